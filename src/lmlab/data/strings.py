"""Character-level string tasks on common English words: reverse, count a letter, first/last letter, uppercase.

Task (kw ``task``):
    - ``"reverse"``: 'Reverse the word "planet".' -> ``tenalp``
    - ``"count"``: 'How many times does the letter "a" appear in "banana"?' -> ``3`` (only letters that occur)
    - ``"first_letter"`` / ``"last_letter"``: -> ``p`` / ``t``
    - ``"uppercase"``: -> ``PLANET``

Metric: exact match of the extracted answer: the output's last word (``[A-Za-z]+``), or for ``count`` its last
number (digits, or a number word zero..twenty). Comparison is case-insensitive except for ``uppercase``, where the
case is the point. So 'The reversed word is "tenalp".' and "tenalp" are right, "tenalp is planet reversed" is not
(its last word is "reversed"): ask for the bare answer, as the prompts do.

Data: `WORDS`, 270 common English words (4-9 letters, no palindromes) written into lmlab. Every seed splits the
*words* by hash into train/dev/test (so a test word is unseen in train for every task); the pool of a task is its
(word[, letter]) items in that split.
"""

from __future__ import annotations

import re
from typing import Any

from lmlab.data import (
    Example,
    check_choice,
    check_n,
    check_split,
    register_suite,
    reject_unknown,
    seeded_rng,
    split_of,
)

TASKS: tuple[str, ...] = ("reverse", "count", "first_letter", "last_letter", "uppercase")

# fmt: off
_RAW_WORDS = """
apple banana cherry orange lemon mango peach grape melon garden window kitchen table chair pencil paper
letter market school teacher student doctor nurse farmer baker painter singer dancer writer reader river
mountain valley forest desert island ocean planet rocket engine bridge castle tower street village city
country summer winter spring autumn morning evening night friday monday sunday number answer question
problem window button candle blanket pillow mirror basket bottle bucket ladder hammer needle thread jacket
sweater pocket wallet ticket camera guitar piano violin trumpet drum whistle puzzle riddle story poem
chapter library museum theater cinema stadium airport harbor station office factory bakery pharmacy hospital
animal rabbit turtle monkey donkey tiger lion zebra giraffe elephant dolphin whale shark salmon parrot eagle
falcon spider beetle butterfly honey butter cheese bread pasta pepper garlic onion potato tomato carrot
cabbage lettuce walnut almond coffee sugar flour cookie muffin pizza soup salad dinner lunch breakfast
family mother father sister brother cousin uncle neighbor stranger captain soldier sailor pilot driver
cloud thunder rain storm snow wind rainbow sunset shadow light darkness silver golden copper marble crystal
diamond purple yellow green scarlet violet crimson silent gentle happy clever brave quick strong simple
travel listen wonder gather borrow follow whisper jump dance laugh smile wander explore build create
blanket carpet curtain cushion drawer shelf closet garage attic cellar fence gate path road tunnel canal
harvest meadow orchard pasture prairie glacier volcano canyon lagoon marsh jungle savanna tundra
computer keyboard monitor printer network signal battery cable socket switch circuit magnet motor
journey voyage adventure holiday festival parade concert picnic wedding birthday lesson homework
science history biology physics algebra grammar language spelling
"""
# fmt: on
# Palindromes would make "reverse" a copy task; sorted + set keeps the list stable whatever the text's order.
WORDS: tuple[str, ...] = tuple(sorted({w for w in _RAW_WORDS.split() if len(w) >= 4 and w != w[::-1]}))

_NUMBER_WORDS = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
        "seventeen eighteen nineteen twenty".split()
    )
}


def _items(task: str, word: str) -> list[tuple[str, str, str]]:
    """(key, prompt, target) items of `task` for one word."""
    if task == "reverse":
        return [(word, f'Reverse the word "{word}". Answer with the reversed word only.', word[::-1])]
    if task == "uppercase":
        return [(word, f'Write the word "{word}" in uppercase letters. Answer with the word only.', word.upper())]
    if task == "first_letter":
        return [(word, f'What is the first letter of the word "{word}"? Answer with the letter only.', word[0])]
    if task == "last_letter":
        return [(word, f'What is the last letter of the word "{word}"? Answer with the letter only.', word[-1])]
    prompt = 'How many times does the letter "{c}" appear in the word "{w}"? Answer with a number.'
    return [(f"{word}|{c}", prompt.format(c=c, w=word), str(word.count(c))) for c in sorted(set(word))]


def generate(
    n: int | None = None,
    seed: int = 0,
    split: str = "test",
    *,
    task: str = "reverse",
    **unknown: Any,
) -> list[Example]:
    """String-manipulation examples.

    Args:
        n (`int`, *optional*): number of examples; None gives the whole split.
        seed (`int`): fixes the word split and the order.
        split (`str`): ``"train"``, ``"dev"`` or ``"test"``.
        task (`str`): one of `TASKS`.

    Returns:
        `list[Example]`: ``meta`` has ``task``, ``word`` and, for ``count``, ``letter``.
    """
    reject_unknown("strings", unknown, ("task",))
    check_split(split)
    check_choice("task", task, TASKS)
    words = [w for w in WORDS if split_of(w, seed) == split]
    items = [(w, *item) for w in words for item in _items(task, w)]
    seeded_rng("strings-order", seed, split, task).shuffle(items)
    check_n(n, pool=len(items), what=f"strings {split} split for task {task!r}")
    out = []
    for word, key, prompt, target in items if n is None else items[:n]:
        meta: dict[str, Any] = {"task": task, "word": word}
        if task == "count":
            meta["letter"] = key.split("|")[1]
        out.append(Example(f"strings/{task}/{key}", prompt, target, None, meta))
    return out


_WORD = re.compile(r"[A-Za-z]+")
_COUNT_TOKEN = re.compile(r"\d+|[A-Za-z]+")


def extract_answer(task: str, output: str) -> str | None:
    """The answer an output commits to: its last word, or for ``count`` its last number (digits or a number word)."""
    if task == "count":
        found = [
            str(int(tok)) if tok.isdigit() else str(_NUMBER_WORDS[tok.lower()])
            for tok in _COUNT_TOKEN.findall(output)
            if tok.isdigit() or tok.lower() in _NUMBER_WORDS
        ]
        return found[-1] if found else None
    words = _WORD.findall(output)
    return words[-1] if words else None


def grade(example: Example, output: str) -> float:
    """1.0 when the extracted answer equals the target (case-sensitive only for ``uppercase``), else 0.0."""
    task = example.meta["task"]
    answer = extract_answer(task, output)
    if answer is None:
        return 0.0
    if task == "uppercase":
        return 1.0 if answer == example.target else 0.0
    return 1.0 if answer.casefold() == example.target.casefold() else 0.0


register_suite(
    "strings",
    generate,
    grade,
    "Reverse a word, count a letter, first/last letter, uppercase; exact match of the extracted answer.",
)
