"""Cascade routing on the committed "mixed" response caches (real zoo variants, cache seeds 0, 1, 2; no model is
loaded, but the caches are built from real models, hence slow): the trimmed quick preset's claim directions.

Asserted, with no tolerance (the paper's direction, not "at most one point below"): cascade routing's AUC (mean over
the cache seeds) is above routing's and the optimal cascade's, and neither check comes out "not_supported"; in the
simulation sweep it gains over the best baseline at low noise (larger at low than at high noise, the paper's
"estimator quality drives the gains", is not asserted: the default run finds it inconclusive, pointing the other way).
The linear interpolation of single models is only reported.
"""

from __future__ import annotations

import pytest

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

CACHE_SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def mixed_caches():
    from lmlab.data.respcache import load_cache

    try:
        return [load_cache("mixed", seed=s) for s in CACHE_SEEDS]
    except FileNotFoundError as e:
        pytest.skip(str(e))


def test_cascade_routing_beats_routing_and_cascading_on_the_zoo(mixed_caches):
    result = run_method("cascade_routing", preset="quick", write=False, show_progress=False, raise_errors=True,
                        cache_seeds=list(CACHE_SEEDS), noise_levels=[[0.6, 0.3], [2.4, 1.2]])  # fmt: skip
    m = {(r.system, r.metric): r.value for r in result.metrics}
    cr = m[("cascade_routing", "auc")]
    assert cr > m[("router", "auc")]
    assert cr > m[("optimal_cascade", "auc")]
    gated = {(c.method, c.baseline): c for c in result.claims if c.gate}
    assert gated[("cascade_routing", "router")].status != "not_supported"
    assert gated[("cascade_routing", "optimal_cascade")].status != "not_supported"
    # the low-vs-high-noise direction is not asserted: the default run (3 cache seeds) found it inconclusive with the
    # opposite point estimate (README, Verdict); that cascade routing gains over the best baseline at low noise is
    assert m[("sim_low", "gain_over_best_baseline")] > 0
    assert result.flags["lambda0_picks_best_quality_set"] is True
