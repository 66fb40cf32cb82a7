"""The federated apps on a real Flower deployment: a SuperLink and two SuperNodes on loopback, two rounds.

Starts ``flower-superlink`` and two ``flower-supernode`` processes on 127.0.0.1 (insecure, telemetry and update checks
off, no runtime dependency installation, a temporary ``FLWR_HOME``), submits lmlab's app bundle
(`lmlab.core.federated.engine.FLOWER_APP_DIR`) with ``flwr run --stream`` for Ferret, FedAvg and FedICU (tiny llama,
the
smoke presets, 2 clients, 2 rounds), and checks each run's result files against the in-process simulator with the
same seed and config: the final trainable state (allclose) and the floats uploaded per client and round (equal).
``flwr run`` exits 0 even when the ServerApp fails, so the test asserts on the result files. Every process it
started is terminated by its PID in a ``finally``. Expected: ~1-2 min (process start-up and one torch import per
ClientApp).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.loopback]

BIN = Path(sys.executable).parent
HAVE_FLWR = importlib.util.find_spec("flwr") is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, procs: list[subprocess.Popen], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a Flower process exited during start-up")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


@pytest.mark.skipif(not HAVE_FLWR, reason="flwr is not installed (pip install 'lmlab[federated]')")
@pytest.mark.timeout(600)
def test_ferret_and_fedavg_run_unchanged_on_a_loopback_flower_federation(tmp_path):
    import torch
    from safetensors.torch import load_file

    from lmlab.core.federated.engine import FLOWER_APP_DIR, simulate
    from lmlab.registry import load_attr

    for exe in ("flower-superlink", "flower-supernode", "flwr"):
        if not (BIN / exe).exists() and shutil.which(exe) is None:
            pytest.skip(f"{exe} is not on PATH (flwr's console scripts)")
    exe = {name: str(BIN / name) if (BIN / name).exists() else shutil.which(name) for name in
           ("flower-superlink", "flower-supernode", "flwr")}  # fmt: skip

    home = tmp_path / "flwr_home"
    home.mkdir()
    quiet = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
    help_text = subprocess.run([exe["flower-superlink"], "--help"], capture_output=True, text=True, timeout=60,
                               env=quiet).stdout  # fmt: skip
    one_port = "--port" in help_text  # flwr >= 1.4x: Fleet, Control and Runtime APIs on one --host/--port
    port = _free_port()
    if one_port:
        link_args = ["--host", "127.0.0.1", "--port", str(port)]
        fleet, control = port, port
    else:  # older flwr: one address per API
        fleet, control = port, _free_port()
        link_args = ["--fleet-api-address", f"127.0.0.1:{fleet}", "--control-api-address", f"127.0.0.1:{control}",
                     "--serverappio-api-address", f"127.0.0.1:{_free_port()}"]  # fmt: skip
    # "local" names flwr's own managed SuperLink in recent versions: use another connection name
    (home / "config.toml").write_text(f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
                                      f'address = "127.0.0.1:{control}"\ninsecure = true\n')  # fmt: skip
    app_dir = tmp_path / "app"
    shutil.copytree(FLOWER_APP_DIR, app_dir, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
           "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "LMLAB_NO_PROGRESS": "1",
           # the SuperLink / SuperNodes spawn flwr-serverapp, flower-superexec, ... by name
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}  # fmt: skip
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: list[subprocess.Popen] = []

    def start(name: str, args: list[str]) -> subprocess.Popen:
        out = open(logs / f"{name}.log", "w")  # noqa: SIM115 - closed with the process below
        p = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
        procs.append(p)
        return p

    try:
        start("superlink", [exe["flower-superlink"], "--insecure", *link_args])
        _wait_port(control, procs)
        for i in range(2):
            own = (
                ["--port", str(_free_port())]
                if one_port
                else ["--clientappio-api-address", f"127.0.0.1:{_free_port()}"]
            )
            start(f"supernode{i}", [exe["flower-supernode"], "--insecure", "--superlink", f"127.0.0.1:{fleet}", *own,
                                    "--node-config",
                                    f"partition-id={i} num-partitions=2"])  # fmt: skip
        ferret_setup = "lmlab.methods.adaptation.ferret.experiment:flower_setup"
        fedicu_setup = "lmlab.methods.adaptation.fedicu.experiment:flower_setup"
        two = {"clients_per_round": 2}
        # fedicu: the first 2 client families (one per SuperNode), all of them every round
        cases = [(ferret_setup, "ferret", two), (ferret_setup, "fedavg", two), (fedicu_setup, "fedicu", {})]
        for setup_path, method, extra in cases:
            out = tmp_path / f"result_{method}"
            run_config = {"setup": setup_path, "method": method, "preset": "smoke", "model": "tiny-llama",
                          "n_clients": 2, "rounds": 2, **extra, "output": str(out)}  # fmt: skip
            # the bundle's default setup is Ferret's; other experiments name theirs in the run config
            rc = " ".join(f"{k}={json.dumps(v)}" for k, v in run_config.items()
                          if k != "setup" or setup_path != ferret_setup)  # fmt: skip
            res = subprocess.run([exe["flwr"], "run", str(app_dir), "loopback", "--stream", "--run-config", rc],
                                 env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
            tail = (res.stdout + res.stderr)[-3000:]
            assert Path(str(out) + ".json").exists(), f"{method}: no result file; flwr run said:\n{tail}"
            got = json.loads(Path(str(out) + ".json").read_text())
            state = load_file(str(out) + ".safetensors")
            torch.set_num_threads(1)
            sim = simulate(load_attr(setup_path)({**run_config, "output": ""}))
            assert [r["clients"] for r in got["rounds"]] == [r.clients for r in sim.rounds]
            assert [r["uploaded_floats"] for r in got["rounds"]] == [r.uploaded_floats for r in sim.rounds]
            for k, v in sim.final_state.items():
                torch.testing.assert_close(state[k], v, atol=1e-5, rtol=1e-4)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
