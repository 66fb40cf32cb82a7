"""The response cache's query suites (``mixed``): which `lmlab.data` suites each task draws from, and the queries.

The model-variant zoo (`lmlab.zoo`) answers these queries and `lmlab.data.respcache` stores the graded results;
this module holds only the data side, so the data layer (e.g. the `prefs` suite, which rebuilds a cache's queries)
never imports the zoo.

Suite ``mixed``: exact-graded queries from `lmlab.data` suites, interleaved by task so any prefix is balanced
(`MIXED_TASKS`: arithmetic word problems with 1 and 2 digits, country capital / currency / continent, word
reversal, letter counting, composition of two permutations of S3). Each query is graded by its suite's own grader
(`lmlab.data.grade`). The continent task is multiple choice over `CONTINENT_OPTIONS` (`MC_OPTIONS`: the order of
every row's ``option_probs``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmlab import data as lmdata
from lmlab.data import Example


@dataclass(frozen=True)
class TaskDef:
    """One task of a zoo suite: which `lmlab.data` suite generates it (with which keywords) and its tags."""

    name: str
    suite: str
    kwargs: dict[str, Any]
    tags: tuple[str, ...]
    suffix: str = ""  # an answer-format instruction appended to the suite's prompt (short answers fit the budget)


_NUMBER_ONLY = " Answer with the number only."
MIXED_TASKS: tuple[TaskDef, ...] = (
    TaskDef("arith1", "arithmetic", {"kind": "word", "digits": 1}, ("arithmetic", "math"), _NUMBER_ONLY),
    TaskDef("arith2", "arithmetic", {"kind": "word", "digits": 2}, ("arithmetic", "math"), _NUMBER_ONLY),
    TaskDef("capital", "countries", {"task": "capital"}, ("geography", "facts")),
    TaskDef("currency", "countries", {"task": "currency"}, ("geography", "facts")),
    TaskDef("continent", "countries", {"task": "continent"}, ("geography", "facts", "mc")),
    # issue 35: `reverse` (0% for every variant) gave way to `uppercase` (a probe of 10 queries per task at data
    # seed 1: smol 0.0, smol-fewshot 0.7, gemma-fewshot 0.7: format-following separates the variants), and the
    # permutations compose 3 steps (test pool 105 >= 60 queries; length 2 had 25) at a similar accuracy (0.1-0.3)
    TaskDef("uppercase", "strings", {"task": "uppercase"}, ("strings", "symbolic")),
    TaskDef("count", "strings", {"task": "count"}, ("strings", "counting")),
    TaskDef("permutations", "permutations", {"n_elements": 3, "length": 3}, ("symbolic", "state_tracking")),
)
ZOO_SUITES: dict[str, tuple[TaskDef, ...]] = {"mixed": MIXED_TASKS}

# Multiple-choice options of the continent task, in the order of every row's `option_probs`.
CONTINENT_OPTIONS: tuple[str, ...] = ("Africa", "Asia", "Europe", "North America", "Oceania", "South America")
MC_OPTIONS: dict[str, tuple[str, ...]] = {"continent": CONTINENT_OPTIONS}


@dataclass(frozen=True)
class Query:
    """One query of a zoo suite: the suite's example, its task and the `lmlab.data` suite that grades it."""

    example: Example
    task: str
    suite: str
    tags: tuple[str, ...]
    suffix: str = ""

    @property
    def id(self) -> str:
        return self.example.id

    @property
    def prompt(self) -> str:
        """The suite's prompt plus the task's answer-format suffix (what every variant but ``pot`` is asked)."""
        return self.example.prompt + self.suffix

    def grade(self, output: str) -> float:
        return float(lmdata.grade(self.suite, self.example, output))


def _task_defs(suite: str) -> tuple[TaskDef, ...]:
    if suite not in ZOO_SUITES:
        raise ValueError(f"suite must be one of {', '.join(ZOO_SUITES)}, got {suite!r}")
    return ZOO_SUITES[suite]


def suite_queries(suite: str = "mixed", n: int = 120, seed: int = 0, split: str = "test") -> list[Query]:
    """`n` queries of `suite`, split as evenly as possible over its tasks and interleaved round-robin by task."""
    defs = _task_defs(suite)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1 (queries of suite {suite!r}), got {n!r}")
    # n < len(defs): the first n tasks get one query each
    per = [n // len(defs) + (1 if i < n % len(defs) else 0) for i in range(len(defs))]
    by_task: list[list[Query]] = []
    for d, k in zip(defs, per):
        if k == 0:
            continue
        try:
            exs = lmdata.load(d.suite, k, seed=seed, split=split, **d.kwargs)
        except ValueError as e:
            raise ValueError(f"task {d.name!r} of suite {suite!r} cannot give {k} queries ({e}); lower n") from None
        by_task.append([Query(e, d.name, d.suite, d.tags, d.suffix) for e in exs])
    out: list[Query] = []
    for i in range(max(per)):
        out += [qs[i] for qs in by_task if i < len(qs)]
    return out


__all__ = [
    "CONTINENT_OPTIONS",
    "MC_OPTIONS",
    "MIXED_TASKS",
    "ZOO_SUITES",
    "Query",
    "TaskDef",
    "suite_queries",
]
