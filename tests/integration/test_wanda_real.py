"""Wanda on SmolLM2-135M-Instruct: the claim's direction on a trimmed quick run, and the saved model loads back."""

from __future__ import annotations

import pytest
import torch

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_wanda_beats_magnitude_and_saved_model_loads_back(smollm2, tmp_path):
    folder = tmp_path / "smollm2-wanda50"
    result = run_method(
        "wanda",
        preset="quick",
        write=False,
        show_progress=False,
        raise_errors=True,
        threads=1,
        n_calib=4,
        n_eval=8,
        speed=False,
        save_model=str(folder),
    )
    ppl = {s: result.metric(s, "perplexity").value for s in ("dense", "wanda_s50", "magnitude_s50")}
    # the claim: Wanda far below magnitude at 50% unstructured, both above the dense model
    assert ppl["dense"] < ppl["wanda_s50"] < ppl["magnitude_s50"]
    headline = result.claims[0]
    assert headline.method == "wanda_s50" and headline.status == "supported"
    assert result.metric("wanda_s50", "measured_sparsity").value == pytest.approx(0.5)
    # per-linear reconstruction error: Wanda's activation-aware mask beats magnitude's on average
    assert (
        result.metric("wanda_s50", "layer_rel_error").value < result.metric("magnitude_s50", "layer_rel_error").value
    )

    # the saved folder is a standard HF model that lmlab loads as --model, sparsity intact
    from lmlab.core.inference.models import load_model
    from lmlab.core.pruning import model_sparsity

    model, tok = load_model(str(folder), fresh=True)
    assert model_sparsity(model)["sparsity"] == pytest.approx(0.5)
    ids = tok("The quick brown fox jumps over the lazy dog.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids).logits).all()
