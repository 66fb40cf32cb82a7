"""Quality estimators: the ex-ante and post-hoc estimates q̂_S and their covariance Σ_S at every run set S.

Official ``classification.py`` / ``quality_computer.py``: one logistic regression per (model, run-subset) on ex-ante
features (task one-hot: a per-task accuracy) plus post-hoc features of the run models (answer log-prob, agreement of
the graded answer keys, and on multiple-choice queries the official ``certainty_features`` / ``agreement_features``:
top option probability, entropy, Jensen-Shannon divergence); Σ_S is the covariance over training queries of
(q̂_S - q̂_all models run) (``fit_covariances``).
`ground_truth_noise_estimates` is the RouterBench simulation: the true 0/1 quality plus N(0, σ_before²) (not run) or
N(0, σ_after²) (run) noise, recalibrated by a linear regression per model. `PoolData` / `pool_from_cache` give the
cost-sorted [queries, models] view of a response cache the estimators and strategies read.

Both return `Estimates` (``method.py``). numpy only.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lmlab.methods.selection.cascade_routing.method import Estimates

# ----------------------------------------------------------------------------------------------------------------
# quality estimators


def _norm_answer(a: str) -> str:
    return " ".join(str(a).strip().lower().split())


def answer_of(row) -> str:
    """The answer two rows are compared by: the cache's graded `answer_key` (the zoo's extracted number / word: same
    key = same answer), else, for caches built before it existed (answer_key None or absent), the normalised text."""
    key = getattr(row, "answer_key", None)
    return str(key) if key is not None else _norm_answer(row.answer)


def entropy_bits(p: np.ndarray) -> np.ndarray:
    """Entropy in bits of distributions along the last axis (official ``entropy``: -Σ p log2 max(p, 1e-16))."""
    return -np.sum(p * np.log2(np.maximum(p, 1e-16)), axis=-1)


def js_divergence(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Jensen-Shannon divergence in bits along the last axis (official ``js_divergence``): (KL(p||m) + KL(q||m))/2,
    m = (p + q)/2."""
    m = (p + q) / 2

    def kl(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.sum(a * np.log2(np.maximum(a, 1e-16) / np.maximum(b, 1e-16)), axis=-1)

    return (kl(p, m) + kl(q, m)) / 2


@dataclass
class PoolData:
    """The [queries, models] view a strategy needs (models cost-sorted, cheapest first).

    Attributes: ``y`` true quality [Q, V] in [0, 1]; ``cost`` true cost [Q, V]; ``logp`` answer log-prob [Q, V]
    (NaN where unknown); ``task`` task index per query [Q]; ``answers`` the compared answer [Q][V] (`answer_of`: the
    graded answer key, else the normalised text; "" unknown); ``options`` the option probabilities of
    multiple-choice rows [Q, V, K] (normalised to sum 1; NaN where the row has none, K = the most options of any
    row, 0 when no row has any).
    """

    models: list[str]
    queries: list[str]
    y: np.ndarray
    cost: np.ndarray
    logp: np.ndarray
    task: np.ndarray
    task_names: list[str]
    answers: list[list[str]]
    options: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.options is None:
            self.options = np.full((len(self.queries), len(self.models), 0), np.nan)

    def subset(self, idx: Sequence[int]) -> PoolData:
        idx = list(idx)
        return PoolData(self.models, [self.queries[i] for i in idx], self.y[idx], self.cost[idx], self.logp[idx],
                        self.task[idx], self.task_names, [self.answers[i] for i in idx],
                        self.options[idx])  # fmt: skip


def pool_from_cache(cache, variants: Sequence[str] | None = None) -> PoolData:
    """The pool view of a `ResponseCache`: complete queries only, models sorted by mean cost (cheapest first)."""
    vids, qids, y = cache.matrix("correct", variants=variants)
    _, _, cost = cache.matrix("cost_flops", variants=vids)
    # answer_logprob may be unknown (NaN) for some variants: read it without dropping queries, align to `qids`
    _, all_q, logp_all = cache.matrix("answer_logprob", variants=vids, complete=False)
    col = {q: j for j, q in enumerate(all_q)}
    logp = logp_all[:, [col[q] for q in qids]]
    if len(vids) < 2:
        raise ValueError(f"cascade routing needs >= 2 models in the pool, got {vids}")
    order = np.argsort(cost.mean(axis=1), kind="stable")
    vids = [vids[i] for i in order]
    y, cost, logp = y[order].T, cost[order].T, logp[order].T  # [Q, V]
    tasks = cache.tasks()
    names = sorted({tasks[q] for q in qids})
    tix = np.array([names.index(tasks[q]) for q in qids])
    by_key = {(r.variant, r.query_id): r for r in cache.rows}
    answers = [[answer_of(by_key[(v, q)]) if (v, q) in by_key else "" for v in vids] for q in qids]
    # option probabilities (the MC tasks): [Q, V, K], NaN-padded where a row has none or fewer options
    k = max((len(r.option_probs) for r in cache.rows if r.option_probs), default=0)
    options = np.full((len(qids), len(vids), k), np.nan)
    for qi, q in enumerate(qids):
        for vi, v in enumerate(vids):
            r = by_key.get((v, q))
            if r is not None and r.option_probs:
                p = np.clip(np.asarray(r.option_probs, float), 0.0, None)
                if p.sum() > 0:
                    options[qi, vi, :] = 0.0
                    options[qi, vi, : len(p)] = p / p.sum()
    return PoolData(vids, qids, y, cost, logp, tix, names, answers, options)


def logistic_fit(x: np.ndarray, y: np.ndarray, c: float = 1.0, n_iter: int = 50) -> np.ndarray:
    """L2 logistic regression by Newton's method, sklearn's objective (``LogisticRegression(C=c)``):
    min_w  Σ_i log(1 + exp(-s_i w·[x_i, 1])) + ||w_{:-1}||² / (2c), the intercept unpenalised. Returns w [d + 1]."""
    xb = np.concatenate([x, np.ones((len(x), 1))], axis=1)
    d = xb.shape[1]
    reg = np.full(d, 1.0 / c)
    reg[-1] = 1e-8
    w = np.zeros(d)
    for _ in range(n_iter):
        p = 1.0 / (1.0 + np.exp(-np.clip(xb @ w, -30, 30)))
        grad = xb.T @ (p - y) + reg * w
        hess = (xb * (p * (1 - p))[:, None]).T @ xb + np.diag(reg)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.max(np.abs(step)) < 1e-8:
            break
    return w


def _lr_fit_predict(x_fit: np.ndarray, y_fit: np.ndarray, x_all: np.ndarray, c: float) -> np.ndarray:
    """P(correct) of a logistic regression (official: one per model and run-subset); a constant (Laplace-smoothed
    mean) where the training labels have one class."""
    yb = (y_fit >= 0.5).astype(float)
    if len(np.unique(yb)) < 2:
        return np.full(len(x_all), (yb.sum() + 1.0) / (len(yb) + 2.0))
    w = logistic_fit(x_fit, yb, c)
    z = np.concatenate([x_all, np.ones((len(x_all), 1))], axis=1) @ w
    return 1.0 / (1.0 + np.exp(-np.clip(z, -30, 30)))


@dataclass
class LogisticEstimator:
    """Ex-ante + post-hoc quality estimates (official ``ClassificationQualityComputer``, features adapted).

    Features of model m in run set S: the task one-hot (ex-ante); for every run model j in S its standardised
    answer log-prob (post-hoc); for m in S with others run, the share of them giving m's graded answer key
    (agreement). With `option_features`, on queries where the cache has option probabilities (the MC task), for m in
    S: its top option probability and entropy (official ``certainty_features``, ``n_highest_include=1``,
    ``add_entropy``) and, with others run, the mean Jensen-Shannon divergence to their option distributions
    (official ``add_js_divergence``, averaged over the other run models instead of one feature per pair); 0 where
    the rows have none (a constant within a task, which the task one-hot absorbs).
    One logistic regression per (m, S); Σ_S = cov over the fit queries of (q̂_S - q̂_all).
    """

    c: float = 1.0
    posthoc: bool = True
    option_features: bool = True

    def _features(self, pool: PoolData, m: int, s: tuple[int, ...], mu: np.ndarray, sd: np.ndarray) -> np.ndarray:
        nq = len(pool.queries)
        cols = [np.eye(len(pool.task_names))[pool.task]]
        if self.posthoc and s:
            lp = pool.logp[:, list(s)]
            lp = np.where(np.isnan(lp), mu[list(s)][None], lp)
            cols.append((lp - mu[list(s)][None]) / sd[list(s)][None])
            if m in s and len(s) > 1:
                agree = np.zeros(nq)
                for qi in range(nq):
                    a = pool.answers[qi][m]
                    if a:
                        agree[qi] = np.mean([pool.answers[qi][j] == a for j in s if j != m])
                cols.append(agree[:, None])
            if self.option_features and m in s and pool.options.shape[2] > 0:
                cols.append(self._option_features(pool, m, s))
        return np.concatenate(cols, axis=1)

    @staticmethod
    def _option_features(pool: PoolData, m: int, s: tuple[int, ...]) -> np.ndarray:
        """[Q, 2] (top option probability, entropy) of model m, plus a mean-JS column [Q, 1] when others are run;
        0 where the option probabilities are unknown."""
        p = pool.options[:, m]  # [Q, K]
        has = ~np.isnan(p).any(axis=1)
        pm = np.where(has[:, None], p, 0.0)
        out = [np.where(has, pm.max(axis=1), 0.0), np.where(has, entropy_bits(pm), 0.0)]
        others = [j for j in s if j != m]
        if others:
            js_sum, n_pair = np.zeros(len(p)), np.zeros(len(p))
            for j in others:
                pj = pool.options[:, j]
                both = has & ~np.isnan(pj).any(axis=1)
                js_sum += np.where(both, js_divergence(pm, np.where(both[:, None], pj, 0.0)), 0.0)
                n_pair += both
            out.append(np.where(n_pair > 0, js_sum / np.maximum(n_pair, 1), 0.0))
        return np.stack(out, axis=1)

    def fit_predict(
        self, fit: PoolData, pools: Sequence[PoolData], states: Sequence[tuple[int, ...]]
    ) -> list[Estimates]:
        """Fit on `fit`, return the estimates of each pool in `pools` at every run set in `states`."""
        v = fit.y.shape[1]
        full = tuple(range(v))
        all_states = list(dict.fromkeys([*states, full]))
        finite = np.where(np.isfinite(fit.logp), fit.logp, np.nan)
        with warnings.catch_warnings():  # a variant without log-probs: an all-NaN column, handled below
            warnings.simplefilter("ignore", RuntimeWarning)
            mu, sd = np.nanmean(finite, axis=0), np.nanstd(finite, axis=0)
        mu = np.where(np.isnan(mu), 0.0, mu)
        sd = np.where(~np.isfinite(sd) | (sd < 1e-6), 1.0, sd)
        targets = [fit, *pools]
        q = [{s: np.zeros((len(p.queries), v)) for s in all_states} for p in targets]
        for s in all_states:
            for m in range(v):
                xs = [np.nan_to_num(self._features(p, m, s, mu, sd)) for p in targets]
                cat = np.concatenate(xs)
                pred = _lr_fit_predict(xs[0], fit.y[:, m], cat, self.c)
                off = 0
                for t, x in enumerate(xs):
                    q[t][s][:, m] = pred[off : off + len(x)]
                    off += len(x)
        sig = {}
        for s in all_states:
            diff = q[0][s] - q[0][full]
            sig[s] = np.cov(diff.T) if diff.shape[0] > 1 else np.zeros((v, v))
            sig[s] = np.nan_to_num(np.atleast_2d(sig[s]))
        return [Estimates(list(all_states), q[t + 1], dict(sig)) for t in range(len(pools))]


def ground_truth_noise_estimates(
    y: np.ndarray, states: Sequence[tuple[int, ...]], sigma_before: float, sigma_after: float, seed: int = 0
) -> Estimates:
    """RouterBench simulation (official ``GroundTruthQualityComputer``): true quality + N(0, σ²) noise (σ_before
    for models not run, σ_after for run ones), each recalibrated onto the truth by a linear regression per model;
    Σ_S = diag(σ_m² for models not run, 1e-6 for run ones), σ_m = std(before - after)."""
    if sigma_before < 0 or sigma_after < 0:
        raise ValueError(f"noise levels must be >= 0, got sigma_before={sigma_before}, sigma_after={sigma_after}")
    rng = np.random.default_rng(seed)
    nq, v = y.shape
    cal = np.zeros((2, nq, v))
    for k, s in enumerate((sigma_before, sigma_after)):
        noisy = y + rng.normal(0.0, s, size=y.shape) if s > 0 else y.astype(float).copy()
        for m in range(v):
            x = noisy[:, m]
            vx = np.var(x)
            slope = (np.mean((x - x.mean()) * (y[:, m] - y[:, m].mean())) / vx) if vx > 0 else 0.0
            cal[k, :, m] = y[:, m].mean() + slope * (x - x.mean())
    sig_m = np.std(cal[0] - cal[1], axis=0)
    q_hat, sigma = {}, {}
    for s in states:
        run = np.zeros(v, bool)
        run[list(s)] = True
        q_hat[s] = np.where(run[None], cal[1], cal[0])
        sigma[s] = np.diag(np.where(run, 1e-6, sig_m**2))
    return Estimates(list(states), q_hat, sigma)


__all__ = [
    "LogisticEstimator",
    "PoolData",
    "answer_of",
    "entropy_bits",
    "ground_truth_noise_estimates",
    "js_divergence",
    "logistic_fit",
    "pool_from_cache",
]
