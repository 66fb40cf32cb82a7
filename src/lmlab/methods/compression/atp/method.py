"""ATP: s_i = S - beta (L - 1)/2 + i beta (i = 0..L-1), an increasing arithmetic progression of block sparsities.

Huang, Zhang, Zheng, Chao & Ji, "Determining Layer-wise Sparsity for Large Language Models Through a Theoretical
Perspective", ICML 2025 (https://arxiv.org/abs/2502.14770; official code github.com/wzhuang-xmu/ATP, `main.py`,
`search.sh`). Pure: no I/O, no printing.

The allocation has one parameter, the common difference beta >= 0:

    first = S - beta (L - 1) / 2,   s_i = first + i beta   =>   mean(s) = S, block 0 (next to the embeddings) densest
    legal iff  beta <= min(2 S / (L - 1), 2 (1 - S) / (L - 1))   (every s_i in [0, 1]; the official code exits on
                                                                  "Illegal beta", we raise ValueError)

Every linear of block i (q, k, v, o, gate, up, down) is pruned at s_i by the base pruner (Wanda or SparseGPT) in the
sequential calibration engine. beta is chosen by grid search on held-out perplexity (`search.sh`: beta = 0.002,
0.004, ... while legal); lmlab chooses it on a validation split, not the test split the official script uses.
The motivation is the "reconstruction error explosion": a block's output error is its own pruning error plus its
inputs' error amplified, so errors compound with depth and the early blocks should be pruned less.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


def max_beta(n_blocks: int, sparsity: float) -> float:
    """The largest legal common difference: min(2 S, 2 (1 - S)) / (L - 1)."""
    if n_blocks < 2:
        return 0.0
    return min(2.0 * sparsity, 2.0 * (1.0 - sparsity)) / (n_blocks - 1)


def layer_sparsities(n_blocks: int, sparsity: float, beta: float) -> list[float]:
    """Per-block sparsity s_0..s_{L-1} (block 0 nearest the embeddings). Raises ValueError for an illegal beta.

    A negative beta gives the reversed (decreasing) progression, the sanity-check baseline; its legality bound is
    the same in |beta|.
    """
    if n_blocks < 1:
        raise ValueError(f"n_blocks={n_blocks}: expected at least 1 transformer block")
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity={sparsity}: expected a target mean sparsity in [0, 1)")
    bound = max_beta(n_blocks, sparsity)
    if abs(beta) > bound + 1e-12:
        raise ValueError(
            f"beta={beta}: illegal for L={n_blocks} blocks at mean sparsity {sparsity}; expected |beta| <= {bound:.6f}"
        )
    first = sparsity - beta * (n_blocks - 1) / 2.0
    # clamp only float round-off at the legal edge (a legal beta keeps every rate in [0, 1] exactly)
    return [min(1.0, max(0.0, first + i * beta)) for i in range(n_blocks)]


def beta_grid(n_blocks: int, sparsity: float, step: float = 0.002, stop: float | None = None) -> list[float]:
    """The official search grid: 0 (uniform), step, 2 step, ... while legal (and <= stop when given)."""
    if step <= 0:
        raise ValueError(f"step={step}: expected a positive grid step")
    bound = max_beta(n_blocks, sparsity) if stop is None else min(stop, max_beta(n_blocks, sparsity))
    grid, k = [0.0], 1
    while k * step <= bound + 1e-12:
        grid.append(round(k * step, 10))
        k += 1
    return grid


@dataclass
class SearchResult:
    """The beta search: the chosen beta, its allocation, and the validation score of every beta tried."""

    best_beta: float
    sparsities: list[float]
    table: list[dict] = field(default_factory=list)  # {"beta", "val_ppl"} per beta, in grid order


def walk_grid(
    evaluate: Callable[[float], float], candidates: Sequence[float], patience: int = 0, *, key: str = "value"
) -> list[dict]:
    """Score `candidates` in order with `evaluate` (lower is better); ``patience = p > 0`` stops after p consecutive
    candidates that do not improve on the best so far. Returns ``[{key: candidate, "val_ppl": score}, ...]``.

    One rule for ATP's beta and for the baselines' knobs (OWL's lambda), so both get the same search budget.
    """
    if patience < 0:
        raise ValueError(f"patience={patience}: expected 0 (whole grid) or a positive number of candidates")
    table: list[dict] = []
    worse_in_a_row = 0
    for value in candidates:
        score = float(evaluate(value))
        improved = not table or score < min(row["val_ppl"] for row in table)
        table.append({key: float(value), "val_ppl": score})
        worse_in_a_row = 0 if improved else worse_in_a_row + 1
        if patience and worse_in_a_row >= patience:
            break
    return table


def search_beta(
    evaluate: Callable[[list[float]], float],
    n_blocks: int,
    sparsity: float,
    betas: Sequence[float],
    patience: int = 0,
) -> SearchResult:
    """beta* = argmin_beta evaluate(layer_sparsities(L, S, beta)); `evaluate` prunes a fresh copy of the model with
    the given per-block list and returns its validation perplexity (ties go to the smaller beta).

    The grid is walked in the given order. ``patience = 0`` evaluates every beta (the official `search.sh`);
    ``patience = p > 0`` stops after p consecutive betas that do not improve on the best so far, which on the
    U-shaped validation curve (perplexity falls, then explodes as the top block approaches 100% sparsity) skips only
    the collapsed end of the grid.
    """
    if not betas:
        raise ValueError("betas=[]: expected at least one beta to try")
    table = walk_grid(lambda beta: evaluate(layer_sparsities(n_blocks, sparsity, beta)), betas, patience, key="beta")
    best = min(table, key=lambda row: (row["val_ppl"], abs(row["beta"])))
    return SearchResult(best["beta"], layer_sparsities(n_blocks, sparsity, best["beta"]), table)
