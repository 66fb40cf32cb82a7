"""Reflection-Window Decoding: pause when a window of tokens is uncertain, regenerate it by beam search.

    pause at step t  iff  rule({H_j : j in window of the last d tokens}) > sigma,   H_j = -sum_v p_j(v) log p_j(v)
    refine:          y_{t-d+1..t} <- argmax_{s in Beam_B(x, y_<t-d+1; d) U {y_{t-d+1..t}}}
                                     sum_i log p(s_i | x, y_<t-d+1, s_<i)

Tang et al., "Reflection-Window Decoding: Text Generation with Selective Refinement", ICML 2025
(https://arxiv.org/abs/2502.03678). No official code exists; the pausing rule, beam width and cool-down are
lmlab's reading of the paper (see the README, "Deviations").

The target is the fixed-length joint optimum y* = argmax log P(y_1..y_T | x); greedy decoding optimises one
coordinate at a time, and the paper bounds its sub-optimality by the uncertainty of the conditionals. So decoding
runs a base rule (greedy by default), records the entropy H_t of the *raw* next-token distribution, and when the
window of the last d tokens is uncertain (``rule="all"``: every H_j > sigma) it rolls the window back, crops the KV
cache to the window start, and re-decodes a length-d span with beam search (width B) scored by joint log-prob, the
original span included as a candidate so a refinement never lowers the window's joint log-prob. The window then
moves past the refined span (a cool-down of d tokens) so the same region is not refined again.

Everything here is pure: no I/O, no printing. Costs come back in `RWOutput` (and in a `ComputeMeter` if given).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from lmlab.core.inference.compute import ComputeMeter
from lmlab.core.inference.generation import DecodeState, Replace, cache_kwargs, decode, entropy_from_logprobs

PAUSE_RULES = ("all", "any", "mean", "current")


def should_pause(window_entropies: Sequence[float], sigma: float, rule: str = "all") -> bool:
    """The pausing criterion on the entropies (nats) of the last d tokens.

    ``all``: every H_j > sigma (sustained uncertainty, lmlab's default reading); ``any``: some H_j > sigma;
    ``mean``: mean H_j > sigma; ``current``: the newest H_t > sigma.
    """
    if not window_entropies:
        return False
    if rule == "all":
        return all(h > sigma for h in window_entropies)
    if rule == "any":
        return any(h > sigma for h in window_entropies)
    if rule == "mean":
        return sum(window_entropies) / len(window_entropies) > sigma
    if rule == "current":
        return window_entropies[-1] > sigma
    raise ValueError(f"rule must be one of {', '.join(PAUSE_RULES)}, got {rule!r}")


@dataclass
class SpanCandidate:
    """A length-<=d continuation of a prefix with its joint log-prob and per-token raw entropies / log-probs."""

    tokens: list[int]
    score: float
    entropies: list[float]
    logprobs: list[float]
    finished: bool = False  # ends in EOS


@dataclass
class RefinementResult:
    best: SpanCandidate
    n_candidates: int
    forward_calls: int  # per-sequence forwards spent by the beam search (B rows of a batch count B)
    forward_tokens: int


@torch.no_grad()
def beam_refine_span(
    model: Any,
    cache: Any,
    first_logprobs: torch.Tensor,
    *,
    length: int,
    beam_width: int,
    eos_ids: set[int],
    allow_eos: bool = False,
    original: SpanCandidate | None = None,
) -> RefinementResult:
    """Beam search over spans of exactly `length` tokens after a prefix, scored by joint log-prob (no normalisation).

    Args:
        model: the causal LM.
        cache: a private KV cache holding exactly the prefix (it is expanded and reordered in place).
        first_logprobs (`torch.Tensor`): raw log-distribution at the end of the prefix, (vocab,).
        length (`int`): span length d.
        beam_width (`int`): B.
        eos_ids: end tokens. Unless `allow_eos`, they are masked so every candidate has exactly `length` tokens (the
            paper's fixed-length objective); with `allow_eos` a beam that emits EOS is finished and competes with its
            joint log-prob so far.
        original: the span being refined, always kept as a candidate.
    """
    if length < 1 or beam_width < 1:
        raise ValueError(f"length and beam_width must be >= 1, got {length} and {beam_width}")
    device = first_logprobs.device
    eos_list = sorted(eos_ids)
    finished: list[SpanCandidate] = []

    def mask_eos(lp: torch.Tensor) -> torch.Tensor:
        if allow_eos or not eos_list:
            return lp
        lp = lp.clone()
        lp[..., eos_list] = float("-inf")
        return lp

    # step 0: the B best first tokens from the prefix distribution
    h0 = float(entropy_from_logprobs(first_logprobs))
    top = torch.topk(mask_eos(first_logprobs), beam_width)
    beams = [
        SpanCandidate([int(t)], float(s), [h0], [float(first_logprobs[t])])
        for s, t in zip(top.values.tolist(), top.indices.tolist())
        if math.isfinite(s)
    ]
    calls = tokens = 0
    live = []
    for b in beams:
        (finished if b.tokens[-1] in eos_ids else live).append(b)
    for b in finished:
        b.finished = True
    if live and length > 1:
        # expand the prefix cache to one row per live beam; rows are reordered as beams are selected
        cache.batch_repeat_interleave(len(live))
    for _ in range(1, length):
        if not live:
            break
        last = torch.tensor([[b.tokens[-1]] for b in live], device=device)  # (beams, 1)
        logits = model(input_ids=last, logits_to_keep=1, **cache_kwargs(model, cache)).logits[:, -1].float()
        calls += len(live)
        tokens += len(live)
        logprobs = F.log_softmax(logits, dim=-1)  # (beams, vocab)
        entropies = entropy_from_logprobs(logprobs).tolist()  # (beams,)
        scores = torch.tensor([b.score for b in live], device=device)[:, None] + mask_eos(logprobs)
        flat = torch.topk(scores.flatten(), min(beam_width, scores.numel()))
        vocab = logprobs.shape[-1]
        new_live: list[SpanCandidate] = []
        parents: list[int] = []
        for s, idx in zip(flat.values.tolist(), flat.indices.tolist()):
            if not math.isfinite(s):
                continue
            parent, token = divmod(idx, vocab)
            p = live[parent]
            cand = SpanCandidate(
                p.tokens + [token], s, p.entropies + [entropies[parent]], p.logprobs + [float(logprobs[parent, token])]
            )
            if token in eos_ids:
                cand.finished = True
                finished.append(cand)
            else:
                new_live.append(cand)
                parents.append(parent)
        live = new_live
        if live:
            cache.reorder_cache(torch.tensor(parents, device=device))
    candidates = finished + live
    if original is not None:
        candidates.append(original)
    best = max(candidates, key=lambda c: c.score)
    return RefinementResult(best, len(candidates), calls, tokens)


@dataclass
class Refinement:
    """One pause: where, what was there, what replaced it (token ids), and both joint log-probs."""

    position: int  # index in the generated tokens where the window starts
    old_tokens: list[int]
    new_tokens: list[int]
    old_logprob: float
    new_logprob: float

    @property
    def changed(self) -> bool:
        return self.old_tokens != self.new_tokens


@dataclass
class RWOutput:
    """Result of `reflection_window_generate` for one prompt."""

    text: str
    token_ids: list[int]
    prompt_ids: list[int]
    entropies: list[float]
    token_logprobs: list[float]
    n_pauses: int
    pause_positions: list[int]
    n_regenerated_tokens: int
    n_changed_tokens: int
    n_forward_calls: int
    n_forward_tokens: int
    stop_reason: str
    refinements: list[Refinement] = field(default_factory=list)


class _Reflector:
    """The step callback: checks the window, and on a pause returns a `Replace` with the refined span."""

    def __init__(self, *, sigma: float, window: int, rule: str, beam_width: int, allow_eos: bool, eos: set[int],
                 meter: ComputeMeter | None, meter_name: str | None):  # fmt: skip
        self.sigma, self.window, self.rule, self.beam_width = sigma, window, rule, beam_width
        self.allow_eos, self.eos = allow_eos, eos
        self.meter, self.meter_name = meter, meter_name
        self.refinements: list[Refinement] = []
        self.cooldown_until = 0  # number of generated tokens at the end of the last refined span
        self.logprob_history: dict[int, torch.Tensor] = {}  # generated index -> raw log-distribution it came from
        self.calls = 0
        self.tokens = 0

    def __call__(self, state: DecodeState) -> Replace | None:
        d = self.window
        step = state.step
        self.logprob_history[step - 1] = state.logprobs
        self.logprob_history.pop(step - 1 - d, None)  # keep only what a window can need
        if state.is_eos or step < d or step - self.cooldown_until < d:
            return None
        if not should_pause(state.entropies[-d:], self.sigma, self.rule):
            return None
        start = step - d  # generated index of the window's first token
        prefix_len = state.prompt_len + start
        old = state.ids[prefix_len:]
        original = SpanCandidate(
            list(old),
            float(sum(state.token_logprobs[-d:])),
            list(state.entropies[-d:]),
            list(state.token_logprobs[-d:]),
        )
        cache, held = state.fork_cache(prefix_len)
        if held < prefix_len:  # the live cache could not be cropped: rebuild the prefix's KV
            self._forward(state.model, state.ids[held:prefix_len], cache)
        if self.meter is not None:
            with self.meter.track(state.model, self.meter_name):
                result = self._refine(state, cache, start, original)
        else:
            result = self._refine(state, cache, start, original)
        self.calls += result.forward_calls
        self.tokens += result.forward_tokens
        best = result.best
        self.refinements.append(Refinement(start, list(old), list(best.tokens), original.score, best.score))
        self.cooldown_until = start + len(best.tokens)
        if best.tokens == list(old):
            return None
        return Replace(d, tuple(best.tokens), tuple(best.entropies), tuple(best.logprobs))

    def _refine(self, state: DecodeState, cache: Any, start: int, original: SpanCandidate) -> RefinementResult:
        return beam_refine_span(
            state.model,
            cache,
            self.logprob_history[start],
            length=self.window,
            beam_width=self.beam_width,
            eos_ids=self.eos,
            allow_eos=self.allow_eos,
            original=original,
        )

    def _forward(self, model: Any, tokens: Sequence[int], cache: Any) -> None:
        from lmlab.core.inference.generation import forward_tokens

        if tokens:
            if self.meter is not None:
                with self.meter.track(model, self.meter_name):
                    forward_tokens(model, tokens, cache)
            else:
                forward_tokens(model, tokens, cache)
            self.calls += 1
            self.tokens += len(tokens)


def reflection_window_generate(
    model: Any,
    tokenizer: Any,
    prompts: str | Sequence[int] | Sequence[str | Sequence[int]],
    *,
    max_new_tokens: int = 32,
    sigma: float = 0.5,
    window: int = 4,
    rule: str = "all",
    beam_width: int = 4,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    allow_eos_in_refinement: bool = False,
    stop_strings: Sequence[str] = (),
    meter: ComputeMeter | None = None,
    meter_name: str | None = None,
) -> RWOutput | list[RWOutput]:
    """Generate with Reflection-Window decoding (a `generate`-like API; one prompt or a list).

    Args:
        model, tokenizer: any Hugging Face causal LM and its tokenizer.
        prompts: a prompt string / token ids, or a list of them (each decoded on its own: rollbacks make batch rows
            ragged). Apply a chat template first for instruct models (`lmlab.core.inference.scoring.chat_prompt`).
        max_new_tokens (`int`, defaults to 32): generation budget.
        sigma (`float`, defaults to 0.5, the paper's value): entropy threshold in nats.
        window (`int`, defaults to 4, the paper's d): reflection-window length.
        rule (`str`, defaults to ``"all"``): pausing rule, one of ``all``, ``any``, ``mean``, ``current``.
        beam_width (`int`, defaults to 4): refinement beam width B.
        do_sample, temperature, top_k, top_p, seed: the base rule (greedy by default; sampling also works).
        eos_token_id: end token(s); defaults to the model's generation config.
        allow_eos_in_refinement (`bool`, defaults to `False`): let refined spans end early (see `beam_refine_span`).
        stop_strings: stop once the text contains one.
        meter (`ComputeMeter`, *optional*): counts all forwards (base decoding and refinements).

    Returns:
        `RWOutput` (or a list of them): text, token ids, entropy trace, pauses, regenerated tokens, forward calls.
    """
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0 nats, got {sigma}")
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if beam_width < 1:
        raise ValueError(f"beam_width must be >= 1, got {beam_width}")
    if rule not in PAUSE_RULES:
        raise ValueError(f"rule must be one of {', '.join(PAUSE_RULES)}, got {rule!r}")
    single = isinstance(prompts, str) or (len(prompts) > 0 and isinstance(prompts[0], int))
    batch = [prompts] if single else list(prompts)
    from lmlab.core.inference.generation import _eos_ids

    eos = _eos_ids(model, tokenizer, eos_token_id)
    outputs = []
    for i, prompt in enumerate(batch):
        reflector = _Reflector(
            sigma=sigma,
            window=window,
            rule=rule,
            beam_width=beam_width,
            allow_eos=allow_eos_in_refinement,
            eos=eos,
            meter=meter,
            meter_name=meter_name,
        )
        out = decode(
            model,
            tokenizer,
            prompt,
            max_new_tokens=max_new_tokens,
            do_sample=do_sample,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=None if seed is None else seed + i,
            eos_token_id=sorted(eos) if eos else None,
            step_callback=reflector,
            stop_strings=stop_strings,
            meter=meter,
            meter_name=meter_name,
        )
        refs = reflector.refinements
        outputs.append(
            RWOutput(
                text=out.text,
                token_ids=out.token_ids,
                prompt_ids=out.prompt_ids,
                entropies=out.entropies,
                token_logprobs=out.token_logprobs,
                n_pauses=len(refs),
                pause_positions=[r.position for r in refs],
                n_regenerated_tokens=sum(len(r.new_tokens) for r in refs),
                n_changed_tokens=sum(sum(a != b for a, b in zip(r.old_tokens, r.new_tokens)) for r in refs),
                n_forward_calls=out.n_forward_calls + reflector.calls,
                n_forward_tokens=out.n_forward_tokens + reflector.tokens,
                stop_reason=out.stop_reason,
                refinements=refs,
            )
        )
    return outputs[0] if single else outputs
