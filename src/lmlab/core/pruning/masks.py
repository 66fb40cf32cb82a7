"""Pruning masks: which weights to zero, given a score per weight (lower score = pruned first).

All masks are boolean tensors shaped like the weight, ``True`` where the weight is pruned. Every selection uses a
stable sort, so tied scores (common in GGUF-dequantised weights, which take 16 levels per 32-weight block) are broken
by position and the masks are deterministic. The counts are exact: ``int(n * sparsity)`` entries per comparison group.
"""

from __future__ import annotations

import re

import torch

STRUCTURES = ("unstructured", "2:4", "4:8")


def parse_mask_structure(structure: str | None) -> tuple[int, int] | None:
    """``"unstructured"`` (or None) -> None; ``"N:M"`` -> ``(N, M)``, meaning *prune N of every M* (official Wanda).

    Args:
        structure (`str`): ``"unstructured"``, ``"2:4"``, ``"4:8"`` or any ``"N:M"`` with ``0 < N < M``.
    """
    if structure is None or structure == "unstructured":
        return None
    match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", str(structure))
    if not match:
        raise ValueError(f"mask_structure must be 'unstructured' or 'N:M' (e.g. '2:4'), got {structure!r}")
    n, m = int(match.group(1)), int(match.group(2))
    if not 0 < n < m:
        raise ValueError(f"mask_structure N:M needs 0 < N < M, got {structure!r}")
    return n, m


def structure_sparsity(structure: str | None, sparsity: float) -> float:
    """The target sparsity of a layer: ``N/M`` for an N:M structure, else `sparsity`."""
    nm = parse_mask_structure(structure)
    return nm[0] / nm[1] if nm else float(sparsity)


def lowest_k(scores: torch.Tensor, k: int, dim: int = -1) -> torch.Tensor:
    """Mask of the `k` lowest entries along `dim`, ties broken by position (lower index first).

    The same set as the first `k` indices of ``torch.sort(scores, dim, stable=True)``, found with `torch.kthvalue`
    (several times faster than a stable sort on CPU).
    """
    n = scores.shape[dim]
    if k <= 0:
        return torch.zeros_like(scores, dtype=torch.bool)
    if k >= n:
        return torch.ones_like(scores, dtype=torch.bool)
    thr = torch.kthvalue(scores, k, dim=dim, keepdim=True).values
    below = scores < thr
    tied = scores == thr
    need = k - below.sum(dim=dim, keepdim=True)
    return below | (tied & (tied.cumsum(dim=dim) <= need))


def row_mask(scores: torch.Tensor, sparsity: float) -> torch.Tensor:
    """Per output row, prune the ``int(C_in * sparsity)`` lowest scores (Wanda's comparison group, stable order).

    Args:
        scores: (C_out, C_in) scores.
        sparsity: fraction of each row to prune, in [0, 1].
    """
    return lowest_k(scores, int(scores.shape[1] * sparsity), dim=1)


def matrix_mask(scores: torch.Tensor, sparsity: float) -> torch.Tensor:
    """Over the whole matrix (row-major order), prune the ``int(numel * sparsity)`` lowest scores (per-layer group)."""
    return lowest_k(scores.reshape(-1), int(scores.numel() * sparsity), dim=0).view_as(scores)


def nm_mask(scores: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """In each row and each group of `m` consecutive input columns, prune the `n` lowest scores.

    Args:
        scores: (C_out, C_in) scores; C_in must be a multiple of `m`.
        n, m: prune n of every m.
    """
    rows, cols = scores.shape
    if cols % m:
        raise ValueError(f"N:M = {n}:{m} needs the input size to be a multiple of {m}, got {cols}")
    groups = scores.reshape(rows, cols // m, m)  # (C_out, C_in/m, m)
    idx = torch.sort(groups, dim=-1, stable=True).indices[..., :n]
    mask = torch.zeros_like(groups, dtype=torch.bool)
    mask.scatter_(-1, idx, True)
    return mask.reshape(rows, cols)


def nm_valid(weight: torch.Tensor, n: int, m: int) -> bool:
    """Whether every group of `m` consecutive input weights of every row has at least `n` zeros."""
    rows, cols = weight.shape
    zeros = (weight.reshape(rows, cols // m, m) == 0).sum(-1)
    return bool((zeros >= n).all())


__all__ = [
    "STRUCTURES",
    "lowest_k",
    "matrix_mask",
    "nm_mask",
    "nm_valid",
    "parse_mask_structure",
    "row_mask",
    "structure_sparsity",
]
