"""Thought generation: `ThoughtModel`, a `StepModel` with a prefix KV cache and batched sampling of n thoughts.

Models exchange thoughts as text (`lmlab.core.inference.steps.StepModel`: each model renders the question and the steps
so far in its own prompt format). `ThoughtModel` adds two things a serving engine has (the paper ran vLLM): a prefix KV
cache per model (only tokens the model has not processed yet are fed; after a switch of models that is the other
model's new steps, counted as prefill) and batched sampling of n thoughts from one prefill. With ``prefix_cache=False``
every call re-prefills its whole prompt, as a plain `StepModel` does; `ThoughtModel.logical_tokens` counts that cost
either way, for a no-cache cost model.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from lmlab.core.inference.compute import ComputeMeter
from lmlab.core.inference.generation import cache_kwargs, crop_cache, filter_logits, new_cache
from lmlab.core.inference.scoring import encode_prompt
from lmlab.core.inference.steps import Shot, StepModel, StepOutput


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


__all__ = ["ThoughtModel"]
