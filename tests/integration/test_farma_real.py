"""FaRMA on SmolLM2-135M-Instruct: the claim's direction on a trimmed quick preset (real model, ~30 s)."""

from __future__ import annotations

import pytest

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_claim_direction_on_smollm2(smollm2):
    result = run_method(
        "farma",
        preset="quick",
        write=False,
        show_progress=False,
        raise_errors=True,
        pref_prompts=12,
        samples_per_prompt=3,
        pref_tokens=12,
        eval_prompts=4,
        eval_seeds=2,
        max_new_tokens=8,
        iterations=2,
        latency_prompts=0,
    )
    farma, args = result.metric("farma", "rm_calls_per_token"), result.metric("args", "rm_calls_per_token")
    # the cost half of the claim, exactly: 1 reward-model call per token instead of k = 10 ...
    assert farma.value == 1.0 and args.value == 10.0
    calls = next(c for c in result.claims if c.metric == "rm_calls_per_token" and c.baseline == "args")
    # it holds by construction: shown as a mechanism check, never gating the verdict (its status over the 4 prompt
    # clusters is inconclusive at this size: n < 6 units; the effect itself is exact)
    assert calls.observed_effect == -9.0 and calls.mechanism and not calls.gate, calls.reason
    # the gold reward is clustered by prompt: 4 prompts x 2 seeds are 4 independent units
    assert result.metric("farma", "gold").n == 4
    # ... hence less reward-model compute per sample (wall time is reported by the run, never asserted)
    assert result.metric("farma", "rm_gflops").value < result.metric("args", "rm_gflops").value
    # the reward half, as a documented proxy (gold-reward differences at this size are within noise even at the
    # default preset's 40 rows): training fits the V-channel RM's pairs beyond its untrained LM-head copy
    trained = result.metric("rm_c (FaRMA)", "train_bt_accuracy").value
    assert trained > 0.5 and trained > result.metric("rm_c untrained", "train_bt_accuracy").value
