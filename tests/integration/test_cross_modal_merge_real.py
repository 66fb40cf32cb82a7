"""Cross-modal merging on SmolLM2-135M (trimmed quick preset): the glyph VLM-proxy learns to read, the reasoning
fine-tune learns (a + b) mod 10 on text, and the merge keeps the VLM-proxy's perception.

The training-free transfer itself (merge > VLM-proxy on multimodal reasoning) is not asserted: at 135M with 20-step
LoRA task vectors it is the open question of the experiment (see the README's Verdict); the documented proxies are
the two fine-tunes learning their skills and perception surviving the merge at α = 0.9.
"""

from __future__ import annotations

import math

import pytest

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_proxy_models_learn_and_the_merge_keeps_perception(smollm2):
    result = run_method(
        "cross_modal_merge",
        preset="quick",
        write=False,
        show_progress=False,
        raise_errors=True,
        threads=2,
        knockout_items=8,
        finetune_cache=False,
    )
    m = {(r.system, r.metric): r.value for r in result.metrics}
    assert result.flags["alpha1_is_vlm"] is True
    assert result.flags["chosen_alpha"] == 0.9
    # the VLM-proxy reads the glyphs (the base LM given the same projector does not)
    assert m[("vlm", "perception_acc")] > m[("base", "perception_acc")]
    # the reasoning fine-tune learned the text skill
    assert m[("reason", "text_reason_acc")] > m[("base", "text_reason_acc")]
    # at α = 0.9 the merge stays close to the VLM-proxy on perception
    assert m[("merged", "perception_acc")] >= m[("vlm", "perception_acc")] - 0.15
    assert {r["model"] for r in result.tables["knockout"]} == {"vlm", "merged"}
    assert all(math.isfinite(r.value) for r in result.metrics)
    assert {c.status for c in result.claims} <= {"supported", "not_supported", "inconclusive"}
