"""Invariants of PLE: the decaying threshold, the rank / weighted-SFT routing, the loss's closed form, bad input."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch

from lmlab.core.training.preference import logps_from_token_logps
from lmlab.methods.alignment.ple import method as M
from lmlab.methods.alignment.ple import task as T


def test_geometric_threshold_decays_as_tau0_alpha_pow_i():
    tau = 0.2
    for i in range(6):
        assert math.isclose(M.threshold_at(i, 0.2, 0.9), 0.2 * 0.9**i)
        assert math.isclose(tau, 0.2 * 0.9**i)
        tau = M.next_threshold(tau, [5.0, -5.0], schedule="geometric", alpha=0.9)  # gaps ignored
    assert M.next_threshold(0.2, [1.0], schedule="fixed", alpha=0.9) == 0.2
    assert math.isclose(M.next_threshold(0.2, [1.0, 0.0], schedule="ema", alpha=0.9), 0.9 * 0.2 + 0.1 * 0.5)


def test_pairs_above_threshold_get_rank_rest_weighted_sft():
    gaps = np.array([0.5, 0.21, 0.2, 0.0, -0.1, -0.5])
    r = M.route_pairs(gaps, 0.2, reverse_case="wsft")
    assert r.tolist() == [M.RANK, M.RANK, M.WSFT, M.WSFT, M.WSFT, M.WSFT]
    r = M.route_pairs(gaps, 0.2, reverse_case="rank")
    assert r.tolist() == [M.RANK, M.RANK, M.WSFT, M.WSFT, M.WSFT, M.RANK_REV]
    # a lower threshold (later iteration) routes more pairs to the ranking loss
    assert (M.route_pairs(gaps, 0.2 * 0.9**10) == M.RANK).sum() >= (r == M.RANK).sum()


def _seq(rows):
    t = torch.tensor(rows, dtype=torch.float64)
    return logps_from_token_logps(t, t != 0)


def test_ple_loss_equals_closed_form_on_fixed_batch():
    g = _seq([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5], [-3.0, 0.0, 0.0]])  # y^p under the plain x
    p = _seq([[-2.0, 0.0, 0.0], [-1.0, -3.0, 0.0], [-1.0, -1.0, -1.0]])  # y under the plain x
    routes = np.array([M.RANK, M.WSFT, M.RANK_REV])
    rg, rp = np.array([1.0, 0.3, -1.0]), np.array([0.0, 0.1, 0.5])
    wg, wp = M.wsft_weights(rg, rp)
    out = M.ple_pair_loss(g, p, routes, wg, wp, rank_kind="pro", rank_beta=2.0, rank_sft_weight=0.5)
    sg, sp = np.array([-1.5, -0.5, -3.0]), np.array([-2.0, -2.0, -1.0])  # mean log-probs
    logsig = lambda z: -math.log1p(math.exp(-z))  # noqa: E731
    want = [
        -logsig(2.0 * (sg[0] - sp[0])) + 0.5 * (-sg[0]),
        wg[1] * (-sg[1]) + wp[1] * (-sp[1]),
        -logsig(2.0 * (sp[2] - sg[2])) + 0.5 * (-sp[2]),
    ]
    assert np.allclose(out.numpy(), want, atol=1e-10)
    assert math.isclose(wg[1], math.exp(0.3) / (math.exp(0.3) + math.exp(0.1)))


def test_raft_keeps_higher_reward_response():
    g, p = _seq([[-1.0, 0.0], [-2.0, 0.0]]), _seq([[-3.0, 0.0], [-4.0, 0.0]])
    out = M.raft_pair_loss(g, p, np.array([1.0, 0.0]), np.array([0.0, 1.0]))
    assert out.tolist() == [1.0, 4.0]


def test_raft_select_takes_the_argmax_reward_first_on_ties():
    r = np.array([[0.1, 0.9, 0.3, 0.9], [2.0, 2.0, -1.0, 0.0], [-3.0, -2.0, -5.0, -2.5]])
    assert M.raft_select(r).tolist() == [1, 0, 1]
    with pytest.raises(ValueError, match="queries, k >= 1"):
        M.raft_select([1.0, 2.0])
    with pytest.raises(ValueError, match="finite"):
        M.raft_select([[1.0, float("nan")]])


def test_normalised_rewards_and_utility():
    a, b = M.normalize_rewards([0.0, 1.0], [2.0, 3.0], "batch_z")
    both = np.concatenate([a, b])
    assert abs(both.mean()) < 1e-12 and abs(both.std() - 1) < 1e-12
    assert T.utility("what a wonderful and friendly city we loved it") > T.utility("we walked to the square today")
    assert T.utility("great great great great great great") < T.utility("a great and lovely trip to the city")


@pytest.mark.parametrize(
    "kw, match",
    [({"tau0": float("nan")}, "tau0"), ({"alpha": 1.5}, "alpha"), ({"iterations": 0}, "iterations"),
     ({"threshold_schedule": "cosine"}, "threshold_schedule"), ({"reverse_case": "drop"}, "reverse_case"),
     ({"raft_k": 0}, "raft_k")],
)  # fmt: skip
def test_bad_options_raise(kw, match):
    with pytest.raises(ValueError, match=match):
        M.PLEOptions(**kw)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="empty"):
        M.route_pairs([], 0.2)
    with pytest.raises(ValueError, match="reward_norm"):
        M.normalize_rewards([1.0], [2.0], "rank")
    with pytest.raises(ValueError, match="one reward per pair"):
        M.normalize_rewards([1.0, 2.0], [2.0], "batch_z")


# ------------------------------------------------------------------------------------- the online loop (tiny)


QUERIES = [f"Continue the story {i}: we arrived and" for i in range(8)]


def _toy_reward(query: str, response: str) -> float:
    return float(len(set(response))) / 4.0  # varied across responses, so pairs split between the two losses


@pytest.fixture(scope="module")
def loop_runs():
    from lmlab.core.inference.tiny import make_byte_tokenizer, make_tiny_llama
    from lmlab.core.training.partial import FrozenTrunk

    model, tok = make_tiny_llama(seed=7, n_layers=3), make_byte_tokenizer()
    trunk = FrozenTrunk(model, 1)
    sft, _ = M.sft_train(trunk, tok, QUERIES[:4], ["we walked to the square."] * 4, lr=1e-3, seed=0)
    gen = M.PolicyGenerator(model, tok, max_new_tokens=5, batch_size=8)
    opts = M.PLEOptions(iterations=2, queries_per_iter=4, epochs=1, train_batch=2, lr=1e-3, tau0=0.2, alpha=0.5)
    runs = {s: M.ple_align(trunk, tok, QUERIES, T.PRINCIPLE, _toy_reward, gen, system=s, opts=opts,
                           init_policy=sft, init_tag="sft", seed=3) for s in M.SYSTEMS}  # fmt: skip
    return trunk, sft, runs


def test_loop_shares_round_zero_and_budget_and_routes_by_decaying_threshold(loop_runs):
    trunk, sft, runs = loop_runs
    r0 = runs["ple"].records[0]
    for s, res in runs.items():
        if s != "raft_plain":  # it samples k plain answers of its own instead of the pair
            assert res.records[0].plain == r0.plain and res.records[0].guided == r0.guided  # same first-round data
        assert res.steps == runs["ple"].steps == 2 * 2  # same steps for every system (2 rounds x 2 minibatches)
        assert [rec.queries for rec in res.records] == [QUERIES[:4], QUERIES[4:]]  # fresh queries per round
    for rec in runs["ple"].records:
        assert math.isclose(rec.tau, 0.2 * 0.5**rec.iteration)
        np.testing.assert_array_equal(rec.routes, M.route_pairs(rec.gap, rec.tau, reverse_case="wsft"))
        rn, rnp = M.normalize_rewards(rec.r_plain, rec.r_guided, "batch_z")
        np.testing.assert_allclose(rec.gap, rnp - rn)
    assert [rec.tau for rec in runs["ple_fixed"].records] == [0.2, 0.2]
    assert all((rec.routes == M.RANK).all() for rec in runs["always_rank_dpo"].records)
    raft0 = runs["raft_guided"].records[0]
    np.testing.assert_array_equal(raft0.routes == M.RANK, raft0.r_guided >= raft0.r_plain)  # RAFT keeps the best
    assert raft0.targets == [yp if k else y for y, yp, k in zip(raft0.plain, raft0.guided, raft0.routes == M.RANK)]
    for rec in runs["raft_plain"].records:  # k = 4 on-policy plain samples per query, the best one kept
        assert len(rec.candidates) == 4 and all(len(c) == 4 for c in rec.candidates) and not rec.guided
        assert rec.targets == [c[j] for c, j in zip(rec.candidates, rec.r_candidates.argmax(1))]


def test_raft_plain_sfts_on_the_best_of_k_plain_samples_never_on_guided_ones(monkeypatch):
    """The paper's RAFT: k plain-prompt samples per query, SFT on the argmax-reward one; y^p never reaches it."""
    from lmlab.core.inference.tiny import make_byte_tokenizer, make_tiny_llama
    from lmlab.core.training.partial import FrozenTrunk

    trunk, tok = FrozenTrunk(make_tiny_llama(seed=2, n_layers=2), 1), make_byte_tokenizer()
    calls = []  # (heads, texts) of every generate call

    def generate(policy, heads, *, tag, do_sample, temperature, top_p, seed):
        texts = ["GUIDED wonderful lovely" if T.PRINCIPLE in h else f"plain {seed} {j} " + "ab" * (j % 5)
                 for j, h in enumerate(heads)]  # fmt: skip
        calls.append((list(heads), texts))
        return texts

    def reward(query, response):  # a guided answer beats every plain one; plain ones get fixed pseudo-random scores
        return 10.0 if response.startswith("GUIDED") else zlib.crc32(response.encode()) % 1000 / 1000

    trained = []  # the responses each round's training encodes, in order
    encode_rows, encode_pairs = M.encode_rows, M.encode_pairs

    def spy_rows(trunk, tokenizer, prompts, responses, **kw):
        trained.append(list(responses))
        return encode_rows(trunk, tokenizer, prompts, responses, **kw)

    def spy_pairs(trunk, tokenizer, prompts, chosen, rejected, **kw):
        trained.append(list(chosen) + list(rejected))
        return encode_pairs(trunk, tokenizer, prompts, chosen, rejected, **kw)

    monkeypatch.setattr(M, "encode_rows", spy_rows)
    monkeypatch.setattr(M, "encode_pairs", spy_pairs)
    k, b = 3, 4
    opts = M.PLEOptions(iterations=2, queries_per_iter=b, epochs=1, train_batch=2, raft_k=k)
    res = M.ple_align(trunk, tok, QUERIES, T.PRINCIPLE, reward, generate, system="raft_plain", opts=opts, seed=5)
    assert len(calls) == len(trained) == 2 and res.steps == 2 * 2  # per round: one decode, one SFT of b / 2 steps
    picked_later = 0
    for i, ((heads, texts), targets, rec) in enumerate(zip(calls, trained, res.records)):
        assert len(heads) == k * b and not any(T.PRINCIPLE in h for h in heads)  # k plain prompts per query
        cands = [[texts[j * b + q] for j in range(k)] for q in range(b)]
        r = np.array([[reward(x, y) for y in row] for x, row in zip(QUERIES[i * b : (i + 1) * b], cands)])
        assert targets == [row[int(np.argmax(rr))] for row, rr in zip(cands, r)]  # the best of the k samples
        assert not any(t.startswith("GUIDED") for t in targets)
        assert rec.targets == targets and rec.candidates == cands
        picked_later += sum(t != row[0] for t, row in zip(targets, cands))
    assert picked_later > 0  # the argmax is not always the first sample: the check above can tell them apart

    # the principle-aware variant on the same generator does train on y^p (what the old "raft" did)
    calls.clear()
    trained.clear()
    guided = M.ple_align(trunk, tok, QUERIES, T.PRINCIPLE, reward, generate, system="raft_guided", opts=opts, seed=5)
    assert all(t.startswith("GUIDED") for rec in guided.records for t in rec.targets)


def test_every_system_trains_its_own_copy_and_dpo_starts_at_log2(loop_runs):
    trunk, sft, runs = loop_runs
    base = dict(sft.named_parameters())
    for s, res in runs.items():
        assert res.policy is not sft
        changed = [n for n, p in res.policy.named_parameters() if p.requires_grad and not torch.equal(p, base[n])]
        assert changed, f"{s}: no trainable parameter changed"
    assert runs["always_rank_dpo"].records[0].losses[0] == pytest.approx(math.log(2), abs=1e-5)  # policy == reference


def test_loop_bad_input_raises():
    from lmlab.core.inference.tiny import make_byte_tokenizer, make_tiny_llama
    from lmlab.core.training.partial import FrozenTrunk

    trunk, tok = FrozenTrunk(make_tiny_llama(seed=1), 1), make_byte_tokenizer()
    opts = M.PLEOptions(iterations=2, queries_per_iter=4)
    with pytest.raises(ValueError, match=r"got 3 queries, need iterations x queries_per_iter = 2 x 4 = 8"):
        M.ple_align(trunk, tok, QUERIES[:3], T.PRINCIPLE, _toy_reward, lambda *a, **k: [], opts=opts)
    with pytest.raises(ValueError, match="principle must be a non-empty string"):
        M.ple_align(trunk, tok, QUERIES, "  ", _toy_reward, lambda *a, **k: [], opts=opts)
    with pytest.raises(ValueError, match="system must be one of"):
        M.ple_align(trunk, tok, QUERIES, T.PRINCIPLE, _toy_reward, lambda *a, **k: [], system="ppo", opts=opts)


@pytest.mark.parametrize(
    "kw, match",
    [({"systems": ["raft_plain"]}, "must include 'ple'"), ({"systems": ["ple", "ppo"]}, "systems entries"),
     ({"systems": ["ple", "raft"]}, "'raft' is now 'raft_guided'"), ({"raft_k": 0}, "raft_k"),
     ({"tau0": float("nan")}, "tau0"), ({"alpha": 0.0}, "alpha"), ({"k_layers": 0}, "k_layers"),
     ({"n_test": 0}, "n_test"), ({"top_p": 1.5}, "top_p")],
)  # fmt: skip
def test_bad_config_raises(kw, match):
    from lmlab.methods.alignment.ple.config import PLEConfig

    with pytest.raises(ValueError, match=match):
        PLEConfig(**kw)
