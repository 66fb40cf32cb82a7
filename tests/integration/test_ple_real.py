"""PLE on SmolLM2-135M (trimmed quick preset): the principle raises the reward (the premise), PLE distils it into
the unprompted policy (held-out reward without the principle above SFT's) without degenerating on neutral text.

PLE vs RAFT / always-rank DPO is not asserted at this size (expected >=, an inconclusive result is acceptable);
the documented direction is PLE > SFT with the reference PPL within 1.5x of SFT's.
"""

from __future__ import annotations

import math

import pytest

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_ple_distils_the_principle_into_the_plain_policy(smollm2):
    result = run_method(
        "ple",
        preset="quick",
        write=False,
        show_progress=False,
        raise_errors=True,
        threads=2,
        iterations=2,
        queries_per_iter=12,
        n_test=16,
        systems=["ple", "always_rank_dpo"],
        eval_guided=True,
    )
    m = {(r.system, r.metric): r.value for r in result.metrics}
    # the premise: answers under the principle score higher than plain ones (round 0 and held out)
    assert m[("principle@0", "train_reward")] > m[("plain@0", "train_reward")]
    assert m[("sft_guided", "reward")] > m[("sft", "reward")]
    # the claim's direction: the principle distilled into the plain policy
    assert m[("ple", "reward")] > m[("sft", "reward")]
    # the degeneration guard: neutral reference text stays about as likely as under SFT
    assert m[("ple", "ref_ppl")] < 1.5 * m[("sft", "ref_ppl")]
    # the decaying threshold: tau_1 = alpha tau_0
    assert result.flags["tau_schedule"] == pytest.approx([0.2, 0.18])
    assert all(math.isfinite(r.value) for r in result.metrics)
    assert {c.status for c in result.claims} <= {"supported", "not_supported", "inconclusive"}
