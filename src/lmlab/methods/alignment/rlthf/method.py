"""RLTHF (Xu et al., ICML 2025): targeted human correction of AI-labelled preference pairs, guided by the reward
distribution of a reward model trained on those labels.

``s_i = y~_i * (r(x, a_i) - r(x, b_i))``, ``y~_i = +1 / -1`` (current label: a / b preferred); sort s descending,
elbow (top) and knee (bottom) by Kneedle; humans label pairs below the knee; human labels get weight ``alpha``
(amplification); un-annotated pairs at the low end are dropped, the drop boundary climbing from the bottom of the
curve to the knee and on to the elbow as the back-off ratio grows (back-off); retrain and repeat.
https://arxiv.org/abs/2502.13417

The paper publishes no code; the loop is reconstructed from the paper's description (step order confident,
thresholds [verify]; see the README):

1. **Initial AI labels** ``y~`` for every pair (any labeller; passed in).
2. **Reward model** RM_t: a linear Bradley-Terry model ``r(x, y) = w . phi(x, y)`` on frozen features, fitted by
   minimising the weighted BT loss (`lmlab.core.training.preference.bradley_terry_loss`) plus L2::

       L(w) = sum_i c_i * -log sigmoid(y~_i * w . (phi(a_i) - phi(b_i))) / sum_i c_i + l2 / 2 * |w|^2

   ``c_i`` = 1 for an AI label, ``alpha`` for a human label, 0 for a dropped pair. A weight of ``alpha`` equals
   ``alpha`` copies of the pair (the paper's amplification by duplication) exactly. Training pairs are scored
   **cross-fitted** (`crossfit_margins`: k folds grouped by prompt; each pair scored by an RM that did not train on
   it), so an RM that could memorise labels still shows the error tail.
3. **Reward distribution** (`reward_regions`): the margins ``s_i`` in the direction of the current label, sorted
   descending and smoothed (rolling mean). The upper half is convex decreasing (a steep head flattening out), its
   Kneedle point is the **elbow**; the lower half is concave decreasing (flat, then a steep fall), its Kneedle point
   is the **knee**. Above the elbow: confidently right labels; below the knee: the likely mislabelled tail.
   Kneedle (Satopaa et al. 2011): normalise the curve to the unit square, turn it into a concave increasing one,
   take the argmax of ``y_n - x_n``. A degenerate curve falls back to quantiles.
4. **Targeted annotation**: ``per_iteration`` un-annotated pairs drawn from below the knee (seeded uniform draw, or
   the lowest margins first) are sent to the annotator; its labels replace the AI labels.
5. **Amplification**: human-labelled pairs weigh ``alpha`` in the next fits.
6. **Back-off sanitisation** (`backoff_drop`): un-annotated pairs at the low end of the curve are left out of the
   next training set (recomputed every iteration from the fresh scores). The back-off ratio ``b`` in [0, 2] moves
   the drop boundary up the sorted curve: ``b`` in [0, 1] drops the lowest ``b`` share of the un-annotated pairs
   below the knee (the spec's reading); ``b`` in (1, 2] drops all of them plus the lowest ``b - 1`` share of the
   un-annotated pairs between the elbow and the knee (the paper's back-off "to the left of the knee", cleaner but
   less coverage); ``b = 2`` trains on the confident region above the elbow and the human labels only. The elbow
   thus sets how far back-off can go.
7. Iterate; the curated set (kept AI labels + amplified human labels) is the output.

Baselines through the same loop and the same annotator door: ``random`` (uniform draw of un-annotated pairs),
``uncertainty`` (smallest ``|r(a) - r(b)|``, cross-fitted), both with the same amplification and no back-off, and
``self`` (the paper's self-improvement ablation: the pairs RLTHF would send to humans get their AI label flipped
instead, no annotator at all).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

STRATEGIES = ("rlthf", "random", "uncertainty", "self")
QUERY_ORDERS = ("random", "lowest")


# ---------------------------------------------------------------------------------------------- reward model


def _check_xy(features: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"features must be a non-empty (n_pairs, dim) array, got shape {x.shape}")
    y = np.asarray(labels)
    if y.shape != (x.shape[0],):
        raise ValueError(f"labels must have shape ({x.shape[0]},) like the features' rows, got {y.shape}")
    if not np.isin(y, (0, 1)).all():
        raise ValueError(f"labels must be 0 or 1 (1: the first response preferred), got values {np.unique(y)[:5]}")
    if not np.isfinite(x).all():
        raise ValueError("features contain non-finite values")
    return x, y.astype(np.int64)


def fit_bt(
    features: Any,
    labels: Any,
    weights: Any | None = None,
    *,
    l2: float = 1e-3,
    max_iter: int = 200,
) -> np.ndarray:
    """Linear Bradley-Terry reward model on pair features: the weights ``w`` (dim,).

    Minimises ``sum_i c_i BT_i / sum_i c_i + l2/2 |w|^2`` with ``BT_i = -log sigmoid(+-w . f_i)``
    (`lmlab.core.training.preference.bradley_terry_loss`), full batch, L-BFGS in float64 (deterministic).

    Args:
        features (`array (n, d)`): ``phi(x, a_i) - phi(x, b_i)`` per pair.
        labels (`array (n,)`): 1 when a is preferred, 0 when b is.
        weights (`array (n,)`, *optional*): per-pair weights ``c_i >= 0`` (amplified human labels, 0 = dropped).
        l2 (`float`, defaults to `1e-3`): L2 strength on the mean-loss scale (> 0 keeps the RM from memorising).
    """
    import torch

    from lmlab.core.training.preference import bradley_terry_loss

    x, y = _check_xy(features, labels)
    if not l2 >= 0:
        raise ValueError(f"l2 must be >= 0, got {l2}")
    c = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=np.float64)
    if c.shape != y.shape or (c < 0).any() or not np.isfinite(c).all():
        raise ValueError(f"weights must be {len(y)} finite values >= 0, got shape {c.shape}")
    if c.sum() <= 0:
        raise ValueError("weights sum to 0: no pair left to fit the reward model on")
    keep = c > 0
    xt = torch.from_numpy(x[keep])  # (m, d)
    sign = torch.from_numpy(2.0 * y[keep] - 1.0)  # (m,) +1: a preferred
    ct = torch.from_numpy(c[keep])
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [w],
        lr=1.0,
        max_iter=max_iter,
        tolerance_grad=1e-6,
        tolerance_change=1e-10,
        history_size=20,
        line_search_fn="strong_wolfe",
    )
    zero = torch.zeros(len(ct), dtype=torch.float64)

    def closure() -> Any:
        opt.zero_grad()
        margin = sign * (xt @ w)  # (m,) r(chosen) - r(rejected) under the current labels
        loss = bradley_terry_loss(margin, zero, weight=ct, reduction="none").sum() / ct.sum() + 0.5 * l2 * (w @ w)
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach().numpy().copy()


def bt_margins(features: Any, w: np.ndarray) -> np.ndarray:
    """``r(x, a_i) - r(x, b_i) = w . f_i`` per pair, (n,)."""
    return np.asarray(features, dtype=np.float64) @ np.asarray(w, dtype=np.float64)


def group_folds(groups: Sequence[Any], n_folds: int, *, seed: int = 0) -> np.ndarray:
    """Fold index per pair, (n,): whole groups (prompts) go to one fold, folds filled round-robin in a seeded order."""
    groups = list(groups)
    uniq = list(dict.fromkeys(groups))
    if n_folds < 2 or n_folds > len(uniq):
        raise ValueError(f"n_folds must be in [2, {len(uniq)}] (the number of groups), got {n_folds}")
    order = np.random.default_rng(seed).permutation(len(uniq))
    fold_of = {uniq[g]: k % n_folds for k, g in enumerate(order)}
    return np.array([fold_of[g] for g in groups], dtype=np.int64)


def crossfit_margins(
    features: Any,
    labels: Any,
    weights: Any | None = None,
    *,
    folds: np.ndarray,
    l2: float = 1e-3,
) -> np.ndarray:
    """Out-of-fold ``r(a_i) - r(b_i)`` for every pair (weight 0 ones included): pair i is scored by the RM fitted
    on the other folds' pairs (their weights), never on itself."""
    x, y = _check_xy(features, labels)
    c = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=np.float64)
    folds = np.asarray(folds)
    if folds.shape != y.shape:
        raise ValueError(f"folds must have shape {y.shape}, got {folds.shape}")
    out = np.zeros(len(y))
    for k in np.unique(folds):
        test = folds == k
        wk = np.where(test, 0.0, c)
        if wk.sum() <= 0:
            raise ValueError(f"fold {k}: the other folds carry no weight to fit on")
        out[test] = bt_margins(x[test], fit_bt(x, y, wk, l2=l2))
    return out


# ------------------------------------------------------------------------------------- reward distribution


def kneedle(y: Any, *, curve: str, direction: str) -> int:
    """Index of the knee / elbow of a curve sampled at equal steps: `kneed.KneeLocator` (Kneedle, Satopaa et al.
    2011, offline, sensitivity S = 1), the spec's library. ``curve``: ``concave`` | ``convex``; ``direction``:
    ``increasing`` | ``decreasing``. Where kneed finds no knee, the argmax of Kneedle's difference curve (the
    normalised curve turned concave increasing, minus the diagonal); a flat curve returns the middle index."""
    if curve not in ("concave", "convex") or direction not in ("increasing", "decreasing"):
        raise ValueError(f"curve must be concave|convex and direction increasing|decreasing, got {curve}, {direction}")
    v = np.asarray(y, dtype=np.float64)
    n = v.size
    if v.ndim != 1 or n < 3:
        raise ValueError(f"kneedle needs a 1-D curve of at least 3 points, got shape {v.shape}")
    span = v.max() - v.min()
    if span <= 0:
        return n // 2
    import warnings

    from kneed import KneeLocator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # kneed warns "No knee/elbow found"; the fallback below handles it
        knee = KneeLocator(np.arange(n), v, curve=curve, direction=direction, S=1.0, online=False).knee
    if knee is not None:
        return int(knee)
    yn = (v - v.min()) / span
    x = np.linspace(0.0, 1.0, n)
    flipped = False
    if direction == "decreasing" and curve == "concave":  # flat, then falling: reversed it rises concavely
        yn, flipped = yn[::-1], True
    elif direction == "decreasing":  # convex decreasing: 1 - y rises concavely
        yn = 1.0 - yn
    elif curve == "convex":  # convex increasing: reversed and mirrored
        yn, flipped = (1.0 - yn)[::-1], True
    i = int(np.argmax(yn - x))
    return n - 1 - i if flipped else i


def rolling_mean(v: np.ndarray, window: int) -> np.ndarray:
    """Centred rolling mean, edges padded with the end values (a sorted curve stays sorted)."""
    if window <= 1:
        return np.asarray(v, dtype=np.float64).copy()
    h = window // 2
    p = np.concatenate([np.full(h, v[0]), v, np.full(window - 1 - h, v[-1])])
    c = np.cumsum(np.concatenate([[0.0], p]))
    return (c[window:] - c[:-window]) / window


@dataclass(frozen=True)
class Regions:
    """The reward distribution of one iteration.

    Attributes:
        order: pair indices sorted by margin, descending (rank r holds pair ``order[r]``).
        curve: the smoothed sorted margins, (n,).
        elbow: rank of the elbow (upper side); ranks ``< elbow`` are the confident region, never dropped by
            back-off (`backoff_drop` with ``b > 1`` drops from the band between elbow and knee).
        knee: rank of the knee (lower side); ranks ``>= knee`` are the likely mislabelled tail.
        fallback: True when a quantile replaced Kneedle (degenerate curve).
    """

    order: np.ndarray
    curve: np.ndarray
    elbow: int
    knee: int
    fallback: bool

    def rank_of(self) -> np.ndarray:
        r = np.empty_like(self.order)
        r[self.order] = np.arange(len(self.order))
        return r


def reward_regions(
    margins: Any,
    *,
    smooth: float = 0.02,
    split: float = 0.5,
    fallback_quantiles: tuple[float, float] = (0.2, 0.8),
) -> Regions:
    """Elbow and knee of the sorted label-direction margins (module docstring, step 3).

    Args:
        margins (`array (n,)`): ``s_i``, the RM margin in the direction of each pair's current label.
        smooth (`float`, defaults to `0.02`): rolling-mean window as a share of n (>= 1 point).
        split (`float`, defaults to `0.5`): rank share where the upper (elbow) and lower (knee) halves meet.
        fallback_quantiles: rank shares of elbow and knee used when Kneedle lands on an end of its half.
    """
    s = np.asarray(margins, dtype=np.float64)
    n = s.size
    if s.ndim != 1 or n < 8:
        raise ValueError(f"margins must be a 1-D array of at least 8 pairs, got shape {s.shape}")
    if not np.isfinite(s).all():
        raise ValueError("margins contain non-finite values")
    if not 0.0 <= smooth < 0.5:
        raise ValueError(f"smooth must be in [0, 0.5), got {smooth}")
    if not 0.1 <= split <= 0.9:
        raise ValueError(f"split must be in [0.1, 0.9], got {split}")
    order = np.argsort(-s, kind="stable")
    curve = rolling_mean(s[order], max(1, int(round(smooth * n))))
    m = int(round(split * n))
    elbow = kneedle(curve[: m + 1], curve="convex", direction="decreasing")
    knee = m + kneedle(curve[m:], curve="concave", direction="decreasing")
    fallback = False
    if elbow in (0, m) or np.ptp(curve[: m + 1]) == 0:
        elbow, fallback = int(fallback_quantiles[0] * n), True
    if knee in (m, n - 1) or np.ptp(curve[m:]) == 0:
        knee, fallback = int(fallback_quantiles[1] * n), True
    return Regions(order, curve, int(elbow), int(knee), fallback)


def backoff_drop(regions: Regions, human: Any, backoff: float) -> np.ndarray:
    """Pair indices back-off leaves out of the next fit, lowest margin first (module docstring, step 6).

    With ``T`` the un-annotated pairs ranked at or below the knee and ``M`` those between the elbow and the knee
    (ranks in ``[elbow, knee)``), both listed lowest margin first::

        b in [0, 1]:  drop T[: round(b |T|)]
        b in (1, 2]:  drop T + M[: round((b - 1) |M|)]

    so the dropped set grows monotonically with ``b``, human-labelled pairs are never dropped and ranks above the
    elbow (the confident region) never are either.

    Args:
        regions (`Regions`): the reward distribution of this iteration.
        human (`array (n,)` of bool): pairs whose label came from the annotator.
        backoff (`float`): the back-off ratio ``b`` in [0, 2].
    """
    if not 0.0 <= backoff <= 2.0:
        raise ValueError(f"backoff must be in [0, 2], got {backoff}")
    human = np.asarray(human, dtype=bool)
    if human.shape != regions.order.shape:
        raise ValueError(f"human must have shape {regions.order.shape} like the regions' order, got {human.shape}")
    rank = regions.rank_of()
    low_first = regions.order[::-1]  # (n,) pair indices, lowest margin first
    free = ~human[low_first]
    tail = low_first[free & (rank[low_first] >= regions.knee)]
    band = low_first[free & (rank[low_first] >= regions.elbow) & (rank[low_first] < regions.knee)]
    if backoff <= 1.0:
        return tail[: int(round(backoff * len(tail)))].astype(np.int64)
    return np.concatenate([tail, band[: int(round((backoff - 1.0) * len(band)))]]).astype(np.int64)


# ---------------------------------------------------------------------------------------------- the loop


@dataclass
class Iteration:
    """What one iteration did (everything here is visible to the learner: no ground truth)."""

    iteration: int
    queried: list[int]
    flipped: int  # queried pairs whose new label differs from the AI label (corrections found)
    n_human: int
    n_dropped: int
    elbow: int | None
    knee: int | None
    fallback: bool
    labels: np.ndarray  # the curated labels after this iteration, (n,)
    weights: np.ndarray  # their training weights (alpha for human labels, 0 for dropped), (n,)


@dataclass
class Curation:
    """The curated dataset: labels, training weights (0 = dropped by back-off), who labelled each pair, history."""

    labels: np.ndarray
    weights: np.ndarray
    human: np.ndarray  # bool, (n,): the label came from the annotator (or, for ``self``, a self-flip)
    history: list[Iteration] = field(default_factory=list)

    @property
    def kept(self) -> np.ndarray:
        return self.weights > 0


def _pick(candidates: np.ndarray, k: int, order: str, rng: np.random.Generator) -> list[int]:
    """`k` of `candidates` (pair indices listed lowest margin first)."""
    if k >= len(candidates):
        return [int(i) for i in candidates]
    if order == "lowest":
        return [int(i) for i in candidates[:k]]
    return [int(i) for i in np.sort(rng.choice(candidates, size=k, replace=False))]


def curate(
    features: Any,
    ai_labels: Any,
    annotate: Callable[[list[int], int], Sequence[int]] | None,
    *,
    strategy: str = "rlthf",
    iterations: int = 4,
    per_iteration: int = 45,
    amplification: float = 5.0,
    backoff: float = 1.0,
    groups: Sequence[Any] | None = None,
    n_folds: int = 5,
    l2: float = 1e-3,
    smooth: float = 0.02,
    split: float = 0.5,
    query_order: str = "random",
    seed: int = 0,
) -> Curation:
    """Run RLTHF (or a baseline through the same loop) on an AI-labelled pool.

    Args:
        features (`array (n, d)`): ``phi(x, a_i) - phi(x, b_i)`` per pair (the RM's input).
        ai_labels (`array (n,)`): the AI labeller's labels, 1 = a preferred.
        annotate (`callable`): ``annotate(pair_indices, iteration) -> labels``: the (budgeted) human. ``None`` only
            for ``strategy="self"``.
        strategy (`str`): ``rlthf`` | ``random`` | ``uncertainty`` | ``self`` (module docstring).
        iterations (`int`, defaults to 4) and per_iteration (`int`): rounds and pairs sent per round.
        amplification (`float`, defaults to 5): weight of a human label (= that many copies).
        backoff (`float`, defaults to 1): the back-off ratio in [0, 2] (`backoff_drop`): 0 keeps every pair, 1
            drops the un-annotated below-knee pairs, 2 also those between the elbow and the knee; rlthf and self
            only.
        groups (`sequence`, *optional*): a group (prompt) per pair for the cross-fitting folds (default: each pair).
        n_folds (`int`, defaults to 5): cross-fitting folds; l2: RM regularisation.
        smooth, split: the reward-distribution curve (`reward_regions`).
        query_order (`str`): ``random`` (seeded draw below the knee) or ``lowest`` (lowest margins first).
        seed (`int`): folds and draws.
    """
    x, y0 = _check_xy(features, ai_labels)
    n = len(y0)
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if (annotate is None) != (strategy == "self"):
        raise ValueError(f"annotate must be None exactly for strategy='self', got {annotate!r} for {strategy!r}")
    if not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations must be an int >= 1, got {iterations!r}")
    if not isinstance(per_iteration, int) or not 1 <= per_iteration <= n:
        raise ValueError(f"per_iteration must be an int in [1, {n}] (the pool size), got {per_iteration!r}")
    if not amplification >= 1:
        raise ValueError(f"amplification must be >= 1, got {amplification}")
    if not 0.0 <= backoff <= 2.0:
        raise ValueError(f"backoff must be in [0, 2], got {backoff}")
    if query_order not in QUERY_ORDERS:
        raise ValueError(f"query_order must be one of {', '.join(QUERY_ORDERS)}, got {query_order!r}")
    groups = list(range(n)) if groups is None else list(groups)
    if len(groups) != n:
        raise ValueError(f"groups must have one entry per pair ({n}), got {len(groups)}")
    rng = np.random.default_rng([seed, 17])
    folds = group_folds(groups, n_folds, seed=seed)
    labels, human = y0.copy(), np.zeros(n, dtype=bool)
    weights = np.ones(n)
    history: list[Iteration] = []
    for it in range(1, iterations + 1):
        regions = None
        unl = np.flatnonzero(~human)
        if strategy == "random":
            queried = [int(i) for i in np.sort(rng.choice(unl, size=min(per_iteration, len(unl)), replace=False))]
        else:
            r = crossfit_margins(x, labels, weights, folds=folds, l2=l2)  # (n,) r(a) - r(b), out of fold
            if strategy == "uncertainty":
                queried = [int(i) for i in unl[np.argsort(np.abs(r[unl]), kind="stable")[:per_iteration]]]
            else:
                s = np.where(labels == 1, r, -r)  # margin in the direction of the current label
                regions = reward_regions(s, smooth=smooth, split=split)
                rank = regions.rank_of()
                low_first = regions.order[::-1]  # lowest margin first
                tail = np.array([i for i in low_first if not human[i] and rank[i] >= regions.knee], dtype=np.int64)
                queried = _pick(tail, per_iteration, query_order, rng)
                if len(queried) < per_iteration:  # the tail is used up: continue upward from the knee
                    rest = [int(i) for i in low_first if not human[i] and int(i) not in set(queried)]
                    queried += rest[: per_iteration - len(queried)]
        if strategy == "self":
            new = [1 - int(labels[i]) for i in queried]
        else:
            new = [int(v) for v in annotate(list(queried), it)]  # type: ignore[misc]
            if len(new) != len(queried) or not set(new) <= {0, 1}:
                raise ValueError(f"annotate must return one 0/1 label per queried pair, got {new[:5]!r}")
        flipped = int(sum(int(labels[i]) != v for i, v in zip(queried, new)))
        for i, v in zip(queried, new):
            labels[i], human[i] = v, True
        weights = np.where(human, float(amplification), 1.0)
        n_dropped = 0
        if regions is not None and backoff > 0:
            drop = backoff_drop(regions, human, backoff)
            weights[drop] = 0.0
            n_dropped = len(drop)
        history.append(
            Iteration(
                it,
                list(queried),
                flipped,
                int(human.sum()),
                n_dropped,
                None if regions is None else regions.elbow,
                None if regions is None else regions.knee,
                False if regions is None else regions.fallback,
                labels.copy(),
                weights.copy(),
            )
        )
    return Curation(labels, weights, human, history)
