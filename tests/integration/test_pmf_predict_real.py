"""PMF on the committed real response cache ("mixed": the zoo's variants x task slices), a trimmed quick preset.

No model is loaded: the cache holds the zoo's graded answers. The claim's direction asserted: PMF's held-out RMSE
below mean-of-means at 20% masking (averaged over the masks) and its posterior std positively rank-correlated with
the actual error; the active-evaluation ordering is too noisy at 6 masks to assert and is only checked to run.
"""

from __future__ import annotations

import math

import pytest

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow]


def test_pmf_beats_mean_of_means_on_the_real_cache():
    from lmlab.data.respcache import load_cache

    try:
        load_cache("mixed", 0)
    except FileNotFoundError as e:
        pytest.skip(str(e))
    result = run_method("pmf_predict", preset="quick", write=False, show_progress=False, raise_errors=True,
                        mask_levels=[0.2], active_rounds=2)  # fmt: skip
    m = {(r.system, r.metric): r.value for r in result.metrics}
    assert result.flags["matrix"]["variants"] >= 5
    assert m[("pmf", "rmse_m20")] < m[("mean_of_means", "rmse_m20")]
    assert m[("pmf", "unc_err_spearman")] > 0
    assert math.isfinite(m[("uncertainty_reveal", "active_auc")])
