"""Statistics: CI coverage and determinism, exact reference values, and the claim-check decision rule."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats as sps

from lmlab.core.stats.uncertainty import (
    Comparison,
    Estimate,
    bootstrap_ci,
    compare,
    default_min_n,
    kendall,
    mcnemar,
    mean_ci,
    paired_bootstrap_diff,
    permutation_test_paired,
    permutation_test_unpaired,
    proportion_ci,
    spearman,
    wilson_interval,
)

Z95 = 1.959963984540054

# ----------------------------------------------------------------------------------------------------------------
# bootstrap
# ----------------------------------------------------------------------------------------------------------------


def test_bootstrap_coverage_and_unbiasedness_on_normal_data():
    rng = np.random.default_rng(123)
    true_mean, repeats, n = 1.5, 200, 40
    covered, points = 0, []
    for i in range(repeats):
        x = rng.normal(true_mean, 2.0, size=n)
        point, lo, hi = bootstrap_ci(x, n_resamples=1000, seed=i)
        assert lo <= point <= hi
        covered += lo <= true_mean <= hi
        points.append(point)
    coverage = covered / repeats
    assert 0.90 <= coverage <= 0.99, coverage
    # mean estimate is unbiased: the average of 200 estimates is within 4 standard errors of the truth
    se = 2.0 / math.sqrt(n) / math.sqrt(repeats)
    assert abs(np.mean(points) - true_mean) < 4 * se


def test_bootstrap_is_deterministic_under_seed():
    x = np.random.default_rng(0).exponential(size=50)
    assert bootstrap_ci(x, seed=7) == bootstrap_ci(x, seed=7)
    assert bootstrap_ci(list(x), seed=7) == bootstrap_ci(x, seed=7)
    assert bootstrap_ci(x, seed=7) != bootstrap_ci(x, seed=8)


def test_bootstrap_degenerate_cases():
    assert bootstrap_ci([3.0]) == (3.0, 3.0, 3.0)
    point, lo, hi = bootstrap_ci([0.1] * 7)
    assert lo == hi == point
    assert bootstrap_ci([1, 1, 1, 1]) == (1.0, 1.0, 1.0)


def test_bootstrap_rejects_nan_and_empty():
    with pytest.raises(ValueError, match="non-finite"):
        bootstrap_ci([1.0, float("nan"), 2.0])
    with pytest.raises(ValueError, match="non-finite"):
        bootstrap_ci([1.0, float("inf")])
    with pytest.raises(ValueError, match="empty"):
        bootstrap_ci([])
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ci([1.0, 2.0], confidence=1.0)


def test_bootstrap_custom_stat_with_and_without_axis():
    x = np.random.default_rng(1).normal(size=31)
    vec = bootstrap_ci(x, stat=np.median, seed=3)
    loop = bootstrap_ci(x, stat=lambda v: float(np.median(v)), seed=3)
    assert vec[0] == pytest.approx(np.median(x))
    assert vec == pytest.approx(loop)  # same resamples, same statistic: same interval
    assert vec[1] < vec[0] < vec[2]


def test_bootstrap_confidence_widens_interval():
    x = np.random.default_rng(2).normal(size=60)
    _, lo90, hi90 = bootstrap_ci(x, confidence=0.90)
    _, lo99, hi99 = bootstrap_ci(x, confidence=0.99)
    assert lo99 < lo90 and hi99 > hi90


def test_paired_bootstrap_diff():
    rng = np.random.default_rng(4)
    b = rng.normal(size=80)
    a = b + 0.5 + rng.normal(0, 0.1, size=80)
    point, lo, hi = paired_bootstrap_diff(a, b)
    assert point == pytest.approx(np.mean(a - b))
    assert lo < 0.5 < hi
    assert hi - lo < 0.1  # pairing removes the large per-example variance shared by a and b
    with pytest.raises(ValueError, match=r"len\(a\)=3, len\(b\)=2"):
        paired_bootstrap_diff([1, 2, 3], [1, 2])


# ----------------------------------------------------------------------------------------------------------------
# permutation tests
# ----------------------------------------------------------------------------------------------------------------


def test_permutation_paired_exact_small_case():
    # d = [1, 2, 3]: 8 sign patterns, sums: 6 once, 4, 2, 0, 0, -2, -4, -6 -> P(sum >= 6) = 1/8
    a, b = [1.0, 2.0, 3.0], [0.0, 0.0, 0.0]
    assert permutation_test_paired(a, b, alternative="greater") == pytest.approx(1 / 8)
    assert permutation_test_paired(a, b, alternative="two-sided") == pytest.approx(2 / 8)
    assert permutation_test_paired(a, b, alternative="less") == pytest.approx(1.0)
    assert permutation_test_paired([1, 2], [1, 2]) == 1.0  # no difference at all


def test_permutation_paired_null_is_roughly_uniform():
    rng = np.random.default_rng(5)
    ps_mc, ps_exact = [], []
    for i in range(150):
        a, b = rng.normal(size=30), rng.normal(size=30)
        ps_mc.append(permutation_test_paired(a, b, n_permutations=400, seed=i))
        ps_exact.append(permutation_test_paired(a[:10], b[:10]))
    for ps in (ps_mc, ps_exact):
        ps = np.asarray(ps)
        assert 0.4 < ps.mean() < 0.6, ps.mean()
        assert np.mean(ps <= 0.05) < 0.12


def test_permutation_paired_strong_effect_and_direction():
    rng = np.random.default_rng(6)
    b = rng.normal(size=40)
    a = b + 1.0 + rng.normal(0, 0.3, size=40)
    assert permutation_test_paired(a, b, n_permutations=2000) < 0.001
    assert permutation_test_paired(a, b, n_permutations=2000, alternative="greater") < 0.001
    assert permutation_test_paired(a, b, n_permutations=2000, alternative="less") > 0.99
    # determinism of the Monte Carlo branch
    assert permutation_test_paired(a, b, n_permutations=500, seed=3) == permutation_test_paired(
        a, b, n_permutations=500, seed=3
    )


def test_permutation_unpaired():
    assert permutation_test_unpaired([3.0, 4.0], [1.0, 2.0], alternative="greater") == pytest.approx(1 / 6)
    rng = np.random.default_rng(7)
    a, b = rng.normal(1.0, 1.0, size=40), rng.normal(0.0, 1.0, size=50)
    assert permutation_test_unpaired(a, b, n_permutations=2000, alternative="greater") < 0.01
    null = [permutation_test_unpaired(rng.normal(size=12), rng.normal(size=12), 300, seed=i) for i in range(80)]
    assert 0.35 < np.mean(null) < 0.65


# ----------------------------------------------------------------------------------------------------------------
# Wilson, McNemar, correlations
# ----------------------------------------------------------------------------------------------------------------


def test_wilson_known_values():
    z2 = Z95**2
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(z2 / (10 + z2))
    lo, hi = wilson_interval(10, 10)
    assert hi == 1.0 and lo == pytest.approx(10 / (10 + z2))
    lo, hi = wilson_interval(5, 10)
    half = Z95 * math.sqrt(0.25 / 10 + z2 / 400) / (1 + z2 / 10)
    assert lo == pytest.approx(0.5 - half) and hi == pytest.approx(0.5 + half)
    assert (lo, hi) == pytest.approx((0.2366, 0.7634), abs=1e-4)  # the textbook value
    with pytest.raises(ValueError):
        wilson_interval(0, 0)
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def test_proportion_ci_estimate():
    est = proportion_ci(5, 10)
    assert isinstance(est, Estimate)
    assert est.value == 0.5 and est.n == 10
    assert (est.ci_low, est.ci_high) == wilson_interval(5, 10)


def test_mcnemar_exact_hand_computed():
    # n01 (A right, B wrong) = 1, n10 (A wrong, B right) = 6, 3 concordant pairs.
    a = [1, 0, 0, 0, 0, 0, 0, 1, 1, 0]
    b = [0, 1, 1, 1, 1, 1, 1, 1, 1, 0]
    stat, p = mcnemar(a, b)
    # 2 * P(X <= 1), X ~ Bin(7, 1/2) = 2 * (1 + 7) / 128
    assert stat == 1.0 and p == pytest.approx(16 / 128)
    assert mcnemar([True, False], [True, False]) == (0.0, 1.0)


def test_mcnemar_chi_square_branch():
    a = [1] * 30 + [0] * 10
    b = [0] * 30 + [1] * 10
    stat, p = mcnemar(a, b)
    assert stat == pytest.approx((20 - 1) ** 2 / 40)
    assert p == pytest.approx(math.erfc(math.sqrt(stat / 2)))  # chi2(1) survival in closed form
    with pytest.raises(ValueError):
        mcnemar([0, 2], [1, 1])


def test_correlations_match_scipy():
    x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    y = [2.0, 1.0, 4.0, 3.0, 6.0, 5.0]
    rho, p = spearman(x, y)
    ref = sps.spearmanr(x, y)
    assert rho == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue)
    assert rho == pytest.approx(1 - 6 * 6 / (6 * 35))  # 1 - 6 * sum d^2 / (n (n^2 - 1)), sum d^2 = 6
    tau, p = kendall(x, y)
    ref = sps.kendalltau(x, y)
    assert tau == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue)
    assert tau == pytest.approx((12 - 3) / 15)  # 12 concordant, 3 discordant pairs
    assert all(math.isnan(v) for v in spearman([1, 1, 1], [1, 2, 3]))
    with pytest.raises(ValueError, match=r"len\(x\)=2, len\(y\)=3"):
        kendall([1, 2], [1, 2, 3])


# ----------------------------------------------------------------------------------------------------------------
# mean_ci
# ----------------------------------------------------------------------------------------------------------------


def test_mean_ci_methods():
    x = np.random.default_rng(8).normal(10, 2, size=50)
    t = mean_ci(x, method="t")
    half = sps.t.ppf(0.975, 49) * x.std(ddof=1) / math.sqrt(50)
    assert t.value == pytest.approx(x.mean())
    assert (t.ci_low, t.ci_high) == pytest.approx((x.mean() - half, x.mean() + half))
    boot = mean_ci(x)
    assert boot.n == 50 and boot.ci_low < boot.value < boot.ci_high
    assert boot.ci_high - boot.ci_low == pytest.approx(2 * half, rel=0.25)
    assert json.loads(json.dumps(boot.to_dict())) == {
        "value": boot.value,
        "ci_low": boot.ci_low,
        "ci_high": boot.ci_high,
        "n": 50,
    }
    assert mean_ci([2.0], method="t") == Estimate(2.0, 2.0, 2.0, 1)
    with pytest.raises(ValueError):
        mean_ci(x, method="bogus")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------------------------
# compare: the claim-check engine
# ----------------------------------------------------------------------------------------------------------------


def _paired_data(effect: float, n: int, seed: int, noise: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    b = rng.normal(0.0, 1.0, size=n)
    return b + effect + rng.normal(0.0, noise, size=n), b


def test_compare_clear_positive_is_supported():
    a, b = _paired_data(1.0, 60, seed=10)
    res = compare(a, b)
    assert isinstance(res, Comparison)
    assert res.status == "supported"
    assert res.effect == pytest.approx(np.mean(a) - np.mean(b))
    assert res.ci_low > 0 and res.p_value < 0.001 and res.n == 60


def test_compare_clear_negative_is_not_supported():
    a, b = _paired_data(-1.0, 60, seed=11)
    res = compare(a, b, direction=">")
    assert res.status == "not_supported"
    assert res.ci_high < 0 and res.p_value > 0.99


def test_compare_zero_effect_small_n_is_inconclusive():
    for seed in range(5):
        a, b = _paired_data(0.0, 12, seed=seed)
        assert compare(a, b).status == "inconclusive"
        assert compare(a, b, direction="<").status == "inconclusive"


def test_compare_direction_less_is_mirrored():
    a, b = _paired_data(-1.0, 60, seed=12)
    assert compare(a, b, direction="<").status == "supported"
    assert compare(b, a, direction="<").status == "not_supported"
    for seed in range(6):
        for effect in (-0.4, -0.1, 0.0, 0.2, 0.6):
            a, b = _paired_data(effect, 25, seed=seed)
            for m in (0.0, 0.2):
                lt, gt = compare(a, b, direction="<", min_effect=m), compare(b, a, direction=">", min_effect=m)
                assert lt.status == gt.status
                assert lt.p_value == pytest.approx(gt.p_value)
                assert (lt.ci_low, lt.ci_high) == pytest.approx((-gt.ci_high, -gt.ci_low))
                assert lt.threshold == -m and gt.threshold == m


def test_compare_min_effect_is_respected():
    a, b = _paired_data(0.3, 400, seed=13, noise=0.2)  # effect ~0.3, CI roughly +-0.02
    assert compare(a, b, min_effect=0.1).status == "supported"
    assert compare(a, b, min_effect=0.5).status == "not_supported"  # precisely below the margin that matters
    assert compare(a, b, min_effect=0.3).status == "inconclusive"  # CI straddles the margin
    assert compare(a, b, direction="<", min_effect=0.1).status == "not_supported"
    # non-inferiority: a slightly worse system is "not worse by more than 0.1"
    c, d = _paired_data(-0.02, 400, seed=14, noise=0.2)
    assert compare(c, d, min_effect=-0.1).status == "supported"
    assert compare(c, d, min_effect=0.0).status in ("inconclusive", "not_supported")


def test_compare_boundary_rules():
    # identical 0/1 outcomes on every example: the CI is exactly [0, 0], which is not beyond a 0 threshold
    same = [1, 0, 1, 1, 0, 1, 0, 1, 1, 1]
    res = compare(same, same)
    assert (res.ci_low, res.ci_high) == (0.0, 0.0) and res.status == "not_supported"
    assert compare(same, same, direction="<").status == "not_supported"
    # a constant win of 1 on every example: supported, CI [1, 1]
    wins = compare([1] * 10, [0] * 10)
    assert wins.status == "supported" and (wins.ci_low, wins.ci_high) == (1.0, 1.0)


def test_compare_refuses_to_decide_on_too_few_examples():
    assert default_min_n(0.95) == 6 and default_min_n(0.99) == 8 and default_min_n(0.90) == 5
    res = compare([1, 1, 1], [0, 0, 0])  # a zero-width CI [1, 1] from three examples
    assert res.status == "inconclusive" and "min_n" in res.reason
    assert compare([1, 1, 1], [0, 0, 0], min_n=1).status == "supported"
    assert compare([1] * 6, [0] * 6).status == "supported"


def test_compare_unpaired():
    rng = np.random.default_rng(15)
    a, b = rng.normal(1.0, 1.0, size=50), rng.normal(0.0, 1.0, size=70)
    res = compare(a, b, paired=False)
    assert res.status == "supported" and res.n == 120 and (res.n_a, res.n_b) == (50, 70)
    assert res.effect == pytest.approx(a.mean() - b.mean())
    assert compare(b, a, paired=False).status == "not_supported"
    assert compare(b, a, paired=False, direction="<").status == "supported"
    z1, z2 = rng.normal(size=10), rng.normal(size=10)
    assert compare(z1, z2, paired=False).status == "inconclusive"
    with pytest.raises(ValueError, match=r"len\(a\)=50, len\(b\)=70"):
        compare(a, b, paired=True)


def test_compare_is_deterministic_and_json_able():
    a, b = _paired_data(0.2, 40, seed=16)
    first, second = compare(a, b, seed=3), compare(a, b, seed=3)
    assert first == second
    assert compare(a, b, seed=4).ci_low != first.ci_low
    d = json.loads(json.dumps(first.to_dict()))
    assert d["status"] == first.status and d["n"] == 40 and d["direction"] == ">"
    with pytest.raises(ValueError):
        compare(a, b, direction="!=")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-finite"):
        compare([1.0, float("nan")], [0.0, 0.0])


# ---------------------------------------------------------------------------------------------------------------
# clustered (block) bootstrap: the independent unit is resampled, not the correlated values inside it
# ---------------------------------------------------------------------------------------------------------------


def _correlated(n_clusters=8, per_cluster=16, seed=0):
    """Values with strong within-cluster correlation: a large cluster effect plus small per-value noise."""
    rng = np.random.default_rng(seed)
    effects = rng.normal(0.0, 1.0, n_clusters)
    values = np.repeat(effects, per_cluster) + rng.normal(0.0, 0.05, n_clusters * per_cluster)
    clusters = np.repeat(np.arange(n_clusters), per_cluster)
    return values, clusters


def test_clustered_ci_is_wider_than_naive_on_correlated_values():
    from lmlab.core.stats.uncertainty import bootstrap_ci

    values, clusters = _correlated()
    _, lo_naive, hi_naive = bootstrap_ci(values, seed=1)
    _, lo_cl, hi_cl = bootstrap_ci(values, seed=1, clusters=clusters)
    assert (hi_cl - lo_cl) > 2.5 * (hi_naive - lo_naive)  # 16 near-copies per unit: about sqrt(16) = 4x narrower


def test_clustered_ci_equals_naive_with_one_value_per_cluster():
    from lmlab.core.stats.uncertainty import bootstrap_ci, compare, mean_ci

    values = np.random.default_rng(3).normal(size=20)
    ids = [f"prompt{i}" for i in range(20)]
    assert bootstrap_ci(values, seed=5) == bootstrap_ci(values, seed=5, clusters=ids)
    assert mean_ci(values, seed=5) == mean_ci(values, seed=5, clusters=ids)
    other = values + np.random.default_rng(4).normal(0.3, 0.2, size=20)
    assert compare(other, values, seed=2) == compare(other, values, seed=2, clusters=ids)


def test_clustered_n_counts_clusters_and_decides_on_them():
    from lmlab.core.stats.uncertainty import compare, mean_ci

    values, clusters = _correlated(n_clusters=4, per_cluster=32)
    assert mean_ci(values, clusters=clusters).n == 4
    # A consistent tiny shift on 4 prompts x 32 steps: 128 naive pairs would "support" it, 4 prompts cannot
    # (fewer than min_n=6 independent units).
    a = values + 0.01
    naive = compare(a, values, seed=0)
    clustered = compare(a, values, seed=0, clusters=clusters)
    assert naive.n == 128 and naive.status == "supported"
    assert clustered.n == 4 and clustered.status == "inconclusive"


def test_clustered_permutation_flips_whole_clusters():
    from lmlab.core.stats.uncertainty import permutation_test_paired

    d, clusters = _correlated(n_clusters=5, per_cluster=10, seed=7)
    d = np.abs(d) + 0.1  # every difference positive
    # naive: 50 positive differences give p ~ 1e-4; by cluster only 5 signs, exact p = 2**-5
    assert permutation_test_paired(d, np.zeros_like(d), alternative="greater") < 1e-3
    assert permutation_test_paired(d, np.zeros_like(d), alternative="greater", clusters=clusters) == 2**-5


def test_clustered_unpaired_compare_counts_clusters():
    from lmlab.core.stats.uncertainty import compare

    a, ca = _correlated(n_clusters=6, per_cluster=8, seed=1)
    b, cb = _correlated(n_clusters=7, per_cluster=8, seed=2)
    cmp = compare(a + 5.0, b, paired=False, clusters=ca, clusters_b=cb, seed=0)
    assert cmp.n == 13 and cmp.status == "supported"
    naive = compare(a, b, paired=False, seed=0)
    clustered = compare(a, b, paired=False, clusters=ca, clusters_b=cb, seed=0)
    assert (clustered.ci_high - clustered.ci_low) > 2 * (naive.ci_high - naive.ci_low)


def test_clusters_must_match_values():
    from lmlab.core.stats.uncertainty import bootstrap_ci, mean_ci

    with pytest.raises(ValueError, match="one cluster id per value"):
        bootstrap_ci([1.0, 2.0, 3.0], clusters=[0, 1])
    with pytest.raises(ValueError, match="mean only"):
        bootstrap_ci([1.0, 2.0, 3.0], clusters=[0, 0, 1], stat=np.median)
    with pytest.raises(ValueError, match="method='bootstrap'"):
        mean_ci([1.0, 2.0], method="t", clusters=[0, 1])


def test_non_inferiority_between_two_identical_constants_is_inconclusive():
    from lmlab.core.stats.uncertainty import compare

    zeros = np.zeros(40)
    cmp = compare(zeros, zeros, direction=">", min_effect=-0.02)
    assert cmp.status == "inconclusive" and "does not discriminate" in cmp.reason
    # a real non-inferiority result still passes
    a = np.r_[np.ones(20), np.zeros(20)]
    assert compare(a, a, direction=">", min_effect=-0.02).status == "supported"


# ----------------------------------------------------------------------------------------------------------------
# bootstrap of an arbitrary statistic of rows
# ----------------------------------------------------------------------------------------------------------------


def test_paired_bootstrap_stat_with_the_mean_is_the_paired_bootstrap():
    from lmlab.core.stats.uncertainty import paired_bootstrap_stat

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=30), rng.normal(0.2, 1.0, size=30)
    got = paired_bootstrap_stat(a, b, np.mean, seed=4, n_resamples=500)
    assert got == pytest.approx(paired_bootstrap_diff(a, b, seed=4, n_resamples=500), abs=1e-12)
    values, clusters = _correlated()
    got = paired_bootstrap_stat(values, None, np.mean, seed=2, clusters=clusters)
    assert got == pytest.approx(bootstrap_ci(values, seed=2, clusters=clusters), abs=1e-12)
    # one cluster: no spread; a statistic of a system against itself: exactly zero
    assert paired_bootstrap_stat(values, None, np.mean, clusters=[0] * len(values))[1:] == (np.mean(values),) * 2
    assert paired_bootstrap_stat(a, a, np.max, seed=1) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="same length"):
        paired_bootstrap_stat(a, b[:-1], np.mean)
    with pytest.raises(ValueError, match="non-finite"):
        paired_bootstrap_stat(np.r_[a[:-1], np.nan], None, np.mean)


def _near_tied_worst_objectives(n: int = 40):
    """Per-example rewards (n, 2) of systems A and B. B's worst objective is 0; A = B shifted by +0.05 on objective 0,
    and A's objective 1 is independent noise whose mean sits just above A's objective 0: the two near-tie for A's
    worst objective."""
    rng = np.random.default_rng(7)
    b = np.stack([rng.normal(0.0, 1.0, n), rng.normal(2.0, 1.0, n)], -1)
    a = b.copy()
    a[:, 0] += 0.05
    noise = rng.normal(0.0, 1.0, n)
    a[:, 1] = noise - noise.mean() + a[:, 0].mean() + 0.01
    return a, b


def test_worst_objective_ci_retakes_the_min_in_each_resample():
    """W = min_k mean_x v[x, k]: the old CI bootstrapped the column fixed at the full-sample argmin, here objective 0
    for both systems, whose paired difference is the constant 0.05 (CI [0.05, 0.05]). Recomputing the min in each
    resample lets A's near-tied objective 1 be its worst in about half the resamples: the CI widens and includes
    W(A) - W(B) values the fixed column excludes."""
    from lmlab.core.stats.uncertainty import compare_statistic, paired_bootstrap_stat

    def worst(v):
        return float(v.mean(0).min())

    a, b = _near_tied_worst_objectives()
    assert np.argmin(a.mean(0)) == np.argmin(b.mean(0)) == 0
    point, lo_fixed, hi_fixed = paired_bootstrap_diff(a[:, 0], b[:, 0], seed=3)
    assert point == pytest.approx(0.05) and hi_fixed - lo_fixed < 1e-12  # zero width: the argmin is taken as known
    w, lo, hi = paired_bootstrap_stat(a, b, worst, seed=3)
    assert w == pytest.approx(point)
    assert lo < lo_fixed - 0.1 and hi >= hi_fixed - 1e-12  # the fixed-column CI excludes [lo, 0.05)
    # the claim "W(A) > W(B)" holds on the fixed column but is inconclusive once the argmin is re-decided
    assert compare(a[:, 0], b[:, 0], seed=3).status == "supported"
    cmp = compare_statistic(a, b, worst, seed=3)
    assert cmp.status == "inconclusive" and cmp.effect == pytest.approx(0.05) and cmp.n == len(a)
    assert cmp.mean_a == pytest.approx(worst(a)) and cmp.mean_b == pytest.approx(worst(b))
    # the decision rule is compare's: a clear shift is supported, the system against itself is not
    assert compare_statistic(a + 1.0, b, worst, seed=3).status == "supported"
    assert compare_statistic(b, b, worst, seed=3, min_n=1).status == "not_supported"
