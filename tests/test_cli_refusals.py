"""Bad input to `reproduce`, `cache`, `bench`, `prune` and `data` is refused before any work (issue 37).

The common rule (tests/test_bad_input_props.py): a one-line error naming the value and what was expected, exit 2,
no traceback, nothing written. Here every heavy entry point (the grid's executors, the cache builder, the
benchmarks, the model loader) is replaced by a sentinel, so a bad value that slips past validation fails the test
at once, without any work. Such a value shows up as an exit 1 naming the sentinel, not the value, plus a folder
written before the failure.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from lmlab import cli


class _Reached(AssertionError):
    """A bad value got past validation and the work began."""


def _sentinel(name: str):  # noqa: ANN202
    def reached(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise _Reached(f"{name} started with a bad value")

    return reached


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as e:  # argparse's own refusals
            code = e.code if isinstance(e.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def assert_refused(code: int, stdout: str, stderr: str, *names: str) -> str:
    """Exit 2, exactly one error line, naming each of `names`; no traceback."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert code == 2, f"exit {code}; stderr={stderr!r}"
    assert "Traceback" not in stderr + stdout
    assert len(lines) == 1 and "error:" in lines[0], lines
    for name in names:
        assert name in lines[0], f"{name!r} not named in {lines[0]!r}"
    return lines[0]


@pytest.fixture
def blocker(tmp_path) -> Path:
    """A file: a folder under it can never be created."""
    path = tmp_path / "a_file"
    path.write_text("keep me\n")
    return path


# ----------------------------------------------------------------------------------------------------------------
# reproduce: the run overrides are checked before the reproduce folder is written


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--threads", "0"], "threads"),
        (["--threads", "5000"], "threads"),
        (["--limit", "0"], "limit"),
        (["--batch-size", "0"], "batch_size"),
        (["--model", "no-such-model"], "no-such-model"),
    ],
)
def test_reproduce_refuses_bad_overrides_before_writing(tmp_path, monkeypatch, flags, named):
    import lmlab.grid as G

    monkeypatch.setattr(G, "run_local", _sentinel("the grid"))
    monkeypatch.setattr(G, "run_ray", _sentinel("the grid"))
    out = tmp_path / "repro"
    code, so, se = run_cli(["reproduce", "wanda", "--out", str(out), "--no-progress", *flags])
    assert_refused(code, so, se, named, flags[-1])
    assert not out.exists(), sorted(p.name for p in out.iterdir())  # no reproduce.json, grid or report


# ----------------------------------------------------------------------------------------------------------------
# cache build: a negative seed and an --out that cannot be a folder


@pytest.fixture
def no_build(monkeypatch):
    import lmlab.zoo.build as build

    monkeypatch.setattr(build, "build_cache", _sentinel("the cache build"))


def test_cache_build_refuses_a_negative_seed(tmp_path, no_build):
    out = tmp_path / "cache"
    code, so, se = run_cli(["cache", "build", "--seed", "-1", "--out", str(out), "--no-progress"])
    assert_refused(code, so, se, "--seed", "-1")
    assert not out.exists()


def test_cache_build_refuses_an_out_under_a_file(blocker, no_build):
    code, so, se = run_cli(["cache", "build", "--out", str(blocker / "cache"), "--no-progress"])
    assert_refused(code, so, se, "--out", str(blocker))
    assert blocker.read_text() == "keep me\n"


def test_cache_build_refuses_an_out_that_is_a_file(blocker, no_build):
    code, so, se = run_cli(["cache", "build", "--out", str(blocker), "--no-progress"])
    assert_refused(code, so, se, "--out", str(blocker))


# ----------------------------------------------------------------------------------------------------------------
# bench: threads, a non-finite time limit and an unknown model, before the benchmark (and its folder)


@pytest.fixture
def no_bench(monkeypatch):
    import lmlab.bench_decode as decode
    import lmlab.bench_suite as suite
    import lmlab.serve.bench as serve_bench

    monkeypatch.setattr(decode, "bench_decode", _sentinel("the decode bench"))
    monkeypatch.setattr(serve_bench, "bench_serve", _sentinel("the serve bench"))
    monkeypatch.setattr(suite, "run_suite", _sentinel("the bench suite"))


BENCH_BAD = [
    (["bench", "decode", "--threads", "0"], ["--threads", "0"]),
    (["bench", "decode", "--threads", "-3"], ["--threads", "-3"]),
    (["bench", "decode", "--model", "no-such-model"], ["no-such-model"]),
    (["bench", "serve", "--threads", "0"], ["--threads", "0"]),
    (["bench", "serve", "--max-seconds", "nan"], ["--max-seconds", "nan"]),
    (["bench", "serve", "--max-seconds", "inf"], ["--max-seconds", "inf"]),
    (["bench", "serve", "--model", "no-such-model"], ["no-such-model"]),
    (["bench", "suite", "--model", "no-such-model"], ["no-such-model"]),
]


@pytest.mark.parametrize(("argv", "named"), BENCH_BAD, ids=[" ".join(a) for a, _ in BENCH_BAD])
def test_bench_refuses_bad_values_before_running(tmp_path, no_bench, argv, named):
    out = tmp_path / "bench"
    code, so, se = run_cli([*argv, "--out", str(out)])
    assert_refused(code, so, se, *named)
    assert not out.exists()


# ----------------------------------------------------------------------------------------------------------------
# prune: every number is checked before the model loads; a failed write leaves no folder at all


_PRUNE = ["prune", "--model", "tiny-llama", "--n-calib", "4", "--seqlen", "32", "--no-progress"]

PRUNE_BAD = [
    (["--method", "atp", "--beta", "nan"], "--beta nan"),
    (["--method", "atp", "--beta=-inf"], "--beta -inf"),
    (["--method", "owl", "--owl-m", "nan"], "--owl-m nan"),
    (["--method", "owl", "--owl-m", "0"], "--owl-m 0"),
    (["--method", "owl", "--owl-lambda", "-0.1"], "--owl-lambda -0.1"),
    (["--method", "owl", "--owl-lambda", "inf"], "--owl-lambda inf"),
    (["--method", "owl", "--sparsity", "0.7", "--owl-lambda", "0.3"], "--owl-lambda 0.3"),  # a block at 100%
    (["--method", "wanda", "--threads", "0"], "--threads 0"),
    (["--method", "wanda", "--seed", "-1"], "--seed -1"),
]


@pytest.mark.parametrize(("bad", "named"), PRUNE_BAD, ids=[" ".join(b) for b, _ in PRUNE_BAD])
def test_prune_refuses_bad_numbers_before_loading(tmp_path, monkeypatch, bad, named):
    import lmlab.core.inference.models as models

    monkeypatch.setattr(models, "load_model", _sentinel("the model load"))
    out = tmp_path / "x"
    code, so, se = run_cli([*_PRUNE, *bad, "--out", str(out)])
    assert_refused(code, so, se, named)
    assert not out.exists()


def test_failed_prune_write_leaves_no_folder_and_one_line(tmp_path, monkeypatch):
    """A write that fails (a full disk) after the prune: exit 1, one line, and not even the parents it created."""
    import errno

    import lmlab.core.pruning as pruning

    def disk_full(model, tok, folder, **kwargs):  # noqa: ANN001, ANN003, ANN202
        Path(folder).mkdir(parents=True)
        (Path(folder) / "model.safetensors").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pruning, "save_pruned", disk_full)
    out = tmp_path / "new" / "deeper" / "pruned"
    code, so, se = run_cli([*_PRUNE, "--method", "magnitude", "--out", str(out)])
    lines = [ln for ln in se.splitlines() if ln.strip()]
    assert code == 1 and len(lines) == 1, se
    assert "No space left" in lines[0] and str(out) in lines[0] and "Traceback" not in se
    assert sorted(tmp_path.iterdir()) == []  # neither the model folder, its temporary sibling nor new/deeper


# ----------------------------------------------------------------------------------------------------------------
# data show: a --kw that repeats a flag


@pytest.mark.parametrize("key", ["n", "seed", "split"])
def test_data_kw_cannot_repeat_a_flag(key):
    code, so, se = run_cli(["data", "show", "arithmetic", "--kw", f"{key}=3"])
    assert_refused(code, so, se, f"--kw {key}", f"--{key}")
