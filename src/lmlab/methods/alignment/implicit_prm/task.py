"""Multi-step arithmetic chains with a noisy programmatic solver: the step-verified task of the implicit-PRM run.

Task (the alignment spec's reproduction): "Start with 7. Add 5. Multiply by 3. Subtract 4." The solution writes one
line per operation, ``"7+5=12"``, ``"12*3=36"``, ``"36-4=32"``, then ``"Answer: 32"``. Each line is a step.

Solver: `noisy_solution` applies the operations in order; at each step, with probability `p`, it writes a wrong
result instead, and later steps compute correctly from that wrong value (errors propagate). So every candidate's
first wrong step is known exactly (`Candidate.first_error`) and the outcome label is exact (final answer == the true
result). The error types repeat across candidates, so wrong answers collide as the systematic mistakes of a real
model do (majority vote is not trivially right).

Error mix, symmetric around the true result: a wrong line is ``result + s * size`` with a size of 1, 10 or the wrong
operator's distance ``|v op' x - v op x|`` (a uniformly drawn other operator on the same operands), each a third of
the time, and a sign ``s = +-1`` from a fair coin drawn independently of the size. So at every step a wrong result is
as likely, and as far, above the true one as below (for ``s`` matching the wrong operator's side it is that
operator's result; otherwise its mirror image). A size larger than a positive true result is drawn again: the
rejection looks at the size only, so the signs stay equally likely, and a wrong result crosses below zero (where the
true path never goes, so a visible tell) only through propagation: about 6% of wrong answers (17% without the
redraw). The first mix (+1, -1, +10, the wrong operator's own result) put wrong final answers above the target about
2:1, and value heads learnt "the smaller answer is right" from it (README).

Monte Carlo step labels (Math-Shepherd's "hard estimation"): `mc_step_labels` runs `m` solver completions from each
step prefix; the step is good if any completion reaches the true answer. Its cost in rollouts and generated tokens
is counted, since that is what the implicit PRM saves.

Data: seeded; a problem's split is a hash of its canonical key (start and operations) with `lmlab.data.split_of`,
so the same problem never lands in two splits of one seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lmlab.data import Example, check_split, sample_unique

OPS: dict[str, tuple[str, str]] = {"add": ("Add", "+"), "sub": ("Subtract", "-"), "mul": ("Multiply by", "*")}
ERRORS: tuple[str, ...] = ("one", "ten", "wrong_op")  # error sizes; the sign is a separate fair coin


def _apply(value: int, op: str, x: int) -> int:
    return value + x if op == "add" else value - x if op == "sub" else value * x


def problem_steps_text(value: int, op: str, x: int, result: int) -> str:
    """One step line, ``"12*3=36"``."""
    return f"{value}{OPS[op][1]}{x}={result}"


def make_problems(
    n: int,
    seed: int,
    split: str,
    *,
    min_ops: int = 3,
    max_ops: int = 4,
    start_max: int = 12,
    operand_max: int = 9,
    mul_max: int = 3,
) -> list[Example]:
    """`n` chain problems of `split` (``meta``: ``start``, ``ops`` as ``[[op, x], ...]``, ``values``, ``n_ops``).

    Operands: start in 2..`start_max`, add/subtract in 1..`operand_max` (subtraction never goes below 0 on the true
    path), multiply in 2..`mul_max`. ``target`` is the true result.
    """
    check_split(split)
    if not 1 <= min_ops <= max_ops:
        raise ValueError(f"need 1 <= min_ops <= max_ops, got min_ops={min_ops}, max_ops={max_ops}")

    def draw(rng: random.Random) -> tuple[str, Example]:
        value = rng.randint(2, start_max)
        ops: list[list] = []
        values = [value]
        for _ in range(rng.randint(min_ops, max_ops)):
            op = rng.choice(("add", "sub", "mul"))
            if op == "sub" and value < 1:
                op = "add"
            x = rng.randint(2, mul_max) if op == "mul" else rng.randint(1, min(operand_max, value) if op == "sub" else
                                                                      operand_max)  # fmt: skip
            value = _apply(value, op, x)
            ops.append([op, x])
            values.append(value)
        key = f"{values[0]}|" + "|".join(f"{o}{x}" for o, x in ops)
        words = " ".join(f"{OPS[o][0]} {x}." for o, x in ops)
        question = f"Start with {values[0]}. {words}"
        meta = {"start": values[0], "ops": ops, "values": values, "n_ops": len(ops)}
        return key, Example(f"arith_chain/{key}", question, str(value), None, meta)

    return sample_unique(draw, n, seed, split, stream=("arith_chain", min_ops, max_ops, start_max, operand_max,
                                                       mul_max), what="arith_chain pool")  # fmt: skip


@dataclass(frozen=True)
class Candidate:
    """One solution: `steps` (operation lines then the answer line), its `answer`, exact labels.

    Attributes:
        correct (`bool`): the final answer equals the problem's true result (the outcome label).
        first_error (`int | None`): index of the first wrong operation line, None if every line is right.
        step_ok (`tuple[bool, ...]`): per operation line, whether its prefix is still on the true path.
    """

    steps: tuple[str, ...]
    answer: int
    correct: bool
    first_error: int | None
    step_ok: tuple[bool, ...]

    @property
    def n_ops(self) -> int:
        return len(self.step_ok)


def _corrupt(value: int, op: str, x: int, result: int, rng: random.Random) -> int:
    """A wrong result ``result +- size``, symmetric around `result` given the step: the size is 1, 10 or the
    distance to a wrong operator's result on the same operands (kind uniform over `ERRORS`; 1 where that operator
    gives the true result, e.g. 2+2 and 2*2), the sign a fair coin drawn independently of the size. A size larger than
    a positive `result` is drawn again (the rejection looks at the size only, so both signs stay equally likely):
    otherwise a third of the wrong answers cross below zero, where the true path never goes, and the size of an answer
    is again a cue (README: the shortcut rows)."""
    while True:
        kind = rng.choice(ERRORS)
        if kind == "one":
            size = 1
        elif kind == "ten":
            size = 10
        else:
            wrong = rng.choice([o for o in OPS if o != op])
            size = abs(_apply(value, wrong, x) - result) or 1
        if size <= result or result < 1:
            return result + size if rng.random() < 0.5 else result - size


def _continue(problem: Example, lines: list[str], value: int, start_op: int, p: float, rng: random.Random,
              first_error: int | None) -> Candidate:  # fmt: skip
    ops = problem.meta["ops"]
    true_values = problem.meta["values"]
    ok = [first_error is None or i < first_error for i in range(start_op)]
    for i in range(start_op, len(ops)):
        op, x = ops[i]
        result = _apply(value, op, x)
        if rng.random() < p:
            result = _corrupt(value, op, x, result, rng)
        lines.append(problem_steps_text(value, op, x, result))
        if first_error is None and result != true_values[i + 1]:
            first_error = i
        ok.append(first_error is None)
        value = result
    lines.append(f"Answer: {value}")
    return Candidate(tuple(lines), value, value == int(problem.target), first_error, tuple(ok))


def noisy_solution(problem: Example, p: float, rng: random.Random) -> Candidate:
    """A solution where each operation line is wrong with probability `p` (errors propagate)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must lie in [0, 1], got {p}")
    return _continue(problem, [], problem.meta["start"], 0, p, rng, None)


def mc_step_labels(
    problem: Example, cand: Candidate, m: int, p: float, rng: random.Random, count_tokens: Callable[[str], int]
) -> tuple[list[float], int, int]:
    """Math-Shepherd hard labels for every step of `cand` (operation lines and the answer line).

    For operation line t < last, `m` solver completions run from the prefix ending at line t; the label is 1 if any
    reaches the true answer. The last operation line and the answer line are labelled by the outcome: nothing is
    left to generate after them, so no rollout is needed.

    Returns:
        (labels, rollouts, generated tokens): one label per step, and the extra rollouts and their tokens.
    """
    if m < 1:
        raise ValueError(f"m must be >= 1 rollouts per step prefix, got {m}")
    labels: list[float] = []
    rollouts = tokens = 0
    for t in range(cand.n_ops - 1):
        value = int(cand.steps[t].rsplit("=", 1)[1])
        prefix_error = cand.first_error if cand.first_error is not None and cand.first_error <= t else None
        hit = False
        for _ in range(m):
            done = _continue(problem, list(cand.steps[: t + 1]), value, t + 1, p, rng, prefix_error)
            rollouts += 1
            tokens += count_tokens("\n" + "\n".join(done.steps[t + 1 :]))
            hit = hit or done.correct
        labels.append(float(hit))
    labels += [float(cand.correct)] * (len(cand.steps) - len(labels))
    return labels, rollouts, tokens


def candidates_for(problem: Example, n: int, p: float, rng: random.Random) -> list[Candidate]:
    return [noisy_solution(problem, p, rng) for _ in range(n)]


def final_answers(cands: Sequence[Candidate]) -> list[int]:
    return [c.answer for c in cands]
