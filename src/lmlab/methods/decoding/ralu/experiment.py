"""Reproduction (mechanism check): repairing one injected bug per HumanEval program at an equal judge-call budget.

The paper's claim (RaLU beats CoT / PoT / self-refinement baselines on HumanEval+ etc. with 70B+ models) cannot be
tested at 135M: SmolLM2-135M cannot write or repair HumanEval programs freely. What is tested is the mechanism:
given a buggy program, does unit-level (CFG) judge / refine / rewind repair it better than line-level or
whole-program refinement, at the same number of judge calls?

- **Drafts:** HumanEval ``canonical_solution`` with one injected single-edit mutation in a random CFG unit (operators
  in `mutations`), kept only when the tests fail in the sandbox and when the inverse edit is in the candidate pool of
  every unit mode (so no system is denied the fix by construction). A controlled stand-in for an LLM's first draft.
- **Systems**, all on the same mutant: ``initial`` (no repair); ``ralu_cfg`` (RaLU on CFG units, the official
  method); ``ralu_line`` (the official line-by-line ablation); ``whole_refine`` (the whole program as one unit: the
  same judge, pool and rewind applied anywhere, chosen by whole-program confidence); ``oracle_cfg`` (RaLU-CFG with a
  judge that runs the tests: validates the plumbing, an upper bound).
- **Equal budget:** per problem, every system gets at most as many unit calls as RaLU-CFG made on it (whole-program
  refine may use them all as rewinds).
- **Metric:** pass@1 of the final program, by running the HumanEval tests only through
  `lmlab.core.training.rewards.humaneval_rewards` (the sandbox); also LLM calls, tokens and wall time.
- **Claim check (computed):** the expected ordering oracle > RaLU-CFG >= line > whole >= initial, one paired
  bootstrap over problems per inequality, plus RaLU-CFG > whole (RaLU-CFG > initial when whole is not run). Gated:
  RaLU-CFG >= line (a guard), line > whole and RaLU-CFG > whole. Mechanism checks, shown but never gating: whole >=
  initial and oracle > initial (pass@1 of the initial drafts is 0 by selection, and the oracle judge repairs by
  construction: if it does not, it is a bug). oracle > RaLU-CFG is an upper bound, reported only.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Sequence
from typing import Any

from lmlab.core.stats.seeding import derive_seed
from lmlab.results import Claim

GE = -0.02  # ">=" checks: "at least as good, up to 2 points" (the catalogue's convention)
# the expected ordering, one inequality (a, b, direction, min_effect) at a time
CHAIN: tuple[tuple[str, str, str, float], ...] = (
    ("oracle_cfg", "ralu_cfg", ">", 0.0),
    ("ralu_cfg", "ralu_line", ">", GE),
    ("ralu_line", "whole_refine", ">", 0.0),
    ("whole_refine", "initial", ">", GE),
)


def _results(problems: list[dict[str, Any]], sources: list[str], cfg: Any) -> list[Any]:
    """Run HumanEval tests on full program sources, in the sandbox (never in-process): `SandboxResult` per source."""
    from lmlab.core.execution.sandbox import SandboxLimits
    from lmlab.core.training.rewards import humaneval_rewards

    if not sources:
        return []
    limits = SandboxLimits(timeout_s=cfg.sandbox_timeout_s, memory_mb=512)
    # the prompt ends with a complete function (its docstring); the program then redefines everything
    completions = ["\n" + s + "\n" for s in sources]
    results = humaneval_rewards(problems, completions, limits=limits, workers=cfg.sandbox_workers)
    refused = [r for r in results if r.status == "refused"]
    if refused:
        raise RuntimeError(f"the sandbox refused to run the tests: {refused[0].reason}")
    return results


def _tests(problems: list[dict[str, Any]], sources: list[str], cfg: Any) -> list[bool]:
    return [r.passed for r in _results(problems, sources, cfg)]


def _tests_for(prob: dict[str, Any], cfg: Any, sources: list[str]) -> list[bool]:
    return _tests([prob] * len(sources), sources, cfg)


def _mutants(cfg: Any, ctx: Any, examples: list[Any]) -> list[dict[str, Any]]:
    """Pick problems in the split's seeded order and inject one failing, reachable mutation each (seeded per task).

    A problem enters when its normalised canonical solution passes, it has at least `min_units` CFG units, and one
    of its mutants (a random unit, then a random edit in it) fails the tests (without timing out) while every unit
    mode can undo it.
    """
    from lmlab.data.humaneval import problem
    from lmlab.methods.decoding.ralu.cfg import cfg_units
    from lmlab.methods.decoding.ralu.cfg_build import CFGError
    from lmlab.methods.decoding.ralu.method import clean_spec
    from lmlab.methods.decoding.ralu.mutations import injection_sites, reachable
    from lmlab.methods.decoding.ralu.program import Program

    chosen = []
    for ex in examples:
        if len(chosen) >= cfg.n_problems:
            break
        prob = problem(ex)
        prog = Program.parse(prob["prompt"] + prob["canonical_solution"])
        try:
            if len(cfg_units(prog, prob["entry_point"])) < cfg.min_units:
                continue
        except CFGError:
            continue
        if not _tests([prob], [prog.source], cfg)[0]:
            ctx.log.warning("%s: the normalised canonical solution fails its tests; skipped", prob["task_id"])
            continue
        rng = random.Random(derive_seed(cfg.seed, "mutant", prob["task_id"]))
        sites = injection_sites(prog, prob["entry_point"], cfg.operators)
        order = sorted(sites)
        rng.shuffle(order)
        spec_text = "## Specification\n" + clean_spec(prob["prompt"])

        picked = None
        for k in order:
            candidates = list(sites[k])
            rng.shuffle(candidates)
            batch: list[Any] = []
            # most mutants fail: test them a few at a time, in the shuffled order, until one does
            for site in [*candidates, None]:
                if site is not None and all(
                    reachable(site.program, prog.source, prob["entry_point"], spec_text, m) for m in ("cfg", "line")
                ):
                    batch.append(site)
                if batch and (len(batch) == 4 or site is None):
                    # a mutant that loops until the time limit would cost every system a timeout: not a draft
                    runs = _results([prob] * len(batch), [b.program for b in batch], cfg)
                    picked = next((b for b, r in zip(batch, runs) if not r.passed and r.status != "timeout"), None)
                    batch = []
                    if picked:
                        break
            if picked:
                break
        if picked is not None:
            chosen.append(
                {"problem": prob, "canonical": prog, "site": picked, "mutant": Program.parse(picked.program)}
            )
    return chosen


def _api_target(cfg: Any) -> tuple[str, str] | None:
    """``(base_url, served model)`` when RaLU runs on an API backend, None when on the local model."""
    from urllib.parse import urldefrag

    from lmlab.core.execution.backends import parse_backend

    if cfg.backend == "openai":  # the older form: the endpoint in openai_base_url / openai_model
        return cfg.openai_base_url, cfg.openai_model
    if cfg.backend == "hf":
        return None
    kind, arg = parse_backend(cfg.backend)
    if kind != "openai":
        return None  # local:MODEL is hf on MODEL (the config set cfg.model)
    url, served = urldefrag(arg)
    return url, served or cfg.openai_model


def _backend(cfg: Any, ctx: Any, model: Any, tok: Any) -> Any:
    from lmlab.methods.decoding.ralu.backends import HFChatBackend, OpenAIChatBackend

    target = _api_target(cfg)
    if target is not None:
        # the official prompt_call: temperature 0.7 (from the loop), frequency penalty 0.3, logprobs=True
        max_tokens = getattr(cfg, "openai_max_tokens", None)
        return OpenAIChatBackend(target[0], target[1], max_tokens=max_tokens, seed=cfg.seed)
    return HFChatBackend(
        model,
        tok,
        n_rewrites=cfg.n_rewrites,
        rewrite_max_tokens=cfg.rewrite_max_tokens,
        judge_bias=cfg.judge_bias,
        seed=cfg.seed,
        batch_size=cfg.batch_size,
        meter=ctx.meter,
        meter_name="llm",
    )


def _run_system(cfg: Any, prob: dict[str, Any], mutant: Any, backend: Any, mode: str, **kw: Any):
    """One repair run; returns the `RaLUResult` and its per-problem statistics."""
    from lmlab.methods.decoding.ralu.method import ralu_repair

    start = time.perf_counter()
    res = ralu_repair(
        prob["prompt"],
        mutant,
        backend,
        unit_mode=mode,
        entry_point=prob["entry_point"],
        max_valid_num=cfg.max_valid_num,
        threshold=cfg.threshold,
        temperature=cfg.temperature,
        synthesis=cfg.synthesis,
        **kw,
    )
    verdicts = [a.info.get("verdict", "") for t in res.traces for a in t.attempts]
    stats = {
        "llm_calls": res.n_calls,
        "judge_calls": res.n_judge_calls,
        "tokens": res.prompt_tokens + res.completion_tokens,
        "wall_s": time.perf_counter() - start,
        "wrong_rate": sum(v.startswith("WRONG") for v in verdicts) / max(1, len(verdicts)),
        "units": len(res.units),
    }
    return res, stats


def _judge_sensitivity(backend: Any, item: dict[str, Any], res: Any) -> tuple[float, float] | None:
    """The local judge's margin on the buggy unit and on the correct unit asked in its place, same history.

    Only for the HF judge, when the buggy unit was first asked on the initial branch (no rewind before it) and the
    mutant's units line up with the canonical program's.
    """
    from lmlab.methods.decoding.ralu.backends import HFChatBackend
    from lmlab.methods.decoding.ralu.cfg import cfg_units
    from lmlab.methods.decoding.ralu.prompts import CODE_SYSTEM

    if not isinstance(backend, HFChatBackend):
        return None
    k = item["site"].unit_index
    clean = cfg_units(item["canonical"], item["problem"]["entry_point"])
    if len(clean) != len(res.units) or k > len(res.traces) or not res.traces[k - 1].attempts:
        return None
    first = res.traces[k - 1].attempts[0]
    if first.branch != "b0" or "logp_ok" not in first.info:
        return None
    history = res.branches["b0"][: 1 + 2 * (k - 1)]
    prompt = ("## Process\n" if k == 1 else "") + f"Unit {k}: {clean[k - 1].text}"
    reply = backend.chat([{"role": "system", "content": CODE_SYSTEM}, *history, {"role": "user", "content": prompt}])
    bug = first.info["logp_ok"] - first.info["logp_wrong"]
    return bug, reply.info["logp_ok"] - reply.info["logp_wrong"]


def run(cfg: Any, ctx: Any):
    from lmlab.core.report.plotting import bar_with_ci, title_for
    from lmlab.methods.decoding.ralu.backends import OracleJudgeBackend
    from lmlab.methods.decoding.ralu.cfg import cfg_units

    systems = [s for s in ("initial", "whole_refine", "ralu_line", "ralu_cfg", "oracle_cfg") if s in cfg.systems]
    for must in ("initial", "ralu_cfg"):
        if must not in systems:
            systems.insert(0 if must == "initial" else len(systems), must)

    target = _api_target(cfg)
    model, tok = (None, None) if target is not None else ctx.load_model()
    # the pool is drawn from the split in its seeded order until n_problems mutants are found
    examples = ctx.data("humaneval", None, split=cfg.split)
    t0 = time.perf_counter()
    items = _mutants(cfg, ctx, examples)
    ctx.record_value("setup", "mutant_setup_s", time.perf_counter() - t0, unit="s")
    if not items:
        raise RuntimeError("no problem yielded a failing, repairable mutant; raise n_problems or check the sandbox")
    backend = _backend(cfg, ctx, model, tok)
    if target is not None:
        ctx.flag("llm_backend", backend.backend.name)

    per: dict[str, dict[str, list[float]]] = {s: {} for s in systems}
    sensitivity: list[tuple[float, float] | None] = []
    samples = []
    for item in ctx.progress(items, "problems"):
        prob, mutant, site = item["problem"], item["mutant"], item["site"]
        ep = prob["entry_point"]
        finals: dict[str, str] = {"initial": mutant.source}
        stats: dict[str, dict[str, float]] = {"initial": {"llm_calls": 0, "judge_calls": 0, "tokens": 0, "wall_s": 0}}

        results: dict[str, Any] = {}
        results["ralu_cfg"], stats["ralu_cfg"] = _run_system(
            cfg, prob, mutant, backend, "cfg", max_branches=cfg.max_branches, max_calls=cfg.budget
        )
        budget = cfg.budget or max(1, results["ralu_cfg"].n_judge_calls)
        sensitivity.append(_judge_sensitivity(backend, item, results["ralu_cfg"]))
        if "ralu_line" in systems:
            results["ralu_line"], stats["ralu_line"] = _run_system(
                cfg, prob, mutant, backend, "line", max_branches=cfg.max_branches, max_calls=budget
            )
        if "whole_refine" in systems:
            # one unit: every call of the budget is available as a rewind of the whole program
            results["whole_refine"], stats["whole_refine"] = _run_system(
                cfg, prob, mutant, backend, "whole", max_branches=budget - 1, max_calls=budget
            )
        if "oracle_cfg" in systems:
            units = cfg_units(mutant, ep)
            oracle = OracleJudgeBackend(mutant, units, functools.partial(_tests_for, prob, cfg))
            results["oracle_cfg"], stats["oracle_cfg"] = _run_system(
                cfg, prob, mutant, oracle, "cfg", max_branches=cfg.max_branches, max_calls=budget, units=units
            )
            stats["oracle_cfg"]["llm_calls"] = 0  # the oracle is not an LLM: its calls are test runs
            stats["oracle_cfg"]["test_runs"] = oracle.n_test_runs
        for name, res in results.items():
            finals[name] = res.program

        order = [s for s in systems if s in finals]
        passed = dict(zip(order, _tests([prob] * len(order), [finals[s] for s in order], cfg)))
        for s in order:
            per[s].setdefault("pass@1", []).append(float(passed[s]))
            for key, value in stats[s].items():
                per[s].setdefault(key, []).append(float(value))
            per[s].setdefault("changed", []).append(float(finals[s] != mutant.source))
            per[s].setdefault("budget", []).append(float(budget))
        samples.append(
            {
                "task_id": prob["task_id"],
                "mutation": {"op": site.op, "unit": site.unit_index, "before": site.before, "after": site.after},
                "budget": budget,
                **{f"{s}.pass": bool(passed[s]) for s in order},
                **{f"{s}.program": finals[s] for s in order if finals[s] != mutant.source},
                **{
                    f"{s}.units": [
                        {"verdicts": [a.info.get("verdict") for a in t.attempts], "by": t.decided_by}
                        for t in results[s].traces
                    ]
                    for s in order
                    if s in results
                },
            }
        )

    units_label = {"pass@1": "", "wall_s": "s"}
    for s in systems:
        for metric, values in per[s].items():
            ctx.record(s, metric, values, unit=units_label.get(metric, ""))
    paired = [x for x in sensitivity if x is not None]
    if paired:
        # the judge's margin log P(OK) - log P(WRONG) on the buggy unit, and on the correct unit in its place with
        # the same history: a negative difference means the judge leans towards WRONG on the bug
        ctx.record("judge", "margin_on_bug", [b for b, _ in paired], unit="nats")
        ctx.record("judge", "margin_on_clean", [c for _, c in paired], unit="nats")
        ctx.record("judge", "margin_bug_minus_clean", [b - c for b, c in paired], unit="nats")
    ctx.add_samples(samples)
    ctx.flag("scale_proxy", True)
    ctx.flag("oracle_judge", "oracle_cfg" in systems)
    ctx.flag("drafts", "canonical solutions with one injected mutation (not LLM drafts)")
    ctx.flag("budget", "per problem: RaLU-CFG's unit calls" if cfg.budget is None else f"{cfg.budget} unit calls")
    ops: dict[str, int] = {}
    for it in items:
        ops[it["site"].op] = ops.get(it["site"].op, 0) + 1
    ctx.table("mutations", [{"operator": k, "count": v} for k, v in sorted(ops.items())])

    # the expected ordering, one inequality at a time, from the measured pass@1
    chain = [c for c in CHAIN if c[0] in systems and c[1] in systems]
    mean = {s: sum(per[s]["pass@1"]) / len(per[s]["pass@1"]) for s in systems}
    rows = []
    for a, b, _, eps in chain + ([("oracle_cfg", "initial", ">", 0.0)] if "oracle_cfg" in systems else []):
        sign = ">=" if eps < 0 else ">"
        holds = mean[a] >= mean[b] if eps < 0 else mean[a] > mean[b]
        rows.append({"inequality": f"{a} {sign} {b}", "lhs": mean[a], "rhs": mean[b], "holds": holds})
    ctx.table("ordering", rows)
    ctx.note(
        "Mechanism check at 135M (scale_proxy): pass@1 after repairing one injected bug, every system limited to "
        "RaLU-CFG's judge calls on each problem. The paper's HumanEval+ gains are for 70B+ models and are not "
        "claimed here."
    )
    if "oracle_cfg" in systems and not mean["oracle_cfg"] > mean["initial"]:
        ctx.note("PLUMBING FAILURE: the oracle judge did not beat the initial program; this is a bug, not a result.")

    pass_rows = [r for r in ctx.metrics if r.metric == "pass@1"]
    ctx.add_figure(
        "pass_at_1",
        bar_with_ci(
            pass_rows,
            title=title_for(
                "ralu",
                str(cfg.model if target is None else target[1]),
                cfg.seed,
                len(items),
                "pass@1 after repair",
            ),
            ylabel="pass@1",
            highlight=["ralu_cfg"],
        ),
    )

    return ctx.finish(build_claims(systems))


def build_claims(systems: Sequence[str]) -> list[Claim]:
    """The claim checks for the systems that ran (all on pass@1, paired over problems).

    Mechanism checks (shown, never gating): every draft fails its tests by selection, so pass@1(initial) = 0 and
    "X >= initial" holds for any X; the oracle judge runs the tests over a pool that holds the inverse edit, so it
    repairs by construction (if it does not, that is a bug). "oracle > RaLU-CFG" is an upper bound, reported only:
    the verdict must not fail because RaLU matches the oracle.
    """
    claims: list[Claim] = []
    if "oracle_cfg" in systems:
        claims.append(
            Claim(
                "pass@1",
                "oracle_cfg",
                "initial",
                ">",
                mechanism=True,
                text="plumbing (mechanism): oracle-judge RaLU-CFG repairs mutants",
            )  # fmt: skip
        )
    for a, b, direction, eps in [c for c in CHAIN if c[0] in systems and c[1] in systems]:
        sign = ">=" if eps < 0 else ">"
        by_construction = b == "initial" and eps < 0
        upper_bound = a == "oracle_cfg"
        label = "mechanism: " if by_construction else "upper bound, not gated: " if upper_bound else ""
        claims.append(Claim("pass@1", a, b, direction, min_effect=eps, mechanism=by_construction,
                            gate=not upper_bound, text=f"{label}pass@1: {a} {sign} {b}"))  # fmt: skip
    if "whole_refine" in systems:
        # the headline of the mechanism: unit-level (CFG) repair beats whole-program refinement at the same budget
        text = "pass@1: ralu_cfg > whole_refine (unit-level beats whole-program repair)"
        claims.append(Claim("pass@1", "ralu_cfg", "whole_refine", ">", text=text))
    else:  # without the whole-program baseline, the least RaLU must do: repair some of the injected bugs
        claims.append(Claim("pass@1", "ralu_cfg", "initial", ">", text="pass@1: ralu_cfg > initial (repairs bugs)"))
    return claims
