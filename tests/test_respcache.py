"""The shared response cache (`lmlab.data.respcache`): its schema, file format, cost and `lmlab cache show`."""

from __future__ import annotations

import gzip
import math

import pytest

from lmlab.data.respcache import (
    ResponseCache,
    ResponseRow,
    cache_filename,
    flop_cost,
    load_cache,
    load_caches,
    synthetic_cache,
)


def _d(rows: list[ResponseRow]) -> list[dict]:
    return [r.to_dict() for r in rows]  # NaN log-probs compare as None


def _rows() -> list[dict]:
    return [
        {"variant": "a", "query_id": "q1", "task": "t1", "correct": 1.0, "cost_flops": 10.0, "answer": "x",
         "answer_logprob": -1.5, "option_probs": [0.25, 0.75], "n_prompt_tokens": 3, "n_gen_tokens": 2,
         "tags": ["geo"]},
        {"variant": "a", "query_id": "q2", "task": "t2", "correct": 0.0, "cost_flops": 12.0},
        {"variant": "b", "query_id": "q1", "task": "t1", "correct": 0.0, "cost_flops": 1.0},
    ]  # fmt: skip


def test_schema_round_trip_keeps_every_column_and_the_pool_order(tmp_path):
    c = ResponseCache.from_records(_rows(), suite="mixed", seed=3, variants={"b": {"kind": "x"}, "a": {}},
                                   failed={"z": "ValueError: no"})  # fmt: skip
    c.meta["options"] = {"t1": ["u", "v"]}
    path = c.save(tmp_path / cache_filename("mixed", 3))
    back = ResponseCache.load(path)
    assert _d(back.rows) == _d(c.rows)
    assert back.variant_ids == ["b", "a"]  # the header is written with sorted keys; the pool order survives
    assert back.failed == {"z": "ValueError: no"} and back.meta == c.meta
    assert math.isnan(back.rows[1].answer_logprob) and back.rows[0].option_probs == (0.25, 0.75)
    assert back.rows[0].tags == ("geo",)
    assert _d(load_cache("mixed", 3, path=path).rows) == _d(c.rows)
    assert path.read_bytes() == c.save(tmp_path / "again.jsonl.gz").read_bytes()  # deterministic bytes
    vids, qids, m = back.matrix("correct")
    assert vids == ["b", "a"] and qids == ["q1"] and m.tolist() == [[0.0], [1.0]]  # q2: not answered by b


def test_truncated_file_is_a_one_line_error(tmp_path):
    path = ResponseCache.from_records(_rows() * 1).save(tmp_path / "c.jsonl.gz")
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="corrupt or truncated") as e:
        ResponseCache.load(path)
    assert "\n" not in str(e.value)
    with gzip.open(tmp_path / "wrong.jsonl.gz", "wt") as fh:
        fh.write('{"schema": 99, "suite": "s", "seed": 0}\n')
    with pytest.raises(ValueError, match="schema 99, expected"):
        ResponseCache.load(tmp_path / "wrong.jsonl.gz")


def test_schema_1_caches_load_with_no_answer_key_and_new_ones_keep_it(tmp_path):
    with gzip.open(tmp_path / "v1.jsonl.gz", "wt") as fh:  # a cache written before the answer_key column
        fh.write('{"schema": 1, "suite": "s", "seed": 0}\n')
        fh.write('{"variant": "a", "query_id": "q1", "task": "t", "correct": 1.0, "cost_flops": 1.0}\n')
    assert ResponseCache.load(tmp_path / "v1.jsonl.gz").rows[0].answer_key is None
    rows = [dict(_rows()[0], answer_key="x")]
    back = ResponseCache.load(ResponseCache.from_records(rows).save(tmp_path / "v2.jsonl.gz"))
    assert back.rows[0].answer_key == "x"


def test_load_caches_gives_one_cache_per_seed_and_rejects_bad_seed_lists(tmp_path, monkeypatch):
    monkeypatch.setenv("LMLAB_CACHE", str(tmp_path))
    for s in (0, 1):
        ResponseCache.from_records(_rows(), suite="mixed", seed=s).save(
            tmp_path / "responses" / cache_filename("mixed", s)
        )
    assert [c.seed for c in load_caches("mixed", [1, 0])] == [1, 0]
    for bad, msg in (([], "seeds is empty"), ([0, 0], "distinct"), ([-1], "ints >= 0"), (["0"], "ints >= 0")):
        with pytest.raises(ValueError, match=msg):
            load_caches("mixed", bad)
    with pytest.raises(FileNotFoundError, match="seed 7"):
        load_caches("mixed", [0, 7])


def test_synthetic_answer_keys_agree_exactly_when_right_and_split_when_wrong():
    c = synthetic_cache(6, 60, seed=3)
    by_query: dict[str, list[ResponseRow]] = {}
    for r in c.rows:
        by_query.setdefault(r.query_id, []).append(r)
    for rows in by_query.values():
        assert len({r.answer_key for r in rows if r.correct == 1.0}) <= 1  # every right answer has the same key
        assert all(r.answer_key != k for r in rows if r.correct == 0.0 for k in [x.answer_key for x in rows
                   if x.correct == 1.0])  # fmt: skip
    wrong_keys = [[r.answer_key for r in rows if r.correct == 0.0] for rows in by_query.values()]
    shared_wrong = sum(len(keys) > len(set(keys)) for keys in wrong_keys)
    assert shared_wrong > 0  # wrong answers collide too: a vote can be won by a wrong answer
    assert synthetic_cache(6, 60, seed=3).matrix("correct")[2].tolist() == c.matrix("correct")[2].tolist()


def test_flop_cost_closed_form_and_bad_input():
    assert flop_cost(1e6, 10, 5) == 2 * 1e6 * 15
    assert flop_cost(100, 3, 4, n_samples=5) == 2 * 100 * 7 * 5
    with pytest.raises(ValueError, match="flop_cost needs"):
        flop_cost(0, 1, 1)
    with pytest.raises(ValueError, match="flop_cost needs"):
        flop_cost(10, 1, 1, n_samples=0)


def test_bad_rows_and_duplicates_raise():
    with pytest.raises(ValueError, match="correct must be in"):
        ResponseRow(variant="a", query_id="q", task="t", correct=2.0, cost_flops=1.0)
    with pytest.raises(ValueError, match="duplicate response row"):
        ResponseCache.from_records([_rows()[0], _rows()[0]])


def test_cache_cli_show_prints_the_matrix_and_failures(tmp_path, capsys):
    from lmlab.cli import main

    c = ResponseCache.from_records(_rows(), suite="mixed", seed=0, failed={"gemma-fewshot": "ImportError: x"})
    c.save(tmp_path / cache_filename("mixed", 0))
    assert main(["cache", "show", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "variant" in out and "t1" in out and "GFLOP/q" in out and "gemma-fewshot: ImportError: x" in out
    assert main(["cache", "show", "--out", str(tmp_path / "none")]) == 2
    assert "does not exist" in capsys.readouterr().err
