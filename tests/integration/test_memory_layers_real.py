"""Memory+ vs dense, trained from scratch at the real (trimmed) size: what the claim predicts, checked on this run.

"Real" here is the real-size training run (the models are tiny and built from scratch; no model package is needed).
"""

from __future__ import annotations

import pytest

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_claim_direction_on_a_trimmed_from_scratch_run():
    result = run_method(
        "memory_layers",
        preset="quick",
        write=False,
        show_progress=False,
        raise_errors=True,
        threads=1,
    )
    m = {(r.system, r.metric): r.value for r in result.metrics}
    # equal FLOPs by construction: the memory layer costs about what the FFN it replaces costs
    assert 0.9 < m[("memory", "flops_per_token")] / m[("dense", "flops_per_token")] < 1.15
    # ... while holding far more parameters (the value table)
    assert m[("memory", "params")] > 3 * m[("dense", "params")]
    # the memory's extra capacity shows as memorisation: lower training loss at equal FLOPs and tokens ...
    assert m[("memory", "train_loss_tail")] < m[("dense", "train_loss_tail")]
    # ... while on held-out-template questions it is not worse at this trimmed size: the answer-NLL check must not
    # come out "does not hold" (memory's NLL clearly above dense's). Its sign is not asserted: measured on an
    # AVX2-only 2-core machine the quick run ties (+0.009 nats, CI straddling 0), on another it came out below.
    nll = next(c for c in result.claims if c.metric == "qa_nll")
    assert nll.status != "not_supported", nll.reason
    # the non-factual control gains nothing from the memory (gains, if any, concentrate on facts)
    control = next(c for c in result.claims if c.metric == "control_em")
    assert control.status != "not_supported"
    # every verdict is computed: the headline check exists and carries its CI
    head = next(c for c in result.claims if c.metric == "qa_em" and c.baseline == "dense")
    assert head.status in ("supported", "not_supported", "inconclusive") and head.ci[0] <= head.ci[1]
    # speed is measured interleaved, reported as a ratio (never asserted)
    assert ("memory", "tokens_per_s") in m
    assert result.tables["systems"][1]["fwd_speed_vs_dense"] > 0
