"""Accept unit u_k iff check_unit(u_k, r_k) and conf = mean_t exp(logp_t) x 100 > 51; else rewind: u_k <- Fix(r_k).

RaLU (Li et al., ICML 2025, https://arxiv.org/abs/2502.07803; official code github.com/DeepAccept/RaLU,
``src/RaLU.py``): for each logic unit u_k the LLM answers r_k = LLM(spec, H_<k, "Unit k: u_k") with a verdict, an
optional fix and an analysis; a unit judged wrong rewinds the history H to H_<k and is re-asked as its fix (at most
`max_branches` = 3 times), after which the most confident branch is kept; the final program is synthesized from the
aligned units and their analyses.

This module is the engine, written after the official ``RaLU`` class: one chat history per branch id, ``branch_off``
copies the current branch without its last exchange, ``check_unit`` accepts a reply whose leading letters spell
"ok" or whose ``<Fix>`` equals the unit on its core characters. Deviations (all documented in the README): branch ids
are counters (deterministic replay instead of uuid4), the places where the official code crashes (no valid reply after
`max_valid_num` attempts, no ``Analysis:``, no pick by the selector) fall back to explicit choices recorded in the
trace, a judge-call budget can cut a run short, and the solution is either reassembled from the accepted units
(``synthesis="reassemble"``, deterministic, the default for small models) or written by the LLM from the reasoning
path (``synthesis="llm"``, the official way).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from lmlab.methods.decoding.ralu.backends import ChatBackend, ChatResponse
from lmlab.methods.decoding.ralu.program import LogicUnit, Program
from lmlab.methods.decoding.ralu.prompts import (
    CODE_SYNTHESIS_SYSTEM,
    CODE_SYSTEM,
    LINE_BY_LINE_SYNTHESIS_SYSTEM,
    LINE_BY_LINE_SYSTEM,
    SELECT_SYSTEM,
    STEP_CODE_SYSTEM,
    STEP_WRITER_SYSTEM,
)
from lmlab.methods.decoding.ralu.units import apply_fixes, extract_units

__all__ = [
    "RaLUResult",
    "RaLUSession",
    "UnitTrace",
    "check_unit",
    "clean_spec",
    "confidence",
    "extract_block",
    "extract_core_chars",
    "extract_program",
    "ralu_repair",
    "reasoning_path",
    "step_units",
]

SYNTHESIS_MODES: tuple[str, ...] = ("reassemble", "llm")


# ----------------------------------------------------------------------------------------------------------------
# The official helpers (our implementations of src/extract.py and src/RaLU.py)


def extract_block(response: str, wrap: str = "Fix") -> str | None:
    """Content of the first ``<Fix>...</Fix>`` block (tag spelled as given, lower or upper case), stripped."""
    for w in (wrap, wrap.lower(), wrap.upper()):
        m = re.search(rf"<\s*{w}\s*>(.*?)<\s*/\s*{w}\s*>", response, re.DOTALL)
        if m:
            return m.group(1).strip()
    return None


def extract_core_chars(text: str) -> str:
    """Lower-case letters, digits and ``( ) + - * / = < > ! & | ^ %`` only: what ``check_unit`` compares."""
    return re.sub(r"[^a-zA-Z0-9()+\-*/=<>!&|^%]", "", text.lower())


def check_unit(unit: str, response: str) -> bool:
    """The official acceptance test: the reply's leading letters spell "ok", or its fix equals `unit` on its core
    characters (so a whitespace-only "fix" counts as unchanged).

    Note the leniency the official code has: letters are collected until they spell "ok", so "Okay..." and
    "O.K." pass, and a reply that starts with anything else never does.
    """
    letters = ""
    for c in response:
        if c.isalpha():
            letters += c
        if letters.lower() == "ok":
            return True
        if len(letters) >= 2:
            break
    block = extract_block(response)
    if block is None:
        return False
    return extract_core_chars(block) == extract_core_chars(unit)


def clean_spec(spec: str) -> str:
    """The official specification cleaner: docstring contents, without "Write a function to", plus the target
    signature as ``Format of Target Function: f(x)``."""
    define = ""
    if "def" in spec:
        for line in spec.splitlines():
            if "def" in line:
                define = "\n" + line.replace("def", "Format of Target Function:").strip().strip(":")
                break
    if spec.count('"""') == 2:
        spec = "\n".join(m.strip() for m in re.findall(r'"""(.*?)"""', spec, re.DOTALL))
    for s in ("Write a function to", "Write a python function to", "Write a function that"):
        if s in spec:
            spec = spec.replace(s, "").strip()
    return spec + define


def confidence(token_logprobs: Sequence[float] | None) -> float:
    """The official score: mean over tokens of round(exp(logprob) x 100, 2); -1 when unavailable."""
    if not token_logprobs:
        return -1.0
    vals = [round(math.exp(lp) * 100, 2) for lp in token_logprobs if not math.isnan(lp)]
    return sum(vals) / len(vals) if vals else -1.0


def extract_program(response: str, entry_point: str | None) -> str | None:
    """The program in a reply: a ``<code>`` block, else the last fenced block, else a bare ``def entry_point``."""
    program = extract_block(response, "code")
    if program is None and "```" in response:
        blocks = re.findall(r"```[^\n]*\n(.*?)\n```", response, re.DOTALL)
        program = blocks[-1].strip() if blocks else None
    if program is None and entry_point and response.strip().startswith(f"def {entry_point}"):
        program = "\n".join(line.rstrip() for line in response.splitlines() if line.startswith(("def", "\t", "    ")))
    if program is None:
        return None
    if entry_point is None:
        return program
    if entry_point not in program and entry_point.lower() in program:
        program = program.replace(entry_point.lower(), entry_point)
    if re.search(rf"def {re.escape(entry_point)}\s*\(", program):
        return program
    renamed = re.sub(r"def\s[a-zA-Z_]+\(", f"def {entry_point}(", program)
    return renamed if re.search(rf"def {re.escape(entry_point)}\s*\(", renamed) else None


# ----------------------------------------------------------------------------------------------------------------
# Traces


@dataclass
class Attempt:
    """One call for one unit: the prompt, the reply, what the engine read from it."""

    branch: str
    prompt: str
    response: str
    correct: bool
    fix: str | None
    confidence: float
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class UnitTrace:
    """Everything that happened to one unit.

    Attributes:
        index (`int`): 1-based unit number.
        unit (`str`): the unit as extracted.
        attempts (`list[Attempt]`): the calls, in order (one per branch and validity retry).
        accepted (`str`): the unit text the reasoning path keeps (the reply's fix if it had one, else the prompt).
        decided_by (`str`): ``judge`` (judged correct), ``confidence`` (most confident branch), ``selector`` (the
            LLM picked a branch), ``fallback`` (no valid reply: kept as asked), ``budget`` (not judged: budget spent).
        branch (`str`): the branch the dialogue continues on.
    """

    index: int
    unit: str
    attempts: list[Attempt] = field(default_factory=list)
    accepted: str = ""
    decided_by: str = ""
    branch: str = ""


@dataclass
class RaLUResult:
    """What `ralu_repair` returns.

    Attributes:
        program (`str`): the final program.
        initial_program (`str`): the normalised initial program.
        units (`list[str]`): the unit strings, as shown to the LLM.
        unit_mode (`str`): ``cfg``, ``thirds`` (CFG failed), ``line`` or ``whole``.
        traces (`list[UnitTrace]`): per-unit verdicts, fixes, branches and confidences.
        branches (`dict[str, list[dict]]`): every branch's dialogue (the official ``branches.json``).
        final_branch (`str`): the branch the reasoning path was read from.
        n_calls (`int`): LLM calls (judge/refine calls, selector calls and synthesis calls).
        n_judge_calls (`int`): unit calls only (what the budget counts).
        prompt_tokens (`int`), completion_tokens (`int`): token usage as the backend reports it.
        budget_exhausted (`bool`): the judge-call budget ended the run before the last unit.
        applied (`list[bool]`): per unit, whether its accepted text could be written back (reassembly).
        synthesis (`str`): ``reassemble``, ``llm`` or ``llm->reassemble`` (the LLM gave no valid program).
    """

    program: str
    initial_program: str
    units: list[str]
    unit_mode: str
    traces: list[UnitTrace]
    branches: dict[str, list[dict[str, str]]]
    final_branch: str
    n_calls: int
    n_judge_calls: int
    prompt_tokens: int
    completion_tokens: int
    budget_exhausted: bool
    applied: list[bool]
    synthesis: str

    @property
    def changed(self) -> bool:
        return self.program != self.initial_program

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------------------------------------------
# The engine


class RaLUSession:
    """The official ``RaLU`` state machine over a `ChatBackend` (one chat history per branch).

    Args:
        backend (`ChatBackend`): the LLM.
        ini_user_prompt (`str`): the first user turn (``## Specification\\n<clean spec>``).
        system_msg (`str`): the judge's system prompt (`prompts.CODE_SYSTEM` for CFG units).
        max_valid_num (`int`, defaults to 1): attempts per prompt when a reply is unusable (official default 1).
        threshold (`float`, defaults to 51.0): a unit judged correct needs confidence above this (0-100 scale).
        temperature (`float`, defaults to 0.7): sent with every call.
        max_calls (`int`, *optional*): budget of unit calls; when spent, the remaining units are kept unjudged.
    """

    def __init__(
        self,
        backend: ChatBackend,
        ini_user_prompt: str,
        system_msg: str,
        *,
        max_valid_num: int = 1,
        threshold: float = 51.0,
        temperature: float = 0.7,
        max_calls: int | None = None,
    ):
        if max_valid_num < 1:
            raise ValueError(f"max_valid_num must be >= 1, got {max_valid_num!r}")
        if max_calls is not None and max_calls < 0:
            raise ValueError(f"max_calls must be >= 0 or None, got {max_calls!r}")
        self.backend = backend
        self.system_msg = system_msg
        self.max_valid_num = max_valid_num
        self.threshold = threshold
        self.temperature = temperature
        self.max_calls = max_calls
        self._next_id = 0
        self.current_id = self._new_id()
        self.keep_state: dict[str, list[dict[str, str]]] = {
            self.current_id: [{"role": "user", "content": ini_user_prompt}]
        }
        self.n_calls = 0
        self.n_judge_calls = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.budget_exhausted = False

    def _new_id(self) -> str:
        bid = f"b{self._next_id}"
        self._next_id += 1
        return bid

    def branch_off(self) -> None:
        """A new branch: the current one without its last exchange (user prompt + reply); it becomes current."""
        new_id = self._new_id()
        self.keep_state[new_id] = [dict(m) for m in self.keep_state[self.current_id][:-2]]
        self.current_id = new_id

    def _call(self, messages: list[dict[str, str]], *, judge: bool) -> ChatResponse:
        response = self.backend.chat(messages, temperature=self.temperature, logprobs=True)
        if not isinstance(response, ChatResponse):
            text, lps = response
            response = ChatResponse(text, lps)
        self.n_calls += 1
        self.n_judge_calls += int(judge)
        self.prompt_tokens += response.prompt_tokens
        self.completion_tokens += response.completion_tokens
        return response

    def _budget_left(self) -> bool:
        return self.max_calls is None or self.n_judge_calls < self.max_calls

    def update_state(self, branch: str, prompt: str, response: str) -> None:
        self.keep_state[branch] += [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]

    def get_valid_response(self, unit: str, prompt: str, trace: UnitTrace) -> Attempt | None:
        """Ask up to `max_valid_num` times; None when no reply was usable (the official code crashes there)."""
        last: Attempt | None = None
        for _ in range(self.max_valid_num):
            if not self._budget_left():
                self.budget_exhausted = True
                break
            messages = [{"role": "system", "content": self.system_msg}, *self.keep_state[self.current_id]]
            reply = self._call([*messages, {"role": "user", "content": prompt}], judge=True)
            score = confidence(reply.token_logprobs)
            # the official loop compares fixes with the unit as extracted, also on a branch asking a correction
            correct = check_unit(unit, reply.text)
            fix = extract_block(reply.text)
            attempt = Attempt(self.current_id, prompt, reply.text, correct, fix, score, reply.info)
            trace.attempts.append(attempt)
            last = attempt
            if not correct and fix is not None:
                return attempt
            if correct and (score > self.threshold or score < 0):
                return attempt
        if last is not None:
            last.info = {**last.info, "invalid": True}
        return None

    def most_confident_branch(self, branch_scores: dict[str, float], trace: UnitTrace) -> tuple[str, str]:
        """The branch to continue on when no attempt was judged correct, and how it was chosen."""
        if max(branch_scores.values()) > 0:
            return max(branch_scores, key=branch_scores.get), "confidence"
        prompt = "## Candidates for Next Unit:\n"
        for bid in branch_scores:
            prompt += "<Unit>\n" + self.keep_state[bid][-2]["content"] + "\n</Unit>\n\n"
        for _ in range(self.max_valid_num):
            messages = [
                {"role": "system", "content": SELECT_SYSTEM.format(n=len(branch_scores))},
                {"role": "user", "content": self.system_msg},
                *self.keep_state[self.current_id][:-2],
                {"role": "user", "content": prompt},
            ]
            reply = self._call(messages, judge=False)
            block = extract_block(reply.text, "Unit")
            if block is not None:
                for bid in branch_scores:
                    if extract_core_chars(self.keep_state[bid][-2]["content"]) == extract_core_chars(block):
                        return bid, "selector"
        return list(branch_scores)[-1], "fallback"

    def reason_unit(self, index: int, unit: str, max_branches: int) -> UnitTrace:
        """Judge one unit with rewind-and-correct (the body of the official ``reason`` loop)."""
        trace = UnitTrace(index, unit)
        corrected: str | None = None
        branch_scores: dict[str, float] = {}
        prompt = f"Unit {index}: {unit}"
        for branch_num in range(max_branches + 1):
            if branch_num > 0:
                if not self._budget_left():
                    self.budget_exhausted = True
                    break
                prompt = f"Unit {index}: {corrected}"
                self.branch_off()
            if index == 1:
                prompt = "## Process\n" + prompt
            attempt = self.get_valid_response(unit, prompt, trace)
            if attempt is None:
                # no usable reply: keep the unit as asked on this branch (the official code raises here)
                last = trace.attempts[-1] if trace.attempts and trace.attempts[-1].branch == self.current_id else None
                if last is not None and last.prompt == prompt:
                    self.update_state(self.current_id, prompt, last.response)
                    trace.accepted = _unit_of(prompt)
                    # judged correct at low confidence (or wrong without a fix) and no retry left: keep it
                    trace.decided_by = "low_confidence" if last.correct else "fallback"
                    trace.branch = self.current_id
                    return trace
                break  # the budget ran out before this attempt
            self.update_state(self.current_id, prompt, attempt.response)
            if attempt.correct:
                trace.accepted = attempt.fix if attempt.fix is not None else _unit_of(prompt)
                trace.decided_by = "judge"
                trace.branch = self.current_id
                return trace
            corrected = attempt.fix
            branch_scores[self.current_id] = attempt.confidence
        if not branch_scores:  # budget spent before the first call
            trace.accepted = unit
            trace.decided_by = "budget"
            trace.branch = self.current_id
            return trace
        if self.budget_exhausted and len(branch_scores) < max_branches + 1:
            best = max(branch_scores, key=branch_scores.get)
            decided = "budget"
        else:
            best, decided = self.most_confident_branch(branch_scores, trace)
        self.current_id = best
        trace.accepted = extract_block(self.keep_state[best][-1]["content"]) or _unit_of(
            self.keep_state[best][-2]["content"]
        )
        trace.decided_by = decided
        trace.branch = best
        return trace

    def reason(self, units: Sequence[str], max_branches: int = 3) -> list[UnitTrace]:
        """Align every unit in order (the official ``reason``)."""
        if max_branches < 0:
            raise ValueError(f"max_branches must be >= 0, got {max_branches!r}")
        traces = []
        for k, unit in enumerate(units, start=1):
            if not self._budget_left():
                self.budget_exhausted = True
                traces.append(UnitTrace(k, unit, [], unit, "budget", self.current_id))
                continue
            traces.append(self.reason_unit(k, unit, max_branches))
        return traces

    def synthesize_code(self, system: str, spec: str, entry_point: str) -> str | None:
        """The official ``coding``: the LLM writes the program from the reasoning path and the specification."""
        path = reasoning_path(self.keep_state[self.current_id])
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": "# Reasoning Path\n" + "\n\n".join(path)},
            {"role": "user", "content": spec},
        ]
        for _ in range(self.max_valid_num):
            reply = self._call(messages, judge=False)
            program = extract_program(reply.text, entry_point)
            if program is not None:
                return program
        return None


def _unit_of(prompt: str) -> str:
    """The unit text of a ``[## Process\\n]Unit k: <unit>`` prompt."""
    m = re.match(r"^(?:## Process\n)?Unit \d+: (.*)$", prompt, re.DOTALL)
    return m.group(1) if m else prompt


def reasoning_path(state: Sequence[Mapping[str, str]]) -> list[str]:
    """Every unit prompt followed by the ``Analysis:`` part of its reply (the official synthesis input)."""
    items: list[str] = []
    turns = list(state[1:])
    for i, turn in enumerate(turns):
        if turn["role"] == "user":
            items.append(turn["content"])
            reply = turns[i + 1]["content"] if i + 1 < len(turns) else ""
            parts = re.split(r"Analysis\s*:", reply, maxsplit=1)
            items.append(parts[1].strip() if len(parts) > 1 else "")
    return items


def step_units(backend: ChatBackend, spec: str, entry_point: str, *, max_valid_num: int = 1) -> list[str]:
    """The official ``step_code`` ablation's units: natural-language steps the LLM writes in ``<Step>`` blocks."""
    messages = [
        {"role": "system", "content": STEP_WRITER_SYSTEM},
        {"role": "user", "content": f"## Specification\n{clean_spec(spec)}\nEntry point: {entry_point}"},
    ]
    for _ in range(max_valid_num):
        reply = backend.chat(messages, temperature=0.7, logprobs=False)
        steps = re.findall(r"<\s*Step\s*>(.*?)<\s*/\s*Step\s*>", reply.text, re.DOTALL | re.IGNORECASE)
        if steps:
            return [x.strip() for x in steps]
    raise ValueError("the LLM wrote no <Step> block; expected at least one")


# ----------------------------------------------------------------------------------------------------------------
# Entry point


def ralu_repair(
    spec: str,
    program: str | Program,
    backend: ChatBackend,
    *,
    unit_mode: str = "cfg",
    entry_point: str | None = None,
    max_branches: int = 3,
    max_valid_num: int = 1,
    threshold: float = 51.0,
    temperature: float = 0.7,
    max_calls: int | None = None,
    synthesis: str = "reassemble",
    system_msg: str | None = None,
    units: Sequence[LogicUnit] | None = None,
    language: str = "Python",
) -> RaLUResult:
    """Run RaLU on a specification and an initial program; return the final program and the full trace.

    Args:
        spec (`str`): the task (for HumanEval: the prompt with signature and docstring; cleaned by `clean_spec`).
        program (`str | Program`): the initial program.
        backend (`ChatBackend`): the LLM (`HFChatBackend`, `OpenAIChatBackend`, `OracleJudgeBackend`, ...).
        unit_mode (`str`, defaults to ``"cfg"``): ``cfg`` (official), ``line`` (official ablation), ``step`` (the
            official step ablation: the LLM writes natural-language steps; needs ``synthesis="llm"``) or ``whole``
            (the whole program as one unit: self-refinement).
        entry_point (`str`, *optional*): the function under test (drops its definition unit; names the program).
        max_branches (`int`, defaults to 3): rewinds per unit (official 3, so at most 4 attempts).
        max_valid_num (`int`, defaults to 1): attempts per prompt when a reply is unusable (official 1).
        threshold (`float`, defaults to 51.0): confidence a unit judged correct must exceed.
        temperature (`float`, defaults to 0.7): sent with every call.
        max_calls (`int`, *optional*): budget of unit calls (the experiment equalises it across systems).
        synthesis (`str`, defaults to ``"reassemble"``): ``reassemble`` writes the accepted units back into the
            program; ``llm`` asks the backend for the final program (official), falling back to reassembly when it
            gives none.
        system_msg (`str`, *optional*): overrides the official system prompt of the unit mode.
        units (`Sequence[LogicUnit]`, *optional*): precomputed units (else extracted from `program`).
        language (`str`, defaults to ``"Python"``): named in the synthesis prompt.

    Returns:
        `RaLUResult`
    """
    if synthesis not in SYNTHESIS_MODES:
        raise ValueError(f"synthesis must be one of {', '.join(SYNTHESIS_MODES)}, got {synthesis!r}")
    prog = program if isinstance(program, Program) else Program.parse(program)
    if unit_mode == "step":
        # natural-language steps cannot be written back into the program: the LLM writes the final one
        if synthesis != "llm":
            raise ValueError(f"unit_mode='step' needs synthesis='llm', got synthesis={synthesis!r}")
        texts = step_units(backend, spec, entry_point or "", max_valid_num=max_valid_num)
        unit_list, used = [LogicUnit(t) for t in texts], "step"
    elif units is None:
        unit_list, used = extract_units(prog, unit_mode, entry_point)
    else:
        unit_list, used = list(units), unit_mode
    if system_msg is None:
        system_msg = {"line": LINE_BY_LINE_SYSTEM, "step": STEP_CODE_SYSTEM}.get(unit_mode, CODE_SYSTEM)
    spec_text = clean_spec(spec)
    ini = f"## Specification\n{spec_text}\n\n" if unit_mode == "line" else f"## Specification\n{spec_text}"
    session = RaLUSession(
        backend,
        ini,
        system_msg,
        max_valid_num=max_valid_num,
        threshold=threshold,
        temperature=temperature,
        max_calls=max_calls,
    )
    traces = session.reason([u.text for u in unit_list], max_branches=max_branches)
    read_mode = "line" if unit_mode == "line" else "cfg"
    final, applied = apply_fixes(prog, [(u, t.accepted) for u, t in zip(unit_list, traces)], read_mode)
    how = "reassemble"
    if synthesis == "llm":
        template = LINE_BY_LINE_SYNTHESIS_SYSTEM if unit_mode == "line" else CODE_SYNTHESIS_SYSTEM
        system = template.format(language=language, entry_point=entry_point or "the main function")
        written = session.synthesize_code(system, spec, entry_point or "")
        if written is not None:
            final, how = written, "llm"
        else:
            how = "llm->reassemble"
    return RaLUResult(
        program=final,
        initial_program=prog.source,
        units=[u.text for u in unit_list],
        unit_mode=used,
        traces=traces,
        branches={k: [dict(m) for m in v] for k, v in session.keep_state.items()},
        final_branch=session.current_id,
        n_calls=session.n_calls,
        n_judge_calls=session.n_judge_calls,
        prompt_tokens=session.prompt_tokens,
        completion_tokens=session.completion_tokens,
        budget_exhausted=session.budget_exhausted,
        applied=applied,
        synthesis=how,
    )
