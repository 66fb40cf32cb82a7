"""Seeds and thread counts, so a run can be repeated bit for bit on the same machine.

torch is imported only when a function here needs it and it is installed; importing this module is free.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import sys
from typing import Any

import numpy as np

# Derived seeds live in [0, 2**32): the range every seeding API accepts (numpy's legacy global seed rejects more).
SEED_SPACE = 2**32

# Environment variables read by the OpenMP / BLAS runtimes. Setting them only affects runtimes not yet initialised
# in this process and child processes (data-loader workers, subprocess tools); torch's own pool is set directly.
THREAD_ENV_VARS: tuple[str, ...] = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def _torch() -> Any | None:
    if "torch" in sys.modules:
        return sys.modules["torch"]
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    return torch


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if not 0 <= int(seed) < SEED_SPACE:
        raise ValueError(f"seed must be in [0, 2**32), got {seed}")
    return int(seed)


def set_seed(seed: int, *, deterministic: bool = False) -> None:
    """Seed Python's `random`, numpy's global generator and torch (if installed).

    Code that needs randomness should prefer an explicit generator (`seeded_rng`, ``torch.Generator``); this
    function covers libraries that draw from the global state.

    Args:
        seed: Integer in ``[0, 2**32)``.
        deterministic: Also make torch use deterministic algorithms
            (``torch.use_deterministic_algorithms(True, warn_only=True)``: an op without a deterministic kernel warns
            instead of crashing a long run), disable cuDNN autotuning, and set ``CUBLAS_WORKSPACE_CONFIG`` for
            deterministic cuBLAS. ``False`` leaves those settings as they are (it does not switch them off).
    """
    seed = _check_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch = _torch()
    if torch is None:
        return
    torch.manual_seed(seed)  # also seeds every CUDA device
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def set_threads(n: int | None) -> int | None:
    """Set the CPU thread count used by torch and, for runtimes started later, by OpenMP/MKL/OpenBLAS.

    Sets ``torch.set_num_threads(n)`` (intra-op pool, effective immediately) and the environment variables in
    `THREAD_ENV_VARS` (effective for child processes and for runtimes not yet initialised in this process).
    torch's inter-op pool is left alone: it can only be set once, before any parallel work, and lmlab's CPU
    workloads are dominated by intra-op parallelism.

    Args:
        n: Threads (>= 1); ``None`` changes nothing.

    Returns:
        torch's previous intra-op thread count (to restore it later), or ``None`` when torch is not installed.
    """
    if n is not None and (isinstance(n, bool) or int(n) < 1):
        raise ValueError(f"threads must be >= 1 or None, got {n!r}")
    torch = _torch()
    previous = torch.get_num_threads() if torch is not None else None
    if n is None:
        return previous
    for var in THREAD_ENV_VARS:
        os.environ[var] = str(int(n))
    if torch is not None:
        torch.set_num_threads(int(n))
    return previous


def derive_seed(seed: int, *names: str | int | float | bool | None) -> int:
    """A child seed for a named component, stable across processes, platforms and Python versions.

    Computed as the first 8 bytes (big-endian) of ``sha256(json.dumps([seed, *names]))`` modulo ``2**32``. Python's
    `hash` would differ between processes (hash randomisation), so it is not used. JSON encoding keeps
    ``("a", "b")`` distinct from ``("a/b",)`` and ``1`` distinct from ``"1"``.

    Args:
        seed: The run's seed (any int).
        *names: Component names (str, int, float, bool or None), e.g. ``derive_seed(0, "bootstrap", "gsm8k")``.

    Returns:
        An int in ``[0, 2**32)``.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    for name in names:
        if not isinstance(name, (str, int, float, bool, type(None))):
            raise TypeError(f"derive_seed names must be str/int/float/bool/None, got {type(name).__name__}")
    payload = json.dumps([int(seed), *names], ensure_ascii=True, allow_nan=True)
    digest = hashlib.sha256(payload.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % SEED_SPACE


def seeded_rng(seed: int, *names: str | int | float | bool | None) -> np.random.Generator:
    """``np.random.default_rng(derive_seed(seed, *names))``: an independent generator per named component.

    Note it is always derived, so ``seeded_rng(0)`` differs from ``np.random.default_rng(0)``.

    Args:
        seed: The run's seed.
        *names: Component names, as for `derive_seed`.
    """
    return np.random.default_rng(derive_seed(seed, *names))


__all__ = ["SEED_SPACE", "THREAD_ENV_VARS", "derive_seed", "seeded_rng", "set_seed", "set_threads"]


def least_favourable_seed(effects: list[float] | tuple[float, ...], direction: str) -> int:
    """Index of the training seed whose mean effect (method - baseline) is least in a claim's `direction` (``"<"``:
    the largest effect; ``">"``: the smallest); ties: the last. An every-seed sign check reads this seed alone: the
    claim holding there implies every seed's mean has the claim's sign."""
    if direction not in ("<", ">"):
        raise ValueError(f"direction must be '<' or '>', got {direction!r}")
    sign = 1.0 if direction == "<" else -1.0
    return max(range(len(effects)), key=lambda k: (sign * effects[k], k))
