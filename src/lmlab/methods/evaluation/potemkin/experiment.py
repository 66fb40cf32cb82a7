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

Claims (computed from this run, each LLM system against the oracle's 0): potemkin rate on classify / generate /
edit above 0 (CIs resample concepts, the independent unit), incoherence above 0 (concepts), the lower bound above 0
(questions). Mechanism checks: the oracle scores 0 and the random responder about 1 on the x2-scaled metrics.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from lmlab.methods.evaluation.potemkin.concepts import CONCEPTS, get_concepts
from lmlab.methods.evaluation.potemkin.method import (
    TASKS,
    BackendAgent,
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
from lmlab.results import Claim

CONTROLS = ("oracle", "random")
CONTROL_MODEL = "tiny-llama"


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
            return [("endpoint", BackendAgent(backend, cfg.mode, "endpoint"), True)]
        model, tok = ctx.load_model(arg)
        return [(arg, BackendAgent(LocalBackend(model, tok, name=f"local:{arg}"), cfg.mode, arg), True)]
    specs = list(cfg.models) or [cfg.model]
    out = []
    for spec in specs:
        model, tok = ctx.load_model(spec)
        gated = not (spec == CONTROL_MODEL and len(specs) > 1)
        out.append((spec, BackendAgent(LocalBackend(model, tok, name=f"local:{spec}"), cfg.mode, spec), gated))
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
        ctx.record_value(system, "classify_yes_rate", sum(yes) / len(yes), note="share of Yes (always-Yes: 1)")
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
    agents = [(s, a, g) for s, a, g in llms] + [("oracle", OracleAgent(), False),
                                                ("random", RandomAgent(cfg.seed), False)]  # fmt: skip
    rows, samples, per_concept = [], [], []
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
    ctx.add_samples(samples)
    judge = ", ".join(f"{s}: {a.backend.name}" for s, a, _ in llms)
    ctx.flag("judge", f"the same model through its backend (self-grading and self-classification) - {judge}")
    ctx.flag("mode", cfg.mode)
    ctx.note(
        f"{len(concepts)} concepts x ({cfg.n_classify} classify + {cfg.n_generate} generate + {cfg.n_edit} edit + "
        f"{cfg.n_incoherence} incoherence) and {len(pairs)} Procedure-2 questions per system; keystone = "
        f"{cfg.n_options}-way definition by {'log-likelihood per character' if cfg.mode == 'completions' else 'chat'}"
        "; judge = the same model (self-grading, as the paper)."
    )
    _figure(ctx, cfg, [s for s, _, _ in agents])
    return ctx.finish(_claims(ctx, llms))


def _claims(ctx: Any, llms: Sequence[tuple[str, Any, bool]]) -> list[Claim]:
    claims = []
    for system, _, gated in llms:
        for task in TASKS:
            metric = f"potemkin_{task}"
            if ctx.has(system, metric):
                claims.append(
                    Claim(
                        metric,
                        system,
                        "oracle",
                        ">",
                        paired=False,
                        gate=gated,
                        text=f"{system}: potemkin rate on {task} (keystone right) above 0 (the oracle's)",
                    )
                )
            else:
                ctx.note(f"{system}: no concept with a right keystone, so no {task} potemkin rate.")
        claims.append(Claim("incoherence", system, "oracle", ">", gate=gated,
                            text=f"{system}: incoherence above 0 (the oracle's), per concept"))  # fmt: skip
        if ctx.has(system, "lower_bound") and ctx.has("oracle", "lower_bound"):
            claims.append(Claim("lower_bound", system, "oracle", ">", paired=False, gate=gated,
                                text=f"{system}: Procedure 2 potemkin lower bound above 0 (oracle's)"))  # fmt: skip
    for metric in ("incoherence", "lower_bound", "potemkin_classify"):
        if ctx.has("oracle", metric) and ctx.has("random", metric):
            claims.append(
                Claim(
                    metric,
                    "oracle",
                    "random",
                    "<",
                    paired=metric == "incoherence",
                    mechanism=True,
                    text=f"metric control: the oracle's {metric} (0) below the random responder's (~1)",
                )
            )
    return claims


def _figure(ctx: Any, cfg: Any, systems: Sequence[str]) -> None:
    from lmlab.core.report.plotting import bar_with_ci, title_for

    for metric in ("potemkin_classify", "potemkin_generate", "potemkin_edit", "incoherence", "lower_bound"):
        rows = [m for m in ctx.metrics if m.metric == metric and m.system in systems]
        if rows:
            ctx.add_figure(metric, bar_with_ci(rows, title=title_for("potemkin", str(cfg.model), cfg.seed,
                                                                      len(cfg.concepts), metric),
                                               ylabel=metric, highlight=[s for s in systems
                                                                         if s not in CONTROLS]))  # fmt: skip
