"""Reproduction (proxy): merge a glyph "VLM" with a text-reasoning fine-tune of the same base; per-block knockouts.

Paper claim (Chen et al., ICML 2025): linearly merging a VLM's language tower with a reasoning LLM of the same base
(α = 0.9 on the VLM) transfers reasoning to visual math problems without training, with little cost to perception;
perception lives in early layers, reasoning in middle-to-late ones, and after merging every layer contributes to
reasoning.

Proxy (no VLM runs offline). Base: `model`. VLM-proxy: a `GlyphProjector` (5x5 digit bitmaps of the task bank ->
soft tokens between ``<img>`` markers) + a LoRA on every decoder layer, trained on "Digit <img> is" -> the digit, with
some text replay. Reasoning model: a LoRA of the same base trained on "(a + b) mod 10 =" with the digits as text.
Task vectors τ = s·BA per weight. Merges on the decoder weights (the embedding and the projector stay the VLM's;
neither fine-tune touches the tied embedding): linear at each α, layerswap, TIES, DARE-linear. Probes (test split,
log-likelihood over the ten digits): perception, multimodal reasoning ("(<img> + <img>) mod 10 =": never trained
by either model) and text reasoning. α for the claim is chosen on the dev split among `claim_alphas` (`choose_alpha`:
ties go to the paper's 0.9; a strict winner at an edge of the grid is flagged, the grid must then be extended);
layerswap runs at that α. The base (the untrained LM reading the VLM-proxy's projector) is scored on every probe.

Claims (paired by test item), in order. Gated, the training gates first (a merge of fine-tunes that learned nothing
has nothing to transfer): the VLM-proxy reads the glyphs (perception, vs the base with the same projector: what its
LoRA adds); the reasoning fine-tune learned (a + b) mod 10 (text, vs the base). Then gated: multimodal-reasoning
accuracy of the merge above the VLM-proxy's. Reported: its perception not below the VLM-proxy's by more than
`perception_tol`; the merge's text reasoning above the VLM-proxy's; layerswap / TIES / DARE against the VLM-proxy.
Task-vector norms (`task_vector_norms`, from the dense τ the merges use): ‖τ_vlm‖, ‖τ_reason‖, their ratio and
cosine, and per α the share (1 − α)‖τ_reason‖ / ‖α τ_vlm + (1 − α) τ_reason‖ of the reasoning vector in the merged
delta (`merge_norms` table; rows ``tau_*``): a large ratio would say τ_reason is small, a small share at a ratio near
1 that the merge weight keeps it out. Knockout table and flags: the block whose reset hurts perception most, and how
many blocks reasoning sensitivity is spread over before and after merging.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from typing import Any

import numpy as np
import torch

from lmlab.core.stats.seeding import derive_seed
from lmlab.results import Claim

PERC, MM, TXT = "perception_acc", "mm_reason_acc", "text_reason_acc"
PROBE_METRIC = {"perception": PERC, "mm_reason": MM, "text_reason": TXT}
PAPER_ALPHA = 0.9  # the paper's α for every pair: dev ties resolve towards it


def choose_alpha(dev_acc: dict[float, float], prefer: float = PAPER_ALPHA) -> tuple[float, bool]:
    """(the α with the best dev accuracy, whether it sits at an edge of the grid).

    Ties go to the α closest to `prefer` (the paper's 0.9), then to the larger α. The edge flag is True only when
    the grid has several α's, the winner is its smallest or largest, and it beats every other α strictly: the
    optimum may then lie beyond the grid, which must be extended (a dev tie at an edge is no such evidence).
    """
    if not dev_acc:
        raise ValueError("dev_acc is empty; expected {alpha: dev accuracy} for at least one α")
    best = max(dev_acc, key=lambda a: (dev_acc[a], -abs(a - prefer), a))
    others = [v for a, v in dev_acc.items() if a != best]
    strict = bool(others) and all(dev_acc[best] > v for v in others)  # False with NaN (one candidate, no dev pass)
    return best, strict and best in (min(dev_acc), max(dev_acc))


def _glyphs(ctx: Any, task: str, n: int, split: str, noise: float) -> list[Any]:
    try:
        ex = ctx.data("taskbank", n, split=split, domain="glyphs", task=task, noise=noise, n_choices=0)
    except ValueError as e:
        raise ValueError(f"the task bank cannot give {n} {split} glyph items of {task!r}: {e}") from None
    if not ex:
        raise ValueError(f"no {split} glyph items of {task!r}; expected at least one (check --limit)")
    return ex


def _key(cfg: Any, ctx: Any, what: str, items: list[Any], steps: int, seed: int) -> str:
    blob = {"what": what, "model": cfg.model, "info": ctx.models.get(cfg.model), "items": [it.id for it in items],
            "steps": steps, "batch": cfg.batch, "lr": cfg.lr, "plr": cfg.projector_lr, "rank": cfg.rank,
            "alpha": cfg.lora_alpha, "targets": list(cfg.target_modules), "k": cfg.image_tokens, "seed": seed,
            "dtype": cfg.dtype, "version": 1}  # fmt: skip
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _cached(cfg: Any, key: str, train_fn: Any) -> tuple[dict[str, Any], list[float], bool]:
    """(state, losses, from_cache): a fine-tune from lmlab's cache folder, or trained and stored there."""
    if not cfg.finetune_cache:
        state, losses = train_fn()
        return state, losses, False
    import os

    from lmlab.core.inference.models import cache_root

    folder = cache_root() / "cross_modal_merge"
    path = folder / f"{key}.pt"
    if path.exists():
        blob = torch.load(path, weights_only=True)
        return blob["state"], blob["losses"], True
    state, losses = train_fn()
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{key}.{os.getpid()}.tmp"
    torch.save({"state": state, "losses": losses}, tmp)
    os.replace(tmp, path)
    return state, losses, False


def run(cfg: Any, ctx: Any) -> Any:
    from peft import LoraConfig

    from lmlab.methods.adaptation.cross_modal_merge.method import (
        GlyphProjector,
        dare_merge,
        effective_blocks,
        layer_blocks,
        layer_knockout,
        layer_norms,
        layerswap_merge,
        linear_merge,
        task_vector_norms,
        ties_merge,
    )
    from lmlab.methods.adaptation.cross_modal_merge.proxy import (
        DigitScorer,
        all_pair_items,
        apply_task_vector,
        build_items,
        dense_task_vector,
        shuffled,
        train_lora,
    )

    # data: glyphs of the task bank (noisy bitmaps; splits disjoint by the exact bitmap)
    read_train = _glyphs(ctx, "read", cfg.train_items, "train", cfg.noise)
    read_test = _glyphs(ctx, "read", cfg.test_items, "test", cfg.noise)
    several = len(set(cfg.claim_alphas)) > 1  # one candidate α needs no dev split
    sum_dev = _glyphs(ctx, "sum_mod10", cfg.dev_items, "dev", cfg.noise) if several else []
    sum_test = _glyphs(ctx, "sum_mod10", cfg.test_items, "test", cfg.noise)
    perc_train = build_items(read_train, "perception")
    n_text = int(round(cfg.vlm_text_mix / (1 - cfg.vlm_text_mix) * len(perc_train)))
    text_read = build_items(read_train, "text_read")[: max(0, n_text)]
    vlm_pool = shuffled(perc_train + text_read, derive_seed(cfg.seed, "cmm-vlm-pool"))
    if cfg.reason_pairs == "all":
        reason_pool = all_pair_items()
    else:
        pairs = _glyphs(ctx, "sum_mod10", None, "train", 0.0)
        reason_pool = build_items(pairs, "text_reason")
    if cfg.limit is not None:
        reason_pool = reason_pool[: cfg.limit]
    probes = {"perception": build_items(read_test, "perception"), "mm_reason": build_items(sum_test, "mm_reason"),
              "text_reason": build_items(sum_test, "text_reason")}  # fmt: skip
    dev_mm = build_items(sum_dev, "mm_reason") if several else []

    model, tok = ctx.load_model()
    if not hasattr(model, "model") or not hasattr(model.model, "layers"):
        raise ValueError(f"model {cfg.model!r} is a {type(model).__name__}; expected a llama-style causal LM with "
                         "model.layers (decoder blocks)")  # fmt: skip
    n_layers = len(model.model.layers)
    work = copy.deepcopy(model)  # the LoRAs are injected here; the cached model stays the base
    for p in work.parameters():
        p.requires_grad_(False)
    scorer = DigitScorer(work, tok, batch_size=32)
    d_model = int(work.get_input_embeddings().weight.shape[1])
    lora_cfg = LoraConfig(r=cfg.rank, lora_alpha=cfg.lora_alpha, target_modules=list(cfg.target_modules),
                          lora_dropout=0.0, bias="none")  # fmt: skip

    # the two fine-tunes (cached on disk when finetune_cache)
    t0 = time.perf_counter()
    vseed, rseed = derive_seed(cfg.seed, "cmm-vlm"), derive_seed(cfg.seed, "cmm-reason")
    torch.manual_seed(derive_seed(vseed, "projector"))
    projector = GlyphProjector(25, d_model, cfg.image_tokens)

    def train_vlm() -> tuple[Any, list[float]]:
        return train_lora(work, scorer, vlm_pool, lora_cfg, steps=cfg.vlm_steps, batch=cfg.batch, lr=cfg.lr,
                          seed=vseed, projector=projector, projector_lr=cfg.projector_lr)  # fmt: skip

    def train_reason() -> tuple[Any, list[float]]:
        return train_lora(work, scorer, reason_pool, lora_cfg, steps=cfg.reason_steps, batch=cfg.batch, lr=cfg.lr,
                          seed=rseed)  # fmt: skip

    try:
        vstate, vloss, vhit = _cached(cfg, _key(cfg, ctx, "vlm", vlm_pool, cfg.vlm_steps, vseed), train_vlm)
        rstate, rloss, rhit = _cached(cfg, _key(cfg, ctx, "reason", reason_pool, cfg.reason_steps, rseed),
                                      train_reason)  # fmt: skip
    except ValueError as e:
        if "Target modules" in str(e) or "target_modules" in str(e):
            raise ValueError(f"target_modules {cfg.target_modules} match no linear layer of {cfg.model}; expected "
                             "llama-style names (q_proj, v_proj, up_proj, down_proj, ...)") from None  # fmt: skip
        raise
    projector.load_state_dict(vstate["projector"])
    projector.eval()
    for p in projector.parameters():
        p.requires_grad_(False)
    train_s = time.perf_counter() - t0
    ctx.record_value("vlm", "train_s", train_s, unit="s", note=f"both fine-tunes (cached: vlm {vhit}, reason {rhit})")

    tau_v, tau_r = dense_task_vector(vstate), dense_task_vector(rstate)
    base = {k: model.get_parameter(k).detach() for k in tau_v}
    zeros = {k: torch.zeros_like(t) for k, t in tau_v.items()}
    if not torch.equal(torch.stack([linear_merge(tau_v, tau_r, 1.0, exclude=())[k].sum() for k in tau_v]),
                       torch.stack([tau_v[k].sum() for k in tau_v])):  # fmt: skip
        raise RuntimeError("the linear merge at α = 1 differs from the VLM-proxy; it must return it exactly")
    ctx.flag("alpha1_is_vlm", True)

    # the size of each task vector and its share of the merged delta at every α (the dense τ the merges use)
    norm_alphas = sorted({1.0, 0.0, *(float(a) for a in cfg.alphas)}, reverse=True)
    tv = task_vector_norms(tau_v, tau_r, norm_alphas)

    # the untrained base first: the row every trained system must move away from. The merges are built one at a
    # time when scored (a dense τ of SmolLM2's 30 layers x 7 projections is ~106M floats, ~0.4 GB)
    systems: dict[str, Any] = {"base": {}, "vlm": tau_v, "reason": tau_r}
    merges = {f"merged_a{a:g}": float(a) for a in cfg.alphas}

    def evaluate(tau: Any, items: list[Any]) -> tuple[list[float], list[float]]:
        apply_task_vector(work, base, tau)
        return scorer.score(items, projector)

    # each system on the probes its checks read (every probe costs a forward pass per item on CPU)
    need = {"reason": ("text_reason", "mm_reason"), "layerswap": ("perception", "mm_reason"),
            "ties": ("perception", "mm_reason"), "dare_linear": ("perception", "mm_reason")}  # fmt: skip
    scores: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    dev_acc: dict[float, float] = {}
    claim_alphas = sorted({float(a) for a in cfg.claim_alphas})
    for name in ctx.progress([*systems, *merges], "evaluate linear merges"):
        alpha = merges.get(name)
        tau = systems[name] if alpha is None else linear_merge(tau_v, tau_r, alpha, exclude=())
        scores[name] = {p: evaluate(tau, probes[p]) for p in need.get(name, tuple(probes))}
        if alpha in claim_alphas and len(claim_alphas) > 1:  # one candidate needs no dev pass
            dev_acc[alpha] = float(np.mean(evaluate(tau, dev_mm)[0]))
        del tau
    if not dev_acc:
        dev_acc = {claim_alphas[0]: float("nan")}
    # α for the claim: the best dev multimodal-reasoning accuracy (ties: the α closest to the paper's 0.9)
    best_alpha, at_edge = choose_alpha(dev_acc)
    chosen = f"merged_a{best_alpha:g}"
    scores["merged"] = scores[chosen]
    systems["merged"] = linear_merge(tau_v, tau_r, best_alpha, exclude=())  # rebuilt: the knockouts need it
    ctx.flag("alpha_dev_mm_reason_acc", {f"{a:g}": None if v != v else round(v, 4) for a, v in dev_acc.items()})
    ctx.flag("chosen_alpha", best_alpha)
    ctx.flag("alpha_at_grid_edge", at_edge)

    # the repo's other merge modes (built one at a time); layerswap at the α chosen on dev
    others = {
        "layerswap": lambda: layerswap_merge(tau_v, tau_r, best_alpha, cfg.base_layer_num, exclude=()),
        "ties": lambda: ties_merge(tau_v, tau_r, zeros, list(cfg.ties_weights), cfg.ties_density, exclude=()),
        "dare_linear": lambda: dare_merge(tau_v, tau_r, zeros, list(cfg.dare_weights), cfg.dare_density, exclude=(),
                                          seed=derive_seed(cfg.seed, "cmm-dare")),
    }  # fmt: skip
    for name in ctx.progress([m for m in others if m in cfg.merges], "evaluate other merges"):
        tau = others[name]()
        scores[name] = {p: evaluate(tau, probes[p]) for p in need[name]}
        del tau
    _record_norms(ctx, tv, best_alpha)

    notes = {"base": "the base LM reading the VLM-proxy's projector", "vlm": "the VLM-proxy (projector + LoRA)",
             "reason": "the reasoning fine-tune, given the VLM-proxy's projector",
             "merged": f"linear merge at α = {best_alpha:g} (chosen on {len(dev_mm)} dev items)" if dev_mm else
                       f"linear merge at α = {best_alpha:g} (the only candidate)",
             "layerswap": f"layers <= {cfg.base_layer_num} from the VLM, α = {best_alpha:g} above",
             "ties": f"TIES, weights {list(cfg.ties_weights)}, density {cfg.ties_density}",
             "dare_linear": f"DARE-linear, weights {list(cfg.dare_weights)}, density {cfg.dare_density}"}  # fmt: skip
    for name, per in scores.items():
        for probe, (correct, _) in per.items():
            ids = [it.id for it in probes[probe]]
            ctx.record(name, PROBE_METRIC[probe], correct, clusters=ids,
                       note=notes.get(name, f"linear merge at α = {name[len('merged_a'):]}"))  # fmt: skip

    # per-block knockout (reset to the base) of the VLM-proxy and the chosen merge
    ko_rows, spread, worst = [], {}, {}
    k = cfg.knockout_items
    if k > 0:
        blocks = layer_blocks(n_layers, cfg.block_size)
        sub = {p: probes[p][:k] for p in ("perception", "mm_reason")}
        for name in ("vlm", "merged"):
            tau = systems[name]
            full = {p: evaluate(tau, items) for p, items in sub.items()}
            drops = {p: [] for p in sub}
            for b, layers in enumerate(ctx.progress(blocks, f"knockout {name}")):
                tau_ko = layer_knockout(tau, zeros, layers)
                row: dict[str, Any] = {"model": name, "block": b, "layers": f"{layers[0]}-{layers[-1]}"}
                for p, items in sub.items():
                    acc, lp = evaluate(tau_ko, items)
                    drop = float(np.mean(full[p][1]) - np.mean(lp))
                    drops[p].append(drop)
                    row[f"{p}_acc"] = float(np.mean(acc))
                    row[f"{p}_acc_drop"] = float(np.mean(full[p][0]) - np.mean(acc))
                    row[f"{p}_logp_drop"] = drop
                ko_rows.append(row)
            worst[name] = int(np.argmax(drops["perception"]))
            spread[name] = {p: round(effective_blocks(v), 3) for p, v in drops.items()}
            for p in sub:
                ctx.record_value(name, f"{p}_knockout_spread", effective_blocks(drops[p]),
                                 note="effective blocks (Σd)²/Σd² of the positive log-prob drops")  # fmt: skip
        ctx.table("knockout", ko_rows)
        ctx.flag("largest_perception_drop_block", {n: {"block": b, "layers": f"{blocks[b][0]}-{blocks[b][-1]}"}
                                                   for n, b in worst.items()})  # fmt: skip
        ctx.flag("knockout_spread", spread)
    norms_v, norms_r = layer_norms(tau_v, n_layers), layer_norms(tau_r, n_layers)
    ctx.table("task_vector_norms", [{"layer": i, "vlm": v, "reason": r} for i, (v, r) in
                                    enumerate(zip(norms_v, norms_r))])  # fmt: skip
    apply_task_vector(work, base, {})

    ctx.table("finetunes", [
        {"model": "vlm", "items": len(vlm_pool), "steps": cfg.vlm_steps, "loss_first": vloss[0],
         "loss_last": vloss[-1], "from_cache": vhit},
        {"model": "reason", "items": len(reason_pool), "steps": cfg.reason_steps, "loss_first": rloss[0],
         "loss_last": rloss[-1], "from_cache": rhit}])  # fmt: skip
    ctx.add_samples({"id": it.id, "probe": p, "answer": it.answer, "digits": list(it.digits),
                     **{s: scores[s][p][0][j] for s in scores if p in scores[s]}}
                    for p, items in probes.items() for j, it in enumerate(items))  # fmt: skip
    _figures(ctx, cfg, ko_rows, norms_v, norms_r)
    ctx.note(
        f"Proxy, not the paper's VLMs: 5x5 digit glyphs -> {cfg.image_tokens} soft tokens; LoRA r = {cfg.rank} on "
        f"every decoder layer ({n_layers}); {cfg.vlm_steps} VLM-proxy steps, {cfg.reason_steps} reasoning steps "
        f"(reason_pairs = {cfg.reason_pairs}); α = {best_alpha:g} chosen on dev; {len(probes['mm_reason'])} test "
        f"items per probe, log-likelihood over the ten digits."
    )
    return ctx.finish(_claims(cfg))


def _record_norms(ctx: Any, tv: dict[str, Any], best_alpha: float) -> None:
    """The `task_vector_norms` rows: ‖τ‖ per fine-tune, their ratio and cosine, the `merge_norms` table (one row per
    α, 1.0 = the VLM-proxy, 0.0 = the reasoning fine-tune) and the chosen merge's shares."""
    ctx.record_value("vlm", "tau_norm", tv["norm_a"], note="‖τ_vlm‖ (Frobenius over every LoRA-adapted weight)")
    ctx.record_value("reason", "tau_norm", tv["norm_b"], note="‖τ_reason‖ (Frobenius over every LoRA-adapted weight)")
    if np.isfinite(tv["ratio"]):  # ‖τ_reason‖ = 0 only when the reasoning LoRA never moved (the training gate fails)
        ctx.record_value("vlm", "tau_norm_ratio", tv["ratio"], note="‖τ_vlm‖ / ‖τ_reason‖")
    if np.isfinite(tv["cosine"]):
        ctx.record_value("vlm", "tau_cosine", tv["cosine"], note="cos(τ_vlm, τ_reason)")

    def finite(v: float) -> float | None:
        return float(v) if np.isfinite(v) else None

    rows = []
    for r in tv["by_alpha"]:
        a = r["alpha"]
        name = "vlm" if a == 1 else "reason" if a == 0 else f"merged_a{a:g}"
        rows.append({"system": name, "alpha": a, "chosen": a == best_alpha, "merged_norm": r["merged_norm"],
                     "vlm_part": r["part_a"], "reason_part": r["part_b"], "vlm_share": finite(r["share_a"]),
                     "reason_share": finite(r["share_b"]), "reason_to_vlm": finite(r["b_to_a"])})  # fmt: skip
        if a == best_alpha and np.isfinite(r["share_b"]):
            share_note = f"(1 − α)‖τ_reason‖ / ‖α τ_vlm + (1 − α) τ_reason‖ at the chosen α = {a:g}"
            ctx.record_value("merged", "tau_reason_share", r["share_b"], note=share_note)
            ctx.record_value("merged", "tau_norm", r["merged_norm"], note=f"‖α τ_vlm + (1 − α) τ_reason‖, α = {a:g}")
    ctx.table("merge_norms", rows)
    ctx.flag("task_vector_norm_totals", {"vlm": finite(tv["norm_a"]), "reason": finite(tv["norm_b"]),
                                         "ratio_vlm_to_reason": finite(tv["ratio"]),
                                         "cosine": finite(tv["cosine"])})  # fmt: skip


def _claims(cfg: Any) -> list[Claim]:
    claims = [
        # the training gates first: a merge of fine-tunes that learned nothing has nothing to transfer
        Claim(PERC, "vlm", "base", ">",
              text="training gate: the VLM-proxy's LoRA learned to read the glyphs (perception vs the base LM with "
                   "the same projector)"),
        Claim(TXT, "reason", "base", ">",
              text="training gate: the reasoning LoRA learned (a + b) mod 10 on text (vs the base LM)"),
        Claim(MM, "merged", "vlm", ">",
              text="multimodal reasoning (two glyphs, (a + b) mod 10): the merge above the VLM-proxy (training-free "
                   "transfer)"),
        # a non-inferiority guard passes for two identical systems, so it is reported, never gated
        Claim(PERC, "merged", "vlm", ">", min_effect=-cfg.perception_tol, gate=False,
              text=f"perception: the merge not below the VLM-proxy by more than {cfg.perception_tol:g} (reported)"),
        Claim(TXT, "merged", "vlm", ">", gate=False,
              text="text reasoning: the merge above the VLM-proxy (reported)"),
    ]  # fmt: skip
    for m in cfg.merges:
        claims.append(Claim(MM, m, "vlm", ">", gate=False,
                            text=f"multimodal reasoning: {m} above the VLM-proxy (reported)"))  # fmt: skip
    return claims


def _figures(ctx: Any, cfg: Any, ko_rows: list[dict[str, Any]], norms_v: list[float], norms_r: list[float]) -> None:
    from lmlab.core.report.plotting import bar_with_ci, lines, title_for

    for metric, what in ((MM, "multimodal reasoning accuracy"), (PERC, "perception accuracy")):
        rows = [m for m in ctx.metrics if m.metric == metric]
        n = rows[0].n if rows else None
        ctx.add_figure(metric, bar_with_ci(rows, title=title_for("cross_modal_merge", str(cfg.model), cfg.seed, n,
                                                                 what), ylabel=what,
                                           highlight=("merged",)))  # fmt: skip
    if ko_rows:
        series = {}
        for name in ("vlm", "merged"):
            for p in ("perception", "mm_reason"):
                series[f"{name} {p}"] = [r[f"{p}_logp_drop"] for r in ko_rows if r["model"] == name]
        blocks = sorted({r["block"] for r in ko_rows})
        ctx.add_figure("knockout", lines(blocks, series, title=title_for("cross_modal_merge", str(cfg.model),
                                                                         cfg.seed, cfg.knockout_items,
                                                                         "block knockout: gold log-prob drop"),
                                         xlabel=f"block ({cfg.block_size} layers)",
                                         ylabel="drop in gold log-prob"))  # fmt: skip
    ctx.add_figure("task_vector_norms", lines(list(range(len(norms_v))), {"||τ_vlm||": norms_v,
                                                                          "||τ_reason||": norms_r},
                                              title=title_for("cross_modal_merge", str(cfg.model), cfg.seed, None,
                                                              "task-vector norm per layer"),
                                              xlabel="layer", ylabel="Frobenius norm"))  # fmt: skip
