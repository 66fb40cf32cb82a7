"""LensLLM (Zeng et al., ICML 2025): the NTK-based rectified scaling law, fitted on small fine-tuning subsets.

    L(D) = B / (F(Θ, t) + D^β) + E,    F(Θ, t) = ‖ expm(−η·Θ·t) · (f₀(X) − Y) ‖²

https://arxiv.org/abs/2505.03793 (official code: https://github.com/Susan571/LENSLLM, ``Code/fit_law.py``).

* Θ: the empirical NTK Gram matrix of the model's trainable parameters on n probe inputs X (``Θ = J Jᵀ``, J the
  (n, P) Jacobian of the scalar outputs f(x)); here normalised by its top eigenvalue so that η·t is well scaled.
* f₀(X) − Y: the residual of the pretrained model on the probes (lmlab: f(x) = Σ log p(answer tokens | x), Y = 0,
  the perfect log-likelihood); F is the NTK-linearised training residual after t steps of gradient flow with
  learning rate η. F takes the place of the Rectified Scaling Law's "pre-learned data size" D_l (Lin et al. 2024):
  a larger residual lowers the predicted loss; B absorbs the scale (the paper's sign, kept).
* exp(−ηΘt) is a **matrix** exponential (the official ``ntk_loss`` takes an element-wise ``np.exp``; see README).
* Fit [code]: mean over the subset sizes of ``(log L̂(D_i) − log L_i)²``, L-BFGS-B, bounds ≥ 0, initial
  (B, β, E) = (1, 1, 0.1), η = 0.01; ``mode="phase_fitting"`` fixes t to the observed early-stopping step,
  ``mode="prediction"`` frees t (initial 500). lmlab adds seeded data-driven restarts (the objective is
  non-convex); the best restart wins.
* In ``mode="prediction"`` F(t) is monotone in t over (F(∞), ‖r₀‖²], so the law is the rectified family
  B / (D_l + D^β) + E with the "pre-learned data size" D_l = F capped at ‖r₀‖²: the NTK enters only through that
  cap (and the floor F(∞), the part of r₀ outside Θ's range). ``fit_free_law`` is the same law with F a free
  constant ≥ 0 (no NTK): the ablation that isolates what the NTK term adds.

Every law fit (LensLLM in both modes, the free-F ablation, the rectified law) runs the same optimiser with the same
tolerances (`_minimise`: L-BFGS-B, `_LBFGSB`) and the same restart budget (the code's initial point plus the best
points of one seeded linear-profile grid), so that a comparison of two laws is not one of two optimisers.

Baselines (``Code/model_select.py``) behind the same `select` interface: ``zeroshot`` (the D = 0 loss),
``subtuning`` (the loss at the largest fitted D), ``modelsize`` (more parameters is better), ``rectified`` (Lin
et al.'s law log L = log((A − |E|) / (1 + exp(β log D + B)) + |E|); the code's two-stage surrogate fit gives the
first restart's start, every restart then fits all four constants on the log-MSE; A > |E| preferred) and ``ats``
(phase transition detection, then a log-log line on the post-transition points); ``lens_free`` (`fit_free_law`)
is lmlab's ablation.

Everything here is numpy / scipy except `empirical_ntk`, which takes any per-probe scalar function of torch
parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ETA = 0.01  # [code] fit_law.py
T_INIT = 500.0  # [code] initial t of the "prediction" mode
LENS_INIT = (1.0, 1.0, 0.1)  # [code] initial (B, beta, E)
ZERO_LOG_X = 1e-10  # [code] the D = 0 column enters the rectified law at log(1e-10)
# scipy's default tolerances stop at a log-MSE of ~1e-7 on exact data, far from the optimum: tighter, bounded.
# One setting for every law fit (`_minimise`).
_LBFGSB = {"ftol": 1e-15, "gtol": 1e-11, "maxiter": 2000}
# The restart grid of the laws with a free pre-learned size D_l (rectified: offset B = −log D_l; lens_free: F = D_l)
D_L_OFFSETS = np.linspace(-12.0, 4.0, 11)  # D_l from e^-4 ≈ 0.02 to e^12 ≈ 1.6e5 (the default run's ‖r₀‖² ≤ ~1e4)
FREE_F_INIT = 1.0  # the rectified code's initial offset B = 0, i.e. D_l = e^0 = 1
# B, t and F are fitted as logarithms (B = e^b, ...): the scales run from ~1 (β, E) to ~1e5 (B, F, t), and on the raw
# scale one tolerance stopped the free-F fit at a log-MSE of 4e-7 on exact data. e^±50 keeps exp finite in line
# searches and lies far outside any fitted value (t -> e^-50 is t = 0 to double precision: F = ‖r₀‖²).
_LOG_BOUND = (-50.0, 50.0)
_NONNEG = (0.0, None)  # β, E >= 0 [code]
MODES = ("prediction", "phase_fitting")
LAW_SELECTORS = ("lensllm", "lensllm_phase", "lens_free", "rectified", "ats")
SELECTORS = ("lensllm", "lensllm_phase", "lens_free", "rectified", "ats", "subtuning", "zeroshot", "modelsize")


# ----------------------------------------------------------------------------------------------------------------
# input checks


def _as_sizes_losses(sizes: Sequence[float], losses: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    d = np.asarray(sizes, dtype=float).ravel()
    y = np.asarray(losses, dtype=float).ravel()
    if d.size != y.size:
        raise ValueError(f"sizes and losses must have the same length, got {d.size} and {y.size}")
    if d.size < 2:
        raise ValueError(f"a scaling-law fit needs at least 2 (size, loss) points, got {d.size}")
    if not np.all(np.isfinite(d)) or np.any(d < 0):
        raise ValueError(f"sizes must be finite and >= 0, got {d.tolist()}")
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ValueError(f"losses must be finite and > 0 (they are fitted in log space), got {y.tolist()}")
    if np.unique(d).size != d.size:
        raise ValueError(f"sizes must be distinct, got {d.tolist()}")
    order = np.argsort(d)
    return d[order], y[order]


def _check_ntk(theta: Any, r0: Any) -> tuple[np.ndarray, np.ndarray]:
    th = np.asarray(theta, dtype=float)
    r = np.asarray(r0, dtype=float).ravel()
    if th.ndim != 2 or th.shape[0] != th.shape[1]:
        raise ValueError(f"theta must be a square (n, n) NTK Gram matrix, got shape {th.shape}")
    if th.shape[0] != r.size:
        raise ValueError(f"r0 must have one residual per probe ({th.shape[0]}), got {r.size}")
    if not (np.all(np.isfinite(th)) and np.all(np.isfinite(r))):
        raise ValueError("theta and r0 must be finite")
    if not np.allclose(th, th.T, rtol=1e-6, atol=1e-8 * max(1.0, float(np.abs(th).max(initial=0.0)))):
        raise ValueError("theta must be symmetric (an NTK Gram matrix J Jᵀ)")
    return th, r


# ----------------------------------------------------------------------------------------------------------------
# the law


def lens_law(D: Any, B: float, beta: float, E: float, F: float) -> np.ndarray:
    """L(D) = B / (F + D^β) + E (D = 0 gives B / F + E, the zero-shot anchor)."""
    d = np.asarray(D, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return B / (F + np.power(d, beta)) + E


def normalise_ntk(theta: Any) -> np.ndarray:
    """Θ divided by its top eigenvalue (Θ unchanged when it is zero), so η·t sets the decay directly."""
    th = np.asarray(theta, dtype=float)
    top = float(np.linalg.eigvalsh((th + th.T) / 2).max(initial=0.0)) if th.size else 0.0
    return th / top if top > 0 else th.copy()


def ntk_residual(theta: Any, r0: Any, eta: float, t: float) -> float:
    """F = ‖expm(−η·Θ·t) · r₀‖², by the eigendecomposition of the symmetric Θ (equal to ``scipy.linalg.expm``).

    Args:
        theta (`array`, (n, n)): symmetric PSD NTK Gram matrix; r0 (`array`, (n,)): f₀(X) − Y.
        eta (`float`): learning rate (>= 0); t (`float`): training time in steps (>= 0).
    """
    th, r = _check_ntk(theta, r0)
    if not (math.isfinite(eta) and eta >= 0):
        raise ValueError(f"eta must be a finite number >= 0, got {eta!r}")
    if not (math.isfinite(t) and t >= 0):
        raise ValueError(f"t must be a finite number >= 0, got {t!r}")
    return _residual_fast(*_eig(th), r, eta, t)


def _eig(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lam, vec = np.linalg.eigh((theta + theta.T) / 2)
    return np.clip(lam, 0.0, None), vec  # a Gram matrix is PSD; round-off negatives would grow, not decay


def _residual_fast(lam: np.ndarray, vec: np.ndarray, r: np.ndarray, eta: float, t: float) -> float:
    coef = vec.T @ r  # (n,) r0 in the eigenbasis
    return float(np.sum((np.exp(-eta * lam * t) * coef) ** 2))


def empirical_ntk(
    score_fn: Callable[[int], Any], params: Sequence[Any], n_probe: int, *, targets: Sequence[float] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Empirical NTK Gram matrix Θ_ij = ⟨∇_θ f(x_i), ∇_θ f(x_j)⟩ and the residual r₀ = f(X) − Y.

    Args:
        score_fn: ``score_fn(i) -> scalar tensor`` f(x_i) with a graph to `params` (e.g. the summed answer
            log-prob of probe i under a model with a fresh LoRA).
        params (`Sequence[torch.nn.Parameter]`): the trainable parameters (the LoRA factors, or every weight).
        n_probe (`int`): number of probes (>= 1).
        targets: Y (default 0 for every probe).

    Returns:
        `(theta, r0)`: (n, n) float64 and (n,) float64.
    """
    import torch

    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("params holds no trainable parameter; expected the model's trainable (LoRA) parameters")
    if not isinstance(n_probe, int) or n_probe < 1:
        raise ValueError(f"n_probe must be an int >= 1, got {n_probe!r}")
    y = np.zeros(n_probe) if targets is None else np.asarray(targets, dtype=float).ravel()
    if y.size != n_probe:
        raise ValueError(f"targets must have n_probe = {n_probe} entries, got {y.size}")
    rows, f0 = [], []
    for i in range(n_probe):
        out = score_fn(i)
        grads = torch.autograd.grad(out, params, allow_unused=True)
        rows.append(torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).double()
                               for g, p in zip(grads, params)]))  # fmt: skip
        f0.append(float(out.detach()))
    jac = torch.stack(rows)  # (n, P)
    theta = (jac @ jac.T).numpy()
    return (theta + theta.T) / 2, np.asarray(f0) - y


# ----------------------------------------------------------------------------------------------------------------
# fits


@dataclass
class LawFit:
    """A fitted law: ``predict(D)`` gives the loss at any size.

    Attributes:
        kind (`str`): ``lensllm`` (either mode), ``lens_free``, ``rectified``, ``ats``.
        params (`dict[str, float]`): the fitted constants (LensLLM: B, beta, E, t, F; lens_free: B, beta, E, F).
        objective (`float`): the fit's mean squared log error on the fitted points.
        restarts (`list[float]`): the objective of every restart (best first is not implied).
    """

    kind: str
    params: dict[str, float]
    objective: float
    restarts: list[float] = field(default_factory=list)
    _predict: Callable[[np.ndarray], np.ndarray] | None = None

    def predict(self, D: Any) -> np.ndarray:
        d = np.asarray(D, dtype=float)
        if np.any(d < 0):
            raise ValueError(f"D must be >= 0, got {d.tolist()}")
        assert self._predict is not None
        return self._predict(d)


def _one_blas_thread() -> Any:
    """OpenBLAS threads make scipy's L-BFGS-B ~50x slower on a tiny problem (measured: 72 ms vs 1.4 ms)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl ships with scikit-learn
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(1)


def _log_mse(pred: np.ndarray, log_y: np.ndarray) -> float:
    with np.errstate(all="ignore"):
        val = float(np.mean((np.log(np.maximum(pred, 1e-300)) - log_y) ** 2))
    return val if math.isfinite(val) else 1e12


_Bounds = Sequence[tuple[float | None, float | None]] | None  # L-BFGS-B bounds per variable, or none


def _minimise(objective: Callable[[np.ndarray], float], x0: np.ndarray, bounds: _Bounds) -> tuple[np.ndarray, float]:
    """The one optimiser of every law fit and fit stage: L-BFGS-B with `_LBFGSB` (bounds or none). A law compared
    with another is then never also a tighter optimiser compared with a looser one."""
    from scipy.optimize import minimize

    with _one_blas_thread():
        res = minimize(objective, np.asarray(x0, dtype=float), method="L-BFGS-B", bounds=bounds, options=_LBFGSB)
    val = float(res.fun) if math.isfinite(res.fun) else 1e12
    return np.asarray(res.x, dtype=float), val


def _best_of(
    objective: Callable[[np.ndarray], float],
    inits: Sequence[np.ndarray],
    bounds: _Bounds,
    admissible: Callable[[np.ndarray], bool] | None = None,
) -> tuple[np.ndarray, float, list[float]]:
    """`_minimise` from every initial point; the lowest objective among the admissible results wins (any result
    when none is admissible). Returns (x, objective, every restart's objective)."""
    best, best_any, objs = None, None, []
    for x0 in inits:
        x, val = _minimise(objective, x0, bounds)
        objs.append(val)
        if best_any is None or val < best_any[1]:
            best_any = (x, val)
        if (admissible is None or admissible(x)) and (best is None or val < best[1]):
            best = (x, val)
    x, val = best or best_any  # type: ignore[misc]
    return x, val, objs


def _linear_profile(
    d: np.ndarray, y: np.ndarray, basis: Callable[[float, int], np.ndarray], n_other: int, seed: int
) -> list[tuple[float, float, int, float, float]]:
    """Initial points for the restarts: every law here is linear in (scale, E) for a fixed exponent β (and t, F or
    the offset B of the rectified law), so a seeded grid over β x `n_other` solves non-negative least squares for
    (scale, E) and ranks the grid points by the log-space objective. Returns (objective, β, j, scale, E), best
    first. The β grid depends on `seed` only, so fits with one seed start from the same exponents."""
    from scipy.optimize import nnls

    rng = np.random.default_rng(seed)
    betas = np.geomspace(0.05, 4.0, 24) * np.exp(rng.uniform(-0.05, 0.05, 24))
    log_y = np.log(y)
    out = []
    for j in range(n_other):
        for beta in betas:
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                g = basis(float(beta), j)
            if not np.all(np.isfinite(g)):
                continue
            (scale, E), _ = nnls(np.column_stack([g, np.ones_like(g)]), y)
            out.append((_log_mse(scale * g + E, log_y), float(beta), j, float(scale), float(E)))
    out.sort(key=lambda row: row[0])
    return out


def _log0(v: float) -> float:
    """The logarithm of a start value; a zero start (an NNLS scale or t = 0 at a bound) maps to the log bound."""
    return math.log(v) if v > 0 else _LOG_BOUND[0]


def _check_restarts(n_restarts: Any) -> None:
    if not isinstance(n_restarts, int) or n_restarts < 1:
        raise ValueError(f"n_restarts must be an int >= 1, got {n_restarts!r}")


def fit_lens_law(
    sizes: Sequence[float],
    losses: Sequence[float],
    theta: Any,
    r0: Any,
    *,
    mode: str = "prediction",
    t_obs: float | None = None,
    eta: float = ETA,
    n_restarts: int = 4,
    normalise: bool = True,
    seed: int = 0,
) -> LawFit:
    """Fit L(D) = B / (F(Θ, t) + D^β) + E in log-loss space with L-BFGS-B, bounds >= 0 [code] (β, E >= 0; B and t
    through their logarithms, so B, t > 0; the code's initial point is the same).

    Args:
        sizes, losses: the fine-tuning subset sizes (0 = zero-shot) and the measured test losses (> 0).
        theta (`array`, (n, n)), r0 (`array`, (n,)): the empirical NTK and the probes' residual f₀(X) − Y.
        mode (`str`): ``"prediction"`` (t free, initial 500) or ``"phase_fitting"`` (t = `t_obs`, fixed).
        t_obs (`float`): the observed early-stopping step (required with ``phase_fitting``).
        eta (`float`, defaults to 0.01): η [code].
        n_restarts (`int`, defaults to 4): the code's initial point plus the `n_restarts - 1` best points of a
            seeded (β, t) grid with (B, E) solved by non-negative least squares (`_linear_profile`).
        normalise (`bool`): divide Θ by its top eigenvalue first.
        seed (`int`): seeds the restarts.
    """
    d, y = _as_sizes_losses(sizes, losses)
    th, r = _check_ntk(theta, r0)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "phase_fitting" and (t_obs is None or not math.isfinite(t_obs) or t_obs < 0):
        raise ValueError(f"mode='phase_fitting' needs t_obs, the observed early-stopping step (>= 0), got {t_obs!r}")
    _check_restarts(n_restarts)
    if not (math.isfinite(eta) and eta > 0):
        raise ValueError(f"eta must be a finite number > 0, got {eta!r}")
    th = normalise_ntk(th) if normalise else th
    lam, vec = _eig(th)
    log_y = np.log(y)
    free_t = mode == "prediction"

    def unpack(q: np.ndarray) -> tuple[float, float, float, float]:  # q = (log B, β, E[, log t])
        t = math.exp(float(q[3])) if free_t else float(t_obs)  # type: ignore[arg-type]
        return math.exp(float(q[0])), float(q[1]), float(q[2]), t

    def objective(p: np.ndarray) -> float:
        B, beta, E, t = unpack(p)
        F = _residual_fast(lam, vec, r, eta, t)
        return _log_mse(lens_law(d, B, beta, E, F), log_y)

    t_grid = np.geomspace(1.0, 1e5, 11) if free_t else np.array([float(t_obs)])  # type: ignore[arg-type]
    F_grid = [_residual_fast(lam, vec, r, eta, float(t)) for t in t_grid]
    grid = _linear_profile(d, y, lambda beta, j: 1.0 / (F_grid[j] + np.power(d, beta)), len(t_grid), seed)
    B0, beta0, E0 = LENS_INIT
    inits = [np.array([_log0(B0), beta0, E0, _log0(T_INIT)] if free_t else [_log0(B0), beta0, E0], dtype=float)]
    for _, beta0, j, B0, E0 in grid[: n_restarts - 1]:
        start = [_log0(B0), beta0, E0, _log0(t_grid[j])] if free_t else [_log0(B0), beta0, E0]
        inits.append(np.array(start, dtype=float))
    x, val, objs = _best_of(objective, inits, [_LOG_BOUND, _NONNEG, _NONNEG] + ([_LOG_BOUND] if free_t else []))
    B, beta, E, t = unpack(x)
    F = _residual_fast(lam, vec, r, eta, t)
    return LawFit("lensllm", {"B": B, "beta": beta, "E": E, "t": t, "F": F}, val, objs,
                  lambda D: lens_law(D, B, beta, E, F))  # fmt: skip


def fit_free_law(sizes: Sequence[float], losses: Sequence[float], *, n_restarts: int = 4, seed: int = 0) -> LawFit:
    """The free-term ablation: L(D) = B / (F + D^β) + E with F > 0 a fitted constant and no NTK.

    It is LensLLM's law, objective, bounds, parameterisation (log B, β, E, log F), optimiser, tolerances and restart
    budget with the NTK taken out: the prediction mode is this law with F confined to the NTK curve
    F(t) ∈ (F(∞), ‖r₀‖²]; the rectified law is the same family written as (A − E) / (1 + e^B D^β) + E, i.e.
    F = D_l = e^−B. LensLLM beating it is the paper's claim that the NTK term helps. Restarts: the code's initial
    (B, β, E) = (1, 1, 0.1) with F = 1 (the rectified code's initial offset B = 0), then the best points of the
    seeded (β, F = e^−offset) grid the rectified law uses.
    """
    d, y = _as_sizes_losses(sizes, losses)
    _check_restarts(n_restarts)
    log_y = np.log(y)
    F_grid = np.exp(-D_L_OFFSETS)

    def unpack(q: np.ndarray) -> tuple[float, float, float, float]:  # q = (log B, β, E, log F)
        return math.exp(float(q[0])), float(q[1]), float(q[2]), math.exp(float(q[3]))

    def objective(q: np.ndarray) -> float:
        return _log_mse(lens_law(d, *unpack(q)), log_y)

    grid = _linear_profile(d, y, lambda beta, j: 1.0 / (F_grid[j] + np.power(d, beta)), len(F_grid), seed)
    B0, beta0, E0 = LENS_INIT
    inits = [np.array([_log0(B0), beta0, E0, _log0(FREE_F_INIT)], dtype=float)]
    for _, beta0, j, B0, E0 in grid[: n_restarts - 1]:
        inits.append(np.array([_log0(B0), beta0, E0, _log0(F_grid[j])], dtype=float))
    x, val, objs = _best_of(objective, inits, [_LOG_BOUND, _NONNEG, _NONNEG, _LOG_BOUND])
    B, beta, E, F = unpack(x)
    return LawFit("lens_free", {"B": B, "beta": beta, "E": E, "F": F}, val, objs,
                  lambda D: lens_law(D, B, beta, E, F))  # fmt: skip


def rectified_law(D: Any, A: float, B: float, beta: float, E: float) -> np.ndarray:
    """Lin et al. 2024 as the LensLLM code writes it: (A − |E|) / (1 + exp(β·log D + B)) + |E| (D = 0 at 1e−10).

    With D_l = e^−B this is (A − |E|)·D_l / (D_l + D^β) + |E|: the LensLLM law with F = D_l (up to the D = 0 point,
    where D^β = 1e−10^β instead of 0)."""
    d = np.maximum(np.asarray(D, dtype=float), ZERO_LOG_X)
    with np.errstate(all="ignore"):
        return (A - abs(E)) / (1.0 + np.exp(beta * np.log(d) + B)) + abs(E)


def fit_rectified_law(sizes: Sequence[float], losses: Sequence[float], *, n_restarts: int = 4,
                      seed: int = 0) -> LawFit:  # fmt: skip
    """The Rectified Scaling Law fit: every restart minimises the log-MSE over all four (A, B, β, E) with the
    optimiser, tolerances and restart budget of `fit_lens_law` (`_best_of`); the best fit with A > |E| wins.

    Restart 0 starts where ``fit_law.fit_rec_llm`` [code] ends from its initial point: a surrogate stage over
    (A, B, β, E) and slack variables Z_i (Z_i² = exp(β·log D_i + B)), then a refit of (A, E) alone (the code stops
    there, with scipy's default BFGS; its three restarts share one initial point). Restarts after the first start
    from the best points of the seeded (β, B) grid (`D_L_OFFSETS`, (A − E, E) by non-negative least squares) that
    `fit_free_law` also uses.
    """
    d, y = _as_sizes_losses(sizes, losses)
    _check_restarts(n_restarts)
    log_x = np.log(np.maximum(d, ZERO_LOG_X))
    log_y = np.log(y)
    u, lo = float(log_y.max()), float(log_y.min())
    n = d.size

    def first_loss(p: np.ndarray) -> float:  # [code] the surrogate: y fitted through Z, Z tied to β·log D + B
        A, B, beta, E = p[:4]
        z = p[4:] ** 2
        with np.errstate(all="ignore"):
            y_loss = np.mean((np.log(A + abs(E) * z) - np.log(1 + z) - log_y) ** 2)
            x_loss = np.mean((np.log(z) - beta * log_x - B) ** 2)
        val = float(y_loss + x_loss)
        return val if math.isfinite(val) else 1e12

    def objective(p: np.ndarray) -> float:
        return _log_mse(rectified_law(d, *p), log_y)

    p, _ = _minimise(first_loss, np.concatenate([[math.exp(u), 0.0, 1.0, math.exp((u + lo) / 2)], np.ones(n)]), None)
    A, B, beta, E = (float(v) for v in p[:4])
    (A, E), _ = _minimise(lambda ae: _log_mse(rectified_law(d, ae[0], B, beta, ae[1]), log_y), np.array([A, E]), None)
    inits = [np.array([A, B, beta, E], dtype=float)]
    grid = _linear_profile(d, y, lambda beta, j: 1.0 / (1.0 + np.exp(beta * log_x + D_L_OFFSETS[j])),
                           len(D_L_OFFSETS), seed)  # fmt: skip
    inits += [np.array([scale + E0, D_L_OFFSETS[j], beta0, E0]) for _, beta0, j, scale, E0 in grid[: n_restarts - 1]]
    inits[0][2] = max(inits[0][2], 0.0)  # the code's β is free; a negative one starts on the bound
    bounds = [(None, None), (None, None), _NONNEG, (None, None)]  # β >= 0: the loss falls with D, as in LensLLM's law
    x, val, objs = _best_of(objective, inits, bounds, admissible=lambda q: q[0] > abs(q[3]))
    params = dict(zip(("A", "B", "beta", "E"), (float(v) for v in x)))
    return LawFit("rectified", params, val, objs, lambda D: rectified_law(D, **params))


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    slope, intercept = np.polyfit(x, y, 1)
    return float(slope), float(intercept)


def phase_transition(sizes: Sequence[float], losses: Sequence[float], *, k: int = 3, delta: float = 5.0) -> int:
    """Index of the last pre-power-phase point of ``model_select._estimate_phase_transition`` [code] (−1: none).

    Fit a log-log line on the last p points (p = k, k+1, ...); stop at the first p whose next earlier point has a
    standardised residual above `delta`. Sizes must be > 0 and sorted.
    """
    lx, ly = np.log(np.asarray(sizes, dtype=float)), np.log(np.asarray(losses, dtype=float))
    n = lx.size
    if n <= k:
        return -1
    p = k
    for p in range(k, n):
        slope, icpt = _line(lx[-p:], ly[-p:])
        sd = float(np.std(ly[-p:] - (slope * lx[-p:] + icpt)))
        r = abs(ly[-p - 1] - (slope * lx[-p - 1] + icpt))
        if (r / sd if sd > 0 else math.inf) > delta:
            break
    return n - p - 1


def fit_ats(sizes: Sequence[float], losses: Sequence[float], *, k: int = 3, delta: float = 5.0) -> LawFit:
    """The code's ``select``: drop the pre-power phase (`phase_transition`), fit log L = a·log D + b on the rest."""
    d, y = _as_sizes_losses(sizes, losses)
    keep = d > 0
    d, y = d[keep], y[keep]
    if d.size < 2:
        raise ValueError("the AtS selector needs at least 2 subset sizes > 0")
    tp = phase_transition(d, y, k=k, delta=delta)
    d_post, y_post = d[tp + 1 :], y[tp + 1 :]
    if d_post.size < 2:
        d_post, y_post = d[-2:], y[-2:]
    slope, icpt = _line(np.log(d_post), np.log(y_post))

    def predict(D: np.ndarray) -> np.ndarray:
        return np.exp(slope * np.log(np.maximum(D, ZERO_LOG_X)) + icpt)

    obj = float(np.mean((slope * np.log(d_post) + icpt - np.log(y_post)) ** 2))
    return LawFit("ats", {"slope": slope, "intercept": icpt, "transition": float(tp)}, obj, [obj], predict)


# ----------------------------------------------------------------------------------------------------------------
# selection


@dataclass
class Selection:
    """A ranking of candidates by one selector.

    Attributes:
        method (`str`): the selector id.
        candidates (`list[str]`): the candidates in input order.
        scores (`np.ndarray`): per candidate, lower is better: the predicted loss at the target size for the law
            selectors, zeroshot and subtuning; −log(parameters) for modelsize.
        is_loss (`bool`): whether `scores` predict the target loss (so a prediction error is defined).
        ranking (`list[str]`): candidates best first; best (`str`): the selected one.
        fits (`list[LawFit | None]`): the fitted law per candidate (law selectors).
    """

    method: str
    candidates: list[str]
    scores: np.ndarray
    is_loss: bool
    fits: list[LawFit | None]

    @property
    def ranking(self) -> list[str]:
        return [self.candidates[i] for i in np.argsort(self.scores, kind="stable")]

    @property
    def best(self) -> str:
        return self.ranking[0]


def select(
    candidates: Sequence[str],
    sizes: Sequence[float],
    subset_losses: Any,
    target_size: float,
    method: str = "lensllm",
    *,
    ntk: Sequence[tuple[Any, Any]] | None = None,
    t_obs: Sequence[float] | None = None,
    model_sizes: Sequence[float] | None = None,
    n_restarts: int = 4,
    eta: float = ETA,
    ats_k: int = 3,
    ats_delta: float = 5.0,
    seed: int = 0,
) -> Selection:
    """Rank `candidates` by `method` from their losses on the small subsets (one signature for every selector).

    Args:
        candidates: K candidate names; sizes: the S subset sizes (0 = zero-shot); subset_losses (`array`, (K, S)):
            the test loss of each candidate after fine-tuning on each subset.
        target_size (`float`): D*, the full fine-tuning budget whose loss is predicted.
        method (`str`): one of `SELECTORS`.
        ntk: per candidate (Θ, r₀) (``lensllm``, ``lensllm_phase``); t_obs: per candidate early-stopping step
            (``lensllm_phase``); model_sizes: per candidate parameter count (``modelsize``).
        n_restarts: restarts of the law fits (one budget, optimiser and tolerance for LensLLM, ``lens_free`` and
            the rectified law).
    """
    names = list(candidates)
    losses = np.asarray(subset_losses, dtype=float)
    d = np.asarray(sizes, dtype=float)
    if not names:
        raise ValueError("candidates is empty; expected at least one candidate")
    if losses.shape != (len(names), d.size):
        raise ValueError(f"subset_losses must be (candidates, sizes) = ({len(names)}, {d.size}), got {losses.shape}")
    if method not in SELECTORS:
        raise ValueError(f"method must be one of {SELECTORS}, got {method!r}")
    if not (math.isfinite(target_size) and target_size > 0):
        raise ValueError(f"target_size must be a finite number > 0, got {target_size!r}")
    fits: list[LawFit | None] = [None] * len(names)
    if method == "zeroshot":
        if 0 not in d:
            raise ValueError("zeroshot needs the D = 0 (zero-shot) column in sizes")
        return Selection(method, names, losses[:, int(np.flatnonzero(d == 0)[0])].copy(), True, fits)
    if method == "subtuning":
        return Selection(method, names, losses[:, int(np.argmax(d))].copy(), True, fits)
    if method == "modelsize":
        if model_sizes is None or len(model_sizes) != len(names):
            raise ValueError(f"modelsize needs model_sizes, one parameter count per candidate ({len(names)})")
        ms = np.asarray(model_sizes, dtype=float)
        if np.any(ms <= 0):
            raise ValueError(f"model_sizes must be > 0, got {ms.tolist()}")
        return Selection(method, names, -np.log(ms), False, fits)
    if method in ("lensllm", "lensllm_phase") and (ntk is None or len(ntk) != len(names)):
        raise ValueError(f"{method} needs ntk, one (theta, r0) pair per candidate ({len(names)})")
    if method == "lensllm_phase" and (t_obs is None or len(t_obs) != len(names)):
        raise ValueError(f"lensllm_phase needs t_obs, one early-stopping step per candidate ({len(names)})")
    preds = np.empty(len(names))
    for i in range(len(names)):
        if method == "rectified":
            fit = fit_rectified_law(d, losses[i], n_restarts=n_restarts, seed=seed + i)
        elif method == "lens_free":
            fit = fit_free_law(d, losses[i], n_restarts=n_restarts, seed=seed + i)
        elif method == "ats":
            if int((d > 0).sum()) < 2:  # no line through one point: the subtuning prediction
                preds[i] = float(losses[i, int(np.argmax(d))])
                continue
            fit = fit_ats(d, losses[i], k=ats_k, delta=ats_delta)
        else:
            theta, r0 = ntk[i]  # type: ignore[index]
            fit = fit_lens_law(d, losses[i], theta, r0, eta=eta, n_restarts=n_restarts, seed=seed + i,
                               mode="prediction" if method == "lensllm" else "phase_fitting",
                               t_obs=None if method == "lensllm" else float(t_obs[i]))  # type: ignore[index]  # fmt: skip
        fits[i] = fit
        p = float(fit.predict(np.array([target_size]))[0])
        preds[i] = p if math.isfinite(p) else float(losses[i, int(np.argmax(d))])  # a diverged fit: subtuning's
    return Selection(method, names, preds, True, fits)


def _corr(x: np.ndarray, y: np.ndarray, rank: bool = False) -> float:
    if rank:
        x, y = (np.argsort(np.argsort(v, kind="stable"), kind="stable").astype(float) for v in (x, y))
    if x.size < 2 or np.std(x) == 0 or np.std(y) == 0:
        return 0.0  # a constant predictor carries no ranking information
    return float(np.corrcoef(x, y)[0, 1])


def selection_metrics(scores: Any, actual: Any, *, is_loss: bool = True) -> dict[str, float]:
    """How a selector's scores (lower = better) match the candidates' actual target losses.

    Returns ``pearson`` / ``spearman`` (of scores vs actual losses; 1 = perfect ordering), ``relacc`` (best actual
    loss / the selected candidate's actual loss, 1.0 when the best is picked), ``regret`` (selected − best actual
    loss), ``top1`` (1.0 when the best is picked) and, when `is_loss`, ``rmse`` and ``log_rmse`` of the predicted
    vs actual losses.
    """
    s = np.asarray(scores, dtype=float).ravel()
    a = np.asarray(actual, dtype=float).ravel()
    if s.size != a.size or s.size == 0:
        raise ValueError(f"scores and actual must be non-empty and of one length, got {s.size} and {a.size}")
    if np.any(a <= 0) or not np.all(np.isfinite(a)):
        raise ValueError(f"actual losses must be finite and > 0, got {a.tolist()}")
    pick = int(np.argmin(s))
    best = float(a.min())
    out = {"pearson": _corr(s, a), "spearman": _corr(s, a, rank=True), "relacc": best / float(a[pick]),
           "regret": float(a[pick]) - best, "top1": float(a[pick] == best)}  # fmt: skip
    if is_loss:
        out["rmse"] = float(np.sqrt(np.mean((s - a) ** 2)))
        with np.errstate(all="ignore"):
            out["log_rmse"] = float(np.sqrt(np.mean((np.log(np.maximum(s, 1e-12)) - np.log(a)) ** 2)))
    return out


def compute_ratio(subset_cost: Mapping[str, float], full_cost: Mapping[str, float]) -> float:
    """Σ cost of the subset fine-tunes / Σ cost of the full (target-size) fine-tunes, over the candidates."""
    den = float(sum(full_cost.values()))
    if den <= 0:
        raise ValueError("the full fine-tuning cost must be > 0")
    return float(sum(subset_cost.values())) / den


__all__ = [
    "ETA",
    "LAW_SELECTORS",
    "MODES",
    "SELECTORS",
    "LawFit",
    "Selection",
    "compute_ratio",
    "empirical_ntk",
    "fit_ats",
    "fit_free_law",
    "fit_lens_law",
    "fit_rectified_law",
    "lens_law",
    "normalise_ntk",
    "ntk_residual",
    "phase_transition",
    "rectified_law",
    "select",
    "selection_metrics",
]
