"""ATP on SmolLM2-135M: an increasing progression beats uniform 70% Wanda on held-out text (trimmed quick run)."""

from __future__ import annotations

import pytest

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_progression_beats_uniform_on_smollm2(smollm2):
    result = run_method(
        "atp", preset="quick", write=False, show_progress=False, raise_errors=True,
        betas=[0.0, 0.008], owl=False, cloze=False, n_calib=4, n_val=2, n_test=6,
    )  # fmt: skip
    assert result.flags["beta_star_wanda"] in (0.0, 0.008)
    uniform = result.metric("wanda_uniform", "nll")
    atp = result.metric("wanda_atp", "nll")
    # the mean sparsity is the same (per-row flooring aside) ...
    su, sa = (result.metric(s, "measured_sparsity").value for s in ("wanda_uniform", "wanda_atp"))
    assert abs(su - sa) < 0.005 and abs(su - 0.7) < 0.01
    # ... and the progression is chosen on validation and lowers test NLL and the last block's error (explosion)
    assert result.flags["beta_star_wanda"] == 0.008
    assert atp.value < uniform.value
    last = {s: result.metric(s, "last_block_dense_error").value for s in ("wanda_uniform", "wanda_atp")}
    assert last["wanda_atp"] < last["wanda_uniform"]
