"""Configuration of SparseGPT's comparison run (the same fields as Wanda's: `PruningConfig`)."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import param
from lmlab.methods.compression.wanda.config import PruningConfig


@dataclass
class SparseGPTConfig(PruningConfig):
    """SparseGPT (Frantar & Alistarh, ICML 2023) against magnitude and Wanda; see `PruningConfig` for the fields."""

    baselines: list = param(["magnitude", "wanda"], "other pruners run side by side", paper="magnitude (paper)")

    method_id = "sparsegpt"
