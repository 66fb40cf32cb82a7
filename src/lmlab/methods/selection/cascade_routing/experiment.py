"""Reproduction: cascade routing vs routing, the optimal cascade, the threshold cascade and the linear baseline.

Paper claim (Dekoninck et al., ICML 2025): cascade routing, the search over supermodels with ex-ante and post-hoc
quality estimates, gives a larger area under the quality-cost curve than routing and cascading alone, and its gains
grow with the quality of the estimators.

Data: the response cache (`cache`; "mixed" = lmlab's zoo of real variants, "synthetic" = a planted table): per query
and model, the 0/1 correctness, the FLOP cost and the answer log-prob. Models are sorted by mean cost. Each split
(the independent unit) permutes the queries: test / estimator-fit / λ-tune parts. Estimators: one logistic regression
per (model, run set) on the task one-hot (ex-ante: a per-task accuracy) plus the run models' answer log-probs and
answer agreement (post-hoc); Σ per run set from the fit queries. Costs: per-model mean cost (estimate), true cost
(accounting), normalised by the dearest model. Per budget of the sweep every strategy tunes its λs on the tune
queries (same strategies and evaluation budget for the cascade router, the optimal cascade and the threshold
cascade; the router has one λ, found by bisection) and is evaluated on the test queries with the γ randomisation.

Claims (per split): AUC(cascade routing) > AUC(router) and > AUC(optimal cascade) (gated); > the threshold cascade
and > the linear interpolation, and optimal cascade > threshold cascade (reported). Simulation sweep (official
GroundTruthQualityComputer on the same table): the gain of cascade routing over the best of router and optimal
cascade is larger at low noise than at high noise (gated). Mechanism check: at λ = 0 cascade routing's first
decision is the best-quality supermodel (a flag, checked on every split).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from lmlab.core.stats.seeding import derive_seed
from lmlab.methods.selection.cascade_routing.baselines import pareto_hull, route, threshold_cascade
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
from lmlab.methods.selection.cascade_routing.metric import area_under_curve, budget_sweep
from lmlab.results import Claim

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


def load_pool(cfg: Any, ctx: Any) -> tuple[Any, PoolData]:
    from lmlab.data.respcache import load_cache, synthetic_cache

    if cfg.cache == "synthetic":
        cache = synthetic_cache(cfg.synthetic_variants, cfg.synthetic_queries, seed=cfg.seed)
    else:
        cache = load_cache(cfg.cache, seed=cfg.seed)
    pool = pool_from_cache(cache, variants=resolve_pool(cache, cfg.variants, ctx))
    ctx.models[f"response-cache:{cache.suite}"] = {
        "variants": pool.models,
        "descriptions": {v: cache.variants.get(v, {}) for v in pool.models},
        "failed": dict(cache.failed),
        "queries": len(pool.queries),
    }
    return cache, pool


def split_indices(n: int, cfg: Any, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fit, tune, test) query indices of split `r`; `cfg.limit` caps each part."""
    perm = np.random.default_rng(derive_seed(cfg.seed, "split", r)).permutation(n)
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
    """Tune every strategy per budget on the tuning queries, evaluate on the test queries: AUCs and curves."""
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
    curves: dict[str, list[tuple[float, float]]] = defaultdict(list)
    evals: dict[str, int] = defaultdict(int)
    for bi, b in enumerate(budgets):
        rng = np.random.default_rng(derive_seed(seed, "gamma", bi))
        for name, (strat, t_tune, t_test) in tables.items():
            tuned = tune_table(t_tune, tune_p.y, tune_p.cost, b, strat.n_lambdas(), seed=derive_seed(seed, name, bi),
                               **kw)  # fmt: skip
            evals[name] += tuned.evaluations
            q, c, _ = execute_table(t_test, tuned.lambdas, test_p.y, test_p.cost, mode="random", gamma=tuned.gamma,
                                    rng=rng)  # fmt: skip
            curves[name].append((float(c.mean()), float(q.mean())))

        def run_router(lam, mode, _ex=ex_tune):
            pick = route(_ex, cost_hat, lam[0], mode=mode)
            r = np.arange(len(pick))
            return float(tune_p.cost[r, pick].mean()), float(tune_p.y[r, pick].mean())

        tuned = tune(run_router, 1, b, search_evals=0, max_lambda=cfg.max_lambda,
                     const_iterations=max(cfg.const_iterations, 50))  # fmt: skip
        evals["router"] += tuned.evaluations
        pick = route(ex_test, cost_hat, tuned.lambdas[0], mode="random", gamma=tuned.gamma, rng=rng)
        curves["router"].append((float(test_p.cost[rows, pick].mean()), float(test_p.y[rows, pick].mean())))

        def run_threshold(lam, mode, _post=post_tune):
            last = threshold_cascade(_post, lam)
            r = np.arange(len(last))
            cum = np.cumsum(tune_p.cost, axis=1)
            return float(cum[r, last].mean()), float(tune_p.y[r, last].mean())

        tuned = tune(run_threshold, v - 1, b, seed=derive_seed(seed, "threshold", bi), **{**kw, "max_lambda": 1.0})
        evals["threshold_cascade"] += tuned.evaluations
        last = threshold_cascade(post_test, tuned.lambdas)
        curves["threshold_cascade"].append((float(np.cumsum(test_p.cost, axis=1)[rows, last].mean()),
                                            float(test_p.y[rows, last].mean())))  # fmt: skip
    lo, hi, floor = float(singles_c.min()), float(singles_c.max()), float(singles_q.min())
    auc = {name: 100 * area_under_curve([p[0] for p in pts], [p[1] for p in pts], lo, hi, floor)
           for name, pts in curves.items()}  # fmt: skip
    hc, hq = pareto_hull(singles_c, singles_q)
    auc["linear"] = 100 * area_under_curve(hc, hq, lo, hi, floor)
    return {"auc": auc, "curves": dict(curves), "evals": dict(evals), "budgets": budgets.tolist(),
            "singles": list(zip(singles_c.tolist(), singles_q.tolist())), "tables": tables}  # fmt: skip


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


def run(cfg: Any, ctx: Any) -> Any:
    cache, pool = load_pool(cfg, ctx)
    v, n = len(pool.models), len(pool.queries)
    if n < 3:
        raise ValueError(f"the cache has {n} complete queries; cascade routing needs >= 3 (fit / tune / test)")
    ctx.flag("pool", {m: {"accuracy": float(pool.y[:, i].mean()), "mean_cost_flops": float(pool.cost[:, i].mean())}
                      for i, m in enumerate(pool.models)})  # fmt: skip
    cr_states = strategy_states(v, max_depth=min(cfg.max_depth, v), cascade=False)
    states = list(dict.fromkeys([*cr_states, *strategy_states(v, max_depth=None, cascade=True)]))
    estimator = LogisticEstimator(c=cfg.lr_c)
    auc: dict[str, list[float]] = defaultdict(list)
    sim_auc: dict[tuple[str, str], list[float]] = defaultdict(list)
    gains: dict[str, list[float]] = defaultdict(list)
    samples, lambda0_ok, evals = [], True, defaultdict(int)
    sizes = None
    levels = [(noise_name(p), tuple(map(float, p))) for p in cfg.noise_levels]  # fmt: skip
    for r in ctx.progress(range(cfg.splits), "splits"):
        fit_i, tun_i, test_i = split_indices(n, cfg, r)
        sizes = (len(fit_i), len(tun_i), len(test_i))
        fit_p, tune_p, test_p = pool.subset(fit_i), pool.subset(tun_i), pool.subset(test_i)
        scale = float(pool.subset(np.concatenate([fit_i, tun_i])).cost.mean(axis=0).max()) or 1.0
        for p in (fit_p, tune_p, test_p):
            p.cost = p.cost / scale
        cost_hat = np.concatenate([fit_p.cost, tune_p.cost]).mean(axis=0)
        seed = derive_seed(cfg.seed, "split-run", r)
        est_tune, est_test = estimator.fit_predict(fit_p, [tune_p, test_p], states)
        out = evaluate_split(cfg, pool, est_tune, est_test, tune_p, test_p, cost_hat, seed)
        for name, val in out["auc"].items():
            auc[name].append(val)
        for name, k in out["evals"].items():
            evals[name] += k
        t_test = out["tables"]["cascade_routing"][2]
        lambda0_ok &= _lambda0_best(
            t_test, est_test.q_hat[()], out["tables"]["cascade_routing"][0].z, est_test.sigma[()]
        )
        samples.append({"split": r, "auc": out["auc"], "budgets": out["budgets"], "singles": out["singles"],
                        "curves": out["curves"]})  # fmt: skip
        # simulation sweep: the official ground-truth quality computer on the same queries
        all_i = np.concatenate([tun_i, test_i])
        y_all = pool.y[all_i]
        for name, (sb, sa) in levels:
            est = ground_truth_noise_estimates(y_all, states, sb, sa, seed=derive_seed(seed, "noise", name))
            e_tune, e_test = _slice(est, np.arange(len(tun_i))), _slice(est, np.arange(len(tun_i), len(all_i)))
            sim = evaluate_split(cfg, pool, e_tune, e_test, tune_p, test_p, cost_hat, derive_seed(seed, "sim", name))
            for sys_name, val in sim["auc"].items():
                sim_auc[(name, sys_name)].append(val)
            best_base = max(sim["auc"]["router"], sim["auc"]["optimal_cascade"])
            gains[name].append(sim["auc"]["cascade_routing"] - best_base)
    ctx.data_info[f"respcache:{cache.suite}/fit"] = {"n": sizes[0], "seed": cfg.seed, "per_split": True}
    ctx.data_info[f"respcache:{cache.suite}/tune"] = {"n": sizes[1], "seed": cfg.seed, "per_split": True}
    ctx.data_info[f"respcache:{cache.suite}/test"] = {"n": sizes[2], "seed": cfg.seed, "per_split": True}
    for name in SYSTEMS:
        ctx.record(name, "auc", auc[name], note="normalised AUC x100 of the test quality-cost curve, per split")
    for name in SYSTEMS:
        if name != "linear":
            ctx.record_value(name, "lambda_evaluations", evals[name], note="strategy executions on tune queries")
    for (lvl, sys_name), vals in sim_auc.items():
        ctx.record(sys_name, f"auc_sim_{lvl}", vals, note="simulation mode (noisy ground-truth estimates), per split")
    for lvl, vals in gains.items():
        ctx.record(
            f"sim_{lvl}",
            "gain_over_best_baseline",
            vals,
            note="AUC(cascade routing) - max(AUC(router), AUC(optimal cascade)) in simulation, per split",
        )
    ctx.flag("lambda0_picks_best_quality_set", bool(lambda0_ok))
    ctx.flag("split_sizes", {"fit": sizes[0], "tune": sizes[1], "test": sizes[2]})
    ctx.add_samples(samples)
    ctx.table("auc_per_split", [{"split": s["split"], **{k: round(v, 3) for k, v in s["auc"].items()}}
                                for s in samples])  # fmt: skip
    _figures(ctx, cfg, samples)
    claims = [
        Claim("auc", "cascade_routing", "router", ">",
              text="AUC of the quality-cost curve: cascade routing above routing (per split)"),
        Claim("auc", "cascade_routing", "optimal_cascade", ">",
              text="AUC: cascade routing above the optimal cascade (per split)"),
        Claim("auc", "cascade_routing", "threshold_cascade", ">", gate=False,
              text="AUC: cascade routing above the threshold cascade (reported)"),
        Claim("auc", "cascade_routing", "linear", ">", gate=False,
              text="AUC: cascade routing above the linear interpolation of single models (reported)"),
        Claim("auc", "optimal_cascade", "threshold_cascade", ">", gate=False,
              text="AUC: the optimal cascade above the threshold cascade (reported)"),
    ]  # fmt: skip
    names = [lvl for lvl, _ in levels]
    if len(names) >= 2:
        text = (
            f"simulation: the gain of cascade routing over the best baseline is larger at {names[0]} noise "
            f"{levels[0][1]} than at {names[-1]} noise {levels[-1][1]}"
        )
        claims.append(Claim("gain_over_best_baseline", f"sim_{names[0]}", f"sim_{names[-1]}", ">", text=text))
    ctx.note(
        f"Pool (cheapest first): {', '.join(pool.models)}; {n} complete queries of cache {cache.suite!r}; "
        f"{cfg.splits} splits of fit/tune/test = {sizes}; max_depth {cfg.max_depth}; λ search: constant "
        f"({cfg.const_iterations} bisections) + {cfg.search_evals} per-step evaluations."
    )
    return ctx.finish(claims)


def _figures(ctx: Any, cfg: Any, samples: list[dict[str, Any]]) -> None:
    from lmlab.core.report.plotting import bar_with_ci, lines, title_for

    rows = [m for m in ctx.metrics if m.metric == "auc"]
    ctx.add_figure("auc", bar_with_ci(rows, title=title_for("cascade_routing", cfg.cache, cfg.seed, cfg.splits,
                                                            "normalised AUC x100"),
                                      ylabel="AUC x100", highlight=("cascade_routing",)))  # fmt: skip
    first = samples[0]
    xs = sorted({round(c, 6) for pts in first["curves"].values() for c, _ in pts})
    if len(xs) >= 2:
        series = {}
        for name, pts in first["curves"].items():
            pts = sorted(pts)
            series[name] = [float(np.interp(x, [p[0] for p in pts], [p[1] for p in pts])) for x in xs]
        ctx.add_figure("quality_cost", lines(xs, series, title=title_for("cascade_routing", cfg.cache, cfg.seed, None,
                                                                         "test quality vs cost (split 0)"),
                                             xlabel="mean cost (normalised)", ylabel="accuracy"))  # fmt: skip
