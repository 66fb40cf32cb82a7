"""Alignment and data curation methods (preference training, reward models, data selection)."""
