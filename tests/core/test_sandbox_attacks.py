"""Hostile candidates against `lmlab.core.execution.sandbox` (issue 19): each attack is a real program run through
`run_code`.

Every attack asserts containment: a classified outcome, the parent unharmed (alive, environment unchanged), nothing
left running (no new uid-65534 process, no process in the candidate's process group or below the launched pid),
nothing written outside scratch (sentinel dirs planted in the world-writable places the sandbox user could reach)
and no secret readable. `tests/core/test_sandbox.py` covers the ordinary verdicts; this file only attacks.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmlab.core.execution import sandbox
from lmlab.core.execution.sandbox import SANDBOX_UID, SandboxLimits, run_code, sandbox_available

AVAILABLE, WHY = sandbox_available("unshare")
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
# A candidate that should finish gets a generous wall clock: under a loaded machine (a second job, CI) the Python start
# and ctypes import alone can take seconds, and a 2 s limit then turned a passing attack test into a timeout. The
# hostile candidates that must be stopped by the clock or the memory limit get SHORT, and their wall-time bound keeps
# a margin for the kill under load (what it checks is "bounded", not "fast").
LIMITS = SandboxLimits(timeout_s=30.0, memory_mb=256)
SHORT = SandboxLimits(timeout_s=2.0, memory_mb=256)
KILL_MARGIN_S = 15.0
SECRET = "lmlab-attack-secret-7f3c9a"
REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(not AVAILABLE, reason=f"no sandbox on this machine: {WHY}"),
    pytest.mark.skipif(not IS_ROOT, reason="attacks the root path (uid drop to 65534); CI runs as root"),
]


def _code(text: str) -> str:
    return textwrap.dedent(text).strip() + "\n"


# -------------------------------------------------------------------------------------------------------------------
# Observation helpers: processes, sentinels, secrets
# -------------------------------------------------------------------------------------------------------------------


def _proc_status(pid: str) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _sandbox_pids() -> set[int]:
    """Live processes whose real uid is the sandbox user's."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            uid = _proc_status(entry).get("Uid", "").split()
            if uid and int(uid[0]) == SANDBOX_UID and _proc_status(entry).get("State", "").strip()[:1] != "Z":
                found.add(int(entry))
    return found


def _group_or_children(pgid: int) -> list[int]:
    """Processes still in process group `pgid` or whose ancestry reaches pid `pgid`."""
    parents: dict[int, int] = {}
    groups: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents[int(entry)], groups[int(entry)] = int(fields[1]), int(fields[2])  # ppid, pgrp
    left = []
    for pid in parents:
        p, seen = pid, 0
        while p > 1 and p != pgid and seen < 64:
            p, seen = parents.get(p, 0), seen + 1
        if groups[pid] == pgid or (p == pgid and pid != pgid):
            left.append(pid)
    return left


class Launches:
    """Records the pid (the candidate's process group id) and scratch names of every process `run_code` launches."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.scratch: set[str] = set()


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> Launches:
    record = Launches()
    real = sandbox.subprocess.Popen

    class RecordingPopen(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            record.pids.append(self.pid)
            record.scratch.update(_scratch_names(" ".join(map(str, self.args))))

    monkeypatch.setattr(sandbox.subprocess, "Popen", RecordingPopen)
    return record


@pytest.fixture
def sentinels() -> Iterator[dict[str, Path]]:
    """World-writable sentinel dirs (0o1777, like /tmp itself) where uid 65534 could write if it saw them."""
    made = {}
    for base in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
        if os.path.isdir(base) and os.access(base, os.W_OK):
            d = Path(tempfile.mkdtemp(prefix="lmlab-sentinel-", dir=base))
            (d / "keep.txt").write_text("sentinel")
            os.chmod(d, 0o1777)
            made[base] = d
    yield made
    for d in made.values():
        for p in sorted(d.rglob("*"), reverse=True):
            p.unlink() if not p.is_dir() or p.is_symlink() else p.rmdir()
        d.rmdir()


def _assert_sentinels_untouched(sentinels: dict[str, Path]) -> None:
    for d in sentinels.values():
        assert sorted(p.name for p in d.iterdir()) == ["keep.txt"], f"the sandbox wrote into {d}"
        assert (d / "keep.txt").read_text() == "sentinel"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}  # pytest rewrites it per phase


def _mounts() -> list[str]:
    return sorted(line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines())


def _scratch_names(text: str) -> set[str]:
    return set(re.findall(r"lmlab-sandbox-[\w-]+", text)) - {"lmlab-sandbox-stage", "lmlab-sandbox-probe-ok"}


def _foreign(pid: int, ours: set[str]) -> bool:
    """Whether `pid` lives in another run's sandbox (a concurrent test elsewhere): a PID namespace whose processes
    name only scratch dirs that are not ours. A namespace dies with its init, and the init names its scratch dir."""
    try:
        ns = os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return False
    names: set[str] = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") == ns:
                names.update(_scratch_names(_cmdline(int(entry)).decode("utf-8", "replace")))
        except OSError:
            continue
    return bool(names) and not names & ours


def _assert_contained(launches: Launches, before: set[int], env_before: dict[str, str], mounts: list[str]) -> None:
    """Parent alive with its environment and mounts, nothing of the candidate left running (short grace period)."""
    assert _env() == env_before
    assert _mounts() == mounts, "the sandbox's private mounts leaked into the parent's mount namespace"
    deadline = time.monotonic() + 1.0
    while True:
        new = {p for p in _sandbox_pids() - before if not _foreign(p, launches.scratch)}
        stray = [p for pgid in launches.pids for p in _group_or_children(pgid)]
        if (not new and not stray) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for pid in [*new, *stray]:  # do not leave them running when the test fails
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    assert not new, f"uid {SANDBOX_UID} processes left running: {sorted(new)}"
    assert not stray, f"processes of the candidate's group left running: {stray}"
    assert launches.pids, "run_code launched nothing"


@pytest.fixture
def contained(launches: Launches) -> Iterator[None]:
    before, env_before, mounts = _sandbox_pids(), _env(), _mounts()
    yield
    _assert_contained(launches, before, env_before, mounts)


# -------------------------------------------------------------------------------------------------------------------
# Resource attacks
# -------------------------------------------------------------------------------------------------------------------


def test_fork_bomb(contained, sentinels):
    code = _code(
        """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """
    )
    r = run_code(code, limits=SHORT)
    assert r.status in ("timeout", "runtime_error"), r
    assert r.wall_s < SHORT.timeout_s + KILL_MARGIN_S
    _assert_sentinels_untouched(sentinels)


def test_memory_bomb(contained):
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))\n"
    r = run_code(code, limits=SHORT)
    assert r.status == "memory_error", r


def test_infinite_loop_that_swallows_the_cpu_signal(contained):
    code = _code(
        """
        while True:
            try:
                while True:
                    pass
            except BaseException:
                pass
        """
    )
    r = run_code(code, limits=SHORT)
    assert r.status == "timeout", r
    assert r.wall_s < SHORT.timeout_s + KILL_MARGIN_S


def test_cpu_spin_in_many_threads(contained):
    code = _code(
        """
        import threading
        def spin():
            while True:
                pass
        started = 0
        for _ in range(16):
            try:
                threading.Thread(target=spin, daemon=True).start()
                started += 1
            except RuntimeError:  # RLIMIT_NPROC / RLIMIT_AS also bound the threads
                break
        print(started, flush=True)
        spin()
        """
    )
    r = run_code(code, limits=SHORT)
    assert r.status == "timeout", r
    assert r.wall_s < SHORT.timeout_s + KILL_MARGIN_S
    assert int(r.stdout.split()[0]) >= 2  # really several spinning threads


def test_setsid_then_sleep_in_the_runner_itself(contained):
    """pid 1 of the namespace leaves the process group and sleeps: killing the group alone would miss it."""
    r = run_code("import os, time\nos.setsid()\ntime.sleep(600)\n", limits=SHORT)
    assert r.status == "timeout", r


def test_daemonised_double_fork_is_gone_afterwards(contained):
    code = _code(
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.close(1)
                os.close(2)
                time.sleep(600)
            os._exit(0)
        time.sleep(0.2)
        print("parent done")
        """
    )
    r = run_code(code, limits=LIMITS)
    assert r.status == "passed", r
    assert r.wall_s < LIMITS.timeout_s


def test_killing_lmlab_itself_ends_the_sandbox():
    """lmlab dies (SIGKILL, OOM killer) while a candidate sleeps after `setsid`: the candidate must die with it."""
    import subprocess
    import sys

    driver = _code(
        """
        from lmlab.core.execution.sandbox import SandboxLimits, run_code
        run_code("import os, time\\nos.setsid()\\ntime.sleep(600)\\n", limits=SandboxLimits(timeout_s=60))
        """
    )
    before = _sandbox_pids()
    proc = subprocess.Popen([sys.executable, "-c", driver], env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    new: set[int] = set()
    try:
        deadline = time.monotonic() + 20
        while not new and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
            new = {p for p in _sandbox_pids() - before if b"candidate.py" in _cmdline(p)}  # not the probe's
        assert new, "the candidate never started"
        time.sleep(0.3)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 3
        while _sandbox_pids() & new and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _sandbox_pids() & new, "the candidate outlived lmlab"
    finally:
        proc.kill()
        proc.wait()
        for pid in _sandbox_pids() - before:
            try:
                os.kill(pid, 9)
            except OSError:
                pass


# -------------------------------------------------------------------------------------------------------------------
# Secrets
# -------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def secrets_planted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A secret in the parent's environment, in $HOME/.ssh and in the lmlab cache: root-owned 0600 as real ones are.

    $HOME lies under the pytest temp dir (hidden twice: a 0700 parent and the sandbox's private /tmp). The cache
    lies in a world-traversable (0755) dir under /var/cache, outside every private mount, so that there only the
    file mode protects it: the layer that guards a real ``~/.cache/lmlab`` whose parents are open.
    """
    from lmlab.core.inference.models import cache_root

    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    os.chmod(home / ".ssh", 0o700)
    base = Path(tempfile.mkdtemp(prefix="lmlab-attack-", dir="/var/cache" if os.path.isdir("/var/cache") else None))
    cache = base / "lmlab"
    cache.mkdir()
    for d in (base, cache):
        os.chmod(d, 0o755)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("LMLAB_CACHE", str(cache))
    monkeypatch.setenv("LMLAB_ATTACK_TOKEN", SECRET)
    assert cache_root() == cache
    files = {"ssh": home / ".ssh" / "id_ed25519", "cache": cache_root() / "token.json"}
    for f in files.values():
        f.write_text(SECRET)
        os.chmod(f, 0o600)
        assert os.stat(f).st_uid == 0
    yield {k: str(v) for k, v in files.items()}
    files["cache"].unlink()
    cache.rmdir()
    base.rmdir()


def test_no_secret_is_readable(secrets_planted, contained):
    paths = sorted(secrets_planted.values())
    paths += [f"/proc/{os.getpid()}/environ", f"/proc/{os.getppid()}/environ", "/root/.ssh/id_rsa", "/etc/shadow"]
    code = _code(
        f"""
        import glob, json, os
        out = {{"env": {SECRET!r} in json.dumps(dict(os.environ)), "read": {{}}, "visible": glob.glob("/proc/[0-9]*")}}
        for p in {paths!r} + glob.glob("/proc/*/environ"):
            try:
                with open(p, "rb") as f:
                    out["read"][p] = {SECRET!r}.encode() in f.read()
            except OSError as e:
                out["read"][p] = type(e).__name__
        print(json.dumps(out))
        """
    )
    r = run_code(code, limits=LIMITS)
    assert r.status == "passed", r
    out = json.loads(r.stdout)
    assert out["env"] is False
    assert not {p: v for p, v in out["read"].items() if v is True}
    assert out["read"][secrets_planted["ssh"]] in ("PermissionError", "FileNotFoundError"), out["read"]
    assert out["read"][secrets_planted["cache"]] == "PermissionError", out["read"]  # visible, but 0600
    assert out["visible"] == ["/proc/1"]  # own PID namespace: the parent's /proc entry does not exist there
    assert SECRET not in r.stdout + r.stderr


# -------------------------------------------------------------------------------------------------------------------
# File system
# -------------------------------------------------------------------------------------------------------------------


def test_writes_outside_scratch_by_every_path_trick(contained, sentinels):
    """Absolute paths, ``..``, symlinks and hard links planted in scratch, /proc/self/{root,cwd}, and a user namespace
    of its own to unmount the private /tmp: nothing lands in the host's sentinel dirs or root-owned places."""
    targets = [str(d / "pwned") for d in sentinels.values()] + [str(d / "keep.txt") for d in sentinels.values()]
    targets += ["/etc/lmlab_pwned", "/root/lmlab_pwned", str(REPO / "lmlab_pwned"), "/usr/lib/lmlab_pwned"]
    code = _code(
        f"""
        import ctypes, json, os
        targets = {targets!r}
        cwd = os.getcwd()
        out = {{"cwd": cwd, "uid": os.geteuid(), "tries": {{}}}}
        def attempt(label, fn):
            try:
                fn()
                out["tries"][label] = "ok"
            except OSError as e:
                out["tries"][label] = type(e).__name__
        def write(path):
            with open(path, "w") as f:
                f.write("pwned")
        for t in targets:
            attempt("abs " + t, lambda: write(t))
            attempt("dotdot " + t, lambda: write(cwd + "/../.." * 8 + t))
            attempt("proc-root " + t, lambda: write("/proc/self/root" + t))
            attempt("proc-cwd " + t, lambda: write("/proc/self/cwd/../../.." + t))
            link = "link-" + str(len(out["tries"]))
            attempt("symlink " + t, lambda: (os.symlink(t, link), write(link)))
            attempt("dirlink " + t, lambda: (os.symlink(os.path.dirname(t), link + "d"), write(link + "d/pwned")))
            attempt("hardlink " + t, lambda: os.link(t, link + "h"))
        attempt("escape-scratch", lambda: write(os.path.join(cwd, "..", "escaped.txt")))
        libc = ctypes.CDLL(None, use_errno=True)
        CLONE_NEWUSER, CLONE_NEWNS, MNT_DETACH = 0x10000000, 0x00020000, 2
        out["unshare"] = libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) or ctypes.get_errno()
        out["umount_tmp"] = libc.umount2(b"/tmp", MNT_DETACH) or ctypes.get_errno()
        for t in targets:
            attempt("userns " + t, lambda: write(t))
        print(json.dumps(out))
        """
    )
    r = run_code(code, limits=LIMITS)
    assert r.status == "passed", r
    out = json.loads(r.stdout)
    assert out["uid"] == SANDBOX_UID
    _assert_sentinels_untouched(sentinels)
    for t in targets[2 * len(sentinels) :]:
        assert not os.path.lexists(t), f"the sandbox created {t}"
    # Whatever "succeeded" went into the sandbox's private tmpfs dirs (checked by the census test), not the host's.
    assert not os.path.exists(os.path.join(os.path.dirname(out["cwd"]), "escaped.txt"))
    assert out["tries"]["escape-scratch"] == "ok"  # the private /tmp is writable: this attack did run
    assert out["umount_tmp"] != 0, "the candidate unmounted its private /tmp"


def test_only_private_places_are_writable(contained):
    """A census, not a list of guesses: every path uid 65534 may write resolves into its scratch, its private tmpfs
    dirs, /proc or a character device (/dev/null and friends, and the masked systemd units linking to it)."""
    code = _code(
        """
        import json, os, stat, subprocess
        cmd = ["find", "/", "-xdev", "-writable", "-print"]
        found = subprocess.run(cmd, capture_output=True, text=True).stdout.split("\\n")
        for top in ("/dev", "/run", "/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/sys", "/proc/sys"):
            if os.path.isdir(top):
                found += subprocess.run(["find", top, "-writable"], capture_output=True, text=True).stdout.split("\\n")
        bad = []
        for p in sorted(set(filter(None, found))):
            real = os.path.realpath(p)
            if real.startswith(("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/proc/")) or real == "/dev/pts/ptmx":
                continue
            try:
                if stat.S_ISCHR(os.stat(real).st_mode):
                    continue
            except OSError:
                pass
            bad.append(p)
        mounts = {}
        for line in open("/proc/self/mountinfo").read().splitlines():
            left, right = line.split(" - ")
            mounts[left.split()[4]] = right.split()[1]  # mount point -> source (later mounts win)
        for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
            if os.path.isdir(d) and mounts.get(d) != "lmlab-private-tmp":  # so the prefixes above were private
                bad.append("not private: " + d)
        print(json.dumps(bad))
        """
    )
    r = run_code(code, limits=SandboxLimits(timeout_s=LIMITS.timeout_s, memory_mb=256, nofile=256))
    assert r.status == "passed", r
    assert json.loads(r.stdout) == []


def test_filling_the_private_tmp_is_bounded(contained):
    """Bytes and inodes of the private tmpfs are RAM: both are capped, and running out is a plain ENOSPC."""
    code = _code(
        """
        import errno, json, os
        out = {}
        for d in ("big", "many"):
            os.mkdir(d)
        block, n = b"x" * (1 << 20), 0
        try:
            while True:
                with open(f"big/{n}", "wb") as f:
                    f.write(block[: (1 << 20) - 1])  # under RLIMIT_FSIZE: only the tmpfs size stops this
                n += 1
        except OSError as e:
            out["bytes"] = [n, errno.errorcode.get(e.errno)]
        for name in os.listdir("big"):
            os.unlink("big/" + name)
        n = 0
        try:
            while True:
                os.close(os.open(f"many/{n}", os.O_CREAT | os.O_WRONLY))
                n += 1
        except OSError as e:
            out["inodes"] = [n, errno.errorcode.get(e.errno)]
        print(json.dumps(out))
        """
    )
    r = run_code(code, limits=LIMITS)
    assert r.status == "passed", r
    out = json.loads(r.stdout)
    mib = sandbox._tmpfs_mb(SandboxLimits())
    assert out["bytes"][1] == "ENOSPC" and out["bytes"][0] <= mib, out
    assert out["inodes"][1] == "ENOSPC" and out["inodes"][0] <= 4096, out


def test_unprivileged_caller_cannot_unmount_its_private_tmp(sentinels):
    """The user-namespace path (lmlab not run as root): the candidate may not undo its private /tmp to reach the
    host's. Drives the sandbox module as uid 65534 with the system Python, as `test_sandbox.py` does."""
    import subprocess

    python = "/usr/bin/python3"
    if not os.path.exists(python) or sandbox._root_only_component(python) is not None:
        pytest.skip("no world-readable system python3")
    target = sentinels["/tmp"]
    candidate = _code(
        f"""
        import ctypes, json, os
        libc = ctypes.CDLL(None, use_errno=True)
        out = {{"uid": os.getuid(), "umount": libc.umount2(b"/tmp", 2)}}
        out["userns"] = libc.unshare(0x10000000 | 0x00020000)  # CLONE_NEWUSER | CLONE_NEWNS
        out["umount_in_userns"] = libc.umount2(b"/tmp", 2)
        out["sees_host_tmp"] = os.path.exists({str(target)!r})
        try:
            open({str(target / "pwned")!r}, "w").write("x")
            out["write"] = "ok"
        except OSError as e:
            out["write"] = type(e).__name__
        print(json.dumps(out))
        """
    )
    driver = _code(
        f"""
        import importlib.util, json, sys
        spec = importlib.util.spec_from_file_location("lmlab_sandbox", {str(Path(sandbox.__file__))!r})
        mod = importlib.util.module_from_spec(spec)
        sys.modules["lmlab_sandbox"] = mod
        spec.loader.exec_module(mod)
        ok, why = mod.sandbox_available()
        r = mod.run_code({candidate!r}, limits=mod.SandboxLimits(timeout_s=30)) if ok else None
        print(json.dumps({{"ok": ok, "why": why, "status": r and r.status, "stdout": r and r.stdout}}))
        """
    )
    drop = ["setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups", "--"]
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp"}
    proc = subprocess.run([*drop, python, "-I", "-c", driver], capture_output=True, text=True, timeout=30, env=env)
    if proc.returncode != 0 and "Permission denied" in proc.stderr:
        pytest.skip(f"uid 65534 cannot read the checkout: {proc.stderr.strip()[-200:]}")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if not out["ok"]:
        pytest.skip(f"unprivileged user namespaces are unavailable: {out['why']}")
    assert out["status"] == "passed", out
    got = json.loads(out["stdout"])
    assert got["umount"] == -1 and got["umount_in_userns"] == -1, got
    assert got["sees_host_tmp"] is False and got["write"] == "FileNotFoundError", got
    _assert_sentinels_untouched(sentinels)


def test_deleting_the_scratch_parent(contained, sentinels):
    code = _code(
        """
        import os, shutil
        cwd = os.getcwd()
        parent = os.path.dirname(cwd)
        shutil.rmtree(parent, ignore_errors=True)
        os.chdir("/")
        shutil.rmtree(cwd, ignore_errors=True)
        for victim in ("/tmp", "/var/tmp", "/dev/shm", parent):
            for name in os.listdir(victim) if os.path.isdir(victim) else ():
                shutil.rmtree(os.path.join(victim, name), ignore_errors=True)
        print(cwd)
        """
    )
    r = run_code(code, limits=LIMITS)
    assert r.status == "passed", r
    _assert_sentinels_untouched(sentinels)
    assert os.path.isdir(tempfile.gettempdir())
    assert not os.path.exists(r.stdout.strip())  # the parent still cleaned up its own scratch dir


# -------------------------------------------------------------------------------------------------------------------
# Network
# -------------------------------------------------------------------------------------------------------------------


def test_sockets_reach_nothing(contained, tmp_path):
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    tcp.setblocking(False)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.setblocking(False)
    sock_dir = Path(tempfile.mkdtemp(prefix="lmlab-sock-", dir="/tmp"))
    os.chmod(sock_dir, 0o777)
    unix_path = str(sock_dir / "s")
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(unix_path)
    os.chmod(unix_path, 0o777)
    unix.listen(8)
    unix.setblocking(False)
    abstract_name = f"\0lmlab-attack-{os.getpid()}"
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind(abstract_name)
    abstract.listen(8)
    abstract.setblocking(False)
    code = _code(
        f"""
        import _socket as S, json
        out = {{}}
        def attempt(label, family, kind, fn, proto=0):
            try:
                s = S.socket(family, kind, proto)
                s.settimeout(1)
                fn(s)
                out[label] = "ok"
            except OSError as e:
                out[label] = type(e).__name__ + ":" + str(e.errno)
        attempt("tcp", S.AF_INET, S.SOCK_STREAM, lambda s: s.connect(("127.0.0.1", {tcp.getsockname()[1]})))
        attempt("tcp6", S.AF_INET6, S.SOCK_STREAM, lambda s: s.connect(("::1", {tcp.getsockname()[1]})))
        attempt("udp", S.AF_INET, S.SOCK_DGRAM, lambda s: s.sendto(b"x", ("127.0.0.1", {udp.getsockname()[1]})))
        attempt("unix", S.AF_UNIX, S.SOCK_STREAM, lambda s: s.connect({unix_path!r}))
        attempt("abstract", S.AF_UNIX, S.SOCK_STREAM, lambda s: s.connect({abstract_name!r}))
        attempt("raw", S.AF_INET, S.SOCK_RAW, lambda s: s.sendto(b"x", ("127.0.0.1", 0)), S.IPPROTO_ICMP)
        attempt("packet", getattr(S, "AF_PACKET", 17), S.SOCK_RAW, lambda s: None)
        print(json.dumps(out))
        """
    )
    try:
        r = run_code(code, limits=LIMITS)
        assert r.status == "passed", r
        out = json.loads(r.stdout)
        assert not [k for k, v in out.items() if v == "ok"], out
        assert out["raw"].startswith("PermissionError") and out["packet"].startswith("PermissionError"), out
        for listener in (tcp, unix, abstract):
            with pytest.raises(BlockingIOError):
                listener.accept()
        with pytest.raises(BlockingIOError):
            udp.recvfrom(16)
    finally:
        for s in (tcp, udp, unix, abstract):
            s.close()
        os.unlink(unix_path)
        sock_dir.rmdir()


# -------------------------------------------------------------------------------------------------------------------
# Privileges, other processes
# -------------------------------------------------------------------------------------------------------------------


def test_shells_and_setuid_binaries_regain_no_privilege(contained):
    setuid = [p for p in ("/usr/bin/passwd", "/usr/bin/su", "/bin/su", "/usr/bin/sudo") if os.path.exists(p)]
    setuid = [p for p in setuid if os.stat(p).st_mode & stat.S_ISUID]
    code = _code(
        f"""
        import json, os, subprocess
        out = {{"sh": subprocess.run(["/bin/sh", "-c", "id -u; id -ru"], capture_output=True, text=True).stdout}}
        for b in {setuid!r}:
            try:  # su answers after PAM's failure delay
                p = subprocess.run([b, "-c", "id -u", "root"] if b.endswith("su") else [b, "-S", "root"],
                                   capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=4)
                out[b] = [p.returncode, p.stdout.strip()[:80]]
            except subprocess.TimeoutExpired:
                out[b] = ["timeout", ""]
        try:
            os.setuid(0)
            out["setuid0"] = "ok"
        except OSError as e:
            out["setuid0"] = type(e).__name__
        status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
        out["caps"] = [status["CapEff"].strip(), status["CapPrm"].strip(), status["CapBnd"].strip()]
        out["nnp"] = status.get("NoNewPrivs", "").strip()
        out["euid"] = os.geteuid()
        print(json.dumps(out))
        """
    )
    r = run_code(code, limits=LIMITS)
    assert r.status == "passed", r
    out = json.loads(r.stdout)
    assert out["sh"].split() == [str(SANDBOX_UID)] * 2
    for b in setuid:
        assert out[b][0] != 0 and out[b][1] != "0", (b, out[b])
    assert out["setuid0"] == "PermissionError"
    assert out["caps"] == ["0000000000000000"] * 3 and out["nnp"] == "1"
    assert out["euid"] == SANDBOX_UID


@pytest.fixture
def victim() -> Iterator[int]:
    """A process of uid 65534 outside the sandbox (like a concurrent sandbox): it must survive the attack."""
    import subprocess

    proc = subprocess.Popen(
        ["setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups", "sleep", "30"]
    )
    deadline = time.monotonic() + 5
    while _proc_status(str(proc.pid)).get("Uid", "").split()[:1] != [str(SANDBOX_UID)]:
        assert time.monotonic() < deadline, "setpriv did not drop to the sandbox uid"
        time.sleep(0.01)
    yield proc.pid
    proc.kill()
    proc.wait()


def test_kill_and_ptrace_of_the_parent_and_a_neighbour(victim, contained):
    # pid 1 is left out: when the test runs under a daemonised parent (nohup, a CI runner) os.getppid() is the host's
    # init, and inside the sandbox's PID namespace "1" names the namespace's own init, which a process there may
    # signal (kill returns 0, the signal is ignored): not an escape, and it failed a full run under nohup.
    targets = [p for p in (os.getpid(), os.getppid(), victim) if p > 1]
    code = _code(
        f"""
        import ctypes, json, os, signal
        libc = ctypes.CDLL(None, use_errno=True)
        libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        out = {{"ppid": os.getppid()}}
        for pid in {targets!r}:
            try:
                os.kill(pid, signal.SIGKILL)
                out[f"kill {{pid}}"] = "ok"
            except OSError as e:
                out[f"kill {{pid}}"] = type(e).__name__
            out[f"ptrace {{pid}}"] = libc.ptrace(16, pid, None, None) or "ok"  # PTRACE_ATTACH
        try:
            os.kill(-1, signal.SIGKILL)  # everything it may signal: only its own namespace, never pid 1 (init)
        except OSError:
            pass
        print(json.dumps(out))
        """
    )
    r = run_code(code, limits=LIMITS)
    assert r.status == "passed", r
    out = json.loads(r.stdout)
    assert out["ppid"] == 0  # init of its own PID namespace
    assert not [k for k, v in out.items() if v == "ok"], out
    os.kill(victim, 0)  # still alive
    assert _proc_status(str(victim)).get("State", "").strip()[:1] != "Z"


def test_limits_cannot_be_raised(contained):
    code = _code(
        """
        import ctypes, json, resource
        libc = ctypes.CDLL(None, use_errno=True)
        class Rlimit(ctypes.Structure):
            _fields_ = [("cur", ctypes.c_uint64), ("max", ctypes.c_uint64)]
        out = {}
        names = ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_CORE")
        for name in names:
            which = getattr(resource, name)
            before = resource.getrlimit(which)
            try:
                resource.setrlimit(which, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
                py = "raised"
            except (ValueError, OSError) as e:
                py = type(e).__name__
            new = Rlimit(2**64 - 1, 2**64 - 1)
            c = libc.prlimit(0, which, ctypes.byref(new), None)
            c2 = libc.setrlimit(which, ctypes.byref(new))
            out[name] = [py, c, c2, list(before) == list(resource.getrlimit(which))]
        print(json.dumps(out))
        """
    )
    r = run_code(code, limits=LIMITS)
    assert r.status == "passed", r
    out = json.loads(r.stdout)
    for name, (py, c, c2, same) in out.items():
        assert py == "ValueError" and c == -1 and c2 == -1 and same, (name, out[name])


# -------------------------------------------------------------------------------------------------------------------
# Output
# -------------------------------------------------------------------------------------------------------------------


def test_huge_output_keeps_the_parent_bounded(contained):
    import resource

    limits = SandboxLimits(timeout_s=LIMITS.timeout_s, output_bytes=4096)
    code = _code(
        """
        import os
        block = b"x" * (1 << 20)
        for _ in range(96):
            os.write(1, block)
            os.write(2, block)
        """
    )
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    r = run_code(code, limits=limits)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert r.status == "passed", r
    assert r.stdout_truncated and r.stderr_truncated
    assert len(r.stdout) < 4096 + 200 and len(r.stderr) < 4096 + 200
    assert grown_mib < 32, f"the parent grew by {grown_mib:.0f} MiB for 192 MiB of output"


# -------------------------------------------------------------------------------------------------------------------
# Refusal when the isolation is missing
# -------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_probe() -> Iterator[None]:
    sandbox._probe.cache_clear()
    yield
    sandbox._probe.cache_clear()


def test_refused_loudly_when_the_private_tmp_cannot_be_mounted(monkeypatch, fresh_probe, tmp_path):
    """The real probe runs the real stage; here the stage fails as `mount` does without CAP_SYS_ADMIN."""
    failing = "echo 'mount: /tmp: permission denied.' >&2\nexit 32\n"
    monkeypatch.setattr(sandbox, "_STAGE", failing)
    ok, reason = sandbox_available("unshare")
    assert not ok and "permission denied" in reason and "\n" not in reason
    marker = tmp_path / "ran"
    r = run_code(f"open({str(marker)!r}, 'w').write('x')", limits=LIMITS)
    assert r.status == "refused" and r.returncode is None and "permission denied" in r.reason
    assert not marker.exists()
    with pytest.warns(RuntimeWarning, match="WITHOUT a sandbox"):
        unsafe = run_code("print(6 * 7)", limits=LIMITS, allow_unsandboxed=True)
    assert unsafe.status == "passed" and unsafe.backend == "none" and unsafe.stdout == "42\n"
