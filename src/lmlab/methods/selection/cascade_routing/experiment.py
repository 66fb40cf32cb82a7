"""Reproduction: cascade routing vs routing, the optimal cascade, the threshold cascade and the linear baseline.

Paper claim (Dekoninck et al., ICML 2025): cascade routing, the search over supermodels with ex-ante and post-hoc
quality estimates, gives a larger area under the quality-cost curve than routing and cascading alone, and its gains
grow with the quality of the estimators.

Data: the response caches (`cache`; "mixed" = lmlab's zoo of real variants, "synthetic" = a planted table), one per
cache seed (`cache_seeds`: independent samples of queries, shots and model samples): per query and model, the 0/1
correctness, the FLOP cost, the answer log-prob, the graded answer key and, on the multiple-choice task, the option
probabilities. Models are sorted by mean cost. Per cache seed, `splits` permutations of its queries give test /
estimator-fit / λ-tune parts. Estimators: one logistic regression per (model, run set) on the task one-hot
(ex-ante: a per-task accuracy) plus the run models' answer log-probs, answer-key agreement and the option features
(top probability, entropy, JS divergence; post-hoc); Σ per run set from the fit queries. Costs: per-model mean cost
(estimate), true cost (accounting), normalised by the dearest model. Per budget of the sweep every strategy tunes its
λs on the tune queries (same strategies and evaluation budget for the cascade router, the optimal cascade and the
threshold cascade; the router has one λ, found by bisection) and is evaluated on the test queries with the γ
randomisation.

Claims: AUC(cascade routing) > AUC(router) and > AUC(optimal cascade) (gated); > the threshold cascade and > the
linear interpolation, and optimal cascade > threshold cascade (reported). Simulation sweep (official
GroundTruthQualityComputer on the same table): the gain of cascade routing over the best of router and optimal
cascade is larger at low noise than at high noise (gated). The effect is the mean over cache seeds of the per-seed
AUC difference; its CI is a query bootstrap stratified by cache seed (the test queries reweighted, the tuned λs and
fitted estimators fixed, every AUC recomputed); a gated check holds only if the CI lies above 0 *and* the effect has
the claimed sign on every cache seed (the seed is the replicate of the whole pipeline, training included). Mechanism
check: at λ = 0 cascade routing's first decision is the best-quality supermodel (a flag, checked on every split).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmlab.core.stats.seeding import derive_seed
from lmlab.methods.selection.cascade_routing.baselines import route, threshold_cascade
from lmlab.methods.selection.cascade_routing.estimators import (
    LogisticEstimator,
    PoolData,
    ground_truth_noise_estimates,
    pool_from_cache,
)
from lmlab.methods.selection.cascade_routing.method import (
    CascadeRouter,
    Estimates,
    execute_table,
    expected_max,
    strategy_states,
    tune,
    tune_table,
)
from lmlab.methods.selection.cascade_routing.metric import (
    SplitOutcomes,
    budget_sweep,
    n_for_power,
    query_bootstrap_weights,
)
from lmlab.results import Claim, ClaimResult, MetricRow, claim_result

SYSTEMS = ("cascade_routing", "router", "optimal_cascade", "threshold_cascade", "linear")
NOISE_NAMES = {(0.6, 0.3): "low", (1.6, 0.8): "medium", (2.4, 1.2): "high"}  # RouterBench's levels


def noise_name(pair: Any) -> str:
    key = (float(pair[0]), float(pair[1]))
    return NOISE_NAMES.get(key, f"{key[0]:g}_{key[1]:g}")


MAX_POOL = 8  # the supermodel search and the per-run-set estimators grow as 2^V


def resolve_pool(cache: Any, wanted: list[str], ctx: Any) -> list[str]:
    """The variants of `wanted` that the cache has (>= 2), else every variant of the cache (at most `MAX_POOL`)."""
    have = [v for v in wanted if v in cache.variant_ids]
    missing = [v for v in wanted if v not in cache.variant_ids]
    if len(have) >= 2:
        if missing:
            ctx.note(f"pool variants missing from the cache (skipped): {missing}")
        return have
    allv = cache.variant_ids
    if len(allv) > MAX_POOL:
        raise ValueError(
            f"the cache has {len(allv)} variants and only {have} of variants={wanted}; list 2-{MAX_POOL} of "
            f"{allv} with --set variants=[...]"
        )
    if wanted:
        ctx.note(f"none or one of {wanted} in the cache: the pool is every variant ({len(allv)})")
    return allv


def load_pools(cfg: Any, ctx: Any) -> list[tuple[Any, PoolData]]:
    """(cache, pool) per cache seed; the pool (variants) is resolved on the first cache and must be in every one
    (each seed sorts it by its own mean costs)."""
    from lmlab.data.respcache import load_caches, synthetic_cache

    if cfg.cache == "synthetic":
        caches = [synthetic_cache(cfg.synthetic_variants, cfg.synthetic_queries, seed=int(s)) for s in cfg.cache_seeds]
    else:
        caches = load_caches(cfg.cache, cfg.cache_seeds)
    variants = resolve_pool(caches[0], cfg.variants, ctx)
    out = []
    for cache in caches:
        missing = [v for v in variants if v not in cache.variant_ids]
        if missing:
            raise ValueError(f"cache {cache.suite} seed {cache.seed} lacks pool variants {missing}; rebuild it")
        pool = pool_from_cache(cache, variants=variants)
        out.append((cache, pool))
        ctx.models[f"response-cache:{cache.suite}-s{cache.seed}"] = {
            "variants": pool.models,
            "descriptions": {v: cache.variants.get(v, {}) for v in pool.models},
            "failed": dict(cache.failed),
            "queries": len(pool.queries),
            "answer_keys": sum(getattr(r, "answer_key", None) is not None for r in cache.rows),
            "option_rows": sum(r.option_probs is not None for r in cache.rows),
        }
    if len({tuple(p.models) for _, p in out}) > 1:  # each seed's strategies run on its own cost order
        ctx.note(f"the cache seeds sort the pool differently by mean cost: {[p.models for _, p in out]}")
    return out


def split_indices(n: int, cfg: Any, cache_seed: int, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fit, tune, test) query indices of split `r` of cache seed `cache_seed`; `cfg.limit` caps each part."""
    perm = np.random.default_rng(derive_seed(cfg.seed, "split", cache_seed, r)).permutation(n)
    n_test = min(n - 2, max(1, int(round(cfg.test_fraction * n))))
    test, train = perm[:n_test], perm[n_test:]
    n_fit = min(len(train) - 1, max(1, int(round(cfg.fit_fraction * len(train)))))
    fit, tun = train[:n_fit], train[n_fit:]
    if cfg.limit is not None:
        fit, tun, test = fit[: cfg.limit], tun[: cfg.limit], test[: cfg.limit]
    return fit, tun, test


def _slice(est: Estimates, idx: np.ndarray) -> Estimates:
    return Estimates(est.states, {s: q[idx] for s, q in est.q_hat.items()}, dict(est.sigma))


def evaluate_split(cfg: Any, pool: PoolData, est_tune: Estimates, est_test: Estimates, tune_p: PoolData,
                   test_p: PoolData, cost_hat: np.ndarray, seed: int) -> dict[str, Any]:  # fmt: skip
    """Tune every strategy per budget on the tuning queries, evaluate on the test queries: AUCs, curves and the
    per-query `SplitOutcomes` the query bootstrap reweights."""
    v = len(pool.models)
    cr = CascadeRouter(cost_hat, max_depth=cfg.max_depth, force_order=cfg.force_order, do_speedup=cfg.do_speedup,
                       n_samples=cfg.n_samples, seed=seed)  # fmt: skip
    oc = CascadeRouter(cost_hat, max_depth=None, cascade=True, n_samples=cfg.n_samples, seed=seed)
    tables = {name: (r, r.table(est_tune), r.table(est_test)) for name, r in (("cascade_routing", cr),
                                                                                ("optimal_cascade", oc))}  # fmt: skip
    singles_c = test_p.cost.mean(axis=0)
    singles_q = test_p.y.mean(axis=0)
    budgets = budget_sweep(singles_c, singles_q, cfg.budgets_per_interval)
    kw = dict(max_lambda=cfg.max_lambda, const_iterations=cfg.const_iterations, search_evals=cfg.search_evals,
              max_factor=cfg.max_factor)  # fmt: skip
    ex_tune, ex_test = est_tune.q_hat[()], est_test.q_hat[()]
    post_tune = np.stack([est_tune.q_hat[tuple(range(j + 1))][:, j] for j in range(v)], axis=1)
    post_test = np.stack([est_test.q_hat[tuple(range(j + 1))][:, j] for j in range(v)], axis=1)
    rows = np.arange(len(test_p.queries))
    per_q: dict[str, list[tuple[np.ndarray, np.ndarray]]] = defaultdict(list)  # system -> per budget (cost, quality)
    evals: dict[str, int] = defaultdict(int)
    for bi, b in enumerate(budgets):
        rng = np.random.default_rng(derive_seed(seed, "gamma", bi))
        for name, (strat, t_tune, t_test) in tables.items():
            tuned = tune_table(t_tune, tune_p.y, tune_p.cost, b, strat.n_lambdas(), seed=derive_seed(seed, name, bi),
                               **kw)  # fmt: skip
            evals[name] += tuned.evaluations
            q, c, _ = execute_table(t_test, tuned.lambdas, test_p.y, test_p.cost, mode="random", gamma=tuned.gamma,
                                    rng=rng)  # fmt: skip
            per_q[name].append((c, q))

        def run_router(lam, mode, _ex=ex_tune):
            pick = route(_ex, cost_hat, lam[0], mode=mode)
            r = np.arange(len(pick))
            return float(tune_p.cost[r, pick].mean()), float(tune_p.y[r, pick].mean())

        tuned = tune(run_router, 1, b, search_evals=0, max_lambda=cfg.max_lambda,
                     const_iterations=max(cfg.const_iterations, 50))  # fmt: skip
        evals["router"] += tuned.evaluations
        pick = route(ex_test, cost_hat, tuned.lambdas[0], mode="random", gamma=tuned.gamma, rng=rng)
        per_q["router"].append((test_p.cost[rows, pick], test_p.y[rows, pick]))

        def run_threshold(lam, mode, _post=post_tune):
            last = threshold_cascade(_post, lam)
            r = np.arange(len(last))
            cum = np.cumsum(tune_p.cost, axis=1)
            return float(cum[r, last].mean()), float(tune_p.y[r, last].mean())

        tuned = tune(run_threshold, v - 1, b, seed=derive_seed(seed, "threshold", bi), **{**kw, "max_lambda": 1.0})
        evals["threshold_cascade"] += tuned.evaluations
        last = threshold_cascade(post_test, tuned.lambdas)
        per_q["threshold_cascade"].append((np.cumsum(test_p.cost, axis=1)[rows, last], test_p.y[rows, last]))
    outcomes = SplitOutcomes({name: np.stack([c for c, _ in pts]) for name, pts in per_q.items()},
                             {name: np.stack([q for _, q in pts]) for name, pts in per_q.items()},
                             test_p.cost, test_p.y)  # fmt: skip
    curves = {name: [(float(c.mean()), float(q.mean())) for c, q in pts] for name, pts in per_q.items()}
    return {"auc": outcomes.aucs(), "outcomes": outcomes, "curves": curves, "evals": dict(evals),
            "budgets": budgets.tolist(), "singles": list(zip(singles_c.tolist(), singles_q.tolist())),
            "tables": tables}  # fmt: skip


def _lambda0_best(table: Any, q_hat0: np.ndarray, z: np.ndarray, sigma: Any, n_check: int = 8) -> bool:
    """At λ = 0 the first decision of the (pruned, vectorised) search is the best-quality supermodel: brute force
    E[max] over every set of <= max_depth models, for the first `n_check` queries."""
    import itertools

    s0 = table.states.index(())
    v = table.n_models
    sets = [c for k in range(1, table.max_steps + 1) for c in itertools.combinations(range(v), k)]
    masks = np.zeros((len(sets), v), bool)
    for k, c in enumerate(sets):
        masks[k, list(c)] = True
    for qi in range(min(n_check, len(q_hat0))):
        brute = float(np.max(expected_max(q_hat0[qi], sigma, masks, z)))
        ok = table.lam_valid[qi, s0] >= 0.0
        got = float(np.max(np.where(ok, table.q_set[qi, s0], -np.inf)))
        if abs(round(got, 6) - round(brute, 6)) > 1e-6:
            return False
    return True


# ------------------------------------------------------------------------------------------------------ claims

# The paper's headline: cascade routing up to +8% AUC over the best baseline on RouterBench (read as relative to the
# baseline's AUC). It gives no number for the simulation gain's drop with noise: sized for the effect of the last
# default run on the 120-query cache (+1.65 AUC points).
PAPER_RELATIVE_GAIN = 0.08
SIM_EFFECT = 1.65


@dataclass
class SeedRuns:
    """One cache seed's splits: the test query indices of each split and its outcomes (``real`` and each noise)."""

    n_queries: int
    tests: list[np.ndarray]
    outcomes: list[dict[str, SplitOutcomes]]


def quantities(runs: list[SeedRuns], weights: list[np.ndarray] | None, levels: list[str]) -> dict[str, np.ndarray]:
    """Per cache seed ([n_seeds]) the mean over its splits of every AUC and simulation gain, the test queries of
    each split weighted by the seed's query weights (None: each once). Keys: ``auc/<system>``,
    ``auc_sim_<level>/<system>``, ``gain/<level>`` (AUC(cascade routing) - max(router, optimal cascade))."""
    per_seed: dict[str, list[float]] = defaultdict(list)
    for si, seed_runs in enumerate(runs):
        acc: dict[str, list[float]] = defaultdict(list)
        for test_i, outs in zip(seed_runs.tests, seed_runs.outcomes):
            w = None if weights is None else weights[si][test_i]
            if w is not None and w.sum() == 0:  # no test query of this split drawn (tiny splits only)
                w = None
            for kind, out in outs.items():
                aucs = out.aucs(w)
                prefix = "auc" if kind == "real" else f"auc_sim_{kind}"
                for name, val in aucs.items():
                    acc[f"{prefix}/{name}"].append(val)
                if kind != "real":
                    acc[f"gain/{kind}"].append(aucs["cascade_routing"] - max(aucs["router"], aucs["optimal_cascade"]))
        for key, vals in acc.items():
            per_seed[key].append(float(np.mean(vals)))
    return {k: np.asarray(v) for k, v in per_seed.items()}


def _claim_key(claim: Claim, who: str) -> str:
    """The `quantities` key of a claim's method or baseline (`who`)."""
    name = getattr(claim, who)
    if claim.metric == "gain_over_best_baseline":
        return f"gain/{name.removeprefix('sim_')}"
    return f"{claim.metric}/{name}"


def stratified_claim(claim: Claim, point: dict[str, np.ndarray], boot: list[dict[str, np.ndarray]], n_units: int,
                     confidence: float = 0.95) -> ClaimResult:  # fmt: skip
    """A claim on the mean over cache seeds of ``value(method) - value(baseline)``: CI from the query bootstrap
    stratified by seed (`boot`, both systems on the same resampled queries), `compare`'s decision rule, and the
    per-seed sign check: "supported" needs the CI above 0 and the per-seed effect above 0 on every seed.
    `null_status` is the same check with the baseline in the method's place (effect 0: it cannot hold)."""
    from lmlab.core.stats.uncertainty import Comparison, default_min_n

    ka, kb = _claim_key(claim, "method"), _claim_key(claim, "baseline")

    def decide(a_key: str) -> tuple[Comparison, str]:
        per_seed = point[a_key] - point[kb]
        effect = float(per_seed.mean())
        dist = np.array([float((r[a_key] - r[kb]).mean()) for r in boot])
        lo, hi = (float(x) for x in np.quantile(dist, [(1 - confidence) / 2, (1 + confidence) / 2]))
        k = int((per_seed > 0).sum())
        ci = f"CI [{lo:.4g}, {hi:.4g}] at {confidence:.0%} (query bootstrap stratified by {len(per_seed)} cache seeds)"
        sign = f"per-seed effect > 0 on {k} of {len(per_seed)} seeds ({', '.join(f'{e:+.3g}' for e in per_seed)})"
        if n_units < default_min_n(confidence):
            status, reason = "inconclusive", f"only {n_units} test queries; {ci}"
        elif lo > 0 and k == len(per_seed):
            status, reason = "supported", f"{ci} lies above 0 and {sign}"
        elif lo > 0:
            status, reason = "inconclusive", f"{ci} lies above 0 but the sign check fails: {sign}"
        elif hi <= 0:
            status, reason = "not_supported", f"{ci} lies at or below 0; {sign}"
        else:
            status, reason = "inconclusive", f"{ci} straddles 0; {sign}"
        cmp = Comparison(effect=effect, ci_low=lo, ci_high=hi, p_value=float("nan"), n=n_units, status=status,
                         direction=">", min_effect=0.0, threshold=0.0, confidence=confidence, paired=True,
                         mean_a=float(point[a_key].mean()), mean_b=float(point[kb].mean()), n_a=n_units,
                         n_b=n_units, reason=reason)  # fmt: skip
        return cmp, reason

    if claim.direction != ">" or claim.min_effect != 0.0:
        raise ValueError("stratified claims are '>' with min_effect 0")
    cmp, reason = decide(ka)
    null, _ = decide(kb)
    return claim_result(claim, cmp, null.status, reason=reason)


def power_rows(claims: list[Claim], point: dict[str, np.ndarray], boot: list[dict[str, np.ndarray]],
               n_units: int) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Per gated check: the test queries it needs for 80% power at 95% to find the paper's effect (8% of the
    baseline's AUC; the simulation check: `SIM_EFFECT`) and the effect this run measured, from the bootstrap SE at
    the queries it has (SE ∝ 1/√n); the seeds it has for the sign check."""
    out = {}
    for c in claims:
        if not c.gate:
            continue
        ka, kb = _claim_key(c, "method"), _claim_key(c, "baseline")
        se = float(np.std([float((r[ka] - r[kb]).mean()) for r in boot], ddof=1))
        paper = SIM_EFFECT if c.metric == "gain_over_best_baseline" else PAPER_RELATIVE_GAIN * float(point[kb].mean())
        seen = float((point[ka] - point[kb]).mean())
        out[f"{c.method} > {c.baseline} ({c.metric})"] = {
            "se": round(se, 4),
            "paper_effect": round(paper, 3),
            "n_needed_paper_effect": n_for_power(se, n_units, paper) if paper and se > 0 else None,
            "measured_effect": round(seen, 3),
            "n_needed_measured_effect": n_for_power(se, n_units, seen) if seen > 0 and se > 0 else None,
            "n_has": n_units,
            "seeds": len(point[ka]),
        }
    return out


def run(cfg: Any, ctx: Any) -> Any:
    seeded = load_pools(cfg, ctx)
    v = len(seeded[0][1].models)
    for cache, pool in seeded:
        if len(pool.queries) < 3:
            raise ValueError(f"cache seed {cache.seed} has {len(pool.queries)} complete queries; cascade routing "
                             "needs >= 3 (fit / tune / test)")  # fmt: skip
    ctx.flag("pool", {f"s{cache.seed}": {m: {"accuracy": round(float(pool.y[:, i].mean()), 4),
                                            "mean_cost_flops": float(pool.cost[:, i].mean())}
                                        for i, m in enumerate(pool.models)} for cache, pool in seeded})  # fmt: skip
    cr_states = strategy_states(v, max_depth=min(cfg.max_depth, v), cascade=False)
    states = list(dict.fromkeys([*cr_states, *strategy_states(v, max_depth=None, cascade=True)]))
    estimator = LogisticEstimator(c=cfg.lr_c, option_features=cfg.option_features)
    samples, lambda0_ok, evals = [], True, defaultdict(int)
    sizes: list[tuple[int, int, int]] = []
    levels = [(noise_name(p), tuple(map(float, p))) for p in cfg.noise_levels]  # fmt: skip
    runs: list[SeedRuns] = []
    jobs = [(k, r) for k in range(len(seeded)) for r in range(cfg.splits)]
    for k, r in ctx.progress(jobs, "cache seeds x splits"):
        cache, pool = seeded[k]
        if r == 0:
            runs.append(SeedRuns(len(pool.queries), [], []))
        fit_i, tun_i, test_i = split_indices(len(pool.queries), cfg, cache.seed, r)
        sizes.append((len(fit_i), len(tun_i), len(test_i)))
        fit_p, tune_p, test_p = pool.subset(fit_i), pool.subset(tun_i), pool.subset(test_i)
        scale = float(pool.subset(np.concatenate([fit_i, tun_i])).cost.mean(axis=0).max()) or 1.0
        for p in (fit_p, tune_p, test_p):
            p.cost = p.cost / scale
        cost_hat = np.concatenate([fit_p.cost, tune_p.cost]).mean(axis=0)
        seed = derive_seed(cfg.seed, "split-run", cache.seed, r)
        est_tune, est_test = estimator.fit_predict(fit_p, [tune_p, test_p], states)
        out = evaluate_split(cfg, pool, est_tune, est_test, tune_p, test_p, cost_hat, seed)
        for name, n_ev in out["evals"].items():
            evals[name] += n_ev
        t_test = out["tables"]["cascade_routing"][2]
        lambda0_ok &= _lambda0_best(
            t_test, est_test.q_hat[()], out["tables"]["cascade_routing"][0].z, est_test.sigma[()]
        )
        outcomes = {"real": out["outcomes"]}
        # simulation sweep: the official ground-truth quality computer on the same queries
        all_i = np.concatenate([tun_i, test_i])
        for name, (sb, sa) in levels:
            est = ground_truth_noise_estimates(pool.y[all_i], states, sb, sa, seed=derive_seed(seed, "noise", name))
            e_tune, e_test = _slice(est, np.arange(len(tun_i))), _slice(est, np.arange(len(tun_i), len(all_i)))
            sim = evaluate_split(cfg, pool, e_tune, e_test, tune_p, test_p, cost_hat, derive_seed(seed, "sim", name))
            outcomes[name] = sim["outcomes"]
        runs[-1].tests.append(test_i)
        runs[-1].outcomes.append(outcomes)
        samples.append({"cache_seed": cache.seed, "split": r, "auc": out["auc"], "budgets": out["budgets"],
                        "singles": out["singles"], "curves": out["curves"]})  # fmt: skip
    names = [lvl for lvl, _ in levels]
    point = quantities(runs, None, names)
    weights = query_bootstrap_weights([sr.n_queries for sr in runs], cfg.bootstrap,
                                      seed=derive_seed(cfg.seed, "query-bootstrap"))  # fmt: skip
    boot = [quantities(runs, w, names) for w in ctx.progress(weights, "query bootstrap")]
    n_units = sum(len(np.unique(np.concatenate(sr.tests))) for sr in runs)  # distinct test queries, all seeds
    seed_ids = [int(c.seed) for c, _ in seeded]
    for key in point:
        metric, system = key.split("/")
        if metric == "gain":
            metric, system = "gain_over_best_baseline", f"sim_{system}"
        lo, hi = (float(x) for x in np.quantile([float(b[key].mean()) for b in boot], [0.025, 0.975]))
        note = {"auc": "normalised AUC x100 of the test quality-cost curve",
                "gain_over_best_baseline": "AUC(cascade routing) - max(AUC(router), AUC(optimal cascade)) in "
                "simulation"}.get(metric, "simulation mode (noisy ground-truth estimates)")  # fmt: skip
        value = float(point[key].mean())
        ctx.metrics.append(MetricRow(system, metric, value, min(lo, value), max(hi, value), n_units, cfg.seed,
                                     note=f"{note}; mean over cache seeds {seed_ids} (per seed: "
                                     f"{', '.join(f'{x:.3g}' for x in point[key])}), CI: query bootstrap "
                                     "stratified by cache seed"))  # fmt: skip
    for name in SYSTEMS:
        if name != "linear":
            ctx.record_value(name, "lambda_evaluations", evals[name], note="strategy executions on tune queries")
    ctx.flag("lambda0_picks_best_quality_set", bool(lambda0_ok))
    first = {c.seed: sizes[i * cfg.splits] for i, (c, _) in enumerate(seeded)}  # (fit, tune, test) of split 0
    ctx.flag("split_sizes", {f"s{seed}": dict(zip(("fit", "tune", "test"), n)) for seed, n in first.items()})
    for c, _ in seeded:
        for part, n_part in zip(("fit", "tune", "test"), first[c.seed]):
            info = {"n": n_part, "seed": int(c.seed), "per_split": True}
            ctx.data_info[f"respcache:{c.suite}-s{c.seed}/{part}"] = info
    ctx.add_samples(samples)
    rows = [{"cache_seed": x["cache_seed"], "split": x["split"], **{k: round(a, 3) for k, a in x["auc"].items()}}
            for x in samples]  # fmt: skip
    ctx.table("auc_per_seed_split", rows)
    _figures(ctx, cfg, samples)
    claims = [
        Claim("auc", "cascade_routing", "router", ">",
              text="AUC of the quality-cost curve: cascade routing above routing (test queries, every cache seed)"),
        Claim("auc", "cascade_routing", "optimal_cascade", ">",
              text="AUC: cascade routing above the optimal cascade (test queries, every cache seed)"),
        Claim("auc", "cascade_routing", "threshold_cascade", ">", gate=False,
              text="AUC: cascade routing above the threshold cascade (reported)"),
        Claim("auc", "cascade_routing", "linear", ">", gate=False,
              text="AUC: cascade routing above the linear interpolation of single models (reported)"),
        Claim("auc", "optimal_cascade", "threshold_cascade", ">", gate=False,
              text="AUC: the optimal cascade above the threshold cascade (reported)"),
    ]  # fmt: skip
    if len(names) >= 2:
        text = (
            f"simulation: the gain of cascade routing over the best baseline is larger at {names[0]} noise "
            f"{levels[0][1]} than at {names[-1]} noise {levels[-1][1]}"
        )
        claims.append(Claim("gain_over_best_baseline", f"sim_{names[0]}", f"sim_{names[-1]}", ">", text=text))
    ctx.flag("power", power_rows(claims, point, boot, n_units))
    ctx.note(
        f"Pool (cheapest first): {', '.join(seeded[0][1].models)}; cache {cfg.cache!r} seeds {seed_ids} with "
        f"{[len(p.queries) for _, p in seeded]} complete queries; {cfg.splits} split(s) per seed of fit/tune/test = "
        f"{sizes[0]}; max_depth {cfg.max_depth}; λ search: constant ({cfg.const_iterations} bisections) + "
        f"{cfg.search_evals} per-step evaluations; CIs: {cfg.bootstrap} query resamples stratified by cache seed."
    )
    result = ctx.finish([])
    result.claims = [stratified_claim(c, point, boot, n_units) for c in claims]
    return result


def _figures(ctx: Any, cfg: Any, samples: list[dict[str, Any]]) -> None:
    from lmlab.core.report.plotting import bar_with_ci, lines, title_for

    rows = [m for m in ctx.metrics if m.metric == "auc"]
    ctx.add_figure("auc", bar_with_ci(rows, title=title_for("cascade_routing", cfg.cache, cfg.seed,
                                                            len(cfg.cache_seeds), "normalised AUC x100"),
                                      ylabel="AUC x100", highlight=("cascade_routing",)))  # fmt: skip
    first = samples[0]
    xs = sorted({round(c, 6) for pts in first["curves"].values() for c, _ in pts})
    if len(xs) >= 2:
        series = {}
        for name, pts in first["curves"].items():
            pts = sorted(pts)
            series[name] = [float(np.interp(x, [p[0] for p in pts], [p[1] for p in pts])) for x in xs]
        ctx.add_figure("quality_cost", lines(xs, series, title=title_for("cascade_routing", cfg.cache, cfg.seed, None,
                                                                         "test quality vs cost (first seed, split 0)"),
                                             xlabel="mean cost (normalised)", ylabel="accuracy"))  # fmt: skip
