"""run_method / reproduce: atomic folders, the combined report, and resuming an interrupted reproduce."""

from __future__ import annotations

import json
import re

import pytest

from lmlab.reproduce import reproduce
from lmlab.results import Claim, RunResult, evaluate_claim
from lmlab.runner import run_method

SMOKE = {"model": "tiny-llama", "threads": 1}


def test_claim_status_comes_from_the_recorded_values():
    better = [1.0, 2.0, 1.5, 1.2, 0.9, 1.1, 1.3, 1.4]
    worse = [v - 1.0 for v in better]
    assert evaluate_claim(Claim("m", "a", "b", ">"), better, worse).status == "supported"
    assert evaluate_claim(Claim("m", "a", "b", ">"), worse, better).status == "not_supported"
    assert evaluate_claim(Claim("m", "a", "b", "<"), worse, better).status == "supported"
    noisy = [0.1, -0.2, 0.05, -0.1, 0.2, -0.05, 0.0, 0.1]
    assert evaluate_claim(Claim("m", "a", "b", ">"), noisy, [0.0] * 8).status == "inconclusive"


def test_a_check_that_holds_when_the_method_is_its_baseline_is_flagged():
    values = [0.3, 0.5, 0.2, 0.7, 0.4, 0.6, 0.1, 0.8]
    shifted = [v + 0.5 for v in values]
    honest = evaluate_claim(Claim("m", "a", "b", ">"), shifted, values)
    assert honest.status == "supported" and honest.null_status == "not_supported" and honest.falsifiable
    # "not worse than the baseline by more than 0.05": any system passes it against itself
    lenient = evaluate_claim(Claim("m", "a", "b", ">", min_effect=-0.05), shifted, values)
    assert lenient.status == "supported" and lenient.null_status == "supported" and not lenient.falsifiable
    # small samples do not hide a rigged check: the null status is decided without min_n
    tiny = evaluate_claim(Claim("m", "a", "b", ">", min_effect=-0.05), shifted[:2], values[:2])
    assert tiny.status == "inconclusive" and tiny.null_status == "supported"
    rigged = RunResult(method="x", run_info={"status": "ok"}, config={}, claims=[lenient])
    assert rigged.null_status == "supported"
    guarded = RunResult(method="x", run_info={"status": "ok"}, config={}, claims=[lenient, honest])
    assert guarded.status == "supported" and guarded.null_status == "not_supported"


def test_mechanism_checks_never_gate():
    claim = Claim("calls", "a", "b", "<", mechanism=True)
    assert claim.gate is False
    result = evaluate_claim(claim, [1.0] * 8, [10.0] * 8)
    assert result.mechanism and not result.gate
    run = RunResult(method="x", run_info={"status": "ok"}, config={}, claims=[result])
    assert run.status == "inconclusive"  # no gating check: nothing decided


def _context():
    from lmlab.registry import get_method
    from lmlab.runner import RunContext, resolve_config

    spec = get_method("reflection_window")
    return RunContext(spec, resolve_config(spec, preset="smoke", overrides=SMOKE), preset="smoke", show_progress=False)


def test_record_with_clusters_counts_units_and_claims_resample_them():
    import numpy as np

    ctx = _context()
    rng = np.random.default_rng(0)
    prompt_effect = np.repeat(rng.normal(0, 1, 4), 32)  # 4 prompts x 32 decode steps
    base = prompt_effect + rng.normal(0, 0.01, 128)
    method = base + 0.01
    ids = [f"p{i // 32}" for i in range(128)]
    row = ctx.record("method", "kl", method, clusters=ids)
    ctx.record("base", "kl", base, clusters=ids)
    ctx.record("method", "kl_naive", method)
    ctx.record("base", "kl_naive", base)
    assert row.n == 4
    result = ctx.finish([Claim("kl", "method", "base", ">"), Claim("kl_naive", "method", "base", ">")])
    clustered, naive = result.claims
    assert clustered.n == 4 and clustered.n_values == 128 and clustered.status == "inconclusive"
    assert naive.n == 128 and naive.status == "supported"


def test_paired_claims_need_the_same_clusters():
    ctx = _context()
    ctx.record("method", "acc", [1.0, 0.0, 1.0, 1.0], clusters=["a", "a", "b", "b"])
    ctx.record("base", "acc", [0.0, 0.0, 1.0, 0.0])
    with pytest.raises(ValueError, match="only method was recorded with clusters"):
        ctx.finish([Claim("acc", "method", "base", ">")])
    with pytest.raises(ValueError, match="one cluster id per value"):
        ctx.record("other", "acc", [1.0, 0.0], clusters=["a"])


def test_an_experiment_error_is_recorded_not_lost(tmp_path, monkeypatch):
    from lmlab.methods.decoding.reflection_window import experiment

    def broken(cfg, ctx):
        raise RuntimeError("boom")

    monkeypatch.setattr(experiment, "run", broken)
    result = run_method("reflection_window", preset="smoke", folder=tmp_path / "r", show_progress=False, **SMOKE)
    assert result.status == "error" and "boom" in result.run_info["error"]
    data = json.loads((tmp_path / "r" / "result.json").read_text())
    assert data["run_info"]["status"] == "error"


def test_run_folders_are_never_overwritten(tmp_path):
    result = RunResult(method="x", run_info={"status": "ok"}, config={})
    result.write(tmp_path / "a")
    with pytest.raises(FileExistsError):
        result.write(tmp_path / "a")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_reproduce_writes_a_self_contained_report_and_resumes(tmp_path, monkeypatch):
    out = tmp_path / "rep"
    folder, entries = reproduce(["reflection_window"], preset="smoke", out=out, show_progress=False, overrides=SMOKE)
    assert folder == out
    html = (out / "report.html").read_text()
    assert "reflection_window" in html and not re.search(r"<script[^>]*\bsrc=", html)
    assert not re.search(r"(src|href)=['\"]https?://", html), "the report must not load external files"
    assert "data:image/png;base64," in html
    summary = json.loads((out / "summary.json").read_text())
    assert summary[0]["method"] == "reflection_window"
    assert summary[0]["status"] in ("supported", "not_supported", "inconclusive")
    assert summary[0]["numbers"] and summary[0]["effect"]
    assert (out / "summary.csv").read_text().startswith("method,")
    first = json.loads((out / "reflection_window" / "result.json").read_text())["run_info"]["created_at"]

    # resume: a finished method is not run again
    calls = []
    import lmlab.runner as runner

    real = runner.run_method
    monkeypatch.setattr(runner, "run_method", lambda *a, **k: calls.append(a) or real(*a, **k))
    reproduce(["reflection_window"], preset="smoke", out=out, resume=True, show_progress=False, overrides=SMOKE)
    assert calls == []
    again = json.loads((out / "reflection_window" / "result.json").read_text())["run_info"]["created_at"]
    assert again == first

    # an interrupted method (a folder without a result) is run again on resume
    import shutil

    shutil.rmtree(out / "reflection_window")
    (out / "reflection_window").mkdir()
    reproduce(["reflection_window"], preset="smoke", out=out, resume=True, show_progress=False, overrides=SMOKE)
    assert len(calls) == 1
    assert (out / "reflection_window" / "result.json").exists()


def test_resume_rejects_another_preset(tmp_path):
    out = tmp_path / "rep"
    reproduce(["reflection_window"], preset="smoke", out=out, show_progress=False, overrides=SMOKE)
    with pytest.raises(ValueError, match="preset"):
        reproduce(["reflection_window"], preset="quick", out=out, resume=True, show_progress=False, overrides=SMOKE)


def test_resume_without_an_earlier_run(tmp_path):
    with pytest.raises(ValueError, match="no earlier reproduce"):
        reproduce(["reflection_window"], preset="smoke", resume=True, runs_root=tmp_path, show_progress=False)
