"""The baselines cascade routing is compared with (Dekoninck et al., ICML 2025; official ``router.py``,
``baseline_cascader.py``, ``utils.remove_redundant_models``).

- `route`: the router (Sec. 3), one step from the ex-ante estimates, argmax_i q̂_i - λ ĉ_i with one λ.
- `threshold_cascade`: the threshold cascade ("thresholding"), continue past model j while q̂_j (post-hoc) < 1 - λ_j;
  the answer is the last model's.
- `pareto_hull`: the single models on the upper convex hull of (cost, quality), the "linear" interpolation baseline
  (and the budget grid of ``metric.budget_sweep``).

The optimal cascade is `CascadeRouter(cascade=True)` in ``method.py``. numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# ----------------------------------------------------------------------------------------------------------------
# the router and the threshold cascade


def route(q_ex: np.ndarray, cost_hat: np.ndarray, lam: float, *, mode: str = "cheapest", gamma: float = 0.0,
          rng: np.random.Generator | None = None, rounding: int = 6) -> np.ndarray:  # fmt: skip
    """The router's model per query: argmax_i q̂_i - λ ĉ_i (ties: cheapest / expensive / γ-random); shape [Q]."""
    score = np.round(q_ex - lam * cost_hat[None], rounding)
    tied = score == score.max(axis=1, keepdims=True)
    cheap = np.where(tied, cost_hat[None], np.inf).argmin(axis=1)
    exp = np.where(tied, cost_hat[None], -np.inf).argmax(axis=1)
    if mode == "cheapest":
        return cheap
    if mode == "expensive":
        return exp
    u = (rng or np.random.default_rng(0)).random(len(q_ex))
    return np.where(u < gamma, exp, cheap)


def threshold_cascade(q_post_last: np.ndarray, lambdas: Sequence[float]) -> np.ndarray:
    """Index of the last model run per query: continue past model j while q̂_j < 1 - λ_j; shape [Q].

    `q_post_last[:, j]` is model j's post-hoc quality estimate after running models 0..j.
    """
    nq, v = q_post_last.shape
    last = np.full(nq, v - 1)
    done = np.zeros(nq, bool)
    for j in range(v - 1):
        stop = ~done & (q_post_last[:, j] >= 1.0 - lambdas[j])
        last[stop] = j
        done |= stop
    return last


# ----------------------------------------------------------------------------------------------------------------
# the linear baseline


def pareto_hull(costs: Sequence[float], qualities: Sequence[float]) -> tuple[list[float], list[float]]:
    """Single models that are not dominated nor below the chord of two others (official
    ``remove_redundant_models``), sorted by cost: the "linear" interpolation baseline."""
    pts = sorted(zip(map(float, costs), map(float, qualities)))
    hull: list[tuple[float, float]] = []
    for c, q in pts:
        if hull and q <= hull[-1][1]:
            continue  # dominated: costs more, no better
        while len(hull) >= 2:
            (c1, q1), (c2, q2) = hull[-2], hull[-1]
            if c == c1 or (q2 - q1) * (c - c1) <= (q - q1) * (c2 - c1):  # hull[-1] at or below the chord
                hull.pop()
            else:
                break
        if hull and c == hull[-1][0]:
            hull.pop()
        hull.append((c, q))
    return [p[0] for p in hull], [p[1] for p in hull]


__all__ = [
    "pareto_hull",
    "route",
    "threshold_cascade",
]
