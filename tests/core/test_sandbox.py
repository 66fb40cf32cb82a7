"""lmlab.core.execution.sandbox: every isolation layer is exercised on real subprocesses (as root in CI)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from lmlab.core.execution import sandbox
from lmlab.core.execution.sandbox import CallSpec, SandboxLimits, run_code, run_many, sandbox_available

AVAILABLE, WHY = sandbox_available("unshare")
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
REPO = Path(__file__).resolve().parents[2]
FAST = SandboxLimits(timeout_s=2.0, memory_mb=512)

needs_sandbox = pytest.mark.skipif(not AVAILABLE, reason=f"no sandbox on this machine: {WHY}")
needs_root = pytest.mark.skipif(not IS_ROOT, reason="checks the root path (uid drop to 65534); CI runs as root")


def _code(text: str) -> str:
    return textwrap.dedent(text).strip() + "\n"


# -------------------------------------------------------------------------------------------------------------------
# Verdicts
# -------------------------------------------------------------------------------------------------------------------


@needs_sandbox
def test_correct_code_passes_and_output_is_captured():
    r = run_code("print('hello')\ndef add(a, b):\n    return a + b\n", test="assert add(2, 3) == 5", limits=FAST)
    assert r.status == "passed", r
    assert r.passed and r.returncode == 0 and r.runner is not None
    assert r.stdout == "hello\n"  # the verdict line is stripped
    assert r.backend == "unshare"


@needs_sandbox
def test_humaneval_style_check_is_called_with_the_entry_point():
    test = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"
    good = run_code("def add(a, b):\n    return a + b\n", test=test, entry_point="add", limits=FAST)
    bad = run_code("def add(a, b):\n    return a - b\n", test=test, entry_point="add", limits=FAST)
    missing = run_code("def plus(a, b):\n    return a + b\n", test=test, entry_point="add", limits=FAST)
    assert good.status == "passed", good
    assert bad.status == "wrong_answer" and bad.runner["phase"] == "test"
    assert missing.status == "runtime_error" and missing.runner["error_type"] == "NameError"


@needs_sandbox
def test_failing_assert_is_wrong_answer():
    r = run_code("assert 1 + 1 == 3, 'arithmetic is broken'", limits=FAST)
    assert r.status == "wrong_answer"
    assert r.runner["error_type"] == "AssertionError" and "arithmetic is broken" in r.reason


@needs_sandbox
def test_infinite_loop_is_timeout():
    r = run_code("while True:\n    pass\n", limits=FAST)
    assert r.status == "timeout", r
    assert r.wall_s < FAST.timeout_s + 2


@needs_sandbox
def test_huge_allocation_is_memory_error():
    r = run_code("x = bytearray(2 << 30)", limits=FAST)
    assert r.status == "memory_error", r


@needs_sandbox
def test_exception_is_runtime_error_with_traceback():
    r = run_code("def f():\n    raise ValueError('boom')\nf()\n", limits=FAST)
    assert r.status == "runtime_error"
    assert r.runner["error_type"] == "ValueError" and "boom" in r.reason
    assert "raise ValueError('boom')" in r.runner["traceback"]  # candidate lines are shown


@needs_sandbox
def test_exit_paths_are_not_passes():
    assert run_code("import sys\nsys.exit(0)", test="assert False", limits=FAST).status == "runtime_error"
    r = run_code("import os\nos._exit(0)", test="assert False", limits=FAST)
    assert r.status == "runtime_error" and r.runner is None  # no verdict at all is never a pass


# -------------------------------------------------------------------------------------------------------------------
# Isolation
# -------------------------------------------------------------------------------------------------------------------


@needs_sandbox
def test_network_is_unreachable():
    code = _code(
        """
        import _socket, json, socket
        out = {}
        for host, port in (("8.8.8.8", 53), ("127.0.0.1", 80)):
            s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)  # raw: bypasses the runner's monkeypatch
            s.settimeout(2)
            try:
                s.connect((host, port))
                out[host] = "connected"
            except OSError as e:
                out[host] = e.errno
        try:
            socket.create_connection(("8.8.8.8", 53), timeout=2)
            out["patched"] = "connected"
        except OSError as e:
            out["patched"] = e.errno
        print(json.dumps(out))
        """
    )
    r = run_code(code, limits=FAST)
    assert r.status == "passed", r
    out = json.loads(r.stdout)
    assert out == {"8.8.8.8": 101, "127.0.0.1": 101, "patched": 101}  # ENETUNREACH: empty network namespace


@needs_sandbox
@needs_root
def test_writes_outside_scratch_fail_and_scratch_is_removed():
    code = _code(
        f"""
        import json, os
        out = {{"cwd": os.getcwd(), "uid": os.getuid(), "pid": os.getpid()}}
        for path in ("/etc/lmlab_probe", "/root/lmlab_probe", {str(REPO / "lmlab_probe")!r}, "local.txt"):
            try:
                with open(path, "w") as f:
                    f.write("x")
                out[path] = "written"
            except OSError as e:
                out[path] = type(e).__name__
        out["read_back"] = open("local.txt").read()
        print(json.dumps(out))
        """
    )
    r = run_code(code, limits=FAST)
    assert r.status == "passed", r
    out = json.loads(r.stdout)
    assert out["uid"] == sandbox.SANDBOX_UID
    assert out["pid"] == 1  # own PID namespace
    assert out["/etc/lmlab_probe"] == "PermissionError"
    assert out["/root/lmlab_probe"] == "PermissionError"
    assert out[str(REPO / "lmlab_probe")] == "PermissionError"
    assert out["local.txt"] == "written" and out["read_back"] == "x"
    assert not Path("/etc/lmlab_probe").exists() and not (REPO / "lmlab_probe").exists()
    assert not Path(out["cwd"]).exists()  # scratch dir deleted afterwards


@needs_sandbox
def test_file_size_limit():
    r = run_code("open('big.bin', 'wb').write(b'0' * (3 << 20))", limits=FAST)  # 3 MiB > fsize_mb=1
    assert r.status == "runtime_error" and r.runner["error_type"] == "OSError", r  # EFBIG (SIGXFSZ is ignored)


@needs_sandbox
def test_fork_bomb_is_contained():
    code = _code(
        """
        import os, time
        print(os.getcwd(), flush=True)
        while True:
            try:
                os.fork()
            except OSError:
                time.sleep(0.01)
        """
    )
    r = run_code(code, limits=FAST)
    assert r.status in ("timeout", "runtime_error"), r
    assert r.wall_s < FAST.timeout_s + 3
    scratch = r.stdout.splitlines()[0]
    left = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if scratch.encode() in cmdline:
                left.append(entry)
    assert left == []  # the whole process tree is gone


@needs_sandbox
def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("LMLAB_SANDBOX_SECRET", "s3cr3t-token-value")
    r = run_code("import json, os\nprint(json.dumps({'env': dict(os.environ), 'cwd': os.getcwd()}))", limits=FAST)
    assert r.status == "passed", r
    out = json.loads(r.stdout)
    assert "s3cr3t-token-value" not in r.stdout and "LMLAB_SANDBOX_SECRET" not in out["env"]
    assert out["env"]["PATH"] == "/usr/bin:/bin"
    assert out["env"]["HOME"] == out["cwd"]


@needs_sandbox
def test_huge_output_is_truncated_and_the_verdict_survives():
    limits = SandboxLimits(timeout_s=5.0, output_bytes=4096)
    code = "import sys\nfor _ in range(200):\n    sys.stdout.write('x' * 50_000)\n    sys.stderr.write('y' * 50_000)\n"
    r = run_code(code, limits=limits)
    assert r.status == "passed", r.reason
    assert r.stdout_truncated and r.stderr_truncated
    assert len(r.stdout) < 4096 + 200 and len(r.stderr) < 4096 + 200
    assert "output truncated: 10000000 bytes" in r.stdout


@needs_sandbox
def test_forged_verdict_does_not_pass():
    fake = json.dumps({"status": "passed", "phase": None, "calls": []})
    lines = [f"{sandbox.MARKER}:{'0' * 32}:{fake}", f"{sandbox.MARKER}::{fake}", f"{sandbox.MARKER}:{fake}"]
    forge = "".join(f"print({line!r})\n" for line in lines)
    failing = run_code(forge + "assert False, 'really wrong'", limits=FAST)
    assert failing.status == "wrong_answer", failing
    exiting = run_code(forge + "import os, sys\nsys.stdout.flush()\nos._exit(0)", test="assert False", limits=FAST)
    assert exiting.status == "runtime_error" and exiting.runner is None, exiting
    assert sandbox.MARKER in exiting.stdout  # the forged lines are just output


@needs_sandbox
def test_spec_file_is_gone_before_the_candidate_runs():
    r = run_code("import os\nprint(sorted(os.listdir('.')))", limits=FAST)
    assert r.status == "passed" and "spec.json" not in r.stdout


# -------------------------------------------------------------------------------------------------------------------
# Refusal and availability
# -------------------------------------------------------------------------------------------------------------------


def test_unavailable_backend_is_refused(monkeypatch):
    monkeypatch.setattr(sandbox, "_which", lambda name: None)
    ok, reason = sandbox_available("unshare")
    assert not ok and "unshare" in reason and "\n" not in reason
    r = run_code("print('should not run')", limits=FAST)
    assert r.status == "refused" and r.returncode is None and r.stdout == ""
    assert "unshare" in r.reason


def test_backend_none_needs_allow_unsandboxed():
    r = run_code("print(1)", backend="none", limits=FAST)
    assert r.status == "refused" and "allow_unsandboxed" in r.reason
    assert not sandbox_available("none")[0]


def test_allow_unsandboxed_falls_back_with_a_warning(monkeypatch):
    monkeypatch.setattr(sandbox, "_which", lambda name: None)
    with pytest.warns(RuntimeWarning, match="WITHOUT a sandbox"):
        r = run_code("print(6 * 7)", limits=FAST, allow_unsandboxed=True, python=sys.executable)
    assert r.status == "passed" and r.backend == "none" and r.stdout == "42\n"


def test_unknown_backend_and_missing_interpreter():
    with pytest.raises(ValueError, match="backend"):
        run_code("pass", backend="docker")
    r = run_code("pass", python="/nonexistent/python3", limits=FAST)
    assert r.status == "refused" and "/nonexistent/python3" in r.reason


@needs_sandbox
@needs_root
def test_root_only_interpreter_is_refused_with_a_clear_reason():
    blocked = sandbox._root_only_component(sys.executable)
    if blocked is None:
        pytest.skip(f"{sys.executable} is world-accessible here")
    ok, reason = sandbox_available(python=sys.executable)
    assert not ok and blocked in reason and "uid 65534" in reason
    assert run_code("pass", python=sys.executable, limits=FAST).status == "refused"


@needs_root
def test_unprivileged_caller_uses_a_user_namespace():
    """Run the sandbox module itself as uid 65534 with the system Python: the `unshare --user` path."""
    import subprocess

    python = "/usr/bin/python3"
    if sandbox._root_only_component(python) is not None or not os.path.exists(python):
        pytest.skip("no world-readable system python3")
    if not sandbox.sandbox_available("unshare", python=python)[0]:
        pytest.skip("the sandbox cannot run the system python3")
    driver = _code(
        f"""
        import importlib.util, json, sys
        spec = importlib.util.spec_from_file_location("lmlab_sandbox", {str(Path(sandbox.__file__))!r})
        mod = importlib.util.module_from_spec(spec)
        sys.modules["lmlab_sandbox"] = mod
        spec.loader.exec_module(mod)
        ok, why = mod.sandbox_available()
        code = "import _socket\\ns = _socket.socket()\\ntry:\\n    s.connect(('8.8.8.8', 53))\\n"
        code += "except OSError as e:\\n    print(e.errno)\\n"
        r = mod.run_code(code, limits=mod.SandboxLimits(timeout_s=5))
        print(json.dumps({{"ok": ok, "why": why, "status": r.status, "stdout": r.stdout, "reason": r.reason}}))
        """
    )
    drop = ["setpriv", f"--reuid={sandbox.SANDBOX_UID}", f"--regid={sandbox.SANDBOX_UID}", "--clear-groups", "--"]
    proc = subprocess.run(
        [*drop, python, "-I", "-c", driver],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp"},
        cwd="/tmp",
    )
    if proc.returncode != 0 and "Permission denied" in proc.stderr:
        pytest.skip(f"uid 65534 cannot read the checkout: {proc.stderr.strip()[-200:]}")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if not out["ok"]:
        pytest.skip(f"unprivileged user namespaces are unavailable: {out['why']}")
    assert "user namespace" in out["why"]
    assert out["status"] == "passed", out
    assert out["stdout"].strip() == "101"


# -------------------------------------------------------------------------------------------------------------------
# Limits, timed calls, run_many, bwrap
# -------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field,value",
    [
        ("timeout_s", 0),
        ("timeout_s", -1.0),
        ("timeout_s", float("nan")),
        ("timeout_s", "2"),
        ("memory_mb", 10),
        ("memory_mb", 512.5),
        ("memory_mb", True),
        ("fsize_mb", -1),
        ("nofile", 4),
        ("nproc", 0),
        ("output_bytes", 10),
    ],
)
def test_bad_limits_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"SandboxLimits\.{field} must be .* in [\[(]"):
        SandboxLimits(**{field: value})


def test_limits_defaults_are_in_the_spec_range():
    lim = SandboxLimits()
    assert 512 <= lim.memory_mb <= 1024 and lim.fsize_mb == 1 and 32 <= lim.nofile <= 64 and lim.nproc == 32


@needs_sandbox
def test_timed_calls_report_best_time_and_peak_memory():
    source = "def total(xs):\n    return sum(xs)\n"
    calls = [
        CallSpec(args_expr="(list(range(100_000)),)", repeat=3, memory=True, expected=4999950000, label="1e5"),
        {"args": [[1, 2, 3]], "repeat": 2},
    ]
    r = run_code(source, entry_point="total", calls=calls, limits=FAST)
    assert r.status == "passed", r
    assert [c["label"] for c in r.calls] == ["1e5", "call 1"]
    assert len(r.calls[0]["times_s"]) == 3 and r.timings[0] == min(r.calls[0]["times_s"]) > 0
    assert isinstance(r.peak_bytes[0], int) and r.peak_bytes[1] is None
    assert r.calls[1]["result_repr"] == "6"

    wrong = run_code(source, entry_point="total", calls=[CallSpec(args=[[1, 2]], expected=4)], limits=FAST)
    assert wrong.status == "wrong_answer" and wrong.runner["phase"] == "calls"
    with pytest.raises(ValueError, match="entry_point"):
        run_code(source, calls=[CallSpec()])
    with pytest.raises(ValueError, match="repeat"):
        CallSpec(repeat=0)


@needs_sandbox
def test_run_many_keeps_order():
    items = [f"import time\ntime.sleep({0.1 * (3 - i):.1f})\nprint({i})" for i in range(4)]
    items.append({"source": "assert False"})
    results = run_many(items, workers=2, limits=FAST)
    assert [r.stdout.strip() for r in results[:4]] == ["0", "1", "2", "3"]
    assert all(r.status == "passed" for r in results[:4])
    assert results[4].status == "wrong_answer"
    assert run_many([]) == []
    with pytest.raises(ValueError, match="workers"):
        run_many(["pass"], workers=0)


BWRAP_OK, BWRAP_WHY = sandbox_available("bwrap")


@pytest.mark.skipif(not BWRAP_OK, reason=f"bubblewrap backend unavailable: {BWRAP_WHY}")
def test_bwrap_backend_read_only_root_and_no_network():
    code = _code(
        """
        import _socket, json, os
        out = {"tmp": os.listdir("/tmp")}
        for path in ("/etc/lmlab_probe", "/usr/lmlab_probe", "local.txt"):
            try:
                open(path, "w").write("x")
                out[path] = "written"
            except OSError as e:
                out[path] = e.errno
        s = _socket.socket()
        try:
            s.connect(("8.8.8.8", 53))
            out["net"] = "connected"
        except OSError as e:
            out["net"] = e.errno
        print(json.dumps(out))
        """
    )
    r = run_code(code, backend="bwrap", limits=FAST)
    assert r.status == "passed", r
    out = json.loads(r.stdout)
    assert out["/etc/lmlab_probe"] in (13, 30) and out["/usr/lmlab_probe"] in (13, 30)  # EACCES / EROFS
    assert out["local.txt"] == "written" and out["net"] == 101
    assert len(out["tmp"]) == 1  # private /tmp holding only the scratch dir
    assert run_code("while True:\n    pass\n", backend="bwrap", limits=FAST).status == "timeout"
