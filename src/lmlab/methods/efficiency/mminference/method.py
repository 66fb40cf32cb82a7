"""MMInference / MInference sparse prefill: offline per-head pattern search, online index build, block kernel.

recall(M) = (1/n) sum_i sum_{j: (i,j) in M} A_ij  (A = causal softmax(Q K^T / sqrt(d))); a head keeps the first
pattern of the ordered search space, and switches only when a later one raises recall by more than
``minimal_delta`` = 0.01 (MMInference, Li et al., ICML 2025, https://arxiv.org/abs/2504.16083; official code
``minference/modules/mminference.py::pattern_search_attn_delta`` in https://github.com/microsoft/MInference).

Patterns (tuples, as in the official best-pattern JSON):

- ``("a_shape", n_init, n_local)``: sink columns j < n_init plus the band 0 <= i - j < n_local.
- ``("vs_attn", v, s)``: vertical-slash (MInference). Online per input: the last ``last_q`` queries give
  ``softmax(q_last K^T / sqrt(d))`` under a causal mask; vertical score = column sums (the first 30 columns forced
  in), slash score = sums along diagonals (the 100 nearest diagonals forced in); keep the top v columns and top s
  diagonals.
- ``("grid_attn", stride, h, v, n_local, shift)``: MMInference's grid: the band 0 <= i - j <= n_local, vertical lines
  j = shift (mod stride) when v, horizontal lines (whole rows) i = shift (mod stride) when h. The shift is searched
  over {0, 1, stride - 1}. Horizontal lines are MMInference's permuted rows: gathered together they are one dense
  block (``HeadGroup.rows`` below).
- ``("dense",)``: a head whose best recall stays below ``min_recall`` (an lmlab option; 0 disables it).

The kernel (`sparse_attention`) is a block-sparse CPU analogue of MInference's Triton kernels: queries in blocks of
``block_size`` rows; each block attends the union over its rows of the pattern's keys (a slash becomes a contiguous
key range, a vertical a gathered column), with an exact causal mask and an exact softmax over the kept set. Its
effective mask is therefore the pattern expanded to query-block granularity (a superset of the token-level mask),
as with the official block kernels. Every row keeps its diagonal, so no softmax row is empty. Heads sharing a static
pattern are batched; each VS head runs on its own index (MMInference's per-head kernels).

Everything here is pure: tensors in, tensors and statistics out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

Pattern = tuple  # ("a_shape", n_init, n_local) | ("vs_attn", v, s) | ("grid_attn", stride, h, v, n_local, shift) | ...

# MMInference's mixed-modality kinds (`modality`): each is ``(kind, v, s)`` and needs the input's modality layout
MM_KINDS = ("q_boundary", "2d_boundary", "vision_grid")
PATTERN_KINDS = ("a_shape", "vs_attn", "grid_attn", "dense", *MM_KINDS)


# ---------------------------------------------------------------------------------------------------------------
# attention maps and their diagonal / column sums


def causal_attention_probs(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Dense causal softmax(q k^T * scale) of one head, fp32.

    Args:
        q (`torch.Tensor`): (n, d) queries (post-RoPE). k (`torch.Tensor`): (n, d) keys.
        scale (`float`, *optional*): defaults to 1/sqrt(d).

    Returns:
        `torch.Tensor`: (n, n) row-stochastic, zero above the diagonal.
    """
    n, d = q.shape
    scale = d**-0.5 if scale is None else scale
    s = (q.float() @ k.float().T) * scale  # (n, n)
    s.masked_fill_(torch.ones(n, n, dtype=torch.bool).triu_(1), float("-inf"))
    return torch.softmax(s, dim=-1)


def diagonal_sums(x: torch.Tensor) -> torch.Tensor:
    """Sums along the diagonals of the last ``m`` rows of an (n-wide) causal map.

    ``x`` holds rows n-m .. n-1 of an (n, n) map (m <= n). ``out[d] = sum_r x[r, (n - m + r) - d]`` over valid
    columns: the mass at distance d = i - j from the main diagonal (d = 0 is the diagonal). Same quantity as the
    official ``sum_all_diagonal_matrix(qk)[..., :-last_q + 1]``, indexed by distance instead of reversed.

    Args:
        x (`torch.Tensor`): (..., m, n).

    Returns:
        `torch.Tensor`: (..., n).
    """
    *lead, m, n = x.shape
    x = x.reshape(-1, m, n)
    b = x.shape[0]
    w = n + m - 1
    # flip columns and pad m - 1 zeros on the right: row r, distance d then sits at a constant stride of w - 1
    z = F.pad(x.flip(-1), (0, m - 1))
    view = z.as_strided((b, m, n), (m * w, w - 1, 1), m - 1)
    return view.sum(1).reshape(*lead, n)


# ---------------------------------------------------------------------------------------------------------------
# patterns as (diagonals, columns, rows): the token-level mask is {(i, j): j <= i and (i - j in S or j in V or i in R)}


@dataclass
class PatternSets:
    """A pattern instantiated for one input length: sorted distance set S, column set V, dense-row set R."""

    diags: torch.Tensor  # (|S|,) int64, sorted, distances i - j >= 0
    cols: torch.Tensor  # (|V|,) int64, sorted
    rows: torch.Tensor  # (|R|,) int64, sorted: rows attending every key j <= i


def _arange(lo: int, hi: int, step: int = 1) -> torch.Tensor:
    return torch.arange(lo, max(lo, hi), step, dtype=torch.long)


def pattern_sets(
    pattern: Pattern, n: int, *, vs_indices: tuple[torch.Tensor, torch.Tensor] | None = None
) -> PatternSets:
    """The (S, V, R) sets of a pattern at length n (VS needs its estimated ``(cols, diags)``)."""
    kind = pattern[0]
    empty = torch.zeros(0, dtype=torch.long)
    if kind == "a_shape":
        n_init, n_local = int(pattern[1]), int(pattern[2])
        return PatternSets(_arange(0, min(n, max(1, n_local))), _arange(0, min(n, n_init)), empty)
    if kind == "grid_attn":
        stride, h, v = int(pattern[1]), bool(pattern[2]), bool(pattern[3])
        n_local, shift = int(pattern[4]), int(pattern[5])
        lines = _arange(shift % stride, n, stride)
        return PatternSets(_arange(0, min(n, n_local + 1)), lines if v else empty, lines if h else empty)
    if kind == "vs_attn":
        if vs_indices is None:
            raise ValueError("a vs_attn pattern needs its estimated (cols, diags): call vs_estimate first")
        cols, diags = vs_indices
        return PatternSets(diags.sort().values, cols.sort().values, empty)
    if kind == "dense":
        return PatternSets(_arange(0, n), empty, empty)
    if kind in MM_KINDS:
        raise ValueError(f"{kind!r} has one (S, V) set per modality: use modality.mm_estimate / mm_token_mask")
    raise ValueError(f"unknown pattern kind {kind!r}; expected one of {', '.join(PATTERN_KINDS)}")


def token_mask(sets: PatternSets, n: int) -> torch.Tensor:
    """The (n, n) boolean token-level mask of a pattern (for tests and small maps)."""
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    in_s = torch.zeros(n, dtype=torch.bool)
    in_s[sets.diags] = True
    in_v = torch.zeros(n, dtype=torch.bool)
    in_v[sets.cols] = True
    in_r = torch.zeros(n, dtype=torch.bool)
    in_r[sets.rows] = True
    causal = j <= i
    return causal & (in_s[(i - j).clamp(min=0)] | in_v[j].expand(n, n) | in_r[i].expand(n, n))


def recall(a: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean over rows of the probability mass inside `mask` (the official ``est_attn.sum(-1).mean(-1)``)."""
    return float((a * mask).sum(-1).mean())


# ---------------------------------------------------------------------------------------------------------------
# vertical-slash estimation (MInference's last-q estimate)


def vs_scores(last_probs: torch.Tensor, *, forced_columns: int = 30, forced_diagonals: int = 100):
    """Vertical and slash scores from the last queries' attention probabilities.

    Args:
        last_probs (`torch.Tensor`): (..., m, n) causal softmax rows of the last m queries.

    Returns:
        ``(vertical, slash)``, each (..., n): column sums with the first `forced_columns` set to +inf, and diagonal
        sums by distance with the `forced_diagonals` nearest set to +inf (both forced in by top-k).
    """
    vertical = last_probs.sum(-2)
    vertical[..., :forced_columns] = math.inf
    slash = diagonal_sums(last_probs)
    slash[..., :forced_diagonals] = math.inf
    return vertical, slash


def vs_topk(vertical: torch.Tensor, slash: torch.Tensor, v: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-v columns and top-s diagonal distances (official sizes: ``min(n, max(v, 30))``, ``min(n, max(s, 50))``)."""
    n = vertical.shape[-1]
    v = min(n, max(int(v), 30))
    s = min(n, max(int(s), 50))
    return torch.topk(vertical, v, dim=-1).indices, torch.topk(slash, s, dim=-1).indices


def vs_estimate(
    q: torch.Tensor,
    k: torch.Tensor,
    v_size: int,
    s_size: int,
    *,
    last_q: int = 64,
    scale: float | None = None,
    forced_columns: int = 30,
    forced_diagonals: int = 100,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MInference's online VS index: ``softmax(q[-last_q:] K^T * scale)`` (causal), then top-v columns, top-s slashes.

    Args:
        q (`torch.Tensor`): (h, n, d) queries of h heads. k (`torch.Tensor`): (h, n, d) their keys (GQA: expanded).

    Returns:
        ``(cols, diags)``: (h, v') column indices and (h, s') diagonal distances (unsorted).
    """
    h, n, d = q.shape
    m = min(last_q, n)
    scale = d**-0.5 if scale is None else scale
    qk = torch.bmm(q[:, -m:].float(), k.float().transpose(1, 2)) * scale  # (h, m, n)
    # causal mask inside the last block: query n - m + r sees keys <= n - m + r
    tail = torch.ones(m, m, dtype=torch.bool).triu_(1)
    qk[:, :, n - m :].masked_fill_(tail, float("-inf"))
    probs = torch.softmax(qk, dim=-1)
    vertical, slash = vs_scores(probs, forced_columns=forced_columns, forced_diagonals=forced_diagonals)
    return vs_topk(vertical, slash, v_size, s_size)


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


class _MapStats:
    """Per-map sums reused by every candidate: diagonal sums D, column sums C (recall from sets, no n x n mask)."""

    def __init__(self, a: torch.Tensor) -> None:
        self.a = a
        self.n = a.shape[-1]
        self.diag = diagonal_sums(a)  # (n,)
        self.col = a.sum(0)  # (n,)
        self.flat = a.reshape(-1)

    def recall(self, sets: PatternSets) -> float:
        """Exact recall of the token-level mask of `sets` (inclusion-exclusion on diagonals x columns, then rows)."""
        a, n = self.a, self.n
        s, v, r = sets.diags, sets.cols, sets.rows
        total = self.diag[s].sum() + self.col[v].sum()
        if len(s) and len(v):
            ii = v[None, :] + s[:, None]  # (|S|, |V|) rows of the overlap entries (i, j) = (j + d, j)
            ok = ii < n
            flat = torch.where(ok, ii * n + v[None, :], 0).reshape(-1)
            total = total - (self.flat.index_select(0, flat) * ok.reshape(-1)).sum()
        if len(r):
            # rows in R attend everything: replace their (S, V) mass by their full mass (1 per row)
            in_s = torch.zeros(n, dtype=torch.bool)
            in_s[s] = True
            in_v = torch.zeros(n, dtype=torch.bool)
            in_v[v] = True
            j = torch.arange(n)[None, :]
            dist = r[:, None] - j
            m = (dist >= 0) & (in_s[dist.clamp(min=0)] | in_v[j])
            total = total - (a[r] * m).sum() + a[r].sum()
        return float(total / n)


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
# online index: block coverage, and the block-sparse kernel


def range_coverage(
    diags: torch.Tensor,
    cols: torch.Tensor,
    c0: torch.Tensor,
    c1: torch.Tensor,
    n: int,
    *,
    key_pos: torch.Tensor | None = None,
    row_max: torch.Tensor | None = None,
) -> torch.Tensor:
    """Keys each query block covers, in key coordinates: the block-expanded union of slashes and verticals.

    Block b holds the query rows whose key coordinates are the contiguous range [c0_b, c1_b) (their own positions
    in the key order; the identity order for unpermuted heads). A slash at (key-coordinate) distance d covers keys
    [c0 - d, c1 - 1 - d] (MInference's ``block_offset``), a vertical j every block; distance 0 (each row's own key)
    is always covered. Distances may be negative in a permuted key order. Finally keys no row of the block can see
    are dropped: original position ``key_pos[j]`` (identity if None) above ``row_max[b]`` (the block's last row if
    None, i.e. c1 - 1 in the identity order).

    Args:
        diags (`torch.Tensor`): kept distances, int64 in [-(n - 1), n - 1]. cols (`torch.Tensor`): kept key coords.
        c0, c1 (`torch.Tensor`): (n_blocks,) first and one-past-last key coordinate of each block's rows.

    Returns:
        `torch.Tensor`: (n_blocks, n) bool over key coordinates.
    """
    o = n - 1  # distance d sits at index d + o
    j = torch.arange(n)
    in_s = torch.zeros(2 * n - 1, dtype=torch.int32)
    d = diags[(diags > -n) & (diags < n)]
    in_s[d + o] = 1
    in_s[o] = 1  # the diagonal
    cum = torch.zeros(2 * n, dtype=torch.int32)
    cum[1:] = in_s.cumsum(0)
    # block b covers key j iff some kept distance lies in [c0 - j, c1 - 1 - j]
    lo = (c0[:, None] - j[None, :] + o).clamp(0, 2 * n - 1)
    hi = (c1[:, None] - j[None, :] + o).clamp(0, 2 * n - 1)  # exclusive
    cov = (cum[hi] - cum[lo]) > 0
    if len(cols):
        cov[:, cols] = True
    row_max = c1 - 1 if row_max is None else row_max
    pos = j if key_pos is None else key_pos
    cov &= pos[None, :] <= row_max[:, None]
    return cov


def block_coverage(sets: PatternSets, n: int, block_size: int) -> torch.Tensor:
    """Keys each query block attends: ``cov[b, j]`` = some row i of block b has (i, j) in the token mask, and j <= i.

    A slash at distance d covers keys [r0 - d, r1 - 1 - d] of block [r0, r1) (MInference's ``block_offset``); a
    vertical j is covered by every block ending after j (``column_index``); the diagonal is always covered.

    Returns:
        `torch.Tensor`: (n_blocks, n) bool.
    """
    starts = torch.arange(0, n, block_size)
    ends = (starts + block_size).clamp(max=n)
    return range_coverage(sets.diags, sets.cols, starts, ends, n)


@dataclass
class HeadGroup:
    """Query heads that share one block index (all heads of one static pattern, or one VS / MMInference head).

    Unpermuted groups (``qperm`` None) use query blocks of ``block_size`` rows. Permuted groups (MMInference's
    modality-aware and grid permutations, `modality`) run on the query rows reordered by ``qperm`` (row r of the
    permuted block space is original position ``qperm[r]``), in blocks ``[starts[b], starts[b + 1])``, and list
    their keys in the key order ``kperm`` (key coordinate j is original position ``kperm[j]``); the kernel un-permutes
    the output at the end.
    """

    heads: torch.Tensor  # (g,) query heads
    keys: torch.Tensor  # (n_blocks, m_max) key coordinates per query block, ascending, padded with n
    counts: torch.Tensor  # (n_blocks,) real keys per block
    rows: torch.Tensor  # (|R|,) dense rows (grid horizontal lines, original positions), possibly empty
    qperm: torch.Tensor | None = None  # (n,) query order, a permutation of range(n); None = identity
    kperm: torch.Tensor | None = None  # (n,) key order; None = identity
    starts: torch.Tensor | None = None  # (n_blocks + 1,) block bounds in the permuted row order; None = uniform


@dataclass
class LayerIndex:
    """The online sparse index of one layer: dense heads, and groups of sparse heads with their block keys."""

    n: int
    block_size: int
    dense_heads: torch.Tensor  # (h_d,) query heads run by dense SDPA
    groups: list[HeadGroup] = field(default_factory=list)
    density: torch.Tensor = field(default_factory=lambda: torch.zeros(0))  # (h_q,) kept causal pairs / n(n+1)/2
    work: float = 0.0  # computed score entries (incl. masked and padded) / (h_q n (n+1) / 2)
    index_s: float = 0.0  # seconds spent building this index (estimation + coverage)


def block_keys(cov: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n_blocks, n) coverage -> ascending key positions per block, padded with n, and the per-block counts."""
    nb, n = cov.shape
    counts = cov.sum(-1)
    m_max = int(counts.max()) if nb else 0
    bb, jj = cov.nonzero(as_tuple=True)  # row-major: ascending j within each block
    offsets = counts.cumsum(0) - counts
    keys = torch.full((nb, m_max), n, dtype=torch.long)
    keys[bb, torch.arange(len(jj)) - offsets[bb]] = jj
    return keys, counts


def block_bounds(group: HeadGroup, n: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(starts, ends) of the group's query blocks in its (permuted) row order."""
    if group.starts is not None:
        return group.starts[:-1], group.starts[1:]
    starts = torch.arange(0, n, block_size)
    return starts, (starts + block_size).clamp(max=n)


def effective_mask(group: HeadGroup, n: int, block_size: int) -> torch.Tensor:
    """The (n, n) token-level mask (original positions) the kernel computes for one head of `group`.

    Each block's rows see each of the block's keys at or before them (exact causal mask); dense rows see every
    key at or before them. This is the pattern expanded to block granularity, as the kernel runs it.
    """
    starts, ends = block_bounds(group, n, block_size)
    qperm = torch.arange(n) if group.qperm is None else group.qperm
    mask = torch.zeros(n, n, dtype=torch.bool)
    for b in range(len(starts)):
        r0, r1, m = int(starts[b]), int(ends[b]), int(group.counts[b])
        keys = group.keys[b, :m]
        pos = keys if group.kperm is None else group.kperm[keys]
        mask[qperm[r0:r1, None], pos[None, :]] = True
    i = torch.arange(n)
    mask &= i[None, :] <= i[:, None]
    if len(group.rows):
        mask[group.rows] = i[None, :] <= group.rows[:, None]
    return mask


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
        from lmlab.methods.efficiency.mminference.modality import mm_head_groups

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
    "MM_KINDS",
    "PATTERN_KINDS",
    "HeadGroup",
    "LayerIndex",
    "block_keys",
    "PatternSets",
    "amdahl_bound",
    "attention_flop_share",
    "block_bounds",
    "block_coverage",
    "build_layer_index",
    "causal_attention_probs",
    "default_search_space",
    "diagonal_sums",
    "effective_mask",
    "pattern_sets",
    "range_coverage",
    "recall",
    "search_head",
    "search_patterns",
    "sparse_attention",
    "sparse_prefill",
    "token_mask",
    "vs_estimate",
    "vs_scores",
    "vs_topk",
]
