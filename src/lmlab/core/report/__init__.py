"""Rendering a run: report blocks (markdown / HTML), plots, and the environment record."""
