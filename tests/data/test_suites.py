"""Contract tests for every data suite in `SUITE_INDEX`, plus suite-specific checks of data and graders."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lmlab.data import SPLITS, SUITE_INDEX, Example, get_suite, grade, load
from lmlab.data.normalize import contains_answer, first_number, last_number, normalize

# Per suite: keyword variants to exercise, and an n that every split of the first variant can supply.
VARIANTS: dict[str, list[dict]] = {
    "countries": [
        {},
        {"task": "country_of_capital", "style": "completion"},
        {"task": "continent", "style": "fewshot", "shots": 2},
        {"task": "currency"},
        {"task": "iso2"},
        {"task": "iso3", "stratify_by_population": True},
    ],
    "arithmetic": [{}, {"kind": "word", "digits": 1, "ops": ("+", "-")}, {"digits": 3, "ops": "*"}],
    "permutations": [{}, {"n_elements": 3, "length": 3}, {"n_elements": 7, "length": 4}],
    "ioi": [{}, {"order": "ABBA"}, {"order": "BABA"}],
    "greater_than": [{}, {"centuries": [15, 16]}],
    "strings": [{"task": t} for t in ("reverse", "count", "first_letter", "last_letter", "uppercase")],
    "humaneval": [{}],
    "corpus": [{}, {"kind": "all", "min_chars": 100, "max_chars": 400}],
    "instructions": [{}],
    "capital_steps": [{}, {"n_countries": 2}],
    "fact_corpus": [{"n_facts": 300}, {"kind": "control"}, {"kind": "document", "n_facts": 300}],
    "ruler": [{"context_tokens": 256}, {"task": "niah_multikey", "context_tokens": 300}, {"task": "vt"}],
    "glyphs": [{}, {"n_images": 1, "chars": 2, "scale": 2, "prose_chars": 50}],
    "geobigedit": [{}, {"kind": "general"}, {"increments": 2, "edits_per_increment": 5, "reedit_fraction": 0.2}],
    "taskbank": [
        {},
        {"domain": "arithmetic", "form": "word"},
        {"domain": "strings", "n_choices": 0},
        {"domain": "units"},
        {"domain": "glyphs", "task": "sum_mod10"},
    ],
    "prefs": [{}, {"per_query": 2}],
}
N = 8
BAD_KWARGS: dict[str, dict] = {
    "countries": {"task": "flag"},
    "arithmetic": {"kind": "poem"},
    "permutations": {"n_elements": 12},
    "ioi": {"order": "AAB"},
    "greater_than": {"centuries": [5]},
    "strings": {"task": "rot13"},
    "humaneval": {"language": "go"},
    "corpus": {"kind": "code"},
    "instructions": {"style": "chat"},
    "capital_steps": {"n_countries": 0},
    "fact_corpus": {"kind": "essay"},
    "ruler": {"task": "qa"},
    "glyphs": {"scale": 0},
    "geobigedit": {"kind": "essay"},
    "taskbank": {"domain": "poetry"},
    "prefs": {"per_query": 0},
}
# Suites whose default pool is enumerated (n=None gives the whole split); the others need an int n.
FINITE = {
    "countries",
    "humaneval",
    "instructions",
    "corpus",
    "greater_than",
    "strings",
    "fact_corpus",
    "permutations",
    "capital_steps",
    "geobigedit",
    "taskbank",
    "prefs",
}


def _good(name: str, ex: Example) -> str:
    if name in ("corpus", "instructions") or ex.meta.get("kind") == "document":
        return "Some answer."
    if name == "ioi":
        return ex.target + " the drink."
    return ex.target


def _bad(name: str, ex: Example) -> str:
    if name == "prefs":
        return ex.meta["rejected"]
    if name in ("corpus", "instructions") or ex.meta.get("kind") == "document":
        return "   "
    if name == "countries":
        return {"iso2": "zz", "iso3": "ZZZ"}.get(ex.meta["task"], "I do not know.")
    if name in ("capital_steps", "ruler", "glyphs", "geobigedit", "taskbank"):
        return "I do not know."
    if name == "fact_corpus":
        return "nowhere"
    if name == "arithmetic":
        return str(int(ex.target) + 1)
    if name == "permutations":
        return "[" + " ".join(reversed(ex.target.strip("[]").split())) + "]" if len(ex.meta["composed"]) > 1 else "[]"
    if name == "ioi":
        return ex.choices[1]
    if name == "greater_than":
        return ex.meta["yy"]
    if name == "strings":
        return {"count": "99"}.get(ex.meta["task"], "qqq")
    raise AssertionError(name)


def _dicts(examples: list[Example]) -> list[dict]:
    return [e.to_dict() for e in examples]


@pytest.fixture(params=list(SUITE_INDEX))
def name(request) -> str:
    return request.param


def test_index_registers_every_suite(name):
    suite = get_suite(name)
    assert suite.name == name and suite.description and suite.source
    module = sys.modules[SUITE_INDEX[name]]
    assert module.__doc__ and "Metric" in module.__doc__ and "Data" in module.__doc__


def test_same_seed_same_examples_and_unique_ids(name):
    for kw in VARIANTS[name]:
        a, b = load(name, N, seed=3, **kw), load(name, N, seed=3, **kw)
        assert len(a) == N
        assert _dicts(a) == _dicts(b)
        assert len({e.id for e in a}) == N
        assert all(isinstance(e.prompt, str) and e.prompt for e in a)


def test_different_seed_different_examples(name):
    kw = VARIANTS[name][0]
    assert [e.id for e in load(name, N, seed=0, **kw)] != [e.id for e in load(name, N, seed=1, **kw)]


def test_splits_are_disjoint(name):
    kw = VARIANTS[name][0]
    n = None if name in FINITE else 200
    by_split = {s: load(name, n, seed=5, split=s, **kw) for s in SPLITS}
    ids = {s: {e.id for e in exs} for s, exs in by_split.items()}
    prompts = {s: {e.prompt for e in exs} for s, exs in by_split.items()}
    for i, s in enumerate(SPLITS):
        assert ids[s], s
        for t in SPLITS[i + 1 :]:
            assert not ids[s] & ids[t], (s, t)
            assert not prompts[s] & prompts[t], (s, t)


def test_n_is_a_prefix_of_a_larger_request(name):
    kw = VARIANTS[name][0]
    assert _dicts(load(name, 3, seed=2, **kw)) == _dicts(load(name, 6, seed=2, **kw))[:3]


def test_grader_right_and_wrong(name):
    for kw in VARIANTS[name]:
        for ex in load(name, 4, seed=7, **kw):
            if name == "humaneval":
                with pytest.raises(NotImplementedError, match="humaneval_reward"):
                    grade(name, ex, ex.target)
                continue
            assert grade(name, ex, _good(name, ex)) == 1.0, (kw, ex.id, ex.target)
            assert grade(name, ex, _bad(name, ex)) == 0.0, (kw, ex.id, _bad(name, ex))


def test_bad_arguments_raise_value_error(name):
    with pytest.raises(ValueError, match=r"\w+ must be|expected"):
        load(name, 2, **BAD_KWARGS[name])
    with pytest.raises(ValueError, match="unknown keyword"):
        load(name, 2, bogus=1)
    with pytest.raises(ValueError, match="split"):
        get_suite(name).generate(2, 0, split="validation")
    with pytest.raises(ValueError, match="n must be"):
        load(name, -1)
    if name in FINITE:
        size = len(load(name, None, seed=0, **VARIANTS[name][0]))
        with pytest.raises(ValueError, match="larger than"):
            load(name, size + 1, seed=0, **VARIANTS[name][0])
    else:
        with pytest.raises(ValueError, match="n must be an int"):
            load(name, None, **VARIANTS[name][0])


_DIGEST_CODE = """
import hashlib, json, sys
from lmlab.data import load
calls = json.loads(sys.argv[1])
print(hashlib.sha256(json.dumps([[e.to_dict() for e in load(*c[:2], seed=c[2], split=c[3], **c[4])] for c in calls],
                                sort_keys=True).encode()).hexdigest())
"""
_DIGEST_CALLS = [
    ["countries", 10, 4, "dev", {"style": "fewshot"}],
    ["arithmetic", 10, 4, "train", {"kind": "word"}],
    ["permutations", 10, 4, "test", {}],
    ["ioi", 10, 4, "test", {}],
    ["greater_than", 10, 4, "test", {}],
    ["strings", 10, 4, "test", {"task": "count"}],
    ["humaneval", 5, 4, "test", {}],
    ["corpus", 10, 4, "test", {}],
    ["instructions", 5, 4, "test", {}],
]


def test_identical_across_processes():
    """Guards against salted `hash()` or set-order dependence: another interpreter must produce the same bytes."""
    calls = _DIGEST_CALLS
    here = hashlib.sha256(
        json.dumps(
            [[e.to_dict() for e in load(*c[:2], seed=c[2], split=c[3], **c[4])] for c in calls], sort_keys=True
        ).encode()
    ).hexdigest()
    env = {"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", _DIGEST_CODE, json.dumps(calls)], capture_output=True, text=True, env=env, check=True
    )
    assert proc.stdout.strip() == here


# --------------------------------------------------------------------------------------------------------------------
# normalize
# --------------------------------------------------------------------------------------------------------------------


def test_normalize_and_contains_answer():
    assert normalize("  Port-au-Prince! ") == "port au prince"
    assert normalize("Bogotá") == normalize("BOGOTA") == "bogota"
    assert normalize("St. John's") == "st johns"
    assert contains_answer("The capital is Bogotá.", ["Bogota"])
    assert contains_answer("bogota", ["Bogotá"])
    assert not contains_answer("Nigeria", ["Niger"])
    assert not contains_answer("Papua New Guinea", ["Guinea"], exclude=["Papua New Guinea"])
    assert contains_answer("Guinea, not Papua New Guinea", ["Guinea"], exclude=["Papua New Guinea"])
    assert not contains_answer("anything", [""])


def test_numbers():
    assert last_number("23 + 45 = 68.") == 68 and first_number("23 + 45 = 68.") == 23
    assert last_number("It is -12 degrees") == -12
    assert last_number("5-3") == 3
    assert last_number("total: 1,234") == 1234
    assert last_number("12.0") == 12 and last_number("2.5") == 2.5
    assert last_number("none") is None and first_number("") is None


# --------------------------------------------------------------------------------------------------------------------
# countries
# --------------------------------------------------------------------------------------------------------------------


def _country_example(iso2: str, task: str = "capital", style: str = "question") -> Example:
    for split in SPLITS:
        for ex in load("countries", None, seed=0, split=split, task=task, style=style):
            if ex.meta["iso2"] == iso2:
                return ex
    raise AssertionError(iso2)


def test_capital_of_france():
    from lmlab.data.countries import capital_of

    assert capital_of("FR") == capital_of("FRA") == capital_of("france") == "Paris"
    assert capital_of("Colombia") == "Bogota"
    ex = _country_example("FR")
    assert ex.prompt == "What is the capital of France? Answer in one sentence."
    assert ex.target == "Paris" and ex.id == "countries/capital/FR"
    for out in ("paris", "PARIS.", "The capital of France is Paris."):
        assert grade("countries", ex, out) == 1.0
    for out in ("Lyon", "Parisian food", ""):
        assert grade("countries", ex, out) == 0.0
    assert _country_example("FR", style="completion").prompt == "The capital of France is"
    assert {"country", "iso2", "population", "continent", "answers"} <= set(ex.meta)
    with pytest.raises(ValueError, match="country"):
        capital_of("Atlantis")


def test_country_aliases_and_accents():
    co = _country_example("CO")
    assert grade("countries", co, "Bogotá") == grade("countries", co, "bogota") == 1.0
    kz = _country_example("KZ")
    assert grade("countries", kz, "Astana") == grade("countries", kz, "Nur-Sultan") == 1.0
    ua = _country_example("UA")
    assert grade("countries", ua, "Kiev") == 1.0
    il = _country_example("IL")
    assert grade("countries", il, "East Jerusalem") == 0.0
    assert grade("countries", il, "Jerusalem") == 1.0
    conakry = _country_example("GN", task="country_of_capital")
    assert grade("countries", conakry, "Guinea") == 1.0
    assert grade("countries", conakry, "Papua New Guinea") == 0.0
    au = _country_example("AU", task="currency")
    assert grade("countries", au, "the Australian dollar") == grade("countries", au, "the dollar") == 1.0
    assert grade("countries", au, "the US dollar") == 0.0
    nl = _country_example("NL", task="capital", style="completion")
    assert nl.prompt == "The capital of the Netherlands is"
    india = _country_example("IN", task="iso2")
    assert grade("countries", india, "IN") == 1.0
    assert grade("countries", india, "It is in Asia.") == 0.0  # case-sensitive: "in" is not the code
    eg = _country_example("EG", task="continent")
    assert grade("countries", eg, "Africa") == 1.0
    assert grade("countries", _country_example("FR", task="continent"), "Europe or Asia") == 0.0


def test_countries_pool_and_splits():
    from lmlab.data.countries import country_facts

    facts = country_facts()
    assert len(facts) == 250 and len(country_facts(with_capital_only=True)) == 244
    assert all(set(f) >= {"iso2", "iso3", "capital", "continent", "currency", "population"} for f in facts)
    sizes = [len(load("countries", None, seed=0, split=s)) for s in SPLITS]
    assert sum(sizes) == 244
    # Same split whatever the task, so few-shot shots (train) never leak test countries.
    test = {e.meta["iso2"] for e in load("countries", None, seed=0, split="test")}
    for ex in load("countries", None, seed=0, split="test", task="currency", style="fewshot"):
        assert ex.meta["iso2"] in test and not set(ex.meta["shots"]) & test
        assert ex.prompt.count("\n") == 3
    # "Singapore is the capital of which country?" gives the answer away and is left out.
    coc = {e.meta["iso2"] for s in SPLITS for e in load("countries", None, seed=0, split=s, task="country_of_capital")}
    assert "SG" not in coc and "MX" not in coc and "FR" in coc


def test_countries_stratified():
    exs = load("countries", 10, seed=0, stratify_by_population=True, strata=5)
    assert sorted(e.meta["population_quantile"] for e in exs) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_stop_markers_open_every_capital_steps_prompt_line():
    """The capital suite's stop markers stay in step with its prompts: a model that copies a question block starts
    a step with one of them (and so ends its answer in `StepModel`), while an answer line ("Peru: Lima") does not."""
    from lmlab.data.countries import STOP_MARKERS

    def starts_block(line: str) -> bool:
        return line.lower().startswith(tuple(m.lower() for m in STOP_MARKERS))

    for ex in load("capital_steps", 5, seed=0, split="train"):
        assert all(starts_block(line) for line in ex.prompt.splitlines()), ex.prompt
        assert not any(starts_block(line) for line in ex.target.splitlines())


# --------------------------------------------------------------------------------------------------------------------
# arithmetic, permutations, greater_than, strings, ioi
# --------------------------------------------------------------------------------------------------------------------


def test_arithmetic_targets_match_eval():
    for ex in load("arithmetic", 50, seed=0, digits=3):
        assert ex.prompt.endswith(" =")
        assert str(eval(ex.prompt[:-2])) == ex.target == str(eval(ex.meta["expression"]))
        assert int(ex.target) >= 0
    for ex in load("arithmetic", 30, seed=0, kind="word"):
        assert str(eval(ex.meta["expression"])) == ex.target
        assert str(ex.meta["a"]) in ex.prompt and str(ex.meta["b"]) in ex.prompt
    ex = load("arithmetic", 1, seed=0)[0]
    assert grade("arithmetic", ex, f"Let me think: 1 + 1 = 2, so the answer is {int(ex.target):,}.") == 1.0
    with pytest.raises(ValueError, match="larger than"):
        load("arithmetic", 60, seed=0, digits=1, ops="+")  # the test split holds ~50 of the 100 sums


def test_permutation_composition_hand_worked():
    from lmlab.data.permutations import compose

    # p1 = [2 3 1]: 1->2, 2->3, 3->1; then p2 = [2 1 3] swaps 1 and 2: 1->2->1, 2->3->3, 3->1->2.
    assert compose([[2, 3, 1], [2, 1, 3]]) == [1, 3, 2]
    assert compose([[2, 1, 3], [2, 3, 1]]) == [3, 2, 1]  # the other order differs: composition is not commutative
    for ex in load("permutations", 20, seed=0, n_elements=4, length=3):
        assert ex.target == "[" + " ".join(map(str, compose(ex.meta["perms"]))) + "]"
        assert sorted(ex.meta["composed"]) == [1, 2, 3, 4]
    ex = load("permutations", 1, seed=0)[0]
    spaced = ", ".join(ex.target.strip("[]").split())
    assert grade("permutations", ex, f"p1 gives [5 4 3 2 1], so the answer is [{spaced}]") == 1.0
    assert grade("permutations", ex, ex.target.strip("[]") + "\nbecause ...") == 1.0
    assert sum(len(load("permutations", None, seed=0, split=s, n_elements=3, length=1)) for s in SPLITS) == 6
    with pytest.raises(ValueError, match="n must be an int"):
        load("permutations", None, n_elements=7, length=4)  # 5040**4 sequences: sampled, not enumerated


def test_greater_than_sets():
    for ex in load("greater_than", 40, seed=0):
        yy = int(ex.meta["yy"])
        assert 2 <= yy <= 98
        assert ex.meta["correct"] == [f"{y:02d}" for y in range(yy + 1, 100)]
        assert set(ex.meta["correct"]) | set(ex.meta["incorrect"]) == {f"{y:02d}" for y in range(100)}
        assert ex.prompt.endswith(f"to the year {ex.meta['century']}")
        assert str(ex.meta["start_year"]) in ex.prompt
        assert grade("greater_than", ex, "99") == 1.0
        assert grade("greater_than", ex, f"{yy:02d}") == 0.0
        assert grade("greater_than", ex, "9") == 0.0


def test_strings_targets():
    for ex in load("strings", None, seed=0, task="count"):
        assert ex.target == str(ex.meta["word"].count(ex.meta["letter"]))
    rev = load("strings", 1, seed=0, task="reverse")[0]
    assert rev.target == rev.meta["word"][::-1]
    assert grade("strings", rev, f'The reversed word is "{rev.target}".') == 1.0
    up = load("strings", 1, seed=0, task="uppercase")[0]
    assert grade("strings", up, up.target.lower()) == 0.0
    cnt = load("strings", 1, seed=0, task="count")[0]
    assert grade("strings", cnt, f"It appears {['zero', 'one', 'two', 'three'][int(cnt.target)]} times.") == 1.0


def test_ioi_structure():
    for ex in load("ioi", 30, seed=0):
        io, s, c = ex.meta["io"], ex.meta["s"], ex.meta["c"]
        assert ex.target == f" {io}" and ex.choices == (f" {io}", f" {s}")
        assert len({io, s, c}) == 3
        assert ex.prompt.count(s) == 2 and ex.prompt.count(io) == 1
        corrupted = ex.meta["corrupted_prompt"]
        assert corrupted.count(c) == 1 and corrupted.count(s) == 1
        assert corrupted.replace(f" {c} ", f" {s} ") == ex.prompt
        first = ex.prompt.index(io) < ex.prompt.index(s)
        assert first == (ex.meta["order"] == "ABBA")
    ex = load("ioi", 1, seed=0)[0]
    assert grade("ioi", ex, ex.meta["io"] + "land") == 0.0


def test_ioi_names_are_single_tokens():
    from lmlab.data.ioi import NAMES

    files = sorted(Path.home().glob(".cache/lmlab/models/*/tokenizer.json"))
    if not files:
        pytest.skip("no cached tokenizer.json to check against")
    from tokenizers import Tokenizer

    for path in files:
        tok = Tokenizer.from_file(str(path))
        multi = [n for n in NAMES if len(tok.encode(f" {n}", add_special_tokens=False).ids) != 1]
        assert not multi, (path.parent.name, multi)


# --------------------------------------------------------------------------------------------------------------------
# humaneval, corpus, instructions
# --------------------------------------------------------------------------------------------------------------------


def test_humaneval_problems():
    from lmlab.data.humaneval import problem

    sizes = [len(load("humaneval", None, seed=0, split=s)) for s in SPLITS]
    assert sum(sizes) == 164 and sizes == [66, 16, 82]
    ex = load("humaneval", 1, seed=0)[0]
    assert f"def {ex.meta['entry_point']}" in ex.prompt and "def check(candidate)" in ex.meta["test"]
    p = problem(ex)
    assert p["prompt"] == ex.prompt and p["canonical_solution"] == ex.target and p["task_id"].startswith("HumanEval/")


def test_corpus_passages():
    from lmlab.data.corpus import corpus_text

    exs = load("corpus", None, seed=0, split="test")
    assert len(exs) > 100
    assert all(200 <= len(e.prompt) <= 1000 and e.target == "" for e in exs)
    assert all(e.meta["python"] == list(sys.version_info[:2]) for e in exs)
    assert all(e.meta["document"].startswith("stdlib:") for e in exs)
    # Prose passages are reflowed paragraphs: no doctest prompts, no hard-wrapped lines.
    assert not any(">>>" in e.prompt for e in exs)
    docs = {s: {e.meta["document"] for e in load("corpus", None, seed=0, split=s)} for s in SPLITS}
    assert not docs["train"] & docs["test"] and not docs["dev"] & docs["test"]
    text = corpus_text("train", seed=0, max_chars=5000)
    assert 0 < len(text) <= 5000 and text == corpus_text("train", seed=0, max_chars=5000)
    small = load("corpus", 5, seed=0, kind="all", min_chars=50, max_chars=120)
    assert all(50 <= len(e.prompt) <= 120 for e in small)
    with pytest.raises(ValueError, match="max_chars"):
        load("corpus", 1, min_chars=500, max_chars=100)
    with pytest.raises(ValueError, match="sources"):
        load("corpus", 1, sources=("wikipedia",))


def test_instructions():
    from lmlab.data.instructions import INSTRUCTIONS

    assert len(INSTRUCTIONS) == 40 and len({i for i, _, _ in INSTRUCTIONS}) == 40
    allx = [e for s in SPLITS for e in load("instructions", None, seed=0, split=s)]
    assert sorted(e.prompt for e in allx) == sorted(t for _, _, t in INSTRUCTIONS)
    assert grade("instructions", allx[0], "Sure.") == 1.0 and grade("instructions", allx[0], "\n") == 0.0
