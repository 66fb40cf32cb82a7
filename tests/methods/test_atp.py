"""ATP allocation invariants: mean = S, monotone in depth, legality, grid and search."""

from __future__ import annotations

import pytest

from lmlab.methods.compression.atp.method import beta_grid, layer_sparsities, max_beta, search_beta


@pytest.mark.parametrize(("blocks", "target", "beta"), [(30, 0.7, 0.01), (32, 0.5, 0.02), (2, 0.6, 0.3)])
def test_rates_average_to_target_and_stay_in_range(blocks, target, beta):
    rates = layer_sparsities(blocks, target, beta)
    assert len(rates) == blocks
    assert sum(rates) / blocks == pytest.approx(target)
    assert all(0.0 <= r <= 1.0 for r in rates)
    assert all(b > a for a, b in zip(rates, rates[1:]))  # block 0 (next to the embeddings) is the densest
    assert rates[1] - rates[0] == pytest.approx(beta)


def test_uniform_and_reverse():
    assert layer_sparsities(4, 0.5, 0.0) == [0.5] * 4
    rev = layer_sparsities(4, 0.5, -0.1)
    assert rev == pytest.approx(list(reversed(layer_sparsities(4, 0.5, 0.1))))


def test_legality_bound_matches_paper_numbers():
    assert max_beta(32, 0.7) == pytest.approx(0.6 / 31)  # ~0.0194, the spec's LLaMA-2-7B value
    assert max_beta(30, 0.7) == pytest.approx(0.6 / 29)  # ~0.0207 for SmolLM2
    edge = layer_sparsities(30, 0.7, max_beta(30, 0.7))
    assert edge[-1] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="beta=0.03: illegal"):
        layer_sparsities(30, 0.7, 0.03)
    with pytest.raises(ValueError, match="sparsity"):
        layer_sparsities(30, 1.5, 0.0)


def test_grid_is_the_official_one():
    grid = beta_grid(30, 0.7)
    assert grid[0] == 0.0 and grid[1] == pytest.approx(0.002)
    assert grid[-1] <= max_beta(30, 0.7)
    assert len(grid) == 11  # 0, 0.002, ..., 0.020 (beta_max = 0.0207)
    assert beta_grid(30, 0.7, stop=0.014)[-1] == pytest.approx(0.014)


def test_search_picks_the_minimum_on_a_convex_profile():
    # a U-shaped validation score, minimal at beta = 0.006
    def fake_ppl(rates):
        beta = rates[1] - rates[0]
        return 100.0 + 1e6 * (beta - 0.006) ** 2

    result = search_beta(fake_ppl, 30, 0.7, beta_grid(30, 0.7, stop=0.014))
    assert result.best_beta == pytest.approx(0.006)
    assert len(result.table) == 8
    assert result.sparsities == layer_sparsities(30, 0.7, result.best_beta)
