"""RSD with SmolLM2-135M-Instruct (draft) and Gemma-3-270M (target): the claim's direction on a trimmed quick run."""

from __future__ import annotations

import pytest

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_claim_direction_on_smollm2_and_gemma(smollm2, gemma3):
    result = run_method(
        "rsd",
        preset="quick",
        write=False,
        show_progress=False,
        raise_errors=True,
        n_questions=5,
        n_calibration=3,
        prms=["noisy", "oracle"],
    )
    # the premise: the target is more step-accurate than the draft on the calibration split; the headline checks
    # gate the verdict only when that is established (3 calibration questions are too few: reported ungated)
    pre = result.flags["precondition"]
    assert pre["target_step_accuracy"] > pre["draft_step_accuracy"]
    gated = {c.method for c in result.claims if c.gate and c.method.startswith("rsd_")}
    assert gated == ({"rsd_noisy_d0.7"} if pre["holds"] else set())
    rsd, oracle = "rsd_noisy_d0.7", "rsd_oracle_d0.7"
    acc = {s: result.metric(s, "step_accuracy").value for s in (rsd, oracle, "draft_only", "target_only")}
    target_flops = {s: result.metric(s, "target_gflops").value for s in (rsd, oracle, "target_only")}
    # RSD fixes draft steps with the target: above draft-only, at fewer target-model FLOPs than target-only
    assert acc[rsd] > acc["draft_only"] and acc[oracle] > acc["draft_only"]
    assert target_flops[rsd] < target_flops["target_only"]
    # with an exact PRM the target writes exactly the steps the draft got wrong: never more than target-only
    assert target_flops[oracle] <= target_flops["target_only"]
    # with an exact PRM, kept draft steps are correct ones: accuracy at least target-only's
    assert acc[oracle] >= acc["target_only"]
    assert result.flags["oracle_prm"] is True
    # token accounting: every draft proposal is counted, kept or discarded
    assert result.metric(rsd, "num_draft_tokens").value > 0 and result.metric(rsd, "acceptance_rate").value < 1
