"""The HTTP layer of `lmlab serve`: OpenAI's ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models`` and
``/health`` on FastAPI, streamed with sse-starlette, in front of the continuous-batching `Scheduler`.

A request becomes one `GenRequest` per choice (``n`` choices of each prompt; choice ``i`` is seeded ``seed + i``,
the scheduler's rule), submitted at once; the handler then awaits the handles' events on the event loop (the
scheduler's worker thread delivers them with ``call_soon_threadsafe``, so nothing blocks the loop). Streaming
responses are server-sent events in OpenAI's wire format, ``data: {json}\\n\\n`` chunks ending with
``data: [DONE]\\n\\n``. A client that goes away (mid-stream, or while a plain request is pending) cancels its
handles, which frees their batch slots before the scheduler's next step.

Every error is OpenAI's JSON shape, ``{"error": {"message", "type", "param", "code"}}``, with `param` the path of
the bad field (``max_tokens``, ``messages.0.role``, ``lmlab.sigma``): pydantic validation errors and malformed JSON
are 400, an unknown model 404 ``model_not_found``, a prompt that does not fit the context 400
``context_length_exceeded``. The server keeps serving after any of them.

Usage is counted from the scheduler's exact counts: prompt tokens once per prompt (not per choice), completion
tokens summed over choices. Each response carries an id (``cmpl-...`` / ``chatcmpl-...``) and the header
``X-Request-Id``: the request's own ``X-Request-Id`` header if it sent one, else its ``user`` field, else the id.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from lmlab.core.execution.backends import render_chat
from lmlab.core.inference.scoring import encode_prompt, has_chat_template
from lmlab.serve.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChoiceDelta,
    ChoiceLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    ErrorBody,
    ErrorResponse,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from lmlab.serve.scheduler import Delta, Finished, GenRequest, TokenInfo

logger = logging.getLogger(__name__)

__all__ = ["APIError", "create_app", "serve"]

# how often a pending non-streaming request checks whether its client is still there (seconds)
DISCONNECT_POLL_S = 0.25


class APIError(Exception):
    """An error answered in OpenAI's shape (`status`, `message`, `param` = the bad field's path, `code`)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type


def _error_json(status: int, body: ErrorBody, request_id: str | None = None) -> JSONResponse:
    headers = {"X-Request-Id": request_id} if request_id else None
    return JSONResponse(ErrorResponse(error=body).model_dump(), status_code=status, headers=headers)


# ----------------------------------------------------------------------------------------------------------------
# Validation errors -> (param, message)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _body_locs(errors: Sequence[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Each error's location inside the body (FastAPI prefixes ``"body"``)."""
    locs = [tuple(e.get("loc", ())) for e in errors]
    return [loc[1:] if loc[:1] == ("body",) else loc for loc in locs]


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none", "bytes"})


def _is_union_tag(part: Any) -> bool:
    """Whether a location part names a union member (``"list[int]"``, ``"TextPart"``) rather than a field.

    Request fields are lower snake_case, pydantic's member tags are type names.
    """
    return isinstance(part, str) and (part in _TYPE_TAGS or "[" in part or "-" in part or part[:1].isupper())


def validation_param(errors: Sequence[dict[str, Any]]) -> str:
    """The field path the first pydantic error points at (``"body"`` when the body itself is bad).

    A value that fails a union (``prompt: str | list[str] | ...``) gives one error per member, whose locations
    continue with the member's name (``("body", "prompt", "list[int]", 0)``): the path stops before that name.
    """
    locs = _body_locs(errors)
    if not locs or not locs[0] or errors[0].get("type") == "json_invalid":
        return "body"
    path = []
    for part in locs[0]:
        if _is_union_tag(part):
            break
        path.append(str(part))
    return ".".join(path) or "body"


def validation_message(errors: Sequence[dict[str, Any]], param: str) -> str:
    """One line naming the bad field, the bad value and what was expected."""
    err = errors[0] if errors else {"type": "unknown", "msg": "invalid request"}
    if err.get("type") == "json_invalid":
        detail = (err.get("ctx") or {}).get("error", "invalid JSON")
        pos = tuple(err.get("loc", ()))[-1]
        return (
            f"We could not parse the JSON body of your request ({detail} at character {pos}); expected a JSON object."
        )
    if err.get("type") == "missing":
        return f"Missing required parameter: '{param}'."
    if param == "body":
        return f"The request body must be a JSON object, got {_short(err.get('input'))}."
    msg = str(err.get("msg", "invalid value"))
    depth = len(param.split("."))
    members = {
        str(loc[depth]) for loc in _body_locs(errors) if len(loc) > depth and ".".join(map(str, loc[:depth])) == param
    }
    if len(members) > 1:  # a union: name its members
        msg = f"expected one of {', '.join(sorted(members))}"
    return f"Invalid value for '{param}': {msg} (got {_short(err.get('input'))})."


# ----------------------------------------------------------------------------------------------------------------
# Tokens -> OpenAI log-prob shapes


class TokenBytes:
    """The raw UTF-8 bytes of each token id (OpenAI's ``bytes`` field), which a token's decoded text cannot give
    when the token is part of a multi-byte character (it decodes to U+FFFD).

    Byte-level BPE (GPT-2 / SmolLM2 / lmlab's tiny byte tokenizer) spells each byte as one printable character
    (`bytes_to_unicode`); SentencePiece byte fallback (Gemma) spells it ``<0xNN>`` and a space ``▁``. Any other
    token: the UTF-8 of its decoded text.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, list[int]] = {}
        self._byte_level = False
        backend = getattr(tokenizer, "backend_tokenizer", None)
        decoder = getattr(backend, "decoder", None)
        if decoder is not None and "ByteLevel" in repr(decoder):
            from transformers.convert_slow_tokenizer import bytes_to_unicode

            self._unicode_to_byte = {ch: b for b, ch in bytes_to_unicode().items()}
            self._byte_level = True

    def __call__(self, token_id: int) -> list[int]:
        token_id = int(token_id)
        if token_id not in self._cache:
            self._cache[token_id] = self._compute(token_id)
        return self._cache[token_id]

    def _compute(self, token_id: int) -> list[int]:
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        special = token_id in set(getattr(self.tokenizer, "all_special_ids", ()))
        if isinstance(piece, str) and not special:
            if self._byte_level and all(ch in self._unicode_to_byte for ch in piece):
                return [self._unicode_to_byte[ch] for ch in piece]
            if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                try:
                    return [int(piece[3:5], 16)]
                except ValueError:
                    pass
            if "\u2581" in piece:  # SentencePiece's word-boundary mark is a space
                return list(piece.replace("\u2581", " ").encode("utf-8"))
        return list(self.tokenizer.decode([token_id]).encode("utf-8"))


def completion_logprobs(tokens: Sequence[TokenInfo], offset: int) -> CompletionLogprobs:
    """Legacy completions' log-probs of `tokens`, text offsets counted from `offset` characters.

    Each ``top_logprobs`` entry holds the requested alternatives plus the chosen token (OpenAI: "up to
    logprobs + 1 elements"); a token without a log-prob (a prompt's first token) has null entries.
    """
    out = CompletionLogprobs()
    for t in tokens:
        out.tokens.append(t.text)
        out.token_logprobs.append(t.logprob)
        if t.logprob is None:
            out.top_logprobs.append(None)
        else:
            top: dict[str, float] = {}
            for _, text, lp in t.top:  # distinct ids may decode alike (U+FFFD): keep the most likely
                top.setdefault(text, lp)
            top.setdefault(t.text, t.logprob)
            out.top_logprobs.append(top)
        out.text_offset.append(offset)
        offset += len(t.text)
    return out


def chat_logprobs(tokens: Sequence[TokenInfo], token_bytes: TokenBytes) -> list[TokenLogprob]:
    return [
        TokenLogprob(
            token=t.text,
            logprob=float(t.logprob),  # None (a strategy's tokens) is refused before submitting
            bytes=token_bytes(t.token_id),
            top_logprobs=[TopLogprob(token=s, logprob=lp, bytes=token_bytes(i)) for i, s, lp in t.top],
        )
        for t in tokens
    ]


# ----------------------------------------------------------------------------------------------------------------
# Jobs: the submitted choices of one HTTP request


@dataclass
class _Job:
    index: int  # OpenAI's choice index: prompt_index * n + choice
    prompt_index: int
    handle: Any  # lmlab.serve.scheduler.Handle
    prompt_text: str = ""


async def _merge(jobs: Sequence[_Job]) -> AsyncIterator[tuple[_Job, Delta | Finished]]:
    """Every job's events as they come, until each has finished (one pump task per handle)."""
    if len(jobs) == 1:
        async with aclosing(jobs[0].handle.events()) as events:
            async for ev in events:
                yield jobs[0], ev
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(job: _Job) -> None:
        try:
            async with aclosing(job.handle.events()) as events:
                async for ev in events:
                    await queue.put((job, ev))
        except Exception as e:  # noqa: BLE001 - re-raised by the consumer below
            await queue.put((job, e))

    tasks = [asyncio.create_task(pump(j)) for j in jobs]
    remaining = len(jobs)
    try:
        while remaining:
            job, ev = await queue.get()
            if isinstance(ev, Exception):
                raise ev
            yield job, ev
            if isinstance(ev, Finished):
                remaining -= 1
    finally:
        for t in tasks:
            t.cancel()


async def _finish_all(jobs: Sequence[_Job], request: Request) -> list[Finished]:
    """Each job's `Finished`, in job order; raises `_ClientGone` once the client has disconnected."""
    finished: dict[int, Finished] = {}

    async def collect() -> None:
        async with aclosing(_merge(jobs)) as events:
            async for job, ev in events:
                if isinstance(ev, Finished):
                    finished[job.index] = ev

    task = asyncio.ensure_future(collect())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                task.result()
                return [finished[j.index] for j in jobs]
            if await request.is_disconnected():
                raise _ClientGone()
    finally:
        if not task.done():
            task.cancel()


class _ClientGone(Exception):
    pass


async def _finish_or_cancel(jobs: Sequence[_Job], request: Request) -> list[Finished] | None:
    """`_finish_all`, cancelling the jobs when the client went away (then None) or the handler was cancelled; a
    request the engine failed on raises its `APIError` (500)."""
    try:
        finished = await _finish_all(jobs, request)
    except _ClientGone:
        _cancel(jobs)
        return None
    except BaseException:
        _cancel(jobs)
        raise
    err = _engine_error(finished)
    if err is not None:
        raise err
    return finished


def _client_gone() -> JSONResponse:
    return _error_json(400, ErrorBody(message="the client disconnected before the answer was ready"))


def _cancel(jobs: Sequence[_Job]) -> None:
    for j in jobs:
        j.handle.cancel()  # a no-op on a finished request


def _engine_error(finished: Sequence[Finished]) -> APIError | None:
    for f in finished:
        if f.error:
            return APIError(500, f"generation failed: {f.error}", type="server_error")
    return None


def _usage(jobs: Sequence[_Job], finished: Sequence[Finished]) -> Usage:
    """Prompt tokens once per prompt (its first choice's count), completion tokens summed over all choices."""
    prompt: dict[int, int] = {}
    for j, f in zip(jobs, finished):
        prompt.setdefault(j.prompt_index, f.n_prompt_tokens)
    p, c = sum(prompt.values()), sum(f.n_completion_tokens for f in finished)
    return Usage(prompt_tokens=p, completion_tokens=c, total_tokens=p + c)


def _sse(model: Any, **dump: Any) -> dict[str, str]:
    return {"data": json.dumps(model.model_dump(mode="json", **dump), ensure_ascii=False)}


def _sse_error(e: APIError) -> dict[str, str]:
    body = ErrorBody(message=e.message, type=e.type, param=e.param, code=e.code)
    return {"data": json.dumps(ErrorResponse(error=body).model_dump(), ensure_ascii=False)}


# ----------------------------------------------------------------------------------------------------------------
# The application


def create_app(
    scheduler: Any,
    tokenizer: Any,
    *,
    served_name: str,
    default_strategy: dict[str, Any] | None = None,
) -> FastAPI:
    """The FastAPI app serving `scheduler` (a `lmlab.serve.scheduler.Scheduler` or anything with its contract).

    Args:
        scheduler: owns the model; `submit(GenRequest) -> Handle`, `stats()`, `max_context`.
        tokenizer: the model's tokenizer (prompts are tokenized and chat templates applied here).
        served_name (`str`): the model's name in ``/v1/models``; requests must name it (or ``"default"``).
        default_strategy (`dict`, *optional*): the ``lmlab`` object used by requests that send none, e.g.
            ``{"strategy": "reflection_window", "sigma": 0.5}``; checked now (ValueError naming the field).
    """
    from lmlab.serve.strategies import StrategyError, parse_strategy

    if default_strategy is not None:
        try:
            parse_strategy(None, default_strategy)
        except StrategyError as e:
            raise ValueError(f"default strategy: {e.param} {e.message}") from None
    app = FastAPI(title="lmlab serve", docs_url=None, redoc_url=None)
    token_bytes = TokenBytes(tokenizer)
    created_at = int(time.time())
    max_context = int(getattr(scheduler, "max_context", 4096))

    # --- errors --------------------------------------------------------------------------------------------------

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        body = ErrorBody(message=exc.message, type=exc.type, param=exc.param, code=exc.code)
        return _error_json(exc.status, body, request.headers.get("x-request-id"))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        param = validation_param(errors)
        body = ErrorBody(message=validation_message(errors, param), param=param)
        return _error_json(400, body, request.headers.get("x-request-id"))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 404:
            message = f"Unknown request URL: {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"Method {request.method} is not allowed on {request.url.path}"
        return _error_json(exc.status_code, ErrorBody(message=message), request.headers.get("x-request-id"))

    @app.exception_handler(Exception)
    async def _server_error(request: Request, exc: Exception) -> JSONResponse:
        # Starlette re-raises after this response, so uvicorn logs the traceback once
        body = ErrorBody(message=f"{type(exc).__name__}: {exc}", type="server_error")
        return _error_json(500, body, request.headers.get("x-request-id"))

    # --- shared steps --------------------------------------------------------------------------------------------

    def check_model(name: str) -> None:
        if name not in (served_name, "default"):
            raise APIError(
                404,
                f"The model {name!r} does not exist; this server serves {served_name!r} (or use 'default').",
                param="model",
                code="model_not_found",
            )

    def strategy_of(obj: dict[str, Any] | None) -> Any:
        try:
            return parse_strategy(obj, default_strategy)
        except StrategyError as e:
            raise APIError(400, f"Invalid value for '{e.param}': {e.message}", param=e.param) from None

    def budget(n_prompt: int, max_tokens: int | None, *, prompt_param: str, tokens_param: str) -> int:
        """The generation budget of a prompt of `n_prompt` tokens (None: up to the context limit)."""
        if n_prompt >= max_context:
            raise APIError(
                400,
                f"The prompt has {n_prompt} tokens; this model's context limit is {max_context} tokens "
                f"(prompt + completion), so at most {max_context - 1} prompt tokens fit.",
                param=prompt_param,
                code="context_length_exceeded",
            )
        if max_tokens is None:
            return max_context - n_prompt
        if n_prompt + max_tokens > max_context:
            raise APIError(
                400,
                f"The prompt ({n_prompt} tokens) + {tokens_param} ({max_tokens}) = {n_prompt + max_tokens} exceeds "
                f"this model's context limit of {max_context} tokens; lower {tokens_param} to at most "
                f"{max_context - n_prompt}.",
                param=tokens_param,
                code="context_length_exceeded",
            )
        return max_tokens

    def submit(
        body: CompletionRequest | ChatCompletionRequest,
        prompts: Sequence[tuple[list[int], str, int]],
        *,
        logprobs: int | None,
        echo_logprobs: bool,
        strategy: Any,
        id_: str,
        prompt_param: str,
    ) -> list[_Job]:
        """One `GenRequest` per choice of each ``(ids, text, max_tokens)`` prompt, with the body's sampling fields
        (n, temperature, top_p, penalties, seed, stop; OpenAI's defaults where unset); choice ``i`` seeded seed + i."""
        n, seed, stop = body.n, body.seed, stops(body.stop)
        temperature = 1.0 if body.temperature is None else body.temperature
        top_p = 1.0 if body.top_p is None else body.top_p
        penalties = penalties_of(body, strategy)
        requests, jobs = [], []
        for p, (ids, text, max_tokens) in enumerate(prompts):
            for i in range(n):
                requests.append(
                    GenRequest(
                        prompt_ids=list(ids),
                        max_tokens=max_tokens,
                        temperature=temperature,
                        top_p=top_p,
                        frequency_penalty=penalties[0],
                        presence_penalty=penalties[1],
                        seed=None if seed is None else seed + i,
                        stop=list(stop),
                        logprobs=logprobs,
                        echo_logprobs=echo_logprobs,
                        strategy=strategy,
                        request_id=f"{id_}-{p}-{i}",
                    )
                )
                jobs.append(_Job(index=p * n + i, prompt_index=p, handle=None, prompt_text=text))
        handles = []
        try:
            for r in requests:
                handles.append(scheduler.submit(r))
        except ValueError as e:  # the scheduler's own checks (token ids outside the vocabulary, ...)
            for h in handles:
                h.cancel()
            raise APIError(400, f"Invalid value for '{prompt_param}': {e}", param=prompt_param) from None
        for j, h in zip(jobs, handles):
            j.handle = h
        return jobs

    def penalties_of(body: Any, strategy: Any) -> tuple[float, float]:
        """OpenAI's ``(frequency_penalty, presence_penalty)``; an lmlab strategy's own decoder applies neither."""
        fp, pp = float(body.frequency_penalty or 0.0), float(body.presence_penalty or 0.0)
        if strategy is not None:
            for name, value in (("frequency_penalty", fp), ("presence_penalty", pp)):
                if value:
                    raise APIError(400, f"an lmlab strategy does not apply '{name}'; drop it (got {value})",
                                   param=name)  # fmt: skip
        return fp, pp

    def stops(stop: str | list[str] | None) -> list[str]:
        return [stop] if isinstance(stop, str) else list(stop or [])

    def reply_id(request: Request, user: str | None, id_: str) -> str:
        return request.headers.get("x-request-id") or user or id_

    # --- routes --------------------------------------------------------------------------------------------------

    @app.get("/health")
    async def health() -> dict[str, Any]:
        stats = dict(scheduler.stats())
        return {"status": "ok", "model": served_name, "engine": stats.get("engine"), **stats}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": served_name, "object": "model", "created": created_at, "owned_by": "lmlab"}],
        }

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        check_model(body.model)
        strategy = strategy_of(body.lmlab)
        if strategy is not None and body.logprobs is not None:
            raise APIError(400, "an lmlab strategy does not report per-token log-probs; drop 'logprobs'",
                           param="logprobs")  # fmt: skip
        echo_logprobs = body.echo and body.logprobs is not None
        if body.stream and echo_logprobs:
            raise APIError(
                400, "echo with logprobs is not supported with stream=true (the prompt's log-probs come with the "
                "finished request); use stream=false", param="echo"
            )  # fmt: skip
        prompts = []
        items = _completion_prompts(tokenizer, body.prompt)
        for k, (ids, text) in enumerate(items):
            param = "prompt" if len(items) == 1 else f"prompt.{k}"
            n_tok = budget(len(ids), body.max_tokens, prompt_param=param, tokens_param="max_tokens")
            prompts.append((ids, text, n_tok))
        id_ = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        headers = {"X-Request-Id": reply_id(request, body.user, id_)}
        jobs = submit(
            body,
            prompts,
            logprobs=body.logprobs,
            echo_logprobs=echo_logprobs,
            strategy=strategy,
            id_=id_,
            prompt_param="prompt",
        )
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            gen = _stream_completions(jobs, id_, created, body.model, body.echo, body.logprobs, include_usage)
            return EventSourceResponse(gen, sep="\n", headers=headers)
        finished = await _finish_or_cancel(jobs, request)
        if finished is None:
            return _client_gone()
        choices = []
        for j, f in zip(jobs, finished):
            text = (j.prompt_text + f.text) if body.echo else f.text
            lp = None
            if body.logprobs is not None:
                toks = list(f.prompt_tokens or []) + list(f.tokens) if body.echo else list(f.tokens)
                lp = completion_logprobs(toks, 0 if body.echo else len(j.prompt_text))
            choices.append(CompletionChoice(index=j.index, text=text, logprobs=lp, finish_reason=f.finish_reason))
        resp = CompletionResponse(
            id=id_, created=created, model=body.model, choices=choices, usage=_usage(jobs, finished)
        )
        return JSONResponse(resp.model_dump(mode="json"), headers=headers)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        check_model(body.model)
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "Invalid value for 'top_logprobs': it requires logprobs=true", param="top_logprobs")
        strategy = strategy_of(body.lmlab)
        if strategy is not None and body.logprobs:
            raise APIError(400, "an lmlab strategy does not report per-token log-probs; drop 'logprobs'",
                           param="logprobs")  # fmt: skip
        ids = _chat_ids(tokenizer, body)
        tokens_param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        want = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        n_tok = budget(len(ids), want, prompt_param="messages", tokens_param=tokens_param)
        id_ = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        headers = {"X-Request-Id": reply_id(request, body.user, id_)}
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        jobs = submit(
            body,
            [(ids, "", n_tok)],
            logprobs=logprobs,
            echo_logprobs=False,
            strategy=strategy,
            id_=id_,
            prompt_param="messages",
        )
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            gen = _stream_chat(jobs, id_, created, body.model, body.logprobs, include_usage, token_bytes)
            return EventSourceResponse(gen, sep="\n", headers=headers)
        finished = await _finish_or_cancel(jobs, request)
        if finished is None:
            return _client_gone()
        choices = [
            ChatChoice(
                index=j.index,
                message=AssistantMessage(content=f.text),
                logprobs=ChoiceLogprobs(content=chat_logprobs(f.tokens, token_bytes)) if body.logprobs else None,
                finish_reason=f.finish_reason,
            )
            for j, f in zip(jobs, finished)
        ]
        resp = ChatCompletionResponse(
            id=id_, created=created, model=body.model, choices=choices, usage=_usage(jobs, finished)
        )
        return JSONResponse(resp.model_dump(mode="json"), headers=headers)

    return app


# ----------------------------------------------------------------------------------------------------------------
# Prompts


def _completion_prompts(tokenizer: Any, prompt: Any) -> list[tuple[list[int], str]]:
    """``(ids, text)`` per prompt of a completions request (a string, strings, token ids or token-id lists).

    An empty prompt starts a new document: it is the BOS token (EOS where there is none), as OpenAI generates
    "as if from the beginning of a new document" and lm-eval's rolling log-likelihood does.
    """
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif prompt and all(isinstance(x, int) for x in prompt):
        items = [list(prompt)]
    else:
        items = list(prompt)
    if not items:
        raise APIError(400, "Invalid value for 'prompt': expected a string or a non-empty list", param="prompt")
    out = []
    for item in items:
        if isinstance(item, str):
            ids, text = encode_prompt(tokenizer, item), item
        else:
            ids, text = [int(t) for t in item], tokenizer.decode([int(t) for t in item])
        if not ids:
            start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
            ids = [int(start)]
        out.append((ids, text))
    return out


def _chat_ids(tokenizer: Any, body: ChatCompletionRequest) -> list[int]:
    """The prompt ids of a chat: the model's chat template with the generation prompt (``developer`` is read as
    ``system``); a model without a template gets `lmlab.core.inference.scoring.chat_prompt`'s plain Question/Answer
    form."""
    messages = []
    for i, m in enumerate(body.messages):
        content = m.content
        if isinstance(content, list):
            for j, part in enumerate(content):
                if part.type != "text" or part.text is None:
                    raise APIError(
                        400,
                        f"Invalid value for 'messages.{i}.content.{j}.type': only text parts are supported, "
                        f"got {part.type!r}",
                        param=f"messages.{i}.content.{j}.type",
                    )
            content = "".join(part.text or "" for part in content)
        messages.append({"role": "system" if m.role == "developer" else m.role, "content": content or ""})
    if not has_chat_template(tokenizer) and messages[-1]["role"] != "user":
        raise APIError(
            400,
            f"Invalid value for 'messages.{len(messages) - 1}.role': this model has no chat template, so the "
            f"last message must be the user's, got {messages[-1]['role']!r}",
            param=f"messages.{len(messages) - 1}.role",
        )
    try:  # the same rules as `lmlab.core.execution.backends.LocalBackend`, so both sides of the API see one prompt
        text = render_chat(tokenizer, messages)
    except Exception as e:  # noqa: BLE001 - a template's own refusal (e.g. roles must alternate)
        raise APIError(400, f"Invalid value for 'messages': the chat template failed: {e}",
                       param="messages") from None  # fmt: skip
    return encode_prompt(tokenizer, text)


# ----------------------------------------------------------------------------------------------------------------
# Streams (server-sent events)


async def _pieces(jobs: Sequence[_Job]) -> AsyncIterator[tuple[_Job, str, list[TokenInfo], Finished | None]]:
    """``(job, new text, new tokens, None)`` per `Delta`, then ``(job, rest, rest of the tokens, finished)``.

    The final piece carries whatever part of `Finished.text` / `Finished.tokens` the deltas did not, so a streamed
    answer always joins to the non-streamed one (the deltas are meant to cover it exactly; this does not rely on
    it).
    """
    sent_text = {j.index: "" for j in jobs}
    sent_tokens = {j.index: 0 for j in jobs}
    async with aclosing(_merge(jobs)) as events:
        async for job, ev in events:
            if isinstance(ev, Delta):
                sent_text[job.index] += ev.text
                sent_tokens[job.index] += len(ev.tokens)
                yield job, ev.text, list(ev.tokens), None
                continue
            sent = sent_text[job.index]
            if ev.error is None and not ev.text.startswith(sent):
                logger.warning("request %s: streamed text %r is not a prefix of its final text", ev.request_id, sent)
            rest = ev.text[len(sent) :] if ev.text.startswith(sent) else ""
            yield job, rest, list(ev.tokens[sent_tokens[job.index] :]), ev


async def _stream_completions(
    jobs: Sequence[_Job],
    id_: str,
    created: int,
    model: str,
    echo: bool,
    logprobs: int | None,
    include_usage: bool,
) -> AsyncIterator[dict[str, str]]:
    offsets = {j.index: (0 if echo else len(j.prompt_text)) for j in jobs}

    def chunk(index: int, text: str, tokens: Sequence[TokenInfo], reason: str | None = None) -> dict[str, str]:
        lp = None
        if logprobs is not None:
            lp = completion_logprobs(tokens, offsets[index])
            offsets[index] += sum(len(t.text) for t in tokens)
        choice = CompletionChoice(index=index, text=text, logprobs=lp, finish_reason=reason)
        return _sse(CompletionResponse(id=id_, created=created, model=model, choices=[choice]))

    finished: dict[int, Finished] = {}
    try:
        if echo:
            for j in jobs:
                choice = CompletionChoice(index=j.index, text=j.prompt_text)
                yield _sse(CompletionResponse(id=id_, created=created, model=model, choices=[choice]))
        async with aclosing(_pieces(jobs)) as pieces:
            async for job, text, tokens, fin in pieces:
                if fin is not None and fin.error:
                    yield _sse_error(APIError(500, f"generation failed: {fin.error}", type="server_error"))
                    return
                if text or (logprobs is not None and tokens):
                    yield chunk(job.index, text, tokens)
                if fin is not None:
                    finished[job.index] = fin
                    yield chunk(job.index, "", [], fin.finish_reason)
        if include_usage:
            usage = _usage(jobs, [finished[j.index] for j in jobs])
            yield _sse(CompletionResponse(id=id_, created=created, model=model, choices=[], usage=usage))
        yield {"data": "[DONE]"}
    finally:  # also on a client that went away (sse-starlette cancels this generator): free the batch slots
        _cancel(jobs)


async def _stream_chat(
    jobs: Sequence[_Job],
    id_: str,
    created: int,
    model: str,
    logprobs: bool,
    include_usage: bool,
    token_bytes: TokenBytes,
) -> AsyncIterator[dict[str, str]]:
    def chunk(index: int, delta: ChoiceDelta, tokens: Sequence[TokenInfo] = (), reason: str | None = None) -> Any:
        lp = ChoiceLogprobs(content=chat_logprobs(tokens, token_bytes)) if logprobs and tokens else None
        choice = ChatChunkChoice(index=index, delta=delta, logprobs=lp, finish_reason=reason)
        # exclude_none: OpenAI sends the last chunk's delta as {} and omits absent fields
        return _sse(ChatCompletionChunk(id=id_, created=created, model=model, choices=[choice]), exclude_none=True)

    finished: dict[int, Finished] = {}
    try:
        for j in jobs:
            yield chunk(j.index, ChoiceDelta(role="assistant", content=""))
        async with aclosing(_pieces(jobs)) as pieces:
            async for job, text, tokens, fin in pieces:
                if fin is not None and fin.error:
                    yield _sse_error(APIError(500, f"generation failed: {fin.error}", type="server_error"))
                    return
                if text or (logprobs and tokens):
                    yield chunk(job.index, ChoiceDelta(content=text), tokens)
                if fin is not None:
                    finished[job.index] = fin
                    yield chunk(job.index, ChoiceDelta(), (), fin.finish_reason)
        if include_usage:
            usage = _usage(jobs, [finished[j.index] for j in jobs])
            yield _sse(ChatCompletionChunk(id=id_, created=created, model=model, choices=[], usage=usage))
        yield {"data": "[DONE]"}
    finally:  # also on a client that went away (sse-starlette cancels this generator): free the batch slots
        _cancel(jobs)


# ----------------------------------------------------------------------------------------------------------------
# `lmlab serve`


def serve(
    model_spec: str,
    *,
    engine: str = "fast",
    host: str = "127.0.0.1",
    port: int = 8000,
    max_batch: int = 8,
    max_context: int | None = None,
    strategy: dict[str, Any] | None = None,
    served_name: str | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    threads: int | None = None,
    log_level: str = "info",
) -> None:
    """Load `model_spec` (`lmlab.core.inference.models.load_model`), start its `Scheduler` and serve it with uvicorn
    until
    interrupted.

    Args:
        model_spec (`str`): alias, HF folder or GGUF file (see ``lmlab models``).
        engine (`str`, defaults to ``"fast"``): ``fast``, ``fast-int4`` (batched, continuous) or ``hf``.
        max_batch (`int`, defaults to 8): most sequences decoded together.
        max_context (`int`, *optional*): longest prompt + completion; default the model's
            ``max_position_embeddings`` capped at 4096. Larger than the model's positions is refused.
        strategy (`dict`, *optional*): the default ``lmlab`` object of requests that send none.
        served_name (`str`, *optional*): the name in ``/v1/models`` (default `model_spec`).
    """
    import uvicorn

    from lmlab.core.inference.models import load_model
    from lmlab.serve.scheduler import Scheduler

    model, tokenizer = load_model(model_spec, dtype=dtype, device=device, threads=threads)
    positions = int(getattr(model.config, "max_position_embeddings", 4096) or 4096)
    if max_context is None:
        max_context = min(positions, 4096)
    elif not 2 <= max_context <= positions:
        raise ValueError(f"--max-context must be in [2, {positions}] (the model's positions), got {max_context}")
    scheduler = Scheduler(model, tokenizer, engine=engine, max_batch=max_batch, max_context=max_context)
    try:
        app = create_app(scheduler, tokenizer, served_name=served_name or model_spec, default_strategy=strategy)
        logger.info("serving %s (%s engine) on http://%s:%d/v1", served_name or model_spec, engine, host, port)
        uvicorn.run(app, host=host, port=port, log_level=log_level)
    finally:
        scheduler.close()
