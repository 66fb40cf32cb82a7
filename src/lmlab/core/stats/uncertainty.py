"""Uncertainty for every number lmlab reports: bootstrap CIs, paired tests, proportions, correlations, claim checks.

Every metric row in lmlab carries ``n``, ``ci_low`` and ``ci_high``; the helpers here produce them. All resampling
is seeded and deterministic: the same inputs and seed give bit-identical outputs in any process.

NaN policy: every function that takes samples rejects NaN (and +-inf) with a `ValueError` naming the argument and
the first offending index. A NaN score means an upstream failure (a crashed generation, an empty reference); dropping
it silently would bias the estimate and hide the bug, so the caller must decide what it means and filter explicitly.

Only numpy and scipy are imported: no torch, so statistics stay cheap to import.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from scipy import stats as _sps

Alternative = Literal["two-sided", "greater", "less"]
Direction = Literal[">", "<"]
Status = Literal["supported", "not_supported", "inconclusive"]

# Cap on the number of elements materialised per resampling chunk (~16 MB of float64), so a bootstrap of a long
# per-token array never allocates n_resamples * n at once.
_CHUNK_ELEMENTS = 2_000_000


# ----------------------------------------------------------------------------------------------------------------
# input checks
# ----------------------------------------------------------------------------------------------------------------


def _as_1d(values: Any, name: str = "values") -> np.ndarray:
    """A finite, non-empty 1-D float64 array, or a `ValueError` saying what is wrong."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty: a statistic needs at least one value")
    bad = ~np.isfinite(arr)
    if bad.any():
        idx = int(np.argmax(bad))
        raise ValueError(
            f"{name} contains a non-finite value ({arr[idx]!r} at index {idx}); lmlab rejects NaN/inf instead of "
            "dropping them silently: filter or impute explicitly before computing statistics"
        )
    return arr


def _paired(a: Any, b: Any) -> tuple[np.ndarray, np.ndarray]:
    a_arr, b_arr = _as_1d(a, "a"), _as_1d(b, "b")
    if a_arr.shape != b_arr.shape:
        raise ValueError(
            f"paired samples must have the same length (same examples, same order): len(a)={a_arr.size}, "
            f"len(b)={b_arr.size}"
        )
    return a_arr, b_arr


def _check_confidence(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return float(confidence)


def _check_alternative(alternative: str) -> None:
    if alternative not in ("two-sided", "greater", "less"):
        raise ValueError(f"alternative must be 'two-sided', 'greater' or 'less', got {alternative!r}")


def _chunks(total: int, per_row: int) -> list[int]:
    """Sizes of the resampling chunks: a deterministic function of (total, per_row), so results never depend on
    anything but the inputs and the seed."""
    rows = max(1, min(total, _CHUNK_ELEMENTS // max(per_row, 1)))
    sizes = [rows] * (total // rows)
    if total % rows:
        sizes.append(total % rows)
    return sizes


def _apply_stat(stat: Callable[..., Any], samples: np.ndarray) -> np.ndarray:
    """`stat` over each row of `samples`: vectorised through ``axis=1`` when `stat` supports it (np.mean,
    np.median, ...), else row by row."""
    try:
        out = np.asarray(stat(samples, axis=1), dtype=np.float64)
        if out.shape == (samples.shape[0],):
            return out
    except TypeError:
        pass  # stat has no `axis` keyword: fall back to a loop
    return np.fromiter((float(stat(row)) for row in samples), dtype=np.float64, count=samples.shape[0])


def cluster_codes(clusters: Any, n: int, name: str = "clusters") -> np.ndarray:
    """Integer codes ``0..G-1`` (in order of first appearance) of the cluster id of each of `n` values.

    `clusters` names the independent unit each value belongs to (a prompt, a document, a seed, a client): values of
    one cluster are correlated, values of different clusters are independent. Any hashable ids work.
    """
    ids = list(clusters)
    if len(ids) != n:
        raise ValueError(f"{name} must give one cluster id per value: got {len(ids)} ids for {n} values")
    codes: dict[Any, int] = {}
    out = np.empty(n, dtype=np.int64)
    for i, c in enumerate(ids):
        try:
            out[i] = codes.setdefault(c, len(codes))
        except TypeError:
            raise ValueError(f"{name}[{i}] = {c!r} is not hashable: cluster ids must be str, int or tuple") from None
    return out


def _cluster_sums(values: np.ndarray, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-cluster ``(sums, counts)``, each of shape ``(G,)``."""
    n_clusters = int(codes.max()) + 1
    sums = np.bincount(codes, weights=values, minlength=n_clusters)
    counts = np.bincount(codes, minlength=n_clusters).astype(np.float64)
    return sums, counts


def n_clusters(clusters: Any) -> int:
    """The number of distinct cluster ids: the ``n`` of a clustered estimate."""
    return len(set(clusters))


def _cluster_boot_means(
    values: np.ndarray, codes: np.ndarray, rng: np.random.Generator, n_resamples: int
) -> np.ndarray:
    """Cluster (block) bootstrap of the pooled mean: draw G clusters with replacement, keep each drawn cluster whole.

    The resampled statistic is the ratio estimator ``sum(cluster sums) / sum(cluster sizes)`` over the drawn clusters
    (the pooled mean of their values), so clusters of unequal size weigh by size, as the point estimate does.
    Shapes: sums, counts (G,); idx (k, G) per chunk.
    """
    sums, counts = _cluster_sums(values, codes)
    g = sums.size
    out = []
    for k in _chunks(n_resamples, g):
        idx = rng.integers(0, g, size=(k, g))
        out.append(sums[idx].sum(axis=1) / counts[idx].sum(axis=1))
    return np.concatenate(out)


# ----------------------------------------------------------------------------------------------------------------
# bootstrap
# ----------------------------------------------------------------------------------------------------------------


def bootstrap_ci(
    values: Any,
    *,
    stat: Callable[..., Any] = np.mean,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    clusters: Any = None,
) -> tuple[float, float, float]:
    """Percentile bootstrap confidence interval of ``stat(values)``, optionally clustered.

    Resamples `values` with replacement `n_resamples` times (``np.random.default_rng(seed)``) and takes the
    ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles (linear interpolation) of the resampled statistic.
    Deterministic given the inputs and `seed`.

    Degenerate cases: with one value, or when all values are equal, every resample is identical, so the interval has
    zero width and ``lo == hi == point`` exactly. A zero-width interval from n=1 carries no information about spread;
    always report `n` beside it (and see `compare`, which refuses to decide a claim from so few examples).

    Args:
        values: 1-D sequence of finite numbers (one per example). NaN/inf raise `ValueError`.
        stat: Statistic of a 1-D array returning a float. If it accepts ``axis=`` (numpy reductions do) the
            resamples are evaluated in vectorised chunks; otherwise it is called once per resample.
        n_resamples: Number of bootstrap resamples (>= 1).
        confidence: Two-sided confidence level in (0, 1).
        seed: Seed of the resampling generator.
        clusters: Optional cluster id per value (the independent unit: prompt, document, seed, client). Then the
            bootstrap draws whole clusters with replacement (a block bootstrap), so correlated values of one unit
            never count as independent evidence; `stat` must be the mean (the pooled mean over the drawn clusters).
            With one value per cluster the result equals the unclustered bootstrap exactly; with a single cluster the
            interval has zero width (one unit carries no information about spread).

    Returns:
        ``(point, lo, hi)``: ``stat(values)`` and the percentile interval.
    """
    arr = _as_1d(values)
    if clusters is not None:
        codes = cluster_codes(clusters, arr.size)
        if int(codes.max()) + 1 < arr.size:  # some cluster holds several values: resample clusters
            if stat is not np.mean:
                raise ValueError("a clustered bootstrap estimates the mean only: pass stat=np.mean with clusters")
            _check_confidence(confidence)
            if n_resamples < 1:
                raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
            point = float(np.mean(arr))
            if int(codes.max()) == 0 or np.all(arr == arr[0]):
                return point, point, point
            boot = _cluster_boot_means(arr, codes, np.random.default_rng(seed), n_resamples)
            alpha = 1.0 - confidence
            lo, hi = np.quantile(boot, [alpha / 2.0, 1.0 - alpha / 2.0])
            return point, float(lo), float(hi)
    _check_confidence(confidence)
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    point = float(stat(arr))
    if arr.size == 1 or np.all(arr == arr[0]):
        # Every resample equals the sample: skip the work and return an exactly degenerate interval (avoids
        # floating-point noise such as mean([0.1] * 7) != 0.1 making lo differ from point by 1 ulp).
        return point, point, point
    rng = np.random.default_rng(seed)
    n = arr.size
    boot = np.concatenate([_apply_stat(stat, arr[rng.integers(0, n, size=(k, n))]) for k in _chunks(n_resamples, n)])
    alpha = 1.0 - confidence
    lo, hi = np.quantile(boot, [alpha / 2.0, 1.0 - alpha / 2.0])
    return point, float(lo), float(hi)


def paired_bootstrap_diff(
    a: Any,
    b: Any,
    *,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    clusters: Any = None,
) -> tuple[float, float, float]:
    """Bootstrap CI of ``mean(a - b)`` for paired scores (same examples, same order), optionally clustered.

    Resampling examples (not a and b independently) keeps the pairing, which is what makes paired comparisons far
    tighter than unpaired ones when both systems find the same examples hard.

    Args:
        a: Per-example scores of system A.
        b: Per-example scores of system B on the same examples in the same order.
        n_resamples: Number of bootstrap resamples.
        confidence: Two-sided confidence level in (0, 1).
        seed: Seed of the resampling generator.
        clusters: Optional cluster id per pair (see `bootstrap_ci`): whole clusters of pairs are resampled.

    Returns:
        ``(point, lo, hi)`` with ``point = mean(a - b)``.

    Raises:
        ValueError: On a length mismatch (the message names both lengths) or NaN/inf in either input.
    """
    a_arr, b_arr = _paired(a, b)
    return bootstrap_ci(
        a_arr - b_arr, stat=np.mean, n_resamples=n_resamples, confidence=confidence, seed=seed, clusters=clusters
    )


def _rows(values: Any, name: str) -> np.ndarray:
    """A finite float64 array of >= 1 rows (axis 0 = the examples), or a `ValueError`."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim < 1 or arr.shape[0] == 0:
        raise ValueError(f"{name} must have at least one row (axis 0 = examples), got shape {arr.shape}")
    if not np.isfinite(arr).all():
        idx = int(np.argmax(~np.isfinite(arr).reshape(arr.shape[0], -1).all(-1)))
        raise ValueError(f"{name} contains a non-finite value in row {idx}; filter or impute explicitly")
    return arr


def paired_bootstrap_stat(
    a: Any,
    b: Any | None,
    stat: Callable[[np.ndarray], float],
    *,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    clusters: Any = None,
) -> tuple[float, float, float]:
    """Percentile bootstrap CI of ``stat(a) - stat(b)`` (of ``stat(a)`` when `b` is None) for any statistic of rows.

    For statistics that are not a mean of per-example values, such as the worst-objective reward
    ``W = min_k mean_x v[x, k]`` of per-example vectors v (n, K): each resample draws clusters with replacement,
    takes all rows of the drawn clusters from `a` and the same rows from `b` (paired: one resampled set of units
    for both systems), and recomputes `stat` on them, so everything inside `stat` (here the argmin over k) is
    re-decided in every resample. Bootstrapping a per-example column fixed at the full-sample argmin instead omits
    that uncertainty and is too narrow when objectives tie.

    The draws are those of `bootstrap_ci` (``rng.integers(0, G, size=(k, G))`` per chunk of `_chunks`), so with
    ``stat = mean`` over 1-D rows the interval equals `paired_bootstrap_diff` / `bootstrap_ci` (to rounding).

    Args:
        a: Rows of system A, shape (n, ...) (axis 0 = examples).
        b: Rows of system B on the same examples in the same order (shape (n, ...)), or None.
        stat: Statistic of an array of rows (m, ...) returning a float; called once per resample and system.
        n_resamples: Bootstrap resamples (>= 1).
        confidence: Two-sided confidence level in (0, 1).
        seed: Seed of the resampling generator.
        clusters: Optional cluster id per row (the independent unit): whole clusters are drawn. Default: each row
            its own unit. With a single cluster the interval has zero width.

    Returns:
        ``(point, lo, hi)`` with ``point = stat(a) - stat(b)`` (or ``stat(a)``).
    """
    a_arr = _rows(a, "a")
    b_arr = None if b is None else _rows(b, "b")
    if b_arr is not None and b_arr.shape[0] != a_arr.shape[0]:
        raise ValueError(
            f"paired rows must have the same length (same examples, same order): len(a)={a_arr.shape[0]}, "
            f"len(b)={b_arr.shape[0]}"
        )
    _check_confidence(confidence)
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    n = a_arr.shape[0]
    codes = np.arange(n) if clusters is None else cluster_codes(clusters, n)

    def value(idx: np.ndarray | slice) -> float:
        out = float(stat(a_arr[idx]))
        return out if b_arr is None else out - float(stat(b_arr[idx]))

    point = value(slice(None))
    g = int(codes.max()) + 1
    if g == 1:
        return point, point, point
    order = np.argsort(codes, kind="stable")  # rows grouped by cluster
    counts = np.bincount(codes, minlength=g)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    members = [order[s : s + c] for s, c in zip(starts, counts)]  # row indices of each cluster
    singletons = bool((counts == 1).all())
    rng = np.random.default_rng(seed)
    boot = np.empty(n_resamples)
    i = 0
    for k in _chunks(n_resamples, g):
        for draw in rng.integers(0, g, size=(k, g)):
            boot[i] = value(order[draw] if singletons else np.concatenate([members[d] for d in draw]))
            i += 1
    alpha = 1.0 - confidence
    lo, hi = np.quantile(boot, [alpha / 2.0, 1.0 - alpha / 2.0])
    return point, float(lo), float(hi)


def _unpaired_bootstrap_diff(
    a: np.ndarray,
    b: np.ndarray,
    *,
    n_resamples: int,
    confidence: float,
    seed: int,
    codes_a: np.ndarray | None = None,
    codes_b: np.ndarray | None = None,
) -> tuple[float, float, float]:
    """Independent two-sample percentile bootstrap of ``mean(a) - mean(b)`` (each sample resampled on its own; by
    whole clusters when cluster codes are given)."""
    point = float(np.mean(a) - np.mean(b))
    rng_a, rng_b = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))

    def boot_means(x: np.ndarray, rng: np.random.Generator, codes: np.ndarray | None = None) -> np.ndarray:
        if x.size == 1 or np.all(x == x[0]) or (codes is not None and int(codes.max()) == 0):
            return np.full(n_resamples, float(np.mean(x)))
        if codes is not None and int(codes.max()) + 1 < x.size:
            return _cluster_boot_means(x, codes, rng, n_resamples)
        return np.concatenate(
            [x[rng.integers(0, x.size, size=(k, x.size))].mean(axis=1) for k in _chunks(n_resamples, x.size)]
        )

    diffs = boot_means(a, rng_a, codes_a) - boot_means(b, rng_b, codes_b)
    if np.all(diffs == diffs[0]):
        return point, point, point
    alpha = 1.0 - confidence
    lo, hi = np.quantile(diffs, [alpha / 2.0, 1.0 - alpha / 2.0])
    return point, float(lo), float(hi)


# ----------------------------------------------------------------------------------------------------------------
# permutation tests
# ----------------------------------------------------------------------------------------------------------------


def _tail_count(null: np.ndarray, observed: float, alternative: str, tol: float) -> int:
    """How many null statistics are at least as extreme as `observed` (ties count, within `tol`)."""
    if alternative == "greater":
        return int(np.count_nonzero(null >= observed - tol))
    if alternative == "less":
        return int(np.count_nonzero(null <= observed + tol))
    return int(np.count_nonzero(np.abs(null) >= abs(observed) - tol))


def permutation_test_paired(
    a: Any,
    b: Any,
    n_permutations: int = 10000,
    seed: int = 0,
    alternative: Alternative = "two-sided",
    *,
    exact_max_n: int = 16,
    clusters: Any = None,
) -> float:
    """Sign-flip permutation test on the paired differences ``d = a - b``, optionally flipping whole clusters.

    Under H0 (A and B exchangeable on each example) every difference is symmetric about 0, so flipping signs at
    random gives the null distribution of ``sum(d)``. Zero differences carry no sign and contribute nothing.

    With ``n <= exact_max_n`` all ``2**n`` sign patterns are enumerated and the p-value is exact (the identity is
    one of them, so ``p >= 2**-n``). Otherwise `n_permutations` random sign patterns are drawn and
    ``p = (1 + #extreme) / (1 + n_permutations)``, the add-one estimate that keeps the test valid (never p = 0).

    Args:
        a: Per-example scores of system A.
        b: Per-example scores of system B (same examples, same order).
        n_permutations: Random sign patterns when the test is not exact.
        seed: Seed of the sign generator.
        alternative: ``"two-sided"``; ``"greater"`` (H1: A scores higher, mean(a - b) > 0); ``"less"``.
        exact_max_n: Largest n that is enumerated exactly (2**n patterns).
        clusters: Optional cluster id per pair. Under H0 the differences of one cluster flip sign together (the
            cluster is the exchangeable unit), so the test runs on the per-cluster sums of ``d`` and ``n`` is the
            number of clusters.

    Returns:
        The p-value in (0, 1].
    """
    _check_alternative(alternative)
    a_arr, b_arr = _paired(a, b)
    d = a_arr - b_arr
    if clusters is not None:
        d = _cluster_sums(d, cluster_codes(clusters, d.size))[0]
    n = d.size
    observed = float(d.sum())
    # Sums of the same numbers in another order may differ by rounding; count near-ties as ties.
    tol = 1e-9 * max(1.0, float(np.abs(d).sum()))
    if not np.any(d):
        return 1.0
    if n <= exact_max_n:
        patterns = np.arange(2**n, dtype=np.int64)[:, None] >> np.arange(n, dtype=np.int64)
        signs = 1.0 - 2.0 * (patterns & 1)
        null = signs @ d
        return _tail_count(null, observed, alternative, tol) / float(2**n)
    if n_permutations < 1:
        raise ValueError(f"n_permutations must be >= 1, got {n_permutations}")
    rng = np.random.default_rng(seed)
    extreme = 0
    for k in _chunks(n_permutations, n):
        signs = 1.0 - 2.0 * rng.integers(0, 2, size=(k, n))
        extreme += _tail_count(signs @ d, observed, alternative, tol)
    return (1.0 + extreme) / (1.0 + n_permutations)


def permutation_test_unpaired(
    a: Any,
    b: Any,
    n_permutations: int = 10000,
    seed: int = 0,
    alternative: Alternative = "two-sided",
    *,
    clusters_a: Any = None,
    clusters_b: Any = None,
) -> float:
    """Two-sample label-permutation test on ``mean(a) - mean(b)`` (independent samples, lengths may differ).

    Exact over all ``C(n_a + n_b, n_a)`` relabellings when that number is at most `n_permutations`; otherwise
    Monte Carlo with ``p = (1 + #extreme) / (1 + n_permutations)``.

    Args:
        a: Scores of group A.
        b: Scores of group B.
        n_permutations: Random relabellings (also the bound for exact enumeration).
        seed: Seed of the permutation generator.
        alternative: ``"two-sided"``, ``"greater"`` (H1: mean(a) > mean(b)) or ``"less"``.
        clusters_a: Optional cluster id per value of `a`; clusters_b: the same for `b`. With either, whole clusters
            are relabelled (the statistic stays the difference of pooled means).

    Returns:
        The p-value in (0, 1].
    """
    _check_alternative(alternative)
    a_arr, b_arr = _as_1d(a, "a"), _as_1d(b, "b")
    if clusters_a is not None or clusters_b is not None:
        return _permutation_unpaired_clustered(
            a_arr, b_arr, clusters_a, clusters_b, n_permutations=n_permutations, seed=seed, alternative=alternative
        )
    pooled = np.concatenate([a_arr, b_arr])
    na, n = a_arr.size, pooled.size
    if np.all(pooled == pooled[0]):
        return 1.0
    total = float(pooled.sum())
    # mean(a*) - mean(b*) is a monotone function of sum(a*): sum(a*)/na - (total - sum(a*))/nb.
    nb = n - na

    def diff_of(sum_a: np.ndarray) -> np.ndarray:
        return sum_a / na - (total - sum_a) / nb

    observed = float(a_arr.mean() - b_arr.mean())
    tol = 1e-9 * max(1.0, float(np.abs(pooled).max()))
    if math.comb(n, na) <= n_permutations:
        sums = np.fromiter(
            (pooled[list(idx)].sum() for idx in itertools.combinations(range(n), na)),
            dtype=np.float64,
            count=math.comb(n, na),
        )
        return _tail_count(diff_of(sums), observed, alternative, tol) / float(sums.size)
    rng = np.random.default_rng(seed)
    extreme = 0
    for k in _chunks(n_permutations, n):
        shuffled = rng.permuted(np.broadcast_to(pooled, (k, n)), axis=1)
        extreme += _tail_count(diff_of(shuffled[:, :na].sum(axis=1)), observed, alternative, tol)
    return (1.0 + extreme) / (1.0 + n_permutations)


def _permutation_unpaired_clustered(
    a: np.ndarray, b: np.ndarray, clusters_a: Any, clusters_b: Any, *, n_permutations: int, seed: int, alternative: str
) -> float:
    """Label permutation of whole clusters: statistic ``S_A / C_A - S_B / C_B`` over the clusters labelled A / B."""
    codes_a = cluster_codes(clusters_a if clusters_a is not None else range(a.size), a.size, "clusters_a")
    codes_b = cluster_codes(clusters_b if clusters_b is not None else range(b.size), b.size, "clusters_b")
    sa, ca = _cluster_sums(a, codes_a)
    sb, cb = _cluster_sums(b, codes_b)
    sums, counts = np.concatenate([sa, sb]), np.concatenate([ca, cb])  # (G,) each
    ga, g = sa.size, sa.size + sb.size
    if np.all(np.concatenate([a, b]) == a[0]):
        return 1.0
    observed = float(a.mean() - b.mean())
    tol = 1e-9 * max(1.0, float(np.abs(np.concatenate([a, b])).max()))

    def stat(mask: np.ndarray) -> np.ndarray:  # mask (k, G) bool, True = labelled A
        s_a, c_a = (mask * sums).sum(axis=1), (mask * counts).sum(axis=1)
        return s_a / c_a - (sums.sum() - s_a) / (counts.sum() - c_a)

    if math.comb(g, ga) <= n_permutations:
        masks = np.zeros((math.comb(g, ga), g), dtype=bool)
        for row, idx in enumerate(itertools.combinations(range(g), ga)):
            masks[row, list(idx)] = True
        return _tail_count(stat(masks), observed, alternative, tol) / float(masks.shape[0])
    rng = np.random.default_rng(seed)
    base = np.zeros(g, dtype=bool)
    base[:ga] = True
    extreme = 0
    for k in _chunks(n_permutations, g):
        extreme += _tail_count(stat(rng.permuted(np.broadcast_to(base, (k, g)), axis=1)), observed, alternative, tol)
    return (1.0 + extreme) / (1.0 + n_permutations)


# ----------------------------------------------------------------------------------------------------------------
# proportions, McNemar, correlations
# ----------------------------------------------------------------------------------------------------------------


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion ``successes / n``.

    Unlike the normal (Wald) interval it never has zero width at 0/n or n/n and stays inside [0, 1], which matters
    for the small accuracy counts lmlab reports. The bound at 0 successes is exactly 0, at n successes exactly 1.

    Args:
        successes: Number of successes, ``0 <= successes <= n``.
        n: Number of trials (> 0; a rate over zero examples is undefined and raises `ValueError`).
        confidence: Two-sided confidence level in (0, 1).

    Returns:
        ``(lo, hi)``. Use `proportion_ci` for an `Estimate` that includes the point estimate and n.
    """
    _check_confidence(confidence)
    if n <= 0:
        raise ValueError(f"n must be > 0 for a proportion, got n={n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, n]: successes={successes}, n={n}")
    z = float(_sps.norm.ppf(0.5 + confidence / 2.0))
    p = successes / n
    z2n = z * z / n
    denom = 1.0 + z2n
    center = (p + z2n / 2.0) / denom
    half = z * math.sqrt(p * (1.0 - p) / n + z * z / (4.0 * n * n)) / denom
    lo = 0.0 if successes == 0 else max(0.0, center - half)
    hi = 1.0 if successes == n else min(1.0, center + half)
    return lo, hi


def mcnemar(a_correct: Any, b_correct: Any, *, exact_below: int = 25) -> tuple[float, float]:
    """McNemar's test: do two classifiers scored on the same examples have different accuracy?

    Only the discordant examples count: ``n01`` = A right and B wrong, ``n10`` = A wrong and B right. Under H0 each
    discordant example is a fair coin.

    * ``n01 + n10 < exact_below``: exact two-sided binomial test, ``statistic = min(n01, n10)`` and
      ``p = min(1, 2 * BinomCDF(min(n01, n10); n01 + n10, 0.5))``. No discordant pair gives ``(0.0, 1.0)``.
    * otherwise: chi-square with continuity correction, ``statistic = (|n01 - n10| - 1)**2 / (n01 + n10)``,
      ``p = chi2.sf(statistic, df=1)``.

    Args:
        a_correct: Per-example correctness of A (bools or 0/1).
        b_correct: Per-example correctness of B on the same examples in the same order.
        exact_below: Discordant count below which the exact binomial test is used (25, the usual rule).

    Returns:
        ``(statistic, p_value)``; the statistic's meaning depends on the branch, as above.
    """
    a_arr, b_arr = _paired(a_correct, b_correct)
    for name, arr in (("a_correct", a_arr), ("b_correct", b_arr)):
        if not np.all((arr == 0) | (arr == 1)):
            raise ValueError(f"{name} must hold booleans or 0/1 values")
    a_ok, b_ok = a_arr.astype(bool), b_arr.astype(bool)
    n01 = int(np.count_nonzero(a_ok & ~b_ok))
    n10 = int(np.count_nonzero(~a_ok & b_ok))
    disc = n01 + n10
    if disc == 0:
        return 0.0, 1.0
    if disc < exact_below:
        k = min(n01, n10)
        return float(k), float(min(1.0, 2.0 * _sps.binom.cdf(k, disc, 0.5)))
    statistic = (abs(n01 - n10) - 1.0) ** 2 / disc
    return float(statistic), float(_sps.chi2.sf(statistic, 1))


def _correlation(fn: Callable[..., Any], x: Any, y: Any) -> tuple[float, float]:
    x_arr, y_arr = _as_1d(x, "x"), _as_1d(y, "y")
    if x_arr.size != y_arr.size:
        raise ValueError(f"x and y must have the same length: len(x)={x_arr.size}, len(y)={y_arr.size}")
    if x_arr.size < 2:
        raise ValueError(f"a correlation needs at least 2 pairs, got {x_arr.size}")
    with warnings.catch_warnings():
        # Constant input is a legitimate outcome (e.g. all methods tie): scipy returns NaN and warns; we document
        # the NaN instead of spamming the run log.
        warnings.simplefilter("ignore")
        res = fn(x_arr, y_arr)
    return float(res.statistic), float(res.pvalue)


def spearman(x: Any, y: Any) -> tuple[float, float]:
    """Spearman rank correlation (`scipy.stats.spearmanr`).

    Args:
        x: First 1-D sample.
        y: Second 1-D sample, same length.

    Returns:
        ``(rho, p_value)``; ``(nan, nan)`` when either input is constant.
    """
    return _correlation(_sps.spearmanr, x, y)


def kendall(x: Any, y: Any) -> tuple[float, float]:
    """Kendall's tau-b (`scipy.stats.kendalltau`), robust to ties.

    Args:
        x: First 1-D sample.
        y: Second 1-D sample, same length.

    Returns:
        ``(tau, p_value)``; ``(nan, nan)`` when either input is constant.
    """
    return _correlation(_sps.kendalltau, x, y)


# ----------------------------------------------------------------------------------------------------------------
# estimates and claim checks
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its confidence interval and sample size: the shape of every lmlab metric."""

    value: float
    ci_low: float
    ci_high: float
    n: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-able ``{"value", "ci_low", "ci_high", "n"}``."""
        return asdict(self)


def mean_ci(
    values: Any,
    method: Literal["bootstrap", "t"] = "bootstrap",
    *,
    confidence: float = 0.95,
    n_resamples: int = 1000,
    seed: int = 0,
    clusters: Any = None,
) -> Estimate:
    """Mean of `values` with a confidence interval (a cluster bootstrap when `clusters` is given).

    Args:
        values: 1-D finite samples (NaN/inf raise `ValueError`).
        method: ``"bootstrap"`` (percentile bootstrap, see `bootstrap_ci`) or ``"t"`` (Student-t interval
            ``mean +- t_{n-1} * sd / sqrt(n)``). With n = 1 both give a zero-width interval at the value.
        confidence: Two-sided confidence level in (0, 1).
        n_resamples: Bootstrap resamples (``"bootstrap"`` only).
        seed: Bootstrap seed (``"bootstrap"`` only).
        clusters: Optional cluster id per value (``"bootstrap"`` only): whole clusters are resampled and ``n`` of
            the estimate is the number of clusters, the number of independent units.

    Returns:
        An `Estimate`.
    """
    arr = _as_1d(values)
    _check_confidence(confidence)
    if clusters is not None and method != "bootstrap":
        raise ValueError(f"clusters need method='bootstrap', got method={method!r}")
    if method == "bootstrap":
        point, lo, hi = bootstrap_ci(arr, n_resamples=n_resamples, confidence=confidence, seed=seed, clusters=clusters)
        if clusters is not None:
            return Estimate(value=point, ci_low=lo, ci_high=hi, n=n_clusters(clusters))
    elif method == "t":
        point = float(arr.mean())
        if arr.size == 1:
            lo = hi = point
        else:
            half = (
                float(_sps.t.ppf(0.5 + confidence / 2.0, arr.size - 1)) * float(arr.std(ddof=1)) / math.sqrt(arr.size)
            )
            lo, hi = point - half, point + half
    else:
        raise ValueError(f"method must be 'bootstrap' or 't', got {method!r}")
    return Estimate(value=point, ci_low=lo, ci_high=hi, n=int(arr.size))


def proportion_ci(successes: int, n: int, confidence: float = 0.95) -> Estimate:
    """``successes / n`` with its Wilson interval, as an `Estimate`.

    Args:
        successes: Number of successes.
        n: Number of trials (> 0).
        confidence: Two-sided confidence level in (0, 1).

    Returns:
        An `Estimate`.
    """
    lo, hi = wilson_interval(successes, n, confidence)
    return Estimate(value=successes / n, ci_low=lo, ci_high=hi, n=int(n))


def default_min_n(confidence: float) -> int:
    """Smallest sample size at which `compare` may return a decisive status.

    It is the smallest n for which even an exact sign-flip test could reach one-sided significance at the CI's
    level: ``2**-n <= (1 - confidence) / 2``, i.e. ``ceil(log2(2 / (1 - confidence)))`` (6 at 95%, 8 at 99%).
    Below it a percentile bootstrap can still give a zero-width interval (three 0/1 wins out of three give [1, 1])
    that would "support" a claim no test could support.

    Args:
        confidence: Two-sided confidence level in (0, 1).
    """
    _check_confidence(confidence)
    return max(2, math.ceil(math.log2(2.0 / (1.0 - confidence)) - 1e-12))


def _claim_rule(direction: str, min_effect: float, confidence: float, min_n: int | None) -> tuple[int, float]:
    """The checked arguments of a claim: (the n a decisive status needs, the threshold t on the effect), with
    ``t = min_effect`` for ``">"`` and ``-min_effect`` for ``"<"``."""
    if direction not in (">", "<"):
        raise ValueError(f"direction must be '>' or '<', got {direction!r}")
    if not math.isfinite(min_effect):
        raise ValueError(f"min_effect must be finite, got {min_effect!r}")
    _check_confidence(confidence)
    need = default_min_n(confidence) if min_n is None else int(min_n)
    return need, float(min_effect) if direction == ">" else -float(min_effect)


def _decide(
    lo: float, hi: float, t: float, direction: Direction, n_eff: int, need: int, confidence: float
) -> tuple[Status, str]:
    """`compare`'s decision rule on a CI ``[lo, hi]`` of the effect against the threshold `t`: status and reason."""
    ci = f"CI [{lo:.4g}, {hi:.4g}] at {confidence:.0%}"
    if n_eff < need:
        return "inconclusive", f"only {n_eff} examples (< min_n={need}): too few to decide; {ci}"
    if direction == ">":
        if lo > t:
            return "supported", f"{ci} lies above the threshold {t:.4g}"
        if hi <= t:
            return "not_supported", f"{ci} lies at or below the threshold {t:.4g}"
        return "inconclusive", f"{ci} straddles the threshold {t:.4g}"
    if hi < t:
        return "supported", f"{ci} lies below the threshold {t:.4g}"
    if lo >= t:
        return "not_supported", f"{ci} lies at or above the threshold {t:.4g}"
    return "inconclusive", f"{ci} straddles the threshold {t:.4g}"


@dataclass(frozen=True)
class Comparison:
    """Outcome of `compare`: the measured effect, its CI and the claim status computed from them.

    Attributes:
        effect: ``mean(a) - mean(b)``.
        ci_low: Lower bound of the CI of the effect.
        ci_high: Upper bound of the CI of the effect.
        p_value: One-sided permutation p-value of H0 "the claim is false at the threshold" (see `compare`).
        n: Pairs when paired, else ``len(a) + len(b)``; clusters instead of values when clustered.
        status: ``"supported"``, ``"not_supported"`` or ``"inconclusive"``.
        direction: The claimed direction, ``">"`` (A higher) or ``"<"`` (A lower).
        min_effect: The margin of the claim.
        threshold: The value the CI is compared with: ``min_effect`` for ``">"``, ``-min_effect`` for ``"<"``.
        confidence: Two-sided confidence level of the CI.
        paired: Whether the paired bootstrap / sign-flip test was used.
        mean_a: ``mean(a)``.
        mean_b: ``mean(b)``.
        n_a: ``len(a)``.
        n_b: ``len(b)``.
        reason: One line saying which rule fired, with the numbers.
    """

    effect: float
    ci_low: float
    ci_high: float
    p_value: float
    n: int
    status: Status
    direction: Direction
    min_effect: float
    threshold: float
    confidence: float
    paired: bool
    mean_a: float
    mean_b: float
    n_a: int
    n_b: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of all fields."""
        return asdict(self)


def compare(
    a: Any,
    b: Any,
    *,
    direction: Direction = ">",
    min_effect: float = 0.0,
    paired: bool = True,
    seed: int = 0,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    n_permutations: int = 10000,
    min_n: int | None = None,
    clusters: Any = None,
    clusters_b: Any = None,
) -> Comparison:
    """Check the claim "A beats B by more than `min_effect`" against the numbers this run measured.

    The effect is ``mean(a) - mean(b)`` with a two-sided `confidence` bootstrap CI ``[lo, hi]``: the paired bootstrap
    of the per-example differences when ``paired=True`` (same examples, same order), else an independent
    two-sample bootstrap of the difference of means.

    Decision rule. Let ``t = min_effect`` for ``direction=">"`` (claim: effect > t) and ``t = -min_effect`` for
    ``direction="<"`` (claim: effect < t, i.e. A lower than B by more than `min_effect`). Let ``n_eff`` be the
    number of pairs (paired) or ``min(len(a), len(b))`` (unpaired).

    * ``n_eff < min_n``                                        -> ``"inconclusive"`` (too few examples to decide).
    * ``">"``: ``lo > t`` -> ``"supported"``; ``hi <= t`` -> ``"not_supported"``; else (``lo <= t < hi``) ->
      ``"inconclusive"``.
    * ``"<"``: ``hi < t`` -> ``"supported"``; ``lo >= t`` -> ``"not_supported"``; else (``lo < t <= hi``) ->
      ``"inconclusive"``.

    So "supported" needs the whole CI strictly beyond the threshold in the claimed direction; "not_supported" needs
    the whole CI on the other side (the data show, with confidence, an effect in the opposite direction or no
    effect beyond `min_effect`; a CI that ends exactly at the threshold counts here, since the effect is then not
    beyond it); a CI that straddles the threshold is "inconclusive". The rule is exactly mirrored:
    ``compare(a, b, direction="<")`` has the status of ``compare(b, a, direction=">")``.

    With ``min_effect=0`` a true null effect stays "inconclusive" however large n is (absence of evidence is not
    evidence of absence). To be able to conclude "no meaningful effect", set `min_effect` to the smallest effect
    that matters: a precise CI below it is then "not_supported". A negative `min_effect` states a non-inferiority
    claim ("A is not worse than B by more than |min_effect|"); when both systems score one and the same constant on
    every example (both at 0, both at ceiling) such a claim is "inconclusive": the metric does not discriminate.

    The reported `p_value` is complementary and does not enter the status: the one-sided permutation p-value of
    H0 "effect <= t" (``">"``) or "effect >= t" (``"<"``), from the sign-flip test on ``a - b - t`` (paired) or the
    label-permutation test of ``a - t`` against ``b`` (unpaired). Everything is deterministic given `seed`.

    Args:
        a: Per-example scores of system A.
        b: Per-example scores of system B (same examples and order when paired).
        direction: ``">"``: the claim is that A scores higher; ``"<"``: that A scores lower.
        min_effect: Margin of the claim in the claimed direction (in the units of the scores).
        paired: Paired (per-example) analysis; requires equal lengths.
        seed: Seed of the bootstrap and permutation generators.
        confidence: Two-sided confidence level of the CI in (0, 1).
        n_resamples: Bootstrap resamples.
        n_permutations: Permutations of the p-value (exact enumeration for small n).
        min_n: Smallest ``n_eff`` for a decisive status; default `default_min_n` (6 at 95%).
        clusters: Optional cluster id per value of `a` (and of `b` when paired: the pairs share them): the
            independent unit (prompt, document, seed, client). The CI is then a cluster bootstrap, the p-value flips
            or relabels whole clusters, and ``n`` / ``n_eff`` count clusters, not values.
        clusters_b: Cluster ids of `b` when unpaired (default: each value its own cluster).

    Returns:
        A `Comparison`.
    """
    need, t = _claim_rule(direction, min_effect, confidence, min_n)
    # Independent streams for the CI and the p-value, both fixed by `seed`.
    boot_seed, perm_seed = (int(s.generate_state(1)[0]) for s in np.random.SeedSequence(seed).spawn(2))
    alternative: Alternative = "greater" if direction == ">" else "less"
    if paired:
        if clusters_b is not None:
            raise ValueError("clusters_b is for unpaired comparisons; paired values share `clusters`")
        a_arr, b_arr = _paired(a, b)
        effect, lo, hi = bootstrap_ci(
            a_arr - b_arr, n_resamples=n_resamples, confidence=confidence, seed=boot_seed, clusters=clusters
        )
        shifted = a_arr - b_arr - t
        p = permutation_test_paired(
            shifted, np.zeros_like(shifted), n_permutations, perm_seed, alternative, clusters=clusters
        )
        n = n_eff = int(a_arr.size) if clusters is None else n_clusters(clusters)
    else:
        a_arr, b_arr = _as_1d(a, "a"), _as_1d(b, "b")
        codes_a = None if clusters is None else cluster_codes(clusters, a_arr.size)
        codes_b = None if clusters_b is None else cluster_codes(clusters_b, b_arr.size, "clusters_b")
        effect, lo, hi = _unpaired_bootstrap_diff(
            a_arr, b_arr, n_resamples=n_resamples, confidence=confidence, seed=boot_seed, codes_a=codes_a,
            codes_b=codes_b,
        )  # fmt: skip
        p = permutation_test_unpaired(
            a_arr - t, b_arr, n_permutations, perm_seed, alternative, clusters_a=clusters, clusters_b=clusters_b
        )
        g_a = a_arr.size if clusters is None else n_clusters(clusters)
        g_b = b_arr.size if clusters_b is None else n_clusters(clusters_b)
        n, n_eff = int(g_a + g_b), int(min(g_a, g_b))

    ci = f"CI [{lo:.4g}, {hi:.4g}] at {confidence:.0%}"
    status, reason = _decide(float(lo), float(hi), t, direction, n_eff, need, confidence)
    lenient = t < 0 if direction == ">" else t > 0  # a non-inferiority claim: a tie passes it
    if status == "supported" and lenient and np.all(a_arr == a_arr[0]) and np.all(b_arr == a_arr[0]):
        # Both systems at one and the same constant (typically both at 0 or both at ceiling): the metric does not
        # discriminate here, so "not worse by more than the margin" is true of any two systems and says nothing.
        status = "inconclusive"
        reason = f"both systems score {a_arr[0]:.4g} on every example: the metric does not discriminate; {ci}"
    return Comparison(
        effect=float(effect),
        ci_low=float(lo),
        ci_high=float(hi),
        p_value=float(p),
        n=n,
        status=status,
        direction=direction,
        min_effect=float(min_effect),
        threshold=t,
        confidence=float(confidence),
        paired=bool(paired),
        mean_a=float(a_arr.mean()),
        mean_b=float(b_arr.mean()),
        n_a=int(a_arr.size),
        n_b=int(b_arr.size),
        reason=reason,
    )


def compare_statistic(
    a: Any,
    b: Any,
    stat: Callable[[np.ndarray], float],
    *,
    direction: Direction = ">",
    min_effect: float = 0.0,
    seed: int = 0,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    min_n: int | None = None,
    clusters: Any = None,
) -> Comparison:
    """`compare` for a statistic that is not a mean of per-example values: the claim ``stat(a) - stat(b)`` beyond
    `min_effect` in `direction`, paired by example (rows of `a` and `b` are the same units in the same order).

    The CI is `paired_bootstrap_stat` (the statistic recomputed on each resample's rows, one resampled set of units
    for both systems); the status follows `compare`'s decision rule on it (``n_eff`` = rows, or clusters when
    clustered). No permutation test: ``p_value`` is NaN. ``mean_a`` / ``mean_b`` hold ``stat(a)`` / ``stat(b)``.
    """
    need, t = _claim_rule(direction, min_effect, confidence, min_n)
    effect, lo, hi = paired_bootstrap_stat(
        a, b, stat, n_resamples=n_resamples, confidence=confidence, seed=seed, clusters=clusters
    )
    n_rows = int(np.asarray(a).shape[0])
    n = n_rows if clusters is None else n_clusters(clusters)
    status, reason = _decide(lo, hi, t, direction, n, need, confidence)
    return Comparison(
        effect=float(effect),
        ci_low=float(lo),
        ci_high=float(hi),
        p_value=float("nan"),
        n=n,
        status=status,
        direction=direction,
        min_effect=float(min_effect),
        threshold=t,
        confidence=float(confidence),
        paired=True,
        mean_a=float(stat(np.asarray(a, dtype=np.float64))),
        mean_b=float(stat(np.asarray(b, dtype=np.float64))),
        n_a=n_rows,
        n_b=n_rows,
        reason=reason,
    )


__all__ = [
    "Comparison",
    "Estimate",
    "bootstrap_ci",
    "cluster_codes",
    "compare",
    "compare_statistic",
    "default_min_n",
    "kendall",
    "mcnemar",
    "mean_ci",
    "n_clusters",
    "paired_bootstrap_diff",
    "paired_bootstrap_stat",
    "permutation_test_paired",
    "permutation_test_unpaired",
    "proportion_ci",
    "spearman",
    "wilson_interval",
]
