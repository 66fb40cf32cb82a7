"""Potemkin on SmolLM2-135M (the default's 10 concepts, SmolLM2 only, ~100 s): the metric controls hold exactly and
the model shows potemkins. The quick preset's 6 game-theory concepts are not used: SmolLM2 gets none of their 4-way
definition keystones right there (measured), so no use rate exists to assert.

At 135M the claim's direction is stable: the model gets some definition keystones right (4-way, by likelihood) and
still misclassifies, misgenerates or misedits instances of those concepts, and its self-classification of its own
examples disagrees with what it was asked to produce. Whether each single rate's CI clears 0 with 6 concepts is not
asserted (clusters are concepts; fewer than 6 with a right keystone leave the check inconclusive).
"""

from __future__ import annotations

import math

import pytest

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_smollm2_shows_potemkins_and_the_controls_hold(smollm2):
    result = run_method("potemkin", preset="default", write=False, show_progress=False, raise_errors=True, threads=2,
                        models=["smollm2-135m"])  # fmt: skip
    m = {(r.system, r.metric): r.value for r in result.metrics}
    # metric controls: the oracle is 0 everywhere, the random responder's incoherence is near 1
    for metric in ("incoherence", "lower_bound", "potemkin_classify", "potemkin_generate", "potemkin_edit"):
        assert m[("oracle", metric)] == 0.0
    assert m[("random", "incoherence")] > 0.5
    # the model: some keystone right, and a use rate above 0 on those concepts (the paper's direction)
    assert m[("smollm2-135m", "keystone_acc")] > 0
    rates = [m[k] for k in m if k[0] == "smollm2-135m" and k[1] in ("potemkin_classify", "potemkin_generate",
                                                                    "potemkin_edit")]  # fmt: skip
    assert rates and max(rates) > 0 and all(math.isfinite(r) for r in rates)
    assert m[("smollm2-135m", "incoherence")] > 0
    assert "the same model" in result.flags["judge"]
