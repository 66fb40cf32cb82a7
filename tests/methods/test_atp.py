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


def test_search_patience_stops_past_the_minimum_of_a_u_shaped_curve():
    calls: list[float] = []

    def u_shaped(rates):  # minimum at beta = 0.008; evaluated in grid order
        beta = rates[1] - rates[0]
        calls.append(beta)
        return 100.0 + 1e6 * (beta - 0.008) ** 2

    grid = [0.0, 0.004, 0.008, 0.012, 0.016, 0.02]
    full = search_beta(u_shaped, 30, 0.7, grid)
    assert len(calls) == 6 and full.best_beta == pytest.approx(0.008)
    calls.clear()
    early = search_beta(u_shaped, 30, 0.7, grid, patience=1)
    assert calls == pytest.approx([0.0, 0.004, 0.008, 0.012])  # stopped at the first beta worse than 0.008
    assert early.best_beta == full.best_beta and len(early.table) == 4
    calls.clear()
    assert search_beta(u_shaped, 30, 0.7, grid, patience=2).best_beta == pytest.approx(0.008)
    assert len(calls) == 5
    with pytest.raises(ValueError, match="patience=-1"):
        search_beta(u_shaped, 30, 0.7, grid, patience=-1)


def test_sweep_levels_run_every_allocation_at_their_own_mean(tmp_path):
    """The smoke preset sweeps S = 0.5 beside the headline 0.7: every allocation and pruner at each level, named
    with the level's suffix, each pruned to that level's mean sparsity, with ungated sweep claims."""
    from lmlab.runner import run_method

    result = run_method("atp", preset="smoke", model="tiny-llama", write=False, show_progress=False,
                        raise_errors=True, threads=1)  # fmt: skip
    for level, suffix in ((0.7, ""), (0.5, "_s50")):
        for system in ("wanda_uniform", "wanda_atp", "wanda_owl", "sparsegpt_uniform", "sparsegpt_atp"):
            measured = result.metric(system + suffix, "measured_sparsity").value
            assert measured == pytest.approx(level, abs=0.02), (system + suffix, measured)
    assert "beta_star_wanda_s50" in result.flags
    sweep_claims = [c for c in result.claims if c.text.startswith("sweep:")]
    assert sweep_claims and not any(c.gate for c in sweep_claims)
    assert "wanda_reverse_s50" not in {m.system for m in result.metrics}


def test_owl_lambda_is_searched_with_the_same_budget_as_beta():
    """Equal tuning: OWL's lambda is chosen on the same validation windows, by the same grid walk and patience,
    from as many candidates as ATP's beta grid (it was fixed at 0.08 while ATP's beta was tuned)."""
    from lmlab.methods.compression.atp.method import walk_grid
    from lmlab.registry import get_method
    from lmlab.runner import resolve_config, run_method

    cfg = resolve_config(get_method("atp"), preset="default")
    assert len(cfg.owl_lambdas) == len(cfg.betas) and cfg.owl_lambda in cfg.owl_lambdas
    result = run_method("atp", preset="smoke", model="tiny-llama", write=False, show_progress=False,
                        raise_errors=True, threads=1)  # fmt: skip
    for suffix in ("", "_s50"):
        curve = result.tables[f"owl_lambda_search{suffix}"]
        assert 1 <= len(curve) <= len(result.config["owl_lambdas"])
        best = min(curve, key=lambda r: (r["val_ppl"], r["lambda"]))["lambda"]
        assert result.flags[f"owl_lambda_star{suffix}"] == pytest.approx(best)
    # the walk's patience rule is the beta search's
    assert [r["x"] for r in walk_grid(lambda x: {1: 3.0, 2: 2.0, 3: 2.5, 4: 1.0}[x], [1, 2, 3, 4], 1, key="x")] == [
        1.0, 2.0, 3.0]  # fmt: skip
