"""The shared dev search with edge extension (`lmlab.core.training.lr_search`): synthetic dev curves, no training."""

from __future__ import annotations

import math

import pytest

from lmlab.core.training.lr_search import LrSearch, search_lr


def _curve(best_lr: float):
    """A dev score quadratic in log10(lr) with its minimum at `best_lr`, and the lrs it was called at."""
    calls: list[float] = []

    def dev(lr: float) -> float:
        calls.append(lr)
        return 1.0 + (math.log10(lr) - math.log10(best_lr)) ** 2

    return dev, calls


def test_a_curve_still_falling_at_the_top_is_extended_until_the_choice_is_interior():
    """Raw learning rates (not multipliers), an uneven grid: the top step is the grid's own ratio there (1e-3 / 3e-4),
    every extension is marked in the record, and the choice ends strictly inside what was tried."""
    dev, calls = _curve(3e-3)
    found = search_lr(dev, [1e-3, 3e-5, 1e-4, 3e-4], max_extensions=2)
    step = 1e-3 / 3e-4
    assert calls == pytest.approx([3e-5, 1e-4, 3e-4, 1e-3, 1e-3 * step, 1e-3 * step**2], rel=1e-9)
    assert found.chosen == pytest.approx(1e-3 * step, rel=1e-9) and found.edge is None
    assert found.extensions == 2 and [ext for *_, ext in found.tried] == [False] * 4 + [True] * 2
    assert [v for _, v, _ in found.tried] == pytest.approx([dev(m) for m, *_ in found.tried])
    tried = [m for m, *_ in found.tried]
    assert min(tried) < found.chosen < max(tried)
    # without extensions the same curve leaves the choice at the top edge, and says so
    found = search_lr(_curve(3e-3)[0], [3e-5, 1e-4, 3e-4, 1e-3], max_extensions=0)
    assert found.chosen == 1e-3 and found.edge == "top" and found.extensions == 0


def test_the_cap_keeps_an_edge_and_the_bottom_is_extended_the_same_way():
    dev, calls = _curve(1.0)  # three decades above the grid: the 4th extension shows 1.0 is interior
    found = search_lr(dev, [1e-4, 1e-3], max_extensions=4)
    assert calls[2:] == pytest.approx([1e-2, 1e-1, 1.0, 10.0]) and found.edge is None
    found = search_lr(_curve(1.0)[0], [1e-4, 1e-3], max_extensions=3)  # the cap: 1.0 is the top tried, flagged
    assert found.chosen == pytest.approx(1.0) and found.edge == "top" and found.extensions == 3
    dev, calls = _curve(5e-7)  # below the bottom: steps down by grid[1] / grid[0]
    found = search_lr(dev, [1e-5, 3e-5, 1e-4], max_extensions=2)
    assert calls[3:] == pytest.approx([1e-5 / 3, 1e-5 / 9]) and found.chosen == pytest.approx(1e-5 / 9)
    assert found.edge == "bottom"


def test_an_interior_choice_runs_no_extension_and_a_diverged_run_never_wins():
    dev, calls = _curve(1e-4)
    found = search_lr(dev, [1e-5, 1e-4, 1e-3])
    assert calls == [1e-5, 1e-4, 1e-3] and isinstance(found, LrSearch)
    assert found.chosen == 1e-4 and found.edge is None and found.extensions == 0
    inf_top = {1e-5: 3.0, 1e-4: 2.0, 1e-3: float("inf")}
    assert search_lr(inf_top.__getitem__, [1e-5, 1e-4, 1e-3]).extensions == 0
    with pytest.raises(ValueError, match="distinct positive"):
        search_lr(dev, [0.0, 1e-3])
    with pytest.raises(ValueError, match="max_extensions"):
        search_lr(dev, [1e-4, 1e-3], max_extensions=-1)
