"""run_method / reproduce: atomic folders, the combined report, and resuming an interrupted reproduce."""

from __future__ import annotations

import json
import re

import pytest

from lmlab.results import Claim, RunResult, evaluate_claim
from lmlab.runner import reproduce, run_method

SMOKE = {"model": "tiny-llama", "threads": 1}


def test_claim_status_comes_from_the_recorded_values():
    better = [1.0, 2.0, 1.5, 1.2, 0.9, 1.1, 1.3, 1.4]
    worse = [v - 1.0 for v in better]
    assert evaluate_claim(Claim("m", "a", "b", ">"), better, worse).status == "supported"
    assert evaluate_claim(Claim("m", "a", "b", ">"), worse, better).status == "not_supported"
    assert evaluate_claim(Claim("m", "a", "b", "<"), worse, better).status == "supported"
    noisy = [0.1, -0.2, 0.05, -0.1, 0.2, -0.05, 0.0, 0.1]
    assert evaluate_claim(Claim("m", "a", "b", ">"), noisy, [0.0] * 8).status == "inconclusive"


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
    assert "reflection_window" in html and "<script" not in html
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
