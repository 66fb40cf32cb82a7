"""Reproduction: Speculative Search vs small-only and large-only PRM beam search on multi-step capital listing.

Paper claim: SpecSearch "preserves comparable reasoning quality to the large model" while accelerating tree-search
reasoning (up to 2.12x over token-level speculative decoding, 4.11x over large-model autoregressive generation). Here
the small model is SmolLM2-135M-Instruct, the large one Gemma-3-270M base, the task `capital_steps` (one "Country:
Capital" line per step, each step given its "Country:" prefix), and the search a PRM beam search (N thoughts per node,
beam B, depth = countries):

1. **Precondition** (calibration = dev split, never the test split): greedy per-country step accuracy of each model
   in each prompt format; ``auto`` formats pick the better one per model; the large model must be more accurate
   than the small one (a gated claim over per-country values clustered by question; a failure is flagged and
   noted, never hidden).
2. **Systems, same questions, same process, interleaved per question** with every PRM in `prms`: small-only beam,
   large-only beam, SpecSearch (one large-model thought at the root gives beta_0, the small model drafts the rest);
   with the headline PRM also the ablations accept-every-draft (no quality-preserving rejection; the large model
   still writes the cold-start thought), a fixed threshold instead of the EMA, and (with ``cold_start_ablation``)
   ``cold_start_all`` (the large model writes the whole root, so depth 0 is large-only search by construction).
3. **Metrics**: step accuracy and all-steps-correct, graded by gold capitals (never the PRM); per model forward calls,
   prefill and decode tokens, the FLOP proxy (including the prefill of the other model's text after a switch), the
   PRM's cost, a no-prefix-cache cost model, a projected cost at the paper's size ratio, wall time, acceptance rate
   and a latency breakdown.
4. **Claims**, per PRM (oracle results are reported, not gated): step accuracy(SpecSearch) >= large-only - margin
   (comparable), > small-only; large-model decode tokens below large-only; cost-model speedup FLOPs(large-only) /
   FLOPs(SpecSearch) > target (per question, as FLOPs ratio < 1 / target). Wall time and ablations: reported.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from lmlab.core.inference.scoring import has_chat_template
from lmlab.core.report.plotting import bar_with_ci, quality_vs_compute, title_for
from lmlab.data import grade
from lmlab.data.capital_prms import STOP_MARKERS, NoisyOraclePRM, OracleFactPRM, ProbePRM, capital_shots
from lmlab.data.capital_steps import step_prefixes, step_scores
from lmlab.methods.decoding.spec_search.method import beam_search, spec_search
from lmlab.methods.decoding.spec_search.thought_model import ThoughtModel
from lmlab.results import Claim

SD_NOTE = (
    "Large-only search with token-level speculative decoding (the paper's SpS baseline) is not run: SmolLM2 and "
    "Gemma-3 have different tokenizers, lossless speculative *sampling* needs one vocabulary, and Gemma-3-270M has no "
    "smaller same-tokenizer sibling. Its output distribution equals large-only search (lossless), so its accuracy is "
    "large-only's; the SD corrector (`corrector='sd'`) is implemented and tested on same-tokenizer tiny models."
)


def _calibrate(cfg: Any, ctx: Any, role: str, model: Any, tok: Any, fmt_cfg: str, shots: list, calib: list):
    """Per-country greedy step accuracy of one model per candidate format.

    Returns (chosen format, rows, per-country values of the chosen format, their question ids): the countries of
    one question are one cluster.
    """
    if fmt_cfg != "auto":
        formats = [fmt_cfg]
    else:
        formats = ["fewshot", "chat"] if has_chat_template(tok) else ["fewshot"]
    rows, values = [], {}
    for fmt in formats:
        tm = ThoughtModel(
            model,
            tok,
            name=f"calib_{role}",
            fmt=fmt,
            shots=shots,
            max_step_tokens=cfg.max_step_tokens,
            meter=ctx.meter,
            prefix_cache=cfg.prefix_cache,
            stop_markers=STOP_MARKERS,
        )
        tm.pin(tm.render("", []))
        accs, ids = [], []
        for ex in calib:
            steps = tm.answer(ex.prompt, cfg.n_steps, step_prefixes=step_prefixes(ex))
            scores = step_scores(ex, steps)  # one per country
            accs += scores
            ids += [ex.id] * len(scores)
        values[fmt] = accs
        rows.append({"model": role, "format": fmt, "step_accuracy": float(np.mean(accs)), "countries": len(accs)})
    chosen = max(formats, key=lambda f: np.mean(values[f]))  # ties keep the first (few-shot)
    for r in rows:
        r["chosen"] = r["format"] == chosen
    return chosen, rows, values[chosen], ids


def _make_prm(cfg: Any, name: str) -> Any:
    from lmlab.core.training.prm import is_prm_spec, load_prm

    if is_prm_spec(name):  # a saved PRM, e.g. implicit:DIR (lmlab.core.training.prm.register_prm_loader)
        return load_prm(name, device=cfg.device, dtype=cfg.dtype)
    if name == "noisy":
        return NoisyOraclePRM(cfg.noisy_eps, cfg.noisy_sigma, seed=cfg.seed)
    if name == "probe":
        return ProbePRM.trained_on_countries(cfg.seed, split="train")
    return OracleFactPRM()


def _row(r: Any, wall: float, ex: Any, flop_params: dict[str, float], ratio: float) -> dict[str, Any]:
    """Per-question numbers of one search result."""
    out: dict[str, Any] = {"steps": r.steps, "provenance": r.provenance, "wall": wall}
    scores = step_scores(ex, r.steps)
    out["step_accuracy"] = float(np.mean(scores))
    out["all_correct"] = grade("capital_steps", ex, r.text)
    out["step_scores"] = scores
    flops = 0.0
    no_cache = 0.0
    proj = 0.0
    for role in ("small", "large"):
        c = r.cost.get(role, {})
        for k in ("forward_calls", "prefill_tokens", "decode_tokens"):
            out[f"{role}_{k}"] = float(c.get(k, 0))
        flops += float(c.get("flops", 0.0))
        no_cache += 2.0 * flop_params[role] * float(c.get("logical_tokens", 0.0))
        tokens = float(c.get("prefill_tokens", 0)) + float(c.get("decode_tokens", 0))
        # projected cost in large-model token equivalents, as if the small model were `ratio` times smaller
        proj += tokens if role == "large" else tokens / ratio
    prm = r.cost.get("prm", {})
    out["prm_flops"] = float(prm.get("flops", 0.0))
    out["prm_steps_scored"] = float(prm.get("steps_scored", 0))
    out["gflops"] = (flops + out["prm_flops"]) / 1e9
    out["gflops_no_cache"] = (no_cache + out["prm_flops"]) / 1e9
    out["proj_tokens"] = proj
    out["acceptance_rate"] = r.acceptance_rate
    out["draft_share"] = float(np.mean([s == "draft" for s in r.provenance])) if r.provenance else 0.0
    finite = [t for t in r.thresholds if t is not None and math.isfinite(t)]
    out["threshold_mean"] = float(np.mean(finite)) if finite else math.nan
    out["latency"] = r.latency
    return out


def run(cfg: Any, ctx: Any):
    small_model, small_tok = ctx.load_model(cfg.model)
    large_model, large_tok = ctx.load_model(cfg.large_model)
    shots = capital_shots(cfg.seed, cfg.n_shots) if cfg.n_shots else []

    # -- 1. precondition and prompt formats, on the calibration (dev) split ---------------------------------------
    calib = ctx.data("capital_steps", cfg.calib_questions, split="dev", n_countries=cfg.n_steps)
    small_fmt, rows_s, acc_s, ids_s = _calibrate(cfg, ctx, "small", small_model, small_tok, cfg.small_fmt, shots,
                                                 calib)  # fmt: skip
    large_fmt, rows_l, acc_l, ids_l = _calibrate(cfg, ctx, "large", large_model, large_tok, cfg.large_fmt, shots,
                                                 calib)  # fmt: skip
    ctx.table("calibration_formats", rows_s + rows_l)
    # per country, clustered by question (the same questions in the same order for both models)
    ctx.record("small_model", "calib_step_accuracy", acc_s, clusters=ids_s,
               note=f"dev split, greedy, {small_fmt}, per country")  # fmt: skip
    ctx.record("large_model", "calib_step_accuracy", acc_l, clusters=ids_l,
               note=f"dev split, greedy, {large_fmt}, per country")  # fmt: skip
    passed = float(np.mean(acc_l)) > float(np.mean(acc_s))
    ctx.flag(
        "precondition",
        {
            "large_more_step_accurate": passed,
            "small": float(np.mean(acc_s)),
            "large": float(np.mean(acc_l)),
            "countries": len(acc_s),
            "split": "dev",
        },
    )
    ctx.note(
        f"Precondition (dev split, {len(acc_s)} countries, greedy): large {cfg.large_model} ({large_fmt}) step "
        f"accuracy {np.mean(acc_l):.2f} vs small {cfg.model} ({small_fmt}) {np.mean(acc_s):.2f}: "
        + (
            "the large model is the more accurate one."
            if passed
            else "PRECONDITION FAILED: the large model is not "
            "more accurate than the small one, so SpecSearch has no quality to preserve; the claims below are moot."
        )
    )

    # -- 2. the systems ---------------------------------------------------------------------------------------------
    small = ThoughtModel(
        small_model,
        small_tok,
        name="small",
        fmt=small_fmt,
        shots=shots,
        max_step_tokens=cfg.max_step_tokens,
        meter=ctx.meter,
        prefix_cache=cfg.prefix_cache,
        stop_markers=STOP_MARKERS,
    )
    large = ThoughtModel(
        large_model,
        large_tok,
        name="large",
        fmt=large_fmt,
        shots=shots,
        max_step_tokens=cfg.max_step_tokens,
        meter=ctx.meter,
        prefix_cache=cfg.prefix_cache,
        stop_markers=STOP_MARKERS,
    )
    # the few-shot scaffold is the same for every question: a serving engine prefills it once (counted here once)
    pinned = {"small": small.pin(small.render("", [])), "large": large.pin(large.render("", []))}
    ctx.table("pinned_scaffold_tokens", [pinned])
    flop_params = {"small": float(small.flop_params), "large": float(large.flop_params)}
    questions = ctx.data("capital_steps", cfg.n_questions, split="test", n_countries=cfg.n_steps)
    prms = {p: _make_prm(cfg, p) for p in cfg.prms}
    head = cfg.prms[0]
    common = dict(
        n=cfg.n, beam_width=cfg.beam_width, temperature=cfg.temperature, aggregate=cfg.aggregate, seed=cfg.seed
    )
    spec_kw = dict(
        theta=cfg.theta, estimator=cfg.estimator, n_cold_start=cfg.n_cold_start, n_large_per_step=cfg.n_large_per_step
    )
    cold = cfg.n if cfg.n_cold_start is None else cfg.n_cold_start

    def sys_name(base: str, p: str) -> str:
        return base if p == head else f"{base}_{p}"

    systems: dict[str, Any] = {}
    sys_prm: dict[str, str] = {}  # system -> its PRM
    for p, prm in prms.items():
        sys_prm.update({sys_name(b, p): p for b in ("small_beam", "large_beam", "spec_search")})
        systems[sys_name("small_beam", p)] = lambda q, pre, prm=prm: beam_search(
            q, small, prm, step_prefixes=pre, **common
        )
        systems[sys_name("large_beam", p)] = lambda q, pre, prm=prm: beam_search(
            q, large, prm, step_prefixes=pre, **common
        )
        systems[sys_name("spec_search", p)] = lambda q, pre, prm=prm: spec_search(
            q, small, large, prm, step_prefixes=pre, **common, **spec_kw
        )
    if cfg.ablations:
        prm = prms[head]
        # the same search with the rejection removed (every draft accepted; the large model still writes the root)
        systems["accept_all"] = lambda q, pre: spec_search(
            q, small, large, prm, step_prefixes=pre, threshold=-math.inf, n_cold_start=cold, **common
        )
        systems["fixed_threshold"] = lambda q, pre: spec_search(
            q, small, large, prm, step_prefixes=pre, threshold=cfg.fixed_threshold, n_cold_start=cold, **common
        )
        sys_prm.update(accept_all=head, fixed_threshold=head)
        if cold != cfg.n and cfg.cold_start_ablation:
            # the large model writes the whole root (beta_0 from all n of its thoughts): depth 0 is large-only search
            # by construction, so this trades the root's savings for a better-estimated beta_0
            systems["cold_start_all"] = lambda q, pre: spec_search(
                q, small, large, prm, step_prefixes=pre, **common, **{**spec_kw, "n_cold_start": cfg.n}
            )
            sys_prm["cold_start_all"] = head
    speculative = {s for s in systems if not s.startswith(("small_beam", "large_beam"))}
    names = list(systems)
    runs: dict[str, list[dict[str, Any]]] = {s: [None] * len(questions) for s in names}  # type: ignore[misc]
    for i, ex in enumerate(ctx.progress(questions, "questions")):
        pre = step_prefixes(ex)
        shift = i % len(names)  # rotate the order per question so machine-load drift hits every system alike
        for s in names[shift:] + names[:shift]:
            t0 = time.perf_counter()
            r = systems[s](ex.prompt, pre)
            runs[s][i] = _row(r, time.perf_counter() - t0, ex, flop_params, cfg.projected_ratio)

    # -- 3. metrics -------------------------------------------------------------------------------------------------
    def per_q(s: str, key: str) -> list[float]:
        return [float(r[key]) for r in runs[s]]

    for s in names:
        ref = sys_name("large_beam", sys_prm[s])
        ctx.record(s, "step_accuracy", per_q(s, "step_accuracy"), note="gold capitals, per question")
        ctx.record(s, "all_correct", per_q(s, "all_correct"), note="gold capitals")
        for role in ("large", "small"):
            for k in ("decode_tokens", "prefill_tokens", "forward_calls"):
                ctx.record(s, f"{role}_{k}", per_q(s, f"{role}_{k}"))
        ctx.record(s, "gflops", per_q(s, "gflops"), unit="GFLOP", note="measured, both models + PRM")
        ctx.record(
            s, "gflops_no_cache", per_q(s, "gflops_no_cache"), unit="GFLOP", note="cost model: re-prefill every call"
        )
        ctx.record(
            s,
            "flops_rel",
            [a / b for a, b in zip(per_q(s, "gflops"), per_q(ref, "gflops"))],
            note=f"FLOPs / FLOPs({ref}) per question",
        )
        ctx.record(
            s,
            "flops_rel_no_cache",
            [a / b for a, b in zip(per_q(s, "gflops_no_cache"), per_q(ref, "gflops_no_cache"))],
        )
        ctx.record(
            s,
            "proj_rel",
            [a / b for a, b in zip(per_q(s, "proj_tokens"), per_q(ref, "proj_tokens"))],
            note=f"projected cost / {ref} with a {cfg.projected_ratio:g}x smaller drafter",
        )
        ctx.record(s, "prm_steps_scored", per_q(s, "prm_steps_scored"))
        ctx.record(s, "wall_s", per_q(s, "wall"), unit="s")
        if s in speculative:
            acc = [v for v in per_q(s, "acceptance_rate") if math.isfinite(v)]
            if acc:
                ctx.record(s, "acceptance_rate", acc, note="accepted drafts / drafts")
            ctx.record(s, "draft_share", per_q(s, "draft_share"), note="best-path steps that are accepted drafts")
            thr = [v for v in per_q(s, "threshold_mean") if math.isfinite(v)]
            if thr:
                ctx.record(s, "threshold_mean", thr)
            for part in ("draft", "evaluate", "correct"):
                ctx.record(s, f"{part}_s", [r["latency"].get(part, 0.0) for r in runs[s]], unit="s")
    ctx.flag("oracle_prm", "oracle" in prms)
    ctx.flag("headline_prm", head)
    ctx.flag("sd_reference", "not run (cross-tokenizer pair); see notes")
    ctx.note(SD_NOTE)
    ctx.note(
        f"Formats: small {small_fmt}, large {large_fmt}; N={cfg.n}, B={cfg.beam_width}, depth={cfg.n_steps}, "
        f"temperature {cfg.temperature}, theta {cfg.theta}, estimator {cfg.estimator}, cold start {cold} large "
        f"thoughts, {cfg.n_large_per_step} large thought(s) per later depth; prefix cache "
        f"{'on (few-shot scaffold pinned: ' + str(pinned) + ' tokens, counted once)' if cfg.prefix_cache else 'off'}."
    )

    def val(s: str, metric: str) -> float:
        return next((m.value for m in ctx.metrics if m.system == s and m.metric == metric), math.nan)

    for p in prms:
        spec, lg, sm = sys_name("spec_search", p), sys_name("large_beam", p), sys_name("small_beam", p)
        saved = 1.0 - val(spec, "large_decode_tokens") / max(val(lg, "large_decode_tokens"), 1e-9)
        ctx.note(
            f"[{p} PRM] step accuracy: SpecSearch {val(spec, 'step_accuracy'):.3f}, large-only "
            f"{val(lg, 'step_accuracy'):.3f}, small-only {val(sm, 'step_accuracy'):.3f}. Large-model decode tokens "
            f"{val(spec, 'large_decode_tokens'):.1f} vs {val(lg, 'large_decode_tokens'):.1f} ({saved:.0%} fewer); "
            f"FLOPs {val(spec, 'flops_rel'):.2f}x large-only's (no prefix cache: "
            f"{val(spec, 'flops_rel_no_cache'):.2f}x; projected with a {cfg.projected_ratio:g}x smaller drafter: "
            f"{val(spec, 'proj_rel'):.2f}x); wall "
            f"{val(spec, 'wall_s'):.2f} s vs {val(lg, 'wall_s'):.2f} s per question; draft acceptance "
            f"{val(spec, 'acceptance_rate'):.2f}."
        )
    cost_rows = []
    for s in names:
        row = {"system": s}
        for k in (
            "large_forward_calls",
            "large_prefill_tokens",
            "large_decode_tokens",
            "small_forward_calls",
            "small_prefill_tokens",
            "small_decode_tokens",
            "prm_steps_scored",
            "gflops",
            "gflops_no_cache",
            "wall",
        ):
            row[k] = float(np.mean(per_q(s, k)))
        cost_rows.append(row)
    ctx.table("cost_per_question", cost_rows)
    ctx.add_samples(
        {
            "id": ex.id,
            "prompt": ex.prompt,
            "target": ex.target,
            **{f"{s}.steps": runs[s][i]["steps"] for s in names},
            **{f"{s}.provenance": runs[s][i]["provenance"] for s in names},
            **{f"{s}.step_scores": runs[s][i]["step_scores"] for s in names},
        }
        for i, ex in enumerate(questions)
    )
    label = f"{cfg.model} -> {cfg.large_model}"
    acc_rows = [m for m in ctx.metrics if m.metric == "step_accuracy"]
    ctx.add_figure(
        "step_accuracy",
        bar_with_ci(
            acc_rows,
            title=title_for("spec_search", label, cfg.seed, len(questions), "step accuracy (gold)"),
            ylabel="step accuracy",
            highlight=[s for s in names if s.startswith("spec_search")],
        ),
    )
    dec = {m.system: m.value for m in ctx.metrics if m.metric == "large_decode_tokens"}
    ctx.add_figure(
        "accuracy_vs_large_tokens",
        quality_vs_compute(
            [(m.system, dec[m.system], m.value) for m in acc_rows],
            title=title_for("spec_search", label, cfg.seed, len(questions), "accuracy vs large-model tokens"),
            xlabel="large-model decode tokens per question",
            ylabel="step accuracy",
            highlight=[s for s in names if s.startswith("spec_search")],
        ),
    )

    # -- 4. claims --------------------------------------------------------------------------------------------------
    claims = [
        Claim(
            "calib_step_accuracy",
            "large_model",
            "small_model",
            ">",
            text="precondition: the large model is more step-accurate than the small one (dev split)",
        )
    ]
    for p in prms:
        spec, lg, sm = sys_name("spec_search", p), sys_name("large_beam", p), sys_name("small_beam", p)
        gate = p != "oracle"  # the oracle is an upper bound, reported only
        claims += [
            Claim(
                "step_accuracy",
                spec,
                lg,
                ">",
                min_effect=-cfg.comparable_margin,
                gate=gate,
                text=f"[{p} PRM] SpecSearch step accuracy comparable to large-only (>= -{cfg.comparable_margin:g})",
            ),
            Claim(
                "step_accuracy", spec, sm, ">", gate=gate, text=f"[{p} PRM] SpecSearch more accurate than small-only"
            ),
            Claim(
                "large_decode_tokens",
                spec,
                lg,
                "<",
                gate=gate,
                text=f"[{p} PRM] fewer large-model decode tokens than large-only",
            ),
            Claim(
                "flops_rel",
                spec,
                lg,
                "<",
                min_effect=1.0 - 1.0 / cfg.speedup_target,
                gate=gate,
                text=f"[{p} PRM] cost-model speedup FLOPs(large-only)/FLOPs(SpecSearch) > {cfg.speedup_target:g}",
            ),
            Claim("wall_s", spec, lg, "<", gate=False, text=f"[{p} PRM] lower wall time than large-only (not gated)"),
            Claim(
                "proj_rel",
                spec,
                lg,
                "<",
                gate=False,
                text=f"[{p} PRM] projected cost below large-only with a {cfg.projected_ratio:g}x smaller drafter",
            ),
        ]
    if cfg.ablations:
        claims += [
            Claim(
                "step_accuracy",
                "spec_search",
                "accept_all",
                ">",
                gate=False,
                text="quality-preserving rejection raises step accuracy over accepting every draft",
            ),
            Claim(
                "step_accuracy",
                "spec_search",
                "fixed_threshold",
                ">",
                gate=False,
                text=f"EMA threshold vs a fixed threshold {cfg.fixed_threshold:g} (step accuracy)",
            ),
        ]
        if "cold_start_all" in systems:
            claims += [
                Claim(
                    "step_accuracy",
                    "spec_search",
                    "cold_start_all",
                    ">",
                    min_effect=-cfg.comparable_margin,
                    gate=False,
                    text=f"cold-start ablation: {cold} large root thought(s) vs the large model writing the whole "
                    "root (step accuracy, comparable)",
                ),
                Claim(
                    "large_decode_tokens",
                    "spec_search",
                    "cold_start_all",
                    "<",
                    gate=False,
                    text="cold-start ablation: fewer large-model decode tokens than a large-model-written root",
                ),
            ]
    return ctx.finish(claims)
