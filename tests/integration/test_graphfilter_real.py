"""GraphFilter on SmolLM2-135M (trimmed quick preset): the set cover spreads the budget over the families and
avoids corrupted items where random does not, and SFT on its subset teaches the held-out format tags.

Macro accuracy over 2 replicates is too noisy at this size to assert GraphFilter > random itself; the documented
proxies are the selection diagnostics (family coverage, corrupted share) and SFT beating the untrained model.
"""

from __future__ import annotations

import math

import pytest

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_graphfilter_spreads_the_budget_and_sft_learns_the_tags(smollm2):
    result = run_method(
        "graphfilter",
        preset="quick",
        write=False,
        show_progress=False,
        raise_errors=True,
        threads=2,
        replicates=2,
        eval_per_family=3,
        epochs=8,  # the quick preset's 3 epochs at 2e-4 leave macro accuracy at 0 (measured); 8 at 5e-4 reach ~0.48
        lr=5e-4,
    )
    m = {(r.system, r.metric): r.value for r in result.metrics}
    assert result.flags["lazy_equals_naive"] is True
    # the set cover reaches more families than random and than quality alone (the diversity term at work); its
    # share of the majority family is not asserted: measured, it is not below random's (0.60 vs 0.50 at the quick
    # preset, 0.59 vs 0.59 with 2 replicates): oracle quality favours that family (quality alone takes 0.67)
    assert m[("graphfilter", "families_covered")] > m[("random", "families_covered")]
    assert m[("graphfilter", "families_covered")] > m[("quality_only", "families_covered")]
    # oracle quality floors the corrupted items: GraphFilter takes fewer of them than random
    assert m[("graphfilter", "corrupted_share")] < m[("random", "corrupted_share")]
    # SFT on the selected subset teaches the families' answer tags
    assert m[("graphfilter", "macro_acc")] > m[("base", "macro_acc")]
    assert all(math.isfinite(r.value) for r in result.metrics)
    assert {c.status for c in result.claims} <= {"supported", "not_supported", "inconclusive"}


def test_superfilter_ifd_runs_on_smollm2(smollm2):
    from lmlab.methods.alignment.graphfilter import ifd_scores, quality_from_ifd

    model, tok = smollm2
    s = ifd_scores(
        model,
        tok,
        ["What is the capital of Norway?", "What is the capital of Norway?"],
        ["The capital of Norway is Oslo.", "The capital of Norway is Lima."],
    )
    assert all(math.isfinite(v) and v > 0 for v in s.ifd)
    assert all(math.isfinite(v) and v > 1 for v in s.ppl_conditional)
    assert quality_from_ifd(s.ifd).shape == (2,)
