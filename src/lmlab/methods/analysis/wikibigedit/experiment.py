"""Reproduction: lifelong editing of SmolLM2 on the GeoBigEdit stream with RAG, LoRA, LoRA-Merge, FT, ROME, MEMIT.

Paper claim (Thede et al., ICML 2025): on real Wikidata changes edited increment after increment, the dedicated
lifelong editors (ROME, R-ROME, MEMIT, WISE) fail at scale (accuracy, retention and locality fall as edits
accumulate); retrieval (RAG) gives the best edit accuracy and retention at a large inference cost; continual
fine-tuning with LoRA-Merge is competitive and cheap.

Protocol here (WikiBigEdit's ``run_lifelong_edit.py``): the GeoBigEdit stream of `increments` x
`edits_per_increment` records (`lmlab.data.geobigedit`, test split), minus the edits the unedited model already
answers (``filter_edits``). Every editor starts from the same unedited model and applies the increments in order
without rollback; after each increment every fact edited so far is scored at its latest value with the paper's
teacher-forced token accuracy in "Q: ... A: ..." after 3 fixed shots (RAG's shots also carry a "Fact:" line, as its
prompts do; the plain-shot variant is re-scored after the last increment and reported): edit (src), rephrase,
persona, multi-hop, locality (agreement with the unedited model's predictions), plus held-out unedited facts (general
ability) and the log-likelihood of HumanEval prompts (fluency). The unit of every CI is the fact (edit).

Learning rates of the fine-tuning editors: the official recipe's lr * batch / 256 (``lora_main.py``), times a
multiplier that the shared dev search (`lmlab.core.training.lr_search.search_lr`, the same rule for LoRA and FT)
picks: each trial trains a fresh copy on one increment of the GeoBigEdit *dev* split and scores that increment's
held-out rephrases (test facts never choose); a choice on the grid's edge extends it. LoRA-Merge trains at LoRA's lr,
as the official configs do. The paper's increments hold ~1000x more optimiser steps than these, so its per-step rate
need not move the model here: a gated check asks that each fine-tuned editor's edit accuracy beats the unedited
model's.

Claim checks, after the last increment, all paired by fact: `rag_best` (RAG's edit accuracy on the last increment
and retention of the earlier ones above the best other editor's), `merge_best_parametric` (LoRA-Merge's locality
and general ability above the best other parametric editor's; its retention above LoRA's and FT's), `rome_degrades`
(ROME's last-increment edit accuracy far above the unedited model's, while the first increment's facts lose
accuracy and locality, and the general facts lose accuracy, from right after the first increment to after the last),
`mhop_low` (RAG's multi-hop accuracy above every parametric editor's), `trained` (LoRA's, LoRA-Merge's and FT's
edit accuracy on the last increment above the unedited model's: training moved the model, so their locality and
general scores are not the unedited model's by default). Which checks run depends on the editors in `methods`.
Reported: RAG with its fact shots against the plain shots (edit accuracy, retention). Mechanism: ROME's rank-one
update reproduces v* at its key (relative residual < 1e-4).
"""

from __future__ import annotations

import copy
import io
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lmlab.core.training.lr_search import LrSearch, search_lr
from lmlab.methods.analysis.wikibigedit.baselines import (
    FEWSHOT_FACTS,
    FTEditor,
    LoRAEditor,
    RAGEditor,
    hashing_embedder,
    minilm_embedder,
)
from lmlab.methods.analysis.wikibigedit.config import FINE_TUNED, LR_BATCH_REF, PARAMETRIC
from lmlab.methods.analysis.wikibigedit.locate_edit import (
    MEMITEditor,
    ROMEEditor,
    compute_covariance,
    context_prefixes,
    context_templates,
)
from lmlab.methods.analysis.wikibigedit.method import (
    FEWSHOT,
    Editor,
    EditRecord,
    IncrementResult,
    decoder_layers,
    evaluate_facts,
    known_before,
    make_reference,
    run_lifelong,
    score_answers,
)
from lmlab.results import Claim

RESIDUAL_TOL = 1e-4  # ROME's (W + dW) k* = v*, float32 weights after a float64 update
RAG_PLAIN, RAG_FACTS = "rag_plain_shots", "rag_fact_shots"  # RAG re-scored with the shots it did not run with
CURVE_METRICS = ("edit", "retention", "rephrase", "persona", "mhop", "locality", "general")
FLUENCY_CHARS = 400  # HumanEval prompts are cut to their first characters (about 100 tokens): budget


def build_geobigedit(
    increments: int = 4,
    edits_per_increment: int = 16,
    seed: int = 0,
    model: Any = None,
    tokenizer: Any = None,
    *,
    split: str = "test",
    path: str | Path | None = None,
) -> list[dict[str, Any]]:
    """The GeoBigEdit stream as WikiBigEdit-schema records (optionally written as JSONL to `path`).

    With a `model` (and its `tokenizer`) the pre-edit filtering of ``filter_edits`` runs (records the model already
    answers are dropped) and every record gets ``loc_pred``: the unedited model's argmax tokens on its locality
    question, the reference of the locality metric.
    """
    from lmlab import data

    examples = data.load("geobigedit", None, seed=seed, split=split, increments=increments,
                         edits_per_increment=edits_per_increment)  # fmt: skip
    records = [{"id": e.id, **e.meta} for e in examples]
    if model is not None:
        if tokenizer is None:
            raise ValueError("build_geobigedit needs the model's tokenizer to filter and to record loc_pred")
        recs = [EditRecord.from_example(e) for e in examples]
        known = known_before(model, tokenizer, recs)
        ref = make_reference(model, tokenizer, recs, [], [])
        records = [
            {**r, "loc_pred": list(ref.loc_pred.get((r["loc"], r["loc_ans"]), ()))}
            for r, k in zip(records, known)
            if not k
        ]
    if path is not None:
        Path(path).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return records


def scaled_lr(cfg: Any, name: str) -> float:
    """The official recipe's rate of a fine-tuning editor (``lora_main.py``: ``lr * batch_size / 256``) before the
    dev search's multiplier; LoRA-Merge has LoRA's (the official merge configs keep LoRA's lr)."""
    if name not in FINE_TUNED:
        raise ValueError(f"only {', '.join(FINE_TUNED)} have a searched learning rate, got {name!r}")
    base = cfg.ft_lr if name == "ft" else cfg.lora_lr
    return base * (cfg.lora_batch / LR_BATCH_REF if cfg.lora_lr_batch_scaling else 1.0)


def search_editor_lrs(cfg: Any, dev_score: Callable[[str, float], float]) -> dict[str, LrSearch]:
    """The dev search of each fine-tuning editor's lr, the same rule for LoRA and FT (`search_lr`).

    `dev_score(name, lr)`: lower is better (the experiment: 1 - token accuracy on the dev increment's held-out
    rephrases after training on it). The grid is `scaled_lr` times `cfg.lr_search`, extended past an edge at its own
    ratio there up to `cfg.lr_max_extensions` times. LoRA-Merge has no search of its own: it trains at LoRA's lr (one
    search when either LoRA editor runs). Returns {"lora" / "ft": its search}.
    """
    names = [n for n in ("lora", "ft") if n in cfg.methods or (n == "lora" and "lora_merge" in cfg.methods)]
    out = {}
    for name in names:
        grid = [scaled_lr(cfg, name) * float(m) for m in cfg.lr_search]
        out[name] = search_lr(lambda lr, name=name: dev_score(name, lr), grid, max_extensions=cfg.lr_max_extensions)
    return out


def _editor(name: str, cfg: Any, base: Any, tok: Any, shared: dict[str, Any]) -> Editor:
    """A fresh editor on its own copy of the unedited model (RAG shares it: it never changes weights).

    The fine-tuning editors train at ``shared["lr"][name]`` (the dev search's choice; LoRA-Merge takes LoRA's), or at
    the recipe's `scaled_lr` when no search ran."""
    if name == "rag":
        if "embed" not in shared:
            shared["embed"] = minilm_embedder() if cfg.retriever == "minilm" else hashing_embedder()
        shots = FEWSHOT_FACTS if cfg.rag_fact_shots else FEWSHOT
        return RAGEditor(base, tok, shared["embed"], top_k=cfg.rag_top_k, shots=shots)
    model = copy.deepcopy(base)
    value_kw = dict(steps=cfg.rome_steps, lr=cfg.rome_lr, weight_decay=cfg.rome_weight_decay,
                    clamp_norm_factor=cfg.rome_clamp, kl_factor=cfg.rome_kl)  # fmt: skip
    if name in FINE_TUNED:
        searched = "lora" if name == "lora_merge" else name
        lr = shared.get("lr", {}).get(searched, scaled_lr(cfg, searched))
    if name in ("lora", "lora_merge"):
        return LoRAEditor(model, tok, rank=cfg.lora_rank, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout, lr=lr,
                          epochs=cfg.lora_epochs, batch_size=cfg.lora_batch, seed=cfg.seed,
                          merge_alpha=cfg.merge_alpha if name == "lora_merge" else None)  # fmt: skip
    if name == "ft":
        return FTEditor(model, tok, layers=shared["ft_layers"], lr=lr, epochs=cfg.lora_epochs,
                        batch_size=cfg.lora_batch, seed=cfg.seed)  # fmt: skip
    if name == "rome":
        cov = shared["covs"][cfg.rome_layer] if cfg.rome_mom2 else None
        return ROMEEditor(model, tok, layer=cfg.rome_layer, templates=shared["templates"], r_rome=cfg.r_rome, cov=cov,
                          **value_kw)  # fmt: skip
    if name == "memit":
        return MEMITEditor(model, tok, layers=list(cfg.memit_layers), templates=shared["templates"],
                           covs=shared["covs"], lam=cfg.memit_lambda, **value_kw)  # fmt: skip
    raise ValueError(f"unknown editor {name!r}")


def _dev_lr_search(ctx: Any, cfg: Any, model: Any, tok: Any, shared: dict[str, Any], prefix: str) -> None:
    """Run `search_editor_lrs` on one increment of the GeoBigEdit dev split; ``shared["lr"]`` gets the choices.

    A trial: a fresh editor (its own copy of the unedited model) applies the dev increment (minus the edits the
    model already answers, as on test), then the dev facts' rephrases are scored (teacher-forced token accuracy,
    the run's shots): held-out wordings of what it trained on. Records the table ``lr_search`` and, for a choice
    still on an edge of its grid, the flag ``lr_still_on_edge``."""
    stream = ctx.data("geobigedit", None, split="dev", increments=1, edits_per_increment=cfg.lr_dev_edits)
    dev = [EditRecord.from_example(e) for e in stream]
    if cfg.filter_known:
        known = known_before(model, tok, dev, prefix=prefix, batch_size=cfg.batch_size)
        dev = [r for r, k in zip(dev, known) if not k]
    dev = [r for r in dev if r.rephrase]
    if not dev:
        raise ValueError("the GeoBigEdit dev increment has no edit left to choose a learning rate on")
    t0 = time.perf_counter()

    def dev_score(name: str, lr: float) -> float:
        editor = _editor(name, cfg, model, tok, {**shared, "lr": {name: lr}})
        editor.apply(dev)
        scored = score_answers(editor.model, tok, [r.rephrase for r in dev], [r.alt for r in dev], prefix=prefix,
                               batch_size=cfg.batch_size)  # fmt: skip
        return 1.0 - float(np.mean([sc.token_acc for sc in scored]))

    searches = search_editor_lrs(cfg, dev_score)
    shared["lr"] = {name: res.chosen for name, res in searches.items()}
    rows = [{"editor": name, "lr": lr, "multiplier": round(lr / scaled_lr(cfg, name), 6),
             "dev_rephrase_acc": round(1.0 - score, 4), "extension": ext, "chosen": lr == res.chosen}
            for name, res in searches.items() for lr, score, ext in res.tried]  # fmt: skip
    if rows:
        ctx.table("lr_search", rows)
        ctx.flag("lr_search", {name: {"lr": res.chosen, "multiplier": round(res.chosen / scaled_lr(cfg, name), 6),
                                      "edge": res.edge, "dev_edits": len(dev)}
                               for name, res in searches.items()})  # fmt: skip
        ctx.record_value("lr_search", "time", time.perf_counter() - t0, unit="s", note=f"{len(rows)} dev trials")
    edges = {name: res.edge for name, res in searches.items() if res.edge}
    if edges:
        ctx.flag("lr_still_on_edge", edges)


def _check_model(model: Any, cfg: Any) -> None:
    """One-line errors for a model the chosen editors cannot edit (checked before any editor runs)."""
    from lmlab.methods.analysis.wikibigedit.method import check_editable, check_layers

    if any(m in cfg.methods for m in ("lora", "lora_merge")):
        names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
        if not {"q_proj", "v_proj"} <= names:
            raise ValueError(f"LoRA targets q_proj and v_proj, which {type(model).__name__} does not have")
    for m, layers, field in (("rome", [cfg.rome_layer], "rome_layer"), ("memit", cfg.memit_layers, "memit_layers"),
                             ("ft", cfg.ft_layers, "ft_layers")):  # fmt: skip
        if m in cfg.methods:
            check_editable(model, m.upper())
            if layers is not None:
                check_layers(model, [int(x) for x in layers], field)


def _split_by_increment(records: Sequence[EditRecord]) -> list[list[EditRecord]]:
    groups: dict[int, list[EditRecord]] = {}
    for r in records:
        groups.setdefault(r.increment, []).append(r)
    return [groups[t] for t in sorted(groups)]


def _curve_row(name: str, res: IncrementResult) -> dict[str, Any]:
    def mean(metric: str, keys: Sequence[str]) -> float | None:
        vals = [res.scores.get(metric, {}).get(k) for k in keys]
        vals = [v for v in vals if v is not None]
        return round(float(np.mean(vals)), 4) if vals else None

    every = res.current + res.past
    return {
        "method": name,
        "increment": res.increment,
        "n_edits": res.n_edits,
        "edit": mean("edit", res.current),
        "retention": mean("edit", res.past),
        "rephrase": mean("rephrase", every),
        "persona": mean("persona", every),
        "mhop": mean("mhop", every),
        "locality": mean("locality", every),
        "general": round(float(np.mean(res.general)), 4) if res.general else None,
        "fluency": round(float(np.mean(res.fluency)), 4) if res.fluency else None,
        "edit_s": round(res.edit_s, 2),
        "eval_s": round(res.eval_s, 2),
    }


def _record_final(ctx: Any, name: str, results: list[IncrementResult], facts: dict[str, EditRecord]) -> None:
    """This editor's per-fact values after the last increment (paired across editors by fact key order)."""
    last, first = results[-1], results[0]
    every = sorted(last.current + last.past)

    def rec(metric: str, system: str, keys: Sequence[str], src: IncrementResult, score: str, note: str) -> None:
        vals = [src.scores.get(score, {}).get(k) for k in keys]
        if keys and all(v is not None for v in vals):
            ctx.record(system, metric, vals, note=note)

    rec("edit_acc", name, sorted(last.current), last, "edit", "token accuracy on the last increment's edits")
    rec("edit_exact", name, sorted(last.current), last, "exact", "every answer token argmax, last increment")
    rec("retention", name, sorted(last.past), last, "edit", "token accuracy on earlier increments' latest values")
    for metric in ("rephrase", "persona", "locality"):
        rec(metric, name, every, last, metric, "all facts after the last increment")
    with_mhop = sorted(k for k in every if facts[k].mhop)
    rec("mhop", name, with_mhop, last, "mhop", "facts with a multi-hop question, after the last increment")
    if "retrieval_hit" in last.scores:
        rec("retrieval_hit", name, every, last, "retrieval_hit", "the fact's own memory entry ranked first (src)")
    if last.general:
        ctx.record(name, "general", last.general, note="held-out unedited facts after the last increment")
    if last.fluency:
        ctx.record(name, "fluency_logprob", last.fluency, unit="nats", note="mean token log-prob of HumanEval prompts")
    if len(results) >= 2:
        # the first increment's facts that no later re-edit overwrote: same target right after t=0 and at the end
        # (a re-edit in any later increment, not only the last, makes the fact "current" there)
        later = {k for r in results[1:] for k in r.current}
        keep = sorted(k for k in first.current if k not in later)
        for metric, score in (("first_increment_acc", "edit"), ("first_increment_locality", "locality")):
            rec(metric, f"{name}@after_first", keep, first, score, "right after the first increment")
            rec(metric, f"{name}@after_last", keep, last, score, "after the last increment")
        if first.general:
            ctx.record(f"{name}@after_first", "general", first.general, note="right after the first increment")
            ctx.record(f"{name}@after_last", "general", last.general, note="after the last increment")


def _best_other(ctx: Any, metric: str, me: str, pool: Sequence[str]) -> str | None:
    others = [m for m in pool if m != me and ctx.has(m, metric)]
    return max(others, key=lambda m: float(np.mean(ctx.values(m, metric)))) if others else None


def _claims(ctx: Any, cfg: Any) -> list[Claim]:
    ms = list(cfg.methods)
    claims: list[Claim] = []
    if "rag" in ms:
        for metric, what in (("edit_acc", "edit accuracy on the last increment"), ("retention", "retention")):
            best = _best_other(ctx, metric, "rag", ms)
            if best and ctx.has("rag", metric):
                claims.append(Claim(metric, "rag", best, ">", text=f"rag_best: RAG's {what} is above the best other "
                                    f"editor's ({best}), paired by fact"))  # fmt: skip
        for m in ms:
            if m in PARAMETRIC and ctx.has("rag", "mhop") and ctx.has(m, "mhop"):
                claims.append(Claim("mhop", "rag", m, ">", text=f"mhop_low: {m}'s multi-hop accuracy is below RAG's"))
        # reported: the same memory scored after shots with and without "Fact:" lines (one of them is "rag")
        with_facts, plain = ("rag", RAG_PLAIN) if cfg.rag_fact_shots else (RAG_FACTS, "rag")
        for metric, what in (("edit_acc", "edit accuracy on the last increment"), ("retention", "retention")):
            if ctx.has(with_facts, metric) and ctx.has(plain, metric):
                text = f"rag_shots: RAG's {what} after shots that show a fact in use is above its plain-shot value"
                claims.append(Claim(metric, with_facts, plain, ">", gate=False, text=text))
    for m in FINE_TUNED:
        if m in ms and ctx.has(m, "edit_acc") and ctx.has("pre_edit", "edit_acc"):
            claims.append(Claim("edit_acc", m, "pre_edit", ">", text=f"trained: {m}'s edit accuracy on the last "
                                "increment is above the unedited model's (training moved the model)"))  # fmt: skip
    if "lora_merge" in ms:
        params = [m for m in ms if m in PARAMETRIC]
        for metric in ("locality", "general"):
            best = _best_other(ctx, metric, "lora_merge", params)
            if best and ctx.has("lora_merge", metric):
                claims.append(Claim(metric, "lora_merge", best, ">", text=f"merge_best_parametric: LoRA-Merge's "
                                    f"{metric} is above the best other parametric editor's ({best})"))  # fmt: skip
        for m in ("lora", "ft"):
            if m in ms and ctx.has("lora_merge", "retention") and ctx.has(m, "retention"):
                claims.append(Claim("retention", "lora_merge", m, ">", text=f"merge_best_parametric: LoRA-Merge "
                                    f"retains past increments better than {m}"))  # fmt: skip
    for m in ("rome", "memit"):
        if m not in ms:
            continue
        gate = m == "rome"  # the paper's ROME claim; MEMIT's is reported beside it
        if ctx.has(m, "edit_acc"):
            claims.append(Claim("edit_acc", m, "pre_edit", ">", min_effect=cfg.min_effect, gate=gate,
                                text=f"{m}_degrades: {m.upper()}'s edit accuracy on the current increment is high "
                                     f"(above the unedited model's by > {cfg.min_effect:g})"))  # fmt: skip
        for metric, what in (("first_increment_acc", "accuracy"), ("first_increment_locality", "locality"),
                             ("general", "general-fact accuracy")):  # fmt: skip
            a, b = f"{m}@after_first", f"{m}@after_last"
            if ctx.has(a, metric) and ctx.has(b, metric):
                whose = "" if metric == "general" else " of the first increment's facts"
                text = f"{m}_degrades: {what}{whose} falls from right after the first increment to the end"
                claims.append(Claim(metric, a, b, ">", gate=gate, text=text))
        if m == "rome" and ctx.has("rome", "rank_one_residual"):
            claims.append(
                Claim(
                    "rank_one_residual",
                    "tolerance",
                    "rome",
                    ">",
                    mechanism=True,
                    text="ROME's rank-one update maps k* to v* (relative residual below 1e-4)",
                )
            )
    return claims


def _figure(rows: list[dict[str, Any]], cfg: Any, n_facts: int) -> bytes:
    import matplotlib.pyplot as plt

    from lmlab.core.report.plotting import title_for

    fig, axes = plt.subplots(2, 4, figsize=(13, 5.6))
    for ax, metric in zip(axes.flat, (*CURVE_METRICS, "fluency")):
        for name in dict.fromkeys(r["method"] for r in rows):
            pts = [(r["n_edits"], r[metric]) for r in rows if r["method"] == name and r[metric] is not None]
            if pts:
                style = {"linestyle": "--", "color": "grey"} if name == "pre_edit" else {"marker": "o"}
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name, **style)
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel("edits so far", fontsize=8)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title_for("wikibigedit", str(cfg.model), cfg.seed, n_facts, "lifelong editing, GeoBigEdit"),
                 fontsize=10)  # fmt: skip
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def run(cfg: Any, ctx: Any) -> Any:
    model, tok = ctx.load_model()
    model.eval()
    _check_model(model, cfg)
    n_layers = len(decoder_layers(model))
    shared: dict[str, Any] = {"ft_layers": list(cfg.ft_layers) if cfg.ft_layers is not None
                              else sorted({max(0, n_layers // 2 - 1), n_layers // 2})}  # fmt: skip
    prefix = FEWSHOT if cfg.fewshot else ""
    stream = ctx.data("geobigedit", None, increments=cfg.increments, edits_per_increment=cfg.edits_per_increment,
                      reedit_fraction=cfg.reedit_fraction)  # fmt: skip
    general = ctx.data("geobigedit", None, kind="general", increments=cfg.increments,
                       edits_per_increment=cfg.edits_per_increment, reedit_fraction=cfg.reedit_fraction)  # fmt: skip
    general = general[: cfg.n_general]
    fluency = [e.prompt[:FLUENCY_CHARS] for e in ctx.data("humaneval", cfg.n_fluency)] if cfg.n_fluency else []
    records = [EditRecord.from_example(e) for e in stream]
    t0 = time.perf_counter()
    if cfg.filter_known:
        known = known_before(model, tok, records, prefix=prefix, batch_size=cfg.batch_size)
        dropped = [r.key for r, k in zip(records, known) if k]
        records = [r for r, k in zip(records, known) if not k]
        ctx.flag("filtered_known", {"dropped": len(dropped), "kept": len(records), "keys": dropped})
    if not records:
        raise ValueError("every GeoBigEdit edit was already known to the model before editing; nothing to edit")
    ref = make_reference(model, tok, records, [(e.prompt, e.target) for e in general], fluency, prefix=prefix,
                         batch_size=cfg.batch_size)  # fmt: skip
    increments = _split_by_increment(records)
    facts = {r.key: r for r in records}  # the latest record of each fact
    ctx.flag("stream", {"increments": len(increments), "edits": len(records), "facts": len(facts),
                        "tags": {t: sum(r.tag == t for r in records) for t in sorted({r.tag for r in records})},
                        "timestamps": sorted({e.meta["timestamp"] for e in stream})})  # fmt: skip
    if "rome" in cfg.methods or "memit" in cfg.methods:
        prefixes = context_prefixes(model, tok, cfg.rome_templates, cfg.rome_template_tokens, seed=cfg.seed)
        shared["templates"] = context_templates(prefixes)
        ctx.flag("context_templates", shared["templates"])
        need = sorted(set(cfg.memit_layers if "memit" in cfg.methods else []) |
                      ({cfg.rome_layer} if "rome" in cfg.methods and cfg.rome_mom2 else set()))  # fmt: skip
        if need:
            t_cov = time.perf_counter()
            texts = [e.prompt for e in ctx.data("corpus", cfg.cov_samples, split="train")]
            shared["covs"] = compute_covariance(model, tok, need, texts, max_tokens=cfg.cov_tokens)
            note = f"{len(texts)} corpus passages x <= {cfg.cov_tokens} tokens, layers {need}"
            ctx.record_value("covariance", "time", time.perf_counter() - t_cov, unit="s", note=note)
    ctx.record_value("pre_edit", "setup_time", time.perf_counter() - t0, unit="s")
    if any(m in FINE_TUNED for m in cfg.methods):
        _dev_lr_search(ctx, cfg, model, tok, shared, prefix)

    # the unedited model: the reference every "edits changed something" check compares with
    pre = Editor(model, tok)
    order = [r.key for r in records]
    rows: list[dict[str, Any]] = []
    seen: dict[str, EditRecord] = {}  # each fact's value as of increment t (a later re-edit is not known yet)
    pre_results = []
    for t, batch in enumerate(increments):
        seen.update({r.key: r for r in batch})
        cur = {r.key for r in batch}
        scores, gen, flu = evaluate_facts(pre, list(seen.values()), ref, prefix=prefix, batch_size=cfg.batch_size)
        res = IncrementResult(t, len(seen), [k for k in seen if k in cur], [k for k in seen if k not in cur], scores,
                              gen, flu, 0.0, 0.0)  # fmt: skip
        pre_results.append(res)
        rows.append(_curve_row("pre_edit", res))
    _record_final(ctx, "pre_edit", pre_results, facts)

    samples: list[dict[str, Any]] = []
    for name in ctx.progress(cfg.methods, "editors"):
        editor = _editor(name, cfg, model, tok, shared)
        shots = editor.shots if cfg.fewshot else ""
        results = run_lifelong(editor, increments, ref, prefix=shots, batch_size=cfg.batch_size)
        rows += [_curve_row(name, r) for r in results]
        _record_final(ctx, name, results, facts)
        if isinstance(editor, RAGEditor) and cfg.fewshot:
            # the other shots on the same memory after the last increment: what the fact demonstrations add
            other, other_shots = (RAG_PLAIN, FEWSHOT) if cfg.rag_fact_shots else (RAG_FACTS, FEWSHOT_FACTS)
            last = results[-1]
            scores, gen, flu = evaluate_facts(editor, [facts[k] for k in last.current + last.past], ref,
                                              prefix=other_shots, batch_size=cfg.batch_size)  # fmt: skip
            res = IncrementResult(last.increment, last.n_edits, last.current, last.past, scores, gen, flu, 0.0, 0.0)
            rows.append(_curve_row(other, res))
            _record_final(ctx, other, [res], facts)
        ctx.record_value(name, "edit_time", sum(r.edit_s for r in results), unit="s")
        ctx.record_value(name, "eval_time", sum(r.eval_s for r in results), unit="s")
        if isinstance(editor, ROMEEditor) and editor.residuals:
            ctx.record("rome", "rank_one_residual", editor.residuals, note="|(W + dW) k - v*| / |v*| per edit")
            ctx.record("tolerance", "rank_one_residual", [RESIDUAL_TOL] * len(editor.residuals))
        if isinstance(editor, RAGEditor) and editor.queries:
            ctx.record_value("rag", "retrieval_ms_per_query", 1000 * editor.retrieval_s / editor.queries, unit="ms")
            prompt_tok = np.mean([len(tok(f"Fact: {facts[k].sentence}\n")["input_ids"]) for k in order])
            ctx.record_value("rag", "extra_prompt_tokens", float(prompt_tok), note="retrieved fact per query")
        last = results[-1]
        for k in order:
            if k in last.scores.get("edit", {}):
                samples.append({"method": name, "key": k, "tag": facts[k].tag, "increment": facts[k].increment,
                                "src": facts[k].src, "alt": facts[k].alt,
                                **{m: last.scores[m].get(k) for m in last.scores}})  # fmt: skip
        for r in results:
            ctx.flag(f"{name}_increment_{r.increment}", r.info)
        del editor
    ctx.table("curves", rows)
    ctx.add_samples(samples)
    ctx.add_figure("lifelong_curves", _figure(rows, cfg, len(facts)))
    ctx.note(
        f"GeoBigEdit test stream: {len(records)} edits of {len(facts)} facts in {len(increments)} increments "
        f"({', '.join(f'{t}: {n}' for t, n in ctx.flags['stream']['tags'].items())}). Scores are teacher-forced token "
        "accuracies of the answer after 3 fixed shots; locality is agreement with the unedited model's argmax tokens; "
        "every CI resamples facts (edits)."
    )
    return ctx.finish(_claims(ctx, cfg))
