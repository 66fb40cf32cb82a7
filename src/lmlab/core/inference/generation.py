"""Generation: lmlab's own token loop over the KV cache, and a thin wrapper over `model.generate`.

`decode` is the loop that refinement, speculative and reward-guided decoding build on. Each step it

1. computes the *raw* next-token distribution p_t = softmax(logits_t) (float32), its entropy
   H_t = -sum_v p_t(v) log p_t(v) in nats, and the log-prob of the chosen token under p_t;
2. picks a token (greedy, or sampled after temperature / top-k / top-p / HF logits processors: these shape the
   choice only, never the recorded entropy or log-prob);
3. calls ``step_callback(state)``, which may accept (return None), `Stop`, `Rewind` k tokens, or `Replace` the last
   k tokens with others (e.g. a refined span);
4. stops at EOS, a stop string or `max_new_tokens`; otherwise feeds the new tokens to the model.

The KV cache always holds a prefix of the current ids. After a rewind or replacement it is cropped to the longest
prefix that is still valid (`DynamicCache.crop`; a sliding-window layer that cannot crop falls back to a fresh
prefill) and only the changed tokens are fed again, so no discarded token ever conditions the next step.

The loop runs one sequence at a time (rewinds make batch rows ragged); `decode_many` maps it over prompts;
`decode_batch` decodes many prompts together (left padding, no callbacks) on the fast engine.
`hf_generate` wraps `model.generate` (left padding, batches) for plain greedy / beam / sampling baselines.

Engines (``engine=`` on `decode`, `decode_many`, `decode_batch`; ``lmlab run --engine``): ``"fast"`` (the default
where supported: lmlab's own llama / gemma3 forward over a static KV cache, with the model's fp32 weights, so the
same greedy tokens as transformers), ``"fast-int4"`` (the same with 4-bit weights, from the GGUF's own Q4 blocks
where the model came from one; ~3-4x faster, not exact: see `lmlab.core.inference.engine`) and ``"hf"`` (the
transformers
forward with a `DynamicCache`). A model the fast engine cannot run (another architecture, hooks, adapters, bf16,
GPU) falls back to ``"hf"`` with a logged message. `DecodeState.fork_cache` always returns a transformers cache.
"""

from __future__ import annotations

import copy
import inspect
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from lmlab.core.inference.compute import ComputeMeter
from lmlab.core.inference.scoring import encode_prompt

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------------------------
# Callback actions


@dataclass(frozen=True)
class Stop:
    """End generation now (the current token is kept)."""

    reason: str = "callback"


@dataclass(frozen=True)
class Rewind:
    """Drop the last `n` generated tokens and continue decoding from there."""

    n: int


@dataclass(frozen=True)
class Replace:
    """Drop the last `n` generated tokens and append `tokens` instead (e.g. a refined span).

    `entropies` / `logprobs` (raw-distribution values for the new tokens, if the caller computed them) keep the
    traces aligned with the tokens; missing values are recorded as NaN.
    """

    n: int
    tokens: tuple[int, ...]
    entropies: tuple[float, ...] | None = None
    logprobs: tuple[float, ...] | None = None


StepAction = Stop | Rewind | Replace | None


# ----------------------------------------------------------------------------------------------------------------
# Helpers on distributions and caches


def entropy_from_logprobs(logprobs: torch.Tensor) -> torch.Tensor:
    """H = -sum p log p (nats) over the last dim; `logprobs` is a log-softmax output. Shape: (...)."""
    return -(logprobs.exp() * logprobs).nan_to_num(0.0).sum(-1)


def filter_logits(
    logits: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """Temperature, then top-k, then nucleus (top-p) filtering of (vocab,) or (batch, vocab) logits."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logits = logits / temperature
    if top_k and top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the mass *before* it already reaches top_p (the top token always stays)
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= top_p
        drop_sorted[..., 0] = False  # also for top_p <= 0
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def penalize(logits: torch.Tensor, generated: Sequence[int], frequency: float, presence: float) -> torch.Tensor:
    """OpenAI's penalties on (vocab,) or (1, vocab) `logits`: ``- frequency * count(v) - presence * (count(v) > 0)``,
    counting `generated` (the completion's tokens so far; the prompt does not count)."""
    if not generated or (frequency == 0 and presence == 0):
        return logits
    counts = torch.bincount(torch.as_tensor(list(generated), dtype=torch.long), minlength=logits.shape[-1])
    counts = counts[: logits.shape[-1]].to(logits.dtype)  # (vocab,)
    return logits - frequency * counts - presence * (counts > 0).to(logits.dtype)


def crop_cache(cache: Any, length: int) -> bool:
    """Crop `cache` in place to its first `length` positions. False if a layer cannot (then re-prefill)."""
    current = cache.get_seq_length()
    if length > current:
        raise ValueError(f"cannot crop a cache of {current} positions to {length}")
    if length == current:
        return True
    if hasattr(cache, "can_crop"):  # the fast engine's KVCache: O(1)
        return cache.crop(length)
    try:
        cache.crop(length - current)  # transformers 5: a negative count removes that many positions
    except (RuntimeError, ValueError):
        return False
    return cache.get_seq_length() == length


def new_cache(model: Any) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def cache_kwargs(model: Any, cache: Any) -> dict[str, Any]:
    """The keyword that passes a KV cache to `model.forward`: ``cache`` (transformers 5.24+) or ``past_key_values``."""
    name = getattr(model, "_lmlab_cache_kwarg", None)
    if name is None:
        params = inspect.signature(model.forward).parameters
        name = "cache" if "cache" in params else "past_key_values"
        model._lmlab_cache_kwarg = name
    return {name: cache, "use_cache": True}


@torch.no_grad()
def forward_tokens(model: Any, tokens: Sequence[int], cache: Any) -> torch.Tensor:
    """Feed `tokens` (one sequence) after what `cache` holds; return the last position's logits, (vocab,) float32."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(tokens)], dtype=torch.long, device=device)
    out = model(input_ids=ids, logits_to_keep=1, **cache_kwargs(model, cache))
    return out.logits[0, -1].float()


_FALLBACK_SEEN: set[tuple[str, str]] = set()


def resolve_engine(model: Any, engine: str | None = None) -> Any | None:
    """The fast engine to decode `model` with, or None for the HF forward.

    `engine` is ``"fast"``, ``"fast-int4"``, ``"hf"`` or None (the process default:
    `lmlab.core.inference.engine.default_engine`,
    ``fast`` unless set). A model the fast engine cannot run falls back to HF with a logged message (a warning
    when the fast engine was asked for explicitly, once per model type and reason).
    """
    from lmlab.core.inference.engine import EngineUnsupported, default_engine, get_engine, parse_engine

    name = parse_engine(engine) if engine is not None else default_engine()
    if name == "hf":
        return None
    try:
        return get_engine(model, "int4" if name == "fast-int4" else "fp32")
    except EngineUnsupported as e:
        key = (type(model).__name__, str(e))
        if key not in _FALLBACK_SEEN:
            _FALLBACK_SEEN.add(key)
            level = logging.WARNING if engine is not None else logging.INFO
            logger.log(level, "engine %r not used for %s: %s; decoding with the HF forward", name, key[0], e)
        return None


def _meter_label(model: Any, name: str | None) -> str:
    return name or getattr(model, "lmlab_spec", None) or type(model).__name__


# ----------------------------------------------------------------------------------------------------------------
# The decode loop


@dataclass
class DecodeState:
    """What a step callback sees. `ids` is prompt + generated, the last token being the one just chosen.

    Attributes:
        model, tokenizer: the model being decoded and its tokenizer.
        prompt_len (`int`): number of prompt tokens at the start of `ids`.
        ids (`list[int]`): all tokens so far.
        logprobs (`torch.Tensor`): raw log-distribution the current token was chosen from, (vocab,).
        entropies (`list[float]`), token_logprobs (`list[float]`): one value per generated token (raw distribution).
        is_eos (`bool`): the current token is an end-of-sequence token.
        meter (`ComputeMeter`, *optional*): the meter counting this decode.
    """

    model: Any
    tokenizer: Any
    prompt_len: int
    ids: list[int]
    logprobs: torch.Tensor
    entropies: list[float]
    token_logprobs: list[float]
    is_eos: bool
    meter: ComputeMeter | None
    _cache: Any = field(repr=False, default=None)
    _cached_len: int = 0

    @property
    def generated(self) -> list[int]:
        return self.ids[self.prompt_len :]

    @property
    def step(self) -> int:
        """Number of generated tokens, counting the current one."""
        return len(self.ids) - self.prompt_len

    @property
    def token_id(self) -> int:
        return self.ids[-1]

    def fork_cache(self, length: int) -> tuple[Any, int]:
        """A private copy of the KV cache holding at most `length` positions, and how many it holds.

        The copy may hold fewer positions than asked (when the live cache cannot be cropped); the caller then feeds
        ``ids[held:length]`` itself before decoding from position `length`.
        """
        held = min(length, self._cached_len)
        if hasattr(self._cache, "to_hf"):  # the fast engine's cache: hand out a transformers copy of its prefix
            return self._cache.to_hf(self.model, held)
        fork = copy.deepcopy(self._cache)
        if not crop_cache(fork, held):
            fork, held = new_cache(self.model), 0
        return fork, held


@dataclass
class DecodeOutput:
    """Result of one `decode` call."""

    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    entropies: list[float]
    token_logprobs: list[float]
    stop_reason: str
    n_forward_calls: int
    n_forward_tokens: int
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)


def _eos_ids(model: Any, tokenizer: Any, eos_token_id: int | Sequence[int] | None) -> set[int]:
    if eos_token_id is None:
        eos_token_id = getattr(model.generation_config, "eos_token_id", None)
        if eos_token_id is None:
            eos_token_id = tokenizer.eos_token_id
    if eos_token_id is None:
        return set()
    return {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(t) for t in eos_token_id}


@torch.no_grad()
def decode(
    model: Any,
    tokenizer: Any,
    prompt: str | Sequence[int],
    *,
    max_new_tokens: int = 32,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    logits_processors: Sequence[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = (),
    step_callback: Callable[[DecodeState], StepAction] | None = None,
    stop_strings: Sequence[str] = (),
    eos_token_id: int | Sequence[int] | None = None,
    seed: int | None = None,
    meter: ComputeMeter | None = None,
    meter_name: str | None = None,
    engine: str | None = None,
) -> DecodeOutput:
    """Decode one sequence with a KV cache, a per-step callback and exact rewind.

    Args:
        model, tokenizer: a Hugging Face causal LM and its tokenizer.
        prompt (`str` or token ids): the prompt; a string is tokenized with `encode_prompt`.
        max_new_tokens (`int`, defaults to 32): generation budget.
        do_sample (`bool`, defaults to `False`): sample instead of greedy argmax.
        temperature, top_k, top_p: sampling filters (only shape the choice; traces use the raw distribution).
        logits_processors: HF-style ``(input_ids (1, L), scores (1, V)) -> scores`` callables applied first.
        step_callback: ``fn(DecodeState) -> None | Stop | Rewind | Replace`` called after every chosen token.
        stop_strings: stop once the generated text contains one; the text is cut before it.
        eos_token_id: end token(s); defaults to the model's generation config.
        seed (`int`, *optional*): seeds the sampler (a private `torch.Generator`).
        meter (`ComputeMeter`, *optional*): counts this decode's forwards under `meter_name`.
        engine (`str`, *optional*): ``"fast"``, ``"fast-int4"`` or ``"hf"`` (see the module docstring); None uses the
            process default (``fast`` where the model supports it).
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    prompt_ids = encode_prompt(tokenizer, prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    if not prompt_ids:
        raise ValueError("prompt is empty: decoding needs at least one prompt token")
    eos = _eos_ids(model, tokenizer, eos_token_id)
    generator = None
    if do_sample:
        generator = torch.Generator(device="cpu")
        generator.manual_seed(0 if seed is None else int(seed))
    counter = {"calls": 0, "tokens": 0}

    ids = list(prompt_ids)
    entropies: list[float] = []
    token_lps: list[float] = []
    events: list[dict[str, Any]] = []
    fast = resolve_engine(model, engine) if max_new_tokens > 0 else None
    capacity = len(prompt_ids) + max_new_tokens + 1

    def fresh_cache() -> Any:
        return fast.new_cache(1, capacity) if fast is not None else new_cache(model)

    cache = fresh_cache()
    cached_len = 0
    stop_reason = "max_new_tokens"
    if fast is not None and meter is not None:
        from lmlab.core.inference.models import flop_params

        label, n_params = _meter_label(model, meter_name), flop_params(model)

    def feed() -> torch.Tensor:
        nonlocal cached_len
        tokens = ids[cached_len:]
        counter["calls"] += 1
        counter["tokens"] += len(tokens)
        if fast is not None:
            t0 = time.perf_counter()
            logits = fast.forward_tokens(tokens, cache)
            if meter is not None:
                meter.record(label, batch=1, seq=len(tokens), flop_params=n_params, wall_s=time.perf_counter() - t0)
        elif meter is not None:
            with meter.track(model, meter_name):
                logits = forward_tokens(model, tokens, cache)
        else:
            logits = forward_tokens(model, tokens, cache)
        cached_len = len(ids)
        return logits

    def resync(valid_prefix: int) -> None:
        """Make the cache hold a prefix of `ids` no longer than `valid_prefix`, leaving >= 1 token to feed."""
        nonlocal cache, cached_len
        target = min(cached_len, valid_prefix, len(ids) - 1)
        if target < cached_len:
            if not crop_cache(cache, target):
                cache, target = fresh_cache(), 0
            cached_len = target

    logits = feed() if max_new_tokens > 0 else None
    while logits is not None and len(ids) - len(prompt_ids) < max_new_tokens:
        raw_lp = F.log_softmax(logits, dim=-1)  # (vocab,)
        scores = logits
        for proc in logits_processors:
            scores = proc(torch.tensor([ids]), scores[None])[0]
        if do_sample:
            probs = filter_logits(scores, temperature=temperature, top_k=top_k, top_p=top_p).softmax(-1)
            token = int(torch.multinomial(probs, 1, generator=generator))
        else:
            token = int(scores.argmax())
        ids.append(token)
        entropies.append(float(entropy_from_logprobs(raw_lp)))
        token_lps.append(float(raw_lp[token]))

        action: StepAction = None
        if step_callback is not None:
            state = DecodeState(
                model,
                tokenizer,
                len(prompt_ids),
                ids,
                raw_lp,
                entropies,
                token_lps,
                token in eos,
                meter,
                cache,
                cached_len,
            )
            action = step_callback(state)
        if isinstance(action, Stop):
            stop_reason = action.reason
            break
        if isinstance(action, Rewind | Replace):
            n = action.n
            if not 0 <= n <= len(ids) - len(prompt_ids):
                raise ValueError(f"callback asked to remove {n} tokens but only {len(ids) - len(prompt_ids)} exist")
            keep = len(ids) - n
            del ids[keep:], entropies[len(entropies) - n :], token_lps[len(token_lps) - n :]
            if isinstance(action, Replace):
                new = [int(t) for t in action.tokens]
                ids.extend(new)
                nan = [math.nan] * len(new)
                entropies.extend(action.entropies if action.entropies is not None else nan)
                token_lps.extend(action.logprobs if action.logprobs is not None else nan)
                events.append({"type": "replace", "at": keep - len(prompt_ids), "removed": n, "added": len(new)})
            else:
                events.append({"type": "rewind", "at": keep - len(prompt_ids), "removed": n})
            if len(ids) - len(prompt_ids) > max_new_tokens:
                over = len(ids) - len(prompt_ids) - max_new_tokens
                del ids[-over:], entropies[-over:], token_lps[-over:]
            resync(keep)
            eos_at = next((i for i in range(len(prompt_ids), len(ids)) if ids[i] in eos), None)
            if eos_at is not None:  # a replacement that contains EOS ends the sequence there
                del (
                    ids[eos_at + 1 :],
                    entropies[eos_at + 1 - len(prompt_ids) :],
                    token_lps[eos_at + 1 - len(prompt_ids) :],
                )
                stop_reason = "eos"
                break
        elif ids[-1] in eos:
            stop_reason = "eos"
            break
        if stop_strings and _hits_stop(tokenizer, ids[len(prompt_ids) :], stop_strings):
            stop_reason = "stop_string"
            break
        if len(ids) - len(prompt_ids) >= max_new_tokens:
            break
        logits = feed()

    gen = ids[len(prompt_ids) :]
    text = tokenizer.decode(gen, skip_special_tokens=True)
    if stop_reason == "stop_string":
        text = _cut_at_stop(text, stop_strings)
    return DecodeOutput(
        prompt_ids=list(prompt_ids),
        token_ids=gen,
        text=text,
        entropies=entropies,
        token_logprobs=token_lps,
        stop_reason=stop_reason,
        n_forward_calls=counter["calls"],
        n_forward_tokens=counter["tokens"],
        events=events,
    )


def _hits_stop(tokenizer: Any, generated: Sequence[int], stop_strings: Sequence[str]) -> bool:
    text = tokenizer.decode(list(generated), skip_special_tokens=True)
    return any(s in text for s in stop_strings)


def _cut_at_stop(text: str, stop_strings: Sequence[str]) -> str:
    cut = min((text.index(s) for s in stop_strings if s in text), default=len(text))
    return text[:cut]


def decode_many(
    model: Any, tokenizer: Any, prompts: Sequence[str | Sequence[int]], **kwargs: Any
) -> list[DecodeOutput]:
    """`decode` over several prompts (one at a time; per-prompt seeds are ``seed + index`` when sampling)."""
    seed = kwargs.pop("seed", None)
    return [
        decode(model, tokenizer, p, seed=None if seed is None else seed + i, **kwargs) for i, p in enumerate(prompts)
    ]


@torch.no_grad()
def decode_batch(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str | Sequence[int]],
    *,
    max_new_tokens: int = 32,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    stop_strings: Sequence[str] = (),
    eos_token_id: int | Sequence[int] | None = None,
    seed: int | None = None,
    batch_size: int = 8,
    meter: ComputeMeter | None = None,
    meter_name: str | None = None,
    engine: str | None = None,
) -> list[DecodeOutput]:
    """Decode many prompts together on the fast engine: left-padded batches, one forward per step for the batch.

    Same outputs as `decode_many` with the same arguments (greedy: the same tokens; sampling: row i uses the
    generator seeded ``seed + i``, as `decode_many` does), without callbacks or logits processors. A row stops at
    EOS, a stop string or `max_new_tokens`; the batch steps until every row has stopped (finished rows are fed
    but ignored). Falls back to `decode_many` when the fast engine is not used.
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k,
                  top_p=top_p, stop_strings=stop_strings, eos_token_id=eos_token_id, meter=meter,
                  meter_name=meter_name)  # fmt: skip
    fast = resolve_engine(model, engine) if max_new_tokens > 0 else None
    if fast is None:
        return decode_many(model, tokenizer, prompts, seed=seed, engine="hf", **kwargs)
    encoded = [encode_prompt(tokenizer, p) if isinstance(p, str) else [int(t) for t in p] for p in prompts]
    if any(not e for e in encoded):
        raise ValueError("prompt is empty: decoding needs at least one prompt token")
    eos = _eos_ids(model, tokenizer, eos_token_id)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    if meter is not None:
        from lmlab.core.inference.models import flop_params

        label, n_params = _meter_label(model, meter_name), flop_params(model)
    outputs: list[DecodeOutput] = []
    for start in range(0, len(encoded), batch_size):
        rows = encoded[start : start + batch_size]
        B, width = len(rows), max(len(r) for r in rows)
        pads = [width - len(r) for r in rows]
        ids = torch.tensor([[pad_id] * p + r for p, r in zip(pads, rows)], dtype=torch.long)
        gens = []
        if do_sample:
            for i in range(B):
                g = torch.Generator(device="cpu")
                g.manual_seed((0 if seed is None else int(seed)) + start + i)
                gens.append(g)
        cache = fast.new_cache(B, width + max_new_tokens + 1, pads)
        new: list[list[int]] = [[] for _ in range(B)]
        ents: list[list[float]] = [[] for _ in range(B)]
        lps: list[list[float]] = [[] for _ in range(B)]
        reasons = ["max_new_tokens"] * B
        done = [False] * B
        calls = 0
        feed = ids
        while True:
            t0 = time.perf_counter()
            logits = fast.forward(feed, cache)  # [B, vocab]
            calls += 1
            if meter is not None:
                meter.record(label, batch=B, seq=feed.shape[1], flop_params=n_params, wall_s=time.perf_counter() - t0)
            raw_lp = F.log_softmax(logits, dim=-1)
            ent = entropy_from_logprobs(raw_lp)
            if do_sample:
                probs = filter_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p).softmax(-1)
                chosen = [int(torch.multinomial(probs[i], 1, generator=gens[i])) for i in range(B)]
            else:
                chosen = logits.argmax(-1).tolist()
            for i in range(B):
                if done[i]:
                    continue
                tok = chosen[i]
                new[i].append(tok)
                ents[i].append(float(ent[i]))
                lps[i].append(float(raw_lp[i, tok]))
                if tok in eos:
                    done[i], reasons[i] = True, "eos"
                elif stop_strings and _hits_stop(tokenizer, new[i], stop_strings):
                    done[i], reasons[i] = True, "stop_string"
                elif len(new[i]) >= max_new_tokens:
                    done[i] = True
            if all(done):
                break
            feed = torch.tensor([[new[i][-1] if new[i] else pad_id] for i in range(B)], dtype=torch.long)
        for i, r in enumerate(rows):
            text = tokenizer.decode(new[i], skip_special_tokens=True)
            if reasons[i] == "stop_string":
                text = _cut_at_stop(text, stop_strings)
            n = len(new[i])
            outputs.append(DecodeOutput(list(r), new[i], text, ents[i], lps[i], reasons[i], n, len(r) + n - 1))
    return outputs


# ----------------------------------------------------------------------------------------------------------------
# Plain generation through `model.generate`


@dataclass
class GenerationOutput:
    prompt_ids: list[int]
    token_ids: list[int]
    text: str


@torch.no_grad()
def hf_generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str | Sequence[int]],
    *,
    max_new_tokens: int = 32,
    num_beams: int = 1,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    length_penalty: float = 1.0,
    seed: int = 0,
    batch_size: int = 8,
    stop_strings: Sequence[str] = (),
    meter: ComputeMeter | None = None,
    meter_name: str | None = None,
) -> list[GenerationOutput]:
    """`model.generate` over prompts in left-padded batches (greedy, beam search or sampling).

    Sampling is seeded per batch with ``torch.manual_seed(seed + batch_index)``: the same seed and batch size give
    the same outputs. EOS and everything after it are removed from `token_ids` only if padding follows it.
    """
    device = next(model.parameters()).device
    encoded = [encode_prompt(tokenizer, p) if isinstance(p, str) else [int(t) for t in p] for p in prompts]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    outputs: list[GenerationOutput] = []
    gen_kwargs: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "num_beams": num_beams,
        "do_sample": do_sample,
        "pad_token_id": pad,
    }
    if do_sample:
        gen_kwargs.update(temperature=temperature, top_k=top_k or None, top_p=top_p)
    if num_beams > 1:
        gen_kwargs.update(length_penalty=length_penalty, early_stopping=True)
    for b, start in enumerate(range(0, len(encoded), batch_size)):
        rows = encoded[start : start + batch_size]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, width - len(r) :] = torch.tensor(r)
            mask[i, width - len(r) :] = 1
        if do_sample:
            torch.manual_seed(seed + b)
        if meter is not None:
            with meter.track(model, meter_name):
                out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **gen_kwargs)
        else:
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **gen_kwargs)
        eos = _eos_ids(model, tokenizer, None)
        for i, r in enumerate(rows):
            gen = out[i, width:].tolist()
            # generate pads finished rows with pad (often == EOS); keep the first EOS, drop the padding after it
            for j, t in enumerate(gen):
                if t in eos:
                    gen = gen[: j + 1]
                    break
            text = tokenizer.decode(gen, skip_special_tokens=True)
            if stop_strings:
                text = _cut_at_stop(text, stop_strings)
            outputs.append(GenerationOutput(list(r), gen, text))
    return outputs
