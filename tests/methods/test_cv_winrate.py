"""Invariants of the control-variates win-rate estimator: α = 0 is the human mean, unbiasedness over seeded repeats,
the ρ² saving, agreement with ppi-python where the estimators coincide, the simulated human, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from lmlab.data.respcache import ResponseCache
from lmlab.methods.evaluation.cv_winrate import method as M
from lmlab.methods.evaluation.cv_winrate.config import CVWinrateConfig
from lmlab.methods.evaluation.cv_winrate.experiment import pair_tables


def _population(n_pairs: int = 400, seed: int = 0, bias: float = 0.15) -> tuple[np.ndarray, np.ndarray]:
    """Correlated (z, ẑ): z ∈ {0, ½, 1} from a latent score, ẑ a biased noisy sigmoid of it."""
    rng = np.random.default_rng(seed)
    s = rng.normal(0.3, 1.0, n_pairs)
    z = np.where(np.abs(s) < 0.1, 0.5, (rng.random(n_pairs) < 1 / (1 + np.exp(-3 * s))).astype(float))
    zhat = 1 / (1 + np.exp(-(s + bias * 4 + rng.normal(0, 0.7, n_pairs))))
    return z, zhat


def test_alpha_zero_equals_the_plain_human_mean():
    z, zhat = _population()
    idx = np.arange(0, 400, 7)
    est = M.control_variates_estimate(z[idx], zhat[idx], zhat, alpha=0.0)
    assert est.estimate == z[idx].mean() and est.alpha == 0.0
    assert M.human_only(z[idx], zhat[idx], zhat).estimate == z[idx].mean()
    reps = M.repeat_estimates(z, zhat, 30, 50, seed=1)
    ref = M.repeat_estimates(z, np.zeros_like(zhat), 30, 50, seed=1)  # constant ẑ: fitted α = 0
    np.testing.assert_allclose(ref["cv"], reps["human_only"])


def test_unbiased_over_seeded_repeats_and_synthetic_only_is_not():
    z, zhat = _population()
    theta = z.mean()
    for n in (20, 80):
        reps = M.repeat_estimates(z, zhat, n, 6000, seed=n)
        for k in ("human_only", "ppi", "cv", "cv_ppi++"):
            se = reps[k].std() / np.sqrt(reps[k].size)
            # fixed α (human-only, PPI) is exactly unbiased; the fitted α adds an O(1/n) bias, well inside 4 SE here
            assert abs(reps[k].mean() - theta) < 4 * se + (0.004 if k.startswith("cv") else 0.0), (k, n)
        assert abs(reps["synthetic_only"].mean() - theta) > 0.05


def test_variance_of_the_human_mean_is_the_finite_population_formula():
    z, zhat = _population()
    n, big_n = 40, z.size
    reps = M.repeat_estimates(z, zhat, n, 20000, seed=3)
    expected = (1 - n / big_n) * z.var(ddof=1) / n
    assert reps["human_only"].var() == pytest.approx(expected, rel=0.05)


def test_measured_saving_matches_the_predicted_rho_squared():
    z, zhat = _population(2000, seed=5)
    rho2 = M.predicted_saving(z, zhat)
    assert 0.2 < rho2 < 0.8
    reps = M.repeat_estimates(z, zhat, 200, 8000, seed=6)
    measured = 1 - reps["cv"].var() / reps["human_only"].var()
    assert measured == pytest.approx(rho2, abs=0.04)
    assert reps["cv_covered"].mean() == pytest.approx(0.95, abs=0.02)


def test_predicted_saving_formulas():
    z, zhat = _population()
    rho2 = np.corrcoef(z, zhat)[0, 1] ** 2
    assert M.predicted_saving(z, z) == pytest.approx(1.0)
    assert M.predicted_saving(z, zhat, 50, 200, mode="subset") == pytest.approx(rho2)
    assert M.predicted_saving(z, zhat, 50, 200, mode="pool") == pytest.approx(rho2 * 0.75)
    assert M.predicted_saving(z, zhat, 50, 200, mode="pool-ppi++") == pytest.approx(rho2 / 1.25)
    assert M.labels_needed(z, zhat, 0.05) < M.labels_needed(z, np.zeros_like(zhat) + 0.5, 0.05)


def test_agrees_with_ppi_python_where_the_estimators_coincide():
    ppi_py = pytest.importorskip("ppi_py")
    z, zhat = _population(300, seed=2)
    rng = np.random.default_rng(0)
    idx = rng.choice(300, 60, replace=False)
    ours = M.control_variates_estimate(z[idx], zhat[idx], zhat, alpha="fit")
    # fixed coefficient: PPI++'s point estimate with lam = α, the "unlabeled" set = ẑ on all N, is θ̂_CV
    theirs = ppi_py.ppi_mean_pointestimate(z[idx], zhat[idx], zhat, lam=ours.alpha)
    assert float(np.squeeze(theirs)) == pytest.approx(ours.estimate, abs=1e-12)
    # power tuning: our "ppi++" coefficient is ppi_py's own λ
    tuned = M.control_variates_estimate(z[idx], zhat[idx], zhat, alpha="ppi++")
    assert float(np.squeeze(ppi_py.ppi_mean_pointestimate(z[idx], zhat[idx], zhat))) == pytest.approx(
        tuned.estimate, abs=1e-12
    )
    # PPI (lam = 1) and the classical mean (lam = 0)
    assert float(np.squeeze(ppi_py.ppi_mean_pointestimate(z[idx], zhat[idx], zhat, lam=1.0))) == pytest.approx(
        M.ppi(z[idx], zhat[idx], zhat).estimate, abs=1e-12
    )
    # the CI with an independent unlabeled pool (ppi_py's setting), up to ddof
    pool = zhat[np.setdiff1d(np.arange(300), idx)]
    lo, hi = ppi_py.ppi_mean_ci(z[idx], zhat[idx], pool, alpha=0.05, lam=ours.alpha)
    mine = M.control_variates_estimate(z[idx], zhat[idx], pool, alpha=ours.alpha, labeled_in_all=False)
    assert mine.ci_low == pytest.approx(float(np.squeeze(lo)), abs=0.01)
    assert mine.ci_high == pytest.approx(float(np.squeeze(hi)), abs=0.01)
    # the vectorised repeats use the same λ formula
    lam = M.ppi_plus_plus_lambda(z[idx], zhat[idx], zhat)
    assert tuned.alpha == pytest.approx(lam)


def test_simulated_human_ties_and_probabilities():
    qa = np.array([1.0, 1.0, 0.0, 0.5])
    qb = np.array([0.0, 0.98, 1.0, 0.5])
    z, p = M.simulated_human(qa, qb, tau=0.25, eps=0.05, seed=0)
    assert z[1] == 0.5 and z[3] == 0.5 and p[1] == 0.5
    assert p[0] == pytest.approx(1 / (1 + np.exp(-4))) and p[2] == pytest.approx(1 / (1 + np.exp(4)))
    np.testing.assert_array_equal(z, M.simulated_human(qa, qb, tau=0.25, eps=0.05, seed=0)[0])


def test_logistic_judge_learns_the_planted_direction():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 3))
    y = (rng.random(500) < 1 / (1 + np.exp(-2 * x[:, 0]))).astype(float)
    judge = M.LogisticJudge(l2=0.1).fit(x, y)
    p = judge.predict(x)
    assert np.corrcoef(p, x[:, 0])[0, 1] > 0.95


def test_pair_tables_fills_missing_logprobs_with_the_variant_mean():
    recs = [{"variant": v, "query_id": f"q{q}", "task": "t", "correct": float(q % 2), "cost_flops": 1.0,
             "answer_logprob": (None if (v == "a" and q == 0) else -1.0 - q), "n_gen_tokens": q}
            for v in ("a", "b") for q in range(3)]  # fmt: skip
    vids, cols = pair_tables(ResponseCache.from_records(recs))
    assert vids == ["a", "b"]
    assert cols["logprob"][0, 0] == pytest.approx(np.mean([-2.0, -3.0]))
    np.testing.assert_array_equal(cols["ntok"][1], [0, 1, 2])


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: M.control_variates_estimate([], [], [0.5]), "z_labeled is empty"),
        (lambda: M.control_variates_estimate([1, 0], [0.5], [0.5, 0.5]), "same length"),
        (lambda: M.control_variates_estimate([1, 0, 1], [0.5, 0.4, 0.3], [0.5]), "N >= n"),
        (lambda: M.control_variates_estimate([1, 0], [0.5, 0.4], [0.5, 0.4], alpha="best"), "alpha must be"),
        (lambda: M.control_variates_estimate([1, np.nan], [0.5, 0.4], [0.5, 0.4]), "finite"),
        (lambda: M.repeat_estimates([1, 0, 1], [0.2, 0.3, 0.4], 5, 10), "n must be in"),
        (lambda: M.simulated_human([1.0], [0.0], tau=0.0, eps=0.1), "tau must be > 0"),
        (lambda: M.predicted_saving([1, 0], [0.2, 0.4], 2, 4, mode="exact"), "mode must be"),
        (lambda: CVWinrateConfig(n_labels=[1, 10]), "n_labels"),
        (lambda: CVWinrateConfig(tau=-1.0), "tau must be in"),
    ],
)
def test_bad_input_is_a_one_line_value_error(call, match):
    with pytest.raises(ValueError, match=match) as e:
        call()
    assert "\n" not in str(e.value)
