"""The d_reft task: country -> continent as a multiple choice over the continents, with paraphrase and typo transforms.

Countries come from lmlab's ``countries`` suite (task ``continent``; GeoNames ``continentcode``). Training prompts use
`TRAIN_TEMPLATES` (varied per example); the held-out paraphrase condition uses `HELDOUT_TEMPLATES`, never seen in
training; the typo condition perturbs the letters of a clean prompt (`typo`). Scoring: the log-likelihood of each
continent name after the prompt (`CONTINENT_OPTIONS`), argmax against the accepted answers (transcontinental
countries accept both continents, as the suite's grader does).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

# the continents with at least one country in GeoNames' list (Antarctica has none with a capital)
CONTINENT_OPTIONS: tuple[str, ...] = ("Africa", "Asia", "Europe", "North America", "Oceania", "South America")

# seen in training (a different one per example and step of the data order)
TRAIN_TEMPLATES: tuple[str, ...] = (
    "Q: Which continent is {c} in?\nA:",
    "{c} is a country on the continent of",
    "Continent of {c}:",
    "Question: On which continent is {c} located?\nAnswer:",
    "Country: {c}\nContinent:",
)
# never seen in training: the paraphrase condition
HELDOUT_TEMPLATES: tuple[str, ...] = (
    "Name the continent where {c} can be found:",
    "Geography quiz. {c} belongs to which continent? Answer:",
    "In terms of continents, {c} is part of",
)


@dataclass(frozen=True)
class Item:
    """One country asked with one template."""

    id: str  # the country's example id (countries/continent/<ISO2>): the independent unit
    country: str
    prompt: str
    target: str  # the suite's gold continent
    accepted: tuple[int, ...]  # indices into CONTINENT_OPTIONS counted as correct


def accepted_indices(example: object) -> tuple[int, ...]:
    """Indices of `CONTINENT_OPTIONS` the suite accepts for `example` (its target and its ``answers``)."""
    names = {str(getattr(example, "target", ""))} | set(getattr(example, "meta", {}).get("answers", ()))
    if "Australia" in names or "Australasia" in names:
        names.add("Oceania")
    idx = tuple(i for i, c in enumerate(CONTINENT_OPTIONS) if c in names)
    if not idx:
        raise ValueError(f"example {getattr(example, 'id', '?')}: target {getattr(example, 'target', None)!r} is not "
                         f"one of the options {CONTINENT_OPTIONS}")  # fmt: skip
    return idx


def render(template: str, country: str) -> str:
    """The prompt of `template` for `country` (templates may start with the country: capitalised then)."""
    if not template.startswith("{c}"):
        return template.format(c=country)
    return template.format(c=country[:1].upper() + country[1:])


def build_items(examples: Sequence[object], templates: Sequence[str], *, seed: int, tag: str) -> list[Item]:
    """One item per example, its template drawn with a seeded RNG (same seed, same assignment)."""
    if not templates:
        raise ValueError("templates must not be empty")
    rng = random.Random(f"d_reft/{tag}/{seed}")
    out = []
    for ex in examples:
        country = ex.meta["country"]  # type: ignore[attr-defined]
        t = templates[rng.randrange(len(templates))]
        out.append(Item(ex.id, country, render(t, country), ex.target, accepted_indices(ex)))  # type: ignore[attr-defined]
    return out


def training_texts(examples: Sequence[object], templates: Sequence[str] = TRAIN_TEMPLATES) -> list[tuple[str, str]]:
    """(prompt, " answer") for every example x template: the training pool (the template varies in training)."""
    if not templates:
        raise ValueError("templates must not be empty")
    pairs = []
    for ex in examples:
        country = ex.meta["country"]  # type: ignore[attr-defined]
        for t in templates:
            pairs.append((render(t, country), " " + ex.target))  # type: ignore[attr-defined]
    return pairs


def typo(text: str, rate: float, rng: random.Random) -> str:
    """Keyboard-style noise: each letter is, with probability `rate`, swapped with the next letter, dropped or
    doubled (one of the three at random). Non-letters (spaces, punctuation, the newline before "A:") are kept, so
    the prompt keeps its shape."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"typo rate must be in [0, 1], got {rate}")
    chars = list(text)
    out: list[str] = []
    i = 0
    while i < len(chars):
        ch = chars[i]
        if ch.isalpha() and rng.random() < rate:
            kind = rng.randrange(3)
            if kind == 0 and i + 1 < len(chars) and chars[i + 1].isalpha():
                out += [chars[i + 1], ch]
                i += 2
                continue
            if kind == 1:
                i += 1
                continue
            out += [ch, ch]
            i += 1
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def typo_items(items: Sequence[Item], rate: float, *, seed: int) -> list[Item]:
    """The same items with `typo` applied to each prompt (seeded per item)."""
    return [
        Item(
            it.id,
            it.country,
            typo(it.prompt, rate, random.Random(f"d_reft/typo/{seed}/{it.id}")),
            it.target,
            it.accepted,
        )  # fmt: skip
        for it in items
    ]
