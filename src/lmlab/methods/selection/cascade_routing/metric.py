"""The metric (official ``utils.area_under_curve``): area under the (cost, quality) curve of a budget sweep between the
cheapest and the most expensive single model, divided by that cost range, flat past the last point, x100.

`budget_sweep` places the budgets on the intervals between the costs of the single models on the Pareto hull
(``baselines.pareto_hull``). `SplitOutcomes` keeps one split's per-query test results so that the AUCs can be
recomputed with the test queries reweighted (the query bootstrap of the claims); `query_bootstrap_weights` draws
those weights, stratified by cache seed. numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lmlab.methods.selection.cascade_routing.baselines import pareto_hull

# ----------------------------------------------------------------------------------------------------------------
# the metric


def area_under_curve(costs: Sequence[float], qualities: Sequence[float], cost_min: float, cost_max: float,
                     quality_floor: float) -> float:  # fmt: skip
    """Normalised area under the quality-cost curve on [cost_min, cost_max] (official ``area_under_curve``):
    linear between points, flat at the last quality past the last point, `quality_floor` before the first."""
    if not cost_max > cost_min:
        raise ValueError(f"cost_max must be > cost_min, got {cost_min}, {cost_max}")
    if len(costs) == 0 or len(costs) != len(qualities):
        raise ValueError(
            f"costs and qualities must be non-empty and of equal length, got {len(costs)}, {len(qualities)}"
        )
    pts = np.unique(np.stack([np.asarray(costs, float), np.asarray(qualities, float)], axis=1), axis=0)
    x, y = pts[:, 0], pts[:, 1]
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]

    def interp(t: float) -> float:
        if len(x) == 1:
            return float(y[0])
        if t <= x[0]:
            j = 1
        elif t >= x[-1]:
            j = len(x) - 1
        else:
            j = int(np.searchsorted(x, t))
        x0, x1, y0, y1 = x[j - 1], x[j], y[j - 1], y[j]
        return float(y0 + (y1 - y0) * (t - x0) / (x1 - x0)) if x1 != x0 else float(y1)

    xs, ys = list(x), list(y)
    if xs[-1] < cost_max:
        xs.append(cost_max)
        ys.append(ys[-1])
    if xs[0] > cost_min:
        xs.append(cost_min)
        ys.append(quality_floor)
    if cost_min not in xs:
        xs.append(cost_min)
        ys.append(interp(cost_min))
    if cost_max not in xs:
        xs.append(cost_max)
        ys.append(interp(cost_max))
    o = np.argsort(xs, kind="stable")
    xa, ya = np.asarray(xs)[o], np.asarray(ys)[o]
    keep = (xa >= cost_min) & (xa <= cost_max)
    xa, ya = xa[keep], ya[keep]
    area = float(np.sum((xa[1:] - xa[:-1]) * (ya[1:] + ya[:-1]) / 2.0))
    return area / (cost_max - cost_min)


def budget_sweep(
    single_costs: Sequence[float], single_qualities: Sequence[float], per_interval: int = 5
) -> np.ndarray:
    """Budgets: `per_interval` points on each interval between consecutive hull models' costs (official)."""
    hc, _ = pareto_hull(single_costs, single_qualities)
    if len(hc) < 2:
        return np.array([float(min(single_costs)), float(max(single_costs))])
    return np.concatenate([np.linspace(hc[i], hc[i + 1], per_interval) for i in range(len(hc) - 1)])


@dataclass
class SplitOutcomes:
    """One split's test results per query, per system and budget of the sweep (the λs tuned and fixed).

    ``cost[name]`` / ``quality[name]``: [n_budgets, n_test] true cost and quality of each test query under system
    `name` at each budget; ``single_cost`` / ``single_quality``: [n_test, V] of the single models (the AUC's cost
    range, its floor and the linear baseline). A curve point is the (weighted) mean over test queries.
    """

    cost: dict[str, np.ndarray]
    quality: dict[str, np.ndarray]
    single_cost: np.ndarray
    single_quality: np.ndarray

    def aucs(self, weights: np.ndarray | None = None) -> dict[str, float]:
        """AUC x100 of every system and of ``linear`` (the hull of single models), the test queries weighted by
        `weights` [n_test] (bootstrap counts; None: each query once, the point estimate)."""
        n = self.single_cost.shape[0]
        w = np.ones(n) if weights is None else np.asarray(weights, float)
        if w.shape != (n,) or (w < 0).any() or w.sum() <= 0:
            raise ValueError(f"weights must be {n} non-negative numbers with a positive sum")
        w = w / w.sum()
        sc, sq = w @ self.single_cost, w @ self.single_quality
        lo, hi, floor = float(sc.min()), float(sc.max()), float(sq.min())
        out = {name: 100 * area_under_curve(self.cost[name] @ w, self.quality[name] @ w, lo, hi, floor)
               for name in self.cost}  # fmt: skip
        hc, hq = pareto_hull(sc, sq)
        out["linear"] = 100 * area_under_curve(hc, hq, lo, hi, floor)
        return out


def query_bootstrap_weights(sizes: Sequence[int], n_resamples: int, seed: int = 0) -> list[list[np.ndarray]]:
    """Stratified query bootstrap: per resample, per stratum (a cache seed) of `sizes[s]` queries, the count of each
    query in a resample of `sizes[s]` draws with replacement (multinomial); ``out[b][s]`` has shape [sizes[s]]."""
    if n_resamples < 1 or any(n < 1 for n in sizes):
        raise ValueError(f"need n_resamples >= 1 and strata of >= 1 query, got {n_resamples}, {list(sizes)}")
    rng = np.random.default_rng(seed)
    return [[rng.multinomial(n, np.full(n, 1.0 / n)).astype(float) for n in sizes] for _ in range(n_resamples)]


def n_for_power(se: float, n_has: int, effect: float, *, confidence: float = 0.95, power: float = 0.8) -> int:
    """Units a check needs to find `effect` with probability `power`, given the standard error `se` of its effect at
    `n_has` units (SE ∝ 1/√n): ``ceil(n_has (z_{(1+confidence)/2} + z_power)² se² / effect²)``."""
    from scipy.stats import norm

    if not effect or se < 0 or n_has < 1:
        raise ValueError(f"need a non-zero effect, se >= 0 and n_has >= 1; got {effect}, {se}, {n_has}")
    z = float(norm.ppf(0.5 + confidence / 2.0) + norm.ppf(power))
    return max(1, math.ceil(n_has * (z * se / effect) ** 2))


__all__ = [
    "SplitOutcomes",
    "area_under_curve",
    "budget_sweep",
    "n_for_power",
    "query_bootstrap_weights",
]
