"""`lmlab bench suite`: paired ratios, interleaving, contention flags, the results schema and --only."""

from __future__ import annotations

import json
import sys
import types

import pytest

from lmlab import bench_suite as bs
from lmlab.bench_suite import Benchmark, SuiteContext
from lmlab.cli import main
from lmlab.errors import UsageError


@pytest.fixture
def quiet_machine(monkeypatch):
    """A machine with no load and no /proc/stat, and a read-bandwidth figure that costs nothing to take."""
    monkeypatch.setattr(bs, "_loadavg", lambda: (0.1, 0.1, 0.1))
    monkeypatch.setattr(bs, "_cpu_busy_s", lambda: None)
    monkeypatch.setattr(bs, "read_bandwidth", lambda **kw: 1e10)


class FakeClock:
    """`time.perf_counter` for bench_suite: advances only when a fake side 'works'."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def _fake_pair(clock: FakeClock, base_s: list[float], method_s: list[float], calls: list[str]) -> Benchmark:
    """Baseline / method whose i-th call (warm-up included) takes base_s[i] / method_s[i] fake seconds."""

    def side(name: str, durations: list[float]):
        it = iter(durations)

        def call(state):
            calls.append(name)
            clock.now += next(it)
            return {"work": 1.0 if name == "m" else 2.0}

        return call

    return Benchmark("half", side("m", method_s), baseline=side("b", base_s), method_name="m", baseline_name="b",
                     rounds=3)  # fmt: skip


def test_speedup_is_the_median_of_per_pair_ratios(quiet_machine, monkeypatch):
    clock, calls = FakeClock(), []
    monkeypatch.setattr(bs, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    # warm-up first (untimed), then 3 rounds: per-pair ratios 2, 4, 1 -> median 2 (the ratio of medians is 4)
    bench = _fake_pair(clock, [9.0, 2.0, 4.0, 10.0], [9.0, 1.0, 1.0, 10.0], calls)
    row = bs.run_benchmark(bench, SuiteContext(), row_id="fake.half")
    assert row["sides"]["b"]["wall_s"] == [2.0, 4.0, 10.0] and row["sides"]["m"]["wall_s"] == [1.0, 1.0, 10.0]
    assert row["speedup"] == 2.0
    assert row["sides"]["b"]["median_wall_s"] / row["sides"]["m"]["median_wall_s"] == 4.0
    assert row["ratios"] == {"work": 0.5}  # method / baseline of the numbers the sides return
    assert row["sides"]["m"]["medians"] == {"work": 1.0}
    assert bs.paired_ratio([2, 4, 10], [1, 1, 10]) == 2.0
    with pytest.raises(ValueError, match="as many"):
        bs.paired_ratio([1.0], [1.0, 2.0])


def test_a_method_doing_half_the_work_is_faster(quiet_machine):
    def work(n: int):
        def call(state):
            sum(i * i for i in range(n))

        return call

    bench = Benchmark("half", work(100_000), baseline=work(200_000), rounds=7)
    row = bs.run_benchmark(bench, SuiteContext())
    assert row["speedup"] > 1.2, row["speedup"]  # ~2 on a quiet machine; paired, so contention hits both sides
    assert len(row["sides"]["method"]["wall_s"]) == len(row["sides"]["baseline"]["wall_s"]) == 7


def test_rounds_alternate_the_order(quiet_machine, monkeypatch):
    clock, calls = FakeClock(), []
    monkeypatch.setattr(bs, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    bench = _fake_pair(clock, [1.0] * 6, [1.0] * 6, calls)
    row = bs.run_benchmark(bench, SuiteContext(rounds=5))
    assert row["rounds"] == 5
    assert row["orders"] == [["b", "m"], ["m", "b"], ["b", "m"], ["m", "b"], ["b", "m"]]
    assert calls == ["b", "m"] + ["b", "m", "m", "b", "b", "m", "m", "b", "b", "m"]  # warm-up, then the rounds


def test_a_loaded_machine_flags_the_row(quiet_machine, monkeypatch):
    bench = Benchmark("noop", lambda state: None, rounds=1)
    assert bs.run_benchmark(bench, SuiteContext())["contended"] is False
    monkeypatch.setattr(bs, "_loadavg", lambda: (2.5, 1.0, 0.5))
    row = bs.run_benchmark(bench, SuiteContext())
    assert row["contended"] is True and row["loadavg_before"] == [2.5, 1.0, 0.5]
    assert any("1-minute load 2.50" in r for r in row["contention_reasons"])
    assert bs.contention_reasons((0.0, 0, 0), other_cores=1.0)  # other processes' CPU time alone flags it too
    assert bs.contention_reasons((0.0, 0, 0), other_cores=0.1) == []


def _fake_rows(monkeypatch):
    rows = {
        "fake.half": Benchmark("half", lambda s: {"x": 1}, baseline=lambda s: {"x": 2}, rounds=2),
        "fake.other": Benchmark("other", lambda s: None, rounds=2),
        "more.skip": Benchmark("skip", lambda s: None, setup=lambda ctx: (_ for _ in ()).throw(bs.Skip("no GGUF"))),
        "more.boom": Benchmark("boom", lambda s: 1 / 0),
    }
    monkeypatch.setattr(bs, "discover", lambda: dict(rows))
    return rows


def test_results_json_schema(quiet_machine, monkeypatch, tmp_path):
    _fake_rows(monkeypatch)
    report = bs.run_suite(out=tmp_path / "b", log=lambda m: None)
    data = json.loads((tmp_path / "b" / "results.json").read_text())
    assert (tmp_path / "b" / "report.md").read_text().startswith("# lmlab bench suite")
    assert {"created", "total_s", "model", "rounds", "threads", "cpu_count", "torch", "read_bandwidth_gb_s_samples",
            "measured", "contended", "rows"} <= set(data)  # fmt: skip
    assert report["folder"] == str(tmp_path / "b")
    rows = {r["id"]: r for r in data["rows"]}
    assert list(rows) == ["fake.half", "fake.other", "more.skip", "more.boom"]
    half = rows["fake.half"]
    keys = {"description", "ceiling", "rounds", "orders", "sides", "speedup", "ratios", "loadavg_before",
            "loadavg_after", "other_processes_cores", "contended", "contention_reasons", "seconds"}  # fmt: skip
    assert keys <= set(half)
    assert set(half["sides"]) == {"baseline", "method"} and half["ratios"] == {"x": 0.5}
    assert {"wall_s", "median_wall_s", "medians"} == set(half["sides"]["method"])
    assert "speedup" not in rows["fake.other"]  # no baseline, no ratio
    assert rows["more.skip"] == {"id": "more.skip", "skipped": "no GGUF"}
    assert rows["more.boom"]["error"] == "ZeroDivisionError: division by zero"


def test_only_filters_and_the_cli_writes_the_folder(quiet_machine, monkeypatch, tmp_path, capsys):
    rows = _fake_rows(monkeypatch)
    assert bs.select(rows, None) == list(rows)
    assert bs.select(rows, ["fake"]) == ["fake.half", "fake.other"]  # a prefix up to a dot
    assert bs.select(rows, ["more.skip", "fake.half", "more.skip"]) == ["more.skip", "fake.half"]
    with pytest.raises(UsageError, match="unknown benchmark 'fa'"):
        bs.select(rows, ["fa"])  # not a whole dotted component
    assert main(["bench", "suite", "--only", "fake", "--rounds", "2", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    data = json.loads((tmp_path / "o" / "results.json").read_text())
    assert [r["id"] for r in data["rows"]] == ["fake.half", "fake.other"] and data["rounds"] == 2
    assert all(r["rounds"] == 2 for r in data["rows"])
    assert "fake.half" in out and "more.boom" not in out
    assert main(["bench", "suite", "--only", "more", "--out", str(tmp_path / "p")]) == 1  # a row failed


@pytest.mark.parametrize(("argv", "needle"), [
    (["--only", "core.matmul", "nope.row"], "unknown benchmark 'nope.row'"),
    (["--rounds", "0"], "--rounds must be >= 1, got 0"),
])  # fmt: skip
def test_bad_arguments_are_one_line_errors(argv, needle, capsys, tmp_path):
    assert main(["bench", "suite", *argv, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lmlab: error: ") and needle in err[0], err
    assert not (tmp_path / "x").exists()


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "suite", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert all(opt in out for opt in ("--only", "--rounds", "--out", "--model"))


def test_method_packages_declare_rows_in_a_bench_module(monkeypatch):
    import lmlab.registry

    spec = types.SimpleNamespace(id="fakemethod", module="lmlab_fake_method_pkg")
    mod = types.ModuleType("lmlab_fake_method_pkg.bench")
    mod.BENCHMARKS = [Benchmark("speed", lambda s: None)]
    monkeypatch.setitem(sys.modules, "lmlab_fake_method_pkg.bench", mod)
    missing = types.SimpleNamespace(id="nobench", module="lmlab.methods.decoding.reflection_window")  # no bench.py
    monkeypatch.setattr(lmlab.registry, "list_methods", lambda: [spec, missing])
    rows = bs.discover()
    assert rows["fakemethod.speed"] is mod.BENCHMARKS[0]
    assert [i for i in rows if i.startswith("core.")] == [b.name for b in bs.CORE_BENCHMARKS]
    assert not any(i.startswith("nobench.") for i in rows)


def test_the_bf16_prefill_row_on_a_tiny_model(quiet_machine, tmp_path):
    report = bs.run_suite(["core.prefill_bf16", "core.model_load"], rounds=1, model="tiny-llama", out=tmp_path,
                          log=lambda m: None)  # fmt: skip
    prefill, load = report["rows"]
    assert set(prefill["sides"]) == {"fp32", "bf16"} and prefill["speedup"] > 0
    assert prefill["check"]["n_windows"] == 2 and 0.5 <= prefill["check"]["top1_agreement"] <= 1.0
    assert load["skipped"].startswith("tiny-llama has no GGUF file")
