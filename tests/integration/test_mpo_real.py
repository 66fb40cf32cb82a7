"""MPO on SmolLM2-135M: the exact level (pi_ref from the real model) reaches the MaxMin optimum and beats the
extreme single policies; the trained level's DPO policies each move towards their own objective.

Level 1 (the quick preset, trimmed): MPO's mirror-descent weights reach the exact MaxMin optimum on the train
candidates, and on held-out prompts MPO's worst-objective reward is above the concise-only and detail-only policies
(means). MPO vs uniform and vs the correct-only policy is the run's gated claim, reported, not asserted. Level 2
(a trimmed default) is too small to assert MPO above the soups; the documented proxy is that each DPO policy beats
the opposite objective's policy on its own objective, and that the run completes with finite numbers.
"""

from __future__ import annotations

import math

import pytest

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def _means(result):
    return {(r.system, r.metric): r.value for r in result.metrics}


def test_mpo_exact_level_reaches_maxmin_and_beats_the_extreme_singles(smollm2):
    result = run_method("mpo", preset="quick", write=False, show_progress=False, raise_errors=True, threads=2,
                        n_train=12, n_test=16)  # fmt: skip
    m = _means(result)
    chk = result.flags["maxmin_check"]
    assert chk["dual_gap"] < 1e-3 and chk["within_tol"]
    w = {s: m[(s, "worst_reward")] for s in ("mpo", "uniform", "single_correct", "single_concise", "single_detail")}
    # robust at beta = 0.5: MPO above the two extreme single policies. MPO vs uniform and vs single_correct is the
    # gated claim of the run and is not asserted here: on a tiny-llama pi_ref it went either way at beta = 0.5
    # (the unregularised W trades against the KL term the MaxMin problem also optimises; README, Pitfalls)
    assert w["mpo"] > w["single_concise"] and w["mpo"] > w["single_detail"]
    # no candidate policy beats the unregularised MaxMin LP
    assert m[("maxmin_lp", "worst_reward_ceiling")] >= w["mpo"] - 1e-9
    assert all(math.isfinite(r.value) for r in result.metrics)
    assert {c.status for c in result.claims} <= {"supported", "not_supported", "inconclusive"}


def test_mpo_trained_level_policies_follow_their_objectives(smollm2):
    result = run_method("mpo", preset="default", write=False, show_progress=False, raise_errors=True, threads=2,
                        n_train=8, n_test=8, dpo_epochs=2, gen_prompts=2, max_new_tokens=16)  # fmt: skip
    m = _means(result)
    assert m[("dpo_single_concise", "reward_concise")] > m[("dpo_single_detail", "reward_concise")]
    assert m[("dpo_single_detail", "reward_detail")] > m[("dpo_single_concise", "reward_detail")]
    for obj in ("correct", "concise", "detail"):
        assert m[(f"dpo_single_{obj}", "dpo_loss_last")] < m[(f"dpo_single_{obj}", "dpo_loss_first")]
    assert ("gen_mpo", "worst_reward") in m and ("dpo_soup_tuned", "worst_reward") in m
    assert all(math.isfinite(r.value) for r in result.metrics)
