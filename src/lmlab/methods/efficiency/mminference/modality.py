"""MMInference's own contribution: modality-aware permutation, Q-boundary / 2D-boundary patterns, permuted grid.

MMInference (Li et al., ICML 2025, https://arxiv.org/abs/2504.16083, Sec. 3; official code
``minference/modules/mminference.py`` in https://github.com/microsoft/MInference) handles a mixed-modality prompt
(text spans and vision spans) by permuting tokens so that the sparse pattern of each part becomes contiguous, then
running the ordinary block-sparse kernel. With a layout of spans (start, end, modality) and, for vision, an image
row stride S (tokens per row), the pieces are:

- **Modality-aware permutation** P: all vision tokens, then all text tokens, each modality's spans in order (the
  official ``create_typed_spans`` order, ``v`` before ``t``). `modality_permutation`.
- **Grid permutation** G inside every vision span [a, a + R S): phase-major order, position a + r S + c goes to
  a + c R + r (the official ``shfl_idx = vis_idx.reshape(-1, S).T.flatten()``), so a vertical line (one phase c of
  every row) and the "same column, earlier rows" neighbours of a pixel become one contiguous run. `grid_order`.
- Every kind has a query order ``qperm`` (how rows are grouped into blocks) and a key order ``kperm`` (the key
  coordinates its slashes and verticals live in). With kinv = kperm^-1 and c(i) = kinv[i] the key coordinate of
  token i (for a query: its own key's coordinate), a head of kind K keeps, for a query i of modality m,

      M_K(i, j) = [j <= i] and ( c(i) - c(j) in S_m  or  c(j) in V_m )

  where (V_m, S_m) is a vertical-slash index estimated online, per modality, from the last ``last_q`` queries of
  modality m's last span (the official ``last_q_for_each_modality`` + ``topk_vs``): vertical score
  sum_r A[r, kperm[j']] per key coordinate j', slash score sum_r sum_j A[r, j] [c(r) - c(j) = d] per distance d,
  first ``forced_columns`` original positions and distances 0 .. ``forced_diagonals`` - 1 forced in, then top-v
  and top-s. Every row keeps the same budget v + s as MInference's VS, so the kinds compare at equal budget:

  | kind | qperm | kperm | what it is |
  |---|---|---|---|
  | ``vs_attn`` | identity | identity | MInference: one VS index from the last queries of the whole input |
  | ``q_boundary`` | P | identity | official ``shuffle_q``: rows grouped by modality, one VS index per modality |
  | ``2d_boundary`` | P | P | rows and keys grouped by modality: each modality's own past is contiguous, so a
  text span's "recent tokens" include the text before the picture (the 2D boundary) |
  | ``vision_grid`` | G P | G P | 2D boundary plus the grid permutation of vision spans: a pixel's column
  neighbours and the phase lines are contiguous (the Grid head, found online from the last vision queries) |

Blocks (`mm_blocks`) run along ``qperm`` and never mix modalities, break where the rows' key coordinates stop being
consecutive (so a slash covers one contiguous key range of the block, MInference's ``block_offset``) and where the
original positions fall (a new grid phase). The kernel (`method.sparse_attention`) gathers queries into ``qperm``
order, reads each block's keys at ``kperm[keys]``, applies the exact causal mask on original positions, and
un-permutes the output.

Everything here is pure: tensors and layouts in, tensors out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lmlab.methods.efficiency.mminference.blocks import HeadGroup, block_bounds, block_keys, range_coverage
from lmlab.methods.efficiency.mminference.patterns import (
    _MapStats,
    causal_attention_probs,
    pattern_sets,
    vs_scores,
    vs_topk,
)

MODALITIES: tuple[str, ...] = ("vision", "text")  # permuted order: vision first (official create_typed_spans)


def modality_code(mod: str) -> int:
    """The label code of modality `mod`; a one-line error naming it otherwise."""
    if mod not in MODALITIES:
        raise ValueError(f"unknown modality {mod!r} in the index; expected one of {', '.join(MODALITIES)}")
    return MODALITIES.index(mod)


MM_SPACE_KINDS: tuple[str, ...] = ("vs_attn", "q_boundary", "2d_boundary", "vision_grid")


@dataclass(frozen=True)
class ModalityLayout:
    """The modality spans of one input: consecutive ``(start, end, modality)`` covering [0, n).

    Args:
        spans: ``((0, e0, m0), (e0, e1, m1), ...)`` with m in `MODALITIES`.
        stride (`int`, *optional*): tokens per image row (the grid stride); every vision span's length must be a
            multiple of it. Needed only by ``vision_grid``.
    """

    spans: tuple[tuple[int, int, str], ...]
    stride: int | None = None

    def __post_init__(self) -> None:
        spans = tuple((int(a), int(e), str(m)) for a, e, m in self.spans)
        object.__setattr__(self, "spans", spans)
        if not spans:
            raise ValueError("layout spans must be a non-empty sequence of (start, end, modality)")
        pos = 0
        for a, e, m in spans:
            if a != pos or e <= a:
                raise ValueError(f"layout spans must be consecutive and non-empty from 0, got {spans!r}")
            if m not in MODALITIES:
                raise ValueError(f"span modality must be one of {', '.join(MODALITIES)}, got {m!r}")
            pos = e
        if self.stride is not None:
            if isinstance(self.stride, bool) or not isinstance(self.stride, int) or self.stride < 1:
                raise ValueError(f"layout stride must be None or an int >= 1, got {self.stride!r}")
            bad = [(a, e) for a, e, m in spans if m == "vision" and (e - a) % self.stride]
            if bad:
                raise ValueError(f"vision spans {bad} are not a whole number of rows of stride {self.stride}")

    @classmethod
    def from_pieces(cls, pieces: Sequence[tuple[str, int]], stride: int | None = None) -> ModalityLayout:
        """A layout from consecutive ``(modality, length)`` pieces (adjacent pieces of one modality are merged)."""
        spans: list[list[Any]] = []
        pos = 0
        for m, length in pieces:
            if length <= 0:
                raise ValueError(f"piece lengths must be >= 1, got {length!r} for {m!r}")
            if spans and spans[-1][2] == m:
                spans[-1][1] += length
            else:
                spans.append([pos, pos + length, m])
            pos += length
        return cls(tuple(tuple(s) for s in spans), stride)

    @property
    def n(self) -> int:
        return self.spans[-1][1]

    def modalities(self) -> tuple[str, ...]:
        """Modalities present, in `MODALITIES` order."""
        present = {m for _, _, m in self.spans}
        return tuple(m for m in MODALITIES if m in present)

    def labels(self) -> torch.Tensor:
        """(n,) int64: index into `MODALITIES` of every token."""
        out = torch.empty(self.n, dtype=torch.long)
        for a, e, m in self.spans:
            out[a:e] = MODALITIES.index(m)
        return out

    def last_span(self, modality: str) -> tuple[int, int]:
        for a, e, m in reversed(self.spans):
            if m == modality:
                return a, e
        raise ValueError(f"the layout has no {modality!r} span")


# ---------------------------------------------------------------------------------------------------------------
# permutations


def inverse_permutation(perm: torch.Tensor) -> torch.Tensor:
    """``inv`` with ``inv[perm[i]] = i``; raises unless `perm` is a permutation of range(n)."""
    if perm.dim() != 1 or perm.dtype != torch.long:
        raise ValueError(f"perm must be a 1-D int64 tensor, got shape {tuple(perm.shape)} and {perm.dtype}")
    n = perm.numel()
    if not torch.equal(perm.sort().values, torch.arange(n)):
        raise ValueError(f"perm must be a permutation of range({n}) (each position exactly once)")
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(n)
    return inv


def grid_order(start: int, end: int, stride: int) -> torch.Tensor:
    """Positions of [start, end) in phase-major order: a + r S + c -> rank c R + r (the official ``shfl_idx``)."""
    if (end - start) % stride:
        raise ValueError(f"span [{start}, {end}) is not a whole number of rows of stride {stride}")
    return torch.arange(start, end).view(-1, stride).T.reshape(-1)


def modality_permutation(layout: ModalityLayout, *, grid: bool = False) -> torch.Tensor:
    """The modality-aware permutation: vision spans then text spans, each in order (phase-major if `grid`).

    Returns:
        `torch.Tensor`: (n,) original positions in permuted order (``perm[r]`` = token at permuted rank r).
    """
    if grid and layout.stride is None:
        raise ValueError("the grid permutation needs the layout's image row stride (stride=None)")
    parts = []
    for mod in MODALITIES:
        for a, e, m in layout.spans:
            if m == mod:
                parts.append(grid_order(a, e, layout.stride) if grid and m == "vision" else torch.arange(a, e))
    return torch.cat(parts)


def kind_orders(kind: str, layout: ModalityLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """``(qperm, kperm)`` of a pattern kind (see the module table)."""
    n = layout.n
    if kind == "vs_attn":
        return torch.arange(n), torch.arange(n)
    if kind == "q_boundary":
        return modality_permutation(layout), torch.arange(n)
    if kind == "2d_boundary":
        p = modality_permutation(layout)
        return p, p
    if kind == "vision_grid":
        p = modality_permutation(layout, grid=True)
        return p, p
    raise ValueError(f"unknown mixed-modality kind {kind!r}; expected one of {', '.join(MM_SPACE_KINDS)}")


# ---------------------------------------------------------------------------------------------------------------
# online per-modality vertical-slash index in key coordinates


def last_query_rows(layout: ModalityLayout, modality: str, last_q: int) -> torch.Tensor:
    """The last ``min(last_q, len)`` positions of `modality`'s last span (official ``last_q_for_each_modality``)."""
    a, e = layout.last_span(modality)
    m = min(int(last_q), e - a)
    return torch.arange(e - m, e)


def keyspace_scores(
    probs: torch.Tensor,
    rows: torch.Tensor,
    kperm: torch.Tensor,
    kinv: torch.Tensor,
    *,
    forced_columns: int = 30,
    forced_diagonals: int = 100,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Vertical and slash scores in key coordinates from the causal softmax rows of queries `rows`.

    Args:
        probs (`torch.Tensor`): (h, m, n) attention of the m queries at original positions `rows` over original keys.
        kperm, kinv (`torch.Tensor`): (n,) key order and its inverse.

    Returns:
        ``(vertical, slash)``: (h, n) per key coordinate j' (= sum_r probs[r, kperm[j']]), and (h, 2n - 1) per
        distance d at index d + n - 1 (d = c(row) - c(key)); forced entries set to +inf.
    """
    h, m, n = probs.shape
    vertical = probs.sum(1)[:, kperm]
    vertical[:, kinv[: min(n, forced_columns)]] = math.inf
    dist = (kinv[rows][:, None] - kinv[None, :] + n - 1).reshape(1, -1).expand(h, -1)  # (h, m n)
    slash = torch.zeros(h, 2 * n - 1, dtype=probs.dtype).scatter_add_(1, dist, probs.reshape(h, -1))
    slash[:, n - 1 : n - 1 + forced_diagonals] = math.inf
    return vertical, slash


def keyspace_topk(vertical: torch.Tensor, slash: torch.Tensor, v: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-v key coordinates and top-s distances (official sizes ``max(v, 30)``, ``max(s, 50)``, capped)."""
    n = vertical.shape[-1]
    v = min(n, max(int(v), 30))
    s = min(slash.shape[-1], max(int(s), 50))
    return torch.topk(vertical, v, dim=-1).indices, torch.topk(slash, s, dim=-1).indices - (n - 1)


def mm_estimate(
    q: torch.Tensor,
    k: torch.Tensor,
    layout: ModalityLayout,
    kind: str,
    v: int,
    s: int,
    *,
    last_q: int = 64,
    scale: float | None = None,
    forced_columns: int = 30,
    forced_diagonals: int = 100,
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The online index of a mixed-modality kind for h heads: per modality, ``(cols (h, v'), diags (h, s'))``.

    Args:
        q (`torch.Tensor`): (h, n, d) post-RoPE queries. k (`torch.Tensor`): (h, n, d) their keys (GQA: expanded).
    """
    h, n, d = q.shape
    if n != layout.n:
        raise ValueError(f"the layout covers {layout.n} tokens but the input has {n}")
    scale = d**-0.5 if scale is None else scale
    _, kperm = kind_orders(kind, layout)
    kinv = inverse_permutation(kperm)
    out = {}
    for mod in layout.modalities():
        rows = last_query_rows(layout, mod, last_q)
        qk = torch.bmm(q[:, rows].float(), k.float().transpose(1, 2)) * scale  # (h, m, n)
        qk.masked_fill_(torch.arange(n)[None, None, :] > rows[None, :, None], float("-inf"))
        probs = torch.softmax(qk, dim=-1)
        vert, slash = keyspace_scores(
            probs, rows, kperm, kinv, forced_columns=forced_columns, forced_diagonals=forced_diagonals
        )
        out[mod] = keyspace_topk(vert, slash, v, s)
    return out


def mm_estimate_from_map(
    a: torch.Tensor,
    layout: ModalityLayout,
    kind: str,
    v: int,
    s: int,
    *,
    last_q: int = 64,
    forced_columns: int = 30,
    forced_diagonals: int = 100,
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """`mm_estimate` of one head from its dense causal map `a` (n, n): the same rows of the same softmax."""
    _, kperm = kind_orders(kind, layout)
    kinv = inverse_permutation(kperm)
    out = {}
    for mod in layout.modalities():
        rows = last_query_rows(layout, mod, last_q)
        vert, slash = keyspace_scores(
            a[rows][None].clone(), rows, kperm, kinv, forced_columns=forced_columns, forced_diagonals=forced_diagonals
        )
        cols, diags = keyspace_topk(vert, slash, v, s)
        out[mod] = (cols[0], diags[0])
    return out


def mm_token_mask(
    kind: str, layout: ModalityLayout, est: dict[str, tuple[torch.Tensor, torch.Tensor]]
) -> torch.Tensor:
    """The (n, n) token-level mask M_K (original positions) of one head's per-modality index `est`.

    Row i of modality m keeps key j <= i when c(i) - c(j) is one of m's distances or c(j) one of m's key
    coordinates (c = key coordinate of the kind's ``kperm``); distance 0 (the diagonal) is always kept.
    """
    n = layout.n
    _, kperm = kind_orders(kind, layout)
    c = inverse_permutation(kperm)
    labels = layout.labels()
    mask = torch.zeros(n, n, dtype=torch.bool)
    for mod, (cols, diags) in est.items():
        rows = (labels == modality_code(mod)).nonzero()[:, 0]
        in_s = torch.zeros(2 * n - 1, dtype=torch.bool)
        in_s[diags[(diags > -n) & (diags < n)] + n - 1] = True
        in_s[n - 1] = True
        in_v = torch.zeros(n, dtype=torch.bool)
        in_v[cols] = True
        mask[rows] = in_s[c[rows][:, None] - c[None, :] + n - 1] | in_v[c][None, :]
    i = torch.arange(n)
    return mask & (i[None, :] <= i[:, None])


def _runs(c: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
    """Split rows (given by their key coordinates `c`) into runs of consecutive coordinates: [(order, c0)]."""
    order = c.argsort()
    cs = c[order]
    cut = [0, *((cs[1:] != cs[:-1] + 1).nonzero()[:, 0] + 1).tolist(), len(cs)]
    return [(order[a:e], int(cs[a])) for a, e in zip(cut[:-1], cut[1:]) if e > a]


def keyspace_sums(
    a: torch.Tensor, rows: torch.Tensor, kperm: torch.Tensor, kinv: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Distance and column sums of the map rows `rows` in key coordinates (c = kinv, key j' = original kperm[j']).

    Returns:
        ``(D, C)``: ``D[d + n - 1] = sum_{i in rows} sum_j a[i, j] [c(i) - c(j) = d]`` for d in (-n, n), and
        ``C[j'] = sum_{i in rows} a[i, kperm[j']]``. Per run of rows with consecutive key coordinates
        c0 .. c0 + L - 1, the columns are put in key order and row t is shifted right by L - 1 - t (flip, zero pad,
        strided view, as `patterns.diagonal_sums`), so each column of the shifted block holds one distance: O(L n),
        no index tensor.
    """
    n = a.shape[-1]
    dist = torch.zeros(2 * n - 1, dtype=a.dtype)
    cols = torch.zeros(n, dtype=a.dtype)
    identity = bool(torch.equal(kperm, torch.arange(n)))
    for order, c0 in _runs(kinv[rows]):
        r = rows[order]
        length = len(r)
        # one slice only when the rows are consecutive *and ascending* (one image in grid order is consecutive
        # as a set, a, a + S, ..., a + 1, ..., but not in order)
        contiguous = bool(torch.equal(r, torch.arange(int(r[0]), int(r[0]) + length)))
        b = a[int(r[0]) : int(r[-1]) + 1] if contiguous else a[r]  # (L, n): row t has key coordinate c0 + t
        if not identity:
            b = b[:, kperm]
        cols += b.sum(0)
        width = n + length
        z = torch.zeros(length, width, dtype=a.dtype)
        z[:, :n] = b.flip(0)
        col = z.reshape(-1).as_strided((length, n + length - 1), (width - 1, 1)).sum(0)  # u: d = c0 + L - 1 - u
        lo = c0 - (n - 1)  # distance of the last u
        dist[lo + n - 1 : c0 + length - 1 + n] += col.flip(0)
    return dist, cols


def mm_recall(
    a: torch.Tensor, kind: str, layout: ModalityLayout, est: dict[str, tuple[torch.Tensor, torch.Tensor]]
) -> float:
    """Exact recall of `mm_token_mask` on the causal map `a` without building the (n, n) mask.

    Per modality m: the mass of m's rows on kept distances plus on kept key coordinates (`keyspace_sums`), minus
    the mass counted twice (a gather of |V| x |S| entries), over n rows. The map is causal (zero above the
    diagonal), so the causal part of the mask needs no work. Equal to ``recall(a, mm_token_mask(...))``.
    """
    n = a.shape[-1]
    _, kperm = kind_orders(kind, layout)
    kinv = inverse_permutation(kperm)
    labels = layout.labels()
    total = a.new_zeros(())
    for mod, (cols, diags) in est.items():
        code = modality_code(mod)
        rows = (labels == code).nonzero()[:, 0]
        d = torch.unique(torch.cat([diags[(diags > -n) & (diags < n)], torch.zeros(1, dtype=torch.long)]))
        v = torch.unique(cols)
        dsum, csum = keyspace_sums(a, rows, kperm, kinv)
        total = total + dsum[d + n - 1].sum() + csum[v].sum()
        # counted twice: key coordinate j' in V seen from a row of m at coordinate j' + d, d in S
        cq = v[None, :] + d[:, None]  # (|S|, |V|) row coordinates
        ri = kperm[cq.clamp(0, n - 1)]  # their original rows
        ok = (cq >= 0) & (cq < n) & (labels[ri] == code)
        total = total - (a[ri, kperm[v][None, :].expand_as(ri)] * ok).sum()
    return float(total / n)


def group_recall(a: torch.Tensor, group: HeadGroup, n: int, block_size: int) -> float:
    """Recall of what the kernel computes for one head of `group` (`blocks.effective_mask`), from its blocks.

    Each block's rows keep the block's keys at or before them: a is causal, so that mass is
    ``a[rows][:, keys].sum()``; dense rows keep everything (recall 1). Equal to ``recall(a, effective_mask(...))``.
    """
    starts, ends = block_bounds(group, n, block_size)
    qperm = torch.arange(n) if group.qperm is None else group.qperm
    per_row = torch.zeros(n, dtype=a.dtype)
    for b in range(len(starts)):
        r0, r1, m = int(starts[b]), int(ends[b]), int(group.counts[b])
        keys = group.keys[b, :m]
        pos = keys if group.kperm is None else group.kperm[keys]
        rows = qperm[r0:r1]
        per_row[rows] = a[rows[:, None], pos[None, :]].sum(-1)
    if len(group.rows):
        per_row[group.rows] = a[group.rows].sum(-1)
    return float(per_row.mean())


# ---------------------------------------------------------------------------------------------------------------
# blocks and head groups


def mm_blocks(
    layout: ModalityLayout, qperm: torch.Tensor, kperm: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Query blocks along `qperm`: ``(starts (n_blocks + 1,), modality (n_blocks,))``.

    A block never mixes modalities, holds rows with consecutive key coordinates (one slash = one contiguous key
    range) and ascending original positions (no block straddles two grid phases), and has <= `block_size` rows.
    """
    n = layout.n
    c = inverse_permutation(kperm)[qperm]  # key coordinate of every permuted row
    lab = layout.labels()[qperm]
    brk = torch.ones(n, dtype=torch.bool)
    brk[1:] = (lab[1:] != lab[:-1]) | (c[1:] != c[:-1] + 1) | (qperm[1:] < qperm[:-1])
    seg = [*brk.nonzero()[:, 0].tolist(), n]
    starts = [b for a, e in zip(seg[:-1], seg[1:]) for b in range(a, e, block_size)]
    starts_t = torch.tensor([*starts, n], dtype=torch.long)
    return starts_t, lab[starts_t[:-1]]


def block_purity(group: HeadGroup, layout: ModalityLayout, block_size: int) -> float:
    """Fraction of the group's query blocks whose rows all belong to one modality."""
    n = layout.n
    starts, ends = block_bounds(group, n, block_size)
    qperm = torch.arange(n) if group.qperm is None else group.qperm
    lab = layout.labels()[qperm]
    pure = [bool((lab[int(a) : int(e)] == lab[int(a)]).all()) for a, e in zip(starts, ends)]
    return sum(pure) / max(1, len(pure))


def mm_head_groups(
    q: torch.Tensor,
    k: torch.Tensor,
    patterns: dict[int, Sequence[Any]],
    layout: ModalityLayout,
    *,
    block_size: int = 128,
    last_q: int = 64,
    scale: float | None = None,
    forced_columns: int = 30,
    forced_diagonals: int = 100,
) -> list[HeadGroup]:
    """One permuted `HeadGroup` per mixed-modality head (``(kind, v, s)`` in `patterns`), estimated online.

    Heads of one (kind, v, s) are estimated in one batched matmul per modality; each head then gets its own block
    keys: for the blocks of modality m, the union of m's slashes (contiguous key ranges) and verticals.

    Args:
        q (`torch.Tensor`): (h_q, n, d). k (`torch.Tensor`): (h_kv, n, d).
    """
    hq, n, _ = q.shape
    group = hq // k.shape[0]
    by_kind: dict[tuple[str, int, int], list[int]] = {}
    for h, p in patterns.items():
        by_kind.setdefault((str(p[0]), int(p[1]), int(p[2])), []).append(h)
    groups: list[HeadGroup] = []
    for (kind, v_size, s_size), heads in by_kind.items():
        qperm, kperm = kind_orders(kind, layout)
        starts, bmod = mm_blocks(layout, qperm, kperm, block_size)
        lengths = starts[1:] - starts[:-1]
        nb = len(lengths)
        c0 = inverse_permutation(kperm)[qperm[starts[:-1]]]
        c1 = c0 + lengths
        block_of_row = torch.repeat_interleave(torch.arange(nb), lengths)
        row_max = torch.zeros(nb, dtype=torch.long).scatter_reduce(0, block_of_row, qperm, "amax", include_self=False)
        identity_k = bool(torch.equal(kperm, torch.arange(n)))
        kv = torch.tensor([h // group for h in heads])
        est = mm_estimate(
            q[heads],
            k[kv],
            layout,
            kind,
            v_size,
            s_size,
            last_q=last_q,
            scale=scale,
            forced_columns=forced_columns,
            forced_diagonals=forced_diagonals,
        )
        for i, h in enumerate(heads):
            cov = torch.zeros(nb, n, dtype=torch.bool)
            for mod, (cols, diags) in est.items():
                sel = bmod == MODALITIES.index(mod)
                cov[sel] = range_coverage(
                    diags[i], cols[i], c0[sel], c1[sel], n, key_pos=None if identity_k else kperm, row_max=row_max[sel]
                )
            keys, counts = block_keys(cov)
            groups.append(
                HeadGroup(
                    torch.tensor([h]),
                    keys,
                    counts,
                    torch.zeros(0, dtype=torch.long),
                    qperm=qperm,
                    kperm=None if identity_k else kperm,
                    starts=starts,
                )
            )
    return groups


# ---------------------------------------------------------------------------------------------------------------
# offline search over the mixed-modality kinds


def mm_search_space(v: int, s: int, *, grid: bool = True) -> list[tuple]:
    """The ordered mixed-modality search space at one budget: official ``no_shuffle`` VS, ``shuffle_q``, then ours.

    The official order (``mix_modality_pattern_search_attn_delta``) lists no-permutation VS before Q-boundary, so a
    permuted kind is chosen only when it raises recall by more than ``minimal_delta``; the 2D-boundary and grid
    kinds (commented out / not released there) follow. `grid` drops ``vision_grid`` (no image row stride).
    """
    kinds = [k for k in MM_SPACE_KINDS if grid or k != "vision_grid"]
    return [(k, int(v), int(s)) for k in kinds]


def search_mm_head(
    a: torch.Tensor,
    layout: ModalityLayout,
    space: Sequence[tuple],
    *,
    minimal_delta: float = 0.01,
    last_q: int = 64,
    forced_columns: int = 30,
    forced_diagonals: int = 100,
) -> tuple[tuple, dict[str, float]]:
    """Official ``pattern_search_attn_delta`` rule over mixed-modality kinds for one head's dense map `a` (n, n).

    Recall of each candidate is that of its token-level mask (`mm_token_mask`; VS: `patterns.pattern_sets`),
    estimated from the same last queries the online index uses. A later candidate replaces the best only if it
    raises recall by more than `minimal_delta`.

    Returns:
        ``(best, recalls)``: the best ``(kind, v, s)`` (the first candidate if none clears the delta) and each
        candidate's recall, keyed ``"kind_v_s"``.
    """
    n = a.shape[-1]
    best, best_recall = None, 0.0
    recalls: dict[str, float] = {}
    stats = None
    for cand in space:
        kind, v_size, s_size = cand[0], int(cand[1]), int(cand[2])
        if kind == "vs_attn":
            stats = stats or _MapStats(a)
            m = min(last_q, n)
            vs = vs_topk(
                *vs_scores(a[-m:].clone(), forced_columns=forced_columns, forced_diagonals=forced_diagonals),
                v_size,
                s_size,
            )
            rec = stats.recall(pattern_sets(tuple(cand), n, vs_indices=vs))
        else:
            est = mm_estimate_from_map(
                a,
                layout,
                kind,
                v_size,
                s_size,
                last_q=last_q,
                forced_columns=forced_columns,
                forced_diagonals=forced_diagonals,
            )
            rec = mm_recall(a, kind, layout, est)
        recalls["_".join(map(str, cand))] = rec
        if rec - best_recall > minimal_delta:
            best, best_recall = tuple(cand), rec
    return (best if best is not None else tuple(space[0])), recalls


def search_mm_patterns(
    captured: dict[int, tuple[torch.Tensor, torch.Tensor]],
    layout: ModalityLayout,
    space: Sequence[tuple],
    *,
    minimal_delta: float = 0.01,
    last_q: int = 64,
    scale: float | None = None,
    forced_columns: int = 30,
    forced_diagonals: int = 100,
) -> tuple[dict[int, dict[int, list]], dict[int, dict[int, dict[str, float]]]]:
    """`search_mm_head` for every (layer, head) of one calibration input (layer -> (q (h_q, n, d), k (h_kv, n, d))).

    Returns:
        ``(best, recalls)``: ``best[layer][head] = [kind, v, s, recall]`` and every candidate's recall per head.
    """
    best: dict[int, dict[int, list]] = {}
    all_recalls: dict[int, dict[int, dict[str, float]]] = {}
    for layer, (q, k) in sorted(captured.items()):
        hq, hkv = q.shape[0], k.shape[0]
        best[layer], all_recalls[layer] = {}, {}
        for h in range(hq):
            a = causal_attention_probs(q[h], k[h // (hq // hkv)], scale)
            pat, recs = search_mm_head(
                a,
                layout,
                space,
                minimal_delta=minimal_delta,
                last_q=last_q,
                forced_columns=forced_columns,
                forced_diagonals=forced_diagonals,
            )
            best[layer][h] = [*pat, recs["_".join(map(str, pat))]]
            all_recalls[layer][h] = recs
    return best, all_recalls


__all__ = [
    "MM_SPACE_KINDS",
    "MODALITIES",
    "ModalityLayout",
    "block_purity",
    "grid_order",
    "inverse_permutation",
    "keyspace_scores",
    "keyspace_topk",
    "kind_orders",
    "last_query_rows",
    "mm_blocks",
    "mm_estimate",
    "mm_estimate_from_map",
    "group_recall",
    "keyspace_sums",
    "mm_head_groups",
    "mm_recall",
    "mm_search_space",
    "mm_token_mask",
    "modality_permutation",
    "search_mm_head",
    "search_mm_patterns",
]
