"""A country fact stated as sentences (plain, verbose, hedged, chatty) about a right or a wrong answer.

The response texts of the fact-based preference data of the alignment area (alignment_potential's candidate
responses, rlthf's attribute grid): a fact about a country (capital, continent, currency) with the suite's answer or
another country's answer that the suite's grader marks wrong.
"""

from __future__ import annotations

from typing import Any

from lmlab.core.stats.seeding import seeded_rng

__all__ = ["WRONG_ANSWER_TRIES", "fact_sentences", "facts_by_iso2", "wrong_answer"]

WRONG_ANSWER_TRIES = 50  # draws of a wrong answer that the grader must mark wrong


def facts_by_iso2() -> dict[str, dict[str, Any]]:
    """The country facts of `lmlab.data.countries`, keyed by ISO 3166 alpha-2 code."""
    from lmlab.data.countries import country_facts

    return {f["iso2"]: f for f in country_facts()}


def _phrase(fact: dict[str, Any], start: bool = False) -> str:
    name = f"the {fact['name']}" if fact.get("the") else fact["name"]
    return name[0].upper() + name[1:] if start else name


def fact_sentences(task: str, fact: dict[str, Any], answer: str) -> dict[str, str]:
    """The fact stated plainly, verbosely, hedged and chattily, about `answer` (right or wrong)."""
    c, cs = _phrase(fact), _phrase(fact, start=True)
    if task == "capital":
        plain = f"The capital of {c} is {answer}."
        extra = "It is where the national government and the parliament meet."
        hedged = f"I am not completely sure, but I think the capital of {c} might be {answer}."
        styled = (
            f"Great question! The capital of {c} is {answer}, a vibrant city famous for its rich history, "
            "lively culture and beautiful architecture."
        )
    elif task == "continent":
        plain = f"{cs} is in {answer}."
        extra = "It shares that part of the world with several of its neighbouring countries."
        hedged = f"I am not completely sure, but I think {c} might be in {answer}."
        styled = (
            f"Great question! {cs} is in {answer}, a fascinating part of the world famous for its rich "
            "history, diverse cultures and beautiful landscapes."
        )
    elif task == "currency":
        plain = f"The official currency of {c} is the {answer}."
        extra = "It is used for everyday payments and issued by the national central bank."
        hedged = f"I am not completely sure, but I think the currency of {c} might be the {answer}."
        styled = (
            f"Great question! The official currency of {c} is the {answer}, which millions of people use "
            "every day for shopping, travel and saving."
        )
    else:
        raise ValueError(f"task must be capital, continent or currency, got {task!r}")
    return {"plain": plain, "verbose": f"{plain} {extra}", "hedged": hedged, "styled": styled}


def wrong_answer(example: Any, facts: dict[str, dict[str, Any]], seed: int) -> str | None:
    """Another country's fact that the suite's grader marks wrong for `example`; None when the grader accepts any
    sentence naming the country (its name contains the answer, e.g. Saint Pierre and Miquelon / Saint-Pierre)."""
    from lmlab.data.countries import CONTINENTS, grade

    task, iso2 = example.meta["task"], example.meta["iso2"]
    if grade(example, _phrase(facts[iso2], start=True)) == 1.0:
        return None
    rng = seeded_rng(seed, "wrong", example.id)
    if task == "continent":
        options = [v for k, v in sorted(CONTINENTS.items()) if k != "AN"]
    else:
        key = "capital" if task == "capital" else "currency"
        options = sorted({f[key] for k, f in facts.items() if k != iso2 and f.get(key)})
    for _ in range(WRONG_ANSWER_TRIES):
        cand = str(options[int(rng.integers(len(options)))])
        if grade(example, fact_sentences(task, facts[iso2], cand)["plain"]) == 0.0:
            return cand
    return None
