"""Reproduction: PLE vs SFT, RAFT and always-rank DPO on positive travel-story continuation (held-out, no principle).

Paper claim (Liu, Xu and Geng, ICML 2025): distilling a principle into the policy with PLE's threshold-gated
objective (ranking loss y^p > y when the principle-guided answer is better by more than tau_i, weighted SFT on both
otherwise, tau_{i+1} = alpha tau_i) reaches a higher reward-model score than SFT, PPO, DPO and RAFT.

Task (`task.py`). Queries ask for one sentence continuing a neutral or negative travel-story opening about a
country of lmlab's `countries` suite; the principle is ``"Please reply in a positive, warm and enthusiastic way."``
prefixed to the user turn; the reward R = U is a transparent lexicon utility (distinct positive minus negative
words, negation-aware, minus repetition and too-short penalties). D_sft: neutral continuations (format, no
sentiment). Train queries come from the train-split countries, held-out queries from the test split.

Systems (same SFT start, same queries, same steps, learning rate and seeds; all but raft_plain share round 0's
pair): ``sft`` (the start), ``ple``, ``ple_fixed`` (constant threshold: the "progressive" ablation), ``raft_plain``
(the paper's RAFT: SFT on the best of `raft_k` = 4 plain samples, regenerated each round, never the principle),
``raft_guided`` (SFT on the better of y and y^p: a principle-aware RAFT), ``always_rank_dpo`` (DPO on y^p > y for
every pair), optionally ``ple_rank_only``. No system is tuned: PLE runs at the paper's tau0 = 0.2, alpha = 0.9 and
DPO at beta = 0.1, all at one shared learning rate.

Claims (computed from this run, one value per held-out query, CIs a bootstrap over queries): held-out reward
without the principle of PLE above SFT, always-rank DPO and the paper's RAFT (``raft_plain``) (gated); above
``raft_guided``, PLE with a fixed threshold and rank-only (reported); ``raft_plain`` above SFT (reported: a baseline
below its start would be a bug); reference NLL of PLE below SFT's (reported: the degeneration guard, expected about
equal).
Reported premise: the principle raises the reward (round 0, train queries; held-out with `eval_guided`).
Mechanism check: on the pairs PLE routes to its ranking loss, training raises the margin s(y^p) - s(y).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from lmlab.core.stats.seeding import derive_seed
from lmlab.methods.alignment.ple import method as M
from lmlab.methods.alignment.ple.task import (
    PRINCIPLE,
    Query,
    distinct_n,
    guided_text,
    make_queries,
    neutral_continuation,
    place_of,
    sentiment_reward,
    utility_parts,
)
from lmlab.results import Claim

NAMES = {
    "sft": "SFT only",
    "ple": "PLE",
    "ple_fixed": "PLE, fixed threshold",
    "ple_rank_only": "PLE, ranking loss on every pair",
    "raft_plain": "RAFT (best of 4 plain samples, the paper's)",
    "raft_guided": "RAFT on PLE's pair (best of y, y^p)",
    "always_rank_dpo": "always-rank DPO",
}


def options(cfg: Any) -> M.PLEOptions:
    """The loop's `PLEOptions` from the config (shared by every system)."""
    return M.PLEOptions(
        tau0=cfg.tau0, alpha=cfg.alpha, iterations=cfg.iterations, queries_per_iter=cfg.queries_per_iter,
        threshold_schedule=cfg.threshold_schedule, reverse_case=cfg.reverse_case, reward_norm=cfg.reward_norm,
        rank_kind=cfg.rank_kind, rank_beta=cfg.rank_beta, rank_sft_weight=cfg.rank_sft_weight,
        wsft_temperature=cfg.wsft_temperature, dpo_beta=cfg.dpo_beta, raft_k=cfg.raft_k, lr=cfg.lr, epochs=cfg.epochs,
        train_batch=cfg.train_batch, do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p,
    )  # fmt: skip


def build_data(ctx: Any, cfg: Any) -> tuple[list[Query], list[str], list[Query], list[Query], list[str]]:
    """``(sft queries, sft responses, train queries, held-out queries, held-out neutral references)``."""
    train_places = [place_of(e) for e in ctx.data("countries", None, split="train", task="capital")]
    test_places = [place_of(e) for e in ctx.data("countries", None, split="test", task="capital")]
    if not train_places or not test_places:
        raise ValueError("the countries suite gave no train or test countries (check --limit)")
    sft_q = make_queries(train_places, cfg.n_sft, seed=cfg.seed, name="sft")
    sft_y = [neutral_continuation(q.place, seed=cfg.seed, name="sft", j=j) for j, q in enumerate(sft_q)]
    train_q = make_queries(train_places, cfg.iterations * cfg.queries_per_iter, seed=cfg.seed, name="query")
    test_q = make_queries(test_places, cfg.n_test, seed=cfg.seed, name="test")
    refs = [neutral_continuation(q.place, seed=cfg.seed, name="ref", j=j) for j, q in enumerate(test_q)]
    return sft_q, sft_y, train_q, test_q, refs


def run(cfg: Any, ctx: Any) -> Any:
    from lmlab.core.training.partial import FrozenTrunk

    opts = options(cfg)
    sft_q, sft_y, train_q, test_q, refs = build_data(ctx, cfg)
    model, tok = ctx.load_model()
    n_layers = len(model.model.layers)
    if cfg.k_layers > n_layers:
        raise ValueError(f"k_layers must be <= {n_layers} (the blocks of {cfg.model}), got {cfg.k_layers}")
    trunk = FrozenTrunk(model, cfg.k_layers)
    kw = dict(chat=cfg.chat, system=cfg.system_prompt)
    seed = derive_seed(cfg.seed, "ple-loop")

    t0 = time.perf_counter()
    sft, sft_losses = M.sft_train(trunk, tok, [q.text for q in sft_q], sft_y, lr=cfg.sft_lr, epochs=cfg.sft_epochs,
                                  batch_size=8, seed=derive_seed(cfg.seed, "sft"), **kw)  # fmt: skip
    ctx.record_value("sft", "train_s", time.perf_counter() - t0, unit="s", note=f"SFT on {len(sft_q)} examples")
    gen = M.PolicyGenerator(model, tok, max_new_tokens=cfg.max_new_tokens, batch_size=cfg.gen_batch)

    results: dict[str, M.PLEResult] = {}
    for system in ctx.progress(list(cfg.systems), "online loop per system"):
        t0 = time.perf_counter()
        results[system] = M.ple_align(trunk, tok, [q.text for q in train_q], PRINCIPLE, sentiment_reward, gen,
                                      system=system, opts=opts, init_policy=sft, init_tag="sft",
                                      chat=cfg.chat, system_prompt=cfg.system_prompt, seed=seed)  # fmt: skip
        ctx.record_value(system, "train_s", time.perf_counter() - t0, unit="s",
                         note="online loop: generation, scoring, trunk cache, training")  # fmt: skip

    # ---- held-out: greedy, plain queries (no principle)
    test_x = [q.text for q in test_q]
    ids = [q.id for q in test_q]
    heads = M.prompt_heads(tok, test_x, chat=cfg.chat, system=cfg.system_prompt)
    ref_rows = M.encode_rows(trunk, tok, test_x, refs, **kw)
    policies = {"sft": sft, **{s: r.policy for s, r in results.items()}}
    outputs: dict[str, list[str]] = {}
    for name, pol in ctx.progress(list(policies.items()), "held-out decoding"):
        outputs[name] = gen(pol, heads, tag=f"eval:{name}", do_sample=False)
        _record_eval(ctx, name, outputs[name], ids, M.row_logps(pol, ref_rows))
    if cfg.eval_guided:
        heads_p = M.prompt_heads(tok, [guided_text(x) for x in test_x], chat=cfg.chat, system=cfg.system_prompt)
        outputs["sft_guided"] = gen(sft, heads_p, tag="eval:sft_guided", do_sample=False)
        _record_eval(ctx, "sft_guided", outputs["sft_guided"], ids, None)

    # ---- the loop's own numbers: thresholds, routing, premise, mechanism
    rows = _loop_tables(ctx, results)
    first = results["ple"].records[0]  # round 0's pair is shared: same policy, queries and seed
    q0 = [f"r0/{j}" for j in range(len(first.queries))]
    ctx.record("principle@0", "train_reward", first.r_guided, clusters=q0, note="round 0: y^p ~ SFT(.|p + x)")
    ctx.record("plain@0", "train_reward", first.r_plain, clusters=q0, note="round 0: y ~ SFT(.|x)")
    has_rank = _record_mechanism(ctx, results["ple"])
    if "ple_fixed" in results and cfg.iterations > 1:
        for s in ("ple", "ple_fixed"):
            recs = results[s].records[1:]
            ctx.record(s, "rank_share_later", [float(c == M.RANK) for rec in recs for c in rec.routes],
                       clusters=[f"r{rec.iteration}/{j}" for rec in recs for j in range(len(rec.routes))],
                       note="pairs routed to the ranking loss in rounds >= 1 (per pair)")  # fmt: skip

    samples = [{"kind": "held_out", "id": i, "query": x, **{s: outputs[s][j] for s in outputs},
                **{f"reward_{s}": utility_parts(outputs[s][j]).utility for s in outputs}}
               for j, (i, x) in enumerate(zip(ids, test_x))]  # fmt: skip
    for rec in results["ple"].records:
        samples += [{"kind": "ple_pair", "round": rec.iteration, "tau": rec.tau, "query": rec.queries[j],
                     "y": rec.plain[j], "y_p": rec.guided[j], "r": float(rec.r_plain[j]),
                     "r_p": float(rec.r_guided[j]), "gap": float(rec.gap[j]),
                     "route": M.ROUTE_NAMES[int(rec.routes[j])]}
                    for j in range(len(rec.queries))]  # fmt: skip
    raft_plain_records = results["raft_plain"].records if "raft_plain" in results else []
    for rec in raft_plain_records:
        samples += [{"kind": "raft_plain_pick", "round": rec.iteration, "query": rec.queries[j],
                     "samples": rec.candidates[j], "rewards": [float(v) for v in rec.r_candidates[j]],
                     "target": rec.targets[j]} for j in range(len(rec.queries))]  # fmt: skip
    ctx.add_samples(samples)
    ctx.flag("generated_tokens", gen.generated_tokens)
    ctx.flag("tau_schedule", [r["tau"] for r in rows if r["system"] == "ple"])
    ctx.flag("sft_loss_first_last", [sft_losses[0], sft_losses[-1]])
    _figures(ctx, cfg, list(policies) + (["sft_guided"] if cfg.eval_guided else []), rows)
    ctx.note(
        f"Reward = rule-based lexicon utility U (task.py), the annotator's truth and the reward model at once. "
        f"Top {cfg.k_layers} of {n_layers} blocks trained on a cached frozen trunk; SFT on {len(sft_q)} neutral "
        f"continuations, then {cfg.iterations} rounds x {cfg.queries_per_iter} fresh queries per system "
        f"(raft_plain: {cfg.raft_k} plain samples per query); held-out: {len(test_q)} test-split queries, greedy, "
        f"without the principle. No system tuned (paper defaults)."
    )
    return ctx.finish(_claims(cfg, results, has_rank))


def _record_eval(ctx: Any, name: str, texts: Sequence[str], ids: Sequence[str], ref: Any) -> None:
    parts = [utility_parts(t) for t in texts]
    note = "greedy, held-out query without the principle" if name != "sft_guided" else "SFT *with* the principle"
    ctx.record(name, "reward", [p.utility for p in parts], clusters=ids, note=note)
    ctx.record(name, "sentiment", [p.sentiment for p in parts], clusters=ids, note="clipped lexicon part of U")
    ctx.record(name, "repetition", [p.repetition for p in parts], clusters=ids, note="1 - distinct / all bigrams")
    ctx.record_value(name, "distinct_2", distinct_n(list(texts), 2), note="corpus distinct-2 of the held-out outputs")
    if ref is not None:
        nll = (-ref.mean).double().numpy()  # (n,) mean-token NLL of the neutral reference continuation
        ctx.record(name, "ref_nll", nll, clusters=ids, note="NLL per token of neutral reference text (PPL guard)")
        ctx.record_value(name, "ref_ppl", float(math.exp(float(np.mean(nll)))), note="exp(mean ref_nll)")


def _mean(a: Any) -> float | None:
    """Mean of a record's array, None where the system has none (raft_plain has no pair: no r^p, gap, margin)."""
    a = np.asarray(a, dtype=np.float64)
    return float(a.mean()) if a.size else None


def _loop_tables(ctx: Any, results: dict[str, M.PLEResult]) -> list[dict[str, Any]]:
    rows = []
    for s, res in results.items():
        for rec in res.records:
            # mean_r: every plain sample of the round (raft_plain: all k per query); mean_r_target: what RAFT SFTs on
            r_plain = rec.r_candidates if rec.r_candidates.size else rec.r_plain
            rows.append({"system": s, "round": rec.iteration, "tau": round(rec.tau, 6),
                         "share_rank": rec.share(M.RANK), "share_wsft": rec.share(M.WSFT),
                         "share_rank_rev": rec.share(M.RANK_REV), "mean_r": _mean(r_plain),
                         "mean_r_p": _mean(rec.r_guided), "mean_gap_norm": _mean(rec.gap),
                         "mean_r_target": _mean(rec.r_targets),
                         "margin_before": _mean(rec.margin_before), "margin_after": _mean(rec.margin_after),
                         "loss_first": rec.losses[0], "loss_last": rec.losses[-1]})  # fmt: skip
    ctx.table("rounds", rows)
    return rows


def _record_mechanism(ctx: Any, res: M.PLEResult) -> bool:
    """Margins s(y^p) - s(y) of the pairs PLE routed to its ranking loss, before and after the round's steps."""
    before, after, cl = [], [], []
    for rec in res.records:
        for j in np.flatnonzero(rec.routes == M.RANK):
            before.append(float(rec.margin_before[j]))
            after.append(float(rec.margin_after[j]))
            cl.append(f"r{rec.iteration}/{j}")
    if not cl:
        ctx.note("PLE routed no pair to the ranking loss in any round: the mechanism check is skipped.")
        return False
    ctx.record("ple", "rank_pair_margin", after, clusters=cl, note="after the round's steps, mean log-probs")
    ctx.record("ple_before", "rank_pair_margin", before, clusters=cl, note="before the round's steps")
    return True


def _claims(cfg: Any, results: dict[str, M.PLEResult], has_rank: bool) -> list[Claim]:
    txt = "held-out reward without the principle: PLE above {}"
    claims = [Claim("reward", "ple", "sft", ">", text=txt.format("SFT"))]
    for b in ("always_rank_dpo", "raft_plain"):  # the paper's baselines (its RAFT: best of 4 plain samples)
        if b in results:
            claims.append(Claim("reward", "ple", b, ">", text=txt.format(NAMES[b]) + " (expected >=)"))
    for b in ("raft_guided", "ple_fixed", "ple_rank_only"):  # not the paper's: a principle-aware RAFT, ablations
        if b in results:
            claims.append(Claim("reward", "ple", b, ">", gate=False, text=txt.format(NAMES[b]) + " (reported)"))
    if "raft_plain" in results:
        claims.append(Claim("reward", "raft_plain", "sft", ">", gate=False,
                            text="held-out reward: the paper's RAFT above SFT, its start (reported; below would be "
                                 "a bug)"))  # fmt: skip
    claims.append(Claim("ref_nll", "ple", "sft", "<", gate=False,
                        text="reference-text NLL: PLE not above SFT (reported; expected about equal)"))  # fmt: skip
    claims.append(Claim("train_reward", "principle@0", "plain@0", ">", gate=False,
                        text="premise: the principle raises SFT's reward (round 0, train queries)"))  # fmt: skip
    if cfg.eval_guided:
        claims.append(Claim("reward", "sft_guided", "sft", ">", gate=False,
                            text="premise: the principle raises SFT's held-out reward (PLE's target)"))  # fmt: skip
    if "ple_fixed" in results and cfg.iterations > 1:
        claims.append(Claim("rank_share_later", "ple", "ple_fixed", ">", paired=False, gate=False,
                            text="the decaying threshold routes more pairs to the ranking loss in rounds >= 1 than a "
                                 "fixed one (reported; on-policy data differ)"))  # fmt: skip
    if has_rank:
        claims.append(Claim("rank_pair_margin", "ple", "ple_before", ">", mechanism=True,
                            text="the ranking loss raises s(y^p) - s(y) on the pairs routed to it"))  # fmt: skip
    return claims


def _figures(ctx: Any, cfg: Any, systems: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
    from lmlab.core.report.plotting import bar_with_ci, lines, title_for

    bars = [m for s in systems for m in ctx.metrics if m.metric == "reward" and m.system == s]
    ctx.add_figure("reward", bar_with_ci(bars, title=title_for("ple", str(cfg.model), cfg.seed, cfg.n_test,
                                                               "held-out reward (no principle)"),
                                         ylabel="U (lexicon utility)", highlight=("ple",)))  # fmt: skip
    rounds = list(range(cfg.iterations))
    series = {f"{s}: share ranked": [r["share_rank"] for r in rows if r["system"] == s]
              for s in ("ple", "ple_fixed") if any(r["system"] == s for r in rows)}  # fmt: skip
    tau = {"ple: tau_i": [r["tau"] for r in rows if r["system"] == "ple"]}
    ctx.add_figure("routing", lines(rounds, series, title=title_for("ple", str(cfg.model), cfg.seed,
                                                                    cfg.queries_per_iter, "routing per round"),
                                    xlabel="round i", ylabel="share of pairs ranked", secondary=tau,
                                    secondary_label="threshold"))  # fmt: skip
