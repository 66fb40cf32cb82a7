"""Concurrency and resources: the model disk cache under concurrent builders and killed builds, and full disks.

- Two processes building the same cache entry at once both succeed, one of them builds, and the folder verifies.
- Two real ``lmlab run wanda --preset smoke`` processes on a GGUF model that goes through the cache both succeed.
- A builder SIGKILLed midway leaves only a temporary folder; the next call detects it, removes it and rebuilds.
- A cache folder corrupted after the fact fails verification and is rebuilt.
- Two `lmlab.zoo.build.build_cache` processes on the same response cache (suite, seed) at once, sharing a variant:
  both succeed, the shared variant is built once, and the cache holds every variant of both (no lost merge).
- A full disk while writing results (a 256 KiB tmpfs; RLIMIT_FSIZE where mounting is not allowed) gives a one-line
  error, exit 1, and leaves earlier results intact and no temporary files.

The GGUF here is a tiny valid file; its dequantizing build (transformers, ~20 s for a real model) is replaced in
the child processes by a slow builder that writes the seeded tiny llama as an HF folder, so everything after the
build (manifest, verification, `from_pretrained` of the cache, the run) is the real code path.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lmlab.core.inference import models as M

PY = sys.executable

# A child process: patch the GGUF build into a slow tiny-llama build that logs each build, then run `code`.
CHILD_PRELUDE = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import lmlab.core.inference.models as M

    def fake_build_from_gguf(directory, gguf_file):
        def build(folder):
            from lmlab.core.inference.tiny import make_byte_tokenizer, make_tiny_model
            with open(os.environ["BUILD_LOG"], "a") as log:
                log.write(f"{os.getpid()} start\\n")
            Path(os.environ["BUILD_LOG"] + ".started").touch()
            time.sleep(float(os.environ.get("BUILD_SLEEP", "1.0")))  # slow enough for the builders to overlap
            model = make_tiny_model(0, arch="llama")
            M.save_hf_folder(model, make_byte_tokenizer(), folder)
            with open(os.environ["BUILD_LOG"], "a") as log:
                log.write(f"{os.getpid()} done\\n")
        return build

    M._build_from_gguf = fake_build_from_gguf
    """
)


def _tiny_gguf(path: Path) -> Path:
    import numpy as np

    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_tensor("token_embd.weight", np.arange(64 * 32, dtype=np.float32).reshape(64, 32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    cache = tmp_path / "cache"
    return {
        **os.environ,
        "LMLAB_CACHE": str(cache),
        "BUILD_LOG": str(tmp_path / "builds.log"),
        "LMLAB_NO_PROGRESS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }


def _child(code: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [PY, "-c", CHILD_PRELUDE + textwrap.dedent(code)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _model_folders(cache: Path) -> list[Path]:
    """Finished cache folders (temporary ones start with a dot)."""
    return sorted(p for p in (cache / "models").iterdir() if p.is_dir() and not p.name.startswith("."))


def _builds(env: dict[str, str]) -> list[str]:
    log = Path(env["BUILD_LOG"])
    return log.read_text().split("\n")[:-1] if log.exists() else []


def test_two_processes_loading_the_same_gguf_build_once(tmp_path, env):
    gguf = _tiny_gguf(tmp_path / "tiny.gguf")
    code = f"""
    model, tok = M.load_model({str(gguf)!r})
    print(M.cached_folder({str(gguf)!r}))
    """
    procs = [_child(code, env) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, se) in zip(procs, outs):
        assert p.returncode == 0, se
    folders = {so.strip().splitlines()[-1] for so, _ in outs}
    assert len(folders) == 1, folders
    folder = Path(folders.pop())
    assert M._manifest_problem(folder, full=True) is None
    assert [line.split()[1] for line in _builds(env)] == ["start", "done"]  # built once; the other waited
    assert _model_folders(Path(env["LMLAB_CACHE"])) == [folder]  # no temporary folder left behind
    assert not list(folder.parent.glob(".*.tmp"))


def test_two_concurrent_lmlab_runs_share_the_cache(tmp_path, env):
    gguf = _tiny_gguf(tmp_path / "tiny.gguf")
    code = """
    from lmlab.cli import main
    sys.exit(main(sys.argv[1:]))
    """
    procs = []
    for i in range(2):
        argv = ["run", "wanda", "--preset", "smoke", "--model", str(gguf), "--out", str(tmp_path / f"out{i}"),
                "--no-plots", "--set", "speed=False"]  # fmt: skip
        procs.append(
            subprocess.Popen(
                [PY, "-c", CHILD_PRELUDE + textwrap.dedent(code), *argv],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_, se) in zip(procs, outs):
        assert p.returncode == 0, se[-3000:]
    for i in range(2):
        results = list((tmp_path / f"out{i}").glob("wanda/*/result.json"))
        assert len(results) == 1
        assert json.loads(results[0].read_text())["run_info"]["status"] == "ok"
    (folder,) = _model_folders(Path(env["LMLAB_CACHE"]))
    assert M._manifest_problem(folder, full=True) is None
    assert [line.split()[1] for line in _builds(env)] == ["start", "done"]


def test_killed_build_is_detected_and_rebuilt(tmp_path, env):
    gguf = _tiny_gguf(tmp_path / "tiny.gguf")
    env = {**env, "BUILD_SLEEP": "60"}
    proc = _child(f"M.load_model({str(gguf)!r})", env)
    started = Path(env["BUILD_LOG"] + ".started")
    deadline = time.monotonic() + 60
    while not started.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the builder never started"
        time.sleep(0.05)
    models = Path(env["LMLAB_CACHE"]) / "models"
    tmps = list(models.glob(".*.tmp"))
    assert len(tmps) == 1 and not _model_folders(Path(env["LMLAB_CACHE"]))  # mid-build: only the temporary folder
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)

    # the next call (a fresh process, the real build path) sees no finished folder, removes the debris, rebuilds
    proc = _child(f"M.load_model({str(gguf)!r}); print(M.cached_folder({str(gguf)!r}))", {**env, "BUILD_SLEEP": "0"})
    so, se = proc.communicate(timeout=120)
    assert proc.returncode == 0, se
    folder = Path(so.strip().splitlines()[-1])
    assert M._manifest_problem(folder, full=True) is None
    assert not tmps[0].exists() and not list(models.glob(".*.tmp"))
    assert "interrupted" in se  # the removal is logged
    assert [line.split()[1] for line in _builds(env)] == ["start", "start", "done"]


def test_corrupted_cache_folder_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("LMLAB_CACHE", str(tmp_path / "cache"))
    builds = []

    def build(folder: Path) -> None:
        builds.append(folder)
        (folder / "weights.bin").write_bytes(b"\1" * 4096)
        (folder / "config.json").write_text("{}")

    folder = M.ensure_cached("toy", "ab" * 32, build)
    assert M._manifest_problem(folder, full=True) is None
    (folder / "weights.bin").write_bytes(b"\1" * 2048)  # truncated behind the cache's back
    M.clear_loaded()  # a new process: nothing verified yet
    assert "weights.bin" in M._manifest_problem(folder, full=True)
    again = M.ensure_cached("toy", "ab" * 32, build)
    assert again == folder and len(builds) == 2
    assert M._manifest_problem(folder, full=True) is None
    M.clear_loaded()


def test_unwritable_cache_is_one_line_output_error(tmp_path, monkeypatch):
    from lmlab.errors import OutputError

    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("LMLAB_CACHE", str(blocker / "cache"))
    with pytest.raises(OutputError) as info:
        M.ensure_cached("toy", "cd" * 32, lambda f: (f / "a").write_text("a"))
    assert "LMLAB_CACHE" in str(info.value) and "\n" not in str(info.value)
    assert blocker.read_text() == "x"


# ----------------------------------------------------------------------------------------------------------------
# Two response-cache builds of the same (suite, seed) at once

# A child process: log each variant build (pid, variant) and make it slow enough to overlap with the other child's,
# wait until both children are ready (imports take a variable few seconds), then run the real `build_cache`.
ZOO_CHILD = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import lmlab.zoo.build as B
    from lmlab.zoo.variants import VariantSpec

    real_run_variant = B.run_variant

    def logged_run_variant(spec, queries, opts):
        with open(os.environ["BUILD_LOG"], "a") as log:
            log.write(f"{os.getpid()} {spec.id}\\n")
        time.sleep(1.0)
        return real_run_variant(spec, queries, opts)

    B.run_variant = logged_run_variant
    out, own = Path(sys.argv[1]), sys.argv[2]
    (out.parent / f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + 120
    while len(list(out.parent.glob("ready-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    own_spec = VariantSpec(own, "trunc", "tiny-llama", {"layers": 1}) if own.startswith("tiny-trunc") else (
        VariantSpec(own, "zeroshot", "tiny-llama", {}))
    cache = B.build_cache("mixed", 0, 6, variants=["tiny-random", own_spec], out=out, progress=False,
                          max_new_tokens=2, option_probs=False)
    print(" ".join(cache.variant_ids))
    """
)


def test_two_processes_building_the_same_response_cache(tmp_path, env):
    from lmlab.data.respcache import ResponseCache, cache_filename
    from lmlab.zoo.build import parts_dir

    out = tmp_path / "responses"
    own = ["tiny-trunc1", "tiny-zeroshot2"]
    procs = [
        subprocess.Popen([PY, "-c", ZOO_CHILD, str(out), v], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for v in own
    ]  # fmt: skip
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_, se) in zip(procs, outs):
        assert p.returncode == 0, se[-3000:]
    built = [line.split()[1] for line in _builds(env)]
    assert sorted(built) == sorted(["tiny-random", *own]), built  # each variant built once: the other reused it
    cache = ResponseCache.load(out / cache_filename("mixed", 0))
    assert set(cache.variant_ids) == {"tiny-random", *own}  # the last merge kept the other process's variant
    pairs = [(r.variant, r.query_id) for r in cache.rows]
    assert len(pairs) == len(set(pairs)) == 3 * 6  # each query once per variant
    for vid in cache.variant_ids:
        assert len(cache.select(variants=[vid]).query_ids) == 6
    leftovers = [p.name for p in (*out.iterdir(), *parts_dir(out, "mixed", 0).iterdir()) if p.name.endswith(".tmp")]
    assert not leftovers


# ----------------------------------------------------------------------------------------------------------------
# A full disk while writing results


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs (root in this container may mount one); skipped with the reason where it may not."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.decode().strip() or done.returncode})")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _fill(mnt: Path, leave: int) -> None:
    """Fill the file system at `mnt` until fewer than `leave` bytes are free."""
    with open(mnt / "filler", "wb") as f:
        while True:
            st = os.statvfs(mnt)
            free = st.f_bavail * st.f_frsize
            if free <= leave:
                break
            try:
                f.write(b"\0" * min(free - leave, 1 << 16) or b"\0")
                f.flush()
            except OSError:
                break


def test_full_disk_result_write_keeps_earlier_results(small_disk):
    from lmlab.errors import OutputError
    from lmlab.results import MetricRow, RunResult, atomic_write_text

    def result(n_samples: int) -> RunResult:
        return RunResult(
            method="wanda", run_info={"status": "ok"}, config={"seed": 0}, claims=[], claim_text="",
            metrics=[MetricRow("wanda", "ppl", 1.0, 0.9, 1.1, 3, 0)],
            samples=[{"i": i, "text": "x" * 200} for i in range(n_samples)],
        )  # fmt: skip

    earlier = result(2).write(small_disk / "runs" / "earlier")
    atomic_write_text(small_disk / "runs" / "summary.json", '{"ok": true}')
    before = _snapshot(small_disk / "runs")
    _fill(small_disk, leave=16 << 10)
    with pytest.raises(OutputError) as info:
        result(2000).write(small_disk / "runs" / "later")  # ~0.5 MB of samples: does not fit
    message = str(info.value)
    assert "\n" not in message and "No space left" in message and "later" in message
    with pytest.raises(OutputError):
        atomic_write_text(small_disk / "runs" / "summary.json", "x" * (64 << 10))
    assert _snapshot(small_disk / "runs") == before  # earlier results intact, byte for byte
    assert not (small_disk / "runs" / "later").exists()
    assert sorted(p.name for p in (small_disk / "runs").iterdir()) == ["earlier", "summary.json"]  # no temp files
    assert earlier.is_dir()


def test_full_disk_cli_run_is_one_line_exit_1(small_disk, tmp_path):
    """A real `lmlab run` whose results do not fit: exit 1, one error line, earlier runs intact."""
    out = small_disk / "runs"
    (out / "wanda" / "earlier").mkdir(parents=True)
    (out / "wanda" / "earlier" / "result.json").write_text('{"kept": true}')
    _fill(small_disk, leave=4 << 10)
    env = {**os.environ, "LMLAB_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1"}
    env.pop("LMLAB_DEBUG", None)
    done = subprocess.run(
        [PY, "-m", "lmlab", "run", "wanda", "--preset", "smoke", "--model", "tiny-llama", "--out", str(out),
         "--set", "speed=False"],
        capture_output=True, text=True, env=env, timeout=240,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "No space left" in errors[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert (out / "wanda" / "earlier" / "result.json").read_text() == '{"kept": true}'
    assert sorted(p.name for p in (out / "wanda").iterdir()) == ["earlier"]


def test_file_size_limit_result_write(tmp_path):
    """RLIMIT_FSIZE (works without mount rights): a write past the limit fails cleanly, earlier files intact."""
    pytest.importorskip("resource")
    code = textwrap.dedent(
        f"""
        import resource, signal, sys
        from lmlab.results import RunResult, atomic_write_text
        from lmlab.errors import OutputError
        atomic_write_text({str(tmp_path / "summary.json")!r}, "kept")
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (32 << 10, 32 << 10))
        r = RunResult(method="wanda", run_info={{}}, config={{}}, metrics=[], claims=[], claim_text="",
                      samples=[{{"text": "x" * 100}} for _ in range(1000)])
        try:
            r.write({str(tmp_path / "run")!r})
        except OutputError as e:
            print("ERR", e)
        try:
            atomic_write_text({str(tmp_path / "summary.json")!r}, "y" * (64 << 10))
        except OutputError as e:
            print("ERR", e)
        """
    )
    done = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("ERR could not write") for line in lines), lines
    assert (tmp_path / "summary.json").read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]
