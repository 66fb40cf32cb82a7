"""mAIHT: min_V F(V) = 1/2 tr((V - W~)^T A (V - W~)) + lam ||V||_0, solved by monotone accelerated IHT.

Wen, Zuo & Pan, "An Efficient Pruner for Large Language Model with Theoretical Guarantee", ICML 2025
(https://openreview.net/forum?id=nh9mBCYeF7; official code github.com/zuoooooooo/mAIHT-pruning, `lib/mAPM.py`,
class ``mAPPruner``, commit c173407). Pure: no I/O, no printing.

Per linear layer W (C_out x C_in) with calibration inputs X (tokens x C_in), the official solver:

    XX = X^T X                                  (un-averaged Gram, C_in x C_in)
    n_j = sqrt(XX_jj) + 1e-8,   D = diag(n)
    A  = D^-1 XX D^-1 + rho0 I                  (unit diagonal + ridge rho0 = 0.1)
    W~ = (W D)^T                                (C_in x C_out: weights scaled by input norms, as Wanda)
    alpha = 0.97 / lambda_max(A)                (the repo's ``--step 0`` rule; its CLI default 1e-3 under-converges)
    lam_0 = v^2 / (2 alpha),  v = |W~| at position floor(q N) of the descending sort (q = .95/.97/.99 by sparsity)
    repeat `iters` times, from W0 = W1 = Z = W~, t0 = 0, t1 = 1:
        lam <- lam (1 + s - delta - s_cur)      (continuation: raise the threshold until near the target sparsity)
        Y  = W1 + (t0 - 1)/t1 (W1 - W0) + t0/t1 (Z - W1)
        Z  = H_tau(Y  - alpha A (Y  - W~))      (accelerated candidate)
        V  = H_tau(W1 - alpha A (W1 - W~))      (plain IHT candidate),  tau = sqrt(2 lam alpha)
        t0, t1 <- t1, (sqrt(4 t1^2 + 1) + 1) / 2
        W0, W1 <- W1, (Z if F(Z) <= F(V) else V)   (monotone safeguard, Li & Lin's mAPG)
    mask = top-k of |W1| over the WHOLE matrix, k = floor(C_out C_in (1 - s) + 1)   (official; not per row)
    refit: `refine` times  W1 <- (W1 - alpha A (W1 - W~)) * mask
    W_new = W1^T D^-1

The monotone test is computed as the repo does: 1/2 tr((2W~ - V - Z)^T A (V - Z)) <= lam (nnz(V) - nnz(Z)), which
is exactly F(Z) <= F(V). Ablations share everything but the iteration: ``"aiht"`` (accelerated, no safeguard:
W1 <- H_tau(Y' - alpha A (Y' - W~)) with Y' = W1 + (t0 - 1)/t1 (W1 - W0), the repo's ``APM``) and ``"iht"``
(W1 <- V, no acceleration). N:M masks (the repo's ``mAPM_2.py``) replace H_tau by the N:M top-magnitude mask of
each candidate and skip the lam schedule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

VARIANTS = ("maiht", "aiht", "iht")


@dataclass
class SolveResult:
    """Output of `solve`: the pruned weight (C_out x C_in) and what the solver saw on the way."""

    weight: torch.Tensor
    step: float
    lam: float
    objective: list[float] = field(default_factory=list)  # F(W1_t) after each iteration (lam of that iteration)
    sparsity_path: list[float] = field(default_factory=list)  # zero fraction of W1_t after each iteration
    accepted_accelerated: int = 0  # iterations where the safeguard kept Z (mAIHT only)


def normalized_problem(weight: torch.Tensor, gram: torch.Tensor, ridge: float = 0.1, dtype=torch.float64):
    """(A, W~, n): the normalised quadratic of the official solver. weight: (C_out, C_in), gram: X^T X (C_in, C_in)."""
    gram = gram.to(dtype)
    norm = torch.diag(gram).clamp_min(0).sqrt() + 1e-8  # (C_in,)
    a_mat = gram / norm[:, None] / norm[None, :] + ridge * torch.eye(gram.shape[0], dtype=gram.dtype)
    w_tilde = (weight.to(dtype) * norm[None, :]).T.contiguous()  # (C_in, C_out)
    return a_mat, w_tilde, norm


def objective(v: torch.Tensor, a_mat: torch.Tensor, w_tilde: torch.Tensor, lam: float) -> float:
    """F(V) = 1/2 tr((V - W~)^T A (V - W~)) + lam ||V||_0."""
    diff = v - w_tilde
    return float(0.5 * (diff * (a_mat @ diff)).sum() + lam * torch.count_nonzero(v))


def hard_threshold(v: torch.Tensor, tau: float) -> torch.Tensor:
    """H_tau: the prox of lam ||.||_0 with tau = sqrt(2 lam alpha): zero every entry with |v| < tau."""
    return v * (v.abs() >= tau)


def nm_mask_rows(v: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """N:M keep-mask of V (C_in, C_out) along the input dimension: in each group of m consecutive inputs of one
    output, prune the n smallest |V| and keep the other m - n (the official ``generate_nm_mask`` on the transposed
    weight). "N:M" means prune N of every M everywhere in lmlab, as in Wanda / SparseGPT's ``prune_n, prune_m`` and
    `lmlab.core.pruning.masks.nm_mask`; at 2:4 keeping n and keeping m - n coincide, which hid the difference."""
    c_in, c_out = v.shape
    if not 0 <= n < m:
        raise ValueError(f"N:M = {n}:{m}: expected 0 <= N < M (prune N of every M)")
    groups = v.T.reshape(c_out, c_in // m, m).abs()
    idx = groups.topk(m - n, dim=-1).indices
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, idx, True)
    return mask.reshape(c_out, c_in).T


def _initial_threshold(w_tilde: torch.Tensor, sparsity: float, step: float) -> tuple[float, float]:
    q = 0.95 if sparsity > 0.35 else (0.99 if sparsity < 0.15 else 0.97)
    ordered = w_tilde.reshape(-1).abs().sort(descending=True).values
    value = float(ordered[int(q * ordered.numel())])
    delta = 0.015 if sparsity > 0.35 else 0.01
    return value * value / 2.0 / step, delta


def solve(
    weight: torch.Tensor,
    gram: torch.Tensor,
    sparsity: float,
    *,
    iters: int = 20,
    refine: int = 30,
    step: float | None = None,
    ridge: float = 0.1,
    variant: str = "maiht",
    nm: tuple[int, int] | None = None,
    lam: float | None = None,
    record: bool = False,
    dtype: torch.dtype = torch.float32,
) -> SolveResult:
    """Prune one linear layer. weight: (C_out, C_in); gram: X^T X over the calibration tokens (C_in, C_in).

    step=None uses alpha = 0.97 / lambda_max(A). lam=None starts from the official quantile rule and runs its
    continuation schedule; a given lam is held fixed (the setting of the monotonicity guarantee). record=True
    fills `objective` and `sparsity_path` per iteration. The iteration runs in `dtype` (fp32 as the official code;
    float64 for exact-arithmetic checks).
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r}: expected one of {', '.join(VARIANTS)}")
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity={sparsity}: expected a value in [0, 1)")
    c_out, c_in = weight.shape
    if gram.shape != (c_in, c_in):
        raise ValueError(f"gram shape {tuple(gram.shape)}: expected ({c_in}, {c_in}) for a weight of {(c_out, c_in)}")
    if nm is not None and c_in % nm[1]:
        raise ValueError(f"nm={nm}: the input dimension {c_in} is not a multiple of m={nm[1]}")
    a_mat, w_tilde, norm = normalized_problem(weight, gram, ridge, dtype)
    if step is None:
        step = 0.97 / float(torch.linalg.eigvalsh(a_mat)[-1])
    fixed_lam = lam is not None
    lam_init, delta = _initial_threshold(w_tilde, sparsity, step)
    lam = float(lam) if fixed_lam else lam_init
    total = c_out * c_in
    result = SolveResult(weight=weight, step=step, lam=lam)

    def prox(v: torch.Tensor) -> torch.Tensor:
        if nm is not None:
            return v * nm_mask_rows(v, *nm)
        return hard_threshold(v, math.sqrt(2.0 * lam * step))

    def grad_step(v: torch.Tensor) -> torch.Tensor:
        return v - step * (a_mat @ (v - w_tilde))

    w0 = w_tilde.clone()
    w1 = w_tilde.clone()
    z = w_tilde.clone()
    t0, t1 = 0.0, 1.0
    for _ in range(iters):
        if nm is None and not fixed_lam:
            s_cur = 1.0 - float(torch.count_nonzero(w1)) / total
            lam = lam * (1.0 + sparsity - delta - s_cur)
        if variant == "maiht":
            y = w1 + (t0 - 1.0) / t1 * (w1 - w0) + t0 / t1 * (z - w1)
            z = prox(grad_step(y))
            v = prox(grad_step(w1))
            # F(Z) <= F(V)  <=>  1/2 tr((2W~ - V - Z)^T A (V - Z)) <= lam (nnz(V) - nnz(Z))
            lhs = 0.5 * float(((2.0 * w_tilde - v - z) * (a_mat @ (v - z))).sum())
            rhs = lam * float(torch.count_nonzero(v) - torch.count_nonzero(z))
            take_z = lhs <= rhs
            result.accepted_accelerated += int(take_z)
            w0, w1 = w1, (z if take_z else v)
        elif variant == "aiht":
            y = w1 + (t0 - 1.0) / t1 * (w1 - w0)
            w0, w1 = w1, prox(grad_step(y))
        else:
            w0, w1 = w1, prox(grad_step(w1))
        t0, t1 = t1, (math.sqrt(4.0 * t1 * t1 + 1.0) + 1.0) / 2.0
        if record:
            result.objective.append(objective(w1, a_mat, w_tilde, lam))
            result.sparsity_path.append(1.0 - float(torch.count_nonzero(w1)) / total)

    if nm is not None:
        mask = nm_mask_rows(w1, *nm)
    else:
        keep = min(total, int(total * (1.0 - sparsity) + 1))  # the official k (one above (1 - s) N)
        flat = w1.reshape(-1).abs()
        mask = torch.zeros(total, dtype=torch.bool, device=w1.device)
        mask[flat.topk(keep).indices] = True
        mask = mask.view_as(w1)
    w1 = w1 * mask
    for _ in range(refine):
        w1 = grad_step(w1) * mask
    result.weight = (w1.T / norm[None, :]).to(weight.dtype).contiguous()
    result.lam = lam
    return result


def reconstruction_error(weight: torch.Tensor, pruned: torch.Tensor, gram: torch.Tensor) -> tuple[float, float]:
    """(||X (W - W')^T||^2, that over ||X W^T||^2) from the Gram X^T X: the layer-wise loss every pruner minimises."""
    gram = gram.double()
    diff = (weight.double() - pruned.double()).T  # (C_in, C_out)
    err = float((diff * (gram @ diff)).sum())
    ref = float((weight.double().T * (gram @ weight.double().T)).sum())
    return err, err / max(ref, 1e-30)
