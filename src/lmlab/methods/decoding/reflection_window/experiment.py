"""Reproduction: Reflection-Window decoding vs greedy, beam search and top-p on SmolLM2-135M-Instruct.

Paper claim: "significant improvement over existing decoding approaches, and maintains performance comparable or
superior to beam search while being more efficient". At 135M we test the paper's formal target, the fixed-length
joint log-prob log P(y_1..y_T | x), rather than MMLU / MT-Bench (a GPT-4 judge is out of reach offline):

- every system answers the same chat-formatted prompts (capital questions + open instructions);
- each output is cut to T_i = the shortest output length among all systems on prompt i, and scored by teacher
  forcing under the same model, so all systems are compared on spans of equal length;
- costs: per-sequence forward calls (a batched call over 4 beams counts 4), forward tokens and the FLOP proxy;
- capital accuracy is reported with ``scale_proxy``: higher likelihood is not higher accuracy at this size.

Claim check, for the paper's sigma = 0.5 and a sigma calibrated on held-out prompts: joint log-prob(RW) >
joint log-prob(greedy) and forward calls(RW) < forward calls(beam), each a paired comparison over prompts.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from lmlab.core.inference.compute import measure
from lmlab.core.inference.generation import decode, hf_generate
from lmlab.core.inference.scoring import chat_prompt, continuation_logprobs, encode_prompt
from lmlab.core.report.plotting import bar_with_ci, quality_vs_compute, title_for
from lmlab.core.stats.seeding import derive_seed
from lmlab.data import grade
from lmlab.methods.decoding.reflection_window.method import reflection_window_generate
from lmlab.results import Claim


def _system_runs(cfg: Any, ctx: Any, model: Any, tok: Any, prompts: list[list[int]], sigmas: dict[str, float]):
    """Outputs of every system per prompt: {system: [{"tokens", "text", "calls", "tokens_fwd", "flops", "wall"}]}."""
    eos = model.generation_config.eos_token_id

    def timed(system: str, fn) -> dict[str, Any]:
        t0 = time.perf_counter()
        with measure(ctx.meter) as delta:
            out = fn()
        cost = delta.get(system)
        return {
            **out,
            "calls": cost.forward_calls if cost else 0,
            "tokens_fwd": cost.tokens if cost else 0,
            "flops": cost.flops if cost else 0.0,
            "wall": time.perf_counter() - t0,
        }

    def greedy(i: int, p: list[int]) -> dict[str, Any]:
        o = decode(model, tok, p, max_new_tokens=cfg.max_new_tokens, meter=ctx.meter, meter_name="greedy")
        return {"tokens": o.token_ids, "text": o.text, "entropies": o.entropies}

    def beam(i: int, p: list[int]) -> dict[str, Any]:
        (o,) = hf_generate(
            model,
            tok,
            [p],
            max_new_tokens=cfg.max_new_tokens,
            num_beams=cfg.baseline_beams,
            length_penalty=cfg.length_penalty,
            batch_size=1,
            meter=ctx.meter,
            meter_name="beam",
        )
        return {"tokens": o.token_ids, "text": o.text}

    def rw(name: str, sigma: float):
        def run(i: int, p: list[int]) -> dict[str, Any]:
            o = reflection_window_generate(
                model,
                tok,
                p,
                max_new_tokens=cfg.max_new_tokens,
                sigma=sigma,
                window=cfg.window,
                rule=cfg.rule,
                beam_width=cfg.beam_width,
                eos_token_id=eos,
                allow_eos_in_refinement=cfg.allow_eos_in_refinement,
                meter=ctx.meter,
                meter_name=name,
            )
            return {"tokens": o.token_ids, "text": o.text, "pauses": o.n_pauses, "changed": o.n_changed_tokens}

        return run

    systems: dict[str, Any] = {"greedy": greedy, "beam": beam}
    for name, sigma in sigmas.items():
        systems[name] = rw(name, sigma)

    def top_p(k: int):
        def run(i: int, p: list[int]) -> dict[str, Any]:
            o = decode(
                model,
                tok,
                p,
                max_new_tokens=cfg.max_new_tokens,
                do_sample=True,
                top_p=cfg.top_p,
                seed=derive_seed(cfg.seed, "top_p", k, i),
                meter=ctx.meter,
                meter_name=f"top_p#{k}",
            )
            return {"tokens": o.token_ids, "text": o.text}

        return run

    for k in range(cfg.top_p_seeds):
        systems[f"top_p#{k}"] = top_p(k)
    # interleave: every prompt runs all systems, in an order rotated per prompt, so machine load drifts hit all
    # systems alike (the wall-time column is then comparable; the claim uses counts anyway)
    names = list(systems)
    runs = {name: [None] * len(prompts) for name in names}
    for i, p in enumerate(ctx.progress(prompts, "prompts")):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            runs[name][i] = timed(name, lambda i=i, p=p, fn=systems[name]: fn(i, p))
    return runs


def run(cfg: Any, ctx: Any):
    model, tok = ctx.load_model()
    capitals = ctx.data("countries", cfg.n_capitals, task="capital", style="question", stratify_by_population=True)
    instructions = ctx.data("instructions", cfg.n_instructions) if cfg.n_instructions else []
    examples = [("countries", ex) for ex in capitals] + [("instructions", ex) for ex in instructions]
    prompts = [encode_prompt(tok, chat_prompt(tok, ex.prompt)) for _, ex in examples]

    sigmas = {f"rw_sigma{cfg.sigma:g}": cfg.sigma}
    if cfg.calibrate_sigma:
        held_out = ctx.data("countries", cfg.calibration_prompts, split="dev", task="capital", style="question")
        entropies = []
        for ex in held_out:
            out = decode(model, tok, chat_prompt(tok, ex.prompt), max_new_tokens=cfg.max_new_tokens)
            entropies.extend(out.entropies)
        sigma_cal = float(np.quantile(entropies, cfg.calibration_quantile))
        ctx.record_value("calibration", "sigma_calibrated", sigma_cal, unit="nats")
        ctx.record_value(
            "calibration", f"share_of_tokens_above_{cfg.sigma:g}", float(np.mean(np.array(entropies) > cfg.sigma))
        )
        ctx.note(
            f"Calibrated sigma = {sigma_cal:.3f} nats: the {cfg.calibration_quantile:.0%} quantile of "
            f"{len(entropies)} "
            f"greedy-token entropies on {len(held_out)} held-out capital questions (dev split). "
            f"{np.mean(np.array(entropies) > cfg.sigma):.0%} of those tokens exceed the paper's sigma = {cfg.sigma:g}."
        )
        sigmas[f"rw_cal{cfg.calibration_quantile:g}"] = sigma_cal

    runs = _system_runs(cfg, ctx, model, tok, prompts, sigmas)
    top_p_names = [s for s in runs if s.startswith("top_p#")]

    # length-matched joint log-prob: every system's output is cut to the shortest length on that prompt
    lengths = [min(len(runs[s][i]["tokens"]) for s in runs) for i in range(len(prompts))]
    for i, t in enumerate(lengths):
        if t == 0:
            raise RuntimeError(f"prompt {i} produced an empty output; cannot length-match")
    joint: dict[str, list[float]] = {}
    for system, outs in runs.items():
        scored = continuation_logprobs(
            model,
            prompts,
            [o["tokens"][:t] for o, t in zip(outs, lengths)],
            batch_size=cfg.batch_size,
            pad_id=tok.pad_token_id or 0,
        )
        joint[system] = [float(sum(lp)) for lp, _ in scored]

    def per_prompt(system_names: list[str], key: str) -> list[float]:
        return [float(np.mean([runs[s][i][key] for s in system_names])) for i in range(len(prompts))]

    display = {"greedy": ["greedy"], "beam": ["beam"], **{s: [s] for s in sigmas}}
    if top_p_names:
        display["top_p"] = top_p_names
    is_capital = [suite == "countries" for suite, _ in examples]
    for name, members in display.items():
        ctx.record(
            name,
            "joint_logprob",
            [float(np.mean([joint[s][i] for s in members])) for i in range(len(prompts))],
            unit="nats",
            note="length-matched",
        )
        ctx.record(name, "forward_calls", per_prompt(members, "calls"), note="per-sequence forwards")
        ctx.record(name, "forward_tokens", per_prompt(members, "tokens_fwd"))
        ctx.record(name, "gflops", [v / 1e9 for v in per_prompt(members, "flops")], unit="GFLOP")
        ctx.record(name, "wall_s", per_prompt(members, "wall"), unit="s")
        if any(is_capital):
            acc = [
                float(np.mean([grade("countries", ex, runs[s][i]["text"]) for s in members]))
                for i, (suite, ex) in enumerate(examples)
                if suite == "countries"
            ]
            ctx.record(name, "capital_accuracy", acc, note="scale proxy; not gated")
    for name in sigmas:
        ctx.record(name, "pauses", [o["pauses"] for o in runs[name]])
        ctx.record(name, "changed_tokens", [o["changed"] for o in runs[name]])
    ctx.flag("scale_proxy", {"capital_accuracy": True})
    ctx.flag("metric", "length-matched joint log-prob (the paper's fixed-length objective), not MMLU / MT-Bench")

    ctx.add_samples(
        {
            "id": ex.id,
            "suite": suite,
            "prompt": ex.prompt,
            "target": ex.target,
            "T": lengths[i],
            **{f"{s}.text": runs[s][i]["text"] for s in runs},
            **{f"{s}.joint_logprob": joint[s][i] for s in runs},
            **{f"{s}.forward_calls": runs[s][i]["calls"] for s in runs},
        }
        for i, (suite, ex) in enumerate(examples)
    )
    model_name = str(model.lmlab_spec)
    rows = [ctx.metrics[i] for i in range(len(ctx.metrics)) if ctx.metrics[i].metric == "joint_logprob"]
    ctx.add_figure(
        "joint_logprob",
        bar_with_ci(
            rows,
            title=title_for("reflection_window", model_name, cfg.seed, len(prompts), "length-matched joint log-prob"),
            ylabel="nats",
            highlight=list(sigmas),
        ),
    )
    calls = {r.system: r.value for r in ctx.metrics if r.metric == "forward_calls"}
    ctx.add_figure(
        "quality_vs_compute",
        quality_vs_compute(
            [(r.system, calls[r.system], r.value) for r in rows],
            title=title_for("reflection_window", model_name, cfg.seed, len(prompts), "quality vs cost"),
            xlabel="forward calls per prompt",
            ylabel="joint log-prob (nats)",
            highlight=list(sigmas),
        ),
    )
    acc_rows = [r for r in ctx.metrics if r.metric == "capital_accuracy"]
    if acc_rows:
        ctx.note(
            "Capital accuracy is reported, not gated: in a probe, beam search raised joint log-prob yet lowered "
            "capital accuracy at 135M, so likelihood is only a proxy of quality at this scale."
        )

    claims = []
    for name, sigma in sigmas.items():
        claims += [
            Claim(
                "joint_logprob", name, "greedy", ">", text=f"{name} (sigma={sigma:.3g}): joint log-prob above greedy"
            ),
            Claim("forward_calls", name, "beam", "<", text=f"{name}: fewer forward calls than beam search"),
            Claim(
                "joint_logprob",
                name,
                "beam",
                ">",
                gate=False,
                text=f"{name}: joint log-prob vs beam (paper: comparable or superior; not gated)",
            ),
        ]
    return ctx.finish(claims)
