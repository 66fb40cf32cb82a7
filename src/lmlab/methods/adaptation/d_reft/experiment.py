"""Reproduction: D-LoReFT vs pointwise LoReFT at an early and a late layer; clean / paraphrase / typo / noise.

Paper claims (Deng et al., ICML 2025): distribution-wise interventions beat pointwise ones in controllability and
robustness, work best in early layers, and a larger learned σ goes with better performance.

Task (`task.py`): country -> continent on the frozen model, scored by the log-likelihood of the six continent names
(one prompt pass with a KV cache, then the options). Training: the train and dev splits of lmlab's ``countries``
suite, each country under the five training templates. Evaluation: `n_test` test-split countries under

- ``clean``: a training template (seeded per country);
- ``paraphrase``: a held-out template never seen in training;
- ``typo``: the clean prompt with letter typos (`typo_rate`);
- ``noise_<a>``: the clean prompt, Gaussian noise of std a x RMS(h) added to the representation at the
  intervened positions before the intervention reads it (the same noise for every system: same generator seed).

For each layer and seed, LoReFT and D-LoReFT start from the same R and W (D-LoReFT adds the log-variance network),
see the same data order and steps. Values of all seeds are clustered by country (the independent unit).

Claims, in order: (1) the training gate, "training moved the policy": the trained LoReFT puts more probability on the
gold continent than the bare model at the earliest layer (clean prompts; log p(gold) normalised over the six options,
per country), gated first, because a D-vs-pointwise comparison between two interventions that did not learn has
nothing to separate; (2) robustness accuracy (mean over the non-clean conditions, per country) of D-LoReFT above LoReFT
at the earliest layer (gated); reported: LoReFT's clean accuracy above the bare model, the same comparison at every
other layer, clean accuracy, D-LoReFT vs its mean, non-inferiority within `tol`, the advantage at the earliest vs the
latest layer. The Spearman correlation of the learned mean σ with accuracy over layers x seeds is recorded, not
gated.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import numpy as np

from lmlab.core.stats.seeding import derive_seed
from lmlab.methods.adaptation.d_reft.task import (
    CONTINENT_OPTIONS,
    HELDOUT_TEMPLATES,
    TRAIN_TEMPLATES,
    Item,
    build_items,
    training_texts,
    typo_items,
)
from lmlab.results import Claim

METHOD, BASELINE, MEAN = "d_loreft", "loreft", "d_loreft_mean"


def _conditions(cfg: Any, clean: list[Item], para: list[Item], seed: int) -> dict[str, tuple[list[Item], float]]:
    conds: dict[str, tuple[list[Item], float]] = {"clean": (clean, 0.0), "paraphrase": (para, 0.0)}
    if cfg.typo_rate > 0:
        conds["typo"] = (typo_items(clean, cfg.typo_rate, seed=seed), 0.0)
    for a in cfg.noise_scales:
        conds[f"noise_{a:g}"] = (clean, float(a))
    return conds


def _score(model: Any, handle: Any, items: list[Item], prompts: dict[str, list[int]], options: list[list[int]],
           cfg: Any, pad_id: int) -> tuple[list[int], list[float]]:  # fmt: skip
    """Per item: the argmax hit, and log p(gold) = logsumexp(s[accepted]) - logsumexp(s) over the K options."""
    from lmlab.methods.adaptation.d_reft.method import option_logprobs

    ids = [prompts[it.prompt] for it in items]
    scores = option_logprobs(model, handle, ids, [options] * len(ids), batch_size=cfg.eval_batch, pad_id=pad_id)
    hits = [int(int(np.argmax(s)) in it.accepted) for s, it in zip(scores, items)]
    gold = [float(np.logaddexp.reduce([s[i] for i in it.accepted]) - np.logaddexp.reduce(s))
            for s, it in zip(scores, items)]  # fmt: skip
    return hits, gold


def run(cfg: Any, ctx: Any) -> Any:
    import torch

    from lmlab.core.stats.uncertainty import spearman
    from lmlab.methods.adaptation.d_reft.method import (
        DLoreftIntervention,
        LoreftIntervention,
        ReftConfig,
        attach_interventions,
        train_intervention,
    )

    train_ex = [*ctx.data("countries", cfg.n_train, split="train", task="continent"),
                *ctx.data("countries", cfg.n_train, split="dev", task="continent")]  # fmt: skip
    test_ex = ctx.data("countries", cfg.n_test, split="test", task="continent")
    if not train_ex or not test_ex:
        raise ValueError("the countries suite gave no training or test examples (check --limit)")
    model, tok = ctx.load_model()
    n_layers = len(model.model.layers)
    for layer in cfg.layers:
        if layer >= n_layers:
            raise ValueError(f"layers entries must be < {n_layers} (the blocks of {cfg.model}), got {layer}")
    d = int(model.config.hidden_size)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)

    def enc(text: str, special: bool = True) -> list[int]:
        return list(tok(text, add_special_tokens=special)["input_ids"])

    options = [enc(" " + c, special=False) for c in CONTINENT_OPTIONS]
    pairs = [(enc(p), enc(a, special=False)) for p, a in training_texts(train_ex)]
    clean = build_items(test_ex, TRAIN_TEMPLATES, seed=cfg.seed, tag="clean")
    para = build_items(test_ex, HELDOUT_TEMPLATES, seed=cfg.seed, tag="paraphrase")
    conds = _conditions(cfg, clean, para, cfg.seed)
    prompts = {it.prompt: enc(it.prompt) for items, _ in conds.values() for it in items}
    robust = [c for c in conds if c != "clean"]
    ctx.flag("conditions", {c: {"items": len(items), "rep_noise": a} for c, (items, a) in conds.items()})
    ctx.flag("examples", {"train_countries": len(train_ex), "train_pairs": len(pairs), "test_countries": len(clean),
                          "options": list(CONTINENT_OPTIONS), "example_paraphrase": para[0].prompt,
                          "example_clean": clean[0].prompt})  # fmt: skip

    hits: dict[tuple[str, int, str], list[int]] = defaultdict(list)  # (system, layer, condition) -> per seed x item
    gold: dict[tuple[str, int, str], list[float]] = defaultdict(list)  # the same keys: normalised log p(gold option)
    ids_of: dict[tuple[str, int, str], list[str]] = defaultdict(list)
    sigma_points: list[dict[str, Any]] = []
    sweep: dict[float, list[int]] = defaultdict(list)
    sweep_ids: dict[float, list[str]] = defaultdict(list)
    samples: list[dict[str, Any]] = []
    timings: dict[str, float] = defaultdict(float)
    first_layer = cfg.layers[0]

    def evaluate(
        system: str, layer: int, handle: Any, seed_s: int, iv: Any = None, sigma_out: list | None = None
    ) -> dict[str, float]:
        """Accuracy per condition; with `sigma_out`, D-LoReFT's sigma on the clean prompts is appended to it."""
        accs = {}
        for cond, (items, alpha) in conds.items():
            if iv is not None and sigma_out is not None:
                iv.sigma_log = sigma_out if cond == "clean" else None
            handle.input_noise = alpha
            # the same noise for every system and seed (evaluation noise; countries are the unit)
            handle.noise_generator = torch.Generator().manual_seed(derive_seed(cfg.seed, "noise", layer, cond))
            if iv is not None:
                iv.generator = torch.Generator().manual_seed(derive_seed(seed_s, "eval-eps", layer, cond))
            h, g = _score(model, handle, items, prompts, options, cfg, pad_id)
            hits[(system, layer, cond)] += h
            gold[(system, layer, cond)] += g
            ids_of[(system, layer, cond)] += [it.id for it in items]
            accs[cond] = float(np.mean(h))
        handle.input_noise = 0.0
        if iv is not None:
            iv.sigma_log = None
        return accs

    # the bare model (an identity LoReFT carries the noise conditions: W = R, b = 0 edits nothing)
    t0 = time.perf_counter()
    for layer in cfg.layers:
        ident = LoreftIntervention(d, cfg.rank).set_identity()
        with attach_interventions(model, ReftConfig(layer, cfg.rank, cfg.positions, cfg.share_weights), ident) as hd:
            accs = evaluate("base", layer, hd, cfg.seed)
        for cond in conds:  # deterministic: the same values for every seed, repeated to pair with the seeds' runs
            hits[("base", layer, cond)] *= cfg.seeds
            gold[("base", layer, cond)] *= cfg.seeds
            ids_of[("base", layer, cond)] *= cfg.seeds
        samples.append({"system": "base", "layer": layer, "accuracy": accs})
    timings["base_eval_s"] = time.perf_counter() - t0

    jobs = [(layer, s) for layer in cfg.layers for s in range(cfg.seeds)]
    for layer, s in ctx.progress(jobs, "layer x seed"):
        seed_s = derive_seed(cfg.seed, "replicate", s)
        rcfg = ReftConfig(layer, cfg.rank, cfg.positions, cfg.share_weights)
        torch.manual_seed(derive_seed(seed_s, "init", layer))
        div = DLoreftIntervention(d, cfg.rank, logvar_clamp=tuple(cfg.logvar_clamp),
                                  sigma_clamp=tuple(cfg.sigma_clamp), sample_at_eval=cfg.sample_at_eval,
                                  kl_beta=cfg.kl_beta)  # fmt: skip
        liv = LoreftIntervention(d, cfg.rank)
        liv.load_state_dict(div.state_dict(), strict=False)  # the same R, W and b at step 0
        for system, iv in ((BASELINE, liv), (METHOD, div)):
            t1 = time.perf_counter()
            with attach_interventions(model, rcfg, iv) as handle:
                if system == METHOD:
                    iv.generator = torch.Generator().manual_seed(derive_seed(seed_s, "train-eps", layer))
                stats = train_intervention(
                    model, handle, pairs, steps=cfg.steps, batch_size=cfg.train_batch, lr=cfg.lr,
                    warmup_ratio=cfg.warmup_ratio, weight_decay=cfg.weight_decay, pad_id=pad_id,
                    generator=torch.Generator().manual_seed(derive_seed(seed_s, "order", layer)),
                )  # fmt: skip
                timings[f"train_s_L{layer}"] += time.perf_counter() - t1
                t2 = time.perf_counter()
                clean_sigma: list = []
                accs = evaluate(system, layer, handle, seed_s, iv if system == METHOD else None, clean_sigma)
                rec: dict[str, Any] = {"system": system, "layer": layer, "seed": s, "accuracy": accs,
                                       "loss_first": stats.losses[0], "loss_last": stats.losses[-1]}  # fmt: skip
                if system == METHOD:
                    sig = torch.cat(clean_sigma).mean().item() if clean_sigma else float("nan")
                    rec["mean_sigma"] = sig
                    sigma_points.append({"layer": layer, "seed": s, "mean_sigma": sig, "clean_acc": accs["clean"],
                                         "robust_acc": float(np.mean([accs[c] for c in robust])) if robust else
                                         accs["clean"]})  # fmt: skip
                    if cfg.eval_mean:
                        iv.sample_at_eval = False
                        rec["accuracy_mean"] = evaluate(MEAN, layer, handle, seed_s, iv)
                        iv.sample_at_eval = cfg.sample_at_eval
                    if layer == first_layer:
                        clean_items = conds["clean"][0]
                        for scale in cfg.sigma_sweep:
                            iv.noise_scale = float(scale)
                            iv.generator = torch.Generator().manual_seed(derive_seed(seed_s, "sweep", layer, scale))
                            sweep[float(scale)] += _score(model, handle, clean_items, prompts, options, cfg, pad_id)[0]
                            sweep_ids[float(scale)] += [it.id for it in clean_items]
                        iv.noise_scale = 1.0
                timings[f"eval_s_L{layer}"] += time.perf_counter() - t2
            samples.append(rec)

    # ---- metrics: per (seed, country) values, clustered by country
    systems = ["base", BASELINE, METHOD] + ([MEAN] if cfg.eval_mean else [])
    for layer in cfg.layers:
        for system in systems:
            ctx.record(
                system,
                f"gold_logp_clean_L{layer}",
                gold[(system, layer, "clean")],
                clusters=ids_of[(system, layer, "clean")],
                note=f"log p(gold continent), normalised over the {len(options)} options, clean, layer {layer}",
            )
            for cond in conds:
                ctx.record(system, f"acc_{cond}_L{layer}", hits[(system, layer, cond)],
                           clusters=ids_of[(system, layer, cond)], note=f"{cond} prompts, layer {layer}")  # fmt: skip
            if robust:
                per = np.mean([hits[(system, layer, c)] for c in robust], axis=0)
                ctx.record(system, f"robust_acc_L{layer}", per.tolist(), clusters=ids_of[(system, layer, "clean")],
                           note="mean over " + ", ".join(robust))  # fmt: skip
        if robust:
            adv = np.mean([np.subtract(hits[(METHOD, layer, c)], hits[(BASELINE, layer, c)]) for c in robust], axis=0)
            ctx.record(f"L{layer}", "robust_adv", adv.tolist(), clusters=ids_of[(METHOD, layer, "clean")],
                       note="D-LoReFT minus LoReFT robustness accuracy at this layer")  # fmt: skip
    for scale, vals in sweep.items():
        ctx.record(f"{METHOD}_eps_x{scale:g}", f"acc_clean_L{first_layer}", vals, clusters=sweep_ids[scale],
                   note=f"epsilon x {scale:g} at evaluation")  # fmt: skip
    for row in sigma_points:
        ctx.record_value(METHOD, f"mean_sigma_L{row['layer']}_s{row['seed']}", row["mean_sigma"],
                         note="mean learned sigma on the clean test prompts")  # fmt: skip
    if len(sigma_points) >= 3:
        key = "robust_acc" if robust else "clean_acc"
        rho, p = spearman([r["mean_sigma"] for r in sigma_points], [r[key] for r in sigma_points])
        rho = 0.0 if not np.isfinite(rho) else float(rho)
        ctx.record_value(
            METHOD,
            "sigma_acc_spearman",
            rho,
            note=f"Spearman(mean sigma, {key}) over {len(sigma_points)} layer x seed runs, p = {p:.3g}",
        )
        ctx.flag("sigma_acc_spearman", {"rho": rho, "p": float(p) if np.isfinite(p) else None,
                                        "points": len(sigma_points), "accuracy": key})  # fmt: skip
    n_liv = sum(p.numel() for p in LoreftIntervention(d, cfg.rank).parameters())
    n_div = n_liv + cfg.rank * (d + 1)
    ctx.flag("parameters", {BASELINE: n_liv, METHOD: n_div, "note": "D-LoReFT adds the log-variance network"})
    ctx.flag("timings_s", {k: round(v, 2) for k, v in timings.items()})
    # the bare model's row first in every table: the untrained reference each trained system must move away from
    base_rows = [{"layer": layer, "seed": None, "mean_sigma": None, "system": "base",
                  "clean_acc": float(np.mean(hits[("base", layer, "clean")])),
                  "robust_acc": float(np.mean([hits[("base", layer, c)] for c in robust])) if robust else
                  float(np.mean(hits[("base", layer, "clean")]))} for layer in cfg.layers]  # fmt: skip
    ctx.table("sigma_vs_accuracy", [*base_rows, *({"system": METHOD, **r} for r in sigma_points)])
    ctx.table("accuracy", [{"system": sm["system"], "layer": sm["layer"], "seed": sm.get("seed"), **sm["accuracy"]}
                           for sm in samples])  # fmt: skip
    ctx.add_samples(samples)
    _figures(ctx, cfg, conds, systems, sigma_points, sweep)
    ctx.note(
        f"Frozen {cfg.model}; rank {cfg.rank}, positions {cfg.positions} (shared={cfg.share_weights}), {cfg.steps} "
        f"steps x {cfg.train_batch}, lr {cfg.lr}; {len(train_ex)} training countries x {len(TRAIN_TEMPLATES)} "
        f"templates, {len(clean)} test countries, {cfg.seeds} seed(s); D-LoReFT "
        f"{'samples' if cfg.sample_at_eval else 'uses its mean'} at evaluation."
    )
    return ctx.finish(_claims(cfg, robust))


def _claims(cfg: Any, robust: list[str]) -> list[Claim]:
    l0, ll = cfg.layers[0], cfg.layers[-1]
    metric = f"robust_acc_L{l0}" if robust else f"acc_clean_L{l0}"
    what = "robustness accuracy (" + ", ".join(robust) + ")" if robust else "clean accuracy"
    claims = [
        # the training gate first: without it "D vs pointwise" may compare two interventions that learned nothing
        Claim(f"gold_logp_clean_L{l0}", BASELINE, "base", ">",
              text=f"training moved the policy: at layer {l0} the trained LoReFT puts more probability on the gold "
                   "continent than the bare model (clean prompts, log p normalised over the options, per country)"),
        Claim(f"acc_clean_L{l0}", BASELINE, "base", ">", gate=False,
              text=f"clean accuracy at layer {l0}: the trained LoReFT above the bare model (reported)"),
        Claim(metric, METHOD, BASELINE, ">",
              text=f"{what} at layer {l0}: D-LoReFT above pointwise LoReFT (per country, all seeds)"),
        Claim(f"acc_clean_L{l0}", METHOD, BASELINE, ">", gate=False,
              text=f"clean accuracy at layer {l0}: D-LoReFT above LoReFT (reported)"),
        Claim(metric, METHOD, BASELINE, ">", min_effect=-cfg.tol, gate=False,
              text=f"{what} at layer {l0}: D-LoReFT not below LoReFT by more than {cfg.tol} (reported)"),
    ]  # fmt: skip
    for layer in cfg.layers[1:]:
        m = f"robust_acc_L{layer}" if robust else f"acc_clean_L{layer}"
        claims.append(Claim(m, METHOD, BASELINE, ">", gate=False,
                            text=f"{what} at layer {layer}: D-LoReFT above LoReFT (reported)"))  # fmt: skip
    if robust and ll != l0:
        claims.append(Claim("robust_adv", f"L{l0}", f"L{ll}", ">", gate=False,
                            text=f"the robustness advantage of D-LoReFT is larger at layer {l0} than at layer {ll} "
                                 "(reported)"))  # fmt: skip
    if cfg.eval_mean:
        claims.append(
            Claim(
                metric,
                METHOD,
                MEAN,
                ">",
                gate=False,
                text=f"{what} at layer {l0}: sampling at evaluation above D-LoReFT's mean (reported)",
            )
        )
    return claims


def _figures(ctx: Any, cfg: Any, conds: dict, systems: list[str], sigma_points: list[dict], sweep: dict) -> None:
    from lmlab.core.report.plotting import lines, quality_vs_compute, title_for

    by = {(m.system, m.metric): m.value for m in ctx.metrics}
    for system in systems:
        series = {c: [by[(system, f"acc_{c}_L{layer}")] for layer in cfg.layers] for c in conds}
        ctx.add_figure(f"accuracy_by_layer_{system}", lines(
            cfg.layers, series, title=title_for("d_reft", str(cfg.model), cfg.seed, len(conds["clean"][0]),
                                                f"{system}: accuracy by layer"),
            xlabel="layer", ylabel="accuracy"))  # fmt: skip
    if sigma_points:
        pts = [(f"L{r['layer']}/s{r['seed']}", r["mean_sigma"], r["robust_acc"]) for r in sigma_points]
        ctx.add_figure("sigma_vs_accuracy", quality_vs_compute(
            pts, title=title_for("d_reft", str(cfg.model), cfg.seed, len(pts), "learned sigma vs robustness accuracy"),
            xlabel="mean learned sigma (clean test prompts)", ylabel="robustness accuracy", highlight=()))  # fmt: skip
    if sweep:
        l0 = cfg.layers[0]
        xs = [0.0, 1.0, *sorted(sweep)] if cfg.eval_mean else [1.0, *sorted(sweep)]
        keys = {0.0: MEAN, 1.0: METHOD, **{s: f"{METHOD}_eps_x{s:g}" for s in sweep}}
        ys = [by[(keys[x], f"acc_clean_L{l0}")] for x in xs]
        ctx.add_figure("sigma_sweep", lines(
            xs, {"D-LoReFT": ys}, title=title_for("d_reft", str(cfg.model), cfg.seed, None,
                                                   f"epsilon multiplier at evaluation, layer {l0}"),
            xlabel="epsilon multiplier (0 = mean)", ylabel="clean accuracy"))  # fmt: skip
