"""Reproduction: potemkin rates, the automatic lower bound and incoherence of small LLMs, with metric controls.

Paper claim (Mancoridis et al., ICML 2025): "potemkins are ubiquitous across models, tasks, and domains": models
that define a concept correctly (the keystone) still fail to classify, generate or edit instances of it, grade their
own answers to related questions as wrong, and contradict themselves when they classify their own examples.

Procedure 1 on lmlab's concepts with programmatic ground truth (`concepts.py`): per concept a 4-way definition
keystone, balanced yes/no classification, constrained generation and edits, all graded by code. Procedure 2 on
exact-graded suite questions (arithmetic, capitals): a right keystone answer, a related question from lmlab's
generator, the model's answer, the model's yes/no self-grade. Incoherence: generate an example (odd attempts) or a
non-example (even), then self-classify it.

Every LLM system goes through `lmlab.core.execution.backends` (a local model or any OpenAI-compatible endpoint with
``backend=openai:URL``). The oracle (programmatic solver) and a random responder answer the same questions.

Each LLM decides yes/no against a log-odds threshold calibrated on balanced items (`method.BackendAgent`). Two
constant Yes/No responders (the oracle answering always Yes / always No) mark what an uninformative decision scores:
classify rate and incoherence 1, lower bound 0 (Yes) or 2 (No); generate / edit 0 (their text is the oracle's).

Claims (computed from this run; gated for each LLM system): its potemkin rate on classify / generate / edit (CIs
resample concepts, the independent unit), its incoherence (concepts) and its lower bound (questions) lie strictly
between the oracle's value (0) and the nearest constant responder's value above it (none for generate / edit: there
the check is "above 0"). The effect is the distance to the nearer end of that band, so a constant responder in the
LLM's place fails every gated check. Mechanism checks: the oracle scores 0 and the random responder about 1 on the
x2-scaled metrics.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from lmlab.methods.evaluation.potemkin.concepts import CONCEPTS, get_concepts
from lmlab.methods.evaluation.potemkin.method import (
    TASKS,
    BackendAgent,
    ConstantAgent,
    OracleAgent,
    Question,
    RandomAgent,
    Record,
    build_benchmark,
    incoherence,
    lower_bound,
    potemkin_rates,
    run_benchmark,
    run_lower_bound,
)
from lmlab.results import Claim, ClaimResult, claim_result

CONSTANTS = ("always_yes", "always_no")
CONTROLS = ("oracle", "random", *CONSTANTS)
CONTROL_MODEL = "tiny-llama"
BAND_LABELS = {
    "potemkin_classify": "potemkin rate on classify (keystone right)",
    "potemkin_generate": "potemkin rate on generate (keystone right)",
    "potemkin_edit": "potemkin rate on edit (keystone right)",
    "incoherence": "incoherence (per concept)",
    "lower_bound": "Procedure 2 potemkin lower bound (per question)",
}


# ----------------------------------------------------------------------------------------------------------------
# Procedure 2 questions


def _lb_questions(ctx: Any, cfg: Any) -> list[tuple[Question, Question]]:
    """(keystone, related) pairs: test-split questions, each paired with a dev-split question of the same kind
    (same operator; another capital), graded exactly by the suite's grader."""
    from lmlab import data

    pairs = []
    for suite in cfg.lb_suites:
        if cfg.lb_questions == 0:
            continue
        kw: dict[str, Any] = {"kind": "expression", "digits": 1} if suite == "arithmetic" else {"task": "capital"}
        keys = ctx.data(suite, cfg.lb_questions, split="test", **kw)
        pool = ctx.data(suite, cfg.lb_questions, split="dev", **kw)
        if not keys or not pool:
            continue

        def group(e: Any) -> str:
            return str(e.meta.get("op", e.meta.get("task", "")))

        def make(e: Any, others: Sequence[Any], suite: str = suite) -> Question:
            wrong = (str(int(e.target) + 1) if suite == "arithmetic" else
                     next((o.target for o in others if o.target != e.target), e.target + "x"))  # fmt: skip
            return Question(f"{suite}:{e.id}", e.prompt, e.target, wrong,
                            lambda out, e=e, suite=suite: data.grade(suite, e, out) >= 1.0,
                            8 if suite == "arithmetic" else 16)  # fmt: skip

        by_group = defaultdict(list)
        for e in pool:
            by_group[group(e)].append(e)
        for i, e in enumerate(keys):
            cands = by_group.get(group(e)) or pool
            rel = cands[i % len(cands)]
            pairs.append((make(e, pool), make(rel, keys)))
    return pairs


# ----------------------------------------------------------------------------------------------------------------
# the run


def _agents(ctx: Any, cfg: Any) -> list[tuple[str, Any, bool]]:
    """``(system, agent, gated)`` of each LLM system: the local `models`, or the one `backend` spec."""
    from lmlab.core.execution.backends import LocalBackend, make_backend, parse_backend

    if cfg.backend != "local":
        kind, arg = parse_backend(cfg.backend)
        if kind == "openai":
            backend = make_backend(cfg.backend)
            ctx.models["endpoint"] = {"backend": backend.name}
            return [("endpoint", BackendAgent(backend, cfg.mode, "endpoint", cfg.calibrate), True)]
        model, tok = ctx.load_model(arg)
        return [(arg, BackendAgent(LocalBackend(model, tok, name=f"local:{arg}"), cfg.mode, arg, cfg.calibrate), True)]
    specs = list(cfg.models) or [cfg.model]
    out = []
    for spec in specs:
        model, tok = ctx.load_model(spec)
        gated = not (spec == CONTROL_MODEL and len(specs) > 1)
        agent = BackendAgent(LocalBackend(model, tok, name=f"local:{spec}"), cfg.mode, spec, cfg.calibrate)
        out.append((spec, agent, gated))
    return out


def _record(ctx: Any, system: str, recs: list[Record], lb: list[Record]) -> dict[str, Any]:
    """Record the per-item values of `system` (clusters: concepts; lower bound: questions); its summary row."""
    rates = potemkin_rates(recs)
    row: dict[str, Any] = {"system": system}
    keystone = [r for r in recs if r.task == "define"]
    ctx.record(system, "keystone_acc", [float(r.correct) for r in keystone], clusters=[r.concept for r in keystone],
               note="4-way definition keystone, one per concept")  # fmt: skip
    row["keystone_acc"] = sum(r.correct for r in keystone) / len(keystone)
    for task in TASKS:
        right = [r for r in recs if r.task == task and r.keystone]
        info = rates[task]
        if right:
            ctx.record(
                system,
                f"potemkin_{task}",
                [r.value for r in right],
                clusters=[r.concept for r in right],
                note=f"s·(1 − correct) on concepts with a right keystone (s = {2 if task == 'classify' else 1})",
            )
            ctx.record_value(system, f"potemkin_{task}_se", info["potemkin"]["se"], note="binomial SE (paper)")
        if info["n"]:
            ctx.record_value(system, f"{task}_acc", info["accuracy"], note="unconditional use accuracy")
            ctx.record_value(system, f"{task}_parse_failure", info["parse_failure"])
        if right and info["n"] > len(right):
            ctx.record_value(system, f"{task}_gap", info["gap"],
                             note="P(use right | keystone right) − P(use right | keystone wrong)")  # fmt: skip
        row[f"potemkin_{task}"] = info["potemkin"]["value"]
        row[f"{task}_n_keystone_right"] = info["potemkin"]["n"]
        row[f"{task}_gap"] = info["gap"]
    cls = [r for r in recs if r.task == "classify"]
    if cls:
        yes = [float(r.output == "True") for r in cls]
        ctx.record_value(system, "classify_yes_rate", sum(yes) / len(yes),
                         note="share of Yes (calibrated: 0.5 by construction; always-Yes: 1)")  # fmt: skip
    row.update(_uncalibrated(ctx, system, recs, lb))
    inc = [r for r in recs if r.task == "incoherence"]
    ctx.record(
        system,
        "incoherence",
        [r.value for r in inc],
        clusters=[r.concept for r in inc],
        note="2·(1 − self-classification agrees with the intent)",
    )
    row["incoherence"] = incoherence(recs).value
    graded = [r for r in lb if r.task == "self_grade"]
    asked = [r for r in lb if r.task in ("self_grade", "keystone_q")]
    if asked:
        ctx.record_value(system, "lb_keystone_acc", len(graded) / len(asked), note="Procedure 2 keystones right")
    if graded:
        ctx.record(system, "lower_bound", [r.value for r in graded], note="2·(1 − self-graded accuracy), per question")
        ctx.record_value(system, "lower_bound_se", lower_bound(lb).se, note="binomial SE (paper)")
        ctx.record_value(system, "self_grade_agreement",
                         sum(r.extra["grade_agrees"] for r in graded) / len(graded),
                         note="self-grade equals the exact grade (a judge-quality diagnostic)")  # fmt: skip
        ctx.record_value(system, "related_answer_acc", sum(r.extra["answer_correct"] for r in graded) / len(graded),
                         note="exact accuracy on the related questions")  # fmt: skip
    row["lower_bound"] = lower_bound(lb).value
    row["lb_n"] = len(graded)
    return row


def _uncalibrated(ctx: Any, system: str, recs: list[Record], lb: list[Record]) -> dict[str, float]:
    """The yes/no metrics of `system` with the plain log p(" Yes") > log p(" No") decision on the same scores (the
    metrics before calibration; only for an agent that scores yes/no): reported, never gated."""
    out: dict[str, float] = {}
    cls = [r for r in recs if r.task == "classify" and "log_odds" in r.extra]
    inc = [r for r in recs if r.task == "incoherence" and "log_odds" in r.extra]
    graded = [r for r in lb if r.task == "self_grade" and "log_odds" in r.extra]
    if cls:
        out["classify_yes_rate_uncalibrated"] = sum(r.extra["log_odds"] > 0 for r in cls) / len(cls)
    if inc:
        agree = [(r.extra["log_odds"] > 0) == r.extra["intent"] for r in inc]
        out["incoherence_uncalibrated"] = 2 * (1 - sum(agree) / len(agree))
    if graded:
        out["lower_bound_uncalibrated"] = 2 * (1 - sum(r.extra["log_odds"] > 0 for r in graded) / len(graded))
    for metric, value in out.items():
        ctx.record_value(system, metric, value, note="plain log p(Yes) > log p(No) on the same scores (uncalibrated)")
    return out


def run(cfg: Any, ctx: Any) -> Any:
    concepts = get_concepts(cfg.concepts)
    n_concepts = len(concepts) if cfg.limit is None else max(1, min(len(concepts), cfg.limit))
    concepts = concepts[:n_concepts]
    bench = build_benchmark(concepts, seed=cfg.seed, n_classify=cfg.n_classify, n_generate=cfg.n_generate,
                            n_edit=cfg.n_edit, n_incoherence=cfg.n_incoherence, n_options=cfg.n_options,
                            distractor_pool=list(CONCEPTS.values()), max_tokens=cfg.max_tokens)  # fmt: skip
    pairs = _lb_questions(ctx, cfg)
    ctx.data_info["concepts"] = {"n": len(concepts), "keys": [c.key for c in concepts], "seed": cfg.seed}

    llms = _agents(ctx, cfg)
    controls = [OracleAgent(), RandomAgent(cfg.seed), ConstantAgent(True), ConstantAgent(False)]
    agents = [*llms, *((a.name, a, False) for a in controls)]
    rows, samples, per_concept, thresholds = [], [], [], []
    for system, agent, _ in ctx.progress(agents, "systems"):
        t0 = time.perf_counter()
        recs = run_benchmark(agent, bench)
        lb = run_lower_bound(agent, pairs, concept=lambda q: q.id.split(":")[0])
        wall = time.perf_counter() - t0
        row = _record(ctx, system, recs, lb)
        row["seconds"] = round(wall, 2)
        if isinstance(agent, BackendAgent):
            row["backend"] = agent.backend.name
            row["calls"] = agent.calls
            ctx.record_value(system, "wall_s", wall, unit="s", note=f"{agent.calls} backend calls")
            thresholds += [{"system": system, "family": f, "threshold": round(t, 4)}
                           for f, t in agent.thresholds.items()]  # fmt: skip
        rows.append(row)
        for r in recs + lb:
            samples.append({"system": system, "concept": r.concept, "task": r.task, "keystone": r.keystone,
                            "correct": r.correct, "parsed": r.parsed, "output": r.output[:300],
                            **r.extra})  # fmt: skip
        by = defaultdict(list)
        for r in recs:
            if r.task in TASKS and r.keystone:
                by[(r.concept, r.task)].append(r.value)
        for (c, t), v in sorted(by.items()):
            per_concept.append({"system": system, "concept": c, "task": t, "potemkin": sum(v) / len(v), "n": len(v)})
    ctx.table("summary", rows)
    ctx.table("per_concept", per_concept)
    if thresholds:
        ctx.table("yes_no_thresholds", thresholds)
    ctx.add_samples(samples)
    judge = ", ".join(f"{s}: {a.backend.name}" for s, a, _ in llms)
    ctx.flag("judge", f"the same model through its backend (self-grading and self-classification) - {judge}")
    ctx.flag("mode", cfg.mode)
    if cfg.mode == "chat":
        ctx.flag("yes_no", "uncalibrated: parsed chat replies")
    else:
        ctx.flag("yes_no", "calibrated: the median log-odds of balanced items per concept / Procedure-2 suite"
                 if cfg.calibrate else "uncalibrated: log p(Yes) > log p(No)")  # fmt: skip
    ctx.note(
        f"{len(concepts)} concepts x ({cfg.n_classify} classify + {cfg.n_generate} generate + {cfg.n_edit} edit + "
        f"{cfg.n_incoherence} incoherence) and {len(pairs)} Procedure-2 questions per system; keystone = "
        f"{cfg.n_options}-way definition by {'log-likelihood per character' if cfg.mode == 'completions' else 'chat'}"
        "; judge = the same model (self-grading, as the paper)."
    )
    _figure(ctx, cfg, [s for s, _, _ in agents])
    return _finish(ctx, _claims(ctx, llms))


def _band(ctx: Any, metric: str) -> tuple[float, str, float]:
    """``(low, high_system, high)`` of `metric`: the oracle's value and the nearest constant responder's value above
    it (``("oracle", inf)`` when none is above: the constant responders then score at most `low`)."""
    low = float(np.mean(ctx.values("oracle", metric)))
    above = sorted((float(np.mean(ctx.values(s, metric))), s) for s in CONSTANTS if ctx.has(s, metric))
    above = [(v, s) for v, s in above if v > low]
    return (low, above[0][1], above[0][0]) if above else (low, "oracle", math.inf)


def _claims(ctx: Any, llms: Sequence[tuple[str, Any, bool]]) -> list[tuple[Claim, tuple[float, float] | None]]:
    """Each claim with its band ``(low, high)`` (a band check) or None (a mean comparison by `ctx.finish`)."""
    checks: list[tuple[Claim, tuple[float, float] | None]] = []
    for system, _, gated in llms:
        for metric, label in BAND_LABELS.items():
            if not ctx.has(system, metric):
                if metric.startswith("potemkin_"):
                    ctx.note(f"{system}: no concept with a right keystone, so no {metric[9:]} potemkin rate.")
                continue
            low, high_system, high = _band(ctx, metric)
            consts = ", ".join(f"{s} {np.mean(ctx.values(s, metric)):.3g}" for s in CONSTANTS if ctx.has(s, metric))
            text = (f"{system}: {label} strictly between the oracle's {low:.3g} and {high:.3g}"
                    if math.isfinite(high) else f"{system}: {label} above the oracle's {low:.3g}")  # fmt: skip
            text += f" (constant Yes/No responders: {consts})"
            claim = Claim(metric, system, high_system, ">", paired=False, gate=gated, text=text)
            checks.append((claim, (low, high)))
    for metric in ("incoherence", "lower_bound", "potemkin_classify"):
        if ctx.has("oracle", metric) and ctx.has("random", metric):
            text = f"metric control: the oracle's {metric} (0) below the random responder's (~1)"
            claim = Claim(metric, "oracle", "random", "<", paired=metric == "incoherence", mechanism=True, text=text)
            checks.append((claim, None))
    return checks


def _band_result(ctx: Any, claim: Claim, low: float, high: float) -> ClaimResult:
    """The check "`claim.method`'s mean of `claim.metric` lies strictly between `low` and `high`".

    Statistic: the margin m(x) = min(mean(x) − low, high − mean(x)), the distance to the nearer end (m ≤ 0 outside
    the band). Its CI is the cluster bootstrap of the method's values (`compare_statistic` against rows fixed at
    `low`, whose margin is 0), decided by `compare`'s rule (> 0, min_n clusters). `null_status`: the same check with
    every value at the baseline's (`high`, or `low` when the band is open): margin 0, never "supported".
    """
    from lmlab.core.stats.seeding import derive_seed
    from lmlab.core.stats.uncertainty import compare_statistic

    def margin(rows: np.ndarray) -> float:
        m = float(np.mean(rows))
        return min(m - low, high - m)

    a = np.asarray(ctx.values(claim.method, claim.metric), dtype=np.float64)
    clusters = ctx.clusters(claim.method, claim.metric)
    seed = derive_seed(ctx.cfg.seed, "claim", claim.method, claim.baseline, claim.metric)
    kw: dict[str, Any] = {"direction": ">", "seed": seed, "clusters": clusters}
    cmp = compare_statistic(a, np.full_like(a, low), margin, **kw)
    base = high if math.isfinite(high) else low
    null = compare_statistic(np.full_like(a, base), np.full_like(a, base), margin, min_n=1, **kw)
    result = claim_result(claim, cmp, null.status, n_values=None if clusters is None else len(a),
                          reason=f"margin to the band ({low:.3g}, {high:.3g}): {cmp.reason}")  # fmt: skip
    return replace(result, method_value=float(a.mean()), baseline_value=base)


def _finish(ctx: Any, checks: list[tuple[Claim, tuple[float, float] | None]]) -> Any:
    """`ctx.finish` for the mean comparisons; the band checks (`_band_result`) in their place, in the order given."""
    result = ctx.finish([claim for claim, band in checks if band is None])
    done = iter(result.claims)
    result.claims = [next(done) if band is None else _band_result(ctx, claim, *band) for claim, band in checks]
    return result


def _figure(ctx: Any, cfg: Any, systems: Sequence[str]) -> None:
    from lmlab.core.report.plotting import bar_with_ci, title_for

    for metric in ("potemkin_classify", "potemkin_generate", "potemkin_edit", "incoherence", "lower_bound"):
        rows = [m for m in ctx.metrics if m.metric == metric and m.system in systems]
        if rows:
            ctx.add_figure(metric, bar_with_ci(rows, title=title_for("potemkin", str(cfg.model), cfg.seed,
                                                                      len(cfg.concepts), metric),
                                               ylabel=metric, highlight=[s for s in systems
                                                                         if s not in CONTROLS]))  # fmt: skip
