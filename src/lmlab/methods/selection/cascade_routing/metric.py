"""The metric (official ``utils.area_under_curve``): area under the (cost, quality) curve of a budget sweep between the
cheapest and the most expensive single model, divided by that cost range, flat past the last point, x100.

`budget_sweep` places the budgets on the intervals between the costs of the single models on the Pareto hull
(``baselines.pareto_hull``). numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence

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


__all__ = [
    "area_under_curve",
    "budget_sweep",
]
