"""KABB on the committed "mixed" response cache (real zoo variants as experts): the trimmed quick preset's claim
directions, or documented proxies where 5 seeds x 500 rounds cannot separate KABB from Thompson sampling.

Asserted: KABB's team accuracy is above random-k and its regret below random's; its cold-start accuracy is not
below vanilla Thompson sampling's by more than 0.02 (the paper: above); it calls top_k of the experts per round, and
the all-experts aggregate (a posterior-weighted vote over answer keys) is above random-k (a vote that votes).
"""

from __future__ import annotations

import pytest

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


@pytest.fixture(scope="module")
def mixed_cache():
    from lmlab.data.respcache import load_cache

    try:
        return [load_cache("mixed", seed=s) for s in (0, 1, 2)]
    except FileNotFoundError as e:
        pytest.skip(str(e))


def test_kabb_coordinates_the_zoo_experts(mixed_cache):
    result = run_method("kabb", preset="quick", write=False, show_progress=False, raise_errors=True, seeds=4)
    m = {(r.system, r.metric): r.value for r in result.metrics}
    assert m[("kabb", "accuracy")] > m[("random", "accuracy")]
    assert m[("kabb", "regret")] < m[("random", "regret")]
    assert m[("kabb", "cold_accuracy")] >= m[("thompson", "cold_accuracy")] - 0.02
    assert m[("kabb", "calls_per_round")] == pytest.approx(result.config["top_k"])
    assert m[("all_experts", "accuracy")] > m[("random", "accuracy")]
