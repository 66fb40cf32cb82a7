"""Control Variates Evaluation (Zhou, Song & Zanette, ICML 2025, arXiv 2502.10563): an unbiased win rate from few
human labels and many synthetic ones.

θ̂_CV = mean_{i∈H} z_i − α (mean_{i∈H} ẑ_i − mean_{i∈[N]} ẑ_i),  α = Cov(z, ẑ) / Var(ẑ) on H;
Var(θ̂_CV) ≈ (1 − ρ²) Var(z) / n, so the predicted saving of human labels is ρ² = corr(z, ẑ)²
(https://arxiv.org/abs/2502.10563, Algorithm 1; official code Zanette-Labs/control_variates_evaluation,
`stats/utils.py`: ``saving = corr² x 100``).

z ∈ {0, ½, 1} is the human preference for model A over model B on a prompt (½ a tie), ẑ ∈ [0, 1] a synthetic
evaluator's (reward model σ(r_A − r_B), or a judge), oriented the same way. H is a random subset of n of the N
prompts, all of which have ẑ. Any fixed α gives an unbiased estimator (E over H of the bracket is 0); α = 0 is the
human-only mean, α = 1 is PPI (Angelopoulos et al., 2023). Estimating α on the same H adds an O(1/n) bias; the
``"ppi++"`` choice uses PPI++'s power-tuned λ = clip(Cov_n(z, ẑ) / ((1 + n/N) Var(ẑ)), 0, 1) exactly as
``ppi_py.ppi_mean_pointestimate(..., lam=None)`` computes it (Angelopoulos, Duchi & Zrnic 2023), with ẑ over all
N as its "unlabeled" set.

Variance. When H is a simple random sample of the N prompts and the ẑ mean is over those same N (the paper's
protocol), Var(θ̂) = (1 − n/N) Var(z − αẑ) / n: the finite-population factor cancels in the ratio to human-only,
so the saving is ρ² at any n for α* = Cov/Var. When the N ẑ are an independent pool instead, Var gains
α² Var(ẑ)/N and the saving shrinks to ρ²(1 − n/N) (paper α) or ρ²/(1 + n/N) (PPI++ λ); `predicted_saving` gives
all three.

Clipping. A near-constant judge on H makes Var(ẑ_H) tiny and α = Cov/Var explode (the official
``ControlVariatesEvaluatorV4`` does not guard it: win rates far outside [0, 1] at n = 10). The fitted α is clipped
to `ALPHA_CLIP` = [0, 2]: for a fixed α, Var(θ̂) <= Var(human-only) iff α lies between 0 and 2α*, so [0, 2] is the
no-harm range of a calibrated judge (E[z | ẑ] = ẑ gives α* = 1), and a negative α (a judge anti-correlated with
humans on H, mostly noise at small n) falls back to the human mean, as PPI++'s clip of λ to [0, 1] does. The
estimate, a win rate, is clipped to [0, 1] (a projection onto the range that holds θ: it can only lower the error).
``alpha_clip=None`` with ``clip_estimate=False`` is the official unclipped estimator.

Planted judges. `noisy_oracle_judge` ẑ = σ((d + b + s·ξ)/τ) sees the latent quality gap d the simulated human
draws z from, blurred by noise s·ξ; `calibrate_judge_noise` picks s so that corr(z, ẑ)² hits a target ρ² (the sweep
that tests "saving ≈ ρ²" where ρ² is large enough to show).

Everything here is numpy (no I/O). The judges built from the response cache live in the experiment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


def _vec(x: Any, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    if a.size == 0:
        raise ValueError(f"{name} is empty; expected at least one value")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} must be finite, got a NaN or infinite value")
    return a


@dataclass(frozen=True)
class CVEstimate:
    """A win-rate estimate with its coefficient, standard error and normal confidence interval."""

    estimate: float
    alpha: float
    se: float
    ci_low: float
    ci_high: float
    n: int
    N: int


ALPHA_CLIP: tuple[float, float] = (0.0, 2.0)  # the fitted α's range (module docstring, "Clipping")


def _check_clip(clip: Any) -> tuple[float, float] | None:
    if clip is None:
        return None
    try:
        lo, hi = (float(c) for c in clip)
    except (TypeError, ValueError):
        raise ValueError(f"alpha_clip must be None or a (low, high) pair, got {clip!r}") from None
    if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
        raise ValueError(f"alpha_clip must be a finite (low, high) pair with low < high, got {clip!r}")
    return lo, hi


def fit_alpha(z: np.ndarray, zhat: np.ndarray, clip: tuple[float, float] | None = ALPHA_CLIP) -> float:
    """α = clip(Cov(z, ẑ) / Var(ẑ), *clip) on the labeled pairs (0 when ẑ is constant there or n < 2); ``clip=None``
    is the official unclipped ratio."""
    z, zhat = _vec(z, "z"), _vec(zhat, "zhat")
    bounds = _check_clip(clip)
    if z.size < 2:
        return 0.0
    var = float(np.var(zhat, ddof=1))
    a = 0.0 if var <= 1e-15 else float(np.cov(z, zhat, ddof=1)[0, 1] / var)
    return a if bounds is None else float(np.clip(a, *bounds))


def ppi_plus_plus_lambda(z: np.ndarray, zhat: np.ndarray, zhat_all: np.ndarray) -> float:
    """PPI++'s power-tuned λ for a mean, as ``ppi_py._calc_lam_glm`` with ``clip=True`` computes it:
    λ = clip(Cov_n(z, ẑ) / ((1 + n/N) · Var(ẑ_H ∪ ẑ_all)), 0, 1) (1/n covariance, ddof-1 variance)."""
    z, zhat, zhat_all = _vec(z, "z"), _vec(zhat, "zhat"), _vec(zhat_all, "zhat_all")
    n, big_n = z.size, zhat_all.size
    cov = float(np.mean((z - z.mean()) * (zhat - zhat.mean())))
    pooled = np.concatenate([zhat, zhat_all])
    var = float(np.var(pooled, ddof=1)) if pooled.size > 1 else 0.0
    if var <= 1e-15:
        return 0.0
    return float(np.clip(cov / ((1.0 + n / big_n) * var), 0.0, 1.0))


def control_variates_estimate(
    z_labeled: Any,
    zhat_labeled: Any,
    zhat_all: Any,
    alpha: str | float = "fit",
    *,
    confidence: float = 0.95,
    labeled_in_all: bool = True,
    alpha_clip: tuple[float, float] | None = ALPHA_CLIP,
    clip_estimate: bool = True,
) -> CVEstimate:
    """θ̂_CV = clip(mean(z_H) − α (mean(ẑ_H) − mean(ẑ_all)), 0, 1) with its SE and a normal CI (clipped to [0, 1]).

    Args:
        z_labeled: human labels of the n labeled pairs (z ∈ [0, 1], ties ½).
        zhat_labeled: the synthetic evaluator's ẑ on the same pairs, oriented like z.
        zhat_all: ẑ on all N pairs (the labeled ones included when `labeled_in_all`).
        alpha: ``"fit"`` (the paper: Cov/Var on the labeled pairs), ``"ppi++"`` (PPI++'s λ), or a number
            (0 = human-only, 1 = PPI).
        confidence: two-sided level of the CI.
        labeled_in_all: H ⊂ [N] (the paper's protocol: finite-population SE); else [N] is an independent pool.
        alpha_clip: range of the fitted α (``"fit"`` only; `ALPHA_CLIP` = (0, 2)); None leaves it unclipped.
        clip_estimate: clip the estimate and the CI to [0, 1] (z must then lie in [0, 1], a win rate).
    """
    z, h, ha = _vec(z_labeled, "z_labeled"), _vec(zhat_labeled, "zhat_labeled"), _vec(zhat_all, "zhat_all")
    if z.size != h.size:
        raise ValueError(f"z_labeled and zhat_labeled must have the same length, got {z.size} and {h.size}")
    if labeled_in_all and z.size > ha.size:
        raise ValueError(f"zhat_all must cover the labeled pairs (N >= n), got N = {ha.size} < n = {z.size}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if clip_estimate and (z.min() < 0.0 or z.max() > 1.0):
        raise ValueError("z_labeled must lie in [0, 1] (a win rate) when clip_estimate=True; pass clip_estimate=False")
    if isinstance(alpha, str):
        if alpha == "fit":
            a = fit_alpha(z, h, clip=alpha_clip)
        elif alpha == "ppi++":
            a = ppi_plus_plus_lambda(z, h, ha)
        else:
            raise ValueError(f"alpha must be 'fit', 'ppi++' or a number, got {alpha!r}")
    else:
        a = float(alpha)
        if not np.isfinite(a):
            raise ValueError(f"alpha must be finite, got {alpha!r}")
    n, big_n = z.size, ha.size
    est = float(z.mean() - a * (h.mean() - ha.mean()))
    resid_var = float(np.var(z - a * h, ddof=1)) if n > 1 else 0.0
    if labeled_in_all:
        var = max(0.0, 1.0 - n / big_n) * resid_var / n
    else:
        var = resid_var / n + a * a * (float(np.var(ha, ddof=1)) if big_n > 1 else 0.0) / big_n
    from scipy.stats import norm

    half = float(norm.ppf(0.5 + confidence / 2.0)) * np.sqrt(var)
    lo, hi = est - half, est + half
    if clip_estimate:  # θ ∈ [0, 1], so the projection can only move the estimate closer to it
        est, lo, hi = (float(np.clip(v, 0.0, 1.0)) for v in (est, lo, hi))
    return CVEstimate(est, a, float(np.sqrt(var)), float(lo), float(hi), n, big_n)


def human_only(z_labeled: Any, zhat_labeled: Any, zhat_all: Any, **kw: Any) -> CVEstimate:
    """The sample mean of the human labels (α = 0)."""
    return control_variates_estimate(z_labeled, zhat_labeled, zhat_all, 0.0, **kw)


def ppi(z_labeled: Any, zhat_labeled: Any, zhat_all: Any, **kw: Any) -> CVEstimate:
    """Prediction-powered inference (α = 1)."""
    return control_variates_estimate(z_labeled, zhat_labeled, zhat_all, 1.0, **kw)


def synthetic_only(zhat_all: Any) -> float:
    """The mean of the synthetic labels over all N (biased by the evaluator's bias)."""
    return float(_vec(zhat_all, "zhat_all").mean())


def predicted_saving(z: Any, zhat: Any, n: int | None = None, N: int | None = None, *,
                     mode: str = "subset") -> float:  # fmt: skip
    """Predicted share of human labels saved, 1 − Var_CV / Var_human.

    ``mode="subset"`` (H ⊂ [N], the paper's protocol) or `n`/`N` not given: ρ². ``"pool"`` (independent pool of N,
    α = Cov/Var): ρ²(1 − n/N). ``"pool-ppi++"`` (PPI++'s λ): ρ² / (1 + n/N).
    """
    z, zhat = _vec(z, "z"), _vec(zhat, "zhat")
    if z.size != zhat.size or z.size < 2:
        raise ValueError(f"z and zhat must have the same length >= 2, got {z.size} and {zhat.size}")
    if z.std() == 0 or zhat.std() == 0:
        return 0.0
    rho2 = float(np.corrcoef(z, zhat)[0, 1] ** 2)
    if mode == "subset" or n is None or N is None:
        if mode not in ("subset", "pool", "pool-ppi++"):
            raise ValueError(f"mode must be subset, pool or pool-ppi++, got {mode!r}")
        return rho2
    if n < 1 or N < 1:
        raise ValueError(f"n and N must be >= 1, got {n}, {N}")
    if mode == "pool":
        return rho2 * max(0.0, 1.0 - n / N)
    if mode == "pool-ppi++":
        return rho2 / (1.0 + n / N)
    raise ValueError(f"mode must be subset, pool or pool-ppi++, got {mode!r}")


def labels_needed(z: Any, zhat: Any, half_width: float, *, confidence: float = 0.95, N: int | None = None) -> int:
    """Human labels for a CI of ± `half_width` with control variates: n = z² (1 − ρ²) Var(z) / w² (finite-population
    corrected when `N` is given)."""
    from scipy.stats import norm

    z, zhat = _vec(z, "z"), _vec(zhat, "zhat")
    if not half_width > 0:
        raise ValueError(f"half_width must be > 0, got {half_width!r}")
    q = float(norm.ppf(0.5 + confidence / 2.0))
    n0 = q * q * (1.0 - predicted_saving(z, zhat)) * float(np.var(z, ddof=1)) / half_width**2
    if N is not None:
        n0 = n0 / (1.0 + n0 / N)
    return max(2, int(np.ceil(n0)))


# ------------------------------------------------------------------------------------------ repeated estimation
def repeat_estimates(
    z: Any, zhat: Any, n: int, repeats: int, seed: int = 0, *, alpha_clip: tuple[float, float] | None = ALPHA_CLIP
) -> dict[str, np.ndarray]:
    """Estimates of every estimator over `repeats` random labeled subsets H (n of the N, without replacement), [R]
    each: ``human_only``, ``cv`` (α fitted on H and clipped to `alpha_clip`), ``cv_ppi++``, ``ppi`` (α = 1),
    ``synthetic_only``, all clipped to [0, 1] as `control_variates_estimate` does; ``cv_unclipped`` (the official
    estimator: α and estimate unclipped); ``cv_covered`` (1 if the CV 95% CI holds the full-population mean of z);
    ``alpha`` (clipped) and ``alpha_unclipped``."""
    from scipy.stats import norm

    z, zhat = _vec(z, "z"), _vec(zhat, "zhat")
    bounds = _check_clip(alpha_clip)
    if z.min() < 0.0 or z.max() > 1.0:
        raise ValueError("z must lie in [0, 1] (a win rate)")
    big_n = z.size
    if zhat.size != big_n:
        raise ValueError(f"z and zhat must have the same length, got {big_n} and {zhat.size}")
    if not 2 <= n <= big_n:
        raise ValueError(f"n must be in [2, {big_n}] (the pairs), got {n!r}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats!r}")
    rng = np.random.default_rng(seed)
    idx = np.argsort(rng.random((repeats, big_n)), axis=1)[:, :n]  # (R, n): simple random samples
    zh, hh = z[idx], zhat[idx]  # (R, n)
    mz, mh, mall = zh.mean(1), hh.mean(1), zhat.mean()
    dz, dh = zh - mz[:, None], hh - mh[:, None]
    var_h = (dh**2).sum(1) / (n - 1)
    alpha_raw = np.where(var_h > 1e-15, (dz * dh).sum(1) / (n - 1) / np.where(var_h > 1e-15, var_h, 1.0), 0.0)
    alpha = alpha_raw if bounds is None else np.clip(alpha_raw, *bounds)
    pooled_var = (np.sum(hh**2, 1) + np.sum(zhat**2) - (hh.sum(1) + zhat.sum()) ** 2 / (n + big_n)) / (n + big_n - 1)
    lam = np.where(pooled_var > 1e-15, (dz * dh).mean(1) / ((1 + n / big_n) * np.where(pooled_var > 1e-15,
                   pooled_var, 1.0)), 0.0)  # fmt: skip
    lam = np.clip(lam, 0.0, 1.0)
    cv = mz - alpha * (mh - mall)
    resid = zh - alpha[:, None] * hh
    se = np.sqrt(max(0.0, 1.0 - n / big_n) * resid.var(1, ddof=1) / n)
    q = float(norm.ppf(0.975))
    return {
        "human_only": mz,
        "cv": np.clip(cv, 0.0, 1.0),
        "cv_ppi++": np.clip(mz - lam * (mh - mall), 0.0, 1.0),
        "ppi": np.clip(mz - (mh - mall), 0.0, 1.0),
        "synthetic_only": np.full(repeats, mall),
        "cv_unclipped": mz - alpha_raw * (mh - mall),
        # θ ∈ [0, 1]: clipping the CI to [0, 1] does not change whether it holds θ
        "cv_covered": (np.abs(cv - z.mean()) <= q * se).astype(float),
        "alpha": alpha,
        "alpha_unclipped": alpha_raw,
    }


# ------------------------------------------------------------------------------------------ simulated human, judges
def simulated_human(q_a: Any, q_b: Any, *, tau: float, eps: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """lmlab's simulated human: z ~ Bernoulli(σ((q_A − q_B)/τ)), a tie (½) when |q_A − q_B| < ε.

    Returns ``(z, p)`` with p = E[z] per pair (its mean is the true win rate)."""
    qa, qb = _vec(q_a, "q_a"), _vec(q_b, "q_b")
    if qa.size != qb.size:
        raise ValueError(f"q_a and q_b must have the same length, got {qa.size} and {qb.size}")
    if not tau > 0 or eps < 0:
        raise ValueError(f"tau must be > 0 and eps >= 0, got tau={tau!r}, eps={eps!r}")
    d = qa - qb
    p = np.where(np.abs(d) < eps, 0.5, 1.0 / (1.0 + np.exp(-d / tau)))
    u = np.random.default_rng(seed).random(d.size)
    z = np.where(np.abs(d) < eps, 0.5, (u < p).astype(float))
    return z, p


def noisy_oracle_judge(gap: Any, xi: Any, noise_sd: float, *, bias: float = 0.0, tau: float = 0.25) -> np.ndarray:
    """A planted synthetic judge ẑ = σ((d + b + s·ξ) / τ): it sees the latent quality gap d = q_A − q_B the simulated
    human draws z from, shifted by a bias b and blurred by s·ξ (ξ the given standard-normal draws, [N], so one set of
    draws serves every noise level). s = 0 is the best judge of d (up to b); s → ∞ is a coin."""
    d, x = _vec(gap, "gap"), _vec(xi, "xi")
    if d.size != x.size:
        raise ValueError(f"gap and xi must have the same length, got {d.size} and {x.size}")
    if not noise_sd >= 0 or not tau > 0:
        raise ValueError(f"noise_sd must be >= 0 and tau > 0, got {noise_sd!r}, {tau!r}")
    return 1.0 / (1.0 + np.exp(-(d + bias + noise_sd * x) / tau))


def calibrate_judge_noise(
    gap: Any, z: Any, xi: Any, target_rho2: float, *, bias: float = 0.0, tau: float = 0.25
) -> float:
    """The noise s of `noisy_oracle_judge` at which corr(z, ẑ)² = `target_rho2` on the given population (ρ² falls as
    s grows: s is bracketed by doubling, then found by `scipy.optimize.brentq`). Raises when even s = 0 stays below
    the target (the human's own label noise caps ρ²)."""
    from scipy.optimize import brentq

    d, zz = _vec(gap, "gap"), _vec(z, "z")
    if not 0.0 < target_rho2 < 1.0:
        raise ValueError(f"target_rho2 must be in (0, 1), got {target_rho2!r}")

    def rho2(s: float) -> float:
        return float(np.corrcoef(zz, noisy_oracle_judge(d, xi, s, bias=bias, tau=tau))[0, 1] ** 2)

    best = rho2(0.0)
    if best < target_rho2:
        raise ValueError(f"a planted judge reaches at most rho2 = {best:.3f} on this population, below {target_rho2}")
    hi = 1.0
    while rho2(hi) > target_rho2:
        hi *= 2.0
        if hi > 1e6:
            raise ValueError(f"no judge noise brings rho2 down to {target_rho2}")
    return float(brentq(lambda s: rho2(s) - target_rho2, 0.0, hi))


def bt_judge(score_a: Any, score_b: Any, temperature: float = 1.0) -> np.ndarray:
    """A Bradley-Terry synthetic preference ẑ = σ((s_A − s_B) / T) from per-response scores (reward, log-prob)."""
    a, b = _vec(score_a, "score_a"), _vec(score_b, "score_b")
    if a.size != b.size:
        raise ValueError(f"score_a and score_b must have the same length, got {a.size} and {b.size}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    return 1.0 / (1.0 + np.exp(-(a - b) / temperature))


class LogisticJudge:
    """A "finetuned" evaluator: ẑ = σ(w·f + b) on pair features f, fitted to human labels (soft targets, ties ½) of
    *other* model pairs by L2-regularised logistic regression (Newton steps). The paper fine-tunes its reward model
    in leave-one-LLM-out cross-validation; this is the same protocol on a linear head."""

    def __init__(self, l2: float = 1.0, n_iters: int = 50) -> None:
        if not l2 > 0 or n_iters < 1:
            raise ValueError(f"l2 must be > 0 and n_iters >= 1, got {l2!r}, {n_iters!r}")
        self.l2, self.n_iters = float(l2), int(n_iters)
        self.w: np.ndarray | None = None

    def fit(self, features: np.ndarray, z: np.ndarray) -> LogisticJudge:
        x = np.asarray(features, dtype=np.float64)
        y = _vec(z, "z")
        if x.ndim != 2 or x.shape[0] != y.size or y.size < 2:
            raise ValueError(f"features must be [n >= 2, d] matching z, got {x.shape} and {y.size}")
        self.mu, self.sd = x.mean(0), x.std(0) + 1e-9
        xx = np.hstack([(x - self.mu) / self.sd, np.ones((x.shape[0], 1))])  # (n, d + 1)
        w = np.zeros(xx.shape[1])
        reg = self.l2 * np.eye(xx.shape[1])
        reg[-1, -1] = 0.0
        for _ in range(self.n_iters):
            p = 1.0 / (1.0 + np.exp(-xx @ w))
            g = xx.T @ (p - y) + reg @ w
            h = (xx * (p * (1 - p))[:, None]).T @ xx + reg + 1e-9 * np.eye(xx.shape[1])
            step = np.linalg.solve(h, g)
            w = w - step
            if np.abs(step).max() < 1e-10:
                break
        self.w = w
        return self

    def predict(self, features: np.ndarray) -> np.ndarray:
        if self.w is None:
            raise ValueError("LogisticJudge.predict() needs fit() first")
        x = np.asarray(features, dtype=np.float64)
        xx = np.hstack([(x - self.mu) / self.sd, np.ones((x.shape[0], 1))])
        return 1.0 / (1.0 + np.exp(-xx @ self.w))
