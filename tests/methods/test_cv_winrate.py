"""Invariants of the control-variates win-rate estimator: α = 0 is the human mean, unbiasedness over seeded repeats,
the ρ² saving, agreement with ppi-python where the estimators coincide, the clipped α and estimate, the planted
judges of the ρ² sweep and the claims they gate, the simulated human, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from lmlab.data.respcache import ResponseCache
from lmlab.methods.evaluation.cv_winrate import method as M
from lmlab.methods.evaluation.cv_winrate.config import CVWinrateConfig
from lmlab.methods.evaluation.cv_winrate.experiment import _claims, pair_tables, simulated_sweep
from lmlab.results import Claim


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


def _flat_judge_population(n_pairs: int = 120, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A judge like the zoo's log-prob one: nearly constant ẑ (spread 1e-3) with 5% far outliers, unrelated to z."""
    rng = np.random.default_rng(seed)
    z = rng.choice([0.0, 0.5, 1.0], n_pairs, p=[0.3, 0.3, 0.4])
    zhat = 0.5 + 1e-3 * rng.standard_normal(n_pairs)
    zhat[rng.choice(n_pairs, n_pairs // 20, replace=False)] = 0.99
    return z, zhat


def test_fitted_alpha_is_clipped_so_a_flat_judge_keeps_the_win_rate_in_range():
    # the labeled pairs miss the outliers: Var(ẑ_H) ~ 1e-6, so Cov/Var is in the hundreds (the official, unclipped α)
    z, zhat = _flat_judge_population()
    idx = np.flatnonzero(zhat < 0.9)[:10]
    est = M.control_variates_estimate(z[idx], zhat[idx], zhat)
    assert 0.0 <= est.alpha <= 2.0  # ALPHA_CLIP
    assert 0.0 <= est.ci_low <= est.estimate <= est.ci_high <= 1.0
    raw = M.fit_alpha(z[idx], zhat[idx], clip=None)
    assert abs(raw) > 10
    official = M.control_variates_estimate(z[idx], zhat[idx], zhat, alpha_clip=None, clip_estimate=False)
    assert official.alpha == pytest.approx(raw) and not 0.0 <= official.estimate <= 1.0


def test_clipping_keeps_the_small_n_mse_near_human_only_where_the_unclipped_alpha_explodes():
    z, zhat = _flat_judge_population()
    theta = z.mean()
    reps = M.repeat_estimates(z, zhat, 10, 2000, seed=0)
    mse = {k: float(np.mean((reps[k] - theta) ** 2)) for k in ("human_only", "cv")}
    assert reps["cv"].min() >= 0.0 and reps["cv"].max() <= 1.0
    assert reps["alpha"].max() <= 2.0 and reps["alpha"].min() >= 0.0  # ALPHA_CLIP
    assert mse["cv"] < 2.0 * mse["human_only"]  # clipped: the α noise costs at most a fraction of the human MSE
    # the official estimator on this judge: win rates far outside [0, 1]
    assert float(np.mean((reps["cv_unclipped"] - theta) ** 2)) > 10.0 * mse["human_only"]
    # with a judge that tracks z, the clip is inactive and changes nothing
    zz, zh = _population(400, seed=7)
    good = M.repeat_estimates(zz, zh, 80, 500, seed=1)
    np.testing.assert_allclose(good["cv"], good["cv_unclipped"])


@pytest.mark.parametrize("target", [0.1, 0.3, 0.5])
def test_planted_judge_hits_its_rho2_and_the_measured_saving_follows_it(target):
    rng = np.random.default_rng(0)
    d = rng.normal(0.1, 1.0, 20000)
    xi = rng.standard_normal(d.size)
    z, _ = M.simulated_human(d, np.zeros_like(d), tau=0.25, eps=0.05, seed=1)
    s = M.calibrate_judge_noise(d, z, xi, target, bias=0.2, tau=0.25)
    zhat = M.noisy_oracle_judge(d, xi, s, bias=0.2, tau=0.25)
    assert M.predicted_saving(z, zhat) == pytest.approx(target, abs=1e-6)
    # a fresh population from the same law: the saving of the fitted-α estimator is ρ² minus its O(1/n) cost
    pop = slice(0, 2000)
    rho2 = M.predicted_saving(z[pop], zhat[pop])
    reps = M.repeat_estimates(z[pop], zhat[pop], 100, 3000, seed=2)
    measured = 1.0 - reps["cv"].var() / reps["human_only"].var()
    assert measured == pytest.approx(rho2, abs=0.04)


def test_calibrate_judge_noise_refuses_a_rho2_the_human_noise_forbids():
    d = np.random.default_rng(0).normal(0.0, 0.1, 4000)  # small gaps: the human is mostly a coin
    z, _ = M.simulated_human(d, np.zeros_like(d), tau=0.25, eps=0.0, seed=0)
    with pytest.raises(ValueError, match="reaches at most"):
        M.calibrate_judge_noise(d, z, np.zeros_like(d), 0.9)


def test_sweep_unit_is_the_simulated_population_and_the_sweep_gates_the_verdict():
    cfg = CVWinrateConfig(repeats=100, sim_seeds=4, sim_items=120, sim_rho2=[0.3, 0.5])
    sweep = simulated_sweep(cfg, 20)
    assert sorted(sweep) == [0.3, 0.5]
    for res in sweep.values():
        assert res["saving"].shape == res["rho2"].shape == res["mse_cv"].shape == (4,)
        assert len(set(np.round(res["rho2"], 12))) == 4  # four distinct populations, one value each
    assert sweep[0.5]["rho2"].mean() > sweep[0.3]["rho2"].mean()
    assert (sweep[0.5]["noise_sd"] < sweep[0.3]["noise_sd"]).all()
    claims = _claims([10, 20, 50], 50, {}, [0.3, 0.5], 20, 0.05)
    gated = [(c.metric, c.method, c.baseline) for c in claims if c.gate]
    assert ("sim_r30_mse", "cv", "human_only") in gated and ("sim_r50_saving", "cv", "rho2_plus_tol") in gated
    assert ("sim_r50_saving", "cv", "rho2_minus_tol") in gated
    # the zoo's judge (ρ² ≈ 0.03) cannot show a saving: its MSE check is reported, not gated
    assert not any(c.gate for c in claims if c.metric == "mse_n50" and c.baseline == "human_only")
    # every gated check is on the sweep (independent populations); the zoo's unit, the cache seed, is too few to gate
    assert all(c.metric.startswith("sim_") for c in claims if c.gate)
    assert ("sim_r30_abs_bias", "cv", "synthetic_only") in gated


def test_smoke_run_records_one_sweep_value_per_population():
    from lmlab.runner import run_method

    res = run_method("cv_winrate", preset="smoke", write=False, show_progress=False, raise_errors=True, threads=1)
    row = res.metric("cv", "sim_r30_saving")
    assert row.n == 6  # sim_seeds of the smoke preset
    assert any(c.gate and c.metric == "sim_r10_saving" for c in res.claims)
    assert np.isfinite(res.metric("cv_unclipped", "mse_n10").value)


def _fake_mixed_caches(calls: list):
    """`load_caches` stand-in: one planted synthetic cache per cache seed (the real mixed-s1/-s2 are not built yet)."""
    from lmlab.data.respcache import synthetic_cache

    def load(suite="mixed", seeds=(0, 1, 2)):
        calls.append((suite, list(seeds)))
        return [synthetic_cache(5, 80, n_tasks=4, seed=int(s), suite=suite) for s in seeds]

    return load


def test_zoo_rows_resample_cache_seeds_not_pairs(monkeypatch):
    """The old run read one cache and bootstrapped over its pairs (n = pairs, though they share queries and
    variants). Now each zoo value is one (cache seed, pair) and the cache seed is the cluster: n counts seeds."""
    from lmlab.data import respcache
    from lmlab.runner import run_method

    calls: list = []
    monkeypatch.setattr(respcache, "load_caches", _fake_mixed_caches(calls))
    res = run_method("cv_winrate", preset="smoke", write=False, show_progress=False, raise_errors=True, threads=1,
                     cache="mixed", cache_seeds=[0, 1], n_labels=[10, 20], claim_n=20, repeats=100, sim_seeds=3,
                     sim_items=100, sim_rho2=[0.3])  # fmt: skip
    assert calls == [("mixed", [0, 1])]
    pairs = res.tables["per_cache_seed"]
    assert [r["cache_seed"] for r in pairs] == [0, 1] and all(r["pairs"] == 10 for r in pairs)  # 5 variants
    zoo = [m for m in res.metrics if not m.metric.startswith("sim_") and m.ci_low is not None]
    assert zoo and {m.n for m in zoo} == {2}  # two cache seeds, not 20 pairs
    zoo_claims = [c for c in res.claims if not c.metric.startswith("sim_")]
    assert {c.n for c in zoo_claims} == {2} and {c.n_values for c in zoo_claims} == {20}
    assert not any(c.gate for c in zoo_claims)
    per_pair = res.tables["per_pair"]
    assert {r["cache_seed"] for r in per_pair} == {0, 1}
    theta = {s: [r["theta"] for r in per_pair if r["cache_seed"] == s and r["n"] == 20] for s in (0, 1)}
    assert theta[0] != theta[1]  # two independent caches, not one matrix twice
    signs = res.tables["zoo_checks_per_cache_seed"]
    assert signs and all(r["seeds"] == 2 and {"effect_s0", "effect_s1"} <= set(r) for r in signs)
    assert res.flags["cache_seeds"] == [0, 1]


def test_per_seed_effects_count_the_seeds_with_the_claimed_sign():
    from lmlab.methods.evaluation.cv_winrate.experiment import per_seed_effects

    vals = {("cv", "m"): [1.0, 1.0, 3.0, 3.0, 0.0, 2.0], ("base", "m"): [2.0, 2.0, 2.0, 2.0, 2.0, 2.0]}
    ids = ["s0", "s0", "s1", "s1", "s2", "s2"]
    clusters = {k: ids for k in vals}
    (row,) = per_seed_effects([Claim("m", "cv", "base", "<")], vals, clusters)
    assert (row["effect_s0"], row["effect_s1"], row["effect_s2"]) == (-1.0, 1.0, -1.0)
    assert row["seeds_with_sign"] == 2 and row["seeds"] == 3


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
        (lambda: CVWinrateConfig(alpha_clip=[2.0, 0.0]), "alpha_clip"),
        (lambda: CVWinrateConfig(sim_rho2=[0.3, 1.2]), "sim_rho2"),
        (lambda: CVWinrateConfig(cache_seeds=[]), "cache_seeds"),
        (lambda: CVWinrateConfig(cache_seeds=[0, 0]), "cache_seeds"),
        (lambda: CVWinrateConfig(cache_seeds=[0, -1]), "cache_seeds"),
        (lambda: CVWinrateConfig(cache_seeds=0), "cache_seeds"),
        (lambda: M.fit_alpha([1, 0], [0.2, 0.4], clip=(1.0, 1.0)), "alpha_clip"),
        (lambda: M.control_variates_estimate([2.0, 0.0], [0.5, 0.4], [0.5, 0.4]), "lie in"),
        (lambda: M.calibrate_judge_noise([0.1, 0.2], [1, 0], [0.0, 0.0], 1.5), "target_rho2"),
    ],
)
def test_bad_input_is_a_one_line_value_error(call, match):
    with pytest.raises(ValueError, match=match) as e:
        call()
    assert "\n" not in str(e.value)
