"""Timing: structure and arithmetic of the fair timing protocol, with a fake clock (no wall-clock assertions)."""

from __future__ import annotations

import json
import math

import pytest

from lmlab.core.stats.timing import BudgetExceeded, BudgetGuard, Timer, compare_timings


class FakeClock:
    """A clock that only moves when a fake workload says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _workload(clock: FakeClock, durations: list[float], log: list[str], name: str):
    """A callable that advances the clock by the next duration each call (the same one for warm-ups)."""
    calls = iter(durations)

    def fn() -> None:
        log.append(name)
        clock.advance(next(calls))

    return fn


def test_timer_with_fake_clock():
    clock = FakeClock()
    t = Timer(clock=clock)
    assert t.elapsed == 0.0
    with t:
        clock.advance(1.5)
        assert t.elapsed == 1.5  # live while running
    clock.advance(10.0)
    assert t.elapsed == 1.5  # frozen after exit


def test_timer_real_clock_is_nonnegative():
    with Timer() as t:
        pass
    assert t.elapsed >= 0.0


def test_budget_guard_records_completed_steps_and_raises():
    clock = FakeClock()
    guard = BudgetGuard(10.0, clock=clock)
    assert not guard.exceeded() and guard.remaining() == 10.0
    guard.check("load")
    clock.advance(4.0)
    guard.check("eval")
    clock.advance(6.0)
    assert guard.exceeded() and guard.remaining() == 0.0
    with pytest.raises(BudgetExceeded) as info:
        guard.check("ablation")
    err = info.value
    assert err.what == "ablation" and err.completed == ["load", "eval"]
    assert err.elapsed_s == 10.0 and err.budget_s == 10.0
    assert "ablation" in str(err) and "load, eval" in str(err)
    assert guard.completed == ["load", "eval"]


def test_budget_guard_unlimited():
    clock = FakeClock()
    guard = BudgetGuard(None, clock=clock)
    clock.advance(1e9)
    assert not guard.exceeded() and math.isinf(guard.remaining())
    guard.check("anything")
    with pytest.raises(ValueError):
        BudgetGuard(-1.0)


def test_compare_timings_interleaves_and_rotates():
    clock = FakeClock()
    log: list[str] = []
    fns = {name: _workload(clock, [1.0] * 20, log, name) for name in ("a", "b", "c")}
    report = compare_timings(fns, repeats=4, warmup=2, clock=clock)
    assert report.rounds == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    # warm-ups come first (2 interleaved rounds, also rotated), then exactly the recorded timed order
    assert log[:6] == ["a", "b", "c", "b", "c", "a"]
    assert log[6:] == [name for rnd in report.rounds for name in rnd]
    assert all(len(v) == 4 for v in report.times.values())
    assert report.baseline == "a" and report.names == ["a", "b", "c"]
    assert {k: s.n for k, s in report.stats.items()} == {"a": 4, "b": 4, "c": 4}


def test_compare_timings_median_iqr_and_speedup_arithmetic():
    clock = FakeClock()
    log: list[str] = []
    # durations for 2 warm-ups then 5 timed rounds
    base = [9.0, 9.0, 4.0, 2.0, 8.0, 6.0, 10.0]
    fast = [9.0, 9.0, 1.0, 2.0, 2.0, 1.0, 5.0]
    report = compare_timings(
        {"base": _workload(clock, base, log, "base"), "fast": _workload(clock, fast, log, "fast")},
        repeats=5,
        clock=clock,
    )
    assert report.times == {"base": [4.0, 2.0, 8.0, 6.0, 10.0], "fast": [1.0, 2.0, 2.0, 1.0, 5.0]}
    s = report.stats["base"]
    assert (s.median, s.q25, s.q75, s.n) == (6.0, 4.0, 8.0, 5)
    s = report.stats["fast"]
    assert (s.median, s.q25, s.q75) == (2.0, 1.0, 2.0)
    # per-round ratios base/fast: 4, 1, 4, 6, 2 -> sorted 1, 2, 4, 4, 6
    sp = report.speedups["fast"]
    assert (sp.median, sp.q25, sp.q75, sp.n) == (4.0, 2.0, 4.0, 5)
    assert report.speedup("fast") == 4.0 and report.speedup("base") == 1.0
    with pytest.raises(KeyError):
        report.speedup("nope")


def test_compare_timings_sync_is_called_inside_the_timed_region():
    clock = FakeClock()
    events: list[str] = []

    def fn() -> None:
        events.append("call")

    def sync() -> None:
        events.append("sync")
        clock.advance(0.5)  # pending asynchronous work finishing: must be billed to the call

    report = compare_timings({"x": fn}, repeats=2, warmup=2, sync=sync, clock=clock)
    assert report.times["x"] == [0.5, 0.5]
    assert events == ["call", "sync", "call", "sync"] + ["sync", "call", "sync"] * 2
    assert report.speedups == {}


def test_compare_timings_report_is_json_able_and_records_environment():
    clock = FakeClock()
    log: list[str] = []
    fns = {"a": _workload(clock, [1.0] * 10, log, "a"), "b": _workload(clock, [0.0] * 10, log, "b")}
    report = compare_timings(fns, repeats=3, clock=clock)
    d = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert d["speedups"]["b"]["median"] is None  # infinite ratio (zero duration) is not valid JSON
    assert d["repeats"] == 3 and d["warmup"] == 2 and d["cpu_count"] >= 1
    assert isinstance(d["contended"], bool)
    assert d["loadavg_before"] is None or len(d["loadavg_before"]) == 3
    assert "a:" in report.summary()


def test_compare_timings_threads_are_restored():
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    seen: list[int] = []
    report = compare_timings(
        {"a": lambda: seen.append(torch.get_num_threads())}, repeats=1, threads=1, clock=FakeClock()
    )
    assert set(seen) == {1} and report.threads == 1
    assert torch.get_num_threads() == before


def test_compare_timings_restores_threads_on_error():
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()

    def boom() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        compare_timings({"a": boom}, threads=1)
    assert torch.get_num_threads() == before


def test_compare_timings_validates_protocol():
    with pytest.raises(ValueError, match="warm-up"):
        compare_timings({"a": lambda: None}, warmup=1)
    with pytest.raises(ValueError):
        compare_timings({}, repeats=1)
    with pytest.raises(ValueError):
        compare_timings({"a": lambda: None}, repeats=0)
