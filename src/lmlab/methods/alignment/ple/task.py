"""PLE's reproduction task: positive continuation of travel-story openings, scored by a rule-based utility.

Built offline from lmlab's seeded `countries` suite (GeoNames + pycountry): each country of a split gives a
place ("Oslo, Norway") and facts (continent, currency) for the texts.

- **Queries** x: ``"Continue this travel story with one short sentence.\\n\\n{opening}"``, the opening neutral
  ("I spent last weekend in Oslo, Norway, and") or negative ("It rained every day of our trip to Oslo, Norway,
  and"), one opening template per (country, index) drawn from the seed. The principle-guided query is
  ``p + " " + x`` (the principle prefixed to the user turn).
- **D_sft**: neutral continuations written from the country's facts ("we walked to the main square and read
  about the history of Norway.") with no lexicon word: the SFT stage teaches the format, not the sentiment.
- **Reference text** for perplexity: the same kind of neutral continuation for the held-out countries.

The utility U (the reward model of this reproduction, and the annotator's hidden truth):

    U(y) = clip(scale * (P - N) / max(n, 1), -1, 1) - rep_penalty * max(0, rep - 0.3) / 0.7 - short_penalty * [n < 5]

with n the number of words of y, P (N) the number of *distinct* positive (negative) lexicon words in y, a word's
polarity flipped when one of the two words before it is a negator ("not", "never", "wasn't", ...), and
``rep = 1 - distinct bigrams / bigrams``. Counting distinct words and penalising repeated bigrams keep
"great great great" from scoring; the short penalty keeps "Lovely." from scoring. The lexicon is written here
(no download) and is transparent on purpose: the spec asks for a reward one can read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from lmlab.core.stats.seeding import seeded_rng

PRINCIPLE = "Please reply in a positive, warm and enthusiastic way."
INSTRUCTION = "Continue this travel story with one short sentence."

NEUTRAL_OPENINGS: tuple[str, ...] = (
    "I spent last weekend in {place}, and",
    "My cousin moved to {place} last year, and",
    "We took the morning train to {place}, and",
    "Our guide showed us around {place}, and",
)
NEGATIVE_OPENINGS: tuple[str, ...] = (
    "The flight to {place} was delayed for six hours, and",
    "It rained every day of our trip to {place}, and",
    "Our hotel in {place} was noisy and cold, and",
    "I got lost twice on my first day in {place}, and",
)
OPENINGS: tuple[str, ...] = NEUTRAL_OPENINGS + NEGATIVE_OPENINGS

# Neutral continuations (no lexicon word): D_sft and the perplexity reference.
NEUTRAL_CONTINUATIONS: tuple[str, ...] = (
    "we walked to the main square and read about the history of {country}.",
    "we paid for the tickets in {currency} at a small office near the station.",
    "we looked at a map of {continent} in the museum of {city}.",
    "I wrote down the names of the streets we passed in {city}.",
    "we took the bus across {city} and got off near the river.",
    "I bought a guidebook about {country} and read it on the way back.",
)

POSITIVE: frozenset[str] = frozenset(
    """great good wonderful amazing lovely beautiful fantastic excellent delightful enjoy enjoyed enjoying love loved
    loving happy happily glad fun friendly warm warmly charming pleasant perfect best brilliant awesome incredible nice
    kind welcoming exciting excited thrilled cheerful joy joyful magical stunning gorgeous memorable fabulous
    marvelous marvellous superb relaxing relaxed peaceful cozy cosy delicious fascinating inspiring impressive
    grateful thankful smile smiled smiling laughed laughing vibrant lively unforgettable enthusiastic enthusiasm
    recommend favorite favourite sunny comfortable wow delighted pleased adore adored treasure blessed""".split()
)
NEGATIVE: frozenset[str] = frozenset(
    """bad terrible awful horrible boring bored dull sad angry annoyed annoying disappointing disappointed worst
    poor ugly dirty noisy rude unfriendly miserable tired exhausted lost late delayed crowded expensive hate hated
    unpleasant stressful stressed frustrating frustrated upset worried scary dangerous sick broken nasty gloomy
    cancelled canceled complain complained regret unfortunately sorry worse mess painful uncomfortable lonely cold
    freezing awkward unhappy ruined failed fail""".split()
)
NEGATORS: frozenset[str] = frozenset({"not", "no", "never", "hardly", "without", "nothing", "nor"})

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def words(text: str) -> list[str]:
    """Lower-cased words of `text` (letters with an optional apostrophe part: "wasn't")."""
    return _WORD.findall(text.lower())


def _negated(tokens: list[str], i: int) -> bool:
    return any(t in NEGATORS or t.endswith("n't") for t in tokens[max(0, i - 2) : i])


@dataclass(frozen=True)
class UtilityParts:
    """The parts of U for one response (for tables and tests)."""

    n_words: int
    positive: int
    negative: int
    sentiment: float
    repetition: float
    utility: float


def utility_parts(
    text: str,
    *,
    scale: float = 5.0,
    rep_threshold: float = 0.3,
    rep_penalty: float = 1.0,
    min_words: int = 5,
    short_penalty: float = 1.0,
) -> UtilityParts:
    """U of one response with its parts (module docstring)."""
    toks = words(text)
    pos: set[str] = set()
    neg: set[str] = set()
    for i, t in enumerate(toks):
        pol = 1 if t in POSITIVE else (-1 if t in NEGATIVE else 0)
        if pol and _negated(toks, i):
            pol = -pol
        if pol > 0:
            pos.add(t)
        elif pol < 0:
            neg.add(t)
    n = len(toks)
    sentiment = max(-1.0, min(1.0, scale * (len(pos) - len(neg)) / max(n, 1)))
    bigrams = list(zip(toks, toks[1:]))
    rep = 1.0 - len(set(bigrams)) / len(bigrams) if bigrams else 0.0
    u = sentiment - rep_penalty * max(0.0, rep - rep_threshold) / (1.0 - rep_threshold)
    if n < min_words:
        u -= short_penalty
    return UtilityParts(n, len(pos), len(neg), sentiment, rep, float(u))


def utility(text: str) -> float:
    """U(y): the rule-based utility with the default constants (the reward model R and the annotator's truth)."""
    return utility_parts(text).utility


def sentiment_reward(query: str, response: str) -> float:
    """``R(x, y) = U(y)``, in the ``reward_fn(query, response)`` form `ple_align` takes (the query is unused)."""
    del query
    return utility(response)


# ------------------------------------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Place:
    """One country of the suite as the texts name it."""

    iso2: str
    city: str
    country: str
    continent: str
    currency: str

    @property
    def place(self) -> str:
        return f"{self.city}, {self.country}"


def place_of(example: Any) -> Place:
    """A `Place` from a `countries` suite example (any task; its ``meta["iso2"]``)."""
    from lmlab.data.countries import country_record

    rec = country_record(example.meta["iso2"])
    name = f"the {rec['name']}" if rec["the"] else rec["name"]
    currency = rec.get("currency") or "the local currency"
    return Place(rec["iso2"], rec["capital"], name, rec["continent"], currency)


def query_text(opening: str) -> str:
    """The plain query x for an opening."""
    return f"{INSTRUCTION}\n\n{opening}"


def guided_text(query: str, principle: str = PRINCIPLE) -> str:
    """The principle-guided query ``p + " " + x``."""
    return f"{principle} {query}"


@dataclass(frozen=True)
class Query:
    """One query: its text, the place it names and whether its opening is negative."""

    id: str
    text: str
    place: Place
    negative: bool


def make_queries(places: list[Place], n: int, *, seed: int, name: str) -> list[Query]:
    """`n` queries cycling over `places` (a place repeats only when n exceeds them), openings drawn from the seed."""
    if not places:
        raise ValueError("no places to build queries from (the countries split is empty)")
    out = []
    for j in range(n):
        pl = places[j % len(places)]
        k = int(seeded_rng(seed, name, pl.iso2, j // len(places)).integers(len(OPENINGS)))
        opening = OPENINGS[k].format(place=pl.place)
        out.append(Query(f"{name}/{pl.iso2}/{j}", query_text(opening), pl, k >= len(NEUTRAL_OPENINGS)))
    return out


def neutral_continuation(place: Place, *, seed: int, name: str, j: int = 0) -> str:
    """A neutral continuation about `place` (no lexicon word)."""
    k = int(seeded_rng(seed, name, place.iso2, j).integers(len(NEUTRAL_CONTINUATIONS)))
    return NEUTRAL_CONTINUATIONS[k].format(
        country=place.country, city=place.city, continent=place.continent, currency=place.currency
    )


def distinct_n(texts: list[str], n: int = 2) -> float:
    """Corpus distinct-n: unique word n-grams / all word n-grams over `texts` (0 when there are none)."""
    grams = [tuple(w[i : i + n]) for w in (words(t) for t in texts) for i in range(len(w) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0
