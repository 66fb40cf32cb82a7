"""MPO's task: capital questions with candidate answers graded by three conflicting ground-truth objectives.

Built offline from lmlab's `countries` suite (GeoNames + pycountry facts, graded by the suite's own alias rules).
For a country x the prompt is ``"Question: What is the capital of {x}?\\nAnswer:"``. Candidate answers come from six
forms that state 0 to 3 facts (capital, continent, currency), each fact true or, with probability `p_wrong`, a
wrong value taken from another country:

    terse      " Oslo."                                                                  (capital)
    sentence   " The capital of Norway is Oslo."                                         (capital)
    continent  " The capital of Norway is Oslo, a city in Europe."                       (capital, continent)
    currency   " The capital of Norway is Oslo, and the currency there is the Krone."    (capital, currency)
    full       " The capital of Norway is Oslo. Norway lies in Europe and pays with ..."  (all three)
    abstain    " I do not know."                                                          (none)

The objectives (`OBJECTIVES`), all computed from the text by `grade_text` (so the same grader scores templated
candidates and free generations):

- ``correct``: the fraction of stated facts that are true (0 when nothing is stated): precision / harmlessness;
- ``concise``: minus the number of words: brevity;
- ``detail``: the number of facts stated, true or not: a verbosity-loving rater (helpfulness).

They conflict: ``detail`` wants the full answer, which risks a wrong fact (``correct``) and is long (``concise``);
``concise`` wants the terse answer or an abstention. A fact counts as stated when any value of its kind appears
(another country's capital, a continent name, a currency name) after the country's own names are removed (so
"South Africa" states no continent); it is true when the `countries` grader accepts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from lmlab.data import seeded_rng
from lmlab.data.countries import CONTINENTS, country_facts, country_record
from lmlab.data.countries import grade as grade_country
from lmlab.data.normalize import contains_answer, normalize

OBJECTIVES: tuple[str, ...] = ("correct", "concise", "detail")
FACTS: tuple[str, ...] = ("capital", "continent", "currency")
FORMS: dict[str, tuple[str, ...]] = {
    "terse": ("capital",),
    "sentence": ("capital",),
    "continent": ("capital", "continent"),
    "currency": ("capital", "currency"),
    "full": ("capital", "continent", "currency"),
    "abstain": (),
}
STOP = ("\n", "Question:")


@dataclass(frozen=True)
class Country:
    """One country's graders: its `countries` examples for the capital, continent and currency tasks."""

    iso2: str
    name: str
    phrase: str  # "Norway", "the Netherlands"
    examples: dict[str, Any]  # fact -> lmlab.data.Example
    own: tuple[str, ...]  # normalised names of the country (removed before fact checks)


def make_country(capital: Any, continent: Any, currency: Any) -> Country:
    """A `Country` from its three `countries` examples (tasks ``capital``, ``continent``, ``currency``)."""
    iso = {e.meta["iso2"] for e in (capital, continent, currency)}
    if len(iso) != 1:
        raise ValueError(f"the three examples must be about one country, got ISO codes {sorted(iso)}")
    rec = country_record(capital.meta["iso2"])
    phrase = f"the {rec['name']}" if rec["the"] else rec["name"]
    own = tuple(sorted({normalize(a) for a in rec["aliases"]}, key=len, reverse=True))
    return Country(rec["iso2"], rec["name"], phrase, {"capital": capital, "continent": continent,
                                                       "currency": currency}, own)  # fmt: skip


def prompt_text(country: Country) -> str:
    return f"Question: What is the capital of {country.phrase}?\nAnswer:"


@lru_cache(maxsize=1)
def _universe() -> dict[str, tuple[str, ...]]:
    """Every value of each fact kind (normalised aliases): what "stating a fact" looks for."""
    recs = country_facts(with_capital_only=True)
    capitals = {normalize(a) for r in recs for a in r["capital_aliases"]}
    currencies = {normalize(a) for r in recs for a in r["currency_aliases"]}
    continents = {normalize(c) for c in CONTINENTS.values()} | {"australasia"}
    return {
        "capital": tuple(sorted(c for c in capitals if c)),
        "continent": tuple(sorted(continents)),
        "currency": tuple(sorted(c for c in currencies if c)),
    }


def _strip_own(text: str, country: Country) -> str:
    t = f" {normalize(text)} "
    for name in country.own:
        while f" {name} " in t:
            t = t.replace(f" {name} ", " | ")
    return t


def fact_judgements(text: str, country: Country) -> dict[str, bool | None]:
    """Per fact kind: None (not stated), True (stated and accepted by the `countries` grader) or False."""
    t = _strip_own(text, country)
    out: dict[str, bool | None] = {}
    for fact in FACTS:
        ex = country.examples[fact]
        true = grade_country(ex, t) == 1.0
        if true:
            out[fact] = True
            continue
        accepted = {normalize(a) for a in ex.meta["answers"]}
        # `t` is normalised and space-padded, the universe pre-normalised: a whole-word phrase test
        seen = any(f" {v} " in t for v in _universe()[fact] if v not in accepted) or contains_answer(t, accepted)
        out[fact] = False if seen else None
    return out


def grade_text(text: str, country: Country) -> np.ndarray:
    """The raw objective vector ``(correct, concise, detail)`` of an answer, float64 (3,)."""
    facts = fact_judgements(text, country)
    stated = [v for v in facts.values() if v is not None]
    correct = sum(stated) / len(stated) if stated else 0.0
    return np.array([correct, -float(len(text.split())), float(len(stated))])


def _render(form: str, country: Country, values: dict[str, str]) -> str:
    c, cap = country.phrase, values.get("capital", "")
    start = c[0].upper() + c[1:]
    if form == "terse":
        return f" {cap}."
    if form == "sentence":
        return f" The capital of {c} is {cap}."
    if form == "continent":
        return f" The capital of {c} is {cap}, a city in {values['continent']}."
    if form == "currency":
        return f" The capital of {c} is {cap}, and the currency there is the {values['currency']}."
    if form == "full":
        return (
            f" The capital of {c} is {cap}. {start} lies in {values['continent']} and pays with the "
            f"{values['currency']}."
        )
    return " I do not know."


@lru_cache(maxsize=1)
def _values() -> dict[str, list[str]]:
    recs = country_facts(with_capital_only=True)
    return {
        "capital": sorted({r["capital"] for r in recs}),
        "continent": sorted(v for v in CONTINENTS.values() if v != "Antarctica"),
        "currency": sorted({r["currency"] for r in recs if r["currency"]}),
    }


@dataclass
class Item:
    """One prompt with its candidates and their raw objective values.

    Attributes:
        id (`str`): the prompt id (``countries/capital/<ISO2>``), the independent unit of every CI.
        prompt (`str`); candidates (`list[str]`); forms (`list[str]`).
        truth (`list[dict]`): per candidate, the intended judgement of each stated fact (True / False).
        rewards (`np.ndarray`, (C, K)): raw objective values (`grade_text`).
        country (`Country`).
    """

    id: str
    prompt: str
    candidates: list[str]
    forms: list[str]
    truth: list[dict[str, bool]]
    rewards: np.ndarray
    country: Country


def build_item(country: Country, *, n_candidates: int, p_wrong: float, seed: int) -> Item:
    """`n_candidates` distinct candidate answers for one country (every form first, then random forms).

    A wrong value is redrawn until the grader rejects it and the sentence still states it, so the intended
    judgements equal `fact_judgements` of the text (tested).
    """
    if not 2 <= n_candidates <= 16:
        raise ValueError(f"n_candidates must be in [2, 16], got {n_candidates}")
    if not 0.0 <= p_wrong <= 1.0:
        raise ValueError(f"p_wrong must be in [0, 1], got {p_wrong}")
    rng = seeded_rng("mpo-candidates", seed, country.iso2)
    names = list(FORMS)
    order = rng.sample(names, len(names))
    true_values = {
        "capital": country.examples["capital"].target,
        "continent": country.examples["continent"].target,
        "currency": country.examples["currency"].target,
    }
    texts: list[str] = []
    forms: list[str] = []
    truth: list[dict[str, bool]] = []
    attempts = 0
    while len(texts) < n_candidates:
        attempts += 1
        if attempts > 400:
            raise RuntimeError(f"could not build {n_candidates} distinct candidates for {country.name}")
        form = order[len(texts)] if len(texts) < len(order) else rng.choice([f for f in names if f != "abstain"])
        wanted = {f: rng.random() >= p_wrong for f in FORMS[form]}
        values = {}
        for fact, ok in wanted.items():
            values[fact] = (
                true_values[fact] if ok else rng.choice([v for v in _values()[fact] if v != true_values[fact]])
            )
        text = _render(form, country, values)
        if text in texts:
            continue
        if fact_judgements(text, country) != {f: wanted.get(f) for f in FACTS}:
            continue  # a wrong value the grader would accept (or not see): draw again
        texts.append(text)
        forms.append(form)
        truth.append(wanted)
    rewards = np.stack([grade_text(t, country) for t in texts])
    ex = country.examples["capital"]
    return Item(ex.id, prompt_text(country), texts, forms, truth, rewards, country)


def usable(capital_example: Any) -> bool:
    """Countries whose capital contains the country's name (Mexico City) are skipped: restating the question
    would then count as a correct capital."""
    return not capital_example.meta.get("capital_contains_country", False)
