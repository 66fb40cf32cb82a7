"""Process reward models (PRMs) for step-level methods: the interface, and what every PRM shares.

Interface (`PRM`): ``score(question, steps) -> list[float]``, the reward of each step given the question and the
steps before it, one value in [0, 1] per step. Methods that gate or rank steps (rsd, spec_search, implicit_prm, ...)
take any object with this method, so a learned PRM, a Hugging Face PRM wrapper or a rule-based checker plugs in
unchanged. `CountingPRM` is a base that counts calls, steps scored and a FLOP proxy, so experiments can charge PRM
cost; `threshold_accuracy` reads a PRM as a step classifier.

The core knows no task: PRMs for a given task live with that task (the decoding area's are in
`lmlab.methods.decoding`).

Saved PRMs are named ``"scheme:ARG"`` on a method's command line (``--set prm=implicit:DIR``): `is_prm_spec` tells
such a name from a method's own PRM names, and `load_prm` loads it through the loader a method registered for the
scheme (`register_prm_loader`), so a method accepts every saved PRM kind without importing it.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

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


# scheme -> "module:function" taking the part after "scheme:" (a folder) and returning a PRM. The core names no
# method: a method that saves PRMs registers its scheme from its package `__init__` (`register_prm_loader`), and the
# registry imports every method package before a scheme is looked up.
PRM_LOADERS: dict[str, str] = {}


def register_prm_loader(scheme: str, loader: str) -> None:
    """Make ``"scheme:ARG"`` a PRM name: `loader` is a lazy ``"module:function"`` called as ``function(ARG, **kw)``."""
    if not scheme.isidentifier() or ":" not in loader:
        raise ValueError(
            f"a PRM loader is registered as (identifier, 'module:function'), got ({scheme!r}, {loader!r})"
        )
    if PRM_LOADERS.get(scheme, loader) != loader:
        raise ValueError(f"PRM scheme {scheme!r} is already registered to {PRM_LOADERS[scheme]!r}")
    PRM_LOADERS[scheme] = loader


def _loaders() -> Mapping[str, str]:
    from lmlab.registry import list_methods

    list_methods()  # imports every method package, which registers its PRM schemes
    return PRM_LOADERS


def is_prm_spec(name: object) -> bool:
    """Whether `name` is a saved-PRM name ``"scheme:ARG"`` with a known scheme (e.g. ``"implicit:runs/prm"``)."""
    if not isinstance(name, str) or ":" not in name:
        return False
    scheme, _, arg = name.partition(":")
    return scheme in _loaders() and bool(arg)


def load_prm(spec: str, **kwargs: Any) -> PRM:
    """Load the PRM named ``"scheme:ARG"`` (see `register_prm_loader`); `kwargs` go to the loader."""
    loaders = _loaders()
    scheme, _, arg = str(spec).partition(":")
    if scheme not in loaders or not arg:
        raise ValueError(
            f"a saved PRM is named 'scheme:ARG' with scheme one of {', '.join(loaders) or '(none)'}, got {spec!r}"
        )
    module, _, attr = loaders[scheme].partition(":")
    return getattr(importlib.import_module(module), attr)(arg, **kwargs)
