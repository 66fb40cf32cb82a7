"""Model Swarms on SmolLM2-135M (the quick preset): arithmetic LoRA experts searched for two-step problems.

Asserts the claim's direction where it is stable at this size: the swarm's model is above the uniform soup of the
experts on test (measured: quick 0.33 vs 0.30, default 0.31 vs 0.28); on dev (the objective) it is at least the best
single expert; every searcher used the same number of utility evaluations. Against the best single expert on test the
claim does not hold at quick (0.33 vs 0.38: 20 dev items cannot rank the experts), so that is not asserted.
"""

from __future__ import annotations

import math

import pytest

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_swarm_beats_the_soup_and_matches_the_best_expert(smollm2, tmp_path):
    result = run_method("model_swarms", preset="quick", write=False, show_progress=False, raise_errors=True,
                        threads=2, save_model=str(tmp_path / "best"))  # fmt: skip
    m = {(r.system, r.metric): r.value for r in result.metrics}
    assert len(set(result.flags["equal_budget"].values())) == 1
    g = result.flags["swarm"]["g_history"]
    assert all(b >= a for a, b in zip(g, g[1:]))
    assert m[("model_swarms", "dev_acc")] >= m[("best_single", "dev_acc")]
    assert m[("model_swarms", "test_acc")] > m[("uniform_soup", "test_acc")]
    assert all(row["loss_last"] < row["loss_first"] for row in result.tables["experts"])  # the experts learned
    assert all(math.isfinite(r.value) for r in result.metrics)
    assert (tmp_path / "best" / "config.json").exists()
