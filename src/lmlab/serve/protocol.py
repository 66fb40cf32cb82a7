"""The OpenAI wire format of `lmlab serve`: request bodies, responses and stream chunks as pydantic models.

Field names, types and defaults follow OpenAI's API reference (the shapes the official `openai` client parses:
``openai.types.Completion``, ``openai.types.chat.ChatCompletion`` / ``ChatCompletionChunk``). Requests are strict
about the fields they declare (``"max_tokens": "5"`` is a type error, not 5) and ignore the ones they do not
(OpenAI's clients send extras such as ``frequency_penalty``), except the ``lmlab`` object, which
`lmlab.serve.strategies.parse_strategy` checks field by field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "ChatMessage",
    "CompletionRequest",
    "CompletionResponse",
    "ErrorBody",
    "ErrorResponse",
    "Usage",
]

# OpenAI's bounds: legacy completions return at most 5 alternatives per token, chat at most 20; n at most 128.
MAX_COMPLETION_LOGPROBS = 5
MAX_TOP_LOGPROBS = 20
MAX_N = 128


class _Request(BaseModel):
    # strict: no "5" -> 5 or 1 -> True coercion (a wrong type is the client's bug); extra fields are ignored
    model_config = ConfigDict(strict=True, extra="ignore")


def _check_stop(v: str | list[str] | None) -> str | list[str] | None:
    stops = [v] if isinstance(v, str) else (v or [])
    if any(s == "" for s in stops):
        raise ValueError("stop strings must be non-empty")
    return v


class StreamOptions(_Request):
    include_usage: bool = False


class CompletionRequest(_Request):
    """``POST /v1/completions``. `prompt` is a string, a list of strings, token ids, or a list of token-id lists."""

    model: str
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)  # OpenAI's default; null: up to the context limit
    temperature: float | None = Field(1.0, ge=0)
    top_p: float | None = Field(1.0, gt=0, le=1)
    frequency_penalty: float | None = Field(0.0, ge=-2, le=2)
    presence_penalty: float | None = Field(0.0, ge=-2, le=2)
    n: int = Field(1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)  # OpenAI's int64; choice i gets seed + i
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    lmlab: dict[str, Any] | None = None

    _stop = field_validator("stop")(_check_stop)


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None


class ChatCompletionRequest(_Request):
    """``POST /v1/chat/completions``. Without `max_tokens` the answer runs until EOS, bounded by the context."""

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)  # OpenAI's newer name; wins over max_tokens
    temperature: float | None = Field(1.0, ge=0)
    top_p: float | None = Field(1.0, gt=0, le=1)
    frequency_penalty: float | None = Field(0.0, ge=-2, le=2)
    presence_penalty: float | None = Field(0.0, ge=-2, le=2)
    n: int = Field(1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)  # OpenAI's int64; choice i gets seed + i
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)  # needs logprobs=true (checked by the app)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    lmlab: dict[str, Any] | None = None

    _stop = field_validator("stop")(_check_stop)


# ----------------------------------------------------------------------------------------------------------------
# Responses


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    """Legacy completions' log-probs: parallel lists, one entry per token (the first prompt token's are null)."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    """Also the stream chunk of ``/v1/completions`` (OpenAI uses one shape for both)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChoiceDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChoiceDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ErrorBody(BaseModel):
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorBody
