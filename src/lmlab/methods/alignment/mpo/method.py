"""MPO: log-linear mixing of single-objective policies, weights by batch stochastic mirror descent.

Wang, Gui, Hu, Lin and Zhang, "MPO: An Efficient Post-Processing Framework for Mixing Diverse Preference Alignment"
(ICML 2025, arXiv 2502.18699). No official code is public; the maths below is the KL-regularised reconstruction of
the spec (`shared/methods/alignment.md`, section `mpo`), estimator details [verify].

Setting. Prompts x, responses y, a reference pi_ref and K rewards r_k. The single-objective KL-optimal policies are
``pi_k(y|x) ∝ pi_ref(y|x) exp(r_k(x, y) / beta)``. For weights lambda on the simplex,

    pi_lambda = argmax_pi E_pi[sum_k lambda_k r_k] - beta KL(pi || pi_ref) ∝ pi_ref exp(lambda·r / beta)
              = prod_k pi_k^{lambda_k} (renormalised)                        (the pi_ref factors cancel: sum = 1)

MaxMin-RLHF, ``max_pi min_k E_pi[r_k] - beta KL``, is by minimax ``min_{lambda in simplex} F(lambda)`` with the
convex dual

    F(lambda) = beta E_x log E_{y ~ pi_ref(.|x)} exp(lambda·r(x, y) / beta),   grad_k F = E_x E_{pi_lambda}[r_k].

Batch stochastic mirror descent (exponentiated gradient on the simplex): on a batch of prompts,
``lambda_k <- lambda_k exp(-eta g_k) / Z`` with ``g_k`` a batch estimate of ``E_{pi_lambda}[r_k]`` (exact over a
finite candidate set, from samples of pi_lambda, or from pi_ref samples with self-normalised importance weights);
the output is the averaged iterate. Objectives that score low under the current mixture gain weight.

Everything here works on finite candidate sets: per prompt a row of candidate responses, log-probs of shape
``(n_prompts, n_candidates)`` (``-inf`` marks a missing candidate) and rewards ``(n_prompts, n_candidates, K)``.
On such a set the regularised MaxMin optimum is computed exactly by Kelley's cutting-plane method (each cut an LP
solved by `scipy.optimize.linprog`, giving certified lower and upper bounds), and the unregularised MaxMin value
(beta -> 0) is one LP. The torch half: DPO training of a single-objective policy on the frozen trunk's cached
candidates (`lmlab.core.training.partial`, `lmlab.core.training.preference.dpo_loss`), parameter averaging of trained
top-k blocks
(the reward-soups baseline), and token-level log-linear mixture decoding, ``logits_t = sum_k lambda_k log
pi_k(.|x, y_<t)``, the standard approximation of the sequence-level product (which is not autoregressive).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lmlab.core.training.partial import policy_model  # noqa: F401 (part of mpo's API: decoding trained policies)

# ---------------------------------------------------------------------------------------------------- checking


def _logps(x: Any, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < 1:
        raise ValueError(f"{name} must have shape (n_prompts >= 1, n_candidates >= 1), got {a.shape}")
    if np.isnan(a).any() or np.isposinf(a).any():
        raise ValueError(f"{name} must hold finite log-probs or -inf for a missing candidate (no NaN / +inf)")
    if not np.isfinite(a).any(axis=1).all():
        bad = int(np.flatnonzero(~np.isfinite(a).any(axis=1))[0])
        raise ValueError(f"{name}: prompt {bad} has no candidate with a finite log-prob")
    return a


def _rewards(r: Any, n: int | None = None, c: int | None = None) -> np.ndarray:
    a = np.asarray(r, dtype=np.float64)
    if a.ndim != 3 or 0 in a.shape:
        raise ValueError(f"rewards must have shape (n_prompts, n_candidates, K) with K >= 1, got {a.shape}")
    if n is not None and a.shape[:2] != (n, c):
        raise ValueError(f"rewards have shape {a.shape}, expected ({n}, {c}, K) to match the log-probs")
    return a


def _clean(rewards: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Rewards with missing candidates zeroed (they carry no probability); finite where present."""
    if not np.isfinite(rewards[mask]).all():
        raise ValueError("rewards must be finite on every present candidate")
    return np.where(mask[..., None], rewards, 0.0)


def check_weights(weights: Any, k: int | None = None, *, name: str = "weights") -> np.ndarray:
    """`weights` as a float64 vector on the simplex (>= 0, sum 1 within 1e-6); a one-line error otherwise."""
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if k is not None and w.shape[0] != k:
        raise ValueError(f"{name} must have {k} entries (one per policy / objective), got {w.shape[0]}")
    if w.size == 0 or not np.isfinite(w).all() or (w < 0).any():
        raise ValueError(f"{name} must be finite and >= 0, got {w.tolist()}")
    if abs(w.sum() - 1.0) > 1e-6:
        raise ValueError(
            f"{name} must sum to 1 (log-linear mixing cancels pi_ref only then; otherwise a pi_ref^(1 - sum) "
            f"factor is missing), got sum {w.sum():.6g}"
        )
    return w / w.sum()


def _lse(a: np.ndarray, axis: int = -1, keepdims: bool = False) -> np.ndarray:
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    out = np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


def normalize_logps(logps: Any) -> np.ndarray:
    """Log-probs renormalised over each prompt's candidates, (n, C); ``-inf`` stays ``-inf``."""
    a = _logps(logps, "logps")
    return a - _lse(a, keepdims=True)


# ------------------------------------------------------------------------------------------ rewards and policies


def zscore_fit(rewards: Any, mask: Any | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-objective mean and std over the present candidates of a pool, each (K,); std floored at 1e-8.

    The spec's pitfall: without z-normalisation the largest-scale objective takes over the mirror descent.
    """
    r = _rewards(rewards)
    m = np.ones(r.shape[:2], dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    vals = r[m]  # (n_present, K)
    if vals.shape[0] == 0:
        raise ValueError("zscore_fit needs at least one present candidate")
    return vals.mean(0), np.maximum(vals.std(0), 1e-8)


def closed_form_policy(ref_logps: Any, rewards: Any, weights: Any, beta: float) -> np.ndarray:
    """``log pi_lambda ∝ log pi_ref + lambda·r / beta`` over the candidates, (n, C), normalised per prompt."""
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    ref = _logps(ref_logps, "ref_logps")
    r = _clean(_rewards(rewards, *ref.shape), np.isfinite(ref))
    w = check_weights(weights, r.shape[2])
    return normalize_logps(ref + (r @ w) / beta)


def closed_form_policies(ref_logps: Any, rewards: Any, beta: float) -> np.ndarray:
    """The exact single-objective policies ``pi_k ∝ pi_ref exp(r_k / beta)``, log-probs (n, C, K)."""
    r = _rewards(rewards)
    return np.stack([closed_form_policy(ref_logps, r, np.eye(r.shape[2])[k], beta) for k in range(r.shape[2])], -1)


def log_linear_mix(policy_logps: Any, weights: Any) -> np.ndarray:
    """MPO's mixture ``pi_lambda ∝ prod_k pi_k^{lambda_k}`` on a candidate set: log-probs (n, C).

    Args:
        policy_logps (`array`, (n, C, K)): each policy's log-probs of the candidates (any per-prompt constant:
            it cancels in the renormalisation); ``-inf`` where a candidate is missing (missing for all policies).
        weights (`array`, (K,)): on the simplex (sum 1: the pi_ref cancellation needs it).
    """
    p = np.asarray(policy_logps, dtype=np.float64)
    if p.ndim != 3:
        raise ValueError(f"policy_logps must have shape (n_prompts, n_candidates, K), got {p.shape}")
    w = check_weights(weights, p.shape[2])
    present = np.isfinite(p).all(-1)
    mixed = np.where(present, np.einsum("nck,k->nc", np.where(np.isfinite(p), p, 0.0), w), -np.inf)
    return normalize_logps(mixed)


def arithmetic_mix(policy_logps: Any, weights: Any) -> np.ndarray:
    """The probability mixture ``sum_k lambda_k pi_k`` (the pitfall MPO avoids), log-probs (n, C)."""
    p = np.asarray(policy_logps, dtype=np.float64)
    if p.ndim != 3:
        raise ValueError(f"policy_logps must have shape (n_prompts, n_candidates, K), got {p.shape}")
    w = check_weights(weights, p.shape[2])
    norm = np.stack([normalize_logps(p[..., k]) for k in range(p.shape[2])], -1)
    with np.errstate(divide="ignore"):
        return normalize_logps(_lse(norm + np.log(w), axis=-1))


def expected_rewards(logp: Any, rewards: Any) -> np.ndarray:
    """``E_{pi(.|x)}[r_k(x, .)]`` per prompt and objective, (n, K), for a policy given by candidate log-probs."""
    lp = normalize_logps(logp)
    r = _clean(_rewards(rewards, *lp.shape), np.isfinite(lp))
    return np.einsum("nc,nck->nk", np.exp(lp), r)


def kl_to_reference(logp: Any, ref_logps: Any) -> np.ndarray:
    """``KL(pi(.|x) || pi_ref(.|x))`` per prompt over the candidate set, (n,)."""
    lp, ref = normalize_logps(logp), normalize_logps(ref_logps)
    if lp.shape != ref.shape:
        raise ValueError(f"logp {lp.shape} and ref_logps {ref.shape} must have one shape")
    p = np.exp(lp)
    diff = np.where(p > 0, lp - np.where(np.isfinite(ref), ref, -1e300), 0.0)
    return (p * diff).sum(-1)


def worst_objective(values: Any) -> tuple[float, int]:
    """``W = min_k mean_x values[x, k]`` and the worst objective's index, for per-prompt values (n, K)."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2:
        raise ValueError(f"values must be (n_prompts, K), got shape {v.shape}")
    means = v.mean(0)
    k = int(np.argmin(means))
    return float(means[k]), k


def dual_value(weights: Any, ref_logps: Any, rewards: Any, beta: float) -> tuple[float, np.ndarray]:
    """``F(lambda) = beta mean_x log sum_y pi_ref(y|x) exp(lambda·r / beta)`` and its gradient (K,).

    ``grad_k F = mean_x E_{pi_lambda}[r_k]``. F is convex; its minimum over the simplex is the value of the
    KL-regularised MaxMin problem ``max_pi min_k E_pi[r_k] - beta KL(pi || pi_ref)`` (strong duality).
    """
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    ref = normalize_logps(ref_logps)
    r = _clean(_rewards(rewards, *ref.shape), np.isfinite(ref))
    w = check_weights(weights, r.shape[2])
    s = ref + (r @ w) / beta  # (n, C)
    value = float(beta * _lse(s).mean())
    post = np.exp(s - _lse(s, keepdims=True))  # pi_lambda
    return value, np.einsum("nc,nck->k", post, r) / r.shape[0]


def regularised_maxmin_value(logp: Any, ref_logps: Any, rewards: Any, beta: float) -> float:
    """Primal value ``min_k mean_x E_pi[r_k] - beta mean_x KL(pi || pi_ref)`` of a policy; <= min F (weak duality)."""
    w, _ = worst_objective(expected_rewards(logp, rewards))
    return w - beta * float(kl_to_reference(logp, ref_logps).mean())


# ------------------------------------------------------------------------------------------------ mirror descent


@dataclass
class MirrorDescentResult:
    """Output of `mpo_weights`.

    Attributes:
        weights (`np.ndarray`, (K,)): the averaged iterate lambda-bar (MPO's output).
        last (`np.ndarray`, (K,)): the last iterate.
        trajectory (`np.ndarray`, (steps + 1, K)): lambda_0 .. lambda_T.
        gradients (`np.ndarray`, (steps, K)): the batch estimates g_t used at each step.
        batches (`list[np.ndarray]`): the prompt indices of each step.
    """

    weights: np.ndarray
    last: np.ndarray
    trajectory: np.ndarray
    gradients: np.ndarray
    batches: list[np.ndarray] = field(default_factory=list)


SAMPLERS = ("exact", "policy", "reference")
SCHEDULES = ("constant", "sqrt")


def mpo_weights(
    rewards: Any,
    *,
    policy_logps: Any | None = None,
    ref_logps: Any | None = None,
    beta: float = 0.5,
    eta: float = 2.0,
    batch_size: int = 8,
    steps: int = 2000,
    sampler: str = "exact",
    n_samples: int = 16,
    schedule: str = "sqrt",
    init: Any | None = None,
    seed: int = 0,
) -> MirrorDescentResult:
    """MPO weights: ``lambda_{t+1} ∝ lambda_t exp(-eta_t g_t)``, g_t a batch estimate of ``E_{pi_lambda_t}[r]``.

    Batch stochastic mirror descent (exponentiated gradient) on ``min_{lambda in simplex} F(lambda)``; returns
    the average of the iterates at which gradients were taken (lambda_0 .. lambda_{T-1}), as in the paper [verify].

    pi_lambda on the candidate set is ``prod_k pi_k^{lambda_k}`` from `policy_logps` when given (trained
    policies), otherwise the closed form ``pi_ref exp(lambda·r / beta)`` from `ref_logps` (exact policies); the two
    coincide when ``pi_k ∝ pi_ref exp(r_k / beta)``.

    Args:
        rewards (`array`, (n, C, K)): per-candidate rewards, z-normalised (`zscore_fit`) so that no objective
            dominates by scale.
        policy_logps (`array`, (n, C, K), *optional*): the single-objective policies' candidate log-probs.
        ref_logps (`array`, (n, C), *optional*): pi_ref's candidate log-probs (needed without `policy_logps`,
            and for ``sampler="reference"``).
        beta (`float`, defaults to 0.5): KL weight of the closed form (unused with `policy_logps`).
        eta (`float`, defaults to 2.0): mirror-descent step size (eta_0 of the schedule).
        batch_size (`int`, defaults to 8): prompts per step (drawn without replacement; all when fewer).
        steps (`int`, defaults to 2000): mirror-descent steps T (each costs a batch of candidate-set sums).
        sampler (`str`, defaults to ``"exact"``): the estimate of ``E_{pi_lambda(.|x)}[r]`` per batch prompt:
            ``"exact"`` (sum over the candidate set), ``"policy"`` (mean over `n_samples` draws from pi_lambda),
            ``"reference"`` (`n_samples` draws from pi_ref, self-normalised importance weights
            ``pi_lambda / pi_ref``: the estimator available when only pi_ref can be sampled).
        schedule (`str`, defaults to ``"sqrt"``): ``eta_t = eta / sqrt(t + 1)`` (the stochastic mirror-descent
            rate; a constant step leaves the average at a noise floor with batches of 8) or ``"constant"``.
        init (`array`, (K,), *optional*): lambda_0 (default uniform).
        seed (`int`): batch and sample draws.
    """
    r = _rewards(rewards)
    n, c, k = r.shape
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}, got {sampler!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    for name, value, lo in (("steps", steps, 1), ("batch_size", batch_size, 1), ("n_samples", n_samples, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {value!r}")
    if not eta > 0:
        raise ValueError(f"eta must be > 0, got {eta}")
    if policy_logps is None and ref_logps is None:
        raise ValueError("mpo_weights needs policy_logps (trained policies) or ref_logps (closed-form policies)")
    if sampler == "reference" and ref_logps is None:
        raise ValueError("sampler='reference' needs ref_logps (the samples come from pi_ref)")
    ref = None if ref_logps is None else normalize_logps(ref_logps)
    pol = None
    if policy_logps is not None:
        pol = np.asarray(policy_logps, dtype=np.float64)
        if pol.shape != (n, c, k):
            raise ValueError(f"policy_logps have shape {pol.shape}, expected {(n, c, k)} to match the rewards")
        present = np.isfinite(pol).all(-1)
    else:
        if beta <= 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        present = np.isfinite(ref)
    if ref is not None and ref.shape != (n, c):
        raise ValueError(f"ref_logps have shape {ref.shape}, expected {(n, c)} to match the rewards")
    r = _clean(r, present)
    lam = np.full(k, 1.0 / k) if init is None else check_weights(init, k, name="init")
    rng = np.random.default_rng(seed)

    def mixture(idx: np.ndarray, w: np.ndarray) -> np.ndarray:  # log pi_lambda on the batch, (B, C)
        if pol is not None:
            return log_linear_mix(pol[idx], w)
        return normalize_logps(ref[idx] + (r[idx] @ w) / beta)

    traj, grads, batches = [lam.copy()], [], []
    for t in range(steps):
        idx = np.sort(rng.choice(n, size=min(batch_size, n), replace=False))
        lp = mixture(idx, lam)  # (B, C)
        rb = r[idx]  # (B, C, K)
        if sampler == "exact":
            g = np.einsum("bc,bck->k", np.exp(lp), rb) / len(idx)
        else:
            src = lp if sampler == "policy" else ref[idx]
            p = np.exp(src)
            p = p / p.sum(-1, keepdims=True)
            g = np.zeros(k)
            for b in range(len(idx)):
                ys = rng.choice(c, size=n_samples, p=p[b])
                if sampler == "policy":
                    g += rb[b, ys].mean(0)
                else:  # self-normalised importance weights pi_lambda / pi_ref (unknown normaliser cancels)
                    logw = lp[b, ys] - src[b, ys]
                    iw = np.exp(logw - logw.max())
                    g += (iw[:, None] * rb[b, ys]).sum(0) / iw.sum()
            g /= len(idx)
        step = eta if schedule == "constant" else eta / math.sqrt(t + 1)
        logits = np.log(np.maximum(lam, 1e-300)) - step * g
        lam = np.exp(logits - logits.max())
        lam /= lam.sum()
        traj.append(lam.copy())
        grads.append(g)
        batches.append(idx)
    trajectory = np.stack(traj)
    avg = trajectory[:-1].mean(0)
    return MirrorDescentResult(avg / avg.sum(), lam, trajectory, np.stack(grads), batches)


# --------------------------------------------------------------------------------------- exact MaxMin references


@dataclass
class MaxMinOptimum:
    """The KL-regularised MaxMin optimum on a finite candidate set (Kelley's cutting planes).

    Attributes:
        weights (`np.ndarray`, (K,)): lambda* (the best point evaluated).
        value (`float`): F(lambda*), an upper bound on min F.
        lower (`float`): the last LP's value, a certified lower bound on min F.
        iterations (`int`): cuts made.
    """

    weights: np.ndarray
    value: float
    lower: float
    iterations: int

    @property
    def gap(self) -> float:
        return self.value - self.lower


def cutting_plane_minimize(
    fn: Callable[[np.ndarray], tuple[float, np.ndarray]],
    k: int,
    *,
    tol: float = 1e-6,
    max_iter: int = 500,
) -> MaxMinOptimum:
    """Minimise a convex ``fn(lambda) -> (value, gradient)`` over the simplex by Kelley's cutting-plane method.

    Each iteration solves the LP ``min t s.t. t >= f(l_j) + g_j·(l - l_j) for all cuts j, l in simplex`` with
    `scipy.optimize.linprog` (HiGHS); its value is a lower bound on min f (the cuts under-estimate a convex f),
    the best evaluated point an upper bound. Each round cuts at the LP's point and at its midpoint with the best
    point so far (in-out stabilisation, Ben-Ameur and Neto 2007). Stops when the two bounds are within
    ``tol * max(1, |f|)``.
    """
    from scipy.optimize import linprog

    pts = [np.full(k, 1.0 / k), *np.eye(k)]
    cuts: list[tuple[float, np.ndarray, np.ndarray]] = []
    best_w, best_v, lower = pts[0], math.inf, -math.inf
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007 (the count is returned)
        for p in pts:
            v, g = fn(p)
            cuts.append((v, np.asarray(g, dtype=np.float64), p))
            if v < best_v:
                best_w, best_v = p.copy(), v
        # variables (l_1..l_k, t): minimise t subject to g·l - t <= g·p - f(p), sum l = 1, l >= 0
        a_ub = np.array([[*g, -1.0] for _, g, _ in cuts])
        b_ub = np.array([g @ p - v for v, g, p in cuts])
        res = linprog(
            c=np.r_[np.zeros(k), 1.0],
            A_ub=a_ub,
            b_ub=b_ub,
            A_eq=np.r_[np.ones(k), 0.0][None],
            b_eq=[1.0],
            bounds=[(0, None)] * k + [(None, None)],
            method="highs",
        )
        if res.status != 0:
            raise RuntimeError(f"cutting-plane LP failed: {res.message}")
        lower = max(lower, float(res.fun))
        if best_v - lower <= tol * max(1.0, abs(best_v)):
            break
        w = np.clip(res.x[:k], 0.0, None)
        w /= w.sum()
        # in-out stabilisation: also cut at the midpoint of the LP point and the best point, which keeps plain
        # Kelley's zig-zag from dragging on near a smooth minimum
        mid = 0.5 * (w + best_w)
        pts = [w, mid / mid.sum()]
    return MaxMinOptimum(best_w, float(best_v), float(lower), it)


def maxmin_optimum(
    ref_logps: Any, rewards: Any, beta: float, *, tol: float = 1e-6, max_iter: int = 500
) -> MaxMinOptimum:
    """The exact regularised MaxMin optimum ``min_{lambda in simplex} F(lambda)`` on the candidate set (LP cuts)."""
    r = _rewards(rewards)
    return cutting_plane_minimize(lambda w: dual_value(w, ref_logps, r, beta), r.shape[2], tol=tol, max_iter=max_iter)


@dataclass
class MaxMinLP:
    """The unregularised MaxMin LP ``max_pi min_k mean_x E_pi[r_k]`` over candidate-supported policies.

    Attributes:
        value (`float`): the optimum, a ceiling on min_k mean_x E_pi[r_k] for every pi on the candidates.
        policy (`np.ndarray`, (n, C)): an optimal policy's probabilities.
        weights (`np.ndarray`, (K,)): the LP dual of the objective constraints, the beta -> 0 MaxMin weights.
    """

    value: float
    policy: np.ndarray
    weights: np.ndarray


def maxmin_lp(rewards: Any, mask: Any | None = None) -> MaxMinLP:
    """Solve ``max t s.t. t <= mean_x sum_y pi(y|x) r_k(x, y) (all k), sum_y pi(y|x) = 1, pi >= 0`` (HiGHS).

    Its dual is ``min_{lambda in simplex} mean_x max_y lambda·r(x, y)``, the beta -> 0 limit of F.
    """
    from scipy.optimize import linprog

    r = _rewards(rewards)
    n, c, k = r.shape
    m = np.ones((n, c), dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    r = _clean(r, m)
    nv = n * c + 1  # pi flattened, then t
    a_ub = np.zeros((k, nv))
    a_ub[:, : n * c] = -(r.reshape(n * c, k).T / n)
    a_ub[:, -1] = 1.0
    a_eq = np.zeros((n, nv))
    for i in range(n):
        a_eq[i, i * c : (i + 1) * c] = 1.0
    bounds = [(0.0, None if m.reshape(-1)[j] else 0.0) for j in range(n * c)] + [(None, None)]
    res = linprog(np.r_[np.zeros(n * c), -1.0], A_ub=a_ub, b_ub=np.zeros(k), A_eq=a_eq, b_eq=np.ones(n),
                  bounds=bounds, method="highs")  # fmt: skip
    if res.status != 0:
        raise RuntimeError(f"MaxMin LP failed: {res.message}")
    duals = -np.asarray(res.ineqlin.marginals)  # >= 0, sum 1 (the t column)
    duals = np.clip(duals, 0.0, None)
    return MaxMinLP(float(-res.fun), res.x[: n * c].reshape(n, c), duals / max(duals.sum(), 1e-300))


# ------------------------------------------------------------------------------------------- torch: training etc.


@dataclass
class CandidateBatch:
    """A group of prompts with all their candidate responses, cached by the frozen trunk.

    Attributes:
        cache (`TrunkCache`): the trunk's output for the ``rows`` sequences ``prompt + candidate``.
        target_mask (`torch.BoolTensor`, (rows, T-1)): response-token targets.
        ref_logps (`torch.Tensor`, (rows,)): summed response log-probs under the frozen reference (top k).
        prompt (`np.ndarray`, (rows,)): the prompt index of each row; candidate (`np.ndarray`, (rows,)): its slot.
    """

    cache: Any
    target_mask: Any
    ref_logps: Any
    prompt: np.ndarray
    candidate: np.ndarray


def response_logps(topk: Any, cache: Any, target_mask: Any) -> Any:
    """Summed response log-probs (rows,) of a cached batch under a `TopK`, the LM head on response positions only.

    Equals ``token_logps_from_cache(topk, cache, target_mask=target_mask).sum(-1)``; skipping the head on prompt
    positions matters because SmolLM2's tied head costs as much as about 8 of its 30 blocks per token.
    """
    import torch
    import torch.nn.functional as F

    h = topk.hidden_states(cache)  # (rows, T, hidden), final-normed; no grad for a frozen TopK
    m = target_mask.bool()  # (rows, T-1): position t predicts token t+1
    hs = h[:, :-1][m]  # (N, hidden)
    targets = cache.input_ids[:, 1:][m]  # (N,)
    head = topk.lm_head
    weight = head.weight if topk.train_head else head.weight.detach()
    bias = getattr(head, "bias", None)
    if bias is not None and not topk.train_head:
        bias = bias.detach()
    with torch.no_grad() if topk.frozen else contextlib.nullcontext():
        logits = F.linear(hs, weight, bias)  # (N, vocab)
        if topk.softcap is not None:
            logits = torch.tanh(logits / topk.softcap) * topk.softcap
        lp = torch.log_softmax(logits.float(), -1).gather(-1, targets[:, None]).squeeze(-1)  # (N,)
        rows = torch.arange(m.shape[0], device=m.device)[:, None].expand_as(m)[m]
        return torch.zeros(m.shape[0], dtype=lp.dtype, device=lp.device).index_add(0, rows, lp)


@dataclass
class DPOResult:
    """A trained single-objective policy and its training trace."""

    policy: Any
    losses: list[float]
    pair_accuracy: list[float]


def train_dpo_policy(
    trunk: Any,
    batches: Sequence[CandidateBatch],
    pairs: Sequence[Any],
    *,
    beta: float = 0.1,
    lr: float = 1e-4,
    epochs: int = 3,
    max_grad_norm: float = 1.0,
    seed: int = 0,
    on_step: Callable[[int, float], None] | None = None,
) -> DPOResult:
    """DPO ``-logsig(beta((pc - rc) - (pr - rr)))`` on the trunk's trainable top-k copy (frozen trunk, frozen ref).

    Args:
        trunk (`FrozenTrunk`): gives the trainable copy (`FrozenTrunk.top_k`) and the cached batches' split.
        batches (`Sequence[CandidateBatch]`): cached prompt groups (their ``ref_logps`` precomputed).
        pairs (`Sequence[torch.LongTensor]`): per batch, (P, 2) row indices (chosen, rejected) of one objective's
            preferences; a batch with no pair is skipped.
        beta, lr, epochs, max_grad_norm: DPO beta (Rafailov et al. 0.1), AdamW learning rate, passes over the
            batches (shuffled each epoch with `seed`), gradient clipping.
        on_step: optional callback ``(step, loss)`` (progress lives in the experiment).
    """
    import torch

    from lmlab.core.training.preference import dpo_loss

    if len(batches) != len(pairs):
        raise ValueError(f"got {len(batches)} batches but {len(pairs)} pair lists")
    if not any(len(p) for p in pairs):
        raise ValueError("no preference pair in any batch: the objective ties on every candidate pair")
    policy = trunk.top_k()
    opt = torch.optim.AdamW(list(policy.trainable_parameters()), lr=lr, weight_decay=0.0)
    rng = np.random.default_rng(seed)
    losses, accs, step = [], [], 0
    for _ in range(epochs):
        for b in rng.permutation(len(batches)):
            pr = pairs[b]
            if len(pr) == 0:
                continue
            batch = batches[b]
            lp = response_logps(policy, batch.cache, batch.target_mask)  # (rows,)
            ref = batch.ref_logps
            c, r = pr[:, 0], pr[:, 1]
            loss = dpo_loss(lp[c], lp[r], ref[c], ref[r], beta=beta)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(list(policy.trainable_parameters()), max_grad_norm)
            opt.step()
            with torch.no_grad():
                accs.append(float(((lp[c] - ref[c]) > (lp[r] - ref[r])).float().mean()))
            losses.append(float(loss.detach()))
            step += 1
            if on_step is not None:
                on_step(step, losses[-1])
    policy.eval()
    return DPOResult(policy, losses, accs)


def soup_topk(trunk: Any, policies: Sequence[Any], weights: Any) -> Any:
    """Reward soups (Rame et al. 2023): the parameter average ``sum_k lambda_k theta_k`` of trained top-k blocks.

    Each policy is a `TopK` of the same trunk (full fine-tunes of the top blocks and final norm; a LoRA is merged
    first). Returns a frozen-in-eval `TopK` holding the averaged parameters.
    """
    import torch

    from lmlab.core.training.partial import _block_state

    w = check_weights(weights, len(policies))
    out = trunk.top_k()
    states = []
    for p in policies:
        blocks = _block_state(p)  # LoRA merged into a copy when attached
        state = {f"layers.{j}.{name}": t for j, s in enumerate(blocks) for name, t in s.items()}
        state.update({f"norm.{name}": t.detach() for name, t in p.norm.state_dict().items()})
        states.append(state)
    keys = set(states[0])
    if any(set(s) != keys for s in states):
        raise ValueError("reward soups need policies of one architecture (the same top-k blocks of one trunk)")
    avg = {key: sum(float(wk) * s[key].to(torch.float64) for wk, s in zip(w, states)) for key in keys}
    target = out.state_dict()
    missing = set(target) - keys
    if missing:
        raise ValueError(f"soup state lacks {sorted(missing)[:3]}")
    out.load_state_dict({key: avg[key].to(target[key].dtype) for key in target})
    out.eval()
    return out


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def mixture_generate(
    models: Sequence[Any],
    tokenizer: Any,
    prompts: Sequence[str],
    weights: Any,
    *,
    max_new_tokens: int = 32,
    do_sample: bool = False,
    temperature: float = 1.0,
    stop_strings: Sequence[str] = (),
    seed: int = 0,
    batch_size: int = 16,
) -> list[str]:
    """Decode from the token-level log-linear mixture ``softmax(sum_k lambda_k log pi_k(.|x, y_<t))``.

    The sequence-level product ``prod_k pi_k(y|x)^{lambda_k}`` is not autoregressive; mixing the per-token
    log-probs is its standard approximation (multi-objective decoding). Models with weight 0 are not run (their
    factor is 1). Prompts are left-padded and decoded together, each model with its own KV cache. Greedy unless
    `do_sample` (then row i draws from a generator seeded ``seed + i``). Stops a row at EOS or a stop string
    (the text is cut before it).

    Args:
        models: policies sharing one tokenizer and vocabulary (HF causal LMs; see `policy_model`).
        prompts: the prompt texts (tokenised with special tokens, as `lmlab.core.training.preference` scores them).
        weights (`array`, (K,)): on the simplex: the runtime "preference sliders".
    """
    import torch

    from lmlab.core.inference.generation import cache_kwargs, new_cache

    if not models:
        raise ValueError("mixture_generate needs at least one model")
    w = check_weights(weights, len(models))
    if isinstance(prompts, str):
        raise ValueError("prompts must be a sequence of strings, got one string")
    if max_new_tokens < 1 or batch_size < 1:
        raise ValueError(f"max_new_tokens and batch_size must be >= 1, got {max_new_tokens}, {batch_size}")
    if do_sample and not temperature > 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
    vocab = {int(m.get_output_embeddings().weight.shape[0]) for m in models}
    if len(vocab) != 1:
        raise ValueError(f"the mixed models must share one vocabulary, got output sizes {sorted(vocab)}")
    active = [(float(wk), m) for wk, m in zip(w, models, strict=True) if wk > 0]
    eos = {int(x) for x in np.atleast_1d(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    device = next(models[0].parameters()).device
    out: list[str] = []
    for start in range(0, len(prompts), batch_size):
        rows = [_encode(tokenizer, p) for p in prompts[start : start + batch_size]]
        if any(not r for r in rows):
            raise ValueError("a prompt has no token; decoding needs a context")
        b, width = len(rows), max(len(r) for r in rows)
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long, device=device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long, device=device)
        pos = (mask.cumsum(-1) - 1).clamp_min(0)
        caches = [new_cache(m) for _, m in active]
        gens = [torch.Generator().manual_seed(int(seed) + start + i) for i in range(b)] if do_sample else []
        new: list[list[int]] = [[] for _ in range(b)]
        done = [False] * b
        feed, feed_pos = ids, pos
        with torch.no_grad():
            for _ in range(max_new_tokens):
                mixed = None
                for (wk, m), cache in zip(active, caches, strict=True):
                    logits = m(input_ids=feed, attention_mask=mask, position_ids=feed_pos, logits_to_keep=1,
                               **cache_kwargs(m, cache)).logits[:, -1].float()  # (B, vocab)  # fmt: skip
                    term = wk * torch.log_softmax(logits, -1)
                    mixed = term if mixed is None else mixed + term
                if do_sample:
                    probs = torch.softmax(mixed / temperature, -1)
                    chosen = [int(torch.multinomial(probs[i], 1, generator=gens[i])) for i in range(b)]
                else:
                    chosen = mixed.argmax(-1).tolist()
                for i in range(b):
                    if done[i]:
                        continue
                    new[i].append(chosen[i])
                    if chosen[i] in eos:
                        done[i] = True
                    elif stop_strings:
                        text = tokenizer.decode(new[i], skip_special_tokens=True)
                        done[i] = any(s in text for s in stop_strings)
                if all(done):
                    break
                feed = torch.tensor([[t[-1]] for t in new], dtype=torch.long, device=device)
                feed_pos = feed_pos[:, -1:] + 1
                mask = torch.cat([mask, mask.new_ones(b, 1)], dim=1)
        for toks in new:
            text = tokenizer.decode([t for t in toks if t not in eos], skip_special_tokens=True)
            for s in stop_strings:
                if s in text:
                    text = text[: text.index(s)]
            out.append(text)
    return out
