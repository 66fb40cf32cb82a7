"""SparseGPT on SmolLM2-135M-Instruct: real layers (error below Wanda's and magnitude's) and the claim's direction."""

from __future__ import annotations

import copy

import pytest
import torch

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_layerwise_error_on_real_layers(smollm2):
    from lmlab.core.pruning import (
        block_linears,
        calibration_windows,
        collect_layer_stats,
        decoder_blocks,
        magnitude_prune,
        sparsegpt_prune_weight,
        token_stream,
        wanda_prune_weight,
    )
    from lmlab.data import load

    model, tok = smollm2
    stream = token_stream(tok, [e.prompt for e in load("corpus", 40, seed=0, split="train")])
    calib = calibration_windows(stream, 16, 128, seed=0)  # 2048 tokens: more than the widest input (1536)
    chosen = {(2, "self_attn.q_proj"), (2, "mlp.down_proj"), (15, "mlp.gate_proj")}
    stats = collect_layer_stats(copy.deepcopy(model), calib, keep=lambda b, n: (b, n) in chosen)
    assert set(stats) == chosen
    for (b, name), st in stats.items():
        w = block_linears(decoder_blocks(model)[b])[name].weight.detach().float()
        rel = {
            "magnitude": st.reconstruction_error(w, magnitude_prune(w, st, 0.7))[1],
            "wanda": st.reconstruction_error(w, wanda_prune_weight(w, st, 0.7))[1],
            "sparsegpt": st.reconstruction_error(w, sparsegpt_prune_weight(w, st, 0.7))[1],
        }
        assert rel["sparsegpt"] < rel["wanda"] < rel["magnitude"], (b, name, rel)


def test_sparsegpt_beats_magnitude(smollm2):
    result = run_method(
        "sparsegpt",
        preset="quick",
        write=False,
        show_progress=False,
        raise_errors=True,
        threads=1,
        speed=False,
    )
    headline = result.claims[0]
    assert (headline.method, headline.baseline) == ("sparsegpt_s50", "magnitude_s50")
    assert headline.status == "supported"
    assert result.metric("sparsegpt_s50", "perplexity").value < result.metric("magnitude_s50", "perplexity").value
    assert result.metric("sparsegpt_s50", "measured_sparsity").value == pytest.approx(0.5)
    assert torch.isfinite(torch.tensor(result.metric("sparsegpt_s50", "nll").value))
