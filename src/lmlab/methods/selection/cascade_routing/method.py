"""Cascade routing (Dekoninck, Baader, Vechev, ICML 2025): the supermodel search, its λ tuning and the optimal cascade.

    step t, run set S:  M* = argmax_{M ⊇ S, |M| <= d}  E[max_{i in M} q_i] - λ_t · Σ_{i in M} ĉ_i,  q ~ N(q̂_S, Σ_S)
    stop if M* = S (answer: argmax_{i in S} q̂_S,i), else run the cheapest model of M* \\ S       (arXiv 2410.10347)

* Routing (Sec. 3, proved optimal): one step from S = ∅ with ex-ante estimates, argmax_i q̂_i - λ ĉ_i
  (``baselines.route``).
* Optimal cascade (Sec. 4): the same objective restricted to prefixes M = {0..j} of the cost-sorted pool
  (``cascade=True``); one λ per step.
* Cascade routing (Sec. 5): every superset of the run set (``force_order``: new models after the last run one, so
  models run cheapest first), at most ``max_depth`` models, pruned by Lemma 1 (``do_speedup``: a supermodel whose
  last added model does not pay for itself, ΔE[max] - λ·c_last < 0, is neither kept nor expanded).
* Threshold cascade (the baseline "thresholding"): continue past model j while q̂_j (post-hoc) < 1 - λ_j; the
  answer is the last model's (``baselines.threshold_cascade``).

Supermodel quality E[max] is a Monte Carlo mean over 100 scrambled-Sobol normal samples (official
``statistics.compute_expected_max``); without uncertainty it is max q̂. λ per step is tuned on training queries to
maximise quality at mean cost <= B (official ``lambda_strategy``): ``ConstantStrategy`` (all λ equal: doubling from
max_λ, then bisection) and a per-step random search around it (the official TPE ``HyperoptStrategy`` objective
-quality + (q_init/c_init)·max(0, cost - cost_init), best feasible evaluation kept); the best feasible strategy wins.
Exact budget matching randomises between the cheapest and the most expensive tie-optimal choice with probability
γ = (B - cost_cheap) / (cost_expensive - cost_cheap) of the expensive one.

This file holds E[max], the one-query search, the vectorised engine (`Estimates`, `SearchTable`), the λ strategies
and `CascadeRouter`. Next to it: ``baselines.py`` (the router, the threshold cascade and the Pareto hull of single
models behind the linear baseline), ``estimators.py`` (the quality estimators that give q̂_S and Σ_S: logistic
regressions and the RouterBench noise simulation) and ``metric.py`` (the area under the quality-cost curve).

Everything here is numpy / scipy / scikit-learn on a [queries, models] table; no model is loaded.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

# ----------------------------------------------------------------------------------------------------------------
# supermodel quality


def sobol_normal(n_samples: int, dim: int, seed: int = 0) -> np.ndarray:
    """(n_samples, dim) scrambled-Sobol standard normal samples (official: ``qmc.Sobol`` then ``norm.ppf``)."""
    from scipy.stats import norm, qmc

    if n_samples < 1 or dim < 1:
        raise ValueError(f"sobol_normal needs n_samples >= 1 and dim >= 1, got {n_samples}, {dim}")
    with warnings.catch_warnings():  # 100 is not a power of 2: scipy warns about balance, the paper uses 100
        warnings.simplefilter("ignore")
        u = qmc.Sobol(d=dim, scramble=True, seed=seed).random(n_samples)
    return norm.ppf(np.clip(u, 1e-12, 1 - 1e-12))


def expected_max(q_hat: np.ndarray, sigma: np.ndarray | None, masks: np.ndarray, z: np.ndarray) -> np.ndarray:
    """E[max_{i in M} q_i], q ~ N(q_hat, sigma), for each boolean row M of `masks` ([n_sets, V]); shape [n_sets].

    One model: q_hat itself; no `sigma` (no uncertainty): max q_hat over M. `z` are (n_samples, V) normal samples.
    """
    q_hat = np.asarray(q_hat, dtype=float)
    masks = np.asarray(masks, dtype=bool)
    if sigma is None:
        return np.where(masks, q_hat[None], -np.inf).max(axis=1)
    v = q_hat.size
    chol = np.linalg.cholesky(np.asarray(sigma, float) + 1e-12 * np.eye(v))
    x = q_hat[None] + z @ chol.T  # (n_samples, V)
    out = np.where(masks[:, None, :], x[None], -np.inf).max(axis=2).mean(axis=1)
    single = masks.sum(axis=1) == 1
    out[single] = q_hat[np.argmax(masks[single], axis=1)]
    return out


# ----------------------------------------------------------------------------------------------------------------
# the search over supermodels of one run set (reference implementation, one query)


def supermodel_candidates(
    run: Sequence[int], n_models: int, *, max_depth: int | None, cascade: bool, force_order: bool
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Supersets M of `run` as (M, new models in the order added), breadth first as in the official search."""
    run = tuple(sorted(run))
    depth = n_models if max_depth is None else max_depth
    out = []
    frontier: list[tuple[int, ...]] = [()]
    while frontier:
        nxt = []
        for new in frontier:
            members = run + new
            if len(members) > depth:
                continue
            out.append((tuple(sorted(members)), new))
            if cascade:
                last = (run + new)[-1] if run + new else -1
                poss = [last + 1] if last + 1 < n_models else []
            else:
                poss = [i for i in range(n_models) if i not in members]
                if force_order and members:
                    poss = [i for i in poss if i > members[-1]]
                if new:
                    poss = [i for i in poss if i > new[-1]]
            nxt += [new + (i,) for i in poss]
        frontier = nxt
    return out


def next_model(
    q_hat: np.ndarray,
    sigma: np.ndarray | None,
    costs: np.ndarray,
    run: Sequence[int],
    lam: float,
    z: np.ndarray,
    *,
    max_depth: int | None = None,
    cascade: bool = False,
    force_order: bool = True,
    do_speedup: bool = True,
    rounding: int = 6,
    tie: str = "cheapest",
) -> tuple[int | None, tuple[int, ...]]:
    """The model to run next (None: stop) and the best supermodel, for one query (the official ``_predict_model``).

    `tie` picks among tie-optimal supermodels: ``cheapest`` or ``expensive``.
    """
    v = len(q_hat)
    cands = supermodel_candidates(run, v, max_depth=max_depth, cascade=cascade, force_order=force_order)
    masks = np.zeros((len(cands), v), bool)
    for k, (m, _) in enumerate(cands):
        masks[k, list(m)] = True
    qual = {}
    nonempty = masks.any(axis=1)
    vals = np.full(len(cands), -1e8)
    if nonempty.any():
        vals[nonempty] = expected_max(q_hat, sigma, masks[nonempty], z)
    for (m, _), val in zip(cands, vals):
        qual[m] = val
    best: list[tuple[float, float, tuple[int, ...], tuple[int, ...]]] = []
    pruned: set[tuple[int, ...]] = set()
    run_t = tuple(sorted(run))
    for (m, new), q in zip(cands, vals):
        if new and new[:-1] and (run_t + new[:-1]) in pruned:
            pruned.add(run_t + new)
            continue
        if new and do_speedup and not cascade and len(m) > 1:
            parent = tuple(sorted(run_t + new[:-1]))
            q_parent = qual[parent] if parent else 0.0
            if q - q_parent - lam * costs[new[-1]] < 0:
                pruned.add(run_t + new)
                continue
        if not m:
            continue
        c = float(np.sum(costs[list(m)]))
        best.append((round(float(q - lam * c), rounding), c, m, new))
    top = max(b[0] for b in best)
    tied = [b for b in best if b[0] == top]
    pick = min(tied, key=lambda b: b[1]) if tie == "cheapest" else max(tied, key=lambda b: b[1])
    if not pick[3]:
        return None, pick[2]
    return min(pick[3]), pick[2]


# ----------------------------------------------------------------------------------------------------------------
# the vectorised engine: every query's search precomputed once, λ-independent


def _subsets(v: int, max_size: int) -> list[tuple[int, ...]]:
    return [s for k in range(max_size + 1) for s in itertools.combinations(range(v), k)]


def strategy_states(v: int, *, max_depth: int | None, cascade: bool) -> list[tuple[int, ...]]:
    """Run sets a strategy can reach: prefixes for a cascade, subsets of size <= max_depth otherwise."""
    if cascade:
        return [tuple(range(k)) for k in range(v + 1)]
    return _subsets(v, v if max_depth is None else max_depth)


@dataclass
class Estimates:
    """Quality estimates of every query at every run set: ``q_hat[S]`` [Q, V] and ``sigma[S]`` [V, V] or [Q, V, V].

    `states` lists the run sets (sorted tuples); ``()`` holds the ex-ante estimates.
    """

    states: list[tuple[int, ...]]
    q_hat: dict[tuple[int, ...], np.ndarray]
    sigma: dict[tuple[int, ...], np.ndarray | None]

    def sigma_of(self, state: tuple[int, ...], qi: int) -> np.ndarray | None:
        s = self.sigma.get(state)
        if s is None or s.ndim == 2:
            return s
        return s[qi]


@dataclass
class SearchTable:
    """Per query and run set: the candidate supermodels' E[max], cost estimate, Lemma-1 validity bound λ_valid
    (a candidate survives pruning iff λ <= λ_valid) and where running its next model leads."""

    states: list[tuple[int, ...]]
    q_set: np.ndarray  # [Q, n_states, J] E[max] of candidate j (-inf padding)
    c_set: np.ndarray  # [n_states, J] estimated cost of candidate j
    lam_valid: np.ndarray  # [Q, n_states, J]
    next_state: np.ndarray  # [n_states, J] state after running the candidate's next model; -1: stop (M = S)
    select: np.ndarray  # [Q, n_states] model answering when stopping in state s (argmax post-hoc q̂ over S)
    max_steps: int
    n_models: int
    state_masks: np.ndarray  # [n_states, V] models of each run set


def _expected_max_batch(qs: np.ndarray, est: Estimates, state: tuple[int, ...], masks: np.ndarray,
                        z: np.ndarray) -> np.ndarray:  # fmt: skip
    """`expected_max` of every query at once ([Q, n_sets]) when Σ_S is shared by the queries (2-D or None)."""
    sig = est.sigma.get(state)
    if sig is not None and sig.ndim == 3:
        return np.stack([expected_max(qs[qi], sig[qi], masks, z) for qi in range(len(qs))])
    if sig is None:
        return np.where(masks[None], qs[:, None, :], -np.inf).max(axis=2)
    v = qs.shape[1]
    chol = np.linalg.cholesky(np.asarray(sig, float) + 1e-12 * np.eye(v))
    noise = z @ chol.T  # (n, V)
    out = np.empty((len(qs), len(masks)))
    for k, m in enumerate(masks):
        cols = np.flatnonzero(m)
        if len(cols) == 1:
            out[:, k] = qs[:, cols[0]]
        else:
            out[:, k] = (qs[:, None, cols] + noise[None, :, cols]).max(axis=2).mean(axis=1)
    return out


def build_table(
    est: Estimates,
    cost_hat: np.ndarray,
    z: np.ndarray,
    *,
    max_depth: int | None = None,
    cascade: bool = False,
    force_order: bool = True,
    do_speedup: bool = True,
) -> SearchTable:
    """Precompute the supermodel search of every query in every reachable run set (λ enters only at decision)."""
    v = len(cost_hat)
    depth = v if (max_depth is None or cascade) else min(max_depth, v)
    states = strategy_states(v, max_depth=depth, cascade=cascade)
    index = {s: i for i, s in enumerate(states)}
    missing = [s for s in states if s not in est.q_hat]
    if missing:
        raise ValueError(f"the estimates lack run sets {missing[:3]}...; estimate every state of the strategy")
    nq = next(iter(est.q_hat.values())).shape[0]
    per_state = [supermodel_candidates(s, v, max_depth=depth, cascade=cascade, force_order=force_order)
                 for s in states]  # fmt: skip
    j_max = max(len(c) for c in per_state)
    ns = len(states)
    q_set = np.full((nq, ns, j_max), -np.inf)
    c_set = np.full((ns, j_max), np.inf)
    lam_valid = np.full((nq, ns, j_max), -np.inf)
    next_state = np.full((ns, j_max), -1, dtype=int)
    select = np.zeros((nq, ns), dtype=int)
    for si, (s, cands) in enumerate(zip(states, per_state)):
        masks = np.zeros((len(cands), v), bool)
        for k, (m, _) in enumerate(cands):
            masks[k, list(m)] = True
        nonempty = masks.any(axis=1)
        key = {(s + new): k for k, (_, new) in enumerate(cands)}
        qs = est.q_hat[s]
        if s:
            select[:, si] = np.asarray(s)[np.argmax(qs[:, list(s)], axis=1)]
        for k, (m, new) in enumerate(cands):
            if m:
                c_set[si, k] = float(np.sum(cost_hat[list(m)]))
                if new:
                    nxt = tuple(sorted(s + (min(new),)))
                    next_state[si, k] = index[nxt] if nxt in index else -1
        vals_all = np.full((nq, len(cands)), -1e8)  # [Q, J]
        if nonempty.any():
            vals_all[:, nonempty] = _expected_max_batch(qs, est, s, masks[nonempty], z)
        for qi in range(nq):
            vals = vals_all[qi]
            lv = np.full(len(cands), np.inf)
            for k, (m, new) in enumerate(cands):
                if new and do_speedup and not cascade and len(m) > 1:
                    parent_k = key[s + new[:-1]]
                    q_parent = vals[parent_k] if (s + new[:-1]) else 0.0
                    gain, c_last = vals[k] - q_parent, cost_hat[new[-1]]
                    bound = gain / c_last if c_last > 0 else (np.inf if gain >= 0 else -np.inf)
                    lv[k] = min(bound, lv[parent_k])
                elif new and new[:-1]:
                    lv[k] = lv[key[s + new[:-1]]]
            real = masks.any(axis=1)
            q_set[qi, si, : len(cands)][real] = vals[real]
            lam_valid[qi, si, : len(cands)][real] = lv[real]
    state_masks = np.zeros((len(states), v), bool)
    for si, st in enumerate(states):
        state_masks[si, list(st)] = True
    return SearchTable(states, q_set, c_set, lam_valid, next_state, select, depth, v, state_masks)


def execute_table(
    table: SearchTable,
    lambdas: Sequence[float],
    y: np.ndarray,
    cost: np.ndarray,
    *,
    mode: str = "cheapest",
    gamma: float = 0.0,
    rng: np.random.Generator | None = None,
    rounding: int = 6,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run the strategy on every query: per-query true quality [Q], true cost [Q] and run-set masks [Q, V].

    `mode`: ``cheapest`` / ``expensive`` tie-breaking, or ``random``: the expensive tie-optimal choice with
    probability `gamma` (the budget-matching randomisation).
    """
    nq, v = y.shape
    state = np.zeros(nq, dtype=int)  # index of () in table.states
    done = np.zeros(nq, bool)
    final = np.zeros(nq, dtype=int)
    rows = np.arange(nq)
    for step in range(table.max_steps + 1):
        active = ~done
        if not active.any():
            break
        if step >= len(lambdas) or step >= table.max_steps:
            final[active] = state[active]
            done[active] = True
            break
        lam = float(lambdas[step])
        st = state[active]
        qs = table.q_set[rows[active], st]  # (n, J)
        cs = table.c_set[st]
        ok = (table.lam_valid[rows[active], st] >= lam) & np.isfinite(qs)
        with np.errstate(invalid="ignore"):  # padding: -inf - λ·inf
            score = np.where(ok, np.round(qs - lam * cs, rounding), -np.inf)
        top = score.max(axis=1, keepdims=True)
        tied = score == top
        c_cheap = np.where(tied, cs, np.inf).argmin(axis=1)
        c_exp = np.where(tied, cs, -np.inf).argmax(axis=1)
        if mode == "cheapest":
            pick = c_cheap
        elif mode == "expensive":
            pick = c_exp
        else:
            u = (rng or np.random.default_rng(0)).random(len(st))
            pick = np.where(u < gamma, c_exp, c_cheap)
        nxt = table.next_state[st, pick]
        stop = nxt < 0
        idx = rows[active]
        final[idx[stop]] = st[stop]
        done[idx[stop]] = True
        state[idx[~stop]] = nxt[~stop]
    run = table.state_masks[final]
    chosen = table.select[rows, final]
    return y[rows, chosen], (run * cost).sum(axis=1), run


# ----------------------------------------------------------------------------------------------------------------
# λ strategies (official lambda_strategy.py)


Execute = Callable[[Sequence[float]], tuple[float, float]]  # lambdas -> (mean cost, mean quality)


def constant_strategy(
    execute: Execute, n_lambdas: int, budget: float, *, max_lambda: float = 1e4, n_iterations: int = 30
) -> tuple[list[float], float, float]:
    """All λ equal: double max_λ until the cost is within budget, then bisect; returns (λs, cost, quality)."""
    lo, hi = 0.0, max_lambda
    c_hi, q_hi = execute([hi] * n_lambdas)
    while c_hi > budget and hi < 1e10:
        lo, hi = hi, hi * 2
        c_hi, q_hi = execute([hi] * n_lambdas)
    for _ in range(n_iterations):
        mid = (lo + hi) / 2
        c, q = execute([mid] * n_lambdas)
        if c < budget:
            hi, c_hi, q_hi = mid, c, q
        else:
            lo = mid
    return [hi] * n_lambdas, c_hi, q_hi


def random_search_strategy(
    execute: Execute,
    init: Sequence[float],
    budget: float,
    *,
    n_evals: int = 50,
    max_factor: float = 4.0,
    max_lambda: float = 1e4,
    seed: int = 0,
) -> tuple[list[float], float, float]:
    """Per-step λ_i ~ U(0, max_factor x the constant solution), `n_evals` evaluations (the official TPE search's
    space and objective, seeded random proposals); the best evaluation with cost < budget, else `init`."""
    rng = np.random.default_rng(seed)
    c0, q0 = execute(list(init))
    top = max(max(init), 1e-12) * max_factor
    top = min(top, max_lambda)
    best = (list(init), c0, q0)
    for _ in range(n_evals):
        lam = rng.uniform(0.0, top, size=len(init)).tolist()
        c, q = execute(lam)
        if c < budget and q > best[2]:
            best = (lam, c, q)
    return best


@dataclass
class Tuned:
    """λs tuned for one budget, and the γ of the tie randomisation."""

    lambdas: list[float]
    gamma: float
    train_cost: float
    train_quality: float
    strategy: str = ""
    evaluations: int = 0


def tune(
    run_fn: Callable[[Sequence[float], str], tuple[float, float]],
    n_lambdas: int,
    budget: float,
    *,
    max_lambda: float = 1e4,
    const_iterations: int = 30,
    search_evals: int = 50,
    max_factor: float = 4.0,
    seed: int = 0,
) -> Tuned:
    """Constant strategy, then (if `search_evals`) the per-step search; the best feasible one; then γ.

    `run_fn(lambdas, mode)` returns the mean (cost, quality) on the tuning queries with tie mode ``cheapest`` or
    ``expensive``.
    """
    count = [0]

    def ex(lam: Sequence[float]) -> tuple[float, float]:
        count[0] += 1
        return run_fn(lam, "cheapest")

    lam, c, q = constant_strategy(ex, n_lambdas, budget, max_lambda=max_lambda, n_iterations=const_iterations)
    name = "constant"
    if search_evals > 0 and n_lambdas > 1:
        lam2, c2, q2 = random_search_strategy(ex, lam, budget, n_evals=search_evals, max_factor=max_factor,
                                              max_lambda=max_lambda, seed=seed)  # fmt: skip
        if c2 <= budget and q2 > q:
            lam, c, q, name = lam2, c2, q2, "search"
    c_cheap, _ = run_fn(lam, "cheapest")
    c_exp, _ = run_fn(lam, "expensive")
    gamma = 0.0 if c_exp == c_cheap else float(np.clip((budget - c_cheap) / (c_exp - c_cheap), 0.0, 1.0))
    return Tuned(list(map(float, lam)), gamma, float(c), float(q), name, count[0] + 2)


# ----------------------------------------------------------------------------------------------------------------
# strategies with one interface: fit(budget) on tuning queries, evaluate on test queries


@dataclass
class CascadeRouter:
    """Cascade routing (``cascade=False``) or the optimal cascade (``cascade=True``) over a cost-sorted pool.

    Args:
        cost_hat (`np.ndarray`): estimated cost of each model [V] (cheapest first).
        max_depth (`int`, *optional*, defaults to 3): at most this many models per query (cascade: all V).
        cascade (`bool`): restrict supermodels to prefixes of the pool (the optimal cascade).
        force_order (`bool`, defaults to `True`): run models in pool order (skips allowed).
        do_speedup (`bool`, defaults to `True`): Lemma-1 pruning.
        n_samples (`int`, defaults to 100): Sobol samples of E[max].
    """

    cost_hat: np.ndarray
    max_depth: int | None = 3
    cascade: bool = False
    force_order: bool = True
    do_speedup: bool = True
    n_samples: int = 100
    rounding: int = 6
    seed: int = 0
    z: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.cost_hat = np.asarray(self.cost_hat, float)
        if self.cost_hat.ndim != 1 or self.cost_hat.size < 1 or (self.cost_hat < 0).any():
            raise ValueError(f"cost_hat must be a non-empty 1-D array of costs >= 0, got {self.cost_hat!r}")
        if self.max_depth is not None and self.max_depth < 1:
            raise ValueError(f"max_depth must be >= 1 or None, got {self.max_depth}")
        if self.n_samples < 2:
            raise ValueError(f"n_samples must be >= 2, got {self.n_samples}")
        self.z = sobol_normal(self.n_samples, self.cost_hat.size, seed=self.seed)

    def table(self, est: Estimates) -> SearchTable:
        return build_table(est, self.cost_hat, self.z, max_depth=self.max_depth, cascade=self.cascade,
                           force_order=self.force_order, do_speedup=self.do_speedup)  # fmt: skip

    def n_lambdas(self) -> int:
        v = self.cost_hat.size
        return v if (self.cascade or self.max_depth is None) else min(self.max_depth, v)


def tune_table(table: SearchTable, y: np.ndarray, cost: np.ndarray, budget: float, n_lambdas: int, **kw) -> Tuned:
    """λs of a cascade router / optimal cascade for `budget` on tuning queries (true quality `y`, true `cost`)."""

    def run_fn(lam: Sequence[float], mode: str) -> tuple[float, float]:
        qual, c, _ = execute_table(table, lam, y, cost, mode=mode)
        return float(c.mean()), float(qual.mean())

    return tune(run_fn, n_lambdas, budget, **kw)


__all__ = [
    "CascadeRouter",
    "Estimates",
    "SearchTable",
    "Tuned",
    "build_table",
    "constant_strategy",
    "execute_table",
    "expected_max",
    "next_model",
    "random_search_strategy",
    "sobol_normal",
    "strategy_states",
    "supermodel_candidates",
    "tune",
    "tune_table",
]
