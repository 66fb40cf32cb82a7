"""Potemkin understanding (Mancoridis, Weeks, Vafa, Mullainathan; ICML 2025, https://arxiv.org/abs/2506.21521).

A keystone is a question a human who gets it right cannot get right while misunderstanding the concept (here: the
concept's definition). A potemkin is a use of the concept that is wrong although the keystone was right:

    potemkin rate(task)  = s_task · (1 − P(use correct | keystone correct)),   s_classify = 2, s_generate = s_edit = 1
    SE                   = s_task · sqrt(p (1 − p) / n)                          (binomial, p = the unscaled rate)
    potemkin lower bound = 2 · (1 − P(self-grade "correct" | keystone correct))  (Procedure 2, SE as above)
    incoherence          = 2 · (1 − P(self-classification agrees with the intent))

The x2 applies where chance accuracy is 0.5 (yes/no classification, self-grading, self-classification), so that a
random responder scores 1 and a perfect one 0. Procedure 2 is a *lower* bound: a self-graded "incorrect" means the
answer or the grade is wrong, and either is a potemkin.

Everything an LLM does here goes through an `Agent` with lm-evaluation-harness's three request types: `choose`
(multiple choice by summed log-likelihood per character), `yes_no` (a calibrated log-odds threshold, below) and `text`
(greedy chat generation). `BackendAgent` runs them on any `lmlab.core.execution.backends.TextBackend` (a local model
or an OpenAI-compatible server; ``mode="chat"`` for chat-only endpoints, which parses letters and yes/no from chat
replies); `OracleAgent` (the programmatic solver), `RandomAgent` and `ConstantAgent` are the metric controls.
Judging (the self-grade of Procedure 2, the self-classification of incoherence) is the same agent: the paper's
self-judging, as the paper does it.

The Yes/No decision is calibrated on balanced items (the spec's pitfall: a small model's raw log p(" Yes") vs
log p(" No") answers one way whatever it is asked, and a constant answer alone scores incoherence 1 and a lower bound
of 0 or 2). Per family of prompts (one concept's classify questions; one Procedure-2 suite's self-grades):

    d(x)      = log p(" Yes" | x) − log p(" No" | x)
    t_family  = median of d over the family's balanced items       (half true, half false: no other label is used)
    yes_no(x) = d(x) > t_family                                    (d = t: a fixed coin per prompt)

so the agent answers Yes on half of the balanced items. The classify questions of a concept are its calibration items
(a concept's self-classifications in the incoherence test use the same threshold); Procedure 2 calibrates each suite
on its related questions shown with the right answer (even pairs) or a wrong one (odd pairs). `ConstantAgent`
("always_yes" / "always_no": the oracle with a constant Yes/No) marks the values an uninformative decision gets:
classify rate and incoherence 1 (balanced items and intents), lower bound 0 (Yes) or 2 (No).

No I/O or printing here.
"""

from __future__ import annotations

import math
import random
import re
import statistics
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from lmlab.methods.evaluation.potemkin.concepts import Concept

__all__ = [
    "SCALE",
    "TASKS",
    "Agent",
    "BackendAgent",
    "Benchmark",
    "ChoiceItem",
    "ConstantAgent",
    "OracleAgent",
    "Question",
    "RandomAgent",
    "Rate",
    "Record",
    "TextItem",
    "YesNoItem",
    "build_benchmark",
    "build_lower_bound",
    "fit_threshold",
    "grade_use",
    "incoherence",
    "lower_bound",
    "potemkin_rates",
    "run_benchmark",
    "run_lower_bound",
    "scaled_rate",
]

TASKS: tuple[str, ...] = ("classify", "generate", "edit")
SCALE: dict[str, float] = {"classify": 2.0, "generate": 1.0, "edit": 1.0, "self_grade": 2.0, "incoherence": 2.0}


# ----------------------------------------------------------------------------------------------------------------
# requests


@dataclass
class ChoiceItem:
    """A multiple-choice question: `prompt`, `options`, the index `gold` of the right one."""

    prompt: str
    options: list[str]
    gold: int


@dataclass
class YesNoItem:
    """A yes/no question with its true answer `gold` (the oracle's reply) and the `family` whose calibrated
    threshold decides it (``"classify:prime"``, ``"self_grade:arithmetic"``; empty: the plain comparison)."""

    prompt: str
    gold: bool
    family: str = ""


@dataclass
class TextItem:
    """A free-text request: `oracle()` is the solver's answer, `random(rng)` a random responder's."""

    prompt: str
    oracle: Callable[[], str]
    random: Callable[[random.Random], str]
    max_tokens: int = 48


class Agent(Protocol):
    name: str

    def choose(self, item: ChoiceItem) -> int: ...

    def yes_no(self, item: YesNoItem) -> bool: ...

    def text(self, item: TextItem) -> str: ...


def fit_threshold(log_odds: Sequence[float]) -> float:
    """The median of `log_odds`: on balanced items, answering Yes iff d > median answers Yes on half of them."""
    if not log_odds:
        raise ValueError("fit_threshold needs at least one log-odds value")
    return float(statistics.median(log_odds))


def _coin(prompt: str) -> bool:
    """A fixed fair coin per prompt: breaks a tie d = t without making the run depend on the call order."""
    return zlib.crc32(prompt.encode()) % 2 == 0


def _qa(prompt: str) -> str:
    return f"Question: {prompt}\nAnswer:"


LETTERS = "ABCDEFGH"


class BackendAgent:
    """An LLM behind a `TextBackend` (module docstring).

    Args:
        backend (`TextBackend`): `lmlab.core.execution.backends.LocalBackend` or `OpenAIBackend`.
        mode (`str`, defaults to ``"completions"``): ``completions`` scores and generates on plain
            ``"Question: ...\\nAnswer:"`` prompts (needs a server that echoes prompt log-probs, such as `lmlab serve`
            or vLLM); ``chat`` asks everything through chat and parses a letter / yes / no from the reply (any
            chat endpoint). Free text (generate, edit, answers) is a greedy chat reply in both modes.
        name (`str`, *optional*): the system name in results (default: the backend's).
        calibrated (`bool`, defaults to True): decide yes/no against each family's threshold fitted by `calibrate`
            (module docstring); False, or a family never calibrated: the plain log p(" Yes") > log p(" No"). Chat
            mode has no log-odds and is never calibrated.
    """

    def __init__(self, backend: Any, mode: str = "completions", name: str | None = None,
                 calibrated: bool = True) -> None:  # fmt: skip
        if mode not in ("completions", "chat"):
            raise ValueError(f"mode must be 'completions' or 'chat', got {mode!r}")
        self.backend, self.mode, self.calibrated = backend, mode, calibrated
        self.name = name or getattr(backend, "name", "backend")
        self.calls = 0
        self.thresholds: dict[str, float] = {}  # family -> t (median log-odds of its balanced items)
        self._log_odds: dict[str, float] = {}  # scored context -> d: calibration and decision share one pair of calls

    def choose(self, item: ChoiceItem) -> int:
        if self.mode == "chat":
            listing = "\n".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(item.options))
            reply = self._chat(f"{item.prompt}\n{listing}\nAnswer with the letter only.", 4)
            m = re.search(r"\b([A-H])\b", reply.upper())
            k = LETTERS.index(m.group(1)) if m else -1
            return k if 0 <= k < len(item.options) else -1
        ctx = _qa(item.prompt)
        scores = []
        for opt in item.options:
            self.calls += 1
            scores.append(sum(self.backend.score(ctx, " " + opt)) / max(1, len(opt)))  # acc_norm: per character
        return int(max(range(len(scores)), key=lambda i: scores[i]))

    def log_odds(self, item: YesNoItem) -> float | None:
        """d = log p(" Yes") − log p(" No") after the item's prompt (scored once per prompt); None in chat mode."""
        if self.mode == "chat":
            return None
        ctx = _qa(f"{item.prompt} Answer Yes or No.")
        if ctx not in self._log_odds:
            self.calls += 2
            self._log_odds[ctx] = sum(self.backend.score(ctx, " Yes")) - sum(self.backend.score(ctx, " No"))
        return self._log_odds[ctx]

    def calibrate(self, family: str, items: Sequence[YesNoItem]) -> float | None:
        """Fit `family`'s threshold on balanced `items` (as many true as false, ±1): the median log-odds, so that
        the agent answers Yes on half of them. Returns it (None where nothing is fitted: chat mode, not
        `calibrated`, no items)."""
        n_true = sum(bool(i.gold) for i in items)
        if abs(2 * n_true - len(items)) > 1:
            raise ValueError(f"calibration items of {family!r} must be balanced, got {n_true} true of {len(items)}")
        if self.mode == "chat" or not self.calibrated or not items:
            return None
        self.thresholds[family] = fit_threshold([self.log_odds(i) for i in items])
        return self.thresholds[family]

    def yes_no(self, item: YesNoItem) -> bool:
        if self.mode == "chat":
            reply = self._chat(f"{item.prompt} Answer Yes or No.", 3).strip().lower()
            return reply.startswith("yes")
        d = self.log_odds(item)
        t = self.thresholds.get(item.family) if self.calibrated else None
        if t is None:
            return d > 0
        return d > t or (d == t and _coin(item.prompt))

    def text(self, item: TextItem) -> str:
        # free text always through chat (the model's own template; the plain Question/Answer form for a model
        # without one, as `lmlab serve` renders it), greedy, in both modes
        return self._chat(item.prompt, item.max_tokens)

    def _chat(self, prompt: str, max_tokens: int) -> str:
        self.calls += 1
        return self.backend.chat([{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0.0).text


class OracleAgent:
    """The programmatic solver: right on every request, so every rate it gets must be 0 (a metric control)."""

    name = "oracle"

    def choose(self, item: ChoiceItem) -> int:
        return item.gold

    def yes_no(self, item: YesNoItem) -> bool:
        return item.gold

    def text(self, item: TextItem) -> str:
        return item.oracle()


class ConstantAgent(OracleAgent):
    """The oracle with a constant Yes/No (``always_yes`` / ``always_no``): every use it makes is right except its
    yes/no decisions, so it scores what an uninformative decision scores (classify rate and incoherence 1 on balanced
    items and intents, lower bound 0 or 2). A metric control: a gated check must not hold for it."""

    def __init__(self, answer: bool) -> None:
        self.answer = bool(answer)
        self.name = "always_yes" if self.answer else "always_no"

    def yes_no(self, item: YesNoItem) -> bool:
        return self.answer


class RandomAgent:
    """Uniform choices, fair yes/no coins, random instances: x2-scaled rates near 1 (a metric control)."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def choose(self, item: ChoiceItem) -> int:
        return self.rng.randrange(len(item.options))

    def yes_no(self, item: YesNoItem) -> bool:
        return self.rng.random() < 0.5

    def text(self, item: TextItem) -> str:
        return item.random(self.rng)


# ----------------------------------------------------------------------------------------------------------------
# Procedure 1: the benchmark


@dataclass
class UseItem:
    """One use question of a concept: `task` in TASKS, the request, and what grading needs."""

    task: str
    request: Any  # YesNoItem (classify) or TextItem (generate / edit)
    target: bool = True  # the polarity asked for (generate / edit) or the true label (classify)
    source: Any = None  # the instance an edit starts from
    check: Callable[[Any], bool] | None = None  # a generate constraint


@dataclass
class ConceptItems:
    concept: Concept
    define: ChoiceItem
    uses: list[UseItem]
    intents: list[bool]  # incoherence attempts: True = an example, False = a non-example
    max_tokens: int = 48  # the answer budget of this concept's free-text requests

    @property
    def family(self) -> str:
        """The calibration family of this concept's yes/no questions (classify and self-classification)."""
        return f"classify:{self.concept.key}"

    @property
    def calibration(self) -> list[YesNoItem]:
        """The balanced items the concept's yes/no threshold is fitted on: its classify questions."""
        return [u.request for u in self.uses if u.task == "classify"]


@dataclass
class Benchmark:
    """The seeded questions of every concept (the same for every agent)."""

    concepts: list[ConceptItems]
    seed: int


@dataclass
class Record:
    """One graded answer. `value` is the item's contribution to its scaled rate (s · (1 − correct))."""

    concept: str
    task: str  # classify / generate / edit / incoherence / self_grade
    keystone: bool
    correct: bool
    parsed: bool = True
    output: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def value(self) -> float:
        return SCALE.get(self.task, 1.0) * (1.0 - float(self.correct))


def _define_item(concept: Concept, pool: Sequence[Concept], rng: random.Random, n_options: int) -> ChoiceItem:
    others = [c.definition for c in pool if c.key != concept.key]
    if len(others) < n_options - 1:
        raise ValueError(f"the keystone needs {n_options - 1} distractor definitions, only {len(others)} other "
                         "concepts are known")  # fmt: skip
    options = [concept.definition, *rng.sample(others, n_options - 1)]
    order = list(range(n_options))
    rng.shuffle(order)
    return ChoiceItem(f"What is the definition of {concept.name}?", [options[i] for i in order], order.index(0))


def classify_prompt(concept: Concept, text: str) -> str:
    return concept.question.format(x=text)


def generate_prompt(concept: Concept, positive: bool, constraint: str = "") -> str:
    what = concept.positive if positive else concept.negative
    return f"Give an example of {what}{' ' + constraint if constraint else ''}. {concept.format_hint}"


def edit_prompt(concept: Concept, x: Any, positive: bool) -> str:
    what = concept.positive if positive else concept.negative
    return (f"Here is a {concept.noun}: {concept.render(x)}. Change it as little as possible so that it becomes "
            f"{what}. {concept.format_hint}")  # fmt: skip


def _random_instance_text(concept: Concept) -> Callable[[random.Random], str]:
    return lambda r: concept.render(concept.sample(r, r.random() < 0.5))


def build_benchmark(
    concepts: Sequence[Concept],
    *,
    seed: int = 0,
    n_classify: int = 10,
    n_generate: int = 3,
    n_edit: int = 3,
    n_incoherence: int = 6,
    n_options: int = 4,
    distractor_pool: Sequence[Concept] | None = None,
    max_tokens: int = 48,
) -> Benchmark:
    """The questions of every concept: one 4-way definition keystone, `n_classify` balanced yes/no instances,
    `n_generate` constrained generations, `n_edit` edits (alternately into and out of the concept) and
    `n_incoherence` generate-then-self-classify attempts (even: a non-example, odd: an example, as the paper). The
    classify questions alternate true / false, so an even `n_classify` is balanced (the concept's calibration items).
    """
    if not concepts:
        raise ValueError("concepts is empty; expected at least one Concept")
    for name, v, lo in (("n_classify", n_classify, 0), ("n_generate", n_generate, 0), ("n_edit", n_edit, 0),
                        ("n_incoherence", n_incoherence, 0), ("n_options", n_options, 2)):  # fmt: skip
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    pool = list(distractor_pool) if distractor_pool is not None else list(concepts)
    out = []
    for concept in concepts:
        rng = random.Random(f"potemkin:{seed}:{concept.key}")
        budget = min(max_tokens, concept.answer_tokens)
        define = _define_item(concept, pool, rng, n_options)
        uses: list[UseItem] = []
        for i in range(n_classify):
            label = i % 2 == 0
            x = concept.sample_where(rng, label)
            item = YesNoItem(classify_prompt(concept, concept.render(x)), label, f"classify:{concept.key}")
            uses.append(UseItem("classify", item, label, x))
        for _ in range(n_generate):
            cons = concept.constraint(rng)
            sol = concept.render(concept.sample_where(random.Random(rng.random()), True, cons.check))
            req = TextItem(generate_prompt(concept, True, cons.text), lambda sol=sol: sol,
                           _random_instance_text(concept), budget)  # fmt: skip
            uses.append(UseItem("generate", req, True, None, cons.check))
        for i in range(n_edit):
            target = i % 2 == 0
            # a source one edit away from the target polarity (the paper's edits are small changes)
            x = concept.sample_where(rng, not target, lambda x, t=target, c=concept: c.edit_to(x, t) is not None)
            sol = concept.render(concept.edit_to(x, target))
            neighbours = list(concept.neighbours(x))

            def rand(r: random.Random, nb: list = neighbours, c: Concept = concept) -> str:
                return c.render(nb[r.randrange(len(nb))])

            req = TextItem(edit_prompt(concept, x, target), lambda sol=sol: sol, rand, budget)
            uses.append(UseItem("edit", req, target, x))
        intents = [i % 2 == 1 for i in range(n_incoherence)]
        out.append(ConceptItems(concept, define, uses, intents, budget))
    return Benchmark(out, seed)


def grade_use(concept: Concept, use: UseItem, output: Any) -> tuple[bool, bool]:
    """``(correct, parsed)`` of an answer to `use` (a bool for classify, text otherwise)."""
    if use.task == "classify":
        return bool(output) == use.target, True
    y = concept.parse(output)
    if y is None:
        return False, False
    if bool(concept.is_instance(y)) != use.target:
        return False, True
    if use.task == "generate":
        return bool(use.check is None or use.check(y)), True
    return y != use.source, True  # an edit must change the instance


def _log_odds(agent: Agent, item: YesNoItem) -> dict[str, float]:
    """``{"log_odds": d}`` of an agent that scores yes/no (cached: no new call), else ``{}``."""
    d = getattr(agent, "log_odds", lambda item: None)(item)
    return {} if d is None else {"log_odds": float(d)}


def run_benchmark(agent: Agent, bench: Benchmark, tasks: Sequence[str] = TASKS) -> list[Record]:
    """Every graded answer of `agent`: keystone, use tasks and incoherence attempts (one `Record` each). An agent
    with a ``calibrate(family, items)`` method fits each concept's yes/no threshold on its classify questions
    first (they are balanced); classify and self-classification records keep the raw log-odds in ``extra``."""
    bad = [t for t in tasks if t not in TASKS]
    if bad:
        raise ValueError(f"tasks must be among {', '.join(TASKS)}, got {bad[0]!r}")
    calibrate = getattr(agent, "calibrate", None)
    records: list[Record] = []
    for ci in bench.concepts:
        c = ci.concept
        if calibrate is not None and ci.calibration:
            calibrate(ci.family, ci.calibration)
        pick = agent.choose(ci.define)
        key = pick == ci.define.gold
        records.append(Record(c.key, "define", key, key, output=str(pick)))
        for use in ci.uses:
            if use.task not in tasks:
                continue
            out = agent.yes_no(use.request) if use.task == "classify" else agent.text(use.request)
            ok, parsed = grade_use(c, use, out)
            extra = _log_odds(agent, use.request) if use.task == "classify" else {}
            records.append(Record(c.key, use.task, key, ok, parsed, str(out), extra))
        for k, intent in enumerate(ci.intents):
            req = TextItem(generate_prompt(c, intent), lambda c=c, intent=intent, k=k: c.render(
                c.sample_where(random.Random(f"{bench.seed}:{c.key}:inc:{k}"), intent)), _random_instance_text(c),
                ci.max_tokens)  # fmt: skip
            text = agent.text(req)
            x = c.parse(text)
            shown = c.render(x) if x is not None else (text.strip().splitlines() or [""])[0][:200]
            truth = bool(c.is_instance(x)) if x is not None else intent
            ask = YesNoItem(classify_prompt(c, shown), truth, ci.family)
            said = agent.yes_no(ask)
            records.append(Record(c.key, "incoherence", key, said == intent, x is not None, text,
                                  {"intent": intent, "self_label": said, "true_label": truth,
                                   **_log_odds(agent, ask)}))  # fmt: skip
    return records


@dataclass
class Rate:
    """A scaled rate with its binomial SE over `n` items."""

    value: float
    se: float
    n: int
    accuracy: float  # the unscaled accuracy behind it

    def as_dict(self) -> dict[str, float]:
        return {"value": self.value, "se": self.se, "n": self.n, "accuracy": self.accuracy}


def scaled_rate(correct: Sequence[bool], scale: float) -> Rate:
    """``s · (1 − mean(correct))`` with SE ``s · sqrt(p (1 − p) / n)`` (the paper's binomial SE); NaN when empty."""
    n = len(correct)
    if n == 0:
        return Rate(float("nan"), float("nan"), 0, float("nan"))
    acc = sum(map(bool, correct)) / n
    p = 1.0 - acc
    return Rate(scale * p, scale * math.sqrt(p * (1 - p) / n), n, acc)


def potemkin_rates(records: Sequence[Record], tasks: Sequence[str] = TASKS) -> dict[str, dict[str, Any]]:
    """Per task: the potemkin rate on concepts whose keystone was right (scaled, with SE), the accuracy where it was
    wrong, the gap P(use | keystone right) − P(use | keystone wrong), the unconditional accuracy and parse failures."""
    out: dict[str, dict[str, Any]] = {}
    for task in tasks:
        rs = [r for r in records if r.task == task]
        right = [r.correct for r in rs if r.keystone]
        wrong = [r.correct for r in rs if not r.keystone]
        rate = scaled_rate(right, SCALE[task])
        acc_wrong = sum(wrong) / len(wrong) if wrong else float("nan")
        out[task] = {
            "potemkin": rate.as_dict(),
            "acc_keystone_right": rate.accuracy,
            "acc_keystone_wrong": acc_wrong,
            "gap": rate.accuracy - acc_wrong if right and wrong else float("nan"),
            "accuracy": sum(r.correct for r in rs) / len(rs) if rs else float("nan"),
            "parse_failure": sum(not r.parsed for r in rs) / len(rs) if rs else float("nan"),
            "n": len(rs),
        }
    return out


def incoherence(records: Sequence[Record]) -> Rate:
    """2 · (1 − consistency) of generate-then-self-classify attempts (all attempts, keystone or not)."""
    return scaled_rate([r.correct for r in records if r.task == "incoherence"], SCALE["incoherence"])


# ----------------------------------------------------------------------------------------------------------------
# Procedure 2: the automatic lower bound


@dataclass
class Question:
    """A benchmark question with an exact grader: `prompt`, `grade(output) -> bool`, a wrong answer for the random
    responder, and the `answer` the oracle gives."""

    id: str
    prompt: str
    answer: str
    wrong: str
    grade: Callable[[str], bool]
    max_tokens: int = 12


def _answer_item(q: Question) -> TextItem:
    return TextItem(q.prompt, lambda q=q: q.answer, lambda r, q=q: q.answer if r.random() < 0.5 else q.wrong,
                    q.max_tokens)  # fmt: skip


def self_grade_prompt(q: Question, answer: str) -> str:
    a = " ".join(answer.split())[:200]
    return f"{q.prompt}\nProposed answer: {a}\nIs the proposed answer correct?"


def run_lower_bound(
    agent: Agent, pairs: Sequence[tuple[Question, Question]], *, concept: Callable[[Question], str] | None = None
) -> list[Record]:
    """Procedure 2 on (keystone question, related question) pairs: answer the keystone (graded exactly); where it is
    right, answer the related question, then self-grade that answer yes/no. One "self_grade" `Record` per right
    keystone: `correct` is the agent's own verdict ("correct" = no potemkin found); ``extra`` keeps the exact grade
    of the answer, whether the self-grade agrees with it and the raw log-odds.

    An agent with a ``calibrate(family, items)`` method first fits one self-grade threshold per concept (family
    ``"self_grade:<concept>"``; one ``"self_grade"`` without `concept`) on balanced items: each pair's related
    question shown with its right answer (even pairs) or its wrong one (odd pairs), whatever the agent will answer."""

    def family(q: Question) -> str:
        return f"self_grade:{concept(q)}" if concept else "self_grade"

    calibrate = getattr(agent, "calibrate", None)
    if calibrate is not None:
        by_family: dict[str, list[YesNoItem]] = {}
        for q, rel in pairs:
            items = by_family.setdefault(family(q), [])
            right = len(items) % 2 == 0  # alternately the right and the wrong answer: balanced
            items.append(YesNoItem(self_grade_prompt(rel, rel.answer if right else rel.wrong), right, family(q)))
        for fam, items in by_family.items():
            calibrate(fam, items)
    records = []
    for q, rel in pairs:
        name = concept(q) if concept else q.id
        if not q.grade(agent.text(_answer_item(q))):
            records.append(Record(name, "keystone_q", False, False))
            continue
        a = agent.text(_answer_item(rel))
        truly = bool(rel.grade(a))
        ask = YesNoItem(self_grade_prompt(rel, a), truly, family(q))
        verdict = agent.yes_no(ask)
        records.append(Record(name, "self_grade", True, verdict, True, a,
                              {"answer_correct": truly, "grade_agrees": verdict == truly, "question": q.id,
                               "related": rel.id, **_log_odds(agent, ask)}))  # fmt: skip
    return records


def lower_bound(records: Sequence[Record]) -> Rate:
    """potemkin_lower = 2 · (1 − self-graded accuracy) over the right keystones, SE 2 · sqrt(p (1 − p) / n)."""
    return scaled_rate([r.correct for r in records if r.task == "self_grade"], SCALE["self_grade"])


def build_lower_bound(
    questions: Sequence[Question], related: Callable[[Question, random.Random], Question], seed: int = 0
) -> list[tuple[Question, Question]]:
    """Pair each keystone question with a related one on the same concept (`related(q, rng)`)."""
    rng = random.Random(f"potemkin-lb:{seed}")
    return [(q, related(q, rng)) for q in questions]
