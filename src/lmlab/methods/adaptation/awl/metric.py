"""Tool-usage accuracy (TUA) and its uncertainty: items resampled, class sizes and TUA recomputed per resample.

    TUA = ½ · P(no tool | easy) + ½ · P(tool | hard),   easy = the evaluated model answers correctly without tools
                                                         (``Climate/evaluate.py``); one class empty -> the rate of
                                                         the class present

TUA is a ratio statistic: its weights 1 / (2 n_easy), 1 / (2 n_hard) depend on the sample. A bootstrap of per-item
scores with the weights fixed from the full sample (``n / (2 n_class)`` per right decision) holds the class sizes at
their observed values and lets the resampled mean drift with the number of copies of each class: it is not TUA's
sampling distribution (with every decision right it gives a CI wider than zero, and past 1). Here each resample
draws whole items, i.e. the (no-tool correct, used tool) record of each system on the item, and recomputes n_easy,
n_hard and TUA for every system on the same drawn items (`tua_bootstrap_ci`, `compare_tua`: core's
`paired_bootstrap_stat` / `compare_statistic` with the statistic `tua_of_rows` over (n, 2) record rows).

Power (`tua_influence`, `n_for_power`): by the delta method TUA's influence on item i is
``IF_i = c_i (r_i - p_easy) / (2 s_easy) + (1 - c_i)(r_i - p_hard) / (2 s_hard)`` (c = easy, r = right decision,
s = class share), so Var(TUA_A - TUA_B) ≈ Var(IF_A - IF_B) / n and a one-sided level-α/2 check of an effect δ has
power 1 - β from ``n = (z_{1-α/2} + z_{1-β})² Var(IF_A - IF_B) / δ²`` items.

numpy only; pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

# ----------------------------------------------------------------------------------------------------------------
# the metric


def _records(no_tool_correct: Sequence[Any], used_tool: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Boolean (n,) arrays of the two flags, or a one-line `ValueError`."""
    c = np.asarray([bool(x) for x in no_tool_correct], dtype=bool)
    u = np.asarray([bool(x) for x in used_tool], dtype=bool)
    if c.size != u.size:
        raise ValueError(f"got {c.size} no-tool correctness flags but {u.size} tool-use flags; expected one each")
    if not c.size:
        raise ValueError("no records: tool-usage accuracy needs at least one item")
    return c, u


def tool_usage_accuracy_rows(correct: np.ndarray, used: np.ndarray) -> np.ndarray:
    """TUA of each row of boolean ``(k, n)`` tables (k samples of n items): ``(k,)``, same empty-class rule."""
    n_easy = correct.sum(axis=1)  # (k,)
    n_hard = correct.shape[1] - n_easy
    right = correct != used  # easy and no tool, or hard and a tool: (k, n)
    p_easy = (right & correct).sum(axis=1) / np.maximum(n_easy, 1)
    p_hard = (right & ~correct).sum(axis=1) / np.maximum(n_hard, 1)
    both = (n_easy > 0) & (n_hard > 0)
    return np.where(both, 0.5 * (p_easy + p_hard), np.where(n_easy > 0, p_easy, p_hard))


def tool_usage_accuracy(no_tool_correct: Sequence[Any], used_tool: Sequence[Any]) -> float:
    """TUA = ½ · P(no tool | easy) + ½ · P(tool | hard), easy = answered correctly without tools.

    With one class empty (every item easy, or every item hard) the mean is over the class present.
    """
    c, u = _records(no_tool_correct, used_tool)
    return float(tool_usage_accuracy_rows(c[None], u[None])[0])


# ----------------------------------------------------------------------------------------------------------------
# uncertainty: core's row bootstrap with TUA recomputed per resample, the paired comparison, the permutation p-value


def _record_rows(correct: np.ndarray, used: np.ndarray) -> np.ndarray:
    """The items as rows for core's row bootstrap: ``(n, 2)`` of (no-tool correct, used tool), 0 / 1."""
    return np.stack([correct, used], axis=1).astype(np.float64)


def tua_of_rows(rows: np.ndarray) -> float:
    """TUA of ``(m, 2)`` record rows (no-tool correct, used tool): the statistic core's bootstrap recomputes on each
    resample's drawn items, so n_easy and n_hard are the drawn items' own."""
    rows = np.asarray(rows)
    return float(tool_usage_accuracy_rows(rows[None, :, 0] != 0, rows[None, :, 1] != 0)[0])


def tua_bootstrap_ci(
    no_tool_correct: Sequence[Any],
    used_tool: Sequence[Any],
    *,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``(TUA, lo, hi)``: percentile bootstrap over items, each resample's TUA recomputed from its own easy / hard
    counts (the drawn items' records): `lmlab.core.stats.uncertainty.paired_bootstrap_stat` with `tua_of_rows` and
    no second system. Deterministic given `seed`; one item gives a zero-width interval."""
    from lmlab.core.stats.uncertainty import paired_bootstrap_stat

    c, u = _records(no_tool_correct, used_tool)
    return paired_bootstrap_stat(_record_rows(c, u), None, tua_of_rows, n_resamples=n_resamples,
                                 confidence=confidence, seed=seed)  # fmt: skip


def _tua_diff_rows(ca: np.ndarray, ua: np.ndarray, cb: np.ndarray, ub: np.ndarray) -> np.ndarray:
    return tool_usage_accuracy_rows(ca, ua) - tool_usage_accuracy_rows(cb, ub)


def _swap_p_value(ca: np.ndarray, ua: np.ndarray, cb: np.ndarray, ub: np.ndarray, observed: float, direction: str,
                  n_permutations: int, seed: int, exact_max_n: int = 16) -> float:  # fmt: skip
    """One-sided permutation p-value of H0 "A and B exchangeable on each item": the two systems' records swapped on
    a random subset of items, TUA(A) - TUA(B) recomputed. Exact (all 2**n swap patterns) for n <= `exact_max_n`,
    else `n_permutations` random patterns with the add-one estimate. Kept here: core's `compare_statistic` reports
    no p-value (NaN)."""
    n = ca.size
    if np.array_equal(ca, cb) and np.array_equal(ua, ub):
        return 1.0
    if n <= exact_max_n:
        swap = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1).astype(bool)  # (2**n, n)
    else:
        if n_permutations < 1:
            raise ValueError(f"n_permutations must be >= 1, got {n_permutations}")
        swap = np.random.default_rng(seed).integers(0, 2, size=(n_permutations, n)).astype(bool)
    null = _tua_diff_rows(np.where(swap, cb, ca), np.where(swap, ub, ua), np.where(swap, ca, cb),
                          np.where(swap, ua, ub))  # fmt: skip
    tol = 1e-9
    extreme = int(np.count_nonzero(null >= observed - tol if direction == ">" else null <= observed + tol))
    return extreme / swap.shape[0] if n <= exact_max_n else (1.0 + extreme) / (1.0 + swap.shape[0])


def compare_tua(
    a_correct: Sequence[Any],
    a_used: Sequence[Any],
    b_correct: Sequence[Any],
    b_used: Sequence[Any],
    *,
    direction: str = ">",
    seed: int = 0,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    n_permutations: int = 10000,
    min_n: int | None = None,
) -> Any:
    """The check "TUA(A) beats TUA(B)" on the same items, as a `lmlab.core.stats.uncertainty.Comparison`.

    `lmlab.core.stats.uncertainty.compare_statistic` with `tua_of_rows` over each system's ``(n, 2)`` record rows:
    the CI of ``TUA(A) - TUA(B)`` is a paired percentile bootstrap (each resample draws items with replacement, both
    systems' TUA recomputed on the drawn items, each from its own easy / hard counts there), and the decision is
    `compare`'s with threshold 0: ``">"`` supported when ``lo > 0``, not supported when ``hi <= 0`` (mirrored for
    ``"<"``), else inconclusive; fewer than `min_n` items (default `default_min_n`) is inconclusive. core reports no
    p-value for a general statistic, so the p-value is `_swap_p_value`'s (reported, not used in the decision).
    """
    from dataclasses import replace

    from lmlab.core.stats.uncertainty import compare_statistic

    if direction not in (">", "<"):
        raise ValueError(f"direction must be '>' or '<', got {direction!r}")
    ca, ua = _records(a_correct, a_used)
    cb, ub = _records(b_correct, b_used)
    if ca.size != cb.size:
        raise ValueError(f"paired records must cover the same items: got {ca.size} for A and {cb.size} for B")
    # independent streams for the CI and the p-value, both fixed by `seed` (as `compare`)
    boot_seed, perm_seed = (int(s.generate_state(1)[0]) for s in np.random.SeedSequence(seed).spawn(2))
    cmp = compare_statistic(_record_rows(ca, ua), _record_rows(cb, ub), tua_of_rows,
                            direction=direction,  # type: ignore[arg-type]
                            min_effect=0.0, seed=boot_seed, confidence=confidence, n_resamples=n_resamples,
                            min_n=min_n)  # fmt: skip
    p = _swap_p_value(ca, ua, cb, ub, cmp.effect, direction, n_permutations, perm_seed)
    return replace(cmp, p_value=p, reason=f"{cmp.reason} (items resampled, TUA recomputed)")


# ----------------------------------------------------------------------------------------------------------------
# power


def tua_influence(no_tool_correct: Sequence[Any], used_tool: Sequence[Any]) -> np.ndarray:
    """Per-item influence of TUA (delta method, mean 0): ``c (r - p_easy) / (2 s_easy) + (1 - c)(r - p_hard) /
    (2 s_hard)``; with one class empty, ``r - p`` of the class present. ``(n,)``."""
    c, u = _records(no_tool_correct, used_tool)
    right = (c != u).astype(float)
    s_easy = c.mean()
    out = np.zeros(c.size)
    for mask, share in ((c, s_easy), (~c, 1.0 - s_easy)):
        if share > 0:
            p = right[mask].mean()
            weight = 0.5 / share if 0 < s_easy < 1 else 1.0 / share
            out[mask] = weight * (right[mask] - p)
    return out


def n_for_power(sd: float, effect: float, *, confidence: float = 0.95, power: float = 0.8) -> int:
    """Items a paired check needs to find `effect` with probability `power` when its per-item differences have
    standard deviation `sd`: ``ceil((z_{(1+confidence)/2} + z_power)² sd² / effect²)`` (normal approximation, the
    two-sided CI's lower end above 0)."""
    from scipy.stats import norm

    if not effect:
        raise ValueError("effect must be non-zero: no n detects an effect of 0")
    if sd < 0 or not 0 < power < 1 or not 0 < confidence < 1:
        raise ValueError(f"need sd >= 0, power and confidence in (0, 1); got {sd}, {power}, {confidence}")
    z = float(norm.ppf(0.5 + confidence / 2.0) + norm.ppf(power))
    return math.ceil((z * sd / effect) ** 2)


__all__ = [
    "compare_tua",
    "n_for_power",
    "tool_usage_accuracy",
    "tool_usage_accuracy_rows",
    "tua_bootstrap_ci",
    "tua_influence",
    "tua_of_rows",
]
