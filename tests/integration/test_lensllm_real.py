"""LensLLM on SmolLM2-135M (a trimmed quick preset): the zoo has real quality differences, the fitted law's
predictions at D* track the measured losses, and the subset fine-tunes cost less than the full ones.

Two data seeds are too few to decide the paired claims (LensLLM vs the rectified law), so the documented proxies are
asserted: the pretrained candidate beats the random tiny one after fine-tuning, LensLLM's predicted D* losses are
positively correlated with the measured ones on every seed and rank SmolLM2 first, and the compute ratio is below 1.
"""

from __future__ import annotations

import math

import pytest

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_lensllm_predicts_the_d_star_ordering_of_the_zoo(smollm2):
    result = run_method(
        "lensllm",
        preset="quick",
        write=False,
        show_progress=False,
        raise_errors=True,
        threads=2,
        candidates=["tiny", "base-trunc10", "base"],
        n_seeds=2,
        test_size=50,
        sizes=[0, 4, 8, 16],
        target_size=64,
    )
    m = {(r.system, r.metric): r.value for r in result.metrics}
    losses = result.tables["losses"]
    at_target = {c: [r["test_loss"] for r in losses if r["candidate"] == c and r["size"] == 64]
                 for c in ("tiny", "base")}  # fmt: skip
    assert max(at_target["base"]) < min(at_target["tiny"])  # SmolLM2 after fine-tuning beats a random tiny llama
    per_seed = [r for r in result.tables["per_seed"] if r["system"] == "lensllm"]
    assert all(r["pearson"] > 0 for r in per_seed)
    assert all(r["selected"] == "base" for r in per_seed)
    assert 0 < m[("lensllm", "compute_ratio")] < 1
    assert all(math.isfinite(r.value) for r in result.metrics)
    assert {c.status for c in result.claims} <= {"supported", "not_supported", "inconclusive"}
