"""Indirect object identification (IOI), after Wang et al. 2022, "Interpretability in the Wild".

Task: complete "When Mary and John went to the store, John gave a drink to" with the indirect object " Mary" (the
name that is *not* repeated). Two name orders: ``ABBA`` (IO first: "Mary and John ..., John gave ... to") and
``BABA`` (subject first: "John and Mary ..., John gave ... to"). ``choices = (" IO", " S")`` for logit-difference
metrics; ``meta["corrupted_prompt"]`` is the ABC-style counterfactual for activation patching: the second mention
of the subject is replaced by a third name C, which removes the "repeated name" signal while keeping every token
position (all names are single tokens).

Metric: exact: 1.0 when the stripped output starts with the IO name as a whole word ("Mary", "Mary.", not "Maryland"),
else 0.0.

Data: synthetic, seeded; 8 templates written for lmlab in the style of the paper's, 12 places, 12 objects and
`NAMES`: common English first names that are each a single token with a leading space in both the SmolLM2 (GPT-2
style BPE, "ĠMary") and Gemma-3 (SentencePiece, "▁Mary") tokenizers (checked against both tokenizer.json files).
Names that are also common words (Mark, Rose, Grace, Bill, Ray, Max, Jack, Frank) are left out. An item's split is
a hash of (template, order, IO, S, place, object).
"""

from __future__ import annotations

import random
from typing import Any

from lmlab.data import Example, check_choice, check_n, check_split, register_suite, reject_unknown, sample_unique

# fmt: off
NAMES: tuple[str, ...] = (
    "John", "Mary", "Alice", "Bob", "Sarah", "James", "Michael", "David", "Robert", "William", "Richard", "Thomas",
    "Charles", "Daniel", "Matthew", "Anthony", "Paul", "Steven", "Andrew", "Kevin", "Brian", "George", "Edward",
    "Peter", "Ryan", "Jacob", "Eric", "Adam", "Henry", "Patrick", "Scott", "Justin", "Sam", "Tom", "Tim", "Ben",
    "Jim", "Joe", "Dan", "Mike", "Chris", "Steve", "Kate", "Anna", "Emma", "Linda", "Susan", "Lisa", "Karen",
    "Nancy", "Betty", "Helen", "Sandra", "Laura", "Amy", "Rachel", "Emily", "Jessica", "Jennifer", "Elizabeth",
    "Barbara", "Margaret", "Michelle", "Julia", "Jane", "Lucy", "Alex", "Luke", "Ethan", "Noah", "Oliver", "Sophia",
    "Olivia", "Mia", "Ella", "Amanda", "Nicole", "Anne", "Claire", "Maria", "Martin", "Carl", "Arthur", "Harry",
    "Joseph", "Simon", "Roger", "Larry", "Jerry", "Fred", "Karl", "Dave", "Greg", "Jeff", "Ian", "Sean", "Ruth",
    "Diana", "Julie", "Hannah", "Sophie", "Kelly", "Jason", "Tony", "Nick", "Oscar", "Vincent", "Victor", "Lewis",
    "Bruce", "Carol", "Joan",
)
# fmt: on

# {A} and {B} are the first two mentions; {S} is the repeated subject; the prompt stops right before the IO. No
# template starts with a name, so every name follows a space and is one token.
TEMPLATES: tuple[str, ...] = (
    "When {A} and {B} went to the {place}, {S} gave a {obj} to",
    "After {A} and {B} arrived at the {place}, {S} handed a {obj} to",
    "Then, {A} and {B} went to the {place}. {S} gave a {obj} to",
    "While {A} and {B} were working at the {place}, {S} passed a {obj} to",
    "When {A} and {B} got a {obj} at the {place}, {S} decided to give it to",
    "Afterwards, {A} and {B} went to the {place}. {S} brought a {obj} to",
    "Today {A} and {B} had lunch at the {place}. Later, {S} offered a {obj} to",
    "Yesterday {A} and {B} visited the {place}, and {S} showed a {obj} to",
)
PLACES: tuple[str, ...] = (
    "store", "garden", "restaurant", "school", "hospital", "office",
    "station", "park", "library", "market", "beach", "museum",
)  # fmt: skip
OBJECTS: tuple[str, ...] = (
    "drink", "book", "ring", "snack", "necklace", "basketball",
    "computer", "letter", "gift", "ticket", "flower", "cake",
)  # fmt: skip
ORDERS: tuple[str, ...] = ("mixed", "ABBA", "BABA")


def generate(
    n: int | None = None,
    seed: int = 0,
    split: str = "test",
    *,
    order: str = "mixed",
    **unknown: Any,
) -> list[Example]:
    """IOI examples.

    Args:
        n (`int`): number of examples (required: the pool is generated).
        seed (`int`): fixes the split and the draws.
        split (`str`): ``"train"``, ``"dev"`` or ``"test"``.
        order (`str`): ``"ABBA"``, ``"BABA"`` or ``"mixed"`` (each example picks one at random).

    Returns:
        `list[Example]`: target ``" <IO>"`` (leading space, the next token); ``choices = (" <IO>", " <S>")``;
        ``meta`` has ``io``, ``s``, ``c`` (the corrupting name), ``template`` (index into `TEMPLATES`), ``order``,
        ``place``, ``object`` and ``corrupted_prompt``.
    """
    reject_unknown("ioi", unknown, ("order",))
    check_split(split)
    check_choice("order", order, ORDERS)
    check_n(n, pool=None, what="IOI pool")

    def draw(rng: random.Random) -> tuple[str, Example]:
        t = rng.randrange(len(TEMPLATES))
        this_order = order if order != "mixed" else rng.choice(("ABBA", "BABA"))
        io, s, c = rng.sample(NAMES, 3)
        place, obj = rng.choice(PLACES), rng.choice(OBJECTS)
        a, b = (io, s) if this_order == "ABBA" else (s, io)
        prompt = TEMPLATES[t].format(A=a, B=b, S=s, place=place, obj=obj)
        corrupted = TEMPLATES[t].format(A=a, B=b, S=c, place=place, obj=obj)
        key = f"{t}|{this_order}|{io}|{s}|{place}|{obj}"
        meta = {
            "io": io,
            "s": s,
            "c": c,
            "template": t,
            "order": this_order,
            "place": place,
            "object": obj,
            "corrupted_prompt": corrupted,
        }
        ident = f"ioi/{t}/{this_order}/{io}-{s}/{place}/{obj}"
        return key, Example(ident, prompt, f" {io}", (f" {io}", f" {s}"), meta)

    assert n is not None
    return sample_unique(draw, n, seed, split, stream=("ioi", order), what="IOI pool")


def grade(example: Example, output: str) -> float:
    """1.0 when the stripped output starts with the IO name as a whole word, else 0.0."""
    name = example.meta.get("io", example.target.strip())
    text = output.strip()
    if not text.startswith(name):
        return 0.0
    rest = text[len(name) :]
    return 0.0 if rest[:1].isalnum() else 1.0


register_suite(
    "ioi",
    generate,
    grade,
    "Indirect object identification prompts (ABBA/BABA) with single-token names, choices (IO, S) and an "
    "ABC-corrupted prompt for patching; graded on whether the output starts with the IO name.",
)
