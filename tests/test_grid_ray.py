"""`reproduce --executor ray` on a local Ray head (127.0.0.1, 2 worker CPUs) gives the local executor's numbers.

The head is started with `ray start --head --block` in its own session and stopped by its process group (only the
processes this test started). Bounded: the whole test has 180 s.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from test_grid import CHEAP

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'lmlab[ray]'; `make test` installs it)")

SEEDS = ["0", "1"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def ray_head():
    """A Ray head on 127.0.0.1 with 2 CPUs (two tasks at once), in a short temp dir (Ray's socket paths are
    limited to 107 characters); yields its address and stops its whole process group afterwards."""
    temp = Path(tempfile.mkdtemp(prefix="lmray", dir="/tmp"))
    port = _free_port()
    ray_bin = Path(sys.executable).with_name("ray")
    cmd = [str(ray_bin), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
           "--include-dashboard=false", f"--temp-dir={temp / 'ray'}", "--block", "--disable-usage-stats"]  # fmt: skip
    log = open(temp / "head.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=temp, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "ray status" not in (temp / "head.log").read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the Ray head did not start:\n" + (temp / "head.log").read_text()[-2000:])
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                pass
        try:  # whatever of the group is left (raylet, workers): the processes this fixture started
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def _lmlab(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "lmlab", "reproduce", "--preset", "smoke", "--only", *CHEAP, "--seeds", *SEEDS,
           "--models", "tiny-llama", "--threads", "1", "--no-progress", *args]  # fmt: skip
    env = {**os.environ, "LMLAB_NO_PROGRESS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.loopback
@pytest.mark.timeout(600)  # three CLI runs of ~15 s each alone; several times that beside other jobs
def test_ray_executor_matches_local(ray_head, tmp_path, comparable):
    ray_out, local_out = tmp_path / "ray", tmp_path / "local"
    proc = _lmlab("--out", str(ray_out), "--executor", "ray", "--address", ray_head)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("cells run 4: ")
    proc = _lmlab("--out", str(local_out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ray_grid = json.loads((ray_out / "grid.json").read_text())
    local_grid = json.loads((local_out / "grid.json").read_text())
    assert [c["status"] for c in ray_grid["cells"]] == [c["status"] for c in local_grid["cells"]]
    assert ray_grid["methods"] == local_grid["methods"], "same verdicts and per-cell effects"
    ran = [c for c in local_grid["cells"] if c["path"]]
    assert len(ran) == 4
    for c in ran:
        a = json.loads((ray_out / c["path"] / "result.json").read_text())
        b = json.loads((local_out / c["path"] / "result.json").read_text())
        assert comparable(a) == comparable(b), c["path"]
    # --resume works across executors: the local executor finds every ray cell finished
    before = {c["path"]: (ray_out / c["path"] / "result.json").stat().st_mtime_ns for c in ran}
    proc = _lmlab("--out", str(ray_out), "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert before == {c["path"]: (ray_out / c["path"] / "result.json").stat().st_mtime_ns for c in ran}
