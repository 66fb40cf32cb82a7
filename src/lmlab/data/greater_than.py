"""Year-span "greater-than" prompts, after Hanna et al. 2023, "How does GPT-2 compute greater-than?".

Task: "The war lasted from the year 1732 to the year 17" -> a two-digit end year YY greater than the start's (here
33..99). Start years take YY in 02..98: 00 and 01 are left out (as in the paper, they invite century confusions)
and 99 would leave no correct continuation.

Metric: exact: the first run of digits in the output must have at least two digits, and its first two digits,
read as a number, must exceed the start YY ("45" and "45 years" are right for 1732; "5" and "32" are wrong).
``meta["correct"]`` / ``meta["incorrect"]`` list the two-digit continuations on each side, for the paper's
probability-difference metric. Note that SmolLM2's tokenizer splits numbers into single digits, so there the
continuation is two tokens: a first digit above ``meta["tens"]`` is always right, equal to it is undecided.

Data: synthetic, seeded: 40 event nouns written for lmlab x centuries (default 11..17) x YY in 02..98. The pool is
enumerated; an item's split is a hash of (noun, start year).
"""

from __future__ import annotations

import re
from typing import Any

from lmlab.data import Example, check_n, check_split, register_suite, reject_unknown, seeded_rng, split_of

# fmt: off
NOUNS: tuple[str, ...] = (
    "war", "siege", "reign", "drought", "famine", "rebellion", "expedition", "voyage", "dynasty", "campaign",
    "occupation", "truce", "alliance", "blockade", "plague", "epidemic", "treaty", "embargo", "strike", "revolt",
    "crusade", "pilgrimage", "journey", "marriage", "regency", "conflict", "dispute", "feud", "boom", "recession",
    "construction", "renovation", "exile", "captivity", "apprenticeship", "partnership", "rivalry", "monopoly",
    "migration", "excavation",
)
# fmt: on
DEFAULT_CENTURIES: tuple[int, ...] = (11, 12, 13, 14, 15, 16, 17)
YY_RANGE: tuple[int, int] = (2, 98)  # inclusive


def _prompt(noun: str, century: int, yy: int) -> str:
    return f"The {noun} lasted from the year {century}{yy:02d} to the year {century}"


def generate(
    n: int | None = None,
    seed: int = 0,
    split: str = "test",
    *,
    centuries: tuple[int, ...] | list[int] = DEFAULT_CENTURIES,
    **unknown: Any,
) -> list[Example]:
    """Greater-than examples.

    Args:
        n (`int`, *optional*): number of examples; None gives the whole split.
        seed (`int`): fixes the split and the order.
        split (`str`): ``"train"``, ``"dev"`` or ``"test"``.
        centuries (`tuple[int, ...]`): two-digit century prefixes XX (10..99) of the start years.

    Returns:
        `list[Example]`: target ``f"{YY + 1:02d}"`` (the smallest correct continuation); ``meta`` has ``noun``,
        ``start_year``, ``century`` (``"17"``), ``yy`` (``"32"``), ``tens`` (``"3"``), ``correct`` and
        ``incorrect`` (two-digit strings).
    """
    reject_unknown("greater_than", unknown, ("centuries",))
    check_split(split)
    cents = tuple(dict.fromkeys(centuries))
    if not cents or any(isinstance(c, bool) or not isinstance(c, int) or not 10 <= c <= 99 for c in cents):
        raise ValueError(f"centuries must be a non-empty list of ints in 10..99, got {centuries!r}")
    lo, hi = YY_RANGE
    keys = [(noun, c, yy) for noun in NOUNS for c in sorted(cents) for yy in range(lo, hi + 1)]
    chosen = [k for k in keys if split_of(f"{k[0]}|{k[1]}{k[2]:02d}", seed) == split]
    seeded_rng("greater-than-order", seed, split, cents).shuffle(chosen)
    check_n(n, pool=len(chosen), what=f"greater_than {split} split")
    out = []
    for noun, century, yy in chosen if n is None else chosen[:n]:
        meta = {
            "noun": noun,
            "start_year": century * 100 + yy,
            "century": str(century),
            "yy": f"{yy:02d}",
            "tens": str(yy // 10),
            "correct": [f"{y:02d}" for y in range(yy + 1, 100)],
            "incorrect": [f"{y:02d}" for y in range(0, yy + 1)],
        }
        ident = f"greater_than/{noun}/{century}{yy:02d}"
        out.append(Example(ident, _prompt(noun, century, yy), f"{yy + 1:02d}", None, meta))
    return out


_FIRST_DIGITS = re.compile(r"\d+")


def grade(example: Example, output: str) -> float:
    """1.0 when the first two digits of the output's first number exceed the start YY, else 0.0."""
    m = _FIRST_DIGITS.search(output)
    if m is None or len(m.group()) < 2:
        return 0.0
    return 1.0 if int(m.group()[:2]) > int(example.meta["yy"]) else 0.0


register_suite(
    "greater_than",
    generate,
    grade,
    "Hanna et al. year-span prompts ('from the year 1732 to the year 17'); correct when the continued two-digit "
    "year is greater than the start's.",
)
