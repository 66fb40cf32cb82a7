"""Invariants of SWIFTCODE: candidate code runs only in the sandbox (a hostile candidate is contained), correctness
comes before efficiency, the selection rule picks the fastest within the margin then the leanest, deterministic
line-event costs, NET / NMU, code extraction, and one-line errors for bad input."""

from __future__ import annotations

import builtins
import math
import os
import textwrap
from pathlib import Path

import numpy as np
import pytest

from lmlab.core.execution.sandbox import sandbox_available
from lmlab.methods.alignment.swiftcode import method as M
from lmlab.methods.alignment.swiftcode.tasks import FAMILIES, build_tasks

AVAILABLE, WHY = sandbox_available("unshare")
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
REPO = Path(__file__).resolve().parents[2]
needs_sandbox = pytest.mark.skipif(not AVAILABLE, reason=f"no sandbox on this machine: {WHY}")
needs_root = pytest.mark.skipif(not IS_ROOT, reason="file containment needs the uid drop (root); CI runs as root")
LINES = M.MeasureSettings(timing="lines", timeout_s=5.0)


def _task(family: str, scale: float = 0.2, seed: int = 0):
    train, _ = build_tasks([family], 1, 0, seed=seed, stress_scale=scale)
    return train[0]


def _m(time: float, mem: int | None, status: str = "correct", code_len: int = 10) -> M.Measurement:
    return M.Measurement("t", status, time=time if status == "correct" else math.inf, peak_bytes=mem,
                         code_len=code_len)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# candidate code runs only in the sandbox


@needs_sandbox
@needs_root
def test_a_hostile_candidate_that_writes_outside_scratch_is_contained(tmp_path):
    task = _task("pair_sum")
    targets = [REPO / "swiftcode_pwned.txt", tmp_path / "pwned.txt", Path("/etc/swiftcode_pwned"),
               Path.home() / "swiftcode_pwned"]  # fmt: skip
    os.chmod(tmp_path, 0o700)  # a folder of the parent's user, like the repository
    hostile = textwrap.dedent(
        f"""
        import builtins, os
        builtins.SWIFTCODE_PWNED = True           # would leak into the parent if the code ran in-process
        os.environ["SWIFTCODE_PWNED"] = "1"
        for path in {[str(p) for p in targets]!r}:
            try:
                with open(path, "w") as f:
                    f.write("pwned")
            except OSError:
                pass

        def {task.entry_point}(nums, k):
            seen = {{}}
            count = 0
            for x in nums:
                count += seen.get(k - x, 0)
                seen[x] = seen.get(x, 0) + 1
            return count
        """
    )
    before = set(os.listdir(os.getcwd()))
    ms = M.measure_many([(task, hostile), (task, task.canonical)], LINES)
    assert ms[0].status == "correct", ms[0].reason  # it ran (in the sandbox) and its function is right
    for p in targets:
        assert not p.exists(), f"the candidate wrote {p}"
    assert not hasattr(builtins, "SWIFTCODE_PWNED") and "SWIFTCODE_PWNED" not in os.environ
    assert set(os.listdir(os.getcwd())) == before
    assert ms[0].time == ms[1].time  # same program text after its side effects: the same deterministic cost


@needs_sandbox
def test_model_code_never_runs_in_process(monkeypatch):
    """Nothing in measure_many / swiftcode_select calls exec, eval or compile on candidate code in this process."""
    task = _task("fibonacci")
    calls = []
    for name in ("exec", "eval", "compile"):
        real = getattr(builtins, name)

        def spy(*a, _real=real, _name=name, **kw):
            calls.append(_name)
            return _real(*a, **kw)

        monkeypatch.setattr(builtins, name, spy)
    bomb = f"raise SystemExit('ran in-process')\ndef {task.entry_point}(n):\n    return n\n"
    sel = M.swiftcode_select([task], [[M.Candidate(task.id, "llm:x", "s0", bomb),
                                       *M.template_candidates(task, FAMILIES["fibonacci"])]], LINES)  # fmt: skip
    monkeypatch.undo()
    assert sel[0].measurements[0].status == "runtime_error"
    assert not calls


def test_refused_without_a_sandbox(monkeypatch):
    from lmlab.core.execution import sandbox

    monkeypatch.setattr(sandbox, "_which", lambda name: None)  # no unshare / setpriv on PATH
    task = _task("fibonacci")
    ms = M.measure_many([(task, task.canonical)], LINES)
    assert ms[0].status == "refused" and not ms[0].correct


# ---------------------------------------------------------------------------------------------------------------
# correctness first, then efficiency (sandbox)


@needs_sandbox
def test_bank_statuses_costs_and_selection_on_pure_python_families():
    for family in ("pair_sum", "fibonacci", "max_subarray"):
        task = _task(family)
        cands = M.template_candidates(task, FAMILIES[family])
        sel = M.swiftcode_select([task], [cands], LINES)[0]
        by_kind: dict[str, list[M.Measurement]] = {}
        for c, m in zip(cands, sel.measurements):
            by_kind.setdefault(c.kind, []).append(m)
            assert m.times[0] == m.times[-1] if m.times else True  # line events: exact across sandbox runs
        assert all(m.status == "wrong_answer" for m in by_kind["buggy"])
        assert all(m.correct and m.timed for m in by_kind["fast"] + by_kind["slow"])
        assert max(m.time for m in by_kind["fast"]) * 10 < min(m.time for m in by_kind["slow"])
        assert sel.kept.kind == "fast" and sel.measurements[sel.chosen].correct
        assert all(len(m.times) == LINES.runs for m in by_kind["fast"])


def test_the_bank_has_enough_families_for_the_clustered_net_check_and_the_default_uses_them_all():
    """The NET claim's CI resamples families and needs >= 6 solved by both SFT systems; with 8 families only 3
    qualified (2026-12-07), so the bank has 16 and the default preset runs every one, 3 training / 4 held-out each."""
    from lmlab.methods.alignment.swiftcode.config import SwiftCodeConfig
    from lmlab.methods.alignment.swiftcode.tasks import HELD_OUT_NAMES, KINDS

    assert len(FAMILIES) >= 16
    cfg = SwiftCodeConfig()
    assert cfg.families == list(FAMILIES)
    assert cfg.n_train == 3 * len(FAMILIES) and cfg.n_eval in (3 * len(FAMILIES), 4 * len(FAMILIES))
    train, test = build_tasks(cfg.families, cfg.n_train, cfg.n_eval, seed=0)
    for split, per in ((train, 3), (test, cfg.n_eval // len(FAMILIES))):
        assert {f: sum(t.family == f for t in split) for f in FAMILIES} == dict.fromkeys(FAMILIES, per)
    names = [n for f in FAMILIES.values() for n in f.func_names]
    assert len(names) == len(set(names))  # a held-out name of one family is no training name of another
    held_out = {n for f in FAMILIES.values() for n in f.func_names[-HELD_OUT_NAMES:]}
    assert held_out.isdisjoint(t.entry_point for t in train) and {t.entry_point for t in test} <= held_out
    for fam in FAMILIES.values():
        kinds = [v.kind for v in fam.variants]
        assert set(kinds) <= set(KINDS) and kinds.count("fast") >= 2 and kinds.count("slow") >= 1
        assert kinds.count("buggy") >= 1 and fam.canonical is fam.variants[0]
        assert len(fam.func_names) > HELD_OUT_NAMES and len(fam.arg_names) >= 1 and len(fam.wordings) >= 1
        assert all(len(a) == fam.arity for a in fam.arg_names)


@needs_sandbox
def test_every_bank_variant_is_what_its_label_says_in_the_sandbox():
    """For every family at the full stress size, in the sandbox: fast and slow variants are correct, buggy ones fail
    a small test, and every slow idiom is slower than every fast one and at least 5x slower than the canonical
    solution (quiet gaps: 10x to 10^4x; the margins leave room for timing noise under load)."""
    wall = M.MeasureSettings(timing="wall", runs=1, repeat=3)
    tasks, cands = [], []
    for family in FAMILIES:
        task = _task(family, scale=1.0, seed=1)
        tasks.append(task)
        cands.append(M.template_candidates(task, FAMILIES[family]))
    ms = M.measure_many([(t, c.code) for t, cs in zip(tasks, cands) for c in cs], wall)
    k = 0
    for task, cs in zip(tasks, cands):
        mine, k = ms[k : k + len(cs)], k + len(cs)
        by_kind: dict[str, list[float]] = {}
        canonical = next(m for c, m in zip(cs, mine) if c.code == task.canonical)
        for c, m in zip(cs, mine):
            if c.kind == "buggy":
                assert m.status == "wrong_answer" and "small test" in m.reason, (task.family, c.name, m.reason)
            else:
                assert m.status == "correct", (task.family, c.name, m.status, m.reason)
                by_kind.setdefault(c.kind, []).append(m.time)
        assert max(by_kind["fast"]) < min(by_kind["slow"]), (task.family, by_kind)
        assert 5 * canonical.time < min(by_kind["slow"]), (task.family, canonical.time, by_kind)


@needs_sandbox
def test_fast_but_wrong_on_the_stress_input_is_incorrect_and_slow_is_over_limit_not_wrong():
    task = _task("pair_sum", scale=1.0)
    cheat = textwrap.dedent(
        f"""
        def {task.entry_point}(nums, k):
            if len(nums) > 50:
                return 0          # passes every small test, wrong on the stress input
            return sum(1 for i in range(len(nums)) for j in range(i + 1, len(nums)) if nums[i] + nums[j] == k)
        """
    )
    slow = task.render(FAMILIES["pair_sum"].variant("double_loop"))
    wall = M.MeasureSettings(timing="wall", timeout_s=1.0, repeat=30)  # 30 x ~50 ms: over the 1 s limit
    ms = M.measure_many([(task, cheat), (task, slow), (task, None), (task, "def nope(:\n")], wall)
    assert ms[0].status == "wrong_answer" and not ms[0].correct
    assert ms[1].status == "over_limit" and ms[1].correct and not ms[1].timed
    assert ms[2].status == "no_code"
    assert ms[3].status == "runtime_error"  # a syntax error, found by the sandboxed interpreter
    assert M.select_most_efficient(ms) == 1  # correct but over the limit beats every incorrect one


@needs_sandbox
def test_wall_timing_is_min_over_runs_and_net_of_the_canonical_is_one():
    task = _task("dedupe", scale=0.5)
    wall = M.MeasureSettings(timing="wall", runs=2, repeat=2)
    canon, slow = M.measure_many([(task, task.canonical), (task, task.render(FAMILIES["dedupe"].variant(
        "list_membership")))], wall)  # fmt: skip
    assert len(canon.times) == 2 and canon.time == min(canon.times)
    assert canon.ratios(canon)[0] == 1.0 and canon.ratios(canon)[1] == 1.0
    net, nmu = slow.ratios(canon)
    assert net > 1.0 and math.isfinite(nmu)


# ---------------------------------------------------------------------------------------------------------------
# the selection rule


def test_lexicographic_rule_margin_then_memory_then_length():
    # 1.0 and 1.4 tie within 1.5x: the leaner wins; 2.0 is out of the tie set despite the least memory
    ms = [_m(1.0, 500), _m(1.4, 100), _m(2.0, 1), _m(0.1, 1, status="wrong_answer")]
    assert M.select_most_efficient(ms) == 1
    assert M.select_most_efficient(ms, time_margin=1.0) == 0  # no tie: the fastest
    assert M.select_most_efficient(ms, time_margin=2.0) == 2
    # equal memory: the shorter program, then the earlier
    assert M.select_most_efficient([_m(1.0, 5, code_len=30), _m(1.2, 5, code_len=20)]) == 1
    assert M.select_most_efficient([_m(1.0, 5), _m(1.0, 5)]) == 0
    assert M.select_most_efficient([_m(1, 1, status="wrong_answer"), _m(1, 1, status="runtime_error")]) is None
    assert M.select_most_efficient([_m(0, 0, status="over_limit", code_len=9), _m(0, 0, status="over_limit",
                                                                                  code_len=3)]) == 1  # fmt: skip


def test_combined_rule_minimises_time_times_memory():
    ms = [_m(1.0, 100), _m(3.0, 10), _m(0.5, 1000)]
    assert M.select_most_efficient(ms, rule="combined") == 1
    assert M.select_most_efficient(ms, rule="lexicographic") == 2  # the fastest: 1.0 is outside 1.5 x 0.5


def test_selection_invariants_on_random_pools():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 8))
        statuses = rng.choice(["correct", "correct", "wrong_answer", "over_limit", "runtime_error"], size=n)
        ms = [_m(float(rng.uniform(0.1, 5)), int(rng.integers(1, 100)), str(s), int(rng.integers(1, 50)))
              for s in statuses]  # fmt: skip
        margin = float(rng.uniform(1.0, 3.0))
        i = M.select_most_efficient(ms, time_margin=margin)
        if not any(m.correct for m in ms):
            assert i is None
            continue
        assert ms[i].correct
        timed = [m for m in ms if m.timed]
        if timed:
            best = min(m.time for m in timed)
            assert ms[i].timed and ms[i].time <= margin * best
            ties = [m for m in timed if m.time <= margin * best]
            assert ms[i].peak_bytes == min(m.peak_bytes for m in ties)
        j = M.select_random_correct(ms, np.random.default_rng(1))
        assert ms[j].correct
        k = M.select_slowest_correct(ms)
        assert ms[k].correct and (ms[k].status == "over_limit" or ms[k].time == max(m.time for m in timed))


def test_random_correct_is_uniform_over_correct_candidates():
    ms = [_m(1, 1), _m(1, 1, status="wrong_answer"), _m(2, 1), _m(0, 0, status="over_limit")]
    rng = np.random.default_rng(0)
    picks = np.bincount([M.select_random_correct(ms, rng) for _ in range(3000)], minlength=4)
    assert picks[1] == 0 and all(abs(picks[j] / 3000 - 1 / 3) < 0.04 for j in (0, 2, 3))


@pytest.mark.parametrize(("kw", "needle"), [({"rule": "fastest"}, "rule"), ({"time_margin": 0.5}, "time_margin"),
                                            ({"time_margin": math.inf}, "time_margin")])  # fmt: skip
def test_bad_rule_or_margin_is_a_one_line_error(kw, needle):
    with pytest.raises(ValueError, match=needle) as e:
        M.select_most_efficient([_m(1, 1)], **kw)
    assert "\n" not in str(e.value)


def test_bad_settings_and_inputs():
    with pytest.raises(ValueError, match="timing"):
        M.MeasureSettings(timing="cpu")
    with pytest.raises(ValueError, match="runs"):
        M.MeasureSettings(runs=0)
    with pytest.raises(ValueError, match="one list per task"):
        M.swiftcode_select([_task("fibonacci")], [])
    with pytest.raises(ValueError, match="tasks is empty"):
        M.swiftcode_select([], [])
    with pytest.raises(ValueError, match="template kinds"):
        M.template_candidates(_task("fibonacci"), FAMILIES["fibonacci"], ["medium"])


# ---------------------------------------------------------------------------------------------------------------
# parsing model answers (string handling only)


def test_extract_code_cuts_at_the_fence_and_needs_the_entry_point():
    body = "def fib(n):\n    return n\n"
    assert M.extract_code(body + "```\nmore text", "fib") == body
    assert M.extract_code("Sure!\n```python\n" + body + "```", "fib") == body
    assert M.extract_code("def other(n):\n    return n\n```", "fib") is None
    assert M.extract_code("", "fib") is None


def test_dedupe_by_normalised_ast_keeps_distinct_programs():
    a = "def f(x):\n    return x + 1\n"
    b = "def f(x):\n    # a comment\n    return (x + 1)\n"
    c = "def f(x):\n    return x + 2\n"
    cands = [M.Candidate("t", "template", str(i), code) for i, code in enumerate([a, b, c, None, "def f(:"])]
    assert [x.name for x in M.dedupe_candidates(cands)] == ["0", "2", "3", "4"]
    assert M.normalized_ast("def f(:") is None


def test_ratios_are_nan_for_unsolved_or_unmeasured():
    canon = _m(2.0, 99)
    assert _m(4.0, 199).ratios(canon) == (2.0, 2.0)
    assert all(math.isnan(v) for v in _m(1.0, 1, status="wrong_answer").ratios(canon))
    assert all(math.isnan(v) for v in _m(0, 0, status="over_limit").ratios(canon))
    net, nmu = _m(4.0, None).ratios(canon)
    assert net == 2.0 and math.isnan(nmu)


# ---------------------------------------------------------------------------------------------------------------
# config


@pytest.mark.parametrize(
    ("override", "needle"),
    [({"n_train": 0}, "n_train"), ({"families": ["sorting"]}, "families"), ({"families": []}, "families"),
     ({"rule": "best"}, "rule"), ({"time_margin": 0.9}, "time_margin"), ({"systems": ["swiftcode", "base"]},
     "random_correct"), ({"generators": ["gpt4"]}, "generators"), ({"timing": "cpu"}, "timing"),
     ({"template_kinds": ["x"]}, "template_kinds"), ({"stress_scale": 0}, "stress_scale"),
     ({"llm_models": []}, "llm_models")],
)  # fmt: skip
def test_config_rejects_bad_values_with_a_one_line_error(override, needle):
    from lmlab.methods.alignment.swiftcode.config import SwiftCodeConfig

    with pytest.raises(ValueError, match=needle) as e:
        SwiftCodeConfig(**override)
    assert "\n" not in str(e.value)


def test_train_layers_above_the_model_is_refused(tmp_path):
    from lmlab.runner import run_method

    with pytest.raises(ValueError, match="train_layers"):
        run_method("swiftcode", preset="smoke", folder=tmp_path / "r", show_progress=False, raise_errors=True,
                   train_layers=99, generators=["template"])  # fmt: skip


def test_smoke_run_labels_generators_and_gives_every_system_the_same_budget(tmp_path):
    from lmlab.runner import run_method

    r = run_method("swiftcode", preset="smoke", folder=tmp_path / "r", show_progress=False, raise_errors=True,
                   threads=1)  # fmt: skip
    gens = r.flags["generators"]
    assert set(gens) == {"template", "llm:tiny-llama"} and gens["template"]["kept_by_swiftcode"] >= 1
    assert set(r.flags["swiftcode_kept_kinds"]) == {"fast"}  # pure-Python families: line events rank right
    budget = r.flags["sft_budget"]
    assert budget["swiftcode"] == budget["random_correct"]
    for row in r.tables["selection"]:
        assert row["swiftcode_time"] <= row["random_time"]
    assert {c.metric for c in r.claims} >= {"mean_net", "pass_at_1", "train_net"}
