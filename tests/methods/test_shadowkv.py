"""ShadowKV invariants on the tiny llama and on synthetic tensors (exactness, SVD, selection, budget accounting)."""

from __future__ import annotations

import math

import pytest
import torch

from lmlab.core.attention import (
    chunk_positions,
    group_scores,
    rope_at,
    rotary_tables,
    sdpa_gqa,
    sink_recent_positions,
    tensor_bytes,
    unrope_at,
    use_controller,
)
from lmlab.methods.efficiency.shadowkv.baselines import FullKV, KeyCollector, Loki, Quest, StreamingLLM, loki_basis
from lmlab.methods.efficiency.shadowkv.config import ShadowKVConfig
from lmlab.methods.efficiency.shadowkv.method import (
    KVSelectionController,
    ShadowKV,
    energy_rank,
    fidelity,
    landmarks_and_outliers,
    low_rank_keys,
    prefill,
    rebuild_keys,
    rewind,
    teacher_forced_logprobs,
)

WIDTH = 32  # tiny llama: 2 kv heads x head_dim 16


@pytest.fixture(scope="module")
def ids():
    g = torch.Generator().manual_seed(0)
    return torch.randint(3, 250, (2, 180), generator=g)


def _dense_logprobs(model, ids, n, steps):
    with torch.no_grad():
        return torch.log_softmax(model(ids).logits[:, n : n + steps].float(), -1)


def test_full_budget_full_rank_equals_dense(tiny_llama, ids):
    n, steps = 150, 8
    sels = {"shadowkv": ShadowKV(1024, WIDTH, outlier_chunks=3), "full_sel": FullKV()}
    ctrl = KVSelectionController(sels)
    before = tiny_llama.config._attn_implementation
    with use_controller(tiny_llama, ctrl):
        cache, _ = prefill(tiny_llama, ids[:, :n])
        out = {}
        for name in ["full", *sels]:
            ctrl.active = name
            out[name] = teacher_forced_logprobs(tiny_llama, cache, ids, n, steps)
    assert tiny_llama.config._attn_implementation == before  # restored on exit
    ref = _dense_logprobs(tiny_llama, ids, n, steps)
    for name, lp in out.items():
        torch.testing.assert_close(lp, ref, atol=1e-3, rtol=0, msg=lambda m, name=name: f"{name}: {m}")
    # every prefill token was attended: local + outliers + all landmark chunks
    assert set(ctrl.attended["shadowkv"]) == {n}
    f = fidelity(ref, out["shadowkv"], ids[:, n + 1 : n + steps + 1])
    assert f["kl"].max() < 1e-5 and f["top1_agreement"].min() == 1.0 and f["delta_nll"].abs().max() < 1e-3


def test_multi_token_query_and_generate_match_dense(tiny_llama, ids):
    """A follow-up query of several tokens (one selection for all of them) and HF generate, at full budget/rank."""
    n = 120
    ctrl = KVSelectionController({"shadowkv": ShadowKV(1024, WIDTH, outlier_chunks=2)}, active="shadowkv")
    with torch.no_grad(), use_controller(tiny_llama, ctrl):
        cache, _ = prefill(tiny_llama, ids[:1, :n])
        multi = tiny_llama(input_ids=ids[:1, n : n + 6], cache=cache, use_cache=True).logits
        rewind(cache, n)
        gen = tiny_llama.generate(input_ids=ids[:1, : n + 1], cache=cache, max_new_tokens=5, do_sample=False)
    with torch.no_grad():
        dense = tiny_llama(ids[:1, : n + 6]).logits[:, n:]
        ref_gen = tiny_llama.generate(input_ids=ids[:1, : n + 1], max_new_tokens=5, do_sample=False)
    torch.testing.assert_close(multi, dense, atol=1e-3, rtol=0)
    assert torch.equal(gen, ref_gen)


def test_svd_full_rank_is_exact_and_truncation_error_is_the_tail_energy():
    g = torch.Generator().manual_seed(1)
    b, n, h, d = 2, 64, 2, 8
    k_pre = torch.randn(b, n, h * d, generator=g)
    U, SV, s = low_rank_keys(k_pre, h * d, h)
    assert U.shape == (b, n, h * d) and SV.shape == (b, h, h * d, d) and s.shape == (b, h * d)
    per_head = k_pre.view(b, n, h, d).transpose(1, 2)  # (B, H, n, d)
    torch.testing.assert_close(torch.matmul(U.unsqueeze(1), SV), per_head, atol=1e-4, rtol=0)
    r = 5
    U, SV, s = low_rank_keys(k_pre, r, h)
    approx = torch.matmul(U.unsqueeze(1), SV).transpose(1, 2).reshape(b, n, h * d)
    err = (approx - k_pre).pow(2).sum(dim=(1, 2))
    torch.testing.assert_close(err, s[:, r:].pow(2).sum(-1), rtol=1e-3, atol=1e-3)  # Eckart-Young


def test_rebuild_reapplies_rope_at_the_original_positions(tiny_llama):
    cos, sin = rotary_tables(tiny_llama, 256)
    g = torch.Generator().manual_seed(2)
    b, n, h, d = 1, 96, 2, 16
    k_pre = torch.randn(b, n, h * d, generator=g)
    post = rope_at(k_pre.view(b, n, h, d).transpose(1, 2), cos, sin, torch.arange(n))
    U, SV, _ = low_rank_keys(k_pre, h * d, h)
    pos = torch.tensor([[[3, 50, 90], [0, 7, 95]]])  # (B, H, S): different positions per kv head
    got = rebuild_keys(U, SV, pos, cos, sin)
    want = torch.stack([post[0, hh, pos[0, hh]] for hh in range(h)]).unsqueeze(0)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    torch.testing.assert_close(unrope_at(post, cos, sin, torch.arange(n)), k_pre.view(b, n, h, d).transpose(1, 2))
    # same numbers as transformers' own RoPE
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    x = k_pre.view(b, n, h, d).transpose(1, 2)
    _, hf = apply_rotary_pos_emb(x, x, cos[:n].unsqueeze(0), sin[:n].unsqueeze(0))
    torch.testing.assert_close(post, hf)


def test_landmarks_are_chunk_means_and_a_planted_outlier_chunk_is_found():
    g = torch.Generator().manual_seed(3)
    b, h, c, cs, d = 1, 2, 10, 8, 16
    base = torch.randn(b, h, c, 1, d, generator=g)
    k = (base + 0.05 * torch.randn(b, h, c, cs, d, generator=g)).reshape(b, h, c * cs, d)
    k[0, 0, 4 * cs + 3] = -5 * base[0, 0, 4, 0]  # one key pointing away from its chunk: chunk 4 of head 0
    k[0, 1, 7 * cs] = -5 * base[0, 1, 7, 0]
    landmarks, idx, outliers, cos_min = landmarks_and_outliers(k, cs, 1)
    assert landmarks.shape == (b, h, c - 1, d) and idx.shape == (b, h, c - 1) and outliers.shape == (b, h, 1)
    assert outliers[0, 0].tolist() == [4] and outliers[0, 1].tolist() == [7]
    assert 4 not in idx[0, 0].tolist() and idx[0, 0].tolist() == sorted(idx[0, 0].tolist())
    means = k.view(b, h, c, cs, d).mean(-2)
    torch.testing.assert_close(landmarks[0, 0], means[0, 0, idx[0, 0]])
    assert cos_min.shape == (b, h, c) and cos_min[0, 0, 4] < cos_min[0, 0].median()


def test_selection_follows_the_query_per_kv_head_with_gqa_max():
    """The query heads of one kv group share one chunk set: the max over the group decides (reference rule)."""
    b, h, g, d, cs = 1, 2, 2, 16, 8
    n = 20 * cs + 4 * cs  # 20 context chunks + 4 local chunks
    gen = torch.Generator().manual_seed(4)
    k = 0.01 * torch.randn(b, h, n, d, generator=gen)
    k[0, 0, 5 * cs : 6 * cs, 0] = 5.0  # chunk 5 of kv head 0 answers dim 0
    k[0, 1, 12 * cs : 13 * cs, 1] = 5.0  # chunk 12 of kv head 1 answers dim 1
    skv = ShadowKV(2 * cs, h * d, outlier_chunks=0, select_scale=1.0)
    st = skv.build(k.transpose(1, 2).reshape(b, n, h * d), k, k.clone(), 0)
    q = torch.zeros(b, h * g, 1, d)
    q[0, 1, 0, 0] = 3.0  # second query head of group 0 looks along dim 0
    q[0, 2, 0, 1] = 3.0  # first query head of group 1 looks along dim 1
    pos = skv.select(st, q)
    assert pos.shape == (b, h, 2 * cs)
    assert set(range(5 * cs, 6 * cs)) <= set(pos[0, 0].tolist())
    assert set(range(12 * cs, 13 * cs)) <= set(pos[0, 1].tolist())
    assert (pos % cs == torch.arange(cs).repeat(2)).all()  # whole chunks


def test_budget_accounting_is_equal_across_policies():
    g = torch.Generator().manual_seed(5)
    b, h, hq, n, d = 2, 2, 4, 203, 16  # n not a multiple of the chunk or page size
    k_pre = torch.randn(b, n, h * d, generator=g)
    k = torch.randn(b, h, n, d, generator=g)
    v = torch.randn(b, h, n, d, generator=g)
    skv = ShadowKV(32, 8, outlier_chunks=2)
    lay = skv.layout(n)
    chunks = n // 8 - 4
    assert lay == {"chunks": chunks, "local": n - 8 * chunks, "outlier": 16, "selected": 32, "total": lay["total"]}
    assert lay["total"] == lay["local"] + 16 + 32
    total = lay["total"]
    bases = {0: loki_basis(torch.randn(h, 300, d, generator=g))}
    policies = {
        "shadowkv": skv,
        "quest": Quest(total, 16),
        "loki": Loki(total, 4, bases),
        "streaming": StreamingLLM(total, 4),
    }
    cos, sin = torch.ones(512, d), torch.zeros(512, d)
    q = torch.randn(b, hq, 1, d, generator=g)
    kg, vg = torch.randn(b, h, 3, d, generator=g), torch.randn(b, h, 3, d, generator=g)
    for name, pol in policies.items():
        st = pol.build(k_pre, k, v, 0)
        out, attended = pol.attend(st, q, kg, vg, scaling=d**-0.5, rope=(cos, sin))
        assert out.shape == (b, hq, 1, d), name
        assert attended == total, (name, attended, total)
    # a budget that is not a multiple of the chunk size is rejected, naming the value
    with pytest.raises(ValueError, match="sparse_budget"):
        ShadowKV(30, 8)


def test_resident_and_offloaded_bytes_are_counted_from_tensors():
    g = torch.Generator().manual_seed(6)
    b, h, n, d, r = 1, 3, 512, 64, 48
    k_pre = torch.randn(b, n, h * d, generator=g)
    k = torch.randn(b, h, n, d, generator=g)
    v = torch.randn(b, h, n, d, generator=g)
    skv = ShadowKV(64, r, outlier_chunks=2)
    st = skv.build(k_pre, k, v, 0)
    want = tensor_bytes(st.U, st.SV, st.landmarks, st.landmark_idx, st.outlier_k, st.outlier_v, st.local_k, st.local_v)
    assert skv.resident_bytes(st) == want and skv.offloaded_bytes(st) == tensor_bytes(v)
    full = tensor_bytes(k, v)
    assert st.U.shape == (b, n, r) and st.landmarks.shape == (b, h, n // 8 - 4 - 2, d)
    c_land, local, outl = n // 8 - 4 - 2, 32, 16
    exact = 4 * (n * r + h * r * d + c_land * h * d + 2 * (local + outl) * h * d) + 8 * c_land * h
    assert want == exact
    # per token: r + Hkv*d/8 floats against 2*Hkv*d, plus constants (SV, outliers, local) that vanish as n grows
    analytic = (r + h * d / 8) / (2 * h * d)
    assert analytic < want / full < analytic + (4 * (h * r * d + 2 * 48 * h * d) + 8 * c_land * h) / full + 1e-9
    assert Quest(64).resident_bytes(Quest(64).build(None, k, v, 0)) > full  # Quest keeps everything, plus summaries


def test_quest_bound_is_an_upper_bound_and_streaming_positions():
    g = torch.Generator().manual_seed(7)
    k = torch.randn(1, 1, 64, 8, generator=g)
    q = torch.randn(8, generator=g)
    st = Quest(32, 16).build(None, k, k, 0)
    ub = torch.maximum(q * st.extra["kmin"], q * st.extra["kmax"]).sum(-1)[0, 0]  # (pages,)
    true = (k[0, 0] @ q).view(4, 16).amax(-1)
    assert (ub >= true - 1e-5).all()
    assert sink_recent_positions(10, 6, 2).tolist() == [0, 1, 6, 7, 8, 9]
    assert sink_recent_positions(5, 8, 2).tolist() == [0, 1, 2, 3, 4]
    assert chunk_positions(torch.tensor([[2, 0]]), 4).tolist() == [[8, 9, 10, 11, 0, 1, 2, 3]]


def test_sdpa_gqa_bottom_right_causal_matches_explicit_softmax():
    g = torch.Generator().manual_seed(8)
    b, hq, h, ql, kl, d = 1, 4, 2, 3, 7, 8
    q, k, v = torch.randn(b, hq, ql, d, generator=g), torch.randn(b, h, kl, d, generator=g), torch.randn(b, h, kl, d)
    out = sdpa_gqa(q, k, v, scaling=0.3)
    kr, vr = k.repeat_interleave(hq // h, 1), v.repeat_interleave(hq // h, 1)
    s = q @ kr.transpose(-1, -2) * 0.3
    mask = torch.arange(kl)[None] <= torch.arange(ql)[:, None] + (kl - ql)
    ref = torch.softmax(s.masked_fill(~mask, -math.inf), -1) @ vr
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    one = sdpa_gqa(q[:, :, -1:], k, v, scaling=0.3)  # packed GQA path for one token
    torch.testing.assert_close(one, ref[:, :, -1:], atol=1e-5, rtol=0)
    scores = torch.arange(2 * 4 * 1 * 3, dtype=torch.float).view(2, 4, 1, 3)
    assert group_scores(scores, 2).shape == (2, 2, 3)
    assert group_scores(scores, 2)[0, 0].tolist() == scores[0, 1, 0].tolist()  # max over the group


def test_energy_rank_closed_form():
    s = torch.tensor([3.0, 1.0])  # energies 9 and 1: 90 % at rank 1, 99 % needs both
    assert energy_rank(s, 0.9) == 1 and energy_rank(s, 0.99) == 2
    assert energy_rank(torch.ones(10), 0.5) == 5


def test_collector_and_controller_restore_on_error(tiny_llama, ids):
    ctrl = KVSelectionController({"collector": KeyCollector()})
    before = tiny_llama.config._attn_implementation
    with pytest.raises(RuntimeError, match="boom"):
        with use_controller(tiny_llama, ctrl):
            prefill(tiny_llama, ids[:, :40])
            raise RuntimeError("boom")
    assert tiny_llama.config._attn_implementation == before
    st = ctrl.states["collector"][0]
    assert st.extra["k_pre"].shape == (2, 40, WIDTH) and st.k.shape == (2, 2, 40, 16)
    assert not tiny_llama.model.layers[0].self_attn.k_proj._forward_hooks  # hooks removed


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="sparse_budget"):
        ShadowKVConfig(sparse_budget=100)
    with pytest.raises(ValueError, match="budgets"):
        ShadowKVConfig(budgets=[4])
    with pytest.raises(ValueError, match="select_scale"):
        ShadowKVConfig(select_scale=-1.0)
    with pytest.raises(ValueError, match="retrieval_task"):
        ShadowKVConfig(retrieval_task="qa")
    cfg = ShadowKVConfig()
    assert cfg.outliers_for(2048) == 48 and cfg.outliers_for(128) == 3 and cfg.outliers_for(64) == 2
