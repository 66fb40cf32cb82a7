"""Reproduction: NZ-LoRA (Init[AB]) vs peft's zero init (Init[A]) over a learning-rate sweep.

Paper claim (Li et al., ICML 2025, abstract): initialising both LoRA factors non-zero makes fine-tuning more robust
to sub-optimal, especially *smaller*, learning rates; the noise B0A0 adds to W0 generally does not hurt.

Design. Task: the task bank's ``geography/<task>`` (default ISO-3 codes: "Q: What is the ISO 3166-1 alpha-3 code of
Togo?\\nA: TGO"), train split for training, test split for scoring, dev split to pick each init's best lr (the
same grid and the same search for every init: equal tuning budget). A LoRA (r, α, `target_modules`) on the top
`train_layers` blocks of `model`; the trunk below is frozen and cached once (`lmlab.core.training.partial`), so a run
costs k blocks, not 30. Each run: a fresh LoRA, `init` applied by `method.init_lora`, `steps` AdamW steps at a
constant lr on the seed's batches (identical for every init and lr of that seed), then the held-out answer NLL
(teacher forcing, summed over the answer's tokens) and greedy exact match (argmax at every answer token) of every
test item.

Learning rates (`search_inits`): the grid `lrs` runs for every init and seed; each init's best lr is then chosen by
the shared dev search (`lmlab.core.training.lr_search.search_lr`, the same rule for every init): the first seed's
mean dev NLL at each grid lr, and a choice on an edge of the grid extends it one step past that edge at the grid's
own ratio there, up to `lr_max_extensions` first-seed runs per init; the other seeds then run at each chosen lr
outside the grid. A choice still on an edge after the cap is flagged (``lr_still_on_edge``) and the claims at a
chosen lr are marked fragile; the table ``lr_search`` holds every (init, lr, dev NLL, extension).

Claims (computed from this run). Gated, for each of the `claim_lrs` smallest lrs and for both ``nz`` and
``nz_reset``: the held-out NLL below ``zero`` (paired by item, every seed's value clustered by its item: the bootstrap
resamples items with the seeds nested), and, with >= 2 seeds, the same sign in every seed (the least favourable
seed's own item-level comparison must hold, so one seed whose mean goes the other way fails it; per-seed rows
``<init>@<lr>/seed<k>`` and the seed-level summary ``seed_effect_nll`` are recorded); fixed grid lrs, no search
enters them. Reported: each init at its own dev-chosen lr (expected a near tie; "FRAGILE" when a choice is still on
an edge of its search); the area under the NLL-vs-log-lr curve over the grid; ``nz`` vs ``nz_reset`` at the
best lr (expected about equal for β <= 1); with `beta_sweep`, ``nz`` vs ``nz_reset`` at the largest β (the noise
should hurt without the reset). Mechanism check: at step 0 ``nz_reset`` is the pretrained model (|ΔNLL| ~ 0) while
``nz`` is not.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from lmlab.core.stats.seeding import derive_seed, least_favourable_seed
from lmlab.core.training.lora import PaddedCache, answer_scores, index_batches  # noqa: F401 (moved; re-exported)
from lmlab.core.training.lr_search import LrSearch, search_lr
from lmlab.results import Claim

NLL, EM = "eval_nll", "eval_em"


def system(mode: str, lr: float | str, beta: float | None = None) -> str:
    """System names: ``"nz@1e-05"``, ``"zero@best"``, ``"nz@beta=4"``."""
    if beta is not None:
        return f"{mode}@beta={beta:g}"
    return f"{mode}@{lr:g}" if isinstance(lr, float | int) else f"{mode}@{lr}"


def load_items(ctx: Any, cfg: Any) -> tuple[list[Any], list[Any], list[Any]]:
    """(train, dev, test) examples of the task bank's geography `task` (cfg.limit caps each split)."""
    kw = {"domain": "geography", "task": cfg.task, "n_choices": 0}
    train = ctx.data("taskbank", None, split="train", **kw)
    dev = ctx.data("taskbank", cfg.dev_items, split="dev", **kw)
    test = ctx.data("taskbank", cfg.eval_items, split="test", **kw)
    if not train or not dev or not test:
        raise ValueError(f"the task bank gave {len(train)} train, {len(dev)} dev, {len(test)} test items of "
                         f"geography/{cfg.task}; expected at least one of each (check --limit)")  # fmt: skip
    return train, dev, test


# moved to lmlab.core.training.lora (shared with model_swarms); the names stay importable from here
_batches = index_batches


def lr_grid(cfg: Any) -> list[float]:
    """`cfg.lrs` sorted, each rounded to 12 significant digits as `search_lr` rounds what it tries (so a grid lr and
    the search's value of it are the same dict key)."""
    return sorted(float(f"{lr:.12g}") for lr in cfg.lrs)


def search_inits(runs: list[Any], cfg: Any, seeds: list[int],
                 train: Callable[[str, float, list[int]], list[Any]]) -> dict[str, LrSearch]:  # fmt: skip
    """Each init's lr, chosen on dev by the shared search (`lmlab.core.training.lr_search.search_lr`).

    The same rule for every init: the dev score of an lr is the mean dev-item answer NLL of the first training
    seed's run at it (test items never choose); the grid is `lr_grid(cfg)`, and a choice on an edge of it extends
    the search one step past that edge at the grid's own ratio there, up to `cfg.lr_max_extensions` runs per init; a
    choice still on an edge after them is `LrSearch.edge` (the claims that use it are marked fragile).

    `runs`: the grid's `SweepRun`s (every seed); the runs this trains are appended to it: first-seed runs at the
    extension lrs, then every other seed at each chosen lr that is not in the grid, for the init that chose it and
    for ``nz_reset`` at ``nz``'s choice (the "without vs with the reset at nz's best lr" comparison), so every chosen
    (init, lr) has all seeds. `train(mode, lr, seeds) -> list[SweepRun]` trains one init at one lr for those seeds.
    """
    have = {(r.mode, r.lr, r.seed): r for r in runs}

    def ensure(mode: str, lr: float, need: list[int]) -> None:
        missing = [s for s in need if (mode, lr, s) not in have]
        if missing:
            for r in train(mode, lr, missing):
                have[(r.mode, r.lr, r.seed)] = r
                runs.append(r)

    searches = {}
    for mode in cfg.inits:

        def dev_score(lr: float, mode: str = mode) -> float:
            ensure(mode, lr, seeds[:1])
            return float(np.mean(have[(mode, lr, seeds[0])].eval["dev_nll"]))

        searches[mode] = search_lr(dev_score, lr_grid(cfg), max_extensions=cfg.lr_max_extensions)
    cells = [(m, searches[m].chosen) for m in cfg.inits]
    if "nz_reset" in cfg.inits:
        cells.append(("nz_reset", searches["nz"].chosen))
    for mode, lr in cells:
        ensure(mode, lr, seeds)
    return searches


def run(cfg: Any, ctx: Any) -> Any:
    from peft import LoraConfig

    from lmlab.core.inference.scoring import _pad_id
    from lmlab.core.training.partial import FrozenTrunk, response_token_logps
    from lmlab.core.training.preference import weighted_sft_loss
    from lmlab.core.training.sft import encode_sequences
    from lmlab.data.taskbank import answer_request
    from lmlab.methods.adaptation.nonzero_lora.method import lora_layers, lr_sweep

    train, dev, test = load_items(ctx, cfg)
    model, tok = ctx.load_model()
    n_layers = len(model.model.layers)
    if cfg.train_layers > n_layers:
        raise ValueError(f"train_layers must be <= {n_layers} (the blocks of {cfg.model}), got {cfg.train_layers}")
    trunk = FrozenTrunk(model, cfg.train_layers)

    def cache_of(items: list[Any]) -> Any:
        pairs = [answer_request(e) for e in items]
        return PaddedCache(trunk, encode_sequences(tok, [p for p, _ in pairs], [a for _, a in pairs]), _pad_id(tok))

    c_train, c_dev, c_test = cache_of(train), cache_of(dev), cache_of(test)
    lora_cfg = LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, target_modules=list(cfg.target_modules),
                          lora_dropout=0.0, bias="none")  # fmt: skip
    try:
        next(iter(lora_layers(trunk.top_k(train_norm=False, lora=lora_cfg))))
    except ValueError:
        raise ValueError(f"target_modules {cfg.target_modules} match no linear layer of {cfg.model}'s blocks; "
                         "expected llama-style names (q_proj, v_proj, up_proj, down_proj, ...)") from None  # fmt: skip

    def build() -> Any:
        return trunk.top_k(train_norm=False, lora=lora_cfg)  # a fresh copy of the top blocks with peft's Init[A]

    def loss_fn(policy: Any, batch: list[int]) -> torch.Tensor:
        sub, tm = c_train.batch(batch)
        lp = response_token_logps(policy, sub, tm)  # (b, T-1), 0 off the answer
        return weighted_sft_loss(lp, tm, reduction="mean")  # mean over items of the per-token answer NLL

    def eval_fn(policy: Any) -> dict[str, list[float]]:
        nll, em = answer_scores(policy, c_test)
        dev_nll, _ = answer_scores(policy, c_dev)
        return {"nll": nll, "em": em, "dev_nll": dev_nll}

    seeds = [derive_seed(cfg.seed, "nonzero_lora-train", s) for s in range(cfg.n_seeds)]
    batch_of = {s: _batches(len(train), cfg.steps, cfg.train_batch, derive_seed(s, "order")) for s in seeds}
    grid = lr_grid(cfg)
    # the grid for every seed, then at most lr_max_extensions first-seed runs per init past an edge and the other
    # seeds at an extension some init chose (itself, and nz_reset at nz's choice): an upper bound for the bar
    n_extra = (len(cfg.inits) * cfg.lr_max_extensions + (len(cfg.inits) + 1) * (cfg.n_seeds - 1)
               if len(grid) > 1 else 0)  # fmt: skip
    jobs = cfg.n_seeds * (len(cfg.inits) * len(grid) + 2 * len(cfg.beta_sweep)) + n_extra
    bar = iter(ctx.progress(range(jobs), "runs (seed x init x lr, lr search, beta sweep)", total=jobs))

    def tick(_: Any) -> None:
        next(bar, None)

    def sweep(lrs: list[float], modes: list[str], run_seeds: list[int]) -> list[Any]:
        return lr_sweep(build, loss_fn, eval_fn, lambda s: batch_of[s], lrs=lrs, modes=modes, seeds=run_seeds,
                        beta=cfg.beta, b_fan=cfg.b_fan, max_grad_norm=cfg.max_grad_norm, eval_step0=False,
                        on_run=tick)  # fmt: skip

    runs = sweep(grid, list(cfg.inits), seeds)
    searches = search_inits(runs, cfg, seeds, lambda mode, lr, run_seeds: sweep([lr], [mode], run_seeds))
    beta_runs = []
    for b in cfg.beta_sweep:
        beta_runs += lr_sweep(build, loss_fn, eval_fn, lambda s: batch_of[s], lrs=[cfg.beta_sweep_lr],
                              modes=["nz", "nz_reset"], seeds=seeds, beta=b, b_fan=cfg.b_fan,
                              max_grad_norm=cfg.max_grad_norm, on_run=tick)  # fmt: skip

    step0 = _step0(build, eval_fn, cfg, seeds[0])  # step 0 (first seed): Init[AB] with and without the reset
    base, _ = answer_scores(trunk.reference, c_test)
    checks = _record(ctx, cfg, runs, beta_runs, seeds, [e.id for e in test], base, step0, searches)
    chosen = ", ".join(f"{m} {f.chosen:g}" for m, f in searches.items())
    ctx.note(
        f"LoRA r={cfg.rank}, alpha={cfg.alpha:g} on {', '.join(cfg.target_modules)} of the top {cfg.train_layers} of "
        f"{n_layers} blocks; {len(train)} train / {len(dev)} dev / {len(test)} test items of geography/{cfg.task}; "
        f"{cfg.steps} AdamW steps x {cfg.train_batch} at constant lr, {cfg.n_seeds} seed(s); beta={cfg.beta:g}, "
        f"B bound from n_{cfg.b_fan}; lr grid {', '.join(f'{lr:g}' for lr in grid)}, each init's lr chosen on the "
        f"first seed's dev NLL with up to {cfg.lr_max_extensions} extension(s) past an edge: {chosen}."
    )
    return ctx.finish(checks)


def _record(ctx: Any, cfg: Any, runs: list[Any], beta_runs: list[Any], seeds: list[int], ids: list[Any],
            base: list[float], step0: dict[str, dict[str, list[float]]],
            searches: Mapping[str, LrSearch]) -> list[Claim]:  # fmt: skip
    """Record every run's metrics, the per-seed rows and tables; return the claims.

    `runs` / `beta_runs`: `SweepRun`s of the lr grid and the lr search (`search_inits`) and of the β sweep; `seeds`:
    the training seeds in run order (seed k = the k-th); `ids`: the held-out item ids, the order of every run's
    ``eval`` lists; `base`: the base model's NLL per item; `step0`: `_step0`'s metrics; `searches`: each init's dev
    lr search. An (init, lr) is recorded once it has every seed (the grid, and each chosen lr); the search's
    first-seed-only runs appear in the ``lr_search`` table alone.
    """
    clusters = [i for _ in seeds for i in ids]  # values of every seed, clustered by held-out item
    by: dict[tuple[str, float], list[Any]] = defaultdict(list)
    for r in runs:
        by[(r.mode, r.lr)].append(r)
    by = defaultdict(list, {cell: rs for cell, rs in by.items() if len(rs) == len(seeds)})
    for (mode, lr), rs in by.items():
        rs.sort(key=lambda r: seeds.index(r.seed))
        note = f"{cfg.steps} steps, constant lr, {len(rs)} seeds x {len(ids)} items"
        ctx.record(system(mode, lr), NLL, [v for r in rs for v in r.eval["nll"]], clusters=clusters, unit="nats",
                   note=note)  # fmt: skip
        ctx.record(system(mode, lr), EM, [v for r in rs for v in r.eval["em"]], clusters=clusters, note=note)
    ctx.record("base", NLL, base, clusters=ids, unit="nats", note="the model before any LoRA")

    lrs = lr_grid(cfg)
    best = {mode: searches[mode].chosen for mode in cfg.inits}
    edges = {mode: searches[mode].edge for mode in cfg.inits if searches[mode].edge is not None}
    for mode in cfg.inits:
        found = searches[mode]
        where = f"{found.extensions} search run(s) past the grid" + (f"; still its {found.edge}" if found.edge else "")
        ctx.record(system(mode, "best"), NLL, ctx.values(system(mode, best[mode]), NLL), clusters=clusters,
                   unit="nats", note=f"best lr on dev (first seed): {best[mode]:g} ({where})")  # fmt: skip
        if len(lrs) > 1:
            ctx.record(mode, "nll_auc", _auc(by, mode, lrs, seeds), clusters=clusters, unit="nats",
                       note="trapezoid area under NLL vs log10(lr) over the grid, / the log10 range")  # fmt: skip
    ctx.flag("best_lr", {m: best[m] for m in cfg.inits})
    ctx.flag("lr_chosen_on_dev", {m: {"lr": f.chosen, "runs": len(f.tried), "extensions": f.extensions,
                                      "edge": f.edge} for m, f in searches.items()})  # fmt: skip
    ctx.flag("lr_still_on_edge", edges)
    for mode, edge in edges.items():
        ctx.note(f"{mode}: the dev choice (lr {best[mode]:g}) is still the {edge} of its search after "
                 f"{searches[mode].extensions} extension(s) (lr_max_extensions={cfg.lr_max_extensions}); the claims "
                 "that use it are marked fragile.")  # fmt: skip
    ctx.table("lr_search", [{"init": mode, "lr": lr, "dev_nll_seed0": v, "extension": ext,
                             "chosen": lr == searches[mode].chosen, "edge": searches[mode].edge}
                            for mode in cfg.inits for lr, v, ext in searches[mode].tried])  # fmt: skip

    per_seed = _record_seeds(ctx, cfg, by, seeds, lrs[: cfg.claim_lrs])

    for b in cfg.beta_sweep:
        for mode in ("nz", "nz_reset"):
            rs = [r for r in beta_runs if r.mode == mode and r.beta == float(b)]
            rs.sort(key=lambda r: seeds.index(r.seed))
            ctx.record(system(mode, cfg.beta_sweep_lr, b), NLL, [v for r in rs for v in r.eval["nll"]],
                       clusters=clusters, unit="nats", note=f"lr {cfg.beta_sweep_lr:g}")  # fmt: skip

    for mode, ev in step0.items():
        ctx.record(f"{mode}@step0", "step0_abs_dnll", [abs(a - b0) for a, b0 in zip(ev["nll"], base)], clusters=ids,
                   unit="nats", note="|NLL at step 0 - base NLL| per item, first seed")  # fmt: skip
    if "nz_reset" in step0:
        ctx.flag("step0_max_abs_dnll_nz_reset", max(abs(a - b0) for a, b0 in zip(step0["nz_reset"]["nll"], base)))

    table = []
    for mode in cfg.inits:
        for lr in lrs:
            rs = by[(mode, lr)]
            table.append({"init": mode, "lr": lr, "eval_nll": float(np.mean([v for r in rs for v in r.eval["nll"]])),
                          "eval_em": float(np.mean([v for r in rs for v in r.eval["em"]])),
                          "dev_nll": float(np.mean([v for r in rs for v in r.eval["dev_nll"]])),
                          "final_train_loss": float(np.mean([r.losses[-1] for r in rs])),
                          "per_seed_eval_nll": [float(np.mean(r.eval["nll"])) for r in rs]})  # fmt: skip
    ctx.table("nll_vs_lr", table)
    ctx.add_samples({"seed": r.seed, "init": r.mode, "lr": r.lr, "beta": r.beta, "losses": r.losses,
                     "mean_eval_nll": float(np.mean(r.eval["nll"]))} for r in runs + beta_runs)  # fmt: skip
    _figure(ctx, cfg, table, lrs)
    out = claims(cfg, lrs, best, per_seed, edges)
    ctx.flag("fragile_claims", [c.text for c in out if c.text.startswith("FRAGILE")])
    return out


def seed_system(mode: str, lr: float, k: int) -> str:
    """The system of one training seed's run: ``"nz@1e-05/seed2"`` (seed k = the k-th training seed)."""
    return f"{system(mode, lr)}/seed{k}"


def _record_seeds(ctx: Any, cfg: Any, by: dict[tuple[str, float], list[Any]], seeds: list[int],
                  claim_lrs: list[float]) -> dict[tuple[str, float], list[float]]:  # fmt: skip
    """The seed-level rows at the gated lrs; returns the per-seed mean effect ``mean_i NLL(mode) - mean_i NLL(zero)``
    of every gated (mode, lr), seed k at index k.

    Rows: each seed's per-item NLL of every init (``<init>@<lr>/seed<k>``, one value per held-out item: what the
    every-seed claims compare), and the per-seed effects against zero init (``<init>-zero@<lr>``,
    ``seed_effect_nll``: k values, their mean and a bootstrap CI over the seeds, the seed-level summary next to the
    item-level CI of the pooled claim; with 3 seeds that CI is about the range of the seed means).
    """
    effects: dict[tuple[str, float], list[float]] = {}
    rows = []
    for lr in claim_lrs:
        for mode in cfg.inits:
            for k, r in enumerate(by[(mode, lr)]):  # sorted by seed
                ctx.record(seed_system(mode, lr, k), NLL, r.eval["nll"], unit="nats",
                           note=f"training seed {k} only, {len(r.eval['nll'])} items")  # fmt: skip
        zero_means = [float(np.mean(r.eval["nll"])) for r in by[("zero", lr)]]
        for mode in [m for m in cfg.inits if m != "zero"]:
            means = [float(np.mean(r.eval["nll"])) for r in by[(mode, lr)]]
            eff = [m - z for m, z in zip(means, zero_means)]  # (seeds,)
            effects[(mode, lr)] = eff
            ctx.record(f"{mode}-zero@{lr:g}", "seed_effect_nll", eff, unit="nats",
                       note=f"mean NLL({mode}) - mean NLL(zero), one value per seed; CI over seeds")  # fmt: skip
            rows += [{"init": mode, "lr": lr, "seed": k, "seed_value": seeds[k], "eval_nll": m, "zero_eval_nll": z,
                      "effect_vs_zero": e} for k, (m, z, e) in enumerate(zip(means, zero_means, eff))]  # fmt: skip
    ctx.table("per_seed_effects", rows)
    ctx.flag("seeds_below_zero_init", {f"{m}@{lr:g}": f"{sum(e < 0 for e in eff)} of {len(eff)}"
                                       for (m, lr), eff in effects.items()})  # fmt: skip
    return effects


def _step0(build: Any, eval_fn: Any, cfg: Any, seed: int) -> dict[str, dict[str, list[float]]]:
    """Held-out metrics right after each non-zero init (no training), first seed."""
    from lmlab.methods.adaptation.nonzero_lora.method import init_lora

    out = {}
    for mode in [m for m in cfg.inits if m != "zero"]:
        torch.manual_seed(seed)
        policy = build()
        init_lora(policy, mode, beta=cfg.beta, b_fan=cfg.b_fan, generator=torch.Generator().manual_seed(seed))
        policy.eval()
        out[mode] = eval_fn(policy)
    return out


def _auc(by: dict[tuple[str, float], list[Any]], mode: str, lrs: list[float], seeds: list[int]) -> list[float]:
    """Per (seed, item): trapezoid area under NLL vs log10(lr), divided by the log10 range (a mean NLL)."""
    x = np.log10(np.asarray(lrs, dtype=float))
    out = []
    for s in seeds:
        curves = np.array([next(r for r in by[(mode, lr)] if r.seed == s).eval["nll"] for lr in lrs])  # (lrs, items)
        area = ((curves[1:] + curves[:-1]) / 2 * np.diff(x)[:, None]).sum(0) / (x[-1] - x[0])
        out += area.tolist()
    return out


def claims(cfg: Any, lrs: list[float], best: Mapping[str, float], per_seed: Mapping[tuple[str, float], list[float]],
           edges: Mapping[str, str]) -> list[Claim]:  # fmt: skip
    """The run's checks. `lrs`: the grid; `best`: each init's dev-chosen lr; `per_seed`: the per-seed mean effects
    against zero init of `_record_seeds`; `edges`: the inits whose dev choice is still on an edge of its search
    (`LrSearch.edge`).

    Gated at each of the `claim_lrs` smallest lrs of the grid (fixed lrs: no search enters them), for ``nz`` and
    ``nz_reset``: (1) NLL below zero init, paired by item with every seed's value clustered by its item (item-level
    CI, seeds nested); (2) with >= 2 seeds, the same sign in every seed: the least favourable seed w = argmax_k (mean
    NLL(mode) - mean NLL(zero)) of seed k must itself show mode below zero init, with a CI over its items. (2)
    holding implies all k seed means have the sign (k of k); a single seed whose mean effect is >= 0 makes it fail
    (not "supported"). The reported checks at a dev-chosen lr start with "FRAGILE" when an init they use is still on
    an edge of its search: a wider search could move that lr, and the comparison with it.
    """

    def tag(modes: tuple[str, ...], text: str) -> str:
        on_edge = [f"{m}'s lr is still the {edges[m]} of its dev search" for m in modes if m in edges]
        if not on_edge:
            return text
        return f"FRAGILE ({'; '.join(on_edge)} after {cfg.lr_max_extensions} extensions): {text}"

    out = []
    for lr in lrs[: cfg.claim_lrs]:
        for mode in [m for m in ("nz", "nz_reset") if m in cfg.inits]:
            eff = per_seed[(mode, lr)]
            seeds_txt = ", ".join(f"{e:+.3f}" for e in eff)
            if mode == "nz":
                text = (f"held-out answer NLL at the small lr {lr:g}: non-zero init (Init[AB]) below zero init "
                        f"(Init[A]) (per-seed effects {seeds_txt})")  # fmt: skip
            else:
                # gated too: with the reset both inits start from the same function, so a gain here is faster
                # learning, not the random step-0 offset plain Init[AB] adds to the pretrained model
                text = (f"held-out NLL at lr {lr:g}: Init[AB] with the base-weight reset (same start as zero init) "
                        f"below zero init (per-seed effects {seeds_txt})")  # fmt: skip
            out.append(Claim(NLL, system(mode, lr), system("zero", lr), "<", text=text))
            if len(eff) >= 2:
                w = least_favourable_seed(eff, "<")
                n_sign = sum(e < 0 for e in eff)
                out.append(Claim(NLL, seed_system(mode, lr, w), seed_system("zero", lr, w), "<",
                                 text=f"same sign in every seed at lr {lr:g} ({n_sign} of {len(eff)} seed means "
                                      f"below zero init): {mode} below zero init in the least favourable seed, "
                                      f"seed {w} ({eff[w]:+.3f}), CI over its items"))  # fmt: skip
    out.append(Claim(NLL, system("nz", "best"), system("zero", "best"), "<", gate=False,
                     text=tag(("nz", "zero"), f"held-out NLL, each init at its dev-selected best lr (nz "
                              f"{best['nz']:g}, zero {best['zero']:g}): non-zero below zero (reported; the paper "
                              "expects about equal)")))  # fmt: skip
    if len(lrs) > 1:
        out.append(Claim("nll_auc", "nz", "zero", "<", gate=False,
                         text="area under the NLL-vs-log-lr curve: non-zero below zero (reported)"))  # fmt: skip
    if "nz_reset" in cfg.inits:
        lr = best["nz"]
        out.append(Claim(NLL, system("nz", lr), system("nz_reset", lr), "<", gate=False,
                         text=tag(("nz",), f"held-out NLL at nz's best lr {lr:g}: without the reset below with it "
                                  "(reported; about equal expected for beta <= 1)")))  # fmt: skip
        out.append(Claim("step0_abs_dnll", "nz_reset@step0", "nz@step0", "<", mechanism=True,
                         text="at step 0 the reset keeps the pretrained model (|dNLL| ~ 0) while plain Init[AB] "
                              "moves it"))  # fmt: skip
    if cfg.beta_sweep:
        b = max(cfg.beta_sweep)
        out.append(Claim(NLL, system("nz", cfg.beta_sweep_lr, b), system("nz_reset", cfg.beta_sweep_lr, b), ">",
                         gate=False, text=f"at the largest beta {b:g}, lr {cfg.beta_sweep_lr:g}: the init noise "
                                          "hurts without the reset (reported)"))  # fmt: skip
    return out


def _figure(ctx: Any, cfg: Any, table: list[dict[str, Any]], lrs: list[float]) -> None:
    from lmlab.core.report.plotting import lines, title_for

    series = {m: [next(r["eval_nll"] for r in table if r["init"] == m and r["lr"] == lr) for lr in lrs]
              for m in cfg.inits}  # fmt: skip
    x = [math.log10(lr) for lr in lrs]
    ctx.add_figure("nll_vs_lr", lines(x, series, title=title_for("nonzero_lora", str(cfg.model), cfg.seed,
                                                                 cfg.eval_items, "held-out NLL vs lr"),
                                      xlabel="log10 learning rate", ylabel="answer NLL (nats)"))  # fmt: skip
