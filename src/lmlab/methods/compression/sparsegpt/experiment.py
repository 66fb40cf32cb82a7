"""Reproduction: SparseGPT on SmolLM2-135M-Instruct against magnitude and Wanda, in one process.

The run is Wanda's comparison run (`lmlab.methods.compression.wanda.experiment.run_pruning_experiment`) with SparseGPT
as the method: the baselines are the sibling pruners, reused by name through the shared engine, not copied.

Claim checks: SparseGPT's held-out NLL below magnitude's at 50% unstructured and at each N:M structure (gating);
SparseGPT's per-linear reconstruction error below Wanda's (gating: the quantity SparseGPT minimises); reported only:
SparseGPT below Wanda at N:M (the reference table's direction) and within `dense_margin` nats of the dense model.
"""

from __future__ import annotations

from typing import Any

from lmlab.methods.compression.wanda.experiment import run_pruning_experiment


def run(cfg: Any, ctx: Any) -> Any:
    return run_pruning_experiment(cfg, ctx, "sparsegpt")
