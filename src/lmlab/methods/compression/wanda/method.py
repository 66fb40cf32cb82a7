"""Wanda: prune by weights and activations, S_ij = |W_ij| * ||X_j||_2, compared per output row, no weight update.

The per-linear rule is `lmlab.core.pruning.wanda_prune_weight`; it runs inside the shared sequential calibration
engine `lmlab.core.pruning.prune_model`, which `atp` and `maiht` use too. Magnitude pruning (the classic baseline)
runs through the same engine, so both see identical calibration windows and propagation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lmlab.core.pruning import PruneReport, prune_model, wanda_prune_weight, wanda_scores


def wanda_prune(
    model: Any,
    calib_ids: torch.Tensor,
    sparsity: float | Sequence[float] = 0.5,
    mask_structure: str = "unstructured",
    **engine_kwargs: Any,
) -> PruneReport:
    """S_ij = |W_ij| * ||X_j||_2; per output row i, zero the int(s * C_in) lowest S_ij (https://arxiv.org/abs/2306.11695).

    ``||X_j||_2`` is the norm of input feature j over all calibration tokens, from the block's inputs after the
    earlier blocks were pruned (sequential calibration, locuslab/wanda ``prune_wanda``). N:M (``"2:4"``, ``"4:8"``)
    zeroes the N lowest S_ij of every M consecutive inputs of a row. The model is pruned in place.

    Args:
        model: a llama / gemma3 causal LM (modified in place).
        calib_ids (`torch.Tensor`): (n_windows, seq_len) calibration token ids.
        sparsity: one value for every block or a per-block list (OWL / ATP allocations).
        mask_structure (`str`): ``"unstructured"`` or ``"N:M"``.
        **engine_kwargs: passed to `prune_model` (``batch_size``, ``keep_stats``, ``on_layer``, ``track_dense``...).

    Returns:
        `PruneReport` (per-linear and per-block diagnostics).
    """
    return prune_model(
        model, calib_ids, method="wanda", sparsity=sparsity, mask_structure=mask_structure, **engine_kwargs
    )


def magnitude_prune_model(
    model: Any,
    calib_ids: torch.Tensor,
    sparsity: float | Sequence[float] = 0.5,
    mask_structure: str = "unstructured",
    group: str = "layer",
    **engine_kwargs: Any,
) -> PruneReport:
    """Magnitude baseline: zero the lowest |W_ij| per layer (locuslab/wanda ``prune_magnitude``) or per row.

    Needs no calibration data; `calib_ids` only feed the engine's diagnostics (reconstruction errors).
    """
    return prune_model(
        model,
        calib_ids,
        method="magnitude",
        sparsity=sparsity,
        mask_structure=mask_structure,
        magnitude_group=group,
        **engine_kwargs,
    )


__all__ = ["magnitude_prune_model", "wanda_prune", "wanda_prune_weight", "wanda_scores"]
