"""PRMs: the core interface, and the capital-listing PRMs of the decoding area (oracle, noise, MiniLM probe)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import lmlab.core
from lmlab import data
from lmlab.core.training.prm import PRM, CountingPRM, threshold_accuracy
from lmlab.data.capital_prms import (
    NoisyOraclePRM,
    OracleFactPRM,
    ProbePRM,
    fact_training_steps,
    parse_fact_step,
)


@pytest.fixture(scope="module")
def question():
    return data.load("capital_steps", 1, seed=0)[0]


def test_parse_fact_step():
    assert parse_fact_step("Peru: Lima") == ("Peru", "Lima")
    assert parse_fact_step("1. Peru: Lima.") == ("Peru", "Lima")
    assert parse_fact_step("The capital of Peru is Lima.") == ("Peru", "Lima")
    assert parse_fact_step("no fact here") is None


def test_oracle_scores_gold_and_wrong_steps(question):
    prm = OracleFactPRM()
    gold = question.target.splitlines()
    assert prm.score(question.prompt, gold) == [1.0] * len(gold)
    wrong = [f"{s['country']}: Paris" for s in question.meta["steps"]]
    assert prm.score(question.prompt, wrong) == [0.0] * len(wrong)
    assert prm.score("", ["peru: LIMA", "Colombia: Bogotá", "Colombia: Bogota", "gibberish"]) == [1, 1, 1, 0]
    assert prm.score("", ["Guinea-Bissau: Guinea-Bissau", "Guinea-Bissau: Bissau", "Djibouti: Djibouti"]) == [0, 1, 1]
    assert prm.calls == 4 and isinstance(prm, PRM)


def test_noisy_oracle_is_deterministic_and_flips_about_eps():
    steps, labels = fact_training_steps(0, "train")
    prm = NoisyOraclePRM(eps=0.2, sigma=0.0, seed=1)
    a = prm.score("q", steps)
    assert a == prm.score("q", steps)  # a PRM is a function of its input
    flips = np.mean([round(v) != lab for v, lab in zip(a, labels)])
    assert 0.12 < flips < 0.28
    assert NoisyOraclePRM(eps=0.0, sigma=0.0).score("q", steps) == [float(v) for v in labels]
    noisy = NoisyOraclePRM(eps=0.0, sigma=0.3).score("q", steps)
    assert all(0.0 <= v <= 1.0 for v in noisy) and noisy != [float(v) for v in labels]
    with pytest.raises(ValueError, match="eps"):
        NoisyOraclePRM(eps=1.5)


def test_capital_steps_grader(question):
    from lmlab.data.capital_steps import step_scores

    assert data.grade("capital_steps", question, question.target) == 1.0
    lines = question.target.splitlines()
    broken = "\n".join([lines[0], "Nowhere: Atlantis", *lines[2:]])
    assert step_scores(question, broken) == [1.0, 0.0, *[1.0] * (len(lines) - 2)]
    assert data.grade("capital_steps", question, broken) == 0.0
    assert step_scores(question, lines[0]) == [1.0] + [0.0] * (len(lines) - 1)


@pytest.mark.slow
@pytest.mark.real_model
def test_probe_beats_the_majority_class_on_held_out_countries():
    pytest.importorskip("sklearn")
    try:
        prm = ProbePRM.trained_on_countries(seed=0, split="train")
    except FileNotFoundError as e:
        pytest.skip(str(e))
    steps, labels = fact_training_steps(0, "test")
    scores = prm.score("", steps)
    accuracy = np.mean([(s >= 0.5) == bool(lab) for s, lab in zip(scores, labels)])
    assert accuracy > np.mean(np.asarray(labels) == 0) + 0.05  # better than always saying "wrong"
    assert prm.flops > 0 and prm.score("", ["not a fact"]) == [0.0]
    # a small model's commonest wrong step repeats the country; its cosine is 1, yet the probe must reject it
    assert prm.score("", ["Peru: Peru"])[0] < 0.5 < prm.score("", ["Peru: Lima"])[0]


# Which package may import which is checked by import-linter (pyproject's [tool.importlinter], tests/test_layers.py).
# What it cannot see is text: task strings in the step and PRM modules, method paths in lazy "module:attr" specs.
_TASK_WORDS = re.compile(r"\b[Cc]apitals?\b|\b[Cc]ountr(?:y|ies)\b|[Gg]ive the capital|\bQuestion:")


def _core_sources():
    root = Path(lmlab.core.__file__).parent
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*.py"))}


def test_core_step_and_prm_modules_name_no_task():
    """The core knows no task: the step and PRM modules carry no task strings (stop markers and task PRMs come from
    the caller)."""
    sources = _core_sources()
    for name in ("training/prm.py", "inference/steps.py"):
        code = "\n".join(line for line in sources[name].splitlines() if not line.lstrip().startswith("#"))
        hits = [m.group(0) for m in _TASK_WORDS.finditer(code)]
        assert not hits, (name, hits)


def test_counting_prm_and_threshold_accuracy():
    class Half(CountingPRM):
        def score(self, question, steps):
            self._count(steps)
            return [0.5 + 0.5 * ("good" in s) for s in steps]

    prm = Half()
    assert isinstance(prm, PRM)
    assert threshold_accuracy(prm, "q", ["good", "bad", "good"], [1, 0, 0], t=0.75) == pytest.approx(2 / 3)
    assert prm.calls == 1 and prm.steps_scored == 3 and prm.flops == 0.0


def test_core_names_no_method():
    """The core knows no method, not even by name in a string (a lazy "module:attr" spec, which import-linter cannot
    see): methods register with the core, e.g. a saved-PRM scheme through `register_prm_loader`."""
    pattern = re.compile(r"lmlab\.methods\.\w+\.\w+")
    offenders = {name: pattern.findall(text) for name, text in _core_sources().items() if pattern.search(text)}
    assert not offenders, offenders


def test_saved_prm_schemes_are_registered_by_methods():
    from lmlab.core.training.prm import is_prm_spec, load_prm, register_prm_loader

    assert is_prm_spec("implicit:/some/dir")  # registered by the implicit_prm package
    assert not is_prm_spec("noisy") and not is_prm_spec("nosuch:/dir") and not is_prm_spec("implicit:")
    with pytest.raises(ValueError, match="nosuch:/dir"):
        load_prm("nosuch:/dir")
    with pytest.raises(ValueError, match="already registered"):
        register_prm_loader("implicit", "elsewhere:loader")
