"""SWIFTCODE: y*(x) = lexmin_{y ∈ C(x), correct(y)} (ET(y) up to a margin, MU(y), |y|); then SFT on (x, y*(x)).

Huang, Zeng, Dai, Luo, Weng, Qing, Cui, Guo & Zhang, "SwiftCoder: Enhancing Code Generation in Large Language Models
through Efficiency-Aware Fine-tuning" (ICML 2025, arXiv 2410.10209; earlier versions "EffiCoder"); official code
https://github.com/huangd1999/EffiCoder (the released data, LLaMA-Factory SFT configs and the EffiBench-style
evaluation scripts; the candidate generation and selection code is not in it). Pure: no file I/O, no printing;
every candidate program runs only inside `lmlab.core.execution.sandbox` (never in this process: the parent only parses
code
with `ast`, which executes nothing).

* Candidates C(x) for a task x come from several generators, each labelled (`Candidate.source`): samples of code
  LLMs (``"llm:<model>"``) and, standing in for the paper's stronger LLMs, the variant bank of `tasks.py`
  (``"template"``: correct fast, correct slow and buggy programs).
* Correctness first: a candidate must pass the task's small tests and return the reference value on the stress
  input (weak tests would let fast-but-wrong code win). A correct candidate that exceeds the time or memory limit
  on the stress input is ``over_limit``: still correct, ranked last, never called incorrect.
* Efficiency on the stress input, EffiBench's metrics (official ``calculate_memory_usage.py``):
  ET = execution time (here min over `runs` sandbox runs of the min of `repeat` timed calls, `time.perf_counter`
  around the bare call), MU = peak memory (here the `tracemalloc` peak of one separate untimed call; timing never
  runs with tracemalloc on), TMU ≈ MU · ET; normalised against the task's canonical solution:
  NET = ET / ET_canonical, NMU = MU / MU_canonical.
* Selection (`select_most_efficient`), ``rule="lexicographic"`` (default): t* = min ET over the correct candidates;
  the tie set is {y : ET(y) <= margin · t*} (timing noise is ~±30% under load, so closer times do not rank);
  among it the lowest MU, then the shortest source, then the earliest. ``rule="combined"``: the lowest MU · ET
  (TMU proxy), then the shortest. The paper says only "the lowest execution time and memory"; its combination
  rule is not published.
* SFT on the kept (x, y*) pairs (`lmlab.core.training.sft`); the baseline fine-tunes on a random correct candidate of
the
  same tasks (`select_random_correct`), same number of examples and steps.
* ``timing="lines"`` replaces ET by a deterministic cost, the number of Python line events of the call under
  ``sys.settrace`` inside the sandbox. It is exact across runs (tests and the smoke preset) but blind to work
  done in C (``x in list``, ``str.count``, string concatenation), so it ranks only pure-Python loops correctly.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lmlab.methods.alignment.swiftcode.tasks import KINDS, CodeTask, Family

RULES = ("lexicographic", "combined")
TIMINGS = ("wall", "lines")
TEMPLATE_SOURCE = "template"
# `over_limit`: passed the small tests, then hit the time or memory limit on the stress input (correct, ranked last)
CORRECT_STATUSES = ("correct", "over_limit")
STATUSES = (*CORRECT_STATUSES, "wrong_answer", "runtime_error", "timeout", "memory_error", "no_code", "refused")
CODE_FENCE = "```python\n"  # the assistant turn starts with it (prompt side); the response ends with CODE_END
CODE_END = "```"
INSTRUCTION = "Answer with the Python function only."
COST_MARKER = "__SWIFTCODE_COST__"

# Runs inside the sandbox (appended to the task's test code): after one untraced warm-up call, the line events of one
# call on the stress input under sys.settrace, then the tracemalloc peak of another untraced call; one marker line.
_LINE_HARNESS = """
import copy as _sc_copy, sys as _sc_sys, tracemalloc as _sc_tm


def _sc_cost(fn, args, expected):
    count = [0]

    def local(frame, event, arg):
        if event == "line":
            count[0] += 1
        return local

    def enter(frame, event, arg):
        return local

    fn(*_sc_copy.deepcopy(args))  # warm-up: first-call caches (ABC checks, imports) would add lines to run 1 only
    a = _sc_copy.deepcopy(args)
    _sc_sys.settrace(enter)
    try:
        out = fn(*a)
    finally:
        _sc_sys.settrace(None)
    assert out == expected, "stress input: wrong value"
    a = _sc_copy.deepcopy(args)
    _sc_tm.start()
    try:
        fn(*a)
        peak = _sc_tm.get_traced_memory()[1]
    finally:
        _sc_tm.stop()
    print("%s %d %d" % ({marker!r}, count[0], peak), flush=True)


_sc_cost({entry}, {args!r}, {expected!r})
"""


# ---------------------------------------------------------------------------------------------------------------
# candidates


@dataclass(frozen=True)
class Candidate:
    """One candidate program for one task.

    Attributes:
        task_id (`str`); source (`str`): the generator (``"template"`` or ``"llm:<model>"``); name (`str`): the
        variant name or sample index; code (`str` or None): the program (None: the generator produced no code).
        kind (`str`, *optional*): the bank's label (fast / slow / buggy) for template candidates, else None.
    """

    task_id: str
    source: str
    name: str
    code: str | None
    kind: str | None = None


def template_candidates(task: CodeTask, family: Family, kinds: Sequence[str] = KINDS) -> list[Candidate]:
    """The variant bank of `family` rendered under `task`'s names (the programmatic generator, source C)."""
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"template kinds must be among {KINDS}, got {bad}")
    return [Candidate(task.id, TEMPLATE_SOURCE, v.name, task.render(v), v.kind) for v in family.variants
            if v.kind in kinds]  # fmt: skip


def user_prompt(task: CodeTask) -> str:
    """The user turn of a task: its statement and the answer-format instruction."""
    return f"{task.prompt} {INSTRUCTION}"


def extract_code(text: str, entry_point: str) -> str | None:
    """The program in a model's answer to a prompt that ended with ``CODE_FENCE``: the text before the closing fence
    (or, when the model opened a fence itself, the first fenced block), or None when no ``def <entry_point>(`` is in
    it. Only string handling: nothing is parsed or run."""
    if CODE_FENCE in text:  # the model wrote its own opening fence
        text = text.split(CODE_FENCE, 1)[1]
    code = text.split(CODE_END, 1)[0].rstrip()
    if f"def {entry_point}(" not in code:
        return None
    return code + "\n"


def normalized_ast(code: str | None) -> str | None:
    """``ast.dump`` of the parsed program (None for no code or a syntax error): equal for sources differing only in
    formatting and comments. `ast.parse` only parses; nothing runs."""
    if code is None:
        return None
    try:
        return ast.dump(ast.parse(code))
    except (SyntaxError, ValueError):
        return None


def dedupe_candidates(cands: Sequence[Candidate]) -> list[Candidate]:
    """Drop candidates of a task whose normalised AST repeats an earlier one (programs without a parse stay)."""
    seen: set[tuple[str, str]] = set()
    out = []
    for c in cands:
        key = normalized_ast(c.code)
        if key is not None:
            if (c.task_id, key) in seen:
                continue
            seen.add((c.task_id, key))
        out.append(c)
    return out


# ---------------------------------------------------------------------------------------------------------------
# measurement (sandbox only)


@dataclass(frozen=True)
class MeasureSettings:
    """How candidates are run and measured.

    Args:
        timing (`str`, defaults to ``"wall"``): ``wall`` (perf_counter seconds) or ``lines`` (line events).
        runs (`int`, defaults to 2): separate sandbox runs timing the stress call; ET is the minimum over them.
        repeat (`int`, defaults to 3): timed calls per run (min of k).
        timeout_s (`float`), memory_mb (`int`): `SandboxLimits` of one run.
        workers (`int`, defaults to 2): parallel sandboxes.
        backend (`str`, defaults to ``"unshare"``), allow_unsandboxed (`bool`, defaults to `False`): see
            `lmlab.core.execution.sandbox.run_code`; without a sandbox every candidate is ``refused``.
    """

    timing: str = "wall"
    runs: int = 2
    repeat: int = 3
    timeout_s: float = 10.0
    memory_mb: int = 512
    workers: int = 2
    backend: str = "unshare"
    allow_unsandboxed: bool = False

    def __post_init__(self) -> None:
        if self.timing not in TIMINGS:
            raise ValueError(f"timing must be one of {', '.join(TIMINGS)}, got {self.timing!r}")
        for name, lo in (("runs", 1), ("repeat", 1), ("workers", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")

    def limits(self) -> Any:
        from lmlab.core.execution.sandbox import SandboxLimits

        return SandboxLimits(timeout_s=float(self.timeout_s), memory_mb=int(self.memory_mb))


@dataclass
class Measurement:
    """Correctness and efficiency of one program on one task.

    Attributes:
        task_id (`str`); status (`str`): one of `STATUSES`; reason (`str`): one line.
        time (`float`): ET, seconds (``timing="wall"``) or line events (``"lines"``): the minimum over runs; `inf`
            when not measured (incorrect, over the limit).
        times (`list[float]`): the per-run values (min of `repeat` each).
        peak_bytes (`int`, *optional*): MU, the tracemalloc peak of one untimed stress call.
        code_len (`int`): characters of the program (the last tie-breaker).
        unit (`str`): ``"s"`` or ``"lines"``.
    """

    task_id: str
    status: str
    reason: str = ""
    time: float = math.inf
    times: list[float] = field(default_factory=list)
    peak_bytes: int | None = None
    code_len: int = 0
    unit: str = "s"

    @property
    def correct(self) -> bool:
        return self.status in CORRECT_STATUSES

    @property
    def timed(self) -> bool:
        """Correct with a finite ET (a measured candidate, not over the limit)."""
        return self.status == "correct" and math.isfinite(self.time)

    def ratios(self, canonical: Measurement) -> tuple[float, float]:
        """(NET, NMU) against the task's canonical solution; NaN where either side is unmeasured. Memory ratios add
        one byte to both sides (a canonical peak can be a few bytes)."""
        if not (self.timed and canonical.timed) or canonical.time <= 0:
            return math.nan, math.nan
        net = self.time / canonical.time
        if self.peak_bytes is None or canonical.peak_bytes is None:
            return net, math.nan
        return net, (self.peak_bytes + 1) / (canonical.peak_bytes + 1)


def _check_job(task: CodeTask, code: str, s: MeasureSettings, *, with_tests: bool, memory: bool) -> dict[str, Any]:
    """The `run_code` arguments of one run: small tests (optional), then the stress input."""
    from lmlab.core.execution.sandbox import CallSpec

    job: dict[str, Any] = {"source": code, "entry_point": task.entry_point}
    tests = task.test_code() if with_tests else ""
    if s.timing == "lines":
        harness = _LINE_HARNESS.format(marker=COST_MARKER, entry=task.entry_point, args=list(task.stress_args),
                                       expected=task.stress_expected)  # fmt: skip
        job["test"] = tests + harness
    else:
        job["test"] = tests or None
        job["calls"] = [CallSpec(args=list(task.stress_args), repeat=s.repeat, memory=memory,
                                 expected=task.stress_expected, label="stress")]  # fmt: skip
    return job


def _cost_line(stdout: str) -> tuple[float, int] | None:
    for line in reversed(stdout.splitlines()):
        parts = line.split()
        if len(parts) == 3 and parts[0] == COST_MARKER:
            return float(parts[1]), int(parts[2])
    return None


def _read(r: Any, s: MeasureSettings) -> tuple[str, float, int | None]:
    """(status, value, peak) of one finished run: status ``ok`` with the stress measurement, or a sandbox status."""
    if r.status != "passed":
        return r.status, math.inf, None
    if s.timing == "lines":
        got = _cost_line(r.stdout)
        if got is None:
            return "runtime_error", math.inf, None
        return "ok", got[0], got[1]
    calls = r.calls
    if not calls or calls[0].get("best_s") is None:
        return "runtime_error", math.inf, None
    return "ok", float(calls[0]["best_s"]), calls[0].get("peak_bytes")


def _phase(r: Any) -> str | None:
    return (r.runner or {}).get("phase")


def measure_many(items: Sequence[tuple[CodeTask, str | None]], settings: MeasureSettings) -> list[Measurement]:
    """Measure programs on their tasks, all in `lmlab.core.execution.sandbox` (`run_many`, `settings.workers` at a
    time).

    Run 1 per program: the small tests, then the stress call (checked against the reference value; timed, with one
    extra tracemalloc call for MU). A limit hit in the stress call makes it ``over_limit``; a limit hit whose phase
    is unknown (wall-clock kill, or the ``lines`` harness) is resolved by one more run of the small tests alone.
    Runs 2..`runs`: the stress call again (no tracemalloc), for programs still ``correct``; a run that now fails
    makes the program ``wrong_answer`` (a flaky program is not correct).

    Args:
        items: (task, program source or None) pairs; None is ``no_code`` (nothing runs).
        settings (`MeasureSettings`).
    """
    from lmlab.core.execution.sandbox import run_many

    s = settings
    lim = s.limits()
    common = dict(limits=lim, backend=s.backend, allow_unsandboxed=s.allow_unsandboxed)
    out: list[Measurement] = []
    for task, code in items:
        m = Measurement(task.id, "no_code", "the generator gave no function", unit="lines" if s.timing == "lines"
                        else "s", code_len=len(code or ""))  # fmt: skip
        out.append(m)
    todo = [i for i, (_, code) in enumerate(items) if code is not None]
    first = run_many([_check_job(items[i][0], items[i][1], s, with_tests=True, memory=True) for i in todo],
                     workers=s.workers, **common)  # fmt: skip
    recheck = []
    for i, r in zip(todo, first):
        m = out[i]
        status, value, peak = _read(r, s)
        if status == "ok":
            m.status, m.reason, m.time, m.times, m.peak_bytes = "correct", "passed", value, [value], peak
        elif status in ("timeout", "memory_error") and _phase(r) == "calls":
            m.status, m.reason = "over_limit", f"small tests passed; stress input: {r.reason}"
        elif status in ("timeout", "memory_error") and _phase(r) not in ("source",):
            recheck.append(i)
            m.status, m.reason = status, r.reason
        else:
            m.status, m.reason = status, r.reason
    if recheck:  # did the small tests pass before the limit was hit?
        again = run_many([{"source": items[i][1], "test": items[i][0].test_code(),
                           "entry_point": items[i][0].entry_point} for i in recheck], workers=s.workers,
                         **common)  # fmt: skip
        for i, r in zip(recheck, again):
            if r.status == "passed":
                out[i].status, out[i].reason = "over_limit", f"small tests passed; stress input: {out[i].reason}"
    for _ in range(s.runs - 1):
        timed = [i for i in todo if out[i].status == "correct"]
        if not timed:
            break
        rs = run_many([_check_job(items[i][0], items[i][1], s, with_tests=False, memory=False) for i in timed],
                      workers=s.workers, **common)  # fmt: skip
        for i, r in zip(timed, rs):
            m = out[i]
            status, value, _ = _read(r, s)
            if status == "ok":
                m.times.append(value)
                m.time = min(m.time, value)
            elif status in ("timeout", "memory_error"):
                m.times.append(math.inf)  # a limit hit now: the earlier run's time stands (the minimum)
            else:
                m.status, m.reason, m.time = "wrong_answer", f"a later run failed: {r.reason}", math.inf
    return out


def measure_efficiency(task: CodeTask, code: str | None, settings: MeasureSettings | None = None) -> Measurement:
    """One program on one task (see `measure_many`)."""
    return measure_many([(task, code)], settings or MeasureSettings())[0]


# ---------------------------------------------------------------------------------------------------------------
# selection


def _check_rule(rule: str, time_margin: float) -> None:
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
    if not (isinstance(time_margin, int | float) and math.isfinite(time_margin) and time_margin >= 1.0):
        raise ValueError(f"time_margin must be a finite number >= 1 (a time ratio), got {time_margin!r}")


def select_most_efficient(
    ms: Sequence[Measurement], *, rule: str = "lexicographic", time_margin: float = 1.5
) -> int | None:
    """Index of the most efficient correct candidate (see the module docstring), or None when none is correct.

    Over-limit candidates (correct, ET unmeasured) come after every timed one, ordered by length.
    """
    _check_rule(rule, time_margin)
    timed = [i for i, m in enumerate(ms) if m.timed]
    if timed:
        if rule == "lexicographic":
            best = min(ms[i].time for i in timed)
            ties = [i for i in timed if ms[i].time <= time_margin * best]
            mem = {i: ms[i].peak_bytes if ms[i].peak_bytes is not None else math.inf for i in ties}
            return min(ties, key=lambda i: (mem[i], ms[i].code_len, i))
        tmu = {i: ms[i].time * (ms[i].peak_bytes if ms[i].peak_bytes is not None else math.inf) for i in timed}
        return min(timed, key=lambda i: (tmu[i], ms[i].code_len, i))
    over = [i for i, m in enumerate(ms) if m.status == "over_limit"]
    return min(over, key=lambda i: (ms[i].code_len, i)) if over else None


def select_random_correct(ms: Sequence[Measurement], rng: np.random.Generator) -> int | None:
    """A uniformly random correct candidate (the baseline: correctness filtering without efficiency), or None."""
    ok = [i for i, m in enumerate(ms) if m.correct]
    return int(ok[int(rng.integers(len(ok)))]) if ok else None


def select_slowest_correct(ms: Sequence[Measurement]) -> int | None:
    """The slowest correct candidate (a control): over-limit first, then the highest ET, then the earliest."""
    ok = [i for i, m in enumerate(ms) if m.correct]
    if not ok:
        return None
    return min(ok, key=lambda i: (-(ms[i].time if ms[i].status == "correct" else math.inf), i))


@dataclass
class TaskSelection:
    """What SWIFTCODE kept for one task.

    Attributes:
        task (`CodeTask`); candidates (`list[Candidate]`); measurements (`list[Measurement]`), aligned with them;
        chosen (`int`, *optional*): the kept candidate's index (None: no correct candidate, the task is dropped).
    """

    task: CodeTask
    candidates: list[Candidate]
    measurements: list[Measurement]
    chosen: int | None

    @property
    def kept(self) -> Candidate | None:
        return None if self.chosen is None else self.candidates[self.chosen]


def swiftcode_select(
    tasks: Sequence[CodeTask],
    candidates: Sequence[Sequence[Candidate]],
    settings: MeasureSettings | None = None,
    *,
    rule: str = "lexicographic",
    time_margin: float = 1.5,
) -> list[TaskSelection]:
    """Measure every candidate of every task in the sandbox and keep the most efficient correct one per task.

    Example:
        >>> from lmlab.methods.alignment.swiftcode.tasks import FAMILIES, build_tasks
        >>> train, _ = build_tasks(["pair_sum"], 2, 0, seed=0)
        >>> cands = [template_candidates(t, FAMILIES[t.family]) for t in train]
        >>> sel = swiftcode_select(train, cands)
        >>> [s.kept.name for s in sel]          # the O(n) one-pass dict, not the double loop

    Args:
        tasks (`Sequence[CodeTask]`); candidates: one list per task (any generators).
        settings (`MeasureSettings`, *optional*); rule (`str`), time_margin (`float`): see `select_most_efficient`.

    Raises:
        `ValueError`: for unequal lengths, no task, or a bad rule / margin.
    """
    _check_rule(rule, time_margin)
    if len(tasks) != len(candidates):
        raise ValueError(f"got {len(tasks)} tasks but {len(candidates)} candidate lists; expected one list per task")
    if not tasks:
        raise ValueError("tasks is empty: need at least one task to select for")
    flat = [(t, c) for t, cs in zip(tasks, candidates) for c in cs]
    ms = measure_many([(t, c.code) for t, c in flat], settings or MeasureSettings())
    out, k = [], 0
    for t, cs in zip(tasks, candidates):
        mine = ms[k : k + len(cs)]
        k += len(cs)
        out.append(TaskSelection(t, list(cs), list(mine), select_most_efficient(mine, rule=rule,
                                                                                time_margin=time_margin)))  # fmt: skip
    return out
