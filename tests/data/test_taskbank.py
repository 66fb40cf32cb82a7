"""The adaptation area's task bank: determinism, disjoint splits, answers correct by construction, bad input."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from lmlab.data import SPLITS, grade, load
from lmlab.data import taskbank as T

# (domain, kwargs) variants that must all satisfy the contract; finite ones can be enumerated with n=None
CASES = [
    ("geography", {}),
    ("arithmetic", {"form": "bare"}),
    ("arithmetic", {"form": "word", "digits": 1}),
    ("strings", {}),
    ("units", {}),
    ("glyphs", {}),
    ("glyphs", {"noise": 0.0}),
]


def _ids(d: str, n, split: str, seed: int = 0, **kw) -> set[str]:
    return {e.id for e in T.tasks(d, n, seed, split, **kw)}


@pytest.mark.parametrize("domain,kw", CASES)
def test_deterministic_and_prefix(domain, kw):
    a = [e.to_dict() for e in T.tasks(domain, 12, 3, "train", **kw)]
    assert a == [e.to_dict() for e in T.tasks(domain, 12, 3, "train", **kw)]
    assert a[:5] == [e.to_dict() for e in T.tasks(domain, 5, 3, "train", **kw)]
    assert len({e["id"] for e in a}) == 12
    assert [e["id"] for e in a] != [e.id for e in T.tasks(domain, 12, 4, "train", **kw)]


@pytest.mark.parametrize("domain,kw", CASES)
def test_splits_disjoint_by_key(domain, kw):
    finite = domain in T.FINITE_DOMAINS or kw.get("noise") == 0.0
    n = None if finite else 8 if kw.get("digits") == 1 else 120
    by = {s: T.tasks(domain, n, 1, s, **kw) for s in SPLITS}
    for i, s in enumerate(SPLITS):
        assert by[s]
        for t in SPLITS[i + 1 :]:
            assert not {e.id for e in by[s]} & {e.id for e in by[t]}
            assert not {e.prompt for e in by[s]} & {e.prompt for e in by[t]}
    if domain == "geography":  # the partition is by country, shared by the four tasks and the countries suite
        countries = {s: {e.meta["iso2"] for e in by[s]} for s in SPLITS}
        assert not countries["train"] & countries["test"]
        assert countries["test"] == {e.meta["iso2"] for e in load("countries", None, seed=1, split="test")}
    if domain == "strings":
        words = {s: {e.meta["word"] for e in by[s]} for s in SPLITS}
        assert not words["train"] & words["test"]
    assert _ids(domain, 10, "val", 1, **kw) == _ids(domain, 10, "dev", 1, **kw)


@pytest.mark.parametrize("domain,kw", CASES)
def test_schema_choices_and_grader(domain, kw):
    for ex in T.tasks(domain, 16, 0, "test", **kw):
        m = ex.meta
        assert m["domain"] == domain and m["task"] in T.DOMAINS[domain] and m["difficulty"] in T.DIFFICULTIES
        assert ex.prompt.startswith("Q: ") and ex.prompt.endswith("\nA:")
        assert len(ex.choices) == 4 and len(set(ex.choices)) == 4
        assert ex.choices[m["answer_index"]] == ex.target
        assert sorted(m["distractors"]) == sorted(c for c in ex.choices if c != ex.target)
        assert grade("taskbank", ex, ex.target) == 1.0
        for wrong in m["distractors"]:
            assert grade("taskbank", ex, wrong) == 0.0, (ex.id, wrong)
        reqs = T.choice_requests(ex)
        assert reqs[m["answer_index"]] == T.answer_request(ex) == (ex.prompt, " " + ex.target)


def test_all_tasks_interleaved_and_selectable():
    exs = T.tasks("geography", 8, 0, "train")
    assert [e.meta["task"] for e in exs] == list(T.DOMAINS["geography"]) * 2
    only = T.tasks("arithmetic", 6, 0, task=["mul", "add"])
    assert [e.meta["task"] for e in only] == ["mul", "add"] * 3
    assert T.families()[0] == ("geography", "capital") and len(T.families()) == sum(map(len, T.DOMAINS.values()))
    assert T.tasks("units", 3, 0, n_choices=0)[0].choices is None


def test_answers_correct_by_construction():
    from lmlab.data.countries import country_record

    for ex in T.tasks("geography", None, 0, "test"):
        rec = country_record(ex.meta["iso2"])
        truth = {"capital": rec["capital"], "continent": rec["continent"], "iso3": rec["iso3"],
                 "currency_code": rec["currency_code"]}[ex.meta["task"]]  # fmt: skip
        assert ex.target == truth
    fr = [e for s in SPLITS for e in T.tasks("geography", None, 0, s, task="capital") if e.meta["iso2"] == "FR"][0]
    assert fr.target == "Paris" and grade("taskbank", fr, "The capital is Paris.") == 1.0
    for form in T.FORMS:
        for ex in T.tasks("arithmetic", 40, 0, form=form, digits=2):
            assert str(eval(ex.meta["expression"])) == ex.target and int(ex.target) >= 0
    for ex in T.tasks("strings", None, 0, "test"):
        w = ex.meta["word"]
        expect = {"reverse": w[::-1], "uppercase": w.upper()}.get(ex.meta["task"])
        assert ex.target == (expect if expect is not None else str(w.count(ex.meta["letter"])))
    for ex in T.tasks("units", 80, 0):
        m = ex.meta
        assert int(ex.target) == (m["value"] * m["factor"] if m["direction"] == "up" else m["value"] // m["factor"])
        assert m["direction"] == "up" or m["value"] % m["factor"] == 0
        assert f"{m['value']} {m['from']}" in ex.prompt
    for ex in T.tasks("glyphs", 40, 0, noise=0.2):
        d = ex.meta["digits"]
        assert int(ex.target) == (d[0] if ex.meta["task"] == "read" else (d[0] + d[1]) % 10)
        for im in ex.meta["bitmaps"]:
            assert T.render_glyph(im) in ex.prompt
        flips = sum(sum(a != b for a, b in zip(im, T.glyph(x))) for im, x in zip(ex.meta["bitmaps"], d))
        assert flips == ex.meta["flips"]


def test_glyph_table():
    clean = [T.glyph(d) for d in range(10)]
    assert all(len(g) == 25 and set(g) <= {0, 1} for g in clean)
    assert len({tuple(g) for g in clean}) == 10  # every digit is distinct
    assert T.render_glyph(T.glyph(1)).splitlines() == list(T.GLYPHS_5X5[1])
    import random

    noisy = T.glyph(3, 0.3, random.Random(0))
    assert noisy != T.glyph(3) and noisy == T.glyph(3, 0.3, random.Random(0))
    # noise 0: the finite pool is every digit (pair) once, split by the exact image
    sizes = [len(T.tasks("glyphs", None, 0, s, task="read", noise=0.0)) for s in SPLITS]
    assert sum(sizes) == 10


def test_difficulty_tags_vary():
    for domain, kw in CASES[:6]:
        tags = {e.meta["difficulty"] for e in T.tasks(domain, 8 if kw.get("digits") == 1 else 60, 0, "train", **kw)}
        assert len(tags) >= 2, (domain, kw, tags)


def test_bad_input_errors():
    with pytest.raises(ValueError, match="domain must be one of"):
        T.tasks("poetry", 2)
    with pytest.raises(ValueError, match="task of domain 'strings' must be one of"):
        T.tasks("strings", 2, task="rot13")
    with pytest.raises(ValueError, match="task must be"):
        T.tasks("strings", 2, task=[])
    with pytest.raises(ValueError, match="n_choices must be"):
        T.tasks("geography", 2, n_choices=1)
    with pytest.raises(ValueError, match="n_choices must be"):
        T.tasks("geography", 2, n_choices=11)
    with pytest.raises(ValueError, match="unknown keyword argument"):
        T.tasks("geography", 2, form="word")  # form is arithmetic's
    with pytest.raises(ValueError, match="digits must be"):
        T.tasks("arithmetic", 2, digits=4)
    with pytest.raises(ValueError, match="form must be"):
        T.tasks("arithmetic", 2, form="poem")
    with pytest.raises(ValueError, match="noise must be"):
        T.tasks("glyphs", 2, noise=0.5)
    with pytest.raises(ValueError, match="split must be"):
        T.tasks("units", 2, split="validation")
    with pytest.raises(ValueError, match="n must be an int"):
        T.tasks("units", None)
    with pytest.raises(ValueError, match="n must be"):
        T.tasks("units", -1)
    with pytest.raises(ValueError, match="larger than"):
        T.tasks("geography", 10_000)
    with pytest.raises(ValueError, match="n_choices=10 is larger"):
        T.tasks("geography", 4, task="continent", n_choices=10)  # only 7 continents
    with pytest.raises(ValueError, match="digit must be"):
        T.glyph(10)
    with pytest.raises(ValueError, match="rng must be"):
        T.glyph(1, 0.1)
    with pytest.raises(ValueError, match="bits must be"):
        T.render_glyph([0] * 24)


_DIGEST = """
import hashlib, json
from lmlab.data import taskbank as T
calls = [("geography", 12, {}), ("arithmetic", 12, {"form": "word"}), ("strings", 12, {}), ("units", 12, {}),
         ("glyphs", 12, {})]
print(hashlib.sha256(json.dumps([[e.to_dict() for e in T.tasks(d, n, 4, "train", **kw)] for d, n, kw in calls],
                                sort_keys=True).encode()).hexdigest())
"""


def test_identical_across_processes():
    out = [subprocess.run([sys.executable, "-c", _DIGEST], capture_output=True, text=True, check=True,
                          env={"PYTHONHASHSEED": str(h), "PATH": "/usr/bin:/bin"}).stdout.strip()
           for h in (1, 2)]  # fmt: skip
    calls = [("geography", 12, {}), ("arithmetic", 12, {"form": "word"}), ("strings", 12, {}), ("units", 12, {}),
             ("glyphs", 12, {})]  # fmt: skip
    here = hashlib.sha256(json.dumps([[e.to_dict() for e in T.tasks(d, n, 4, "train", **kw)] for d, n, kw in calls],
                                     sort_keys=True).encode()).hexdigest()  # fmt: skip
    assert out[0] == out[1] == here
