"""Reproduction: PMF by MCMC on lmlab's own model x task-slice matrices, against the paper's baselines.

Paper claims (Zhao et al., ICML 2025): PMF predicts unknown scores better than the baselines; its MCMC uncertainty
tracks the actual error, so evaluating the most uncertain cells first lowers RMSE faster than a random order.

Matrices (`slice_matrix`). One per cache seed in `cache_seeds` (`lmlab.data.respcache`, `cache` = ``"mixed"``: the
real zoo; ``"synthetic"``: a planted table per seed); rows = variants, columns = (task, query-chunk) slices of
`items_per_cell` queries (a task's queries in cache order, split into ``len // items_per_cell`` near-equal chunks),
cell = mean of `column` over the slice.

Independent unit. A cache seed is an independent sample of queries; within one, the tasks' query sets are disjoint.
The `seeds` random masks of one matrix overlap (they re-use its cells), so they are never counted as replicates:
every gated metric is recorded per (cache seed, mask, task) with cluster (cache seed, task), and the claims' cluster
bootstrap resamples those (3 seeds x 8 tasks = 24 at the default), the masks of a cluster moving together. Per-seed
effects and a k-of-n sign count are tabled beside (`per_cache_seed`).

Systems per mask, fitted on the train cells only (baselines included: no leak of held-out cells): PMF with the
paper's (rank, α) (the gated method, always untuned), the other `prior` with the same (rank, α), plain MF by ALS,
mean-of-means and global mean on the column-normalised train matrix mapped back (as `run_pmf.py`), mean-of-means on
the raw scores (reported), and with `tune` a tuned PMF (``pmf_tuned``: (rank, α) from `pmf_grid` by RMSE on one
validation split of the train cells; reported) while MF picks (rank, λ) from `mf_grid` (same size) the same way.

Metrics: `mse_mXX` = MSE on the held-out cells of one task (gated, per cluster) and `rmse_mXX` = RMSE on all
held-out cells (per cache seed; the paper's number, reported); `unc_err_spearman` = Spearman, within one task's
held-out cells, of an uncertainty with |error|: PMF's posterior std against the binomial heuristic
sqrt(p̂(1 − p̂)/items) at PMF's own mean (gated), 1/sqrt(observed cells in the row and column) and a constant
(reported); |coverage − level| of the `interval_level` predictive intervals (against MF ± z·residual sd, per cache
seed); active evaluation at `active_mask`: `active_rounds` rounds revealing `active_step` of all cells (revealed
cells count as known, as `active_eval.py`), `active_auc` = the mean over rounds 0..R of the MSE on one task's
original held-out cells; uncertainty-ordered vs random (gated) vs the binomial heuristic's order and oracle-worst.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from lmlab.core.stats.seeding import derive_seed
from lmlab.methods.evaluation.pmf_predict.method import (
    PMF,
    als_mf_predict,
    binomial_sd,
    coverage,
    global_mean_predict,
    group_mse,
    mean_of_means_predict,
    reveal_path,
    rmse,
    split_cells,
)
from lmlab.results import Claim

SYNTHETIC = {"n_variants": 10, "n_queries": 300, "n_tasks": 3}  # the smoke table: 10 x 30 cells of 10 items
REVEALS = (("uncertainty", "uncertainty_reveal"), ("random", "random_reveal"), ("heuristic", "binomial_reveal"),
           ("oracle", "oracle_reveal"))  # (reveal_path strategy, system)  # fmt: skip


def load_table(name: str, seed: int) -> Any:
    """The response cache named by the config (``"synthetic"``: `synthetic_cache` with `SYNTHETIC`)."""
    from lmlab.data.respcache import load_cache, synthetic_cache

    if name == "synthetic":
        return synthetic_cache(**SYNTHETIC, seed=seed)
    return load_cache(name, seed)


def load_tables(name: str, seeds: list) -> list:
    """One cache per cache seed: `respcache.load_caches` (its checks of the seed list), or planted tables."""
    from lmlab.data.respcache import load_caches

    if name == "synthetic":
        return [load_table(name, int(s)) for s in seeds]
    return load_caches(name, [int(s) for s in seeds])


def slice_matrix(cache: Any, items_per_cell: int, column: str = "correct") -> tuple[list[str], list[str], np.ndarray]:
    """``(variants, slices, R)``: R[v, s] = mean `column` of variant v over the queries of slice s, [V, S].

    A slice is one chunk of a task's queries (cache order), ``len // items_per_cell`` near-equal chunks per task (at
    least one); only queries every variant answered are used. A view over `ResponseCache.matrix`.
    """
    if items_per_cell < 1:
        raise ValueError(f"items_per_cell must be >= 1, got {items_per_cell!r}")
    vids, qids, m = cache.matrix(column)  # (V, Q), complete
    task_of = cache.tasks()
    by_task: dict[str, list[int]] = {}
    for j, q in enumerate(qids):
        by_task.setdefault(task_of[q], []).append(j)
    names, cols = [], []
    for task, idx in by_task.items():
        k = max(1, len(idx) // items_per_cell)
        for c, chunk in enumerate(np.array_split(np.asarray(idx), k)):
            with np.errstate(invalid="ignore"):
                cols.append(np.nanmean(m[:, chunk], axis=1))
            names.append(f"{task}#{c}")
    r = np.stack(cols, axis=1)  # (V, S)
    keep = np.isfinite(r).any(axis=0)
    return vids, [n for n, k in zip(names, keep) if k], r[:, keep]


def _tune(train: np.ndarray, grid: list, fit: Any, val_fraction: float, seed: int) -> tuple[Any, list[dict]]:
    """The grid entry with the lowest validation RMSE (a random `val_fraction` of the train cells held out)."""
    try:
        sub, val = split_cells(train, val_fraction, seed)
    except ValueError:
        return grid[0], []
    rows = []
    for g in grid:
        rows.append({"config": list(g), "val_rmse": rmse(fit(sub, g), val)})
    best = min(range(len(grid)), key=lambda i: (rows[i]["val_rmse"], i))
    return grid[best], rows


def column_tasks(slices: list[str]) -> list[str]:
    """The task of each `slice_matrix` column (its name up to the last ``#``)."""
    return [s.rsplit("#", 1)[0] for s in slices]


def sampling_sd(mean: np.ndarray, train: np.ndarray, items: int, column: str) -> np.ndarray:
    """The uncertainty heuristic of a point prediction [M, N]: `binomial_sd` of `mean` over `items` results for the
    0/1 ``correct`` column; for a continuous column, the train spread of the column over sqrt(items)."""
    if column == "correct":
        return binomial_sd(mean, items)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: their mean / std are NaN, handled below
        spread = np.nan_to_num(np.nanstd(train, axis=0), nan=float(np.nanstd(train)))  # (N,)
    return np.broadcast_to(spread[None, :] / np.sqrt(items), mean.shape)


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho, 0 where either side is constant (no ranking to compare)."""
    from scipy.stats import spearmanr

    if len(x) < 2 or np.std(x) == 0 or np.std(y) == 0:
        return 0.0
    rho = float(spearmanr(x, y)[0])
    return 0.0 if np.isnan(rho) else rho


def run(cfg: Any, ctx: Any) -> Any:
    from scipy.stats import norm

    caches = load_tables(cfg.cache, cfg.cache_seeds)
    items = cfg.items_per_cell if cfg.limit is None else min(cfg.items_per_cell, cfg.limit)
    mats = []  # (cache seed, variants, slices, R [V, S])
    for c, cache in zip(cfg.cache_seeds, caches):
        variants, slices, full = slice_matrix(cache, items, cfg.column)
        v_n, s_n = full.shape
        if v_n < 3 or s_n < 3:
            raise ValueError(f"the {cfg.cache} cache seed {c} gives a {v_n} x {s_n} matrix; PMF needs >= 3 variants "
                             "and slices")  # fmt: skip
        ctx.models[f"respcache:{cfg.cache}-s{c}"] = {"variants": variants, "failed": dict(cache.failed),
                                                     "rows": v_n, "slices": s_n, "suite": cache.suite,
                                                     "seed": cache.seed}  # fmt: skip
        ctx.data_info[f"respcache:{cfg.cache}-s{c}/cells"] = {"n": items, "unit": "queries per cell",
                                                              "cells": v_n * s_n, "seed": c}  # fmt: skip
        mats.append((c, variants, slices, full))
    z90 = float(norm.ppf(0.5 + cfg.interval_level / 2.0))
    other_prior = "bpmf" if cfg.prior == "fixed" else "fixed"
    paper = [cfg.rank, cfg.alpha]

    def pmf_fit(train: np.ndarray, rank: int, alpha: float, seed: int, prior: str = cfg.prior) -> Any:
        return PMF(rank=int(rank), alpha=float(alpha), n_burn=cfg.n_burn, n_draws=cfg.n_draws,
                   init_std=cfg.init_std, prior=prior, seed=seed).fit(train).predict()  # fmt: skip

    vals: dict[tuple[str, str], list[float]] = {}
    clus: dict[tuple[str, str], list[str]] = {}
    tuned: list[dict] = []
    samples = []

    def put(system: str, metric: str, value: float, cluster: str) -> None:
        vals.setdefault((system, metric), []).append(float(value))
        clus.setdefault((system, metric), []).append(cluster)

    pmf_grid = ([paper] + [g for g in cfg.pmf_grid if list(g) != paper])[: len(cfg.pmf_grid)]
    jobs = [(m, lvl, k) for m in range(len(mats)) for lvl in cfg.mask_levels for k in range(cfg.seeds)]
    for m, lvl, k in ctx.progress(jobs, "cache seeds x masks"):
        c, _, slices, full = mats[m]
        tasks = column_tasks(slices)
        tag = f"m{int(round(100 * float(lvl)))}"
        sd = derive_seed(cfg.seed, "mask", c, float(lvl), k)
        train, test = split_cells(full, float(lvl), sd)
        fit_seed = derive_seed(sd, "gibbs")
        pred = pmf_fit(train, cfg.rank, cfg.alpha, fit_seed)  # the paper's PMF: the gated method, never tuned
        alt = pmf_fit(train, cfg.rank, cfg.alpha, fit_seed, prior=other_prior)
        systems = {"pmf": pred.mean, f"pmf_{other_prior}": alt.mean}
        best_m = cfg.mf_grid[0]
        if cfg.tune:
            val_seed = derive_seed(sd, "val")

            def fit_p(t: np.ndarray, g: list, fs: int = fit_seed) -> np.ndarray:
                return pmf_fit(t, g[0], g[1], fs).mean

            def fit_m(t: np.ndarray, g: list, fs: int = fit_seed) -> np.ndarray:
                return als_mf_predict(t, int(g[0]), float(g[1]), seed=fs)

            best_p, rows_p = _tune(train, pmf_grid, fit_p, cfg.val_fraction, val_seed)
            best_m, rows_m = _tune(train, cfg.mf_grid, fit_m, cfg.val_fraction, val_seed)
            same = [float(x) for x in best_p] == [float(x) for x in paper]
            systems["pmf_tuned"] = pred.mean if same else pmf_fit(train, best_p[0], best_p[1], fit_seed).mean
            tuned.append({"cache_seed": c, "mask": lvl, "seed": k, "pmf_tuned": list(best_p), "mf_als": list(best_m),
                          "pmf_grid": rows_p, "mf_grid": rows_m})  # fmt: skip
        mf = als_mf_predict(train, int(best_m[0]), float(best_m[1]), seed=fit_seed)
        systems.update(mf_als=mf, mean_of_means=mean_of_means_predict(train), global_mean=global_mean_predict(train),
                       mean_of_means_raw=mean_of_means_predict(train, normalise=False))  # fmt: skip
        for system, p in systems.items():
            put(system, f"rmse_{tag}", rmse(p, test), f"s{c}")
            for task, mse in group_mse(p, test, tasks).items():
                put(system, f"mse_{tag}", mse, f"s{c}/{task}")
        # calibration: within each task's held-out cells (a 0% task's near-zero errors and sds rank nothing)
        held = np.isfinite(test)
        err = np.abs(pred.mean - test)  # (V, S), NaN off the test cells
        heur = sampling_sd(pred.mean, train, items, cfg.column)
        obs = np.isfinite(train)
        count = 1.0 / np.sqrt(obs.sum(1)[:, None] + obs.sum(0)[None, :] + 1.0)  # (V, S): fewer observations, less sure
        for task in dict.fromkeys(tasks):
            cell = held & (np.asarray(tasks) == task)[None, :]
            if cell.sum() < 3:
                continue
            e = err[cell]
            for system, u in (("pmf", pred.std), ("binomial_sd", heur), ("count_heuristic", count)):
                put(system, "unc_err_spearman", _spearman(u[cell], e), f"s{c}/{task}")
            put("uninformative", "unc_err_spearman", 0.0, f"s{c}/{task}")
        lo, hi = pred.interval(cfg.interval_level)
        put("pmf", "calib_abs_err", abs(coverage(lo, hi, test) - cfg.interval_level), f"s{c}")
        put("pmf", "coverage", coverage(lo, hi, test), f"s{c}")
        resid = np.nanstd(np.where(obs, full - mf, np.nan))
        mf_cov = coverage(mf - z90 * resid, mf + z90 * resid, test)
        put("mf_plugin", "calib_abs_err", abs(mf_cov - cfg.interval_level), f"s{c}")
        put("mf_plugin", "coverage", mf_cov, f"s{c}")
        samples.append({"cache_seed": c, "mask": lvl, "seed": k, "mf_config": list(best_m),
                        **{f"rmse_{s}": vals[(s, f"rmse_{tag}")][-1] for s in systems}})  # fmt: skip

    # active evaluation (the paper's PMF settings; no tuning), per cache seed
    curves: dict[str, list[list[float]]] = {}
    steps = {}
    act_jobs = [(m, k) for m in range(len(mats)) for k in range(cfg.seeds)]
    for m, k in ctx.progress(act_jobs, "active evaluation"):
        c, _, slices, full = mats[m]
        tasks = column_tasks(slices)
        step = steps.setdefault(f"s{c}", max(1, int(round(cfg.active_step * full.size))))
        sd = derive_seed(cfg.seed, "active", c, k)
        train, test = split_cells(full, cfg.active_mask, sd)
        n_hidden = int(np.isfinite(test).sum())
        rounds = min(cfg.active_rounds, max(0, (n_hidden - 1) // step))
        gibbs_seed = derive_seed(sd, "gibbs")

        def fit_a(t: np.ndarray, gs: int = gibbs_seed) -> Any:
            return pmf_fit(t, cfg.rank, cfg.alpha, gs)

        def heuristic(p: Any, t: np.ndarray) -> np.ndarray:
            return sampling_sd(p.mean, t, items, cfg.column)

        for strat, system in REVEALS:
            path = reveal_path(full, train, test, strategy=strat, rounds=rounds, step=step, fit=fit_a,
                               seed=derive_seed(sd, strat), heuristic=heuristic)  # fmt: skip
            curves.setdefault(system, []).append([rmse(p, test) for p in path])
            per_round = [group_mse(p, test, tasks) for p in path]  # rounds+1 x {task: mse}
            for task in per_round[0]:
                put(system, "active_auc", float(np.mean([r[task] for r in per_round])), f"s{c}/{task}")

    for (system, metric), v in vals.items():
        unit = "cache seed" if clus[(system, metric)][0].count("/") == 0 else "(cache seed, task)"
        ctx.record(system, metric, v, clusters=clus[(system, metric)],
                   note=f"cluster = {unit}; {cfg.seeds} masks per cache seed averaged within it")  # fmt: skip
    claims = _claims(cfg, other_prior)
    ctx.table("per_cache_seed", _per_seed(claims, vals, clus))
    ctx.flag("matrix", {"variants": min(x[3].shape[0] for x in mats), "slices": min(x[3].shape[1] for x in mats),
                        "items_per_cell": items, "column": cfg.column, "cache_seeds": list(cfg.cache_seeds),
                        "per_seed": [{"cache_seed": c, "variants": f.shape[0], "slices": f.shape[1],
                                      "observed": int(np.isfinite(f).sum())} for c, _, _, f in mats]})  # fmt: skip
    ctx.flag("active", {"mask": cfg.active_mask, "step_cells": steps, "rounds": cfg.active_rounds})
    if tuned:
        ctx.table("tuning", [{k: v for k, v in t.items() if k in ("cache_seed", "mask", "seed", "pmf_tuned", "mf_als")}
                             for t in tuned])  # fmt: skip
    ctx.table("active_curves", [
        {"strategy": k, "round": r, "rmse": float(np.mean([c[r] for c in cs if len(c) > r]))}
        for k, cs in curves.items() for r in range(max(len(c) for c in cs))
    ])  # fmt: skip
    c0, variants0, slices0, full0 = mats[0]
    ctx.table("matrix_slices", [
        {"variant": v, **{sl: (None if not np.isfinite(full0[i, j]) else round(float(full0[i, j]), 3))
                          for j, sl in enumerate(slices0)}}
        for i, v in enumerate(variants0)
    ])  # fmt: skip
    ctx.add_samples(samples)
    _figures(ctx, cfg, curves)
    ctx.note(f"Matrices: {len(mats)} cache seeds ({', '.join(str(x[0]) for x in mats)}) of the {cfg.cache} cache, "
             f"{mats[0][3].shape[0]} variants x {mats[0][3].shape[1]} (task, chunk) slices of {items} queries "
             f"({cfg.column}); the gated PMF is the paper's (D = {cfg.rank}, alpha = {cfg.alpha}, {cfg.prior} prior), "
             f"{cfg.n_burn} + {cfg.n_draws} Gibbs sweeps; baselines on the column-normalised scale; "
             f"{'pmf_tuned and MF tuned on a validation split' if cfg.tune else 'MF first grid entry'}; matrix_slices "
             f"shows cache seed {c0}.")  # fmt: skip
    return ctx.finish(claims)


def _per_seed(claims: list[Claim], vals: dict, clus: dict) -> list[dict]:
    """Each claim's effect within each cache seed (mean of method − baseline over that seed's values), with the
    number of seeds whose effect lies in the claimed direction: the k-of-n sign check beside the cluster CI."""
    rows = []
    for cl in claims:
        a, b = vals.get((cl.method, cl.metric)), vals.get((cl.baseline, cl.metric))
        if a is None or b is None:
            continue
        seed_of = np.asarray([x.split("/", 1)[0] for x in clus[(cl.method, cl.metric)]])
        diff = np.asarray(a) - np.asarray(b)  # paired values, same clusters in the same order
        effects = {s: float(np.mean(diff[seed_of == s])) for s in dict.fromkeys(seed_of.tolist())}
        agree = sum((e > 0) if cl.direction == ">" else (e < 0) for e in effects.values())
        rows.append({"metric": cl.metric, "method": cl.method, "baseline": cl.baseline, "gate": cl.gate,
                     **{f"effect_{s}": round(e, 6) for s, e in effects.items()},
                     "seeds_in_direction": f"{agree} of {len(effects)}"})  # fmt: skip
    return rows


def _claims(cfg: Any, other_prior: str) -> list[Claim]:
    claims = []
    for lvl in cfg.mask_levels:
        pct = f"{float(lvl):.0%}"
        tag = f"mse_m{int(round(100 * float(lvl)))}"
        claims.append(Claim(tag, "pmf", "mean_of_means", "<",
                            text=f"MSE at {pct} masked: the paper's PMF (D = {cfg.rank}, alpha = {cfg.alpha}) below "
                            "mean-of-means on the normalised scale (per cache seed x task)"))  # fmt: skip
        claims.append(Claim(tag, "pmf", "mf_als", "<", gate=False,
                            text=f"MSE at {pct} masked: PMF below plain MF (reported)"))  # fmt: skip
        claims.append(Claim(tag, "mean_of_means", "global_mean", "<", gate=False,
                            text=f"MSE at {pct} masked: mean-of-means below global mean, both normalised "
                            "(reported)"))  # fmt: skip
        claims.append(Claim(tag, "pmf", "mean_of_means_raw", "<", gate=False,
                            text=f"MSE at {pct} masked: PMF below raw-score mean-of-means (reported)"))  # fmt: skip
        claims.append(Claim(tag, f"pmf_{other_prior}", "pmf", "<", gate=False,
                            text=f"MSE at {pct} masked: the {other_prior} prior below {cfg.prior} "
                            "(reported; the paper's Bayesian priors help when sparse)"))  # fmt: skip
        if cfg.tune:
            claims.append(Claim(tag, "pmf_tuned", "pmf", "<", gate=False,
                                text=f"MSE at {pct} masked: PMF tuned on a validation split below the paper's "
                                "defaults (reported)"))  # fmt: skip
    claims += [
        Claim("unc_err_spearman", "pmf", "binomial_sd", ">",
              text="calibration: within a task, PMF's posterior std ranks held-out |errors| better than the binomial "
              "sd sqrt(p(1-p)/items) at PMF's own mean (per cache seed x task)"),
        Claim("unc_err_spearman", "pmf", "uninformative", ">", gate=False,
              text="calibration: Spearman(posterior std, |error|) within a task above 0 (reported)"),
        Claim("unc_err_spearman", "pmf", "count_heuristic", ">", gate=False,
              text="calibration: posterior std ranks errors better than 1/sqrt(observations) (reported)"),
        Claim("calib_abs_err", "pmf", "mf_plugin", "<", gate=False,
              text=f"|coverage - {cfg.interval_level}| of PMF predictive intervals below MF ± z·residual sd "
              "(reported, per cache seed)"),
        Claim("active_auc", "uncertainty_reveal", "random_reveal", "<",
              text="active evaluation: mean MSE over reveal rounds lower revealing the most uncertain cells first "
              "than random cells (per cache seed x task)"),
        Claim("active_auc", "uncertainty_reveal", "binomial_reveal", "<", gate=False,
              text="active evaluation: posterior-std order below the binomial-sd order (reported)"),
        Claim("active_auc", "uncertainty_reveal", "oracle_reveal", ">", gate=False,
              text="active evaluation: the oracle-worst order (true errors known) is the lower bound (reported)"),
    ]  # fmt: skip
    return claims


def _figures(ctx: Any, cfg: Any, curves: dict[str, list[list[float]]]) -> None:
    from lmlab.core.report.plotting import bar_with_ci, lines, title_for

    for lvl in cfg.mask_levels:
        tag = f"rmse_m{int(round(100 * float(lvl)))}"
        rows = [m for m in ctx.metrics if m.metric == tag]
        ctx.add_figure(tag, bar_with_ci(rows, title=title_for("pmf_predict", cfg.cache, cfg.seed, cfg.seeds,
                                                              f"held-out RMSE, {float(lvl):.0%} masked"),
                                        ylabel="RMSE", highlight=("pmf",)))  # fmt: skip
    n = min(len(c) for cs in curves.values() for c in cs)
    series = {k: [float(np.mean([c[r] for c in cs])) for r in range(n)] for k, cs in curves.items()}
    ctx.add_figure("active", lines([cfg.active_step * r for r in range(n)], series,
                                   title=title_for("pmf_predict", cfg.cache, cfg.seed, cfg.seeds, "active evaluation"),
                                   xlabel="share of cells revealed", ylabel="RMSE on held-out cells"))  # fmt: skip
