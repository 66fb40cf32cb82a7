"""SWIFTCODE on SmolLM2-135M (the quick preset: two families, template candidates): SFT on the most efficient
correct candidate writes faster held-out code than SFT on a random correct one, and solves more held-out tasks than
the base model. All candidate and model code runs in lmlab.core.execution.sandbox.

At this size the held-out NET claim rests on the tasks both fine-tuned models solve (8 held-out tasks); the test
asserts its direction, and the selection itself (only fast idioms kept) as the mechanism behind it.
"""

from __future__ import annotations

import math

import pytest

from lmlab.core.execution.sandbox import sandbox_available
from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]
AVAILABLE, WHY = sandbox_available("unshare")


@pytest.mark.skipif(not AVAILABLE, reason=f"no sandbox on this machine: {WHY}")
def test_swiftcode_sft_writes_faster_code_than_random_correct_sft(smollm2):
    # 24 held-out tasks (quick has 8): the NET comparison needs tasks both fine-tuned models solve
    result = run_method("swiftcode", preset="quick", write=False, show_progress=False, raise_errors=True, threads=2,
                        n_eval=24)  # fmt: skip
    m = {(r.system, r.metric): r.value for r in result.metrics}
    # the selection: every kept training solution is a fast idiom, and faster than the random correct pick
    assert set(result.flags["swiftcode_kept_kinds"]) == {"fast"}
    assert m[("swiftcode", "train_net")] < m[("random_correct", "train_net")]
    # SFT teaches the task format: both fine-tuned models solve more held-out tasks than the base model
    assert m[("swiftcode", "pass_at_1")] > m[("base", "pass_at_1")]
    assert m[("random_correct", "pass_at_1")] > m[("base", "pass_at_1")]
    # the claim's direction: faster code on the held-out tasks both solve
    assert result.flags["mean_net_tasks"] >= 2
    assert m[("swiftcode", "mean_net")] < m[("random_correct", "mean_net")]
    assert all(math.isfinite(r.value) for r in result.metrics)
    assert {c.status for c in result.claims} <= {"supported", "not_supported", "inconclusive"}
