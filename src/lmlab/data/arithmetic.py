"""Integer arithmetic: bare expressions ("23 + 45 =") or templated one-step word problems.

Task: compute ``a op b`` for ``op`` in ``+``, ``-``, ``*``. ``kind="expression"`` prompts ``"23 * 45 ="`` (a
valid Python expression once the trailing ``=`` is dropped); ``kind="word"`` wraps the same arithmetic in a short
story ("Mia has 23 stickers. She buys 45 more. ..."). Subtraction always has ``a >= b`` so every answer is a
non-negative integer, as in the word problems.

Metric: exact match of the *last* number in the output (`lmlab.data.normalize.last_number`, which reads "1,234"
and "68.0") against the integer target, so chain-of-thought before the final answer is allowed.

Data: synthetic, seeded. An item's split is a hash of its canonical key ``"a op b"`` (the arithmetic fact, not the
wording), so the same fact never appears in two splits of one seed, whatever the template.
"""

from __future__ import annotations

import random
from typing import Any

from lmlab.data import Example, check_choice, check_n, check_split, register_suite, reject_unknown, sample_unique
from lmlab.data.normalize import last_number

KINDS: tuple[str, ...] = ("expression", "word")
OPS: tuple[str, ...] = ("+", "-", "*")

_NAMES = ("Mia", "Sam", "Lena", "Omar", "Priya", "Tom", "Ana", "Ravi", "Kate", "Noah", "Yuki", "Leo")
_PRONOUN = {
    "Mia": "She",
    "Sam": "He",
    "Lena": "She",
    "Omar": "He",
    "Priya": "She",
    "Tom": "He",
    "Ana": "She",
    "Ravi": "He",
    "Kate": "She",
    "Noah": "He",
    "Yuki": "She",
    "Leo": "He",
}
_ITEMS = ("apples", "stickers", "marbles", "books", "coins", "pencils", "stamps", "shells", "cards", "beads")
_CONTAINERS = ("boxes", "bags", "jars", "baskets", "shelves", "crates")

# {x} and {y} are the operands in order; every template asks for exactly `x op y`.
_WORD_TEMPLATES: dict[str, tuple[str, ...]] = {
    "+": (
        "{name} has {x} {item}. {pron} gets {y} more {item}. How many {item} does {name} have now?",
        "There are {x} {item} in one pile and {y} {item} in another. How many {item} are there in total?",
        "{name} collected {x} {item} on Monday and {y} {item} on Tuesday. How many {item} did {name} collect?",
    ),
    "-": (
        "{name} has {x} {item}. {pron} gives away {y} of them. How many {item} does {name} have left?",
        "A shop had {x} {item}. It sold {y} {item}. How many {item} are left in the shop?",
        "{name} needs {x} {item} and already has {y}. How many more {item} does {name} need?",
    ),
    "*": (
        "There are {x} {container} with {y} {item} in each. How many {item} are there altogether?",
        "{name} buys {x} packs of {item}. Each pack has {y} {item}. How many {item} does {name} buy?",
        "A classroom has {x} rows of desks with {y} {item} on each row. How many {item} are there?",
    ),
}


def _operands(rng: random.Random, lo: int, hi: int, op: str) -> tuple[int, int]:
    a, b = rng.randint(lo, hi), rng.randint(lo, hi)
    if op == "-" and a < b:
        a, b = b, a
    return a, b


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def generate(
    n: int | None = None,
    seed: int = 0,
    split: str = "test",
    *,
    kind: str = "expression",
    digits: int = 2,
    ops: tuple[str, ...] | list[str] | str = OPS,
    **unknown: Any,
) -> list[Example]:
    """Arithmetic examples.

    Args:
        n (`int`): number of examples (required: the pool is generated).
        seed (`int`): fixes the split of arithmetic facts and the draws.
        split (`str`): ``"train"``, ``"dev"`` or ``"test"``.
        kind (`str`): ``"expression"`` or ``"word"``.
        digits (`int`): digits per operand: 1-6 for expressions, 1-3 for word problems (1 means 0-9, or 1-9 in word
            problems).
        ops (`tuple[str, ...]`): operators to draw from, a subset of ``("+", "-", "*")``; a single string like
            ``"+-"`` works too.

    Returns:
        `list[Example]`: target is the integer result as text; ``meta`` has ``a``, ``b``, ``op``, ``kind``,
        ``digits``, ``expression`` (``"a op b"``, evaluable Python).
    """
    reject_unknown("arithmetic", unknown, ("kind", "digits", "ops"))
    check_split(split)
    check_choice("kind", kind, KINDS)
    max_digits = 6 if kind == "expression" else 3
    if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= max_digits:
        raise ValueError(f"digits must be an int in 1..{max_digits} for kind {kind!r}, got {digits!r}")
    op_list = tuple(dict.fromkeys(ops))
    if not op_list or any(op not in OPS for op in op_list):
        raise ValueError(f"ops must be a non-empty subset of {', '.join(OPS)}, got {ops!r}")
    # Operand range: exactly `digits` digits; one-digit word problems start at 1 ("0 boxes" reads oddly).
    lo = 10 ** (digits - 1) if digits > 1 else (1 if kind == "word" else 0)
    hi = 10**digits - 1
    # Pool size per op: all ordered pairs (subtraction keeps a >= b, so about half of them).
    span = hi - lo + 1
    pool = sum(span * (span + 1) // 2 if op == "-" else span * span for op in op_list)
    check_n(n, pool=pool, what=f"arithmetic pool for digits={digits}, ops={''.join(op_list)}")
    if n is None:
        # An expression pool is finite but can be huge; n=None only makes sense for the tiny ones.
        raise ValueError("n must be an int for the arithmetic suite (the pool is generated), got None")

    def draw(rng: random.Random) -> tuple[str, Example]:
        op = rng.choice(op_list)
        a, b = _operands(rng, lo, hi, op)
        expr = f"{a} {op} {b}"
        result = _apply(a, op, b)
        if kind == "expression":
            prompt = f"{expr} ="
        else:
            name = rng.choice(_NAMES)
            template = rng.choice(_WORD_TEMPLATES[op])
            prompt = template.format(
                name=name,
                pron=_PRONOUN[name],
                x=a,
                y=b,
                item=rng.choice(_ITEMS),
                container=rng.choice(_CONTAINERS),
            )
        meta = {"a": a, "b": b, "op": op, "kind": kind, "digits": digits, "expression": expr}
        return expr, Example(f"arithmetic/{kind}/{expr.replace(' ', '')}", prompt, str(result), None, meta)

    return sample_unique(draw, n, seed, split, stream=("arithmetic", kind, digits, op_list), what="arithmetic pool")


def grade(example: Example, output: str) -> float:
    """1.0 when the last number in `output` equals the integer target, else 0.0."""
    value = last_number(output)
    return 1.0 if value is not None and value == int(example.target) else 0.0


register_suite(
    "arithmetic",
    generate,
    grade,
    "Integer +, -, * as bare expressions or templated word problems; graded on the last number in the output.",
    metric="exact_match (last number)",
)
