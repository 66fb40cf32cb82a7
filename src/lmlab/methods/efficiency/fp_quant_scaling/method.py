"""Floating-point quantization training and its unified scaling law (Sun et al., ICML 2025).

    L(N, D, E, M, B) = n / N^alpha + d / D^beta + eps + (D^beta / N^alpha) * log2(B) / (gamma (E+0.5)^delta (M+0.5)^nu)

Paper: https://arxiv.org/abs/2501.02423 (no official code).

Three parts, all pure (no I/O):

1. **A simulated ExMy quantizer** (`FPFormat`, `fp_round`, `fp_quantize`): sign + E exponent bits + M mantissa bits,
   bias 2^(E-1) - 1, subnormals (optional), round to nearest (ties to even), saturation at the largest finite value,
   and one fp32 (or power-of-two E8M0, as in OCP MX) scaling factor ``s = absmax(group) / maxval`` per group of B
   elements along the GEMM reduction axis (B = the row length for per-channel, B = numel for per-tensor).
   Conventions of the top binade (`FPFormat.special`): ``"none"`` (every code is finite: OCP FP4/FP6 E2M1, E2M3,
   E3M2), ``"nan"`` (only the all-ones code is NaN: OCP E4M3fn, max 448), ``"ieee"`` (the top exponent is inf/NaN:
   E5M2 max 57344, fp16, bf16). ``"auto"`` picks the OCP/IEEE one for E4M3 / E>=5 and ``"none"`` otherwise.
2. **Fake-quantized training** (`FPQuantLinear`, `quantize_linears`): the forward GEMM operands x (activations) and w
   (the weight's forward copy; the fp32 master weight is what the optimizer updates) are quantized, gradients pass
   straight through (STE, identity); optionally the output gradient dY, the operand of both backward GEMMs, is
   quantized too (``"grad_out"``). The backward GEMMs reuse the quantized forward copies of x and w saved by
   ``F.linear``.
3. **The law** (`unified_loss`, `precision_term`, `critical_data_size`, `optimal_split`, `optimal_precision`) with the
   paper's constants (`PAPER_CONSTANTS`), and a least-squares fitter of the precision term on measured loss gaps
   (`fit_precision_term`), in log space:

       log(L_q - L_fp) = kappa * log(log2 B) - log(gamma') - delta * log(E + 0.5) - nu * log(M + 0.5)

   where gamma' = gamma * N^alpha / D^beta absorbs the fixed model and data size and kappa (1 in the paper) tests the
   log2(B) dependence.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# Fitted constants of the unified law as quoted in lmlab's area spec (PMLR 267:57544, Eq. of the "unified scaling
# law"); see the README: they could not be checked against the PDF text offline.
PAPER_CONSTANTS: dict[str, float] = {
    "n": 69.23,
    "alpha": 0.2368,
    "d": 68973.0,
    "beta": 0.5162,
    "epsilon": 1.906,
    "gamma": 11334.5,
    "delta": 3.1609,
    "nu": 2.9056,
}

SPECIALS = ("auto", "none", "nan", "ieee")
TARGETS = ("x", "w", "grad_out")
SCALE_DTYPES = ("fp32", "e8m0")


# ----------------------------------------------------------------------------------------------------------------
# formats
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FPFormat:
    """A sign-exponent-mantissa format ExMy (1 + E + M bits) with bias 2^(E-1) - 1.

    Args:
        exp_bits (`int`): E >= 1. E = 1 formats are uniform grids (all values subnormal or in one binade).
        man_bits (`int`): M >= 0. M = 0 formats hold powers of two only.
        subnormals (`bool`, defaults to `True`): keep the subnormal values (0.m x 2^(1-bias)); without them,
            magnitudes below the smallest normal round to 0 or to the smallest normal.
        special (`str`, defaults to ``"auto"``): top-binade convention, one of `SPECIALS` (see the module docstring).
    """

    exp_bits: int
    man_bits: int
    subnormals: bool = True
    special: str = "auto"

    def __post_init__(self) -> None:
        for name, value, lo, hi in (("exp_bits", self.exp_bits, 1, 8), ("man_bits", self.man_bits, 0, 23)):
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
        if self.special not in SPECIALS:
            raise ValueError(f"special must be one of {', '.join(SPECIALS)}, got {self.special!r}")
        if self.kind == "nan" and self.man_bits == 0:
            raise ValueError("special='nan' (only the all-ones code is NaN) needs man_bits >= 1")
        if self.exp_bits == 8 and self.kind != "ieee":
            raise ValueError("E8 formats exceed the fp32 range unless special='ieee' (bf16 layout)")

    @classmethod
    def parse(cls, name: str, **kwargs: Any) -> FPFormat:
        """``"E2M1"`` / ``"e4m3"`` -> `FPFormat`."""
        m = re.fullmatch(r"[eE](\d+)[mM](\d+)", str(name).strip())
        if not m:
            raise ValueError(f"FP format must look like 'E2M1' (exponent and mantissa bits), got {name!r}")
        return cls(int(m.group(1)), int(m.group(2)), **kwargs)

    @property
    def name(self) -> str:
        return f"E{self.exp_bits}M{self.man_bits}"

    @property
    def bits(self) -> int:
        return 1 + self.exp_bits + self.man_bits

    @property
    def kind(self) -> str:
        """The resolved top-binade convention: OCP E4M3fn -> nan, E >= 5 -> ieee (E5M2, fp16, bf16), else none."""
        if self.special != "auto":
            return self.special
        if self.exp_bits == 4 and self.man_bits == 3:
            return "nan"
        return "ieee" if self.exp_bits >= 5 else "none"

    @property
    def bias(self) -> int:
        return 2 ** (self.exp_bits - 1) - 1

    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal binade (subnormals share its spacing)."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Unbiased exponent of the largest binade holding a finite value."""
        top = 2**self.exp_bits - 1
        return (top - 1 if self.kind == "ieee" else top) - self.bias

    @property
    def max_value(self) -> float:
        if self.kind == "nan":  # the all-ones mantissa of the top binade is NaN
            return 2.0**self.emax * (2.0 - 2.0 ** (1 - self.man_bits))
        return 2.0**self.emax * (2.0 - 2.0 ** (-self.man_bits))

    @property
    def min_normal(self) -> float:
        return 2.0**self.emin

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value (the smallest normal when there are no subnormals or M = 0)."""
        return 2.0 ** (self.emin - self.man_bits) if self.subnormals and self.man_bits > 0 else self.min_normal

    def values(self) -> torch.Tensor:
        """All non-negative finite values, sorted (for tests and plots; E <= 5 and M <= 10 only)."""
        if self.exp_bits > 5 or self.man_bits > 10:
            raise ValueError(f"values() enumerates small formats only, got {self.name}")
        out = {0.0}
        for e in range(self.emin, self.emax + 1):
            for k in range(2**self.man_bits):
                out.add(2.0**e * (1 + k / 2**self.man_bits))
        if self.subnormals:
            for k in range(1, 2**self.man_bits):
                out.add(2.0**self.emin * k / 2**self.man_bits)
        return torch.tensor(sorted(v for v in out if v <= self.max_value), dtype=torch.float64)


def fp_values(fmt: FPFormat | str) -> torch.Tensor:
    """Sorted non-negative finite values of `fmt` (``"E2M1"`` -> 0, 0.5, 1, 1.5, 2, 3, 4, 6)."""
    return (FPFormat.parse(fmt) if isinstance(fmt, str) else fmt).values()


def _as_format(fmt: FPFormat | str) -> FPFormat:
    return FPFormat.parse(fmt) if isinstance(fmt, str) else fmt


# ----------------------------------------------------------------------------------------------------------------
# quantizer
# ----------------------------------------------------------------------------------------------------------------


def fp_round(y: torch.Tensor, fmt: FPFormat | str) -> torch.Tensor:
    """Round `y` (already scaled) to the nearest value of `fmt`, ties to even, saturating at +-max_value.

    Exact: the binade exponent comes from ``frexp`` and the step 2^(e - M) is a power of two, so ``y / step`` and
    the product back are exact in fp32 (fp64 inputs stay fp64).
    """
    fmt = _as_format(fmt)
    work = y if y.dtype == torch.float64 else y.float()
    a = work.abs().clamp(max=fmt.max_value)
    if a.dtype == torch.float32:  # 2^floor(log2 a) straight from the fp32 exponent field (~7x faster than frexp)
        binade = (a.view(torch.int32) & 0x7F800000).view(torch.float32)
        step = binade.clamp(min=2.0**fmt.emin) * 2.0 ** (-fmt.man_bits)  # value spacing in that binade, 2^(e - M)
    else:
        _, ex = torch.frexp(a)  # a = m * 2^ex, m in [0.5, 1): the binade exponent is ex - 1 (0 -> clamped to emin)
        step = torch.ldexp(torch.ones_like(a), (ex - 1).clamp(min=fmt.emin) - fmt.man_bits)
    q = (torch.round(a / step) * step).clamp(max=fmt.max_value)  # round-half-even; a carry lands on 2^(e+1)
    if not fmt.subnormals:
        tiny = a < fmt.min_normal
        q = torch.where(tiny, torch.where(a > fmt.min_normal / 2, fmt.min_normal, 0.0).to(q.dtype), q)
    return q.copysign(work).to(y.dtype)


def _scales(amax: torch.Tensor, fmt: FPFormat, scale_dtype: str) -> torch.Tensor:
    """One scaling factor per group: absmax / maxval (fp32) or its power of two as in OCP MX (E8M0)."""
    if scale_dtype == "fp32":
        s = amax / fmt.max_value
    elif scale_dtype == "e8m0":  # shared exponent floor(log2 amax) - emax(element format): values above max saturate
        _, ex = torch.frexp(amax)
        _, ex_max = math.frexp(fmt.max_value)
        s = torch.ldexp(torch.ones_like(amax), (ex - 1) - (ex_max - 1))
    else:
        raise ValueError(f"scale_dtype must be one of {', '.join(SCALE_DTYPES)}, got {scale_dtype!r}")
    return torch.where(amax > 0, s, torch.ones_like(s))


def _check_block(block_size: int | str | None) -> None:
    if block_size is None or block_size in ("channel", "tensor"):
        return
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an int >= 1, 'channel', 'tensor' or None, got {block_size!r}")


def fp_quantize(
    x: torch.Tensor,
    fmt: FPFormat | str,
    block_size: int | str | None = 32,
    axis: int = -1,
    scale_dtype: str = "fp32",
) -> torch.Tensor:
    """Quantize-dequantize `x` to `fmt` with one scaling factor per block of `block_size` elements along `axis`.

    x_hat = s * round_fmt(x / s),  s = absmax(block) / maxval(fmt)

    Args:
        x (`torch.Tensor`): any shape; `axis` should be the GEMM reduction axis so the scales factor out of the dot
            products (the last axis of activations (..., in) and of weights (out, in)).
        fmt: an `FPFormat` or its name (``"E2M1"``).
        block_size: elements per scaling factor (a trailing partial block is zero-padded, which leaves its absmax
            unchanged); ``"channel"``: the whole `axis` (per row / per token); ``"tensor"``: one factor for all of
            `x`; None: no scaling (a plain cast to `fmt`, saturating).
        scale_dtype (`str`): ``"fp32"`` (the default) or ``"e8m0"`` (power-of-two scales, OCP MX).

    Returns:
        `torch.Tensor` of x's shape and dtype, every element s * (a value of `fmt`).
    """
    fmt = _as_format(fmt)
    _check_block(block_size)
    if x.numel() == 0:
        return x.clone()
    if block_size is None:
        return fp_round(x, fmt)
    if block_size == "tensor":
        s = _scales(x.detach().abs().amax().float(), fmt, scale_dtype)
        return (fp_round(x.float() / s, fmt) * s).to(x.dtype)
    xt = x.float().movedim(axis, -1)  # (..., K)
    k = xt.shape[-1]
    b = k if block_size == "channel" else int(block_size)
    pad = (-k) % b
    xp = F.pad(xt, (0, pad)) if pad else xt
    blocks = xp.reshape(*xp.shape[:-1], -1, b)  # (..., K/B, B)
    s = _scales(blocks.abs().amax(-1, keepdim=True), fmt, scale_dtype)
    q = (fp_round(blocks / s, fmt) * s).reshape(xp.shape)[..., :k]
    return q.movedim(-1, axis).to(x.dtype)


def group_size(shape: Sequence[int], block_size: int | str | None, axis: int = -1) -> int:
    """Elements sharing one scaling factor for a tensor of `shape` (the law's B)."""
    _check_block(block_size)
    if block_size is None:
        return 1
    if block_size == "tensor":
        return int(np.prod(shape))
    k = int(shape[axis])
    return k if block_size == "channel" else min(int(block_size), k)


def ste(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Straight-through estimator: the value of `q`, the gradient of the identity with respect to `x`."""
    return x + (q - x).detach()


class _QuantizeGrad(torch.autograd.Function):
    """Identity in the forward pass; quantizes the incoming gradient (dY, along its last axis) in the backward."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, quantize: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        ctx.quantize = quantize
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.quantize(grad), None


class FPQuantLinear(nn.Module):
    """An ``nn.Linear`` whose GEMM operands are fake-quantized to ExMy: y = Q(x) Q(W)^T + b, with STE gradients.

    Wraps (does not copy) the linear: its fp32 weight and bias stay the trainable master parameters, and a quantized
    copy of the weight is made in every forward pass.

    Args:
        linear (`nn.Linear`): the layer to wrap.
        fmt: `FPFormat` or name; block_size, scale_dtype: see `fp_quantize` (blocks run along the input features,
            the forward reduction axis, for both x and W).
        targets (`tuple[str, ...]`, defaults to ``("x", "w")``): operands to quantize, a subset of `TARGETS`
            (``grad_out``: dY in the backward, blocks along the output features).
        grad_fmt: format of dY (defaults to `fmt`).
    """

    def __init__(
        self,
        linear: nn.Linear,
        fmt: FPFormat | str,
        block_size: int | str | None = 32,
        targets: Sequence[str] = ("x", "w"),
        scale_dtype: str = "fp32",
        grad_fmt: FPFormat | str | None = None,
    ):
        super().__init__()
        bad = [t for t in targets if t not in TARGETS]
        if bad or not targets:
            raise ValueError(f"targets must be a non-empty subset of {', '.join(TARGETS)}, got {list(targets)!r}")
        if scale_dtype not in SCALE_DTYPES:
            raise ValueError(f"scale_dtype must be one of {', '.join(SCALE_DTYPES)}, got {scale_dtype!r}")
        _check_block(block_size)
        self.linear = linear
        self.fmt = _as_format(fmt)
        self.grad_fmt = _as_format(grad_fmt) if grad_fmt is not None else self.fmt
        self.block_size = block_size
        self.targets = tuple(targets)
        self.scale_dtype = scale_dtype

    @property
    def weight(self) -> nn.Parameter:
        return self.linear.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.linear.bias

    def _q(self, t: torch.Tensor, fmt: FPFormat) -> torch.Tensor:
        with torch.no_grad():
            return fp_quantize(t, fmt, self.block_size, -1, self.scale_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        w = self.linear.weight  # (out, in)
        if "x" in self.targets:
            x = ste(x, self._q(x, self.fmt))
        if "w" in self.targets:
            w = ste(w, self._q(w, self.fmt))
        y = F.linear(x, w, self.linear.bias)
        if "grad_out" in self.targets and torch.is_grad_enabled() and y.requires_grad:
            y = _QuantizeGrad.apply(y, lambda g: self._q(g, self.grad_fmt))
        return y

    def extra_repr(self) -> str:
        return f"fmt={self.fmt.name}, block_size={self.block_size}, targets={self.targets}, scale={self.scale_dtype}"


def quantize_linears(
    model: nn.Module,
    fmt: FPFormat | str,
    block_size: int | str | None = 32,
    targets: Sequence[str] = ("x", "w"),
    *,
    scale_dtype: str = "fp32",
    grad_fmt: FPFormat | str | None = None,
    skip: Sequence[str] = ("lm_head",),
) -> list[str]:
    """Swap every ``nn.Linear`` of `model` (except names containing an entry of `skip`) for an `FPQuantLinear`.

    Embeddings, norms and (by default) the LM head stay in high precision. Returns the swapped module names.
    """
    swapped = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and not any(s in full for s in skip):
                setattr(module, child_name, FPQuantLinear(child, fmt, block_size, targets, scale_dtype, grad_fmt))
                swapped.append(full)
    return swapped


# ----------------------------------------------------------------------------------------------------------------
# the unified scaling law (analytic)
# ----------------------------------------------------------------------------------------------------------------


def _c(constants: dict[str, float] | None) -> dict[str, float]:
    return dict(PAPER_CONSTANTS if constants is None else constants)


def precision_term(
    N: float, D: float, E: float, M: float, B: float, constants: dict[str, float] | None = None
) -> float:
    """(D^beta / N^alpha) * log2(B) / (gamma (E+0.5)^delta (M+0.5)^nu): the loss added by FP quantization."""
    c = _c(constants)
    if B < 1:
        raise ValueError(f"block size B must be >= 1, got {B!r}")
    denom = c["gamma"] * (E + 0.5) ** c["delta"] * (M + 0.5) ** c["nu"]
    return D ** c["beta"] / N ** c["alpha"] * math.log2(B) / denom


def unified_loss(N: float, D: float, E: float, M: float, B: float, constants: dict[str, float] | None = None) -> float:
    """L(N, D, E, M, B) = n/N^alpha + d/D^beta + eps + precision_term (N parameters, D tokens)."""
    c = _c(constants)
    base = c["n"] / N ** c["alpha"] + c["d"] / D ** c["beta"] + c["epsilon"]
    return base + precision_term(N, D, E, M, B, c)


def critical_data_size(N: float, E: float, M: float, B: float, constants: dict[str, float] | None = None) -> float:
    """D_crit = [d gamma N^alpha (E+0.5)^delta (M+0.5)^nu / log2 B]^(1 / (2 beta)): dL/dD = 0; more data hurts."""
    c = _c(constants)
    if B <= 1:
        return math.inf  # no block-size penalty: the loss keeps falling with D
    inner = c["d"] * c["gamma"] * N ** c["alpha"] * (E + 0.5) ** c["delta"] * (M + 0.5) ** c["nu"] / math.log2(B)
    return inner ** (1.0 / (2.0 * c["beta"]))


def optimal_split(P: int, constants: dict[str, float] | None = None) -> tuple[int, int]:
    """The (E, M) with E + M + 1 = P minimising the precision term (maximising (E+0.5)^delta (M+0.5)^nu), E >= 1.

    The continuous optimum is E + 0.5 = P delta / (delta + nu) (`optimal_exponent_continuous`).
    """
    c = _c(constants)
    if isinstance(P, bool) or not isinstance(P, int) or P < 2:
        raise ValueError(f"P (total bits, sign included) must be an int >= 2, got {P!r}")
    best = max(range(1, P), key=lambda e: c["delta"] * math.log(e + 0.5) + c["nu"] * math.log(P - 1 - e + 0.5))
    return best, P - 1 - best


def optimal_exponent_continuous(P: float, constants: dict[str, float] | None = None) -> float:
    c = _c(constants)
    return P * c["delta"] / (c["delta"] + c["nu"]) - 0.5


def optimal_precision(
    compute: float,
    *,
    B: float = 128,
    bits: Sequence[int] = tuple(range(3, 17)),
    constants: dict[str, float] | None = None,
) -> dict[str, float]:
    """The precision P (with its best split) and model size N minimising L at a fixed cost C = 6 N D P / 16.

    The cost counts training FLOPs weighted by the operand width relative to 16 bits (the paper's "cost ~ N D P"
    budget, normalised so that 16-bit training costs 6 N D). For each P, N is optimised on a log grid refined by a
    golden-section search; D = 16 C / (6 N P).
    """
    if compute <= 0:
        raise ValueError(f"compute must be > 0, got {compute!r}")
    c = _c(constants)
    best: dict[str, float] | None = None
    for P in bits:
        E, M = optimal_split(P, c)

        def loss_at(log_n: float, P: int = P, E: int = E, M: int = M) -> float:
            N = math.exp(log_n)
            D = 16.0 * compute / (6.0 * N * P)
            return unified_loss(N, D, E, M, B, c)

        grid = np.linspace(math.log(1e3), math.log(max(1e4, compute)), 200)
        vals = [loss_at(g) for g in grid]
        i = int(np.argmin(vals))
        lo, hi = grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)]
        phi = (math.sqrt(5) - 1) / 2
        for _ in range(60):  # golden section on [lo, hi]
            a, b = hi - phi * (hi - lo), lo + phi * (hi - lo)
            if loss_at(a) < loss_at(b):
                hi = b
            else:
                lo = a
        log_n = (lo + hi) / 2
        row = {"P": P, "E": E, "M": M, "N": math.exp(log_n), "loss": loss_at(log_n)}
        row["D"] = 16.0 * compute / (6.0 * row["N"] * P)
        if best is None or row["loss"] < best["loss"]:
            best = row
    assert best is not None
    return best


# ----------------------------------------------------------------------------------------------------------------
# fitting the precision term on measured losses
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class PrecisionFit:
    """Least-squares fit of log(dL) = kappa log(log2 B) - log(gamma') - delta log(E+.5) - nu log(M+.5)."""

    gamma_prime: float
    delta: float
    nu: float
    kappa: float
    r2: float
    n: int
    fit_kappa: bool
    residuals: list[float] = field(default_factory=list)
    loo_predictions: list[float] = field(default_factory=list)

    def predict(self, E: Any, M: Any, log2B: Any) -> np.ndarray:
        E, M, log2B = (np.asarray(v, dtype=float) for v in (E, M, log2B))
        return log2B**self.kappa / (self.gamma_prime * (E + 0.5) ** self.delta * (M + 0.5) ** self.nu)

    def paper_gamma(self, N: float, D: float, constants: dict[str, float] | None = None) -> float:
        """gamma in the paper's parametrisation: gamma' = gamma N^alpha / D^beta with the paper's alpha, beta."""
        c = _c(constants)
        return self.gamma_prime * D ** c["beta"] / N ** c["alpha"]


def _design(E: np.ndarray, M: np.ndarray, log2B: np.ndarray, fit_kappa: bool) -> np.ndarray:
    cols = [np.ones_like(E), -np.log(E + 0.5), -np.log(M + 0.5)]
    if fit_kappa:
        cols.append(np.log(log2B))
    return np.stack(cols, axis=1)


def _solve(E: np.ndarray, M: np.ndarray, log2B: np.ndarray, y: np.ndarray, fit_kappa: bool) -> np.ndarray:
    X = _design(E, M, log2B, fit_kappa)
    target = y if fit_kappa else y - np.log(log2B)
    coef, *_ = np.linalg.lstsq(X, target, rcond=None)
    return coef


def fit_precision_term(
    E: Sequence[float],
    M: Sequence[float],
    log2B: Sequence[float],
    delta_loss: Sequence[float],
    *,
    fit_kappa: bool = True,
) -> PrecisionFit:
    """Fit the law's precision term to measured loss gaps dL = L_quantized - L_full_precision (> 0 only).

    Args:
        E, M: exponent and mantissa bits of each run; log2B: log2 of its scaling-group size (> 0).
        delta_loss: its loss gap to the full-precision baseline at the same N and D; must be > 0 (the fit is in
            log space: filter non-positive gaps first and say so).
        fit_kappa (`bool`): also fit the exponent of log2(B) (the paper's form has kappa = 1).

    Returns:
        `PrecisionFit` with gamma' (= gamma N^alpha / D^beta at our N, D), delta, nu, kappa, R^2 in log space, and
        leave-one-out predictions of dL (each run predicted from a fit without it; NaN when too few points remain).
    """
    E_a, M_a, b_a, d_a = (np.asarray(v, dtype=float) for v in (E, M, log2B, delta_loss))
    if not (E_a.shape == M_a.shape == b_a.shape == d_a.shape) or E_a.ndim != 1:
        raise ValueError("E, M, log2B and delta_loss must be 1-D sequences of the same length")
    if (d_a <= 0).any() or not np.isfinite(d_a).all():
        raise ValueError(f"delta_loss must be finite and > 0 (log-space fit), got {d_a.tolist()!r}")
    if (b_a <= 0).any():
        raise ValueError(f"log2B must be > 0 (block size >= 2), got {b_a.tolist()!r}")
    k = 4 if fit_kappa else 3
    if len(d_a) < k:
        raise ValueError(f"the fit needs at least {k} runs, got {len(d_a)}")
    y = np.log(d_a)
    coef = _solve(E_a, M_a, b_a, y, fit_kappa)
    X = _design(E_a, M_a, b_a, fit_kappa)
    pred = X @ coef + (0.0 if fit_kappa else np.log(b_a))
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")
    loo = []
    for i in range(len(d_a)):
        keep = np.arange(len(d_a)) != i
        if keep.sum() < k:
            loo.append(float("nan"))
            continue
        c_i = _solve(E_a[keep], M_a[keep], b_a[keep], y[keep], fit_kappa)
        x_i = _design(E_a[i : i + 1], M_a[i : i + 1], b_a[i : i + 1], fit_kappa)
        loo.append(float(np.exp(x_i @ c_i + (0.0 if fit_kappa else np.log(b_a[i])))[0]))
    return PrecisionFit(
        gamma_prime=float(math.exp(-coef[0])),
        delta=float(coef[1]),
        nu=float(coef[2]),
        kappa=float(coef[3]) if fit_kappa else 1.0,
        r2=r2,
        n=len(d_a),
        fit_kappa=fit_kappa,
        residuals=(y - pred).tolist(),
        loo_predictions=loo,
    )


def fit_precision_term_free_offset(
    E: Sequence[float],
    M: Sequence[float],
    log2B: Sequence[float],
    loss: Sequence[float],
    *,
    fit_kappa: bool = True,
) -> tuple[PrecisionFit, float]:
    """Fit L = L0 + log2(B)^kappa / (gamma' (E+.5)^delta (M+.5)^nu) with the offset L0 free (nonlinear LS).

    Unlike `fit_precision_term`, this needs no full-precision reference: L0 plays the part of the law's
    precision-free terms n/N^alpha + d/D^beta + eps, and only the differences between quantized runs pin down
    delta, nu and kappa. Returns the fit (R^2 on the losses, no leave-one-out) and L0.
    """
    from scipy.optimize import least_squares

    E_a, M_a, b_a, l_a = (np.asarray(v, dtype=float) for v in (E, M, log2B, loss))
    if not (E_a.shape == M_a.shape == b_a.shape == l_a.shape) or E_a.ndim != 1:
        raise ValueError("E, M, log2B and loss must be 1-D sequences of the same length")
    if (b_a <= 0).any() or not np.isfinite(l_a).all():
        raise ValueError("log2B must be > 0 and the losses finite")
    k = 5 if fit_kappa else 4
    if len(l_a) < k:
        raise ValueError(f"the free-offset fit needs at least {k} runs, got {len(l_a)}")

    def model(theta: np.ndarray) -> np.ndarray:
        l0, log_g, delta, nu = theta[:4]
        kappa = theta[4] if fit_kappa else 1.0
        return l0 + np.exp(kappa * np.log(b_a) - log_g - delta * np.log(E_a + 0.5) - nu * np.log(M_a + 0.5))

    best = None
    spread = float(l_a.max() - l_a.min()) or 1e-3
    for l0_start in (l_a.min() - 0.5 * spread, l_a.min() - 2 * spread, l_a.min() - 0.1 * spread):
        theta0 = [l0_start, 0.0, 3.0, 3.0] + ([1.0] if fit_kappa else [])
        theta0[1] = float(np.log(np.mean(b_a) / (np.mean(l_a) - l0_start) / 2.5**3 / 1.5**3))
        lo = [-np.inf, -np.inf, 0.0, 0.0] + ([0.0] if fit_kappa else [])
        hi = [np.inf, np.inf, 30.0, 30.0] + ([10.0] if fit_kappa else [])
        res = least_squares(lambda t: model(t) - l_a, theta0, bounds=(lo, hi), max_nfev=20000, x_scale="jac")
        if best is None or res.cost < best.cost:
            best = res
    assert best is not None
    theta = best.x
    pred = model(theta)
    ss_res = float(((l_a - pred) ** 2).sum())
    ss_tot = float(((l_a - l_a.mean()) ** 2).sum())
    fit = PrecisionFit(
        gamma_prime=float(math.exp(theta[1])),
        delta=float(theta[2]),
        nu=float(theta[3]),
        kappa=float(theta[4]) if fit_kappa else 1.0,
        r2=1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan"),
        n=len(l_a),
        fit_kappa=fit_kappa,
        residuals=(l_a - pred).tolist(),
    )
    return fit, float(theta[0])
