"""The composite target ``composite/capital_upper``: "the capital of X, answered in uppercase" (the spec's example),
selectable, not the default (at this scale no expert beats the base model on it; README, Deviations); and
`held_out_dev`, the dev pool of every geography target.

Pure (no model, no I/O): task-bank ``geography/capital`` examples in, composite examples out. No new data: the
countries, their train / dev / test partition and the capital distractors are the task bank's; only the prompt and
the options change.

Prompt: ``"Q: What is the capital of <country>? Write the answer in uppercase letters.\\nA:"`` (the instruction
echoes the ``strings/uppercase`` prompts, "Write the word "poem" in uppercase letters."). Options, in a seeded
order (`n_choices` of them):

* the gold capital in uppercase (``"WARSAW"``): the answer;
* the gold capital as written (``"Warsaw"``): the *case trap*, what the capital skill alone answers;
* ``n_choices - 2`` other capitals in uppercase (the capital item's seeded distractors): what the case skill alone
  cannot tell apart from the answer.

So the task needs both component skills: knowing the capital and ignoring the case picks the trap (0 correct);
following the case without knowing the capital picks one of ``n_choices - 1`` uppercase names (1/3 at 4 options);
chance is 1/`n_choices`. ``meta["trap_index"]`` is the trap's position, for the trap rate of a system.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from lmlab.data import Example, seeded_rng

INSTRUCTION = " Write the answer in uppercase letters."
PROMPT_HEAD, PROMPT_TAIL = "Q: ", "\nA:"  # the task bank's prompt: "Q: <question>\nA:"


def _trap(gold: str) -> str:
    """The gold answer in a case other than uppercase: as written, else capitalised, else lower case."""
    up = gold.upper()
    for c in (gold, gold.capitalize(), gold.lower()):
        if c != up:
            return c
    raise ValueError(f"capital {gold!r} has no lower-case letter; it cannot carry a case trap")


def capital_upper(capital_items: Sequence[Example], n_choices: int, seed: int) -> list[Example]:
    """One composite example per task-bank ``geography/capital`` example (made with ``n_choices >= 2``, so its
    ``meta["distractors"]`` holds ``n_choices - 1`` other capitals, best first); ids
    ``model_swarms/capital_upper/<ISO2>``."""
    if isinstance(n_choices, bool) or not isinstance(n_choices, int) or n_choices < 2:
        raise ValueError(f"n_choices must be an int >= 2 (the answer and the case trap), got {n_choices!r}")
    out = []
    for ex in capital_items:
        meta = ex.meta
        if meta.get("domain") != "geography" or meta.get("task") != "capital":
            raise ValueError(f"capital_upper takes geography/capital examples of the task bank, got {ex.id!r}")
        if not (ex.prompt.startswith(PROMPT_HEAD) and ex.prompt.endswith(PROMPT_TAIL)):
            raise ValueError(f"{ex.id}: expected a 'Q: ...\\nA:' prompt, got {ex.prompt!r}")
        question = ex.prompt[len(PROMPT_HEAD) : -len(PROMPT_TAIL)]
        gold, trap = ex.target.upper(), _trap(ex.target)
        taken = {gold, trap}
        others = []
        for d in meta.get("distractors", ()):  # other capitals, never an accepted answer of this country
            if len(others) == n_choices - 2:
                break
            if d.upper() not in taken:
                taken.add(d.upper())
                others.append(d.upper())
        if len(others) < n_choices - 2:
            raise ValueError(f"{ex.id} has {len(others)} usable distractor capitals, n_choices={n_choices} needs "
                             f"{n_choices - 2}; make the capital items with n_choices >= {n_choices}")  # fmt: skip
        options = [gold, trap, *others]
        order = list(range(len(options)))
        seeded_rng("model_swarms-capital-upper", seed, ex.id).shuffle(order)
        choices = tuple(options[i] for i in order)
        new_meta = {"domain": "composite", "task": "capital_upper", "components": ["geography/capital",
                    "strings/uppercase"], "country": meta.get("country"), "iso2": meta["iso2"],
                    "difficulty": meta.get("difficulty"), "answers": [a.upper() for a in meta.get("answers", [])],
                    "case_sensitive": True, "answer_index": order.index(0), "trap_index": order.index(1),
                    "distractors": [trap, *others]}  # fmt: skip
        out.append(Example(f"model_swarms/capital_upper/{meta['iso2']}", f"{PROMPT_HEAD}{question}{INSTRUCTION}"
                           f"{PROMPT_TAIL}", gold, choices, new_meta))  # fmt: skip
    return out


def held_out_dev(dev_split: Sequence[Example], train_split: Sequence[Example],
                 trained: Iterable[str]) -> list[Example]:  # fmt: skip
    """The dev pool of a geography target (a geography family, or the composite built from capital items): every
    dev-split item, then the train-split items of countries (``meta["iso2"]``) outside `trained` (the countries a
    geography expert trained on). The dev split alone has 24 countries; the test split (122) stays untouched, so
    dev, test and every expert's training data are disjoint by country."""
    seen = set(trained)
    return [*dev_split, *(e for e in train_split if e.meta["iso2"] not in seen)]
