"""Step-level generation for multi-step methods: one delimited step at a time, from any model, exchanged as text.

Step-level methods (rsd, spec_search, ...) let several models take turns writing the steps of one answer. Models
may have different tokenizers, so steps travel as text: each call renders the question and the steps so far in the
model's own prompt format, tokenizes it, and decodes until the step delimiter. There is no KV cache shared across
calls, so every call pays the prefill of the whole prefix: that is the real cost of switching models, and the
`ComputeMeter` counts it (prefill tokens) next to the decoded step tokens.

Prompt formats (`StepFormat`):

- ``"chat"``: an instruct model with a chat template; the question is the user turn and the steps so far are the
  start of the assistant turn, joined by the delimiter.
- ``"fewshot"``: a base model; `shots` solved examples (question + steps), then the question and the steps so far.

Steps are stripped of surrounding whitespace and rejoined with the explicit delimiter, so tokenizer boundary
artifacts (leading spaces, merged newlines) do not leak from one model to another.

When the answer ends: at EOS, or at an empty step (the format's own structural marker: in few-shot, blocks are
separated by a blank line, so a model that closes its block writes an empty step). Anything task-specific, such as
the line a few-shot model writes when it starts copying the next question, is the caller's to say: `stop_markers`
(e.g. a data suite's ``STOP_MARKERS``). This module knows no task.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lmlab.core.inference.compute import ComputeMeter
from lmlab.core.inference.generation import decode
from lmlab.core.inference.scoring import chat_prompt, encode_prompt, has_chat_template


@dataclass(frozen=True)
class Shot:
    """A solved example for few-shot prompting: a question and its steps."""

    question: str
    steps: tuple[str, ...]


@dataclass
class StepOutput:
    """One generated step: its text (stripped, without the delimiter), token ids, and whether the answer ended."""

    text: str
    token_ids: list[int]
    finished: bool  # the model ended the answer (EOS, or an empty step) instead of writing another step
    token_logprobs: list[float] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)


class StepModel:
    """A model that writes one step at a time, in its own prompt format.

    Args:
        model, tokenizer: a Hugging Face causal LM and its tokenizer.
        name (`str`): the name its compute is counted under in `meter`.
        fmt (`str`, *optional*): ``"chat"`` or ``"fewshot"``; default: ``"chat"`` if the tokenizer has a chat
            template, else ``"fewshot"``.
        shots (`Sequence[Shot]`): solved examples for the few-shot format.
        delimiter (`str`, defaults to ``"\\n"``): the step delimiter.
        max_step_tokens (`int`, defaults to 24): budget per step.
        meter (`ComputeMeter`, *optional*): counts this model's forwards (prefill per call + decode).
        stop_markers (`Sequence[str]`, defaults to none): step starts that end the answer (matched case-insensitively
            at the start of a generated step, which is then dropped): the caller's task says what a new question block
            looks like, e.g. ``("Q:", "###")``. Without them only EOS and an empty step end the answer.
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
        stop_markers: Sequence[str] = (),
    ):
        if fmt is None:
            fmt = "chat" if has_chat_template(tokenizer) else "fewshot"
        if fmt not in ("chat", "fewshot"):
            raise ValueError(f"fmt must be 'chat' or 'fewshot', got {fmt!r}")
        if not delimiter:
            raise ValueError("delimiter must be a non-empty string")
        self.model, self.tokenizer, self.name, self.fmt = model, tokenizer, name, fmt
        self.shots = tuple(shots)
        self.delimiter = delimiter
        self.max_step_tokens = max_step_tokens
        self.meter = meter
        if isinstance(stop_markers, str):
            raise ValueError(f"stop_markers must be a sequence of strings, got the string {stop_markers!r}")
        for m in stop_markers:
            if not isinstance(m, str) or not m.strip():
                raise ValueError(f"stop_markers must be non-empty strings, got {m!r}")
        self.stop_markers = tuple(m.strip() for m in stop_markers)

    def render(self, question: str, steps: Sequence[str], step_prefix: str = "") -> str:
        """The prompt text that asks for the next step after `steps` (which starts with `step_prefix`)."""
        body = "".join(s.strip() + self.delimiter for s in steps) + step_prefix
        if self.fmt == "chat":
            return chat_prompt(self.tokenizer, question) + body
        blocks = [f"{shot.question}\n" + "".join(s + self.delimiter for s in shot.steps) for shot in self.shots]
        return "\n".join([*blocks, f"{question}\n{body}"])

    @torch.no_grad()
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
        """Generate the next step (greedy by default) after `steps`.

        `step_prefix` is given, not generated: the step is ``step_prefix + generated text`` (e.g. ``"Peru:"`` in a
        task whose i-th step must be about the i-th listed item).
        """
        prompt_ids = encode_prompt(self.tokenizer, self.render(question, steps, step_prefix))
        out = decode(
            self.model,
            self.tokenizer,
            prompt_ids,
            max_new_tokens=self.max_step_tokens,
            do_sample=do_sample,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop_strings=(self.delimiter,),
            meter=self.meter,
            meter_name=self.name,
        )
        return self.to_step(out.token_ids, out.stop_reason, step_prefix, out.token_logprobs)

    def to_step(
        self, token_ids: Sequence[int], stop_reason: str, step_prefix: str = "", token_logprobs: Sequence[float] = ()
    ) -> StepOutput:
        """A `StepOutput` from generated ids: the text up to the delimiter, and whether the answer ended."""
        text = self.tokenizer.decode(list(token_ids), skip_special_tokens=True).split(self.delimiter)[0].strip()
        if step_prefix:
            return StepOutput(f"{step_prefix.strip()} {text}".strip(), list(token_ids), stop_reason == "eos",
                              list(token_logprobs))  # fmt: skip
        # a model that starts a new question block (as the caller's markers describe it) has finished the answer
        marked = self.starts_new_block(text)
        finished = stop_reason == "eos" or not text or marked
        return StepOutput("" if marked else text, list(token_ids), finished, list(token_logprobs))

    def starts_new_block(self, text: str) -> bool:
        """Whether `text` (a generated step) begins with one of the caller's `stop_markers`."""
        lowered = text.lower()
        return any(lowered.startswith(m.lower()) for m in self.stop_markers)

    def sample_steps(
        self,
        question: str,
        steps: Sequence[str],
        n: int,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int,
        step_prefix: str = "",
    ) -> list[StepOutput]:
        """`n` sampled candidates for the next step (seeds ``seed .. seed + n - 1``)."""
        return [
            self.next_step(
                question,
                steps,
                do_sample=True,
                temperature=temperature,
                top_p=top_p,
                seed=seed + i,
                step_prefix=step_prefix,
            )  # fmt: skip
            for i in range(n)
        ]

    def answer(
        self, question: str, max_steps: int, *, step_prefixes: Sequence[str] | None = None, **kwargs: Any
    ) -> list[str]:
        """A whole answer written by this model alone, step by step.

        Without `step_prefixes` it stops when the model finishes or at `max_steps`; with them it writes exactly one
        step per prefix.
        """
        steps: list[str] = []
        if step_prefixes is not None:
            for prefix in step_prefixes:
                steps.append(self.next_step(question, steps, step_prefix=prefix, **kwargs).text)
            return steps
        for _ in range(max_steps):
            out = self.next_step(question, steps, **kwargs)
            if out.text:
                steps.append(out.text)
            if out.finished:
                break
        return steps
