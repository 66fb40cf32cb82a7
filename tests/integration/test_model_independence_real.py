"""Independence tests on SmolLM2-135M: the attack defeats CSW but not MATCH; a structurally pruned copy is detected
and its blocks mapped; Gemma is not flagged."""

from __future__ import annotations

import pytest

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_match_survives_the_attack_and_does_not_flag_gemma(smollm2, gemma3):
    result = run_method(
        "model_independence",
        preset="quick",
        write=False,
        show_progress=False,
        raise_errors=True,
        threads=2,
        tiny_pairs=0,  # the tiny calibration is covered by the fast tests
        derived=["perm_rot", "pruned"],
        independent_model="gemma3-270m",
        blocks=6,
        n_texts=3,
        seq_len=64,
        prune_calib=2,
    )
    # the attack leaves SmolLM2's outputs unchanged (float64 copies), hides it from the weight tests, not from MATCH
    assert result.flags["derived_perm_rot"]["logit_rel_diff_fp64"] < 1e-5
    assert result.metric("match@perm_rot", "detected").value == 1.0
    assert result.metric("csw@perm_rot", "detected").value == 0.0
    # the structurally pruned, healed copy (blocks dropped, MLP units cut): other depth and widths, so only MATCH
    # applies; it is detected on its kept blocks, and the localized search maps its blocks better than relative depth
    # (4 of its 5 kept tested blocks in every run so far: the block right after the dropped run is the miss)
    assert result.metric("match@pruned", "detected").value >= 0.6
    assert result.metric("match@pruned", "fisher_p").value < 1e-6
    assert (
        result.metric("localized@pruned", "map_correct").value
        > result.metric("relative_depth@pruned", "map_correct").value
    )
    # an independently trained model of another architecture is not flagged
    assert result.metric("match@independent_real", "detected").value == 0.0
    statuses = {c.text.split(":")[0]: c.status for c in result.claims if c.gate}
    # the localized map is asserted by its direction above: at 3 texts x 64 tokens its gated margin (0.5 over the
    # relative-depth guess) is not always cleared (inconclusive); the default's 8 x 128 clears it (0.93 vs 0.13)
    assert statuses.pop("B localized") in ("supported", "inconclusive"), statuses
    assert statuses and all(s == "supported" for s in statuses.values()), statuses
