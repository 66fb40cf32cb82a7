"""Concepts with programmatic ground truth for the potemkin benchmark (Mancoridis et al., ICML 2025).

The paper's 32 concepts (`PAPER_CONCEPTS`, names only: facts from the official `constants.py`) are graded by
experts. lmlab keeps the six game-theory concepts that a 2x2 payoff matrix decides exactly (strict / weak dominance,
pure Nash equilibrium, Pareto optimality, zero-sum, symmetric game; all in the paper's list) and adds four
code-checkable concepts of its own (palindrome, prime, perfect square, arithmetic progression).

Each `Concept` carries a reference definition (the keystone), an instance sampler with hard negatives (one cell,
letter or number away from an instance), the checker `is_instance`, a renderer and a parser of free text, the
one-step neighbours an edit may reach, and the constraints of its generate task. Nothing here calls a model.

A 2x2 game is ``((r_AX, c_AX), (r_AY, c_AY)), ((r_BX, c_BX), (r_BY, c_BY))``: Row picks A or B, Column X or Y,
each cell holds (Row's payoff, Column's payoff); it is written ``A,X=(3,2) A,Y=(0,1) B,X=(1,0) B,Y=(2,2)``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CONCEPTS",
    "GAME_THEORY",
    "PAPER_CONCEPTS",
    "Concept",
    "Constraint",
    "get_concepts",
]

# The paper's concept list (official constants.py; 12 + 12 + 9 names, the paper counts 32), reused as facts.
PAPER_CONCEPTS: dict[str, tuple[str, ...]] = {
    "literary techniques": ("Haiku", "Shakespearean Sonnet", "Analogy", "Paradox", "Anacoluthon", "Asyndeton",
                            "Hyperbaton", "Synesis", "Accismus", "Slant Rhyme", "Enthymeme", "Anapest"),
    "psychological biases": ("Fundamental Attribution Error", "Demanding Bias", "Black and White Thinking",
                             "Sunk Cost Fallacy", "IKEA Effect", "Pseudocertainty Effect", "Endowment Effect",
                             "Naive Cynicism", "Normalcy Bias", "Spotlight Effect", "Illusory Superiority",
                             "Catastrophizing"),
    "game theory": ("Strict Dominance", "Iterated Dominance", "Weak Dominance", "Pure Nash Equilibrium",
                    "Mixed Strategy Nash Equilibrium", "Pareto Optimality", "Best Response", "Zero-Sum Game",
                    "Symmetric Game"),
}  # fmt: skip

Game = tuple[tuple[tuple[int, int], tuple[int, int]], tuple[tuple[int, int], tuple[int, int]]]


@dataclass(frozen=True)
class Constraint:
    """A generate-task constraint: its text (``"with Row's payoff at A,X equal to 2"``) and its check."""

    text: str
    check: Callable[[Any], bool]


@dataclass(frozen=True)
class Concept:
    """One concept with programmatic ground truth.

    Attributes:
        key (`str`): identifier (``"strict_dominance"``).
        name (`str`): display name (``"Strict Dominance"``).
        domain (`str`): ``"game theory"`` or ``"lmlab"`` (concepts not in the paper).
        definition (`str`): the reference definition (the keystone's correct option), worded without the
            concept's name so that the keystone cannot be passed by matching the name.
        noun (`str`): what an instance is (``"2x2 game"``, ``"word"``), used in prompts.
        question (`str`): the classify question about one instance (``"... {x} ..."`` is filled by `render`).
        positive (`str`), negative (`str`): ``"a 2x2 game in which ..."`` phrases for generate / edit prompts.
        is_instance (`Callable`): the checker f*(x).
        sample (`Callable`): ``sample(rng, positive) -> instance`` (negatives are often one step from a positive).
        render (`Callable`): instance -> text; parse (`Callable`): free text -> instance or None.
        neighbours (`Callable`): the one-step edits of an instance (an edit task's oracle searches them).
        constraint (`Callable`): ``constraint(rng) -> Constraint`` of the generate task.
        format_hint (`str`): how an answer must be written.
        answer_tokens (`int`): the generation budget of an answer (capped by the run's `max_tokens`).
    """

    key: str
    name: str
    domain: str
    definition: str
    noun: str
    question: str
    positive: str
    negative: str
    is_instance: Callable[[Any], bool]
    sample: Callable[[random.Random, bool], Any]
    render: Callable[[Any], str]
    parse: Callable[[str], Any]
    neighbours: Callable[[Any], Iterator[Any]]
    constraint: Callable[[random.Random], Constraint]
    format_hint: str
    answer_tokens: int = 12  # generation budget of an answer (a game needs ~33 tokens, a word or number a few)

    def sample_where(self, rng: random.Random, positive: bool, check: Callable[[Any], bool] | None = None,
                     tries: int = 5000) -> Any:  # fmt: skip
        """An instance of the given polarity that also passes `check` (rejection sampling)."""
        for _ in range(tries):
            x = self.sample(rng, positive)
            if bool(self.is_instance(x)) == positive and (check is None or check(x)):
                return x
        raise RuntimeError(f"{self.key}: no {'positive' if positive else 'negative'} instance found in {tries} draws")

    def edit_to(self, x: Any, positive: bool) -> Any | None:
        """The first one-step neighbour of `x` with the target polarity (the oracle's edit), or None."""
        for y in self.neighbours(x):
            if bool(self.is_instance(y)) == positive:
                return y
        return None


# ----------------------------------------------------------------------------------------------------------------
# 2x2 games

_PAY = range(0, 4)  # payoffs 0..3: ties are common, so weak dominance and Pareto ties occur


def _game(cells: list[int]) -> Game:
    r = cells
    return (((r[0], r[1]), (r[2], r[3])), ((r[4], r[5]), (r[6], r[7])))


def _flat(g: Game) -> list[int]:
    return [v for row in g for cell in row for v in cell]


def render_game(g: Game) -> str:
    (ax, ay), (bx, by) = g
    return f"A,X=({ax[0]},{ax[1]}) A,Y=({ay[0]},{ay[1]}) B,X=({bx[0]},{bx[1]}) B,Y=({by[0]},{by[1]})"


def parse_game(text: str) -> Game | None:
    """The first eight integers of `text` as a 2x2 game (labels A, B, X, Y carry no digits), else None."""
    nums = re.findall(r"-?\d+", text or "")
    if len(nums) < 8:
        return None
    vals = [int(v) for v in nums[:8]]
    if any(abs(v) > 99 for v in vals):
        return None
    return _game(vals)


def _R(g: Game, i: int, j: int) -> int:
    return g[i][j][0]


def _C(g: Game, i: int, j: int) -> int:
    return g[i][j][1]


def strictly_dominant(g: Game) -> bool:
    """One of Row's strategies pays strictly more than the other against every Column strategy."""
    return any(all(_R(g, i, j) > _R(g, 1 - i, j) for j in (0, 1)) for i in (0, 1))


def weakly_dominant(g: Game) -> bool:
    """One of Row's strategies pays at least as much against every Column strategy and strictly more against one."""
    for i in (0, 1):
        diffs = [_R(g, i, j) - _R(g, 1 - i, j) for j in (0, 1)]
        if min(diffs) >= 0 and max(diffs) > 0:
            return True
    return False


def pure_nash(g: Game) -> bool:
    """Some cell where neither player gains by deviating alone."""
    return any(_R(g, i, j) >= _R(g, 1 - i, j) and _C(g, i, j) >= _C(g, i, 1 - j) for i in (0, 1) for j in (0, 1))


def pareto_ax(g: Game) -> bool:
    """No other outcome is at least as good for both players and strictly better for one than (A, X)."""
    r, c = g[0][0]
    for i in (0, 1):
        for j in (0, 1):
            if (i, j) == (0, 0):
                continue
            ri, ci = g[i][j]
            if ri >= r and ci >= c and (ri > r or ci > c):
                return False
    return True


def zero_sum(g: Game) -> bool:
    return all(a + b == 0 for row in g for a, b in row)


def symmetric(g: Game) -> bool:
    """Column's payoffs are Row's transposed: c(i, j) = r(j, i)."""
    return all(_C(g, i, j) == _R(g, j, i) for i in (0, 1) for j in (0, 1))


def _random_game(rng: random.Random, lo: int = 0, hi: int = 3) -> Game:
    return _game([rng.randint(lo, hi) for _ in range(8)])


def _perturb_game(g: Game, rng: random.Random, lo: int = 0, hi: int = 3) -> Game:
    cells = _flat(g)
    k = rng.randrange(8)
    cells[k] = rng.choice([v for v in range(lo, hi + 1) if v != cells[k]])
    return _game(cells)


def _game_neighbours(lo: int, hi: int) -> Callable[[Game], Iterator[Game]]:
    def gen(g: Game) -> Iterator[Game]:
        cells = _flat(g)
        for k in range(8):
            for v in range(lo, hi + 1):
                if v != cells[k]:
                    new = list(cells)
                    new[k] = v
                    yield _game(new)

    return gen


def _game_sampler(pred: Callable[[Game], bool], make_positive: Callable[[random.Random], Game] | None = None,
                  lo: int = 0, hi: int = 3) -> Callable[[random.Random, bool], Game]:  # fmt: skip
    """Positives by rejection (or `make_positive`); negatives half random, half one payoff away from a positive."""

    def sample(rng: random.Random, positive: bool) -> Game:
        for _ in range(10000):
            if positive:
                g = make_positive(rng) if make_positive else _random_game(rng, lo, hi)
            else:
                base = make_positive(rng) if make_positive else _random_game(rng, lo, hi)
                g = _perturb_game(base, rng, lo, hi) if rng.random() < 0.5 else _random_game(rng, lo, hi)
            if pred(g) == positive:
                return g
        raise RuntimeError("game sampler found no instance")

    return sample


def _zero_sum_positive(rng: random.Random) -> Game:
    r = [rng.randint(-3, 3) for _ in range(4)]
    return _game([r[0], -r[0], r[1], -r[1], r[2], -r[2], r[3], -r[3]])


def _symmetric_positive(rng: random.Random) -> Game:
    a, b, c, d = (rng.randint(0, 3) for _ in range(4))  # r(A,X)=a r(A,Y)=b r(B,X)=c r(B,Y)=d
    return _game([a, a, b, c, c, b, d, d])


def _ax_constraint(rng: random.Random) -> Constraint:
    v = rng.randint(0, 3)
    return Constraint(f"with Row's payoff at A,X equal to {v}", lambda g, v=v: g is not None and _R(g, 0, 0) == v)


GAME_FORMAT = ("Write the game as A,X=(r,c) A,Y=(r,c) B,X=(r,c) B,Y=(r,c), where Row plays A or B, Column plays "
               "X or Y, r is Row's payoff and c is Column's payoff.")  # fmt: skip


def _game_concept(key: str, name: str, definition: str, question: str, positive: str, negative: str,
                  pred: Callable[[Game], bool], make_positive: Callable[[random.Random], Game] | None = None,
                  lo: int = 0, hi: int = 3) -> Concept:  # fmt: skip
    return Concept(
        key=key, name=name, domain="game theory", definition=definition, noun="2x2 game", question=question,
        positive=positive, negative=negative, is_instance=pred, sample=_game_sampler(pred, make_positive, lo, hi),
        render=render_game, parse=parse_game, neighbours=_game_neighbours(lo, hi), constraint=_ax_constraint,
        format_hint=GAME_FORMAT, answer_tokens=36,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# words and numbers

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def is_palindrome(w: str) -> bool:
    return isinstance(w, str) and len(w) >= 3 and w.isalpha() and w == w[::-1]


def _sample_word(rng: random.Random, positive: bool) -> str:
    half = [rng.choice(_LETTERS) for _ in range(3)]
    pal = "".join(half + half[:2][::-1])  # 5 letters
    if positive:
        return pal
    if rng.random() < 0.5:  # one letter away from a palindrome
        k = rng.choice([0, 1, 3, 4])
        chars = list(pal)
        chars[k] = rng.choice([c for c in _LETTERS if c != chars[k]])
        return "".join(chars)
    return "".join(rng.choice(_LETTERS) for _ in range(5))


def parse_word(text: str) -> str | None:
    m = re.search(r"[A-Za-z]{3,}", text or "")
    return m.group(0).lower() if m else None


def _word_neighbours(w: str) -> Iterator[str]:
    for k in range(len(w)):
        for c in _LETTERS:
            if c != w[k]:
                yield w[:k] + c + w[k + 1 :]


def _word_constraint(rng: random.Random) -> Constraint:
    ch = rng.choice(_LETTERS[:20])
    return Constraint(f"starting with the letter {ch}",
                      lambda w, ch=ch: isinstance(w, str) and len(w) == 5 and w[0] == ch)  # fmt: skip


def is_prime(n: Any) -> bool:
    if not isinstance(n, int) or n < 2:
        return False
    return all(n % d for d in range(2, int(n**0.5) + 1))


def is_square(n: Any) -> bool:
    return isinstance(n, int) and n >= 0 and int(round(n**0.5)) ** 2 == n


def parse_int(text: str) -> int | None:
    m = re.search(r"-?\d+", (text or "").replace(",", ""))
    return int(m.group(0)) if m and len(m.group(0)) <= 7 else None


def _number_sampler(pred: Callable[[int], bool], lo: int, hi: int,
                    near: Callable[[random.Random], int]) -> Callable[[random.Random, bool], int]:  # fmt: skip
    def sample(rng: random.Random, positive: bool) -> int:
        for _ in range(10000):
            n = rng.randint(lo, hi) if (positive or rng.random() < 0.5) else near(rng)
            if pred(n) == positive and lo <= n <= hi:
                return n
        raise RuntimeError("number sampler found no instance")

    return sample


def _number_neighbours(n: int) -> Iterator[int]:
    for d in range(1, 40):
        yield n + d
        if n - d >= 0:
            yield n - d


def _greater_than(lo: int, hi: int) -> Callable[[random.Random], Constraint]:
    def make(rng: random.Random) -> Constraint:
        k = rng.randint(lo, hi)
        return Constraint(f"greater than {k}", lambda n, k=k: isinstance(n, int) and n > k)

    return make


def is_progression(xs: Any) -> bool:
    if not isinstance(xs, tuple) or len(xs) != 4:
        return False
    d = xs[1] - xs[0]
    return d != 0 and all(xs[i + 1] - xs[i] == d for i in range(3))


def _sample_progression(rng: random.Random, positive: bool) -> tuple[int, ...]:
    a, d = rng.randint(1, 20), rng.choice([1, 2, 3, 4, 5, 6, 7])
    ap = tuple(a + i * d for i in range(4))
    if positive:
        return ap
    xs = list(ap)
    k = rng.randrange(4)
    xs[k] += rng.choice([-2, -1, 1, 2])
    return tuple(xs)


def parse_progression(text: str) -> tuple[int, ...] | None:
    nums = re.findall(r"-?\d+", text or "")
    return tuple(int(v) for v in nums[:4]) if len(nums) >= 4 else None


def _progression_neighbours(xs: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    for k in range(len(xs)):
        for d in (1, -1, 2, -2, 3, -3, 4, -4, 5, -5, 6, -6, 7, -7):
            new = list(xs)
            new[k] += d
            yield tuple(new)


def _progression_constraint(rng: random.Random) -> Constraint:
    k = rng.randint(1, 20)
    return Constraint(f"starting with {k}", lambda xs, k=k: isinstance(xs, tuple) and len(xs) == 4 and xs[0] == k)


# ----------------------------------------------------------------------------------------------------------------
# the catalogue

CONCEPTS: dict[str, Concept] = {
    c.key: c
    for c in (
        _game_concept(
            "strict_dominance", "Strict Dominance",
            "One strategy gives a player a strictly higher payoff than another strategy against every strategy of "
            "the opponent.",
            "In the following 2x2 game, does one of Row's strategies strictly dominate the other? {x}",
            "a 2x2 game in which one of Row's strategies strictly dominates the other",
            "a 2x2 game in which neither of Row's strategies strictly dominates the other",
            strictly_dominant,
        ),
        _game_concept(
            "weak_dominance", "Weak Dominance",
            "One strategy gives a player a payoff at least as high as another strategy against every strategy of "
            "the opponent, and a strictly higher payoff against at least one.",
            "In the following 2x2 game, does one of Row's strategies weakly dominate the other? {x}",
            "a 2x2 game in which one of Row's strategies weakly dominates the other",
            "a 2x2 game in which neither of Row's strategies weakly dominates the other",
            weakly_dominant,
        ),
        _game_concept(
            "pure_nash", "Pure Nash Equilibrium",
            "A pair of strategies, one per player, from which no player can get a higher payoff by changing only "
            "their own strategy.",
            "Does the following 2x2 game have a pure-strategy Nash equilibrium? {x}",
            "a 2x2 game that has a pure-strategy Nash equilibrium",
            "a 2x2 game that has no pure-strategy Nash equilibrium",
            pure_nash,
        ),
        _game_concept(
            "pareto_optimality", "Pareto Optimality",
            "An outcome such that no other outcome makes one player better off without making any player worse "
            "off.",
            "In the following 2x2 game, is the outcome (A, X) Pareto optimal? {x}",
            "a 2x2 game in which the outcome (A, X) is Pareto optimal",
            "a 2x2 game in which the outcome (A, X) is not Pareto optimal",
            pareto_ax,
        ),
        _game_concept(
            "zero_sum", "Zero-Sum Game",
            "A game in which, in every outcome, the players' payoffs add up to zero: one player's gain is exactly "
            "the other's loss.",
            "Is the following 2x2 game a zero-sum game? {x}",
            "a 2x2 zero-sum game",
            "a 2x2 game that is not zero-sum",
            zero_sum, _zero_sum_positive, -3, 3,
        ),
        _game_concept(
            "symmetric_game", "Symmetric Game",
            "A game whose payoffs depend only on the strategies played, not on who plays them: swapping the "
            "players' roles leaves every payoff unchanged.",
            "Is the following 2x2 game symmetric (with A matching X and B matching Y)? {x}",
            "a symmetric 2x2 game (with A matching X and B matching Y)",
            "a 2x2 game that is not symmetric (with A matching X and B matching Y)",
            symmetric, _symmetric_positive,
        ),
        Concept(
            key="palindrome", name="Palindrome", domain="lmlab",
            definition="A word that reads the same backwards as forwards.",
            noun="word", question="Is the word '{x}' a palindrome?",
            positive="a 5-letter palindrome", negative="a 5-letter word that is not a palindrome",
            is_instance=is_palindrome, sample=_sample_word, render=str, parse=parse_word,
            neighbours=_word_neighbours, constraint=_word_constraint,
            format_hint="Answer with the word only (letters a-z).",
        ),
        Concept(
            key="prime", name="Prime Number", domain="lmlab",
            definition="A whole number greater than 1 whose only divisors are 1 and itself.",
            noun="number", question="Is {x} a prime number?",
            positive="a two-digit prime number", negative="a two-digit number that is not prime",
            is_instance=lambda n: is_prime(n) and 10 <= n <= 99,
            sample=_number_sampler(lambda n: is_prime(n), 10, 99, lambda r: r.choice([2, 3, 5, 7]) * r.randint(3, 30)),
            render=str, parse=parse_int, neighbours=_number_neighbours, constraint=_greater_than(10, 80),
            format_hint="Answer with the number only.",
        ),
        Concept(
            key="perfect_square", name="Perfect Square", domain="lmlab",
            definition="A whole number that equals some whole number multiplied by itself.",
            noun="number", question="Is {x} a perfect square?",
            positive="a perfect square between 10 and 999", negative="a number between 10 and 999 that is not a "
            "perfect square",
            is_instance=lambda n: is_square(n) and 10 <= n <= 999,
            sample=_number_sampler(is_square, 10, 999, lambda r: r.randint(4, 31) ** 2 + r.choice([-1, 1, 2])),
            render=str, parse=parse_int, neighbours=_number_neighbours, constraint=_greater_than(10, 500),
            format_hint="Answer with the number only.",
        ),
        Concept(
            key="arithmetic_progression", name="Arithmetic Progression", domain="lmlab",
            definition="A sequence of numbers in which each term after the first is obtained by adding the same "
            "nonzero constant to the previous term.",
            noun="sequence of four numbers", question="Is the sequence {x} an arithmetic progression?",
            positive="an arithmetic progression of four whole numbers",
            negative="a sequence of four whole numbers that is not an arithmetic progression",
            is_instance=is_progression, sample=_sample_progression,
            render=lambda xs: ", ".join(str(v) for v in xs), parse=parse_progression,
            neighbours=_progression_neighbours, constraint=_progression_constraint,
            format_hint="Answer with the four numbers separated by commas.",
        ),
    )
}  # fmt: skip

GAME_THEORY: tuple[str, ...] = tuple(k for k, c in CONCEPTS.items() if c.domain == "game theory")


def get_concepts(keys: list[str] | tuple[str, ...]) -> list[Concept]:
    """The concepts named by `keys`; ValueError naming an unknown key and the known ones."""
    if isinstance(keys, str) or not keys:
        raise ValueError(
            f"concepts must be a non-empty list of concept keys among {', '.join(CONCEPTS)}, got {keys!r}"
        )
    out = []
    for k in keys:
        if k not in CONCEPTS:
            raise ValueError(f"unknown concept {k!r}; expected one of {', '.join(CONCEPTS)}")
        out.append(CONCEPTS[k])
    if len(set(keys)) != len(keys):
        raise ValueError(f"concepts must not repeat, got {list(keys)}")
    return out
