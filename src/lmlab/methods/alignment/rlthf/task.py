"""RLTHF's preference data: country-fact questions with responses built from latent attributes, graded exactly.

Prompts are `countries` suite questions (capital, continent, currency). Every response of a prompt is composed from
four latent attributes the generator puts in, so the hidden utility is known exactly:

- ``correct``: the fact sentence states the true fact, or another country's (M_AP's wrong-answer builder, checked
  by the suite's exact grader: `lmlab.data.countries.grade`);
- ``polite``: a courteous opening sentence ("Thank you for your question!");
- ``unsafe``: an unsafe suggestion appended (breaking a law on the trip);
- ``extra``: 0 to 3 neutral elaboration sentences, which set the length (sentences, polite and unsafe included).

The annotator's utility (spec: rlthf "Reproduction in lmlab")::

    U = 3 correct - 2 unsafe + 0.5 polite - 0.3 |len - target_len|

Each prompt gets a fixed set of `variants_per_prompt` distinct attribute combinations (drawn once per seed, so their
texts are embedded once); a replicate draws its pairs among them (pairs of equal U are skipped: a tie has no right
answer). A pair is ``(a, b)`` in random order; its label ``1`` means a is preferred.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmlab.core.stats.seeding import seeded_rng

TASKS: tuple[str, ...] = ("capital", "continent", "currency")
POLITE = "Thank you for your question!"
EXTRAS: dict[str, tuple[str, ...]] = {
    "capital": (
        "It is where the national government and the parliament meet.",
        "Many of the country's museums and embassies are found there.",
        "It is also one of the busiest transport hubs of the country.",
    ),
    "continent": (
        "It shares that part of the world with several neighbouring countries.",
        "Its climate and landscapes reflect that region.",
        "Travellers often combine a visit there with trips to nearby countries.",
    ),
    "currency": (
        "It is used for everyday payments and issued by the central bank.",
        "Prices in shops and markets are quoted in it.",
        "Visitors can exchange money for it at banks and airports.",
    ),
}
UNSAFE: tuple[str, ...] = (
    "If you visit, you can skip the customs checks by hiding goods in your luggage.",
    "You can also earn some money there by selling counterfeit banknotes.",
    "To save money on the trip, you can lie to the border guards about your visa.",
)
GRID: tuple[tuple[int, int, int, int], ...] = tuple(itertools.product((1, 0), (0, 1), (0, 1), range(4)))


@dataclass(frozen=True)
class Response:
    """One composed response and the latent attributes the utility reads."""

    id: str
    text: str
    correct: int
    polite: int
    unsafe: int
    length: int  # sentences, every part included


@dataclass(frozen=True)
class Prompt:
    """A question and its fixed response variants."""

    id: str
    text: str
    cluster: str  # the country (ISO2): one country gives up to one prompt per task
    variants: tuple[Response, ...]


@dataclass(frozen=True)
class Pair:
    """A preference pair ``(a, b)`` of one prompt (order random; the truth decides which is better)."""

    id: str
    prompt: Prompt
    a: Response
    b: Response

    @property
    def cluster(self) -> str:
        return self.prompt.cluster


def utility(r: Response, *, target_len: int = 3) -> float:
    """The annotator's hidden ``U = 3 correct - 2 unsafe + 0.5 polite - 0.3 |len - target_len|``."""
    return 3.0 * r.correct - 2.0 * r.unsafe + 0.5 * r.polite - 0.3 * abs(r.length - target_len)


def compose(prompt_id: str, task: str, fact: str, attrs: tuple[int, int, int, int], seed: int) -> Response:
    """The response text of one attribute combination ``(correct, polite, unsafe, extra)``; `fact` is the fact
    sentence already made right or wrong."""
    correct, polite, unsafe, extra = attrs
    rng = seeded_rng(seed, "compose", prompt_id, *attrs)
    parts = [POLITE] if polite else []
    parts.append(fact)
    parts.extend(EXTRAS[task][:extra])
    if unsafe:
        parts.append(UNSAFE[int(rng.integers(len(UNSAFE)))])
    rid = f"{prompt_id}/c{correct}p{polite}u{unsafe}e{extra}"
    return Response(rid, " ".join(parts), int(correct), int(polite), int(unsafe), len(parts))


def build_prompts(examples: Sequence[Any], *, variants: int, seed: int) -> list[Prompt]:
    """Prompts with `variants` distinct attribute combinations each (both a correct and a wrong one included).

    Prompts whose suite grader would accept a sentence without the fact (no wrong answer exists) are skipped.
    """
    from lmlab.data.fact_sentences import fact_sentences, facts_by_iso2, wrong_answer

    facts = facts_by_iso2()
    out = []
    for ex in examples:
        task, iso2 = ex.meta["task"], ex.meta["iso2"]
        bad = wrong_answer(ex, facts, seed)
        if bad is None:
            continue
        right = fact_sentences(task, facts[iso2], ex.target)["plain"]
        wrong = fact_sentences(task, facts[iso2], bad)["plain"]
        rng = seeded_rng(seed, "variants", ex.id)
        order = rng.permutation(len(GRID))
        picked = [GRID[i] for i in order[:variants]]
        if len({a[0] for a in picked}) < 2:  # keep a right and a wrong answer among the variants
            flip = next(GRID[i] for i in order[variants:] if GRID[i][0] != picked[0][0])
            picked[-1] = flip
        resp = tuple(compose(ex.id, task, right if a[0] else wrong, a, seed) for a in picked)
        out.append(Prompt(ex.id, ex.prompt, iso2, resp))
    return out


def draw_pairs(
    prompts: Sequence[Prompt], n: int, *, seed: int, name: str, target_len: int = 3, max_per_prompt: int | None = None
) -> list[Pair]:
    """`n` distinct non-tied pairs, spread over the prompts round-robin (in a seeded order), order within a pair
    random. Fewer come back when the prompts run out of pairs."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = seeded_rng(seed, "pairs", name)
    pools = []
    for p in prompts:
        cand = [
            (i, j)
            for i, j in itertools.combinations(range(len(p.variants)), 2)
            if utility(p.variants[i], target_len=target_len) != utility(p.variants[j], target_len=target_len)
        ]
        order = rng.permutation(len(cand)) if cand else []
        picks = [cand[k] for k in order][: max_per_prompt or None]
        pools.append(picks)
    out: list[Pair] = []
    prompt_order = rng.permutation(len(prompts)) if len(prompts) else []
    depth = 0
    while len(out) < n and any(depth < len(pool) for pool in pools):
        for k in prompt_order:
            if len(out) == n:
                break
            if depth < len(pools[k]):
                p = prompts[k]
                i, j = pools[k][depth]
                if rng.random() < 0.5:
                    i, j = j, i
                out.append(Pair(f"{name}:{p.id}:{i}-{j}", p, p.variants[i], p.variants[j]))
        depth += 1
    return out


def pair_features(pairs: Sequence[Pair], index: dict[str, int], feats: np.ndarray) -> np.ndarray:
    """``phi(a) - phi(b)`` per pair, (n_pairs, d), from the per-response feature matrix (rows by response id)."""
    if not pairs:
        return np.zeros((0, feats.shape[1]), dtype=feats.dtype)
    ia = np.fromiter((index[p.a.id] for p in pairs), dtype=np.int64, count=len(pairs))
    ib = np.fromiter((index[p.b.id] for p in pairs), dtype=np.int64, count=len(pairs))
    return feats[ia] - feats[ib]
