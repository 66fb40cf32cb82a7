"""RULER-like long-context suite: exact lengths, needle placement, graders, and the task definitions."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from lmlab.data import SUITE_INDEX, grade, load
from lmlab.data import ruler as R


def test_registered():
    assert SUITE_INDEX["ruler"] == "lmlab.data.ruler"
    ex = load("ruler", 1, seed=0, context_tokens=256)[0]
    assert ex.id.startswith("ruler/passkey/256/") and ex.prompt.endswith("Answer: The pass key is")


@pytest.mark.parametrize("task", R.TASKS)
def test_exact_token_length_with_a_tokenizer(task, tiny_tokenizer):
    target = 1500 if task == "fwe" else 600  # byte tokens: fwe needs enough coded words for a strict top 3
    for ex in load("ruler", 2, seed=1, task=task, context_tokens=target, tokenizer=tiny_tokenizer):
        n = len(tiny_tokenizer(ex.prompt)["input_ids"])
        assert ex.meta["n_context_tokens"] == n
        assert target - 3 <= n <= target, (task, n)


def test_length_without_tokenizer_follows_chars_per_token():
    ex = load("ruler", 1, seed=0, context_tokens=1000)[0]
    assert abs(len(ex.prompt) - 1000 * R.CHARS_PER_TOKEN["filler"]) <= 80


@pytest.mark.parametrize("task", ["passkey", "niah_multikey", "vt"])
def test_needles_sit_where_meta_says(task):
    for ex in load("ruler", 3, seed=2, task=task, context_tokens=800):
        start, end = ex.meta["context_span"]
        positions = ex.meta["needle_positions"]
        assert positions == sorted(positions)
        for pos, text in zip(positions, ex.meta["needles"]):
            assert ex.prompt[pos : pos + len(text)] == text
            assert start <= pos < end
        # the asked needle sits near its requested depth (needles go between filler sentences)
        asked = positions[ex.meta["query_needles"][0]]
        assert abs((asked - start) / (end - start) - ex.meta["depth"]) < 0.15


def test_filler_has_no_digits_so_the_needle_is_the_only_number():
    ex = load("ruler", 1, seed=3, context_tokens=1200)[0]
    context = ex.prompt[slice(*ex.meta["context_span"])]
    assert set(re.findall(r"\d+", context)) == {ex.target}
    text = R.filler_text(0, 5000)
    assert len(text) <= 5000 and len(text) > 4800 and not re.search(r"\d", text)


def test_depths_spread_and_fixed_depth():
    exs = load("ruler", 10, seed=0, context_tokens=300)
    depths = sorted(e.meta["depth"] for e in exs)
    assert depths[0] < 0.15 and depths[-1] > 0.85
    assert {e.meta["depth"] for e in load("ruler", 3, seed=0, context_tokens=300, depth=0.5)} == {0.5}


def test_multikey_distractors_and_vt_chain_order():
    ex = load("ruler", 1, seed=4, task="niah_multikey", context_tokens=600, n_keys=4)[0]
    assert len(ex.meta["needles"]) == 4 and len(set(ex.meta["values"])) == 4
    assert ex.target == str(ex.meta["values"][0]) and ex.meta["key"] in ex.prompt.split("Question:")[1]
    vt = load("ruler", 1, seed=4, task="vt", context_tokens=800, n_hops=3, n_chains=2)[0]
    chain = vt.meta["chains"][0]
    assert vt.meta["answers"] == chain and len(chain) == 4
    at = [vt.prompt.index(f"VAR {name} =") for name in chain]
    assert at == sorted(at)  # each hop follows the one it copies
    assert f"VAR {chain[0]} = {vt.meta['value']}." in vt.prompt


def test_fwe_answer_is_the_three_most_frequent_coded_words():
    ex = load("ruler", 1, seed=5, task="fwe", context_tokens=700)[0]
    words = Counter(w for w in ex.prompt[slice(*ex.meta["context_span"])].split() if w.isalpha())
    top3 = [w for w, _ in words.most_common(3)]
    assert sorted(top3) == sorted(ex.meta["answers"])
    assert words.most_common(4)[2][1] > words.most_common(4)[3][1]  # a strict top 3


def test_grader_whole_words_first_line_and_partial_credit():
    ex = load("ruler", 1, seed=6, context_tokens=300)[0]
    pk = ex.target
    assert grade("ruler", ex, f" {pk}.") == 1.0
    assert grade("ruler", ex, f"\n\n The key is {pk}\nmore") == 1.0
    assert grade("ruler", ex, f" 1{pk}") == 0.0  # not inside a longer number
    assert grade("ruler", ex, f" nothing\n{pk}") == 0.0  # only the first non-empty line counts
    vt = load("ruler", 1, seed=6, task="vt", context_tokens=600)[0]
    names = vt.meta["answers"]
    assert R.answer_recall(vt, " ".join(names[:2])) == pytest.approx(2 / len(names))
    assert grade("ruler", vt, " ".join(names[:2])) == 0.0
    assert grade("ruler", vt, ", ".join(n.lower() for n in names)) == 1.0


def test_bad_values_name_the_argument():
    with pytest.raises(ValueError, match="context_tokens"):
        load("ruler", 1, context_tokens=100)
    with pytest.raises(ValueError, match="depth"):
        load("ruler", 1, depth=1.5)
    with pytest.raises(ValueError, match="too small"):
        load("ruler", 1, task="vt", context_tokens=256, n_hops=30, n_chains=16)
