"""State tracking at CPU scale: trained S3 trackers learn the task, prune by parity when they fail, patching is exact.

The AA-vs-PAA claim needs many seeds (unpaired, clustered by seed: >= 6 per mechanism), beyond a ~25 s test, so
this test asserts documented proxies that were stable in every run we made (README, Reproduction): one seed of
plain training for 800 steps (below the default's 2000-step cap, where training stops once validation accuracy
reaches 0.95) lifts accuracy at the training length far above chance without reaching the 0.9 'learned' bar, so the
run is not labelled (issue 35: only learned runs vote AA / PAA); its accuracy falls beyond the training length, its
errors keep the parity far above chance (the PAA signature), and full patching reproduces the counterfactual.
"""

from __future__ import annotations

import pytest

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_s3_trackers_learn_and_their_errors_keep_the_parity():
    result = run_method(
        "state_tracking",
        preset="quick",
        write=False,
        show_progress=False,
        raise_errors=True,
        threads=2,
        conditions=["plain"],
        seeds=1,
        steps=800,  # a cap below the default's 2000: the run trains all 800 (validation stays under 0.95)
        n_eval=256,  # halved: mechanism on one half of the stories, outcomes on the other
        n_patch=32,
    )
    (row,) = result.tables["runs"]
    assert row["acc_at_T"] > 1 / 6 + 0.2, row
    if row["acc_at_T"] < 0.9:  # below the bar a run is never labelled, whatever its mechanism indices say
        assert not row["learned"], row
    assert row["long_acc"] < row["acc_at_T"]  # no length generalisation beyond the training length at this scale
    assert row["gen_index"] > 0.3, row  # errors stay in the right parity coset far more often than chance (0.4)
    assert result.metric("full_patch", "normalised_ld").value == pytest.approx(1.0)
    trackers = next(c for c in result.claims if c.method == "trackers")
    assert trackers.method_value > trackers.baseline_value
