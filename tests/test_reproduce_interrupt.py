"""`lmlab reproduce` killed at several points (SIGINT, SIGKILL) and restarted with `--resume`: no finished cell is
run again, no half-written cell is read as finished, and the final grid equals an uninterrupted run's.

One chain of real subprocesses over 3 cheap methods x 2 seeds (the response-cache methods: ~1 s a cell):
SIGINT after the first cell folder appears, SIGKILL mid-cell (while a cell's temporary folder exists), SIGKILL
after the next cell folder appears, SIGINT mid-cell, then a resume that runs to the end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmlab import grid as G
from lmlab.reproduce import reproduce

IDS = ["cv_winrate", "kabb", "pmf_predict"]
SEEDS = [0, 1]


def _start(out: Path, resume: bool) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "lmlab", "reproduce", "--preset", "smoke", "--only", *IDS,
           "--seeds", *map(str, SEEDS), "--threads", "1", "--out", str(out), "--no-progress", "-q"]  # fmt: skip
    if resume:
        cmd.append("--resume")
    env = {**os.environ, "LMLAB_NO_PROGRESS": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=_sigint_default)  # fmt: skip


def _sigint_default() -> None:
    """In the child before exec: SIGINT back to its default action. A suite started in the background (`cmd &`,
    nohup) inherits SIGINT ignored, Python then installs no KeyboardInterrupt handler, and the "Ctrl-C" below was
    ignored: the run finished all six cells with exit 0 and only 1 interruption landed (two full runs under nohup)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _finished(out: Path) -> dict[str, int]:
    """result.json files under their final cell names -> mtime (ns)."""
    return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in out.glob("*/default/seed*/result.json")}


def _temps(out: Path) -> list[Path]:
    return list(out.glob("*/default/.seed*.tmp"))


def _kill_when(proc: subprocess.Popen, out: Path, sig: int, point: str, known: set[str]) -> bool:
    """Send `sig` once `point` is reached ("folder": a cell folder not in `known` appears; "temp": a cell's
    temporary folder exists); False when the process ended first."""
    deadline = time.monotonic() + 300  # a safety net only: the kill waits for the event
    while proc.poll() is None and time.monotonic() < deadline:
        if (point == "folder" and set(_finished(out)) - known) or (point == "temp" and _temps(out)):
            proc.send_signal(sig)
            proc.communicate(timeout=60)
            return True
        time.sleep(0.005)
    proc.communicate(timeout=60)
    return False


def _check_nothing_half_read(out: Path) -> None:
    """Every folder under a final cell name holds a whole result; the grid counts only those as run."""
    for p in out.glob("*/default/seed*"):
        data = json.loads((p / "result.json").read_text())  # a final name is always a whole folder
        assert data["run_info"]["status"] == "ok" and data["run_info"]["preset"] == "smoke"
    if (out / "reproduce.json").exists():
        grid = G.grid_from_folder(out)
        done = {c["path"] for c in grid["cells"] if c["status"] != "pending"}
        assert done == {str(Path(k).parent) for k in _finished(out)}


# ~100 s quiet, 210 s seen beside another job: at least 3x margin (the steps wait on events, not the clock)
@pytest.mark.timeout(900)
def test_killed_and_resumed_reproduce_loses_nothing(tmp_path, comparable):
    reference, _ = reproduce(IDS, preset="smoke", out=tmp_path / "reference", show_progress=False,
                             overrides={"threads": 1}, seeds=SEEDS)  # fmt: skip
    out = tmp_path / "rep"
    steps = [(signal.SIGINT, "folder"), (signal.SIGKILL, "temp"), (signal.SIGKILL, "folder"), (signal.SIGINT, "temp")]
    killed = []
    for i, (sig, point) in enumerate(steps):
        before = _finished(out) if out.exists() else {}
        proc = _start(out, resume=i > 0)
        if not _kill_when(proc, out, sig, point, set(before)):
            break  # the run finished before this point: the last resume below has nothing left to run
        killed.append((sig.name, point, proc.returncode))
        after = _finished(out)
        assert all(after[k] == v for k, v in before.items()), "a finished cell was run again"
        if point == "temp" and sig == signal.SIGKILL:
            assert _temps(out), "a killed cell leaves its temporary folder, never a final one"
        _check_nothing_half_read(out)
    assert len(killed) >= 3, f"too few interruptions landed: {killed}"
    assert ("SIGINT", "folder", 130) in killed, killed  # Ctrl-C: "interrupted", exit 130
    before = _finished(out)
    proc = _start(out, resume=True)
    stdout, stderr = proc.communicate(timeout=400)  # a hang guard: 120 s failed beside other jobs
    assert proc.returncode == 0, stderr[-3000:]
    assert stdout.strip().splitlines()[-1].startswith("cells run 6: ")
    after = _finished(out)
    assert all(after[k] == v for k, v in before.items()), "a finished cell was run again"
    assert len(after) == len(IDS) * len(SEEDS) and not _temps(out)
    grid = json.loads((out / "grid.json").read_text())
    ref = json.loads((reference / "grid.json").read_text())
    assert [(c["method"], c["seed"], c["status"]) for c in grid["cells"]] == [
        (c["method"], c["seed"], c["status"]) for c in ref["cells"]
    ]
    assert grid["methods"] == ref["methods"] and grid["counts"] == ref["counts"]
    for c in ref["cells"]:
        a = json.loads((out / c["path"] / "result.json").read_text())
        b = json.loads((reference / c["path"] / "result.json").read_text())
        assert comparable(a) == comparable(b), c["path"]
