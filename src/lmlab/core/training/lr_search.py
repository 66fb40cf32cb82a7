"""A 1-D dev search whose grid is extended past an edge until the choice is interior (or a cap is reached).

Moved here from ``ferret`` (behaviour unchanged) once ``nonzero_lora`` needed the same rule: a tuned knob chosen at
the edge of its grid means the grid is extended, the same way for every system of a run, so that no baseline loses
because its best value lay just outside the grid.

* `search_lr`: runs ``dev_score(x)`` (lower is better) at every point of a grid of positive values (learning rates,
  or multipliers of one), then one step further past the edge the choice sits on, at the grid's own ratio at that
  end, up to `max_extensions` times.
* `LrSearch`: its record: the choice, every (value, dev score, extension) tried in order, and the edge the choice is
  still on after the cap (callers flag the claims that depend on such a choice as fragile).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class LrSearch:
    """A learning-rate search on dev (`search_lr`).

    Attributes:
        chosen (`float`): the multiplier with the lowest dev score.
        tried (`list[tuple[float, float, bool]]`): (multiplier, dev score, extension) in the order run; extension:
            run because the choice sat on the edge of the multipliers before it.
        edge (`str | None`): ``"bottom"`` / ``"top"`` when the choice is still the smallest / largest multiplier tried
            after the extensions (a wider search could move it), None when it is interior (or the grid has one point:
            no search, so no edge either).
    """

    chosen: float
    tried: list[tuple[float, float, bool]]
    edge: str | None

    @property
    def extensions(self) -> int:
        return sum(1 for *_, ext in self.tried if ext)


def search_lr(
    dev_score: Callable[[float], float],
    grid: Sequence[float],
    *,
    max_extensions: int = 2,
    upper: float | None = None,
) -> LrSearch:
    """The same dev search for every system: ``dev_score(m)`` (lower is better) of each multiplier `m` of `grid`.

    The lowest score wins; a non-finite score (a diverged run) never beats a finite one; ties go to the multiplier
    nearest the grid's geometric centre, so an edge wins only by beating the inside. While the choice is the smallest
    (largest) multiplier tried, one more run at the next step down (up) by the grid's own ratio at that end
    (``grid[1] / grid[0]``, ``grid[-1] / grid[-2]``), `max_extensions` runs in all; a one-point grid is not searched.
    The grid's values may be learning rates themselves rather than multipliers of one: only their ratios matter.
    Values are rounded to 12 significant digits (0.1 / 10 stays 0.01), so an extension is a stable dict key.

    `upper` (optional) is a bound of the knob's domain (FedICU's upload fraction ρ <= 1): the grid must stay within
    it, the step up is capped at it and nothing lies past it, so a choice at `upper` is on the domain's bound, not
    on an edge a wider search could move (its `edge` is None).
    """
    grid = sorted(float(m) for m in grid)
    if not grid or grid[0] <= 0 or len(set(grid)) != len(grid):
        raise ValueError(f"grid must hold distinct positive multipliers, got {grid!r}")
    if upper is not None and grid[-1] > upper:
        raise ValueError(f"grid must lie within its bound {upper:g}, got {grid!r}")
    if max_extensions < 0:
        raise ValueError(f"max_extensions must be >= 0, got {max_extensions}")
    down = grid[1] / grid[0] if len(grid) > 1 else 1.0
    up = grid[-1] / grid[-2] if len(grid) > 1 else 1.0
    centre = float(np.mean(np.log(grid)))
    scores: dict[float, float] = {}
    tried: list[tuple[float, float, bool]] = []

    def run(m: float, extension: bool) -> None:
        m = float(f"{m:.12g}")  # 0.1 / 10 stays 0.01, not 0.010000000000000002
        v = float(dev_score(m))
        scores[m] = v if math.isfinite(v) else math.inf
        tried.append((m, v, extension))

    def best() -> float:
        return min(scores, key=lambda m: (scores[m], round(abs(math.log(m) - centre), 9)))

    for m in grid:
        run(m, False)
    if len(grid) == 1:
        return LrSearch(grid[0], tried, None)
    for _ in range(max_extensions):
        if best() == min(scores):
            run(min(scores) / down, True)
        elif best() == max(scores) and (upper is None or max(scores) < upper):
            run(max(scores) * up if upper is None else min(upper, max(scores) * up), True)
        else:
            break
    chosen = best()
    at_top = chosen == max(scores) and (upper is None or chosen < upper)
    edge = "bottom" if chosen == min(scores) else "top" if at_top else None
    return LrSearch(chosen, tried, edge)
