"""Invariants of M_AP selection and its cached-trunk DPO / SimPO kit, on synthetic arrays and the tiny llama."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
import torch

from lmlab.core.inference.tiny import make_byte_tokenizer, make_tiny_llama
from lmlab.core.training.partial import FrozenTrunk
from lmlab.core.training.preference import seq_logprobs
from lmlab.methods.alignment.alignment_potential import method as M
from lmlab.methods.alignment.alignment_potential.config import AlignmentPotentialConfig

PROMPTS = ["What is the capital of Norway?", "Which continent is Peru on?", "Name a colour.", "2 + 2 ="]
CHOSEN = ["The capital of Norway is Oslo.", "Peru is in South America.", "Blue.", " 4"]
REJECTED = ["Bergen, a lovely city by the sea.", "Peru is in Asia, I think.", "A colour is a thing.", " 5, clearly"]
RM = [[2.5, 0.5], [2.4, 0.1], [1.0, 0.9], [2.0, 0.0]]


@pytest.fixture(scope="module")
def tiny():
    # HF's default init (0.02) keeps logits O(1); a fresh model per module so training tests can't leak
    return make_tiny_llama(seed=3, n_layers=3), make_byte_tokenizer()


# ------------------------------------------------------------------------------------------------ the metric


def _z(v):
    mu, sd = statistics.fmean(v), statistics.pstdev(v)
    return [(x - mu) / sd for x in v]


def test_scores_match_the_official_metric_on_a_fixed_input():
    rm = [1.0, 2.0, 3.0, 4.0, 5.0, 0.5]
    lp = [5.0, 1.0, 4.0, 2.0, 3.5, 0.2]
    zr, zl = _z(rm), _z(lp)  # population std, as numpy's default in metric_selection.py
    np.testing.assert_allclose(M.zscore(rm), zr)
    np.testing.assert_allclose(M.metric_scores(rm, lp, "rm-logp"), [a - b for a, b in zip(zr, zl)])
    np.testing.assert_allclose(
        M.metric_scores(rm, lp, "rm-xlogp", logp_weight=2.5), [a - 2.5 * b for a, b in zip(zr, zl)]
    )
    np.testing.assert_allclose(M.metric_scores(rm, lp, "rm_margin"), zr)
    np.testing.assert_allclose(M.metric_scores(rm, lp, "logp_margin_norm_abs"), [-b for b in zl])
    # rm-logp by hand: scores -2.40, 0.59, -0.56, 1.25, 1.00, 0.12; pair 0 (small explicit, large implicit) last
    s = M.metric_scores(rm, lp, "rm-logp")
    np.testing.assert_allclose(s, [-2.402, 0.589, -0.555, 1.254, 0.996, 0.119], atol=2e-3)
    assert list(M.top_k_indices(s, 2)) == [4, 3] and int(np.argmin(s)) == 0
    # the code keeps argsort(score)[-k:], ascending; k = int(0.4 * n)
    kept, idx = M.select(list("abcdef"), s, 0.4)
    assert list(idx) == [4, 3] and kept == ["e", "d"]


def test_random_baseline_draws_what_np_random_seed_42_draws():
    state = np.random.get_state()
    try:
        np.random.seed(42)
        expected = np.random.choice(200, 80, replace=False)
    finally:
        np.random.set_state(state)
    np.testing.assert_array_equal(M.random_indices(200, 80, seed=42), expected)
    assert len(set(M.random_indices(200, 80).tolist())) == 80


def test_map_ranks_between_explicit_and_implicit_and_is_scale_free():
    rng = np.random.default_rng(0)
    rm, imp = rng.gamma(2.0, size=50), rng.gamma(2.0, size=50)
    # w = 0 is explicit-only; a huge w orders as implicit-only
    np.testing.assert_array_equal(
        M.top_k_indices(M.map_score(rm, imp, w=0.0), 20), M.top_k_indices(M.metric_scores(rm, imp, "rm_margin"), 20)
    )
    big = M.top_k_indices(M.map_score(rm, imp, w=1e9), 20)
    assert set(big.tolist()) == set(M.top_k_indices(M.metric_scores(rm, imp, "logp_margin_norm_abs"), 20).tolist())
    # explicit-only keeps the largest explicit margins, implicit-only the smallest implicit ones
    assert set(M.top_k_indices(M.metric_scores(rm, imp, "rm_margin"), 10).tolist()) == set(np.argsort(rm)[-10:])
    assert set(M.top_k_indices(M.metric_scores(rm, imp, "logp_margin_norm_abs"), 10).tolist()) == set(
        np.argsort(imp)[:10]
    )
    # z-scores: an affine rescaling of the RM and dropping beta from the implicit reward change nothing
    np.testing.assert_allclose(M.map_score(3.0 * rm + 7.0, 0.1 * imp), M.map_score(rm, imp), atol=1e-9)
    # M_AP rises with the explicit margin and falls with the implicit one
    s = M.map_score(rm, imp)
    i = int(np.argmax(imp))
    imp2 = imp.copy()
    imp2[i] = imp.min() / 2
    assert M.map_score(rm, imp2)[i] > s[i]


def test_absolute_implicit_margin_ranks_a_badly_wrong_pair_low_signed_high():
    rm = np.array([2.0, 2.0, 2.0, 0.5])
    chosen = np.array([-1.0, -1.0, -3.0, -1.0])  # pair 2: the policy strongly prefers the rejected response
    rejected = np.array([-1.5, -0.8, -1.0, -1.1])
    a = M.map_score(rm, M.implicit_margin(chosen, rejected))
    s = M.map_score(rm, M.implicit_margin(chosen, rejected, signed=True))
    assert a[2] < a[0] and a[2] < a[1]  # |margin| = 2: "already decided", scored low
    assert int(np.argmax(s)) == 2  # signed: most room to learn
    np.testing.assert_allclose(M.rm_margin([[1.0, 3.0, 2.0], [0.5, 0.5]]), [2.0, 0.0])


def test_preference_accuracy_and_reward_margins():
    np.testing.assert_array_equal(M.preference_accuracy([0.3, 0.0, -1e-9]), [1.0, 0.5, 0.0])
    s = M.PairScores(*(np.array(v, float) for v in ([-1, -2], [-3, -1], [-0.5, -1], [-1, -0.5], [2, 2], [3, 2])))
    r = M.PairScores(*(np.array(v, float) for v in ([-2, -2], [-2, -2], [0, 0], [0, 0], [2, 2], [3, 2])))
    # ((pc - rc) - (pr - rr)): ((-1 + 2) - (-3 + 2), (-2 + 2) - (-1 + 2))
    np.testing.assert_allclose(M.reward_margins(s, "dpo", r), [2.0, -1.0])
    np.testing.assert_allclose(M.reward_margins(s, "simpo"), [0.5, -0.5])


# --------------------------------------------------------------------------------- log-probs on the tiny model


def test_cached_topk_scores_equal_full_model_logprobs(tiny):
    model, tok = tiny
    ps, cs, rs = M.format_pairs(tok, PROMPTS, CHOSEN, REJECTED)  # chat template, empty system turn
    assert all(p.startswith("<s>system\n</s>") and p.endswith("<s>assistant\n") for p in ps)
    assert all(c.endswith("</s>\n") for c in cs)
    with torch.no_grad():
        full = seq_logprobs(model, tok, ps + ps, cs + rs, chat=False)
    for k in (1, 3):
        trunk = FrozenTrunk(model, k)
        pairs = M.encode_pairs(trunk, tok, PROMPTS, CHOSEN, REJECTED, chat=True)
        sc = M.score_pairs(trunk.reference, pairs, batch_size=3)  # chunks cross the chosen/rejected boundary
        np.testing.assert_allclose(np.r_[sc.chosen_sum, sc.rejected_sum], full.sum.double().numpy(), atol=1e-4)
        np.testing.assert_allclose(np.r_[sc.chosen_mean, sc.rejected_mean], full.mean.double().numpy(), atol=1e-5)
        np.testing.assert_array_equal(np.r_[sc.chosen_len, sc.rejected_len], full.n_tokens.numpy())
    # the public scorer on the full model: the code's mean log-prob margin, abs, z-scored with rm_margin
    got = M.alignment_potential(model, tok, PROMPTS, CHOSEN, REJECTED, RM, batch_size=3)
    n = len(PROMPTS)
    imp = np.abs(full.mean[:n].double().numpy() - full.mean[n:].double().numpy())
    np.testing.assert_allclose(got.implicit_margin, imp, atol=1e-5)
    np.testing.assert_allclose(got.rm_margin, [2.0, 2.3, 0.1, 2.0])
    np.testing.assert_allclose(got.score, M.zscore([2.0, 2.3, 0.1, 2.0]) - M.zscore(imp), atol=1e-4)
    summed = M.alignment_potential(model, tok, PROMPTS, CHOSEN, REJECTED, RM, reduction="sum", w=2.5)
    np.testing.assert_allclose(summed.implicit_margin, np.abs(full.sum[:n] - full.sum[n:]).double().numpy(), atol=1e-4)


@pytest.mark.parametrize("arch, attn", [("llama", "sdpa"), ("gemma3", "eager")])
def test_cached_scores_and_training_on_other_attention_and_architectures(arch, attn):
    from lmlab.core.inference.tiny import make_tiny_model

    model, tok = make_tiny_model(1, arch=arch, n_layers=3, attn_implementation=attn), make_byte_tokenizer()
    ps, cs, rs = M.format_pairs(tok, PROMPTS, CHOSEN, REJECTED)
    with torch.no_grad():
        full = seq_logprobs(model, tok, ps + ps, cs + rs, chat=False)
    trunk = FrozenTrunk(model, 2)
    pairs = M.encode_pairs(trunk, tok, PROMPTS, CHOSEN, REJECTED)
    ref = M.score_pairs(trunk.reference, pairs, batch_size=3)
    np.testing.assert_allclose(np.r_[ref.chosen_sum, ref.rejected_sum], full.sum.double().numpy(), atol=1e-4)
    res = M.train_preference(trunk, pairs, [0, 1, 2], ref=ref, lr=3e-3, epochs=3, batch_size=2, warmup_ratio=0.0)
    assert res.losses[0] == pytest.approx(np.log(2), abs=1e-5) and res.losses[-1] < res.losses[0]


def test_chat_texts_system_turn_and_plain_fallback(tiny):
    _, tok = tiny
    head, tail = M.chat_texts(tok, "Hi?", "Yo.", system="")
    assert head == "<s>system\n</s>\n<s>user\nHi?</s>\n<s>assistant\n" and tail == "Yo.</s>\n"
    head, _ = M.chat_texts(tok, "Hi?", "Yo.", system=None)  # the template's default (none for this template)
    assert head == "<s>user\nHi?</s>\n<s>assistant\n"
    ps, cs, _ = M.format_pairs(tok, ["Hi?"], ["Yo."], ["No."], chat=False)
    assert ps == ["Question: Hi?\nAnswer:"] and cs == [" Yo."]


def test_sliced_cache_gives_the_rows_of_the_full_cache(tiny):
    model, tok = tiny
    trunk = FrozenTrunk(model, 2)
    pairs = M.encode_pairs(trunk, tok, PROMPTS, CHOSEN, REJECTED, chat=True)
    with torch.no_grad():
        whole = M.response_logps(trunk.reference, pairs.cache, pairs.response_mask)
        rows = pairs.rows([2, 0])
        part = M.response_logps(trunk.reference, M.slice_cache(pairs.cache, rows), pairs.response_mask[rows])
    torch.testing.assert_close(part.sum, whole.sum[rows], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------- training


def _params(m):
    return {n: p.detach().clone() for n, p in m.named_parameters()}


def _dpo_grad_norm(trunk, pairs, ref, idx):
    from lmlab.core.training.preference import dpo_loss

    policy = trunk.top_k()
    rows = pairs.rows(idx)
    out = M.response_logps(policy, M.slice_cache(pairs.cache, rows), pairs.response_mask[rows])
    h = len(idx)
    rc, rr = (torch.as_tensor(v[idx], dtype=torch.float32) for v in (ref.chosen_sum, ref.rejected_sum))
    loss = dpo_loss(out.sum[:h], out.sum[h:], rc, rr, beta=0.1)
    loss.backward()
    return float(loss.detach()), max(
        float(p.grad.abs().max()) for p in policy.trainable_parameters() if p.grad is not None
    )


def test_dpo_gradient_through_the_policy_vanishes_when_chosen_equals_rejected(tiny):
    model, tok = tiny
    trunk = FrozenTrunk(model, 2)
    same = M.encode_pairs(trunk, tok, PROMPTS, CHOSEN, CHOSEN, chat=True)  # equal log-ratios by construction
    loss, g_same = _dpo_grad_norm(trunk, same, M.score_pairs(trunk.reference, same), [0, 1, 2, 3])
    assert loss == pytest.approx(np.log(2), abs=1e-6)
    diff = M.encode_pairs(trunk, tok, PROMPTS, CHOSEN, REJECTED, chat=True)
    _, g_diff = _dpo_grad_norm(trunk, diff, M.score_pairs(trunk.reference, diff), [0, 1, 2, 3])
    assert g_same < 1e-6 < 1e-3 < g_diff


def test_training_moves_only_the_top_blocks_and_learns_the_kept_pairs(tiny):
    model, tok = tiny
    before = _params(model)
    trunk = FrozenTrunk(model, 2)
    pairs = M.encode_pairs(trunk, tok, PROMPTS, CHOSEN, REJECTED, chat=True)
    ref = M.score_pairs(trunk.reference, pairs)
    for obj, beta, gamma in (("dpo", 0.5, 0.0), ("simpo", 2.0, 0.5)):
        res = M.train_preference(
            trunk,
            pairs,
            [0, 1],
            objective=obj,
            ref=ref,
            beta=beta,
            gamma=gamma,
            lr=3e-3,
            epochs=8,
            batch_size=2,
            warmup_ratio=0.0,
            seed=1,
        )
        start = _params(trunk.reference)
        moved = [n for n, p in res.policy.named_parameters() if p.requires_grad and not torch.equal(p, start[n])]
        assert len(moved) == len([p for p in res.policy.parameters() if p.requires_grad])  # every trainable moved
        assert res.losses[-1] < res.losses[0]
        after = M.score_pairs(res.policy, pairs)
        m_new = M.reward_margins(after, obj, ref)[:2]
        m_old = M.reward_margins(ref, obj, ref)[:2]
        assert (m_new > m_old).all(), (obj, m_new, m_old)
    # the model, its trunk and the reference blocks are untouched
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), before[n], msg=n)


def test_zero_weights_and_determinism(tiny):
    model, tok = tiny
    trunk = FrozenTrunk(model, 1)
    pairs = M.encode_pairs(trunk, tok, PROMPTS, CHOSEN, REJECTED, chat=True)
    ref = M.score_pairs(trunk.reference, pairs)
    zero = M.train_preference(trunk, pairs, [0, 1, 2], ref=ref, lr=1e-2, weight=np.zeros(4), batch_size=2)
    for (_, p), (_, q) in zip(zero.policy.named_parameters(), _params(trunk.reference).items()):
        torch.testing.assert_close(p.detach(), q)
    a = M.train_preference(trunk, pairs, [0, 1, 2], ref=ref, lr=1e-3, epochs=2, batch_size=2, seed=5)
    b = M.train_preference(trunk, pairs, [0, 1, 2], ref=ref, lr=1e-3, epochs=2, batch_size=2, seed=5)
    assert a.losses == b.losses and a.steps == 4


# ---------------------------------------------------------------------------------------------------- data


def test_pool_and_test_pairs_are_graded_exactly_and_disjoint():
    from lmlab import data
    from lmlab.data.countries import grade
    from lmlab.methods.alignment.alignment_potential import experiment as E

    train = {t: data.load("countries", 8, seed=0, split="train", task=t) for t in ("capital", "currency")}
    test = {t: data.load("countries", 8, seed=0, split="test", task=t) for t in ("capital", "continent")}
    pool = E.build_pool(train, 12, n_responses=3, noise=0.3, seed=0)
    pairs = E.build_test(test, 10, seed=0)
    assert len(pool) == 12 and len(pairs) == 10
    assert {p.cluster for p in pool}.isdisjoint({t.cluster for t in pairs})
    by_id = {e.id: e for es in [*train.values(), *test.values()] for e in es}
    for p in pool:
        assert max(p.rm_scores) - min(p.rm_scores) >= 0 and len(p.rm_scores) == 3
        for r in (p.chosen, p.rejected):  # correctness is the suite's exact grade
            assert r.correct == grade(by_id[r.example_id], r.text)
            assert r.correct == (1.0 if r.template in ("concise", "verbose", "hedged") else 0.0)
    for t in pairs:
        assert E.utility(t.a) != E.utility(t.b)
    assert E.build_pool(train, 12, n_responses=3, noise=0.3, seed=0) == pool  # seeded


# ------------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: M.zscore([]), "non-empty"),
        (lambda: M.zscore([1.0, float("nan")]), "finite"),
        (lambda: M.metric_scores([1, 2], [1, 2], "rm+logp"), "metric must be one of"),
        (lambda: M.metric_scores([1, 2], [1, 2], "rm-xlogp", logp_weight=-1), "logp_weight"),
        (lambda: M.metric_scores([1, 2], [1, 2, 3], "rm-logp"), "same length"),
        (lambda: M.select_size(10, 0.0), "ratio must be in"),
        (lambda: M.select_size(10, 1.5), "ratio must be in"),
        (lambda: M.select_size(0, 0.4), "at least one pair"),
        (lambda: M.top_k_indices([1.0, 2.0], 3), "k must be an int in"),
        (lambda: M.random_indices(5, 0), "k must be an int in"),
        (lambda: M.select(["a"], [1.0, 2.0], 0.4), "1 items but 2 scores"),
        (lambda: M.rm_margin([[1.0]]), ">= 2 finite"),
        (lambda: M.rm_margin([]), "empty"),
        (lambda: M.reward_margins(M.PairScores(*[np.zeros(1)] * 6), "dpo"), "reference"),
        (lambda: M.reward_margins(M.PairScores(*[np.zeros(1)] * 6), "ipo"), "objective must be one of"),
    ],
)
def test_bad_input_is_a_one_line_value_error(call, match):
    with pytest.raises(ValueError, match=match) as e:
        call()
    assert "\n" not in str(e.value)


def test_bad_model_inputs_and_training_arguments(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="reduction must be one of"):
        M.alignment_potential(model, tok, PROMPTS, CHOSEN, REJECTED, RM, reduction="max")
    with pytest.raises(ValueError, match="no preference pairs"):
        M.alignment_potential(model, tok, [], [], [], [])
    with pytest.raises(ValueError, match="reward rows"):
        M.alignment_potential(model, tok, PROMPTS, CHOSEN, REJECTED, RM[:2])
    with pytest.raises(ValueError, match="not a supported decoder-only LM"):
        FrozenTrunk(torch.nn.Linear(4, 4), 1)  # a model of the wrong architecture
    trunk = FrozenTrunk(model, 1)
    pairs = M.encode_pairs(trunk, tok, PROMPTS[:2], CHOSEN[:2], REJECTED[:2], chat=True)
    with pytest.raises(ValueError, match="needs the reference"):
        M.train_preference(trunk, pairs, [0], objective="dpo")
    with pytest.raises(ValueError, match="objective must be one of"):
        M.train_preference(trunk, pairs, [0], objective="kto")
    with pytest.raises(ValueError, match="pair_idx is empty"):
        M.train_preference(trunk, pairs, [], objective="simpo")
    with pytest.raises(ValueError, match="must index the 2 encoded pairs"):
        M.train_preference(trunk, pairs, [5], objective="simpo")
    with pytest.raises(ValueError, match="rows must be"):
        M.slice_cache(pairs.cache, torch.tensor([9]))


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"select_ratio": 0.0}, "select_ratio must be in"),
        ({"select_ratio": 1.2}, "select_ratio must be in"),
        ({"k_layers": 0}, "k_layers"),
        ({"n_responses": 1}, "n_responses"),
        ({"tasks": ["iso2"]}, "tasks entries must be among"),
        ({"tasks": []}, "tasks must name"),
        ({"selections": ["top"]}, "selections entries must be among"),
        ({"selections": [], "simpo_selections": []}, "nothing to train"),
        ({"logp_weight": -1.0}, "logp_weight"),
        ({"reduction": "max"}, "reduction must be one of"),
        ({"lr": 0.0}, "lr must be in"),
    ],
)
def test_bad_config_is_a_one_line_value_error(kw, match):
    with pytest.raises(ValueError, match=match) as e:
        AlignmentPotentialConfig(**kw)
    assert "\n" not in str(e.value)


def test_experiment_refuses_a_run_without_map_and_too_many_layers(tmp_path):
    from lmlab.runner import run_method

    with pytest.raises(ValueError, match="must include 'map'"):
        run_method(
            "alignment_potential",
            preset="smoke",
            model="tiny-llama",
            write=False,
            show_progress=False,
            raise_errors=True,
            selections=["random"],
            simpo_selections=[],
        )
    with pytest.raises(ValueError, match="k_layers must be in"):
        run_method(
            "alignment_potential",
            preset="smoke",
            model="tiny-llama",
            write=False,
            show_progress=False,
            raise_errors=True,
            k_layers=9,
        )


# ------------------------------------------------------------------------ recipe, replicates and the base rows


def test_default_recipe_trains_the_spec_epochs_over_several_replicates():
    # the old recipe (1 epoch at 1e-5: 20 AdamW steps) left every selection at the base policy's accuracy
    cfg = AlignmentPotentialConfig()
    assert cfg.epochs == 2 and cfg.lr > 1e-5 and cfg.replicates >= 3
    assert cfg.eval_split == "test" and AlignmentPotentialConfig(eval_split="dev").eval_split == "dev"
    for kw, match in (({"replicates": 0}, "replicates"), ({"eval_split": "train"}, "eval_split")):
        with pytest.raises(ValueError, match=match) as e:
            AlignmentPotentialConfig(**kw)
        assert "\n" not in str(e.value)


def test_random_subset_and_training_order_are_resampled_per_replicate():
    from lmlab.methods.alignment.alignment_potential import experiment as E

    cfg = AlignmentPotentialConfig()
    rng = np.random.default_rng(0)
    rm, imp = rng.gamma(2.0, size=200), rng.gamma(2.0, size=200)
    subsets = [E._select("random", rm, imp, 80, cfg, r) for r in range(3)]
    np.testing.assert_array_equal(subsets[0], M.random_indices(200, 80, seed=42))  # replicate 0: the code's draw
    assert len({tuple(sorted(s.tolist())) for s in subsets}) == 3  # a fresh random 40% per replicate
    # the deterministic selections do not depend on the replicate; the training order does (and per objective)
    np.testing.assert_array_equal(E._select("map", rm, imp, 80, cfg, 0), E._select("map", rm, imp, 80, cfg, 2))
    seeds = {E.train_seed_of(cfg, obj, r) for obj in ("dpo", "simpo") for r in range(3)}
    assert len(seeds) == 6


def test_training_moved_the_policy_is_gated_first_for_each_objective():
    from lmlab.methods.alignment.alignment_potential import experiment as E

    claims = E._claims(AlignmentPotentialConfig())
    first = [(c.method, c.baseline, c.direction, c.gate) for c in claims[:2]]
    assert first == [("map@dpo", "base@dpo", ">", True), ("map@simpo", "base@simpo", ">", True)]
    only_dpo = E._claims(AlignmentPotentialConfig(simpo_selections=[]))
    assert [c.baseline for c in only_dpo if c.baseline.startswith("base@")] == ["base@dpo"]


def test_smoke_run_records_base_rows_and_values_per_replicate_and_test_pair():
    from lmlab.runner import run_method

    res = run_method(
        "alignment_potential",
        preset="smoke",
        model="tiny-llama",
        write=False,
        show_progress=False,
        raise_errors=True,
        replicates=2,
        selections=["random", "map"],
        simpo_selections=["map"],
    )
    data = res.flags["data"]
    cells = 2 * data["test_countries"]  # (replicate, test country) cells: the bootstrap's unit
    assert data["replicates"] == 2 and data["test_split"] == "test"
    for system in ("base@dpo", "base@simpo", "random@dpo", "map@dpo", "map@simpo"):
        assert res.metric(system, "pref_acc").n == cells, system
    assert res.metric("base@dpo", "pref_acc").value == 0.5  # the DPO reward is identically 0 at initialisation
    rows = res.tables["training"]
    assert {r["system"] for r in rows if r["replicate"] == "all"} == {"base@dpo", "base@simpo"}
    assert sorted(r["replicate"] for r in rows if r["system"] == "random@dpo") == [0, 1]
    assert [r["seed"] for r in res.tables["random_subsets"]][0] == 42
    moved = [c for c in res.claims if c.baseline.startswith("base@")]
    assert [c.baseline for c in moved] == ["base@dpo", "base@simpo"] and all(c.gate for c in moved)
    assert moved[0].n == cells and moved[0].n_values == 2 * data["test_pairs"]
