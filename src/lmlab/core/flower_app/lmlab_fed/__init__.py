"""Thin Flower app modules: the logic lives in `lmlab.core.federated` (lmlab must be installed)."""
