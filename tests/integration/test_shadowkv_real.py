"""ShadowKV inside SmolLM2-135M-Instruct: exactness through HF generate, and the claim's direction on a trimmed run."""

from __future__ import annotations

import pytest
import torch

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_full_budget_shadowkv_generate_equals_dense_in_smollm2(smollm2):
    from lmlab.core.attention import use_controller
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
