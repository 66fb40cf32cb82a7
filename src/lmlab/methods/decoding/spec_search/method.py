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

Models exchange thoughts as text (`lmlab.core.inference.steps.StepModel`: each model renders the question and the steps
so far
in its own prompt format). `ThoughtModel` adds two things a serving engine has (the paper ran vLLM): a prefix KV cache
per model (only tokens the model has not processed yet are fed; after a switch of models that is the other model's
new steps, counted as prefill) and batched sampling of n thoughts from one prefill. With ``prefix_cache=False`` every
call re-prefills its whole prompt, as a plain `StepModel` does; `ThoughtModel.logical_tokens` counts that cost either
way, for a no-cache cost model.

Everything here is pure: no I/O, no printing. Costs come back in `SearchResult` (and in a `ComputeMeter` if given).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from lmlab.core.inference.compute import ComputeMeter
from lmlab.core.inference.generation import cache_kwargs, crop_cache, filter_logits, new_cache
from lmlab.core.inference.scoring import encode_prompt
from lmlab.core.inference.steps import Shot, StepModel, StepOutput
from lmlab.core.stats.seeding import derive_seed

AGGREGATES = ("mean", "min", "last", "prod")
ESTIMATORS = ("mean", "max")
CORRECTORS = ("plain", "sd")
SOURCES = ("draft", "correction", "cold_start", "small", "large")


# ----------------------------------------------------------------------------------------------------------------
# Thought generation: a StepModel with a prefix KV cache and batched sampling


class ThoughtModel(StepModel):
    """A `StepModel` that samples n thoughts from one prefill and keeps a prefix KV cache across calls.

    Args:
        model, tokenizer, name, fmt, shots, delimiter, max_step_tokens, meter, stop_markers: as for `StepModel`.
        prefix_cache (`bool`, defaults to `True`): reuse the KV cache of the longest previously processed prompt
            prefix (what vLLM's prefix caching does); off: every call prefills its whole prompt.
        cache_entries (`int`, defaults to 32): sequences kept in the prefix cache (least recently used evicted): the
            prompts, and each sampled thought's prompt + tokens, so a model continuing its own thought does not
            re-prefill it (only text another model wrote, or the re-rendered delimiter and step prefix).

    Attributes:
        calls (`int`): generation calls; logical_tokens (`int`): prompt tokens of all calls plus generated tokens
        (the prefill + decode a cache-less engine would run, per sequence row sharing one prefill).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str,
        fmt: str | None = None,
        shots: Sequence[Shot] = (),
        delimiter: str = "\n",
        max_step_tokens: int = 24,
        meter: ComputeMeter | None = None,
        prefix_cache: bool = True,
        cache_entries: int = 32,
        stop_markers: Sequence[str] = (),
    ):
        super().__init__(
            model,
            tokenizer,
            name=name,
            fmt=fmt,
            shots=shots,
            delimiter=delimiter,
            max_step_tokens=max_step_tokens,
            meter=meter,
            stop_markers=stop_markers,
        )
        if max_step_tokens < 1:
            raise ValueError(f"max_step_tokens must be >= 1, got {max_step_tokens}")
        self.prefix_cache = prefix_cache
        self.cache_entries = cache_entries
        self._entries: list[tuple[tuple[int, ...], Any]] = []
        self._pinned: list[tuple[tuple[int, ...], Any]] = []
        self.calls = 0
        self.logical_tokens = 0
        eos = getattr(model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_ids: set[int] = set() if eos is None else ({int(eos)} if isinstance(eos, int) else set(map(int, eos)))

    @property
    def flop_params(self) -> int:
        from lmlab.core.inference.models import flop_params

        return flop_params(self.model)

    def clear_cache(self) -> None:
        """Forget the cached prompts (pinned ones stay)."""
        self._entries.clear()

    @torch.no_grad()
    def pin(self, text: str) -> int:
        """Prefill `text` once and keep its KV cache across `clear_cache` (a prompt scaffold shared by all questions,
        e.g. the few-shot block, as a serving engine's prefix cache would). Returns the tokens prefilled."""
        if not self.prefix_cache:
            return 0
        ids = encode_prompt(self.tokenizer, text)
        cache = new_cache(self.model)
        self._forward(torch.tensor([ids], device=next(self.model.parameters()).device), cache)
        self._pinned.append((tuple(ids), cache))
        return len(ids)

    # -- prefix cache ------------------------------------------------------------------------------------------------

    def _lookup(self, ids: list[int]) -> tuple[Any, int]:
        """A private cache holding the longest stored prefix of `ids` (at most len(ids) - 1 positions)."""
        best, best_len = None, 0
        if self.prefix_cache:
            for key, cache in self._pinned + self._entries:
                n = 0
                for a, b in zip(key, ids):
                    if a != b:
                        break
                    n += 1
                if n > best_len:
                    best, best_len = (key, cache), n
        if best is None:
            return new_cache(self.model), 0
        for i, e in enumerate(self._entries):
            if e is best:  # most recently used last
                self._entries.append(self._entries.pop(i))
                break
        held = min(best_len, len(ids) - 1, best[1].get_seq_length())
        fork = copy.deepcopy(best[1])
        if not crop_cache(fork, held):  # e.g. a sliding-window layer past its window: prefill from scratch
            return new_cache(self.model), 0
        return fork, held

    def _store(self, ids: list[int], cache: Any, *, row: int | None = None) -> None:
        """Keep a copy of `cache` (or of its batch row `row`) as the KV of `ids`."""
        if not self.prefix_cache or not ids:
            return
        if row is None:
            snap = copy.deepcopy(cache)
        else:  # shallow copies whose layers then index their own row: the live batch cache is not touched
            snap = copy.copy(cache)
            snap.layers = [copy.copy(layer) for layer in cache.layers]
            snap.batch_select_indices(torch.tensor([row], device=next(self.model.parameters()).device))
        key = tuple(ids)
        self._entries = [e for e in self._entries if e[0] != key]
        self._entries.append((key, snap))
        del self._entries[: max(0, len(self._entries) - self.cache_entries)]

    def _forward(self, ids: torch.Tensor, cache: Any) -> torch.Tensor:
        """Logits of the last position for each row, (rows, vocab) float32; counted by the meter."""
        if self.meter is not None:
            with self.meter.track(self.model, self.name):
                out = self.model(input_ids=ids, logits_to_keep=1, **cache_kwargs(self.model, cache))
        else:
            out = self.model(input_ids=ids, logits_to_keep=1, **cache_kwargs(self.model, cache))
        return out.logits[:, -1].float()

    @torch.no_grad()
    def prefill(self, prompt_ids: list[int]) -> tuple[Any, torch.Tensor]:
        """(KV cache holding `prompt_ids`, next-token logits (vocab,)), feeding only the uncached suffix."""
        if not prompt_ids:
            raise ValueError("prompt is empty: a thought needs at least one prompt token")
        cache, held = self._lookup(prompt_ids)
        device = next(self.model.parameters()).device
        logits = self._forward(torch.tensor([prompt_ids[held:]], device=device), cache)[0]
        self._store(prompt_ids, cache)
        return cache, logits

    # -- generation --------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def sample(
        self,
        question: str,
        steps: Sequence[str],
        seeds: Sequence[int],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        step_prefix: str = "",
    ) -> list[StepOutput]:
        """One thought per seed, batched: one prefill, then the rows decode together until each hits the delimiter.

        Row i samples with its own generator seeded by ``seeds[i]``, so a thought does not depend on how many others
        are drawn with it. ``temperature=0`` decodes greedily.
        """
        n = len(seeds)
        if n == 0:
            return []
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        prompt_ids = encode_prompt(self.tokenizer, self.render(question, steps, step_prefix))
        self.calls += 1
        self.logical_tokens += len(prompt_ids)
        cache, logits = self.prefill(prompt_ids)
        cache.batch_repeat_interleave(n)
        logits = logits[None].expand(n, -1)  # (n, vocab)
        gens = [torch.Generator(device="cpu").manual_seed(int(s)) for s in seeds]
        tokens: list[list[int]] = [[] for _ in range(n)]
        reasons = ["max_new_tokens"] * n
        active = list(range(n))  # rows still decoding; cache row j belongs to active[j]
        device = next(self.model.parameters()).device
        for _ in range(self.max_step_tokens):
            chosen = []
            for j, row in enumerate(active):
                if temperature == 0:
                    tok = int(logits[j].argmax())
                else:
                    probs = filter_logits(logits[j], temperature=temperature, top_p=top_p).softmax(-1)
                    tok = int(torch.multinomial(probs, 1, generator=gens[row]))
                tokens[row].append(tok)
                chosen.append(tok)
            self.logical_tokens += len(active)
            keep = []
            for j, row in enumerate(active):
                if chosen[j] in self.eos_ids:
                    reasons[row] = "eos"
                elif self.delimiter in self.tokenizer.decode(tokens[row], skip_special_tokens=True):
                    reasons[row] = "stop_string"
                else:
                    keep.append(j)
                    continue
                # the row's KV (prompt + its fed tokens) is what a later call continuing this thought starts from
                self._store([*prompt_ids, *tokens[row][:-1]], cache, row=j)
            if not keep or len(tokens[active[0]]) >= self.max_step_tokens:
                break
            if len(keep) < len(active):
                cache.batch_select_indices(torch.tensor(keep, device=device))
            active = [active[j] for j in keep]
            feed = torch.tensor([[chosen[j]] for j in keep], device=device)  # (rows, 1)
            logits = self._forward(feed, cache)
        return [self.to_step(tokens[i], reasons[i], step_prefix) for i in range(n)]

    def next_step(
        self,
        question: str,
        steps: Sequence[str],
        *,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        step_prefix: str = "",
    ) -> StepOutput:
        """`StepModel.next_step` through the prefix cache (greedy unless `do_sample`)."""
        t = temperature if do_sample else 0.0
        return self.sample(
            question, steps, [0 if seed is None else seed], temperature=t, top_p=top_p, step_prefix=step_prefix
        )[0]


# ----------------------------------------------------------------------------------------------------------------
# Token-level speculative decoding (same tokenizer), the optional corrector


@dataclass
class SpecDecodeOutput:
    """Result of `speculative_decode`: tokens and the drafter's statistics."""

    token_ids: list[int]
    stop_reason: str
    n_rounds: int  # target verification forwards after the prefill
    n_drafted: int
    n_accepted: int

    @property
    def acceptance_rate(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else math.nan


def _dist(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The sampling distribution (vocab,) of a decoding rule; one-hot at the argmax when temperature is 0."""
    if temperature == 0:
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return filter_logits(logits, temperature=temperature, top_p=top_p).softmax(-1)


@torch.no_grad()
def speculative_decode(
    target: ThoughtModel,
    draft: ThoughtModel,
    prompt_ids: list[int],
    *,
    max_new_tokens: int,
    gamma: int = 4,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    stop_string: str | None = None,
) -> SpecDecodeOutput:
    """Token-level speculative decoding (Leviathan et al., 2023) of `target` with a same-vocabulary `draft`.

    The drafter proposes `gamma` tokens from q; the target scores them in one forward and keeps token x with
    probability min(1, p(x) / q(x)), else samples from norm(max(0, p - q)) and stops the round; if all are kept it adds
    one token from p. The output follows the target's distribution exactly; with ``temperature=0`` (p and q one-hot)
    it is the target's greedy output token for token.
    """
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")
    if target.model.config.get_text_config().vocab_size != draft.model.config.get_text_config().vocab_size:
        raise ValueError("speculative_decode needs a drafter with the target's vocabulary (same tokenizer)")
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    device = next(target.model.parameters()).device
    t_cache, t_logits = target.prefill(prompt_ids)
    d_cache, d_logits = draft.prefill(prompt_ids)
    out: list[int] = []
    rounds = drafted = accepted = 0
    reason = "max_new_tokens"
    while len(out) < max_new_tokens:
        # draft: gamma tokens from q, each fed to the drafter
        k = min(gamma, max_new_tokens - len(out))
        proposal, qs = [], []
        for i in range(k):
            q = _dist(d_logits, temperature, top_p)
            tok = int(q.argmax()) if temperature == 0 else int(torch.multinomial(q, 1, generator=gen))
            proposal.append(tok)
            qs.append(q)
            if i < k - 1:
                d_logits = draft._forward(torch.tensor([[tok]], device=device), d_cache)[0]
        # verify: one target forward over the proposal gives p for positions 2..k+1 (position 1 is t_logits)
        base = t_cache.get_seq_length()
        kw = cache_kwargs(target.model, t_cache)
        ids = torch.tensor([proposal], device=device)
        if target.meter is not None:
            with target.meter.track(target.model, target.name):
                logits = target.model(input_ids=ids, **kw).logits[0].float()  # (k, vocab)
        else:
            logits = target.model(input_ids=ids, **kw).logits[0].float()
        rounds += 1
        drafted += k
        p_rows = [t_logits, *logits]  # p_rows[i] is the target's distribution for proposal[i]
        n_ok, extra = 0, None
        for i, tok in enumerate(proposal):
            p = _dist(p_rows[i], temperature, top_p)
            if temperature == 0:
                ok = tok == int(p.argmax())
            else:
                ok = float(torch.rand(1, generator=gen)) < min(1.0, float(p[tok] / qs[i][tok].clamp_min(1e-30)))
            if not ok:
                residual = (p - qs[i]).clamp_min(0.0)
                residual = residual / residual.sum() if residual.sum() > 0 else p
                greedy = temperature == 0
                extra = int(residual.argmax()) if greedy else int(torch.multinomial(residual, 1, generator=gen))
                break
            n_ok += 1
        if extra is None:  # every draft token kept: one more token from the target's last distribution
            p = _dist(p_rows[k], temperature, top_p)
            extra = int(p.argmax()) if temperature == 0 else int(torch.multinomial(p, 1, generator=gen))
        accepted += n_ok
        new = [*proposal[:n_ok], extra]
        # keep only the accepted tokens in both caches; `extra` is fed at the start of the next round
        history = [*prompt_ids, *out, *proposal]  # positions 0 .. base + k - 1
        t_cache = _keep(target, t_cache, history, base + n_ok)
        d_cache = _keep(draft, d_cache, history, base + min(n_ok, k - 1))  # the drafter never fed its last proposal
        for tok in new:
            out.append(tok)
            if tok in target.eos_ids:
                reason = "eos"
                break
            if stop_string and stop_string in target.tokenizer.decode(out, skip_special_tokens=True):
                reason = "stop_string"
                break
            if len(out) >= max_new_tokens:
                break
        if reason != "max_new_tokens" or len(out) >= max_new_tokens:
            break
        # catch both models up: both lack `extra`; the drafter also lacks its last proposal when all were kept
        d_missing = new[min(n_ok, k - 1) :]
        t_logits = target._forward(torch.tensor([[extra]], device=device), t_cache)[0]
        d_logits = draft._forward(torch.tensor([d_missing], device=device), d_cache)[0]
    out = out[:max_new_tokens]
    return SpecDecodeOutput(out, reason, rounds, drafted, accepted)


def _keep(m: ThoughtModel, cache: Any, history: list[int], length: int) -> Any:
    """`cache` cropped to its first `length` positions; rebuilt by a (counted) prefill when a layer cannot crop."""
    if cache.get_seq_length() <= length or crop_cache(cache, length):
        return cache
    fresh = new_cache(m.model)  # e.g. a sliding-window layer that has dropped early positions
    m._forward(torch.tensor([history[:length]], device=next(m.model.parameters()).device), fresh)
    return fresh


class SpeculativeThoughtModel(ThoughtModel):
    """The large model's thoughts written by token-level speculative decoding with a same-tokenizer drafter.

    Sampling it is sampling the target (speculative sampling is lossless); only the cost changes. The target's and the
    drafter's forwards are counted under their own names. Thoughts are drawn one at a time.
    """

    def __init__(self, target: ThoughtModel, drafter: ThoughtModel, *, gamma: int = 4):
        super().__init__(
            target.model,
            target.tokenizer,
            name=target.name,
            fmt=target.fmt,
            shots=target.shots,
            delimiter=target.delimiter,
            max_step_tokens=target.max_step_tokens,
            meter=target.meter,
            prefix_cache=target.prefix_cache,
            cache_entries=target.cache_entries,
            stop_markers=target.stop_markers,
        )
        if drafter.tokenizer.get_vocab() != target.tokenizer.get_vocab():
            raise ValueError(
                "corrector='sd' needs a drafter with the large model's tokenizer; for a cross-tokenizer pair use "
                "corrector='plain'"
            )
        self.drafter = drafter
        self.gamma = gamma
        self.n_drafted = 0
        self.n_accepted = 0

    @torch.no_grad()
    def sample(
        self,
        question: str,
        steps: Sequence[str],
        seeds: Sequence[int],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        step_prefix: str = "",
    ) -> list[StepOutput]:
        prompt_ids = encode_prompt(self.tokenizer, self.render(question, steps, step_prefix))
        outs = []
        for s in seeds:
            self.calls += 1
            self.logical_tokens += len(prompt_ids)
            o = speculative_decode(
                self,
                self.drafter,
                prompt_ids,
                max_new_tokens=self.max_step_tokens,
                gamma=self.gamma,
                temperature=temperature,
                top_p=top_p,
                seed=int(s),
                stop_string=self.delimiter,
            )
            self.logical_tokens += len(o.token_ids)
            self.n_drafted += o.n_drafted
            self.n_accepted += o.n_accepted
            outs.append(self.to_step(o.token_ids, o.stop_reason, step_prefix))
        return outs


# ----------------------------------------------------------------------------------------------------------------
# Search state


@dataclass
class Candidate:
    """One thought proposed at a node: its text, PRM score, who wrote it, and whether the path ends there."""

    step: StepOutput
    score: float
    source: str  # "draft" (accepted small-model thought), "correction", "cold_start", or "small"/"large" (baselines)
    accepted: bool = True


@dataclass(frozen=True)
class Path:
    """A partial solution: its steps, their PRM scores and provenance."""

    steps: tuple[str, ...] = ()
    scores: tuple[float, ...] = ()
    sources: tuple[str, ...] = ()
    finished: bool = False

    def extend(self, c: Candidate) -> Path:
        text = c.step.text
        if not text:  # the model ended the answer without a new step
            return Path(self.steps, self.scores, self.sources, True)
        return Path((*self.steps, text), (*self.scores, c.score), (*self.sources, c.source), c.step.finished)

    def value(self, aggregate: str = "mean") -> float:
        return aggregate_scores(self.scores, aggregate)


def aggregate_scores(scores: Sequence[float], aggregate: str = "mean") -> float:
    """A path's value from its step scores: ``mean``, ``min``, ``last`` or ``prod`` (-inf for an empty path)."""
    if aggregate not in AGGREGATES:
        raise ValueError(f"aggregate must be one of {', '.join(AGGREGATES)}, got {aggregate!r}")
    if not scores:
        return -math.inf
    if aggregate == "mean":
        return float(np.mean(scores))
    if aggregate == "min":
        return float(min(scores))
    if aggregate == "last":
        return float(scores[-1])
    return float(np.prod(scores))


def select_top(paths: Sequence[Path], k: int, aggregate: str = "mean") -> list[Path]:
    """The `k` distinct paths of highest value (a path sampled twice is kept once; ties keep the earlier path)."""
    unique: dict[tuple[tuple[str, ...], bool], Path] = {}
    for p in paths:
        unique.setdefault((p.steps, p.finished), p)
    kept = list(unique.values())
    order = sorted(range(len(kept)), key=lambda i: -kept[i].value(aggregate))
    return [kept[i] for i in order[:k]]


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


@dataclass
class DepthRecord:
    """What happened at one search depth."""

    depth: int
    threshold: float | None  # beta_t used for the rejection (None for a plain beam search)
    n_drafts: int = 0
    n_accepted: int = 0
    n_corrections: int = 0
    n_cold_start: int = 0
    draft_scores: list[float] = field(default_factory=list)
    large_scores: list[float] = field(default_factory=list)


@dataclass
class SearchResult:
    """Output of `spec_search` / `beam_search`.

    Attributes:
        steps (`list[str]`): the best path's thoughts; provenance (`list[str]`): who wrote each of them (``draft``
            = an accepted small-model thought, ``correction`` / ``cold_start`` = the large model, ``small`` /
            ``large`` in the one-model baselines); scores: their PRM scores; value: the path's aggregate score.
        beams (`list[Path]`): the final beam (finished paths included), best first.
        acceptance_rate (`float`): accepted drafts / drafts (NaN when nothing was drafted).
        thresholds (`list[float | None]`): beta_t per depth.
        depths (`list[DepthRecord]`): per-depth counts and scores.
        cost (`dict`): per model name ``calls``, ``logical_tokens`` and, with a meter, the measured
            ``forward_calls``, ``prefill_tokens``, ``decode_tokens``, ``flops``; plus ``"prm"``: ``calls``,
            ``steps_scored``, ``flops``.
        latency (`dict[str, float]`): seconds in ``draft``, ``evaluate``, ``correct`` (incl. cold start),
            ``generate`` (one-model baselines), ``select`` and ``total``.
    """

    steps: list[str]
    provenance: list[str]
    scores: list[float]
    value: float
    beams: list[Path]
    acceptance_rate: float
    thresholds: list[float | None]
    depths: list[DepthRecord]
    cost: dict[str, dict[str, float]]
    latency: dict[str, float]

    @property
    def text(self) -> str:
        return "\n".join(self.steps)

    @property
    def n_drafts(self) -> int:
        return sum(d.n_drafts for d in self.depths)

    @property
    def n_accepted(self) -> int:
        return sum(d.n_accepted for d in self.depths)

    @property
    def n_large_thoughts(self) -> int:
        return sum(d.n_corrections + d.n_cold_start for d in self.depths)


# ----------------------------------------------------------------------------------------------------------------
# The search


def _check_search_args(n: int, beam_width: int, max_depth: int, step_prefixes: Sequence[str] | None) -> int:
    if n < 1:
        raise ValueError(f"n (thoughts per node) must be >= 1, got {n}")
    if beam_width < 1:
        raise ValueError(f"beam_width must be >= 1, got {beam_width}")
    if step_prefixes is not None:
        if len(step_prefixes) == 0:
            raise ValueError("step_prefixes must name at least one step, got an empty sequence")
        return len(step_prefixes) if max_depth is None else min(max_depth, len(step_prefixes))
    if max_depth is None or max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    return max_depth


def _scorer(prm: Any, question: str, latency: dict[str, float]) -> Callable[[Path, list[StepOutput]], list[float]]:
    def score(path: Path, outs: list[StepOutput]) -> list[float]:
        t0 = time.perf_counter()
        vals = []
        for o in outs:
            if not o.text:  # an empty step (the model ended) adds nothing to judge; it scores as the path's value
                vals.append(path.value("last") if path.scores else 0.0)
                continue
            vals.append(float(prm.score(question, [*path.steps, o.text])[-1]))
        latency["evaluate"] += time.perf_counter() - t0
        return vals

    return score


def _seeds(seed: int, role: str, question: str, path: Path, start: int, count: int) -> list[int]:
    # the seed of a thought depends on (role, question, path text, index) only, so two systems reaching the same node
    # draw the same thoughts (common random numbers make the paired comparisons sharper)
    key = "\n".join(path.steps)
    return [derive_seed(seed, "thought", role, question, key, i) for i in range(start, start + count)]


def _run_search(
    question: str,
    expand: Callable[[int, Path, str], list[Candidate]],
    *,
    beam_width: int,
    depth: int,
    step_prefixes: Sequence[str] | None,
    aggregate: str,
    end_depth: Callable[[int], None] | None = None,
    latency: dict[str, float],
) -> list[Path]:
    active = [Path()]
    finished: list[Path] = []
    for t in range(depth):
        prefix = step_prefixes[t] if step_prefixes is not None else ""
        children = [node.extend(c) for node in active for c in expand(t, node, prefix)]
        if end_depth is not None:
            end_depth(t)
        t0 = time.perf_counter()
        kept = select_top(children, beam_width, aggregate)
        finished += [p for p in kept if p.finished]
        active = [p for p in kept if not p.finished]
        latency["select"] += time.perf_counter() - t0
        if not active:
            break
    return select_top(finished + active, len(finished) + len(active), aggregate)


class _Tally:
    """Per-search cost: the models' counter deltas, the meter's per-model deltas, and the PRM's counters."""

    def __init__(self, models: Sequence[ThoughtModel], prm: Any, meter: ComputeMeter | None):
        self.models = list({id(m): m for m in models}.values())
        self.start = {id(m): (m.calls, m.logical_tokens) for m in self.models}
        self.meter = meter
        self.before = meter.snapshot() if meter is not None else {}
        self.prm = prm
        self.prm0 = self._prm_counts()

    def _prm_counts(self) -> tuple[float, float, float]:
        p = self.prm
        return (getattr(p, "calls", 0), getattr(p, "steps_scored", 0), float(getattr(p, "flops", 0.0)))

    def cost(self) -> dict[str, dict[str, float]]:
        cost: dict[str, dict[str, float]] = {}
        for m in self.models:
            c0, t0 = self.start[id(m)]
            row = cost.setdefault(m.name, {"calls": 0.0, "logical_tokens": 0.0, "flop_params": float(m.flop_params)})
            row["calls"] += m.calls - c0
            row["logical_tokens"] += m.logical_tokens - t0
        if self.meter is not None:
            for name, d in self.meter.since(self.before).items():
                if d.forward_calls == 0 and name not in cost:
                    continue
                row = cost.setdefault(name, {})
                row.update(
                    forward_calls=d.forward_calls,
                    forward_batches=d.forward_batches,
                    prefill_tokens=d.prefill_tokens,
                    decode_tokens=d.decode_tokens,
                    flops=d.flops,
                )
        calls, steps, flops = (a - b for a, b in zip(self._prm_counts(), self.prm0))
        cost["prm"] = {"calls": calls, "steps_scored": steps, "flops": flops}
        return cost


def _result(
    paths: list[Path],
    depths: list[DepthRecord],
    tally: _Tally,
    latency: dict[str, float],
    t_start: float,
    aggregate: str,
) -> SearchResult:
    latency["total"] = time.perf_counter() - t_start
    best = paths[0] if paths else Path()
    drafts = sum(d.n_drafts for d in depths)
    return SearchResult(
        steps=list(best.steps),
        provenance=list(best.sources),
        scores=list(best.scores),
        value=best.value(aggregate),
        beams=paths,
        acceptance_rate=(sum(d.n_accepted for d in depths) / drafts) if drafts else math.nan,
        thresholds=[d.threshold for d in depths],
        depths=depths,
        cost=tally.cost(),
        latency=dict(latency),
    )


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
