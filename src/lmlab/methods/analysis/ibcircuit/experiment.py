"""Reproduction: IBCircuit vs attribution patching (EAP), head importance (HAP) and random heads, per task.

For each task in ``cfg.tasks``:

1. Prompts: `n_fit` fit prompts and `n_eval` held-out prompts with aligned positions (`task.py`). ``induction``
   runs on the hand-built 2-layer model whose circuit is known ((0, 0) previous-token head, (1, 0) induction head);
   ``ioi`` and ``greater_than`` on ``cfg.model`` (SmolLM2-135M by default: 30 layers x 9 heads = 270 nodes).
2. Scores (L, H) from the fit prompts: IBCircuit's batch-mean keep-rates λ̄, EAP (clean vs corrupted prompts),
   HAP, `n_random` random rankings, and (induction, or with ``exact_patching``) exact one-head mean-ablation patching.
3. The same evaluation for every ranking: keep its top-k heads, replace every other head's output by its
   position-wise mean over the fit prompts, and measure on each held-out prompt the task metric m(C) (IOI: logit
   difference IO − S; greater-than: PD), the normalised faithfulness F = (m(C) − m(∅)) / (m̄(M) − m̄(∅)) (∅: every
   head ablated, M: full model; 0 = nothing recovered, 1 = the full model, > 1 when the ablated heads worked against
   the answer) and KL(p_M ‖ p_C). Per prompt, ``*_auc`` averages over the ks (area under the curve vs circuit size);
   ``*_faithfulness_distance_auc`` is mean_k |F(C_k) − 1| (`M.faithfulness_distance`, F the ratio of prompt means).
4. Induction: AUROC of each ranking against the known heads (the paper's RQ1 ROC; SmolLM2 has no published
   circuit).

Claims (prompts are the unit, paired): see `_claims`. Gated: the faithfulness distance |F − 1| (lower: a circuit
that overshoots the full model's logit difference is as unfaithful as one that falls short by as much) and KL
(lower), both averaged over the ks. The raw metric (the paper's plotted axis, higher) is reported, not gated: above
F = 1 a larger value is an overshoot, not a closer circuit. IOI gates; greater-than is reported either way (the
paper is weaker there); induction's AUROC is a ground-truth check.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from lmlab.methods.analysis.ibcircuit import method as M
from lmlab.methods.analysis.ibcircuit import task as T
from lmlab.results import Claim, ClaimResult, claim_result

BASELINES = ("eap", "hap", "random")
DISTANCE = "_faithfulness_distance_auc"  # metric suffix of mean_k |F(C_k) − 1|, a statistic of prompt means
TASK_METRIC = {"ioi": "logit difference", "greater_than": "probability difference", "induction": "copy logit margin"}


def _batches(cfg: Any, ctx: Any, name: str, tok: Any, vocab: int) -> tuple[M.CircuitBatch, M.CircuitBatch]:
    n_eval = cfg.n_eval if cfg.limit is None else max(1, min(cfg.n_eval, cfg.limit))
    if name == "induction":
        fit = T.induction_dataset(cfg.n_fit, cfg.seed, "fit")
        ev = T.induction_dataset(max(2, n_eval), cfg.seed, "eval").subset(range(n_eval))
    else:
        build = T.ioi_dataset if name == "ioi" else T.greater_than_dataset
        fit = build(tok, cfg.n_fit, cfg.seed, "fit", vocab=vocab)
        ev = build(tok, max(2, n_eval), cfg.seed, "eval", vocab=vocab).subset(range(n_eval))
    # --limit caps the scored (held-out) prompts; the fit batch is the method's training data and needs >= 2
    ctx.data_info[f"{name}/eval"] = {"n": ev.size, "seed": cfg.seed, "builder": f"ibcircuit.task:{name}"}
    ctx.flag(f"{name}_fit_prompts", fit.size)
    return fit, ev


def _scores(cfg: Any, ctx: Any, name: str, model: Any, fit: M.CircuitBatch, ref: torch.Tensor) -> dict[str, Any]:
    n_layers, n_heads, _ = M.check_model(model)
    steps = cfg.induction_steps if name == "induction" else cfg.steps
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    ib = M.IBCircuit(
        model,
        per_example=cfg.per_example,
        alpha=cfg.alpha,
        beta=cfg.beta,
        lr=cfg.lr,
        steps=steps,
        init_mean=cfg.init_mean,
        init_std=cfg.init_std,
        loss=cfg.loss,
        seed=cfg.ib_seed,
    )
    bar = iter(ctx.progress(range(steps), desc=f"{name} IB steps", total=steps))
    out["ibcircuit"] = ib.fit(fit, callback=lambda *_: next(bar, None)).cpu()
    ctx.record_value("ibcircuit", f"{name}_fit_time", time.perf_counter() - t0, unit="s")
    if ib.history:
        h0, h1 = ib.history[0], ib.history[-1]
        ctx.table(
            f"{name}_ib_history",
            [
                {"step": i, **r}
                for i, r in enumerate(ib.history)
                if i % max(1, len(ib.history) // 10) == 0 or i == len(ib.history) - 1
            ],
        )
        ctx.flag(f"{name}_ib_loss", {"first": h0, "last": h1})
    counts, edges = ib.lambda_histogram(10)
    ctx.table(
        f"{name}_lambda_histogram",
        [{"bin": f"[{edges[i]:.1f}, {edges[i + 1]:.1f})", "heads": c} for i, c in enumerate(counts)],
    )
    ctx.table(f"{name}_thresholds", [{"threshold": t, "heads": len(ib.circuit(threshold=t))} for t in cfg.thresholds])
    t0 = time.perf_counter()
    out["eap"] = M.eap_node_scores(model, fit)
    ctx.record_value("eap", f"{name}_fit_time", time.perf_counter() - t0, unit="s")
    t0 = time.perf_counter()
    out["hap"] = M.hap_scores(model, fit, ref if cfg.hap_reference == "mean" else None)
    ctx.record_value("hap", f"{name}_fit_time", time.perf_counter() - t0, unit="s")
    out["random"] = [M.random_scores(n_layers, n_heads, cfg.seed * 1000 + r) for r in range(cfg.n_random)]
    if name == "induction" or cfg.exact_patching:
        out["patching"] = M.patching_scores(model, fit, ref)
    return out


def _curves(
    cfg: Any, ctx: Any, name: str, model: Any, ev: M.CircuitBatch, ref: torch.Tensor, scores: dict[str, Any]
) -> dict[str, Any]:
    """Per system: per-prompt metric, normalised faithfulness and KL at every k; records the AUC metrics and rows.

    Every system is scored here, on the same held-out prompts, the same reference means (`ref`), the same full-model
    logits, the same all-ablated metric m(∅) and the same ks.
    """
    n_layers, n_heads, _ = M.check_model(model)
    ks = sorted({min(k, n_layers * n_heads) for k in cfg.ks})
    ctx.flag(f"{name}_ks", ks)  # the circuit sizes of this task's curves (clipped to its head count)
    with torch.no_grad():
        full = M.answer_logits(model, ev.input_ids, ev.answer_pos)
    none = M.evaluate_circuit(model, [], ev, reference=ref, full_logits=full)  # m(∅), shared by every system
    gap = none.gap
    ctx.flag(f"{name}_full_minus_ablated", round(gap, 4))
    if gap <= 0:
        ctx.note(
            f"{name}: the full model's metric ({float(none.full.mean()):.3f}) is not above the all-ablated one "
            f"({float(none.ablated.mean()):.3f}): the model does not do the task, normalised faithfulness is undefined"
        )
    fields = ("metric", "faithfulness", "kl")
    curve: dict[str, dict[str, list[float]]] = {}
    per_prompt: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for system, sc in ctx.progress(list(scores.items()), desc=f"{name} scoring"):
        rankings = sc if isinstance(sc, list) else [sc]
        per_prompt[system] = {}
        for k in ks:
            evs = [
                M.evaluate_circuit(
                    model, M.top_k_heads(s, k), ev, reference=ref, full_logits=full, ablated_metric=none.metric
                )
                for s in rankings
            ]
            # (B,) each, averaged over the random draws (one ranking for the other systems)
            per_prompt[system][k] = {f: torch.stack([getattr(e, f) for e in evs]).mean(0) for f in fields}
        auc = {f: torch.stack([per_prompt[system][k][f] for k in ks]).mean(0) for f in fields}
        ctx.record(system, f"{name}_metric_auc", auc["metric"].tolist(), clusters=ev.ids)
        ctx.record(system, f"{name}_faithfulness_auc", auc["faithfulness"].tolist(), clusters=ev.ids)
        ctx.record(system, f"{name}_kl_auc", auc["kl"].tolist(), clusters=ev.ids, unit="nats")
        for k in ks:
            # the raw m(C_k) per prompt: the rows `_distance_rows` re-takes |F − 1| from in every bootstrap resample
            ctx.record(system, f"{name}_metric@{k}", per_prompt[system][k]["metric"].tolist(), clusters=ev.ids)
            ctx.record(system, f"{name}_faithfulness@{k}", per_prompt[system][k]["faithfulness"].tolist(),
                       clusters=ev.ids)  # fmt: skip
            ctx.record(system, f"{name}_kl@{k}", per_prompt[system][k]["kl"].tolist(), clusters=ev.ids, unit="nats")
        curve[system] = {f: [float(per_prompt[system][k][f].mean()) for k in ks] for f in fields}
        # |F(C_k) − 1| per k; the prompt mean of F is the ratio of means (one shared gap m̄(M) − m̄(∅))
        curve[system]["distance"] = [abs(f - 1.0) for f in curve[system]["faithfulness"]]
    ctx.record("all_ablated", f"{name}_metric_auc", none.metric.tolist(), clusters=ev.ids)
    ctx.record("full_model", f"{name}_metric_auc", none.full.tolist(), clusters=ev.ids)
    for system in scores:
        _record_distance(ctx, name, system)
    # per k: is IBCircuit's circuit closer to the full model than each baseline's on both |F − 1| and KL (means)?
    wins = {}
    for b in (s for s in scores if s != "ibcircuit"):
        wins[b] = sum(
            curve["ibcircuit"]["distance"][i] < curve[b]["distance"][i]
            and curve["ibcircuit"]["kl"][i] < curve[b]["kl"][i]
            for i in range(len(ks))
        )
    ctx.flag(f"{name}_k_wins_of_{len(ks)}", wins)
    ctx.table(
        f"{name}_curve",
        [
            {
                "k": k,
                **{f"{s}_faithfulness": round(curve[s]["faithfulness"][i], 4) for s in curve},
                **{f"{s}_distance": round(curve[s]["distance"][i], 4) for s in curve},
                **{f"{s}_kl": round(curve[s]["kl"][i], 4) for s in curve},
                **{f"{s}_metric": round(curve[s]["metric"][i], 4) for s in curve},
            }
            for i, k in enumerate(ks)
        ],
    )
    ctx.add_samples(
        {
            "task": name,
            "id": ev.ids[i],
            "prompt": ev.prompts[i] if ev.prompts else "",
            "full_metric": float(none.full[i]),
            "ablated_metric": float(none.metric[i]),
            **{
                f"{s}_faithfulness@{k}": round(float(per_prompt[s][k]["faithfulness"][i]), 4)
                for s in ("ibcircuit", "eap")
                for k in ks
            },
        }
        for i in range(ev.size)
    )
    return {"ks": ks, **curve}


def _distance_rows(ctx: Any, name: str, system: str) -> tuple[np.ndarray, list[Any] | None]:
    """A system's recorded rows (B, K + 2) = [m(C_k) for k in ks, m(M), m(∅)] per held-out prompt, and the prompt
    ids (the independent unit)."""
    ks = ctx.flags[f"{name}_ks"]
    cols = [ctx.values(system, f"{name}_metric@{k}") for k in ks]
    cols += [ctx.values("full_model", f"{name}_metric_auc"), ctx.values("all_ablated", f"{name}_metric_auc")]
    return np.asarray(cols, dtype=np.float64).T, ctx.clusters(system, f"{name}_metric@{ks[0]}")


def _distance(rows: np.ndarray) -> float:
    """mean_k |F(C_k) − 1| of (B, K + 2) rows: F's prompt means (the gap m̄(M) − m̄(∅) included) are re-taken on
    whatever rows a bootstrap resample drew."""
    return M.faithfulness_distance(rows[:, :-2], rows[:, -2], rows[:, -1])


def _record_distance(ctx: Any, name: str, system: str) -> None:
    """The metric row of mean_k |F(C_k) − 1| with its CI over prompts (resampled prompts, F re-taken)."""
    from lmlab.core.stats.seeding import derive_seed
    from lmlab.core.stats.uncertainty import paired_bootstrap_stat

    metric = f"{name}{DISTANCE}"
    rows, ids = _distance_rows(ctx, name, system)
    note = "mean over k of abs(F(C_k) - 1), F = (m(C) - m(none)) / (m(full) - m(none)) of prompt means"
    row = ctx.record_value(system, metric, _distance(rows), note=note)
    _, row.ci_low, row.ci_high = paired_bootstrap_stat(rows, None, _distance, clusters=ids,
                                                       seed=derive_seed(ctx.cfg.seed, system, metric))  # fmt: skip
    row.n = len(set(ids)) if ids is not None else len(rows)


def _figures(
    cfg: Any, ctx: Any, name: str, model_label: str, n: int, curve: dict[str, Any], scores: dict[str, Any]
) -> None:
    from lmlab.core.report.plotting import heatmap, lines, title_for

    ks = curve["ks"]
    systems = [s for s in curve if s != "ks"]
    ctx.add_figure(
        f"{name}_faithfulness",
        lines(
            ks,
            {s: curve[s]["faithfulness"] for s in systems},
            secondary={f"{s} KL": curve[s]["kl"] for s in ("ibcircuit",)},
            secondary_label="KL(full || circuit), nats",
            xlabel="heads kept (k), others mean-ablated",
            ylabel="faithfulness (m(C) - m(none)) / (m(full) - m(none))",
            title=title_for("ibcircuit", model_label, cfg.seed, n, f"{name}: faithfulness vs circuit size"),
        ),
    )
    ctx.add_figure(
        f"{name}_lambda",
        heatmap(
            scores["ibcircuit"].numpy(),
            cmap="viridis",
            center=False,
            title=title_for("ibcircuit", model_label, cfg.seed, n, f"{name}: keep-rate λ per head"),
        ),
    )


def run(cfg: Any, ctx: Any) -> Any:
    torch.manual_seed(cfg.seed)
    real: tuple[Any, Any] | None = None
    # no ctx.budget.check between tasks: a slow or busy machine would abort a run that is otherwise fine (the smoke
    # run failed at 11.8 s of 10 beside other jobs); the runner records the wall time against the budget instead
    for name in cfg.tasks:
        if name == "induction":
            model, tok, label = T.make_induction_model(cfg.seed), None, "induction-2L"
            ctx.models["induction-2L"] = {
                "spec": "induction-2L",  # the run header names every model by its spec
                "params": sum(p.numel() for p in model.parameters()),
                "n_layers": 2,
                "n_heads": 4,
                "built": "by hand (ibcircuit.task)",
            }
        else:
            real = real or ctx.load_model(cfg.model)
            model, tok = real
            label = cfg.model
        model.eval()
        vocab = int(model.get_output_embeddings().weight.shape[0])
        fit, ev = _batches(cfg, ctx, name, tok, vocab)
        ref = M.head_means(model, fit)  # the mean-ablation reference of every method: fit-prompt means
        scores = _scores(cfg, ctx, name, model, fit, ref)
        curve = _curves(cfg, ctx, name, model, ev, ref, scores)
        _figures(cfg, ctx, name, label, ev.size, curve, scores)
        if name == "induction":
            truth = T.induction_truth()
            ctx.table(
                "induction_auroc",
                [
                    {
                        "system": s,
                        "auroc": round(M.auroc(sc if not isinstance(sc, list) else torch.stack(sc).mean(0), truth), 4),
                        "top2_are_known": set(M.top_k_heads(sc if not isinstance(sc, list) else sc[0], 2))
                        == set(T.KNOWN_HEADS),
                    }
                    for s, sc in scores.items()
                ],
            )
            for row in ctx.tables["induction_auroc"]:
                ctx.record_value(row["system"], "induction_auroc", row["auroc"])
            ctx.flag("induction_known_heads_found", ctx.tables["induction_auroc"][0]["top2_are_known"])
    ctx.note(
        "The TransformerLens cross-check of the attribution scores is a test, not part of the run: "
        "tests/integration/test_ibcircuit_tl.py (skipped where transformer_lens is not importable)."
    )
    ctx.note(
        "Every ranking is scored by the same position-wise mean ablation (fit-prompt means) at the same ks on the "
        "same held-out prompts; faithfulness F = (m(C) - m(none)) / (m(full) - m(none)), which exceeds 1 when the "
        "ablated heads worked against the answer (a larger logit difference than the full model, not a closer "
        "match). The gate is abs(F - 1) (mean over the ks) and KL; the raw metric is reported."
    )
    return _finish(ctx, _claims(cfg))


def _claims(cfg: Any) -> list[Claim]:
    """Per task and baseline: |F − 1| (lower), KL (lower), both gated on IOI; the raw metric (higher), reported.

    Each is the mean over the circuit sizes k (the spec asks "at every k": the ``*_k_wins_of_K`` flag counts the ks
    where IBCircuit is ahead on both |F − 1| and KL). The raw metric is not gated: it rewards a circuit that
    overshoots the full model (F > 1), which is a deviation from the model, not a closer match.
    """
    claims: list[Claim] = []
    for name in cfg.tasks:
        # IOI decides the verdict (the paper's headline); without IOI in the run, the induction ground truth does
        gate = name == "ioi" or ("ioi" not in cfg.tasks and name == "induction")
        label = TASK_METRIC[name]
        for b in BASELINES:
            claims.append(
                Claim(
                    f"{name}{DISTANCE}",
                    "ibcircuit",
                    b,
                    "<",
                    gate=gate,
                    text=f"{name}: IBCircuit's circuits keep the full model's {label} more closely than {b}'s: "
                    f"abs(F - 1), F = (m(C) - m(none)) / (m(full) - m(none)), mean over the circuit sizes k "
                    f"(per k: the {name}_k_wins flag)",
                )
            )
            claims.append(
                Claim(
                    f"{name}_kl_auc",
                    "ibcircuit",
                    b,
                    "<",
                    gate=gate,
                    text=f"{name}: IBCircuit's circuits are closer to the full model in KL than {b}'s (mean over k)",
                )
            )
            claims.append(
                Claim(
                    f"{name}_metric_auc",
                    "ibcircuit",
                    b,
                    ">",
                    gate=False,
                    text=f"{name} (reported; above F = 1 a larger value is an overshoot): IBCircuit's circuits keep "
                    f"a larger raw {label}, the paper's axis, than {b}'s (mean over k)",
                )
            )
    return claims


def _distance_claim(ctx: Any, claim: Claim) -> ClaimResult:
    """A claim on mean_k |F(C_k) − 1|, checked on both systems' recorded rows (`_distance_rows`).

    |F − 1| is not a mean of per-prompt values (F is a ratio of prompt means, then an absolute value), so `compare`'s
    bootstrap of per-prompt differences does not apply: the CI is the paired bootstrap over prompts of
    ``d(method) − d(baseline)`` with F re-taken in every resample, the same resampled prompts for both systems
    (`compare_statistic`), decided by `compare`'s rule. Where m̄(M) <= m̄(∅) (the model does not do the task) F is
    undefined and the check is inconclusive.
    """
    from lmlab.core.stats.seeding import derive_seed
    from lmlab.core.stats.uncertainty import compare_statistic

    name = claim.metric.removesuffix(DISTANCE)
    a, ids = _distance_rows(ctx, name, claim.method)
    b, ids_b = _distance_rows(ctx, name, claim.baseline)
    if ids != ids_b:
        raise ValueError(f"claim {claim.method} vs {claim.baseline}: the systems were recorded on different prompts")
    seed = derive_seed(ctx.cfg.seed, "claim", claim.method, claim.baseline, claim.metric)
    kw: dict[str, Any] = dict(direction=claim.direction, min_effect=claim.min_effect, seed=seed, clusters=ids)
    cmp = compare_statistic(a, b, _distance, **kw)
    null = compare_statistic(b, b, _distance, min_n=1, **kw)
    reason = f"{cmp.reason} (F re-taken from each resample's prompt means)"
    gap = float(a[:, -2].mean() - a[:, -1].mean())
    if gap <= 0:
        cmp, null = replace(cmp, status="inconclusive"), replace(null, status="inconclusive")
        reason = f"m(full) - m(none) = {gap:.4g} <= 0: the model does not do the task, F is undefined"
    return claim_result(claim, cmp, null.status, n_values=len(a), reason=reason)


def _finish(ctx: Any, claims: list[Claim]) -> Any:
    """`ctx.finish` for the claims on means; the |F − 1| claims (`_distance_claim`) in their place, in order."""
    result = ctx.finish(claims=[c for c in claims if not c.metric.endswith(DISTANCE)])
    checked = iter(result.claims)
    result.claims = [_distance_claim(ctx, c) if c.metric.endswith(DISTANCE) else next(checked) for c in claims]
    return result
