"""Reproduction: PMF by MCMC on lmlab's own model x task-slice matrix, against the paper's baselines.

Paper claims (Zhao et al., ICML 2025): PMF predicts unknown scores better than the baselines; its MCMC uncertainty
tracks the actual error, so evaluating the most uncertain cells first lowers RMSE faster than a random order.

Matrix (`slice_matrix`). The response cache (`lmlab.data.respcache`, `cache` = ``"mixed"``: the real zoo;
``"synthetic"``: a planted table) gives per-query results of a pool of variants; rows = variants, columns =
(task, query-chunk) slices of `items_per_cell` queries (a task's queries in cache order, split into
``len // items_per_cell`` near-equal chunks), cell = mean of `column` over the slice.

Replicates (the independent unit). For each of `seeds` random masks at each level of `mask_levels`: PMF (the
method, `prior`), the other prior (reported), plain MF by ALS, mean-of-means and global mean, fitted on the train
cells only (baselines included: no leak of held-out cells into column means). With `tune`, PMF picks (rank, α) from
`pmf_grid` and MF picks (rank, λ) from `mf_grid` (same size) by RMSE on a validation split of the train cells, then
refits on all train cells.

Metrics per replicate: RMSE on the held-out cells (original scale); Spearman correlation of the posterior std with
the absolute error (against a count heuristic 1/sqrt(observed cells in the row and column) and an uninformative
constant); |coverage - level| of the `interval_level` predictive intervals (against MF ± z·residual sd, a plug-in
interval); active evaluation at `active_mask`: RMSE on the original held-out cells after each of `active_rounds`
rounds revealing `active_step` of all cells (revealed cells count as known, as `active_eval.py`), area = mean over
the rounds; uncertainty-ordered vs random vs oracle-worst.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lmlab.core.stats.seeding import derive_seed
from lmlab.methods.evaluation.pmf_predict.method import (
    PMF,
    active_reveal,
    als_mf_predict,
    coverage,
    global_mean_predict,
    mean_of_means_predict,
    rmse,
    split_cells,
)
from lmlab.results import Claim

SYNTHETIC = {"n_variants": 10, "n_queries": 300, "n_tasks": 3}  # the smoke table: 10 x 30 cells of 10 items


def load_table(name: str, seed: int) -> Any:
    """The response cache named by the config (``"synthetic"``: `synthetic_cache` with `SYNTHETIC`)."""
    from lmlab.data.respcache import load_cache, synthetic_cache

    if name == "synthetic":
        return synthetic_cache(**SYNTHETIC, seed=seed)
    return load_cache(name, seed)


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


def run(cfg: Any, ctx: Any) -> Any:
    from scipy.stats import norm, spearmanr

    cache = load_table(cfg.cache, cfg.cache_seed)
    items = cfg.items_per_cell if cfg.limit is None else min(cfg.items_per_cell, cfg.limit)
    variants, slices, full = slice_matrix(cache, items, cfg.column)
    v_n, s_n = full.shape
    if v_n < 3 or s_n < 3:
        raise ValueError(f"the {cfg.cache} cache gives a {v_n} x {s_n} matrix; PMF needs >= 3 variants and slices")
    ctx.models[f"respcache:{cfg.cache}"] = {"variants": variants, "failed": dict(cache.failed), "rows": v_n,
                                            "slices": s_n, "suite": cache.suite, "seed": cache.seed}  # fmt: skip
    ctx.data_info[f"respcache:{cfg.cache}/cells"] = {"n": items, "unit": "queries per cell", "cells": v_n * s_n,
                                                     "seed": cfg.cache_seed}  # fmt: skip
    z90 = float(norm.ppf(0.5 + cfg.interval_level / 2.0))
    other_prior = "bpmf" if cfg.prior == "fixed" else "fixed"

    def pmf_fit(train: np.ndarray, rank: int, alpha: float, seed: int, prior: str = cfg.prior) -> Any:
        return PMF(rank=int(rank), alpha=float(alpha), n_burn=cfg.n_burn, n_draws=cfg.n_draws,
                   init_std=cfg.init_std, prior=prior, seed=seed).fit(train).predict()  # fmt: skip

    vals: dict[tuple[str, str], list[float]] = {}
    tuned: list[dict] = []
    samples = []

    def put(system: str, metric: str, value: float) -> None:
        vals.setdefault((system, metric), []).append(float(value))

    jobs = [(lvl, s) for lvl in cfg.mask_levels for s in range(cfg.seeds)]
    for lvl, s in ctx.progress(jobs, "masks x seeds"):
        tag = f"m{int(round(100 * float(lvl)))}"
        sd = derive_seed(cfg.seed, "mask", float(lvl), s)
        train, test = split_cells(full, float(lvl), sd)
        fit_seed = derive_seed(sd, "gibbs")
        pmf_grid = [[cfg.rank, cfg.alpha]] + [g for g in cfg.pmf_grid if list(g) != [cfg.rank, cfg.alpha]]
        pmf_grid = pmf_grid[: len(cfg.pmf_grid)]
        if cfg.tune:
            val_seed = derive_seed(sd, "val")

            def fit_p(t: np.ndarray, g: list, fs: int = fit_seed) -> np.ndarray:
                return pmf_fit(t, g[0], g[1], fs).mean

            def fit_m(t: np.ndarray, g: list, fs: int = fit_seed) -> np.ndarray:
                return als_mf_predict(t, int(g[0]), float(g[1]), seed=fs)

            best_p, rows_p = _tune(train, pmf_grid, fit_p, cfg.val_fraction, val_seed)
            best_m, rows_m = _tune(train, cfg.mf_grid, fit_m, cfg.val_fraction, val_seed)
            tuned.append({"mask": lvl, "seed": s, "pmf": list(best_p), "mf_als": list(best_m),
                          "pmf_grid": rows_p, "mf_grid": rows_m})  # fmt: skip
        else:
            best_p, best_m = pmf_grid[0], cfg.mf_grid[0]
        pred = pmf_fit(train, best_p[0], best_p[1], fit_seed)
        alt = pmf_fit(train, best_p[0], best_p[1], fit_seed, prior=other_prior)
        mf = als_mf_predict(train, int(best_m[0]), float(best_m[1]), seed=fit_seed)
        mom, gm = mean_of_means_predict(train), global_mean_predict(train)
        for system, p in (("pmf", pred.mean), (f"pmf_{other_prior}", alt.mean), ("mf_als", mf),
                          ("mean_of_means", mom), ("global_mean", gm)):  # fmt: skip
            put(system, f"rmse_{tag}", rmse(p, test))
        held = np.isfinite(test)
        err = np.abs(pred.mean - test)[held]
        obs = np.isfinite(train)
        count = 1.0 / np.sqrt(obs.sum(1)[:, None] + obs.sum(0)[None, :] + 1.0)  # (V, S): fewer observations, less sure
        rho = spearmanr(pred.std[held], err)[0] if err.std() > 0 and pred.std[held].std() > 0 else 0.0
        rho_c = spearmanr(count[held], err)[0] if count[held].std() > 0 and err.std() > 0 else 0.0
        put("pmf", "unc_err_spearman", 0.0 if np.isnan(rho) else rho)
        put("count_heuristic", "unc_err_spearman", 0.0 if np.isnan(rho_c) else rho_c)
        put("uninformative", "unc_err_spearman", 0.0)
        lo, hi = pred.interval(cfg.interval_level)
        put("pmf", "calib_abs_err", abs(coverage(lo, hi, test) - cfg.interval_level))
        put("pmf", "coverage", coverage(lo, hi, test))
        resid = np.nanstd(np.where(obs, full - mf, np.nan))
        put("mf_plugin", "calib_abs_err", abs(coverage(mf - z90 * resid, mf + z90 * resid, test) - cfg.interval_level))
        put("mf_plugin", "coverage", coverage(mf - z90 * resid, mf + z90 * resid, test))
        samples.append({"mask": lvl, "seed": s, "pmf_config": list(best_p), "mf_config": list(best_m),
                        "rmse_pmf": vals[("pmf", f"rmse_{tag}")][-1],
                        "rmse_mean_of_means": vals[("mean_of_means", f"rmse_{tag}")][-1]})  # fmt: skip

    # active evaluation (the paper's PMF settings; no tuning)
    step = max(1, int(round(cfg.active_step * v_n * s_n)))
    curves: dict[str, list[list[float]]] = {}
    for s in ctx.progress(range(cfg.seeds), "active evaluation"):
        sd = derive_seed(cfg.seed, "active", s)
        train, test = split_cells(full, cfg.active_mask, sd)
        n_hidden = int(np.isfinite(test).sum())
        rounds = min(cfg.active_rounds, max(0, (n_hidden - 1) // step))
        gibbs_seed = derive_seed(sd, "gibbs")

        def fit_a(t: np.ndarray, gs: int = gibbs_seed) -> Any:
            return pmf_fit(t, cfg.rank, cfg.alpha, gs)

        for strat in ("uncertainty", "random", "oracle"):
            curve = active_reveal(full, train, test, strategy=strat, rounds=rounds, step=step,
                                  seed=derive_seed(sd, strat), fit=fit_a)  # fmt: skip
            curves.setdefault(strat, []).append(curve)
            put(f"{strat}_reveal", "active_auc", float(np.mean(curve)))
            put(f"{strat}_reveal", "active_final_rmse", curve[-1])

    for (system, metric), v in vals.items():
        ctx.record(system, metric, v, note=f"one value per random mask ({cfg.seeds} seeds)")
    ctx.flag("matrix", {"variants": v_n, "slices": s_n, "items_per_cell": items, "column": cfg.column,
                        "observed": int(np.isfinite(full).sum())})  # fmt: skip
    ctx.flag("active", {"mask": cfg.active_mask, "step_cells": step, "rounds": cfg.active_rounds})
    if tuned:
        ctx.table("tuning", [{k: v for k, v in t.items() if k in ("mask", "seed", "pmf", "mf_als")} for t in tuned])
    ctx.table("active_curves", [
        {"strategy": k, "round": r, "rmse": float(np.mean([c[r] for c in cs if len(c) > r]))}
        for k, cs in curves.items() for r in range(max(len(c) for c in cs))
    ])  # fmt: skip
    ctx.table("matrix_slices", [
        {"variant": v, **{sl: (None if not np.isfinite(full[i, j]) else round(float(full[i, j]), 3))
                          for j, sl in enumerate(slices)}}
        for i, v in enumerate(variants)
    ])  # fmt: skip
    ctx.add_samples(samples)
    _figures(ctx, cfg, curves)
    ctx.note(f"Matrix: {v_n} variants x {s_n} (task, chunk) slices of {items} queries ({cfg.column}) from the "
             f"{cfg.cache} cache; PMF {cfg.prior} prior, {cfg.n_burn} + {cfg.n_draws} Gibbs sweeps; "
             f"{'tuned on a validation split' if cfg.tune else 'paper defaults, MF first grid entry'}.")  # fmt: skip
    return ctx.finish(_claims(cfg, other_prior))


def _claims(cfg: Any, other_prior: str) -> list[Claim]:
    claims = []
    for lvl in cfg.mask_levels:
        tag = f"rmse_m{int(round(100 * float(lvl)))}"
        claims.append(Claim(tag, "pmf", "mean_of_means", "<",
                            text=f"RMSE at {float(lvl):.0%} masked: PMF below mean-of-means (per mask)"))  # fmt: skip
        claims.append(Claim(tag, "pmf", "mf_als", "<", gate=False,
                            text=f"RMSE at {float(lvl):.0%} masked: PMF below tuned plain MF (reported)"))  # fmt: skip
        claims.append(Claim(tag, "mean_of_means", "global_mean", "<", gate=False,
                            text=f"RMSE at {float(lvl):.0%} masked: mean-of-means below global mean "
                            "(reported)"))  # fmt: skip
        claims.append(Claim(tag, f"pmf_{other_prior}", "pmf", "<", gate=False,
                            text=f"RMSE at {float(lvl):.0%} masked: the {other_prior} prior below {cfg.prior} "
                            "(reported; the paper's Bayesian priors help when sparse)"))  # fmt: skip
    claims += [
        Claim("unc_err_spearman", "pmf", "uninformative", ">",
              text="calibration: Spearman(posterior std, |error|) on held-out cells above 0 (per mask)"),
        Claim("unc_err_spearman", "pmf", "count_heuristic", ">", gate=False,
              text="calibration: posterior std ranks errors better than 1/sqrt(observations) (reported)"),
        Claim("calib_abs_err", "pmf", "mf_plugin", "<", gate=False,
              text=f"|coverage - {cfg.interval_level}| of PMF predictive intervals below MF ± z·residual sd "
              "(reported)"),
        Claim("active_auc", "uncertainty_reveal", "random_reveal", "<",
              text="active evaluation: mean RMSE over reveal rounds lower revealing the most uncertain cells first "
              "than random cells (per mask)"),
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
