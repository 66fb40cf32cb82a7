"""SparseGPT on the tiny llama and on synthetic layers: N:M validity, error below Wanda's, config, the smoke run."""

from __future__ import annotations

import copy

import pytest
import torch

from lmlab.core.pruning import block_linears, collect_layer_stats, decoder_blocks, nm_valid, wanda_prune_weight
from lmlab.methods.compression.sparsegpt import sparsegpt_prune, sparsegpt_prune_weight
from lmlab.methods.compression.sparsegpt.config import SparseGPTConfig
from lmlab.runner import run_method


def _calib(n: int = 4, seq: int = 32) -> torch.Tensor:
    return torch.randint(4, 260, (n, seq), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("structure", ["2:4", "4:8"])
def test_nm_pattern_valid_on_every_linear(tiny_llama, structure):
    model = copy.deepcopy(tiny_llama)
    n, m = map(int, structure.split(":"))
    report = sparsegpt_prune(model, _calib(), 0.5, structure)
    for block in decoder_blocks(model):
        for lin in block_linears(block).values():
            assert nm_valid(lin.weight, n, m)
    assert report.sparsity == pytest.approx(0.5)


def test_error_below_wanda_on_every_tiny_layer(tiny_llama):
    # same dense statistics, same layer: OBS with weight updates reconstructs better than Wanda's mask alone
    stats = collect_layer_stats(copy.deepcopy(tiny_llama), _calib(8, 64))
    for (b, name), st in stats.items():
        w = dict(block_linears(decoder_blocks(tiny_llama)[b]))[name].weight.detach().float()
        e_sgpt = st.reconstruction_error(w, sparsegpt_prune_weight(w, st, 0.5))[0]
        e_wanda = st.reconstruction_error(w, wanda_prune_weight(w, st, 0.5))[0]
        assert e_sgpt < e_wanda, (b, name)


def test_weight_update_changes_kept_weights():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 32, generator=g)
    from lmlab.core.pruning import LayerStats

    st = LayerStats(0, "x", 2, 256, x.T @ x)
    w = torch.randn(16, 32, generator=g)
    out = sparsegpt_prune_weight(w, st, 0.5)
    kept = out != 0
    assert not torch.equal(out[kept], w[kept])  # OBS compensates on the surviving weights
    assert torch.equal(sparsegpt_prune_weight(w, st, 0.0), w)


def test_config():
    assert SparseGPTConfig().baselines == ["magnitude", "wanda"]
    with pytest.raises(ValueError, match="baselines entries"):
        SparseGPTConfig(baselines=["sparsegpt"])
    with pytest.raises(ValueError, match="block_size"):
        SparseGPTConfig(block_size=0)


def test_smoke_run_reuses_the_wanda_baseline():
    r = run_method("sparsegpt", preset="smoke", write=False, show_progress=False, raise_errors=True, threads=1)
    gating = [c for c in r.claims if c.gate]
    assert [(c.method, c.baseline, c.metric) for c in gating] == [
        ("sparsegpt_s50", "magnitude_s50", "nll"),
        ("sparsegpt_2:4", "magnitude_2:4", "nll"),
        ("sparsegpt_s50", "wanda_s50", "layer_rel_error"),
    ]
    assert r.metric("sparsegpt_s50", "layer_rel_error").value < r.metric("wanda_s50", "layer_rel_error").value
    assert r.metric("sparsegpt_2:4", "measured_sparsity").value == pytest.approx(0.5)
