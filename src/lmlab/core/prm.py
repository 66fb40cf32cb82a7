"""Process reward models (PRMs) for step-level methods: the interface, and what every PRM shares.

Interface (`PRM`): ``score(question, steps) -> list[float]``, the reward of each step given the question and the
steps before it, one value in [0, 1] per step. Methods that gate or rank steps (rsd, spec_search, implicit_prm, ...)
take any object with this method, so a learned PRM, a Hugging Face PRM wrapper or a rule-based checker plugs in
unchanged. `CountingPRM` is a base that counts calls, steps scored and a FLOP proxy, so experiments can charge PRM
cost; `threshold_accuracy` reads a PRM as a step classifier.

The core knows no task: PRMs for a given task live with that task (the decoding area's are in
`lmlab.methods.decoding`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class PRM(Protocol):
    """Anything with ``score(question, steps) -> list[float]`` (one value in [0, 1] per step)."""

    def score(self, question: str, steps: Sequence[str]) -> list[float]: ...


class CountingPRM:
    """Base of a PRM that counts its cost: ``calls`` (score calls), ``steps_scored`` and ``flops`` (a FLOP proxy a
    network-based PRM adds to). Subclasses call ``self._count(steps)`` once per ``score`` call."""

    def __init__(self) -> None:
        self.calls = 0
        self.steps_scored = 0
        self.flops = 0.0

    def _count(self, steps: Sequence[str]) -> None:
        self.calls += 1
        self.steps_scored += len(steps)


def threshold_accuracy(
    prm: PRM, question: str, steps: Sequence[str], labels: Sequence[float], t: float = 0.5
) -> float:
    """Fraction of steps where ``score >= t`` agrees with the 0/1 label (a PRM's step accuracy)."""
    scores = prm.score(question, steps)
    if not scores:
        return math.nan
    return float(np.mean([(s >= t) == bool(label) for s, label in zip(scores, labels)]))
