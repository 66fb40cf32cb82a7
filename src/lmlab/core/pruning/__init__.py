"""Post-training pruning: one sequential layer-by-layer calibration engine and the pruners built on it.

Used by the `wanda` and `sparsegpt` baselines and by `atp` (layer-wise ratios) and `maiht` (a per-layer solver).

The engine (`prune_model`)
    For each decoder block l = 0..L-1: hook every ``nn.Linear`` of the block (q, k, v, o, gate, up, down; never
    ``lm_head`` or the embeddings, which SmolLM2 and Gemma tie), run the still-dense block on its calibration inputs to
    accumulate each linear's input Gram matrix ``G = sum_t x_t x_t^T`` (fp32), prune every linear with the block's
    sparsity ``s_l``, then run the pruned block again: its outputs are block l+1's inputs (sequential calibration,
    as locuslab/wanda and IST-DASLab/sparsegpt). Works on llama (SmolLM2, tiny-llama) and gemma3 blocks: every
    block's call kwargs (masks, rotary tables) are captured by forward pre-hooks.

    >>> from lmlab.core.pruning import prune_model, calibration_windows, token_stream
    >>> report = prune_model(model, calib_ids, method="wanda", sparsity=0.5)            # uniform, unstructured
    >>> report = prune_model(model, calib_ids, method="sparsegpt", mask_structure="2:4")  # N:M (prune 2 of 4)
    >>> report = prune_model(model, calib_ids, method="wanda", sparsity=[0.6, 0.65, ...])  # one value per block

Per-linear plug-in (``method=`` a callable; mAIHT plugs in here)
    ``prune_fn(weight, stats, sparsity, nm) -> new_weight``: `weight` (C_out, C_in) fp32 copy; `stats` a
    `LayerStats` (``gram`` (C_in, C_in) = sum_t x x^T, ``sq_norm`` = ||X_j||^2, ``scaler_row`` (Wanda),
    ``hessian()`` = 2G/n_samples (SparseGPT), ``n_samples``, ``n_tokens``, ``reconstruction_error(old, new)``);
    `sparsity` the block's target; `nm` None or (N, M). Built-ins: `magnitude_prune`, `wanda_prune_weight`,
    `sparsegpt_prune_weight` (or ``get_prune_fn(name, ...)``).

Diagnostics (`PruneReport`)
    ``report.layers``: one `LayerRecord` per linear (block, name, shape, target and measured sparsity, exact
    reconstruction error ``sum_t ||W x_t - W' x_t||^2`` and its relative value, seconds). ``report.blocks``: one
    `BlockRecord` per block (measured sparsity; ``out_error``: relative error of the block output, dense vs pruned
    block on the same inputs; ``dense_error``: relative error against the fully dense model's hidden state at that
    depth, i.e. the accumulated error that ATP plots against depth). ``report.sparsity``: overall measured sparsity.
    ``keep_stats=True`` (or a predicate ``(block, name) -> bool``) keeps the `LayerStats` in ``report.stats``;
    ``on_layer(record, stats, old_weight, new_weight)`` is called after each linear; `collect_layer_stats` gets the
    dense model's statistics without pruning.

Allocations
    Any per-block list works as ``sparsity``. `owl_sparsities(model, calib_ids, S, m=5, lmbda=0.08)` computes OWL's
    (outlier ratio of Wanda scores per block; mean S, range S +- lambda); `owl_from_ratios` is the formula alone.

Data, evaluation, saving, speed (`lmlab.core.pruning.evaluate`)
    `token_stream`, `calibration_windows` (seeded random windows) and `eval_windows` (non-overlapping) over the
    `corpus` suite's disjoint splits (train for calibration, dev for validation, test for evaluation); `window_nll`
    (per-window NLL; perplexity = exp(mean)); `save_pruned(model, tokenizer, folder)` (a standard HF folder that
    `lmlab.core.inference.models.load_model(folder)` loads back); `storage_report` (dense / CSR / bitmask / N:M bytes);
    `csr_plan`, `sparse_copy` and `latency_report`: CSR only where a micro-benchmark shows it wins, timed against
    dense in the same process with `lmlab.core.stats.timing.compare_timings`. torch's 2:4 semi-structured kernels are
    CUDA-only, so N:M is a mask constraint on CPU.
"""

from __future__ import annotations

from lmlab.core.pruning.engine import (
    BlockInputs,
    BlockRecord,
    LayerRecord,
    OWLAllocation,
    PruneReport,
    block_linears,
    capture_block_inputs,
    collect_layer_stats,
    decoder_blocks,
    owl_from_ratios,
    owl_sparsities,
    prune_model,
    resolve_sparsities,
)
from lmlab.core.pruning.evaluate import (
    SparseLinear,
    calibration_windows,
    csr_plan,
    eval_windows,
    latency_report,
    model_sparsity,
    perplexity_from_nll,
    save_pruned,
    sparse_copy,
    storage_report,
    token_stream,
    window_nll,
)
from lmlab.core.pruning.masks import (
    STRUCTURES,
    lowest_k,
    matrix_mask,
    nm_mask,
    nm_valid,
    parse_mask_structure,
    row_mask,
    structure_sparsity,
)
from lmlab.core.pruning.solvers import (
    METHODS,
    LayerStats,
    PruneFn,
    get_prune_fn,
    magnitude_prune,
    sparsegpt_prune_weight,
    wanda_prune_weight,
    wanda_scores,
)

__all__ = [
    "METHODS",
    "STRUCTURES",
    "BlockInputs",
    "BlockRecord",
    "LayerRecord",
    "LayerStats",
    "OWLAllocation",
    "PruneFn",
    "PruneReport",
    "SparseLinear",
    "block_linears",
    "calibration_windows",
    "capture_block_inputs",
    "collect_layer_stats",
    "csr_plan",
    "decoder_blocks",
    "eval_windows",
    "get_prune_fn",
    "latency_report",
    "lowest_k",
    "magnitude_prune",
    "matrix_mask",
    "model_sparsity",
    "nm_mask",
    "nm_valid",
    "owl_from_ratios",
    "owl_sparsities",
    "parse_mask_structure",
    "perplexity_from_nll",
    "prune_model",
    "resolve_sparsities",
    "row_mask",
    "save_pruned",
    "sparse_copy",
    "sparsegpt_prune_weight",
    "storage_report",
    "structure_sparsity",
    "token_stream",
    "wanda_prune_weight",
    "wanda_scores",
    "window_nll",
]
