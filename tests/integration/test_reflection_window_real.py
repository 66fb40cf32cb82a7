"""Reflection-Window decoding on SmolLM2-135M-Instruct: the claim's direction on a trimmed quick preset."""

from __future__ import annotations

import pytest

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_claim_direction_on_smollm2(smollm2):
    result = run_method(
        "reflection_window",
        preset="quick",
        write=False,
        show_progress=False,
        raise_errors=True,
        n_capitals=3,
        n_instructions=3,
        max_new_tokens=20,
        calibrate_sigma=False,
    )
    rw, greedy = "rw_sigma0.5", "greedy"
    # refinement raises the length-matched joint log-prob over greedy ...
    assert result.metric(rw, "joint_logprob").value > result.metric(greedy, "joint_logprob").value
    assert result.metric(rw, "pauses").value > 0
    # ... at fewer forward calls than beam search (a paired check over the 6 prompts)
    calls = next(c for c in result.claims if c.metric == "forward_calls")
    assert calls.status == "supported", calls.reason
    assert result.metric(greedy, "forward_calls").value < result.metric(rw, "forward_calls").value
