"""`lmlab bench decode` on the tiny model: the report, the warm-up, contention flags and the `--out` folder."""

from __future__ import annotations

import json
import os

import pytest

from lmlab.cli import main

TINY = ["--model", "tiny-llama", "--prompts", "1", "--prompt-tokens", "12", "--new-tokens", "3", "--rounds", "1",
        "--threads", "1", "--no-exactness"]  # fmt: skip


def _bench(**kw):
    from lmlab.bench_decode import bench_decode

    args = dict(n_prompts=1, prompt_tokens=12, new_tokens=4, rounds=2, threads=1, log=lambda m: None)
    return bench_decode("tiny-llama", **{**args, **kw})


def test_bench_decode_report_on_tiny_model(tmp_path):
    from lmlab.bench_decode import format_report, write_report

    report = _bench()
    assert set(report["results"]) == {"lmlab-int4", "lmlab-fp32", "hf-fp32", "hf-fp32-static", "hf-bf16"}
    for r in report["results"].values():
        assert r["step_ms"] > 0 and r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0
        assert 0 < r["fraction_of_bandwidth_floor"] and r["weight_bytes_per_token"] > 0
        # warm-up: >= 16 generated tokens in calls of the timed shape (4 new tokens -> 4 calls)
        assert r["warmup"]["tokens"] >= 16 and r["warmup"]["calls"] == 4
        assert r["speedup_vs_best_hf"] > 0
    assert report["results"]["hf-fp32"]["speedup_vs_hf_fp32"] == pytest.approx(1.0)
    assert report["best_hf"] in {"hf-fp32", "hf-fp32-static", "hf-bf16"}
    assert report["results"][report["best_hf"]]["speedup_vs_best_hf"] == pytest.approx(1.0)
    assert report["exactness"]["fp32_greedy_equals_hf"] is True
    assert report["exactness"]["hf-fp32-static_greedy_equal_prompts"] == "1/1"  # the static row does the same work
    held = report["exactness"]["int4_vs_fp32_heldout"]
    assert held["tokens"] > 0 and 0 <= held["top1_agreement"] <= 1
    assert any("llama.cpp" in n for n in report["notes"])  # no GGUF for a tiny model: said, not hidden
    assert report["publishable"] is (not report["contended"])
    assert len(report["loadavg_between_rounds"]) == 3
    text = format_report(report)
    assert "x hf-fp32" in text and "x best hf" in text and "target lmlab-int4 >= 2" in text
    path = write_report(report, tmp_path / "bench")
    assert path == tmp_path / "bench" / "results.json" and json.loads(path.read_text())["model"] == "tiny-llama"
    assert (tmp_path / "bench" / "report.txt").read_text().startswith("model tiny-llama")
    with pytest.raises(ValueError, match="unknown candidate"):
        _bench(candidates=("vllm",))
    with pytest.raises(ValueError, match="warmup_tokens must be >= 16"):
        _bench(warmup_tokens=4)


def test_contention_is_measured_and_flags_the_run(monkeypatch):
    import lmlab.bench_decode as bd

    monkeypatch.setattr(bd.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(bd, "_cpu_busy_s", bd._own_cpu_s)  # nothing but this process ran: quiet
    quiet = _bench(candidates=("lmlab-fp32",), rounds=1)
    assert quiet["other_processes_cores"] == pytest.approx(0.0, abs=1e-6)
    assert not quiet["contended"] and quiet["publishable"] and quiet["contention_reasons"] == []

    busy = iter(range(0, 10**6, 1000))  # another process burning 1000 CPU-seconds between any two samples
    monkeypatch.setattr(bd, "_cpu_busy_s", lambda: float(next(busy)))
    loud = _bench(candidates=("lmlab-fp32",), rounds=1)
    assert loud["contended"] and not loud["publishable"]
    assert loud["other_processes_cores"] > bd.CONTENDED_OTHER_CORES
    assert "other processes used" in loud["contention_reasons"][0]
    assert "CONTENDED" in bd.format_report(loud) and "not for publication" in bd.format_report(loud)

    monkeypatch.setattr(bd, "_cpu_busy_s", bd._own_cpu_s)
    monkeypatch.setattr(bd.os, "getloadavg", lambda: (2.5, 1.0, 0.5))  # a job had just been running
    late = _bench(candidates=("lmlab-fp32",), rounds=1)
    assert late["contended"] and "load 2.50 before the start" in late["contention_reasons"][0]


def test_cli_bench_out_is_a_folder_written_atomically(tmp_path, capsys):
    """An existing folder as --out (the old code ran the whole bench, then died with IsADirectoryError)."""
    out = tmp_path / "existing"
    out.mkdir()
    code = main(["bench", "decode", *TINY, "--candidates", "lmlab-fp32", "hf-fp32", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    report = json.loads((out / "results.json").read_text())
    assert set(report["results"]) == {"lmlab-fp32", "hf-fp32"} and report["warmup_tokens"] == 16
    assert (out / "report.txt").is_file()
    assert sorted(p.name for p in out.iterdir()) == ["report.txt", "results.json"]  # no temporary files left
    assert f"wrote {out / 'results.json'}" in capsys.readouterr().out
    # a folder that does not exist yet is created, parents included
    nested = tmp_path / "a" / "b"
    assert main(["bench", "decode", *TINY, "--candidates", "lmlab-fp32", "--out", str(nested)]) == 0
    assert (nested / "results.json").is_file()


def test_cli_bench_rejects_a_bad_out_before_running(tmp_path, capsys, monkeypatch):
    import lmlab.bench_decode as bd

    def never(*a, **k):
        raise AssertionError("the bench ran although --out was bad")

    monkeypatch.setattr(bd, "bench_decode", never)
    a_file = tmp_path / "results.json"
    a_file.write_text("{}")
    cases = [(a_file, "is a file"), (a_file / "sub", "is a file, not a folder")]
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        cases.append((locked / "out", "is not writable"))
    for bad, why in cases:
        assert main(["bench", "decode", *TINY, "--out", str(bad)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("lmlab: error: --out") and why in err and str(bad) in err, err
        assert len(err.splitlines()) == 1
    assert a_file.read_text() == "{}"
    assert main(["bench", "decode", *TINY, "--warmup-tokens", "8"]) == 2
    assert "--warmup-tokens must be >= 16, got 8" in capsys.readouterr().err
    assert main(["bench", "decode", *TINY, "--candidates", "vllm"]) == 2
    assert "unknown vllm" in capsys.readouterr().err


@pytest.mark.slow
def test_compiled_transformers_row_runs_on_the_tiny_model():
    """``--compile``: static cache + torch.compile (~30 s to compile on 2 cores, hence slow); compiled during the
    warm-up, so the timed steps run the compiled graph, and it generates hf-fp32's greedy tokens."""
    report = _bench(candidates=("hf-fp32",), compile=True, rounds=1, exactness=False)
    row = report["results"]["hf-fp32-compiled"]
    assert row["warmup"]["tokens"] >= 16 and row["step_ms"] > 0
    assert report["exactness"]["hf-fp32-compiled_greedy_equal_prompts"] == "1/1"
