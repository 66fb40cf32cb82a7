"""MMInference / MInference sparse patterns: attention maps, pattern sets, recall, and the online VS estimate.

recall(M) = (1/n) sum_i sum_{j: (i,j) in M} A_ij  (A = causal softmax(Q K^T / sqrt(d))), the quantity the offline
search (`method.search_head`) ranks patterns by (MMInference, Li et al., ICML 2025, https://arxiv.org/abs/2504.16083;
official code ``minference/modules/mminference.py`` in https://github.com/microsoft/MInference).

Patterns (tuples, as in the official best-pattern JSON):

- ``("a_shape", n_init, n_local)``: sink columns j < n_init plus the band 0 <= i - j < n_local.
- ``("vs_attn", v, s)``: vertical-slash (MInference). Online per input: the last ``last_q`` queries give
  ``softmax(q_last K^T / sqrt(d))`` under a causal mask; vertical score = column sums (the first 30 columns forced
  in), slash score = sums along diagonals (the 100 nearest diagonals forced in); keep the top v columns and top s
  diagonals.
- ``("grid_attn", stride, h, v, n_local, shift)``: MMInference's grid: the band 0 <= i - j <= n_local, vertical lines
  j = shift (mod stride) when v, horizontal lines (whole rows) i = shift (mod stride) when h. The shift is searched
  over {0, 1, stride - 1}. Horizontal lines are MMInference's permuted rows: gathered together they are one dense
  block (``blocks.HeadGroup.rows``).
- ``("dense",)``: a head whose best recall stays below ``min_recall`` (an lmlab option; 0 disables it).
- ``(kind, v, s)`` with kind in `MM_KINDS`: MMInference's mixed-modality patterns (`modality`).

A pattern at length n is a set triple (S, V, R) (`PatternSets`): its token-level mask is
{(i, j): j <= i and (i - j in S or j in V or i in R)}. `_MapStats` computes the exact recall of such sets from one
map's diagonal and column sums (shared by the search in `method` and in `modality`).

Everything here is pure: tensors in, tensors and statistics out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


__all__ = [
    "MM_KINDS",
    "PATTERN_KINDS",
    "PatternSets",
    "causal_attention_probs",
    "diagonal_sums",
    "pattern_sets",
    "recall",
    "token_mask",
    "vs_estimate",
    "vs_scores",
    "vs_topk",
]
