"""Bucketing py-spy stacks by method and phase (`lmlab.profiling`)."""

from __future__ import annotations

import pytest

from lmlab.profiling import PHASES, RUNNER, bucket, classify, format_table, main, parse_raw

R = "<module> (lmlab/__main__.py:1)"
M = R + ";run (/r/src/lmlab/methods/alignment/mpo/experiment.py:40)"
RAW = [
    f"{M};train (/r/src/lmlab/core/training/sft.py:9);forward (torch/nn/modules/module.py:3) 10",
    f"{M};step (x.py:1);backward (/v/torch/_tensor.py:620);_engine (torch/autograd/graph.py:8) 6",
    f"{M};score (/r/src/lmlab/core/inference/scoring.py:4);forward (torch/nn/modules/linear.py:1) 4",
    f"{M};sample (/r/src/lmlab/core/training/sft.py:30);decode (/r/src/lmlab/core/inference/generation.py:70) 8",
    f"{R};reproduce (/r/src/lmlab/runner.py:400);load_model (/r/src/lmlab/core/inference/models.py:500) 20",
    f"{M};helper (/r/src/lmlab/methods/alignment/mpo/method.py:3) 2",
    f"{M};_find_and_load (<frozen importlib._bootstrap>:1);<module> (/v/sklearn/__init__.py:1) 4",
]


def test_each_stack_goes_to_its_method_and_innermost_phase():
    stacks = parse_raw(RAW)
    assert [classify(f) for f, _ in stacks] == [
        ("mpo", "training"),  # a forward inside SFT is training time
        ("mpo", "training"),  # autograd's backward
        ("mpo", "scoring"),
        ("mpo", "generation"),  # a decode inside the training loop is generation, the innermost named phase
        (RUNNER, "load"),  # outside any method folder
        ("mpo", "other"),  # the method's own code
        ("mpo", "import"),
    ]


def test_seconds_are_samples_over_the_rate_and_the_table_adds_up():
    table = bucket(parse_raw(RAW), rate_hz=2.0)
    assert table["mpo"]["training"] == 8.0 and table["mpo"]["generation"] == 4.0 and table[RUNNER]["load"] == 10.0
    assert sum(sum(t.values()) for t in table.values()) == 54 / 2.0
    text = format_table(table)
    assert text.splitlines()[2].startswith("| mpo | 17.0 |")  # the largest total first
    assert "| **all** | 27.0 |" in text and len(text.splitlines()[0].split("|")) == len(PHASES) + 4


def test_bad_input_is_refused_with_the_line(tmp_path, capsys):
    with pytest.raises(ValueError, match="line 2 is not py-spy raw output"):
        parse_raw(["a;b 3", "no count here"])
    with pytest.raises(ValueError, match="rate_hz must be > 0, got 0"):
        bucket([], 0)
    assert main([str(tmp_path / "missing.txt")]) == 2
    assert "is not a file" in capsys.readouterr().err
    f = tmp_path / "p.txt"
    f.write_text("\n".join(RAW))
    assert main([str(f), "2"]) == 0 and "| mpo |" in capsys.readouterr().out
