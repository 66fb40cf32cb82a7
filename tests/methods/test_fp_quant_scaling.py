"""Invariants of the simulated FP quantizer, FP-quantized training layers and the unified law's analytic functions."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from lmlab.methods.efficiency.fp_quant_scaling import (
    PAPER_CONSTANTS,
    FPFormat,
    FPQuantLinear,
    critical_data_size,
    fit_precision_term,
    fit_precision_term_free_offset,
    fp_quantize,
    fp_round,
    fp_values,
    optimal_precision,
    optimal_split,
    precision_term,
    quantize_linears,
    unified_loss,
)
from lmlab.methods.efficiency.fp_quant_scaling.config import FPQuantScalingConfig

SMALL_FORMATS = ["E1M2", "E2M1", "E3M0", "E1M4", "E2M3", "E3M2", "E4M1", "E4M3", "E5M2", "E2M2", "E3M3"]


# ---- formats -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, max_value, min_normal, min_subnormal",
    [
        ("E2M1", 6.0, 1.0, 0.5),  # OCP MX FP4
        ("E2M3", 7.5, 1.0, 0.125),  # OCP MX FP6
        ("E3M2", 28.0, 0.25, 0.0625),  # OCP MX FP6
        ("E4M3", 448.0, 2.0**-6, 2.0**-9),  # OCP FP8 E4M3fn
        ("E5M2", 57344.0, 2.0**-14, 2.0**-16),  # OCP FP8 E5M2 (IEEE-like, has inf)
    ],
)
def test_known_max_and_min_values(name, max_value, min_normal, min_subnormal):
    fmt = FPFormat.parse(name)
    assert fmt.max_value == max_value
    assert fmt.min_normal == min_normal
    assert fmt.min_subnormal == min_subnormal
    assert fmt.bits == 1 + fmt.exp_bits + fmt.man_bits


@pytest.mark.parametrize("name, dtype", [("E4M3", torch.float8_e4m3fn), ("E5M2", torch.float8_e5m2)])
def test_limits_match_torch_float8(name, dtype):
    fmt, info = FPFormat.parse(name), torch.finfo(dtype)
    assert fmt.max_value == info.max and fmt.min_normal == info.smallest_normal


def test_e2m1_values_and_power_of_two_formats():
    assert fp_values("E2M1").tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert fp_values("E3M0").tolist() == [0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0]  # M = 0: powers of two
    assert fp_values("E1M2").tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]  # E = 1: a uniform grid
    assert len(fp_values("E2M3")) == 32 and len(fp_values("E3M2")) == 32  # 2^(E+M) magnitudes, all finite


def test_bad_formats_raise():
    for bad in ("E0M3", "X2M1", "E9M0", "2M1"):
        with pytest.raises(ValueError):
            FPFormat.parse(bad)
    with pytest.raises(ValueError, match="special"):
        FPFormat(2, 1, special="odd")


# ---- rounding ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SMALL_FORMATS)
def test_exactly_representable_values_round_trip(name):
    vals = fp_values(name).float()
    both = torch.cat([vals, -vals])
    assert torch.equal(fp_round(both, name), both)
    # also through block scaling: a block holding +-max_value scaled by a power of two gets the scale 2^k exactly
    fmt = FPFormat.parse(name)
    block = torch.cat([both, torch.tensor([fmt.max_value])])
    x = torch.stack([block * 2.0**k for k in (-3, 0, 5)])  # (3, K): one block per row
    assert torch.equal(fp_quantize(x, fmt, "channel"), x)


@pytest.mark.parametrize("name", ["E2M1", "E3M2", "E2M3", "E4M3", "E1M2", "E3M0"])
def test_rounds_to_the_nearest_representable_value(name):
    fmt = FPFormat.parse(name)
    grid = fp_values(fmt)
    grid = torch.cat([-grid.flip(0), grid])
    x = torch.empty(4000, dtype=torch.float64).uniform_(
        -fmt.max_value, fmt.max_value, generator=torch.Generator().manual_seed(0)
    )
    q = fp_round(x, fmt)
    assert torch.isin(q, grid).all()
    best = (x[:, None] - grid[None, :]).abs().min(1).values
    assert torch.allclose((q - x).abs(), best, rtol=0, atol=1e-12)


def test_ties_to_even_and_saturation():
    x = torch.tensor([0.25, 0.75, 2.5, 3.5, 5.0, 100.0, -100.0, -0.25, 1e-9])
    assert fp_round(x, "E2M1").tolist() == [0.0, 1.0, 2.0, 4.0, 4.0, 6.0, -6.0, -0.0, 0.0]
    assert fp_round(torch.tensor([500.0, 1e6]), "E4M3").tolist() == [448.0, 448.0]  # saturate, never NaN/inf


def test_without_subnormals_small_values_flush():
    fmt = FPFormat(2, 1, subnormals=False)
    assert fp_round(torch.tensor([0.4, 0.5, 0.6, 1.2]), fmt).tolist() == [0.0, 0.0, 1.0, 1.0]


@pytest.mark.parametrize("name, dtype", [("E4M3", torch.float8_e4m3fn), ("E5M2", torch.float8_e5m2)])
def test_matches_torch_float8_casts(name, dtype):
    fmt = FPFormat.parse(name)
    g = torch.Generator().manual_seed(1)
    x = torch.cat([torch.randn(20000, generator=g) * s for s in (1e-6, 1e-3, 1.0, 30.0, 3000.0)])
    x = x.clamp(-fmt.max_value, fmt.max_value)
    assert torch.equal(fp_round(x, fmt), x.to(dtype).float())


def test_matches_bf16_and_fp16_casts():
    x = torch.randn(50000, generator=torch.Generator().manual_seed(2)) * 10
    assert torch.equal(fp_round(x, "E8M7"), x.bfloat16().float())
    assert torch.equal(fp_round(x, "E5M10"), x.half().float())


@pytest.mark.parametrize(
    "name, attr", [("E2M1", "float4_e2m1fn"), ("E2M3", "float6_e2m3fn"), ("E3M2", "float6_e3m2fn")]
)
def test_matches_ml_dtypes_fp4_fp6(name, attr):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    import numpy as np

    fmt = FPFormat.parse(name)
    x = (torch.randn(20000, generator=torch.Generator().manual_seed(3)) * fmt.max_value / 3).clamp(
        -fmt.max_value, fmt.max_value
    )
    ref = x.numpy().astype(getattr(ml_dtypes, attr)).astype(np.float32)
    assert np.array_equal(fp_round(x, fmt).numpy(), ref)


# ---- block scaling -------------------------------------------------------------------------------------------------


def test_block_scaling_is_per_block_absmax():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 96, generator=g) * torch.tensor([0.01, 1.0, 100.0]).repeat_interleave(32)  # (3, 96)
    q = fp_quantize(x, "E2M1", 32)
    for j in range(3):
        blk, qb = x[:, 32 * j : 32 * (j + 1)], q[:, 32 * j : 32 * (j + 1)]
        s = blk.abs().amax(1, keepdim=True) / 6.0
        assert torch.allclose(qb, fp_round(blk / s, "E2M1") * s)
        assert torch.allclose(qb.abs().amax(1), blk.abs().amax(1))  # the absmax element maps to max_value exactly
    # blocks are independent: changing one block leaves the others' quantization unchanged
    y = x.clone()
    y[:, :32] *= 50
    assert torch.equal(fp_quantize(y, "E2M1", 32)[:, 32:], q[:, 32:])


def test_granularities_and_axis():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(8, 40, generator=g)
    assert torch.equal(fp_quantize(x, "E2M1", "channel"), fp_quantize(x, "E2M1", 40))
    s = x.abs().max() / 6.0
    assert torch.allclose(fp_quantize(x, "E2M1", "tensor"), fp_round(x / s, "E2M1") * s)
    # a trailing partial block (40 = 32 + 8) is quantized as its own block
    parts = torch.cat([fp_quantize(x[:, :32], "E2M1", "channel"), fp_quantize(x[:, 32:], "E2M1", "channel")], 1)
    assert torch.equal(fp_quantize(x, "E2M1", 32), parts)
    assert torch.equal(fp_quantize(x, "E2M1", 8, axis=0), fp_quantize(x.T, "E2M1", 8).T)
    assert torch.equal(fp_quantize(torch.zeros(4, 32), "E2M1", 32), torch.zeros(4, 32))  # zero blocks stay zero
    with pytest.raises(ValueError, match="block_size"):
        fp_quantize(x, "E2M1", 0)


def test_e8m0_scales_are_powers_of_two():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(6))
    q = fp_quantize(x, "E4M3", 32, scale_dtype="e8m0")
    amax = x.reshape(4, 2, 32).abs().amax(-1, keepdim=True)
    s = 2.0 ** (torch.floor(torch.log2(amax)) - 8)  # OCP MX: floor(log2 amax) - emax(E4M3) = - 8
    assert torch.equal(q, (fp_round(x.reshape(4, 2, 32) / s, "E4M3") * s).reshape(4, 64))


def test_fewer_bits_larger_error():
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(7))
    err = {f: float(((fp_quantize(x, f, 32) - x) ** 2).mean()) for f in ("E2M1", "E3M2", "E4M3", "E5M10")}
    assert err["E2M1"] > err["E3M2"] > err["E4M3"] > err["E5M10"]
    per_tensor, per_block = (float(((fp_quantize(x, "E2M1", b) - x) ** 2).mean()) for b in ("tensor", 16))
    assert per_tensor > per_block


# ---- STE and the quantized linear ----------------------------------------------------------------------------------


def _linear(seed=0, bias=True):
    torch.manual_seed(seed)
    return nn.Linear(64, 48, bias=bias)


def test_fpquantlinear_forward_and_ste_gradients():
    lin = _linear()
    layer = FPQuantLinear(lin, "E2M1", 32, targets=("x", "w"))
    x = torch.randn(2, 5, 64, requires_grad=True)
    y = layer(x)
    qx, qw = fp_quantize(x.detach(), "E2M1", 32), fp_quantize(lin.weight.detach(), "E2M1", 32)
    assert torch.allclose(y, F.linear(qx, qw, lin.bias), atol=1e-6)
    dy = torch.randn_like(y)
    y.backward(dy)
    # straight-through: d/dx is the gradient w.r.t. the quantized input, d/dW w.r.t. the quantized weight copy
    assert torch.allclose(x.grad, dy @ qw, atol=1e-5)
    assert torch.allclose(lin.weight.grad, dy.reshape(-1, 48).T @ qx.reshape(-1, 64), atol=1e-4)
    assert torch.allclose(lin.bias.grad, dy.sum((0, 1)), atol=1e-5)
    assert x.grad.abs().sum() > 0 and lin.weight.grad.abs().sum() > 0  # the rounding does not kill gradients


def test_grad_out_target_quantizes_the_output_gradient():
    lin = _linear(1, bias=False)
    layer = FPQuantLinear(lin, "E4M3", 16, targets=("x", "w", "grad_out"), grad_fmt="E5M2")
    x = torch.randn(3, 64, requires_grad=True)
    y = layer(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    qdy = fp_quantize(dy, "E5M2", 16)
    qx, qw = fp_quantize(x.detach(), "E4M3", 16), fp_quantize(lin.weight.detach(), "E4M3", 16)
    assert not torch.equal(qdy, dy)
    assert torch.allclose(x.grad, qdy @ qw, atol=1e-5)
    assert torch.allclose(lin.weight.grad, qdy.T @ qx, atol=1e-4)


def test_master_weights_stay_full_precision():
    lin = _linear(2)
    before = lin.weight.detach().clone()
    layer = FPQuantLinear(lin, "E2M1", 32)
    layer(torch.randn(4, 64)).sum().backward()
    assert torch.equal(lin.weight.detach(), before)  # forward never writes the quantized copy back
    assert layer.weight is lin.weight


def test_quantize_linears_on_tiny_llama(tiny_llama):
    model = copy.deepcopy(tiny_llama)
    ids = torch.randint(4, 200, (2, 12), generator=torch.Generator().manual_seed(0))
    ref = tiny_llama(input_ids=ids).logits
    swapped = quantize_linears(model, "E8M23", None, ("x", "w"))  # a plain cast to fp32's own layout: identity
    assert len(swapped) == 7 * tiny_llama.config.num_hidden_layers and not any("lm_head" in s for s in swapped)
    assert isinstance(model.lm_head, nn.Linear) and not isinstance(model.lm_head, FPQuantLinear)
    assert torch.equal(model(input_ids=ids).logits, ref)
    low = copy.deepcopy(tiny_llama)
    quantize_linears(low, "E2M1", 32)
    out = low(input_ids=ids).logits
    assert out.shape == ref.shape and not torch.allclose(out, ref)
    out.sum().backward()
    assert all(p.grad is not None for n, p in low.named_parameters() if "proj" in n)


def test_bad_layer_arguments():
    with pytest.raises(ValueError, match="targets"):
        FPQuantLinear(_linear(), "E2M1", 32, targets=("y",))
    with pytest.raises(ValueError, match="scale_dtype"):
        FPQuantLinear(_linear(), "E2M1", 32, scale_dtype="fp8")


# ---- the law -------------------------------------------------------------------------------------------------------


def test_critical_data_size_matches_hand_calculation_and_is_a_minimum():
    c = PAPER_CONSTANTS
    N, E, M, B = 1e6, 2, 1, 128
    hand = (c["d"] * c["gamma"] * N ** c["alpha"] * 2.5 ** c["delta"] * 1.5 ** c["nu"] / 7) ** (1 / (2 * c["beta"]))
    d_crit = critical_data_size(N, E, M, B)
    assert d_crit == pytest.approx(hand, rel=1e-12)
    assert d_crit == pytest.approx(7.7e10, rel=0.02)  # the area spec's derived number
    lo, mid, hi = (unified_loss(N, d, E, M, B) for d in (d_crit / 1.5, d_crit, d_crit * 1.5))
    assert mid < lo and mid < hi  # past D_crit more data raises the loss
    assert critical_data_size(1e9, E, M, B) > d_crit  # bigger models tolerate more data
    assert critical_data_size(N, 4, 3, B) > d_crit  # and so do more bits


def test_unified_loss_terms():
    c = PAPER_CONSTANTS
    N, D = 3e8, 5e10
    base = c["n"] / N ** c["alpha"] + c["d"] / D ** c["beta"] + c["epsilon"]
    assert unified_loss(N, D, 4, 3, 1) == pytest.approx(base)  # B = 1: log2 B = 0, no penalty
    assert precision_term(N, D, 2, 1, 256) == pytest.approx(2 * precision_term(N, D, 2, 1, 16))  # linear in log2 B
    assert precision_term(N, D, 3, 2, 32) < precision_term(N, D, 2, 3, 32)  # delta > nu: an exponent bit is worth more
    assert precision_term(N, D, 2, 1, 32) > precision_term(N, D, 4, 3, 32) > 0  # fewer bits, larger penalty


@pytest.mark.parametrize("P, split", [(4, (2, 1)), (5, (2, 2)), (6, (3, 2)), (7, (3, 3)), (8, (4, 3)), (16, (8, 7))])
def test_optimal_split(P, split):
    assert optimal_split(P) == split


def test_optimal_precision_is_low_bit_and_grows_with_compute():
    small, large = optimal_precision(1e19), optimal_precision(1e25)
    assert 4 <= small["P"] <= 8 and 4 <= large["P"] <= 8
    assert large["P"] >= small["P"] and large["N"] > small["N"]


def test_fit_recovers_known_constants():
    E, M, lb = [], [], []
    for e, m in [(1, 2), (2, 1), (3, 0), (1, 4), (2, 3), (3, 2), (4, 1), (4, 3), (2, 2)]:
        for b in (4.0, 5.0, 8.0):
            E.append(e)
            M.append(m)
            lb.append(b)
    gp, delta, nu, kappa = 40.0, 3.16, 2.91, 1.3
    dl = [b**kappa / (gp * (e + 0.5) ** delta * (m + 0.5) ** nu) for e, m, b in zip(E, M, lb)]
    fit = fit_precision_term(E, M, lb, dl)
    assert fit.delta == pytest.approx(delta, abs=1e-8) and fit.nu == pytest.approx(nu, abs=1e-8)
    assert fit.kappa == pytest.approx(kappa, abs=1e-8) and fit.gamma_prime == pytest.approx(gp, rel=1e-8)
    assert fit.r2 == pytest.approx(1.0) and all(p == pytest.approx(d) for p, d in zip(fit.loo_predictions, dl))
    # kappa fixed at the paper's 1 when the data follow it
    dl1 = [b / (gp * (e + 0.5) ** delta * (m + 0.5) ** nu) for e, m, b in zip(E, M, lb)]
    fit1 = fit_precision_term(E, M, lb, dl1, fit_kappa=False)
    assert fit1.kappa == 1.0 and fit1.delta == pytest.approx(delta) and fit1.gamma_prime == pytest.approx(gp)
    # the paper's gamma from gamma' at a given N, D
    assert fit1.paper_gamma(1e6, 1e9) == pytest.approx(
        gp * 1e9 ** PAPER_CONSTANTS["beta"] / 1e6 ** PAPER_CONSTANTS["alpha"]
    )
    # with 1% multiplicative noise the exponents are still close
    noise = torch.empty(len(dl)).uniform_(-0.01, 0.01, generator=torch.Generator().manual_seed(0))
    fit_n = fit_precision_term(E, M, lb, [d * math.exp(float(z)) for d, z in zip(dl, noise)])
    assert abs(fit_n.delta - delta) < 0.1 and abs(fit_n.nu - nu) < 0.1 and abs(fit_n.kappa - kappa) < 0.1


def test_free_offset_fit_recovers_known_constants():
    E, M, lb = (
        [1, 2, 3, 1, 2, 3, 4, 4, 2, 2, 2, 2],
        [2, 1, 0, 4, 3, 2, 1, 3, 1, 1, 1, 1],
        [5.0] * 8 + [4, 6, 6.6, 15.6],
    )
    loss = [2.3 + b / (0.2 * (e + 0.5) ** 3.16 * (m + 0.5) ** 2.91) for e, m, b in zip(E, M, lb)]
    fit, l0 = fit_precision_term_free_offset(E, M, lb, loss)
    assert l0 == pytest.approx(2.3, abs=1e-6) and fit.delta == pytest.approx(3.16, abs=1e-4)
    assert fit.nu == pytest.approx(2.91, abs=1e-4) and fit.kappa == pytest.approx(1.0, abs=1e-4)


def test_fit_rejects_non_positive_gaps():
    with pytest.raises(ValueError, match="delta_loss"):
        fit_precision_term([1, 2, 3, 4], [2, 1, 0, 3], [5, 5, 5, 5], [0.1, -0.01, 0.2, 0.05])


# ---- config --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"formats": ["E2X1"]}, "formats"),
        ({"formats": []}, "formats"),
        ({"block_size": 1}, "block_size"),
        ({"block_sizes": ["row"]}, "block_sizes"),
        ({"targets": ["x", "y"]}, "targets"),
        ({"model": "smollm2-135m"}, "tiny-llama"),
        ({"lr": 0.0}, "lr"),
        ({"hidden": 30}, "hidden"),
    ],
)
def test_config_errors_name_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        FPQuantScalingConfig(**kw)
