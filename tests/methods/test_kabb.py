"""KABB invariants: Thompson sampling concentrates on a dominant arm, the knowledge distance and difficulty closed
forms, the Beta update and the step decay, the distance steering selection, the vote, and bad-input errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmlab.methods.selection.kabb.config import KABBConfig
from lmlab.methods.selection.kabb.method import (
    KABB,
    UCB1,
    Domain,
    EpsilonGreedy,
    Expert,
    RandomK,
    ThompsonSampling,
    best_fixed_subset,
    knowledge_distance,
    run_stream,
    task_difficulty,
    weighted_vote,
)


def _bernoulli_play(bandit, p, rounds, seed=0):
    rng = np.random.default_rng(seed)
    picks = []
    for _ in range(rounds):
        chosen, _ = bandit.select()
        bandit.update(chosen, (rng.random(len(chosen)) < p[chosen]).astype(float))
        bandit.step()
        picks.append(chosen.tolist())
    return picks


@pytest.mark.parametrize("bandit_cls", [ThompsonSampling, UCB1, EpsilonGreedy])
def test_bandit_concentrates_on_a_dominant_arm(bandit_cls):
    p = np.array([0.2, 0.9, 0.25, 0.2, 0.3])
    picks = _bernoulli_play(bandit_cls(5, top_k=1, seed=0), p, 600)
    late = [c[0] for c in picks[-200:]]
    assert np.mean(np.array(late) == 1) > 0.9


def test_kabb_with_decay_concentrates_and_random_does_not():
    p = np.array([0.2, 0.9, 0.25, 0.2])
    kabb = KABB([Expert(str(i)) for i in range(4)], top_k=1, gamma=0.99, seed=1)
    late = [c[0] for c in _bernoulli_play(kabb, p, 600)[-200:]]
    assert np.mean(np.array(late) == 1) > 0.8
    rnd = [c[0] for c in _bernoulli_play(RandomK(4, 1, seed=1), p, 600)[-200:]]
    assert np.mean(np.array(rnd) == 1) < 0.4


def test_knowledge_distance_closed_form():
    dom = Domain("arith", frozenset({"add", "mul"}))
    e = Expert("pot", frozenset({"add"}), dependencies=("x", "y"))
    d = knowledge_distance(e, dom, alpha=3.0, beta=1.0, n_experts=4, difficulty=2.0)
    assert d == pytest.approx((0.4 * 0.5 + 0.3 * 0.5 + 0.3 * 0.25) * math.log(3.0))
    assert knowledge_distance(Expert("a"), Domain("empty"), 1.0, 1.0, 2, 1.0) == pytest.approx(
        (0.4 * 0.5 + 0.3 * 0.5) * math.log(2.0)
    )  # no concepts: overlap 0.5
    assert knowledge_distance(e, dom, 3.0, 1.0, 4, 2.0, use_hist=False) == pytest.approx(0.35 * math.log(3.0))
    assert task_difficulty(50) == pytest.approx(1.4)  # clip(0.5, 1, 10) / 10 * 4 + 1
    assert task_difficulty(2000) == pytest.approx(5.0)
    assert task_difficulty(500, (2, 4)) == pytest.approx(3.0)


def test_update_and_step_decay():
    k = KABB([Expert("a"), Expert("b", alpha=2.0, beta=3.0)], top_k=1, gamma=0.5)
    k.update([1], [0.25])
    assert k.alpha.tolist() == [1.0, 2.25] and k.beta.tolist() == [1.0, 3.75]
    k.update([0], [7.0])  # clamped to 1
    assert k.alpha[0] == 2.0 and k.beta[0] == 1.0
    k.step()
    assert k.alpha.tolist() == [1.0, 1.125] and k.beta.tolist() == [0.5, 1.875]
    ts = ThompsonSampling(2, 1)
    ts.step()
    assert ts.alpha.tolist() == [1.0, 1.0]  # vanilla TS never decays


def test_zero_distance_weights_equal_thompson_sampling():
    experts = [Expert(str(i), frozenset({"t"} if i == 0 else set())) for i in range(4)]
    a = KABB(experts, top_k=2, gamma=1.0, weights=(0.0, 0.0, 0.0), seed=5)
    b = ThompsonSampling(4, 2, seed=5)
    dom = Domain("t", frozenset({"t"}))
    for _ in range(50):
        ca, _ = a.select(dom, 2.0)
        cb, _ = b.select(dom, 2.0)
        assert ca.tolist() == cb.tolist()
        a.update(ca, [1.0, 0.0])
        b.update(cb, [1.0, 0.0])


def test_the_distance_steers_towards_matching_capabilities():
    experts = [Expert("match", frozenset({"geo"})), Expert("other", frozenset({"arith"}))]
    k = KABB(experts, top_k=1, gamma=1.0, seed=0)
    dom = Domain("geo", frozenset({"geo"}))
    picks = [k.select(dom, 5.0)[0][0] for _ in range(400)]  # identical posteriors, no updates
    assert np.mean(np.array(picks) == 0) > 0.6
    k.update_capabilities(1, add=["geo"], remove=["arith"])
    assert k.experts[1].capabilities == frozenset({"geo"})


def test_weighted_vote_and_best_fixed_subset():
    codes = np.array([0, 1, 1])
    correct = np.array([1.0, 0.0, 0.0])
    assert weighted_vote(codes, correct, np.array([0.9, 0.5, 0.5])) == 0.0  # two agreeing outvote one
    assert weighted_vote(codes, correct, np.array([1.2, 0.5, 0.5])) == 1.0
    rng = np.random.default_rng(0)
    corr = (rng.random((30, 4)) < [0.2, 0.8, 0.5, 0.6]).astype(float)
    cod = np.where(corr > 0, 0, 1 + np.arange(4)[None])  # correct answers agree, wrong ones differ
    queries = rng.integers(0, 30, size=100)
    best, team = best_fixed_subset(queries, corr, cod, 2)
    import itertools

    for sub in itertools.combinations(range(4), 2):
        idx = np.array(sub)
        w = corr[queries].mean(axis=0)[idx] + 1e-9 * idx
        other = np.mean([weighted_vote(cod[q, idx], corr[q, idx], w) for q in queries])
        assert team.mean() >= other - 1e-12


def test_run_stream_rewards_each_expert_with_its_correctness():
    corr = np.array([[1.0, 0.0, 1.0]] * 5)
    codes = np.array([[0, 1, 0]] * 5)
    cost = np.ones((5, 3))
    ts = ThompsonSampling(3, 3, seed=0)
    res = run_stream(ts, np.arange(5), corr, codes, cost, [Domain("t")], np.zeros(5, int), np.ones(5))
    assert ts.alpha.tolist() == [6.0, 1.0, 6.0] and ts.beta.tolist() == [1.0, 6.0, 1.0]
    assert res.team.tolist() == [1.0] * 5 and res.calls.tolist() == [3.0] * 5


def test_bad_inputs():
    with pytest.raises(ValueError, match="top_k must be in"):
        ThompsonSampling(3, 4)
    with pytest.raises(ValueError, match="gamma must be in"):
        KABB([Expert("a")], 1, gamma=0.0)
    with pytest.raises(ValueError, match="alpha and beta must be > 0"):
        Expert("a", alpha=0.0)
    with pytest.raises(ValueError, match="one reward per chosen expert"):
        ThompsonSampling(3, 2).update([0, 1], [1.0])
    with pytest.raises(ValueError, match="difficulty_range"):
        task_difficulty(10, (5, 1))
    with pytest.raises(ValueError, match="rounds must be"):
        KABBConfig(rounds=5)
    with pytest.raises(ValueError, match="weights must be"):
        KABBConfig(weights=[0.5, 0.5])
    with pytest.raises(ValueError, match="cold_rounds must be <= rounds"):
        KABBConfig(rounds=100, cold_rounds=200)


def test_vectorised_distances_equal_the_closed_form():
    experts = [Expert("a", frozenset({"x"}), ("d",)), Expert("b", frozenset({"x", "y"})), Expert("c")]
    k = KABB(experts, top_k=1, alpha_floor=1e-3)
    k.alpha[:] = [2.0, 0.5, 1.0]
    dom = Domain("t", frozenset({"x", "y"}))
    want = [knowledge_distance(e, dom, k.alpha[i], k.beta[i], 3, 2.5) for i, e in enumerate(experts)]
    assert np.allclose(k.distances(dom, 2.5), want)


def test_knowledge_tags_beat_context_free_thompson_sampling_on_task_experts():
    # two tasks, each with its own perfect expert; a context-free bandit cannot route by task, KABB's distance can
    rng = np.random.default_rng(0)
    nq = 40
    task = np.arange(nq) % 2
    corr = np.zeros((nq, 4))
    corr[task == 0, 0] = 1.0
    corr[task == 1, 1] = 1.0
    corr[:, 2:] = rng.random((nq, 2)) < 0.3
    codes = np.where(corr > 0, 0, 1 + np.arange(4)[None])
    domains = [Domain("a", frozenset({"a"})), Domain("b", frozenset({"b"}))]
    caps = [frozenset({"a"}), frozenset({"b"}), frozenset(), frozenset()]
    acc_k, acc_t = [], []
    for s in range(8):
        queries = np.random.default_rng(s).integers(0, nq, size=200)
        kabb = KABB([Expert(str(i), caps[i]) for i in range(4)], top_k=1, seed=s)
        ts = ThompsonSampling(4, 1, seed=s)
        args = (queries, corr, codes, np.ones((nq, 4)), domains, task, np.full(nq, 5.0))
        acc_k.append(run_stream(kabb, *args).team.mean())
        acc_t.append(run_stream(ts, *args).team.mean())
    assert np.mean(acc_k) > np.mean(acc_t) + 0.1
