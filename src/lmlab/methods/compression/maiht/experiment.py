"""Reproduction: mAIHT against magnitude, Wanda and SparseGPT on SmolLM2, layer by layer and on the whole model.

1. Layer-wise study: the input Gram matrices of `study_layers` (dense model, calibration windows of the `corpus`
   train split). Each solver prunes each linear to `sparsity`; the relative reconstruction error
   ``||X (W - W')^T||^2 / ||X W^T||^2`` (the quantity mAIHT minimises) is recorded per linear (paired by linear),
   with the solver's wall time. Ablations: IHT (no acceleration), AIHT (accelerated, no monotone safeguard), and
   mAIHT with the repo's CLI step 1e-3 instead of 0.97 / lambda_max(A).
2. Objective vs iteration: on the first study linear, IHT / AIHT / mAIHT at the same fixed lambda (the one mAIHT's
   continuation reached), so all three minimise the same F; mAIHT's F must never increase.
3. Full model (`full_prune`): every linear of every block pruned sequentially by magnitude, Wanda, SparseGPT and
   mAIHT (through the shared engine, `lmlab.core.pruning.prune_model`, mAIHT as its per-linear plug-in) at each of
   `sparsities`; held-out perplexity on the test split (disjoint modules), prune wall time.

Claim checks (computed): mAIHT's layer error below SparseGPT's and Wanda's (paired by linear); test NLL below Wanda's
at the highest sparsity (paired by window); versus SparseGPT reported, not gated (the spec expects a small or mixed gap
at 135M).
"""

from __future__ import annotations

import copy
import math
import time
from typing import Any

import numpy as np

from lmlab.core.pruning import (
    calibration_windows,
    collect_layer_stats,
    decoder_blocks,
    eval_windows,
    get_prune_fn,
    prune_model,
    token_stream,
    window_nll,
)
from lmlab.core.pruning.evaluate import record_perplexity
from lmlab.core.report.plotting import lines, title_for
from lmlab.methods.compression.maiht.method import reconstruction_error, solve
from lmlab.results import Claim

BASELINES = ("magnitude", "wanda", "sparsegpt")


def maiht_prune_fn(**kwargs: Any):
    """The engine plug-in: ``prune_fn(weight, stats, sparsity, nm) -> new_weight`` running `solve` on stats.gram."""

    def prune_fn(weight, stats, sparsity, nm):
        return solve(weight, stats.gram, sparsity, nm=nm, **kwargs).weight

    return prune_fn


def _parse(item: str) -> tuple[int, str]:
    block, _, name = item.partition(":")
    return int(block), name


def run(cfg: Any, ctx: Any) -> Any:
    model, tok = ctx.load_model()
    n_blocks = len(decoder_blocks(model))
    train = token_stream(tok, [e.prompt for e in ctx.data("corpus", None, split="train")])
    calib = calibration_windows(train, cfg.n_calib, cfg.seq_len, seed=cfg.seed)
    wanted = [_parse(x) for x in cfg.study_layers]
    bad = [f"{b}:{n}" for b, n in wanted if b >= n_blocks]
    if bad:
        raise ValueError(f"study_layers {bad}: the model has blocks 0..{n_blocks - 1}")
    claims: list[Claim] = []

    # 1. layer-wise study on the dense model's statistics
    stats = collect_layer_stats(model, calib, keep=lambda b, n: (b, n) in set(wanted), batch_size=cfg.batch_size)
    missing = [f"{b}:{n}" for b, n in wanted if (b, n) not in stats]
    if missing:
        raise ValueError(
            f"study_layers {missing}: no such linear (names look like 'self_attn.q_proj', 'mlp.down_proj')"
        )
    blocks = decoder_blocks(model)
    solvers = {
        "magnitude": lambda w, st: get_prune_fn("magnitude")(w, st, cfg.sparsity, None),
        "wanda": lambda w, st: get_prune_fn("wanda")(w, st, cfg.sparsity, None),
        "sparsegpt": lambda w, st: get_prune_fn("sparsegpt")(w, st, cfg.sparsity, None),
        "iht": lambda w, st: solve(w, st.gram, cfg.sparsity, variant="iht", iters=cfg.study_iters,
                                   refine=cfg.study_refine, step=cfg.step, ridge=cfg.ridge).weight,
        "aiht": lambda w, st: solve(w, st.gram, cfg.sparsity, variant="aiht", iters=cfg.study_iters,
                                    refine=cfg.study_refine, step=cfg.step, ridge=cfg.ridge).weight,
        "maiht_step1e-3": lambda w, st: solve(w, st.gram, cfg.sparsity, iters=cfg.study_iters,
                                              refine=cfg.study_refine, step=cfg.fixed_step, ridge=cfg.ridge).weight,
        "maiht": lambda w, st: solve(w, st.gram, cfg.sparsity, iters=cfg.study_iters, refine=cfg.study_refine,
                                     step=cfg.step, ridge=cfg.ridge).weight,
    }  # fmt: skip
    errors: dict[str, list[float]] = {k: [] for k in solvers}
    seconds: dict[str, list[float]] = {k: [] for k in solvers}
    rows = []
    for b, name in ctx.progress(wanted, "layer study"):
        weight = blocks[b].get_submodule(name).weight.detach().float().clone()
        st = stats[(b, name)]
        row: dict[str, Any] = {"linear": f"{b}:{name}", "shape": "x".join(map(str, weight.shape))}
        for system, fn in solvers.items():
            t0 = time.perf_counter()
            new = fn(weight.clone(), st)
            seconds[system].append(time.perf_counter() - t0)
            rel = reconstruction_error(weight, new, st.gram)[1]
            errors[system].append(rel)
            row[system] = round(rel, 5)
        rows.append(row)
    for system in solvers:
        ctx.record(system, "layer_rel_error", errors[system],
                   note=f"||X(W-W')^T||^2/||XW^T||^2 at {cfg.sparsity:g}, paired by linear")  # fmt: skip
        ctx.record(system, "solve_time", seconds[system], unit="s", note="wall time per linear (contended machine)")
    ctx.table("layer_study", rows)
    claims += [
        Claim("layer_rel_error", "maiht", "sparsegpt", "<", text="layer-wise: mAIHT's reconstruction error below "
              "SparseGPT's (paired by linear)"),
        Claim("layer_rel_error", "maiht", "wanda", "<", text="layer-wise: mAIHT's reconstruction error below Wanda's"),
        Claim("layer_rel_error", "maiht", "maiht_step1e-3", "<", gate=False,
              text="the automatic step 0.97/lambda_max beats the repo's CLI step 1e-3 at this scale"),
        Claim("layer_rel_error", "maiht", "iht", "<", gate=False, text="ablation: acceleration helps (vs IHT)"),
    ]  # fmt: skip

    # 2. objective vs iteration at a common fixed lambda
    b0, n0 = wanted[0]
    w0 = blocks[b0].get_submodule(n0).weight.detach().float().clone()
    lam = solve(w0, stats[(b0, n0)].gram, cfg.sparsity, iters=cfg.study_iters, refine=0, step=cfg.step,
                ridge=cfg.ridge).lam  # fmt: skip
    curves = {}
    for variant in ("iht", "aiht", "maiht"):
        res = solve(w0, stats[(b0, n0)].gram, cfg.sparsity, variant=variant, iters=cfg.study_iters, refine=0,
                    step=cfg.step, ridge=cfg.ridge, lam=lam, record=True)  # fmt: skip
        curves[variant] = res.objective
    increases = {v: sum(1 for a, c in zip(o, o[1:]) if c > a * (1 + 1e-6)) for v, o in curves.items()}
    ctx.flag("objective_increases_fixed_lambda", increases)
    ctx.record_value("maiht", "objective_increases", increases["maiht"],
                     note=f"iterations where F rose, {b0}:{n0}, fixed lambda (guarantee: 0)")  # fmt: skip
    ctx.record_value("aiht", "objective_increases", increases["aiht"], note="no monotone safeguard")
    ctx.record_value("maiht", "final_objective_ratio_vs_iht", curves["maiht"][-1] / curves["iht"][-1],
                     note="F after the last iteration, mAIHT / IHT (< 1: faster decrease)")  # fmt: skip
    ctx.add_figure("objective_vs_iteration", lines(
        list(range(1, cfg.study_iters + 1)), {k: [x / v[0] for x in v] for k, v in curves.items()},
        title=title_for("maiht", str(cfg.model), cfg.seed, None, f"F_t / F_1 on {b0}:{n0}, fixed lambda"),
        xlabel="iteration", ylabel="relative objective"))  # fmt: skip
    ctx.note(f"Objective at a fixed lambda on {b0}:{n0}: iterations where F increased: {increases} (mAIHT's "
             "monotone safeguard guarantees 0; AIHT has none).")  # fmt: skip

    # 3. the whole model
    if cfg.full_prune:
        _full_prune(cfg, ctx, model, tok, calib, claims)
    del stats
    return ctx.finish(claims=claims)


def _full_prune(cfg: Any, ctx: Any, model: Any, tok: Any, calib: Any, claims: list[Claim]) -> None:
    test = eval_windows(token_stream(tok, [e.prompt for e in ctx.data("corpus", None, split="test")]),
                        cfg.n_test, cfg.seq_len)  # fmt: skip
    ctx.flag("data", {"calib": list(calib.shape), "test": list(test.shape), "splits": "corpus train / test"})
    nll = {"dense": window_nll(model, test, batch_size=cfg.batch_size)}
    record_perplexity(ctx, "dense", nll["dense"])
    summary = []
    for s in cfg.sparsities:
        for pruner in (*BASELINES, "maiht"):
            system = f"{pruner}_s{round(s * 100):d}"
            pm = copy.deepcopy(model)
            method = maiht_prune_fn(iters=cfg.iters, refine=cfg.refine, step=cfg.step, ridge=cfg.ridge) \
                if pruner == "maiht" else pruner  # fmt: skip
            report = prune_model(pm, calib, method=method, sparsity=s, batch_size=cfg.batch_size, track_dense=False)
            nll[system] = window_nll(pm, test, batch_size=cfg.batch_size)
            record_perplexity(ctx, system, nll[system])
            ctx.record_value(system, "prune_time", report.seconds, unit="s")
            ctx.record_value(system, "measured_sparsity", report.sparsity, note=f"nominal {s:g}")
            ctx.record(system, "full_layer_rel_error", [r.rel_recon_error for r in report.layers],
                       note="per linear, on its sequential (already-pruned-upstream) inputs")  # fmt: skip
            summary.append({"system": system, "test_ppl": round(math.exp(float(np.mean(nll[system]))), 3),
                            "measured_sparsity": round(report.sparsity, 4), "prune_s": round(report.seconds, 1),
                            "mean_layer_rel_error": round(float(np.mean([r.rel_recon_error for r in report.layers])),
                                                          5)})  # fmt: skip
            del pm
    ctx.table("full_model", summary)
    top = f"s{round(max(cfg.sparsities) * 100):d}"
    claims.append(Claim("nll", f"maiht_{top}", f"wanda_{top}", "<",
                        text=f"end to end: mAIHT's test NLL below Wanda's at {top[1:]}%"))  # fmt: skip
    claims.append(Claim("nll", f"maiht_{top}", f"sparsegpt_{top}", "<", gate=False,
                        text=f"end to end: mAIHT's test NLL below SparseGPT's at {top[1:]}% (small or mixed gap "
                             "expected at 135M)"))  # fmt: skip
    claims.append(Claim("nll", f"maiht_{top}", f"magnitude_{top}", "<", gate=False,
                        text=f"end to end: mAIHT below magnitude at {top[1:]}%"))  # fmt: skip
