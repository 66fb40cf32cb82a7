"""Speculative Search on SmolLM2-135M (small) + Gemma-3-270M (large): the claim's direction, trimmed quick preset."""

from __future__ import annotations

import pytest

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_claim_direction_on_smollm2_and_gemma(smollm2, gemma3):
    result = run_method(
        "spec_search",
        preset="quick",
        write=False,
        show_progress=False,
        raise_errors=True,
        n_questions=3,
        calib_questions=2,
        n_steps=2,
        n=3,
    )
    # the precondition was measured on the calibration split and reported, whichever way it went
    assert "precondition" in result.flags and result.flags["precondition"]["split"] == "dev"
    # per country, clustered by question: 2 calibration questions are 2 independent units
    assert result.metric("large_model", "calib_step_accuracy").n == 2
    # accepted drafts replace large-model thoughts: fewer large-model decode tokens than large-only search ...
    assert result.metric("spec_search", "acceptance_rate").value > 0
    spec_tokens = result.metric("spec_search", "large_decode_tokens").value
    assert spec_tokens < result.metric("large_beam", "large_decode_tokens").value
    # ... at a step accuracy (graded by gold capitals) at least the small-only search's
    assert result.metric("spec_search", "step_accuracy").value >= result.metric("small_beam", "step_accuracy").value
    assert result.flags["oracle_prm"] is False
