"""Reproduction: RLTHF vs random selection, uncertainty sampling, AI-only and full annotation, at one budget.

Paper claim (Xu et al., ICML 2025): sending to humans only the pairs that the reward distribution of an RM trained on
AI labels marks as likely mislabelled (below the knee of the sorted margins), amplifying the corrections and
dropping the rest of that tail, reaches full-human RM accuracy with 6-7% of the human effort.

Data (`task.py`): `countries` questions (capital, continent, currency), train split for the pool and test split for
the held-out pairs (disjoint countries); every response is composed from latent attributes (correct fact, polite
opening, unsafe suggestion, length), so the hidden utility ``U = 3 correct - 2 unsafe + 0.5 polite - 0.3 |len -
3|`` is exact. The human is `lmlab.core.training.annotator.GroundTruthAnnotator` (it alone holds U, refuses queries
past its
budget, labels held-out pairs uncounted); every strategy gets its own annotator with the same budget.

AI labellers (uncounted): ``systematic``: `SimulatedJudge`, blind to politeness, crediting `judge_length_bias` per
sentence, errors rising as its perceived margin shrinks; ``flip``: `FlipJudge`, uniform flips at `flip_prob`.

Reward model: MiniLM embeddings of "prompt \\n response" (frozen, computed once), projected on the `pca_dim`
principal directions of the training responses (unlabelled), pair features phi(a) - phi(b) standardised on the
pool; linear Bradley-Terry (`method.fit_bt`). Strategies (`method.curate`): rlthf, random, uncertainty (same
annotator budget, same rounds, same amplification), self (the paper's no-human ablation, budget 0); plus ai_only
(budget 0) and full (budget = the whole pool).

Metrics per replicate (the independent unit: pair draws, labeller and human noise, folds): ``test_acc``, the RM's
held-out accuracy against the clean oracle (one value per test pair, clustered by replicate); ``label_acc``, the
accuracy of the curated labels (the kept pairs) against U (measured through the annotator's uncharged
`agreement`, for the report only); the curve of test accuracy after each round (x = % of the pool sent to the
human); ``yield``, the share of queried pairs whose AI label the human overturned.

Back-off tuning (dev stage, before the replicates): the back-off ratio of RLTHF and of self (the only strategies
with a knob beyond the shared amplification) is chosen per noise model from `backoff_grid` by the mean held-out RM
accuracy on the suite's *dev* split (countries disjoint from train and test): `dev_replicates` pools of
`n_train_pairs` drawn from the training prompts, each curated at every grid value with the same annotator budget
and seed, the RM scored on `n_dev_pairs` clean-oracle dev pairs (uncounted). While the best value is the grid's
largest and below 2 (the natural bound: only the confident region above the elbow kept), the grid grows by its
last step. The test pairs never enter the choice; every value's dev score and the choice are recorded
(`backoff_dev` table, ``backoff`` / ``dev_acc`` rows).

Claims (gated, systematic noise, the spec's): test_acc of RLTHF above uncertainty, random and AI-only. Reported:
the same under uniform flips (where the method is expected to look better); label accuracy vs random and
uncertainty; the gap full - RLTHF; self-improvement vs AI-only; the correction yield vs random.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lmlab.core.stats.seeding import derive_seed
from lmlab.methods.alignment.rlthf.method import Curation, bt_margins, curate, fit_bt
from lmlab.methods.alignment.rlthf.task import TASKS, build_prompts, draw_pairs, pair_features, utility
from lmlab.results import Claim

LABELS = {
    "rlthf": "RLTHF",
    "random": "random",
    "uncertainty": "uncertainty",
    "self": "self-improvement",
    "ai_only": "AI-only",
    "full": "full annotation",
}

BACKOFF_STRATEGIES = ("rlthf", "self")  # the strategies with a back-off (they curate from a reward distribution)
BACKOFF_BOUND = 2.0  # back-off 2 keeps only the confident region above the elbow: the grid never grows past it

HASH_DIM = 512

# ------------------------------------------------------------------------------------------------------ data


def hashing_embed(texts: list[str], dim: int = HASH_DIM) -> np.ndarray:
    """A model-free stand-in for sentence embeddings (tests, smoke): counts of hashed word uni- and bigrams, (n, dim)
    unit rows."""
    import hashlib

    out = np.zeros((len(texts), dim), dtype=np.float32)
    for i, t in enumerate(texts):
        words = t.lower().split()
        for g in [*words, *(f"{a} {b}" for a, b in zip(words, words[1:]))]:
            out[i, int.from_bytes(hashlib.blake2b(g.encode(), digest_size=4).digest(), "little") % dim] += 1.0
    return out / np.linalg.norm(out, axis=1, keepdims=True).clip(1e-12)


def _prompts(ctx: Any, cfg: Any, split: str, cap: int | None) -> list[Any]:
    examples = [e for t in TASKS for e in ctx.data("countries", None, split=split, task=t)]
    prompts = build_prompts(examples, variants=cfg.variants_per_prompt, seed=cfg.seed)
    return prompts[:cap] if cap is not None else prompts


def _embed(ctx: Any, cfg: Any, texts: list[str]) -> np.ndarray:
    """(n, d) unit rows: MiniLM (texts sorted by length so batches pad little) or a hashing stand-in."""
    if cfg.embedder == "hashing":
        ctx.models["hashing"] = {"name": f"word uni+bigram hashing, {HASH_DIM} buckets", "params": 0}
        return hashing_embed(texts)
    from lmlab.core.inference.embed import Embedder
    from lmlab.core.inference.models import model_info

    emb = Embedder(cfg.model)
    if type(emb.model).__name__.endswith("ForCausalLM"):
        raise ValueError(
            f"model must be a BERT-style sentence encoder such as minilm for embedder='model', got "
            f"{cfg.model!r} ({type(emb.model).__name__}); or pass --set embedder=hashing"
        )
    ctx.models[cfg.model] = model_info(emb.model)
    order = np.argsort([len(t) for t in texts], kind="stable")
    out = np.empty((len(texts), emb.model.config.hidden_size), dtype=np.float32)
    out[order] = emb.encode([texts[i] for i in order], batch_size=max(1, cfg.batch_size) * 8)
    return out


def _features(cfg: Any, train_p: list[Any], held_p: list[Any], x: np.ndarray) -> tuple[dict[str, int], np.ndarray]:
    """Response id -> row, and the rows projected on the top principal directions of the training responses
    (`held_p`: the test and dev prompts, projected, never fitted)."""
    ids = [v.id for p in (*train_p, *held_p) for v in p.variants]
    n_train = sum(len(p.variants) for p in train_p)
    import torch

    xt = torch.from_numpy(np.asarray(x, dtype=np.float64))
    mu = xt[:n_train].mean(0)
    _, _, vt = torch.linalg.svd(xt[:n_train] - mu, full_matrices=False)  # torch's LAPACK: numpy's was 10x slower
    k = min(cfg.pca_dim, vt.shape[0])
    return {r: i for i, r in enumerate(ids)}, ((xt - mu) @ vt[:k].T).numpy()  # (n_responses, k)


def _standardise(f_train: np.ndarray, f_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sd = f_train.std(0)
    sd = np.maximum(sd, 1e-2 * max(float(sd.max()), 1e-12))
    return f_train / sd, f_test / sd


def _judge(cfg: Any, noise: str, pairs: dict[str, tuple[Any, Any]], seed: int) -> Any:
    from lmlab.core.training.annotator import FlipJudge, SimulatedJudge

    u = lambda r: utility(r, target_len=cfg.target_len)  # noqa: E731
    if noise == "systematic":
        return SimulatedJudge(
            pairs,
            utility=u,
            blind_spot=lambda r: 0.5 * r.polite,
            length=lambda r: r.length,
            length_bias=cfg.judge_length_bias,
            temperature=cfg.judge_temperature,
            seed=seed,
        )
    return FlipJudge(pairs, utility=u, flip_prob=cfg.flip_prob, seed=seed)


# ------------------------------------------------------------------------------------------------------- run


def run(cfg: Any, ctx: Any) -> Any:
    t0 = time.perf_counter()
    train_p = _prompts(ctx, cfg, "train", cfg.max_train_prompts)
    test_p = _prompts(ctx, cfg, "test", cfg.max_test_prompts)
    dev_p = _prompts(ctx, cfg, "dev", cfg.max_dev_prompts) if cfg.backoff is None else []
    if len(train_p) < 2 or not test_p or (cfg.backoff is None and not dev_p):
        raise ValueError(
            f"need >= 2 training prompts, >= 1 test prompt and (to tune the back-off) >= 1 dev prompt, got "
            f"{len(train_p)}, {len(test_p)} and {len(dev_p)} (raise --limit or the prompt caps)"
        )
    texts = [f"{p.text}\n{v.text}" for p in (*train_p, *test_p, *dev_p) for v in p.variants]
    x = _embed(ctx, cfg, texts)
    index, z = _features(cfg, train_p, [*test_p, *dev_p], x)
    embed_s = time.perf_counter() - t0

    with _one_thread():  # the RM fits are tiny: extra torch threads only add contention (measured 10x slower)
        return _run(cfg, ctx, train_p, test_p, dev_p, index, z, len(texts), embed_s)


@contextmanager
def _one_thread() -> Iterator[None]:
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def _run(
    cfg: Any,
    ctx: Any,
    train_p: list[Any],
    test_p: list[Any],
    dev_p: list[Any],
    index: dict[str, int],
    z: np.ndarray,
    n_texts: int,
    embed_s: float,
) -> Any:
    strategies = list(dict.fromkeys(cfg.strategies))
    tuned = [s for s in strategies if s in BACKOFF_STRATEGIES]
    if cfg.backoff is None:
        t_dev = time.perf_counter()
        backoff, dev_rows = _tune_backoff(cfg, ctx, train_p, dev_p, index, z, tuned)
        _record_backoff(ctx, cfg, backoff, dev_rows, time.perf_counter() - t_dev)
    else:
        backoff = {(s, noise): cfg.backoff for s in tuned for noise in cfg.noise_models}
        for (s, noise), b in backoff.items():
            ctx.record_value(f"{s}@{noise}", "backoff", b, note="back-off ratio, fixed by the config (not tuned)")
    acc = _Acc()
    for r in ctx.progress(range(cfg.replicates), "replicates"):
        _replicate(cfg, r, train_p, test_p, index, z, strategies, backoff, acc)
    vals, curve, judge_acc, budget, n_train = acc.vals, acc.curve, acc.judge_acc, acc.budget, acc.n_train
    clus, samples, hist_rows = acc.clus, acc.samples, acc.hist_rows

    note_unit = "one value per replicate (the independent unit)"
    for (name, metric), v in vals.items():
        if metric == "test_acc":
            ctx.record(
                name,
                metric,
                v,
                clusters=clus[(name, metric)],
                note="held-out pairs vs the clean oracle; CI clustered by replicate",
            )
        else:
            ctx.record(name, metric, v, note=note_unit)
    for noise, v in judge_acc.items():
        ctx.record(f"judge@{noise}", "label_acc", v, note=f"the {noise} AI labeller's accuracy vs U (report only)")
    ctx.record_value("all", "budget_pairs", budget, note=f"unique oracle queries per budgeted strategy, of {n_train}")
    ctx.record_value("all", "embed_s", embed_s, unit="s", note=f"{n_texts} texts embedded ({cfg.embedder})")
    ctx.table("rounds", hist_rows)
    rounds = list(range(cfg.iterations + 1))
    per_round_share = (budget / cfg.iterations) / max(1, n_train)
    ctx.table(
        "budget_curve",
        [
            {
                "system": name,
                "round": k,
                "human_pct": _pct(name.split("@")[0], k, per_round_share),
                "test_acc": float(np.mean(curve[(name, k)])),
            }
            for name in sorted({n for n, _ in curve})
            for k in rounds
            if (name, k) in curve
        ],
    )
    ctx.add_samples(samples)
    ctx.flag(
        "equal_budget",
        {"pairs": budget, "share": round(budget / max(1, n_train), 4), "per_round": budget // cfg.iterations},
    )
    ctx.flag("judge_accuracy", {k: round(float(np.mean(v)), 4) for k, v in judge_acc.items()})
    _figures(ctx, cfg, curve, strategies, rounds, per_round_share)
    human = "clean" if cfg.human_noise_temperature is None else f"BT noise T={cfg.human_noise_temperature}"
    judges = {"systematic": "SimulatedJudge (politeness blind spot, length bias)", "flip": "FlipJudge (uniform flips)"}
    for noise, v in judge_acc.items():
        ctx.note(
            f"Substitution ({noise}): human = simulated oracle with utility U ({human}); AI labeller = "
            f"{judges[noise]}; its accuracy vs U = {100 * float(np.mean(v)):.1f}%."
        )
    encoder = cfg.model if cfg.embedder == "model" else "hashing"
    ctx.note(
        f"RM = linear Bradley-Terry on {encoder} embeddings (PCA {cfg.pca_dim}, standardised, L2 "
        f"{cfg.l2:g}), cross-fitted over {cfg.n_folds} prompt-grouped folds; {cfg.replicates} replicates of "
        f"{n_train} training pairs; budget {budget} pairs ({100 * budget / max(1, n_train):.1f}%) in "
        f"{cfg.iterations} rounds for every budgeted strategy."
    )
    return ctx.finish(_claims(cfg, strategies))


# -------------------------------------------------------------------------------------------- back-off on dev


def _tune_backoff(
    cfg: Any,
    ctx: Any,
    train_p: list[Any],
    dev_p: list[Any],
    index: dict[str, int],
    z: np.ndarray,
    tuned: list[str],
) -> tuple[dict[tuple[str, str], float], list[dict[str, Any]]]:
    """The dev stage (module docstring): per (strategy, noise model), the back-off with the best mean dev RM
    accuracy, and one row per value tried. Each dev replicate is a fresh pool from the training prompts with its own
    annotator budget and AI labels; every value of one (strategy, noise) reuses the pool's seeds (paired)."""
    pools = []
    for k in range(cfg.dev_replicates):
        dseed = derive_seed(cfg.seed, "dev", k)
        pool = _Pool.draw(
            cfg, dseed, f"dev replicate {k}", train_p, dev_p, cfg.n_dev_pairs, f"devpool{k}", f"dev{k}", index, z
        )
        _, dev_labels = pool.door(0)  # dev pairs: clean truth, uncounted, closed to the training door
        ai = {
            noise: np.array(_judge(cfg, noise, pool.pairs, derive_seed(dseed, "judge", noise)).label(pool.train_ids))
            for noise in cfg.noise_models
        }
        pools.append((dseed, pool, np.array(dev_labels.labels(pool.held_ids)), ai))

    def dev_acc(s: str, noise: str, b: float) -> list[float]:
        out = []
        for dseed, pool, y_dev, ai in pools:
            cur, _ = pool.curate(s, ai[noise], b, derive_seed(dseed, "curate", noise))
            out.append(float(pool.held_hits(cur.labels, cur.weights, y_dev).mean()))
        return out  # (dev_replicates,)

    chosen: dict[tuple[str, str], float] = {}
    rows: list[dict[str, Any]] = []
    grid = sorted(float(b) for b in cfg.backoff_grid)
    cells = [(noise, s) for noise in cfg.noise_models for s in tuned]
    for noise, s in ctx.progress(cells, "back-off on dev"):
        best, scores = choose_backoff(grid, lambda b, s=s, noise=noise: dev_acc(s, noise, b))
        chosen[(s, noise)] = best
        rows += [
            {
                "noise": noise,
                "system": s,
                "backoff": b,
                "dev_acc": float(np.mean(v)),
                "dev_acc_per_replicate": [round(a, 5) for a in v],
                "grown": b not in grid,
                "chosen": b == best,
            }
            for b, v in sorted(scores.items())
        ]
    return chosen, rows


def choose_backoff(
    grid: list[float], dev_score: Callable[[float], list[float]], *, bound: float = BACKOFF_BOUND
) -> tuple[float, dict[float, list[float]]]:
    """The back-off with the highest mean `dev_score` (a tie goes to the smaller one: fewer pairs dropped), and the
    scores of every value tried. While the best is the largest value tried and below `bound` (the natural upper
    bound; 0, the lower one, is natural too), the grid grows by its last step, so the choice is never an edge
    that could move."""
    grid = sorted(float(b) for b in grid)
    step = grid[-1] - grid[-2] if len(grid) > 1 else 0.25
    scores = {b: list(dev_score(b)) for b in grid}

    def best() -> float:
        return min(scores, key=lambda b: (-float(np.mean(scores[b])), b))

    while best() == max(scores) < bound:
        b = round(min(bound, max(scores) + step), 6)
        scores[b] = list(dev_score(b))
    return best(), scores


def _record_backoff(
    ctx: Any, cfg: Any, chosen: dict[tuple[str, str], float], rows: list[dict[str, Any]], seconds: float
) -> None:
    ctx.table("backoff_dev", rows)
    parts = []
    for (s, noise), b in chosen.items():
        mine = [row for row in rows if row["system"] == s and row["noise"] == noise]
        best = next(row for row in mine if row["chosen"])
        ctx.record_value(f"{s}@{noise}", "backoff", b, note="back-off ratio chosen on the dev split")
        ctx.record_value(
            f"{s}@{noise}", "dev_acc", best["dev_acc"], note="mean dev RM accuracy at the chosen back-off"
        )
        scores = ", ".join(f"{row['backoff']:g}: {row['dev_acc']:.3f}" for row in mine)
        parts.append(f"{s}@{noise} -> {b:g} (dev accuracy by back-off: {scores})")
    ctx.flag("backoff_chosen", {f"{s}@{noise}": b for (s, noise), b in chosen.items()})
    ctx.record_value("all", "tune_s", seconds, unit="s", note="the dev stage choosing the back-off")
    ctx.note(
        f"Back-off chosen on the dev split ({cfg.dev_replicates} dev pools of the training prompts, each at the "
        f"same annotator budget; RM accuracy on up to {cfg.n_dev_pairs} dev-country pairs per pool, clean oracle; "
        f"test pairs unused): " + "; ".join(parts) + "."
    )


def _pct(system: str, k: int, per_round_share: float) -> float:
    """% of the pool sent to the oracle after round `k`."""
    if system == "full":
        return 100.0
    return round(100 * k * per_round_share, 2) if system in ("rlthf", "random", "uncertainty") else 0.0


def _claims(cfg: Any, strategies: list[str]) -> list[Claim]:
    claims = []
    for noise in cfg.noise_models:
        gate = noise == "systematic"
        tag = "systematic AI noise" if gate else "uniform flips (reported: this noise overstates the method)"
        for b in ("uncertainty", "random", "ai_only"):
            if b in strategies or b == "ai_only":
                claims.append(
                    Claim(
                        "test_acc",
                        f"rlthf@{noise}",
                        f"{b}@{noise}",
                        ">",
                        gate=gate,
                        text=f"held-out RM accuracy: RLTHF above {LABELS[b]} at the same oracle budget ({tag})",
                    )
                )
        for b in ("random", "uncertainty"):
            if b in strategies:
                claims.append(
                    Claim(
                        "label_acc",
                        f"rlthf@{noise}",
                        f"{b}@{noise}",
                        ">",
                        gate=False,
                        text=f"curated label accuracy: RLTHF above {LABELS[b]} ({noise}, reported)",
                    )
                )
        claims.append(
            Claim(
                "test_acc",
                f"full@{noise}",
                f"rlthf@{noise}",
                ">",
                gate=False,
                text=f"the gap full annotation - RLTHF (expected a few points at most; {noise}, reported)",
            )
        )
        if "self" in strategies:
            claims.append(
                Claim(
                    "test_acc",
                    f"self@{noise}",
                    f"ai_only@{noise}",
                    ">",
                    gate=False,
                    text=f"self-improvement without humans above AI-only (expected not; {noise}, reported)",
                )
            )
        if "random" in strategies:
            claims.append(
                Claim(
                    "yield",
                    f"rlthf@{noise}",
                    f"random@{noise}",
                    ">",
                    gate=False,
                    text=f"share of queried pairs the human overturned: below-knee vs random ({noise}, reported)",
                )
            )
    return claims


def _figures(ctx: Any, cfg: Any, curve: dict, strategies: list[str], rounds: list[int], share: float) -> None:
    from lmlab.core.report.plotting import lines, title_for

    xs = [100 * k * share for k in rounds]
    for noise in cfg.noise_models:
        series = {}
        for s in strategies:
            if s == "self":
                continue
            series[LABELS[s]] = [float(np.mean(curve[(f"{s}@{noise}", k)])) for k in rounds]
        for s in ("ai_only", "full"):
            series[LABELS[s] + (" (100%)" if s == "full" else "")] = [
                float(np.mean(curve[(f"{s}@{noise}", 0)]))
            ] * len(rounds)
        png = lines(
            xs,
            series,
            title=title_for(
                "rlthf",
                cfg.model if cfg.embedder == "model" else "hashing",
                cfg.seed,
                cfg.replicates,
                f"RM accuracy vs oracle budget ({noise})",
            ),
            xlabel="% of the pool sent to the oracle",
            ylabel="held-out preference accuracy",
        )
        ctx.add_figure(f"accuracy_vs_budget_{noise}", png)


@dataclass
class _Acc:
    """What the replicates measured, collected for the records."""

    vals: dict = field(default_factory=lambda: defaultdict(list))  # (system@noise, metric) -> values
    clus: dict = field(default_factory=lambda: defaultdict(list))  # (system@noise, metric) -> replicate ids
    curve: dict = field(default_factory=lambda: defaultdict(list))  # (system@noise, round) -> per-replicate acc
    judge_acc: dict = field(default_factory=lambda: defaultdict(list))
    samples: list = field(default_factory=list)
    hist_rows: list = field(default_factory=list)
    budget: int = 0
    n_train: int = 0


@dataclass
class _Pool:
    """One drawn training pool and its held-out pairs (test or dev): the annotator door, the curation and the RM's
    held-out hits."""

    cfg: Any
    seed: int
    train_ids: list[str]
    held_ids: list[str]
    pairs: dict[str, tuple[Any, Any]]
    f_tr: np.ndarray  # (n_train, k) standardised phi(a) - phi(b)
    f_held: np.ndarray  # (n_held, k), standardised with the pool's scale
    groups: list[str]
    n_folds: int
    per_round: int
    budget: int

    @property
    def n_train(self) -> int:
        return len(self.train_ids)

    @classmethod
    def draw(
        cls,
        cfg: Any,
        seed: int,
        what: str,
        train_p: list[Any],
        held_p: list[Any],
        n_held: int,
        train_name: str,
        held_name: str,
        index: dict[str, int],
        z: np.ndarray,
    ) -> _Pool:
        train = draw_pairs(train_p, cfg.n_train_pairs, seed=seed, name=train_name, target_len=cfg.target_len)
        held = draw_pairs(held_p, n_held, seed=seed, name=held_name, target_len=cfg.target_len)
        if len(train) < 16 or not held:
            raise ValueError(f"{what}: {len(train)} training / {len(held)} held-out pairs; need >= 16 and >= 1")
        per_round = max(1, int(round(cfg.human_fraction * len(train) / cfg.iterations)))
        f_tr, f_held = _standardise(pair_features(train, index, z), pair_features(held, index, z))
        groups = [p.prompt.id for p in train]
        return cls(
            cfg,
            seed,
            [p.id for p in train],
            [p.id for p in held],
            {p.id: (p.a, p.b) for p in (*train, *held)},
            f_tr,
            f_held,
            groups,
            min(cfg.n_folds, len(set(groups))),
            per_round,
            per_round * cfg.iterations,
        )

    def door(self, budget: int) -> tuple[Any, Any]:
        """A fresh annotator with `budget` and the held-out labels (clean truth, uncounted, closed to training)."""
        from lmlab.core.training.annotator import GroundTruthAnnotator

        cfg = self.cfg
        ann = GroundTruthAnnotator(
            self.pairs,
            budget=budget,
            utility=lambda x: utility(x, target_len=cfg.target_len),
            noise_temperature=cfg.human_noise_temperature,
            seed=self.seed,
        )
        return ann, ann.held_out(self.held_ids)

    def held_hits(self, labels: np.ndarray, weights: np.ndarray | None, y_held: np.ndarray) -> np.ndarray:
        """1.0 where the RM fitted on (labels, weights) ranks a held-out pair as the truth does, (n_held,)."""
        w = fit_bt(self.f_tr, labels, weights, l2=self.cfg.l2)
        return ((bt_margins(self.f_held, w) > 0).astype(int) == y_held).astype(float)

    def curate(self, strategy: str, ai: np.ndarray, backoff: float, seed: int) -> tuple[Curation, int]:
        """`strategy` on the AI labels through its own annotator (budget 0 for self): the curation and the pairs
        charged (which must be the budget)."""
        cfg = self.cfg
        ann, _ = self.door(self.budget if strategy != "self" else 0)

        def ask(idx: list[int], it: int) -> list[int]:
            return ann.label([self.train_ids[i] for i in idx], iteration=it)

        cur = curate(
            self.f_tr,
            ai,
            None if strategy == "self" else ask,
            strategy=strategy,
            iterations=cfg.iterations,
            per_iteration=self.per_round,
            amplification=cfg.amplification,
            backoff=backoff,
            groups=self.groups,
            n_folds=self.n_folds,
            l2=cfg.l2,
            smooth=cfg.smooth,
            split=cfg.split,
            query_order=cfg.query_order,
            seed=seed,
        )
        if strategy != "self" and ann.n_queried != self.budget:
            raise RuntimeError(
                f"{strategy}: the annotator was charged {ann.n_queried} pairs, the budget is {self.budget}"
            )
        return cur, ann.n_queried


def _replicate(
    cfg: Any,
    r: int,
    train_p: list[Any],
    test_p: list[Any],
    index: dict[str, int],
    z: np.ndarray,
    strategies: list[str],
    backoff: dict[tuple[str, str], float],
    acc: _Acc,
) -> None:
    """One replicate: draw the pairs, label them with each AI labeller, run every strategy with its own annotator."""
    systems = [*strategies, "ai_only", "full"]
    rseed = derive_seed(cfg.seed, "replicate", r)
    pool = _Pool.draw(
        cfg, rseed, f"replicate {r}", train_p, test_p, cfg.n_test_pairs, f"train{r}", f"test{r}", index, z
    )
    n_train, budget, train_ids = pool.n_train, pool.budget, pool.train_ids
    acc.n_train, acc.budget = n_train, budget
    referee, test_labels = pool.door(0)  # reports label accuracy (uncharged `agreement`) and nothing else
    y_test = np.array(test_labels.labels(pool.held_ids))

    def test_hits(labels: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
        return pool.held_hits(labels, weights, y_test)

    for noise in cfg.noise_models:
        judge = _judge(cfg, noise, pool.pairs, derive_seed(rseed, "judge", noise))
        ai = np.array(judge.label(train_ids))
        acc.judge_acc[noise].append(referee.agreement(train_ids, ai.tolist()))
        results: dict[str, tuple[np.ndarray, np.ndarray, list[Any], int]] = {}
        for s in strategies:
            cur, charged = pool.curate(s, ai, backoff.get((s, noise), 0.0), derive_seed(rseed, "curate", noise))
            results[s] = (cur.labels, cur.weights, cur.history, charged)
        ann_full, _ = pool.door(n_train)
        full = np.array(ann_full.label(train_ids, iteration=0))
        results["full"] = (full, np.ones(n_train), [], ann_full.n_queried)
        results["ai_only"] = (ai, np.ones(n_train), [], 0)
        ai_hits = test_hits(ai, None)
        for s in systems:
            labels, weights, history, charged = results[s]
            name = f"{s}@{noise}"
            hits = ai_hits if s == "ai_only" else test_hits(labels, weights)
            acc.vals[(name, "test_acc")].extend(hits.tolist())
            acc.clus[(name, "test_acc")].extend([f"r{r}"] * len(hits))
            kept = [train_ids[i] for i in np.flatnonzero(weights > 0)]
            lab_acc = referee.agreement(kept, [int(labels[i]) for i in np.flatnonzero(weights > 0)])
            acc.vals[(name, "label_acc")].append(lab_acc)
            acc.vals[(name, "human_share")].append(charged / n_train)
            acc.vals[(name, "kept_share")].append(len(kept) / n_train)
            acc.curve[(name, 0)].append(float(ai_hits.mean()) if s in strategies else float(hits.mean()))
            for h in history:
                a = float(test_hits(h.labels, h.weights).mean()) if h is not history[-1] else float(hits.mean())
                acc.curve[(name, h.iteration)].append(a)
                acc.hist_rows.append(
                    {
                        "replicate": r,
                        "noise": noise,
                        "system": s,
                        "round": h.iteration,
                        "human_share": h.n_human / n_train,
                        "queried": len(h.queried),
                        "overturned": h.flipped,
                        "dropped": h.n_dropped,
                        "elbow": h.elbow,
                        "knee": h.knee,
                        "fallback": h.fallback,
                        "test_acc": a,
                    }
                )
            if history and s != "self":
                q = sum(len(h.queried) for h in history)
                acc.vals[(name, "yield")].append(sum(h.flipped for h in history) / max(1, q))
            acc.samples.append(
                {
                    "replicate": r,
                    "noise": noise,
                    "system": s,
                    "test_acc": float(hits.mean()),
                    "label_acc": lab_acc,
                    "human_queries": charged,
                    "kept": len(kept),
                    "queried": [train_ids[i] for h in history for i in h.queried][:50],
                }
            )
