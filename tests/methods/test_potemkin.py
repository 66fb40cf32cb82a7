"""Invariants of the potemkin metrics: closed forms, keystone conditioning, the oracle / random / constant controls,
the concept checkers, the backend agent and its calibrated yes/no (a fake backend and `lmlab serve` on loopback), the
experiment's gated checks against constant Yes/No responders, and one-line errors on bad input."""

from __future__ import annotations

import math
import random
import re
import zlib
from collections import defaultdict

import pytest

from lmlab.methods.evaluation.potemkin.concepts import CONCEPTS, PAPER_CONCEPTS, get_concepts
from lmlab.methods.evaluation.potemkin.method import (
    BackendAgent,
    ChoiceItem,
    ConstantAgent,
    OracleAgent,
    Question,
    RandomAgent,
    TextItem,
    YesNoItem,
    build_benchmark,
    grade_use,
    incoherence,
    lower_bound,
    potemkin_rates,
    run_benchmark,
    run_lower_bound,
    scaled_rate,
)

G = CONCEPTS  # short


def _game(ax, ay, bx, by):
    return ((ax, ay), (bx, by))


PRISONERS = _game((3, 3), (0, 5), (5, 0), (1, 1))  # A = cooperate
PENNIES = _game((1, -1), (-1, 1), (-1, 1), (1, -1))


# ----------------------------------------------------------------------------------------------------------------
# closed forms


def test_scaled_rate_is_the_papers_formula_with_binomial_se():
    r = scaled_rate([True, False, False, True], 2.0)
    assert r.value == pytest.approx(1.0) and r.se == pytest.approx(2 * math.sqrt(0.25 / 4)) and r.n == 4
    r = scaled_rate([True, True, True, False], 1.0)
    assert r.value == pytest.approx(0.25) and r.se == pytest.approx(math.sqrt(0.25 * 0.75 / 4))
    assert math.isnan(scaled_rate([], 2.0).value)


def test_checkers_on_known_games_and_numbers():
    assert G["strict_dominance"].is_instance(PRISONERS)  # B (defect) strictly dominates for Row
    assert G["pure_nash"].is_instance(PRISONERS)
    assert G["pareto_optimality"].is_instance(PRISONERS)  # (cooperate, cooperate) is Pareto optimal
    assert G["symmetric_game"].is_instance(PRISONERS) and not G["zero_sum"].is_instance(PRISONERS)
    assert G["zero_sum"].is_instance(PENNIES) and not G["pure_nash"].is_instance(PENNIES)
    assert not G["strict_dominance"].is_instance(PENNIES) and not G["weak_dominance"].is_instance(PENNIES)
    tie = _game((1, 0), (2, 0), (1, 0), (1, 0))  # A >= B everywhere, > against Y: weak, not strict
    assert G["weak_dominance"].is_instance(tie) and not G["strict_dominance"].is_instance(tie)
    assert not G["pareto_optimality"].is_instance(_game((1, 1), (2, 2), (0, 0), (0, 0)))
    assert G["prime"].is_instance(97) and not G["prime"].is_instance(91) and not G["prime"].is_instance(7)
    assert G["perfect_square"].is_instance(144) and not G["perfect_square"].is_instance(145)
    assert G["arithmetic_progression"].is_instance((3, 5, 7, 9))
    assert not G["arithmetic_progression"].is_instance((3, 5, 8, 9))
    assert not G["arithmetic_progression"].is_instance((2, 2, 2, 2))  # a nonzero difference
    assert G["palindrome"].is_instance("level") and not G["palindrome"].is_instance("lever")


@pytest.mark.parametrize("key", list(CONCEPTS))
def test_samplers_parsers_and_oracle_edits_are_consistent(key):
    c = CONCEPTS[key]
    rng = random.Random(key)
    for positive in (True, False):
        for _ in range(30):
            x = c.sample_where(rng, positive)
            assert bool(c.is_instance(x)) == positive
            assert c.parse(c.render(x)) == x  # the renderer round-trips through the free-text parser
            y = c.edit_to(x, not positive)
            if y is not None:
                assert bool(c.is_instance(y)) != positive and y != x
    assert c.parse("no answer here") is None or key == "palindrome"


def test_paper_concept_list_is_kept_as_facts():
    assert sum(len(v) for v in PAPER_CONCEPTS.values()) == 33  # 12 + 12 + 9 names in the official constants.py
    paper_gt = {n.lower().replace("-", " ") for n in PAPER_CONCEPTS["game theory"]}
    for key in ("strict_dominance", "weak_dominance", "zero_sum", "symmetric_game"):
        assert CONCEPTS[key].name.lower().replace("-", " ") in paper_gt


# ----------------------------------------------------------------------------------------------------------------
# controls and conditioning


@pytest.fixture(scope="module")
def bench():
    return build_benchmark(list(CONCEPTS.values()), seed=0, n_classify=10, n_generate=3, n_edit=3, n_incoherence=6)


def test_the_oracle_scores_zero_everywhere(bench):
    recs = run_benchmark(OracleAgent(), bench)
    rates = potemkin_rates(recs)
    for task in ("classify", "generate", "edit"):
        assert rates[task]["potemkin"]["value"] == 0.0 and rates[task]["potemkin"]["n"] > 0
        assert rates[task]["parse_failure"] == 0.0
    assert incoherence(recs).value == 0.0


def test_the_random_responder_scores_about_one_on_scaled_metrics():
    bench = build_benchmark(list(CONCEPTS.values()), seed=1, n_classify=40, n_generate=0, n_edit=0,
                            n_incoherence=40)  # fmt: skip
    recs = run_benchmark(RandomAgent(3), bench)
    inc = incoherence(recs)
    assert abs(inc.value - 1.0) < 3 * inc.se + 0.05
    # classify accuracy of a coin is 0.5 whatever the keystone: the scaled rate over all items is about 1
    cls = [r.correct for r in recs if r.task == "classify"]
    assert abs(scaled_rate(cls, 2.0).value - 1.0) < 0.2


class Scripted:
    """Right on zero_sum's keystone and wrong on every zero_sum use; wrong keystone and right uses elsewhere."""

    name = "scripted"

    def __init__(self):
        self.oracle = OracleAgent()

    def choose(self, item):
        return item.gold if "Zero-Sum" in item.prompt else (item.gold + 1) % len(item.options)

    def yes_no(self, item):
        return (not item.gold) if "zero-sum" in item.prompt else item.gold

    def text(self, item):
        return "nothing" if "zero-sum" in item.prompt else item.oracle()


def test_the_rate_is_conditional_on_the_keystone():
    bench = build_benchmark(get_concepts(["zero_sum", "palindrome"]), seed=0, distractor_pool=list(CONCEPTS.values()))
    rates = potemkin_rates(run_benchmark(Scripted(), bench))
    # only zero_sum (keystone right) counts, and all its uses are wrong: classify 2 x 1, generate / edit 1
    assert rates["classify"]["potemkin"]["value"] == pytest.approx(2.0)
    assert rates["generate"]["potemkin"]["value"] == pytest.approx(1.0)
    assert rates["edit"]["potemkin"]["value"] == pytest.approx(1.0)
    assert rates["classify"]["potemkin"]["n"] == 10
    # the unconditional accuracy mixes in palindrome's right answers; the gap is P(right | key) - P(right | no key)
    assert rates["classify"]["accuracy"] == pytest.approx(0.5)
    assert rates["classify"]["gap"] == pytest.approx(-1.0)


class AlwaysYes(OracleAgent):
    name = "always_yes"

    def yes_no(self, item):
        return True


def test_always_yes_classifier_gets_scaled_rate_one_on_balanced_classes(bench):
    rates = potemkin_rates(run_benchmark(AlwaysYes(), bench, tasks=("classify",)))
    assert rates["classify"]["potemkin"]["value"] == pytest.approx(1.0)


def test_constant_responders_mark_the_values_of_an_uninformative_yes_no(bench):
    # intents alternate non-example / example: a constant answer agrees with half of them -> 2 (1 - 0.5) = 1
    pairs = [(_q(i, str(i + 1)), _q(i + 10, str(i + 11))) for i in range(4)]
    for answer, lb in ((True, 0.0), (False, 2.0)):
        agent = ConstantAgent(answer)
        recs = run_benchmark(agent, bench)
        assert incoherence(recs).value == pytest.approx(1.0)
        assert potemkin_rates(recs)["classify"]["potemkin"]["value"] == pytest.approx(1.0)
        assert potemkin_rates(recs)["generate"]["potemkin"]["value"] == 0.0  # its text is the oracle's
        assert lower_bound(run_lower_bound(agent, pairs)).value == pytest.approx(lb)
    assert (ConstantAgent(True).name, ConstantAgent(False).name) == ("always_yes", "always_no")


def test_grading_of_generate_and_edit():
    bench = build_benchmark(get_concepts(["prime"]), seed=0, n_classify=0, n_generate=2, n_edit=2, n_incoherence=2,
                            distractor_pool=list(CONCEPTS.values()))  # fmt: skip
    c = CONCEPTS["prime"]
    gen = [u for u in bench.concepts[0].uses if u.task == "generate"][0]
    assert grade_use(c, gen, gen.request.oracle()) == (True, True)
    assert grade_use(c, gen, "11") == (gen.check(11), True)  # a prime that may miss the constraint
    assert grade_use(c, gen, "12") == (False, True) and grade_use(c, gen, "none") == (False, False)
    edit = [u for u in bench.concepts[0].uses if u.task == "edit"][0]
    assert grade_use(c, edit, c.render(edit.source)) == (False, True)  # an unchanged instance is no edit
    assert grade_use(c, edit, edit.request.oracle()) == (True, True)


def _q(i, answer):
    return Question(f"q{i}", f"{i} + 1 =", answer, "0", lambda out, a=answer: out.strip() == a, 4)


def test_lower_bound_counts_self_graded_failures_on_right_keystones_only():
    pairs = [(_q(i, str(i + 1)), _q(i + 10, str(i + 11))) for i in range(6)]
    assert lower_bound(run_lower_bound(OracleAgent(), pairs)).value == 0.0

    class Doubter(OracleAgent):
        def yes_no(self, item):
            return False

    assert lower_bound(run_lower_bound(Doubter(), pairs)).value == pytest.approx(2.0)

    class WrongOnEven(OracleAgent):
        def text(self, item):
            return "x" if item.prompt.startswith(("0 ", "2 ", "4 ")) else item.oracle()

    recs = run_lower_bound(WrongOnEven(), pairs)
    graded = [r for r in recs if r.task == "self_grade"]
    assert len(graded) == 3 and all(r.extra["grade_agrees"] for r in graded)


# ----------------------------------------------------------------------------------------------------------------
# backend agent


class FakeBackend:
    name = "fake"

    def __init__(self, scores, chat_reply="B"):
        self.scores, self.chat_reply, self.asked = scores, chat_reply, []

    def score(self, context, continuation):
        self.asked.append((context, continuation))
        return self.scores[continuation]

    def chat(self, messages, **kw):
        from lmlab.core.execution.backends import Completion

        return Completion(self.chat_reply)


def test_backend_agent_normalises_choices_per_character_and_compares_yes_no():
    fake = FakeBackend(
        {" short": [-2.0], " a much longer option": [-1.0] * 5, " Yes": [-0.5], " No": [-1.5]},
        chat_reply="A,X=(1,0) A,Y=(1,0) B,X=(0,0) B,Y=(0,0)",
    )
    agent = BackendAgent(fake)
    # summed: short (-2) beats long (-5); per character: long (-5/20) beats short (-2/5)
    assert agent.choose(ChoiceItem("Q?", ["short", "a much longer option"], 0)) == 1
    assert agent.yes_no(YesNoItem("Is it?", False)) is True
    assert fake.asked[-1][0].startswith("Question: Is it? Answer Yes or No.") and fake.asked[-1][0].endswith("Answer:")
    assert "A,X" in agent.text(TextItem("Give a game.", lambda: "", lambda r: ""))


def test_backend_agent_chat_mode_parses_letters_and_yes():
    agent = BackendAgent(FakeBackend({}, chat_reply="The answer is B."), mode="chat")
    assert agent.choose(ChoiceItem("Q?", ["x", "y", "z"], 0)) == 1
    assert BackendAgent(FakeBackend({}, chat_reply="Yes, it is."), mode="chat").yes_no(YesNoItem("?", False))
    assert BackendAgent(FakeBackend({}, chat_reply="Q"), mode="chat").choose(ChoiceItem("Q?", ["x", "y"], 0)) == -1


# ----------------------------------------------------------------------------------------------------------------
# the calibrated yes/no decision


class NoBiased:
    """A backend that knows the answer but leans to " No": log-odds d = +1 − 5 on a true statement, −1 − 5 on a
    false one (the plain log p(Yes) > log p(No) answers No to everything, as SmolLM2 did). `truth(context)` reads the
    statement; chat answers "13" to a request for a prime and "15" to one for a non-prime, and `answers(prompt)` to
    anything else."""

    name = "no-biased"

    def __init__(self, truth, answers=lambda prompt: ""):
        self.truth, self.answers = truth, answers

    def score(self, context, continuation):
        if continuation not in (" Yes", " No"):
            return [-1.0]
        return [(1.0 if self.truth(context) else -1.0) - 5.0] if continuation == " Yes" else [0.0]

    def chat(self, messages, **kw):
        from lmlab.core.execution.backends import Completion

        prompt = messages[-1]["content"]
        if "prime" in prompt:
            return Completion("15" if CONCEPTS["prime"].negative in prompt else "13")
        return Completion(self.answers(prompt))


def _prime_truth(context):
    return bool(CONCEPTS["prime"].is_instance(int(re.search(r"\d+", context).group())))


def test_calibrated_yes_no_answers_yes_on_half_of_balanced_items_by_the_log_odds():
    numbers = (11, 12, 13, 14, 17, 18, 19, 20)
    items = [YesNoItem(f"Is {n} a prime number?", _prime_truth(str(n)), "classify:prime") for n in numbers]
    agent, plain = BackendAgent(NoBiased(_prime_truth)), BackendAgent(NoBiased(_prime_truth), calibrated=False)
    assert agent.calibrate("classify:prime", items) == pytest.approx(-5.0)  # the median log-odds
    assert [agent.yes_no(i) for i in items] == [i.gold for i in items]  # Yes on exactly the 4 primes
    assert agent.calls == 2 * len(items)  # calibration and decision share one pair of scores per prompt
    assert plain.calibrate("classify:prime", items) is None and not any(plain.yes_no(i) for i in items)
    # log-odds that do not depend on the item: every decision is a tie, broken by a fixed coin per prompt
    flat = BackendAgent(FakeBackend({" Yes": [-1.0], " No": [-1.0]}))
    many = [YesNoItem(f"Is {n} a prime number?", n % 2 == 0, "f") for n in range(20)]
    flat.calibrate("f", many)
    said = [flat.yes_no(i) for i in many]
    assert 0 < sum(said) < len(said) and said == [flat.yes_no(i) for i in many]
    with pytest.raises(ValueError, match="must be balanced"):
        agent.calibrate("f", [YesNoItem("Is 13 a prime number?", True)] * 3)


def test_run_benchmark_calibrates_classify_and_self_classification_per_concept():
    bench = build_benchmark(get_concepts(["prime"]), seed=0, n_classify=8, n_generate=0, n_edit=0, n_incoherence=4,
                            distractor_pool=list(CONCEPTS.values()))  # fmt: skip
    for calibrated, want in ((True, 0.0), (False, 1.0)):
        agent = BackendAgent(NoBiased(_prime_truth), calibrated=calibrated)
        recs = run_benchmark(agent, bench)
        classify = [r for r in recs if r.task == "classify"]
        # calibrated: the threshold sits between the two log-odds levels, every answer right (old code: all No = 1)
        assert scaled_rate([r.correct for r in classify], 2.0).value == pytest.approx(want)
        assert incoherence(recs).value == pytest.approx(want)  # self-classification uses the concept's threshold
        assert all("log_odds" in r.extra for r in recs if r.task in ("classify", "incoherence"))
    assert agent.thresholds == {}


def test_lower_bound_calibrates_the_self_grade_on_balanced_related_answers():
    # keystones "i + 1 =" answered right; related "20+i + 1 =" right for even i, wrong ("0") for odd i
    pairs = [(_q(i, str(i + 1)), _q(20 + i, str(21 + i))) for i in range(6)]

    def answers(prompt):
        n = int(prompt.split(" + ")[0])
        return str(n + 1) if n < 20 or n % 2 == 0 else "0"

    def truth(context):
        m = re.search(r"(\d+) \+ 1 =\nProposed answer: (\S+)", context)
        return int(m.group(2)) == int(m.group(1)) + 1

    for calibrated, want in ((True, 1.0), (False, 2.0)):
        agent = BackendAgent(NoBiased(truth, answers), calibrated=calibrated)
        recs = run_lower_bound(agent, pairs)
        graded = [r for r in recs if r.task == "self_grade"]
        assert len(graded) == 6 and sum(r.extra["answer_correct"] for r in graded) == 3
        # calibrated: "correct" on exactly its 3 right answers, 2 (1 - 3/6) = 1; the plain decision says "No" to all
        assert lower_bound(recs).value == pytest.approx(want)
        assert all(r.extra["grade_agrees"] for r in graded) == calibrated


# ----------------------------------------------------------------------------------------------------------------
# the experiment's gated checks


class SaysNo(OracleAgent):
    """Right on everything but its yes/no answers, which are always No: the review's always-No responder."""

    name = "says_no"
    backend = FakeBackend({})  # the run names each LLM system's backend in its judge flag

    def yes_no(self, item):
        return False


class SaysYes(SaysNo):
    name = "says_yes"

    def yes_no(self, item):
        return True


class Planted(OracleAgent):
    """Right keystones; a fixed quarter of its yes/no answers and the free text of about half its generate / edit /
    incoherence requests wrong (by a hash of the prompt): potemkins inside every band."""

    name = "planted"
    backend = FakeBackend({})

    def yes_no(self, item):
        return item.gold != (zlib.crc32(item.prompt.encode()) % 4 == 0)

    def text(self, item):
        wrong = item.prompt.startswith(("Give an example", "Here is a")) and zlib.crc32(item.prompt.encode()) % 2
        return "nothing" if wrong else item.oracle()


def test_every_gated_check_fails_for_a_constant_yes_no_responder(monkeypatch):
    from lmlab.methods.evaluation.potemkin import experiment
    from lmlab.runner import run_method

    stand_ins = [Planted(), SaysNo(), SaysYes()]
    monkeypatch.setattr(experiment, "_agents", lambda ctx, cfg: [(a.name, a, True) for a in stand_ins])
    result = run_method("potemkin", preset="default", model="tiny-llama", models=[], write=False, plots=False,
                        show_progress=False, raise_errors=True, threads=1)  # fmt: skip
    m = {(r.system, r.metric): r.value for r in result.metrics}
    for system, lb in (("always_yes", 0.0), ("always_no", 2.0)):  # the controls the bands are built from
        assert m[(system, "lower_bound")] == lb and m[(system, "incoherence")] == pytest.approx(1.0)
        assert m[(system, "potemkin_classify")] == pytest.approx(1.0) and m[(system, "potemkin_edit")] == 0.0
    gated = defaultdict(list)
    for c in result.claims:
        if c.gate:
            gated[c.method].append(c)
            assert c.null_status != "supported", c.text  # the constant responder in the model's place fails
    # old code: incoherence 1 and lower bound 2 (says_no), classify rate 1 (both) held "above the oracle's 0"
    for system in ("says_no", "says_yes"):
        assert len(gated[system]) == 5
        assert [c.status for c in gated[system]] == ["not_supported"] * 5, [(c.text, c.ci) for c in gated[system]]
    # and the checks can hold: a planted potemkin agent passes all five
    assert [c.status for c in gated["planted"]] == ["supported"] * 5, [(c.text, c.ci) for c in gated["planted"]]
    band = {c.metric: c for c in gated["says_no"]}
    assert band["lower_bound"].baseline == "always_no" and band["lower_bound"].baseline_value == 2.0
    assert band["potemkin_generate"].baseline == "oracle"  # the constant responders score 0 there, like the oracle


@pytest.mark.loopback
def test_core_loop_through_lmlab_serve_equals_the_local_backend(tiny_llama, tiny_tokenizer):
    pytest.importorskip("openai")
    app_mod = pytest.importorskip("lmlab.serve.app")
    sched_mod = pytest.importorskip("lmlab.serve.scheduler")
    from lmlab.core.execution.backends import LocalBackend, OpenAIBackend
    from lmlab.serve.testing import ServerThread

    bench = build_benchmark(get_concepts(["zero_sum", "prime"]), seed=0, n_classify=2, n_generate=1, n_edit=1,
                            n_incoherence=2, max_tokens=8, distractor_pool=list(CONCEPTS.values()))  # fmt: skip
    pairs = [(_q(1, "2"), _q(2, "3"))]
    local = BackendAgent(LocalBackend(tiny_llama, tiny_tokenizer))
    want = run_benchmark(local, bench) + run_lower_bound(local, pairs)
    sched = sched_mod.Scheduler(tiny_llama, tiny_tokenizer, engine="fast", max_batch=8, max_context=4096)
    try:
        with ServerThread(app_mod.create_app(sched, tiny_tokenizer, served_name="tiny")) as srv:
            remote = BackendAgent(OpenAIBackend(srv.base_url, "tiny", max_retries=0, timeout=60))
            got = run_benchmark(remote, bench) + run_lower_bound(remote, pairs)
            assert sched.stats()["generated_tokens"] > 0
    finally:
        sched.close()
    assert [(r.task, r.concept, r.correct, r.output) for r in got] == [
        (r.task, r.concept, r.correct, r.output) for r in want
    ]


@pytest.mark.loopback
def test_the_experiment_runs_against_an_openai_endpoint_without_a_local_model(tiny_llama, tiny_tokenizer,
                                                                             monkeypatch, tmp_path):  # fmt: skip
    pytest.importorskip("openai")
    app_mod = pytest.importorskip("lmlab.serve.app")
    sched_mod = pytest.importorskip("lmlab.serve.scheduler")
    from lmlab.runner import RunContext, run_method
    from lmlab.serve.testing import ServerThread

    def no_local_model(self, *args, **kwargs):
        raise AssertionError("potemkin on an API backend must not load a local model")

    monkeypatch.setattr(RunContext, "load_model", no_local_model)
    sched = sched_mod.Scheduler(tiny_llama, tiny_tokenizer, engine="fast", max_batch=8, max_context=4096)
    try:
        with ServerThread(app_mod.create_app(sched, tiny_tokenizer, served_name="tiny")) as srv:
            backend = f"openai:{srv.base_url}#tiny"
            result = run_method("potemkin", preset="smoke", model="tiny-llama", backend=backend, show_progress=False,
                                folder=tmp_path / "p", raise_errors=True, threads=1)  # fmt: skip
    finally:
        sched.close()
    rows = {(m.system, m.metric): m for m in result.metrics}
    assert result.run_info["status"] == "ok" and result.config["backend"] == backend
    assert ("endpoint", "incoherence") in rows and ("oracle", "incoherence") in rows
    assert rows[("endpoint", "wall_s")].note.endswith("backend calls")
    assert "endpoint: openai:" in result.flags["judge"]


# ----------------------------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"concepts": ["haiku"]}, "unknown concept 'haiku'"),
        ({"concepts": []}, "concepts must be a non-empty list"),
        ({"n_incoherence": 1}, "n_incoherence must be in"),
        ({"n_incoherence": 5}, "n_incoherence must be even"),
        ({"n_classify": 3}, "n_classify must be even"),
        ({"n_classify": 0}, "n_classify must be in"),
        ({"n_options": 1}, "n_options must be in"),
        ({"backend": "vllm:foo"}, "backend must be 'local' or a backend spec"),
        ({"mode": "rest"}, "mode"),
        ({"lb_suites": ["mmlu"]}, "lb_suites must be among"),
        ({"models": ["a", "a"]}, "models must not repeat"),
    ],
)
def test_bad_config_is_a_one_line_value_error(overrides, match):
    from lmlab.config import build_config
    from lmlab.methods.evaluation.potemkin.config import PotemkinConfig

    with pytest.raises(ValueError, match=match) as info:
        build_config(PotemkinConfig, overrides)
    assert "\n" not in str(info.value)


def test_bad_arguments_of_the_api():
    with pytest.raises(ValueError, match="concepts is empty"):
        build_benchmark([])
    with pytest.raises(ValueError, match="n_classify must be an integer >= 0"):
        build_benchmark(get_concepts(["prime"]), n_classify=-1)
    with pytest.raises(ValueError, match="distractor definitions"):
        build_benchmark(get_concepts(["prime"]))  # a 4-way keystone needs 3 other concepts
    with pytest.raises(ValueError, match="mode must be"):
        BackendAgent(FakeBackend({}), mode="rest")
    with pytest.raises(ValueError, match="tasks must be among"):
        run_benchmark(OracleAgent(), build_benchmark(list(CONCEPTS.values())[:4]), tasks=("define",))
