"""Reproduction: ATP's per-block arithmetic progression vs uniform, OWL and reversed allocations on SmolLM2.

All systems prune fresh copies of the same model on the same calibration windows through the shared sequential
engine (`lmlab.core.pruning.prune_model`) and are scored on the same windows.

1. Data: calibration windows from the `corpus` train split; validation windows (beta selection) from the dev split;
   test windows (reported numbers) from the test split. The three splits come from disjoint CPython modules.
2. Wanda at mean sparsity S for every beta of the grid (beta = 0 is uniform): validation NLL picks beta*; at the
   headline S the test NLL of every beta is recorded too (the U-shaped curve). OWL (M = 5, lambda = 0.08; outlier
   ratios from one pass over the dense model, shared by all levels) and, at the headline S, the reversed progression
   (-beta*) at the same mean sparsity.
3. SparseGPT at uniform, OWL and beta* (Wanda's, unless `sparsegpt_search`), at the headline S (and at the `sweep`
   levels for the pruners in `sweep_pruners`). The same uniform / OWL / ATP comparison then runs at each `sweep` level.
4. Mechanism: the relative error of each block's output against the dense model's hidden state at that depth
   (calibration tokens), uniform vs ATP: the "reconstruction error explosion" with depth.
5. Zero-shot proxy: 4-way capital cloze ("The capital of X is" + 4 candidate capitals), ranked by log-likelihood.

Claim checks (computed, paired by test window): ATP(beta*) < uniform and ATP(beta*) <= OWL on test NLL for each base
pruner run. Speed: storage of the ATP model (bitmask) and the honest note that CSR does not beat dense here.
"""

from __future__ import annotations

import copy
import math
import random
import re
from typing import Any

import numpy as np

from lmlab.core.pruning import (
    calibration_windows,
    decoder_blocks,
    eval_windows,
    owl_from_ratios,
    owl_sparsities,
    prune_model,
    storage_report,
    token_stream,
    window_nll,
)
from lmlab.core.pruning.evaluate import record_perplexity
from lmlab.core.report.plotting import lines, title_for
from lmlab.methods.compression.atp.method import layer_sparsities, max_beta, search_beta, walk_grid
from lmlab.results import Claim

# systems of the sweep levels are named like "wanda_atp_s50"; the headline level's have no suffix
_LEVEL_SUFFIX = re.compile(r"_s(\d+)$")
# the cloze (5.6 s per model) runs on the allocations its claim compares, at the headline level; every 70% model
# scores near chance on it at this size, so SparseGPT and the reversed progression would add time, not signal
_CLOZE_SYSTEMS = ("wanda_uniform", "wanda_atp", "wanda_owl")


def _cloze_items(ctx: Any, n: int, seed: int) -> list[tuple[str, list[str], int]]:
    """(context, 4 candidate capitals, gold index): distractors are other test countries' capitals (seeded)."""
    examples = ctx.data("countries", None, split="test", task="capital", style="completion")
    rng = random.Random(seed)
    rng.shuffle(examples)
    examples = examples[: min(n, len(examples))]
    capitals = sorted({e.target for e in examples})
    if len(capitals) < 4:  # e.g. under --limit: too few countries for 3 distractors
        ctx.note(f"capital cloze skipped: {len(capitals)} distinct capitals, 4 needed for a 4-way choice")
        return []
    items = []
    for e in examples:
        others = [c for c in capitals if c not in e.meta.get("answers", [e.target])]
        choices = rng.sample(others, 3) + [e.target]
        rng.shuffle(choices)
        items.append((e.prompt, [" " + c for c in choices], choices.index(e.target)))
    return items


def run(cfg: Any, ctx: Any) -> Any:
    from lmlab.core.inference.scoring import choice_accuracy

    model, tok = ctx.load_model()

    def windows(split: str, n: int, random_windows: bool = False):
        stream = token_stream(tok, [e.prompt for e in ctx.data("corpus", None, split=split)])
        if random_windows:
            return calibration_windows(stream, n, cfg.seq_len, seed=cfg.seed)
        return eval_windows(stream, n, cfg.seq_len)

    calib = windows("train", cfg.n_calib, random_windows=True)
    val = windows("dev", cfg.n_val)
    test = windows("test", cfg.n_test)
    ctx.flag("data", {"calib": list(calib.shape), "val": list(val.shape), "test": list(test.shape),
                      "splits": "corpus train / dev / test (disjoint modules)"})  # fmt: skip
    cloze = _cloze_items(ctx, cfg.n_cloze, cfg.seed) if cfg.cloze else []
    sweep = _Sweep(cfg, ctx, model, tok, calib, val, test, cloze)
    sweep.test_nll["dense"] = window_nll(model, test, batch_size=cfg.batch_size)
    record_perplexity(ctx, "dense", sweep.test_nll["dense"])
    if cloze:
        ctx.record("dense", "cloze_acc", choice_accuracy(model, tok, cloze), note="4-way capital cloze, 1 = correct")

    # The headline level (cfg.sparsity: gated claims, reverse sanity check, cloze) first, then the sweep levels.
    levels = [cfg.sparsity] + [s for s in cfg.sweep if not math.isclose(s, cfg.sparsity)]
    for level in ctx.progress(levels, "sparsity levels"):
        sweep.run_level(level, headline=level == cfg.sparsity)
    ctx.table("by_sparsity", sorted(sweep.level_rows, key=lambda r: (r["pruner"], r["allocation"], r["sparsity"])))

    _tables_and_figures(cfg, ctx, sweep)
    return ctx.finish(claims=_claims(cfg, sweep.reports, bool(cloze)))


class _Sweep:
    """The systems of one run: each prunes a fresh copy of the model on the same calibration windows.

    Attributes:
        test_nll: per-window test NLL by system; reports, allocations: the engine's report and per-block sparsity by
            system; level_rows: one row per (sparsity, pruner, allocation); curve: the headline level's Wanda beta
            curve; storage: bitmask storage of the headline Wanda-ATP model.
    """

    def __init__(self, cfg: Any, ctx: Any, model: Any, tok: Any, calib: Any, val: Any, test: Any, cloze: list) -> None:
        self.cfg, self.ctx, self.model, self.tok = cfg, ctx, model, tok
        self.calib, self.val, self.test, self.cloze = calib, val, test, cloze
        self.n_blocks = len(decoder_blocks(model))
        self.test_nll: dict[str, list[float]] = {}
        self.reports: dict[str, Any] = {}
        self.allocations: dict[str, list[float]] = {}
        self.level_rows: list[dict[str, Any]] = []
        self.curve: list[dict[str, Any]] = []
        self.storage: dict[str, Any] = {}
        self.owl_ratios: list[float] | None = None  # the dense model's outlier ratios: the same at every level
        # every block's dense output on the calibration windows, computed once: each prune's dense_error reads it
        # instead of propagating the dense states again (one block forward less per block and prune)
        self.dense_outputs = prune_model(model, calib, method=None, sparsity=0.0, batch_size=cfg.batch_size,
                                         track_dense=False, keep_outputs=True).block_outputs  # fmt: skip

    def prune(self, pruner: str, rates: list[float]) -> tuple[Any, Any]:
        pm = copy.deepcopy(self.model)
        rep = prune_model(pm, self.calib, method=pruner, sparsity=rates, batch_size=self.cfg.batch_size,
                          track_dense=True, dense_outputs=self.dense_outputs)  # fmt: skip
        return pm, rep

    def nll(self, model: Any, windows: Any) -> list[float]:
        return window_nll(model, windows, batch_size=self.cfg.batch_size)

    def finish(self, system: str, level: float, headline: bool, pruned: tuple[Any, Any], rates: list[float],
               beta: float | None = None, test_nll: list[float] | None = None) -> None:  # fmt: skip
        """Score one pruned model on test (unless `test_nll` was already measured) and the cloze (`_CLOZE_SYSTEMS`)."""
        from lmlab.core.inference.scoring import choice_accuracy

        pm, rep = pruned
        name = system + _level_suffix(level, headline)
        ctx = self.ctx
        self.reports[name], self.allocations[name] = rep, rates
        ctx.record_value(name, "measured_sparsity", rep.sparsity, note=f"nominal mean {level:g}")
        ctx.record_value(name, "prune_time", rep.seconds, unit="s")
        ctx.record_value(name, "last_block_dense_error", rep.blocks[-1].dense_error,
                         note="||h_L - h'_L||^2 / ||h_L||^2 vs the dense model (calibration)")  # fmt: skip
        self.test_nll[name] = test_nll if test_nll is not None else self.nll(pm, self.test)
        record_perplexity(ctx, name, self.test_nll[name])
        if self.cloze and name in _CLOZE_SYSTEMS:
            ctx.record(name, "cloze_acc", choice_accuracy(pm, self.tok, self.cloze), note="4-way capital cloze")
        pruner, _, allocation = system.partition("_")
        self.level_rows.append({"sparsity": level, "pruner": pruner, "allocation": allocation,
                                "beta": None if beta is None else round(beta, 5),
                                "test_ppl": round(math.exp(float(np.mean(self.test_nll[name]))), 3),
                                "last_block_dense_error": round(rep.blocks[-1].dense_error, 5)})  # fmt: skip

    def run_level(self, level: float, headline: bool) -> None:
        """Wanda beta search on validation, then uniform / ATP / OWL (/ reverse), Wanda and SparseGPT, at `level`."""
        cfg, ctx, n_blocks = self.cfg, self.ctx, self.n_blocks
        suffix = _level_suffix(level, headline)
        bound = max_beta(n_blocks, level)
        betas = [b for b in cfg.betas if b <= bound + 1e-12]
        dropped = [b for b in cfg.betas if b > bound + 1e-12]
        if dropped:
            ctx.note(f"betas {dropped} are illegal for L={n_blocks} at S={level:g} (beta_max={bound:.4f}): skipped.")

        # 1. Wanda beta search on the validation split; at the headline level every beta is also scored on test for
        # the U-shaped curve (at the sweep levels only the kept betas are, to fit the default budget)
        curve: list[dict[str, Any]] = []
        kept: dict[float, tuple[Any, Any]] = {}
        kept_test: dict[float, list[float]] = {}

        def evaluate_wanda(rates: list[float]) -> float:
            beta = round(rates[1] - rates[0], 10) if n_blocks > 1 else 0.0
            pm, rep = self.prune("wanda", rates)
            val_nll = float(np.mean(self.nll(pm, self.val)))
            if headline:
                kept_test[beta] = self.nll(pm, self.test)
            curve.append({"beta": beta, "val_ppl": math.exp(val_nll),
                          "test_ppl": math.exp(float(np.mean(kept_test[beta]))) if headline else None,
                          "last_block_error": rep.blocks[-1].dense_error,
                          "top_block_sparsity": rates[-1]})  # fmt: skip
            kept[beta] = (pm, rep)
            # keep only uniform and the best so far in memory
            best = min(curve, key=lambda r: (r["val_ppl"], r["beta"]))["beta"]
            for b in list(kept):
                if b not in (0.0, best, beta):
                    del kept[b]
            return math.exp(val_nll)

        search = search_beta(evaluate_wanda, n_blocks, level, betas, patience=cfg.search_patience)
        beta_star = search.best_beta
        ctx.flag(f"beta_star_wanda{suffix}", beta_star)
        ctx.table(f"beta_search_wanda{suffix}", [{k: (round(v, 5) if isinstance(v, float) else v)
                                                  for k, v in r.items()} for r in curve])  # fmt: skip
        if headline:
            self.curve = curve
        uniform = layer_sparsities(n_blocks, level, 0.0)
        self.finish("wanda_uniform", level, headline, kept.get(0.0) or self.prune("wanda", uniform), uniform, 0.0,
                    test_nll=kept_test.get(0.0))  # fmt: skip
        atp = search.sparsities
        pruned_atp = kept.get(beta_star) or self.prune("wanda", atp)
        self.finish("wanda_atp", level, headline, pruned_atp, atp, beta_star, test_nll=kept_test.get(beta_star))
        if headline:
            self.storage = storage_report(pruned_atp[0])
        kept.clear()
        del pruned_atp

        owl = None
        if cfg.owl:
            if self.owl_ratios is None:  # one pass over the dense model; the ratios do not depend on the level
                self.owl_ratios = owl_sparsities(self.model, self.calib, level, m=cfg.owl_m, lmbda=cfg.owl_lambda,
                                                 batch_size=cfg.batch_size).outlier_ratios  # fmt: skip
            lam_star, owl_pruned = cfg.owl_lambda, None
            lams = [lam for lam in cfg.owl_lambdas if level + lam < 1.0 and level - lam >= 0.0]
            if lams:  # the same tuning budget as beta: validation windows, grid walk, patience
                best_owl: list[Any] = []  # [val_ppl, lambda, (model, report)] of the best lambda so far

                def evaluate_owl(lam: float) -> float:
                    pm, rep = self.prune("wanda", owl_from_ratios(self.owl_ratios, level, lam))
                    v = math.exp(float(np.mean(self.nll(pm, self.val))))
                    if not best_owl or v < best_owl[0]:  # strict: a tie keeps the smaller lambda, walked first
                        best_owl[:] = [v, lam, (pm, rep)]
                    return v

                owl_curve = walk_grid(evaluate_owl, lams, cfg.search_patience, key="lambda")
                lam_star, owl_pruned = best_owl[1], best_owl[2]
                best_owl.clear()
                ctx.table(f"owl_lambda_search{suffix}", [{k: round(v, 5) for k, v in r.items()} for r in owl_curve])
            ctx.flag(f"owl_lambda_star{suffix}", lam_star)
            owl = owl_from_ratios(self.owl_ratios, level, lam_star)
            ctx.table(f"owl_outlier_ratio{suffix}", [
                {"block": i, "outlier_ratio_pct": round(r, 4), "owl_sparsity": round(s, 4)}
                for i, (r, s) in enumerate(zip(self.owl_ratios, owl))
            ])  # fmt: skip
            self.finish("wanda_owl", level, headline, owl_pruned or self.prune("wanda", owl), owl)
            del owl_pruned
        if headline and cfg.reverse and beta_star > 0:
            rev = layer_sparsities(n_blocks, level, -beta_star)
            self.finish("wanda_reverse", level, headline, self.prune("wanda", rev), rev, -beta_star)

        # 2. SparseGPT at uniform, OWL and beta*
        if "sparsegpt" not in (cfg.pruners if headline else cfg.sweep_pruners):
            return
        beta_sg = beta_star
        if cfg.sparsegpt_search:
            sg_curve = []

            def evaluate_sg(rates: list[float]) -> float:
                pm, _ = self.prune("sparsegpt", rates)
                v = math.exp(float(np.mean(self.nll(pm, self.val))))
                sg_curve.append({"beta": round(rates[1] - rates[0], 10), "val_ppl": round(v, 4)})
                return v

            beta_sg = search_beta(evaluate_sg, n_blocks, level, betas, patience=cfg.search_patience).best_beta
            ctx.table(f"beta_search_sparsegpt{suffix}", sg_curve)
        ctx.flag(f"beta_star_sparsegpt{suffix}", beta_sg)
        self.finish("sparsegpt_uniform", level, headline, self.prune("sparsegpt", uniform), uniform, 0.0)
        sg_rates = layer_sparsities(n_blocks, level, beta_sg)
        self.finish("sparsegpt_atp", level, headline, self.prune("sparsegpt", sg_rates), sg_rates, beta_sg)
        if owl is not None:
            self.finish("sparsegpt_owl", level, headline, self.prune("sparsegpt", owl), owl)


def _level_suffix(level: float, headline: bool) -> str:
    """'' at the headline level, '_s50' at a sweep level of 0.5 (what `_LEVEL_SUFFIX` matches)."""
    return "" if headline else f"_s{round(level * 100):d}"


def _is_headline(system: str) -> bool:
    return _LEVEL_SUFFIX.search(system) is None


def _tables_and_figures(cfg: Any, ctx: Any, sweep: _Sweep) -> None:
    reports, allocations, curve, test_nll = sweep.reports, sweep.allocations, sweep.curve, sweep.test_nll
    storage, level_rows = sweep.storage, sweep.level_rows
    ctx.table("summary", [
        {"system": s, "test_ppl": round(math.exp(float(np.mean(v))), 3),
         "measured_sparsity": round(reports[s].sparsity, 4) if s in reports else 0.0,
         "first_block_s": round(allocations[s][0], 4) if s in allocations else 0.0,
         "last_block_s": round(allocations[s][-1], 4) if s in allocations else 0.0,
         "last_block_dense_error": round(reports[s].blocks[-1].dense_error, 5) if s in reports else 0.0,
         "prune_s": round(reports[s].seconds, 1) if s in reports else 0.0}
        for s, v in test_nll.items()
    ])  # fmt: skip
    ctx.table("per_block", [
        {"system": s, "block": b.block, "sparsity_target": round(allocations[s][b.block], 4),
         "measured_sparsity": round(b.sparsity, 4), "out_error": round(b.out_error, 6),
         "dense_error": round(b.dense_error, 6)}
        for s, r in reports.items() for b in r.blocks
    ])  # fmt: skip
    ctx.table("storage_atp_wanda", [{k: (round(v / 1e6, 2) if k.endswith("_bytes") else v)
                                     for k, v in storage.items()}])  # fmt: skip
    model = str(cfg.model)
    depth = list(range(len(next(iter(allocations.values())))))
    err = {
        s: [b.dense_error for b in r.blocks] for s, r in reports.items() if s.startswith("wanda_") and _is_headline(s)
    }
    ctx.add_figure("error_vs_depth", lines(depth, err, title=title_for("atp", model, cfg.seed, None,
                   "block output error vs dense, by depth"), xlabel="block", ylabel="||h - h'||^2 / ||h||^2",
                   logy=True))  # fmt: skip
    ctx.add_figure("allocation", lines(depth, {s: a for s, a in allocations.items()
                                               if s.startswith("wanda_") and _is_headline(s)},
                   title=title_for("atp", model, cfg.seed, None, "per-block sparsity"), xlabel="block",
                   ylabel="sparsity"))  # fmt: skip
    levels = sorted({r["sparsity"] for r in level_rows})
    if len(levels) > 1:
        by_system: dict[str, list[float]] = {}
        for r in sorted(level_rows, key=lambda r: r["sparsity"]):
            by_system.setdefault(f"{r['pruner']}_{r['allocation']}", []).append(r["test_ppl"])
        ctx.add_figure("ppl_vs_sparsity", lines(levels, {k: v for k, v in by_system.items() if len(v) == len(levels)},
                       title=title_for("atp", model, cfg.seed, None, "test perplexity vs mean sparsity"),
                       xlabel="mean sparsity", ylabel="perplexity", logy=True))  # fmt: skip
    if len(curve) > 1:
        betas = [r["beta"] for r in curve]
        ctx.add_figure("beta_curve", lines(betas, {"validation": [r["val_ppl"] for r in curve],
                       "test": [r["test_ppl"] for r in curve]}, title=title_for("atp", model, cfg.seed, None,
                       f"Wanda at S={cfg.sparsity:g}: perplexity vs beta"), xlabel="beta", ylabel="perplexity",
                       logy=True))  # fmt: skip
    ctx.note(
        "Speed: ATP changes where the zeros are, not how many; the paper's 2.63x CPU speedup came from the DeepSparse "
        "engine (deprecated) at 70% sparsity, not from ATP. Here torch CSR is slower than dense below ~85-90% "
        "per-layer sparsity (see `lmlab run wanda` for the measured latency table), so no speedup is claimed; the "
        f"bitmask storage of the ATP model's pruned linears is {storage['bitmask_bytes'] / 1e6:.1f} MB vs "
        f"{storage['dense_bytes'] / 1e6:.1f} MB dense fp32."
    )


def _claims(cfg: Any, reports: dict[str, Any], cloze: bool) -> list[Claim]:
    claims = []
    for pruner in cfg.pruners:
        if f"{pruner}_atp" not in reports:
            continue
        text = f"ATP beats uniform sparsity with {pruner} at S={cfg.sparsity:g} (test NLL)"
        claims.append(Claim("nll", f"{pruner}_atp", f"{pruner}_uniform", "<", text=text))
        if f"{pruner}_owl" in reports:
            claims.append(Claim("nll", f"{pruner}_atp", f"{pruner}_owl", "<", min_effect=0.0, gate=pruner == "wanda",
                                text=f"ATP is at least as good as OWL with {pruner} (test NLL)"))  # fmt: skip
    for system in reports:  # the sweep levels: reported, not gated (the paper's headline is S = 0.7)
        match = _LEVEL_SUFFIX.search(system)
        if match is None or not system[: match.start()].endswith("_atp"):
            continue
        pruner, level, suffix = system.split("_", 1)[0], int(match.group(1)) / 100, match.group(0)
        for baseline in ("uniform", "owl"):
            if f"{pruner}_{baseline}{suffix}" in reports:
                text = f"sweep: ATP beats {baseline} with {pruner} at S={level:g} (test NLL)"
                claims.append(Claim("nll", system, f"{pruner}_{baseline}{suffix}", "<", gate=False, text=text))
    if "wanda_reverse" in reports:
        claims.append(Claim("nll", "wanda_atp", "wanda_reverse", "<", gate=False,
                            text="sanity: the increasing progression beats the reversed one"))  # fmt: skip
    if cloze:
        claims.append(Claim("cloze_acc", "wanda_atp", "wanda_uniform", ">", gate=False,
                            text="zero-shot proxy: ATP's capital-cloze accuracy above uniform's"))  # fmt: skip
    return claims
