"""The reproduction study: cells exported small from a reproduce folder, read back as a grid, reported without
running, checked for staleness against git, and rendered into the generated docs."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from lmlab import docs
from lmlab.cli import main
from lmlab.grid import grid_from_folder
from lmlab.study import export_cells, load_study, method_staleness, stale_cells

_spec = importlib.util.spec_from_file_location("report_grid", Path(__file__).parent / "fixtures" / "report_grid.py")
report_grid = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report_grid)

COMMIT = "0123456789abcdef0123456789abcdef01234567"
FIELDS = {"schema", "method", "area", "model", "seed", "preset", "status", "verdict", "reason", "claims",
          "config_hash", "git_commit", "git_dirty", "seconds", "machine", "loadavg", "lmlab_version"}  # fmt: skip
CLAIM_FIELDS = {"text", "metric", "method", "baseline", "direction", "min_effect", "observed_effect", "ci", "n",
                "status", "gate"}  # fmt: skip


@pytest.fixture
def run_folder(tmp_path):
    """The report fixture's reproduce folder, its result.json files given a config and the run's meta_info."""
    folder, _ = report_grid.make_report_folder(tmp_path / "run")
    (folder / "grid.json").unlink()  # the cells are read from their folders, as after a real run
    for path in folder.glob("**/result.json"):
        data = json.loads(path.read_text())
        data["config"] = {"model": "smollm2-135m", "seed": data["run_info"]["seed"], "n": 40}
        system = {"git_dirty": False, "cpu_model": "Test CPU", "cpu_avx512": True, "cpu_count": 2,
                  "cpu_available": 2, "loadavg": [0.5, 0.4, 0.3]}  # fmt: skip
        data["meta_info"] = {"git_hash": COMMIT, "package_info": {"lmlab": "0.1.0"}, "system_info": system}
        data["samples"] = ["x" * 100] * 50  # never copied into the study
        path.write_text(json.dumps(data))
    return folder


def _verdicts(grid):
    return {m["method"]: (m["verdict"], m["k_holds"], m["n_cells"], m["n_errors"]) for m in grid["methods"]}


def test_export_writes_small_cells_with_the_schema(run_folder, tmp_path):
    study = tmp_path / "study"
    files = export_cells(run_folder, study)
    assert len(files) == 10  # every cell that ran (the errored one included); skipped cells are not exported
    for f in files:
        assert f.exists() and f.stat().st_size < 8 * 1024, f
        rec = json.loads(f.read_text())
        assert FIELDS <= set(rec), FIELDS - set(rec)
        assert "samples" not in rec
        assert rec["git_commit"] == COMMIT and rec["git_dirty"] is False and rec["lmlab_version"] == "0.1.0"
        assert rec["machine"] == {"cpu_model": "Test CPU", "avx512": True, "cpu_count": 2, "cpu_available": 2}
        assert len(rec["config_hash"]) == 12 and rec["preset"] == "smoke"
        assert all(CLAIM_FIELDS <= set(c) for c in rec["claims"])
    # the method's default model is stored under the alias the run used, never "default"
    assert sorted(p.name for p in (study / "gamma").iterdir()) == ["smollm2-135m"]
    assert (study / "beta/m-b/seed0.json").exists()
    assert json.loads((study / "beta/m-b/seed0.json").read_text())["status"] == "error"
    assert not list(study.rglob("*.png"))
    assert export_cells(run_folder, study) == files  # idempotent: the same files, rewritten


def test_load_study_gives_the_grids_verdicts(run_folder, tmp_path):
    export_cells(run_folder, tmp_path / "study")
    study = load_study(tmp_path / "study")
    source = grid_from_folder(run_folder)
    assert _verdicts(study) == _verdicts(source)
    assert study["counts"] == source["counts"]
    assert {m["method"]: m["verdict"] for m in study["methods"]} == {"beta": "fragile", "gamma": "does_not_hold",
                                                                      "alpha": "holds"}  # fmt: skip
    empty = load_study(tmp_path / "absent")
    assert empty["cells"] == [] and empty["counts"]["cells"] == 0


def test_reproduce_from_study_runs_nothing(run_folder, tmp_path, monkeypatch, capsys):
    import lmlab.runner

    def refuse(*a, **k):
        raise AssertionError("reproduce --from must not run a method")

    monkeypatch.setattr(lmlab.runner, "run_method", refuse)
    study = tmp_path / "study"
    assert main(["reproduce", "--from", str(run_folder), "--export-study", str(study), "--out",
                 str(tmp_path / "r1")]) == 0  # fmt: skip
    assert len(list(study.rglob("seed*.json"))) == 10
    assert main(["reproduce", "--from", str(study), "--out", str(tmp_path / "r2")]) == 0
    out = capsys.readouterr().out
    html = (tmp_path / "r2" / "report.html").read_text()
    assert "fragile" in html and "&lt;script&gt;" in html and "<script>alert" not in html
    assert "cells run 10: holds 1 / does not hold 1 / fragile 1" in out
    assert "holds in 2 of 3 cells, 1 errors" in out
    grid = json.loads((tmp_path / "r2" / "grid.json").read_text())
    assert _verdicts(grid) == _verdicts(grid_from_folder(run_folder))


def test_reproduce_from_refuses_run_options_and_empty_folders(tmp_path, capsys):
    assert main(["reproduce", "--from", str(tmp_path), "--seeds", "0", "1"]) == 2
    assert "--seeds" in capsys.readouterr().err
    assert main(["reproduce", "--from", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "holds no cells" in capsys.readouterr().err


def _git(repo: Path, *args: str) -> str:
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args]
    return subprocess.run(cmd, cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_stale_cells_from_git_history(tmp_path):
    repo = tmp_path / "repo"
    for area, method in (("pruning", "beta"), ("decoding", "alpha")):
        d = repo / "src/lmlab/methods" / area / method
        d.mkdir(parents=True)
        (d / "method.py").write_text("x = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "one")
    first = _git(repo, "rev-parse", "HEAD")
    (repo / "src/lmlab/methods/pruning/beta/method.py").write_text("x = 2\n")
    _git(repo, "commit", "-q", "-am", "two")
    (repo / "src/lmlab/methods/decoding/alpha/README.md").write_text("verdict from the run\n")  # words, not code
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "three")

    def cell(method, area, commit):
        return {"method": method, "area": area, "path": f"{method}/m/seed0.json"}, {"git_commit": commit}

    cells = [cell("beta", "pruning", first), cell("alpha", "decoding", first), cell("gamma", "routing", "f" * 40),
             cell("delta", "routing", None)]  # fmt: skip
    study = {"cells": [c for c, _ in cells], "study": {c["path"]: e for c, e in cells}}
    stale = stale_cells(study, repo)
    assert stale == {"beta/m/seed0.json": True, "alpha/m/seed0.json": False, "gamma/m/seed0.json": "unknown",
                     "delta/m/seed0.json": "unknown"}  # fmt: skip
    assert method_staleness(study, stale) == {"beta": True, "alpha": False, "gamma": "unknown", "delta": "unknown"}
    assert set(stale_cells(study, tmp_path / "not-a-repo").values()) == {"unknown"}  # no git repository: no crash


def test_generated_docs_round_trip(run_folder, tmp_path):
    study = tmp_path / "study"
    empty = docs.reproduction_md(study, tmp_path)
    assert "No cells yet" in empty and "|" not in empty
    assert "no cells yet" in docs.study_block(study, tmp_path)
    export_cells(run_folder, study)
    gemma = json.loads((study / "alpha/m-a/seed0.json").read_text())
    gemma["model"] = "gemma3-270m"
    (study / "alpha/gemma3-270m").mkdir()
    (study / "alpha/gemma3-270m/seed0.json").write_text(json.dumps(gemma))
    page = docs.reproduction_md(study, tmp_path)
    assert "| `beta` | pruning | fragile: holds in 2 of 3 cells, 1 error | - | 3 | ? |" in page
    assert "| `alpha` | decoding | holds in 5 of 5 cells | holds (1 of 1) | 2 | ? |" in page
    assert "[README](../src/lmlab/methods/pruning/beta/README.md)" in page
    text = f"intro\n{docs.STUDY_BEGIN}\nOLD-TEXT\n{docs.STUDY_END}\ntail\n"
    block = docs.study_block(study, tmp_path)
    once = docs.readme_with_study(text, block)
    assert "OLD-TEXT" not in once and "does not hold: holds in 0 of 2 cells" in once and once.endswith("tail\n")
    assert docs.readme_with_study(once, block) == once
