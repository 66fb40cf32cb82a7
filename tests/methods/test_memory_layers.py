"""Invariants of the product-key memory layer (Memory+) and its drop-in use inside a Hugging Face llama."""

from __future__ import annotations

import copy

import pytest
import torch

from lmlab.core.inference.tiny import make_tiny_llama
from lmlab.core.training.pretrain import lm_loss, pretrain_lm
from lmlab.methods.efficiency.memory_layers import (
    ProductKeyMemory,
    SwitchMoE,
    add_memory_layers,
    add_moe_layers,
    brute_force_topk,
    memory_param_groups,
    model_costs,
    product_key_topk,
)
from lmlab.methods.efficiency.memory_layers.config import MemoryLayersConfig
from lmlab.methods.efficiency.memory_layers.method import changed_rows, memory_cost, slots_read, solve_moe_experts


def _mem(**kw):
    torch.manual_seed(0)
    args = dict(n_keys=16, heads=2, knn=4, k_dim=8)
    args.update(kw)
    return ProductKeyMemory(12, **args)


@pytest.mark.parametrize("knn", [1, 3, 8, 16])
def test_product_key_topk_equals_brute_force_over_all_keys(knn):
    g = torch.Generator().manual_seed(knn)
    bs, heads, n_keys, half = 7, 3, 16, 5
    q1, q2 = torch.randn(bs, heads, half, generator=g), torch.randn(bs, heads, half, generator=g)
    k1, k2 = torch.randn(heads, n_keys, half, generator=g), torch.randn(heads, n_keys, half, generator=g)
    scores, idx = product_key_topk(q1, q2, k1, k2, knn)
    ref_scores, ref_idx = brute_force_topk(q1, q2, k1, k2, knn)
    assert scores.shape == idx.shape == (bs, heads, knn)
    torch.testing.assert_close(scores, ref_scores)
    assert torch.equal(idx, ref_idx)
    # the index of slot (a, b) is a * n_keys + b and its score is q1.K1[a] + q2.K2[b]
    a, b = idx // n_keys, idx % n_keys
    direct = torch.einsum("bhd,bhkd->bhk", q1, k1[torch.arange(heads)[None, :, None], a]) + torch.einsum(
        "bhd,bhkd->bhk", q2, k2[torch.arange(heads)[None, :, None], b]
    )
    torch.testing.assert_close(direct, scores)


def test_layer_lookup_equals_brute_force_on_its_own_keys():
    mem = _mem(knn=5)
    x = torch.randn(9, 12)
    scores, idx = mem.lookup(x)
    q = mem.query_proj(x).view(9, mem.heads, mem.k_dim)
    keys = mem.keys.view(mem.heads, 2, mem.n_keys, mem.k_dim // 2)
    ref_s, ref_i = brute_force_topk(q[..., :4], q[..., 4:], keys[:, 0], keys[:, 1], 5)
    assert torch.equal(idx, ref_i)
    torch.testing.assert_close(scores, ref_s)


def test_shapes_and_closed_form_output():
    mem = _mem()
    x = torch.randn(2, 3, 12)
    y = mem(x)
    assert y.shape == (2, 3, 12)
    # closed form: per-head softmax over the k scores, heads summed, Memory+ gate and projection
    flat = x.reshape(-1, 12)
    scores, idx = mem.lookup(flat)
    w = torch.softmax(scores, dim=-1)
    v = (w.unsqueeze(-1) * mem.values.weight[idx]).sum(dim=(1, 2))  # (6, v_dim)
    ref = mem.value_proj(v * torch.nn.functional.silu(mem.swilu_projection(flat)))
    torch.testing.assert_close(y.reshape(-1, 12), ref)
    assert mem.size == 256 and mem.values.weight.shape == (256, 12)


def test_plain_pkm_has_no_projection_and_gate_multiplies():
    pkm = _mem(swilu=False)
    assert pkm.value_proj is None and pkm.swilu_projection is None
    x = torch.randn(4, 12)
    s, i = pkm.lookup(x)
    ref = (torch.softmax(s, -1).unsqueeze(-1) * pkm.values.weight[i]).sum(dim=(1, 2))
    torch.testing.assert_close(pkm(x.view(1, 4, 12)).view(4, 12), ref)
    gated = _mem(gated=True)
    ungated = copy.deepcopy(gated)
    ungated.gating = None
    torch.testing.assert_close(
        gated(x.view(1, 4, 12)), torch.sigmoid(gated.gating(x)).view(1, 4, 1) * ungated(x.view(1, 4, 12))
    )


def test_gradient_reaches_only_the_selected_values():
    mem = _mem()
    x = torch.randn(1, 5, 12)
    mem(x).pow(2).sum().backward()
    _, idx = mem.lookup(x.view(-1, 12))
    selected = torch.zeros(mem.size, dtype=torch.bool)
    selected[idx.reshape(-1)] = True
    grad_rows = mem.values.weight.grad.abs().sum(1) > 0
    assert grad_rows.any()
    assert not grad_rows[~selected].any()  # no gradient outside the k slots read per head and token
    assert grad_rows[selected].float().mean() > 0.9
    assert mem.keys.grad is not None and mem.keys.grad.abs().sum() > 0  # keys learn through the softmax weights


def test_value_lr_param_group_and_separate_clipping():
    model = make_tiny_llama(seed=0)
    mems = add_memory_layers(model, [0, 1], n_keys=8, heads=2, knn=2, k_dim=8, value_lr=1e-2, seed=0)
    assert mems[0].values is mems[1].values  # shared table (official mem_share_values)
    groups = memory_param_groups(model)
    value_group = groups[-1]
    assert value_group["lr"] == 1e-2 and value_group["clip_group"] == "pk_values"
    assert value_group["params"] == [mems[0].values.weight]
    others = {id(p) for g in groups[:-1] for p in g["params"]}
    assert id(mems[0].values.weight) not in others
    assert len(others) + 1 == len({id(p) for p in model.parameters()})
    ids = torch.randint(0, 260, (400,), generator=torch.Generator().manual_seed(0))
    res = pretrain_lm(model, ids, steps=3, batch_size=2, seq_len=16, lr=1e-3, warmup=0, param_groups=groups)
    assert [round(lr, 8) for lr in res.lrs[0]] == [1e-3, 1e-3, 1e-2]  # the value group keeps its own base LR
    # an explicit value_lr overrides the layers' own
    assert memory_param_groups(model, value_lr=5e-2)[-1]["lr"] == 5e-2


def test_an_sgd_step_moves_only_value_rows_that_were_read():
    model = make_tiny_llama(seed=0)
    (mem,) = add_memory_layers(model, [1], n_keys=32, heads=2, knn=2, k_dim=8, seed=0)
    before = mem.values.weight.detach().clone()
    ids = torch.randint(0, 260, (200,), generator=torch.Generator().manual_seed(1))
    batch = ids[:9].view(1, 9)
    read = set(slots_read(model, batch[:, :-1])[0].reshape(-1).tolist())  # the slots this batch reads
    model.train()
    loss = lm_loss(model, batch)
    loss.backward()
    opt = torch.optim.SGD(memory_param_groups(model), lr=0.1)  # plain SGD: a row moves only with gradient
    opt.step()
    moved = set(changed_rows(before, mem.values.weight.detach()).tolist())
    assert moved and moved <= read  # SGD moved exactly rows that were read (at most tokens x heads x knn)
    assert len(moved) <= 8 * 2 * 2


def test_drop_in_replacement_keeps_the_llama_forward_working():
    base = make_tiny_llama(seed=0)
    model = copy.deepcopy(base)
    add_memory_layers(model, [1], n_keys=8, heads=2, knn=4, k_dim=8, seed=0)
    x = torch.randint(0, 260, (2, 11))
    out = model(input_ids=x)
    assert out.logits.shape == (2, 11, 260) and torch.isfinite(out.logits).all()
    # layer 0 is untouched: its output equals the original model's
    with torch.no_grad():
        a = base(input_ids=x, output_hidden_states=True).hidden_states[1]
        b = model(input_ids=x, output_hidden_states=True).hidden_states[1]
    torch.testing.assert_close(a, b)
    # generate() with a KV cache runs through the memory layer too
    gen = model.generate(x[:1, :4], max_new_tokens=3, do_sample=False)
    assert gen.shape == (1, 7)
    # the memory only sees the current token: with a cache, logits equal the uncached forward's
    with torch.no_grad():
        full = model(input_ids=x[:1]).logits[0, -1]
        past = model(input_ids=x[:1, :-1], use_cache=True).past_key_values
        step = model(input_ids=x[:1, -1:], cache=past).logits[0, -1]
    torch.testing.assert_close(full, step, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="memory layers must be indices"):
        add_memory_layers(copy.deepcopy(base), [5])


def test_query_batchnorm_option_and_bad_arguments():
    mem = _mem(query_batchnorm=True)
    assert isinstance(mem.query_bn, torch.nn.BatchNorm1d)
    mem.train()
    assert mem(torch.randn(2, 4, 12)).shape == (2, 4, 12)
    with pytest.raises(ValueError, match="k_dim must be an even"):
        ProductKeyMemory(8, n_keys=8, k_dim=7)
    with pytest.raises(ValueError, match="knn must be in"):
        ProductKeyMemory(8, n_keys=4, knn=5)


def test_moe_top1_routes_each_token_to_one_expert_and_matches_dense_with_one_expert():
    torch.manual_seed(0)
    moe = SwitchMoE(12, 24, n_experts=4, top_k=1)
    x = torch.randn(2, 5, 12)
    y = moe(x)
    assert y.shape == x.shape and moe.last_load.sum().item() == pytest.approx(1.0)
    probs = torch.softmax(moe.router(x.reshape(-1, 12)), -1)
    f = torch.bincount(probs.argmax(-1), minlength=4).float() / 10
    assert moe.aux_loss.item() == pytest.approx(4 * float((f * probs.mean(0)).sum()), rel=1e-5)  # Switch: E sum f P
    # top_k = n_experts, renormalised: the full softmax mixture of every expert
    moe_all = SwitchMoE(12, 24, n_experts=3, top_k=3)
    flat = x.reshape(-1, 12)
    p = torch.softmax(moe_all.router(flat), -1)
    ref = sum(
        p[:, e : e + 1]
        * ((torch.nn.functional.silu(flat @ moe_all.w_gate[e]) * (flat @ moe_all.w_up[e])) @ moe_all.w_down[e])
        for e in range(3)
    )
    torch.testing.assert_close(moe_all(x).reshape(-1, 12), ref, atol=1e-5, rtol=1e-5)


def test_parameter_and_flop_accounting():
    from lmlab.methods.efficiency.memory_layers.method import build_llama, tiny_llama_config

    cfg = tiny_llama_config(100, hidden=16, n_layers=2, d_ff=32, heads=2, max_len=64)
    dense = build_llama(cfg, 0)
    mem = build_llama(cfg, 0)
    (m,) = add_memory_layers(mem, [1], n_keys=8, heads=2, knn=2, k_dim=8)
    c_dense, c_mem = model_costs(dense, 16), model_costs(mem, 16)
    assert c_dense["params"] == sum(p.numel() for p in dense.parameters())
    assert c_mem["params"] == sum(p.numel() for p in {id(p): p for p in mem.parameters()}.values())
    assert c_mem["memory_value_params"] == 64 * 16
    # FLOPs differ only by the FFN -> memory swap
    assert c_mem["flops_per_token"] - c_dense["flops_per_token"] == pytest.approx(
        2 * (memory_cost(m).macs - 3 * 16 * 32)
    )
    moe = build_llama(cfg, 0)
    add_moe_layers(
        moe, [1], n_experts=solve_moe_experts(c_mem["params"] - c_dense["params"] + 3 * 16 * 32, 16, 32), d_ff=32
    )
    c_moe = model_costs(moe, 16)
    assert abs(c_moe["params"] - c_mem["params"]) <= 3 * 16 * 32  # within one expert
    assert c_moe["flops_per_token"] == pytest.approx(
        c_dense["flops_per_token"] + 2 * 16 * moe.model.layers[1].mlp.n_experts
    )


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("knn", 0, "knn must be in"),
        ("k_dim", 7, "k_dim must be even"),
        ("systems", ["dense", "foo"], "systems entries must be one of"),
        ("systems", ["dense"], "must include 'memory' and 'dense'"),
        ("memory_layers", [9], r"memory_layers entries must be ints in \[0, 3\]"),
        ("value_lr", 0.0, "value_lr must be in"),
        ("moe_experts", 1, "moe_experts must be 0"),
    ],
)
def test_bad_config_values_name_the_field(field, value, match):
    with pytest.raises(ValueError, match=match):
        MemoryLayersConfig(**{field: value})


def test_pretrain_lm_clips_the_value_table_apart(monkeypatch):
    model = make_tiny_llama(seed=0)
    (mem,) = add_memory_layers(model, [1], n_keys=8, heads=2, knn=2, k_dim=8, seed=0)
    calls = []
    real = torch.nn.utils.clip_grad_norm_

    def spy(params, max_norm, *a, **kw):
        params = list(params)
        calls.append([id(p) for p in params])
        return real(params, max_norm, *a, **kw)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", spy)
    ids = torch.randint(0, 260, (200,), generator=torch.Generator().manual_seed(0))
    pretrain_lm(model, ids, steps=1, batch_size=2, seq_len=8, param_groups=memory_param_groups(model))
    assert len(calls) == 2  # official train.py: values and the rest clipped separately
    assert [id(mem.values.weight)] in calls
    pretrain_lm(model, ids, steps=1, batch_size=2, seq_len=8)  # default groups: one joint clip, as before
    assert len(calls) == 3
