"""Cascade routing invariants: E[max] closed forms, the vectorised search equals the one-query official search, zero
cost weight picks the best-quality set, budgets are met, the AUC metric and the bad-input errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import norm

from lmlab.methods.selection.cascade_routing.baselines import pareto_hull, route, threshold_cascade
from lmlab.methods.selection.cascade_routing.config import CascadeRoutingConfig
from lmlab.methods.selection.cascade_routing.estimators import (
    ground_truth_noise_estimates,
    logistic_fit,
    pool_from_cache,
)
from lmlab.methods.selection.cascade_routing.method import (
    CascadeRouter,
    Estimates,
    execute_table,
    expected_max,
    next_model,
    sobol_normal,
    strategy_states,
    tune_table,
)
from lmlab.methods.selection.cascade_routing.metric import area_under_curve, budget_sweep


def _random_estimates(nq=12, v=4, seed=0, depth=None):
    rng = np.random.default_rng(seed)
    states = list(dict.fromkeys([*strategy_states(v, max_depth=depth or v, cascade=False),
                                 *strategy_states(v, max_depth=None, cascade=True)]))  # fmt: skip
    q_hat, sigma = {}, {}
    for s in states:
        q_hat[s] = rng.uniform(0.1, 0.9, size=(nq, v))
        a = rng.normal(size=(v, v)) * 0.2
        sigma[s] = a @ a.T + 0.01 * np.eye(v)
    return Estimates(states, q_hat, sigma)


def test_expected_max_closed_forms():
    z = sobol_normal(4096, 2, seed=0)
    mu = np.array([0.3, 0.5])
    s1, s2 = 0.2, 0.3
    theta = np.hypot(s1, s2)
    a = (mu[0] - mu[1]) / theta
    exact = mu[0] * norm.cdf(a) + mu[1] * norm.cdf(-a) + theta * norm.pdf(a)  # Clark (1961), independent pair
    masks = np.array([[True, True], [True, False], [False, True]])
    got = expected_max(mu, np.diag([s1**2, s2**2]), masks, z)
    assert got[0] == pytest.approx(exact, abs=5e-3)
    assert got[1] == mu[0] and got[2] == mu[1]  # one model: its estimate exactly
    assert np.allclose(expected_max(mu, None, masks, z), [0.5, 0.3, 0.5])  # no uncertainty: the max


def test_vectorised_search_equals_the_one_query_search():
    v, depth = 4, 3
    est = _random_estimates(v=v, depth=depth)
    cost_hat = np.array([0.05, 0.2, 0.4, 1.0])
    for cascade in (False, True):
        cr = CascadeRouter(cost_hat, max_depth=None if cascade else depth, cascade=cascade, n_samples=64, seed=1)
        table = cr.table(est)
        for lam in (0.0, 0.05, 0.3, 1.0, 5.0):
            for si, s in enumerate(table.states):
                if len(s) >= table.max_steps:
                    continue
                for qi in range(6):
                    ref, ref_set = next_model(est.q_hat[s][qi], est.sigma[s], cost_hat, s, lam, cr.z,
                                              max_depth=table.max_steps, cascade=cascade)  # fmt: skip
                    qs, ok = table.q_set[qi, si], table.lam_valid[qi, si] >= lam
                    with np.errstate(invalid="ignore"):
                        score = np.where(ok & np.isfinite(qs), np.round(qs - lam * table.c_set[si], 6), -np.inf)
                    tied = score == score.max()
                    k = int(np.where(tied, table.c_set[si], np.inf).argmin())
                    nxt = table.next_state[si, k]
                    got = None if nxt < 0 else (set(table.states[nxt]) - set(s)).pop()
                    assert got == ref, (cascade, lam, s, qi)


def test_zero_cost_weight_picks_the_best_quality_set():
    v, depth = 5, 3
    est = _random_estimates(v=v, depth=depth, seed=3)
    cost_hat = np.linspace(0.1, 1.0, v)
    cr = CascadeRouter(cost_hat, max_depth=depth, n_samples=64)
    sets = [c for k in range(1, depth + 1) for c in itertools.combinations(range(v), k)]
    masks = np.zeros((len(sets), v), bool)
    for i, c in enumerate(sets):
        masks[i, list(c)] = True
    for qi in range(8):
        best_q = expected_max(est.q_hat[()][qi], est.sigma[()], masks, cr.z).max()
        _, chosen = next_model(est.q_hat[()][qi], est.sigma[()], cost_hat, (), 0.0, cr.z, max_depth=depth,
                               do_speedup=False)  # fmt: skip
        m = np.zeros(v, bool)
        m[list(chosen)] = True
        assert expected_max(est.q_hat[()][qi], est.sigma[()], m[None], cr.z)[0] == pytest.approx(best_q)
    # without uncertainty the best set is the single best model: λ = 0 routes every query to argmax q̂
    y = np.random.default_rng(0).random((8, v))
    pick = route(est.q_hat[()][:8], cost_hat, 0.0)
    assert np.array_equal(pick, est.q_hat[()][:8].argmax(axis=1))
    # estimates that running a model does not change (no post-hoc information), no uncertainty
    noiseless = Estimates(est.states, {s: est.q_hat[()] for s in est.states}, {s: None for s in est.states})
    q, _, run = execute_table(cr.table(noiseless), [0.0] * depth, y, np.ones((8, 1)) * cost_hat)
    assert np.array_equal(run.sum(axis=1), np.ones(8))  # ties broken to the cheapest set: one model
    assert np.array_equal(run.argmax(axis=1), pick)


def test_large_lambda_runs_only_the_cheapest_model_and_tuning_meets_the_budget():
    rng = np.random.default_rng(1)
    nq, v = 40, 4
    y = (rng.random((nq, v)) < np.linspace(0.3, 0.8, v)).astype(float)
    cost = np.tile(np.array([0.05, 0.2, 0.5, 1.0]), (nq, 1))
    states = list(dict.fromkeys([*strategy_states(v, max_depth=3, cascade=False),
                                 *strategy_states(v, max_depth=None, cascade=True)]))  # fmt: skip
    est = ground_truth_noise_estimates(y, states, 0.6, 0.3, seed=0)
    cr = CascadeRouter(cost[0], max_depth=3, n_samples=32)
    table = cr.table(est)
    _, c, run = execute_table(table, [1e6] * 3, y, cost)
    assert np.all(run[:, 0]) and run.sum() == nq and np.allclose(c, 0.05)
    for budget in (0.1, 0.4, 0.9):
        tuned = tune_table(table, y, cost, budget, 3, search_evals=10)
        assert tuned.train_cost <= budget + 1e-9
        _, c_mix, _ = execute_table(table, tuned.lambdas, y, cost, mode="random", gamma=tuned.gamma,
                                    rng=np.random.default_rng(0))  # fmt: skip
        assert c_mix.mean() <= budget + 0.2  # the γ mix sits between the cheap and the expensive tie-break


def test_cascade_runs_prefixes_and_perfect_posthoc_reaches_the_oracle():
    rng = np.random.default_rng(2)
    nq, v = 50, 4
    y = (rng.random((nq, v)) < 0.5).astype(float)
    cost = np.tile(np.array([0.1, 0.2, 0.3, 0.4]), (nq, 1))
    states = strategy_states(v, max_depth=None, cascade=True)
    est = ground_truth_noise_estimates(y, list(dict.fromkeys([*states, *strategy_states(v, max_depth=v,
                                                                                         cascade=False)])),
                                       0.0, 0.0)  # fmt: skip
    oc = CascadeRouter(cost[0], max_depth=None, cascade=True, n_samples=32)
    q, _, run = execute_table(oc.table(est), [0.0] * v, y, cost)
    for row in run:  # a prefix of the pool
        k = int(row.sum())
        assert row[:k].all() and not row[k:].any()
    assert q.mean() == pytest.approx(y.max(axis=1).mean())  # exact estimates, no cost: the oracle's quality


def test_threshold_cascade_extremes():
    q_post = np.array([[0.9, 0.2, 0.5], [0.1, 0.3, 0.4]])
    assert threshold_cascade(q_post, [1.0, 1.0]).tolist() == [0, 0]  # threshold 0: stop after the first model
    assert threshold_cascade(q_post, [0.0, 0.0]).tolist() == [2, 2]  # threshold 1: run everything
    assert threshold_cascade(q_post, [0.2, 0.2]).tolist() == [0, 2]


def test_area_under_curve_and_hull():
    assert area_under_curve([0.0, 1.0], [0.4, 0.4], 0.0, 1.0, 0.0) == pytest.approx(0.4)
    assert area_under_curve([0.0, 1.0], [0.2, 0.6], 0.0, 1.0, 0.0) == pytest.approx(0.4)
    assert area_under_curve([0.0, 0.5], [0.2, 0.6], 0.0, 1.0, 0.0) == pytest.approx(0.2 + 0.3)  # flat past 0.5
    assert area_under_curve([0.5, 1.0], [0.6, 0.6], 0.0, 1.0, 0.1) == pytest.approx(0.5 * (0.1 + 0.6) / 2 + 0.3)
    c, q = pareto_hull([1.0, 2.0, 3.0, 4.0], [0.5, 0.55, 0.8, 0.7])  # 2.0 under the chord, 4.0 dominated
    assert c == [1.0, 3.0] and q == [0.5, 0.8]
    b = budget_sweep([1.0, 2.0, 3.0], [0.2, 0.5, 0.6], 5)
    assert len(b) == 10 and b[0] == 1.0 and b[-1] == 3.0


def test_logistic_fit_is_at_the_l2_optimum():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(80, 3))
    y = (x[:, 0] + rng.normal(size=80) > 0).astype(float)
    w = logistic_fit(x, y, c=1.0)
    xb = np.concatenate([x, np.ones((80, 1))], axis=1)
    p = 1 / (1 + np.exp(-xb @ w))
    grad = xb.T @ (p - y) + np.concatenate([w[:3], [0.0]])
    assert np.abs(grad).max() < 1e-6


def test_noise_free_simulation_returns_the_truth():
    y = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    est = ground_truth_noise_estimates(y, [(), (0,), (0, 1)], 0.0, 0.0)
    assert np.allclose(est.q_hat[(0,)], y)
    with pytest.raises(ValueError, match="noise levels must be >= 0"):
        ground_truth_noise_estimates(y, [()], -1.0, 0.1)


def test_pool_from_cache_sorts_by_cost():
    from lmlab.data.respcache import synthetic_cache

    pool = pool_from_cache(synthetic_cache(4, 30, seed=1))
    assert np.all(np.diff(pool.cost.mean(axis=0)) >= 0)
    assert pool.y.shape == (30, 4) and len(pool.answers) == 30


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"splits": 0}, "splits must be"),
        ({"noise_levels": [[0.6]]}, "noise_levels must be"),
        ({"test_fraction": 1.5}, "test_fraction must be"),
        ({"variants": ["only_one"]}, "variants must list >= 2"),
        ({"max_depth": 0}, "max_depth must be"),
    ],
)
def test_bad_config_is_a_one_line_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CascadeRoutingConfig(**kwargs)


def test_bad_inputs():
    with pytest.raises(ValueError, match="cost_hat must be"):
        CascadeRouter(np.array([]))
    with pytest.raises(ValueError, match="cost_max must be > cost_min"):
        area_under_curve([0.1], [0.5], 1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="non-empty"):
        area_under_curve([], [], 0.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="lack run sets"):
        CascadeRouter(np.array([0.1, 0.2]), max_depth=2).table(Estimates([()], {(): np.zeros((2, 2))}, {(): None}))


def test_pool_resolution_prefers_the_spec_pool_and_refuses_huge_pools():
    from lmlab.data.respcache import ResponseCache
    from lmlab.methods.selection.cascade_routing.experiment import resolve_pool

    class Ctx:
        notes: list = []

        def note(self, text):
            self.notes.append(text)

    def cache(ids):
        rows = [{"variant": v, "query_id": "q0", "task": "t", "correct": 1.0, "cost_flops": 1.0} for v in ids]
        return ResponseCache.from_records(rows, variants={v: {} for v in ids})

    assert resolve_pool(cache(["smol", "x", "smol-pot"]), ["tiny-random", "smol", "smol-pot"], Ctx()) == [
        "smol",
        "smol-pot",
    ]
    assert resolve_pool(cache(["a", "b", "c"]), ["smol"], Ctx()) == ["a", "b", "c"]
    with pytest.raises(ValueError, match="list 2-8 of"):
        resolve_pool(cache([f"v{i}" for i in range(9)]), ["smol"], Ctx())


def test_unknown_logprobs_do_not_drop_queries():
    from lmlab.data.respcache import ResponseCache

    rows = [
        {"variant": v, "query_id": f"q{i}", "task": "t", "correct": float(i % 2), "cost_flops": c,
         "answer_logprob": None if v == "b" else -1.0}
        for i in range(6)
        for v, c in (("a", 1.0), ("b", 2.0))
    ]  # fmt: skip
    pool = pool_from_cache(ResponseCache.from_records(rows))
    assert pool.y.shape == (6, 2) and np.isnan(pool.logp[:, 1]).all() and (pool.logp[:, 0] == -1.0).all()


# ---------------------------------------------------------------------------------------------------------------
# issue 35: answer keys, option-probability features, CIs by the independent unit (query within cache seed)


def _keyed_cache(rows):
    """A cache whose rows carry `answer_key` (the field of the rebuilt caches; the subclass also runs on a
    respcache without it, so the test shows what the old cascade code did with keys)."""
    from dataclasses import dataclass

    from lmlab.data.respcache import ResponseCache, ResponseRow

    @dataclass(frozen=True)
    class KeyedRow(ResponseRow):
        answer_key: str | None = None

    return ResponseCache(suite="keyed", seed=0, rows=[KeyedRow(**r) for r in rows])


def test_agreement_compares_answer_keys_not_raw_text():
    from lmlab.methods.selection.cascade_routing.estimators import LogisticEstimator

    texts = (("The answer is 42.", "42"), ("It is Paris, France", "Paris"), ("7", "seven"))
    rows = []
    for i in range(6):
        a_text, b_text = texts[i % 3]
        key = ["42", "paris", "7"][i % 3] if i < 4 else None  # the last two: no key (an old cache), the text decides
        rows += [
            dict(variant="a", query_id=f"q{i}", task="t", correct=1.0, cost_flops=1.0, answer=a_text, answer_key=key),
            dict(variant="b", query_id=f"q{i}", task="t", correct=1.0, cost_flops=2.0, answer=b_text, answer_key=key),
        ]  # fmt: skip
    pool = pool_from_cache(_keyed_cache(rows))
    # same key = same answer, though no raw text pair is equal; without a key the normalised text is compared
    assert [p[0] == p[1] for p in pool.answers] == [True, True, True, True, False, False]
    x = LogisticEstimator()._features(pool, 0, (0, 1), np.zeros(2), np.ones(2))
    assert x[:, -1].tolist() == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]  # the agreement feature of model 0 with model 1


def test_entropy_and_js_divergence_match_the_official_definitions():
    from lmlab.methods.selection.cascade_routing.estimators import entropy_bits, js_divergence

    assert entropy_bits(np.full(4, 0.25)) == pytest.approx(2.0)
    assert entropy_bits(np.array([1.0, 0.0])) == pytest.approx(0.0)
    assert js_divergence(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(1.0)  # disjoint: 1 bit
    assert js_divergence(np.array([0.3, 0.7]), np.array([0.3, 0.7])) == pytest.approx(0.0)


def test_option_probabilities_inform_the_posthoc_estimate():
    """On a multiple-choice task where the log-prob says nothing, a model's confidence (top option probability) says
    whether it is right: the post-hoc estimate must use it (the official certainty features)."""
    from lmlab.data.respcache import ResponseCache
    from lmlab.methods.selection.cascade_routing.estimators import LogisticEstimator

    rng = np.random.default_rng(0)
    rows = []
    for i in range(160):
        top = rng.uniform(0.3, 0.95)
        probs = [top, *((1 - top) * rng.dirichlet(np.ones(3)))]
        right = float(top > 0.6)  # confident = right
        rows += [
            {"variant": "a", "query_id": f"q{i}", "task": "mc", "correct": right, "cost_flops": 1.0,
             "answer_logprob": -1.0, "option_probs": probs},
            {"variant": "b", "query_id": f"q{i}", "task": "mc", "correct": 1.0 - right, "cost_flops": 2.0,
             "answer_logprob": -1.0},  # no option probabilities: its own features are 0
        ]  # fmt: skip
    pool = pool_from_cache(ResponseCache.from_records(rows))
    fit, test = pool.subset(range(80)), pool.subset(range(80, 160))
    states = [(), (0,), (1,), (0, 1)]
    (est,) = LogisticEstimator().fit_predict(fit, [test], states)
    q_run = est.q_hat[(0,)][:, 0]  # model a's estimate after running it
    right, wrong = q_run[test.y[:, 0] == 1], q_run[test.y[:, 0] == 0]
    assert np.mean(right[:, None] > wrong[None]) > 0.9  # AUROC: it tells right from wrong
    assert pool.options.shape == (160, 2, 4) and np.isnan(pool.options[:, 1]).all()
    assert np.ptp(est.q_hat[()][:, 0]) < 1e-9  # ex-ante: one task, one estimate
    (flat,) = LogisticEstimator(option_features=False).fit_predict(fit, [test], states)
    assert np.ptp(flat.q_hat[(0,)][:, 0]) < 1e-6  # the ablation: nothing post-hoc to go on


def test_query_bootstrap_is_stratified_by_cache_seed():
    from lmlab.methods.selection.cascade_routing.metric import query_bootstrap_weights

    w = query_bootstrap_weights([5, 9, 3], 50, seed=0)
    assert len(w) == 50 and all([len(x) for x in r] == [5, 9, 3] for r in w)
    assert all([x.sum() for x in r] == [5, 9, 3] for r in w)  # each seed keeps its own number of queries
    assert len({tuple(r[1]) for r in w}) > 1


def test_split_outcomes_reweighted_by_ones_give_the_plain_auc():
    from lmlab.methods.selection.cascade_routing.metric import SplitOutcomes

    rng = np.random.default_rng(0)
    cost, qual = rng.random((4, 10)), (rng.random((4, 10)) < 0.5).astype(float)
    sc, sq = np.tile([0.1, 0.5, 1.0], (10, 1)), (rng.random((10, 3)) < [0.2, 0.4, 0.7]).astype(float)
    out = SplitOutcomes({"s": cost}, {"s": qual}, sc, sq)
    lo, hi, floor = 0.1, 1.0, float(sq.mean(axis=0).min())
    assert out.aucs()["s"] == pytest.approx(100 * area_under_curve(cost.mean(1), qual.mean(1), lo, hi, floor))
    w = np.zeros(10)
    w[0], w[3] = 2.0, 1.0  # the resample (query 0, query 0, query 3)
    sub = SplitOutcomes({"s": cost[:, [0, 0, 3]]}, {"s": qual[:, [0, 0, 3]]}, sc[[0, 0, 3]], sq[[0, 0, 3]])
    assert out.aucs(w)["s"] == pytest.approx(sub.aucs()["s"])  # weights = resampled queries


def _claim_inputs(per_seed_a, per_seed_b, spread=0.5, n_boot=400):
    rng = np.random.default_rng(0)
    a, b = np.array(per_seed_a, float), np.array(per_seed_b, float)
    point = {"auc/cascade_routing": a, "auc/router": b}
    boot = [{"auc/cascade_routing": a + rng.normal(0, spread, a.size), "auc/router": b} for _ in range(n_boot)]
    return point, boot


def test_a_gated_check_needs_the_sign_on_every_cache_seed():
    from lmlab.methods.selection.cascade_routing.experiment import stratified_claim
    from lmlab.results import Claim

    claim = Claim("auc", "cascade_routing", "router", ">")
    point, boot = _claim_inputs([24.0, 24.0, 19.5], [20.0, 20.0, 20.0])  # pooled +2.5, CI above 0, one seed below
    res = stratified_claim(claim, point, boot, n_units=720)
    assert res.ci[0] > 0 and res.status == "inconclusive" and "2 of 3 seeds" in res.reason
    point, boot = _claim_inputs([24.0, 24.0, 20.5], [20.0, 20.0, 20.0])
    res = stratified_claim(claim, point, boot, n_units=720)
    assert res.status == "supported" and res.null_status != "supported" and res.n == 720
    point, boot = _claim_inputs([18.0, 19.0, 18.5], [20.0, 20.0, 20.0])
    assert stratified_claim(claim, point, boot, n_units=720).status == "not_supported"


def test_claims_count_test_queries_of_independent_cache_seeds_not_splits():
    """The old run bootstrapped over overlapping splits of one cache (n = splits). Now the unit is the test query,
    resampled within its cache seed: more splits of the same queries add no units."""
    from lmlab.runner import run_method

    kw = dict(cache="synthetic", synthetic_queries=24, synthetic_variants=3, max_depth=2, search_evals=0,
              budgets_per_interval=2, n_samples=16, noise_levels=[[0.6, 0.3], [2.4, 1.2]], bootstrap=100)  # fmt: skip
    one = run_method("cascade_routing", write=False, show_progress=False, raise_errors=True, threads=1,
                     cache_seeds=[0, 1], splits=1, **kw)  # fmt: skip
    many = run_method("cascade_routing", write=False, show_progress=False, raise_errors=True, threads=1,
                      cache_seeds=[0], splits=3, **kw)  # fmt: skip
    assert {c.n for c in one.claims} == {24}  # 12 test queries x 2 cache seeds
    assert len({c.n for c in many.claims}) == 1 and many.claims[0].n <= 24  # 3 overlapping splits: <= 24 queries
    assert all("stratified by 2 cache seeds" in c.reason for c in one.claims)
    assert {m.n for m in one.metrics if m.metric == "auc"} == {24}
    assert set(one.flags["power"]) == {c.method + " > " + c.baseline + f" ({c.metric})" for c in one.claims if c.gate}
