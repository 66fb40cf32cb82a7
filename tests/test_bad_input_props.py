"""Property tests: malformed input to the CLI and the public API of every registered method fails cleanly.

Each case must give a one-line error that names the bad value and what was expected, a non-zero exit, no
traceback (outside ``--debug``), and nothing written under ``--out``. Validation runs before any model loads, so
every case here is fast; the experiments themselves are replaced by a sentinel that fails the test if a bad value
ever slips through validation and reaches a run.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmlab import cli
from lmlab.registry import MethodSpec, list_methods

METHOD_IDS = [s.id for s in list_methods()]
PROPS = settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    database=None,  # nothing written under .hypothesis: CI runs the same examples every time
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class _ReachedRun(AssertionError):
    """Raised when a bad value got past validation and an experiment started."""


@pytest.fixture(autouse=True)
def _no_experiments(monkeypatch):
    """No experiment may start in these tests: validation must refuse the input first."""

    def run_function(self):  # noqa: ANN001, ANN202
        def run(cfg, ctx):  # noqa: ANN001, ANN202
            raise _ReachedRun(f"{self.id}: a bad value reached the experiment: {cfg!r}")

        return run

    monkeypatch.setattr(MethodSpec, "run_function", run_function)


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``lmlab.cli.main(argv)`` in-process: (exit code, stdout, stderr); argparse's SystemExit becomes its code."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as e:  # argparse refuses a malformed flag itself
            code = e.code if isinstance(e.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def assert_clean_failure(code: int, stdout: str, stderr: str, *names: str, out: Path | None = None) -> str:
    """Non-zero exit, one line on stderr naming each of `names`, no traceback, nothing under `out`."""
    assert code != 0, f"exit 0 for bad input; stdout={stdout!r} stderr={stderr!r}"
    assert "Traceback" not in stderr and "Traceback" not in stdout, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    # argparse prints its usage line before the error; our own errors are exactly one line
    errors = [ln for ln in lines if "error:" in ln]
    assert len(errors) == 1, f"expected one error line, got {lines!r}"
    message = errors[0]
    for name in names:
        assert name in message, f"{name!r} not named in {message!r}"
    if out is not None:
        assert not out.exists() or not any(out.iterdir()), f"{out} was written: {sorted(out.rglob('*'))}"
    return message


# ----------------------------------------------------------------------------------------------------------------
# CLI: unknown --set keys, unknown models, for every registered method

_key = st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True)


@pytest.mark.parametrize("method_id", METHOD_IDS)
def test_unknown_set_key_is_refused(method_id, tmp_path):
    spec = next(s for s in list_methods() if s.id == method_id)
    known = {f["name"] for f in __import__("lmlab.config", fromlist=["describe_fields"]).describe_fields(
        spec.config_class())}  # fmt: skip

    @PROPS
    @given(key=_key.filter(lambda k: k not in known))
    def prop(key):
        out = tmp_path / "out"
        code, so, se = run_cli(["run", method_id, "--model", "tiny-llama", "--preset", "smoke", "--out", str(out),
                                "--set", f"{key}=1"])  # fmt: skip
        msg = assert_clean_failure(code, so, se, repr(key), out=out)
        assert "valid keys" in msg

    prop()


@PROPS
@given(
    model=st.text(st.characters(codec="utf-8", exclude_characters="\x00\n\r"), min_size=1, max_size=60).filter(
        lambda s: s.strip() and s.strip() not in ("tiny-llama", "tiny-gemma3") and not Path(s.strip()).exists()
    ),
    method_id=st.sampled_from(METHOD_IDS),
)
def test_unknown_model_is_refused(model, method_id, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "o"
    code, so, se = run_cli(["run", method_id, "--preset", "smoke", "--out", str(out), f"--model={model}"])
    assert_clean_failure(code, so, se, out=out)
    assert "model" in se


# ----------------------------------------------------------------------------------------------------------------
# Config values: wrong types, out-of-range, NaN/inf, huge, for every method's fields (public API)


def _numeric_fields(spec: MethodSpec) -> list[str]:
    """Fields annotated int or float (optionally ``| None``): those must refuse non-numbers, NaN and inf."""
    import dataclasses
    import typing

    from lmlab.config import _field_types

    hints = _field_types(spec.config_class())
    out = []
    for f in dataclasses.fields(spec.config_class()):
        options = set(typing.get_args(hints[f.name]) or (hints[f.name],)) - {type(None)}
        if options and options <= {int, float}:
            out.append(f.name)
    return out


_NOT_A_NUMBER = st.one_of(
    st.text(min_size=0, max_size=30).filter(lambda s: not s.strip().lstrip("-").replace(".", "").isdigit()),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.booleans(),
)
_NON_FINITE = st.sampled_from([float("nan"), float("inf"), float("-inf")])


@pytest.mark.parametrize("method_id", METHOD_IDS)
def test_numbers_refuse_wrong_types_and_nan(method_id):
    """Every int/float field refuses non-numbers, and NaN/inf, with a ValueError that names the field."""
    from lmlab.registry import get_method
    from lmlab.runner import resolve_config

    spec = get_method(method_id)
    numeric = _numeric_fields(spec)
    if not numeric:
        pytest.skip(f"{method_id} has no numeric fields")

    @PROPS
    @given(data=st.data())
    def prop(data):
        name = data.draw(st.sampled_from(numeric), label="field")
        bad = data.draw(st.one_of(_NOT_A_NUMBER, _NON_FINITE), label="value")
        with pytest.raises(ValueError) as info:
            resolve_config(spec, preset="smoke", overrides={"model": "tiny-llama", name: bad})
        message = str(info.value)
        assert name in message and "\n" not in message, message

    prop()


@pytest.mark.parametrize("method_id", METHOD_IDS)
def test_every_numeric_field_refuses_nan_and_inf(method_id, tmp_path):
    """Exhaustive over fields (hypothesis above samples them): NaN, inf and -inf, also from YAML (``.nan``)."""
    from lmlab.registry import get_method
    from lmlab.runner import resolve_config

    spec = get_method(method_id)
    for name in _numeric_fields(spec):
        for bad in (float("nan"), float("inf"), float("-inf")):
            with pytest.raises(ValueError, match=name):
                resolve_config(spec, preset="smoke", overrides={"model": "tiny-llama", name: bad})
        for text in (".nan", ".inf", "-.inf"):
            cfg_file = tmp_path / "cfg.yaml"
            cfg_file.write_text(f"{name}: {text}\n")
            with pytest.raises(ValueError, match=name):
                resolve_config(spec, preset="smoke", config_file=cfg_file, overrides={"model": "tiny-llama"})


@pytest.mark.parametrize("method_id", METHOD_IDS)
def test_set_strings_never_crash_validation(method_id):
    """Any ``--set field=TEXT`` for any field either resolves or is refused with a one-line ValueError.

    (Nothing else: a TypeError or ZeroDivisionError escaping a ``__post_init__`` would be a traceback in the CLI.)
    """
    from lmlab.registry import get_method
    from lmlab.runner import resolve_config

    spec = get_method(method_id)
    import dataclasses

    names = [f.name for f in dataclasses.fields(spec.config_class()) if f.name not in ("model", "output_dir")]
    texts = st.one_of(
        st.sampled_from(["nan", "inf", "-1", "0", "1e400", "10**30", "[]", "['a']", "[nan]", "{}", "None", "''"]),
        st.text(max_size=40),
        st.integers(min_value=-(2**70), max_value=2**70).map(str),
    )

    @PROPS
    @given(name=st.sampled_from(names), text=texts)
    def prop(name, text):
        try:
            resolve_config(spec, preset="smoke", sets=[f"{name}={text}"], overrides={"model": "tiny-llama"})
        except ValueError as e:
            assert "\n" not in str(e) and str(e).strip(), repr(e)

    prop()


BASE_BAD = [
    ("seed", -1),
    ("seed", 2**40),
    ("batch_size", 0),
    ("batch_size", "8"),
    ("max_new_tokens", -3),
    ("threads", 0),
    ("threads", 10**6),
    ("limit", 0),
    ("limit", 2.5),
    ("device", "tpu"),
    ("dtype", "int8"),
    ("seed", True),
]


@pytest.mark.parametrize(("name", "value"), BASE_BAD, ids=[f"{n}={v!r}" for n, v in BASE_BAD])
def test_base_fields_cli(name, value, tmp_path):
    out = tmp_path / "out"
    code, so, se = run_cli(["run", "wanda", "--model", "tiny-llama", "--preset", "smoke", "--out", str(out),
                            "--set", f"{name}={value!r}"])  # fmt: skip
    assert code == 2
    assert_clean_failure(code, so, se, name, out=out)


def test_api_run_method_refuses_before_writing(tmp_path):
    from lmlab.errors import LmlabError
    from lmlab.runner import run_method

    out = tmp_path / "out"
    for kwargs in ({"batch_size": float("nan")}, {"seed": -5}, {"model": "no-such-model"}, {"nosuch": 1}):
        with pytest.raises((ValueError, LmlabError)) as info:
            run_method("wanda", preset="smoke", out=out, **{"model": "tiny-llama", **kwargs})
        assert "\n" not in str(info.value)
        assert not out.exists()


# ----------------------------------------------------------------------------------------------------------------
# Missing, truncated and corrupt model files passed as --model


def _tiny_gguf(path: Path) -> Path:
    import numpy as np
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.ones((64, 32), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones((32,), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory) -> bytes:
    pytest.importorskip("gguf")
    return _tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf").read_bytes()


def test_valid_gguf_passes_the_check(gguf_bytes, tmp_path):
    from lmlab.core.inference.models import resolve_model

    path = tmp_path / "ok.gguf"
    path.write_bytes(gguf_bytes)
    assert resolve_model(str(path)).kind == "gguf"


@PROPS
@given(cut=st.floats(min_value=0.0, max_value=0.999), spec_form=st.sampled_from(["path", "dir::", "pretrained"]))
def test_truncated_gguf_is_refused(gguf_bytes, tmp_path_factory, cut, spec_form):
    folder = tmp_path_factory.mktemp("m")
    path = folder / "cut.gguf"
    path.write_bytes(gguf_bytes[: int(len(gguf_bytes) * cut)])
    spec = {"path": str(path), "dir::": f"{folder}::cut.gguf", "pretrained": f"pretrained={folder},gguf_file=cut.gguf"}
    out = folder / "out"
    code, so, se = run_cli(["run", "wanda", "--preset", "smoke", "--out", str(out), f"--model={spec[spec_form]}"])
    assert code == 2
    msg = assert_clean_failure(code, so, se, "cut.gguf", out=out)
    assert "GGUF" in msg and ("truncated" in msg or "magic" in msg), msg


@PROPS
@given(garbage=st.binary(min_size=1, max_size=64).filter(lambda b: not b"GGUF".startswith(b[:4])))
def test_gguf_with_wrong_magic(gguf_bytes, tmp_path_factory, garbage):
    folder = tmp_path_factory.mktemp("m")
    path = folder / "bad.gguf"
    path.write_bytes(garbage + gguf_bytes[len(garbage) :])
    code, so, se = run_cli(["run", "wanda", "--preset", "smoke", "--out", str(folder / "out"), f"--model={path}"])
    assert code == 2
    assert_clean_failure(code, so, se, "bad.gguf", "magic", out=folder / "out")


@pytest.mark.parametrize(
    ("offset", "patch", "expected"),
    [
        (4, (7).to_bytes(4, "little"), "version 7"),  # an unknown GGUF version
        (8, (2**40).to_bytes(8, "little"), "more than"),  # a tensor count larger than the file
        (16, (2**33).to_bytes(8, "little"), "more than"),  # as many metadata entries
        (24, (2**40).to_bytes(8, "little"), "truncated"),  # a metadata key longer than the file
    ],
)
def test_gguf_with_corrupt_header(gguf_bytes, tmp_path, offset, patch, expected):
    path = tmp_path / "bad.gguf"
    path.write_bytes(gguf_bytes[:offset] + patch + gguf_bytes[offset + len(patch) :])
    code, so, se = run_cli(["run", "wanda", "--preset", "smoke", "--out", str(tmp_path / "out"), f"--model={path}"])
    assert code == 2
    assert_clean_failure(code, so, se, "bad.gguf", expected, out=tmp_path / "out")


_BAD_SAFETENSORS = st.one_of(
    st.binary(max_size=40),  # too short, or a random header length
    st.builds(lambda n, body: n.to_bytes(8, "little") + body, st.integers(0, 2**64 - 1), st.binary(max_size=40)),
    st.builds(
        lambda end: (
            (h := b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, %d]}}' % end)
            and len(h).to_bytes(8, "little") + h + b"\0" * 4
        ),
        st.integers(5, 10**6),
    ),  # a valid header whose tensor runs past the end of the file
)


@PROPS
@given(content=_BAD_SAFETENSORS, as_file=st.booleans())
def test_safetensors_with_wrong_header_is_refused(tmp_path_factory, content, as_file):
    import json

    folder = tmp_path_factory.mktemp("hf")
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "model.safetensors").write_bytes(content)
    model = folder / "model.safetensors" if as_file else folder
    out = folder / "out"
    code, so, se = run_cli(["run", "wanda", "--preset", "smoke", "--out", str(out), f"--model={model}"])
    assert code == 2
    msg = assert_clean_failure(code, so, se, "model.safetensors", out=out)
    assert "safetensors" in msg


@pytest.mark.parametrize("config_text", ["", "{not json", "[1, 2]", '"llama"'])
def test_hf_folder_with_corrupt_config(tmp_path, config_text):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(config_text)
    code, so, se = run_cli(["run", "wanda", "--preset", "smoke", "--out", str(tmp_path / "out"), f"--model={folder}"])
    assert code == 2
    assert_clean_failure(code, so, se, "config.json", out=tmp_path / "out")


def test_huge_model_name_is_one_line(tmp_path):
    code, so, se = run_cli(["run", "wanda", "--preset", "smoke", f"--model={'m' * 5000}"])
    msg = assert_clean_failure(code, so, se, "5000 characters")
    assert len(msg) < 600


# ----------------------------------------------------------------------------------------------------------------
# Output folders: under a file, a file, existing


@PROPS
@given(depth=st.integers(0, 3), is_file=st.booleans())
def test_unwritable_out_refused_before_running(tmp_path_factory, depth, is_file):
    """A --out that is a file or lies under one (a write that fails even as root) is refused before the run."""
    base = tmp_path_factory.mktemp("o")
    blocker = base / "a_file"
    blocker.write_text("keep me\n")
    out = blocker if is_file and depth == 0 else blocker.joinpath(*[f"d{i}" for i in range(depth + 1)])
    code, so, se = run_cli(["run", "wanda", "--model", "tiny-llama", "--preset", "smoke", "--out", str(out)])
    assert code == 2
    assert_clean_failure(code, so, se, str(blocker))
    assert blocker.read_text() == "keep me\n"


def test_existing_out_is_left_unchanged(tmp_path):
    out = tmp_path / "out"
    (out / "wanda" / "earlier").mkdir(parents=True)
    (out / "wanda" / "earlier" / "result.json").write_text("{}")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    code, so, se = run_cli(["run", "wanda", "--model", "tiny-llama", "--preset", "smoke", "--out", str(out),
                            "--set", "sparsity=1.5"])  # fmt: skip
    assert_clean_failure(code, so, se, "sparsity", "1.5")
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert (out / "wanda" / "earlier" / "result.json").read_text() == "{}"


def test_result_write_failure_is_one_line_and_leaves_nothing(tmp_path):
    from lmlab.errors import OutputError
    from lmlab.results import RunResult, atomic_write_text

    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = RunResult(method="wanda", run_info={}, config={}, metrics=[], claims=[], claim_text="")
    with pytest.raises(OutputError) as info:
        result.write(blocker / "run")
    assert "\n" not in str(info.value) and str(blocker / "run") in str(info.value)
    with pytest.raises(OutputError):
        atomic_write_text(blocker / "x.json", "{}")
    assert sorted(tmp_path.iterdir()) == [blocker]


# ----------------------------------------------------------------------------------------------------------------
# --debug: the traceback, and only then (a subprocess, as a user runs it)


def test_debug_flag_shows_traceback_only_when_asked(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "LMLAB_NO_PROGRESS": "1"}
    env.pop("LMLAB_DEBUG", None)
    argv = [sys.executable, "-m", "lmlab", "run", "wanda", "--preset", "smoke", "--model", "tiny-llama",
            "--set", "sparsity=nan", "--out", str(tmp_path / "o")]  # fmt: skip
    plain = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert plain.stderr.strip().count("\n") == 0 and "sparsity" in plain.stderr, plain.stderr
    debug = subprocess.run([*argv, "--debug"], capture_output=True, text=True, env=env, timeout=120)
    assert debug.returncode != 0 and "Traceback" in debug.stderr
    assert not (tmp_path / "o").exists()


def test_failed_experiment_logs_one_line_outside_debug(tmp_path):
    """An experiment that raises is recorded (status error, exit 1); its traceback is shown only with --debug."""
    import os
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from lmlab.registry import MethodSpec\n"
        "def boom(cfg, ctx):\n"
        "    raise RuntimeError('boom inside the experiment')\n"
        "MethodSpec.run_function = lambda self: boom\n"
        "from lmlab.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    env = {**os.environ, "LMLAB_NO_PROGRESS": "1"}
    env.pop("LMLAB_DEBUG", None)
    for debug in (False, True):
        out = tmp_path / f"out{int(debug)}"
        argv = ["run", "wanda", "--preset", "smoke", "--model", "tiny-llama", "--no-plots", "--out", str(out)]
        done = subprocess.run([sys.executable, "-c", code, *argv, *(["--debug"] if debug else [])],
                              capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
        assert done.returncode == 1, done.stderr
        assert "boom inside the experiment" in done.stderr
        assert ("Traceback" in done.stderr) is debug, done.stderr
        if not debug:
            assert len([ln for ln in done.stderr.splitlines() if ln.strip()]) == 1, done.stderr
        (result,) = out.glob("wanda/*/result.json")  # a failed run is still a result, written whole
        assert '"status": "error"' in result.read_text()


# ----------------------------------------------------------------------------------------------------------------
# Other commands, and random argument lists


CLI_BAD = [
    (["info", "nosuch"], "nosuch"),
    (["run", "wand"], "wand"),
    (["data", "show", "nosuch"], "nosuch"),
    (["data", "show", "arithmetic", "--n", "-1"], "-1"),
    (["data", "show", "arithmetic", "--n", "0"], "--n"),
    (["data", "show", "arithmetic", "--seed", "-5"], "--seed"),
    (["data", "show", "arithmetic", "--kw", "nosuch=1"], "nosuch"),
    (["run", "wanda", "--config", "/nonexistent/cfg.yaml"], "/nonexistent/cfg.yaml"),
    (["run", "wanda", "--set", "noequals"], "noequals"),
    (["run", "wanda", "--set", "sparsity.x=1"], "sparsity"),
    (["run", "wanda", "--model", "tiny-llama", "--seeds", "-1"], "seed"),
    (["run", "wanda", "--model", "tiny-llama", "--threads", "0"], "threads"),
    (["run", "wanda", "--model", "tiny-llama", "--backend", "zzz"], "backend"),
    (["run", "wanda", "--model", "tiny-llama", "--engine", "zzz"], "zzz"),
    (["run", "wanda", "--model", "tiny-llama", "--threads", "many"], "many"),
    (["cache", "build", "--n", "0"], "--n"),
    (["serve", "--port", "99999"], "99999"),
    (["serve", "--strategy", "[1]"], "[1]"),
    (["bench", "decode", "--rounds", "0"], "--rounds"),
]


@pytest.mark.parametrize(("argv", "named"), CLI_BAD, ids=[" ".join(a) for a, _ in CLI_BAD])
def test_other_commands_refuse_bad_input(argv, named):
    code, so, se = run_cli(argv)
    assert code == 2
    assert_clean_failure(code, so, se, named)


_FLAGS = ["--model", "--preset", "--device", "--dtype", "--threads", "--limit", "--batch-size", "--seed", "--set",
          "--out", "--config", "--engine", "--backend", "--seeds"]  # fmt: skip
_JUNK = st.one_of(
    st.sampled_from(
        ["nan", "-1", "0", "1e999", "tiny-llama", "smoke", "cpu", "x=1", "seed=-1", "limit=nan", "", "[]"]
    ),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12),
)


@PROPS
@given(
    method_id=st.sampled_from(METHOD_IDS),
    pairs=st.lists(st.tuples(st.sampled_from(_FLAGS), _JUNK), min_size=1, max_size=4),
)
def test_random_run_arguments_never_traceback(tmp_path_factory, method_id, pairs):
    """Any mix of flags and junk values: exit 0 (a valid --dry-run) or 2 with one error line; never a traceback."""
    base = tmp_path_factory.mktemp("r")
    argv = ["run", method_id, "--dry-run"]
    for flag, value in pairs:
        value = str(base / value) if flag in ("--out", "--config") and value else value
        argv.append(f"{flag}={value}")
    code, so, se = run_cli(argv)
    assert "Traceback" not in se + so
    assert code in (0, 2), (argv, code, se)
    if code:
        assert sum("error:" in ln for ln in se.splitlines()) == 1, se


def test_unwritable_output_dir_from_config_refused_before_running(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, so, se = run_cli(["run", "wanda", "--model", "tiny-llama", "--preset", "smoke",
                            "--set", f"output_dir={blocker / 'runs'}"])  # fmt: skip
    assert code == 2
    assert_clean_failure(code, so, se, "output_dir", str(blocker))


# ----------------------------------------------------------------------------------------------------------------
# What `param(...)` declares is enforced however the config is built


def test_param_declared_ranges_are_enforced():
    from dataclasses import dataclass

    from lmlab.config import BaseConfig, build_config, param

    @dataclass
    class ToyConfig(BaseConfig):
        tau: float = param(0.5, "temperature", lo=0.0, hi=1.0, open_lo=True)
        budget: float = param(float("inf"), "seconds (inf: no limit)")
        scale: float = param(1.0, "scale; inf allowed", allow_inf=True)
        sweep: list = param([0.1, 0.2], "taus to sweep", lo=0.0, hi=1.0, nonempty=True)
        name: str = param("x", "a label", nonempty=True)

    assert build_config(ToyConfig, {"tau": 1, "budget": float("inf"), "scale": float("inf")}).tau == 1.0
    assert build_config(ToyConfig, {"sweep": [1, 0.5]}).sweep == [1.0, 0.5]
    for bad, named in [
        ({"tau": 0.0}, "tau must be in (0.0, 1.0]"),
        ({"tau": 1.5}, "tau"),
        ({"tau": float("nan")}, "tau"),
        ({"scale": float("nan")}, "scale"),
        ({"sweep": []}, "sweep must not be empty"),
        ({"sweep": [0.5, 2.0]}, "sweep[1]"),
        ({"sweep": [0.5, "a"]}, "sweep[1] must be a number"),
        ({"sweep": [float("nan")]}, "sweep[0]"),
        ({"name": "  "}, "name must not be empty"),
    ]:
        with pytest.raises(ValueError) as info:
            build_config(ToyConfig, bad)
        assert named in str(info.value), (bad, str(info.value))
    with pytest.raises(ValueError, match="tau"):  # the API's direct construction is checked the same way
        ToyConfig(tau=float("nan"))


def test_post_init_arithmetic_error_is_one_line():
    from dataclasses import dataclass

    from lmlab.config import BaseConfig, build_config, param

    @dataclass
    class Divides(BaseConfig):
        heads: int = param(4, "heads")

        def __post_init__(self) -> None:
            super().__post_init__()
            self.per_head = 64 // self.heads  # a method config that divides before it checks

    with pytest.raises(ValueError) as info:
        build_config(Divides, {"heads": 0})
    assert "heads=0" in str(info.value) and "ZeroDivisionError" in str(info.value)


@pytest.mark.parametrize(
    ("index", "named"),
    [
        ('{"weight_map": {"w": "model-00002-of-00002.safetensors"}}', "model-00002-of-00002.safetensors"),
        ("{not json", "shard index"),
        ('{"metadata": {}}', "weight_map"),
    ],
)
def test_sharded_folder_with_missing_or_bad_index(tmp_path, index, named):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors.index.json").write_text(index)
    code, so, se = run_cli(["run", "wanda", "--preset", "smoke", "--out", str(tmp_path / "out"), f"--model={folder}"])
    assert code == 2
    assert_clean_failure(code, so, se, "model.safetensors.index.json", named, out=tmp_path / "out")
