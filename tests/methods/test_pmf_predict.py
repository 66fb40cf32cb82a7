"""Invariants of PMF by Gibbs sampling: exact Gaussian conditionals, recovery of a planted low-rank matrix within
its intervals, the per-column normalisation and baselines of the official code (on its normalised scale), the reveal
loop and its heuristic order, and the experiment's design (issue 35): the gated PMF is the paper's, the calibration
gate compares with a heuristic, the (cache seed, task) cluster is the CI unit; bad input."""

from __future__ import annotations

import numpy as np
import pytest

from lmlab.data.respcache import ResponseCache
from lmlab.methods.evaluation.pmf_predict import experiment as E
from lmlab.methods.evaluation.pmf_predict import method as M
from lmlab.methods.evaluation.pmf_predict.config import PMFPredictConfig
from lmlab.methods.evaluation.pmf_predict.experiment import slice_matrix
from lmlab.runner import run_method

SMOKE = dict(preset="smoke", write=False, plots=False, show_progress=False, raise_errors=True)


@pytest.fixture(scope="module")
def smoke_result():
    """The smoke run (3 synthetic cache seeds), with the cache seeds it loaded in ``loaded_seeds``."""
    loaded = []
    real = E.load_table

    def spy(name, seed):
        loaded.append(seed)
        return real(name, seed)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(E, "load_table", spy)
        res = run_method("pmf_predict", **SMOKE)  # default cache_seeds: [0, 1, 2]
    res.flags["loaded_seeds"] = loaded
    return res


def test_block_update_draws_from_the_exact_gaussian_conditional():
    rng = np.random.default_rng(0)
    d, n = 3, 7
    v = rng.normal(size=(n, d))
    z = rng.normal(size=(1, n))
    obs = np.ones((1, n), bool)
    obs[0, 2] = False
    alpha = 2.0
    prec = np.eye(d) + alpha * v[obs[0]].T @ v[obs[0]]
    mean = np.linalg.solve(prec, alpha * v[obs[0]].T @ z[0, obs[0]])
    draws = np.stack([M._sample_rows(v, z, obs, alpha, np.eye(d), np.zeros(d), rng)[0] for _ in range(20000)])
    np.testing.assert_allclose(draws.mean(0), mean, atol=0.02)
    np.testing.assert_allclose(np.cov(draws, rowvar=False), np.linalg.inv(prec), atol=0.02)


@pytest.mark.parametrize("prior", ["fixed", "bpmf"])
def test_recovers_a_planted_low_rank_matrix_within_its_intervals(prior):
    truth, noisy = M.synthetic_low_rank(20, 30, 2, noise=0.05, seed=1)
    train, test = M.split_cells(noisy, 0.3, seed=2)
    pred = M.PMF(rank=10, alpha=100.0, n_burn=150, n_draws=150, prior=prior, seed=3).fit(train).predict()
    held = np.isfinite(test)
    true_held = np.where(held, truth, np.nan)
    err = M.rmse(pred.mean, true_held)
    assert err < 0.2 * M.rmse(M.mean_of_means_predict(train), true_held), err
    lo, hi = pred.interval(0.9)
    assert M.coverage(lo, hi, test) >= 0.8  # predictive intervals hold the noisy held-out cells
    assert M.coverage(lo, hi, true_held) >= 0.8
    assert pred.draws.shape == (150, 20, 30) and (pred.predictive_std > pred.std).all()


def test_same_seed_same_draws_and_another_seed_differs():
    _, r = M.synthetic_low_rank(6, 8, 2, seed=0)
    train, _ = M.split_cells(r, 0.25, seed=0)
    a = M.PMF(rank=2, n_burn=5, n_draws=5, seed=4).fit(train).predict()
    b = M.PMF(rank=2, n_burn=5, n_draws=5, seed=4).fit(train).predict()
    c = M.PMF(rank=2, n_burn=5, n_draws=5, seed=5).fit(train).predict()
    np.testing.assert_array_equal(a.draws, b.draws)
    assert not np.allclose(a.draws, c.draws)


def test_column_normalisation_falls_back_to_global_stats_below_five_observations():
    r = np.array([[1.0, 10.0], [2.0, np.nan], [3.0, np.nan], [4.0, np.nan], [5.0, 12.0]])
    z, mu, sd = M.column_normalise(r)
    assert mu[0] == pytest.approx(3.0) and sd[0] == pytest.approx(np.std([1, 2, 3, 4, 5]))
    assert mu[1] == pytest.approx(np.nanmean(r)) and sd[1] == pytest.approx(np.nanstd(r))
    np.testing.assert_allclose(z[:, 0], (r[:, 0] - 3.0) / np.std([1, 2, 3, 4, 5]))


def test_baselines_run_on_the_column_normalised_scale_as_run_pmf():
    # run_pmf.py passes the column-normalised train matrix to every baseline and de-normalises (recomm_eval)
    rng = np.random.default_rng(0)
    r = np.column_stack([rng.uniform(0, 1, 8), 10 + 5 * rng.uniform(0, 1, 8), rng.uniform(0, 0.1, 8)])  # (8, 3)
    train, _ = M.split_cells(r, 0.1, seed=0)  # every column keeps >= 5 observations
    z, mu, sd = M.column_normalise(train)
    g, rows, cols = np.nanmean(z), np.nanmean(z, axis=1), np.nanmean(z, axis=0)
    official = (g + rows[:, None] + cols[None, :]) / 3.0 * sd + mu
    np.testing.assert_allclose(M.mean_of_means_predict(train), official)
    np.testing.assert_allclose(M.global_mean_predict(train), np.broadcast_to(g * sd + mu, r.shape))
    assert not np.allclose(M.mean_of_means_predict(train, normalise=False), official)  # the raw scale differs
    np.testing.assert_allclose(M.global_mean_predict(train, normalise=False), np.nanmean(train))


def test_mean_of_means_and_global_mean_closed_forms():
    r = np.array([[1.0, np.nan, 3.0], [np.nan, np.nan, 5.0]])
    g = 3.0
    mom = M.mean_of_means_predict(r)
    assert mom[0, 1] == pytest.approx(np.mean([g, 2.0]))  # column 1 unobserved: (global, row)
    assert mom[1, 0] == pytest.approx(np.mean([g, 5.0, 1.0]))
    np.testing.assert_allclose(M.global_mean_predict(r), 3.0)
    # < 5 observations per column: one global affine map, so the normalised and raw forms agree
    np.testing.assert_allclose(mom, M.mean_of_means_predict(r, normalise=False))


def test_als_mf_fits_a_rank_one_matrix():
    r = np.outer(np.arange(1, 9), np.arange(1, 7)).astype(float)
    train, test = M.split_cells(r, 0.2, seed=0)
    assert M.rmse(M.als_mf_predict(train, 2, 1e-3), test) < 0.1 * M.rmse(M.global_mean_predict(train), test)


def test_suggest_returns_the_most_uncertain_unobserved_cells():
    _, r = M.synthetic_low_rank(8, 10, 2, seed=0)
    train, _ = M.split_cells(r, 0.5, seed=1)
    pmf = M.PMF(rank=2, n_burn=10, n_draws=20, seed=0).fit(train)
    cells = pmf.suggest(5)
    std = pmf.predict().std
    assert all(not np.isfinite(train[i, j]) for i, j in cells)
    stds = [std[i, j] for i, j in cells]
    assert stds == sorted(stds, reverse=True)
    rest = [std[i, j] for i, j in np.argwhere(~np.isfinite(train)) if (i, j) not in cells]
    assert min(stds) >= max(rest)


def test_active_reveal_counts_revealed_cells_as_known():
    _, r = M.synthetic_low_rank(6, 8, 2, seed=0)
    train, test = M.split_cells(r, 0.5, seed=1)
    n_hidden = int(np.isfinite(test).sum())
    fit = lambda t: M.PMF(rank=2, n_burn=5, n_draws=5, seed=0).fit(t).predict()  # noqa: E731
    for strat in ("uncertainty", "random", "oracle"):
        curve = M.active_reveal(r, train, test, strategy=strat, rounds=1, step=n_hidden, fit=fit)
        assert len(curve) == 2 and curve[1] == 0.0  # everything revealed: no error left
    a = M.active_reveal(r, train, test, strategy="uncertainty", rounds=0, step=1, fit=fit)
    b = M.active_reveal(r, train, test, strategy="random", rounds=0, step=1, fit=fit)
    assert a == b  # round 0 is the same fit


def test_binomial_sd_and_the_heuristic_reveal_order():
    np.testing.assert_allclose(M.binomial_sd(np.array([0.5, 0.0, 1.2, -0.1]), 4), [0.25, 0.0, 0.0, 0.0])
    _, r = M.synthetic_low_rank(6, 8, 2, seed=0)
    train, test = M.split_cells(r, 0.5, seed=1)
    fit = lambda t: M.PMF(rank=2, n_burn=5, n_draws=5, seed=0).fit(t).predict()  # noqa: E731
    score = np.arange(r.size, dtype=float).reshape(r.shape)  # the heuristic: later cells first
    path = M.reveal_path(r, train, test, strategy="heuristic", rounds=1, step=3, fit=fit,
                         heuristic=lambda p, t: score)  # fmt: skip
    revealed = np.isfinite(test) & (path[1] == r) & (path[0] != r)
    hidden = np.argwhere(np.isfinite(test))
    top3 = {tuple(x) for x in hidden[np.argsort(-score[hidden[:, 0], hidden[:, 1]])[:3]]}
    assert {tuple(x) for x in np.argwhere(revealed)} == top3
    with pytest.raises(ValueError, match="needs heuristic"):
        M.reveal_path(r, train, test, strategy="heuristic", rounds=1, step=1, fit=fit)


def test_group_mse_splits_the_held_out_error_by_task():
    truth = np.array([[1.0, np.nan, 3.0], [np.nan, 2.0, np.nan]])
    pred = np.zeros((2, 3))
    out = M.group_mse(pred, truth, ["a", "a", "b"])
    assert out == {"a": pytest.approx((1 + 4) / 2), "b": pytest.approx(9.0)}
    only_a = np.array([[1.0, np.nan, np.nan], [np.nan, np.nan, np.nan]])
    assert M.group_mse(pred, only_a, ["a", "a", "b"]) == {"a": 1.0}  # a task with no held-out cell is left out


def test_gated_pmf_is_the_paper_default_even_when_tuning_picks_another(monkeypatch, smoke_result):
    # the review: the gated "pmf" was the tuned PMF (D = 2 in 6 of 10 masks, worse than the paper's D = 10, α = 2)
    plain = smoke_result  # tune=False
    monkeypatch.setattr(E, "_tune", lambda train, grid, fit, vf, seed: (grid[-1], []))  # tuning picks the last entry
    tuned = run_method("pmf_predict", tune=True, **SMOKE)
    rows = lambda res: {(m.system, m.metric): m.value for m in res.metrics}  # noqa: E731
    a, b = rows(plain), rows(tuned)
    for metric in ("rmse_m20", "rmse_m80"):
        assert a[("pmf", metric)] == b[("pmf", metric)]  # the gated system ignores the tuning
    assert b[("pmf_tuned", "rmse_m20")] != b[("pmf", "rmse_m20")]  # the tuned one is reported beside it
    gated = {(c.metric, c.method) for c in tuned.claims if c.gate}
    assert ("mse_m20", "pmf") in gated and not any(m == "pmf_tuned" for _, m in gated)


def test_calibration_is_gated_against_a_heuristic_not_a_constant(smoke_result):
    gated = [c for c in smoke_result.claims if c.gate and c.metric == "unc_err_spearman"]
    assert len(gated) == 1
    row = next(m for m in smoke_result.metrics if m.system == gated[0].baseline and m.metric == "unc_err_spearman")
    assert row.ci_high > row.ci_low  # the baseline's ranking varies with the data: not the constant 0
    assert gated[0].baseline == "binomial_sd"


def test_cache_seed_and_task_are_the_ci_unit(smoke_result):
    res = smoke_result
    assert res.flags["loaded_seeds"] == [0, 1, 2]
    n_tasks = E.SYNTHETIC["n_tasks"]
    for c in (c for c in res.claims if c.gate):
        # one cluster per (cache seed, task); the masks of one matrix overlap and are not counted as units
        assert c.n == 3 * n_tasks, (c.text, c.n)
        assert c.n_values > c.n
    per_seed = res.tables["per_cache_seed"]
    assert {k for k in per_seed[0] if k.startswith("effect_")} == {"effect_s0", "effect_s1", "effect_s2"}
    assert all(r["seeds_in_direction"].endswith("of 3") for r in per_seed)


def test_slice_matrix_averages_each_task_chunk():
    recs = []
    for v, acc in (("a", [1, 1, 0, 0]), ("b", [0, 0, 1, 1]), ("c", [1, 0, 1, 0])):
        for q, c in enumerate(acc):
            recs.append({"variant": v, "query_id": f"q{q}", "task": "t0" if q < 2 else "t1", "correct": c,
                         "cost_flops": 1.0})  # fmt: skip
    cache = ResponseCache.from_records(recs)
    vids, names, r = slice_matrix(cache, 2)
    assert vids == ["a", "b", "c"] and names == ["t0#0", "t1#0"]
    np.testing.assert_allclose(r, [[1, 0], [0, 1], [0.5, 0.5]])
    _, names1, r1 = slice_matrix(cache, 1)
    assert names1 == ["t0#0", "t0#1", "t1#0", "t1#1"] and r1.shape == (3, 4)


def test_crosspred_json_loader(tmp_path):
    p = tmp_path / "r.json"
    p.write_text('{"m1": {"d1": 0.5, "d2": 0.7}, "m2": {"d2": 0.1}}')
    models, datasets, r = M.load_crosspred_json(str(p))
    assert models == ["m1", "m2"] and datasets == ["d1", "d2"]
    assert np.isnan(r[1, 0]) and r[0, 1] == 0.7


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: M.PMF(rank=0), "rank must be >= 1"),
        (lambda: M.PMF(alpha=0.0), "alpha"),
        (lambda: M.PMF(prior="lkj"), "prior must be"),
        (lambda: M.PMF().fit(np.full((3, 3), np.nan)), "no observed cell"),
        (lambda: M.PMF().fit(np.zeros(4)), "2-D matrix"),
        (lambda: M.PMF().predict(), "needs fit"),
        (lambda: M.split_cells(np.ones((3, 3)), 1.5, 0), "fraction must be in"),
        (
            lambda: M.active_reveal(
                np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), strategy="best", rounds=1, step=1, fit=None
            ),
            "strategy must be",
        ),  # fmt: skip
        (lambda: PMFPredictConfig(mask_levels=[0.2, 1.0]), "mask_levels entries"),
        (lambda: PMFPredictConfig(pmf_grid=[[10, 2.0]]), "same size"),
        (lambda: PMFPredictConfig(cache=""), "cache must name"),
        (lambda: PMFPredictConfig(cache_seeds=[]), "cache_seeds must list"),
        (lambda: PMFPredictConfig(cache_seeds=[0, 0]), "cache_seeds must list"),
        (lambda: M.binomial_sd(np.ones(2), 0), "items must be"),
        (lambda: M.group_mse(np.ones((2, 2)), np.ones((2, 2)), ["a"]), "groups must label"),
    ],
)
def test_bad_input_is_a_one_line_value_error(call, match):
    with pytest.raises(ValueError, match=match) as e:
        call()
    assert "\n" not in str(e.value)
