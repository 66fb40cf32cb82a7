"""Speculative Search: small-model drafts kept iff their PRM score reaches an EMA estimate of the large model's.

    accept draft z  iff  V(z) >= beta_t,    beta_{t+1} = theta * beta_t + (1 - theta) * mean(V(large thoughts at t))

Wang et al., "Accelerating Large Language Model Reasoning via Speculative Search", ICML 2025
(https://arxiv.org/abs/2505.02865, code https://github.com/MIRALab-USTC/LLMReasoning-SpecSearch).

SpecSearch is a bi-level speculative *thought* generator inside a PRM-guided tree search (beam search here). At each
depth t and for each kept partial path z:

1. **Draft**: the small model samples candidate thoughts (text up to the step delimiter) given (q, z).
2. **Evaluate**: a process reward model V scores every draft.
3. **Quality-preserving rejection**: a draft is accepted iff ``V >= beta_t``, a step-wise threshold that estimates the
   *large* model's thought quality from its thoughts at earlier steps (an EMA); beta_0 comes from a cold start, the
   score of the large model's thought(s) at the root (by default one; the small model drafts the root's others).
4. **Correct**: the large model writes the node's remaining thoughts (one per rejected draft), by plain sampling or
   by token-level speculative decoding with a same-tokenizer drafter (lossless); their scores update the EMA.
5. **Select**: accepted and corrected thoughts of all nodes are pooled and beam search keeps the top B distinct paths
   by their PRM value (the mean step score by default).

The plain PRM beam search over one model (the paper's "large model only" and the "small model only" baselines) is
the same loop with a one-model expander, so the systems differ only in who writes the thoughts.

The pieces live next to this file: `thought_model.py` (`ThoughtModel`: a step model with a prefix KV cache and
batched sampling, the engine both models run in), `speculative_decoding.py` (the optional token-level corrector,
`SpeculativeThoughtModel`) and `search.py` (the beam-search state, loop and cost accounting both searches share,
`SearchResult`). This file holds the threshold update (`ema_update`) and the two searches.

Everything here is pure: no I/O, no printing. Costs come back in `SearchResult` (and in a `ComputeMeter` if given).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from lmlab.core.inference.steps import StepOutput
from lmlab.methods.decoding.spec_search.search import (
    Candidate,
    DepthRecord,
    Path,
    SearchResult,
    _check_search_args,
    _result,
    _run_search,
    _scorer,
    _seeds,
    _Tally,
    aggregate_scores,
)
from lmlab.methods.decoding.spec_search.speculative_decoding import SpeculativeThoughtModel
from lmlab.methods.decoding.spec_search.thought_model import ThoughtModel

ESTIMATORS = ("mean", "max")
CORRECTORS = ("plain", "sd")


def ema_update(beta: float, scores: Sequence[float], theta: float, estimator: str = "mean") -> float:
    """beta' = theta * beta + (1 - theta) * estimate(scores); beta unchanged when no large-model thought was scored.

    `estimator` is the non-parametric estimate of the large model's step quality: ``mean`` (its expected score, the
    quantity the paper's Theorem 4.3 compares against) or ``max`` (a conservative upper estimate).
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}, got {estimator!r}")
    if not scores:
        return beta
    est = float(np.mean(scores)) if estimator == "mean" else float(max(scores))
    return theta * beta + (1.0 - theta) * est


def beam_search(
    question: str,
    model: ThoughtModel,
    prm: Any,
    *,
    n: int = 4,
    beam_width: int = 2,
    max_depth: int | None = None,
    step_prefixes: Sequence[str] | None = None,
    temperature: float = 0.7,
    top_p: float = 1.0,
    aggregate: str = "mean",
    seed: int = 0,
    source: str | None = None,
    reset_prefix_cache: bool = True,
) -> SearchResult:
    """PRM-guided beam search with one model: each kept path gets `n` sampled thoughts, the top `beam_width` survive.

    The paper's "large model only" (AR) baseline with ``model=large`` and the small-only baseline with ``model=small``.

    Args:
        question (`str`): the problem.
        model (`ThoughtModel`): writes every thought.
        prm: any object with ``score(question, steps) -> list[float]``.
        n (`int`, defaults to 4): thoughts sampled per node (one batched call per node).
        beam_width (`int`, defaults to 2): paths kept per depth (B).
        max_depth (`int`, *optional*): maximum number of steps (default: ``len(step_prefixes)``).
        step_prefixes (`Sequence[str]`, *optional*): the given start of each step (e.g. ``"Peru:"``).
        temperature, top_p: sampling of the thoughts.
        aggregate (`str`, defaults to ``"mean"``): path value from step scores (``mean``, ``min``, ``last``, ``prod``).
        seed (`int`): thoughts are seeded by (seed, model role, question, path text, index).
        source (`str`, *optional*): provenance label of the thoughts (default: the model's name).
        reset_prefix_cache (`bool`, defaults to `True`): start with the model's prefix cache emptied (pinned scaffolds
            stay), so the cost does not depend on what ran before.
    """
    depth = _check_search_args(n, beam_width, max_depth, step_prefixes)
    aggregate_scores([], aggregate)  # validates
    if reset_prefix_cache:
        model.clear_cache()
    t_start = time.perf_counter()
    latency = {"generate": 0.0, "evaluate": 0.0, "select": 0.0}
    label = source or model.name
    tally = _Tally([model], prm, model.meter)
    score = _scorer(prm, question, latency)
    depths: list[DepthRecord] = []

    def expand(t: int, node: Path, prefix: str) -> list[Candidate]:
        if not depths or depths[-1].depth != t:
            depths.append(DepthRecord(t, None))
        t0 = time.perf_counter()
        outs = model.sample(
            question,
            node.steps,
            _seeds(seed, label, question, node, 0, n),
            temperature=temperature,
            top_p=top_p,
            step_prefix=prefix,
        )
        latency["generate"] += time.perf_counter() - t0
        vals = score(node, outs)
        return [Candidate(o, v, label) for o, v in zip(outs, vals)]

    paths = _run_search(
        question,
        expand,
        beam_width=beam_width,
        depth=depth,
        step_prefixes=step_prefixes,
        aggregate=aggregate,
        latency=latency,
    )
    return _result(paths, depths, tally, latency, t_start, aggregate)


def spec_search(
    question: str,
    small: ThoughtModel,
    large: ThoughtModel,
    prm: Any,
    *,
    n: int = 4,
    beam_width: int = 2,
    max_depth: int | None = None,
    step_prefixes: Sequence[str] | None = None,
    theta: float = 0.9,
    threshold: str | float = "ema",
    estimator: str = "mean",
    n_cold_start: int | None = None,
    n_large_per_step: int = 1,
    n_drafts: int | None = None,
    corrector: str = "plain",
    sd_gamma: int = 4,
    temperature: float = 0.7,
    top_p: float = 1.0,
    aggregate: str = "mean",
    seed: int = 0,
    reset_prefix_cache: bool = True,
) -> SearchResult:
    """Speculative Search (the paper's Algorithm 2, on beam search): draft, evaluate, reject, correct, select.

    At depth t each kept path gets `n_drafts` small-model drafts; those with PRM score >= beta_t are accepted (the `n`
    best at most), and the large model writes the node's remaining thoughts (a correction per rejected draft). The
    accepted and corrected thoughts of all paths are pooled and the top `beam_width` paths survive. The large model
    writes `n_cold_start` of the root's thoughts (the cold start: their mean score is beta_0; by default one, and the
    root's other thoughts are drafted and gated like every later depth's) and, in EMA mode, `n_large_per_step`
    thoughts at the best node of each later depth, so the EMA sees the large model even when every draft passes.
    ``n_cold_start=n`` makes the large model write the whole root, so depth 0 is large-only search by construction:
    an ablation, not the default.

    Args:
        question (`str`): the problem.
        small, large (`ThoughtModel`): the drafter and the large model (any two HF causal LMs; tokenizers may differ,
            thoughts travel as text).
        prm: any object with ``score(question, steps) -> list[float]``.
        n (`int`, defaults to 4): thoughts per node (tree width N), as in the baselines.
        beam_width (`int`, defaults to 2): B.
        max_depth (`int`, *optional*): maximum steps (default: ``len(step_prefixes)``).
        step_prefixes (`Sequence[str]`, *optional*): the given start of each step.
        theta (`float`, defaults to 0.9): EMA weight of the threshold.
        threshold (`"ema"` or `float`, defaults to ``"ema"``): ``"ema"`` is the paper's quality-preserving rejection;
            a number is a fixed threshold, with no large-model thoughts beyond corrections (``-inf`` accepts every
            draft and never calls the large model; ``inf`` rejects every draft).
        estimator (`str`, defaults to ``"mean"``): estimate of the large model's step quality (``mean`` or ``max``).
        n_cold_start (`int`, *optional*): large-model thoughts at the root (default: 1 in EMA mode, the fewest that
            give beta_0 [verify: the official code was not reachable]; 0 with a fixed threshold); in EMA mode beta_0
            is their estimator value, so it must be >= 1.
        n_large_per_step (`int`, defaults to 1): large-model thoughts at the best node of each later depth (EMA mode).
        n_drafts (`int`, *optional*): drafts per node (default `n`).
        corrector (`str`, defaults to ``"plain"``): ``"plain"`` samples the large model (batched); ``"sd"`` uses
            token-level speculative decoding with `small` as drafter (needs the same tokenizer; lossless).
        sd_gamma (`int`, defaults to 4): draft tokens per speculative round.
        temperature, top_p: sampling of drafts and corrections.
        aggregate (`str`, defaults to ``"mean"``): path value from step scores.
        seed (`int`): thoughts are seeded by (seed, role, question, path text, index), as in `beam_search`.
        reset_prefix_cache (`bool`, defaults to `True`): start with the models' prefix caches emptied (pinned
            scaffolds stay), so the cost does not depend on what ran before.

    Returns:
        `SearchResult` with the best path, per-step provenance, acceptance rate, thresholds, cost and latency.
    """
    depth = _check_search_args(n, beam_width, max_depth, step_prefixes)
    aggregate_scores([], aggregate)
    if not 0.0 <= theta <= 1.0:
        raise ValueError(f"theta must be in [0, 1], got {theta}")
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}, got {estimator!r}")
    if corrector not in CORRECTORS:
        raise ValueError(f"corrector must be one of {', '.join(CORRECTORS)}, got {corrector!r}")
    ema = threshold == "ema"
    if isinstance(threshold, str) and not ema:
        raise ValueError(f"threshold must be 'ema' or a number, got {threshold!r}")
    if not ema and (isinstance(threshold, bool) or not isinstance(threshold, int | float) or math.isnan(threshold)):
        raise ValueError(f"threshold must be 'ema' or a number, got {threshold!r}")
    if n_cold_start is None:
        n_cold_start = 1 if ema else 0
    if not (1 if ema else 0) <= n_cold_start <= n:
        raise ValueError(f"n_cold_start must be in [{1 if ema else 0}, n={n}], got {n_cold_start}")
    if not 0 <= n_large_per_step <= n:
        raise ValueError(f"n_large_per_step must be in [0, n={n}], got {n_large_per_step}")
    n_drafts = n if n_drafts is None else n_drafts
    if n_drafts < 0:
        raise ValueError(f"n_drafts must be >= 0, got {n_drafts}")
    writer: ThoughtModel = large
    if corrector == "sd":
        writer = SpeculativeThoughtModel(large, small, gamma=sd_gamma)
    if reset_prefix_cache:
        small.clear_cache()
        large.clear_cache()

    t_start = time.perf_counter()
    latency = {"draft": 0.0, "evaluate": 0.0, "correct": 0.0, "select": 0.0}
    tally = _Tally([small, large, writer], prm, large.meter or small.meter)
    score = _scorer(prm, question, latency)
    state: dict[str, Any] = {"beta": None if ema else float(threshold)}
    depths: list[DepthRecord] = []

    def large_thoughts(node: Path, prefix: str, start: int, count: int) -> tuple[list[StepOutput], list[float]]:
        t0 = time.perf_counter()
        outs = writer.sample(
            question,
            node.steps,
            _seeds(seed, large.name, question, node, start, count),
            temperature=temperature,
            top_p=top_p,
            step_prefix=prefix,
        )
        latency["correct"] += time.perf_counter() - t0
        return outs, score(node, outs)

    def expand(t: int, node: Path, prefix: str) -> list[Candidate]:
        cands: list[Candidate] = []
        first = not depths or depths[-1].depth != t  # the best kept path comes first
        reserved = 0
        if first:
            # the threshold needs the large model's quality: it writes the root's first thoughts (cold start, beta_0)
            # and, in EMA mode, some of the best node's thoughts at each later depth
            reserved = n_cold_start if t == 0 else (n_large_per_step if ema else 0)
            if reserved:
                outs, vals = large_thoughts(node, prefix, 0, reserved)
                if state["beta"] is None:
                    state["beta"] = float(np.mean(vals)) if estimator == "mean" else float(max(vals))
                label = "cold_start" if t == 0 else "correction"
                cands += [Candidate(o, v, label) for o, v in zip(outs, vals)]
        if first:
            depths.append(DepthRecord(t, state["beta"]))
        rec = depths[-1]
        rec.n_cold_start += reserved if t == 0 else 0
        rec.n_corrections += reserved if t > 0 else 0
        rec.large_scores += [c.score for c in cands]
        beta = state["beta"]
        # 1-2. draft and evaluate (nothing to draft when the large model took every slot)
        t0 = time.perf_counter()
        m = n_drafts if reserved < n else 0
        drafts = small.sample(
            question,
            node.steps,
            _seeds(seed, small.name, question, node, 0, m),
            temperature=temperature,
            top_p=top_p,
            step_prefix=prefix,
        )
        latency["draft"] += time.perf_counter() - t0
        vals = score(node, drafts)
        # 3. quality-preserving rejection: keep the drafts at least as good as the large model is expected to be
        ok = [i for i, v in enumerate(vals) if v >= beta]
        rec.n_drafts += len(drafts)
        rec.n_accepted += len(ok)
        rec.draft_scores += vals
        ok = sorted(ok, key=lambda i: -vals[i])[: max(0, n - reserved)]
        cands += [Candidate(drafts[i], vals[i], "draft") for i in ok]
        # 4. correct: the large model writes the node's remaining thoughts, one per rejected draft
        k = n - len(cands)
        if k > 0:
            outs, lvals = large_thoughts(node, prefix, reserved, k)
            rec.n_corrections += k
            rec.large_scores += lvals
            cands += [Candidate(o, v, "correction") for o, v in zip(outs, lvals)]
        return cands

    def end_depth(t: int) -> None:
        # beta_{t+1} = theta * beta_t + (1 - theta) * estimate(V(large-model thoughts at t)); kept if there were none
        if ema and depths and depths[-1].depth == t:
            state["beta"] = ema_update(state["beta"], depths[-1].large_scores, theta, estimator)

    paths = _run_search(
        question,
        expand,
        beam_width=beam_width,
        depth=depth,
        step_prefixes=step_prefixes,
        aggregate=aggregate,
        end_depth=end_depth,
        latency=latency,
    )
    return _result(paths, depths, tally, latency, t_start, aggregate)


__all__ = ["CORRECTORS", "ESTIMATORS", "beam_search", "ema_update", "spec_search"]
