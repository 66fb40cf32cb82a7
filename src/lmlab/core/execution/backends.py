"""Text-in / text-out backends: one interface over a local model and over any OpenAI-compatible server.

Methods that need an LLM only as text in, text out (API-only methods, judges, routers) call it through three
methods, the ones every OpenAI-compatible server offers:

- ``generate(prompt, ...) -> list[Completion]``: ``POST /v1/completions`` (``n`` choices of one prompt);
- ``chat(messages, ...) -> Completion``: ``POST /v1/chat/completions`` (the model's chat template);
- ``score(context, continuation) -> list[float]``: log p of each continuation token given the context, lm-eval's
  ``loglikelihood`` recipe over the API (``/v1/completions`` with ``echo=True, logprobs=0, max_tokens=0``: the
  server scores the prompt and generates nothing). A server that cannot echo prompt log-probs (OpenAI's chat-only
  models) raises `BackendUnsupported`.

`LocalBackend` runs them on a loaded model (`lmlab.core.inference.generation.decode`, `lmlab.core.inference.scoring`);
`OpenAIBackend`
sends them with the official `openai` client. At temperature 0 the two give the same text, and their log-probs agree
to float precision, when the server runs the same model (`lmlab serve`; tested end to end on loopback). Sampled
text (temperature > 0) is reproducible per backend with a seed, not across backends: each has its own sampler.

Log-probs are always those of the model's raw distribution (temperature 1, before any penalty), as `decode` records
them and as vLLM / `lmlab serve` return them.

Backends are named by a spec (`parse_backend`, `make_backend`, ``lmlab run --backend``):

- ``openai:http://HOST:PORT/v1`` or ``openai:http://HOST:PORT/v1#MODEL`` (the served model name; default
  ``default``, which `lmlab serve` accepts), the key read from ``$OPENAI_API_KEY`` (``"EMPTY"`` when unset: local
  servers want none);
- ``local:ALIAS_OR_FOLDER`` or a bare alias / folder (anything `lmlab.core.inference.models.load_model` reads).

Nothing here imports torch, transformers or openai at module level: `parse_backend` is cheap enough for the CLI.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urldefrag, urlsplit

from lmlab.errors import LmlabError

__all__ = [
    "BACKEND_FORMS",
    "BackendError",
    "BackendHTTPError",
    "BackendUnsupported",
    "Completion",
    "FrequencyPenalty",
    "LocalBackend",
    "OpenAIBackend",
    "TextBackend",
    "continuation_span",
    "make_backend",
    "parse_backend",
    "render_chat",
]

BACKEND_FORMS = "openai:http(s)://HOST[:PORT]/PATH[#MODEL], local:ALIAS_OR_FOLDER, or a bare model alias / folder"
CHAT_ROLES = ("system", "developer", "user", "assistant")


class BackendError(LmlabError, RuntimeError):
    """A backend call failed (connection refused, an HTTP error, an unreadable answer); one line naming the URL."""


class BackendHTTPError(BackendError):
    """The server answered an HTTP error (after the client's retries); `status_code`, and the `param` (the field)
    and `code` of an OpenAI-style error body, are kept for callers that tell cases apart."""

    def __init__(self, message: str, status_code: int, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status_code, self.param, self.code = int(status_code), param, code


class BackendUnsupported(BackendError):
    """The backend cannot do what was asked (e.g. score: the server does not echo prompt log-probs)."""


@dataclass
class Completion:
    """One generated answer.

    Attributes:
        text (`str`): the generated text (stop strings cut off, special tokens dropped).
        token_ids (`list[int]`, *optional*): the generated token ids (None: the backend does not report them, as
            the OpenAI API does not).
        token_logprobs (`list[float]`, *optional*): log p of each generated token under the raw distribution
            (None: not asked for, or the server did not return them).
        finish_reason (`str`): ``"stop"`` (EOS or a stop string) or ``"length"`` (`max_tokens` reached), OpenAI's.
        n_prompt_tokens (`int`): prompt tokens (after the chat template).
        n_completion_tokens (`int`): generated tokens of this answer.
    """

    text: str
    token_ids: list[int] | None = None
    token_logprobs: list[float] | None = None
    finish_reason: str = "stop"
    n_prompt_tokens: int = 0
    n_completion_tokens: int = 0


@runtime_checkable
class TextBackend(Protocol):
    """What an API-only method needs from an LLM (module docstring). Implementations: `LocalBackend`,
    `OpenAIBackend`."""

    name: str

    def generate(
        self,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] = (),
        seed: int | None = None,
        n: int = 1,
        logprobs: bool = False,
    ) -> list[Completion]: ...

    def chat(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] = (),
        seed: int | None = None,
        logprobs: bool = False,
        frequency_penalty: float = 0.0,
    ) -> Completion: ...

    def score(self, context: str, continuation: str) -> list[float]: ...


# ----------------------------------------------------------------------------------------------------------------
# Request checks shared by both backends (bad input fails before any model call or network request)


def _check_sampling(
    *,
    max_tokens: int | None,
    temperature: float,
    top_p: float,
    stop: str | Sequence[str],
    seed: int | None,
    n: int = 1,
    frequency_penalty: float = 0.0,
) -> list[str]:
    """Raise ValueError naming the bad argument; return `stop` as a list."""
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0):
        raise ValueError(f"max_tokens must be an integer >= 0, got {max_tokens!r}")
    if not isinstance(temperature, int | float) or not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature!r}")
    if not isinstance(top_p, int | float) or not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"seed must be an integer or None, got {seed!r}")
    # OpenAI's range: "Number between -2.0 and 2.0"
    if not isinstance(frequency_penalty, int | float) or not -2.0 <= frequency_penalty <= 2.0:
        raise ValueError(f"frequency_penalty must be in [-2, 2], got {frequency_penalty!r}")
    stops = [stop] if isinstance(stop, str) else list(stop)
    bad = [s for s in stops if not isinstance(s, str) or not s]
    if bad:
        raise ValueError(f"stop strings must be non-empty strings, got {bad[0]!r}")
    return stops


def _check_generate(prompt: str, **sampling: Any) -> list[str]:
    """`generate`'s argument checks (`_check_sampling` plus the prompt and a required `max_tokens`); the stop list."""
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be a string, got {type(prompt).__name__}")
    if sampling["max_tokens"] is None:
        raise ValueError("max_tokens must be an integer >= 0 for generate, got None")
    return _check_sampling(**sampling)


def _check_chat(messages: Sequence[Mapping[str, str]], **sampling: Any) -> tuple[list[dict[str, str]], list[str]]:
    """`chat`'s argument checks: the messages as plain dicts (`_check_messages`) and the stop list."""
    return _check_messages(messages), _check_sampling(**sampling)


def _check_messages(messages: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
    """The messages as plain ``{"role", "content"}`` dicts; ValueError naming the first bad one."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise ValueError(f"messages must be a non-empty list of {{'role', 'content'}} dicts, got {messages!r:.80}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {m!r:.80}")
        if m["role"] not in CHAT_ROLES:
            raise ValueError(f"messages[{i}]['role'] must be one of {', '.join(CHAT_ROLES)}, got {m['role']!r}")
        if not isinstance(m["content"], str):
            raise ValueError(f"messages[{i}]['content'] must be a string, got {type(m['content']).__name__}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def _check_pair(context: str, continuation: str) -> None:
    if not isinstance(context, str) or not isinstance(continuation, str):
        raise ValueError(f"context and continuation must be strings, got {type(context).__name__} and "
                         f"{type(continuation).__name__}")  # fmt: skip
    if not context:
        raise ValueError("context is empty: score needs at least one context character to predict the first "
                         "continuation token from")  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# Local model


def render_chat(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> str:
    """The prompt text of a chat: the tokenizer's chat template with the generation prompt.

    ``developer`` is read as ``system`` (OpenAI's newer name). A tokenizer without a template (a base model such as
    Gemma-3-270M) gets `lmlab.core.inference.scoring.chat_prompt`'s plain Question/Answer form: system turns joined,
    the
    other turns as history, and the last turn, which must be the user's, as the question. These are `lmlab serve`'s
    rules, so a `LocalBackend` and an `OpenAIBackend` in front of the same model see the same prompt.
    """
    from lmlab.core.inference.scoring import chat_prompt, has_chat_template

    msgs = [{"role": "system" if m["role"] == "developer" else m["role"], "content": m["content"]} for m in messages]
    if has_chat_template(tokenizer):
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    if msgs[-1]["role"] != "user":
        raise ValueError(f"messages[-1]['role'] must be 'user' for a model without a chat template, got "
                         f"{msgs[-1]['role']!r}")  # fmt: skip
    system = "\n".join(m["content"] for m in msgs if m["role"] == "system") or None
    history = [m for m in msgs[:-1] if m["role"] != "system"]
    return chat_prompt(tokenizer, msgs[-1]["content"], system=system, history=history)


class FrequencyPenalty:
    """OpenAI's frequency penalty as a logits processor: ``logit[v] -= penalty * count(v in the tokens generated so
    far)`` (the prompt's tokens are not counted; OpenAI: "how often the token was sampled prior to the current
    position").

    Args:
        penalty (`float`): OpenAI's ``frequency_penalty``, in [-2, 2] (negative values favour repetition).
        prompt_len (`int`): the prompt's token count; `input_ids` positions from there on are the generated ones.
    """

    def __init__(self, penalty: float, prompt_len: int) -> None:
        self.penalty, self.prompt_len = float(penalty), int(prompt_len)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        # input_ids (batch, seq) long: prompt + generated so far; scores (batch, vocab)
        import torch

        from lmlab.core.inference.generation import penalize

        rows = [
            penalize(scores[i], input_ids[i, self.prompt_len :].tolist(), self.penalty, 0.0)
            for i in range(len(scores))
        ]
        return torch.stack(rows)  # (batch, vocab)


_FINISH = {"eos": "stop", "stop_string": "stop", "max_new_tokens": "length"}


class LocalBackend:
    """A loaded Hugging Face causal LM behind the `TextBackend` interface.

    generate / chat decode with `lmlab.core.inference.generation.decode` (greedy at temperature 0, else sampled with
    temperature and top-p; choice ``i`` of ``n`` seeded ``seed + i``, `lmlab serve`'s rule); score is
    `lmlab.core.inference.scoring.continuation_logprobs` with `split_pair`'s boundary rule (a token merged across the
    boundary belongs to the continuation).

    Args:
        model, tokenizer: a causal LM and its tokenizer (e.g. from `lmlab.core.inference.models.load_model`).
        engine (`str`, *optional*): `decode`'s engine (``"fast"``, ``"fast-int4"``, ``"hf"``; None: the default).
        name (`str`, *optional*): the backend's name in traces (default ``local:<model spec>``).
        meter (`ComputeMeter`, *optional*), meter_name (`str`, *optional*): count the decodes' forwards.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        engine: str | None = None,
        *,
        name: str | None = None,
        meter: Any = None,
        meter_name: str | None = None,
    ) -> None:
        self.model, self.tokenizer, self.engine = model, tokenizer, engine
        self.name = name or f"local:{getattr(model, 'lmlab_spec', None) or type(model).__name__}"
        self.meter, self.meter_name = meter, meter_name

    def _prompt_ids(self, text: str) -> list[int]:
        from lmlab.core.inference.scoring import encode_prompt

        ids = encode_prompt(self.tokenizer, text)
        if not ids:  # an empty prompt starts a new document (OpenAI; `lmlab serve` does the same)
            tok = self.tokenizer
            ids = [int(tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id)]
        return ids

    def _decode(
        self,
        ids: list[int],
        *,
        max_tokens: int | None,
        temperature: float,
        top_p: float,
        stop: list[str],
        seed: int | None,
        logprobs: bool,
        frequency_penalty: float,
    ) -> Completion:
        from lmlab.core.inference.generation import decode

        if max_tokens is None:  # until EOS, bounded by the model's context (the server's rule)
            limit = int(getattr(self.model.config, "max_position_embeddings", 2048))
            max_tokens = max(0, limit - len(ids))
        procs = [FrequencyPenalty(frequency_penalty, len(ids))] if frequency_penalty else []
        out = decode(
            self.model,
            self.tokenizer,
            ids,
            max_new_tokens=max_tokens,
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else 1.0,
            top_p=top_p,
            logits_processors=procs,
            stop_strings=stop,
            seed=seed,
            meter=self.meter,
            meter_name=self.meter_name,
            engine=self.engine,
        )
        return Completion(
            text=out.text,
            token_ids=list(out.token_ids),
            token_logprobs=list(out.token_logprobs) if logprobs else None,
            finish_reason=_FINISH.get(out.stop_reason, "stop"),
            n_prompt_tokens=len(ids),
            n_completion_tokens=len(out.token_ids),
        )

    def _seeds(self, seed: int | None, n: int, temperature: float) -> list[int | None]:
        if temperature > 0 and seed is None:
            import torch

            # unseeded sampling: a base seed from torch's global generator (so `set_seed` still fixes the run);
            # `decode` would otherwise use seed 0 for every choice and return n copies of one sample
            seed = int(torch.randint(0, 2**31 - 1, ()))
        return [None if seed is None else seed + i for i in range(n)]

    def generate(
        self,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] = (),
        seed: int | None = None,
        n: int = 1,
        logprobs: bool = False,
    ) -> list[Completion]:
        stops = _check_generate(prompt, max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=stop,
                                seed=seed, n=n)  # fmt: skip
        ids = self._prompt_ids(prompt)
        return [
            self._decode(
                ids,
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=top_p,
                stop=stops,
                seed=s,
                logprobs=logprobs,
                frequency_penalty=0.0,
            )  # fmt: skip
            for s in self._seeds(seed, n, temperature)
        ]

    def chat(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] = (),
        seed: int | None = None,
        logprobs: bool = False,
        frequency_penalty: float = 0.0,
    ) -> Completion:
        msgs, stops = _check_chat(messages, max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=stop,
                                  seed=seed, frequency_penalty=frequency_penalty)  # fmt: skip
        ids = self._prompt_ids(render_chat(self.tokenizer, msgs))
        (s,) = self._seeds(seed, 1, temperature)
        return self._decode(ids, max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=stops, seed=s,
                            logprobs=logprobs, frequency_penalty=frequency_penalty)  # fmt: skip

    def score(self, context: str, continuation: str) -> list[float]:
        from lmlab.core.inference.scoring import _pad_id, continuation_logprobs, split_pair

        _check_pair(context, continuation)
        if not continuation:
            return []
        ctx, cont = split_pair(self.tokenizer, context, continuation)
        if not ctx:  # the whole context merged into the continuation's first token
            raise ValueError(f"context {context[:40]!r} has no token of its own before the continuation")
        ((lps, _),) = continuation_logprobs(self.model, [ctx], [cont], pad_id=_pad_id(self.tokenizer))
        return [float(x) for x in lps]


# ----------------------------------------------------------------------------------------------------------------
# OpenAI-compatible server


def continuation_span(
    tokens: Sequence[str], offsets: Sequence[int], text: str, n_context: int, n_prompt: int
) -> tuple[int, int]:
    """The echoed tokens ``[start, stop)`` that make up the continuation, from the server's character offsets.

    Args:
        tokens (`list[str]`): the echoed tokens' texts; offsets (`list[int]`): their ``text_offset``.
        text (`str`): the echoed text (the prompt context + continuation, plus any text generated after it).
        n_context (`int`), n_prompt (`int`): characters of the context and of context + continuation.

    Offsets are anchored at the end: a server that counts a special token's text the echoed text does not hold (a
    BOS ``"<s>"`` at offset 0) shifts every later offset by its length, and ``shift = end of the last token -
    len(text)`` undoes it. A token that spans the boundary (a BPE merge of the context's last characters with the
    continuation's first) belongs to the continuation, as in `lmlab.core.inference.scoring.split_pair`; tokens that
    start
    after the prompt (a server that generated although asked for ``max_tokens=0``) are left out. Exact when each
    token's text is a whole-character piece of the text; a token holding part of a multi-byte character shows as
    U+FFFD, whose length is not its share.
    """
    if not tokens or len(tokens) != len(offsets):
        raise ValueError(f"got {len(tokens)} tokens but {len(offsets)} text offsets")
    shift = offsets[-1] + len(tokens[-1]) - len(text)
    starts = [o - shift for o in offsets]
    start = next((i for i, (o, t) in enumerate(zip(starts, tokens)) if o + len(t) > n_context), len(tokens))
    stop = next((i for i in range(start, len(tokens)) if starts[i] >= n_prompt), len(tokens))
    return start, stop


def _refuses_echo(e: BackendHTTPError) -> bool:
    """Whether an HTTP error answers the scoring request's echo / logprobs / max_tokens=0 (or its endpoint), rather
    than something else the caller must fix (a wrong model name, a prompt too long for the context)."""
    if e.status_code == 404:  # no /completions (a chat-only server), unless the model name is what is unknown
        return e.param != "model" and e.code != "model_not_found"
    if e.status_code in (400, 422):
        if e.param is not None:
            return e.param in ("echo", "logprobs", "max_tokens")
        return any(word in str(e).lower() for word in ("echo", "logprobs", "max_tokens"))
    return False


def _one_line(text: Any, limit: int = 300) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


class OpenAIBackend:
    """Any OpenAI-compatible server (`lmlab serve`, vLLM, llama.cpp's ``llama-server``, TGI, OpenAI) through the
    official `openai` client.

    generate is ``completions.create``; chat is ``chat.completions.create`` (``logprobs=True``: each token's
    ``choices[0].logprobs.content[i].logprob``); score is ``completions.create(prompt=context + continuation,
    echo=True, logprobs=0, max_tokens=0)``, keeping the continuation's tokens (`continuation_span`). The client
    retries connection errors, 408/409/429 and 5xx itself (`max_retries`, exponential back-off, ``Retry-After``
    honoured); what is left becomes a one-line `BackendError` naming the URL.

    Args:
        base_url (`str`): the API root, e.g. ``"http://127.0.0.1:8000/v1"``.
        model (`str`, defaults to ``"default"``): the served model name (`lmlab serve` accepts ``default``).
        api_key_env (`str`, defaults to ``"OPENAI_API_KEY"``): the environment variable holding the key (unset:
            ``"EMPTY"``, which local servers ignore). The key itself never sits in a config.
        timeout (`float`, defaults to 120.0): seconds per request.
        max_retries (`int`, defaults to 2): the client's retries (the `openai` default).
    """

    def __init__(
        self,
        base_url: str,
        model: str = "default",
        api_key_env: str = "OPENAI_API_KEY",
        *,
        timeout: float = 120.0,
        max_retries: int = 2,
    ) -> None:
        _check_url(base_url, f"base_url {base_url!r}")
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty served model name, got {model!r}")
        if not isinstance(timeout, int | float) or timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an integer >= 0, got {max_retries!r}")
        try:
            import openai
        except ImportError:
            raise BackendError("the OpenAI backend needs the openai client: pip install openai") from None
        self._openai = openai
        self.base_url, self.model = base_url.rstrip("/"), model
        self.name = f"openai:{self.base_url}#{model}"
        self.client = openai.OpenAI(
            base_url=self.base_url,
            api_key=os.environ.get(api_key_env) or "EMPTY",
            timeout=float(timeout),
            max_retries=max_retries,
        )

    def _call(self, endpoint: str, create: Callable[..., Any], **kw: Any) -> Any:
        """`create(**kw)` with the client's errors turned into one-line `BackendError`s naming the URL."""
        openai = self._openai
        url = f"{self.base_url}/{endpoint}"
        try:
            return create(model=self.model, **kw)
        except openai.APIConnectionError as e:
            cause = e.__cause__ or e
            raise BackendError(f"{url}: no answer ({type(e).__name__}: {_one_line(cause)}); is the server "
                               "running there?") from None  # fmt: skip
        except openai.APIStatusError as e:
            body = e.body
            detail = body.get("message", body) if isinstance(body, Mapping) else (body or e.message)
            message = f"{url} answered HTTP {e.status_code}: {_one_line(detail)}"
            raise BackendHTTPError(
                message, e.status_code, getattr(e, "param", None), getattr(e, "code", None)
            ) from None
        except openai.OpenAIError as e:
            raise BackendError(f"{url}: {type(e).__name__}: {_one_line(e)}") from None

    def generate(
        self,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] = (),
        seed: int | None = None,
        n: int = 1,
        logprobs: bool = False,
    ) -> list[Completion]:
        stops = _check_generate(prompt, max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=stop,
                                seed=seed, n=n)  # fmt: skip
        kw: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p,
                              "n": n}  # fmt: skip
        if stops:
            kw["stop"] = stops
        if seed is not None:
            kw["seed"] = seed
        if logprobs:
            kw["logprobs"] = 0  # the chosen tokens' log-probs only
        r = self._call("completions", self.client.completions.create, **kw)
        choices = sorted(r.choices or [], key=lambda c: c.index)
        if len(choices) != n:
            raise BackendError(f"{self.base_url}/completions returned {len(choices)} choices, expected {n}")
        usage = r.usage
        n_prompt = int(usage.prompt_tokens) if usage else 0
        total = int(usage.completion_tokens) if usage else 0
        out = []
        for i, c in enumerate(choices):
            lp = c.logprobs.token_logprobs if logprobs and c.logprobs is not None else None
            lps = [float(x) for x in lp] if lp is not None else None
            # the API reports completion tokens for the whole request; with log-probs each choice's count is exact,
            # otherwise the total is shared out evenly
            count = len(lps) if lps is not None else total // n + (i < total % n)
            out.append(Completion(c.text or "", None, lps, c.finish_reason or "stop", n_prompt, count))
        return out

    def chat(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] = (),
        seed: int | None = None,
        logprobs: bool = False,
        frequency_penalty: float = 0.0,
    ) -> Completion:
        msgs, stops = _check_chat(messages, max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=stop,
                                  seed=seed, frequency_penalty=frequency_penalty)  # fmt: skip
        kw: dict[str, Any] = {"messages": msgs, "temperature": temperature, "top_p": top_p, "logprobs": bool(logprobs)}
        if max_tokens is not None:
            kw["max_tokens"] = max_tokens
        if stops:
            kw["stop"] = stops
        if seed is not None:
            kw["seed"] = seed
        if frequency_penalty:
            kw["frequency_penalty"] = frequency_penalty
        r = self._call("chat/completions", self.client.chat.completions.create, **kw)
        if not r.choices:
            raise BackendError(f"{self.base_url}/chat/completions returned no choice")
        c = r.choices[0]
        content = c.logprobs.content if logprobs and c.logprobs is not None else None
        lps = [float(t.logprob) for t in content] if content is not None else None
        usage = r.usage
        return Completion(
            text=(c.message.content if c.message is not None else None) or "",
            token_ids=None,
            token_logprobs=lps,
            finish_reason=c.finish_reason or "stop",
            n_prompt_tokens=int(usage.prompt_tokens) if usage else 0,
            n_completion_tokens=int(usage.completion_tokens) if usage else (len(lps) if lps else 0),
        )

    def score(self, context: str, continuation: str) -> list[float]:
        _check_pair(context, continuation)
        if not continuation:
            return []
        full = context + continuation
        url = f"{self.base_url}/completions"
        try:
            r = self._call("completions", self.client.completions.create, prompt=full, echo=True, logprobs=0,
                           max_tokens=0, temperature=0.0)  # fmt: skip
        except BackendHTTPError as e:
            if _refuses_echo(e):
                raise BackendUnsupported(
                    f"{self.name} cannot score (echo=True, logprobs=0, max_tokens=0): {e}"
                ) from None
            raise
        c = r.choices[0] if r.choices else None
        lp = c.logprobs if c is not None else None
        if lp is None or not lp.tokens or not (c.text or "").startswith(full):
            raise BackendUnsupported(f"{url} did not echo the prompt's log-probs (echo=True, logprobs=0), so "
                                     f"{self.name} cannot score")  # fmt: skip
        tokens, offsets, values = list(lp.tokens), list(lp.text_offset or []), list(lp.token_logprobs or [])
        if len(offsets) != len(tokens) or len(values) != len(tokens):
            raise BackendUnsupported(f"{url} echoed {len(tokens)} tokens but {len(offsets)} offsets and "
                                     f"{len(values)} log-probs")  # fmt: skip
        start, stop = continuation_span(tokens, offsets, c.text, len(context), len(full))
        picked = values[start:stop]
        if not picked or any(v is None for v in picked):
            raise BackendUnsupported(f"{url} gave no log-prob for the continuation {continuation[:40]!r} after "
                                     f"{len(context)} context characters")  # fmt: skip
        return [float(v) for v in picked]


# ----------------------------------------------------------------------------------------------------------------
# Specs


_KIND = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")


def _check_url(url: str, what: str) -> None:
    """ValueError unless `url` is ``http(s)://host[:port][/path]``."""
    if not isinstance(url, str):
        raise ValueError(f"{what} must be a string URL such as http://127.0.0.1:8000/v1")
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError on a bad port ("host:http")
    except ValueError as e:
        raise ValueError(f"{what} is not a valid URL ({e}); expected http(s)://HOST[:PORT]/PATH") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{what} must start with http:// or https:// and name a host, e.g. http://127.0.0.1:8000/v1")


def parse_backend(spec: str) -> tuple[str, str]:
    """``(kind, arg)`` of a backend spec: ``("openai", "URL[#MODEL]")`` or ``("local", "ALIAS_OR_FOLDER")``.

    Accepted: ``openai:http(s)://HOST[:PORT]/PATH`` with an optional ``#MODEL`` suffix, ``local:ALIAS_OR_FOLDER``,
    or a bare alias / folder (any `load_model` spec, ``DIR::file.gguf`` included). A spec that starts like a URL
    scheme other than these (``http://...``, ``vllm:...``) is refused rather than taken for a folder. Raises
    ValueError naming the spec and the accepted forms.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"backend spec {spec!r} is empty; expected {BACKEND_FORMS}")
    kind, sep, rest = spec.partition(":")
    if kind == "openai":
        if not sep or not rest:
            raise ValueError(f"backend spec {spec!r} names no URL; expected openai:http(s)://HOST[:PORT]/PATH[#MODEL]")
        url, model = urldefrag(rest)
        _check_url(url, f"backend spec {spec!r}: the URL {url!r}")
        if rest.endswith("#") or ("#" in rest and not model):
            raise ValueError(f"backend spec {spec!r} has an empty model name after '#'; expected openai:URL#MODEL")
        return "openai", rest
    if kind == "local":
        if not rest:
            raise ValueError(f"backend spec {spec!r} names no model; expected local:ALIAS_OR_FOLDER")
        return "local", rest
    if sep and _KIND.fullmatch(kind) and not rest.startswith(":"):
        raise ValueError(f"backend spec {spec!r} has an unknown kind {kind!r}; expected {BACKEND_FORMS}")
    return "local", spec


def make_backend(
    spec: str,
    *,
    load_local: Callable[[str], tuple[Any, Any]] | None = None,
    engine: str | None = None,
    api_key_env: str = "OPENAI_API_KEY",
    timeout: float = 120.0,
    max_retries: int = 2,
) -> TextBackend:
    """The backend a spec names (`parse_backend`).

    Args:
        spec (`str`): ``openai:URL[#MODEL]``, ``local:ALIAS_OR_FOLDER`` or a bare alias / folder.
        load_local (`Callable`, *optional*): ``fn(model_spec) -> (model, tokenizer)`` for local specs; defaults to
            `lmlab.core.inference.models.load_model` (a method passes its context's loader, which applies its device /
            dtype).
        engine (`str`, *optional*): the local backend's decode engine.
        api_key_env, timeout, max_retries: `OpenAIBackend`'s.
    """
    kind, arg = parse_backend(spec)
    if kind == "openai":
        url, model = urldefrag(arg)
        return OpenAIBackend(url, model or "default", api_key_env, timeout=timeout, max_retries=max_retries)
    if load_local is None:
        from lmlab.core.inference.models import load_model as load_local
    model, tokenizer = load_local(arg)
    return LocalBackend(model, tokenizer, engine, name=f"local:{arg}")
