"""ShadowKV invariants on the tiny llama and on synthetic tensors (exactness, SVD, selection, budget accounting)."""

from __future__ import annotations

import math

import pytest
import torch

from lmlab.core.inference.attention import (
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
    model_support,
    prefill,
    rebuild_keys,
    rewind,
    rope_tables,
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


# ---------------------------------------------------------------------------------------------------------------
# Chunked prefill (explicit phase), Gemma-3 (keys after k_norm, sliding layers dense), unsupported models, clusters


def _decode_all(model, ctrl, cache, ids, n, steps, names):
    out = {}
    for name in names:
        ctrl.active = name
        out[name] = teacher_forced_logprobs(model, cache, ids, n, steps)
    return out


@pytest.mark.parametrize("arch", ["tiny_llama", "tiny_gemma"])
def test_chunked_prefill_then_decode_equals_one_shot_prefill(arch, request, ids):
    """Several prefill calls with q_len > 1 and q_len != k_len build the same state as one call (sparse budget).

    The old rule (prefill iff q_len == k_len) read the second chunk as a decode step: the state then covered the
    first chunk only, so the sparse decode differed.
    """
    model = request.getfixturevalue(arch)
    n, steps = 150, 6
    width = model.config.num_key_value_heads * model.config.head_dim

    def run(chunk):
        sels = {"shadowkv": ShadowKV(16, width // 2, outlier_chunks=1), "streaming": StreamingLLM(40, 4)}
        ctrl = KVSelectionController(sels)
        with torch.no_grad(), use_controller(model, ctrl):
            cache, last = prefill(model, ids[:, :n], controller=ctrl, chunk_tokens=chunk)
            lps = _decode_all(model, ctrl, cache, ids, n, steps, ["shadowkv", "streaming"])
        return ctrl, last, lps

    one, last1, lp1 = run(None)
    chunked, last2, lp2 = run(48)  # calls of 48, 48, 48, 6 tokens
    torch.testing.assert_close(last2, last1, atol=1e-4, rtol=0)
    for layer in one.sparse_layers:
        a, b = one.states["shadowkv"][layer], chunked.states["shadowkv"][layer]
        assert a.n == b.n == n
        torch.testing.assert_close(b.U @ b.SV[:, 0], a.U @ a.SV[:, 0], atol=1e-4, rtol=0)  # sign-free low-rank keys
        assert torch.equal(a.landmark_idx, b.landmark_idx)
        torch.testing.assert_close(b.landmarks, a.landmarks, atol=1e-4, rtol=0)
        torch.testing.assert_close(b.local_k, a.local_k, atol=1e-4, rtol=0)
        assert chunked.states["streaming"][layer].n == n
    for name in lp1:
        torch.testing.assert_close(lp2[name], lp1[name], atol=1e-3, rtol=0, msg=lambda m, name=name: f"{name}: {m}")
    assert set(chunked.attended["shadowkv"]) == set(one.attended["shadowkv"])


def test_prefill_phase_errors_are_explicit(tiny_llama, ids):
    with pytest.raises(ValueError, match="chunk_tokens=16 < 40 tokens"):
        prefill(tiny_llama, ids[:, :40], chunk_tokens=16)  # a chunked prefill needs the controller to declare it
    ctrl = KVSelectionController({"shadowkv": ShadowKV(16, 8)})
    with torch.no_grad(), use_controller(tiny_llama, ctrl):
        ctrl.begin_prefill(50)
        cache = tiny_llama(input_ids=ids[:, :40], use_cache=True).cache
        with pytest.raises(ValueError, match="crosses the declared prefill of 50 tokens"):
            tiny_llama(input_ids=ids[:, 40:60], cache=cache, use_cache=True)
    with pytest.raises(ValueError, match="prompt length >= 1, got 0"):
        ctrl.begin_prefill(0)


def test_gemma3_full_budget_equals_dense_and_sliding_layers_stay_dense(tiny_gemma, ids):
    """tiny-gemma3 (1 sliding + 1 full layer, window 16): at full budget and rank, ShadowKV equals dense attention.

    This needs the keys captured after k_norm and re-rotated with the full-attention RoPE table (theta 1e6).
    """
    model = tiny_gemma
    cfg = model.config
    assert cfg.model_type == "gemma3_text" and hasattr(model.model.layers[0].self_attn, "k_norm")
    assert "sliding_attention" in cfg.layer_types and "full_attention" in cfg.layer_types
    n, steps = 120, 8  # far past the sliding window
    width = cfg.num_key_value_heads * cfg.head_dim
    ctrl = KVSelectionController({"shadowkv": ShadowKV(1024, width, outlier_chunks=2), "full_sel": FullKV()})
    with torch.no_grad(), use_controller(model, ctrl):
        cache, _ = prefill(model, ids[:, :n], controller=ctrl)
        out = _decode_all(model, ctrl, cache, ids, n, steps, ["full", "shadowkv", "full_sel"])
        ctrl.active = "shadowkv"  # generate from scratch: an undeclared forward on an empty cache is the prefill
        gen = model.generate(input_ids=ids[:1, : n + 1], max_new_tokens=4, do_sample=False)
    ref = _dense_logprobs(model, ids, n, steps)
    for name, lp in out.items():
        torch.testing.assert_close(lp, ref, atol=1e-3, rtol=0, msg=lambda m, name=name: f"{name}: {m}")
    with torch.no_grad():
        assert torch.equal(gen, model.generate(input_ids=ids[:1, : n + 1], max_new_tokens=4, do_sample=False))
    # which layers were sparsified: the full-attention one only
    full = tuple(i for i, t in enumerate(cfg.layer_types) if t == "full_attention")
    assert ctrl.sparse_layers == full and ctrl.support.dense_layers == (0,) and ctrl.support.key_site == "k_norm"
    assert set(ctrl.states["shadowkv"]) == set(full) and ctrl.states["shadowkv"][full[0]].n == n + 1
    assert ctrl.attended["shadowkv"] == [n] * steps * len(full) + [n + 1] * 3 * len(full)  # 3 decode steps of 4
    # the RoPE tables are the full-attention layers' ones, not the sliding layers'
    cos, _ = rope_tables(model, 64)
    pos = torch.arange(64).unsqueeze(0)
    want, _ = model.model.rotary_emb(torch.zeros(1), pos, "full_attention")
    other, _ = model.model.rotary_emb(torch.zeros(1), pos, "sliding_attention")
    torch.testing.assert_close(cos, want[0])
    assert not torch.allclose(cos, other[0])


def test_gemma3_captured_keys_are_k_norm_of_k_proj(tiny_gemma, ids):
    """The pre-RoPE keys ShadowKV factorises are k_norm(k_proj(x)) (what Gemma3Attention rotates), not k_proj(x)."""
    model = tiny_gemma
    layer = model.config.layer_types.index("full_attention")
    attn = model.model.layers[layer].self_attn
    seen = {}
    handle = attn.register_forward_pre_hook(lambda _m, args, kw: seen.update(x=kw["hidden_states"]), with_kwargs=True)
    ctrl = KVSelectionController({"collector": KeyCollector()})
    try:
        with torch.no_grad(), use_controller(model, ctrl):
            prefill(model, ids[:, :64], controller=ctrl, chunk_tokens=24)  # chunked: the capture concatenates
    finally:
        handle.remove()
    with torch.no_grad():
        x = seen["x"]  # the last chunk's input; recompute the full prompt's keys from one dense forward instead
        b, d = x.shape[0], attn.head_dim
        full_x = {}
        h2 = attn.register_forward_pre_hook(lambda _m, a, kw: full_x.update(x=kw["hidden_states"]), with_kwargs=True)
        try:
            model(ids[:, :64])
        finally:
            h2.remove()
        raw = attn.k_proj(full_x["x"])  # (B, 64, Hkv*d)
        normed = attn.k_norm(raw.view(b, 64, -1, d).transpose(1, 2)).transpose(1, 2).reshape(b, 64, -1)
    got = ctrl.states["collector"][layer].extra["k_pre"]
    assert got.shape == normed.shape == (b, 64, model.config.num_key_value_heads * d)
    torch.testing.assert_close(got, normed, atol=1e-5, rtol=0)
    assert not torch.allclose(got, raw, atol=1e-2)  # the test can tell the two apart
    assert set(ctrl.states["collector"]) == {layer}  # sliding layers: no state


def test_unsupported_model_type_is_refused_naming_the_type():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=32)).eval()
    before = model.config._attn_implementation
    with pytest.raises(
        ValueError, match=r"does not support model type 'gpt2': expected one of 'gemma3_text', 'llama'"
    ):
        with use_controller(model, KVSelectionController({"shadowkv": ShadowKV(16, 8)})):
            pass
    assert model.config._attn_implementation == before
    with pytest.raises(ValueError, match="'gpt2'"):
        model_support(model)


def test_fidelity_metrics_are_clustered_by_prompt():
    """Decode steps of one prompt share its prefill: n (and the claims' n) count prompts, not prompt x step."""
    from lmlab.runner import run_method

    r = run_method("shadowkv", preset="smoke", write=False, show_progress=False, raise_errors=True, ranks=[],
                   ablations=False, n_retrieval=0, bench_batches=[1], bench_repeats=1)  # fmt: skip
    n_prompts, steps = 2, 4  # smoke preset
    for system in ("shadowkv_b16", "quest_b16", "full"):
        m = r.metric(system, "kl")
        assert m.n == n_prompts, (system, m.n)
    kl_claims = [c for c in r.claims if c.metric == "kl"]
    assert kl_claims and all(c.n == n_prompts and c.n_values == n_prompts * steps for c in kl_claims)
    resident = [c for c in r.claims if c.metric == "resident_ratio"]
    assert resident and all(c.mechanism and not c.gate for c in resident)  # holds by construction: never gates
