"""Regrouping the rows of the fast engine's KV caches: what continuous batching needs between decode steps.

A `KVCache` holds ``batch`` rows left-padded to one shared length: row ``b``'s tokens fill the columns
``[pad[b], length)`` and its rope position at column ``c`` is ``c - pad[b]``. `regroup` builds a new cache from
any rows of any caches by right-aligning them: with ``n_b = length - pad[b]`` tokens per row, the new length is
``L = max n_b`` and row ``b`` gets ``pad = L - n_b``. A row's keys are copied to the columns shifted by
``L - length`` of its source cache, so each key keeps its rope position (``c - pad`` is unchanged) and nothing is
recomputed. Leading columns that every row pads are dropped, so a long-lived batch does not grow without bound.

Sliding layers (Gemma-3) keep a ring of the last ``window - 1`` columns, column ``c`` in slot ``c % (window - 1)``;
a shifted column moves to its new slot. Columns a row never had (its padding) stay zero and are masked by the
forward's ``kcol >= pad`` rule.

Cost: one copy of the rows' filled K/V per call (SmolLM2: ~46 KB per token and row), paid when requests join or
leave, never per step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lmlab.core.inference.engine.model import KVCache

__all__ = ["regroup", "row_tokens"]


def row_tokens(cache: KVCache, row: int) -> int:
    """Number of real (non-pad) columns of `row`."""
    return cache.length - cache.pad_list[row]


def _time_ordered(cache: KVCache, store: list[torch.Tensor], layer: int) -> tuple[torch.Tensor, int]:
    """Layer `layer`'s filled keys (or values) in time order, [batch, kv_heads, n, head_dim], and the first column."""
    if cache.engine.layer_types[layer] == "sliding":
        lo = max(0, cache.length - (cache.engine.window - 1))
        return torch.cat(cache.ring_parts(store[layer]), dim=2), lo
    return store[layer][:, :, : cache.length], 0


def regroup(parts: Sequence[tuple[KVCache, Sequence[int]]], *, headroom: int = 64) -> KVCache | None:
    """A new cache holding, in order, the given rows of the given caches, right-aligned (see the module docstring).

    Args:
        parts: ``(cache, rows)`` pairs; every cache must belong to the same engine. Rows may repeat (a row copied
            twice forks it, e.g. for ``n`` choices of one prompt).
        headroom (`int`): extra capacity (columns) beyond the new length, so the next steps do not grow at once.

    Returns:
        The new cache, or None when no row is given.
    """
    parts = [(c, [int(r) for r in rows]) for c, rows in parts if len(rows)]
    if not parts:
        return None
    engine = parts[0][0].engine
    for c, rows in parts:
        if c.engine is not engine:
            raise ValueError("regroup: every cache must come from the same engine")
        bad = [r for r in rows if not 0 <= r < c.batch]
        if bad:
            raise ValueError(f"regroup: row {bad[0]} is out of range for a cache of batch {c.batch}")
    n_tokens = [row_tokens(c, r) for c, rows in parts for r in rows]
    length = max(n_tokens)
    pads = [length - n for n in n_tokens]
    out = KVCache(engine, len(pads), length + max(1, int(headroom)), pads)
    out.length = length
    ring = engine.window - 1 if engine.has_sliding else 0
    for layer, kind in enumerate(engine.layer_types):
        for which in ("k", "v"):
            dst = getattr(out, which)[layer]  # [B_out, kv, capacity or ring, D]
            j = 0
            for c, rows in parts:
                src, first = _time_ordered(c, getattr(c, which), layer)  # columns [first, c.length) of the source
                shift = length - c.length  # source column s -> new column s + shift
                # copy from the first column any chosen row uses: its new index s0 + shift is >= 0
                s0 = max(first, min(c.pad_list[r] for r in rows))
                idx = torch.tensor(rows, dtype=torch.long)
                picked = src[:, :, s0 - first :].index_select(0, idx)  # [len(rows), kv, c.length - s0, D]
                if kind == "sliding":
                    cols = torch.arange(s0, c.length) + shift  # new columns, all >= length - ring
                    dst[j : j + len(rows)][:, :, cols % ring] = picked
                else:
                    dst[j : j + len(rows), :, s0 + shift : length] = picked
                j += len(rows)
    return out
