"""Thin Flower app modules: the logic lives in `lmlab.core.federated.engine` (lmlab must be installed)."""
