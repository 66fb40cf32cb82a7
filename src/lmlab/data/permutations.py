"""Permutation composition over the symmetric group S_n (a state-tracking task).

Task: the prompt lists ``length`` permutations of ``{1, ..., n}`` in one-line notation, ``p = [p(1) p(2) ...
p(n)]`` (position i holds the image of i), and asks for their composition in the same notation.

Composition order: left to right, i.e. apply ``p1`` first, then ``p2``, and so on. The answer ``q`` satisfies
``q(i) = p_k(...p_2(p_1(i))...)``. Example in S_3: ``p1 = [2 3 1]`` (1->2, 2->3, 3->1) and ``p2 = [2 1 3]`` (swap
1 and 2) give ``q = [1 3 2]``: 1 -> 2 -> 1, 2 -> 3 -> 3, 3 -> 1 -> 2.

Metric: exact match of the last square-bracketed list in the output (or, with no brackets, of the integers on its first
line) against the target, ignoring separators: ``"[1, 3, 2]"``, ``"[1 3 2]"`` and ``"1 3 2"`` all count.

Data: synthetic, seeded. An item's split is a hash of the permutation sequence, so splits are disjoint by
construction. ``meta["perms"]`` holds the permutations as lists of ints in the shown (1-based) one-line notation,
``meta["composed"]`` the answer.
"""

from __future__ import annotations

import math
import random
import re
from itertools import permutations as _all_perms
from itertools import product
from typing import Any

from lmlab.data import (
    Example,
    check_n,
    check_split,
    register_suite,
    reject_unknown,
    sample_unique,
    seeded_rng,
    split_of,
)

MAX_ELEMENTS = 9  # one digit per element keeps the notation unambiguous


def compose(perms: list[list[int]] | list[tuple[int, ...]]) -> list[int]:
    """Left-to-right composition of 1-based one-line permutations: apply ``perms[0]`` first."""
    n = len(perms[0])
    out = list(range(1, n + 1))
    for p in perms:
        out = [p[x - 1] for x in out]
    return out


def fmt(perm: list[int] | tuple[int, ...]) -> str:
    """One-line notation as shown in prompts: ``[3 1 2]``."""
    return "[" + " ".join(str(x) for x in perm) + "]"


def _prompt(perms: list[tuple[int, ...]]) -> str:
    n = len(perms[0])
    names = [f"p{i + 1}" for i in range(len(perms))]
    if len(perms) == 1:
        instruction = "Write this permutation again."
    else:
        instruction = f"Compose them left to right: apply {names[0]} first, then {', then '.join(names[1:])}."
    return "\n".join(
        [
            f"Permutations of {{1, ..., {n}}} in one-line notation: position i holds the image of i.",
            *(f"{name} = {fmt(p)}" for name, p in zip(names, perms)),
            instruction,
            "Give the result in the same notation.",
            "Answer:",
        ]
    )


def _key(perms: list[tuple[int, ...]] | tuple[tuple[int, ...], ...]) -> str:
    return ";".join(" ".join(map(str, p)) for p in perms)


def _example(perms: list[tuple[int, ...]]) -> tuple[str, Example]:
    key = _key(perms)
    composed = compose(perms)
    meta = {
        "perms": [list(p) for p in perms],
        "composed": composed,
        "n_elements": len(perms[0]),
        "length": len(perms),
        "order": "left-to-right: apply perms[0] first",
    }
    ident = "/".join("".join(map(str, p)) for p in perms)
    return key, Example(f"permutations/S{len(perms[0])}/{ident}", _prompt(perms), fmt(composed), None, meta)


def generate(
    n: int | None = None,
    seed: int = 0,
    split: str = "test",
    *,
    n_elements: int = 5,
    length: int = 2,
    **unknown: Any,
) -> list[Example]:
    """Permutation-composition examples.

    Args:
        n (`int`, *optional*): number of examples; None is allowed when the pool ``(n_elements!)**length`` has at
            most 100,000 items (then the whole split is enumerated).
        seed (`int`): fixes the split and the draws.
        split (`str`): ``"train"``, ``"dev"`` or ``"test"``.
        n_elements (`int`): the n of S_n, 2..9 (default 5; 3 gives a small, easy group).
        length (`int`): number of permutations to compose, >= 1.

    Returns:
        `list[Example]`: target like ``"[2 3 1 5 4]"``; ``meta`` has ``perms``, ``composed``, ``n_elements``,
        ``length`` and ``order``.
    """
    reject_unknown("permutations", unknown, ("n_elements", "length"))
    check_split(split)
    if isinstance(n_elements, bool) or not isinstance(n_elements, int) or not 2 <= n_elements <= MAX_ELEMENTS:
        raise ValueError(f"n_elements must be an int in 2..{MAX_ELEMENTS}, got {n_elements!r}")
    if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= 64:
        raise ValueError(f"length must be an int in 1..64, got {length!r}")
    pool = math.factorial(n_elements) ** length
    what = f"permutation pool (S{n_elements}, length {length}: {pool} sequences)"
    if pool <= 100_000:
        # Small pools are enumerated, so n=None works and "n too large" is exact.
        group = list(_all_perms(range(1, n_elements + 1)))
        chosen = [list(seq) for seq in product(group, repeat=length) if split_of(_key(seq), seed) == split]
        seeded_rng("permutations-order", seed, split, n_elements, length).shuffle(chosen)
        check_n(n, pool=len(chosen), what=f"{split} split of the {what}")
        return [_example(seq)[1] for seq in (chosen if n is None else chosen[:n])]
    check_n(n, pool=None, what=what)

    def draw(rng: random.Random) -> tuple[str, Example]:
        perms = []
        for _ in range(length):
            p = list(range(1, n_elements + 1))
            rng.shuffle(p)
            perms.append(tuple(p))
        return _example(perms)

    assert n is not None
    return sample_unique(draw, n, seed, split, stream=("permutations", n_elements, length), what=what)


_BRACKETS = re.compile(r"\[([^\[\]]*)\]")


def parse_answer(output: str) -> list[int] | None:
    """The permutation an output commits to: its last ``[...]`` list, else the integers on its first line."""
    groups = _BRACKETS.findall(output)
    if groups:
        text = groups[-1]
    else:
        lines = [line for line in output.strip().splitlines() if line.strip()]
        if not lines:
            return None
        text = lines[0]
    nums = re.findall(r"\d+", text)
    return [int(x) for x in nums] if nums else None


def grade(example: Example, output: str) -> float:
    """1.0 when the parsed permutation (see `parse_answer`) equals the target exactly, else 0.0."""
    target = [int(x) for x in re.findall(r"\d+", example.target)]
    return 1.0 if parse_answer(output) == target else 0.0


register_suite(
    "permutations",
    generate,
    grade,
    "Left-to-right composition of permutations of {1..n} in one-line notation; exact match of the result.",
)
