"""lmlab decoding strategies as a request option of `lmlab serve`.

A request body may carry ``"lmlab": {"strategy": NAME, ...parameters}`` (or the server a launch default,
``lmlab serve --strategy '{"strategy": "reflection_window"}'``). Each strategy declares its parameters as a strict
pydantic model, so an unknown strategy, an unknown field or a bad value is refused with the field's path
(``lmlab.sigma``) before anything runs. A strategy request runs alone on the scheduler's worker (its decoder
rewinds and branches, so it does not share the batched cache); its text and tokens come back as one piece.

Strategies (more register with `register_strategy`; a method whose decoder needs a trained model, e.g. a PRM for
``rsd``, registers once such a model can be named in a request):

- ``reflection_window`` (Tang et al., ICML 2025): pause where the entropy of the last `window` tokens exceeds
  `sigma`, re-decode that window by beam search (`lmlab.methods.decoding.reflection_window`).
- ``beam_search``: the HF beam-search baseline (`num_beams`, `length_penalty`).

Without an ``lmlab`` object a request uses the plain batched decoder (greedy at temperature 0, else sampling).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["STRATEGIES", "Strategy", "StrategyError", "StrategyOutput", "parse_strategy", "register_strategy"]


class StrategyError(ValueError):
    """A bad ``lmlab`` request option. `param` is the field's path (e.g. ``lmlab.sigma``)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param, self.message = param, message


@dataclass
class StrategyOutput:
    token_ids: list[int]
    stop_reason: str  # "eos", "stop_string" or "max_new_tokens"


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReflectionWindowParams(_Params):
    strategy: Literal["reflection_window"] = "reflection_window"
    sigma: float = Field(0.5, ge=0, description="entropy threshold in nats (the paper's 0.5)")
    window: int = Field(4, ge=1, le=64, description="reflection-window length d")
    rule: Literal["all", "any", "mean", "current"] = "all"
    beam_width: int = Field(4, ge=1, le=16)


class BeamSearchParams(_Params):
    strategy: Literal["beam_search"] = "beam_search"
    num_beams: int = Field(4, ge=1, le=16)
    length_penalty: float = 1.0


def _run_reflection_window(p: ReflectionWindowParams, model: Any, tokenizer: Any, req: Any) -> StrategyOutput:
    from lmlab.methods.decoding.reflection_window.method import reflection_window_generate

    out = reflection_window_generate(
        model,
        tokenizer,
        list(req.prompt_ids),
        max_new_tokens=req.max_tokens,
        sigma=p.sigma,
        window=p.window,
        rule=p.rule,
        beam_width=p.beam_width,
        do_sample=req.temperature > 0,
        temperature=req.temperature if req.temperature > 0 else 1.0,
        top_p=req.top_p,
        seed=req.seed,
        stop_strings=tuple(req.stop),
    )
    return StrategyOutput(list(out.token_ids), out.stop_reason)


def _run_beam_search(p: BeamSearchParams, model: Any, tokenizer: Any, req: Any) -> StrategyOutput:
    from lmlab.core.inference.generation import _eos_ids, hf_generate

    (out,) = hf_generate(
        model,
        tokenizer,
        [list(req.prompt_ids)],
        max_new_tokens=req.max_tokens,
        num_beams=p.num_beams,
        length_penalty=p.length_penalty,
    )
    ended = bool(out.token_ids) and out.token_ids[-1] in _eos_ids(model, tokenizer, None)
    return StrategyOutput(list(out.token_ids), "eos" if ended else "max_new_tokens")


@dataclass
class _Entry:
    params: type[_Params]
    run: Callable[[Any, Any, Any, Any], StrategyOutput]


STRATEGIES: dict[str, _Entry] = {
    "reflection_window": _Entry(ReflectionWindowParams, _run_reflection_window),
    "beam_search": _Entry(BeamSearchParams, _run_beam_search),
}


def register_strategy(name: str, params: type[BaseModel], run: Callable[[Any, Any, Any, Any], StrategyOutput]) -> None:
    """Add a strategy: `params` a pydantic model (with a ``strategy`` field), ``run(params, model, tokenizer,
    request) -> StrategyOutput``."""
    STRATEGIES[name] = _Entry(params, run)


@dataclass
class Strategy:
    """A validated strategy call, ready for the scheduler (``GenRequest.strategy``)."""

    name: str
    params: BaseModel
    _run: Callable[[Any, Any, Any, Any], StrategyOutput]

    def run(self, model: Any, tokenizer: Any, request: Any) -> StrategyOutput:
        return self._run(self.params, model, tokenizer, request)


def parse_strategy(obj: dict | None, default: dict | None = None) -> Strategy | None:
    """The `Strategy` a request's ``lmlab`` object asks for (else the launch `default`), or None (neither given:
    the plain batched decoder). Raises `StrategyError` naming the bad field."""
    chosen = obj if obj is not None else default
    if chosen is None:
        return None
    if not isinstance(chosen, dict):
        raise StrategyError("lmlab", f'must be an object like {{"strategy": ...}}, got {type(chosen).__name__}')
    name = chosen.get("strategy")
    if name is None:
        raise StrategyError("lmlab.strategy", f"is required; one of {', '.join(sorted(STRATEGIES))}")
    if name not in STRATEGIES:
        raise StrategyError(
            "lmlab.strategy", f"unknown strategy {name!r}; expected one of {', '.join(sorted(STRATEGIES))}"
        )
    entry = STRATEGIES[name]
    try:
        params = entry.params.model_validate(chosen)
    except ValidationError as e:
        err = e.errors()[0]
        path = ".".join(str(x) for x in ("lmlab", *err["loc"]))
        raise StrategyError(path, f"{err['msg']} (got {err.get('input')!r})") from None
    return Strategy(name, params, entry.run)
