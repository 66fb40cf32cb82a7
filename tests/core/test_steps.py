"""Step-level generation: prompt rendering, delimiters, step prefixes and the cost of re-prefilling."""

from __future__ import annotations

import pytest

from lmlab import data
from lmlab.core.inference.compute import ComputeMeter
from lmlab.core.inference.generation import decode
from lmlab.core.inference.scoring import encode_prompt
from lmlab.core.inference.steps import Shot, StepModel
from lmlab.data.capital_prms import capital_shots
from lmlab.data.capital_steps import step_prefixes
from lmlab.data.countries import STOP_MARKERS


def test_render_formats(tiny_llama, tiny_tokenizer):
    chat = StepModel(tiny_llama, tiny_tokenizer, name="m")
    assert chat.fmt == "chat"
    text = chat.render("Q?", [" a ", "b"], step_prefix="C:")
    assert text.endswith("assistant\na\nb\nC:")
    shots = [Shot("Q1?", ("x", "y"))]
    few = StepModel(tiny_llama, tiny_tokenizer, name="m", fmt="fewshot", shots=shots)
    assert few.render("Q?", ["a"]) == "Q1?\nx\ny\n\nQ?\na\n"
    with pytest.raises(ValueError, match="fmt"):
        StepModel(tiny_llama, tiny_tokenizer, name="m", fmt="xml")


def test_next_step_is_the_greedy_continuation_up_to_the_delimiter(tiny_llama, tiny_tokenizer):
    model = StepModel(tiny_llama, tiny_tokenizer, name="m", delimiter="e", max_step_tokens=12)
    out = model.next_step("Question", ["first"])
    full = decode(tiny_llama, tiny_tokenizer, encode_prompt(tiny_tokenizer, model.render("Question", ["first"])),
                  max_new_tokens=12)  # fmt: skip
    assert out.text == full.text.split("e")[0].strip()
    assert "e" not in out.text


def test_step_prefixes_and_cost_accounting(tiny_llama, tiny_tokenizer):
    meter = ComputeMeter()
    q = data.load("capital_steps", 1, seed=0)[0]
    model = StepModel(tiny_llama, tiny_tokenizer, name="m", meter=meter, max_step_tokens=4)
    steps = model.answer(q.prompt, 3, step_prefixes=step_prefixes(q))
    assert [s.split(":")[0] for s in steps] == [p[:-1] for p in step_prefixes(q)]
    cost = meter.models["m"]
    # every step re-prefills the whole prefix: 3 prefills, each longer than the question alone
    question_tokens = len(encode_prompt(tiny_tokenizer, model.render(q.prompt, [])))
    assert cost.prefill_tokens >= 3 * question_tokens


def test_sampling_is_seeded(tiny_llama, tiny_tokenizer):
    model = StepModel(tiny_llama, tiny_tokenizer, name="m", max_step_tokens=6)
    a = [s.text for s in model.sample_steps("Q", [], 3, seed=5)]
    assert a == [s.text for s in model.sample_steps("Q", [], 3, seed=5)]


def test_capital_shots_come_from_the_train_split():
    test_ids = {s["iso2"] for ex in data.load("capital_steps", None, seed=0) for s in ex.meta["steps"]}
    for shot in capital_shots(seed=0, n=3):
        assert len(shot.steps) == 3
        names = shot.question.split("Countries: ")[1].split(", ")
        assert not any(ex_name in names for ex in data.load("capital_steps", None, seed=0)
                       for ex_name in [s["country"] for s in ex.meta["steps"]])  # fmt: skip
    assert test_ids


def _ids(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def test_a_step_beginning_with_question_is_kept_unless_the_caller_asks(tiny_llama, tiny_tokenizer):
    """Stop markers are the caller's: by default a few-shot step "Question: ..." is an ordinary step (the old core
    hard-coded the capital task's markers and silently ended the answer there); with the suite's markers it ends."""
    ids = _ids(tiny_tokenizer, "Question: why is the sky blue?\n")
    plain = StepModel(tiny_llama, tiny_tokenizer, name="m", fmt="fewshot")
    out = plain.to_step(ids, "stop_string")
    assert out.text == "Question: why is the sky blue?" and not out.finished
    capital = StepModel(tiny_llama, tiny_tokenizer, name="m", fmt="fewshot", stop_markers=STOP_MARKERS)
    out = capital.to_step(ids, "stop_string")
    assert out.text == "" and out.finished
    # matched case-insensitively at the start only; the chat format honours the caller's markers too
    assert capital.to_step(_ids(tiny_tokenizer, "countries: A, B\n"), "stop_string").finished
    assert not capital.to_step(_ids(tiny_tokenizer, "Peru: Lima. Question: next?\n"), "stop_string").finished
    chat = StepModel(tiny_llama, tiny_tokenizer, name="m", fmt="chat", stop_markers=("Q:",))
    assert chat.to_step(_ids(tiny_tokenizer, "Q: more\n"), "stop_string").finished
    # the format's own marker: an empty step (a blank line closes a few-shot block) ends the answer either way
    assert plain.to_step(_ids(tiny_tokenizer, "\n"), "stop_string").finished


def test_answer_stops_only_at_the_callers_markers(tiny_llama, tiny_tokenizer, monkeypatch):
    script = iter(["Peru: Lima", "Question: and Chile?", "Chile: Santiago", ""])

    def fake_next_step(self, question, steps, **kw):
        return self.to_step(_ids(self.tokenizer, next(script) + "\n"), "stop_string")

    monkeypatch.setattr(StepModel, "next_step", fake_next_step)
    plain = StepModel(tiny_llama, tiny_tokenizer, name="m", fmt="fewshot")
    assert plain.answer("q", 5) == ["Peru: Lima", "Question: and Chile?", "Chile: Santiago"]
    script = iter(["Peru: Lima", "Question: and Chile?", "Chile: Santiago", ""])
    marked = StepModel(tiny_llama, tiny_tokenizer, name="m", fmt="fewshot", stop_markers=["question:"])
    assert marked.answer("q", 5) == ["Peru: Lima"]


def test_bad_stop_markers_raise(tiny_llama, tiny_tokenizer):
    with pytest.raises(ValueError, match="stop_markers"):
        StepModel(tiny_llama, tiny_tokenizer, name="m", stop_markers="Question:")
    with pytest.raises(ValueError, match="stop_markers"):
        StepModel(tiny_llama, tiny_tokenizer, name="m", stop_markers=["  "])
