"""Invariants of PMF by Gibbs sampling: exact Gaussian conditionals, recovery of a planted low-rank matrix within
its intervals, the per-column normalisation and baselines of the official code, the reveal loop, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from lmlab.data.respcache import ResponseCache
from lmlab.methods.evaluation.pmf_predict import method as M
from lmlab.methods.evaluation.pmf_predict.config import PMFPredictConfig
from lmlab.methods.evaluation.pmf_predict.experiment import slice_matrix


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


def test_mean_of_means_and_global_mean_closed_forms():
    r = np.array([[1.0, np.nan, 3.0], [np.nan, np.nan, 5.0]])
    g = 3.0
    mom = M.mean_of_means_predict(r)
    assert mom[0, 1] == pytest.approx(np.mean([g, 2.0]))  # column 1 unobserved: (global, row)
    assert mom[1, 0] == pytest.approx(np.mean([g, 5.0, 1.0]))
    np.testing.assert_allclose(M.global_mean_predict(r), 3.0)


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
    ],
)
def test_bad_input_is_a_one_line_value_error(call, match):
    with pytest.raises(ValueError, match=match) as e:
        call()
    assert "\n" not in str(e.value)
