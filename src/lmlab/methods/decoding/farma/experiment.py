"""Reproduction: FaRMA vs top-k sampling, Best-of-N, ARGS and PARGS on SmolLM2-135M-Instruct, one process.

Paper claim: a V-channel reward model scores every candidate next token in one call, so reward-guided decoding is
"significantly faster ... requires fewer calls to the reward model and performs competitively compared to previous
RGTG" methods. At 135M on CPU, offline:

1. Prompts "Write one sentence about {topic}." (a fixed topic list, split by seed into preference and held-out
   decoding prompts). The gold objective is an offline rule-based reward (default: positivity = positive-lexicon
   hits - negative-lexicon hits - 0.1 per word beyond 20).
2. Preference data: SmolLM2 samples (temperature 1.0), paired within a prompt by gold score with a minimum margin;
   a share of the prompts is held out to measure each reward model's Bradley-Terry accuracy.
3. Three reward models on SmolLM2's frozen body (features cached once; only heads train): (a) a scalar head, BT on
   full pairs (ARGS, Best-of-N); (b) a scalar head, BT on equal-length prefix pairs (PARGS); (c) FaRMA's untied
   V-channel head (LM-head copy + low-rank delta), alternating BT and max-constraint phases.
4. Decoding on held-out prompts x seeds, the same batch and seeds for every system: top-k sampling, Best-of-N,
   ARGS, PARGS, FaRMA (w = 1 and a small w sweep), FaRMA with the untrained V head (a control: the LM-head copy
   alone sharpens the LM) and FaRMA trained without L_max (ablation); then a batch-1 latency run.

Claim check (computed; prompts x seeds, clustered by prompt): gold(FaRMA), gold(ARGS), gold(PARGS) each >
gold(top-k sampling); FaRMA not worse than ARGS / PARGS by more than `noninferiority` gold (a quarter of a lexicon
word per response). Mechanism check, shown but never gating: RM calls per token FaRMA (1) < ARGS = PARGS (k), which
the algorithms fix. Wall time (batched rows, and batch 1 with ARGS's candidates batched or one per forward) and
per-model GFLOPs are reported beside them, not gated (wall time on shared CPUs is noisy).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from lmlab.core.inference.models import flop_params
from lmlab.core.inference.scoring import chat_prompt, encode_prompt
from lmlab.core.report.plotting import bar_with_ci, quality_vs_compute, title_for
from lmlab.core.stats.seeding import derive_seed
from lmlab.data import seeded_rng
from lmlab.methods.decoding.farma.baselines import ARGSLogitsProcessor, best_of_n
from lmlab.methods.decoding.farma.method import RewardGuidedLogitsProcessor, bt_accuracy, train_bt, train_farma_rm
from lmlab.methods.decoding.farma.reward_models import RewardInputs, ScalarRM, VChannelRM, reward_inputs
from lmlab.methods.decoding.farma.sampling import Generation, generate_batch, pad_token_id
from lmlab.results import Claim

PROMPT = "Write one sentence about {topic}."

# Everyday topics, neutral on purpose: some invite positive, some negative sentences, most either.
TOPICS: tuple[str, ...] = (
    "coffee", "the ocean", "winter", "trains", "a rainy day", "homework", "the city at night", "mountains", "cats",
    "dogs", "gardening", "music", "libraries", "bicycles", "breakfast", "the moon", "autumn leaves",
    "a birthday party", "old friends", "the desert", "thunderstorms", "a Monday morning", "traffic", "a hospital",
    "a forest", "rivers", "bread", "chocolate", "tea", "summer vacation", "the internet", "smartphones", "robots",
    "airports", "a long flight", "a job interview", "exams", "grandparents", "a small village", "the beach", "snow",
    "spring flowers", "a museum", "painting", "poetry", "football", "running", "swimming", "cooking dinner",
    "a busy kitchen", "the post office", "a bookstore", "a lighthouse", "bees", "birds", "the stars", "a campfire",
    "fishing", "a farm", "apples", "a bakery", "a wedding", "the dentist", "taxes", "a broken phone",
    "a lost wallet", "a noisy neighbor", "the subway", "a bridge", "a castle", "a volcano", "the rain forest",
    "a marathon", "a chess game", "a piano", "a violin", "a school bus", "a teacher", "a nurse", "firefighters",
    "a market", "a zoo", "elephants", "penguins", "the Arctic", "a sunrise", "a sunset", "a storm at sea", "fog",
    "a quiet evening", "a city park", "a playground", "a picnic", "a road trip", "a mountain cabin", "an old house",
    "a new car", "a train station", "a hotel", "a thrift shop", "recycling", "electricity", "the weather", "clouds",
    "a river boat", "homemade soup", "a power outage", "a traffic jam", "a science fair", "the first day of school",
)  # fmt: skip

POSITIVE: frozenset[str] = frozenset(
    "good great best better beautiful beauty wonderful amazing awesome excellent fantastic lovely love loved loves "
    "loving happy happiness joy joyful delight delightful delicious pleasant peaceful peace calm warm warmth bright "
    "brilliant perfect nice kind kindness gentle fun enjoy enjoyed enjoys enjoyable enjoying favorite favourite "
    "charming cheerful glad grateful hope hopeful inspiring inspire inspired inspiration magical magic vibrant vivid "
    "majestic stunning gorgeous radiant serene cozy cosy comfortable comfort fresh healthy thriving thrive success "
    "successful rich treasure treasured precious beloved friendly smile smiles smiling laughter laugh celebrate "
    "celebration blessing blessed bliss brave wise elegant graceful sweet soothing refreshing uplifting remarkable "
    "incredible fascinating exciting thrilling glorious harmony harmonious freedom safe supportive generous "
    "adventure adventures cherish cherished tranquil breathtaking splendid marvelous marvellous heartwarming "
    "lively playful welcoming magnificent lush colorful colourful quaint legendary iconic luxurious wonder wonders "
    "treasures passion passionate creativity creative glow glowing jolly grand honored delicate dedicated timeless "
    "innovative enchanting captivating renowned inviting comforting picturesque idyllic heavenly dazzling "
    "sparkling gleaming pristine exquisite superb bountiful flourishing gracious caring compassionate thoughtful "
    "fond".split()
)
NEGATIVE: frozenset[str] = frozenset(
    "bad worse worst terrible horrible awful sad sadness unhappy angry anger hate hated fear afraid scary dark "
    "darkness gloomy gloom lonely loneliness pain painful hurt cruel ugly boring dull bitter harsh dangerous danger "
    "toxic poor poverty sick illness disease death dead die dies dying kill killed war violence violent disaster "
    "tragic tragedy broken lost loss fail failed failure problem problems stress stressful anxiety anxious worry "
    "worried chaos chaotic miserable misery grief suffering suffer threat struggle struggling unforgiving destroy "
    "destroyed destruction pollution crisis desperate evil nightmare dread grim bleak annoying annoyed frustrating "
    "frustrated tired exhausting exhausted noisy dirty empty eerie dreary menacing ominous haunting haunted "
    "abandoned desolate deserted crumbling rotten stale filthy polluted crowded cramped scream screaming tears "
    "crying cried isolated frightening terrifying horrifying disgusting nasty rude hostile unpleasant "
    "uncomfortable freezing brutal tense bored sorrow sorrowful mourning weep weeping regret guilt shame ashamed "
    "ruined ruin damage damaged injured injury accident crash collapse collapsed".split()
)
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def positivity(text: str) -> float:
    """Gold reward: positive-lexicon hits - negative-lexicon hits - 0.1 per word beyond 20 (transparent, offline)."""
    words = _WORD.findall(text.lower())
    hits = sum(w in POSITIVE for w in words) - sum(w in NEGATIVE for w in words)
    return float(hits) - 0.1 * max(0, len(words) - 20)


def topic_period(text: str, topic: str) -> float:
    """Alternative gold reward: +1 if the topic's main word is mentioned, +1 if the text ends with a period."""
    main = max(_WORD.findall(topic.lower()), key=len)
    return float(main in text.lower()) + float(text.strip().endswith("."))


def _gold(cfg: Any) -> Callable[[str, str], float]:
    if cfg.gold == "positivity":
        return lambda text, topic: positivity(text)
    return topic_period


def _split_topics(cfg: Any, ctx: Any) -> tuple[list[str], list[str], list[str]]:
    """Held-out decoding topics, preference-train topics, preference-validation topics (disjoint, seeded)."""
    if cfg.eval_prompts + cfg.pref_prompts > len(TOPICS):
        raise ValueError(
            f"eval_prompts + pref_prompts must be <= {len(TOPICS)} topics, got {cfg.eval_prompts + cfg.pref_prompts}"
        )
    order = list(TOPICS)
    seeded_rng("farma-topics", cfg.seed).shuffle(order)
    limit = cfg.limit if cfg.limit is not None else len(TOPICS)
    eval_topics = order[: min(cfg.eval_prompts, limit)]
    pool = order[cfg.eval_prompts :]  # the full eval count is always skipped, so --limit never moves topics
    pref = pool[: min(cfg.pref_prompts, limit)]
    n_val = int(round(len(pref) * cfg.rm_val_fraction)) if len(pref) > 1 else 0
    ctx.data_info["farma_topics/eval"] = {"n": len(eval_topics), "seed": cfg.seed, "source": "experiment.TOPICS"}
    ctx.data_info["farma_topics/preference"] = {"n": len(pref), "seed": cfg.seed, "heldout_for_rm": n_val}
    return eval_topics, pref[n_val:], pref[:n_val]


def _chunks(n: int, size: int) -> list[range]:
    return [range(s, min(s + size, n)) for s in range(0, n, size)]


def _pairs(gold: list[float], groups: list[list[int]], min_margin: float) -> list[tuple[int, int]]:
    """(chosen, rejected) sample indices within each prompt's group, gold gap >= min_margin (and > 0)."""
    out = []
    for group in groups:
        for a in range(len(group)):
            for b in range(a + 1, len(group)):
                i, j = group[a], group[b]
                if gold[i] == gold[j] or abs(gold[i] - gold[j]) < min_margin:
                    continue
                out.append((i, j) if gold[i] > gold[j] else (j, i))
    return out


def _cat(parts: list[RewardInputs]) -> RewardInputs:
    parts = [p for p in parts if len(p)]
    if not parts:
        return RewardInputs(torch.zeros(0, 1), torch.zeros(0, dtype=torch.long), torch.zeros(0, 1))
    return RewardInputs(
        torch.cat([p.prev_hidden for p in parts]),
        torch.cat([p.last_token for p in parts]),
        torch.cat([p.last_hidden for p in parts]),
    )


def _prefix_pairs(pairs, seqs, feats, prompt_len, min_prefix, topics) -> tuple[RewardInputs, RewardInputs, list]:
    """Equal-length response-prefix pairs (PARGS's partial data, true lengths: no padding), and each one's prompt
    topic (all prefixes of one pair, and all pairs of one prompt, are one cluster)."""
    ch, rj, ids = [], [], []
    for c, r in pairs:
        n = min(len(seqs[c]), len(seqs[r])) - prompt_len[c]
        ends = [prompt_len[c] + i for i in range(min_prefix, n + 1)]
        if ends:
            ch.append(reward_inputs([feats[c]] * len(ends), [seqs[c]] * len(ends), ends))
            rj.append(reward_inputs([feats[r]] * len(ends), [seqs[r]] * len(ends), ends))
            ids += [topics[c]] * len(ends)
    return _cat(ch), _cat(rj), ids


def _partials(indices, seqs, feats, prompt_len, min_prefix) -> RewardInputs:
    """Partial chosen sequences y_<=t for the max constraint, t from `min_prefix` response tokens to the end."""
    parts = []
    for i in sorted(set(indices)):
        ends = [prompt_len[i] + t for t in range(min_prefix, len(seqs[i]) - prompt_len[i] + 1)]
        if ends:
            parts.append(reward_inputs([feats[i]] * len(ends), [seqs[i]] * len(ends), ends))
    return _cat(parts)


def run(cfg: Any, ctx: Any):
    lm, tok = ctx.load_model()
    gold_fn = _gold(cfg)
    pad = pad_token_id(lm, tok)  # the id generate_batch left-pads with: the processors must read the same one
    eval_topics, train_topics, val_topics = _split_topics(cfg, ctx)
    encode = {t: encode_prompt(tok, chat_prompt(tok, PROMPT.format(topic=t))) for t in TOPICS}

    # -- 1. preference data: SmolLM2 samples, paired by gold score ---------------------------------------------
    t0 = time.perf_counter()
    pref_topics = train_topics + val_topics
    sample_topics = [t for t in pref_topics for _ in range(cfg.samples_per_prompt)]
    samples: list[Generation] = []
    for c, rows in enumerate(_chunks(len(sample_topics), 3 * cfg.eval_batch)):
        # the frozen body's features come out of sampling itself (return_hidden): no second pass over the data
        samples += generate_batch(lm, tok, [encode[sample_topics[i]] for i in rows], max_new_tokens=cfg.pref_tokens,
                                  do_sample=True, temperature=cfg.pref_temperature, return_hidden=True,
                                  seed=derive_seed(cfg.seed, "preference", c), meter=ctx.meter,
                                  meter_name="lm/preference-data")  # fmt: skip
    gold = [gold_fn(s.text, t) for s, t in zip(samples, sample_topics)]
    seqs = [s.prompt_ids + s.token_ids for s in samples]
    prompt_len = [len(s.prompt_ids) for s in samples]
    groups = {t: [] for t in pref_topics}
    for i, t in enumerate(sample_topics):
        groups[t].append(i)
    train_pairs = _pairs(gold, [groups[t] for t in train_topics], cfg.min_margin)
    val_pairs = _pairs(gold, [groups[t] for t in val_topics], cfg.min_margin)
    data_s = time.perf_counter() - t0
    ctx.record_value("data", "preference_samples", len(samples))
    ctx.record_value("data", "train_pairs", len(train_pairs))
    ctx.record_value("data", "heldout_pairs", len(val_pairs))
    ctx.record_value("data", "sample_gold_mean", float(np.mean(gold)) if gold else 0.0, unit="gold")
    ctx.record_value("timing", "preference_data_s", data_s, unit="s")

    # -- 2. reward models on the frozen body, trained on the cached features -------------------------------------
    feats = [smp.hidden for smp in samples]
    rm_a = ScalarRM.from_causal_lm(lm)  # ARGS + Best-of-N: BT on full pairs
    rm_b = ScalarRM.from_causal_lm(lm)  # PARGS: BT on equal-length prefix pairs
    rm_c = VChannelRM.from_causal_lm(lm, mode=cfg.head, rank=cfg.rank, seed=cfg.seed)  # FaRMA
    rm_init = VChannelRM.from_causal_lm(lm, mode=cfg.head, rank=cfg.rank, seed=cfg.seed)  # control: untrained
    rm_nomax = VChannelRM.from_causal_lm(lm, mode=cfg.head, rank=cfg.rank, seed=cfg.seed)  # ablation: BT phases only

    def full(pairs):
        return (reward_inputs([feats[c] for c, _ in pairs], [seqs[c] for c, _ in pairs]),
                reward_inputs([feats[r] for _, r in pairs], [seqs[r] for _, r in pairs]))  # fmt: skip

    tr_c, tr_r = full(train_pairs)
    va_c, va_r = full(val_pairs)
    tp_c, tp_r, _ = _prefix_pairs(train_pairs, seqs, feats, prompt_len, cfg.pargs_min_prefix, sample_topics)
    vp_c, vp_r, vp_ids = _prefix_pairs(val_pairs, seqs, feats, prompt_len, cfg.pargs_min_prefix, sample_topics)
    # pairs (and prefix pairs) of one prompt share its samples: the prompt is the cluster of a BT accuracy
    tr_ids = [sample_topics[c] for c, _ in train_pairs]
    va_ids = [sample_topics[c] for c, _ in val_pairs]
    partial = _partials([c for c, _ in train_pairs], seqs, feats, prompt_len, cfg.max_min_prefix)
    epochs = cfg.iterations * cfg.bt_epochs  # the scalar RMs get as many BT epochs as FaRMA's BT phases
    t1 = time.perf_counter()
    kw = dict(lr=cfg.lr, batch_size=cfg.train_batch)
    loss_a = train_bt(rm_a, tr_c, tr_r, epochs=epochs, seed=derive_seed(cfg.seed, "rm_a"), **kw) if len(tr_c) else []
    loss_b = train_bt(rm_b, tp_c, tp_r, epochs=epochs, seed=derive_seed(cfg.seed, "rm_b"), **kw) if len(tp_c) else []
    curve: list[dict[str, Any]] = []

    def on_phase(name: str, it: int) -> None:
        acc = bt_accuracy(rm_c, va_c, va_r)
        curve.append({"phase": f"{name}{it}", "heldout_bt_accuracy": float(np.mean(acc)) if acc else math.nan})

    log = None
    if len(tr_c):
        farma_kw = dict(iterations=cfg.iterations, bt_epochs=cfg.bt_epochs, seed=derive_seed(cfg.seed, "rm_c"),
                        partial_per_phase=len(tr_c), **kw)  # fmt: skip
        log = train_farma_rm(rm_c, tr_c, tr_r, partial, max_epochs=cfg.max_epochs, stop_gradient=cfg.stop_gradient,
                             on_phase=on_phase, **farma_kw)  # fmt: skip
        for row, (_, _, losses) in zip(curve, log.phases):
            row["mean_loss"] = float(np.mean(losses)) if losses else math.nan
            row["steps"] = len(losses)
        if cfg.run_no_max_ablation:
            train_farma_rm(rm_nomax, tr_c, tr_r, partial, max_epochs=0.0, **farma_kw)
    else:
        ctx.note("No preference pair met the margin: the reward models stay untrained (r = 0 / f = LM copy).")
    train_s = time.perf_counter() - t1
    ctx.record_value("timing", "rm_training_s", train_s, unit="s")
    ctx.table("farma_rm_training", curve)
    rm_names = {"rm_a (ARGS, BoN)": rm_a, "rm_b (PARGS)": rm_b, "rm_c (FaRMA)": rm_c, "rm_c untrained": rm_init}
    if cfg.run_no_max_ablation:
        rm_names["rm_c without L_max"] = rm_nomax
    for name, rm in rm_names.items():
        if len(tr_c):
            ctx.record(name, "train_bt_accuracy", bt_accuracy(rm, tr_c, tr_r), clusters=tr_ids,
                       note="training pairs (fit), clustered by prompt")  # fmt: skip
        if len(va_c):
            ctx.record(name, "heldout_bt_accuracy", bt_accuracy(rm, va_c, va_r), clusters=va_ids,
                       note="held-out prompts, full pairs, clustered by prompt")  # fmt: skip
        if len(vp_c):
            ctx.record(name, "heldout_prefix_bt_accuracy", bt_accuracy(rm, vp_c, vp_r), clusters=vp_ids,
                       note="equal-length prefixes, clustered by prompt")  # fmt: skip
    ctx.record_value("training", "rm_a_steps", len(loss_a))
    ctx.record_value("training", "rm_b_steps", len(loss_b))
    ctx.record_value("training", "rm_c_steps", log.steps if log else 0)

    # -- 3. decoding on held-out prompts x seeds: same batches and seeds for every system ------------------------
    do_sample = cfg.mode == 2
    rows = [(t, s) for t in eval_topics for s in range(cfg.eval_seeds)]
    sys_args: dict[str, Any] = {}

    def guided(name: str, proc: Any) -> Callable[[list[list[int]], int], list[Generation]]:
        def go(prompts: list[list[int]], seed: int) -> list[Generation]:
            return generate_batch(
                lm,
                tok,
                prompts,
                max_new_tokens=cfg.max_new_tokens,
                do_sample=do_sample,
                logits_processors=[proc],
                seed=seed,
                meter=ctx.meter,
                meter_name=f"lm/{name}",
            )

        sys_args[name] = proc
        return go

    def rm_proc(cls, rm, name, w, **extra):
        return cls(rm, w, cfg.k, pad_token_id=pad, meter=ctx.meter, meter_name=f"rm/{name}", **extra)

    systems: dict[str, Callable[[list[list[int]], int], list[Generation]]] = {
        "top_k": lambda prompts, seed: generate_batch(lm, tok, prompts, max_new_tokens=cfg.max_new_tokens,
                                                      top_k=cfg.k, seed=seed, meter=ctx.meter, meter_name="lm/top_k"),
    }  # fmt: skip
    if cfg.best_of_n:
        systems[f"best_of_{cfg.best_of_n}"] = lambda prompts, seed: best_of_n(
            lm,
            tok,
            rm_a,
            prompts,
            cfg.best_of_n,
            max_new_tokens=cfg.max_new_tokens,
            top_k=cfg.k,
            seed=seed,
            meter=ctx.meter,
            meter_name="lm/best_of_n",
            rm_meter_name="rm/best_of_n",
        )
    systems["args"] = guided("args", rm_proc(ARGSLogitsProcessor, rm_a, "args", cfg.w))
    if cfg.run_pargs:
        systems["pargs"] = guided("pargs", rm_proc(ARGSLogitsProcessor, rm_b, "pargs", cfg.w))
    systems["farma"] = guided("farma", rm_proc(RewardGuidedLogitsProcessor, rm_c, "farma", cfg.w))
    for w in cfg.w_sweep:
        name = f"farma_w{w:g}"
        if name != f"farma_w{cfg.w:g}":
            systems[name] = guided(name, rm_proc(RewardGuidedLogitsProcessor, rm_c, name, float(w)))
    if cfg.run_init_control:
        systems["farma_untrained"] = guided(
            "farma_untrained", rm_proc(RewardGuidedLogitsProcessor, rm_init, "farma_untrained", cfg.w)
        )
    if cfg.run_no_max_ablation:
        systems["farma_no_max"] = guided(
            "farma_no_max", rm_proc(RewardGuidedLogitsProcessor, rm_nomax, "farma_no_max", cfg.w)
        )

    names = list(systems)
    outs: dict[str, list[Generation]] = {n: [] for n in names}
    wall: dict[str, list[float]] = {n: [] for n in names}
    for b, idx in enumerate(ctx.progress(_chunks(len(rows), cfg.eval_batch), "decoding batches")):
        prompts = [encode[rows[i][0]] for i in idx]
        seed = derive_seed(cfg.seed, "eval", b)
        shift = b % len(names)  # rotate the order per batch: machine-load drifts hit every system alike
        for name in names[shift:] + names[:shift]:
            t0 = time.perf_counter()
            outs[name] += systems[name](prompts, seed)
            wall[name] += [(time.perf_counter() - t0) / len(idx)] * len(idx)

    # -- 4. metrics: gold with CIs, RM calls per token, per-model cost, wall time --------------------------------
    lm_fp = flop_params(lm)
    rm_fp = {"args": flop_params(rm_a), "pargs": flop_params(rm_b), f"best_of_{cfg.best_of_n}": flop_params(rm_a)}
    rm_fp.update({n: flop_params(rm_c) for n in names if n.startswith("farma")})  # the same head shape for all
    # rows are prompts x seeds: the seeds of one prompt are one cluster (n counts prompts, the CI resamples them)
    prompt_ids = [t for t, _ in rows]
    # wall time is measured per batch and spread over its rows: the batch is its independent unit
    batch_ids = [b for b, idx in enumerate(_chunks(len(rows), cfg.eval_batch)) for _ in idx]
    gold_rows: dict[str, list[float]] = {}
    for name in names:
        gens = outs[name]
        gold_rows[name] = [gold_fn(g.text, rows[i][0]) for i, g in enumerate(gens)]
        ntok = [max(g.n_tokens, 1) for g in gens]
        per_prompt = dict(clusters=prompt_ids)
        ctx.record(name, "gold", gold_rows[name], unit="gold",
                   note=f"{cfg.gold}, per prompt x seed, clustered by prompt", **per_prompt)  # fmt: skip
        ctx.record(name, "rm_calls_per_token", [g.rm_calls / n for g, n in zip(gens, ntok)], **per_prompt)
        ctx.record(name, "tokens", [g.n_tokens for g in gens], **per_prompt)
        ctx.record(name, "lm_gflops", [2 * lm_fp * g.lm_tokens / 1e9 for g in gens], unit="GFLOP", **per_prompt)
        ctx.record(name, "rm_gflops", [2 * rm_fp.get(name, 0) * g.rm_tokens / 1e9 for g in gens], unit="GFLOP",
                   **per_prompt)  # fmt: skip
        ctx.record(name, "wall_s", wall[name], unit="s", clusters=batch_ids,
                   note=f"batch of {cfg.eval_batch} rows: wall / rows, clustered by batch")  # fmt: skip
    mean_wall = {n: float(np.mean(wall[n])) for n in names}
    ctx.table(
        "cost_per_sample",
        [
            {
                "system": n,
                "wall_s_per_sample": round(mean_wall[n], 4),
                "wall_vs_farma": round(mean_wall[n] / mean_wall["farma"], 3) if mean_wall["farma"] > 0 else None,
                "rm_calls_per_token": float(np.mean(ctx.values(n, "rm_calls_per_token"))),
                "lm_gflops": float(np.mean(ctx.values(n, "lm_gflops"))),
                "rm_gflops": float(np.mean(ctx.values(n, "rm_gflops"))),
            }
            for n in names
        ],
    )

    # batch-1 latency (one prompt at a time, as the official loops run): FaRMA, ARGS with its k candidates in one
    # forward, and ARGS scoring them one forward at a time (it samples exactly what batched ARGS samples)
    latency: dict[str, list[float]] = {}
    if cfg.latency_prompts:
        lat_systems = {
            "top_k": lambda p, sd: generate_batch(lm, tok, p, max_new_tokens=cfg.max_new_tokens, top_k=cfg.k,
                                                  seed=sd),
            "farma": lambda p, sd: generate_batch(lm, tok, p, max_new_tokens=cfg.max_new_tokens, seed=sd,
                                                  do_sample=do_sample, logits_processors=[
                                                      RewardGuidedLogitsProcessor(rm_c, cfg.w, cfg.k)]),
            "args": lambda p, sd: generate_batch(lm, tok, p, max_new_tokens=cfg.max_new_tokens, seed=sd,
                                                 do_sample=do_sample, logits_processors=[
                                                     ARGSLogitsProcessor(rm_a, cfg.w, cfg.k)]),
            "args_unbatched": lambda p, sd: generate_batch(lm, tok, p, max_new_tokens=cfg.max_new_tokens, seed=sd,
                                                           do_sample=do_sample, logits_processors=[
                                                               ARGSLogitsProcessor(rm_a, cfg.w, cfg.k,
                                                                                   batch_candidates=False)]),
        }  # fmt: skip
        lat_out: dict[str, list[Generation]] = {n: [] for n in lat_systems}
        latency = {n: [] for n in lat_systems}
        for j, topic in enumerate(eval_topics[: cfg.latency_prompts]):
            sd = derive_seed(cfg.seed, "latency", j)
            order = list(lat_systems)
            for name in order[j % len(order) :] + order[: j % len(order)]:
                t0 = time.perf_counter()
                (g,) = lat_systems[name]([encode[topic]], sd)
                latency[name].append((time.perf_counter() - t0) / max(g.n_tokens, 1))
                lat_out[name].append(g)
        for name, vals in latency.items():
            ctx.record(f"{name}@batch1", "wall_s_per_token", vals, unit="s", note="one prompt at a time")
        same = [float(a.token_ids == u.token_ids) for a, u in zip(lat_out["args"], lat_out["args_unbatched"])]
        ctx.record("args_unbatched@batch1", "same_output_as_args", same, note="candidates one forward at a time")

    def ratio(num: float, den: float) -> float | None:
        return round(num / den, 3) if den > 0 else None

    lat = {n: float(np.mean(v)) for n, v in latency.items()}
    ratio_rows = [{"regime": f"batch of {cfg.eval_batch} rows", "args_over_farma": ratio(mean_wall["args"],
                   mean_wall["farma"]), "args_unbatched_over_farma": None}]  # fmt: skip
    if "pargs" in mean_wall:
        ratio_rows[0]["pargs_over_farma"] = ratio(mean_wall["pargs"], mean_wall["farma"])
    if lat:
        ratio_rows.append({"regime": "batch 1", "args_over_farma": ratio(lat["args"], lat["farma"]),
                           "args_unbatched_over_farma": ratio(lat["args_unbatched"], lat["farma"])})  # fmt: skip
    ctx.table("wall_time_ratios", ratio_rows)
    ctx.note(
        "Wall-time ratios to FaRMA: "
        + "; ".join(
            f"{r['regime']}: ARGS {r['args_over_farma']}x"
            + (
                f", ARGS one candidate per forward {r['args_unbatched_over_farma']}x"
                if r["args_unbatched_over_farma"]
                else ""
            )
            for r in ratio_rows
        )
        + "."
    )

    # -- 5. claim check ----------------------------------------------------------------------------------------
    claims = build_claims(cfg)

    # the specification's "within one standard error" reading, computed and reported beside the gated checks
    spec_rows = []
    for other in [n for n in ("args", "pargs") if n in gold_rows]:
        diff = np.array(gold_rows["farma"]) - np.array(gold_rows[other])
        # one difference per prompt (its seeds averaged): the prompts are the independent units
        d = np.array([diff[[i for i, t in enumerate(prompt_ids) if t == topic]].mean() for topic in eval_topics])
        se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else math.nan
        spec_rows.append({"check": f"|gold(farma) - gold({other})| <= s.e. of the difference",
                          "difference": float(d.mean()), "se": se, "holds": bool(abs(d.mean()) <= se)})  # fmt: skip
    ctx.table("spec_equivalence_check", spec_rows)

    # -- 6. samples, figures, flags -----------------------------------------------------------------------------
    ctx.add_samples(
        {"topic": t, "seed": s, **{f"{n}.text": outs[n][i].text for n in names},
         **{f"{n}.gold": gold_rows[n][i] for n in names}}
        for i, (t, s) in enumerate(rows)
    )  # fmt: skip
    model_name = str(getattr(lm, "lmlab_spec", cfg.model))
    gold_metric = [r for r in ctx.metrics if r.metric == "gold"]
    highlight = [n for n in names if n.startswith("farma")]
    ctx.add_figure("gold", bar_with_ci(gold_metric, title=title_for("farma", model_name, cfg.seed, len(rows),
                   f"gold reward ({cfg.gold})"), ylabel="gold reward", highlight=highlight))  # fmt: skip
    ctx.add_figure("gold_vs_wall", quality_vs_compute(
        [(r.system, mean_wall[r.system], r.value) for r in gold_metric],
        title=title_for("farma", model_name, cfg.seed, len(rows), "gold vs wall time"),
        xlabel="wall time per sample (s)", ylabel="gold reward", highlight=highlight))  # fmt: skip
    ctx.flag("gold_reward", f"{cfg.gold} (offline rule-based)")
    ctx.flag("scale_proxy", {"gold": "rule-based reward instead of a learned evaluator RM on TL;DR / HH"})
    ctx.flag("frozen_body_rms", True)
    return ctx.finish(claims)


def build_claims(cfg: Any) -> list[Claim]:
    """The claim checks: gold reward (gated; paired per prompt x seed, clustered by prompt) and the mechanism check
    of RM calls per token (1 for FaRMA, k for ARGS / PARGS: fixed by the algorithms, so shown, never gating)."""
    base = "top_k"
    margin = cfg.noninferiority
    claims = [
        Claim("gold", "farma", base, ">", text="FaRMA's gold reward above top-k sampling"),
        Claim("gold", "args", base, ">", text="ARGS's gold reward above top-k sampling"),
        Claim("gold", "farma", "args", ">", min_effect=-margin,
              text=f"FaRMA competitive with ARGS: not below it by more than {margin:g} gold"),
        Claim("rm_calls_per_token", "farma", "args", "<", mechanism=True,
              text="mechanism: FaRMA makes 1 RM call per token, ARGS k (by construction)"),
    ]  # fmt: skip
    if cfg.run_pargs:
        claims += [
            Claim("gold", "pargs", base, ">", text="PARGS's gold reward above top-k sampling"),
            Claim("gold", "farma", "pargs", ">", min_effect=-margin,
                  text=f"FaRMA competitive with PARGS: not below it by more than {margin:g} gold"),
            Claim("rm_calls_per_token", "farma", "pargs", "<", mechanism=True,
                  text="mechanism: FaRMA makes 1 RM call per token, PARGS k (by construction)"),
        ]  # fmt: skip
    if cfg.best_of_n:
        claims.append(Claim("gold", "farma", f"best_of_{cfg.best_of_n}", ">", gate=False,
                            text="FaRMA vs Best-of-N (reported, not gated)"))  # fmt: skip
    if cfg.run_init_control:
        claims.append(Claim("gold", "farma", "farma_untrained", ">", gate=False,
                            text="trained V head vs its untrained LM-head copy (control, not gated)"))  # fmt: skip
    return claims
