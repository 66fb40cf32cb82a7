"""The command line: --help everywhere, machine-readable listing, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lmlab.cli import build_parser, main
from lmlab.registry import list_methods

SUBCOMMANDS = [["list"], ["info"], ["run"], ["reproduce"], ["models"], ["data"], ["data", "list"], ["data", "show"],
               ["env"], ["serve"], ["bench", "serve"], ["bench", "decode"]]  # fmt: skip


@pytest.mark.parametrize("argv", [[], *SUBCOMMANDS], ids=lambda a: " ".join(a) or "lmlab")
def test_help_exits_zero(argv, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([*argv, "--help"])
    assert e.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_console_script_and_module_entry_point():
    out = subprocess.run([sys.executable, "-m", "lmlab", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "reproduce" in out.stdout


def test_list_json_parses(capsys):
    assert main(["list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["id"] for r in rows} == {s.id for s in list_methods()}
    assert all({"id", "area", "name", "paper", "default_model", "quick_budget_s", "available"} <= set(r) for r in rows)


@pytest.mark.parametrize("method_id", [s.id for s in list_methods()])
def test_info_for_every_method(method_id, capsys):
    assert main(["info", method_id]) == 0
    out = capsys.readouterr().out
    assert method_id in out and "claim:" in out and "paper" in out
    assert main(["info", method_id, "--bibtex"]) == 0


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("lmlab: error: ")
    return err[0]


def test_unknown_method_id(capsys):
    assert main(["run", "reflection_windw"]) == 2
    assert "unknown method 'reflection_windw'" in _one_line_error(capsys)


def test_missing_model_file(capsys, tmp_path):
    missing = tmp_path / "nothing.gguf"
    assert (
        main(["run", "reflection_window", "--preset", "smoke", "--model", str(missing), "--out", str(tmp_path)]) == 2
    )
    assert "does not exist" in _one_line_error(capsys)
    assert not any(tmp_path.iterdir())  # nothing was written


def test_unknown_model_alias(capsys, tmp_path):
    assert main(["run", "reflection_window", "--model", "gpt-17", "--out", str(tmp_path)]) == 2
    line = _one_line_error(capsys)
    assert "unknown model 'gpt-17'" in line and "smollm2-135m" in line


def test_out_of_range_value(capsys, tmp_path):
    argv = ["run", "reflection_window", "--model", "tiny-llama", "--set", "sigma=-1", "--out", str(tmp_path)]
    assert main(argv) == 2
    assert "sigma must be in" in _one_line_error(capsys)


def test_unknown_suite(capsys):
    assert main(["data", "show", "nosuchsuite"]) == 2
    assert "unknown data suite 'nosuchsuite'" in _one_line_error(capsys)


def test_dry_run_prints_the_resolved_config(capsys):
    assert main(["run", "reflection_window", "--quick", "--set", "sigma=0.9", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "sigma: 0.9" in out and "n_capitals: 6" in out


def test_data_list_and_show(capsys):
    assert main(["data", "list"]) == 0
    assert "countries" in capsys.readouterr().out
    assert main(["data", "show", "countries", "--n", "2", "--seed", "0"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all(json.loads(line)["prompt"] for line in lines)


def test_models_and_env(capsys):
    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"smollm2-135m", "gemma3-270m", "minilm", "tiny-llama"} <= {r["alias"] for r in rows}
    assert main(["env"]) == 0
    assert "python" in capsys.readouterr().out


def test_run_writes_a_result_folder(tmp_path, capsys):
    env = {**os.environ, "LMLAB_NO_PROGRESS": "1"}
    cmd = [sys.executable, "-m", "lmlab", "run", "reflection_window", "--preset", "smoke", "--model", "tiny-llama",
           "--out", str(tmp_path), "--threads", "1"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    folders = list((tmp_path / "reflection_window").iterdir())
    assert len(folders) == 1
    names = {p.name for p in folders[0].iterdir()}
    assert {"result.json", "metrics.csv", "samples.jsonl", "config.yaml", "report.md", "report.html"} <= names
    assert "verdict:" in out.stdout


# -- lmlab prune ------------------------------------------------------------------------------------------------


_PRUNE = ["prune", "--model", "tiny-llama", "--n-calib", "4", "--seqlen", "32", "--no-progress"]


@pytest.mark.parametrize("method, extra, expected", [
    ("wanda", ["--sparsity", "0.5"], 0.5),
    ("maiht", ["--structure", "1:4"], 0.25),
    ("atp", ["--sparsity", "0.5", "--beta", "0.1"], 0.5),
])  # fmt: skip
def test_prune_writes_a_loadable_hf_folder_with_its_report(tmp_path, method, extra, expected):
    from lmlab.core.inference.models import load_model
    from lmlab.core.pruning import model_sparsity

    out = tmp_path / "pruned"
    assert main([*_PRUNE, "--method", method, *extra, "--out", str(out)]) == 0
    report = json.loads((out / "sparsity_report.json").read_text())
    assert report["method"] == method and abs(report["sparsity"] - expected) < 0.01
    assert "| block | linear |" in (out / "sparsity_report.md").read_text()
    model, _ = load_model(str(out))  # a standard HF folder: valid --model for every method
    assert abs(model_sparsity(model)["sparsity"] - expected) < 0.01
    if method == "atp":
        rates = report["target_sparsities"]
        assert rates[0] < 0.5 < rates[-1]  # the arithmetic progression, deeper blocks sparser
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left


@pytest.mark.parametrize("bad, needle", [
    (["--method", "wanda", "--sparsity", "1.5"], "--sparsity 1.5"),
    (["--method", "pruneit"], "--method 'pruneit'"),
    (["--method", "wanda", "--structure", "5:4"], "5:4"),
    (["--method", "wanda", "--calib", "missing.txt"], "missing.txt"),
    (["--method", "owl", "--structure", "2:4"], "--method owl"),
    (["--method", "wanda", "--beta", "0.01"], "--beta"),
])  # fmt: skip
def test_prune_rejects_bad_values_before_any_work(tmp_path, capsys, monkeypatch, bad, needle):
    import lmlab.core.inference.models as models

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(models, "load_model", no_load)
    assert main([*_PRUNE, *bad, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]
    assert not (tmp_path / "x").exists()


def test_prune_refuses_an_existing_out(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    assert main([*_PRUNE, "--method", "wanda", "--out", str(tmp_path / "x")]) == 2
    assert "already exists" in capsys.readouterr().err


def test_backend_flag_is_refused_where_a_method_has_no_api_backend(capsys):
    assert main(["run", "wanda", "--backend", "openai:http://127.0.0.1:1/v1", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "wanda has no API backend" in err and "ralu" in err


def test_bad_backend_spec_is_named(capsys):
    assert main(["run", "ralu", "--backend", "vllm:http://x", "--dry-run"]) == 2
    assert "'vllm:http://x'" in capsys.readouterr().err


def test_backend_flag_reaches_the_config(capsys):
    assert main(["run", "ralu", "--backend", "openai:http://127.0.0.1:9/v1#m", "--dry-run"]) == 0
    assert "openai:http://127.0.0.1:9/v1#m" in capsys.readouterr().out
