"""RLTHF invariants: Kneedle finds known kinks, the reward distribution splits at its elbow and knee, amplification
equals duplication, cross-fitted margins never see their own label, the loop spends exactly the annotator's budget,
human labels replace AI labels, back-off drops only un-annotated tail pairs, and below-knee queries find more
mislabels than random ones, back-off climbs from the below-knee tail up to the elbow, the back-off is chosen on dev
pairs disjoint from the test pairs and recorded; bad input is refused with one line naming the value."""

from __future__ import annotations

import numpy as np
import pytest

from lmlab.core.training.annotator import BudgetExceeded, GroundTruthAnnotator
from lmlab.methods.alignment.rlthf.config import RLTHFConfig
from lmlab.methods.alignment.rlthf.method import (
    backoff_drop,
    bt_margins,
    crossfit_margins,
    curate,
    fit_bt,
    group_folds,
    kneedle,
    reward_regions,
    rolling_mean,
)


def _data(n=600, d=8, flip=0.2, seed=0):
    """Linear truth on Gaussian pair features; AI labels = truth with uniform flips."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    w = rng.normal(size=d)
    truth = (x @ w > 0).astype(int)
    ai = np.where(rng.random(n) < flip, 1 - truth, truth)
    groups = [f"g{i // 3}" for i in range(n)]  # 3 pairs per "prompt"
    return x, truth, ai, groups


def _annotator(truth, budget):
    pairs = {i: (float(t), 1.0 - float(t)) for i, t in enumerate(truth)}  # U(a) - U(b) > 0 iff truth = 1
    return GroundTruthAnnotator(pairs, budget=budget, utility=lambda v: v)


@pytest.mark.parametrize(
    "curve,direction,make",
    [
        ("concave", "increasing", lambda t: np.minimum(t, 30) * 3 + np.maximum(t - 30, 0) * 0.2),
        ("convex", "decreasing", lambda t: -(np.minimum(t, 30) * 3 + np.maximum(t - 30, 0) * 0.2)),
        ("concave", "decreasing", lambda t: -(np.minimum(t, 70) * 0.2 + np.maximum(t - 70, 0) * 3)),
        ("convex", "increasing", lambda t: np.minimum(t, 70) * 0.2 + np.maximum(t - 70, 0) * 3),
    ],
)
def test_kneedle_finds_the_kink_of_a_two_slope_curve(curve, direction, make):
    t = np.arange(101, dtype=float)
    want = 30 if (curve, direction) in (("concave", "increasing"), ("convex", "decreasing")) else 70
    assert kneedle(make(t), curve=curve, direction=direction) == want


def test_reward_regions_split_a_reverse_s_curve_at_its_elbow_and_knee():
    # sorted margins: a steep head (100 pairs), a flat middle, a steep tail (the last 100): elbow 100, knee 900
    head = np.linspace(10, 2, 100, endpoint=False)
    mid = np.linspace(2, -1, 800, endpoint=False)
    tail = np.linspace(-1, -12, 100)
    s = np.random.default_rng(0).permutation(np.concatenate([head, mid, tail]))
    reg = reward_regions(s, smooth=0.0)
    assert abs(reg.elbow - 100) <= 1 and abs(reg.knee - 900) <= 1 and not reg.fallback
    assert np.all(np.diff(s[reg.order]) <= 0)  # order sorts descending
    assert reg.rank_of()[reg.order[5]] == 5
    flat = reward_regions(np.ones(50))
    assert flat.fallback and flat.elbow < flat.knee  # degenerate curve: quantile fallback


def _reverse_s(seed=0):
    """Sorted margins with a steep head (100 pairs), a flat middle and a steep tail (the last 100), permuted."""
    head = np.linspace(10, 2, 100, endpoint=False)
    mid = np.linspace(2, -1, 800, endpoint=False)
    tail = np.linspace(-1, -12, 100)
    return np.random.default_rng(seed).permutation(np.concatenate([head, mid, tail]))


def test_backoff_climbs_from_the_tail_to_the_elbow_and_never_drops_human_labels():
    reg = reward_regions(_reverse_s(), smooth=0.0)
    n, rank = len(reg.order), reg.rank_of()
    assert abs(reg.elbow - 100) <= 1 and abs(reg.knee - 900) <= 1
    human = np.zeros(n, dtype=bool)
    human[np.random.default_rng(1).choice(n, size=60, replace=False)] = True  # spread over head, middle and tail
    free = ~human
    tail = set(np.flatnonzero(free & (rank >= reg.knee)))
    band = set(np.flatnonzero(free & (rank >= reg.elbow) & (rank < reg.knee)))
    drops = {b: backoff_drop(reg, human, b) for b in (0.0, 0.5, 1.0, 1.5, 2.0)}
    assert len(drops[0.0]) == 0
    assert set(drops[1.0]) == tail  # b = 1: the whole un-annotated below-knee tail (the old default)
    assert set(drops[2.0]) == tail | band  # b = 2: everything un-annotated below the elbow ...
    kept_ai = np.setdiff1d(np.flatnonzero(free), drops[2.0])
    assert set(kept_ai) == set(np.flatnonzero(free & (rank < reg.elbow)))  # ... the confident region stays
    for lo, hi in [(0.0, 0.5), (0.5, 1.0), (1.0, 1.5), (1.5, 2.0)]:
        assert set(drops[lo]) < set(drops[hi])  # the dropped set only grows with b
    for d in drops.values():
        assert not human[d].any() and len(set(d)) == len(d)  # never a human label, never twice
        if len(d):
            assert np.all(np.diff(rank[d]) < 0)  # lowest margin first
    half_band = set(drops[1.5]) - tail
    assert len(half_band) == round(0.5 * len(band))
    assert min(rank[list(half_band)]) > max(rank[list(band - half_band)])  # the lower half of the band goes first
    # the elbow sets how far back-off climbs: a higher elbow leaves more of the head untouched at b = 2
    import dataclasses

    lower = dataclasses.replace(reg, elbow=300)
    assert set(backoff_drop(lower, human, 2.0)) == set(np.flatnonzero(free & (rank >= 300)))
    assert set(backoff_drop(lower, human, 1.0)) == tail  # at b <= 1 only the knee matters
    with pytest.raises(ValueError, match=r"backoff must be in \[0, 2\]"):
        backoff_drop(reg, human, 2.5)


def test_curate_with_backoff_past_one_drops_up_to_the_elbow():
    x, truth, ai, groups = _data(n=600)
    out = {}
    for b in (1.0, 2.0):
        ann = _annotator(truth, budget=30)
        out[b] = curate(x, ai, lambda idx, it, a=ann: a.label(idx, iteration=it), iterations=2, per_iteration=15,
                        backoff=b, groups=groups, l2=0.01, seed=0)  # fmt: skip
    h1, h2 = out[1.0].history[0], out[2.0].history[0]
    assert h1.queried == h2.queried and (h1.elbow, h1.knee) == (h2.elbow, h2.knee)  # round 1 sees only AI labels
    assert h1.elbow < h1.knee and all(h.n_dropped > 0 for h in out[1.0].history)
    # round 1 queries below the knee, so back-off 1 drops the rest of the tail, back-off 2 everything below the elbow
    assert h1.n_dropped == 600 - h1.knee - 15
    assert h2.n_dropped == 600 - h2.elbow - 15
    assert not out[2.0].human[out[2.0].weights == 0].any()


def test_choose_backoff_takes_the_best_dev_score_and_grows_a_grid_whose_best_is_its_edge():
    from lmlab.methods.alignment.rlthf.experiment import choose_backoff

    grid = [0.0, 0.25, 0.5, 0.75, 1.0]
    best, scores = choose_backoff(grid, lambda b: [0.8 - (b - 0.5) ** 2, 0.7 - (b - 0.5) ** 2])
    assert best == 0.5 and sorted(scores) == grid  # an interior best: no growth
    best, scores = choose_backoff(grid, lambda b: [0.7 + 0.01 * b])  # better the more is dropped
    assert best == 2.0 and sorted(scores) == [*grid, 1.25, 1.5, 1.75, 2.0]  # grown to the natural bound
    best, scores = choose_backoff(grid, lambda b: [0.9 - abs(b - 1.25)])
    assert best == 1.25 and max(scores) == 1.5  # grown one step past the best, then stopped
    best, _ = choose_backoff(grid, lambda b: [0.75])
    assert best == 0.0  # a tie goes to the value that drops least
    best, scores = choose_backoff(grid, lambda b: [0.8 - b])
    assert best == 0.0 and sorted(scores) == grid  # the lower edge 0 is a natural bound: no growth


def test_backoff_is_chosen_on_dev_pairs_disjoint_from_the_test_pairs_and_recorded(tmp_path, monkeypatch):
    from lmlab.core.training.annotator import GroundTruthAnnotator
    from lmlab.runner import run_method

    held: list[str] = []
    real_held_out = GroundTruthAnnotator.held_out

    def spy(self, pair_ids, **kw):
        ids = list(pair_ids)
        held.extend(ids)
        return real_held_out(self, ids, **kw)

    monkeypatch.setattr(GroundTruthAnnotator, "held_out", spy)
    result = run_method("rlthf", preset="smoke", folder=tmp_path / "run", show_progress=False, raise_errors=True,
                        threads=1)  # fmt: skip
    prompt_of = lambda pid: pid.split(":")[1]  # noqa: E731  pair id = "<draw>:<prompt id>:<i>-<j>"
    dev = {prompt_of(p) for p in held if p.startswith("dev")}
    test = {prompt_of(p) for p in held if p.startswith("test")}
    assert dev and test and not dev & test  # the choice never sees a test prompt
    rows = result.tables["backoff_dev"]
    chosen = {}
    for noise in ("systematic", "flip"):
        for s in ("rlthf", "self"):
            mine = [r for r in rows if r["noise"] == noise and r["system"] == s]
            assert {0.0, 0.5, 1.0} <= {r["backoff"] for r in mine}  # every value of the smoke grid scored on dev
            best = max(r["dev_acc"] for r in mine)
            want = min(r["backoff"] for r in mine if r["dev_acc"] == best)
            assert [r["backoff"] for r in mine if r["chosen"]] == [want]
            chosen[f"{s}@{noise}"] = want
    recorded = {m.system: m.value for m in result.metrics if m.metric == "backoff"}
    assert recorded == chosen and result.flags["backoff_chosen"] == chosen
    # the replicates ran with the chosen value: back-off 0 drops nothing, any other value drops some tail pair
    for noise in ("systematic", "flip"):
        dropped = [r["dropped"] for r in result.tables["rounds"] if r["noise"] == noise and r["system"] == "rlthf"]
        assert (sum(dropped) == 0) == (chosen[f"rlthf@{noise}"] == 0.0)


def test_rolling_mean_keeps_a_sorted_curve_sorted_and_its_length():
    v = np.sort(np.random.default_rng(1).normal(size=200))[::-1]
    m = rolling_mean(v, 9)
    assert m.shape == v.shape and np.all(np.diff(m) <= 1e-12)


def test_amplification_weight_equals_duplication_and_zero_weight_removes():
    x, truth, ai, _ = _data(n=200)
    w_amp = fit_bt(x, ai, np.where(np.arange(200) < 20, 3.0, 1.0), l2=0.01)
    dup_x = np.concatenate([x, x[:20], x[:20]])
    dup_y = np.concatenate([ai, ai[:20], ai[:20]])
    np.testing.assert_allclose(w_amp, fit_bt(dup_x, dup_y, l2=0.01), atol=1e-5)
    w0 = fit_bt(x, ai, np.where(np.arange(200) < 50, 0.0, 1.0), l2=0.01)
    np.testing.assert_allclose(w0, fit_bt(x[50:], ai[50:], l2=0.01), atol=1e-6)


def test_bt_fit_recovers_the_truth_direction_on_clean_labels():
    x, truth, _, _ = _data(n=800)
    w = fit_bt(x, truth, l2=1e-3)
    assert ((bt_margins(x, w) > 0).astype(int) == truth).mean() > 0.95


def test_crossfit_margin_of_a_pair_does_not_see_its_own_label():
    x, _, ai, groups = _data(n=300)
    folds = group_folds(groups, 5, seed=0)
    assert all(len({f for f, g in zip(folds, groups) if g == gg}) == 1 for gg in set(groups))  # groups stay whole
    m = crossfit_margins(x, ai, folds=folds, l2=0.01)
    flipped = ai.copy()
    flipped[7] = 1 - flipped[7]
    m2 = crossfit_margins(x, flipped, folds=folds, l2=0.01)
    assert m2[7] == pytest.approx(m[7], abs=1e-9)  # its own label never enters its own score
    assert not np.allclose(m2[folds != folds[7]], m[folds != folds[7]])  # ... but it trains the other folds


@pytest.mark.parametrize("strategy", ["rlthf", "random", "uncertainty"])
def test_the_loop_spends_exactly_the_budget_and_human_labels_replace_ai_labels(strategy):
    x, truth, ai, groups = _data()
    ann = _annotator(truth, budget=4 * 15)
    cur = curate(
        x,
        ai,
        lambda idx, it: ann.label(idx, iteration=it),
        strategy=strategy,
        iterations=4,
        per_iteration=15,
        amplification=5.0,
        groups=groups,
        l2=0.01,
        seed=0,
    )
    assert ann.n_queried == 60 and ann.remaining == 0
    queried = [i for h in cur.history for i in h.queried]
    assert len(queried) == len(set(queried)) == 60  # never re-asks
    assert set(np.flatnonzero(cur.human)) == set(queried)
    np.testing.assert_array_equal(cur.labels[queried], truth[queried])  # the human's labels replaced the AI's
    untouched = np.setdiff1d(np.arange(len(ai)), queried)
    np.testing.assert_array_equal(cur.labels[untouched], ai[untouched])
    assert np.all(cur.weights[queried] == 5.0)  # amplified
    assert [h.iteration for h in ann.log[::15]] == [1, 2, 3, 4]
    if strategy == "rlthf":
        dropped = np.flatnonzero(cur.weights == 0)
        assert len(dropped) > 0 and not cur.human[dropped].any()  # back-off drops only un-annotated pairs
    else:
        assert cur.kept.all()
    with pytest.raises(BudgetExceeded):  # a budget one pair short is refused, not silently exceeded
        small = _annotator(truth, budget=59)
        curate(
            x,
            ai,
            lambda idx, it: small.label(idx, iteration=it),
            strategy=strategy,
            iterations=4,
            per_iteration=15,
            groups=groups,
            l2=0.01,
        )


def test_below_knee_queries_find_more_mislabels_than_random_ones():
    x, truth, ai, groups = _data(n=900, seed=3)
    yields = {}
    for s in ("rlthf", "random"):
        ann = _annotator(truth, budget=90)
        cur = curate(
            x,
            ai,
            lambda idx, it, a=ann: a.label(idx, iteration=it),
            strategy=s,
            iterations=3,
            per_iteration=30,
            groups=groups,
            l2=0.01,
            seed=1,
        )
        yields[s] = sum(h.flipped for h in cur.history) / 90
    assert yields["random"] < 0.35 and yields["rlthf"] > 2 * yields["random"], yields


def test_backoff_zero_keeps_everything_and_self_improvement_asks_no_one():
    x, truth, ai, groups = _data()
    ann = _annotator(truth, budget=30)
    cur = curate(
        x,
        ai,
        lambda idx, it: ann.label(idx, iteration=it),
        iterations=2,
        per_iteration=15,
        backoff=0.0,
        groups=groups,
        l2=0.01,
    )
    assert cur.kept.all()
    selfc = curate(x, ai, None, strategy="self", iterations=2, per_iteration=15, groups=groups, l2=0.01)
    # self-improvement asks about the same low-margin tail as RLTHF (its first query depends only on the AI labels)
    # and differs only in who answers: it flips its own label there, and nowhere else
    assert selfc.history[0].queried == cur.history[0].queried
    queried = [i for h in selfc.history for i in h.queried]
    assert len(set(queried)) == len(queried) == 30  # a pair is never asked about twice
    asked = np.zeros(len(ai), dtype=bool)
    asked[queried] = True
    np.testing.assert_array_equal(selfc.labels[asked], 1 - ai[asked])
    np.testing.assert_array_equal(selfc.labels[~asked], ai[~asked])
    again = curate(x, ai, None, strategy="self", iterations=2, per_iteration=15, groups=groups, l2=0.01)
    np.testing.assert_array_equal(again.labels, selfc.labels)  # deterministic per seed


def test_bad_inputs_are_refused_with_one_line_naming_the_value():
    x, truth, ai, groups = _data(n=60)
    ask = lambda idx, it: [0] * len(idx)  # noqa: E731
    cases = [
        (dict(strategy="oracle"), "strategy must be one of"),
        (dict(strategy="rlthf", annotate=None), "annotate must be None exactly"),
        (dict(per_iteration=61), r"per_iteration must be an int in \[1, 60\]"),
        (dict(amplification=0.5), "amplification must be >= 1"),
        (dict(backoff=2.5), r"backoff must be in \[0, 2\]"),
        (dict(query_order="top"), "query_order must be one of"),
        (dict(iterations=0), "iterations must be an int >= 1"),
        (dict(n_folds=100), "n_folds must be in"),
    ]
    for kw, msg in cases:
        annotate = kw.pop("annotate", ask)
        with pytest.raises(ValueError, match=msg) as e:
            curate(x, ai, annotate, groups=groups, **{"per_iteration": 5, **kw})
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="labels must be 0 or 1"):
        fit_bt(x, np.full(60, 2))
    with pytest.raises(ValueError, match=r"labels must have shape \(60,\)"):
        fit_bt(x, ai[:10])
    with pytest.raises(ValueError, match="non-empty"):
        fit_bt(np.zeros((0, 3)), np.zeros(0))
    with pytest.raises(ValueError, match="weights sum to 0"):
        fit_bt(x, ai, np.zeros(60))
    with pytest.raises(ValueError, match="at least 8 pairs"):
        reward_regions(np.ones(3))
    with pytest.raises(ValueError, match="curve must be"):
        kneedle(np.arange(5.0), curve="wiggly", direction="decreasing")


def test_config_refuses_out_of_range_knobs():
    for kw, msg in [
        (dict(human_fraction=0.0), "human_fraction must be in"),
        (dict(amplification=0.5), "amplification must be in"),
        (dict(noise_models=["gaussian"]), "noise_models must be"),
        (dict(strategies=["random"]), "strategies must include 'rlthf'"),
        (dict(flip_prob=0.7), "flip_prob must be in"),
        (dict(embedder="bert"), "embedder must be one of"),
        (dict(backoff=2.5), r"backoff must be in \[0.0, 2.0\]"),
        (dict(backoff_grid=[]), "backoff_grid must be a non-empty list"),
        (dict(backoff_grid=[0.5, 3.0]), "backoff_grid values must be in"),
        (dict(dev_replicates=0), "dev_replicates must be in"),
    ]:
        with pytest.raises(ValueError, match=msg):
            RLTHFConfig(**kw)


def test_a_fully_annotated_tail_leaves_nothing_to_drop():
    x, truth, ai, groups = _data(n=40)
    ann = _annotator(truth, budget=40)
    cur = curate(x, ai, lambda idx, it: ann.label(idx, iteration=it), iterations=2, per_iteration=20, groups=groups,
                 n_folds=4, l2=0.01)  # fmt: skip
    assert cur.human.all() and cur.kept.all() and cur.history[-1].n_dropped == 0


def test_a_causal_lm_as_the_sentence_encoder_is_refused(tmp_path):
    from lmlab.runner import run_method

    with pytest.raises(ValueError, match="model must be a BERT-style sentence encoder") as e:
        run_method("rlthf", preset="smoke", model="tiny-llama", embedder="model", folder=tmp_path / "run",
                   show_progress=False, raise_errors=True, threads=1)  # fmt: skip
    assert "\n" not in str(e.value)
