"""Timers, time budgets, and the fair timing protocol every lmlab efficiency method reports with.

The protocol (`compare_timings`): all candidates run in the same process, interleaved round by round with the
order rotated each round (so slow drift such as thermal throttling or a background job hits every candidate
alike), after at least two untimed warm-up calls each (lazy init, allocator and cache warm-up). Speedups are the
median of per-round ratios, not a ratio of medians: both calls of a round saw the same machine state. The report
records the load average and thread count so a reader can tell a contended measurement from a clean one.

Nothing here asserts or assumes any particular wall-clock value; tests inject a fake `clock`.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lmlab.core.stats.seeding import _torch

Clock = Callable[[], float]

MIN_WARMUP = 2


class Timer:
    """Context manager measuring the wall time of its block with `time.perf_counter` (or an injected clock).

    Example:
        >>> with Timer() as t:
        ...     work()
        >>> t.elapsed  # seconds

    Args:
        clock: Zero-argument callable returning seconds; `time.perf_counter` by default (tests inject a fake one).
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock: Clock = clock or time.perf_counter
        self._start: float | None = None
        self._end: float | None = None

    def __enter__(self) -> Timer:
        self._start = self._clock()
        self._end = None
        return self

    def __exit__(self, *exc: object) -> None:
        self._end = self._clock()

    @property
    def elapsed(self) -> float:
        """Seconds from entering to leaving the block; while still inside, the seconds so far; 0.0 before entry."""
        if self._start is None:
            return 0.0
        end = self._end if self._end is not None else self._clock()
        return end - self._start


class BudgetExceeded(RuntimeError):
    """Raised by `BudgetGuard.check` when the time budget is spent.

    Experiments catch it to report partial results: it says which step was about to start and which steps had
    passed their checks (so were completed, when `check` is called before each step).

    Attributes:
        what: Name of the step whose check failed (it was not started).
        completed: Names passed to earlier successful `check` calls, in order.
        elapsed_s: Seconds spent when the check failed.
        budget_s: The budget.
    """

    def __init__(self, what: str, completed: list[str], elapsed_s: float, budget_s: float) -> None:
        self.what = what
        self.completed = list(completed)
        self.elapsed_s = elapsed_s
        self.budget_s = budget_s
        done = ", ".join(self.completed) if self.completed else "nothing"
        super().__init__(
            f"time budget of {budget_s:.1f}s exceeded after {elapsed_s:.1f}s before {what!r}; completed: {done}"
        )


class BudgetGuard:
    """A wall-clock budget that long experiments check between steps.

    The clock starts at construction. Call ``guard.check("step name")`` before each step: it raises
    `BudgetExceeded` (carrying the names of the steps already checked, i.e. completed) once the budget is spent,
    and otherwise records the name.

    Args:
        budget_s: Budget in seconds; ``None`` means unlimited (never exceeded).
        clock: Zero-argument callable returning seconds; `time.perf_counter` by default.
    """

    def __init__(self, budget_s: float | None, *, clock: Clock | None = None) -> None:
        if budget_s is not None and not budget_s >= 0:
            raise ValueError(f"budget_s must be >= 0 or None, got {budget_s!r}")
        self.budget_s = budget_s
        self._clock: Clock = clock or time.perf_counter
        self._start = self._clock()
        self._completed: list[str] = []

    @property
    def completed(self) -> list[str]:
        """Names passed to successful `check` calls, in order (a copy)."""
        return list(self._completed)

    def elapsed(self) -> float:
        """Seconds since the guard was created."""
        return self._clock() - self._start

    def remaining(self) -> float:
        """Seconds left (never negative); ``math.inf`` when the budget is unlimited."""
        if self.budget_s is None:
            return math.inf
        return max(0.0, self.budget_s - self.elapsed())

    def exceeded(self) -> bool:
        """Whether the budget is spent (elapsed >= budget)."""
        return self.budget_s is not None and self.elapsed() >= self.budget_s

    def check(self, what: str) -> None:
        """Raise `BudgetExceeded` if the budget is spent, else record `what` as started.

        Args:
            what: Name of the step about to start.
        """
        elapsed = self.elapsed()
        if self.budget_s is not None and elapsed >= self.budget_s:
            raise BudgetExceeded(what, self._completed, elapsed, self.budget_s)
        self._completed.append(what)


# ----------------------------------------------------------------------------------------------------------------
# fair timing protocol
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimingStats:
    """Per-call seconds of one candidate: median and interquartile range over the timed rounds."""

    median: float
    q25: float
    q75: float
    n: int

    def to_dict(self) -> dict[str, Any]:
        return {"median": _jsonable(self.median), "q25": _jsonable(self.q25), "q75": _jsonable(self.q75), "n": self.n}


@dataclass(frozen=True)
class SpeedupStats:
    """Speedup of one candidate over the baseline: median and IQR of the per-round ratios baseline/method."""

    median: float
    q25: float
    q75: float
    n: int

    def to_dict(self) -> dict[str, Any]:
        return {"median": _jsonable(self.median), "q25": _jsonable(self.q25), "q75": _jsonable(self.q75), "n": self.n}


@dataclass
class TimingReport:
    """Result of `compare_timings`.

    Attributes:
        baseline: Name of the baseline (the first key of `fns`).
        names: Candidate names in the order given.
        times: Per-call seconds per name, in round order.
        rounds: The call order of each timed round (records the interleaving).
        stats: Median/IQR of per-call seconds per name.
        speedups: Per non-baseline name, median/IQR of per-round ``baseline_time / method_time``.
        repeats: Timed rounds.
        warmup: Untimed warm-up calls per name.
        threads: Torch intra-op threads during the run (``None`` when torch is not installed).
        loadavg_before: ``os.getloadavg()`` before the run (``None`` where unavailable).
        loadavg_after: ``os.getloadavg()`` after the run.
        cpu_count: CPUs this process may use.
        contended: Whether the 1-minute load average (max of before/after) exceeded `cpu_count`: then other work
            competed for the CPUs and the numbers are suspect.
    """

    baseline: str
    names: list[str]
    times: dict[str, list[float]]
    rounds: list[list[str]]
    stats: dict[str, TimingStats]
    speedups: dict[str, SpeedupStats]
    repeats: int
    warmup: int
    threads: int | None
    loadavg_before: tuple[float, float, float] | None
    loadavg_after: tuple[float, float, float] | None
    cpu_count: int
    contended: bool
    extra: dict[str, Any] = field(default_factory=dict)

    def speedup(self, name: str) -> float:
        """Median speedup of `name` over the baseline (1.0 for the baseline itself).

        Args:
            name: A candidate name.
        """
        if name == self.baseline:
            return 1.0
        if name not in self.speedups:
            raise KeyError(f"unknown timing candidate {name!r}; known: {self.names}")
        return self.speedups[name].median

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (non-finite floats become ``None``)."""
        return {
            "baseline": self.baseline,
            "names": list(self.names),
            "times": {k: [_jsonable(x) for x in v] for k, v in self.times.items()},
            "rounds": [list(r) for r in self.rounds],
            "stats": {k: v.to_dict() for k, v in self.stats.items()},
            "speedups": {k: v.to_dict() for k, v in self.speedups.items()},
            "repeats": self.repeats,
            "warmup": self.warmup,
            "threads": self.threads,
            "loadavg_before": list(self.loadavg_before) if self.loadavg_before is not None else None,
            "loadavg_after": list(self.loadavg_after) if self.loadavg_after is not None else None,
            "cpu_count": self.cpu_count,
            "contended": self.contended,
            "extra": dict(self.extra),
        }

    def summary(self) -> str:
        """A few human-readable lines: median [IQR] per name and speedups over the baseline."""
        lines = []
        for name in self.names:
            s = self.stats[name]
            line = f"{name}: {s.median * 1e3:.2f} ms [{s.q25 * 1e3:.2f}, {s.q75 * 1e3:.2f}] (n={s.n})"
            if name in self.speedups:
                sp = self.speedups[name]
                line += f", speedup x{sp.median:.3f} [{sp.q25:.3f}, {sp.q75:.3f}] vs {self.baseline}"
            lines.append(line)
        lines.append(f"threads={self.threads} cpu_count={self.cpu_count} contended={self.contended}")
        return "\n".join(lines)


def _jsonable(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    arr = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):  # inf ratios (zero durations) interpolate to nan/inf: fine, reported as None
        q25, med, q75 = np.percentile(arr, [25.0, 50.0, 75.0])
    return float(med), float(q25), float(q75)


def _ratio(base: float, method: float) -> float:
    # A zero duration only happens with a coarse or fake clock; keep the arithmetic defined instead of raising.
    if method > 0:
        return base / method
    return math.inf if base > 0 else math.nan


def _loadavg() -> tuple[float, float, float] | None:
    try:
        return tuple(float(x) for x in os.getloadavg())  # type: ignore[return-value]
    except (AttributeError, OSError):  # not available on Windows
        return None


def _cpu_count() -> int:
    # The affinity mask is what this process can actually use (containers, taskset); cpu_count() is the host's.
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def compare_timings(
    fns: Mapping[str, Callable[[], Any]],
    *,
    repeats: int = 5,
    warmup: int = MIN_WARMUP,
    threads: int | None = None,
    sync: Callable[[], Any] | None = None,
    clock: Clock | None = None,
) -> TimingReport:
    """Time several callables fairly against the first one (the baseline).

    Protocol: in this process, `warmup` untimed interleaved rounds, then `repeats` timed rounds. Round ``r`` calls
    the candidates in the given order rotated by ``r`` (A B C, B C A, C A B, ...), so no candidate always runs first
    or right after the same neighbour. Each call is timed alone: ``clock()`` before, the call, ``sync()`` if given
    (e.g. ``torch.cuda.synchronize`` so asynchronous work is counted), ``clock()`` after.

    Reported per name: median and IQR (25th/75th percentiles, linear interpolation) of per-call seconds, and n. Per
    non-baseline name: the median and IQR over rounds of ``baseline_time[r] / method_time[r]`` (> 1 means faster
    than the baseline).

    Args:
        fns: Name -> zero-argument callable, in order; the first is the baseline. At least one.
        repeats: Timed rounds (>= 1).
        warmup: Untimed warm-up calls per name (>= 2, the protocol's minimum).
        threads: If given, torch intra-op threads for the run, restored afterwards (requires torch).
        sync: Called after every call inside the timed region, and before each timed call outside it.
        clock: Zero-argument callable returning seconds; `time.perf_counter` by default (tests inject a fake one).

    Returns:
        A `TimingReport`.
    """
    names = list(fns)
    if not names:
        raise ValueError("compare_timings needs at least one callable")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warmup < MIN_WARMUP:
        raise ValueError(f"the fair timing protocol needs >= {MIN_WARMUP} warm-up calls per callable, got {warmup}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1 or None, got {threads}")
    clock = clock or time.perf_counter
    torch = _torch()
    if threads is not None and torch is None:
        raise RuntimeError("compare_timings(threads=...) sets torch threads, but torch is not installed")

    k = len(names)
    times: dict[str, list[float]] = {name: [] for name in names}
    rounds: list[list[str]] = []
    load_before = _loadavg()
    previous_threads = torch.get_num_threads() if torch is not None else None
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        used_threads = torch.get_num_threads() if torch is not None else None
        for w in range(warmup):
            for i in range(k):
                fns[names[(i + w) % k]]()
                if sync is not None:
                    sync()
        for r in range(repeats):
            order = [names[(i + r) % k] for i in range(k)]
            rounds.append(order)
            for name in order:
                fn = fns[name]
                if sync is not None:
                    sync()  # drain work queued by the previous call so it is not billed to this one
                t0 = clock()
                fn()
                if sync is not None:
                    sync()
                times[name].append(clock() - t0)
    finally:
        if threads is not None and previous_threads is not None:
            torch.set_num_threads(previous_threads)
    load_after = _loadavg()

    stats = {}
    for name in names:
        med, q25, q75 = _quartiles(times[name])
        stats[name] = TimingStats(median=med, q25=q25, q75=q75, n=len(times[name]))
    baseline = names[0]
    speedups = {}
    for name in names[1:]:
        ratios = [_ratio(b, m) for b, m in zip(times[baseline], times[name])]
        med, q25, q75 = _quartiles(ratios)
        speedups[name] = SpeedupStats(median=med, q25=q25, q75=q75, n=len(ratios))
    cpus = _cpu_count()
    loads = [x[0] for x in (load_before, load_after) if x is not None]
    return TimingReport(
        baseline=baseline,
        names=names,
        times=times,
        rounds=rounds,
        stats=stats,
        speedups=speedups,
        repeats=repeats,
        warmup=warmup,
        threads=used_threads,
        loadavg_before=load_before,
        loadavg_after=load_after,
        cpu_count=cpus,
        contended=bool(loads) and max(loads) > cpus,
    )


__all__ = [
    "BudgetExceeded",
    "BudgetGuard",
    "SpeedupStats",
    "Timer",
    "TimingReport",
    "TimingStats",
    "compare_timings",
]
