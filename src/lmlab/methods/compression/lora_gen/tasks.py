"""LoRA-Gen's multi-task benchmark, built from lmlab's seeded suites: a task is a relation x an output format.

Relations (the suite supplying inputs and gold answers):
- ``capital``, ``continent``: `countries` (input: the country's name);
- ``first_letter``, ``last_letter``, ``uppercase``: `strings` (input: the word).

Formats: ``plain`` (the answer), ``upper`` (the answer in capitals), ``bracket`` (``[answer]``). ``uppercase x
upper`` is the same task as ``uppercase x plain`` and is never built.

Every task shares its query format with the others of its input type (``"France ->"``, ``"planet ->"``), so the bare
query does not say which task is wanted: only the system prompt (a description of the relation and the format plus
few-shot examples) does. That is the set-up in which LoRA-Gen's generated LoRA can beat one conventional multi-task
LoRA, and in which removing the system prompt from the edge model's context is a real compression.

Splits: queries come from each suite's own seeded splits (countries by ISO code, words by hash), so a test query is
never a training query or a shot; few-shot examples come from the train split. Unseen tasks are whole (relation,
format) pairs whose system prompts never reach the generator during training; their relation and their format each
occur in other training tasks (compositional generalisation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

RELATIONS: dict[str, tuple[str, str, str]] = {
    # name: (suite, suite task, description)
    "capital": ("countries", "capital", "Given a country, reply with the name of its capital city."),
    "continent": ("countries", "continent", "Given a country, reply with the continent it is located on."),
    "first_letter": ("strings", "first_letter", "Given a word, reply with the first letter of the word."),
    "last_letter": ("strings", "last_letter", "Given a word, reply with the last letter of the word."),
    "uppercase": ("strings", "uppercase", "Given a word, reply with the whole word written in capital letters."),
}
FORMATS: dict[str, tuple[Callable[[str], str], str]] = {
    "plain": (lambda t: t, "Write the answer exactly as it is, with nothing else."),
    "upper": (lambda t: t.upper(), "Write the answer in capital letters only, with nothing else."),
    "bracket": (lambda t: f"[{t}]", "Write the answer inside square brackets, like [answer], with nothing else."),
}


@dataclass(frozen=True)
class Item:
    """One query of a task: the edge input (``"France ->"``), the formatted gold answer, the source example id."""

    query: str
    answer: str
    source_id: str


@dataclass
class Task:
    """A (relation, format) task with its train / test items and its system prompts (one per variant)."""

    relation: str
    fmt: str
    train: list[Item]
    test: list[Item]
    prompts: list[str]
    seen: bool

    @property
    def name(self) -> str:
        return f"{self.relation}/{self.fmt}"

    @property
    def description(self) -> str:
        return f"{RELATIONS[self.relation][2]} {FORMATS[self.fmt][1]}"


def task_names(relations: list[str], formats: list[str]) -> list[str]:
    """All valid ``relation/format`` names, in order."""
    return [f"{r}/{f}" for r in relations for f in formats if not (r == "uppercase" and f == "upper")]


def _query(suite: str, ex: Any) -> str:
    return f"{ex.meta['country'] if suite == 'countries' else ex.meta['word']} ->"


def system_prompt(relation: str, fmt: str, shots: list[Item]) -> str:
    """The task's system prompt: description, then one ``query answer`` line per shot; ends with a newline."""
    lines = [f"{RELATIONS[relation][2]} {FORMATS[fmt][1]}"] + [f"{s.query} {s.answer}" for s in shots]
    return "\n".join(lines) + "\n"


def build_tasks(
    load: Callable[..., list[Any]],
    relations: list[str],
    formats: list[str],
    unseen: list[str],
    *,
    n_train: int,
    n_test: int,
    n_shots: int,
    n_variants: int,
) -> list[Task]:
    """Build every task of `relations` x `formats`.

    Args:
        load: ``load(suite, n, split=..., task=...) -> list[Example]`` (the run context's seeded `data`).
        unseen: ``relation/format`` names held out from generator training.
        n_train, n_test: items per task from the suite's train / test split.
        n_shots: few-shot examples per system prompt (from the train items); n_variants: system prompts per task,
            each with a different rotation of shots (the cloud sees several phrasings of one task in training).
    """
    names = task_names(relations, formats)
    bad = [u for u in unseen if u not in names]
    if bad:
        raise ValueError(f"unseen_tasks {bad} are not tasks of relations {relations} x formats {formats}")
    cache: dict[tuple[str, str], tuple[list[Any], list[Any]]] = {}
    tasks = []
    for name in names:
        relation, fmt = name.split("/")
        suite, suite_task, _ = RELATIONS[relation]
        if (suite, suite_task) not in cache:
            cache[(suite, suite_task)] = (
                load(suite, n_train, split="train", task=suite_task),
                load(suite, n_test, split="test", task=suite_task),
            )
        train_ex, test_ex = cache[(suite, suite_task)]
        to_answer = FORMATS[fmt][0]
        train = [Item(_query(suite, e), to_answer(e.target), e.id) for e in train_ex]
        test = [Item(_query(suite, e), to_answer(e.target), e.id) for e in test_ex]
        k = min(n_shots, len(train))
        prompts = []
        for v in range(n_variants):
            shots = [train[(v * k + j) % len(train)] for j in range(k)] if train else []
            prompts.append(system_prompt(relation, fmt, shots))
        tasks.append(Task(relation, fmt, train, test, prompts, seen=name not in unseen))
    return tasks


def bare_query_ceiling(rows: list[tuple[str, str]]) -> float:
    """Highest mean exact match any system reading only the bare query can reach on `rows` ``(query, answer)``.

    Such a system gives one answer per query, so of the rows sharing a query at most those with its most common
    answer can be right: ceiling = sum over queries of max_answer count(query, answer) / n. With k tasks sharing
    every query and distinct answers that is 1/k (the multi-task LoRA without the prompt; LoRA-Gen, the prompt in
    context and the per-task LoRA all know the task and are not bound by it).
    """
    if not rows:
        raise ValueError("bare_query_ceiling needs at least one (query, answer) row, got []")
    counts: dict[str, dict[str, int]] = {}
    for query, answer in rows:
        by_answer = counts.setdefault(query, {})
        by_answer[answer] = by_answer.get(answer, 0) + 1
    return sum(max(c.values()) for c in counts.values()) / len(rows)
