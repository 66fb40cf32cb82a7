"""SparseGPT: one-shot OBS pruning with lazy-batch column updates (Frantar & Alistarh, ICML 2023).

The per-linear rule is `lmlab.core.pruning.sparsegpt_prune_weight` (IST-DASLab/sparsegpt ``fasterprune``); it runs
inside the shared sequential calibration engine `lmlab.core.pruning.prune_model`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lmlab.core.pruning import PruneReport, prune_model, sparsegpt_prune_weight


def sparsegpt_prune(
    model: Any,
    calib_ids: torch.Tensor,
    sparsity: float | Sequence[float] = 0.5,
    mask_structure: str = "unstructured",
    block_size: int = 128,
    dampening_frac: float = 0.01,
    **engine_kwargs: Any,
) -> PruneReport:
    """min_{M, W'} ||W X - (M * W') X||^2 by OBS: H = 2XX^T + damp I, err = (w - q) / [H^-1]_ii (https://arxiv.org/abs/2301.00774).

    Per linear: ``U = chol(H^-1)`` (upper); columns are processed left to right in blocks of `block_size`; in each
    block the mask is chosen adaptively (the int(s * rows * B) lowest ``w^2 / U_ii^2`` over the block, or the N
    lowest of every M for N:M), and every pruned column's error is propagated to the not-yet-processed columns
    (``W[:, i:] -= err U[i, i:]``, then ``W[:, i2:] -= Err U[i1:i2, i2:]`` after the block). Sequential calibration
    as locuslab/wanda ``prune_sparsegpt``. The model is pruned in place.

    Args:
        model: a llama / gemma3 causal LM (modified in place).
        calib_ids (`torch.Tensor`): (n_windows, seq_len) calibration token ids.
        sparsity: one value for every block or a per-block list.
        mask_structure (`str`): ``"unstructured"`` or ``"N:M"``.
        block_size (`int`, defaults to 128): lazy-batch block (official ``blocksize``).
        dampening_frac (`float`, defaults to 0.01): ``percdamp`` (llm-compressor ``dampening_frac``).
        **engine_kwargs: passed to `prune_model`.

    Returns:
        `PruneReport`.
    """
    return prune_model(
        model,
        calib_ids,
        method="sparsegpt",
        sparsity=sparsity,
        mask_structure=mask_structure,
        block_size=block_size,
        dampening_frac=dampening_frac,
        **engine_kwargs,
    )


__all__ = ["sparsegpt_prune", "sparsegpt_prune_weight"]
