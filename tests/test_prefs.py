"""The preference-pair suite over the response cache: exact labels, disjoint splits, one-line errors."""

from __future__ import annotations

import pytest

from lmlab.data import SPLITS, grade
from lmlab.data.prefs import build_pairs
from lmlab.data.respcache import ResponseCache
from lmlab.data.respsuite import suite_queries


def _cache(queries, answers):
    """answers: variant -> function(query) -> answer text; correctness by the query's own grader."""
    rows = []
    for q in queries:
        for v, f in answers.items():
            a = f(q)
            rows.append(dict(variant=v, query_id=q.id, task=q.task, answer=a, correct=q.grade(a), cost_flops=1.0))
    return ResponseCache.from_records(rows, suite="mixed", seed=0, variants={v: {} for v in answers})


@pytest.fixture(scope="module")
def queries():
    return suite_queries("mixed", n=24, seed=0)


def test_chosen_is_graded_correct_and_rejected_wrong_by_the_source_grader(queries):
    cache = _cache(queries, {"right": lambda q: q.example.target, "wrong": lambda q: "zzqx", "echo": lambda q: "7"})
    pairs = build_pairs(cache, queries, per_query=2)
    assert pairs
    for p in pairs:
        assert grade("prefs", p, p.target) == 1.0
        assert grade("prefs", p, p.meta["rejected"]) == 0.0
        assert p.meta["chosen_variant"] != p.meta["rejected_variant"]  # "echo" ("7") is right on some queries
        assert p.target != p.meta["rejected"]


def test_queries_without_a_wrong_answer_give_no_pair_and_splits_are_disjoint(queries):
    cache = _cache(queries, {"a": lambda q: q.example.target, "b": lambda q: q.example.target})
    assert build_pairs(cache, queries) == []
    cache = _cache(queries, {"right": lambda q: q.example.target, "wrong": lambda q: "zzqx"})
    by_split = {s: {p.meta["query_id"] for p in build_pairs(cache, queries, split=s)} for s in SPLITS}
    assert sum(len(v) for v in by_split.values()) == len({p.meta["query_id"] for p in build_pairs(cache, queries)})
    assert not (by_split["train"] & by_split["test"]) and not (by_split["dev"] & by_split["test"])


def test_bad_input_is_a_one_line_error(queries):
    cache = _cache(queries, {"right": lambda q: q.example.target, "wrong": lambda q: "zzqx"})
    with pytest.raises(ValueError, match="not among"):
        build_pairs(cache, queries[:3])
    with pytest.raises(ValueError, match="per_query"):
        build_pairs(cache, queries, per_query=0)
    with pytest.raises(ValueError, match="split must be"):
        build_pairs(cache, queries, split="val")
