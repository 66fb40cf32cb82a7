"""Continuous batching for `lmlab serve`: requests join the fast engine's batched decode between steps.

One worker thread owns the model. Each loop turn it

1. takes new requests from the queue (at most ``max_batch`` sequences decode together; the rest wait),
2. prefills each new prompt on its own batch-1 cache (all positions' logits when the request wants the prompt's
   log-probs, OpenAI's ``echo``) and picks its first token,
3. regroups the running rows and the new ones into one right-aligned cache
(`lmlab.core.inference.engine.batching.regroup`:
   keys are copied, never recomputed, and keep their rope positions),
4. runs one batched forward ``[B, 1] -> [B, vocab]`` for every running row and picks each row's next token with
   that row's own sampler (temperature, top-p, a private seeded `torch.Generator`),
5. drops the rows that finished (EOS, a stop string, `max_tokens`) or whose client cancelled, before the next step.

So a request that arrives mid-decode waits at most one step plus its own prefill, and B concurrent requests share
each weight read (decode is memory-bound: B rows cost little more than one). Requests that ask for an lmlab
decoding strategy (`GenRequest.strategy`), and every request under ``engine="hf"`` (no batched cache there), run
one at a time on the same worker through `lmlab.core.inference.generation.decode`.

Log-probs are those of the raw model distribution (temperature 1, before top-p), as `lmlab.core.inference.scoring`
computes
them; a chosen token's log-prob is its entry there.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from lmlab.core.inference.generation import penalize

logger = logging.getLogger(__name__)

__all__ = ["Delta", "Finished", "GenRequest", "Handle", "Scheduler", "TextStream", "TokenInfo"]

# the seeds a `torch.Generator` takes (negative ones wrap); choice i of a request is seeded seed + i
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


@dataclass
class GenRequest:
    """One sequence to generate (a completion with ``n`` choices is ``n`` requests).

    Attributes:
        prompt_ids (`list[int]`): the prompt, already tokenized (chat template applied by the caller).
        max_tokens (`int`): generation budget, >= 0 (0: no generation; with `echo_logprobs` only scores the prompt).
        temperature (`float`): 0 = greedy; > 0 samples from softmax(logits / temperature) after `top_p`.
        top_p (`float`): nucleus filter in (0, 1].
        frequency_penalty, presence_penalty (`float`): OpenAI's, in [-2, 2]: before the choice (not in the reported
            log-probs), ``logit[v] -= frequency_penalty * count(v) + presence_penalty * (count(v) > 0)`` over the
            tokens generated so far (the prompt does not count).
        seed (`int`, *optional*): seeds this request's private sampler (same seed, same batch-independent draw).
        stop (`list[str]`): stop strings; the text is cut before the first one (it is not returned).
        logprobs (`int`, *optional*): return each chosen token's log-prob and the `logprobs` most likely
            alternatives (0: only the chosen token's). None: no log-probs.
        echo_logprobs (`bool`): also return the prompt tokens' log-probs (the first one is None), as OpenAI's
            ``echo=True`` with ``logprobs``.
        strategy (`Any`, *optional*): a prepared `lmlab.serve.strategies.Strategy` call; the request then runs
            alone (not batched) through that decoder.
        request_id (`str`): the caller's id, carried into every event.

    The ``n`` choices of one prompt are ``n`` requests; give choice ``i`` the seed ``seed + i`` so that they differ
    and the same request with the same seed gives the same choices.
    """

    prompt_ids: list[int]
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    logprobs: int | None = None
    echo_logprobs: bool = False
    strategy: Any = None
    request_id: str = ""


@dataclass
class TokenInfo:
    """One token of a prompt or a completion. `logprob` is under the raw (temperature 1) distribution."""

    token_id: int
    text: str  # the token as text (tokenizer.decode([token_id]))
    logprob: float | None = None
    top: list[tuple[int, str, float]] = field(default_factory=list)  # (id, text, logprob), most likely first


@dataclass
class Delta:
    """A streamed piece of a completion: new text (held back while it may be the start of a stop string or an
    incomplete UTF-8 character) and the tokens it covers. The deltas of a request, joined, are exactly its
    `Finished.text` and `Finished.tokens`: the last one (possibly empty) comes just before the `Finished`."""

    request_id: str
    text: str
    tokens: list[TokenInfo]


@dataclass
class Finished:
    """The end of a request. `text` is the whole completion (cut before a stop string); `tokens` every generated
    token (with log-probs when asked); `prompt_tokens` the prompt's TokenInfo when `echo_logprobs`.

    `finish_reason` is OpenAI's: ``"stop"`` (EOS or a stop string), ``"length"`` (max_tokens), or ``"cancelled"``.
    `n_prompt_tokens` / `n_completion_tokens` are exact counts (completion tokens include a final EOS token).
    `error` is set (and the rest empty) when the request failed inside the engine.
    """

    request_id: str
    text: str
    tokens: list[TokenInfo]
    finish_reason: str
    n_prompt_tokens: int
    n_completion_tokens: int
    prompt_tokens: list[TokenInfo] | None = None
    error: str | None = None


# ----------------------------------------------------------------------------------------------------------------
# Text of a growing completion


class TextStream:
    """The text of a growing list of generated ids, released only once it is final.

    Text is held back while it ends in an incomplete UTF-8 character (the tokenizer decodes a partial byte sequence
    to U+FFFD) or in a prefix of a stop string; a stop string ends the completion and is not part of its text.
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.released = 0  # characters of the text handed out so far
        self.text = ""  # the whole text so far (cut at a stop string once one appears)
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Add one generated id; return the newly final text (maybe empty). Sets `stopped` on a stop string."""
        self.ids.append(int(token_id))
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        hits = [text.index(s) for s in self.stop if s in text]
        if hits:
            self.text, self.stopped = text[: min(hits)], True
            return self.flush()
        self.text = text
        safe = len(text)
        if text.endswith("\ufffd"):
            safe = len(text.rstrip("\ufffd"))
        for s in self.stop:  # the longest tail of the text that could begin a stop string
            for k in range(min(len(s) - 1, safe), 0, -1):
                if text[safe - k : safe] == s[:k]:
                    safe -= k
                    break
        out = text[self.released : max(self.released, safe)]
        self.released += len(out)
        return out

    def flush(self) -> str:
        """The rest of the text (the completion has ended)."""
        out = self.text[self.released :]
        self.released = len(self.text)
        return out


# ----------------------------------------------------------------------------------------------------------------
# Handles


class Handle:
    """A submitted request: iterate its events (`Delta`s then one `Finished`), or wait for the `Finished`.

    `events()` is an async iterator (use from the server's event loop); `result(timeout)` blocks (tests, sync
    callers). `cancel()` (a client that went away) frees its batch slot before the next step; the request then
    finishes with ``finish_reason="cancelled"``.
    """

    def __init__(self, request: GenRequest) -> None:
        self.request = request
        self.cancelled = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._events: list[Delta | Finished] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._aqueue: asyncio.Queue | None = None
        self.finished: Finished | None = None
        try:  # submitted from a coroutine: deliver events straight into its loop
            self._bind(asyncio.get_running_loop())
        except RuntimeError:
            pass

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            if self._loop is not None:
                return
            self._loop, self._aqueue = loop, asyncio.Queue()
            for ev in self._events:
                self._aqueue.put_nowait(ev)

    def _push(self, event: Delta | Finished) -> None:
        """Called by the worker thread."""
        with self._lock:
            self._events.append(event)
            if isinstance(event, Finished):
                self.finished = event
            if self._loop is not None:
                try:
                    self._loop.call_soon_threadsafe(self._aqueue.put_nowait, event)
                except RuntimeError:  # the loop has closed (server shutting down): nobody is listening
                    pass
        if isinstance(event, Finished):
            self._done.set()

    async def events(self) -> AsyncIterator[Delta | Finished]:
        self._bind(asyncio.get_running_loop())
        while True:
            event = await self._aqueue.get()
            yield event
            if isinstance(event, Finished):
                return

    def result(self, timeout: float | None = None) -> Finished:
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.request.request_id!r} did not finish within {timeout} s")
        return self.finished

    def deltas(self) -> list[Delta]:
        with self._lock:
            return [e for e in self._events if isinstance(e, Delta)]

    def cancel(self) -> None:
        self.cancelled.set()


# ----------------------------------------------------------------------------------------------------------------
# The scheduler


@dataclass
class _Row:
    """A running sequence: its handle, sampler, text stream and what it has generated."""

    handle: Handle
    generator: torch.Generator | None
    stream: TextStream
    tokens: list[TokenInfo] = field(default_factory=list)
    pending: list[TokenInfo] = field(default_factory=list)  # tokens not yet sent in a Delta
    prompt_tokens: list[TokenInfo] | None = None
    last: int = -1  # the token to feed next
    held: str = ""  # released text not yet sent (the final token's)
    reason: str | None = None

    @property
    def request(self) -> GenRequest:
        return self.handle.request


class Scheduler:
    """Owns the model: one worker thread runs every forward (see the module docstring).

    Args:
        model, tokenizer: a loaded lmlab / HF causal LM and its tokenizer.
        engine (`str`): ``fast``, ``fast-int4`` (batched, continuous) or ``hf`` (requests run one at a time).
        max_batch (`int`): most sequences decoded together; more wait in the queue.
        max_context (`int`): longest prompt + max_tokens accepted (`submit` raises ValueError beyond it).
        eos_token_id: end token(s); default the model's generation config (then the tokenizer's).

    `submit(request)` is thread-safe and returns a `Handle` at once. `stats()` gives
    ``{"active", "queued", "steps", "generated_tokens", "max_batch", "engine"}``. `close()` stops the worker.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        engine: str = "fast",
        max_batch: int = 8,
        max_context: int = 4096,
        eos_token_id: int | Sequence[int] | None = None,
    ) -> None:
        from lmlab.core.inference.engine import parse_engine
        from lmlab.core.inference.generation import _eos_ids, resolve_engine

        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_context < 2:
            raise ValueError(f"max_context must be >= 2, got {max_context}")
        self.model, self.tokenizer = model, tokenizer
        self.engine_name = parse_engine(engine)
        self.fast = resolve_engine(model, self.engine_name) if self.engine_name != "hf" else None
        if self.fast is None:
            self.engine_name = "hf"
        self.max_batch, self.max_context = int(max_batch), int(max_context)
        self.eos = _eos_ids(model, tokenizer, eos_token_id)
        self._queue: collections.deque[Handle] = collections.deque()
        self._wake = threading.Condition()
        self._rows: list[_Row] = []
        self._cache: Any = None
        self._closed = False
        self._steps = 0
        self._generated = 0
        self._worker = threading.Thread(target=self._run, name="lmlab-scheduler", daemon=True)
        self._worker.start()

    # --- public --------------------------------------------------------------------------------------------------

    def submit(self, request: GenRequest) -> Handle:
        if self._closed:
            raise RuntimeError("the scheduler is closed")
        n_prompt = len(request.prompt_ids)
        if n_prompt == 0:
            raise ValueError("prompt is empty: generation needs at least one prompt token")
        if request.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {request.max_tokens}")
        if n_prompt + request.max_tokens > self.max_context:
            raise ValueError(
                f"prompt ({n_prompt} tokens) + max_tokens ({request.max_tokens}) = {n_prompt + request.max_tokens} "
                f"exceeds the context limit of {self.max_context} tokens"
            )
        if request.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {request.temperature}")
        if request.seed is not None and not SEED_MIN <= int(request.seed) <= SEED_MAX:
            raise ValueError(f"seed must be in [{SEED_MIN}, {SEED_MAX}] (torch's 64-bit seeds), got {request.seed}")
        if not 0 < request.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {request.top_p}")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2 <= getattr(request, name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(request, name)}")
        vocab = self._vocab_size()
        bad = [t for t in request.prompt_ids if not 0 <= int(t) < vocab]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab})")
        handle = Handle(request)
        with self._wake:
            self._queue.append(handle)
            self._wake.notify()
        return handle

    def submit_many(self, requests: Sequence[GenRequest]) -> list[Handle]:
        return [self.submit(r) for r in requests]

    def stats(self) -> dict[str, Any]:
        with self._wake:
            return {
                "active": len(self._rows),
                "queued": len(self._queue),
                "steps": self._steps,
                "generated_tokens": self._generated,
                "max_batch": self.max_batch,
                "engine": self.engine_name,
            }

    def close(self, timeout: float = 10.0) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._worker.join(timeout)

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- worker --------------------------------------------------------------------------------------------------

    def _vocab_size(self) -> int:
        emb = self.model.get_input_embeddings()
        return int(emb.weight.shape[0])

    def _take(self) -> list[Handle]:
        """New handles to start now (waits while idle)."""
        with self._wake:
            while not self._closed and not self._queue and not self._rows:
                self._wake.wait(0.5)
            if self._closed:
                return []
            taken = []
            while self._queue and len(self._rows) + len(taken) < self.max_batch:
                h = self._queue[0]
                if (h.request.strategy is not None or self.fast is None) and (self._rows or taken):
                    break  # a one-at-a-time request waits until the batch has drained
                taken.append(self._queue.popleft())
                if h.request.strategy is not None or self.fast is None:
                    break
            return taken

    def _run(self) -> None:
        while True:
            new = self._take()
            if self._closed:
                break
            try:
                alone = [h for h in new if h.request.strategy is not None or self.fast is None]
                for h in alone:
                    self._run_alone(h)
                batched = [h for h in new if h not in alone]
                if batched:
                    self._admit(batched)
                if self._rows:
                    self._step()
            except Exception as e:  # noqa: BLE001 - one bad request must not stop the server
                logger.exception("scheduler step failed")
                for row in self._rows:
                    self._finish(row, error=f"{type(e).__name__}: {e}")
                with self._wake:
                    self._rows, self._cache = [], None
                for h in new:
                    if h.finished is None:
                        h._push(self._error(h, e))
        for row in self._rows:
            self._finish(row, error="the server is shutting down")
        with self._wake:
            pending, self._queue = list(self._queue), collections.deque()
        for h in pending:
            h._push(self._error(h, RuntimeError("the server is shutting down")))

    @staticmethod
    def _error(handle: Handle, e: BaseException) -> Finished:
        r = handle.request
        return Finished(r.request_id, "", [], "error", len(r.prompt_ids), 0, None, f"{type(e).__name__}: {e}")

    def _info(self, token_id: int, logprobs: torch.Tensor | None, k: int | None) -> TokenInfo:
        """TokenInfo of `token_id` chosen from the log-distribution `logprobs` ((vocab,)); top-`k` alternatives."""
        text = self.tokenizer.decode([int(token_id)])
        if logprobs is None or k is None:
            return TokenInfo(int(token_id), text)
        top: list[tuple[int, str, float]] = []
        if k > 0:
            values, ids = torch.topk(logprobs, min(int(k), logprobs.shape[-1]))
            top = [(int(i), self.tokenizer.decode([int(i)]), float(v)) for v, i in zip(values, ids)]
        return TokenInfo(int(token_id), text, float(logprobs[token_id]), top)

    def _choose(self, row: _Row, logits: torch.Tensor) -> int:
        """The next token for `row` from its (vocab,) logits: argmax at temperature 0, else a seeded sample."""
        from lmlab.core.inference.generation import filter_logits

        req = row.request
        logits = penalize(logits, [t.token_id for t in row.tokens], req.frequency_penalty, req.presence_penalty)
        if req.temperature == 0:
            return int(logits.argmax())
        probs = filter_logits(logits, temperature=req.temperature, top_p=req.top_p).softmax(-1)
        if not bool(torch.isfinite(probs).all()):  # logits / a tiny temperature overflowed: its limit is greedy
            return int(logits.argmax())
        return int(torch.multinomial(probs, 1, generator=row.generator))

    def _new_row(self, handle: Handle) -> _Row:
        req = handle.request
        gen = None
        if req.temperature > 0:
            gen = torch.Generator(device="cpu")
            gen.manual_seed(int(req.seed) if req.seed is not None else random.SystemRandom().randrange(2**63))
        return _Row(handle, gen, TextStream(self.tokenizer, req.stop))

    def _prompt_infos(self, prompt: Sequence[int], logits: torch.Tensor, k: int | None) -> list[TokenInfo]:
        """Prompt tokens with their log-probs from all-position logits [L, vocab] (the first has none)."""
        lp = F.log_softmax(logits[:-1].float(), dim=-1)  # position t predicts token t + 1
        infos = [TokenInfo(int(prompt[0]), self.tokenizer.decode([int(prompt[0])]))]
        infos += [self._info(int(t), lp[i], k if k is not None else 0) for i, t in enumerate(prompt[1:])]
        return infos

    def _accept(self, row: _Row, token: int, logits: torch.Tensor) -> None:
        """Record `row`'s new token chosen from `logits` ((vocab,)); decide whether the row has finished."""
        req = row.request
        lp = F.log_softmax(logits.float(), dim=-1) if req.logprobs is not None else None
        info = self._info(token, lp, req.logprobs)
        row.tokens.append(info)
        row.pending.append(info)
        row.last = token
        self._generated += 1
        if token in self.eos:
            row.reason = "stop"
            return
        text = row.stream.push(token)
        if row.stream.stopped:
            row.reason = "stop"
        elif len(row.tokens) >= req.max_tokens:
            row.reason = "length"
        if text and row.reason is None:
            row.handle._push(Delta(req.request_id, text, row.pending))
            row.pending = []
        else:  # the final token's text goes out with the last Delta, in `_finish`
            row.held += text

    def _finish(self, row: _Row, *, reason: str | None = None, error: str | None = None) -> None:
        req = row.request
        reason = reason or row.reason or "length"
        rest = row.held + row.stream.flush() if error is None else ""
        row.held = ""
        row.handle._push(Delta(req.request_id, rest, row.pending))
        row.pending = []
        row.handle._push(
            Finished(
                req.request_id,
                row.stream.text if error is None else "",
                row.tokens,
                "error" if error else reason,
                len(req.prompt_ids),
                len(row.tokens),
                row.prompt_tokens,
                error,
            )
        )

    def _admit(self, handles: Sequence[Handle]) -> None:
        """Prefill each new request alone, pick its first token, and join it to the running batch."""
        from lmlab.core.inference.engine.batching import regroup

        joined = []
        for h in handles:
            try:
                one = self._admit_one(h)
            except Exception as e:  # noqa: BLE001 - a request that fails to start fails alone, not the batch
                logger.exception("request %s failed to start", h.request.request_id)
                if h.finished is None:
                    h._push(self._error(h, e))
                continue
            if one is not None:
                joined.append(one)
        if joined:
            parts = [(self._cache, range(len(self._rows)))] if self._rows else []
            cache = regroup(parts + [(c, [0]) for _, c in joined])
            with self._wake:
                self._cache, self._rows = cache, self._rows + [r for r, _ in joined]

    def _admit_one(self, h: Handle) -> tuple[_Row, Any] | None:
        """Prefill one new request; ``(row, its cache)`` to join the batch, None when it has already finished."""
        req, row = h.request, self._new_row(h)
        if h.cancelled.is_set():
            self._finish(row, reason="cancelled")
            return None
        cache = self.fast.new_cache(1, len(req.prompt_ids) + req.max_tokens + 1)
        tokens = torch.tensor([list(req.prompt_ids)], dtype=torch.long)
        if req.echo_logprobs:
            all_logits = self.fast.forward(tokens, cache, all_logits=True)[0]  # [L, vocab]
            row.prompt_tokens = self._prompt_infos(req.prompt_ids, all_logits, req.logprobs)
            logits = all_logits[-1]
        else:
            logits = self.fast.forward(tokens, cache)[0]  # [vocab]
        if req.max_tokens == 0:
            self._finish(row, reason="length")
            return None
        self._accept(row, self._choose(row, logits), logits)
        if row.reason is not None:
            self._finish(row)
            return None
        return row, cache

    def _step(self) -> None:
        """One batched forward for every running row, then drop the rows that finished or were cancelled."""
        rows = self._rows
        keep = [i for i, r in enumerate(rows) if not r.handle.cancelled.is_set()]
        if len(keep) < len(rows):
            for i, r in enumerate(rows):
                if i not in keep:
                    self._finish(r, reason="cancelled")
            self._regroup(keep)
            rows = self._rows
            if not rows:
                return
        feed = torch.tensor([[r.last] for r in rows], dtype=torch.long)  # [B, 1]
        logits = self.fast.forward(feed, self._cache)  # [B, vocab]
        self._steps += 1
        failed: dict[int, str] = {}
        for i, r in enumerate(rows):
            try:
                self._accept(r, self._choose(r, logits[i]), logits[i])
            except Exception as e:  # noqa: BLE001 - one row's sampler failing ends that row only
                logger.exception("request %s failed", r.request.request_id)
                failed[i] = f"{type(e).__name__}: {e}"
        done = [i for i, r in enumerate(rows) if r.reason is not None or i in failed]
        if done:
            for i in done:
                self._finish(rows[i], error=failed.get(i))
            self._regroup([i for i in range(len(rows)) if i not in done])

    def _regroup(self, keep: Sequence[int]) -> None:
        from lmlab.core.inference.engine.batching import regroup

        rows = [self._rows[i] for i in keep]
        cache = regroup([(self._cache, keep)]) if keep else None
        with self._wake:
            self._rows, self._cache = rows, cache

    def _run_alone(self, handle: Handle) -> None:
        """A request that does not batch: an lmlab strategy, or any request on the HF engine."""
        from lmlab.core.inference.generation import Stop, decode

        req, row = handle.request, self._new_row(handle)
        if handle.cancelled.is_set():
            self._finish(row, reason="cancelled")
            return
        if req.echo_logprobs:
            from lmlab.core.inference.scoring import _device

            ids = torch.tensor([list(req.prompt_ids)], dtype=torch.long, device=_device(self.model))
            with torch.no_grad():
                all_logits = self.model(input_ids=ids).logits[0].float()
            row.prompt_tokens = self._prompt_infos(req.prompt_ids, all_logits, req.logprobs)
        if req.max_tokens == 0:
            self._finish(row, reason="length")
            return
        if req.strategy is not None:
            out = req.strategy.run(self.model, self.tokenizer, req)
            for t in out.token_ids:
                info = self._info(int(t), None, None)
                row.tokens.append(info)
                row.pending.append(info)
                if row.stream.stopped:
                    break
                row.stream.push(int(t))
            self._generated += len(row.tokens)
            row.reason = "stop" if (row.stream.stopped or out.stop_reason in ("eos", "stop_string")) else "length"
            self._finish(row)
            return

        def on_step(state: Any) -> Any:
            token = state.token_id
            info = self._info(token, state.logprobs if req.logprobs is not None else None, req.logprobs)
            row.tokens.append(info)
            row.pending.append(info)
            self._generated += 1
            if state.is_eos:
                row.reason = "stop"
                return Stop("eos")
            text = row.stream.push(token)
            if row.stream.stopped:
                row.reason = "stop"
                row.held += text
                return Stop("stop_string")
            if text:
                handle._push(Delta(req.request_id, text, row.pending))
                row.pending = []
            if handle.cancelled.is_set():
                row.reason = "cancelled"
                return Stop("cancelled")
            return None

        n_prompt = len(req.prompt_ids)

        def penalties(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            # input_ids (1, prompt + generated), scores (1, vocab)
            gen = input_ids[0, n_prompt:].tolist()
            return penalize(scores, gen, req.frequency_penalty, req.presence_penalty)

        decode(
            self.model,
            self.tokenizer,
            list(req.prompt_ids),
            logits_processors=(penalties,),
            max_new_tokens=req.max_tokens,
            do_sample=req.temperature > 0,
            temperature=req.temperature if req.temperature > 0 else 1.0,
            top_p=req.top_p,
            seed=req.seed if req.seed is not None else random.SystemRandom().randrange(2**31),
            eos_token_id=sorted(self.eos) or None,
            step_callback=on_step,
            engine="hf",
        )
        self._finish(row)
