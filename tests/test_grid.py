"""The reproduce grid: verdict aggregation, which cells run, the folder layout, grid.json, resuming, the executors'
bad-input errors, and (slow) that the same seed and model give the same numbers in two separate processes."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from lmlab import grid as G
from lmlab.registry import get_method
from lmlab.reproduce import reproduce

CHEAP = ["cv_winrate", "wanda"]  # cv_winrate runs on the response cache (no model), wanda on the tiny llama
SMOKE = {"threads": 1}


# ----------------------------------------------------------------------------------------------------------------
# aggregation


@pytest.mark.parametrize(
    "statuses, verdict",
    [
        (["supported", "supported", "supported"], "holds"),
        (["not_supported", "not_supported"], "does_not_hold"),
        (["supported", "not_supported", "supported"], "fragile"),  # holds on some seeds only: not "holds"
        (["supported", "inconclusive"], "fragile"),
        (["not_supported", "not_supported", "inconclusive"], "does_not_hold"),  # a majority does not hold
        (["not_supported", "inconclusive"], "inconclusive"),  # no majority
        (["inconclusive", "inconclusive"], "inconclusive"),
        (["error", "error"], "error"),
        (["supported", "error", "supported"], "holds"),  # errors do not vote once a cell ran
        (["supported"], "holds"),
        (["not_supported"], "does_not_hold"),
        (["inconclusive"], "inconclusive"),
        (["skipped", "skipped"], "skipped"),
        (["skipped", "pending"], "pending"),
        (["supported", "skipped", "pending", "supported"], "holds"),
    ],
)
def test_aggregate_verdict(statuses, verdict):
    assert G.aggregate_verdict(statuses) == verdict


def test_aggregate_verdict_refuses_an_unknown_status():
    with pytest.raises(ValueError, match="got 'holds'"):
        G.aggregate_verdict(["supported", "holds"])


def test_method_summary_counts_errors_apart():
    def claim(effect, status):
        return {"metric": "acc", "observed_effect": effect, "ci": [effect - 0.1, effect + 0.1], "status": status,
                "gate": True}  # fmt: skip

    rows = [(0, "supported", [claim(0.2, "supported")]), (1, "error", []), (2, "not_supported", [claim(-0.1, "x")])]
    cells = [
        {"method": "m", "area": "a", "model": "default", "seed": s, "status": st, "claims": c} for s, st, c in rows
    ]
    (summary,) = G.method_summaries(cells, {"m": "claim"})
    assert summary["verdict"] == "fragile" and summary["k_holds"] == 1
    assert summary["n_cells"] == 2 and summary["n_errors"] == 1
    assert [(e["seed"], e["observed_effect"]) for e in summary["effects"]] == [(0, 0.2), (2, -0.1)]
    counts = G.grid_counts(cells, [summary])
    assert counts == {"cells": 3, "holds": 0, "does_not_hold": 0, "fragile": 1, "inconclusive": 0, "errors": 1,
                      "skipped": 0}  # fmt: skip
    assert G.summary_line(counts) == "cells run 3: holds 0 / does not hold 0 / fragile 1 / inconclusive 0 / errors 1"


# ----------------------------------------------------------------------------------------------------------------
# planning


def test_plan_skips_models_a_method_does_not_use_or_refuses():
    specs = [get_method(m) for m in ("cv_winrate", "wanda", "fp_quant_scaling", "memory_layers")]
    cells = G.plan_grid(specs, seeds=[0, 1], models=["tiny-llama", "smollm2-135m"], preset="smoke")
    by = {c.key: c for c in cells}
    # the response-cache method: once per seed under its default model, the given models skipped with the reason
    assert by[("cv_winrate", "default", 1)].path == "cv_winrate/default/seed1"
    assert by[("cv_winrate", "tiny-llama", 0)].skipped
    assert "config has no model field" in by[("cv_winrate", "smollm2-135m", 0)].reason
    assert "model" in by[("memory_layers", "tiny-llama", 0)].reason and by[("memory_layers", "default", 0)].path
    # a model-taking method: one folder per (model, seed)
    assert by[("wanda", "smollm2-135m", 1)].path == "wanda/smollm2-135m/seed1"
    # a model the config refuses: skipped with the config's own message
    assert by[("fp_quant_scaling", "tiny-llama", 0)].path == "fp_quant_scaling/tiny-llama/seed0"
    refused = by[("fp_quant_scaling", "smollm2-135m", 0)]
    assert refused.skipped and "config refuses model 'smollm2-135m'" in refused.reason
    assert len(cells) == 2 * (3 + 2 + 2 + 3)


def test_single_cell_plan_keeps_the_old_layout():
    cells = G.plan_grid([get_method("cv_winrate")], seeds=None, models=None, preset="smoke")
    assert [(c.path, c.model, c.seed) for c in cells] == [("cv_winrate", "default", 0)]
    cells = G.plan_grid([get_method("cv_winrate")], seeds=[3, 4], models=None, preset="smoke")
    assert [c.path for c in cells] == ["cv_winrate/default/seed3", "cv_winrate/default/seed4"]


# ----------------------------------------------------------------------------------------------------------------
# a grid end to end (in this process)


@pytest.fixture(scope="module")
def grid_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("grid") / "rep"
    folder, entries = reproduce(CHEAP, preset="smoke", out=out, show_progress=False, overrides=SMOKE, seeds=[0, 1],
                                models=["tiny-llama"])  # fmt: skip
    return folder, entries


def test_grid_layout_and_grid_json(grid_run):
    folder, entries = grid_run
    assert (folder / "wanda" / "tiny-llama" / "seed0" / "result.json").exists()
    assert (folder / "cv_winrate" / "default" / "seed1" / "result.json").exists()
    assert not [p for p in folder.rglob(".*.tmp")], "no temporary folder may be left"
    grid = json.loads((folder / "grid.json").read_text())
    assert {"preset", "seeds", "models", "cells", "methods", "counts"} <= set(grid)
    assert grid["preset"] == "smoke" and grid["seeds"] == [0, 1] and grid["models"] == ["tiny-llama"]
    ran = [c for c in grid["cells"] if c["status"] != "skipped"]
    assert len(ran) == 4 and len(grid["cells"]) == 6
    for c in ran:
        assert {"method", "area", "model", "seed", "path", "status", "reason", "time_s", "claims"} <= set(c)
        assert c["status"] in ("supported", "not_supported", "inconclusive"), c
        assert (folder / c["path"] / "result.json").exists()
        assert c["claims"] and {"text", "metric", "observed_effect", "ci", "gate", "status"} <= set(c["claims"][0])
    skipped = [c for c in grid["cells"] if c["status"] == "skipped"]
    assert {c["method"] for c in skipped} == {"cv_winrate"} and all(c["path"] is None for c in skipped)
    for m in grid["methods"]:
        statuses = [c["status"] for c in grid["cells"] if c["method"] == m["method"]]
        assert m["verdict"] == G.aggregate_verdict(statuses) and m["n_cells"] == 2
        assert len({(e["seed"], e["model"]) for e in m["effects"]}) == 2
    assert grid["counts"]["cells"] == 4 and grid["counts"]["skipped"] == 2
    assert len(entries) == 4 and {e["seed"] for e in entries} == {0, 1}
    assert grid == G.grid_from_folder(folder), "grid.json is what the folders say"


def test_resume_reruns_only_unfinished_cells(grid_run, tmp_path, monkeypatch):
    import shutil

    import lmlab.runner as runner

    folder = tmp_path / "rep"
    shutil.copytree(grid_run[0], folder)
    done = folder / "cv_winrate" / "default" / "seed0" / "result.json"
    mtime = done.stat().st_mtime_ns
    # a half-written cell (no result.json), an errored one, and a temporary folder an interrupted cell left
    half = folder / "wanda" / "tiny-llama" / "seed1"
    shutil.rmtree(half)
    half.mkdir()
    (half / "metrics.csv").write_text("method_or_baseline\n")
    errored = folder / "cv_winrate" / "default" / "seed1" / "result.json"
    data = json.loads(errored.read_text())
    data["run_info"]["status"], data["run_info"]["error"] = "error", "RuntimeError: boom"
    errored.write_text(json.dumps(data))
    stale = folder / "wanda" / "tiny-llama" / ".seed0.deadbeef.tmp"
    stale.mkdir()
    calls = []
    real = runner.run_method
    monkeypatch.setattr(runner, "run_method", lambda *a, **k: calls.append((a[0], k["seed"])) or real(*a, **k))
    reproduce(CHEAP, preset="smoke", out=folder, resume=True, show_progress=False, overrides=SMOKE)
    assert sorted(calls) == [("cv_winrate", 1), ("wanda", 1)]
    assert done.stat().st_mtime_ns == mtime
    assert not stale.exists()
    grid = json.loads((folder / "grid.json").read_text())
    assert grid["seeds"] == [0, 1] and grid["models"] == ["tiny-llama"], "resume takes the stored grid"
    assert [c["status"] for c in grid["cells"]] == [c["status"] for c in G.grid_from_folder(grid_run[0])["cells"]]
    with pytest.raises(ValueError, match="seeds"):
        reproduce(CHEAP, preset="smoke", out=folder, resume=True, show_progress=False, overrides=SMOKE, seeds=[0])


def test_an_exception_outside_the_experiment_is_an_error_cell(tmp_path, monkeypatch):
    import lmlab.runner as runner

    def broken(*a, **k):
        raise ImportError("method cv_winrate needs scipy: pip install scipy")

    monkeypatch.setattr(runner, "run_method", broken)
    folder, entries = reproduce(["cv_winrate"], preset="smoke", out=tmp_path / "r", show_progress=False, seeds=[0, 1])
    grid = json.loads((folder / "grid.json").read_text())
    assert [c["status"] for c in grid["cells"]] == ["error", "error"]
    assert grid["cells"][0]["reason"] == "ImportError: method cv_winrate needs scipy: pip install scipy"
    assert grid["methods"][0]["verdict"] == "error" and grid["counts"]["errors"] == 2
    assert [e["status"] for e in entries] == ["error", "error"], "an error cell is reported, never dropped"


def test_grid_from_a_folder_without_state(grid_run, tmp_path):
    import shutil

    shutil.copytree(grid_run[0] / "wanda", tmp_path / "wanda")
    grid = G.grid_from_folder(tmp_path)
    assert [(c["model"], c["seed"]) for c in grid["cells"]] == [("tiny-llama", 0), ("tiny-llama", 1)]
    assert grid["preset"] == "smoke" and grid["methods"][0]["n_cells"] == 2


def test_cli_summary_ends_with_the_counts_line(tmp_path, capsys):
    from lmlab.cli import main

    out = tmp_path / "r"
    assert main(["reproduce", "cv_winrate", "--preset", "smoke", "--out", str(out), "--no-progress"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.match(r"\s*cv_winrate\s+(holds|does not hold|inconclusive)\s", lines[0]), lines  # per-method line
    counts = r"cells run 1: holds \d / does not hold \d / fragile 0 / inconclusive \d / errors 0"
    assert re.fullmatch(counts, lines[-1]), lines
    assert (out / "cv_winrate" / "result.json").exists(), "a single-cell grid keeps <folder>/<method>/"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--seeds", "-1"], "--seeds must be non-negative integers, got -1"),
        (["--seeds", "0", "0"], "--seeds lists a seed twice"),
        (["--models", "nosuchmodel"], "nosuchmodel"),
        (["--models", "tiny-llama,"], "--models expects comma-separated model aliases"),
        (["--models", "tiny-llama", "--model", "tiny-llama"], "--model and --models cannot be combined"),
        (["--jobs", "0"], "--jobs must be >= 1, got 0"),
        (["--address", "127.0.0.1:1"], "--address 127.0.0.1:1 needs --executor ray"),
    ],
)
def test_bad_grid_arguments_give_one_line(argv, message, tmp_path, capsys):
    from lmlab.cli import main

    code = main(["reproduce", "cv_winrate", "--preset", "smoke", "--out", str(tmp_path / "r"), *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1, err


def test_ray_missing_is_one_line(tmp_path, capsys, monkeypatch):
    import importlib.util

    from lmlab.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    code = main(["reproduce", "cv_winrate", "--preset", "smoke", "--out", str(tmp_path / "r"), "--executor", "ray"])
    assert code == 2
    assert capsys.readouterr().err.strip() == "lmlab: error: --executor ray needs ray: pip install 'lmlab[ray]'"
    monkeypatch.setitem(sys.modules, "ray", None)  # the library call, without the CLI's check
    with pytest.raises(ImportError, match=re.escape(G.RAY_MISSING)):
        G.run_ray([])


def test_process_pool_gives_the_same_numbers(grid_run, tmp_path, comparable):
    folder, _ = reproduce(["cv_winrate"], preset="smoke", out=tmp_path / "p", show_progress=False, overrides=SMOKE,
                          seeds=[0, 1], jobs=2)  # fmt: skip
    for seed in (0, 1):
        rel = Path("cv_winrate") / "default" / f"seed{seed}" / "result.json"
        pooled = json.loads((folder / rel).read_text())
        local = json.loads((grid_run[0] / rel).read_text())
        assert comparable(pooled) == comparable(local)


# ----------------------------------------------------------------------------------------------------------------
# the cross-process comparison (the test itself is in tests/test_method_battery.py) is not vacuous


def test_the_comparison_sees_a_different_seed(grid_run, comparable):
    """`comparable` is not vacuous: two seeds of one method differ in it."""
    folder, _ = grid_run
    a, b = (json.loads((folder / "wanda" / "tiny-llama" / f"seed{s}" / "result.json").read_text()) for s in (0, 1))
    assert comparable(a)["metrics"] and comparable(a) != comparable(b)
    assert comparable(a) == comparable(json.loads(json.dumps(a)))


def test_a_dead_ray_worker_becomes_an_error_cell(tmp_path, monkeypatch):
    """run_ray against a stand-in `ray` whose task's worker dies: retried once (max_retries=1, Ray's side), then
    recorded as an error cell folder with the reason; the connection is closed."""
    import types

    class RayError(Exception):
        pass

    calls: dict = {"remote": [], "options": [], "shutdown": 0}

    class Fn:
        def options(self, **res):
            calls["options"].append(res)
            return self

        def remote(self, job):
            return job.seed

    fake = types.SimpleNamespace(
        init=lambda **kw: calls.setdefault("init", kw),
        remote=lambda **kw: calls["remote"].append(kw) or (lambda fn: Fn()),
        wait=lambda refs, num_returns: (refs[:1], refs[1:]),
        get=lambda ref: (_ for _ in ()).throw(RayError("The worker died unexpectedly while executing this task")),
        cancel=lambda ref, force: None,
        shutdown=lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1),
    )
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setitem(sys.modules, "ray.exceptions", types.SimpleNamespace(RayError=RayError))
    jobs = [G.CellJob("cv_winrate", "default", s, str(tmp_path / "cv_winrate" / "default" / f"seed{s}"), "smoke")
            for s in (0, 1)]  # fmt: skip
    done = []
    G.run_ray(jobs, address="127.0.0.1:6379", on_done=lambda job, outcome: done.append((job.seed, outcome)))
    assert calls["remote"] == [{"max_retries": 1}] and calls["options"][0]["num_cpus"] == 1
    assert calls["init"]["address"] == "127.0.0.1:6379" and calls["shutdown"] == 1
    assert [(s, o["status"]) for s, o in done] == [(0, "error"), (1, "error")]
    data = json.loads((tmp_path / "cv_winrate" / "default" / "seed0" / "result.json").read_text())
    assert data["run_info"]["status"] == "error" and "ray task failed after 1 retry" in data["run_info"]["error"]
    assert "worker died" in data["run_info"]["error"]
