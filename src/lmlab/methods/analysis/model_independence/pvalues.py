"""p-values: LAP matching of units, Spearman, Fisher.

* `match_units`: π = LAP over the rows (units) of two (h, k) matrices (squared Euclidean distances, minimised, as
  MATCH; or cosine similarities, maximised, as CSW / CSH). Float64 costs.
* `spearman_p`: two-sided p of Spearman's ρ; `identity_test` = Spearman(π, identity) (the constrained tests);
  `match_pvalue` = Spearman(π_gate, π_up) (MATCH of one block pair).
* `fisher_combine`: χ² = −2 Σ_l log p_l, df = 2L; `BlockTest` holds per-block p-values and their Fisher aggregate.

p-values of 0 are clipped at `P_FLOOR` for logs and Fisher. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

# a p-value of 0 (e.g. Spearman of two identical permutations of 1536 units) is clipped here for logs and Fisher
P_FLOOR = 1e-300


def spearman_p(x: Sequence[float], y: Sequence[float]) -> float:
    """Two-sided p-value of Spearman's ρ (``scipy.stats.spearmanr``); NaN for a constant input (code: skipped)."""
    from scipy.stats import spearmanr

    x, y = np.asarray(x), np.asarray(y)
    if x.size < 3 or np.all(x == x[0]) or np.all(y == y[0]):
        return float("nan")
    return float(spearmanr(x, y).pvalue)


def fisher_combine(pvalues: Sequence[float]) -> float:
    """FISHER: χ² = −2 Σ log p_l, df = 2L (``scipy.stats.combine_pvalues``); NaNs skipped as in ``csu.py``.

    Assumes independent p-values across blocks (approximately true; the paper states the same).
    """
    from scipy.stats import combine_pvalues

    ps = [max(float(p), P_FLOOR) for p in pvalues if not math.isnan(float(p))]
    if not ps:
        return float("nan")
    return float(combine_pvalues(ps, method="fisher").pvalue)


def neg_log10(p: float) -> float:
    """−log10 p, with p clipped at 1e-300 (a Spearman p of exactly 0 reads as 300)."""
    return float("nan") if math.isnan(p) else -math.log10(max(p, P_FLOOR))


def _cosine(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(n, m) cosine similarities of the rows of x (n, k) and y (m, k), float64."""
    x, y = x.detach().double(), y.detach().double()
    xn = x / x.norm(dim=1, keepdim=True).clamp_min(1e-300)
    yn = y / y.norm(dim=1, keepdim=True).clamp_min(1e-300)
    return xn @ yn.T


def _sq_dists(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(n, m) squared Euclidean distances of rows (code ``tracing/utils/utils.py:pdists``), float64."""
    x, y = x.detach().double(), y.detach().double()
    return (x * x).sum(1)[:, None] + (y * y).sum(1)[None, :] - 2.0 * (x @ y.T)


def match_units(x_a: torch.Tensor, x_b: torch.Tensor, cost: str = "sqeuclidean") -> np.ndarray:
    """Hungarian matching of the rows (units) of x_a (h_a, k) to those of x_b (h_b, k), h_a <= h_b.

    ``cost="sqeuclidean"``: LAP minimising squared distances (``match_wmats``, used by MATCH); ``"cosine"``: LAP
    maximising cosine similarity (``csu.py`` / ``csh.py``; the paper's Algorithm 2). Float64 costs (the code casts).
    Returns the (h_a,) matched row of x_b for every row of x_a. Argmax instead of the LAP is not a permutation (the
    code notes it "does not work as well").
    """
    from scipy.optimize import linear_sum_assignment

    if x_a.dim() != 2 or x_b.dim() != 2 or x_a.shape[1] != x_b.shape[1]:
        raise ValueError(
            f"match_units needs (h_a, k) and (h_b, k) matrices, got {tuple(x_a.shape)}, {tuple(x_b.shape)}"
        )
    if x_a.shape[0] > x_b.shape[0]:
        raise ValueError(f"match_units needs h_a <= h_b, got {x_a.shape[0]} > {x_b.shape[0]}; swap the models")
    if cost == "sqeuclidean":
        rows, cols = linear_sum_assignment(_sq_dists(x_a, x_b).numpy())
    elif cost == "cosine":
        rows, cols = linear_sum_assignment(_cosine(x_a, x_b).numpy(), maximize=True)
    else:
        raise ValueError(f"cost must be 'sqeuclidean' or 'cosine', got {cost!r}")
    out = np.empty(x_a.shape[0], dtype=np.int64)
    out[rows] = cols
    return out


def identity_test(x_a: torch.Tensor, x_b: torch.Tensor, cost: str = "cosine") -> tuple[float, np.ndarray]:
    """SPEARMAN(MATCH(x_a, x_b), identity): the constrained tests (CSW on weights, CSH on activations)."""
    if x_a.shape[0] != x_b.shape[0]:
        raise ValueError(f"the constrained tests need equal widths, got {x_a.shape[0]} and {x_b.shape[0]} units")
    pi = match_units(x_a, x_b, cost)
    return spearman_p(pi, np.arange(len(pi))), pi


def match_pvalue(
    gate_a: torch.Tensor, up_a: torch.Tensor, gate_b: torch.Tensor, up_b: torch.Tensor, cost: str = "sqeuclidean"
) -> float:
    """MATCH of one block pair: Spearman(π_gate, π_up) with π = LAP on unit activations (units, columns).

    With unequal widths the narrower model is the row side (a rectangular LAP matches min(h_a, h_b) units) and the
    rank correlation uses the matched pairs only.
    """
    if gate_a.shape[0] > gate_b.shape[0]:
        gate_a, up_a, gate_b, up_b = gate_b, up_b, gate_a, up_a
    pi_gate = match_units(gate_a, gate_b, cost)
    pi_up = match_units(up_a, up_b, cost)
    return spearman_p(pi_gate, pi_up)


@dataclass
class BlockTest:
    """Per-block p-values of a test and their Fisher aggregate."""

    blocks: list[tuple[int, int]]  # (block of model a, block of model b)
    p: list[float]

    @property
    def aggregate(self) -> float:
        return fisher_combine(self.p)


__all__ = [
    "BlockTest",
    "fisher_combine",
    "identity_test",
    "match_pvalue",
    "match_units",
    "neg_log10",
    "spearman_p",
]
