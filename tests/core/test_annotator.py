"""The simulated annotator: budget refusal, unique counting, calibrated human noise, held-out labels, and an AI
judge whose errors are systematic (length bias, blind spot, hard pairs), not uniform."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmlab.core.training.annotator import (
    BudgetExceeded,
    FlipJudge,
    GroundTruthAnnotator,
    SimulatedJudge,
    bt_flip_prob,
)


def _pairs(n: int, seed: int = 0):
    """Items are dicts with a quality and a length; U = quality."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(n):
        a = {"q": float(rng.normal()), "len": int(rng.integers(5, 60))}
        b = {"q": float(rng.normal()), "len": int(rng.integers(5, 60))}
        out[f"p{i}"] = (a, b)
    return out


def U(x):
    return x["q"]


def test_budget_refusal_is_atomic_and_names_the_budget():
    ann = GroundTruthAnnotator(_pairs(10), budget=3, utility=U)
    ann.label(["p0", "p1"])
    with pytest.raises(BudgetExceeded, match=r"budget of 3 unique queries exceeded: 2 used, this call asks 2 new"):
        ann.label(["p2", "p3"])
    assert ann.n_queried == 2 and ann.queried_ids == ["p0", "p1"]  # the refused call labelled nothing
    ann.label(["p0", "p2"])  # one new: reaches the budget exactly
    assert ann.remaining == 0
    with pytest.raises(BudgetExceeded):
        ann.label(["p9"])
    assert ann.label(["p1", "p2", "p0"]) == ann.label(["p1", "p2", "p0"])  # re-asks stay free at zero budget


def test_unique_counting_and_the_log():
    ann = GroundTruthAnnotator(_pairs(10), budget=10, utility=U)
    first = ann.label(["p0", "p0", "p1"], iteration=0)
    assert ann.n_queried == 2 and first[0] == first[1]
    again = ann.label(["p1", "p2"], iteration=1)
    assert ann.n_queried == 3 and again[0] == first[2]
    assert [(r.pair_id, r.iteration, r.charged) for r in ann.log] == [
        ("p0", 0, True),
        ("p0", 0, False),  # asked twice in one call: charged once
        ("p1", 0, True),
        ("p1", 1, False),  # a re-ask is free but logged with its iteration
        ("p2", 1, True),
    ]
    assert ann.fraction_queried() == pytest.approx(3 / 10)
    assert ann.fraction_queried(100) == pytest.approx(0.03)


def test_clean_oracle_labels_follow_the_utility():
    pairs = _pairs(200)
    ann = GroundTruthAnnotator(pairs, budget=200, utility=U)
    labels = ann.label(list(pairs))
    assert labels == [int(U(a) > U(b)) for a, b in pairs.values()]


def test_bradley_terry_noise_matches_the_sigmoid():
    n = 4000
    for du, temp in [(0.0, 1.0), (1.0, 1.0), (0.5, 0.25), (-2.0, 1.0)]:
        pairs = {i: ({"q": du}, {"q": 0.0}) for i in range(n)}
        ann = GroundTruthAnnotator(pairs, budget=n, utility=U, noise_temperature=temp, seed=3)
        rate = float(np.mean(ann.label(list(range(n)))))
        p = 1 / (1 + math.exp(-du / temp))
        assert abs(rate - p) < 4 * math.sqrt(p * (1 - p) / n), (du, temp, rate, p)
    assert bt_flip_prob(1.0, 1.0) == pytest.approx(1 / (1 + math.e))


def test_noise_is_fixed_per_pair_not_per_query_order():
    pairs = {i: ({"q": 0.3}, {"q": 0.0}) for i in range(300)}
    a = GroundTruthAnnotator(pairs, budget=300, utility=U, noise_temperature=1.0, seed=7)
    b = GroundTruthAnnotator(pairs, budget=300, utility=U, noise_temperature=1.0, seed=7)
    ids = list(range(300))
    la = a.label(ids)
    lb = b.label(ids[::-1])[::-1]
    assert la == lb  # same seed, any order: the same human answers
    assert a.label(ids) == la  # a re-ask does not redraw
    c = GroundTruthAnnotator(pairs, budget=300, utility=U, noise_temperature=1.0, seed=8)
    assert c.label(ids) != la


def test_held_out_labels_are_uncounted_and_closed_to_training():
    pairs = _pairs(20)
    ann = GroundTruthAnnotator(pairs, budget=5, utility=U, noise_temperature=0.5)
    test_ids = [f"p{i}" for i in range(10, 20)]
    test = ann.held_out(test_ids)
    assert ann.n_queried == 0 and ann.log == []
    assert test.labels() == [int(U(pairs[p][0]) > U(pairs[p][1])) for p in test_ids]  # clean truth by default
    with pytest.raises(ValueError, match="p12.*held out for evaluation"):
        ann.label(["p0", "p12"])
    assert ann.n_queried == 0  # the refused call charged nothing
    ann.label(["p0"])
    with pytest.raises(ValueError, match="p0.*already labelled for training"):
        ann.held_out(["p0"])
    assert ann.fraction_queried() == pytest.approx(1 / 10)  # the pool excludes held-out pairs
    assert test.accuracy(test.labels()) == 1.0


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="exactly one of utility"):
        GroundTruthAnnotator(_pairs(2), budget=1)
    with pytest.raises(ValueError, match="budget must be an int >= 0"):
        GroundTruthAnnotator(_pairs(2), budget=-1, utility=U)
    ann = GroundTruthAnnotator(_pairs(2), budget=1, utility=U)
    with pytest.raises(ValueError, match="unknown pair id 'zz'"):
        ann.label(["zz"])
    with pytest.raises(ValueError, match="sequence of ids"):
        ann.label("p0")


def _judge_errors(judge: SimulatedJudge, pairs) -> np.ndarray:
    labels = np.array(judge.label(list(pairs)))
    truth = np.array([int(U(a) > U(b)) for a, b in pairs.values()])
    return labels != truth


def test_judge_length_bias_is_systematic():
    pairs = _pairs(3000, seed=1)
    judge = SimulatedJudge(pairs, utility=U, length=lambda x: x["len"], length_bias=0.05, temperature=0.3)
    err = _judge_errors(judge, pairs)
    # length of the truly worse response minus the better one's
    dlen = np.array([(b["len"] - a["len"]) if U(a) > U(b) else (a["len"] - b["len"]) for a, b in pairs.values()])
    r = np.corrcoef(err.astype(float), dlen)[0, 1]
    assert r > 0.3, r  # errors go to pairs whose worse response is longer
    assert err[dlen > 20].mean() > 3 * err[dlen < -20].mean()
    # a uniform-noise labeller with the same error rate shows no such correlation
    rng = np.random.default_rng(0)
    flips = rng.random(len(err)) < err.mean()
    assert abs(np.corrcoef(flips.astype(float), dlen)[0, 1]) < 0.08


def test_judge_errors_rise_as_the_margin_shrinks_and_it_misses_its_blind_spot():
    pairs = _pairs(3000, seed=2)
    judge = SimulatedJudge(pairs, utility=U, temperature=0.3)
    err = _judge_errors(judge, pairs)
    gap = np.array([abs(U(a) - U(b)) for a, b in pairs.values()])
    rates = [err[(gap >= lo) & (gap < hi)].mean() for lo, hi in [(0, 0.1), (0.1, 0.3), (0.3, 0.8), (0.8, 9)]]
    assert all(x > y for x, y in zip(rates, rates[1:], strict=False)), rates
    assert rates[0] > 0.3 and rates[-1] < 0.02

    # blind spot: U = style + correctness; the judge sees only style
    blind_pairs = {
        i: ({"q": s + c, "c": c}, {"q": s2 + c2, "c": c2})
        for i, (s, c, s2, c2) in enumerate(np.random.default_rng(3).normal(size=(2000, 4)) * [0.3, 1, 0.3, 1])
    }
    blind = SimulatedJudge(blind_pairs, utility=U, blind_spot=lambda x: x["c"], temperature=0.05)
    clear = SimulatedJudge(blind_pairs, utility=U, temperature=0.05)
    assert _judge_errors(blind, blind_pairs).mean() > 0.25 > 0.05 > _judge_errors(clear, blind_pairs).mean()


def test_agreement_reports_judge_accuracy_without_charging():
    pairs = _pairs(500)
    ann = GroundTruthAnnotator(pairs, budget=0, utility=U)
    judge = SimulatedJudge(pairs, utility=U, temperature=0.3)
    acc = ann.agreement(list(pairs), judge.label(list(pairs)))
    assert acc == pytest.approx(1 - _judge_errors(judge, pairs).mean())
    assert ann.n_queried == 0


def test_flip_judge_noise_is_uniform_and_fixed_per_pair():
    pairs = _pairs(4000, seed=4)
    judge = FlipJudge(pairs, utility=U, flip_prob=0.2, seed=1)
    err = _judge_errors(judge, pairs)
    assert abs(err.mean() - 0.2) < 0.02
    gap = np.array([abs(U(a) - U(b)) for a, b in pairs.values()])
    assert abs(np.corrcoef(err.astype(float), gap)[0, 1]) < 0.05  # errors do not track the margin
    ids = list(pairs)
    assert judge.label(ids[::-1])[::-1] == judge.label(ids)  # one fixed draw per pair, whatever the order
    assert FlipJudge(pairs, utility=U, flip_prob=0.0).label(ids) == [int(U(a) > U(b)) for a, b in pairs.values()]
    with pytest.raises(ValueError, match="flip_prob must be in"):
        FlipJudge(pairs, utility=U, flip_prob=1.5)
