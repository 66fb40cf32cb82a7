"""Reproduction: KABB vs Thompson sampling, UCB1, random-k, all experts and the best fixed subset on a drifting stream.

Paper claim (Zhang et al., ICML 2025): knowledge-aware Thompson sampling (knowledge distance, dual adaptation, decay)
coordinates experts at a better cost-performance balance: near all-experts quality at a fraction of the calls, and
better than knowledge-free bandits.

Data: the response caches of `cache_seeds` (one per cache seed: its own queries, shots and model samples): per query
and variant (the experts), the 0/1 correctness, the extracted answer (`answer_key`, the vote's key) and its FLOP
cost. Each cache is dealt into `blocks` disjoint query blocks, stratified by task; a (cache seed, block) is the
independent unit of the CIs (queries are never shared between units). Per block and bandit seed, `profile_fraction`
of each task's queries profile the experts: an expert's capability tags are the tasks where its profiled accuracy
beats the pool mean (the domain "knowledge graph": one domain per task, its concept = the task). The block's other
queries form the stream: `rounds` draws with replacement, `drift_share` of them from one half of the tasks before
round `drift_at` x `rounds` and from the other half after it (the mid-stream drift of the task mix). Each round the
bandit picks `top_k` experts; the aggregator votes their answer keys weighted by their posterior means; each chosen
expert is rewarded with its own correctness. "All experts" calls every expert and uses the same aggregator.

Claims (paired by run, clustered by (cache seed, block)): cold-start accuracy (first `cold_rounds`) of KABB above
vanilla Thompson sampling, and cumulative regret against the best fixed subset in hindsight below it (gated).
Reported: overall accuracy vs Thompson sampling, UCB1 and random; accuracy close to all experts at top_k / #experts
of the calls; recovery after the drift with and without decay; the ablations without the distance and with
misleading capability tags. Flags: the per-cache-seed effects (k-of-n sign check) and how often answer keys agree.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from lmlab.core.stats.seeding import derive_seed
from lmlab.methods.selection.kabb.method import (
    KABB,
    UCB1,
    AllExperts,
    Domain,
    EpsilonGreedy,
    Expert,
    RandomK,
    ThompsonSampling,
    best_fixed_subset,
    run_stream,
    task_difficulty,
)
from lmlab.results import Claim

SYSTEMS = (
    "kabb",
    "thompson",
    "ucb1",
    "eps_greedy",
    "random",
    "all_experts",
    "kabb_no_decay",
    "kabb_no_distance",
    "kabb_misleading",
    "best_fixed",
)  # fmt: skip


def _norm(a: str) -> str:
    return " ".join(str(a).strip().lower().split())


def answer_codes(cache: Any, vids: list[str], qids: list[str], correct: np.ndarray) -> np.ndarray:
    """[Q, V] answer ids per query: equal ids = the same answer, the vote's key.

    The key is the row's extracted ``answer_key`` (``lmlab.zoo.answers.answer_key``: the graded answer, normalised)
    where the cache stores one, else the normalised raw answer text (old caches; 1.2% of expert pairs coincide there,
    so votes almost never vote), else (no text: synthetic tables) correct answers agree and wrong ones differ."""
    keys: dict[tuple[str, str], str] = {}
    for r in cache.rows:
        k = getattr(r, "answer_key", None)
        keys[(r.variant, r.query_id)] = str(k) if k is not None else _norm(r.answer)
    codes = np.zeros(correct.shape, dtype=int)
    for qi, q in enumerate(qids):
        seen: dict[str, int] = {}
        for vi, v in enumerate(vids):
            a = keys.get((v, q), "")
            if not a:
                a = "<correct>" if correct[qi, vi] >= 0.5 else f"<wrong:{v}>"
            codes[qi, vi] = seen.setdefault(a, len(seen))
    return codes


def load_table(cfg: Any, ctx: Any, cache_seed: int = 0, cache: Any = None) -> dict[str, Any]:
    """The [Q, V] tables of one cache seed: correctness, answer ids, FLOPs, prompt tokens, task per query.

    `cache`: the loaded cache of `cache_seed` (else it is loaded, or planted when ``cfg.cache == "synthetic"``)."""
    from lmlab.data.respcache import load_cache, synthetic_cache

    if cache is None:
        if cfg.cache == "synthetic":
            cache = synthetic_cache(cfg.synthetic_variants, cfg.synthetic_queries, seed=cfg.seed + 1000 * cache_seed)
        else:
            cache = load_cache(cfg.cache, seed=cache_seed)
    have = [v for v in cfg.variants if v in cache.variant_ids]
    if len(have) > cfg.top_k:
        missing = [v for v in cfg.variants if v not in cache.variant_ids]
        if missing:
            ctx.note(f"cache seed {cache_seed}: experts missing from the cache (skipped): {missing}")
    else:
        if cfg.variants:
            ctx.note(f"cache seed {cache_seed}: at most top_k of {cfg.variants} in the cache: the experts are every "
                     "variant")  # fmt: skip
        have = None
    vids, qids, correct = cache.matrix("correct", variants=have)
    if len(vids) <= cfg.top_k:
        raise ValueError(f"top_k={cfg.top_k} needs more experts than that; the pool has {len(vids)}: {vids}")
    _, _, cost = cache.matrix("cost_flops", variants=vids)
    _, _, ptok = cache.matrix("n_prompt_tokens", variants=vids)
    correct, cost, ptok = correct.T, cost.T, ptok.T  # [Q, V]
    tasks = cache.tasks()
    names = sorted({tasks[q] for q in qids})
    task = np.array([names.index(tasks[q]) for q in qids])
    codes = answer_codes(cache, vids, qids, correct)
    keyed = sum(getattr(r, "answer_key", None) is not None for r in cache.rows)
    ctx.models[f"response-cache:{cache.suite}-s{cache_seed}"] = {
        "variants": vids,
        "queries": len(qids),
        "rows_with_answer_key": keyed,
        "failed": dict(cache.failed),
        "descriptions": {v: cache.variants.get(v, {}) for v in vids},
    }
    return {"cache": cache, "vids": vids, "qids": qids, "correct": (correct >= 0.5).astype(float), "cost": cost,
            "ptok": ptok, "task": task, "task_names": names, "codes": codes}  # fmt: skip


def query_blocks(task: np.ndarray, n_blocks: int, seed: int) -> list[np.ndarray]:
    """`n_blocks` disjoint query sets of one cache, stratified by task (each task's queries dealt round-robin after a
    seeded shuffle): independent samples of queries, the claims' unit (never overlapping splits of one table)."""
    rng = np.random.default_rng(derive_seed(seed, "blocks"))
    blocks: list[list[int]] = [[] for _ in range(n_blocks)]
    start = 0
    for t in np.unique(task):
        idx = rng.permutation(np.flatnonzero(task == t))
        for j, q in enumerate(idx):
            blocks[(start + j) % n_blocks].append(int(q))
        start += len(idx)  # the next task's round-robin continues, so block sizes stay within one query
    return [np.array(sorted(b), int) for b in blocks]


def profile_split(
    task: np.ndarray, cfg: Any, seed: int, pool: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(profile, stream) query indices of `pool` (default: every query): `profile_fraction` of each task profiles;
    `cfg.limit` caps each part."""
    rng = np.random.default_rng(derive_seed(seed, "profile"))
    pool = np.arange(len(task)) if pool is None else np.asarray(pool, int)
    prof, stream = [], []
    for t in np.unique(task[pool]):
        idx = rng.permutation(pool[task[pool] == t])
        n_p = min(len(idx) - 1, max(1, int(round(cfg.profile_fraction * len(idx))))) if len(idx) > 1 else 0
        prof += idx[:n_p].tolist()
        stream += idx[n_p:].tolist()
    prof, stream = np.array(sorted(prof), int), np.array(sorted(stream), int)
    if cfg.limit is not None:
        prof, stream = prof[: cfg.limit], stream[: cfg.limit]
    return prof, stream


def capability_tags(correct: np.ndarray, task: np.ndarray, prof: np.ndarray, names: list[str]) -> list[frozenset]:
    """Per expert: the tasks where its profiled accuracy beats the pool's mean accuracy on that task."""
    v = correct.shape[1]
    caps: list[set] = [set() for _ in range(v)]
    for t, name in enumerate(names):
        idx = prof[task[prof] == t]
        if len(idx) == 0:
            continue
        acc = correct[idx].mean(axis=0)
        for e in np.flatnonzero(acc > acc.mean()):
            caps[e].add(name)
    return [frozenset(c) for c in caps]


def make_stream(task: np.ndarray, stream: np.ndarray, cfg: Any, seed: int) -> np.ndarray:
    """`rounds` query indices: before the drift `drift_share` from the first half of the tasks, after it from the
    second half (uniform within a task)."""
    rng = np.random.default_rng(derive_seed(seed, "stream"))
    tasks = np.unique(task[stream])
    half = max(1, len(tasks) // 2)
    groups = (tasks[:half], tasks[half:] if len(tasks) > half else tasks[:half])
    by_task = {t: stream[task[stream] == t] for t in tasks}
    cut = int(round(cfg.drift_at * cfg.rounds))
    out = np.empty(cfg.rounds, dtype=int)
    for r in range(cfg.rounds):
        fav, other = (groups[0], groups[1]) if r < cut else (groups[1], groups[0])
        g = fav if rng.random() < cfg.drift_share else other
        t = g[rng.integers(len(g))]
        pool = by_task[t]
        out[r] = pool[rng.integers(len(pool))]
    return out


def run(cfg: Any, ctx: Any) -> Any:
    from lmlab.data.respcache import load_caches

    if cfg.cache == "synthetic":
        tables = [load_table(cfg, ctx, c) for c in cfg.cache_seeds]
    else:  # one cache per cache seed: the independent replicates
        caches = load_caches(cfg.cache, seeds=tuple(cfg.cache_seeds))
        tables = [load_table(cfg, ctx, c, cache) for c, cache in zip(cfg.cache_seeds, caches)]
    vids = tables[0]["vids"]
    for c, tab in zip(cfg.cache_seeds, tables):
        if tab["vids"] != vids:
            raise ValueError(f"cache seed {c} has experts {tab['vids']}, cache seed {cfg.cache_seeds[0]} {vids}: "
                             "every cache seed needs the same expert pool")  # fmt: skip
    v = len(vids)
    dr = tuple(map(float, cfg.difficulty_range))
    cut = int(round(cfg.drift_at * cfg.rounds))
    metrics: dict[tuple[str, str], list[float]] = defaultdict(list)
    units: list[str] = []  # one cluster id per (cache seed, block, bandit seed) value: the (cache seed, block)
    unit_acc: dict[str, dict[str, float]] = defaultdict(dict)
    picks: dict[str, np.ndarray] = {s: np.zeros(v) for s in SYSTEMS}
    samples, sizes, best_subsets = [], [], []
    runs = [(c, b, s) for c in range(len(tables)) for b in range(cfg.blocks) for s in range(cfg.seeds)]
    blocks_of = [query_blocks(tab["task"], cfg.blocks, derive_seed(cfg.seed, "cache", c))
                 for c, tab in zip(cfg.cache_seeds, tables)]  # fmt: skip
    for ci, b, s in ctx.progress(runs, "cache seeds x blocks x seeds"):
        tab, c = tables[ci], cfg.cache_seeds[ci]
        correct, codes, cost, task, names = tab["correct"], tab["codes"], tab["cost"], tab["task"], tab["task_names"]
        domains = [Domain(n, frozenset([n]), dr) for n in names]
        # length proxy of the official len(query) in characters: ~4 characters per prompt token
        difficulty = np.array([task_difficulty(4.0 * float(np.nanmax(tab["ptok"][q])), dr) for q in range(len(task))])
        unit = f"s{c}/b{b}"
        seed = derive_seed(cfg.seed, "bandit-seed", c, b, s)
        prof, stream = profile_split(task, cfg, seed, pool=blocks_of[ci][b])
        if len(stream) == 0:
            raise ValueError("no stream queries left after profiling: lower profile_fraction or blocks, raise limit")
        sizes.append((len(prof), len(stream)))
        caps = capability_tags(correct, task, prof, names) if len(prof) else [frozenset()] * v
        misleading = caps[1:] + caps[:1]  # every expert gets its neighbour's tags
        queries = make_stream(task, stream, cfg, seed)

        def kabb(capabilities, gamma=cfg.gamma, use_distance=True, _seed=seed):
            experts = [Expert(vids[i], capabilities[i]) for i in range(v)]
            return KABB(experts, cfg.top_k, gamma, cfg.weights, use_distance=use_distance, use_hist=cfg.use_hist,
                        alpha_floor=cfg.alpha_floor, seed=derive_seed(_seed, "sampler"))  # fmt: skip

        bandits = {
            "kabb": kabb(caps),
            "thompson": ThompsonSampling(v, cfg.top_k, seed=derive_seed(seed, "sampler")),
            "ucb1": UCB1(v, cfg.top_k, seed=derive_seed(seed, "sampler")),
            "eps_greedy": EpsilonGreedy(v, cfg.top_k, cfg.epsilon, seed=derive_seed(seed, "sampler")),
            "random": RandomK(v, cfg.top_k, seed=derive_seed(seed, "sampler")),
            # every expert, voted with KABB's aggregator: posterior-mean weights learnt on the same stream, same γ
            "all_experts": AllExperts(v, cfg.gamma, seed=derive_seed(seed, "sampler")),
            "kabb_no_decay": kabb(caps, gamma=1.0),
            "kabb_no_distance": kabb(caps, use_distance=False),
            "kabb_misleading": kabb(misleading),
        }
        teams = {}
        for name, bandit in bandits.items():
            res = run_stream(bandit, queries, correct, codes, cost, domains, task, difficulty)
            teams[name] = res.team
            metrics[(name, "calls_per_round")].append(float(res.calls.mean()))
            metrics[(name, "flops_per_round")].append(float(res.flops.mean()))
            for ch in res.chosen:
                picks[name][ch] += 1
        best, teams["best_fixed"] = best_fixed_subset(queries, correct, codes, cfg.top_k)
        best_subsets.append([vids[i] for i in best])
        metrics[("best_fixed", "calls_per_round")].append(float(cfg.top_k))
        metrics[("best_fixed", "flops_per_round")].append(float(cost[queries][:, list(best)].sum(axis=1).mean()))
        cold = min(cfg.cold_rounds, cfg.rounds)
        win = slice(cut, min(cfg.rounds, cut + cfg.window))
        for name, team in teams.items():
            metrics[(name, "accuracy")].append(float(team.mean()))
            metrics[(name, "cold_accuracy")].append(float(team[:cold].mean()))
            metrics[(name, "post_drift_accuracy")].append(float(team[win].mean()))
            metrics[(name, "regret")].append(float(np.sum(teams["best_fixed"] - team)))
            unit_acc[unit][name] = unit_acc[unit].get(name, 0.0) + float(team.mean()) / cfg.seeds
        units.append(unit)
        samples.append({"cache_seed": c, "block": b, "seed": s, "best_fixed": best_subsets[-1],
                        "capabilities": [sorted(cap) for cap in caps],
                        **{f"accuracy_{k}": float(t.mean()) for k, t in teams.items()}})  # fmt: skip
    src = tables[0]["cache"].suite
    prof_n, stream_n = np.mean([p for p, _ in sizes]), np.mean([q for _, q in sizes])
    ctx.data_info[f"respcache:{src}/profile"] = {"n": round(float(prof_n), 1), "cache_seeds": list(cfg.cache_seeds),
                                                 "per": "block x seed"}  # fmt: skip
    ctx.data_info[f"respcache:{src}/stream"] = {"n": round(float(stream_n), 1), "cache_seeds": list(cfg.cache_seeds),
                                                "blocks": cfg.blocks, "rounds": cfg.rounds}  # fmt: skip
    unit_names = {"regret": "rounds", "calls_per_round": "calls", "flops_per_round": "FLOPs"}
    for (name, metric), vals in metrics.items():
        ctx.record(
            name,
            metric,
            vals,
            clusters=units,
            unit=unit_names.get(metric, ""),
            note="one value per (cache seed, block, bandit seed); clusters = (cache seed, query block)",
        )
    for name in SYSTEMS:
        tot = picks[name].sum()
        if tot:
            ctx.flag(f"pick_share_{name}", {vids[i]: round(float(picks[name][i] / tot), 3) for i in range(v)})
    ctx.flag("best_fixed_subsets", best_subsets[:5])
    ctx.flag("task_accuracy", {f"s{c}": {vids[i]: {n: round(float(tab["correct"][tab["task"] == t, i].mean()), 3)
                                                   for t, n in enumerate(tab["task_names"])} for i in range(v)}
                               for c, tab in zip(cfg.cache_seeds, tables)})  # fmt: skip
    # vote keys that coincide: how often a vote can vote at all (share of expert pairs with one answer per query)
    ctx.flag("identical_answer_pairs", {f"s{c}": round(float(np.mean([
        np.mean(tab["codes"][:, i] == tab["codes"][:, j]) for i in range(v) for j in range(i + 1, v)])), 4)
        for c, tab in zip(cfg.cache_seeds, tables)})  # fmt: skip
    # per cache seed (the replicate): the kabb - all_experts and kabb - thompson accuracy differences, k-of-n signs
    per_seed = {f"s{c}": {k: round(float(np.mean([unit_acc[f"s{c}/b{b}"]["kabb"] - unit_acc[f"s{c}/b{b}"][k]
                                                  for b in range(cfg.blocks)])), 4)
                          for k in ("thompson", "all_experts")} for c in cfg.cache_seeds}  # fmt: skip
    ctx.flag("per_cache_seed_accuracy_effect", per_seed)
    ctx.add_samples(samples)
    _figure(ctx, cfg)
    claims = [
        Claim("cold_accuracy", "kabb", "thompson", ">",
              text=f"cold-start accuracy (first {cfg.cold_rounds} rounds): KABB above vanilla Thompson sampling"),
        Claim("regret", "kabb", "thompson", "<",
              text="cumulative regret against the best fixed subset in hindsight: KABB below Thompson sampling"),
        Claim("accuracy", "kabb", "thompson", ">", gate=False,
              text="stream accuracy: KABB above Thompson sampling (reported)"),
        Claim("accuracy", "kabb", "ucb1", ">", gate=False, text="stream accuracy: KABB above UCB1 (reported)"),
        Claim("accuracy", "kabb", "eps_greedy", ">", gate=False,
              text="stream accuracy: KABB above ε-greedy (reported)"),
        Claim("accuracy", "kabb", "random", ">", gate=False, text="stream accuracy: KABB above random-k (reported)"),
        Claim("accuracy", "kabb", "all_experts", ">", min_effect=-0.05, gate=False,
              text="stream accuracy: KABB within 0.05 of all experts aggregated by the same posterior-weighted vote "
                   "(reported)"),
        Claim("calls_per_round", "kabb", "all_experts", "<", mechanism=True,
              text=f"KABB calls top_k={cfg.top_k} experts per query, all experts {v}"),
        Claim("post_drift_accuracy", "kabb", "kabb_no_decay", ">", gate=False,
              text=f"recovery ({cfg.window} rounds after the drift): KABB with decay above without (reported)"),
        Claim("cold_accuracy", "kabb", "kabb_no_distance", ">", gate=False,
              text="ablation: the knowledge distance raises cold-start accuracy (reported)"),
        Claim("cold_accuracy", "kabb_misleading", "thompson", "<", gate=False,
              text="limitation: misleading capability tags lower cold-start accuracy below Thompson sampling"),
    ]  # fmt: skip
    ctx.note(
        f"{v} experts ({', '.join(vids)}) of cache {src!r}, cache seeds {list(cfg.cache_seeds)} x {cfg.blocks} "
        f"disjoint query blocks (the CI unit, {len(set(units))} clusters) x {cfg.seeds} bandit seeds x {cfg.rounds} "
        f"rounds, top_k={cfg.top_k}, γ={cfg.gamma} per round; drift of the task mix at round {cut}; mean "
        f"profile/stream queries per run = ({prof_n:.1f}, {stream_n:.1f})."
    )
    return ctx.finish(claims)


def _figure(ctx: Any, cfg: Any) -> None:
    from lmlab.core.report.plotting import bar_with_ci, title_for

    rows = [m for m in ctx.metrics if m.metric == "accuracy"]
    ctx.add_figure("accuracy", bar_with_ci(rows, title=title_for("kabb", cfg.cache, cfg.seed, cfg.seeds,
                                                                 "team accuracy over the stream"),
                                           ylabel="accuracy", highlight=("kabb",)))  # fmt: skip
