"""Preference pairs built offline from lmlab's own models: the response cache's answers, graded exactly.

For every query of a response cache (`lmlab.data.respcache`, built by `lmlab cache build` from the model zoo:
SmolLM2 zero- / few-shot, self-consistency, truncated, pruned, int4, LoRA experts, Gemma, the tiny floor), the
answers of the variants are split by the query's own exact grader into correct and wrong ones; a pair is (prompt,
chosen = a correct answer of one variant, rejected = a wrong answer of another). Real model outputs, not templated
negatives, and an exact label: the preference is the grader's, never a judge's.

Splits: the cached queries are re-split train / dev / test by `lmlab.data.split_of(query id, seed)` (the suites'
seeded split), so one query never lands in two splits of a seed; `seed` also picks which (correct, wrong) variant
pair a query contributes.
A query with no correct or no wrong answer gives no pair.

    lmlab data show prefs --n 5            # the pairs as JSON lines

Metric: the source suite's exact grader on the pair's query (`grade`): 1.0 when an output answers it correctly; the
chosen side grades 1.0 and the rejected side 0.0 by construction.

Data: lmlab's own model outputs, the committed response caches (`src/lmlab/data/responses/mixed-s<seed>.jsonl.gz`,
11 variants x 480 queries per cache seed, built by `lmlab cache build`), or a user's rebuilt copy under
``$LMLAB_CACHE/responses``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lmlab import data as lmdata
from lmlab.data import SPLITS, Example, register_suite, reject_unknown, seeded_rng, split_of


def build_pairs(
    cache: Any, queries: Sequence[Any], *, seed: int = 0, per_query: int = 1, split: str | None = None
) -> list[Example]:
    """Pairs of `cache` (a `ResponseCache`) over `queries` (its `lmlab.data.respsuite.Query` list, same ids).

    Each query gives up to `per_query` (chosen, rejected) pairs with distinct variants and answers: the shortest
    correct answers first, ties and the rejected side drawn with `seed`.
    `split` keeps only that split's queries (None: all).
    """
    if per_query < 1:
        raise ValueError(f"per_query must be >= 1, got {per_query}")
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    by_id = {q.id: q for q in queries}
    missing = [qid for qid in cache.query_ids if qid not in by_id]
    if missing:
        raise ValueError(
            f"{len(missing)} cached queries (e.g. {missing[0]!r}) are not among the {len(by_id)} queries given; "
            "rebuild the queries with the cache's suite, seed and n"
        )
    answers: dict[str, list[Any]] = {}
    for r in cache.rows:
        answers.setdefault(r.query_id, []).append(r)
    out: list[Example] = []
    for qid in cache.query_ids:
        if split is not None and split_of(qid, seed) != split:
            continue
        q = by_id[qid]
        rows = [r for r in answers[qid] if r.answer.strip()]
        # a pair's sides must grade 1 / 0 as TEXT by the query's grader: a row's `correct` can grade something else
        # (program of thought grades its computed value, so its "[no program] ... Africa." row is 0 while the text
        # answers the continent question right)
        good = [r for r in rows if r.correct >= 1.0 and q.grade(r.answer) >= 1.0]
        bad = [r for r in rows if r.correct <= 0.0 and q.grade(r.answer) <= 0.0]
        if not good or not bad:
            continue
        rng = seeded_rng("prefs", seed, qid)
        combos = [(g, b) for g in good for b in bad if g.variant != b.variant and g.answer.strip() != b.answer.strip()]
        rng.shuffle(combos)
        # the most concise correct answers first (lenient graders accept rambling answers that contain the target)
        combos.sort(key=lambda gb: len(gb[0].answer.strip()))
        for k, (g, b) in enumerate(combos[:per_query]):
            out.append(
                Example(
                    id=f"prefs/{qid}/{k}",
                    prompt=q.prompt,
                    target=g.answer.strip(),
                    meta={
                        "rejected": b.answer.strip(),
                        "chosen_variant": g.variant,
                        "rejected_variant": b.variant,
                        "task": q.task,
                        "query_id": qid,
                        "source_suite": q.suite,
                        "source_example": q.example.to_dict(),
                        "split": split_of(qid, seed),
                    },
                )
            )
    return out


def generate(
    n: int | None,
    seed: int = 0,
    split: str = "test",
    *,
    suite: str = "mixed",
    cache_seed: int = 0,
    per_query: int = 1,
    cache_path: str | None = None,
    **unknown: Any,
) -> list[Example]:
    """`n` pairs (all when None) of the `split` queries of the (`suite`, `cache_seed`) response cache."""
    reject_unknown("prefs", unknown, ("suite", "cache_seed", "per_query", "cache_path"))
    from lmlab.data.respcache import load_cache
    from lmlab.data.respsuite import suite_queries

    cache = load_cache(suite, cache_seed, path=cache_path)
    n_queries = int(cache.meta.get("n") or len(cache.query_ids))
    queries = suite_queries(suite, n=n_queries, seed=cache.seed)
    pairs = build_pairs(cache, queries, seed=seed, per_query=per_query, split=split)
    if n is not None and n > len(pairs):
        raise ValueError(
            f"n={n} is larger than the {len(pairs)} {split} pairs the {suite!r} cache gives (per_query={per_query})"
        )
    return pairs if n is None else pairs[:n]


def grade(example: Example, output: str) -> float:
    """The source suite's exact grader on the pair's query (1.0: `output` answers it correctly)."""
    src = dict(example.meta["source_example"])
    if src.get("choices") is not None:
        src["choices"] = tuple(src["choices"])
    return lmdata.grade(example.meta["source_suite"], Example(**src), output)


register_suite(
    "prefs",
    generate,
    grade,
    "Preference pairs from the response cache: a correct answer of one lmlab variant (chosen) vs a wrong answer of "
    "another (rejected), graded exactly by the query's suite.",
    metric="exact_match",
    source="lmlab's own model outputs (response cache)",
)
