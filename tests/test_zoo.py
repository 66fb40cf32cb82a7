"""The response-cache zoo (`lmlab.zoo`) and its builder (`lmlab.zoo.build`), on the tiny model."""

from __future__ import annotations

import numpy as np
import pytest

from lmlab.data.respcache import ResponseRow, cache_filename, load_cache
from lmlab.data.respsuite import MIXED_TASKS, suite_queries
from lmlab.zoo import build as zoo_build
from lmlab.zoo.answers import answer_key, extract_expression, safe_eval
from lmlab.zoo.build import build_cache, parts_dir
from lmlab.zoo.run import _pruned_model, run_variant, truncated_model
from lmlab.zoo.variants import VariantSpec, resolve_variants

TINY_FEWSHOT = VariantSpec("tiny-fewshot", "fewshot", "tiny-llama", {"shots": 2}, "tiny, 2 shots")
TINY_TRUNC = VariantSpec("tiny-trunc1", "trunc", "tiny-llama", {"layers": 1}, "tiny, first block only")


def _d(rows: list[ResponseRow]) -> list[dict]:
    return [r.to_dict() for r in rows]  # NaN log-probs compare as None


def test_safe_eval_computes_arithmetic_and_refuses_everything_else():
    assert safe_eval("(23 + 45) * 2 - 6 / 3") == 134.0
    assert safe_eval("-3 + 2 ** 3") == 5
    for bad in ('__import__("os").system("true")', "x + 1", "(1).real", "[1][0]", "2 ** 99", "1 / 0", "9" * 300):
        with pytest.raises(ValueError):
            safe_eval(bad)
    assert extract_expression("The expression is `7 x 8`.") == "7 * 8"
    assert extract_expression("23 + 45 = 68") == "23 + 45"
    assert extract_expression("Paris") is None


def test_mixed_queries_are_balanced_seeded_and_graded_by_their_suites():
    qs = suite_queries("mixed", 16, seed=0)
    assert len(qs) == 16 and len({q.id for q in qs}) == 16
    assert [q.task for q in qs[:8]] == [d.name for d in MIXED_TASKS]  # interleaved round-robin
    assert [q.id for q in suite_queries("mixed", 16, seed=0)] == [q.id for q in qs]
    assert [q.id for q in suite_queries("mixed", 16, seed=1)] != [q.id for q in qs]
    for q in qs:
        assert q.grade(q.example.target) == 1.0  # the gold answer passes its suite's exact grader
    assert [q.task for q in suite_queries("mixed", 3)] == ["arith1", "arith2", "capital"]
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        suite_queries("mixed", 0)
    with pytest.raises(ValueError, match="suite must be one of"):
        suite_queries("nope", 16)
    with pytest.raises(ValueError, match="unknown variant"):
        resolve_variants(["smol", "nope"])


def test_truncated_model_keeps_the_first_blocks_and_leaves_the_model_alone(tiny_llama):
    import torch

    from lmlab.core.inference.models import flop_params

    full = flop_params(tiny_llama)
    t = truncated_model(tiny_llama, 1)
    assert len(t.model.layers) == 1 and len(tiny_llama.model.layers) == 2
    assert t.model.layers[0] is tiny_llama.model.layers[0]  # shared weights, no copy
    per_block = full - flop_params(t)
    assert per_block == sum(p.numel() for p in tiny_llama.model.layers[1].parameters())  # FLOPs scale with blocks
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():  # the kept blocks + norm + head compute what the full model's first block feeds them
        h = tiny_llama(ids, output_hidden_states=True).hidden_states[1]
        ref = tiny_llama.lm_head(tiny_llama.model.norm(h))
        assert torch.allclose(t(ids).logits, ref, atol=1e-5)
    with pytest.raises(ValueError, match=r"layers must be an int in \[1, 2\]"):
        truncated_model(tiny_llama, 3)


def test_build_on_the_tiny_model_with_two_cheap_variants(tmp_path):
    cache = build_cache("mixed", 0, 6, variants=["tiny-random", TINY_TRUNC], out=tmp_path, progress=False,
                        max_new_tokens=4)  # fmt: skip
    assert cache.variant_ids == ["tiny-random", "tiny-trunc1"] and not cache.failed
    vids, qids, m = cache.matrix("correct")
    assert m.shape == (2, 6) and set(np.unique(m)) <= {0.0, 1.0}
    _, _, cost = cache.matrix("cost_flops")
    _, _, tokens = cache.matrix("n_prompt_tokens")
    _, _, gen = cache.matrix("n_gen_tokens")
    p = [cache.variants[v]["flop_params"] for v in vids]
    assert np.allclose(cost, 2 * np.asarray(p)[:, None] * (tokens + gen))  # the closed form, per row
    assert (cost[1] < cost[0]).all()  # one block of two is cheaper on every query
    assert (gen <= 4).all() and (gen >= 1).all()
    mc = [r for r in cache.rows if r.task == "continent"]
    assert mc and all(r.option_probs is not None and abs(sum(r.option_probs) - 1) < 1e-4 for r in mc)
    saved = load_cache("mixed", 0, path=tmp_path / cache_filename("mixed", 0))
    assert _d(saved.rows) == _d(cache.rows) and saved.meta["tasks"] == [d.name for d in MIXED_TASKS]
    again = build_cache("mixed", 0, 6, variants=["tiny-random", TINY_TRUNC], out=tmp_path, progress=False,
                        max_new_tokens=4, resume=False)  # fmt: skip
    assert [r.answer for r in again.rows] == [r.answer for r in cache.rows]  # greedy and seeded: same answers
    # issue 35: every row stores the answer key its text commits to (votes / agreement compare keys, not text)
    queries = {q.id: q for q in suite_queries("mixed", 6, 0)}
    assert all(r.answer_key == answer_key(queries[r.query_id], r.answer) for r in cache.rows)
    assert any(r.answer_key is not None for r in cache.rows)
    assert [r.answer_key for r in saved.rows] == [r.answer_key for r in cache.rows]


def test_answer_keys_merge_the_same_answer_and_keep_case_where_case_is_graded():
    by_task = {q.task: q for q in suite_queries("mixed", 8, 0)}
    up, arith = by_task["uppercase"], by_task["arith1"]
    assert answer_key(up, "FAMILY") != answer_key(up, "family")  # graded case-sensitively: different answers
    assert answer_key(arith, "The answer is 7.") == answer_key(arith, "7") == "7"


def test_the_default_pool_spreads_and_the_mixed_suite_gives_60_queries_per_task():
    from lmlab.zoo.variants import DEFAULT_VARIANTS

    assert not any(v.startswith("smol-trunc") for v in DEFAULT_VARIANTS)  # 0% on every task: no information
    assert {"smol-wanda30", "smol-atp40"} <= set(DEFAULT_VARIANTS) and "smol-wanda50" not in DEFAULT_VARIANTS
    qs = suite_queries("mixed", 480, 1)
    counts = {t: sum(q.task == t for q in qs) for t in {q.task for q in qs}}
    assert len(counts) == 8 and set(counts.values()) == {60} and "reverse" not in counts


def test_resume_after_a_simulated_kill_and_failures_are_recorded(tmp_path, monkeypatch):
    calls: list[str] = []
    real = run_variant

    def flaky(spec, queries, opts=None):
        calls.append(spec.id)
        if spec.id == "tiny-trunc1" and calls.count("tiny-trunc1") == 1:
            raise KeyboardInterrupt  # the build is killed while the second variant runs
        return real(spec, queries, opts)

    monkeypatch.setattr(zoo_build, "run_variant", flaky)
    bad = VariantSpec("tiny-bad", "trunc", "tiny-llama", {"layers": 9})
    variants = ["tiny-random", TINY_TRUNC, bad]
    with pytest.raises(KeyboardInterrupt):
        build_cache("mixed", 0, 8, variants=variants, out=tmp_path, progress=False, max_new_tokens=3)
    parts = parts_dir(tmp_path, "mixed", 0)
    assert [p.name for p in parts.glob("*.jsonl.gz")] == ["tiny-random.jsonl.gz"]  # the finished variant's part
    assert not (tmp_path / cache_filename("mixed", 0)).exists()  # no final file from a killed build
    assert not list(tmp_path.rglob("*.tmp"))  # atomic writes leave no temp files
    cache = build_cache("mixed", 0, 8, variants=variants, out=tmp_path, progress=False, max_new_tokens=3)
    assert calls == ["tiny-random", "tiny-trunc1", "tiny-trunc1", "tiny-bad"]  # resumed at the next variant
    assert cache.variant_ids == ["tiny-random", "tiny-trunc1"]
    assert set(cache.failed) == {"tiny-bad"} and "layers must be an int" in cache.failed["tiny-bad"]
    assert "\n" not in cache.failed["tiny-bad"]
    # a slice rebuilt alone keeps the other variants' parts in the final cache
    one = build_cache("mixed", 0, 8, variants=[TINY_TRUNC], out=tmp_path, progress=False, max_new_tokens=3)
    assert set(one.variant_ids) == {"tiny-random", "tiny-trunc1"} and calls[-1] == "tiny-bad"
    # a different query set (n) does not reuse stale parts
    build_cache("mixed", 0, 9, variants=["tiny-random"], out=tmp_path, progress=False, max_new_tokens=3)
    assert calls[-1] == "tiny-random"


def test_no_resume_reuses_a_concurrent_builds_part_and_debris_of_a_killed_writer_is_removed(tmp_path, monkeypatch):
    import os
    import time

    calls: list[str] = []
    real = run_variant

    def counted(spec, queries, opts=None):
        calls.append(spec.id)
        return real(spec, queries, opts)

    monkeypatch.setattr(zoo_build, "run_variant", counted)
    build_cache("mixed", 0, 4, variants=["tiny-random"], out=tmp_path, progress=False, max_new_tokens=2)
    parts = parts_dir(tmp_path, "mixed", 0)
    part = parts / "tiny-random.jsonl.gz"
    debris = [parts / ".tiny-trunc1.jsonl.gz.x1.tmp", tmp_path / f".{cache_filename('mixed', 0)}.x2.tmp"]
    for p in debris:  # what a writer killed mid-save leaves
        p.write_bytes(b"\x1f\x8b half")
    future = time.time() + 60  # as if a concurrent build of the same cache finished it after this one started
    os.utime(part, (future, future))
    build_cache("mixed", 0, 4, variants=["tiny-random"], out=tmp_path, progress=False, max_new_tokens=2, resume=False)
    assert calls == ["tiny-random"]  # reused, not rebuilt
    assert not any(p.exists() for p in debris) and zoo_build.lock_path(tmp_path, "mixed", 0).is_file()
    os.utime(part, (1.0, 1.0))  # an earlier build's part: --no-resume rebuilds it
    build_cache("mixed", 0, 4, variants=["tiny-random"], out=tmp_path, progress=False, max_new_tokens=2, resume=False)
    assert calls == ["tiny-random", "tiny-random"]


def test_self_consistency_costs_every_sample_and_pot_never_evals(tmp_path, monkeypatch):
    import builtins

    def no_eval(*a, **k):
        raise AssertionError("program of thought must not call eval")

    monkeypatch.setattr(builtins, "eval", no_eval)
    sc = VariantSpec("tiny-sc2", "sc", "tiny-llama", {"samples": 2, "temperature": 0.7})
    pot = VariantSpec("tiny-pot", "pot", "tiny-llama", {"max_new_tokens": 3})
    cache = build_cache("mixed", 0, 4, variants=["tiny-random", sc, pot], out=tmp_path, progress=False,
                        max_new_tokens=3, option_probs=False)  # fmt: skip
    assert not cache.failed, cache.failed
    _, _, cost = cache.matrix("cost_flops", variants=["tiny-random", "tiny-sc2"])
    _, _, gen = cache.matrix("n_gen_tokens", variants=["tiny-random", "tiny-sc2"])
    assert (gen[1] <= 2 * 3).all() and (cost[1] > cost[0]).all()  # two prompts' worth of tokens per query
    for r in cache.rows:
        if r.variant == "tiny-pot":
            assert r.answer.startswith("[no program]") or " = " in r.answer


def test_atp_variant_prunes_in_an_arithmetic_progression_and_keeps_the_best_validation_beta():
    from lmlab.core.inference.models import load_model

    model, tok = load_model("tiny-llama")
    params = {"sparsity": 0.5, "n_calib": 2, "calib_seqlen": 16, "n_val": 2, "betas": [0.0, 0.4], "patience": 0}
    spec = VariantSpec("tiny-atp", "atp", "tiny-llama", params)
    pruned, extra = _pruned_model(spec, model, tok, 0)
    table = {row["beta"]: row["val_ppl"] for row in extra["beta_search"]}
    assert set(table) == {0.0, 0.4}
    assert extra["beta"] == min(table, key=lambda b: (table[b], b))  # the lowest validation perplexity wins
    beta = extra["beta"]
    assert extra["block_sparsity_first_last"] == [0.5 - beta / 2, 0.5 + beta / 2]
    for i, layer in enumerate(pruned.model.layers):  # block i is pruned at S - beta (L-1)/2 + i beta, row by row
        w = layer.mlp.up_proj.weight
        assert (w == 0).sum(dim=1).tolist() == [int((0.5 - beta / 2 + i * beta) * w.shape[1])] * w.shape[0]
    assert all((p != 0).all() for p in model.model.layers[0].mlp.up_proj.weight)  # the base model is left alone
    bad = VariantSpec("tiny-atp-bad", "atp", "tiny-llama", {"sparsity": 0.5, "betas": [0.0, 1.5]})
    with pytest.raises(ValueError, match=r"betas \[1.5\] exceed beta_max=1.0000"):
        _pruned_model(bad, model, tok, 0)
