"""PMF by MCMC for predicting unknown benchmark scores (Zhao et al., ICML 2025, arXiv 2410.10112).

R_mn ~ N(U_m · V_n, 1/α) on observed cells, U_m ~ N(0, I_D), V_n ~ N(0, I_D); prediction = posterior mean of U·Vᵀ
over draws, uncertainty = posterior std of U·Vᵀ (https://arxiv.org/abs/2410.10112).

Everything here is pure numpy / scipy (no I/O). The official code (Qinyu-Allen-Zhao/CrossPred-LVLM,
`method/pmf.py`, `run_pmf.py`) samples this model with PyMC NUTS (1 chain, 500 tune + 100 draws); lmlab samples it
with its own conjugate Gibbs sampler, whose full conditionals are Gaussian:

    U_m | V, R ~ N(μ_m, Λ_m⁻¹),  Λ_m = Λ_U + α Σ_{n∈obs(m)} V_n V_nᵀ,  μ_m = Λ_m⁻¹ (Λ_U μ_U + α Σ_{n∈obs(m)} R_mn V_n)

and symmetrically for V_n over the observed rows of column n. ``prior="fixed"`` is the paper's PMF (μ_U = 0,
Λ_U = I). ``prior="bpmf"`` is Bayesian PMF (Salakhutdinov & Mnih, ICML 2008) with Normal-Wishart hyperpriors
(μ_U, Λ_U) ~ N(μ_U | μ₀, (β₀ Λ_U)⁻¹) W(Λ_U | W₀, ν₀), μ₀ = 0, β₀ = 2, W₀ = I, ν₀ = D, resampled each sweep from

    β* = β₀ + M,  ν* = ν₀ + M,  μ* = (β₀ μ₀ + M Ū) / β*,
    W*⁻¹ = W₀⁻¹ + M S̄ + β₀ M / (β₀ + M) (μ₀ − Ū)(μ₀ − Ū)ᵀ     (Ū, S̄: mean and covariance of the rows of U).

The official "Bayesian PMF" (`method/bptf.py`) puts an LKJ-Cholesky prior (η = 5, Exponential(1) scales) on the
factor covariance instead, which has no conjugate update; Normal-Wishart is the conjugate prior of the same
hierarchical model (documented deviation).

Scores are normalised per column with the train mean and std (`column_normalise`, as `method/matrix.py`: columns with
fewer than 5 observed values use the global statistics) before fitting and mapped back on prediction. The predictive
interval of a cell adds the likelihood noise: sd_pred² = sd(U·Vᵀ)² + 1/α (normalised scale).

Baselines (`method/baseline_pmf.py`): global mean, mean-of-means (average of the row, column and global means), both
on the column-normalised train matrix and mapped back as `run_pmf.py` does, and plain matrix factorisation by
alternating least squares (a point estimate: no uncertainty). Uncertainty heuristic: `binomial_sd`, the sampling sd
sqrt(p̂(1 − p̂)/items) of a cell of `items` 0/1 results at the predicted mean p̂.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

MIN_COLUMN_OBS = 5  # `method/matrix.py`: fewer observed values -> the column takes the global statistics


def _check_matrix(r: np.ndarray, name: str = "R") -> np.ndarray:
    r = np.asarray(r, dtype=np.float64)
    if r.ndim != 2 or r.shape[0] < 1 or r.shape[1] < 1:
        raise ValueError(f"{name} must be a non-empty 2-D matrix (NaN = unobserved), got shape {r.shape}")
    if np.isinf(r).any():
        raise ValueError(f"{name} must hold finite scores or NaN, got an infinite value")
    if not np.isfinite(r).any():
        raise ValueError(f"{name} has no observed cell; expected at least one finite score")
    return r


# ----------------------------------------------------------------------------------------------------------- data
def synthetic_low_rank(
    n_rows: int, n_cols: int, rank: int, noise: float = 0.1, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """A planted matrix ``(truth, observed)``: truth = A Bᵀ with A [n_rows, rank], B [n_cols, rank] ~ N(0, 1/√rank),
    observed = truth + N(0, noise²). For tests of recovery and interval coverage."""
    if n_rows < 1 or n_cols < 1 or rank < 1 or noise < 0:
        raise ValueError(f"synthetic_low_rank needs n_rows, n_cols, rank >= 1 and noise >= 0, got "
                         f"{n_rows}, {n_cols}, {rank}, {noise}")  # fmt: skip
    rng = np.random.default_rng(seed)
    a = rng.normal(0.0, 1.0 / np.sqrt(np.sqrt(rank)), (n_rows, rank))
    b = rng.normal(0.0, 1.0 / np.sqrt(np.sqrt(rank)), (n_cols, rank))
    truth = a @ b.T  # (n_rows, n_cols)
    return truth, truth + rng.normal(0.0, noise, truth.shape)


def split_cells(r: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Mask `fraction` of the observed cells at random: ``(train, test)``, each NaN where the other holds a value."""
    r = _check_matrix(r)
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction!r}")
    obs = np.argwhere(np.isfinite(r))
    n_test = int(round(fraction * len(obs)))
    if n_test < 1 or n_test >= len(obs):
        raise ValueError(f"masking {fraction:.0%} of {len(obs)} observed cells leaves an empty train or test split")
    pick = np.random.default_rng(seed).choice(len(obs), size=n_test, replace=False)
    train, test = r.copy(), np.full_like(r, np.nan)
    rows, cols = obs[pick, 0], obs[pick, 1]
    test[rows, cols] = r[rows, cols]
    train[rows, cols] = np.nan
    return train, test


def column_normalise(train: np.ndarray, min_obs: int = MIN_COLUMN_OBS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(Z, mu, sigma)`` with Z = (train - mu) / sigma per column; columns with < `min_obs` observed values (or zero
    spread) take the global mean / std of the train cells (as the official `normalize_data`)."""
    train = _check_matrix(train, "train")
    obs = np.isfinite(train)
    count = obs.sum(axis=0)
    g_mu = float(np.nanmean(train))
    g_sd = float(np.nanstd(train)) or 1.0
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: their mean / std are NaN, handled below
        mu = np.nanmean(train, axis=0)
        sd = np.nanstd(train, axis=0)
    bad = (count < min_obs) | ~np.isfinite(mu) | ~(sd > 1e-12)
    mu = np.where(bad, g_mu, mu)
    sd = np.where(bad, g_sd, sd)
    return (train - mu) / sd, mu, sd


# ----------------------------------------------------------------------------------------------------------- PMF
@dataclass
class PMFPrediction:
    """Posterior summary on the original scale, every cell.

    Attributes:
        mean: posterior mean of U·Vᵀ (de-normalised), [M, N].
        std: posterior std of U·Vᵀ (the paper's uncertainty), [M, N].
        predictive_std: sqrt(std² + σ_col² / α): the std of a new noisy observation of the cell, [M, N].
        draws: the kept draws of U·Vᵀ (de-normalised), [S, M, N].
    """

    mean: np.ndarray
    std: np.ndarray
    predictive_std: np.ndarray
    draws: np.ndarray

    def interval(self, level: float = 0.9, *, predictive: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Central Gaussian interval of each cell at `level` (predictive: including the likelihood noise)."""
        from scipy.stats import norm

        if not 0.0 < level < 1.0:
            raise ValueError(f"level must be in (0, 1), got {level!r}")
        half = float(norm.ppf(0.5 + level / 2.0)) * (self.predictive_std if predictive else self.std)
        return self.mean - half, self.mean + half


class PMF:
    """Probabilistic matrix factorisation sampled by Gibbs; ``fit(R)`` then ``predict()`` / ``suggest(k)``.

    R_mn ~ N(U_m·V_n, 1/α), U_m, V_n ~ N(0, I_D) (``prior="fixed"``) or Normal-Wishart BPMF hyperpriors
    (``prior="bpmf"``); https://arxiv.org/abs/2410.10112.

    Args:
        rank (`int`, defaults to 10): latent dimension D (paper: 10).
        alpha (`float`, defaults to 2.0): fixed likelihood precision on the column-normalised scale (paper: 2).
        n_burn (`int`, defaults to 100): Gibbs sweeps discarded.
        n_draws (`int`, defaults to 100): Gibbs sweeps kept (paper: 100 NUTS draws after 500 tuning steps).
        init_std (`float`, defaults to 0.05): U, V start at N(0, init_std²) (official `--std 0.05`).
        prior (`str`, defaults to ``"fixed"``): ``fixed`` (paper's PMF) or ``bpmf`` (Normal-Wishart hyperpriors).
        seed (`int`, defaults to 0): the sampler's seed (same seed, same draws).
    """

    def __init__(self, rank: int = 10, alpha: float = 2.0, n_burn: int = 100, n_draws: int = 100,
                 init_std: float = 0.05, prior: str = "fixed", seed: int = 0) -> None:  # fmt: skip
        if int(rank) < 1:
            raise ValueError(f"rank must be >= 1, got {rank!r}")
        if not alpha > 0:
            raise ValueError(f"alpha (likelihood precision) must be > 0, got {alpha!r}")
        if int(n_burn) < 0 or int(n_draws) < 2:
            raise ValueError(f"n_burn must be >= 0 and n_draws >= 2, got {n_burn!r}, {n_draws!r}")
        if not init_std > 0:
            raise ValueError(f"init_std must be > 0, got {init_std!r}")
        if prior not in ("fixed", "bpmf"):
            raise ValueError(f"prior must be 'fixed' or 'bpmf', got {prior!r}")
        self.rank, self.alpha, self.n_burn, self.n_draws = int(rank), float(alpha), int(n_burn), int(n_draws)
        self.init_std, self.prior, self.seed = float(init_std), prior, int(seed)
        self._fit: PMFPrediction | None = None
        self._train: np.ndarray | None = None

    def fit(self, r: np.ndarray) -> PMF:
        """Sample the posterior given the observed (finite) cells of `r` [M, N]; NaN = unobserved."""
        r = _check_matrix(r)
        z, mu, sd = column_normalise(r)
        draws = gibbs_pmf(z, rank=self.rank, alpha=self.alpha, n_burn=self.n_burn, n_draws=self.n_draws,
                          init_std=self.init_std, prior=self.prior, seed=self.seed)  # fmt: skip
        draws = draws * sd + mu  # (S, M, N), original scale
        std = draws.std(axis=0)
        pred_sd = np.sqrt(std**2 + sd**2 / self.alpha)
        self._fit = PMFPrediction(draws.mean(axis=0), std, pred_sd, draws)
        self._train = r
        return self

    def predict(self) -> PMFPrediction:
        if self._fit is None:
            raise ValueError("PMF.predict() needs fit(R) first")
        return self._fit

    def suggest(self, k: int) -> list[tuple[int, int]]:
        """The `k` unobserved cells with the highest posterior std ("evaluate next"), highest first."""
        pred = self.predict()
        assert self._train is not None
        cand = np.argwhere(~np.isfinite(self._train))
        if k < 0 or k > len(cand):
            raise ValueError(f"k must be in [0, {len(cand)}] (the unobserved cells), got {k!r}")
        order = np.argsort(-pred.std[cand[:, 0], cand[:, 1]], kind="stable")[:k]
        return [(int(i), int(j)) for i, j in cand[order]]


def _sample_rows(other: np.ndarray, z: np.ndarray, obs: np.ndarray, alpha: float, lam0: np.ndarray,
                 mu0: np.ndarray, rng: np.random.Generator) -> np.ndarray:  # fmt: skip
    """One block update: every row of the factor given the other factor (batched Gaussian conditionals)."""
    d = other.shape[1]
    zo = np.where(obs, z, 0.0)  # (M, N)
    prec = lam0[None] + alpha * np.einsum("mn,nd,ne->mde", obs.astype(float), other, other)  # (M, D, D)
    rhs = (lam0 @ mu0)[None] + alpha * zo @ other  # (M, D)
    chol = np.linalg.cholesky(prec)  # prec = L Lᵀ
    mean = np.linalg.solve(prec, rhs[..., None])[..., 0]
    eps = rng.standard_normal((z.shape[0], d))
    # x = L⁻ᵀ ε has covariance (L Lᵀ)⁻¹
    noise = np.linalg.solve(np.swapaxes(chol, 1, 2), eps[..., None])[..., 0]
    return mean + noise


def _sample_normal_wishart(x: np.ndarray, beta0: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(μ, Λ) from the Normal-Wishart posterior given the rows of x (S&M 2008, Eq. 13-14; μ₀ = 0, W₀ = I, ν₀ = D)."""
    from scipy.stats import wishart

    m, d = x.shape
    xbar = x.mean(axis=0)
    s = np.cov(x, rowvar=False, bias=True).reshape(d, d) if m > 1 else np.zeros((d, d))
    beta, nu = beta0 + m, d + m
    mu_star = m * xbar / beta
    w_inv = np.eye(d) + m * s + (beta0 * m / beta) * np.outer(xbar, xbar)
    w_star = np.linalg.inv(w_inv)
    w_star = (w_star + w_star.T) / 2
    lam = np.atleast_2d(wishart.rvs(df=nu, scale=w_star, random_state=rng))
    cov = np.linalg.inv(beta * lam)
    mu = rng.multivariate_normal(mu_star, (cov + cov.T) / 2)
    return mu, lam


def gibbs_pmf(z: np.ndarray, *, rank: int, alpha: float, n_burn: int, n_draws: int, init_std: float = 0.05,
              prior: str = "fixed", seed: int = 0, beta0: float = 2.0) -> np.ndarray:  # fmt: skip
    """Gibbs draws of U·Vᵀ [n_draws, M, N] for the (normalised) matrix `z` with NaN = unobserved."""
    obs = np.isfinite(z)
    rng = np.random.default_rng(seed)
    m, n = z.shape
    u = rng.normal(0.0, init_std, (m, rank))
    v = rng.normal(0.0, init_std, (n, rank))
    eye, zero = np.eye(rank), np.zeros(rank)
    mu_u, lam_u, mu_v, lam_v = zero, eye, zero, eye
    out = np.empty((n_draws, m, n))
    for t in range(n_burn + n_draws):
        if prior == "bpmf":
            mu_u, lam_u = _sample_normal_wishart(u, beta0, rng)
        u = _sample_rows(v, z, obs, alpha, lam_u, mu_u, rng)
        if prior == "bpmf":
            mu_v, lam_v = _sample_normal_wishart(v, beta0, rng)
        v = _sample_rows(u, z.T, obs.T, alpha, lam_v, mu_v, rng)
        if t >= n_burn:
            out[t - n_burn] = u @ v.T  # average products, never factors (rotation / label switching)
    return out


# ----------------------------------------------------------------------------------------------------------- baselines
def _on_scale(train: np.ndarray, normalise: bool, fill: Any) -> np.ndarray:
    """`fill(X)` on the column-normalised train cells mapped back (``normalise``), or on the raw cells."""
    train = _check_matrix(train, "train")
    if not normalise:
        return fill(train)
    z, mu, sd = column_normalise(train)
    return fill(z) * sd + mu  # (M, N)


def global_mean_predict(train: np.ndarray, *, normalise: bool = True) -> np.ndarray:
    """Every cell = the mean of the train cells (`GlobalMeanBaseline`).

    ``normalise=True`` (as `run_pmf.py`, which passes the column-normalised train matrix to every baseline and
    de-normalises in `recomm_eval`): the mean of Z = (R - mu) / sigma mapped back, i.e. about the train column mean
    of every column with >= 5 observations. ``normalise=False``: one raw mean for every cell."""

    def fill(x: np.ndarray) -> np.ndarray:
        return np.full(x.shape, float(np.nanmean(x)))

    return _on_scale(train, normalise, fill)


def mean_of_means_predict(train: np.ndarray, *, normalise: bool = True) -> np.ndarray:
    """Cell (m, n) = mean of (global mean, row mean, column mean), dropping a mean with no observation
    (`MeanOfMeansBaseline`), on the column-normalised scale and mapped back (``normalise=True``, as `run_pmf.py`:
    mu_n + sigma_n · mean(ḡ_Z, r̄_Z,m, c̄_Z,n)) or on the raw scores (``normalise=False``)."""

    def fill(x: np.ndarray) -> np.ndarray:
        obs = np.isfinite(x)
        g = float(np.nanmean(x))
        zero = np.where(obs, x, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            rmean = zero.sum(1) / obs.sum(1)
            cmean = zero.sum(0) / obs.sum(0)
        stack = np.stack(np.broadcast_arrays(np.full(x.shape, g), rmean[:, None], cmean[None, :]))  # (3, M, N)
        return np.nanmean(np.where(np.isfinite(stack), stack, np.nan), axis=0)

    return _on_scale(train, normalise, fill)


def binomial_sd(mean: np.ndarray, items: int) -> np.ndarray:
    """The sampling sd of a cell that averages `items` 0/1 results: sqrt(p̂(1 − p̂) / items), p̂ = `mean` clipped
    to [0, 1] [M, N]. An uncertainty heuristic from a point prediction alone (no posterior): the review's baseline
    for PMF's posterior std."""
    if int(items) < 1:
        raise ValueError(f"items must be >= 1, got {items!r}")
    p = np.clip(np.asarray(mean, dtype=np.float64), 0.0, 1.0)
    return np.sqrt(p * (1.0 - p) / int(items))


def als_mf_predict(train: np.ndarray, rank: int, reg: float, *, n_iters: int = 50, seed: int = 0) -> np.ndarray:
    """Plain matrix factorisation by alternating ridge regressions on the column-normalised train cells:
    min Σ_obs (Z_mn − U_m·V_n)² + reg (‖U‖² + ‖V‖²); a point estimate, de-normalised."""
    if int(rank) < 1 or not reg > 0 or int(n_iters) < 1:
        raise ValueError(f"als_mf_predict needs rank >= 1, reg > 0 and n_iters >= 1, got {rank}, {reg}, {n_iters}")
    z, mu, sd = column_normalise(train)
    obs = np.isfinite(z)
    rng = np.random.default_rng(seed)
    u = rng.normal(0.0, 0.1, (z.shape[0], rank))
    v = rng.normal(0.0, 0.1, (z.shape[1], rank))
    lam0 = reg * np.eye(rank)

    def solve(other: np.ndarray, zz: np.ndarray, oo: np.ndarray) -> np.ndarray:
        a = lam0[None] + np.einsum("mn,nd,ne->mde", oo.astype(float), other, other)
        return np.linalg.solve(a, (np.where(oo, zz, 0.0) @ other)[..., None])[..., 0]

    for _ in range(int(n_iters)):
        u = solve(v, z, obs)
        v = solve(u, z.T, obs.T)
    return (u @ v.T) * sd + mu


# ----------------------------------------------------------------------------------------------------------- metrics
def rmse(pred: np.ndarray, truth: np.ndarray) -> float:
    """RMSE over the finite cells of `truth`."""
    m = np.isfinite(truth)
    if not m.any():
        raise ValueError("rmse needs at least one finite truth cell")
    return float(np.sqrt(np.mean((pred[m] - truth[m]) ** 2)))


def coverage(lo: np.ndarray, hi: np.ndarray, truth: np.ndarray) -> float:
    """Share of finite truth cells inside [lo, hi]."""
    m = np.isfinite(truth)
    return float(np.mean((truth[m] >= lo[m]) & (truth[m] <= hi[m])))


REVEAL_STRATEGIES = ("uncertainty", "random", "oracle", "heuristic")


def reveal_path(
    full: np.ndarray,
    train: np.ndarray,
    test: np.ndarray,
    *,
    strategy: str,
    rounds: int,
    step: int,
    fit: Any,
    seed: int = 0,
    heuristic: Any = None,
) -> list[np.ndarray]:
    """The predicted matrix after each round of revealing `step` test cells, revealed cells set to their true value
    (known, error 0, as `active_eval.py`), refitting each round: ``[pred_0, ..., pred_rounds]``, each [M, N].

    `strategy`: ``uncertainty`` (highest posterior std first, the paper's `ActiveSelector`), ``random``, ``oracle``
    (largest true error, `WorstSelector`) or ``heuristic`` (highest ``heuristic(pred, train)`` [M, N], e.g. the
    `binomial_sd` of the predicted mean: an uncertainty without a posterior). `fit(train) -> PMFPrediction`.
    """
    if strategy not in REVEAL_STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(REVEAL_STRATEGIES)}, got {strategy!r}")
    if strategy == "heuristic" and not callable(heuristic):
        raise ValueError(f"the heuristic strategy needs heuristic=f(pred, train) -> [M, N] scores, got {heuristic!r}")
    rng = np.random.default_rng(seed)
    train = train.copy()
    hidden = np.isfinite(test)
    out = []
    for t in range(rounds + 1):
        pred = fit(train)
        out.append(np.where(np.isfinite(train) & hidden, full, pred.mean))
        if t == rounds:
            break
        cand = np.argwhere(hidden & ~np.isfinite(train))
        k = min(step, len(cand))
        if strategy == "random":
            pick = rng.choice(len(cand), size=k, replace=False)
        else:
            if strategy == "uncertainty":
                score = pred.std  # (M, N)
            elif strategy == "oracle":
                score = np.abs(pred.mean - full)
            else:
                score = np.asarray(heuristic(pred, train))
            pick = np.argsort(-score[cand[:, 0], cand[:, 1]], kind="stable")[:k]
        for i, j in cand[pick]:
            train[i, j] = full[i, j]
    return out


def active_reveal(
    full: np.ndarray,
    train: np.ndarray,
    test: np.ndarray,
    *,
    strategy: str,
    rounds: int,
    step: int,
    fit: Any,
    seed: int = 0,
    heuristic: Any = None,
) -> list[float]:
    """RMSE on the original test cells after each round of `reveal_path`: ``[rmse_0, ..., rmse_rounds]``."""
    path = reveal_path(full, train, test, strategy=strategy, rounds=rounds, step=step, fit=fit, seed=seed,
                       heuristic=heuristic)  # fmt: skip
    return [rmse(p, test) for p in path]


def group_mse(pred: np.ndarray, truth: np.ndarray, groups: Any) -> dict[Any, float]:
    """Mean squared error over the finite cells of `truth` in the columns of each group: ``{group: mse}`` in order
    of first appearance; a group with no finite truth cell is left out. `groups`: one label per column [N]."""
    groups = list(groups)
    if len(groups) != truth.shape[1]:
        raise ValueError(f"groups must label each of the {truth.shape[1]} columns, got {len(groups)} labels")
    out: dict[Any, float] = {}
    labels = np.asarray(groups, dtype=object)
    for g in dict.fromkeys(groups):
        cols = labels == g
        m = np.isfinite(truth[:, cols])
        if m.any():
            out[g] = float(np.mean((pred[:, cols][m] - truth[:, cols][m]) ** 2))
    return out


def load_crosspred_json(path: str) -> tuple[list[str], list[str], np.ndarray]:
    """A ``{model: {dataset: score}}`` JSON (the CrossPred-LVLM `result_summary.json` format, from a copy the user
    holds; lmlab ships none) as ``(models, datasets, R)`` with NaN for missing scores."""
    import json

    with open(path) as fh:
        data = json.load(fh)
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{path}: expected a non-empty {{model: {{dataset: score}}}} JSON object")
    models = list(data)
    datasets = list(dict.fromkeys(d for m in models for d in data[m]))
    r = np.full((len(models), len(datasets)), np.nan)
    for i, m in enumerate(models):
        for j, d in enumerate(datasets):
            v = data[m].get(d)
            if v is not None:
                r[i, j] = float(v)
    return models, datasets, r
