"""Reproduction: Autonomy-of-Experts vs a router MoE (tiny LMs from scratch) and norm-based choice in SmolLM2's FFNs.

Paper claim: AoE (experts rank themselves by the norm of a low-rank pre-activation, no router) outperforms a
traditional router + aux-loss MoE at comparable parameters and efficiency, with better expert-load balance and more
confident expert selection.

A. From scratch (faithful, tiny). Llama-style LMs (`d_model`, `n_layers`) whose every FFN is an `AoEMoE` or a
   `RouterMoE` (E experts, top-k, the same expert loop, the same aux loss and weight). AoE's d_wide is solved so
   that both models have the same total parameters (printed; the residual mismatch is a rounding of d_wide). Same
   word tokenizer, same data (fact_corpus documents + corpus prose, train split), same attention/embedding init and
   data order per seed, same AdamW schedule; `n_seeds` seeds. Held-out: 10% of the fact documents (unseen documents
   of the same facts) and corpus prose of the dev split. Metrics: per-window held-out loss (paired over seeds x
   windows), per-seed mean loss (CI across seeds), expert-load CV, max-load, load entropy and per-token routing
   entropy on the held-out tokens (per seed x layer), training tokens/s, and an interleaved timing (ABAB, medians)
   of inference forward and train step of the seed-0 models. Analytic FFN multiply-adds per token for both.
B. Pretrained proxy (SmolLM2). Each FFN's d_ff units are split into `b_experts` contiguous groups; per token only the
   top-`b_top_k` groups contribute. Rules: AoE low-rank norm ||x W_down^e|| (W_down from a rank-`b_d_low` SVD of each
   group's gate weights), exact intermediate norm (oracle), full gate norm, a linear router fitted by ridge regression
   to the oracle norms on train passages, random; the unsplit model as reference. Metric: per-passage NLL on held-out
   corpus passages (test split), oracle recall and load CV per layer, selection multiply-adds per token.

Claim check (computed from the recorded values): A: held-out loss AoE < router MoE and load CV AoE < router MoE
(gated); routing entropy AoE < MoE (reported). B: NLL AoE-low-rank < random (gated), AoE-low-rank < fitted router
(reported).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from lmlab.core.inference.tiny import make_word_tokenizer
from lmlab.core.report.plotting import bar_with_ci, title_for
from lmlab.core.stats.seeding import derive_seed
from lmlab.core.stats.timing import compare_timings
from lmlab.core.training.pretrain import count_parameters, encode_documents, lm_loss, pretrain_lm
from lmlab.methods.efficiency.aoe.method import (
    AoEMoE,
    DenseFFN,
    RouterMoE,
    aoe_d_wide_for_params,
    balance_stats,
    ffn_flops_per_token,
    fit_router,
    install_ffn,
    moe_layers,
    moefy,
    selection_macs,
    set_rule,
    total_aux_loss,
    unmoefy,
)
from lmlab.results import Claim

# ----------------------------------------------------------------------------------------------------------------
# part A: from-scratch AoE vs router MoE
# ----------------------------------------------------------------------------------------------------------------


def _texts(cfg: Any, ctx: Any) -> tuple[list[str], dict[str, list[str]], bool]:
    """Training texts and held-out texts per domain; whether the fact held-out set overlaps training (tiny data)."""
    docs = [ex.prompt for ex in ctx.data("fact_corpus", None, kind="document", n_facts=cfg.n_facts)]
    n_held = max(1, len(docs) // 10)
    overlap = len(docs) < 2
    held_fact = docs[-n_held:]
    train_fact = docs if overlap else docs[:-n_held]
    prose_train = [ex.prompt for ex in ctx.data("corpus", None, split="train")][: cfg.n_corpus_passages]
    info = dict(ctx.data_info.pop("corpus/train"), n=len(prose_train))
    ctx.data_info["corpus/train (part A)"] = info  # part B reads the train split again (router fit)
    prose_dev = [ex.prompt for ex in ctx.data("corpus", cfg.eval_windows, split="dev")]
    ctx.data_info["fact_corpus/documents"] = ctx.data_info.pop("fact_corpus/test")  # kind=document ignores split
    # interleave the two domains so that every region of the stream mixes them
    train: list[str] = []
    for i in range(max(len(train_fact), len(prose_train))):
        train += train_fact[i : i + 1] + prose_train[i : i + 1]
    return train, {"fact": held_fact, "prose": prose_dev}, overlap


def _build(kind: str, cfg: Any, vocab: int, seed: int, d_wide: int) -> Any:
    """A tiny Llama with every MLP replaced by the `kind` FFN; non-FFN weights depend on `seed` only."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    lc = LlamaConfig(
        vocab_size=vocab,
        hidden_size=cfg.d_model,
        intermediate_size=8,  # placeholder MLPs, replaced below
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_heads,
        max_position_embeddings=max(128, cfg.seq_len + 1),
        tie_word_embeddings=True,
        initializer_range=0.02,  # `init_normal_(std=0.02)` as in `moe.py`
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(lc, attn_implementation="sdpa")
        torch.manual_seed(derive_seed(seed, "ffn", kind))

        def make(_: int) -> Any:
            if kind in ("aoe", "aoe_no_aux"):
                return AoEMoE(cfg.d_model, cfg.n_experts, cfg.top_k, cfg.d_low, d_wide, renormalize=cfg.renormalize)
            if kind == "router_moe":
                return RouterMoE(cfg.d_model, cfg.n_experts, cfg.top_k, cfg.moe_d_ff, renormalize=cfg.renormalize)
            return DenseFFN(cfg.d_model, cfg.top_k * cfg.moe_d_ff)

        install_ffn(model, make)
    finally:
        torch.random.set_rng_state(state)
    return model


@torch.no_grad()
def _evaluate(model: Any, ids: torch.Tensor, seq_len: int, n_windows: int, batch: int) -> tuple[list[float], list]:
    """Per-window held-out losses and, per MoE layer, the (selected, logits) of all evaluated tokens."""
    n = max(1, min(n_windows, (len(ids) - 1) // seq_len))
    windows = torch.stack([ids[i * seq_len : i * seq_len + seq_len + 1] for i in range(n)])  # (n, seq + 1)
    layers = moe_layers(model)
    for m in layers:
        m.record = True
    sel: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in layers]
    losses: list[float] = []
    model.eval()
    try:
        for start in range(0, n, batch):
            b = windows[start : start + batch]
            logits = model(input_ids=b[:, :-1]).logits  # (b, seq, vocab)
            nll = F.cross_entropy(logits.float().transpose(1, 2), b[:, 1:], reduction="none")  # (b, seq)
            losses += nll.mean(dim=1).tolist()
            for j, m in enumerate(layers):
                if m.last is not None:
                    sel[j].append((m.last.selected, m.last.logits))
    finally:
        for m in layers:
            m.record, m.last = False, None
    return losses, sel


def _part_a(cfg: Any, ctx: Any) -> list[Claim]:
    train_texts, held, overlap = _texts(cfg, ctx)
    tok = make_word_tokenizer(train_texts, max_vocab=cfg.vocab_size)
    vocab = len(tok)
    train_ids = encode_documents(tok, train_texts)
    eval_ids = {d: encode_documents(tok, texts) for d, texts in held.items()}
    # tiny data (--limit) can be shorter than one window: shrink the window rather than fail (flagged)
    seq_len = max(2, min(cfg.seq_len, len(train_ids) - 2, *(len(e) - 1 for e in eval_ids.values())))
    eval_sizes = {d: len(e) for d, e in eval_ids.items()}
    ctx.flag("part_a_data", {"train_tokens": len(train_ids), "vocab": vocab, "seq_len": seq_len,
                             "eval_tokens": eval_sizes, "fact_heldout_overlap": overlap})  # fmt: skip
    d_wide = aoe_d_wide_for_params(cfg.d_model, cfg.n_experts, cfg.moe_d_ff, cfg.d_low)
    systems = ["router_moe", "aoe", *cfg.ablations]
    aux = {"router_moe": cfg.aux_coef, "aoe": cfg.aux_coef, "aoe_no_aux": 0.0, "dense": 0.0}

    per: dict[str, dict[str, list[float]]] = {s: {} for s in systems}
    seed_rows = []
    timing_models: dict[str, Any] = {}
    params: dict[str, dict[str, int]] = {}
    for i in range(cfg.n_seeds):
        seed = derive_seed(cfg.seed, "aoe-model", i)
        for system in ctx.progress(systems, f"seed {i}"):
            model = _build(system, cfg, vocab, seed, d_wide)
            if system not in params:
                ffn = sum(p.numel() for m in moe_layers(model) for p in m.parameters())
                params[system] = {"total": count_parameters(model), "ffn": ffn}
                ctx.models[f"scratch_{system}"] = {"spec": f"from-scratch:{system}",
                                                   "params": params[system]["total"], "ffn_params": ffn,
                                                   "layers": cfg.n_layers, "hidden_size": cfg.d_model,
                                                   "vocab_size": vocab}  # fmt: skip
            coef = aux[system]

            def loss_fn(m: Any, batch: torch.Tensor, coef: float = coef) -> torch.Tensor:
                loss = lm_loss(m, batch)
                return loss + coef * total_aux_loss(m) if coef > 0 else loss

            warmup = min(cfg.warmup, cfg.steps - 1)
            res = pretrain_lm(model, train_ids, steps=cfg.steps, batch_size=cfg.train_batch_size, seq_len=seq_len,
                              lr=cfg.lr, warmup=warmup, seed=seed, loss_fn=loss_fn)  # fmt: skip
            vals = per[system]
            vals.setdefault("train_tokens_per_s", []).append(res.tokens_per_s)
            vals.setdefault("final_train_loss", []).append(res.tail_loss(0.1))
            all_losses: list[float] = []
            chosen: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(cfg.n_layers)]
            for domain, ids in eval_ids.items():  # balance statistics over the held-out tokens of both domains
                losses, sel = _evaluate(model, ids, seq_len, cfg.eval_windows, cfg.train_batch_size)
                vals.setdefault(f"heldout_loss_{domain}", []).extend(losses)
                vals.setdefault(f"heldout_seed_{domain}", []).extend([i] * len(losses))
                all_losses += losses
                for j, layer in enumerate(sel):
                    chosen[j] += layer
            vals.setdefault("heldout_loss", []).extend(all_losses)
            # the seed (init and data order) is the independent unit: windows of one model are correlated
            vals.setdefault("heldout_seed", []).extend([i] * len(all_losses))
            vals.setdefault("seed_heldout_loss", []).append(float(np.mean(all_losses)))
            for layer in chosen:
                if layer:
                    sel_t = torch.cat([s for s, _ in layer])
                    log_t = torch.cat([lg for _, lg in layer])
                    for k, v in balance_stats(sel_t, log_t, cfg.n_experts).items():
                        vals.setdefault(k, []).append(v)
                    vals.setdefault("layer_seed", []).append(i)
            seed_rows.append({"seed": i, "system": system, "heldout_loss": round(float(np.mean(all_losses)), 4),
                              "train_loss": round(res.tail_loss(0.1), 4),
                              "load_cv": round(float(np.mean(vals["load_cv"][-cfg.n_layers:])), 4)
                              if system != "dense" else None,
                              "train_tok_per_s": round(res.tokens_per_s, 1)})  # fmt: skip
            if i == 0:
                timing_models[system] = model
        if i == 0:
            _timing(cfg, ctx, timing_models, vocab, seq_len)
            timing_models.clear()

    # -- record
    for system in systems:
        v = per[system]
        ctx.record(system, "heldout_loss", v["heldout_loss"], clusters=v["heldout_seed"], unit="nats",
                   note="per held-out window, pooled over seeds; CI and n over seeds (the unit)")  # fmt: skip
        for domain in eval_ids:
            ctx.record(system, f"heldout_loss_{domain}", v[f"heldout_loss_{domain}"],
                       clusters=v[f"heldout_seed_{domain}"], unit="nats")  # fmt: skip
        ctx.record(system, "seed_heldout_loss", v["seed_heldout_loss"], unit="nats",
                   note=f"mean held-out loss per seed: CI across {cfg.n_seeds} seeds")  # fmt: skip
        ctx.record(system, "final_train_loss", v["final_train_loss"], unit="nats")
        ctx.record(system, "train_tokens_per_s", v["train_tokens_per_s"], unit="tok/s",
                   note="whole training loop, not interleaved (see the timing table for the fair ratio)")  # fmt: skip
        if system != "dense":
            for metric in ("load_cv", "max_load", "load_entropy", "routing_entropy"):
                ctx.record(system, metric, v[metric], clusters=v["layer_seed"],
                           note="per seed x layer, on held-out tokens; n over seeds")  # fmt: skip
        ctx.record_value(system, "params_total", params[system]["total"])
        ctx.record_value(system, "params_ffn", params[system]["ffn"])
    kinds = {"router_moe": ("router_moe", cfg.moe_d_ff), "aoe": ("aoe", d_wide), "aoe_no_aux": ("aoe", d_wide),
             "dense": ("dense", cfg.top_k * cfg.moe_d_ff)}  # fmt: skip
    flops = {}
    for system in systems:
        kind, width = kinds[system]
        flops[system] = ffn_flops_per_token(kind, cfg.d_model, cfg.n_experts, cfg.top_k, width, cfg.d_low)
        f = flops[system]
        ctx.record_value(system, "ffn_macs_per_token_layer", f["total_macs"],
                         note=f"selection {f['selection_macs']} + experts {f['expert_macs']}")  # fmt: skip
    ctx.table("part_a_seeds", seed_rows)
    diff = np.array(per["router_moe"]["seed_heldout_loss"]) - np.array(per["aoe"]["seed_heldout_loss"])
    wins = int((diff > 0).sum())
    from scipy.stats import binomtest

    sign_p = float(binomtest(wins, len(diff), 0.5, alternative="greater").pvalue) if len(diff) else float("nan")
    mismatch = params["aoe"]["total"] - params["router_moe"]["total"]
    ctx.flag("part_a", {"d_wide": d_wide, "params": params, "param_mismatch": mismatch,
                        "param_mismatch_rel": mismatch / params["router_moe"]["total"],
                        "seed_loss_gap_moe_minus_aoe": diff.tolist(), "seeds_aoe_better": wins,
                        "sign_test_p": sign_p, "ffn_macs": flops})  # fmt: skip
    ctx.note(
        f"Part A: {cfg.n_seeds} seeds x {cfg.steps} steps x {cfg.train_batch_size}x{seq_len} tokens; total params "
        f"AoE {params['aoe']['total']:,} vs router MoE {params['router_moe']['total']:,} (d_wide={d_wide}, "
        f"mismatch {mismatch:+,}, {100 * mismatch / params['router_moe']['total']:+.2f}%). Per-seed loss gap "
        f"MoE - AoE: {', '.join(f'{x:+.4f}' for x in diff)} (mean {diff.mean():+.4f}, sd "
        f"{diff.std(ddof=1) if len(diff) > 1 else 0.0:.4f}); AoE better in {wins}/{len(diff)} seeds "
        f"(one-sided sign test p={sign_p:.3f}). FFN multiply-adds per token and layer: AoE "
        f"{flops['aoe']['total_macs']:,} (ranking {flops['aoe']['selection_macs']:,}) vs MoE "
        f"{flops['router_moe']['total_macs']:,} (router {flops['router_moe']['selection_macs']:,})."
    )
    if overlap:
        ctx.note("Only one fact document (--limit): its held-out loss is measured on a training document.")
    rows = [r for r in ctx.metrics if r.metric == "heldout_loss"]
    title = title_for("aoe", "tiny LM from scratch", cfg.seed, rows[0].n, "held-out loss (seeds x windows)")
    ctx.add_figure("heldout_loss", bar_with_ci(rows, title=title, ylabel="loss (nats)", highlight=["aoe"]))
    claims = [
        Claim("heldout_loss", "aoe", "router_moe", "<",
              text="A: AoE held-out loss < router MoE at equal total parameters (paired, by seed)"),
        Claim("load_cv", "aoe", "router_moe", "<",
              text="A: AoE expert-load CV < router MoE (better balance; per seed x layer)"),
        Claim("routing_entropy", "aoe", "router_moe", "<", gate=False,
              text="A: AoE per-token selection entropy < router MoE (more confident selection; not gated)"),
    ]  # fmt: skip
    if "aoe_no_aux" in systems:
        claims.append(Claim("heldout_loss", "aoe_no_aux", "router_moe", "<", gate=False,
                            text="A (ablation): AoE without aux loss: held-out loss < router MoE"))  # fmt: skip
    if "dense" in systems:
        claims.append(Claim("heldout_loss", "aoe", "dense", "<", gate=False,
                            text="A (sanity): AoE held-out loss < dense FFN of equal active width"))  # fmt: skip
    return claims


def _timing(cfg: Any, ctx: Any, models: dict[str, Any], vocab: int, seq_len: int) -> None:
    """Interleaved (ABAB, rotated) timing of inference forward and of a train step, seed-0 models, same batch."""
    gen = torch.Generator().manual_seed(derive_seed(cfg.seed, "timing"))
    batch = torch.randint(4, vocab, (cfg.train_batch_size, seq_len + 1), generator=gen)
    tokens = batch.shape[0] * seq_len

    def forward(m: Any) -> Any:
        def fn() -> None:
            with torch.no_grad():
                m(input_ids=batch[:, :-1])

        return fn

    def train_step(m: Any, coef: float) -> Any:
        def fn() -> None:
            loss = lm_loss(m, batch)
            if coef > 0:
                loss = loss + coef * total_aux_loss(m)
            loss.backward()
            m.zero_grad(set_to_none=True)

        return fn

    names = [s for s in ("router_moe", "aoe") if s in models]
    rows = []
    for what, fns in (
        ("forward", {s: forward(models[s]) for s in names}),
        ("train_step", {s: train_step(models[s], cfg.aux_coef) for s in names}),
    ):
        for m in models.values():
            m.train(what == "train_step")
        rep = compare_timings(fns, repeats=cfg.timing_repeats, warmup=2)
        for s in names:
            st = rep.stats[s]
            note = f"interleaved median of {st.n} rounds, batch {cfg.train_batch_size}x{seq_len}"
            ctx.record_value(s, f"{what}_tokens_per_s", tokens / st.median, unit="tok/s", note=note)
        sp = rep.speedups["aoe"]
        rows.append({"what": what, "router_moe_ms": round(rep.stats["router_moe"].median * 1e3, 2),
                     "aoe_ms": round(rep.stats["aoe"].median * 1e3, 2),
                     "aoe_speed_vs_moe": round(sp.median, 3), "iqr": [round(sp.q25, 3), round(sp.q75, 3)],
                     "threads": rep.threads, "loadavg": rep.loadavg_after, "contended": rep.contended})  # fmt: skip
    for m in models.values():
        m.eval()
    ctx.table("part_a_timing", rows)
    ctx.flag("timing", rows)


# ----------------------------------------------------------------------------------------------------------------
# part B: a pretrained FFN split into experts
# ----------------------------------------------------------------------------------------------------------------


def _encode(tok: Any, texts: list[str], max_tokens: int) -> list[list[int]]:
    out = []
    for t in texts:
        ids = tok(t, add_special_tokens=False)["input_ids"][:max_tokens]
        if len(ids) >= 2:
            out.append(ids)
    return out


def _batches(seqs: list[list[int]], size: int) -> Any:
    for start in range(0, len(seqs), size):
        chunk = seqs[start : start + size]
        width = max(len(s) for s in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for j, s in enumerate(chunk):
            ids[j, : len(s)] = torch.tensor(s)
            mask[j, : len(s)] = 1
        yield ids, mask


@torch.no_grad()
def _passage_nll(model: Any, seqs: list[list[int]], batch: int) -> list[float]:
    """Mean next-token NLL per passage (padding masked out)."""
    out: list[float] = []
    for ids, mask in _batches(seqs, batch):
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()  # (b, n-1, V)
        nll = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")  # (b, n-1)
        m = mask[:, 1:].float()
        out += ((nll * m).sum(1) / m.sum(1)).tolist()
    return out


def _part_b(cfg: Any, ctx: Any) -> list[Claim]:
    model, tok = ctx.load_model()
    d_ff = model.model.layers[0].mlp.gate_proj.weight.shape[0]
    d_model = model.config.hidden_size
    eval_seqs = _encode(tok, [ex.prompt for ex in ctx.data("corpus", cfg.n_eval_passages, split="test")],
                        cfg.eval_tokens)  # fmt: skip
    fit_seqs = _encode(tok, [ex.prompt for ex in ctx.data("corpus", cfg.n_router_passages, split="train")],
                       cfg.eval_tokens)  # fmt: skip
    wrappers = moefy(model, cfg.b_experts, cfg.b_top_k, d_low=cfg.b_d_low, seed=cfg.seed)
    try:
        rules = ["dense", *cfg.b_rules]
        if "router" in rules:  # FFN inputs of the unsplit model on train passages -> ridge fit to the oracle norms
            set_rule(wrappers, "dense")
            inputs: list[list[torch.Tensor]] = [[] for _ in wrappers]
            hooks = []
            for j, w in enumerate(wrappers):
                hooks.append(w.register_forward_pre_hook(lambda mod, args, j=j: inputs[j].append(args[0])))
            try:
                with torch.no_grad():
                    for ids, mask in _batches(fit_seqs, cfg.batch_size):
                        model(input_ids=ids, attention_mask=mask)
                        keep = mask.bool()
                        for j in range(len(wrappers)):
                            inputs[j][-1] = inputs[j][-1][keep]  # (valid tokens, d)
            finally:
                for h in hooks:
                    h.remove()
            agreement = [fit_router(w, torch.cat(x), ridge=cfg.router_ridge) for w, x in zip(wrappers, inputs)]
            ctx.record("split_router", "fit_topk_set_agreement", agreement,
                       note="per layer: share of fitting tokens whose top-k set equals the oracle's")  # fmt: skip
        nll: dict[str, list[float]] = {}
        rows = []
        for rule in ctx.progress(rules, "split rules"):
            set_rule(wrappers, rule)
            for w in wrappers:
                w.reset_stats()
                w.record = True
            system = "unsplit" if rule == "dense" else f"split_{rule}"
            nll[system] = _passage_nll(model, eval_seqs, cfg.batch_size)
            for w in wrappers:
                w.record = False
            ctx.record(system, "corpus_nll", nll[system], unit="nats", note="mean next-token NLL per passage")
            macs = selection_macs(rule, d_model, d_ff, cfg.b_experts, cfg.b_d_low)
            ctx.record_value(system, "selection_macs_per_token_layer", macs)
            row = {"system": system, "ppl": round(math.exp(float(np.mean(nll[system]))), 3),
                   "nll": round(float(np.mean(nll[system])), 4), "selection_macs": macs}  # fmt: skip
            if rule != "dense":
                recall = [w.oracle_recall for w in wrappers]
                cv = [float((w.load_counts / w.load_counts.sum()).std(unbiased=False) * cfg.b_experts)
                      for w in wrappers]  # fmt: skip
                ctx.record(system, "oracle_recall", recall, note="per layer: share of the oracle's top-k kept")
                ctx.record(system, "load_cv", cv, note="per layer, on held-out tokens")
                row.update(oracle_recall=round(float(np.mean(recall)), 4), load_cv=round(float(np.mean(cv)), 4))
            ctx.record_value(system, "perplexity", row["ppl"], note="exp(mean passage NLL)")
            rows.append(row)
    finally:
        unmoefy(model)
    ctx.table("part_b_rules", rows)
    ctx.flag("part_b", {"d_ff": d_ff, "groups": cfg.b_experts, "group_width": d_ff // cfg.b_experts,
                        "top_k": cfg.b_top_k, "d_low": cfg.b_d_low, "passages": len(eval_seqs)})  # fmt: skip
    ctx.note(
        f"Part B: {cfg.model}'s FFNs split into {cfg.b_experts} groups of {d_ff // cfg.b_experts} units, top-"
        f"{cfg.b_top_k} kept per token, SVD rank {cfg.b_d_low}; selected groups keep their pretrained weights (the "
        "low-rank factor only ranks). Perplexity: " + ", ".join(f"{r['system']} {r['ppl']:.2f}" for r in rows) + "."
    )
    prow = [r for r in ctx.metrics if r.metric == "corpus_nll"]
    ctx.add_figure("split_nll", bar_with_ci(prow, title=title_for("aoe", cfg.model, cfg.seed, prow[0].n,
                   f"NLL, top-{cfg.b_top_k} of {cfg.b_experts} FFN groups"), ylabel="NLL (nats)",
                   highlight=["split_aoe_lowrank"]))  # fmt: skip
    claims = [
        Claim("corpus_nll", "split_aoe_lowrank", "split_random", "<",
              text="B: AoE low-rank norm choice NLL < random choice at the same k (SmolLM2 FFN split)"),
    ]  # fmt: skip
    if "router" in cfg.b_rules:
        claims.append(Claim("corpus_nll", "split_aoe_lowrank", "split_router", "<", gate=False,
                            text="B: AoE low-rank norm choice NLL < fitted linear router (not gated)"))  # fmt: skip
    return claims


def run(cfg: Any, ctx: Any) -> Any:
    claims: list[Claim] = []
    if cfg.pretrain:
        claims += _part_a(cfg, ctx)
    if cfg.moefy:
        claims += _part_b(cfg, ctx)
    return ctx.finish(claims)
