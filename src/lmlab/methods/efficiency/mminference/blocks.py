"""MMInference / MInference block-sparse index structures: block coverage, head groups, layer index, block keys.

The kernel (`method.sparse_attention`) runs queries in blocks of ``block_size`` rows (or, for MMInference's permuted
groups, in the blocks `modality.mm_blocks` cuts along the permuted row order); each block attends the union over
its rows of the pattern's keys (a slash becomes a contiguous key range, MInference's ``block_offset``; a vertical a
gathered column). `range_coverage` / `block_coverage` give those key sets, `block_keys` lists them per block,
`HeadGroup` holds one group of heads sharing such an index and `LayerIndex` one layer's groups. `effective_mask` is
the token-level mask the kernel computes for a group (the pattern expanded to block granularity).

Everything here is pure: tensors in, tensors out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lmlab.methods.efficiency.mminference.patterns import PatternSets

# ---------------------------------------------------------------------------------------------------------------
# online index: block coverage, head groups and block keys


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


__all__ = [
    "HeadGroup",
    "LayerIndex",
    "block_bounds",
    "block_coverage",
    "block_keys",
    "effective_mask",
    "range_coverage",
]
