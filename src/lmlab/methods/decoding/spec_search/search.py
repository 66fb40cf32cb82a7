"""The PRM beam search that `beam_search` and `spec_search` (in `method.py`) share: its state, loop and accounting.

A search keeps up to B `Path`s (steps, their PRM scores, who wrote each). At each depth an ``expand`` callback proposes
`Candidate` thoughts for every kept path; `_run_search` pools the children and `select_top` keeps the B distinct paths
of highest value (`aggregate_scores` of their step scores). Finished paths leave the beam and compete again at the
end. Who writes the thoughts (one model, or small-model drafts gated against the large model) is the caller's
``expand``. `_Tally` collects the models' and the PRM's costs; `_result` packs them into a `SearchResult`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lmlab.core.inference.compute import ComputeMeter
from lmlab.core.inference.steps import StepOutput
from lmlab.core.stats.seeding import derive_seed
from lmlab.methods.decoding.spec_search.thought_model import ThoughtModel

AGGREGATES = ("mean", "min", "last", "prod")
SOURCES = ("draft", "correction", "cold_start", "small", "large")


# ----------------------------------------------------------------------------------------------------------------
# Search state


@dataclass
class Candidate:
    """One thought proposed at a node: its text, PRM score, who wrote it, and whether the path ends there."""

    step: StepOutput
    score: float
    source: str  # "draft" (accepted small-model thought), "correction", "cold_start", or "small"/"large" (baselines)
    accepted: bool = True


@dataclass(frozen=True)
class Path:
    """A partial solution: its steps, their PRM scores and provenance."""

    steps: tuple[str, ...] = ()
    scores: tuple[float, ...] = ()
    sources: tuple[str, ...] = ()
    finished: bool = False

    def extend(self, c: Candidate) -> Path:
        text = c.step.text
        if not text:  # the model ended the answer without a new step
            return Path(self.steps, self.scores, self.sources, True)
        return Path((*self.steps, text), (*self.scores, c.score), (*self.sources, c.source), c.step.finished)

    def value(self, aggregate: str = "mean") -> float:
        return aggregate_scores(self.scores, aggregate)


def aggregate_scores(scores: Sequence[float], aggregate: str = "mean") -> float:
    """A path's value from its step scores: ``mean``, ``min``, ``last`` or ``prod`` (-inf for an empty path)."""
    if aggregate not in AGGREGATES:
        raise ValueError(f"aggregate must be one of {', '.join(AGGREGATES)}, got {aggregate!r}")
    if not scores:
        return -math.inf
    if aggregate == "mean":
        return float(np.mean(scores))
    if aggregate == "min":
        return float(min(scores))
    if aggregate == "last":
        return float(scores[-1])
    return float(np.prod(scores))


def select_top(paths: Sequence[Path], k: int, aggregate: str = "mean") -> list[Path]:
    """The `k` distinct paths of highest value (a path sampled twice is kept once; ties keep the earlier path)."""
    unique: dict[tuple[tuple[str, ...], bool], Path] = {}
    for p in paths:
        unique.setdefault((p.steps, p.finished), p)
    kept = list(unique.values())
    order = sorted(range(len(kept)), key=lambda i: -kept[i].value(aggregate))
    return [kept[i] for i in order[:k]]


@dataclass
class DepthRecord:
    """What happened at one search depth."""

    depth: int
    threshold: float | None  # beta_t used for the rejection (None for a plain beam search)
    n_drafts: int = 0
    n_accepted: int = 0
    n_corrections: int = 0
    n_cold_start: int = 0
    draft_scores: list[float] = field(default_factory=list)
    large_scores: list[float] = field(default_factory=list)


@dataclass
class SearchResult:
    """Output of `spec_search` / `beam_search`.

    Attributes:
        steps (`list[str]`): the best path's thoughts; provenance (`list[str]`): who wrote each of them (``draft``
            = an accepted small-model thought, ``correction`` / ``cold_start`` = the large model, ``small`` /
            ``large`` in the one-model baselines); scores: their PRM scores; value: the path's aggregate score.
        beams (`list[Path]`): the final beam (finished paths included), best first.
        acceptance_rate (`float`): accepted drafts / drafts (NaN when nothing was drafted).
        thresholds (`list[float | None]`): beta_t per depth.
        depths (`list[DepthRecord]`): per-depth counts and scores.
        cost (`dict`): per model name ``calls``, ``logical_tokens`` and, with a meter, the measured
            ``forward_calls``, ``prefill_tokens``, ``decode_tokens``, ``flops``; plus ``"prm"``: ``calls``,
            ``steps_scored``, ``flops``.
        latency (`dict[str, float]`): seconds in ``draft``, ``evaluate``, ``correct`` (incl. cold start),
            ``generate`` (one-model baselines), ``select`` and ``total``.
    """

    steps: list[str]
    provenance: list[str]
    scores: list[float]
    value: float
    beams: list[Path]
    acceptance_rate: float
    thresholds: list[float | None]
    depths: list[DepthRecord]
    cost: dict[str, dict[str, float]]
    latency: dict[str, float]

    @property
    def text(self) -> str:
        return "\n".join(self.steps)

    @property
    def n_drafts(self) -> int:
        return sum(d.n_drafts for d in self.depths)

    @property
    def n_accepted(self) -> int:
        return sum(d.n_accepted for d in self.depths)

    @property
    def n_large_thoughts(self) -> int:
        return sum(d.n_corrections + d.n_cold_start for d in self.depths)


# ----------------------------------------------------------------------------------------------------------------
# The search loop and its cost accounting


def _check_search_args(n: int, beam_width: int, max_depth: int, step_prefixes: Sequence[str] | None) -> int:
    if n < 1:
        raise ValueError(f"n (thoughts per node) must be >= 1, got {n}")
    if beam_width < 1:
        raise ValueError(f"beam_width must be >= 1, got {beam_width}")
    if step_prefixes is not None:
        if len(step_prefixes) == 0:
            raise ValueError("step_prefixes must name at least one step, got an empty sequence")
        return len(step_prefixes) if max_depth is None else min(max_depth, len(step_prefixes))
    if max_depth is None or max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    return max_depth


def _scorer(prm: Any, question: str, latency: dict[str, float]) -> Callable[[Path, list[StepOutput]], list[float]]:
    def score(path: Path, outs: list[StepOutput]) -> list[float]:
        t0 = time.perf_counter()
        vals = []
        for o in outs:
            if not o.text:  # an empty step (the model ended) adds nothing to judge; it scores as the path's value
                vals.append(path.value("last") if path.scores else 0.0)
                continue
            vals.append(float(prm.score(question, [*path.steps, o.text])[-1]))
        latency["evaluate"] += time.perf_counter() - t0
        return vals

    return score


def _seeds(seed: int, role: str, question: str, path: Path, start: int, count: int) -> list[int]:
    # the seed of a thought depends on (role, question, path text, index) only, so two systems reaching the same node
    # draw the same thoughts (common random numbers make the paired comparisons sharper)
    key = "\n".join(path.steps)
    return [derive_seed(seed, "thought", role, question, key, i) for i in range(start, start + count)]


def _run_search(
    question: str,
    expand: Callable[[int, Path, str], list[Candidate]],
    *,
    beam_width: int,
    depth: int,
    step_prefixes: Sequence[str] | None,
    aggregate: str,
    end_depth: Callable[[int], None] | None = None,
    latency: dict[str, float],
) -> list[Path]:
    active = [Path()]
    finished: list[Path] = []
    for t in range(depth):
        prefix = step_prefixes[t] if step_prefixes is not None else ""
        children = [node.extend(c) for node in active for c in expand(t, node, prefix)]
        if end_depth is not None:
            end_depth(t)
        t0 = time.perf_counter()
        kept = select_top(children, beam_width, aggregate)
        finished += [p for p in kept if p.finished]
        active = [p for p in kept if not p.finished]
        latency["select"] += time.perf_counter() - t0
        if not active:
            break
    return select_top(finished + active, len(finished) + len(active), aggregate)


class _Tally:
    """Per-search cost: the models' counter deltas, the meter's per-model deltas, and the PRM's counters."""

    def __init__(self, models: Sequence[ThoughtModel], prm: Any, meter: ComputeMeter | None):
        self.models = list({id(m): m for m in models}.values())
        self.start = {id(m): (m.calls, m.logical_tokens) for m in self.models}
        self.meter = meter
        self.before = meter.snapshot() if meter is not None else {}
        self.prm = prm
        self.prm0 = self._prm_counts()

    def _prm_counts(self) -> tuple[float, float, float]:
        p = self.prm
        return (getattr(p, "calls", 0), getattr(p, "steps_scored", 0), float(getattr(p, "flops", 0.0)))

    def cost(self) -> dict[str, dict[str, float]]:
        cost: dict[str, dict[str, float]] = {}
        for m in self.models:
            c0, t0 = self.start[id(m)]
            row = cost.setdefault(m.name, {"calls": 0.0, "logical_tokens": 0.0, "flop_params": float(m.flop_params)})
            row["calls"] += m.calls - c0
            row["logical_tokens"] += m.logical_tokens - t0
        if self.meter is not None:
            for name, d in self.meter.since(self.before).items():
                if d.forward_calls == 0 and name not in cost:
                    continue
                row = cost.setdefault(name, {})
                row.update(
                    forward_calls=d.forward_calls,
                    forward_batches=d.forward_batches,
                    prefill_tokens=d.prefill_tokens,
                    decode_tokens=d.decode_tokens,
                    flops=d.flops,
                )
        calls, steps, flops = (a - b for a, b in zip(self._prm_counts(), self.prm0))
        cost["prm"] = {"calls": calls, "steps_scored": steps, "flops": flops}
        return cost


def _result(
    paths: list[Path],
    depths: list[DepthRecord],
    tally: _Tally,
    latency: dict[str, float],
    t_start: float,
    aggregate: str,
) -> SearchResult:
    latency["total"] = time.perf_counter() - t_start
    best = paths[0] if paths else Path()
    drafts = sum(d.n_drafts for d in depths)
    return SearchResult(
        steps=list(best.steps),
        provenance=list(best.sources),
        scores=list(best.scores),
        value=best.value(aggregate),
        beams=paths,
        acceptance_rate=(sum(d.n_accepted for d in depths) / drafts) if drafts else math.nan,
        thresholds=[d.threshold for d in depths],
        depths=depths,
        cost=tally.cost(),
        latency=dict(latency),
    )


__all__ = [
    "AGGREGATES",
    "SOURCES",
    "Candidate",
    "DepthRecord",
    "Path",
    "SearchResult",
    "aggregate_scores",
    "select_top",
]
