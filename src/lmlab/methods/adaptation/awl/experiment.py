"""Reproduction: AWL vs the base model, WKL (stage 1) alone and tool-only SFT, on two tool domains.

Paper claim (Lyu et al., ICML 2025): fine-tuning on tool-derived solutions (World Knowledge Learning) and then on a
mix where the problems the WKL model already solves are answered directly and the rest with tool traces (Tool Usage
Adaptation) raises answer accuracy (+29.11%) and balanced tool-usage accuracy (+12.72%) over the base model; models
trained on tool traces alone over-rely on tools.

Data. Task-bank train / test splits (`lmlab.data.taskbank`): ``arithmetic`` (1-digit add / sub, 2-digit add,
2- and 3-digit mul; tool ``calculator[expr]``) and ``geography`` (capitals; tool ``lookup[country, capital]``,
GeoNames facts). Every training problem's solution comes from running its tool (`lmlab.core.execution.tools`): the tool
trace, and its tool-free rewrite ("386 * 275 = 106150. Answer: 106150"; the paper's teacher rewrite, by template);
traces whose tool output is graded wrong are dropped.

Systems (same model, data, seeds; top `train_layers` blocks fine-tuned over one cached frozen trunk):
``wkl`` = stage 1 (no-tool prompt -> solution, `stage1_steps`); ``awl`` = stage 2 from the WKL weights on the
mixed data (WKL again + easy -> ``Action: answer_question`` + solution + hard -> tool trace; easy = the WKL model
answers the training problem correctly, greedy, without tools; minority repeated), `stage2_steps`;
``tool_only`` = a fresh copy trained on tool traces for every problem for `stage1_steps + stage2_steps` steps;
``base`` = the model untouched.

Evaluation (held-out test items are the unit, paired across systems): each system answers every item without
tools (greedy) and with tools (ReAct decoding: a turn stops at ``Observation:``; a tool call is executed through
lmlab's tools and the model continues, <= `max_turns` turns). Test easy / hard is each system's own no-tool
correctness. Metrics: no-tool and tool-available answer accuracy, tool-call rate, and tool-usage accuracy
TUA = ½ P(no tool | easy) + ½ P(tool | hard). TUA is a ratio (its class sizes are random), so its CIs and claims
resample the items' (no-tool correct, used tool) records and recompute each system's easy / hard counts and TUA on the
drawn items (`metric.tua_bootstrap_ci`, `metric.compare_tua`), not a mean of per-item scores with fixed weights.

Claims (gated): TUA of AWL above base, WKL and tool-only; no-tool accuracy of AWL above base; tool-call rate of AWL
below tool-only. Reported: tool-available accuracy of AWL vs tool-only and vs base, no-tool accuracy of WKL vs base
(world knowledge learnt from tool-derived solutions). The ``power`` flag gives, per gated check, the items it needs to
find the paper's effect with 80% power (from this run's per-item spread) and the items it has.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from lmlab.methods.adaptation.awl.method import (
    Problem,
    balance_repeat,
    extract_answer,
    problem_from_example,
    render_prompt,
    run_with_tools,
    train_awl,
    train_tool_only,
)
from lmlab.methods.adaptation.awl.metric import (
    compare_tua,
    n_for_power,
    tool_usage_accuracy,
    tua_bootstrap_ci,
    tua_influence,
)
from lmlab.results import Claim, ClaimResult, MetricRow, claim_result

# (task, digits) of the arithmetic domain: easy (1-digit add / sub) to hard (3-digit products)
ARITH_MIX: tuple[tuple[str, int], ...] = (("add", 1), ("sub", 1), ("add", 2), ("mul", 2), ("mul", 3))
DOMAIN_TOOLS = {"arithmetic": "calculator", "geography": "lookup"}
# the paper's gains over the base model [abstract], the effects the power statement is sized for
PAPER_TUA_GAIN = 0.1272  # +12.72% tool-usage accuracy
PAPER_ACC_GAIN = 0.2911  # +29.11% answer accuracy
TUA_BASELINES = (("tool_only", "tool-only SFT"), ("wkl", "WKL (stage 1) alone"), ("base", "the base model"))


def build_problems(ctx: Any, cfg: Any, split: str, n: int) -> list[Problem]:
    """`n` problems per domain of `cfg.domains` from the task bank's `split` (arithmetic tasks interleaved)."""
    out: list[Problem] = []
    for domain in cfg.domains:
        if domain == "arithmetic":
            per = -(-n // len(ARITH_MIX))
            chunks = [ctx.data("taskbank", per, split=split, domain="arithmetic", task=t, digits=d, n_choices=0)
                      for t, d in ARITH_MIX]  # fmt: skip
            exs = [c[i] for i in range(per) for c in chunks if i < len(c)][:n]
        else:
            exs = ctx.data("taskbank", None, split=split, domain="geography", task="capital", n_choices=0)[:n]
        out += [problem_from_example(e) for e in exs]
    if not out:
        raise ValueError(f"no {split} problems for domains {cfg.domains} (check n_train / n_test and --limit)")
    return out


def _grade(example: Any, text: str) -> float:
    from lmlab.data.taskbank import grade

    return grade(example, text)


def _no_tool_answers(model: Any, tok: Any, problems: Sequence[Problem], cfg: Any, ctx: Any, name: str) -> list[str]:
    from lmlab.core.inference.generation import decode_batch

    prompts = [render_prompt(tok, "no_tools", p.question) for p in problems]
    outs = decode_batch(model, tok, prompts, max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size,
                        meter=ctx.meter, meter_name=name)  # fmt: skip
    return [o.text for o in outs]


def run(cfg: Any, ctx: Any) -> Any:
    from lmlab.core.training.partial import policy_model
    from lmlab.data.tools import default_tools

    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    tools = default_tools([DOMAIN_TOOLS[d] for d in cfg.domains])
    train_all = build_problems(ctx, cfg, "train", cfg.n_train)
    test = build_problems(ctx, cfg, "test", cfg.n_test)
    model, tok = ctx.load_model()
    n_layers = len(model.model.layers)
    if cfg.train_layers > n_layers:
        raise ValueError(f"train_layers must be <= {n_layers} (the blocks of {cfg.model}), got {cfg.train_layers}")
    timings["data_and_load_s"] = time.perf_counter() - t0

    # WKL -> easy/hard by the WKL model -> mixed TUA data, from the WKL weights
    t = time.perf_counter()
    awl_run = train_awl(model, tok, train_all, tools, grade=_grade, train_layers=cfg.train_layers,
                        stage1_steps=cfg.stage1_steps, stage2_steps=cfg.stage2_steps, batch=cfg.train_batch,
                        lr=cfg.lr, warmup_ratio=cfg.warmup_ratio, balance=cfg.balance,
                        max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size, seed=cfg.seed,
                        meter=ctx.meter)  # fmt: skip
    timings["awl_train_s"] = time.perf_counter() - t
    train, easy, hard = awl_run.problems, awl_run.easy, awl_run.hard
    losses = dict(awl_run.losses)
    ctx.flag("traces", {"train_problems": len(train_all), "kept": len(train), "test_problems": len(test)})
    e_rep, h_rep = balance_repeat(easy, hard) if cfg.balance == "repeat" else (easy, hard)
    by_dom: dict[str, dict[str, int]] = defaultdict(lambda: {"easy": 0, "hard": 0})
    for c, p in zip(awl_run.correct, train):
        by_dom[p.domain]["easy" if c else "hard"] += 1
    ctx.flag("train_split", {"easy": len(easy), "hard": len(hard), "by_domain": dict(by_dom),
                             "stage2_direct": len(e_rep), "stage2_tool": len(h_rep),
                             "balance": cfg.balance})  # fmt: skip
    ctx.flag("train_sequences", awl_run.cache.n)
    ctx.record_value("awl", "train_easy_share", len(easy) / len(train),
                     note="training problems the WKL model solves without tools (TUA-easy)")  # fmt: skip
    if "base" in cfg.systems:
        # world knowledge learnt from the tool-derived solutions: the training facts, without tools, before / after
        t = time.perf_counter()
        base_train = _no_tool_answers(model, tok, train, cfg, ctx, "base:train")
        ctx.record("base", "train_acc_no_tools", [_grade(p.example, extract_answer(a)) for p, a in
                                                   zip(train, base_train)],
                   note="training problems answered correctly without tools (the facts WKL trains on)")  # fmt: skip
        ctx.record("wkl", "train_acc_no_tools", [float(c) for c in awl_run.correct],
                   note="training problems answered correctly without tools by the WKL model (the split)")  # fmt: skip
        timings["base_train_probe_s"] = time.perf_counter() - t

    models: dict[str, Any] = {"base": model, "wkl": awl_run.full_model(model, "wkl"),
                              "awl": awl_run.full_model(model, "awl")}  # fmt: skip
    if "tool_only" in cfg.systems:
        # the same problems, cache and total steps as AWL's two stages, from the untouched model
        t = time.perf_counter()
        tool_only, losses["tool_only"] = train_tool_only(awl_run, steps=cfg.stage1_steps + cfg.stage2_steps,
                                                         batch=cfg.train_batch, lr=cfg.lr,
                                                         warmup_ratio=cfg.warmup_ratio, seed=cfg.seed)  # fmt: skip
        models["tool_only"] = policy_model(model, tool_only)
        timings["tool_only_s"] = time.perf_counter() - t

    # evaluation on the held-out items, both settings
    t = time.perf_counter()
    systems = [s for s in cfg.systems if s in models]
    tool_prompts = [render_prompt(tok, "tools", p.question, tools) for p in test]
    per_item: dict[str, dict[str, list[float]]] = {}
    samples = []
    for system in ctx.progress(systems, "no-tool and tool answers per system"):
        m = models[system]
        plain = _no_tool_answers(m, tok, test, cfg, ctx, f"{system}:no_tools")
        traces = run_with_tools(m, tok, tool_prompts, tools, max_turns=cfg.max_turns,
                                max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size, meter=ctx.meter,
                                meter_name=f"{system}:tools")  # fmt: skip
        acc_nt = [_grade(p.example, extract_answer(a)) for p, a in zip(test, plain)]
        acc_t = [_grade(p.example, tr.answer) for p, tr in zip(test, traces)]
        used = [float(tr.used_tool) for tr in traces]
        per_item[system] = {"acc_no_tools": acc_nt, "acc_tools": acc_t, "tool_call_rate": used}
        for i, p in enumerate(test):
            samples.append({"system": system, "id": p.id, "domain": p.domain, "difficulty": p.difficulty,
                            "question": p.question, "gold": p.answer, "no_tools": plain[i],
                            "tools": traces[i].text, "calls": traces[i].calls, "correct_no_tools": acc_nt[i],
                            "correct_tools": acc_t[i], "used_tool": bool(used[i])})  # fmt: skip
    timings["eval_s"] = time.perf_counter() - t

    notes = {"acc_no_tools": "answer correct without tools (greedy), per held-out item",
             "acc_tools": "answer correct with tools offered (ReAct, tools executed), per held-out item",
             "tool_call_rate": "first action is a tool call (tools offered), per held-out item"}  # fmt: skip
    for system in systems:
        for metric, vals in per_item[system].items():
            ctx.record(system, metric, vals, note=notes[metric])
    _record_tua(ctx, cfg, systems, per_item)
    ctx.flag("power", _power(systems, per_item))
    _tables(ctx, systems, per_item, test)
    for name, ls in losses.items():
        ctx.record_value(name, "sft_loss_last", ls[-1], note="loss of the last SFT step")
    ctx.flag("sft_steps", {k: len(v) for k, v in losses.items()})
    ctx.flag("timings_s", {k: round(v, 2) for k, v in timings.items()})
    ctx.add_samples(samples)
    _figure(ctx, cfg, systems, len(test))
    ctx.note(
        f"Domains {', '.join(cfg.domains)}; {len(train)} training problems ({len(easy)} easy / {len(hard)} hard by "
        f"the WKL model), {len(test)} held-out; top {cfg.train_layers} of {n_layers} blocks fine-tuned, "
        f"{cfg.stage1_steps} + {cfg.stage2_steps} steps of {cfg.train_batch} (tool-only: "
        f"{cfg.stage1_steps + cfg.stage2_steps}), lr {cfg.lr} cosine; greedy, <= {cfg.max_new_tokens} tokens per "
        f"turn, <= {cfg.max_turns} turns; tools: {', '.join(tools.names)} (lmlab.core.execution.tools)."
    )
    result = ctx.finish(_claims(systems))
    result.claims[:0] = _tua_claims(cfg, systems, per_item)  # first: the headline is the first gated check
    return result


def _record_tua(ctx: Any, cfg: Any, systems: Sequence[str], per_item: dict[str, dict[str, list[float]]]) -> None:
    """Each system's TUA row, its CI from `tua_bootstrap_ci` (items resampled, easy / hard counts and TUA recomputed
    per resample). TUA is not a mean of per-item values, so the row is built here rather than by ``ctx.record``."""
    from lmlab.core.stats.seeding import derive_seed

    for system in systems:
        acc_nt, used = per_item[system]["acc_no_tools"], per_item[system]["tool_call_rate"]
        tua, lo, hi = tua_bootstrap_ci(acc_nt, used, seed=derive_seed(cfg.seed, system, "tool_usage_acc"))
        ctx.metrics.append(MetricRow(system, "tool_usage_acc", tua, lo, hi, len(acc_nt), cfg.seed,
                                     note="½P(no tool|easy) + ½P(tool|hard), easy = the system's own no-tool "
                                     "correctness; CI: items resampled, TUA recomputed"))  # fmt: skip


def _tua_claims(cfg: Any, systems: Sequence[str], per_item: dict[str, dict[str, list[float]]]) -> list[ClaimResult]:
    """TUA of AWL above each baseline, by `compare_tua`: both systems' TUA recomputed on the same resampled items
    (``ctx.finish`` compares means of per-item values, which TUA is not). `null_status`: the baseline against itself
    (its CI is [0, 0], so the check cannot hold)."""
    from lmlab.core.stats.seeding import derive_seed

    out = []
    rec = {s: (per_item[s]["acc_no_tools"], per_item[s]["tool_call_rate"]) for s in systems}
    for b, why in TUA_BASELINES:
        if b not in systems:
            continue
        seed = derive_seed(cfg.seed, "claim", "awl", b, "tool_usage_acc")
        cmp = compare_tua(*rec["awl"], *rec[b], direction=">", seed=seed)
        null = compare_tua(*rec[b], *rec[b], direction=">", seed=seed, min_n=1)
        claim = Claim("tool_usage_acc", "awl", b, ">", text=f"balanced tool-usage accuracy: AWL above {why} (per "
                      "test item)")  # fmt: skip
        out.append(claim_result(claim, cmp, null.status))
    return out


def _power(systems: Sequence[str], per_item: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, Any]]:
    """Per gated check: the items it needs to find the paper's effect with 80% power at the CI's 95% (normal
    approximation; the per-item spread is this run's: TUA's delta-method influence values, or the paired
    differences) and the items it has. The paper gives no effect for the tool-call rate: sized for this run's."""
    from lmlab.core.stats.uncertainty import default_min_n

    n = len(per_item["awl"]["acc_no_tools"])
    out: dict[str, dict[str, Any]] = {}

    def row(sd: float, effect: float, source: str) -> dict[str, Any]:
        # no check decides below `compare`'s min_n (6 at 95%), whatever the spread
        need = max(n_for_power(sd, effect), default_min_n(0.95)) if effect else None
        return {"effect": round(effect, 4), "effect_from": source, "sd_per_item": round(sd, 4), "n_needed": need,
                "n_has": n}  # fmt: skip

    inf_awl = tua_influence(per_item["awl"]["acc_no_tools"], per_item["awl"]["tool_call_rate"])
    for b, _ in TUA_BASELINES:
        if b in systems:
            inf_b = tua_influence(per_item[b]["acc_no_tools"], per_item[b]["tool_call_rate"])
            out[f"tool_usage_acc:awl>{b}"] = row(float(np.std(inf_awl - inf_b)), PAPER_TUA_GAIN, "paper (vs base)")
    if "base" in systems:
        d = np.subtract(per_item["awl"]["acc_no_tools"], per_item["base"]["acc_no_tools"])
        out["acc_no_tools:awl>base"] = row(float(np.std(d)), PAPER_ACC_GAIN, "paper (answer accuracy vs base)")
    if "tool_only" in systems:
        d = np.subtract(per_item["awl"]["tool_call_rate"], per_item["tool_only"]["tool_call_rate"])
        out["tool_call_rate:awl<tool_only"] = row(float(np.std(d)), float(np.mean(d)), "this run (paper: none)")
    return out


def _tables(ctx: Any, systems: Sequence[str], per_item: dict[str, dict[str, list[float]]],
            test: Sequence[Problem]) -> None:  # fmt: skip
    """Per system and domain: accuracies, tool-call rate, the system's own easy share and TUA."""
    rows = []
    domains = sorted({p.domain for p in test})
    for s in systems:
        for d in [*domains, "all"]:
            idx = [i for i, p in enumerate(test) if d in ("all", p.domain)]
            v = per_item[s]
            acc_nt = [v["acc_no_tools"][i] for i in idx]
            used = [v["tool_call_rate"][i] for i in idx]
            easy = [u for a, u in zip(acc_nt, used) if a > 0]
            hard = [u for a, u in zip(acc_nt, used) if a <= 0]
            rows.append({"system": s, "domain": d, "n": len(idx), "acc_no_tools": float(np.mean(acc_nt)),
                         "acc_tools": float(np.mean([v["acc_tools"][i] for i in idx])),
                         "tool_call_rate": float(np.mean(used)), "easy_share": len(easy) / len(idx),
                         "p_no_tool_given_easy": float(1 - np.mean(easy)) if easy else None,
                         "p_tool_given_hard": float(np.mean(hard)) if hard else None,
                         "tool_usage_acc": tool_usage_accuracy(acc_nt, used)})  # fmt: skip
    ctx.table("per_domain", rows)


def _claims(systems: Sequence[str]) -> list[Claim]:
    """The checks on means of per-item values (``ctx.finish``); the TUA checks are `_tua_claims`."""
    claims = []
    if "base" in systems:
        claims.append(Claim("acc_no_tools", "awl", "base", ">",
                            text="no-tool answer accuracy: AWL above the base model (knowledge learnt)"))  # fmt: skip
        claims.append(Claim("acc_tools", "awl", "base", ">", gate=False,
                            text="tool-available answer accuracy: AWL above the base model (reported)"))  # fmt: skip
    if "tool_only" in systems:
        claims.append(Claim("tool_call_rate", "awl", "tool_only", "<",
                            text="tool-call rate: AWL below tool-only SFT (less over-reliance)"))  # fmt: skip
        claims.append(Claim("acc_tools", "awl", "tool_only", ">", gate=False,
                            text="tool-available answer accuracy: AWL vs tool-only SFT (reported; expected about "
                            "equal)"))  # fmt: skip
    if "base" in systems:
        claims.append(Claim("train_acc_no_tools", "wkl", "base", ">", gate=False,
                            text="no-tool accuracy on the training facts: WKL above the base model (world knowledge "
                            "learnt from tool-derived solutions; reported)"))  # fmt: skip
    if "wkl" in systems and "base" in systems:
        claims.append(Claim("acc_no_tools", "wkl", "base", ">", gate=False,
                            text="no-tool answer accuracy: WKL above the base model (world knowledge learnt from "
                            "tool-derived solutions; reported)"))  # fmt: skip
    return claims


def _figure(ctx: Any, cfg: Any, systems: Sequence[str], n: int) -> None:
    from lmlab.core.report.plotting import bar_with_ci, title_for

    for metric, label in (("tool_usage_acc", "tool-usage accuracy"), ("acc_no_tools", "no-tool answer accuracy"),
                          ("acc_tools", "tool-available answer accuracy")):  # fmt: skip
        rows = [m for m in ctx.metrics if m.metric == metric and m.system in systems]
        if rows:
            ctx.add_figure(metric, bar_with_ci(rows, title=title_for("awl", str(cfg.model), cfg.seed, n, label),
                                               ylabel=label, highlight=("awl",)))  # fmt: skip
