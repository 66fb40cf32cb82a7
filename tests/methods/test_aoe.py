"""Invariants of Autonomy-of-Experts: the layers on synthetic tensors, the post-hoc FFN split on the tiny llama."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from lmlab.methods.efficiency.aoe import (
    AoEMoE,
    RouterMoE,
    aoe_d_wide_for_params,
    balance_stats,
    dense_mixture,
    fit_router,
    install_ffn,
    load_balancing_loss,
    moefy,
    set_rule,
    svd_low_rank_down,
    total_aux_loss,
    unmoefy,
)
from lmlab.methods.efficiency.aoe.config import AoEConfig
from lmlab.methods.efficiency.aoe.method import MoEfiedFFN, selection_macs

D, E, R, W = 24, 6, 4, 20


def _aoe(k: int, seed: int = 0, **kw) -> AoEMoE:
    torch.manual_seed(seed)
    layer = AoEMoE(D, E, k, R, W, **kw)
    with torch.no_grad():  # larger weights than the 0.02 init so that norms differ clearly between experts
        for p in layer.parameters():
            p.mul_(20)
    return layer


def _x(n: int = 40, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, D, generator=torch.Generator().manual_seed(seed))


def _reference_lb_loss(logits, num_experts, top_k=2):
    # verbatim logic of `load_balancing_loss_func` in the official moe.py
    routing_weights = torch.nn.functional.softmax(logits, dim=-1)
    _, selected_experts = torch.topk(routing_weights, top_k, dim=-1)
    expert_mask = torch.nn.functional.one_hot(selected_experts, num_experts)
    tokens_per_expert = torch.mean(expert_mask.float(), dim=0)
    router_prob_per_expert = torch.mean(routing_weights, dim=0)
    return torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0)) * num_experts


@pytest.mark.parametrize("renormalize", [True, False])
def test_aoe_with_all_experts_equals_the_dense_mixture(renormalize):
    layer = _aoe(E, renormalize=renormalize)
    x = _x()
    want = dense_mixture(layer, x)  # sum_e softmax(||x W_down^e||)_e * expert_e(x)
    assert torch.allclose(layer(x), want, atol=1e-5, rtol=1e-4)


def test_router_moe_with_all_experts_equals_the_dense_mixture():
    torch.manual_seed(0)
    layer = RouterMoE(D, E, E, W)
    x = _x()
    assert torch.allclose(layer(x), dense_mixture(layer, x), atol=1e-6, rtol=1e-4)


def test_top_k_output_is_the_gated_sum_of_the_selected_experts():
    layer = _aoe(2)
    layer.record = True
    x = _x()
    y = layer(x)
    norms = torch.stack([(x @ layer.w_down[:, e * R : (e + 1) * R]).norm(dim=-1) for e in range(E)], dim=1)
    probs = F.softmax(norms, dim=-1)
    top, idx = torch.topk(probs, 2, dim=-1)
    gates = top / top.sum(-1, keepdim=True)
    outs = torch.stack([layer.expert_output(e, x) for e in range(E)], dim=1)  # (T, E, d)
    want = (outs.gather(1, idx[..., None].expand(-1, -1, D)) * gates[..., None]).sum(1)
    assert torch.allclose(y, want, atol=1e-5, rtol=1e-4)
    assert torch.equal(layer.last.selected, idx)
    assert torch.allclose(layer.last.logits, norms, atol=1e-5)


def test_norm_ranking_picks_the_expert_with_the_largest_low_rank_norm():
    layer = _aoe(1)
    j = 3
    with torch.no_grad():
        layer.w_down[:, j * R : (j + 1) * R] *= 50  # expert j's low-rank pre-activation dwarfs the others'
    layer.record = True
    layer(_x())
    assert (layer.last.selected[:, 0] == j).all()
    # and in general the selection is the arg-top-k of ||x W_down^e||, not of anything else
    layer2 = _aoe(2, seed=5)
    layer2.record = True
    x = _x(seed=7)
    layer2(x)
    norms = torch.stack([(x @ layer2.w_down[:, e * R : (e + 1) * R]).norm(dim=-1) for e in range(E)], dim=1)
    assert torch.equal(layer2.last.selected.sort(-1).values, norms.topk(2, dim=-1).indices.sort(-1).values)


def test_shapes_and_aux_loss():
    layer = _aoe(2)
    layer.record = True
    x = torch.randn(3, 5, D)
    y = layer(x)
    assert y.shape == x.shape
    assert layer.aux_loss.shape == () and layer.aux_loss.item() >= 1.0 - 1e-6  # E sum f P >= 1 (Cauchy-Schwarz)
    assert layer.last.selected.shape == (15, 2) and layer.last.weights.shape == (15, 2)
    assert torch.allclose(layer.last.weights.sum(-1), torch.ones(15))
    assert layer._acts is None  # the cached activations are released after the forward


def test_load_balancing_loss_matches_the_official_function():
    logits = torch.randn(50, E, generator=torch.Generator().manual_seed(3))
    for k in (1, 2, 3):
        assert torch.allclose(load_balancing_loss(logits, E, k), _reference_lb_loss(logits, E, k))


def test_gradients_reach_the_right_parameters():
    layer = _aoe(1)
    j = 2
    with torch.no_grad():
        layer.w_down[:, j * R : (j + 1) * R] = 0.0  # expert j's norm is 0: never in the top-1
    x = _x()
    (layer(x).pow(2).sum() + total_aux_loss(torch.nn.Sequential(layer))).backward()
    assert layer.w_down.grad.abs().sum() > 0  # through the gate weights and the re-used activations
    for w in (layer.w_up, layer.w_p, layer.w_o):
        assert w.grad[j].abs().sum() == 0  # an aborted expert gets no gradient
        assert w.grad.abs().sum() > 0
    torch.manual_seed(0)
    moe = RouterMoE(D, E, 2, W)
    (moe(x).pow(2).sum() + moe.aux_loss).backward()
    assert moe.router.grad.abs().sum() > 0


def test_aux_loss_gets_gradient_into_the_norms():
    layer = _aoe(2)
    layer(_x())
    layer.aux_loss.backward()
    assert layer.w_down.grad.abs().sum() > 0  # AoE balances through the softmax of its own norms


@pytest.mark.parametrize("d,e,h,r", [(96, 8, 128, 16), (64, 8, 128, 32), (576, 8, 192, 128), (32, 4, 16, 4)])
def test_d_wide_matches_total_parameters(d, e, h, r):
    dw = aoe_d_wide_for_params(d, e, h, r)
    aoe = sum(p.numel() for p in AoEMoE(d, e, 2, r, dw).parameters())
    moe = sum(p.numel() for p in RouterMoE(d, e, 2, h).parameters())
    assert abs(aoe - moe) <= e * (r + 2 * d) / 2
    assert dw > h  # the removed router and the factorised gate are paid back in width


def test_install_ffn_trains_inside_a_llama(tiny_llama):
    model = copy.deepcopy(tiny_llama)
    d = model.config.hidden_size
    install_ffn(model, lambda i: AoEMoE(d, 4, 2, 8, 40))
    ids = torch.randint(4, 200, (2, 12), generator=torch.Generator().manual_seed(0))
    before = [p.detach().clone() for p in model.model.layers[0].mlp.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    out = model(input_ids=ids, labels=ids)
    (out.loss + 0.01 * total_aux_loss(model)).backward()
    opt.step()
    assert out.logits.shape == (2, 12, model.config.vocab_size)
    assert all(not torch.equal(a, b) for a, b in zip(before, model.model.layers[0].mlp.parameters()))


def test_balance_stats_closed_forms():
    uniform = torch.arange(16).remainder(4).view(16, 1)
    s = balance_stats(uniform, torch.zeros(16, 4), 4)
    assert s["load_cv"] == pytest.approx(0.0) and s["max_load"] == pytest.approx(1.0)
    assert s["load_entropy"] == pytest.approx(1.0)
    assert s["routing_entropy"] == pytest.approx(torch.log(torch.tensor(4.0)).item(), rel=1e-5)
    collapsed = balance_stats(torch.zeros(16, 1, dtype=torch.long), torch.zeros(16, 4), 4)
    assert collapsed["max_load"] == pytest.approx(4.0) and collapsed["load_entropy"] == pytest.approx(0.0)


# ---------------------------------------------------------------------------------------------------------------
# post-hoc split of a pretrained FFN (tiny llama: d 64, d_ff 128)
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture()
def llama(tiny_llama):
    return copy.deepcopy(tiny_llama)


def _ids():
    return torch.randint(4, 250, (2, 10), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("rule", ["oracle", "gate_norm", "aoe_lowrank", "router", "random", "dense"])
def test_split_with_all_groups_equals_the_unsplit_ffn(llama, rule):
    ids = _ids()
    with torch.no_grad():
        want = llama(input_ids=ids).logits
        wrappers = moefy(llama, 8, 8, d_low=4)
        set_rule(wrappers, rule)
        got = llama(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5)
    unmoefy(llama)
    assert not any(isinstance(layer.mlp, MoEfiedFFN) for layer in llama.model.layers)


def test_split_keeps_only_the_selected_groups(llama):
    mlp = llama.model.layers[0].mlp
    wrap = MoEfiedFFN(mlp, 4, 2, d_low=4)
    wrap.rule = "aoe_lowrank"
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = wrap(x)
        scores = torch.stack([(x @ wrap.w_down[:, e * 4 : (e + 1) * 4]).norm(dim=-1) for e in range(4)], 1)
        top = scores.topk(2, dim=-1).indices
        want = torch.zeros_like(got)
        for t in range(7):
            for e in top[t].tolist():
                sl = slice(e * 32, (e + 1) * 32)
                h = F.silu(x[t] @ mlp.gate_proj.weight[sl].T) * (x[t] @ mlp.up_proj.weight[sl].T)
                want[t] += h @ mlp.down_proj.weight[:, sl].T
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-3)


def test_full_rank_low_rank_norm_equals_the_gate_norm(llama):
    mlp = llama.model.layers[1].mlp
    w_g = mlp.gate_proj.weight.detach().T[:, :32]  # (d, width) of the first group
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(4))
    full = svd_low_rank_down(w_g, 32)
    assert torch.allclose((x @ full).norm(dim=-1), (x @ w_g).norm(dim=-1), atol=1e-4)
    # rank r: the norm of the best rank-r gate pre-activation, never above the full one (orthogonal projection)
    low = svd_low_rank_down(w_g, 4)
    assert ((x @ low).norm(dim=-1) <= (x @ w_g).norm(dim=-1) + 1e-5).all()


def test_random_rule_is_reproducible_and_oracle_recall_is_one(llama):
    ids = _ids()
    wrappers = moefy(llama, 8, 2, d_low=4, seed=3)
    with torch.no_grad():
        set_rule(wrappers, "random")
        a = llama(input_ids=ids).logits
        set_rule(wrappers, "random")
        b = llama(input_ids=ids).logits
        assert torch.equal(a, b)
        set_rule(wrappers, "oracle")
        for w in wrappers:
            w.reset_stats()
            w.record = True
        llama(input_ids=ids)
    assert all(w.oracle_recall == pytest.approx(1.0) for w in wrappers)
    assert all(w.load_counts.sum() == 2 * 20 for w in wrappers)


def test_fitted_router_beats_random_on_its_fitting_data(llama):
    wrap = MoEfiedFFN(llama.model.layers[0].mlp, 8, 2, d_low=4)
    x = torch.randn(400, 64, generator=torch.Generator().manual_seed(5))
    agreement = fit_router(wrap, x)
    assert 0.0 <= agreement <= 1.0
    recalls = {}
    for rule in ("router", "random"):
        wrap.rule = rule
        wrap.reset_random()
        wrap.reset_stats()
        wrap.record = True
        with torch.no_grad():
            wrap(x)
        recalls[rule] = wrap.oracle_recall
    assert recalls["router"] > recalls["random"] + 0.1


def test_selection_costs_order():
    costs = {r: selection_macs(r, 576, 1536, 8, 32) for r in ("oracle", "gate_norm", "aoe_lowrank", "router")}
    assert costs["oracle"] > costs["gate_norm"] > costs["aoe_lowrank"] > costs["router"] > 0


def test_bad_values_raise_one_line_errors():
    with pytest.raises(ValueError, match="top_k"):
        AoEConfig(top_k=9)
    with pytest.raises(ValueError, match="b_rules"):
        AoEConfig(b_rules=["nope"])
    with pytest.raises(ValueError, match="d_low"):
        AoEConfig(d_low=0)
    with pytest.raises(ValueError, match="top_k"):
        AoEMoE(8, 4, 5, 2, 8)
