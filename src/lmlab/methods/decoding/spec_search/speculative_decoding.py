"""Token-level speculative decoding (Leviathan et al., 2023): Speculative Search's optional lossless corrector.

- `speculative_decode`: decodes a `ThoughtModel` target with a same-vocabulary drafter; the drafter proposes gamma
  tokens, the target verifies them in one forward and keeps each with probability min(1, p(x) / q(x)), else samples
  from norm(max(0, p - q)). The output follows the target's distribution exactly (greedy: the target's greedy tokens).
- `SpeculativeThoughtModel`: a `ThoughtModel` whose thoughts are written that way (what
  ``spec_search(..., corrector="sd")`` uses): sampling it is sampling the target; only the cost changes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from lmlab.core.inference.generation import cache_kwargs, crop_cache, filter_logits, new_cache
from lmlab.core.inference.scoring import encode_prompt
from lmlab.core.inference.steps import StepOutput
from lmlab.methods.decoding.spec_search.thought_model import ThoughtModel


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


__all__ = ["SpecDecodeOutput", "SpeculativeThoughtModel", "speculative_decode"]
