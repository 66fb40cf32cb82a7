"""Seeded data suites with exact graders.

A suite is a deterministic generator ``fn(n, seed, split="test", **kw) -> list[Example]``, registered by name with
`register_suite`. The same (n, seed, split, kw) always gives the same examples; each seed fixes a disjoint
train/dev/test split of the underlying pool. `grade(example, output)` applies the suite's exact grader.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import random
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

SPLITS: tuple[str, ...] = ("train", "dev", "test")

# Lazy index, like the method registry: suite name -> module that registers it.
SUITE_INDEX: Mapping[str, str] = {
    "countries": "lmlab.data.countries",
    "capital_steps": "lmlab.data.capital_steps",
    "fact_corpus": "lmlab.data.fact_corpus",
    "arithmetic": "lmlab.data.arithmetic",
    "permutations": "lmlab.data.permutations",
    "ioi": "lmlab.data.ioi",
    "greater_than": "lmlab.data.greater_than",
    "strings": "lmlab.data.strings",
    "humaneval": "lmlab.data.humaneval",
    "corpus": "lmlab.data.corpus",
    "instructions": "lmlab.data.instructions",
    "ruler": "lmlab.data.ruler",
    "glyphs": "lmlab.data.glyphs",
    "geobigedit": "lmlab.data.geobigedit",
    "taskbank": "lmlab.data.taskbank",
    "prefs": "lmlab.data.prefs",
}


@dataclass(frozen=True)
class Example:
    """One task instance.

    Args:
        id (`str`): stable id, unique within the suite (e.g. ``"countries/capital/FR"``).
        prompt (`str`): the input text (plain; apply a chat template at use time).
        target (`str`): the gold answer as text.
        choices (`tuple[str, ...]`, *optional*): answer options for multiple-choice use.
        meta (`dict`): anything else (task, difficulty, aliases accepted by the grader, ...).
    """

    id: str
    prompt: str
    target: str
    choices: tuple[str, ...] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Suite:
    """A registered suite: generator, grader and documentation."""

    name: str
    generate: Callable[..., list[Example]]
    grade: Callable[[Example, str], float]
    description: str
    metric: str = "exact_match"
    source: str = "synthetic (seeded)"


_SUITES: dict[str, Suite] = {}


def register_suite(
    name: str,
    generate: Callable[..., list[Example]],
    grade: Callable[[Example, str], float],
    description: str,
    *,
    metric: str = "exact_match",
    source: str = "synthetic (seeded)",
) -> Suite:
    if name in _SUITES and _SUITES[name].generate is not generate:
        raise ValueError(f"There is already a data suite called {name!r}")
    suite = Suite(name, generate, grade, description, metric, source)
    _SUITES[name] = suite
    return suite


def get_suite(name: str) -> Suite:
    if name not in _SUITES:
        module = SUITE_INDEX.get(name)
        if module is None:
            close = difflib.get_close_matches(name, list(SUITE_INDEX), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; expected one of {', '.join(SUITE_INDEX)}"
            raise KeyError(f"unknown data suite {name!r}{hint}")
        importlib.import_module(module)
    return _SUITES[name]


def list_suites() -> list[Suite]:
    return [get_suite(name) for name in SUITE_INDEX]


def load(name: str, n: int | None = None, seed: int = 0, split: str = "test", **kwargs: Any) -> list[Example]:
    """Generate `n` examples of suite `name` (all of the split when `n` is None)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if n is not None and n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return get_suite(name).generate(n, seed, split=split, **kwargs)


def grade(name: str, example: Example, output: str) -> float:
    """Score `output` for `example` with suite `name`'s exact grader (1.0 correct, 0.0 wrong, or a partial score)."""
    return float(get_suite(name).grade(example, output))


# ---------------------------------------------------------------------------------------------------------------
# Helpers shared by the suite modules: stable hashing, seeded splits and argument checks. Python's `hash()` of a
# string is salted per process, so everything here goes through sha256 to stay identical across processes.

# train / dev / test shares of a pool. Test gets the largest share: most suites are used for evaluation, and train
# only has to feed few-shot prompts, probes or calibration.
SPLIT_FRACTIONS: tuple[float, float, float] = (0.4, 0.1, 0.5)


def stable_hash(*parts: object) -> int:
    """A 64-bit integer from the sha256 of the parts' `str`, identical across processes and machines."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def seeded_rng(*parts: object) -> random.Random:
    """A `random.Random` seeded by `stable_hash(*parts)`: one independent stream per (suite, seed, split, ...)."""
    return random.Random(stable_hash(*parts))


def split_of(key: str, seed: int, fractions: tuple[float, float, float] = SPLIT_FRACTIONS) -> str:
    """The split (``"train"``, ``"dev"`` or ``"test"``) that a generated item with canonical `key` belongs to.

    Splitting generated pools by a hash of the item's key makes the splits disjoint by construction: an item can
    only ever be drawn into one split for a given seed.
    """
    u = stable_hash("split", seed, key) / 2**64
    if u < fractions[0]:
        return "train"
    return "dev" if u < fractions[0] + fractions[1] else "test"


def split_finite(
    keys: list[str], seed: int, split: str, fractions: tuple[float, float, float] = SPLIT_FRACTIONS
) -> list[str]:
    """The keys of a finite pool that fall in `split`, in a seeded order (a seeded permutation cut by `fractions`)."""
    check_split(split)
    order = sorted(set(keys))
    seeded_rng("finite-split", seed).shuffle(order)
    n_train = round(fractions[0] * len(order))
    n_dev = round((fractions[0] + fractions[1]) * len(order)) - n_train
    bounds = {"train": (0, n_train), "dev": (n_train, n_train + n_dev), "test": (n_train + n_dev, len(order))}
    lo, hi = bounds[split]
    return order[lo:hi]


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")


def check_n(n: int | None, *, pool: int | None = None, what: str = "pool") -> None:
    """Reject a negative `n`, an `n` above the pool size, and ``n=None`` for an unbounded pool."""
    if n is None:
        if pool is None:
            raise ValueError(f"n must be an int for the unbounded {what}, got None")
        return
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be None or an int >= 0, got {n!r}")
    if pool is not None and n > pool:
        raise ValueError(f"n={n} is larger than the {what} ({pool} examples)")


def check_choice(name: str, value: object, allowed: tuple[object, ...] | list[object]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")


def reject_unknown(suite: str, unknown: Mapping[str, Any], expected: tuple[str, ...]) -> None:
    """Turn stray keyword arguments into a ValueError that lists the suite's keywords."""
    if unknown:
        bad = ", ".join(sorted(unknown))
        raise ValueError(f"unknown keyword argument(s) {bad} for suite {suite!r}; expected {', '.join(expected)}")


def sample_unique(
    draw: Callable[[random.Random], tuple[str, Example]],
    n: int,
    seed: int,
    split: str,
    *,
    stream: tuple[object, ...],
    what: str,
    max_tries: int | None = None,
) -> list[Example]:
    """Draw `n` distinct examples of `split` from an unbounded (or very large) generated pool.

    `draw(rng)` returns ``(key, example)``; an example is kept when `split_of(key, seed)` is `split` and its key is
    new. Each split reads its own RNG stream, so asking for more test examples never changes the train ones.
    """
    rng = seeded_rng("draw", *stream, seed, split)
    seen: set[str] = set()
    out: list[Example] = []
    tries = max_tries if max_tries is not None else 200 * n + 2000
    for _ in range(tries):
        if len(out) == n:
            break
        key, ex = draw(rng)
        if key in seen or split_of(key, seed) != split:
            continue
        seen.add(key)
        out.append(ex)
    if len(out) < n:
        raise ValueError(f"n={n} is larger than the {what} allows (found {len(out)} distinct {split} examples)")
    return out
