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


# --- issue 35: answer-key votes, an aggregated all-experts reference, the (cache seed, query block) CI unit ---------


def _keyed_cache():
    """Two queries x three experts; expert texts differ in wording but share the extracted answer key."""
    from lmlab.data.respcache import ResponseCache, ResponseRow

    def row(v, q, correct, text, key):
        cost = 1e9 * (1 + "abc".index(v))
        return ResponseRow(variant=v, query_id=q, task="arith1", correct=correct, cost_flops=cost, answer=text,
                           answer_key=key, n_prompt_tokens=20)  # fmt: skip

    rows = [
        row("a", "q0", 1.0, "The answer is 42.", "42"),
        row("b", "q0", 1.0, "42", "42"),
        row("c", "q0", 0.0, "Forty-one, I think: 41", "41"),
        row("a", "q1", 0.0, "7 apples", None),  # no key extracted: the raw text is the key
        row("b", "q1", 0.0, "7 apples", None),
        row("c", "q1", 1.0, "8", "8"),
    ]
    return ResponseCache(suite="mixed", seed=0, rows=rows)


class _Ctx:
    def __init__(self):
        self.models, self.notes = {}, []

    def note(self, text):
        self.notes.append(text)


def test_vote_keys_come_from_the_extracted_answer_key(monkeypatch):
    import lmlab.data.respcache as respcache
    from lmlab.methods.selection.kabb.experiment import load_table

    cache = _keyed_cache()
    monkeypatch.setattr(respcache, "load_cache", lambda *a, **k: cache)
    tab = load_table(KABBConfig(variants=["a", "b", "c"], top_k=1), _Ctx())
    codes = tab["codes"]  # [Q, V] in the cache's variant / query order
    assert tab["vids"] == ["a", "b", "c"] and tab["qids"] == ["q0", "q1"]
    assert codes[0, 0] == codes[0, 1] != codes[0, 2]  # "The answer is 42." and "42" are one answer
    assert codes[1, 0] == codes[1, 1] != codes[1, 2]  # no key: identical raw texts still agree
    # the vote of the three experts now follows the two agreeing answers
    assert weighted_vote(codes[0], tab["correct"][0], np.array([0.3, 0.3, 0.5])) == 1.0


def test_all_experts_is_an_aggregate_weighted_by_learned_posteriors_not_one_model():
    from lmlab.methods.selection.kabb.method import AllExperts

    # expert 0 is always right; experts 1-3 are always wrong with answers of their own, 2 and 3 agreeing on half
    # the queries. The old reference broke ties to the last / costliest expert, i.e. it was expert 3 alone.
    nq, v = 40, 4
    corr = np.zeros((nq, v))
    corr[:, 0] = 1.0
    codes = np.tile(np.arange(v), (nq, 1))
    codes[::2, 3] = 2  # a wrong answer shared by two weak experts
    rounds = np.random.default_rng(0).integers(0, nq, size=300)
    args = (rounds, corr, codes, np.ones((nq, v)), [Domain("t")], np.zeros(nq, int), np.ones(nq))
    team = run_stream(AllExperts(v), *args).team
    assert team[50:].mean() > 0.95  # the posterior-mean weights learn that expert 0 outweighs two wrong ones
    assert team.mean() > corr[rounds][:, 1:].mean(axis=0).max() + 0.5  # far above any single weak expert


def test_query_blocks_are_disjoint_task_stratified_and_cover_the_cache():
    from lmlab.methods.selection.kabb.experiment import query_blocks

    task = np.repeat(np.arange(8), 60)  # 480 queries, 60 per task (the issue-35 cache)
    blocks = query_blocks(task, 4, seed=3)
    allq = np.concatenate(blocks)
    assert len(allq) == len(task) and len(np.unique(allq)) == len(task)  # disjoint, nothing dropped
    for b in blocks:
        assert np.bincount(task[b], minlength=8).tolist() == [15] * 8  # stratified by task
    assert [x.tolist() for x in query_blocks(task, 4, seed=3)] == [x.tolist() for x in blocks]
    assert [x.tolist() for x in query_blocks(task, 4, seed=4)] != [x.tolist() for x in blocks]


def test_cache_seed_and_block_config_errors():
    with pytest.raises(ValueError, match="cache_seeds must be"):
        KABBConfig(cache_seeds=[0, 0])
    with pytest.raises(ValueError, match="cache_seeds must be"):
        KABBConfig(cache_seeds=[])
    with pytest.raises(ValueError, match="blocks must be"):
        KABBConfig(blocks=0)


def test_smoke_run_clusters_by_cache_seed_and_query_block():
    from lmlab.runner import run_method

    res = run_method("kabb", preset="smoke", write=False, show_progress=False, raise_errors=True)
    row = res.metric("kabb", "accuracy")
    assert row.n == 2 * 2  # smoke: 2 cache seeds x 2 blocks are the independent units (not the 4 bandit runs)
    gated = [c for c in res.claims if c.gate]
    assert gated and all(c.n == 4 and c.n_values == 8 for c in gated)
    assert set(res.flags["per_cache_seed_accuracy_effect"]) == {"s0", "s1"}
