"""ShadowKV inside SmolLM2-135M-Instruct: exactness through HF generate, and the claim's direction on a trimmed run."""

from __future__ import annotations

import pytest
import torch

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_full_budget_shadowkv_generate_equals_dense_in_smollm2(smollm2):
    from lmlab.core.inference.attention import use_controller
    from lmlab.data.ruler import filler_text
    from lmlab.methods.efficiency.shadowkv.method import KVSelectionController, ShadowKV

    model, tok = smollm2
    ids = tok(filler_text(1, 1600), return_tensors="pt").input_ids[:, :300]
    with torch.no_grad():
        dense = model.generate(ids, max_new_tokens=6, do_sample=False)
        ctrl = KVSelectionController({"shadowkv": ShadowKV(4096, 192, outlier_chunks=4)}, active="shadowkv")
        with use_controller(model, ctrl):
            sparse = model.generate(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(dense, sparse)
    assert set(ctrl.attended["shadowkv"]) == {ids.shape[1]}  # every decode step saw all 300 prefill tokens


def test_claim_direction_on_smollm2(smollm2):
    result = run_method(
        "shadowkv",
        preset="quick",
        write=False,
        show_progress=False,
        raise_errors=True,
        context_tokens=768,
        decode_steps=8,
        n_retrieval=0,
        bench_tokens=1024,
        bench_batches=[1],
        bench_repeats=2,
    )
    s, st = "shadowkv_b64", "streaming_b64"
    kl = {k: result.metric(k, "kl").value for k in (s, st, "quest_b64")}
    # closer to full attention than sink + recent at the same total budget
    assert kl[s] < kl[st]
    assert result.metric(s, "top1_agreement").value >= 0.5
    # equal total budget, counted from the gathered tensors
    total = {k: result.metric(k, "attended_prefill_tokens").value for k in (s, st, "quest_b64", "loki_b64")}
    assert len(set(total.values())) == 1
    # resident tier far below full K+V (analytic (48 + 24) / 384 = 0.19 plus local/outlier/SV constants)
    assert result.metric(s, "resident_ratio").value < 0.35
    # the paper's observation: pre-RoPE keys are lower-rank than post-RoPE keys
    assert result.metric("pre_rope_keys", "rank90").value < result.metric("post_rope_keys", "rank90").value


def test_chunked_prefill_equals_one_shot_in_smollm2(smollm2):
    """A 600-token prompt prefilled in 4 calls of 160 tokens gives the same sparse decode as one call."""
    from lmlab.core.inference.attention import use_controller
    from lmlab.data.ruler import filler_text
    from lmlab.methods.efficiency.shadowkv.method import (
        KVSelectionController,
        ShadowKV,
        prefill,
        teacher_forced_logprobs,
    )

    model, tok = smollm2
    ids = tok(filler_text(2, 5000), return_tensors="pt").input_ids[:, :610]
    n, steps = 600, 6
    lps = []
    for chunk in (None, 160):
        ctrl = KVSelectionController({"shadowkv": ShadowKV(64, 48, outlier_chunks=2)}, active="shadowkv")
        with torch.no_grad(), use_controller(model, ctrl):
            cache, _ = prefill(model, ids[:, :n], controller=ctrl, chunk_tokens=chunk)
            lps.append(teacher_forced_logprobs(model, cache, ids, n, steps))
    torch.testing.assert_close(lps[1], lps[0], atol=2e-3, rtol=0)


def test_full_budget_shadowkv_equals_dense_in_gemma3(gemma3):
    """Gemma-3-270M: keys after k_norm, only the full-attention layers sparsified; at full budget/rank = dense."""
    from lmlab.core.inference.attention import use_controller
    from lmlab.data.ruler import filler_text
    from lmlab.methods.efficiency.shadowkv.method import KVSelectionController, ShadowKV

    model, tok = gemma3
    cfg = model.config
    ids = tok(filler_text(1, 6000), return_tensors="pt").input_ids[:, :700]  # past the 512-token sliding window
    width = cfg.num_key_value_heads * cfg.head_dim
    with torch.no_grad():
        dense = model.generate(ids, max_new_tokens=6, do_sample=False)
        ctrl = KVSelectionController({"shadowkv": ShadowKV(4096, width, outlier_chunks=4)}, active="shadowkv")
        with use_controller(model, ctrl):
            sparse = model.generate(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(dense, sparse)
    full = tuple(i for i, t in enumerate(cfg.layer_types) if t == "full_attention")
    assert ctrl.sparse_layers == full and 0 < len(full) < cfg.num_hidden_layers
    assert ctrl.support.key_site == "k_norm" and set(ctrl.states["shadowkv"]) == set(full)
    assert set(ctrl.attended["shadowkv"]) == {ids.shape[1]}
