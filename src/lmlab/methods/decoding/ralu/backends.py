"""Chat backends for RaLU: any OpenAI-compatible endpoint, a local Hugging Face model, and an oracle judge.

RaLU talks to its LLM through one call, ``chat(messages, temperature, logprobs) -> (text, token_logprobs)`` (the
official ``LLMBot.prompt_call``: ``/v1/chat/completions`` with ``logprobs=True``, temperature 0.7, frequency penalty
0.3). Three implementations:

- `APIChatBackend`: the official call over any `lmlab.core.execution.backends.TextBackend`; `OpenAIChatBackend` is it
over
  `lmlab.core.execution.backends.OpenAIBackend` (any server speaking the OpenAI chat API: `lmlab serve`, vLLM,
  llama.cpp
  ``llama-server``, TGI, OpenAI, through the official `openai` client), so the official prompts and loop run
  unchanged against a model large enough to judge and repair code.
- `HFChatBackend`: a local causal LM (SmolLM2-135M-Instruct by default) playing the official roles under
  *deterministic constraints*, because a 135M model cannot follow the response format freely:

  - **judge**: ``OK`` when log P("OK") + `judge_bias` >= log P("WRONG") as the first response token (the first
    token of each word), under the official system prompt and the whole dialogue;
  - **confidence**: the tokens whose mean probability the engine turns into the official 0-100 score are the unit
    text itself (for ``OK``: the unit as written in the user turn; for ``WRONG``: the fix inside ``<Fix>``);
  - **refine**: the fix is the most probable (highest mean token probability) of the candidate pool: every
    single-edit mutation of the unit's snippets (`lmlab.methods.decoding.ralu.mutations.unit_candidates`) plus
    `n_rewrites` fixes sampled from the model after ``WRONG\\n<Fix>\\n`` (temperature 0.7, seeded by the dialogue;
    only for units of at most `rewrite_max_tokens` tokens: a cut rewrite cannot replace a longer unit);
  - **select** (``## Candidates for Next Unit``): the most probable ``<Unit>`` candidate;
  - anything else (e.g. the official final program synthesis): greedy generation.

  A prefix KV cache (longest common prefix over the last few dialogues) makes each turn cost only its new tokens:
  the 550-token system prompt and the growing history are encoded once.
- `OracleJudgeBackend`: the experiment's upper bound, a judge that runs the tests: a unit is ``WRONG`` when one of
  its candidate fixes, written into the program, passes them (that candidate is the fix).
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from lmlab.methods.decoding.ralu.mutations import context_names, unit_candidates
from lmlab.methods.decoding.ralu.program import LogicUnit, Program
from lmlab.methods.decoding.ralu.units import apply_fix, apply_fixes

__all__ = [
    "APIChatBackend",
    "FREQUENCY_PENALTY",
    "ChatBackend",
    "ChatResponse",
    "HFChatBackend",
    "OK_RESPONSE",
    "OpenAIChatBackend",
    "OracleJudgeBackend",
    "parse_unit_prompt",
    "wrong_response",
]

OK_RESPONSE = "OK\nAnalysis: This unit adheres to the requirement."
_UNIT_PROMPT = re.compile(r"^(?:## Process\n)?Unit (\d+): (.*)$", re.DOTALL)
_CANDIDATES_HEAD = "## Candidates for Next Unit:"
_UNIT_BLOCK = re.compile(r"<\s*Unit\s*>(.*?)<\s*/\s*Unit\s*>", re.DOTALL)


def wrong_response(fix: str) -> str:
    """The constrained ``WRONG`` reply carrying a fix, in the official response format."""
    return f"WRONG\n<Fix>\n{fix}\n</Fix>\nAnalysis: This unit deviates from the specification; the fix is above."


def parse_unit_prompt(text: str) -> tuple[int, str] | None:
    """``(k, unit)`` of an official ``Unit k: <unit>`` prompt (``## Process`` prefix allowed), else None."""
    m = _UNIT_PROMPT.match(text)
    return (int(m.group(1)), m.group(2)) if m else None


@dataclass
class ChatResponse:
    """One chat completion. Unpacks as ``text, token_logprobs`` (the official ``prompt_call`` pair).

    Attributes:
        text (`str`): the assistant message.
        token_logprobs (`list[float]`, *optional*): log-probs of the scored response tokens (None: unavailable).
        prompt_tokens (`int`), completion_tokens (`int`): token usage as the backend counts it.
        info (`dict`): backend details for traces (judge margin, candidate pool, ...).
    """

    text: str
    token_logprobs: list[float] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    def __iter__(self):
        yield self.text
        yield self.token_logprobs


@runtime_checkable
class ChatBackend(Protocol):
    """What RaLU needs from an LLM: the official ``prompt_call``."""

    def chat(
        self, messages: Sequence[Mapping[str, str]], *, temperature: float = 0.7, logprobs: bool = True
    ) -> ChatResponse: ...


# ----------------------------------------------------------------------------------------------------------------
# Any text backend (an OpenAI-compatible server)

FREQUENCY_PENALTY = 0.3  # the official prompt_call (src/bot.py)


class APIChatBackend:
    """The official ``prompt_call`` over a `lmlab.core.execution.backends.TextBackend`: the free-form official loop.

    Each call is ``backend.chat(messages, temperature=..., logprobs=..., frequency_penalty=0.3)`` (the official
    values; ``temperature`` comes from the RaLU loop, 0.7). Nothing is constrained: the backend's model must follow
    the response format itself, which needs a served model far above 135M.

    Args:
        backend (`TextBackend`): e.g. `lmlab.core.execution.backends.OpenAIBackend`.
        frequency_penalty (`float`, defaults to 0.3): the official value.
        max_tokens (`int`, *optional*): completion cap per call (the official code sets none).
        seed (`int`, *optional*): call ``i`` (counted from 0) is sent ``seed + i``, so a run is reproducible on a
            server that honours seeds while a re-asked prompt still gets a fresh sample; None sends no seed.
    """

    def __init__(
        self,
        backend: Any,
        *,
        frequency_penalty: float = FREQUENCY_PENALTY,
        max_tokens: int | None = None,
        seed: int | None = None,
    ):
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 or None, got {max_tokens!r}")
        self.backend = backend
        self.frequency_penalty = frequency_penalty
        self.max_tokens = max_tokens
        self.seed = seed
        self.n_calls = 0

    def chat(
        self, messages: Sequence[Mapping[str, str]], *, temperature: float = 0.7, logprobs: bool = True
    ) -> ChatResponse:
        seed = None if self.seed is None else self.seed + self.n_calls
        self.n_calls += 1
        c = self.backend.chat(
            messages,
            max_tokens=self.max_tokens,
            temperature=temperature,
            seed=seed,
            logprobs=logprobs,
            frequency_penalty=self.frequency_penalty,
        )
        info = {"role": "remote", "backend": self.backend.name, "finish_reason": c.finish_reason}
        return ChatResponse(c.text, c.token_logprobs, c.n_prompt_tokens, c.n_completion_tokens, info)


class OpenAIChatBackend(APIChatBackend):
    """`APIChatBackend` over `lmlab.core.execution.backends.OpenAIBackend`: any OpenAI-compatible
    ``/v1/chat/completions``.

    Args:
        base_url (`str`): the API root, e.g. ``"http://127.0.0.1:8000/v1"``.
        model (`str`, defaults to ``"default"``): the served model name.
        api_key_env (`str`, defaults to ``"OPENAI_API_KEY"``): the environment variable holding the key.
        timeout (`float`, defaults to 120.0): seconds per request.
        max_retries (`int`, defaults to 4): the client's retries on connection errors and 5xx (5 attempts: the
            official ``@retry`` makes 5 tries); a 4xx error is raised at once.
        frequency_penalty, max_tokens, seed: `APIChatBackend`'s.
    """

    def __init__(
        self,
        base_url: str,
        model: str = "default",
        *,
        api_key_env: str = "OPENAI_API_KEY",
        timeout: float = 120.0,
        max_retries: int = 4,
        frequency_penalty: float = FREQUENCY_PENALTY,
        max_tokens: int | None = None,
        seed: int | None = None,
    ):
        from lmlab.core.execution.backends import OpenAIBackend

        backend = OpenAIBackend(base_url, model, api_key_env, timeout=timeout, max_retries=max_retries)
        super().__init__(backend, frequency_penalty=frequency_penalty, max_tokens=max_tokens, seed=seed)


# ----------------------------------------------------------------------------------------------------------------
# Local Hugging Face model with constrained roles


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class HFChatBackend:
    """A local causal LM in the official chat format, with deterministic constrained roles (module docstring).

    Args:
        model, tokenizer: a Hugging Face causal LM and its tokenizer (a chat template is used when present).
        n_rewrites (`int`, defaults to 2): fixes sampled from the model per ``WRONG`` verdict, added to the pool.
        rewrite_max_tokens (`int`, defaults to 48): token cap of a sampled fix.
        rewrite_temperature (`float`, defaults to 0.7): sampling temperature of the rewrites (the official 0.7).
        judge_bias (`float`, defaults to 0.0): added to log P("OK") before the comparison (0: the plain rule).
        max_new_tokens (`int`, defaults to 256): budget of free generation (non-unit prompts).
        seed (`int`, defaults to 0): seeds the rewrites (together with a hash of the dialogue).
        candidates (`Callable`, *optional*): ``fn(unit, names) -> list[str]`` candidate fixes; defaults to the
            single-edit mutations of the unit.
        batch_size (`int`, defaults to 16): candidates scored per forward.
        cache_entries (`int`, defaults to 4): dialogues kept in the prefix KV cache.
        meter (`ComputeMeter`, *optional*), meter_name (`str`): count this backend's forwards.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        n_rewrites: int = 2,
        rewrite_max_tokens: int = 48,
        rewrite_temperature: float = 0.7,
        judge_bias: float = 0.0,
        max_new_tokens: int = 256,
        seed: int = 0,
        candidates: Callable[[str, set[str]], list[str]] | None = None,
        batch_size: int = 16,
        cache_entries: int = 4,
        meter: Any = None,
        meter_name: str = "ralu_llm",
    ):
        if n_rewrites < 0:
            raise ValueError(f"n_rewrites must be >= 0, got {n_rewrites!r}")
        if rewrite_temperature <= 0:
            raise ValueError(f"rewrite_temperature must be > 0, got {rewrite_temperature!r}")
        self.model = model
        self.tok = tokenizer
        self.n_rewrites = n_rewrites
        self.rewrite_max_tokens = rewrite_max_tokens
        self.rewrite_temperature = rewrite_temperature
        self.judge_bias = judge_bias
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.candidates = candidates or (lambda unit, names: [c for _, c in unit_candidates(unit, names)])
        self.batch_size = batch_size
        self.cache_entries = cache_entries
        self.meter = meter
        self.meter_name = meter_name
        self._entries: list[tuple[list[int], Any]] = []
        self.n_calls = 0

    # -- text and tokens ----------------------------------------------------------------------------------------
    def render(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The prompt text: the chat template with the generation prompt (a plain transcript without one)."""
        from lmlab.core.inference.scoring import has_chat_template

        msgs = [{"role": m["role"], "content": m["content"]} for m in messages]
        if has_chat_template(self.tok):
            return self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return "".join(f"{m['role'].capitalize()}: {m['content']}\n\n" for m in msgs) + "Assistant:"

    def encode(self, text: str) -> list[int]:
        from lmlab.core.inference.scoring import encode_prompt

        return encode_prompt(self.tok, text)

    def _continuation(self, context_ids: list[int], context: str, continuation: str) -> list[int]:
        """Token ids of `continuation` right after the tokens `context_ids` of `context` (the KV cache holds exactly
        those, so a BPE merge across the boundary is resolved by encoding the continuation on its own)."""
        full = self.encode(context + continuation)
        if full[: len(context_ids)] == list(context_ids):
            return full[len(context_ids) :]
        return list(self.tok(continuation, add_special_tokens=False)["input_ids"])

    # -- forward passes -----------------------------------------------------------------------------------------
    def _model_forward(self, **kwargs: Any) -> Any:
        import torch

        with torch.no_grad():
            if self.meter is not None:
                with self.meter.track(self.model, self.meter_name):
                    return self.model(**kwargs)
            return self.model(**kwargs)

    def _prefill(self, ids: list[int], need_from: int) -> tuple[Any, Any]:
        """Run `ids` through the model reusing the longest cached prefix (never beyond ``need_from - 1``).

        Returns:
            `(cache, logprobs)`: the KV cache holding all of `ids`, and log-softmax rows for positions
            ``need_from - 1 .. len(ids) - 1`` (row r predicts token ``need_from + r``), shape (n, vocab).
        """
        import torch
        import torch.nn.functional as F

        from lmlab.core.inference.generation import cache_kwargs, crop_cache, new_cache

        limit = max(0, min(need_from - 1, len(ids) - 1))
        best, held = None, 0
        for i, (entry_ids, _) in enumerate(self._entries):
            n = min(_lcp(entry_ids, ids), limit)
            if n > held:
                best, held = i, n
        if best is not None:
            # take the entry over (no copy): the dialogue that extends it is stored again below, and a rewound
            # branch shares a prefix of it anyway
            _, cache = self._entries.pop(best)
            if not crop_cache(cache, held):
                cache, held = new_cache(self.model), 0
        else:
            cache = new_cache(self.model)
        device = next(self.model.parameters()).device
        feed = torch.tensor([ids[held:]], dtype=torch.long, device=device)
        keep = len(ids) - limit
        out = self._model_forward(input_ids=feed, logits_to_keep=keep, **cache_kwargs(self.model, cache))
        logprobs = F.log_softmax(out.logits[0].float(), dim=-1)  # (keep, vocab)
        # the caller may extend this cache in place; the entry stays valid for its first len(ids) positions
        self._entries.insert(0, (list(ids), cache))
        del self._entries[self.cache_entries :]
        return cache, logprobs

    def _extend(self, cache: Any, tokens: list[int]) -> Any:
        """Feed `tokens` after `cache` (in place); log-softmax rows of every fed position, (len(tokens), vocab).

        Extending a cache that is also a prefix-cache entry is safe: entries are always cropped to a common prefix
        of their recorded ids before reuse."""
        import torch
        import torch.nn.functional as F

        from lmlab.core.inference.generation import cache_kwargs

        device = next(self.model.parameters()).device
        feed = torch.tensor([tokens], dtype=torch.long, device=device)
        out = self._model_forward(input_ids=feed, logits_to_keep=len(tokens), **cache_kwargs(self.model, cache))
        return F.log_softmax(out.logits[0].float(), dim=-1)

    def _score(self, cache: Any, first_row: Any, conts: list[list[int]]) -> list[list[float]]:
        """Token log-probs of several continuations after `cache`; `first_row` predicts their first token."""
        import torch
        import torch.nn.functional as F

        from lmlab.core.inference.generation import cache_kwargs

        device = next(self.model.parameters()).device
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        out: list[list[float]] = [[] for _ in conts]
        for i, c in enumerate(conts):
            if c:
                out[i].append(float(first_row[c[0]]))
        order = [i for i in range(len(conts)) if len(conts[i]) > 1]
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            width = max(len(conts[i]) for i in idx) - 1
            # right padding: a causal model's earlier positions never see the pads, so no mask is needed
            rows = [conts[i][:-1] + [pad] * (width - len(conts[i]) + 1) for i in idx]
            batch_cache = copy.deepcopy(cache)
            batch_cache.batch_repeat_interleave(len(idx))
            feed = torch.tensor(rows, dtype=torch.long, device=device)
            logits = self._model_forward(input_ids=feed, **cache_kwargs(self.model, batch_cache)).logits
            lp = F.log_softmax(logits.float(), dim=-1)  # (batch, width, vocab)
            for r, i in enumerate(idx):
                target = torch.tensor(conts[i][1:], device=device)
                out[i].extend(lp[r, : len(target)].gather(-1, target[:, None]).squeeze(-1).tolist())
        return out

    def _sample(self, cache: Any, first_row: Any, n: int, max_tokens: int, seed: int) -> list[str]:
        """`n` seeded samples after `cache` until ``</Fix>``, EOS or `max_tokens`."""
        import torch
        import torch.nn.functional as F

        from lmlab.core.inference.generation import cache_kwargs

        if n == 0:
            return []
        device = next(self.model.parameters()).device
        gen = torch.Generator(device="cpu")
        gen.manual_seed(seed)
        eos = self.tok.eos_token_id
        batch_cache = copy.deepcopy(cache)
        batch_cache.batch_repeat_interleave(n)
        rows = first_row[None].expand(n, -1)
        tokens: list[list[int]] = [[] for _ in range(n)]
        done = [False] * n
        for _ in range(max_tokens):
            probs = (rows / self.rewrite_temperature).softmax(-1).cpu()
            picks = torch.multinomial(probs, 1, generator=gen)[:, 0].tolist()
            for r, t in enumerate(picks):
                if done[r]:
                    continue
                if t == eos:
                    done[r] = True
                    continue
                tokens[r].append(t)
                if "</Fix>" in self.tok.decode(tokens[r][-4:], skip_special_tokens=True) or "</Fix>" in (
                    self.tok.decode(tokens[r], skip_special_tokens=True)
                ):
                    done[r] = True
            if all(done):
                break
            feed = torch.tensor([[t] for t in picks], dtype=torch.long, device=device)
            logits = self._model_forward(input_ids=feed, **cache_kwargs(self.model, batch_cache)).logits
            rows = F.log_softmax(logits[:, -1].float(), dim=-1)
        texts = []
        for t in tokens:
            text = self.tok.decode(t, skip_special_tokens=True)
            texts.append(text.split("</Fix>")[0].strip())
        return texts

    # -- roles --------------------------------------------------------------------------------------------------
    def chat(
        self, messages: Sequence[Mapping[str, str]], *, temperature: float = 0.7, logprobs: bool = True
    ) -> ChatResponse:
        """Answer the dialogue in the role its last user turn asks for (see the module docstring)."""
        if not messages:
            raise ValueError("messages is empty: expected at least one user turn")
        self.n_calls += 1
        last = messages[-1]["content"]
        parsed = parse_unit_prompt(last)
        if parsed is not None:
            return self._judge(messages, parsed[1])
        if last.startswith(_CANDIDATES_HEAD):
            return self._select(messages)
        return self._generate(messages)

    def _judge(self, messages: Sequence[Mapping[str, str]], unit: str) -> ChatResponse:
        import math

        prompt = self.render(messages)
        ids = self.encode(prompt)
        # the unit's characters in the prompt: its last occurrence (it sits in the last user turn)
        at = prompt.rfind(unit)
        first = _lcp(self.encode(prompt[:at]), ids) if at >= 0 else len(ids)
        end = _lcp(self.encode(prompt[: at + len(unit)]), ids) if at >= 0 else len(ids)
        first = max(1, first)
        cache, rows = self._prefill(ids, first)
        unit_lps = [float(rows[r][ids[first + r]]) for r in range(end - first)]
        last_row = rows[-1]  # predicts the first response token
        ok_ids = self._continuation(ids, prompt, "OK")
        head = "WRONG\n<Fix>\n"
        head_ids = self._continuation(ids, prompt, head)
        wrong_ids = self._continuation(ids, prompt, "WRONG")
        # the verdict compares log P("OK") and log P("WRONG") as the reply's first token (the first token of each
        # word), read off the prompt's own forward pass: a judgment costs one pass over the new turn's tokens
        ok_lp, wrong_lp = float(last_row[ok_ids[0]]), float(last_row[wrong_ids[0]])
        info: dict[str, Any] = {"role": "judge", "logp_ok": ok_lp, "logp_wrong": wrong_lp}
        if ok_lp + self.judge_bias >= wrong_lp:
            info["verdict"] = "OK"
            return ChatResponse(OK_RESPONSE, unit_lps, len(ids), len(ok_ids), info)

        head_rows = self._extend(cache, head_ids)  # cache now holds prompt + "WRONG\n<Fix>\n"
        names = context_names(m["content"] for m in messages if m["role"] == "user")
        pool = [c for c in self.candidates(unit, names) if c.strip() and c.strip() != unit.strip()]
        sources = ["mutation"] * len(pool)
        digest = hashlib.sha256(prompt.encode("utf-8")).digest()
        seed = (self.seed * 1_000_003 + int.from_bytes(digest[:4], "little")) % (2**31)
        # a rewrite is cut at rewrite_max_tokens: for a longer unit (a whole program) a cut rewrite cannot stand for
        # the unit, so none is sampled
        n_rewrites = self.n_rewrites if end - first <= self.rewrite_max_tokens else 0
        info["rewrites_sampled"] = n_rewrites
        for text in self._sample(cache, head_rows[-1], n_rewrites, self.rewrite_max_tokens, seed):
            if text and text.strip() != unit.strip() and text not in pool:
                pool.append(text)
                sources.append("rewrite")
        info["verdict"] = "WRONG"
        if not pool:
            info["pool"] = 0
            # nothing to offer: the constrained judge can only accept the unit as it is
            info["verdict"] = "OK (empty pool)"
            return ChatResponse(OK_RESPONSE, unit_lps, len(ids), len(ok_ids), info)
        context = prompt + head
        context_ids = ids + head_ids
        conts = [self._continuation(context_ids, context, c) for c in pool]
        scores = self._score(cache, head_rows[-1], conts)
        conf = [sum(math.exp(x) for x in s) / len(s) if s else 0.0 for s in scores]
        best = max(range(len(pool)), key=lambda i: (conf[i], -i))
        info.update(
            pool=len(pool),
            rewrites=[p for p, s in zip(pool, sources) if s == "rewrite"],
            fix_source=sources[best],
            top=sorted(((round(100 * c, 2), p) for c, p in zip(conf, pool)), reverse=True)[:3],
        )
        fix = pool[best]
        return ChatResponse(wrong_response(fix), scores[best], len(ids), len(head_ids) + len(conts[best]), info)

    def _select(self, messages: Sequence[Mapping[str, str]]) -> ChatResponse:
        import math

        candidates = [c.strip() for c in _UNIT_BLOCK.findall(messages[-1]["content"])]
        prompt = self.render(messages)
        ids = self.encode(prompt)
        if not candidates:
            return ChatResponse("", None, len(ids), 0, {"role": "select"})
        cache, rows = self._prefill(ids, len(ids))
        head = "<Unit>\n"
        head_ids = self._continuation(ids, prompt, head)
        head_rows = self._extend(cache, head_ids)
        conts = [self._continuation(ids + head_ids, prompt + head, c) for c in candidates]
        scores = self._score(cache, head_rows[-1], conts)
        conf = [sum(math.exp(x) for x in s) / len(s) if s else 0.0 for s in scores]
        best = max(range(len(candidates)), key=lambda i: (conf[i], -i))
        text = f"<Unit>\n{candidates[best]}\n</Unit>"
        return ChatResponse(text, scores[best], len(ids), len(conts[best]), {"role": "select", "conf": conf})

    def _generate(self, messages: Sequence[Mapping[str, str]]) -> ChatResponse:
        import torch

        prompt = self.render(messages)
        ids = self.encode(prompt)
        cache, rows = self._prefill(ids, len(ids))
        eos = self.tok.eos_token_id
        row = rows[-1]
        out: list[int] = []
        lps: list[float] = []
        for _ in range(self.max_new_tokens):
            t = int(torch.argmax(row))
            if t == eos:
                break
            out.append(t)
            lps.append(float(row[t]))
            row = self._extend(cache, [t])[-1]
        text = self.tok.decode(out, skip_special_tokens=True)
        return ChatResponse(text, lps, len(ids), len(out), {"role": "generate"})


# ----------------------------------------------------------------------------------------------------------------
# Oracle judge


class OracleJudgeBackend:
    """An upper-bound judge that runs the tests (validates the plumbing; never a method).

    For ``Unit k: u``: take the program with the fixes the dialogue accepted so far; if it passes with unit k
    replaced by ``u``, ``OK``; otherwise the first candidate
    fix of ``u`` (the same pool the model judge gets, same variable names) whose program passes is returned as
    ``WRONG`` + ``<Fix>``; if none passes, ``OK`` (nothing in the pool helps). Replies carry no log-probs, so the
    engine treats confidence as unavailable, as the official code does for a negative score.

    Args:
        program (`str | Program`): the initial program.
        units (`Sequence[LogicUnit]`): its units, in the order they are shown.
        passes (`Callable`): ``fn(list of sources) -> list[bool]``, running the tests (the experiment batches
            them through `lmlab.core.execution.sandbox.run_many`).
        mode (`str`, defaults to ``"cfg"``): the unit mode (how corrected units are read back).
        candidates (`Callable`, *optional*): ``fn(unit, names) -> list[str]``, as in `HFChatBackend`.
    """

    def __init__(
        self,
        program: str | Program,
        units: Sequence[LogicUnit],
        passes: Callable[[list[str]], list[bool]],
        *,
        mode: str = "cfg",
        candidates: Callable[[str, set[str]], list[str]] | None = None,
    ):
        self.program = program if isinstance(program, Program) else Program.parse(program)
        self.units = list(units)
        self.passes = passes
        self.mode = mode
        self.candidates = candidates or (lambda unit, names: [c for _, c in unit_candidates(unit, names)])
        self._memo: dict[str, bool] = {}
        self.n_calls = 0
        self.n_test_runs = 0

    def _check(self, sources: list[str]) -> list[bool]:
        todo = [s for s in dict.fromkeys(sources) if s not in self._memo]
        if todo:
            self.n_test_runs += len(todo)
            for s, ok in zip(todo, self.passes(todo)):
                self._memo[s] = bool(ok)
        return [self._memo[s] for s in sources]

    def _accepted_so_far(self, history: Sequence[Mapping[str, str]]) -> Program:
        """The program with the fixes the dialogue has accepted so far (a fix in a reply, else the unit asked)."""
        fixes = []
        turns = list(history)
        for i, turn in enumerate(turns):
            parsed = parse_unit_prompt(turn["content"]) if turn["role"] == "user" else None
            if parsed is None or i + 1 >= len(turns) or turns[i + 1]["role"] != "assistant":
                continue
            k, text = parsed
            reply = turns[i + 1]["content"]
            m = re.search(r"<\s*Fix\s*>(.*?)<\s*/\s*Fix\s*>", reply, re.DOTALL | re.IGNORECASE)
            if 1 <= k <= len(self.units):
                fixes.append((self.units[k - 1], m.group(1).strip() if m else text))
        if not fixes:
            return self.program
        return Program.parse(apply_fixes(self.program, fixes, self.mode)[0])

    def chat(
        self, messages: Sequence[Mapping[str, str]], *, temperature: float = 0.7, logprobs: bool = True
    ) -> ChatResponse:
        self.n_calls += 1
        parsed = parse_unit_prompt(messages[-1]["content"])
        if parsed is None:
            return ChatResponse("", None, 0, 0, {"role": "oracle", "note": "not a unit prompt"})
        k, text = parsed
        if not 1 <= k <= len(self.units):
            raise ValueError(f"unit index {k} is out of range: the program has {len(self.units)} units")
        unit = self.units[k - 1]
        base = self._accepted_so_far(messages[:-1])
        current = apply_fix(base, unit, text, self.mode)
        if current is not None and self._check([current])[0]:
            return ChatResponse(OK_RESPONSE, None, 0, 0, {"role": "oracle", "verdict": "OK"})
        names = context_names(m["content"] for m in messages if m["role"] == "user")
        pool = [c for c in self.candidates(text, names) if c.strip() != text.strip()]
        programs = [apply_fix(base, unit, c, self.mode) for c in pool]
        usable = [(c, p) for c, p in zip(pool, programs) if p is not None]
        verdicts = self._check([p for _, p in usable])
        for (c, _), ok in zip(usable, verdicts):
            if ok:
                return ChatResponse(wrong_response(c), None, 0, 0, {"role": "oracle", "verdict": "WRONG"})
        return ChatResponse(OK_RESPONSE, None, 0, 0, {"role": "oracle", "verdict": "OK (no passing fix)"})
