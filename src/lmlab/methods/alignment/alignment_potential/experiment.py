"""Reproduction: M_AP selection vs explicit-only, implicit-only and random at one keep fraction, then DPO and SimPO.

Paper claim (Huang et al., ICML 2025, Tables 1-2): the 40% of a preference set with the highest alignment potential
``z(rm_margin) - z(|implicit margin|)`` trains a better policy than the 40% with the largest explicit margins, the
40% with the smallest implicit margins, or a random 40%, across base models and objectives (DPO, SimPO).

Data (offline, seeded, graded exactly). Prompts are `countries` suite questions (capital, continent, currency) of
the train split (pool) and of the test split (held-out pairs: disjoint countries). Each prompt gets templated
responses of graded quality: ``concise`` (correct fact), ``verbose`` (correct + an elaboration), ``hedged``
(correct, hedged), ``wrong`` (another country's fact, concise), ``wrong_styled`` (a wrong fact in a chatty style an
instruct model tends to like) and ``off_topic``. Correctness is the suite's exact grader (`countries.grade`).

- The human is `lmlab.core.training.annotator.GroundTruthAnnotator` with the hidden utility
  ``U = 2 correct + 0.5 concise - 0.5 hedged``; it labels the test pairs (held out, uncounted, never seen by
  selection) and nothing else (budget 0).
- The explicit reward model (the paper's ArmoRM) is ``r_ex = U + N(0, reward_noise)``, one draw per response:
  noisy, so small-margin pairs carry label noise. Per prompt `n_responses` templates are drawn; chosen = max r_ex,
  rejected = min r_ex, ``rm_margin = max - min`` (the code's ``all_rm_scores``).
- The pool mixes the three kinds of pair M_AP is about: large explicit margins the policy already ranks right,
  large explicit margins it ranks wrong (styled wrong answers), and small noisy margins (two correct or two wrong
  answers).

Policy: `model` (SmolLM2-135M-Instruct), the top `k_layers` blocks trainable over a frozen trunk whose outputs are
cached once for the pool and the test pairs; the frozen reference is the original top blocks on the same cache.
The implicit margin of M_AP is the untrained policy's mean-token log-prob margin on the chat-templated pairs.

Each selection keeps ``max(1, int(select_ratio * pool))`` pairs; every system of one objective trains with the same
recipe and epochs (the full pool: more steps, as in the paper's full-data row). The recipe (epochs, lr) is chosen
on the dev split (``eval_split=dev``) by the mean over the selectors, never on test. `replicates` repeat the
training: replicate r draws its own random subset (r = 0: the code's ``np.random.seed(42)``) and its own training
order, shared by every system of one objective within r (paired). Metric: held-out preference accuracy, the share
of test pairs whose implicit reward orders the pair as the annotator's U does (DPO: ``beta log pi/pi_ref``; SimPO:
its length-normalised log-prob), one value per (replicate, test pair), with cluster-bootstrap CIs over (replicate,
test country) cells: a country gives up to one pair per task, and a replicate's training order and random subset
move all its pairs together.

The untrained policy is a system of every table: ``base@dpo`` (the DPO reward is identically 0 at initialisation:
0.5 per pair) and ``base@simpo`` (the untrained policy's mean log-prob margin).

Claim checks (gated, first): training moved the policy, ``map@X > base@X`` for each objective X; then M_AP > random,
> implicit-only, > explicit-only on held-out accuracy, for DPO and for SimPO (the spec expects >=: inconclusive is
acceptable). Reported: explicit-only - random, random - implicit-only, full pool - M_AP, rm-xlogp (w = 2.5) - M_AP.
Mechanism: the M_AP subset's mean score exceeds random's (replicate 0).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmlab.core.stats.seeding import derive_seed, seeded_rng
from lmlab.data.fact_sentences import WRONG_ANSWER_TRIES, fact_sentences, facts_by_iso2, wrong_answer
from lmlab.methods.alignment.alignment_potential.method import (
    implicit_margin,
    metric_scores,
    preference_accuracy,
    random_indices,
    reward_margins,
    rm_margin,
    select_size,
    top_k_indices,
)
from lmlab.results import Claim

TEMPLATES = ("concise", "verbose", "hedged", "wrong", "wrong_styled", "off_topic")
_CONCISE = frozenset({"concise", "wrong"})
_HEDGED = frozenset({"hedged"})
_OFF_TOPIC = (
    "That is a great question! Many people enjoy learning about geography, and travelling is a wonderful way to "
    "discover the world."
)


@dataclass(frozen=True)
class Response:
    """One templated response: its text and the latent attributes the generator put in (U reads them)."""

    id: str
    example_id: str
    template: str
    text: str
    correct: float  # the suite's exact grade, 1.0 or 0.0
    concise: bool
    hedged: bool


def utility(r: Response) -> float:
    """The annotator's hidden utility ``U = 2 correct + 0.5 concise - 0.5 hedged`` (the spec's r_ex without noise)."""
    return 2.0 * r.correct + 0.5 * float(r.concise) - 0.5 * float(r.hedged)


@dataclass(frozen=True)
class PoolPair:
    """A training pair as the paper's data has it: chosen / rejected by the explicit RM and all its scores."""

    id: str
    prompt: str
    chosen: Response
    rejected: Response
    rm_scores: tuple[float, ...]
    cluster: str  # country (ISO2)


@dataclass(frozen=True)
class TestPair:
    """A held-out pair (random order); its label comes from the annotator."""

    id: str
    prompt: str
    a: Response
    b: Response
    cluster: str


# ------------------------------------------------------------------------------------------------------- data


def responses_for(example: Any, facts: dict[str, dict[str, Any]], seed: int) -> dict[str, Response] | None:
    """The six templated responses of one prompt, each graded by the suite's exact grader (None: no wrong answer
    the grader would mark wrong exists for this prompt; it is skipped)."""
    from lmlab.data.countries import grade

    task, fact = example.meta["task"], facts[example.meta["iso2"]]
    bad = wrong_answer(example, facts, seed)
    if bad is None:
        return None
    right, wrong = fact_sentences(task, fact, example.target), fact_sentences(task, fact, bad)
    texts = {
        "concise": right["plain"],
        "verbose": right["verbose"],
        "hedged": right["hedged"],
        "wrong": wrong["plain"],
        "wrong_styled": wrong["styled"],
        "off_topic": _OFF_TOPIC,
    }
    return {
        t: Response(f"{example.id}/{t}", example.id, t, text, float(grade(example, text)), t in _CONCISE, t in _HEDGED)
        for t, text in texts.items()
    }


def _prompts(examples: dict[str, list[Any]], seed: int, name: str) -> list[Any]:
    """Every (task, country) prompt, shuffled over tasks and countries."""
    flat = [e for task in sorted(examples) for e in examples[task]]
    order = seeded_rng(seed, name, "order").permutation(len(flat))
    return [flat[i] for i in order]


def build_pool(examples: dict[str, list[Any]], n: int, *, n_responses: int, noise: float, seed: int) -> list[PoolPair]:
    """Training pairs: `n_responses` templates per prompt scored by the noisy explicit RM; chosen = max, rejected
    = min (SimPO's on-policy binarisation)."""
    facts = facts_by_iso2()
    out = []
    for ex in _prompts(examples, seed, "pool"):
        resp = responses_for(ex, facts, seed)
        if resp is None:
            continue
        if len(out) == n:
            break
        rng = seeded_rng(seed, "pool-templates", ex.id)
        picked = [TEMPLATES[i] for i in rng.choice(len(TEMPLATES), n_responses, replace=False)]
        scores = [
            utility(resp[t]) + noise * float(seeded_rng(seed, "rm", resp[t].id).standard_normal()) for t in picked
        ]
        hi, lo = int(np.argmax(scores)), int(np.argmin(scores))
        if hi == lo:  # equal scores (noise 0, equal U): the first is chosen, the last rejected
            hi, lo = 0, len(picked) - 1
        out.append(PoolPair(ex.id, ex.prompt, resp[picked[hi]], resp[picked[lo]], tuple(scores), ex.meta["iso2"]))
    return out


def build_test(examples: dict[str, list[Any]], n: int, *, seed: int) -> list[TestPair]:
    """Held-out pairs: two templates of different utility per prompt, in random order."""
    facts = facts_by_iso2()
    out = []
    for ex in _prompts(examples, seed, "test"):
        resp = responses_for(ex, facts, seed)
        if resp is None:
            continue
        if len(out) == n:
            break
        rng = seeded_rng(seed, "test-templates", ex.id)
        for _ in range(WRONG_ANSWER_TRIES):
            i, j = rng.choice(len(TEMPLATES), 2, replace=False)
            a, b = resp[TEMPLATES[i]], resp[TEMPLATES[j]]
            if utility(a) != utility(b):  # a tie has no right answer to measure
                break
        else:
            continue
        out.append(TestPair(ex.id, ex.prompt, a, b, ex.meta["iso2"]))
    return out


def _kind(p: PoolPair) -> str:
    c, r = p.chosen.correct > 0, p.rejected.correct > 0
    return "right_vs_wrong" if c != r else ("both_right" if c else "both_wrong")


# ------------------------------------------------------------------------------------------------ selection


def random_seed_of(cfg: Any, replicate: int) -> int:
    """Seed of the random subset of `replicate`: ``random_seed`` (the code's 42) for replicate 0, derived after."""
    return int(cfg.random_seed) if replicate == 0 else derive_seed(cfg.random_seed, "random-subset", replicate)


def train_seed_of(cfg: Any, objective: str, replicate: int) -> int:
    """Seed of the training order of every system of `objective` in `replicate` (paired across systems)."""
    if replicate == 0:  # the single run of earlier versions
        return derive_seed(cfg.seed, "train", objective)
    return derive_seed(cfg.seed, "train", objective, replicate)


def _select(name: str, rm: np.ndarray, imp: np.ndarray, k: int, cfg: Any, replicate: int = 0) -> np.ndarray:
    """Indices kept by one system in one replicate (the code's metric names in comments); only ``random``
    depends on the replicate."""
    n = rm.size
    if name == "random":  # rand
        return random_indices(n, k, random_seed_of(cfg, replicate))
    if name == "explicit_only":  # rm_margin
        return top_k_indices(metric_scores(rm, imp, "rm_margin"), k)
    if name == "implicit_only":  # logp_margin_norm_abs
        return top_k_indices(metric_scores(rm, imp, "logp_margin_norm_abs"), k)
    if name == "map":  # rm-logp (w = 1) / rm-xlogp
        return top_k_indices(metric_scores(rm, imp, "rm-xlogp", logp_weight=cfg.logp_weight), k)
    if name == "map_xlogp":
        return top_k_indices(metric_scores(rm, imp, "rm-xlogp", logp_weight=cfg.xlogp_weight), k)
    if name == "full_pool":
        return np.arange(n)
    raise ValueError(f"unknown selection {name!r}")


def _claims(cfg: Any) -> list[Claim]:
    claims = []
    # gated first: training moved the policy away from the untrained one (without it every comparison below
    # compares copies of the base policy, as the old 20-step recipe did)
    for obj, systems in (("dpo", cfg.selections), ("simpo", cfg.simpo_selections)):
        if "map" in systems:
            name = obj.upper() if obj == "dpo" else "SimPO"
            claims.append(
                Claim(
                    "pref_acc",
                    f"map@{obj}",
                    f"base@{obj}",
                    ">",
                    text=f"{name}: training moved the policy: M_AP-trained held-out preference accuracy above the "
                    "untrained policy's",
                )
            )
    for obj, systems in (("dpo", cfg.selections), ("simpo", cfg.simpo_selections)):
        s, name = set(systems), obj.upper() if obj == "dpo" else "SimPO"
        if "map" not in s:
            continue
        for base, label in (
            ("random", "random"),
            ("implicit_only", "implicit-only"),
            ("explicit_only", "explicit-only"),
        ):
            if base in s:
                claims.append(
                    Claim(
                        "pref_acc",
                        f"map@{obj}",
                        f"{base}@{obj}",
                        ">",
                        text=f"{name}: M_AP's kept pairs beat {label} selection on held-out preference "
                        "accuracy (same keep fraction)",
                    )
                )
        if {"explicit_only", "random"} <= s:
            claims.append(
                Claim(
                    "pref_acc",
                    f"explicit_only@{obj}",
                    f"random@{obj}",
                    ">",
                    gate=False,
                    text=f"{name}: explicit-only > random (reported)",
                )
            )
        if {"random", "implicit_only"} <= s:
            claims.append(
                Claim(
                    "pref_acc",
                    f"random@{obj}",
                    f"implicit_only@{obj}",
                    ">",
                    gate=False,
                    text=f"{name}: random > implicit-only (reported)",
                )
            )
        if "full_pool" in s:
            claims.append(
                Claim(
                    "pref_acc",
                    f"full_pool@{obj}",
                    f"map@{obj}",
                    ">",
                    gate=False,
                    text=f"{name}: the gap full pool - M_AP with 40% of the data (expected small)",
                )
            )
        if "map_xlogp" in s:
            claims.append(
                Claim(
                    "pref_acc",
                    f"map_xlogp@{obj}",
                    f"map@{obj}",
                    ">",
                    gate=False,
                    text=f"{name}: rm-xlogp (w = {cfg.xlogp_weight:g}) vs rm-logp (reported)",
                )
            )
    systems = set(cfg.selections) | set(cfg.simpo_selections)
    if {"map", "random"} <= systems:
        claims.append(
            Claim(
                "sel_map_score",
                "map",
                "random",
                ">",
                paired=False,
                mechanism=True,
                text="the M_AP subset has a higher mean M_AP than the random subset (top-k by construction)",
            )
        )
    return claims


# ------------------------------------------------------------------------------------------------------- run


def _load_examples(ctx: Any, cfg: Any, split: str) -> dict[str, list[Any]]:
    return {t: ctx.data("countries", None, split=split, task=t) for t in cfg.tasks}


def run(cfg: Any, ctx: Any) -> Any:
    import torch

    from lmlab.core.inference.scoring import has_chat_template
    from lmlab.core.report.plotting import bar_with_ci, title_for
    from lmlab.core.training.annotator import GroundTruthAnnotator
    from lmlab.core.training.partial import FrozenTrunk
    from lmlab.methods.alignment.alignment_potential.method import encode_pairs, score_pairs, train_preference

    if "map" not in set(cfg.selections) | set(cfg.simpo_selections):
        raise ValueError("selections or simpo_selections must include 'map' (the method under test)")
    model, tok = ctx.load_model()
    n_layers = len(model.model.layers) if hasattr(model, "model") and hasattr(model.model, "layers") else None
    if n_layers is not None and cfg.k_layers > n_layers:
        raise ValueError(
            f"k_layers must be in [1, {n_layers}] for {cfg.model} ({n_layers} blocks), got {cfg.k_layers}"
        )
    t0 = time.perf_counter()
    pool = build_pool(
        _load_examples(ctx, cfg, "train"),
        cfg.pool_size,
        n_responses=cfg.n_responses,
        noise=cfg.reward_noise,
        seed=cfg.seed,
    )
    if cfg.drop_ties:
        pool = [p for p in pool if max(p.rm_scores) > min(p.rm_scores)]
    test = build_test(_load_examples(ctx, cfg, cfg.eval_split), cfg.test_size, seed=cfg.seed)
    if not pool or not test:
        raise ValueError(f"empty data: {len(pool)} pool pairs and {len(test)} test pairs (raise limit or sizes)")

    # the human: holds U, labels the held-out pairs (uncounted) and nothing for training (budget 0)
    ann = GroundTruthAnnotator(
        {**{p.id + "#pool": (p.chosen, p.rejected) for p in pool}, **{t.id + "#test": (t.a, t.b) for t in test}},
        budget=0,
        utility=utility,
        seed=cfg.seed,
    )
    labels = ann.held_out([t.id + "#test" for t in test])
    first = [t.a if labels[t.id + "#test"] == 1 else t.b for t in test]  # the preferred response first
    second = [t.b if labels[t.id + "#test"] == 1 else t.a for t in test]
    rm_agrees = [ann.agreement([p.id + "#pool"], [1]) for p in pool]  # report only: RM's chosen agrees with U
    # one value per (replicate, test pair); the unit is the (replicate, test country) cell
    clusters = [f"r{r}/{t.cluster}" for r in range(cfg.replicates) for t in test]

    chat = has_chat_template(tok)
    trunk = FrozenTrunk(model, cfg.k_layers)
    with torch.no_grad():
        pool_c = encode_pairs(
            trunk,
            tok,
            [p.prompt for p in pool],
            [p.chosen.text for p in pool],
            [p.rejected.text for p in pool],
            chat=chat,
            system=cfg.system_prompt,
        )
        test_c = encode_pairs(
            trunk,
            tok,
            [t.prompt for t in test],
            [r.text for r in first],
            [r.text for r in second],
            chat=chat,
            system=cfg.system_prompt,
        )
    ref_pool = score_pairs(trunk.reference, pool_c, batch_size=cfg.score_batch)
    ref_test = score_pairs(trunk.reference, test_c, batch_size=cfg.score_batch)
    encode_s = time.perf_counter() - t0

    # M_AP under the policy about to be trained (the untrained model = the reference)
    lc, lr = (
        (ref_pool.chosen_mean, ref_pool.rejected_mean)
        if cfg.reduction == "mean"
        else (ref_pool.chosen_sum, ref_pool.rejected_sum)
    )
    rm = rm_margin([p.rm_scores for p in pool])
    imp = implicit_margin(lc, lr, signed=cfg.signed)
    signed_imp = lc - lr
    score = metric_scores(rm, imp, "rm-xlogp", logp_weight=cfg.logp_weight)
    k = select_size(len(pool), cfg.select_ratio)
    systems = list(dict.fromkeys([*cfg.selections, *cfg.simpo_selections]))
    kept = {s: _select(s, rm, imp, k, cfg) for s in systems}  # replicate 0 (random: the code's seed 42)

    sel_rows, ref_set = [], set(kept["map"].tolist())
    kept_sets = {s: set(kept[s].tolist()) for s in systems}
    for s in systems:
        idx = kept[s]
        ctx.record(s, "sel_map_score", score[idx], note=f"M_AP (w={cfg.logp_weight:g}) of the kept pairs")
        ctx.record(s, "sel_rm_margin", rm[idx], note="explicit margin of the kept pairs")
        ctx.record(s, "sel_implicit_margin", imp[idx], note="implicit margin (of cfg.reduction) of the kept pairs")
        ctx.record(s, "sel_label_agrees", [rm_agrees[i] for i in idx], note="RM's chosen is U's preferred (report)")
        kinds = [_kind(pool[i]) for i in idx]
        sel_rows.append(
            {
                "system": s,
                "kept": len(idx),
                "mean_rm_margin": round(float(rm[idx].mean()), 3),
                "mean_abs_implicit": round(float(imp[idx].mean()), 3),
                "policy_prefers_chosen": round(float(np.mean(signed_imp[idx] > 0)), 3),
                "rm_label_agrees_U": round(float(np.mean([rm_agrees[i] for i in idx])), 3),
                **{
                    f"share_{c}": round(kinds.count(c) / len(kinds), 3)
                    for c in ("right_vs_wrong", "both_right", "both_wrong")
                },
                "jaccard_with_map": round(len(ref_set & kept_sets[s]) / len(ref_set | kept_sets[s]), 3),
            }
        )
    ctx.table("selections", sel_rows)

    # the untrained policy, a row of every table: DPO's reward log pi/pi_ref is identically 0 (0.5 per pair),
    # SimPO's is the base policy's mean log-prob margin; repeated per replicate so the claims pair value by value
    base_margin = {"dpo": np.zeros(len(test)), "simpo": ref_test.chosen_mean - ref_test.rejected_mean}
    train_rows = []
    for obj in ("dpo", "simpo"):
        acc = preference_accuracy(base_margin[obj])
        ctx.record(
            f"base@{obj}",
            "pref_acc",
            np.tile(acc, cfg.replicates),
            clusters=clusters,
            note="untrained policy" + (" (DPO reward = 0 at init)" if obj == "dpo" else ", mean log-prob margin"),
        )
        train_rows.append(
            {"system": f"base@{obj}", "replicate": "all", "pairs": 0, "steps": 0, "loss_first": None,
             "loss_last": None, "pref_acc": round(float(acc.mean()), 3), "seconds": 0.0}
        )  # fmt: skip
    gamma = cfg.simpo_gamma_beta_ratio * cfg.simpo_beta
    margins: dict[str, list[float]] = {}
    acc_of: dict[str, list[np.ndarray]] = {}
    secs_of: dict[str, float] = {}
    random_kept = [
        {
            "replicate": r,
            "seed": random_seed_of(cfg, r),
            "kept": sorted(_select("random", rm, imp, k, cfg, r).tolist()),
        }
        for r in range(cfg.replicates)
        if "random" in systems
    ]
    jobs = [
        (r, obj, s)
        for r in range(cfg.replicates)
        for obj, sel in (("dpo", cfg.selections), ("simpo", cfg.simpo_selections))
        for s in sel
    ]
    for r, obj, s in ctx.progress(jobs, "train (replicate x objective x selection)", total=len(jobs)):
        t1 = time.perf_counter()
        idx = _select(s, rm, imp, k, cfg, r)
        res = train_preference(
            trunk,
            pool_c,
            idx,
            objective=obj,
            ref=ref_pool if obj == "dpo" else None,
            beta=cfg.dpo_beta if obj == "dpo" else cfg.simpo_beta,
            gamma=0.0 if obj == "dpo" else gamma,
            lr=cfg.lr,
            epochs=cfg.epochs,
            batch_size=cfg.train_batch,
            warmup_ratio=cfg.warmup_ratio,
            max_grad_norm=cfg.max_grad_norm,
            seed=train_seed_of(cfg, obj, r),
        )
        sc = score_pairs(res.policy, test_c, batch_size=cfg.score_batch)
        m = reward_margins(sc, obj, ref_test)
        name = f"{s}@{obj}"
        if r == 0:
            margins[name] = [float(v) for v in m]
        acc_of.setdefault(name, []).append(preference_accuracy(m))
        secs = time.perf_counter() - t1
        secs_of[name] = secs_of.get(name, 0.0) + secs
        train_rows.append(
            {
                "system": name,
                "replicate": r,
                "pairs": len(idx),
                "steps": res.steps,
                "loss_first": round(res.losses[0], 4),
                "loss_last": round(res.losses[-1], 4),
                "pref_acc": round(float(acc_of[name][-1].mean()), 3),
                "seconds": round(secs, 1),
            }
        )
        del res
    for name, per_rep in acc_of.items():
        ctx.record(
            name,
            "pref_acc",
            np.concatenate(per_rep),
            clusters=clusters,
            note=f"held-out pairs x {cfg.replicates} replicates, implicit reward; CI over (replicate, test country)",
        )
        ctx.record_value(name, "train_time", secs_of[name], unit="s", note="all replicates")
    ctx.table("training", train_rows)
    if random_kept:
        ctx.table("random_subsets", random_kept)

    ctx.add_samples(
        {
            "part": "pool",
            "id": p.id,
            "prompt": p.prompt,
            "chosen": p.chosen.text,
            "rejected": p.rejected.text,
            "rm_scores": list(p.rm_scores),
            "rm_margin": float(rm[i]),
            "implicit_margin_signed": float(signed_imp[i]),
            "map_score": float(score[i]),
            "kind": _kind(p),
            "kept_by": [s for s in systems if i in kept_sets[s]],
        }
        for i, p in enumerate(pool)
    )
    ctx.add_samples(
        {
            "part": "test",
            "id": t.id,
            "prompt": t.prompt,
            "preferred": first[j].text,
            "other": second[j].text,
            "margins_replicate0": {name: m[j] for name, m in margins.items()},
        }
        for j, t in enumerate(test)
    )
    rows = [r for r in ctx.metrics if r.metric == "pref_acc"]
    ctx.add_figure(
        "pref_acc",
        bar_with_ci(
            rows,
            title=title_for(
                "alignment_potential", str(cfg.model), cfg.seed, len(test), "held-out preference accuracy"
            ),
            ylabel="accuracy",
            highlight=("map@dpo", "map@simpo", "base@dpo", "base@simpo"),
        ),
    )
    ctx.flag(
        "data",
        {
            "pool_pairs": len(pool),
            "kept": k,
            "test_pairs": len(test),
            "test_split": cfg.eval_split,
            "test_countries": len({t.cluster for t in test}),
            "replicates": cfg.replicates,
            "tasks": list(cfg.tasks),
            "chat_template": chat,
        },
    )
    ctx.flag("encode_seconds", round(encode_s, 1))
    ctx.flag(
        "tokens",
        {"pool_rows": int(pool_c.cache.attention_mask.sum()), "test_rows": int(test_c.cache.attention_mask.sum())},
    )
    ctx.note(
        "Substitution: human = simulated oracle with utility U = 2 correct + 0.5 concise - 0.5 hedged (correctness by "
        f"the countries suite's exact grader); explicit RM = U + N(0, {cfg.reward_noise:g}); the RM's chosen agrees "
        f"with U on {np.mean(rm_agrees):.0%} of the pool pairs (ties decided by a fixed coin). The test pairs are "
        "labelled by the annotator's held-out door and never reach selection or training."
    )
    ctx.note(
        f"M_AP = z(rm_margin) - {cfg.logp_weight:g} z({'signed' if cfg.signed else '|'}{cfg.reduction} log-prob "
        f"margin{'' if cfg.signed else '|'}) under the untrained policy; each selection keeps {k} of {len(pool)} "
        "pairs. "
        f"Training: top {cfg.k_layers} blocks, {cfg.epochs} epochs, AdamW lr {cfg.lr:g}, batch {cfg.train_batch}; "
        f"DPO beta {cfg.dpo_beta:g}, SimPO beta {cfg.simpo_beta:g}, gamma {gamma:g}; {cfg.replicates} replicates "
        "(random subset x training order), CIs over (replicate, test country) cells; held-out pairs from the "
        f"{cfg.eval_split} split."
    )
    return ctx.finish(_claims(cfg))
