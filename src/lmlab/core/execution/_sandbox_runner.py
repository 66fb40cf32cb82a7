"""The script `lmlab.core.execution.sandbox` runs inside the sandboxed child. Standard library only, Python >= 3.8.

Usage (the parent builds this command; nobody else should)::

    python -I _sandbox_runner.py CANDIDATE.py SPEC.json

The runner reads the spec and deletes the spec file (it holds the per-run nonce), lowers its own resource limits
once more (defence in depth: the parent already set them), blocks Python-level sockets (defence in depth: the real
network block is the empty network namespace), then runs, in one namespace:

1. the candidate source (``CANDIDATE.py``);
2. the ``test`` code, if any; if the test defines ``check`` and an ``entry_point`` is named, ``check(candidate)`` is
   called with the candidate's entry-point function (HumanEval style);
3. the ``calls``, if any: each call of the entry point is timed with ``time.perf_counter()`` around the bare call
   (fresh deep copy of the arguments each repeat, garbage collector off while timed), best of ``repeat``; with
   ``memory`` set, one extra untimed call runs under ``tracemalloc`` to get the peak traced allocation.

Last, it writes one line to the original stdout: ``"\\n" + marker + ":" + nonce + ":" + JSON + "\\n"`` and exits with
``os._exit(0)`` (no atexit hooks, no waiting on the candidate's threads). The parent only accepts a line carrying
this run's nonce, so a candidate cannot forge a verdict by printing a marker line unless it digs the nonce out of the
runner's memory (the candidate runs in the same process: this is hardening, not a proof).

Spec (JSON object, ``version`` 1)::

    {
      "version": 1,
      "nonce": "<hex>",                  # required, removed from memory as soon as possible
      "marker": "__LMLAB_SANDBOX_RESULT__",
      "entry_point": "f" | null,         # function name in the candidate namespace
      "test": "<python code>" | null,
      "calls": [                         # optional; needs entry_point
        {"label": "n=1e5", "args": [..], "kwargs": {..}, "args_expr": "(list(range(10**5)),)" | null,
         "repeat": 5, "memory": false, "expected": <json>}        # "expected" optional
      ],
      "limits": {"timeout_s": 2, "memory_mb": 512, "fsize_mb": 1, "nofile": 64, "nproc": 32},
      "max_repr": 1000
    }

Result JSON: ``status`` (``passed`` / ``wrong_answer`` / ``timeout`` / ``memory_error`` / ``runtime_error``),
``phase`` where it stopped (``source`` / ``test`` / ``calls`` / null), ``error_type``, ``error``, ``traceback``
(both truncated), ``calls`` (one object per finished call: ``label``, ``times_s``, ``best_s``, ``peak_bytes``,
``result_repr``, ``matches_expected``), ``durations_s`` per phase, ``python`` version.
"""

import builtins
import copy
import gc
import json
import linecache
import os
import signal
import sys
import time
import traceback

_MAX_ERR = 2000
_MAX_TB = 6000


class _CpuTimeLimit(BaseException):
    """Raised from the SIGXCPU handler: the soft RLIMIT_CPU was reached. BaseException so `except Exception` in
    candidate code does not swallow it."""


def _on_sigxcpu(signum, frame):
    raise _CpuTimeLimit("CPU time limit exceeded (RLIMIT_CPU)")


def _apply_limits(limits):
    try:
        import resource
    except ImportError:  # pragma: no cover - not Linux
        return
    mib = 1024 * 1024
    wanted = []
    if limits.get("memory_mb"):
        wanted.append((resource.RLIMIT_AS, int(limits["memory_mb"]) * mib, int(limits["memory_mb"]) * mib))
    if limits.get("timeout_s"):
        soft = max(1, int(-(-float(limits["timeout_s"]) // 1)))
        wanted.append((resource.RLIMIT_CPU, soft, soft + 1))
    if limits.get("fsize_mb") is not None:
        size = int(float(limits["fsize_mb"]) * mib)
        wanted.append((resource.RLIMIT_FSIZE, size, size))
    if limits.get("nofile"):
        wanted.append((resource.RLIMIT_NOFILE, int(limits["nofile"]), int(limits["nofile"])))
    if limits.get("nproc"):
        wanted.append((resource.RLIMIT_NPROC, int(limits["nproc"]), int(limits["nproc"])))
    wanted.append((resource.RLIMIT_CORE, 0, 0))
    for which, soft, hard in wanted:
        try:
            cur_soft, cur_hard = resource.getrlimit(which)
            if cur_hard != resource.RLIM_INFINITY:
                hard = min(hard, cur_hard)
                soft = min(soft, hard)
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError):
            pass  # only ever lowering; a limit we cannot lower stays as the parent set it


def _block_sockets():
    """Defence in depth only: the network namespace is the real block (raw `_socket` bypasses this)."""
    import errno
    import socket

    def _refuse(*args, **kwargs):
        raise OSError(errno.ENETUNREACH, "network access is disabled in the lmlab sandbox")

    for name in ("connect", "connect_ex", "sendto", "sendmsg"):
        if hasattr(socket.socket, name):
            setattr(socket.socket, name, _refuse)
    socket.create_connection = _refuse
    socket.getaddrinfo = _refuse


def _short(text, limit):
    text = str(text)
    if len(text) <= limit:
        return text
    return text[: limit // 2] + "\n...[truncated]...\n" + text[-(limit // 2) :]


def _safe_str(exc):
    try:
        return _short(str(exc), _MAX_ERR)
    except BaseException:  # a candidate exception whose __str__ fails
        return f"<unprintable {type(exc).__name__}>"


def _safe_repr(value, limit):
    try:
        return _short(repr(value), limit)
    except BaseException:
        return f"<unrepresentable {type(value).__name__}>"


def _classify(exc):
    if isinstance(exc, AssertionError):
        return "wrong_answer"
    if isinstance(exc, MemoryError):
        return "memory_error"
    if isinstance(exc, _CpuTimeLimit):
        return "timeout"
    return "runtime_error"


def _register_source(filename, source):
    """Let tracebacks show candidate / test lines."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)


def _run_calls(fn, calls, namespace, result, max_repr):
    for index, call in enumerate(calls):
        label = call.get("label") or f"call {index}"
        entry = {"label": label, "times_s": [], "best_s": None, "peak_bytes": None, "result_repr": None}
        result["calls"].append(entry)
        if call.get("args_expr"):
            args = eval(call["args_expr"], namespace)  # noqa: S307 - runs inside the sandbox by design
            if not isinstance(args, (tuple, list)):
                args = (args,)
        else:
            args = call.get("args") or []
        args = tuple(args)
        kwargs = dict(call.get("kwargs") or {})
        repeat = max(1, int(call.get("repeat", 5)))
        value = None
        for _ in range(repeat):
            a, kw = copy.deepcopy((args, kwargs))
            gc_was_enabled = gc.isenabled()
            gc.disable()
            try:
                t0 = time.perf_counter()
                value = fn(*a, **kw)
                t1 = time.perf_counter()
            finally:
                if gc_was_enabled:
                    gc.enable()
            entry["times_s"].append(t1 - t0)
            entry["best_s"] = min(entry["times_s"])
        entry["result_repr"] = _safe_repr(value, max_repr)
        if "expected" in call:
            entry["matches_expected"] = bool(value == call["expected"])
        if call.get("memory"):
            import tracemalloc

            a, kw = copy.deepcopy((args, kwargs))
            tracemalloc.start()
            try:
                fn(*a, **kw)
                entry["peak_bytes"] = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        if entry.get("matches_expected") is False:
            raise AssertionError(f"{label}: returned {entry['result_repr']}, expected {call['expected']!r}")


def main():
    started = time.perf_counter()
    out_fd = os.dup(1)  # the verdict goes here even if the candidate closes or redirects fd 1
    cand_path, spec_path = sys.argv[1], sys.argv[2]
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    try:
        os.unlink(spec_path)
    except OSError:
        pass
    header = f"\n{spec.get('marker', '__LMLAB_SANDBOX_RESULT__')}:{spec.pop('nonce')}:".encode()
    _apply_limits(spec.get("limits") or {})
    signal.signal(signal.SIGXCPU, _on_sigxcpu)
    _block_sockets()
    with open(cand_path, encoding="utf-8") as f:
        source = f.read()

    max_repr = int(spec.get("max_repr", 1000))
    entry_point = spec.get("entry_point")
    test = spec.get("test")
    calls = spec.get("calls") or []
    result = {
        "status": "passed",
        "phase": None,
        "error_type": None,
        "error": None,
        "traceback": None,
        "calls": [],
        "durations_s": {},
        "python": ".".join(str(v) for v in sys.version_info[:3]),
    }
    namespace = {"__name__": "__lmlab_candidate__", "__builtins__": builtins}
    phase = None
    try:
        phase = "source"
        t0 = time.perf_counter()
        _register_source("<candidate>", source)
        exec(compile(source, "<candidate>", "exec"), namespace)  # noqa: S102 - runs inside the sandbox by design
        result["durations_s"]["source"] = time.perf_counter() - t0
        if test:
            phase = "test"
            t0 = time.perf_counter()
            _register_source("<test>", test)
            exec(compile(test, "<test>", "exec"), namespace)  # noqa: S102
            if entry_point and callable(namespace.get("check")):
                if entry_point not in namespace:
                    raise NameError(f"entry point {entry_point!r} is not defined by the candidate")
                namespace["check"](namespace[entry_point])
            result["durations_s"]["test"] = time.perf_counter() - t0
        if calls:
            phase = "calls"
            t0 = time.perf_counter()
            if not entry_point or entry_point not in namespace:
                raise NameError(f"entry point {entry_point!r} is not defined by the candidate")
            _run_calls(namespace[entry_point], calls, namespace, result, max_repr)
            result["durations_s"]["calls"] = time.perf_counter() - t0
        phase = None
    except BaseException as exc:  # noqa: B036 - everything the candidate raises is a verdict
        result["status"] = _classify(exc)
        result["phase"] = phase
        result["error_type"] = type(exc).__name__
        result["error"] = _safe_str(exc)
        try:
            result["traceback"] = _short(
                "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)), _MAX_TB
            )
        except BaseException:
            result["traceback"] = None
    result["durations_s"]["total"] = time.perf_counter() - started
    signal.signal(signal.SIGXCPU, signal.SIG_IGN)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    try:
        payload = json.dumps(result, default=repr)
    except BaseException as exc:
        payload = json.dumps({"status": "runtime_error", "error_type": "RunnerError", "error": _safe_str(exc)})
    data = header + payload.encode("utf-8", "replace") + b"\n"
    while data:
        try:
            written = os.write(out_fd, data)
        except InterruptedError:
            continue
        except OSError:
            break
        data = data[written:]
    os._exit(0)


if __name__ == "__main__":
    main()
