"""RULER-like synthetic long-context retrieval: passkey, multi-key NIAH, variable tracking, frequent words.

Task: a long context hides one or more "needles" in filler text, and a question at the end asks for them. The four
tasks follow RULER (Hsieh et al., 2024, arXiv 2404.06654) and the passkey test (Mohtashami & Jaggi, 2023):

- ``passkey``: one needle ``"The pass key is 48213. Remember it. 48213 is the pass key."``; the question asks for
  the pass key (5 digits).
- ``niah_multikey``: `n_keys` needles ``"One of the special magic numbers for quiet-harbor is: 4821337."`` with
  different keys (adjective-noun) and 7-digit values; the question asks for one key's value, the others are
  distractors (RULER's ``niah_multikey_1``).
- ``vt``: variable tracking. `n_chains` chains of `n_hops` + 1 assignments ``"VAR QXKZB = 48213."``,
  ``"VAR PLMRT = VAR QXKZB."``, ... spread through the filler in order; the question gives one chain's value and
  asks for every variable assigned it (all `n_hops` + 1 names are required). The other chains are distractors.
- ``fwe``: frequent-word extraction. The context is "coded text": random 6-letter words drawn with Zipf counts
  ``floor(W * k**-2 / zeta(2))`` for rank k, where rank 1 is the noise word ``"...."`` (as in RULER); the answer is
  the words of ranks 2-4, the three most frequent coded words. It has no filler and no needle.

Filler is templated English built from lmlab's own country facts (`lmlab.data.countries.country_facts`: capitals,
continents, currencies, borders, rough population and area in words), shuffled per example; it contains no digits,
so the needles' numbers are the only numbers in the context. Nothing is downloaded. `filler_text` gives plain filler
for methods that only need long natural-looking text (e.g. teacher-forced fidelity).

Length: ``context_tokens`` is the target length of the whole prompt (instruction, context, question and answer
cue). With ``tokenizer=`` (any HF tokenizer) the filler is cut by a binary search over its length in characters (the
last filler sentence may be cut mid-word), so that ``len(tokenizer(prompt).input_ids)`` equals the target, or falls
short by a token or two where BPE merges make the count jump; for ``fwe`` the coded words are whole and the text is
topped up with trailing dots (within a few tokens of the target). Without a tokenizer the prompt is
``round(context_tokens * chars_per_token)`` characters long, with `CHARS_PER_TOKEN` measured with SmolLM2's
tokenizer on this filler (Gemma-3's tokenizer is close on English text; pass a tokenizer whenever the length must
be exact).

Needle depth: ``meta["depth"]`` in [0, 1] is the relative position of the asked needle in the context (for ``vt``
the asked chain's first assignment; the later hops follow at random depths after it). Depths are spread uniformly
over the examples by a golden-ratio sequence (any prefix of the examples covers [0, 1) evenly), unless ``depth=``
fixes it. Needles are inserted between filler sentences.

Prompt: ``instruction + "\\n\\n" + context + "\\n\\nQuestion: ...\\nAnswer: <cue>"``: no chat template, and the
prompt ends with an answer cue (``"Answer: The pass key is"``), so base and instruct models answer by greedy
continuation. ``target`` is the answer (space-separated names/words for ``vt`` and ``fwe``).

Meta: ``task``, ``depth`` (None for ``fwe``), ``answers`` (the strings the grader requires), ``needles`` and
``needle_positions`` (needle texts and their character offsets in ``prompt``, in order of appearance),
``query_needles`` (indices into ``needles`` of the needles the question is about), ``context_span`` (character
offsets of the context in ``prompt``), ``context_tokens`` (the target) and, when a tokenizer was given,
``n_context_tokens`` (the prompt's actual token count).

Metric: exact match by containment (1.0 / 0.0): every string in ``meta["answers"]`` (one for ``passkey`` and
``niah_multikey``, all variables for ``vt``, all three words for ``fwe``) must occur as a whole word,
case-insensitively, in the first non-empty line of the output. `answer_recall` gives RULER's partial credit (the
fraction of required strings found).

Data: synthetic (seeded). Splits are disjoint by construction: each example has a key (the pass key, the asked
value, the vt chain's value, or the fwe answer words) and belongs to the split `split_of(key, seed)` assigns it.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
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
    stable_hash,
)

TASKS: tuple[str, ...] = ("passkey", "niah_multikey", "vt", "fwe")
_KEYWORDS: tuple[str, ...] = ("task", "context_tokens", "tokenizer", "depth", "n_keys", "n_hops", "n_chains")

# Characters per SmolLM2-135M token, measured with its tokenizer on this module's text (seed 0, 100k characters):
# the country-fact filler gives 4.55 chars/token; fwe's coded text (6 random letters + space per word) 2.33.
# Whole prompts come within ~2 % of the target with these; pass `tokenizer=` for exact lengths.
CHARS_PER_TOKEN: dict[str, float] = {"filler": 4.55, "fwe": 2.33}
# Below this the fixed text (instruction, needles, question) leaves too little room for a haystack.
MIN_CONTEXT_TOKENS = 256

_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0  # 0.618...: additive recurrence with the best spread of any prefix


# ---------------------------------------------------------------------------------------------------------------
# Filler: templated English from the country facts


def _pop_phrase(population: int) -> str | None:
    if population <= 0:
        return None
    if population < 100_000:
        return "fewer than a hundred thousand people"
    if population < 1_000_000:
        return "a few hundred thousand people"
    if population < 10_000_000:
        return "several million people"
    if population < 100_000_000:
        return "tens of millions of people"
    return "more than a hundred million people"


def _area_phrase(area_km2: float) -> str | None:
    if area_km2 <= 0:
        return None
    if area_km2 < 1_000:
        return "a very small area"
    if area_km2 < 100_000:
        return "a modest area"
    if area_km2 < 1_000_000:
        return "a large area"
    return "a vast area"


@cache
def _sentences() -> tuple[str, ...]:
    """Every filler sentence: a few templated facts per country, in a fixed order (shuffled per use)."""
    from lmlab.data.countries import country_facts

    facts = country_facts()
    by_iso = {r["iso2"]: r for r in facts}

    def the(r: dict[str, Any], start: bool = False) -> str:
        return f"{'The' if start else 'the'} {r['name']}" if r["the"] else r["name"]

    out: list[str] = []
    for r in facts:
        if r["capital"]:
            out.append(f"The capital of {the(r)} is {r['capital']}.")
        out.append(f"{the(r, True)} lies in {r['continent']}.")
        if r["currency"]:
            out.append(f"People in {the(r)} pay with the {r['currency']}.")
        neighbours = [by_iso[c] for c in r["neighbours"] if c in by_iso][:2]
        for nb in neighbours:
            out.append(f"{the(r, True)} shares a border with {the(nb)}.")
        if not r["neighbours"]:
            out.append(f"{the(r, True)} has no land border with any other country.")
        if pop := _pop_phrase(int(r["population"] or 0)):
            out.append(f"{the(r, True)} is home to {pop}.")
        if area := _area_phrase(float(r["area_km2"] or 0.0)):
            out.append(f"{the(r, True)} covers {area}.")
    # Digits would compete with the needles' numbers; the templates above never produce any.
    return tuple(s for s in out if not any(ch.isdigit() for ch in s))


def _filler_sentences(stream: tuple[object, ...], n_chars: int) -> list[str]:
    """Seeded sentences whose " "-join is at least `n_chars` long (the pool is reshuffled each time it runs out)."""
    rng = seeded_rng("ruler-filler", *stream)
    pool = list(_sentences())
    out: list[str] = []
    total = -1
    while total < n_chars:
        order = pool[:]
        rng.shuffle(order)
        for s in order:
            out.append(s)
            total += len(s) + 1
            if total >= n_chars:
                break
    return out


def filler_text(seed: int, n_chars: int) -> str:
    """Plain filler: whole templated country-fact sentences, seeded, at most `n_chars` characters long.

    The text is as long as whole sentences allow (it falls short of `n_chars` by less than one sentence, ~60
    characters). For a token budget, request ``n_tokens * 6`` characters (SmolLM2 averages `CHARS_PER_TOKEN`
    ``["filler"]`` = 4.55 characters per token here) and slice the token ids.

    Args:
        seed (`int`): fixes the sentence order.
        n_chars (`int`): maximum length in characters.

    Returns:
        `str`: sentences joined by single spaces (no digits, no newlines).
    """
    if isinstance(n_chars, bool) or not isinstance(n_chars, int) or n_chars < 0:
        raise ValueError(f"n_chars must be an int >= 0, got {n_chars!r}")
    out: list[str] = []
    total = -1
    for s in _filler_sentences(("text", seed), n_chars):
        if total + len(s) + 1 > n_chars:
            break
        out.append(s)
        total += len(s) + 1
    return " ".join(out)


# ---------------------------------------------------------------------------------------------------------------
# Needles

# Words for niah_multikey keys ("adjective-noun", as RULER's wonderwords keys): 40 x 40 = 1,600 keys.
_ADJECTIVES = (
    "quiet amber brave calm clever silent golden hollow gentle hidden icy jolly lively misty narrow noble odd "
    "pale proud rapid rusty shiny sleepy smooth solid steady swift tidy tiny vivid warm wild windy wise young "
    "bitter bold crisp dusty eager"
).split()
_NOUNS = (
    "harbor lantern meadow falcon river candle garden castle island forest pebble comet bridge violin orchard "
    "canyon beacon willow compass glacier thunder marble saddle cabin anchor quill meteor lagoon ribbon kettle "
    "tunnel badger cactus dolphin feather hammer jungle kitten ladder mirror"
).split()


@dataclass(frozen=True)
class _Needle:
    depth: float  # requested relative position in the context, in [0, 1]
    text: str
    query: bool  # asked about by the question


@dataclass(frozen=True)
class _Spec:
    """Everything about one example except the filler length: the fitter renders it at a given length."""

    key: str
    instruction: str
    question: str  # "Question: ...\nAnswer: <cue>"
    needles: tuple[_Needle, ...]
    target: str
    answers: tuple[str, ...]
    depth: float | None
    extra: dict[str, Any]


def _coded_word(rng: Any, length: int = 6) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(length))


def _var_name(rng: Any) -> str:
    return "".join(rng.choice(string.ascii_uppercase) for _ in range(5))


def _draw_key(task: str, rng: Any, kw: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The split key and the secret of one candidate example (cheap: the split filter runs before any rendering)."""
    if task == "passkey":
        value = rng.randint(10_000, 99_999)
        return f"passkey/{value}", {"value": value}
    if task == "niah_multikey":
        value = rng.randint(1_000_000, 9_999_999)
        return f"niah_multikey/{value}", {"value": value}
    if task == "vt":
        value = rng.randint(10_000, 99_999)
        return f"vt/{value}", {"value": value}
    # fwe: a fresh coded vocabulary; ranks 2-4 are the answer
    words: list[str] = []
    while len(words) < 64:
        w = _coded_word(rng)
        if w not in words:
            words.append(w)
    return f"fwe/{' '.join(words[:3])}", {"vocab": words}


def _spec(task: str, secret: dict[str, Any], rng: Any, depth: float, kw: dict[str, Any]) -> _Spec:
    if task == "passkey":
        pk = secret["value"]
        needle = _Needle(depth, f"The pass key is {pk}. Remember it. {pk} is the pass key.", True)
        return _Spec(
            key=f"passkey/{pk}",
            instruction=(
                "There is an important piece of information hidden inside a lot of irrelevant text. Find it and "
                "memorize it. I will quiz you about the important information there."
            ),
            question="Question: What is the pass key?\nAnswer: The pass key is",
            needles=(needle,),
            target=str(pk),
            answers=(str(pk),),
            depth=depth,
            extra={},
        )
    if task == "niah_multikey":
        n_keys = kw["n_keys"]
        keys: list[str] = []
        while len(keys) < n_keys:
            k = f"{rng.choice(_ADJECTIVES)}-{rng.choice(_NOUNS)}"
            if k not in keys:
                keys.append(k)
        values = [secret["value"]]
        while len(values) < n_keys:
            v = rng.randint(1_000_000, 9_999_999)
            if v not in values:
                values.append(v)
        needles = [_Needle(depth, f"One of the special magic numbers for {keys[0]} is: {values[0]}.", True)]
        needles += [
            _Needle(rng.random(), f"One of the special magic numbers for {k} is: {v}.", False)
            for k, v in zip(keys[1:], values[1:])
        ]
        return _Spec(
            key=f"niah_multikey/{values[0]}",
            instruction=(
                "Some special magic numbers are hidden within the following text. Make sure to memorize them. "
                "I will quiz you about the numbers afterwards."
            ),
            question=(
                f"Question: What is the special magic number for {keys[0]} mentioned in the provided text?\n"
                f"Answer: The special magic number for {keys[0]} mentioned in the provided text is"
            ),
            needles=tuple(needles),
            target=str(values[0]),
            answers=(str(values[0]),),
            depth=depth,
            extra={"key": keys[0], "keys": keys, "values": values},
        )
    if task == "vt":
        n_hops, n_chains = kw["n_hops"], kw["n_chains"]
        names: list[str] = []
        while len(names) < n_chains * (n_hops + 1):
            name = _var_name(rng)
            if name not in names:
                names.append(name)
        values = [secret["value"]]
        while len(values) < n_chains:
            v = rng.randint(10_000, 99_999)
            if v not in values:
                values.append(v)
        needles = []
        chains = []
        for c in range(n_chains):
            chain = names[c * (n_hops + 1) : (c + 1) * (n_hops + 1)]
            chains.append(chain)
            if c == 0:
                # the asked chain starts at `depth`; its later hops follow somewhere after it, in order
                depths = [depth] + sorted(depth + (1.0 - depth) * rng.random() for _ in range(n_hops))
            else:
                depths = sorted(rng.random() for _ in range(n_hops + 1))
            texts = [f"VAR {chain[0]} = {values[c]}."] + [
                f"VAR {chain[i]} = VAR {chain[i - 1]}." for i in range(1, n_hops + 1)
            ]
            needles += [_Needle(d, t, c == 0) for d, t in zip(depths, texts)]
        asked = chains[0]
        return _Spec(
            key=f"vt/{values[0]}",
            instruction="Memorize and track the chain(s) of variable assignment hidden in the following text.",
            question=(
                f"Question: Find all variables that are assigned the value {values[0]} in the text above.\n"
                f"Answer: According to the chain(s) of variable assignment in the text above, {n_hops + 1} "
                f"variables are assigned the value {values[0]}, they are:"
            ),
            needles=tuple(needles),
            target=" ".join(asked),
            answers=tuple(asked),
            depth=depth,
            extra={"value": values[0], "chains": chains, "values": values},
        )
    vocab = secret["vocab"]
    return _Spec(
        key=f"fwe/{' '.join(vocab[:3])}",
        instruction=(
            "Read the following coded text and track the frequency of each coded word. Find the three most "
            "frequently appeared coded words."
        ),
        question=(
            "Question: Do not provide any explanation. Please ignore the dots '....'. What are the three most "
            "frequently appeared words in the above coded text?\n"
            "Answer: According to the coded text above, the three most frequently appeared words are:"
        ),
        needles=(),
        target=" ".join(vocab[:3]),
        answers=tuple(vocab[:3]),
        depth=None,
        extra={"vocab": vocab},
    )


# ---------------------------------------------------------------------------------------------------------------
# Rendering at a given length, and the length fit


@dataclass
class _Rendered:
    prompt: str
    needle_positions: list[int]
    needle_texts: list[str]
    query_needles: list[int]
    context_span: tuple[int, int]
    extra: dict[str, Any]


def _render_text(spec: _Spec, filler: str, bounds: list[int], n_chars: int) -> _Rendered:
    """Prompt with the first `n_chars` characters of `filler` and the needles inserted at sentence boundaries.

    `bounds` are the offsets in `filler` where a sentence ends (plus 0): a needle of depth d goes to the boundary
    closest to ``d * n_chars`` among those inside the cut, so it never splits a sentence or the cut word.
    """
    body = filler[:n_chars]
    inside = [b for b in bounds if b <= n_chars]
    # needles sorted by depth, stable, so a vt chain keeps its order even when two hops share a boundary
    order = sorted(range(len(spec.needles)), key=lambda i: spec.needles[i].depth)
    cuts: list[tuple[int, int]] = []  # (boundary, needle index)
    j = 0
    for i in order:
        goal = spec.needles[i].depth * n_chars
        while j + 1 < len(inside) and abs(inside[j + 1] - goal) <= abs(inside[j] - goal):
            j += 1  # boundaries are sorted; the cut never moves backwards, which keeps needles in depth order
        cuts.append((inside[j], i))
    head = spec.instruction + "\n\n"
    parts: list[str] = []
    positions: list[int] = []
    texts: list[str] = []
    queries: list[int] = []
    pos = len(head)
    last = 0

    def add(piece: str) -> None:
        nonlocal pos
        if not piece:
            return
        if parts:
            parts.append(" ")
            pos += 1
        parts.append(piece)
        pos += len(piece)

    for b, i in cuts:
        add(body[last:b].strip())
        last = b
        if parts:
            positions.append(pos + 1)
        else:
            positions.append(pos)
        if spec.needles[i].query:
            queries.append(len(texts))
        texts.append(spec.needles[i].text)
        add(spec.needles[i].text)
    add(body[last:].strip())
    context = "".join(parts)
    prompt = head + context + "\n\n" + spec.question
    return _Rendered(prompt, positions, texts, queries, (len(head), len(head) + len(context)), {})


def _fwe_counts(n_words: int, vocab_size: int) -> list[int]:
    """RULER's counts: ``floor(W * k**-alpha / zeta(alpha))`` for ranks k = 1.. with alpha = 2 (zeta(2) = pi^2/6)."""
    zeta2 = math.pi**2 / 6.0
    return [int(n_words * k**-2.0 / zeta2) for k in range(1, vocab_size + 1)]


def _render_fwe(spec: _Spec, n_words: int, n_dots: int, stream: tuple[object, ...]) -> _Rendered:
    vocab = ["...."] + list(spec.extra["vocab"])  # rank 1 is the noise word, as in RULER
    counts = _fwe_counts(n_words, len(vocab))
    words = [w for w, c in zip(vocab, counts) for _ in range(c)]
    seeded_rng("ruler-fwe-order", *stream, n_words).shuffle(words)
    head = spec.instruction + "\n\n"
    # trailing dots fine-tune the length below one coded word; "...." is the noise the question says to ignore
    context = " ".join(words) + "." * n_dots
    prompt = head + context + "\n\n" + spec.question
    ranked = {w: c for w, c in zip(vocab, counts) if c}
    return _Rendered(prompt, [], [], [], (len(head), len(head) + len(context)), {"word_counts": ranked})


def _largest_fitting(render: Callable[[int], str], count: Callable[[str], int], target: int, lo: int, hi: int) -> int:
    """Largest x in [lo, hi] with ``count(render(x)) <= target``, by bisection (assumes a near-monotone count).

    `hi` is grown until it overshoots; raises when even `lo` is over the target.
    """
    if count(render(lo)) > target:
        raise ValueError(f"context_tokens={target} is too small for the task's fixed text (instruction, needles)")
    while count(render(hi)) <= target:
        lo, hi = hi, hi * 2
    # invariant: count(lo) <= target < count(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if count(render(mid)) <= target:
            lo = mid
        else:
            hi = mid
    return lo


def _build(
    spec: _Spec, task: str, context_tokens: int, tokenizer: Any, stream: tuple[object, ...]
) -> tuple[_Rendered, int | None]:
    if tokenizer is not None:

        def count(text: str) -> int:
            return len(tokenizer(text)["input_ids"])

        target = context_tokens
    else:
        count = len
        target = round(context_tokens * CHARS_PER_TOKEN["fwe" if task == "fwe" else "filler"])

    if task == "fwe":
        # coarse: whole coded words (a nominal W; the text holds sum(counts) <= W words); fine: trailing dots
        n_words = _largest_fitting(lambda w: _render_fwe(spec, w, 0, stream).prompt, count, target, 16, 64)
        if _fwe_counts(n_words, len(spec.extra["vocab"]) + 1)[3] <= _fwe_counts(n_words, 65)[4]:
            raise ValueError(f"context_tokens={context_tokens} is too short for a strict top-3 in fwe")
        n_dots = _largest_fitting(lambda d: _render_fwe(spec, n_words, d, stream).prompt, count, target, 0, 8)
        n_dots = min(n_dots, 16)
        rendered = _render_fwe(spec, n_words, n_dots, stream)
    else:
        # filler long enough for any tokenizer: 8 characters per token is above every real ratio
        sentences = _filler_sentences(stream, 8 * context_tokens + 64)
        filler = " ".join(sentences)
        bounds = [0]
        for s in sentences:
            bounds.append(bounds[-1] + len(s) + (1 if len(bounds) > 1 else 0))
        hi = max(64, target)
        n_chars = _largest_fitting(lambda c: _render_text(spec, filler, bounds, c).prompt, count, target, 0, hi)
        rendered = _render_text(spec, filler, bounds, min(n_chars, len(filler)))
    n_tokens = count(rendered.prompt) if tokenizer is not None else None
    return rendered, n_tokens


# ---------------------------------------------------------------------------------------------------------------
# Suite API


def _check_int(name: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an int in [{lo}, {hi}], got {value!r}")


def generate(
    n: int | None = None,
    seed: int = 0,
    split: str = "test",
    *,
    task: str = "passkey",
    context_tokens: int = 2048,
    tokenizer: Any = None,
    depth: float | None = None,
    n_keys: int = 4,
    n_hops: int = 4,
    n_chains: int = 2,
    **unknown: Any,
) -> list[Example]:
    """RULER-like long-context examples (see the module docstring for the tasks, prompt format and meta).

    Args:
        n (`int`): number of examples (the pool is unbounded, so ``None`` is rejected).
        seed (`int`): fixes the split assignment and everything drawn.
        split (`str`): ``"train"``, ``"dev"`` or ``"test"``; disjoint by the example key.
        task (`str`, defaults to ``"passkey"``): one of `TASKS`.
        context_tokens (`int`, defaults to `2048`): target prompt length in tokens (RULER's 4k-128k scaled down to
            a 135M model on CPU); at least `MIN_CONTEXT_TOKENS`.
        tokenizer (*optional*): an HF tokenizer; when given, the prompt is fitted to exactly `context_tokens`
            tokens as counted by ``len(tokenizer(prompt)["input_ids"])`` (special tokens included), otherwise the
            length is estimated with `CHARS_PER_TOKEN`.
        depth (`float`, *optional*): fix the asked needle's depth for every example; by default depths are spread
            uniformly over the examples.
        n_keys (`int`, defaults to `4`): ``niah_multikey`` needles (1 asked + 3 distractors, RULER's default).
        n_hops (`int`, defaults to `4`): ``vt`` hops per chain (5 variables, RULER's default).
        n_chains (`int`, defaults to `2`): ``vt`` chains (1 asked + 1 distractor).

    Returns:
        `list[Example]`: prompts ending in an answer cue; ``target`` is the answer.
    """
    reject_unknown("ruler", unknown, _KEYWORDS)
    check_split(split)
    check_n(n, what="ruler pool")
    check_choice("task", task, TASKS)
    _check_int("context_tokens", context_tokens, MIN_CONTEXT_TOKENS, 1 << 20)
    _check_int("n_keys", n_keys, 1, 64)
    _check_int("n_hops", n_hops, 1, 32)
    _check_int("n_chains", n_chains, 1, 16)
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0 <= depth <= 1):
        raise ValueError(f"depth must be None or a float in [0, 1], got {depth!r}")
    if tokenizer is not None and not callable(tokenizer):
        raise ValueError(f"tokenizer must be None or a callable HF tokenizer, got {type(tokenizer).__name__}")
    kw = {"n_keys": n_keys, "n_hops": n_hops, "n_chains": n_chains}
    assert n is not None
    # one RNG stream per (task, seed, split): more test examples never change the train ones
    rng = seeded_rng("ruler-draw", task, seed, split)
    offset = seeded_rng("ruler-depth", task, seed, split).random()
    seen: set[str] = set()
    out: list[Example] = []
    for _ in range(200 * n + 2000):
        if len(out) == n:
            break
        key, secret = _draw_key(task, rng, kw)
        if key in seen or split_of(key, seed) != split:
            continue
        seen.add(key)
        i = len(out)
        d = float(depth) if depth is not None else (offset + i * _GOLDEN) % 1.0
        # the rest of the example is drawn from its own stream, so its content depends only on (seed, key, kw)
        ex_rng = seeded_rng("ruler-example", task, seed, key, n_keys, n_hops, n_chains)
        spec = _spec(task, secret, ex_rng, d, kw)
        stream = (task, seed, key)
        rendered, n_tokens = _build(spec, task, context_tokens, tokenizer, stream)
        meta: dict[str, Any] = {
            "task": task,
            "depth": spec.depth,
            "answers": list(spec.answers),
            "needles": rendered.needle_texts,
            "needle_positions": rendered.needle_positions,
            "query_needles": rendered.query_needles,
            "context_span": list(rendered.context_span),
            "context_tokens": context_tokens,
            **spec.extra,
            **rendered.extra,
        }
        meta.pop("vocab", None)
        if n_tokens is not None:
            meta["n_context_tokens"] = n_tokens
        secret_id = spec.key.split("/", 1)[1].replace(" ", "-")
        out.append(Example(f"ruler/{task}/{context_tokens}/{secret_id}", rendered.prompt, spec.target, None, meta))
    if len(out) < n:
        raise ValueError(f"n={n} is larger than the ruler {task} pool allows (found {len(out)} {split} examples)")
    return out


def _first_line(output: str) -> str:
    for line in output.splitlines():
        if line.strip():
            return line
    return ""


def _found(line: str, answer: str) -> bool:
    # whole word: "48213" must not match inside "148213"
    return re.search(rf"(?<![0-9A-Za-z]){re.escape(answer)}(?![0-9A-Za-z])", line, flags=re.IGNORECASE) is not None


def answer_recall(example: Example, output: str) -> float:
    """RULER's ``string_match_all`` partial credit: the fraction of ``meta["answers"]`` found in the first line."""
    line = _first_line(output)
    answers = example.meta["answers"]
    return sum(_found(line, a) for a in answers) / len(answers)


def grade(example: Example, output: str) -> float:
    """1.0 when every required answer occurs (whole word, any case) in the output's first non-empty line."""
    return 1.0 if answer_recall(example, output) == 1.0 else 0.0


register_suite(
    "ruler",
    generate,
    grade,
    "RULER-like long-context retrieval (passkey, multi-key NIAH, variable tracking, frequent words) at a target "
    "token length; answer cue for greedy continuation.",
    metric="exact_match (all answers in the first line; answer_recall for partial credit)",
    source="synthetic (seeded); filler templated from lmlab.data.countries facts",
)

__all__ = ["CHARS_PER_TOKEN", "MIN_CONTEXT_TOKENS", "TASKS", "answer_recall", "filler_text", "generate", "grade"]
_ = stable_hash  # re-exported helper kept importable for callers hashing example keys the same way
