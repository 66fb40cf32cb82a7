"""The shared response cache (`lmlab.data.respcache`): its schema, file format, cost and `lmlab cache show`."""

from __future__ import annotations

import gzip
import math

import pytest

from lmlab.data.respcache import ResponseCache, ResponseRow, cache_filename, flop_cost, load_cache


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
