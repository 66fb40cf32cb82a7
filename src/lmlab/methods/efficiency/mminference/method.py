"""MMInference / MInference sparse prefill: offline per-head pattern search, online index build, block kernel.

The patterns, their sets and recall are in `patterns`; the block index structures in `blocks`; MMInference's
modality-aware permutation and mixed-modality patterns in `modality`. This module holds the search, the per-input
index build, the kernel and the analytic ceilings.

Search: a head keeps the first pattern of the ordered search space (`default_search_space`), and switches only when
a later one raises recall (`patterns.recall`) by more than ``minimal_delta`` = 0.01 (MMInference, Li et al., ICML
2025, https://arxiv.org/abs/2504.16083; official code ``minference/modules/mminference.py::pattern_search_attn_delta``
in https://github.com/microsoft/MInference).

The kernel (`sparse_attention`) is a block-sparse CPU analogue of MInference's Triton kernels: queries in blocks of
``block_size`` rows; each block attends the union over its rows of the pattern's keys (a slash becomes a contiguous
key range, a vertical a gathered column), with an exact causal mask and an exact softmax over the kept set. Its
effective mask is therefore the pattern expanded to query-block granularity (a superset of the token-level mask),
as with the official block kernels. Every row keeps its diagonal, so no softmax row is empty. Heads sharing a static
pattern are batched; each VS head runs on its own index (MMInference's per-head kernels).

Everything here is pure: tensors in, tensors and statistics out.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from lmlab.methods.efficiency.mminference.blocks import (
    HeadGroup,
    LayerIndex,
    block_bounds,
    block_coverage,
    block_keys,
)
from lmlab.methods.efficiency.mminference.modality import mm_head_groups
from lmlab.methods.efficiency.mminference.patterns import (
    MM_KINDS,
    PATTERN_KINDS,
    Pattern,
    _MapStats,
    causal_attention_probs,
    pattern_sets,
    vs_estimate,
    vs_scores,
    vs_topk,
)

# ---------------------------------------------------------------------------------------------------------------
# offline pattern search


def default_search_space(
    *,
    a_shape: Sequence[int] = (64, 512),
    vs: Sequence[Sequence[int]] = ((128, 256), (128, 512)),
    grid_stride: int | None = None,
    grid_local: int = 128,
) -> list[Pattern]:
    """The ordered search space (official order: grid v-lines, grid h+v lines, A-shape, VS by growing budget).

    Grid entries appear only when `grid_stride` is given (the input's period, e.g. tokens per frame or record);
    their phase (shift) is searched.
    """
    space: list[Pattern] = []
    if grid_stride:
        space += [
            ("grid_attn", int(grid_stride), False, True, int(grid_local)),
            ("grid_attn", int(grid_stride), True, True, int(grid_local)),
        ]
    space.append(("a_shape", int(a_shape[0]), int(a_shape[1])))
    space += [("vs_attn", int(v), int(s)) for v, s in vs]
    return space


def search_head(
    a: torch.Tensor,
    space: Sequence[Pattern],
    *,
    minimal_delta: float = 0.01,
    min_recall: float = 0.0,
    last_q: int = 64,
    forced_columns: int = 30,
    forced_diagonals: int = 100,
    control_sink: int = 64,
) -> tuple[Pattern, dict[str, float]]:
    """MMInference's ``pattern_search_attn_delta`` for one head on its dense causal map `a` (n, n).

    Walks `space` in order and keeps a candidate only if its recall beats the best so far by > `minimal_delta`
    (cheaper patterns listed first win ties). Grid candidates search their phase over {0, 1, stride - 1}. VS
    candidates use the online estimate from the last `last_q` rows of `a` (identical to estimating from q, k).
    If the best recall is below `min_recall` (lmlab; 0 = off, as the paper), the head stays ``("dense",)``.

    With grid candidates, ``recalls["grid_phase_gain"]`` is lmlab's structure check (`_phase_gain`): how much the
    vertical lines at the best searched phase beat lines at a typical phase, sinks included on both sides.

    Returns:
        ``(best_pattern, recalls)``: the pattern (grid with its shift appended) and every candidate's recall.
    """
    n = a.shape[-1]
    stats = _MapStats(a)
    vs_cache = None
    best, best_recall = None, 0.0
    recalls: dict[str, float] = {}
    for cand in space:
        kind = cand[0]
        if kind == "grid_attn":
            stride = int(cand[1])
            rec, shift = -1.0, 0
            for sh in dict.fromkeys([0, 1, stride - 1]):
                r_ = stats.recall(pattern_sets((*cand, sh), n))
                if r_ > rec:
                    rec, shift = r_, sh
            cand = (*cand, shift)
            if "grid_phase_gain" not in recalls:
                recalls["grid_phase_gain"] = _phase_gain(stats, stride, int(cand[4]), control_sink)
        elif kind == "vs_attn":
            if vs_cache is None:
                m = min(last_q, n)
                vs_cache = vs_scores(a[-m:].clone(), forced_columns=forced_columns, forced_diagonals=forced_diagonals)
            cols, diags = vs_topk(*vs_cache, int(cand[1]), int(cand[2]))
            rec = stats.recall(pattern_sets(cand, n, vs_indices=(cols, diags)))
        else:
            rec = stats.recall(pattern_sets(cand, n))
        recalls["_".join(map(str, cand))] = rec
        if rec - best_recall > minimal_delta:
            best, best_recall = cand, rec
    if best is None or best_recall < min_recall:
        return ("dense",), recalls
    return best, recalls


def _phase_gain(stats: _MapStats, stride: int, n_local: int, sink: int) -> float:
    """Recall of band + sinks + v-lines at the best official phase {0, 1, stride-1} minus the median over all phases.

    On an input without period `stride`, every phase is alike and the gain is ~0; extra lines there only add budget.
    The first `sink` columns are in every variant, so the BOS sink (phase 0) does not count as structure. Computed
    from column sums: lines at phase p add sum over j = p (mod stride), j >= sink, of (C[j] - band part of column j).
    """
    a, n = stats.a, stats.n
    band_col = torch.zeros(n, dtype=a.dtype)
    for d in range(min(n, n_local + 1)):
        band_col[: n - d] += a.diagonal(-d)
    excess = stats.col - band_col
    excess[: min(n, sink)] = 0
    pad = (-n) % stride
    per_phase = F.pad(excess, (0, pad)).view(-1, stride).sum(0) / n  # (stride,)
    best = max(float(per_phase[ph]) for ph in dict.fromkeys([0, 1, stride - 1]))
    return best - float(per_phase.median())


def search_patterns(
    captured: dict[int, tuple[torch.Tensor, torch.Tensor]],
    space: Sequence[Pattern],
    *,
    minimal_delta: float = 0.01,
    min_recall: float = 0.0,
    last_q: int = 64,
    scale: float | None = None,
    forced_columns: int = 30,
    forced_diagonals: int = 100,
    control_sink: int = 64,
) -> tuple[dict[int, dict[int, list]], dict[int, dict[int, dict[str, float]]]]:
    """Search every (layer, head): `captured` maps layer -> (q (h_q, n, d), k (h_kv, n, d)) of one calibration input.

    Returns:
        ``(best, recalls)``: ``best[layer][head] = [kind, *args, recall]`` (MInference's JSON layout, the chosen
        pattern's recall last), and every candidate's recall per head.
    """
    best: dict[int, dict[int, list]] = {}
    all_recalls: dict[int, dict[int, dict[str, float]]] = {}
    for layer, (q, k) in sorted(captured.items()):
        hq, hkv = q.shape[0], k.shape[0]
        best[layer], all_recalls[layer] = {}, {}
        for h in range(hq):
            a = causal_attention_probs(q[h], k[h // (hq // hkv)], scale)
            pat, recs = search_head(
                a,
                space,
                minimal_delta=minimal_delta,
                min_recall=min_recall,
                last_q=last_q,
                forced_columns=forced_columns,
                forced_diagonals=forced_diagonals,
                control_sink=control_sink,
            )
            chosen = recs.get("_".join(map(str, pat)), 1.0)
            best[layer][h] = [*pat, chosen]
            all_recalls[layer][h] = recs
    return best, all_recalls


# ---------------------------------------------------------------------------------------------------------------
# online index build, and the block-sparse kernel


def build_layer_index(
    q: torch.Tensor,
    k: torch.Tensor,
    patterns: dict[int, Sequence[Any]],
    *,
    block_size: int = 128,
    last_q: int = 64,
    scale: float | None = None,
    forced_columns: int = 30,
    forced_diagonals: int = 100,
    layout: Any = None,
) -> LayerIndex:
    """Build one layer's index for one input: VS estimation (batched over VS heads), then block coverage.

    Heads with the same static pattern (A-shape, grid) share one index and run as one batch; each VS head has its
    own (its columns and slashes depend on its queries), so no head pays for another head's keys. MMInference's
    mixed-modality kinds (``q_boundary``, ``2d_boundary``, ``vision_grid``) need the input's `layout`
    (`modality.ModalityLayout`) and are built by `modality.mm_head_groups`, one permuted group per head.

    Args:
        q (`torch.Tensor`): (h_q, n, d) post-RoPE queries. k (`torch.Tensor`): (h_kv, n, d) post-RoPE keys.
        patterns: head -> pattern (``[kind, *args]``; a trailing recall from the JSON layout is ignored). Heads
            missing from `patterns` are dense.
        layout (`modality.ModalityLayout`, *optional*): modality spans of this input (mixed-modality kinds only).
    """
    t0 = time.perf_counter()
    hq, n, d = q.shape
    group = hq // k.shape[0]
    pats = {h: _strip_recall(patterns.get(h, ("dense",))) for h in range(hq)}
    vs_idx: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    by_size: dict[tuple[int, int], list[int]] = {}  # VS heads sharing (v, s) are estimated in one batched matmul
    for h in range(hq):
        if pats[h][0] == "vs_attn":
            by_size.setdefault((int(pats[h][1]), int(pats[h][2])), []).append(h)
    for (v_size, s_size), heads in by_size.items():
        kv = torch.tensor([h // group for h in heads])
        cols, diags = vs_estimate(
            q[heads],
            k[kv],
            v_size,
            s_size,
            last_q=last_q,
            scale=scale,
            forced_columns=forced_columns,
            forced_diagonals=forced_diagonals,
        )
        for i, h in enumerate(heads):
            vs_idx[h] = (cols[i], diags[i])
    static: dict[tuple, list[int]] = {}
    groups: list[HeadGroup] = []
    mm_pats = {h: p for h, p in pats.items() if p[0] in MM_KINDS}
    for h in range(hq):
        if pats[h][0] == "vs_attn":
            cov = block_coverage(pattern_sets(pats[h], n, vs_indices=vs_idx[h]), n, block_size)
            groups.append(HeadGroup(torch.tensor([h]), *block_keys(cov), torch.zeros(0, dtype=torch.long)))
        elif pats[h][0] not in ("dense", *MM_KINDS):
            static.setdefault(pats[h], []).append(h)
    for pat, heads in static.items():
        sets = pattern_sets(pat, n)
        groups.append(HeadGroup(torch.tensor(heads), *block_keys(block_coverage(sets, n, block_size)), sets.rows))
    if mm_pats:
        if layout is None:
            kinds = sorted({p[0] for p in mm_pats.values()})
            raise ValueError(f"patterns {', '.join(kinds)} need the input's modality layout (layout=...)")
        groups += mm_head_groups(
            q,
            k,
            mm_pats,
            layout,
            block_size=block_size,
            last_q=last_q,
            scale=scale,
            forced_columns=forced_columns,
            forced_diagonals=forced_diagonals,
        )
    dense = [h for h in range(hq) if pats[h][0] == "dense"]
    index = LayerIndex(n, block_size, torch.tensor(dense, dtype=torch.long), groups)
    index.index_s = time.perf_counter() - t0
    index.density, index.work = _density(index, hq)
    return index


def _strip_recall(p: Sequence[Any]) -> tuple:
    p = tuple(p)
    arity = {"a_shape": 3, "vs_attn": 3, "grid_attn": 6, "dense": 1, **dict.fromkeys(MM_KINDS, 3)}.get(p[0])
    if arity is None:
        raise ValueError(f"unknown pattern kind {p[0]!r}; expected one of {', '.join(PATTERN_KINDS)}")
    return p[:arity]


def _density(index: LayerIndex, hq: int) -> tuple[torch.Tensor, float]:
    """Kept causal (i, j) pairs per head over n(n+1)/2, and computed score entries over the dense causal count.

    A kept key j of block [r0, r1) is seen by the r1 - max(j, r0) rows at or after it (pads, = n, by none). In a
    permuted group a kept key is seen by the block's rows whose original position is at or after the key's.
    """
    n, bs = index.n, index.block_size
    total = n * (n + 1) / 2
    dens = torch.ones(hq, dtype=torch.float64)
    work = float(len(index.dense_heads)) * total
    starts = torch.arange(0, n, bs)
    ends = (starts + bs).clamp(max=n)
    for g in index.groups:
        if g.starts is None and g.qperm is None and g.kperm is None:
            seen = (ends[:, None] - torch.maximum(g.keys, starts[:, None])).clamp(min=0)
            kept = float(seen.sum())
            work += float((g.counts * (ends - starts)).sum()) * len(g.heads)
        else:
            kept = 0.0
            g_starts, g_ends = block_bounds(g, n, bs)
            qperm = torch.arange(n) if g.qperm is None else g.qperm
            for b in range(len(g_starts)):
                r0, r1, m = int(g_starts[b]), int(g_ends[b]), int(g.counts[b])
                keys = g.keys[b, :m]
                pos = keys if g.kperm is None else g.kperm[keys]
                rows = qperm[r0:r1].sort().values
                kept += float((r1 - r0) * m - torch.searchsorted(rows, pos).sum())  # rows >= each key
            work += float((g.counts * (g_ends - g_starts)).sum()) * len(g.heads)
        if len(g.rows):
            inside = (g.keys[g.rows // bs] <= g.rows[:, None]).sum(-1)  # keys row r already keeps in its block
            kept += float((g.rows + 1 - inside).sum())
            work += float(len(g.rows)) * n * len(g.heads)
        dens[g.heads] = kept / total
    return dens, work / (hq * total)


def sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    index: LayerIndex,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """Block-sparse causal attention of one sequence under `index` (exact softmax over each block's kept keys).

    Per head group and query block: gather the block's keys (contiguous ranges and columns alike) with one
    ``index_select``, then ``softmax(q_blk K^T + causal/pad mask) V`` batched over the group's heads. Dense heads
    use ``F.scaled_dot_product_attention`` (causal); grid horizontal lines are recomputed as dense rows.

    Permuted groups (MMInference): queries are gathered into the permuted order once (``q[:, qperm]``), each block's
    keys are read at their original positions ``kperm[keys]`` (the rows a permuted, contiguous key block holds; CPU
    gathers need no materialised permuted K), the causal mask compares original positions, and the output is
    un-permuted at the end (``out[:, qperm] = out_permuted``).

    Args:
        q (`torch.Tensor`): (h_q, n, d). k, v (`torch.Tensor`): (h_kv, n, d).

    Returns:
        `torch.Tensor`: (h_q, n, d).
    """
    hq, n, d = q.shape
    hkv = k.shape[0]
    group = hq // hkv
    scale = d**-0.5 if scale is None else scale
    out = torch.empty_like(q)
    if len(index.dense_heads):
        hd = index.dense_heads
        kv = hd // group
        out[hd] = F.scaled_dot_product_attention(q[hd][None], k[kv][None], v[kv][None], is_causal=True, scale=scale)[0]
    k_flat = k.reshape(hkv * n, d)
    v_flat = v.reshape(hkv * n, d)
    bs = index.block_size
    for g in index.groups:
        hs = g.heads
        kv_off = (hs // group) * n  # (g,)
        qs = q[hs] * scale  # (g, n, d)
        qpos = torch.arange(n)
        if g.qperm is not None:
            qs = qs[:, g.qperm]  # (g, n, d) rows in the permuted order
            qpos = g.qperm
        og = torch.empty_like(qs)
        starts, ends = block_bounds(g, n, bs)
        for b in range(len(starts)):
            r0, r1 = int(starts[b]), int(ends[b])
            m = int(g.counts[b])
            pos = g.keys[b, :m]  # (m,) ascending key coordinates
            if g.kperm is not None:
                pos = g.kperm[pos]  # original positions
            flat = (pos[None, :] + kv_off[:, None]).reshape(-1)
            kb = k_flat.index_select(0, flat).view(len(hs), m, d)
            vb = v_flat.index_select(0, flat).view(len(hs), m, d)
            scores = torch.bmm(qs[:, r0:r1], kb.transpose(1, 2))  # (g, rows, m)
            rows = qpos[r0:r1]
            if g.kperm is None:
                # keys ascending and rows contiguous: only keys at or after the first row can need the causal mask
                t = int(torch.searchsorted(pos, rows[0]))
                if t < m:
                    scores[:, :, t:].masked_fill_(pos[None, None, t:] > rows[None, :, None], float("-inf"))
            else:
                scores.masked_fill_(pos[None, None, :] > rows[None, :, None], float("-inf"))
            og[:, r0:r1] = torch.bmm(torch.softmax(scores, dim=-1), vb)
        if g.qperm is not None:
            unperm = torch.empty_like(og)
            unperm[:, g.qperm] = og  # back to original row order
            og = unperm
        if len(g.rows):
            r = g.rows
            last = int(r.max()) + 1
            for i, h in enumerate(hs.tolist()):
                s = (q[h, r] * scale) @ k[h // group, :last].T  # (|R|, last)
                s.masked_fill_(torch.arange(last)[None, :] > r[:, None], float("-inf"))
                og[i, r] = torch.softmax(s, dim=-1) @ v[h // group, :last]
        out[hs] = og
    return out


def sparse_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    patterns: dict[int, Sequence[Any]],
    *,
    block_size: int = 128,
    last_q: int = 64,
    scale: float | None = None,
    forced_columns: int = 30,
    forced_diagonals: int = 100,
    layout: Any = None,
) -> tuple[torch.Tensor, LayerIndex]:
    """Online index build + block-sparse attention for a batch: q (b, h_q, n, d), k/v (b, h_kv, n, d).

    `layout` (`modality.ModalityLayout`) is the modality layout of the input, needed by mixed-modality patterns.

    Returns:
        ``(out, index)``: out (b, h_q, n, d); the index of the last sequence (its ``index_s`` summed over the batch).
    """
    outs = []
    index_s = 0.0
    index = None
    for i in range(q.shape[0]):
        index = build_layer_index(
            q[i],
            k[i],
            patterns,
            block_size=block_size,
            last_q=last_q,
            scale=scale,
            forced_columns=forced_columns,
            forced_diagonals=forced_diagonals,
            layout=layout,
        )
        index_s += index.index_s
        outs.append(sparse_attention(q[i], k[i], v[i], index, scale=scale))
    assert index is not None
    index.index_s = index_s
    return torch.stack(outs), index


# ---------------------------------------------------------------------------------------------------------------
# analytic ceilings


def amdahl_bound(attention_share: float, density: float) -> float:
    """End-to-end speed-up bound ``1 / ((1 - f) + f rho)`` when only attention (share f) shrinks to density rho."""
    return 1.0 / ((1.0 - attention_share) + attention_share * density)


def attention_flop_share(n: int, *, n_heads: int, head_dim: int, linear_flops_per_token: float) -> float:
    """Share of causal attention in a layer's prefill FLOPs: 2 h d n^2 / (2 h d n^2 + n * linear)."""
    attn = 2.0 * n_heads * head_dim * n * n  # QK^T and PV over the causal half: 2 * (2 h d n^2 / 2)
    return attn / (attn + n * linear_flops_per_token)


__all__ = [
    "amdahl_bound",
    "attention_flop_share",
    "build_layer_index",
    "default_search_space",
    "search_head",
    "search_patterns",
    "sparse_attention",
    "sparse_prefill",
]
