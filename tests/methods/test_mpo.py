"""Invariants of MPO: log-linear mixing, mirror descent reaching the exact MaxMin optimum (LP), the torch pieces."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch

from lmlab.methods.alignment.mpo import method as M
from lmlab.methods.alignment.mpo import task as T


def _problem(seed: int = 0, n: int = 24, c: int = 8, k: int = 3):
    """A finite candidate set with conflicting z-normalised objectives and a non-uniform reference."""
    rng = np.random.default_rng(seed)
    ref = rng.normal(size=(n, c)) * 1.5
    r = rng.normal(size=(n, c, k))
    r[..., 1] = -0.7 * r[..., 0] + 0.3 * rng.normal(size=(n, c)) + 0.4  # objectives 0 and 1 conflict
    mu, sd = M.zscore_fit(r)
    return M.normalize_logps(ref), (r - mu) / sd


def _grid(k: int, d: int):
    return [np.array(p, float) / d for p in itertools.product(range(d + 1), repeat=k) if sum(p) == d]


# ------------------------------------------------------------------------------------------- mixing maths


def test_log_linear_mix_of_exact_policies_is_the_closed_form_and_needs_sum_one():
    ref, z = _problem()
    singles = M.closed_form_policies(ref, z, 0.5)  # pi_k ∝ pi_ref exp(z_k / beta)
    w = np.array([0.2, 0.5, 0.3])
    # prod_k pi_k^{w_k} ∝ pi_ref exp(w·z / beta): the pi_ref factors cancel because sum w = 1
    assert np.abs(M.log_linear_mix(singles, w) - M.closed_form_policy(ref, z, w, 0.5)).max() < 1e-10
    # a vertex gives that policy; the probability mixture is a different distribution
    assert np.abs(M.log_linear_mix(singles, [0, 1, 0]) - singles[..., 1]).max() < 1e-12
    assert np.abs(M.arithmetic_mix(singles, w) - M.log_linear_mix(singles, w)).max() > 1e-2
    # identical policies: every mixture is that policy
    same = np.repeat(singles[..., :1], 3, axis=-1)
    assert np.abs(M.log_linear_mix(same, w) - singles[..., 0]).max() < 1e-12
    assert np.abs(M.arithmetic_mix(same, w) - singles[..., 0]).max() < 1e-12
    with pytest.raises(ValueError, match="must sum to 1"):
        M.log_linear_mix(singles, [0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match=">= 0"):
        M.log_linear_mix(singles, [1.5, -0.5, 0.0])


def test_dual_gradient_is_the_mixture_expectation_and_kl_vanishes_at_reference():
    ref, z = _problem(1)
    w = np.array([0.3, 0.3, 0.4])
    f, g = M.dual_value(w, ref, z, 0.5)
    pol = M.closed_form_policy(ref, z, w, 0.5)
    assert np.allclose(g, M.expected_rewards(pol, z).mean(0))
    # directional finite difference inside the simplex
    d = np.array([1.0, -1.0, 0.0]) * 1e-5  # central difference
    fd = (M.dual_value(w + d, ref, z, 0.5)[0] - M.dual_value(w - d, ref, z, 0.5)[0]) / 2e-5
    assert fd == pytest.approx(g @ np.array([1, -1, 0]), abs=1e-7)
    assert np.abs(M.kl_to_reference(ref, ref)).max() < 1e-12
    assert (M.kl_to_reference(pol, ref) > 0).all()
    # weak duality: any policy's regularised MaxMin value is below F at any weights
    assert M.regularised_maxmin_value(pol, ref, z, 0.5) <= f + 1e-12


def test_cutting_plane_lp_certifies_the_minimum_of_F():
    ref, z = _problem(2)
    opt = M.maxmin_optimum(ref, z, 0.5)
    assert 0 <= opt.gap <= 1e-6 * max(1, abs(opt.value))
    values = [M.dual_value(w, ref, z, 0.5)[0] for w in _grid(3, 30)]
    assert min(values) >= opt.lower - 1e-10  # the LP bound is a true lower bound
    assert min(values) >= opt.value - 1e-3  # and the optimum is not beaten by the grid
    # at an interior optimum every objective with positive weight has the same expected reward (the MaxMin tie)
    er = M.expected_rewards(M.closed_form_policy(ref, z, opt.weights, 0.5), z).mean(0)
    active = opt.weights > 1e-3
    assert np.ptp(er[active]) < 1e-3
    assert (er[~active] >= er[active].min() - 1e-3).all()


# ------------------------------------------------------------------------------------------ mirror descent


@pytest.mark.parametrize("seed", [0, 3])
def test_mirror_descent_reaches_the_exact_maxmin_optimum(seed):
    ref, z = _problem(seed, n=32)
    opt = M.maxmin_optimum(ref, z, 0.5)
    w_opt = M.worst_objective(M.expected_rewards(M.closed_form_policy(ref, z, opt.weights, 0.5), z))[0]
    for batch, steps, f_tol, w_tol in ((32, 1000, 5e-5, 2e-3), (8, 2000, 2e-4, 1e-2)):
        res = M.mpo_weights(z, ref_logps=ref, beta=0.5, batch_size=batch, steps=steps, seed=seed)
        f = M.dual_value(res.weights, ref, z, 0.5)[0]
        assert f - opt.lower < f_tol, (batch, f - opt.lower)
        pol = M.closed_form_policy(ref, z, res.weights, 0.5)
        assert abs(M.worst_objective(M.expected_rewards(pol, z))[0] - w_opt) < w_tol
        # the mixed policy itself is near-optimal for the regularised MaxMin problem (duality gap -> 0)
        assert opt.value - M.regularised_maxmin_value(pol, ref, z, 0.5) < 20 * f_tol
    uniform_w = M.worst_objective(M.expected_rewards(M.closed_form_policy(ref, z, np.ones(3) / 3, 0.5), z))[0]
    assert w_opt > uniform_w + 1e-3  # the problem is not trivially solved by uniform weights


def test_mirror_descent_converges_with_more_steps_and_its_update_favours_the_lagging_objective():
    ref, z = _problem(4, n=32)
    opt = M.maxmin_optimum(ref, z, 0.5)
    gaps = [M.dual_value(M.mpo_weights(z, ref_logps=ref, batch_size=32, steps=t).weights, ref, z, 0.5)[0]
            - opt.lower for t in (20, 200, 2000)]  # fmt: skip
    assert gaps[0] > gaps[1] > gaps[2] >= -1e-12
    one = M.mpo_weights(z, ref_logps=ref, batch_size=32, steps=1, schedule="constant", eta=0.5)
    g = one.gradients[0]
    # exponentiated gradient: lambda_1 ∝ (1/K) exp(-eta g)
    assert np.allclose(one.last, np.exp(-0.5 * g) / np.exp(-0.5 * g).sum())
    assert np.argmax(one.last) == np.argmin(g)  # the objective that scores lowest under pi_lambda gains weight
    assert np.allclose(one.trajectory[0], np.ones(3) / 3) and np.allclose(one.weights, np.ones(3) / 3)


def test_policy_sampler_and_trained_policies_give_the_same_weights_as_the_closed_form():
    ref, z = _problem(5)
    pols = M.closed_form_policies(ref, z, 0.5)
    a = M.mpo_weights(z, ref_logps=ref, beta=0.5, steps=300, seed=1)
    b = M.mpo_weights(z, policy_logps=pols + 7.0, steps=300, seed=1)  # per-prompt constants cancel
    assert np.abs(a.weights - b.weights).max() < 1e-10


@pytest.mark.parametrize("sampler", ["policy", "reference"])
def test_sampled_gradients_estimate_the_mixture_expectation(sampler):
    ref, z = _problem(6, n=4)
    exact = M.mpo_weights(z, ref_logps=ref, beta=0.5, batch_size=4, steps=1).gradients[0]
    est = M.mpo_weights(z, ref_logps=ref, beta=0.5, batch_size=4, steps=1, sampler=sampler,
                        n_samples=40000, seed=2).gradients[0]  # fmt: skip
    assert np.abs(est - exact).max() < 0.03


def test_small_beta_approaches_the_unregularised_lp():
    ref, z = _problem(7, n=12)
    lp = M.maxmin_lp(z)
    # the LP is a ceiling on the worst-objective reward of any candidate policy
    for w in _grid(3, 6):
        assert M.worst_objective(M.expected_rewards(M.closed_form_policy(ref, z, w, 0.05), z))[0] <= lp.value + 1e-9
    assert abs(lp.policy.sum(-1) - 1).max() < 1e-9 and abs(lp.weights.sum() - 1) < 1e-9
    # beta -> 0: min F_beta -> the LP value from below, within beta * mean_x max_y log(1 / pi_ref(y|x))
    slack = float((-ref).max(-1).mean())
    betas = (0.5, 0.1, 0.02)
    opts = [M.maxmin_optimum(ref, z, b) for b in betas]
    vals = [o.value for o in opts]
    assert vals[0] < vals[1] < vals[2] <= lp.value + 1e-9
    for b, v in zip(betas, vals, strict=True):
        assert lp.value - v <= b * slack + 1e-9
    # MPO's weights reach min F_beta at a small beta too (a less smooth F)
    res = M.mpo_weights(z, ref_logps=ref, beta=0.02, batch_size=12, steps=3000)
    assert M.dual_value(res.weights, ref, z, 0.02)[0] - opts[2].lower < 5e-3


def test_bad_inputs_give_one_line_errors():
    ref, z = _problem()
    with pytest.raises(ValueError, match="sampler must be one of"):
        M.mpo_weights(z, ref_logps=ref, sampler="bogus")
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        M.mpo_weights(z, ref_logps=ref, steps=0)
    with pytest.raises(ValueError, match="eta must be > 0"):
        M.mpo_weights(z, ref_logps=ref, eta=0.0)
    with pytest.raises(ValueError, match="needs policy_logps"):
        M.mpo_weights(z)
    with pytest.raises(ValueError, match="expected"):
        M.mpo_weights(z[:, :3], ref_logps=ref)
    with pytest.raises(ValueError, match="no candidate with a finite log-prob"):
        M.normalize_logps(np.full((2, 3), -np.inf))
    with pytest.raises(ValueError, match="rewards must have shape"):
        M.zscore_fit(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="beta must be > 0"):
        M.dual_value(np.ones(3) / 3, ref, z, 0.0)
    with pytest.raises(ValueError, match="weights must have 3 entries"):
        M.closed_form_policy(ref, z, [0.5, 0.5], 0.5)


def test_config_rejects_out_of_range_knobs():
    from lmlab.methods.alignment.mpo.config import MPOConfig

    bad = (("n_train", 0, "n_train"), ("n_candidates", 1, "n_candidates"), ("eta", 0.0, "eta"),
           ("k_layers", 0, "k_layers"), ("p_wrong", 1.5, "p_wrong"), ("sampler", "x", "sampler must be one of"),
           ("maxmin_tol", 0.0, "maxmin_tol"), ("md_schedule", "cosine", "md_schedule"),
           ("gen_samples", 0, "gen_samples"), ("gen_temperature", 0.0, "gen_temperature"))  # fmt: skip
    for field, value, msg in bad:
        with pytest.raises(ValueError, match=msg):
            MPOConfig(**{field: value})


# ------------------------------------------------------------------------------------------------ the task


def _countries(n: int = 12, split: str = "train"):
    from lmlab import data

    caps = data.load("countries", None, seed=0, split=split, task="capital")
    conts = {e.meta["iso2"]: e for e in data.load("countries", None, seed=0, split=split, task="continent")}
    curs = {e.meta["iso2"]: e for e in data.load("countries", None, seed=0, split=split, task="currency")}
    out = [T.make_country(e, conts[e.meta["iso2"]], curs[e.meta["iso2"]]) for e in caps if T.usable(e)]
    return out[:n]


def test_candidates_are_graded_exactly_as_constructed():
    for country in _countries(20):
        item = T.build_item(country, n_candidates=12, p_wrong=0.4, seed=0)
        assert len(set(item.candidates)) == 12 and set(item.forms) == set(T.FORMS)
        for text, truth, r in zip(item.candidates, item.truth, item.rewards, strict=True):
            got = T.fact_judgements(text, country)
            assert got == {f: truth.get(f) for f in T.FACTS}, (text, got)
            stated = list(truth.values())
            assert r[0] == pytest.approx(sum(stated) / len(stated) if stated else 0.0)
            assert r[1] == -len(text.split()) and r[2] == len(stated)
    # the same seed gives the same candidates
    c = _countries(1)[0]
    assert T.build_item(c, n_candidates=8, p_wrong=0.3, seed=1).candidates == \
        T.build_item(c, n_candidates=8, p_wrong=0.3, seed=1).candidates  # fmt: skip


def test_grader_ignores_the_country_name_and_catches_wrong_facts():
    from lmlab import data

    split = next(s for s in ("train", "dev", "test") if any(e.meta["iso2"] == "ZA" for e in data.load(
        "countries", None, seed=0, split=s, task="capital")))  # fmt: skip
    ex = {t: next(e for e in data.load("countries", None, seed=0, split=split, task=t) if e.meta["iso2"] == "ZA")
          for t in ("capital", "continent", "currency")}  # fmt: skip
    za = T.make_country(ex["capital"], ex["continent"], ex["currency"])
    assert T.fact_judgements("The capital of South Africa is Pretoria.", za) == {
        "capital": True,
        "continent": None,
        "currency": None,
    }
    assert T.fact_judgements("Paris, in Asia, uses the Rand.", za) == {
        "capital": False,
        "continent": False,
        "currency": True,
    }
    assert T.grade_text(" I do not know.", za).tolist() == [0.0, -4.0, 0.0]


# ------------------------------------------------------------------------------------------- torch pieces


def _trunk_batch(tiny_llama, tiny_tokenizer, k: int = 1):
    from lmlab.core.training.partial import FrozenTrunk
    from lmlab.core.training.preference import build_response_batch

    trunk = FrozenTrunk(tiny_llama, k)
    prompts = ["Q: capital of A?\nA:"] * 3 + ["Q: capital of B?\nA:"] * 3
    resp = [" Ax.", " The capital is Ax.", " No idea.", " Bx.", " It is Bx, in Asia.", " Hm."]
    batch = build_response_batch(tiny_tokenizer, prompts, resp, padding_side="right")
    cache = trunk(batch.input_ids, batch.attention_mask, batch.position_ids)
    with torch.no_grad():
        ref = M.response_logps(trunk.reference, cache, batch.target_mask)
    group = M.CandidateBatch(cache, batch.target_mask, ref, np.array([0, 0, 0, 1, 1, 1]), np.array([0, 1, 2] * 2))
    return trunk, group


def test_response_logps_equal_the_full_model_sums(tiny_llama, tiny_tokenizer):
    from lmlab.core.training.partial import token_logps_from_cache
    from lmlab.core.training.preference import batch_logps, build_response_batch

    trunk, group = _trunk_batch(tiny_llama, tiny_tokenizer)
    full = token_logps_from_cache(trunk.reference, group.cache, target_mask=group.target_mask).sum(-1)
    assert torch.allclose(group.ref_logps, full, atol=1e-5)
    prompts = ["Q: capital of A?\nA:"] * 3 + ["Q: capital of B?\nA:"] * 3
    resp = [" Ax.", " The capital is Ax.", " No idea.", " Bx.", " It is Bx, in Asia.", " Hm."]
    with torch.no_grad():
        direct = batch_logps(tiny_llama, build_response_batch(tiny_tokenizer, prompts, resp)).sum
    assert torch.allclose(group.ref_logps, direct, atol=1e-4)


def test_dpo_policy_learns_its_pairs_and_leaves_the_reference_alone(tiny_llama, tiny_tokenizer):
    trunk, group = _trunk_batch(tiny_llama, tiny_tokenizer)
    before = {n: p.detach().clone() for n, p in tiny_llama.named_parameters()}
    pairs = [torch.tensor([[1, 0], [1, 2], [4, 3], [4, 5]])]  # the long answers preferred
    res = M.train_dpo_policy(trunk, [group], pairs, beta=0.5, lr=3e-3, epochs=30, seed=0)
    assert res.losses[-1] < res.losses[0] * 0.5 and res.pair_accuracy[-1] == 1.0
    assert all(torch.equal(before[n], p) for n, p in tiny_llama.named_parameters())
    with torch.no_grad():
        lp = M.response_logps(res.policy, group.cache, group.target_mask)
    margin = lp - group.ref_logps
    assert margin[1] > margin[0] and margin[4] > margin[3]
    with pytest.raises(ValueError, match="no preference pair"):
        M.train_dpo_policy(trunk, [group], [torch.zeros(0, 2, dtype=torch.long)])


def test_reward_soup_is_the_parameter_average(tiny_llama, tiny_tokenizer):
    trunk, group = _trunk_batch(tiny_llama, tiny_tokenizer)
    a = M.train_dpo_policy(trunk, [group], [torch.tensor([[1, 0]])], lr=1e-2, epochs=3, seed=0).policy
    b = M.train_dpo_policy(trunk, [group], [torch.tensor([[0, 1]])], lr=1e-2, epochs=3, seed=1).policy
    sa, sb = a.state_dict(), b.state_dict()
    s = M.soup_topk(trunk, [a, b], [0.25, 0.75]).state_dict()
    for key in sa:
        assert torch.allclose(s[key], 0.25 * sa[key] + 0.75 * sb[key], atol=1e-6), key
    one = M.soup_topk(trunk, [a, b], [1.0, 0.0])
    with torch.no_grad():
        assert torch.allclose(M.response_logps(one, group.cache, group.target_mask),
                              M.response_logps(a, group.cache, group.target_mask), atol=1e-5)  # fmt: skip
    with pytest.raises(ValueError, match="must sum to 1"):
        M.soup_topk(trunk, [a, b], [0.5, 0.6])


def test_policy_model_matches_the_topk_and_shares_the_trunk(tiny_llama, tiny_tokenizer):
    from lmlab.core.training.partial import logits_from_cache

    trunk, group = _trunk_batch(tiny_llama, tiny_tokenizer)
    pol = M.train_dpo_policy(trunk, [group], [torch.tensor([[1, 0]])], lr=1e-2, epochs=2).policy
    full = M.policy_model(tiny_llama, pol)
    assert full.get_input_embeddings() is tiny_llama.get_input_embeddings()
    assert full.model.layers[0] is tiny_llama.model.layers[0]
    assert full.model.layers[1] is not tiny_llama.model.layers[1]
    c = group.cache
    with torch.no_grad():
        got = full(input_ids=c.input_ids, attention_mask=c.attention_mask, position_ids=c.position_ids).logits
        assert torch.allclose(got, logits_from_cache(pol, c), atol=1e-4)
        base = tiny_llama(input_ids=c.input_ids, attention_mask=c.attention_mask, position_ids=c.position_ids).logits
        assert torch.allclose(base, logits_from_cache(trunk.reference, c), atol=1e-4)  # the model is untouched


def test_mixture_generate_is_exact_at_the_vertices_and_mixes_log_probs(tiny_llama, tiny_tokenizer):
    from lmlab.core.inference.tiny import make_tiny_llama

    other = make_tiny_llama(seed=3)
    prompts = ["Question: What is the capital of Peru?\nAnswer:", "Q: hi"]
    kw = dict(max_new_tokens=6)
    single = M.mixture_generate([tiny_llama], tiny_tokenizer, prompts, [1.0], **kw)
    # HF greedy decoding of each prompt alone
    for p, text in zip(prompts, single, strict=True):
        ids = tiny_tokenizer(p, return_tensors="pt").input_ids
        out = tiny_llama.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                                  pad_token_id=0, eos_token_id=None)  # fmt: skip
        assert tiny_tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True) == text
    assert M.mixture_generate([tiny_llama, other], tiny_tokenizer, prompts, [1.0, 0.0], **kw) == single
    twin = copy.deepcopy(tiny_llama)
    assert M.mixture_generate([tiny_llama, twin], tiny_tokenizer, prompts, [0.3, 0.7], **kw) == single
    # first token: argmax of the weighted sum of log-softmaxes
    w = [0.4, 0.6]
    ids = tiny_tokenizer(prompts[0], return_tensors="pt").input_ids
    with torch.no_grad():
        mix = sum(wk * torch.log_softmax(m(ids).logits[0, -1], -1) for wk, m in zip(w, [tiny_llama, other]))
    first = M.mixture_generate([tiny_llama, other], tiny_tokenizer, prompts[:1], w, max_new_tokens=1)[0]
    assert first == tiny_tokenizer.decode([int(mix.argmax())], skip_special_tokens=True)
    with pytest.raises(ValueError, match="must sum to 1"):
        M.mixture_generate([tiny_llama, other], tiny_tokenizer, prompts, [0.5, 0.6])


# ------------------------------------------------------------------------------------------- the experiment


def _near_tied(n: int = 40):
    """Per-prompt objective rewards (n, 3) of systems A and B: B's worst objective is `correct` (column 0); A is B
    shifted by +0.05 on it, and A's `concise` (column 1) is independent noise whose mean sits 0.01 above A's
    `correct`, so the two near-tie for A's worst objective. On the full sample both systems' worst is column 0."""
    rng = np.random.default_rng(7)
    b = np.stack([rng.normal(0.0, 1.0, n), rng.normal(2.0, 1.0, n), rng.normal(2.0, 1.0, n)], -1)
    a = b.copy()
    a[:, 0] += 0.05
    noise = rng.normal(0.0, 1.0, n)
    a[:, 1] = noise - noise.mean() + a[:, 0].mean() + 0.01
    return a, b


def test_worst_reward_claims_retake_the_argmin_in_each_resample():
    """W = min_k mean_x E[z_k] is not a mean of per-prompt values. The old check bootstrapped the per-prompt column
    of the full-sample worst objective: here the constant difference 0.05, CI [0.05, 0.05], "holds". Re-taking the
    min in every paired resample lets A's near-tied `concise` be its worst in part of them: the CI includes the
    values below 0.05 that the fixed column excludes, and the check is inconclusive."""
    from lmlab.core.stats.uncertainty import compare
    from lmlab.methods.alignment.mpo import experiment as E
    from lmlab.methods.alignment.mpo.config import MPOConfig
    from lmlab.registry import get_method
    from lmlab.results import Claim
    from lmlab.runner import RunContext

    a, b = _near_tied()
    ids = [f"p{i}" for i in range(len(a))]
    ctx = RunContext(get_method("mpo"), MPOConfig(), show_progress=False)
    E._record_system(ctx, "a", a, ids)
    E._record_system(ctx, "b", b, ids)
    fixed = compare(a[:, 0], b[:, 0], clusters=ids, seed=0)  # the old check: the worst column fixed
    assert fixed.status == "supported" and fixed.ci_high - fixed.ci_low < 1e-12
    claims = [Claim("worst_reward", "a", "b", ">"), Claim("reward_correct", "a", "b", ">")]
    w, mean = E._finish(ctx, claims).claims
    assert w.observed_effect == pytest.approx(0.05) and w.n == len(a)
    assert w.status == "inconclusive" and w.ci[0] < fixed.ci_low - 0.1 and w.ci[1] >= fixed.ci_high - 1e-12
    assert w.null_status == "not_supported"  # the baseline against itself: W difference 0, CI [0, 0]
    assert mean.metric == "reward_correct" and mean.status == "supported"  # mean claims keep compare's check
    # the W row's CI is W's own bootstrap too: wider than the fixed column's
    row = next(m for m in ctx.metrics if (m.system, m.metric) == ("a", "worst_reward"))
    col = next(m for m in ctx.metrics if (m.system, m.metric) == ("a", "reward_correct"))
    assert row.value == pytest.approx(a.mean(0).min()) and row.ci_low < col.ci_low - 0.02


def test_run_rejects_too_many_trainable_blocks():
    from lmlab.runner import run_method

    with pytest.raises(ValueError, match="k_layers must be at most"):
        run_method("mpo", preset="smoke", model="tiny-llama", write=False, show_progress=False, raise_errors=True,
                   threads=1, k_layers=5)  # fmt: skip


def test_run_reports_the_exact_maxmin_check_and_records_it_as_a_mechanism():
    from lmlab.runner import run_method

    res = run_method("mpo", preset="smoke", model="tiny-llama", write=False, show_progress=False, raise_errors=True,
                     threads=1, train_policies=False, md_steps=3000)  # fmt: skip
    chk = res.flags["maxmin_check"]
    # converged mirror descent: the certified dual gap and the two-sided W bound are small on the train prompts
    assert 0 <= chk["dual_gap"] < 1e-3 and chk["gap_bound"] < 0.02 and chk["within_tol"]
    assert chk["abs_gap"] <= chk["gap_bound"] + 1e-9
    mech = [c for c in res.claims if c.metric == "maxmin_gap"]
    assert len(mech) == 1 and mech[0].mechanism and not mech[0].gate
    gated = {c.baseline for c in res.claims if c.gate}
    assert {"uniform", "single_correct", "single_concise", "single_detail"} <= gated
    assert "maxmin_opt" not in gated and not any(c.method.startswith("dpo_") for c in res.claims)


def test_run_gates_that_training_moved_the_policies_and_samples_generations(monkeypatch):
    """Level 2 opens with the gate "training moved each policy" (own objective against pi_ref, held-out candidates),
    every level's table has the untrained row, generations are sampled (a prompt's samples differ; greedy wrote the
    same text for every mixture), and each W claim is the paired bootstrap of W re-taken per resample on the
    recorded per-objective rewards (per-sample rows clustered by prompt in generation)."""
    from lmlab.core.stats.seeding import derive_seed
    from lmlab.core.stats.uncertainty import compare_statistic
    from lmlab.runner import RunContext, run_method

    seen = {}
    finish = RunContext.finish

    def spy(self, claims, **kw):
        seen["ctx"] = self
        return finish(self, claims, **kw)

    monkeypatch.setattr(RunContext, "finish", spy)
    res = run_method("mpo", preset="smoke", model="tiny-llama", write=False, show_progress=False, raise_errors=True,
                     threads=1, gen_samples=3)  # fmt: skip
    ctx = seen["ctx"]
    texts = [c.text for c in res.claims]
    trained = [i for i, t in enumerate(texts) if t.startswith("trained:")]
    moved = [i for i, t in enumerate(texts) if t.startswith("trained: training moved the policy")]
    assert len(moved) == 3 and moved == trained[:3]
    for i, o in zip(moved, ("correct", "concise", "detail"), strict=True):
        c = res.claims[i]
        assert c.gate and (c.metric, c.method, c.baseline) == (f"reward_{o}", f"dpo_single_{o}", "reference")
    table = res.tables["systems"]
    for level in ("exact", "trained", "generation"):
        assert {"reference", "gen_reference"} & {r["system"] for r in table if r["level"] == level}, level
    assert all(r["kl_ref"] == 0 for r in table if r["system"] == "reference")
    gens = res.tables["generations"]
    assert len(gens) == 2 * 3 and [g["sample"] for g in gens] == [0, 1, 2] * 2
    assert any(len({g["gen_reference"] for g in gens if g["id"] == pid}) > 1 for pid in {g["id"] for g in gens})
    assert len(ctx.values("gen_mpo", "reward_correct")) == 6  # one row per sample, clustered by prompt
    assert len(set(ctx.clusters("gen_mpo", "reward_correct"))) == 2
    objectives = ("correct", "concise", "detail")
    for c in (c for c in res.claims if c.metric == "worst_reward"):
        a = np.stack([ctx.values(c.method, f"reward_{o}") for o in objectives], -1)
        b = np.stack([ctx.values(c.baseline, f"reward_{o}") for o in objectives], -1)
        ids = ctx.clusters(c.method, "reward_correct")
        seed = derive_seed(res.config["seed"], "claim", c.method, c.baseline, c.metric)
        want = compare_statistic(a, b, lambda v: float(v.mean(0).min()), clusters=ids, seed=seed)
        assert c.ci == (want.ci_low, want.ci_high) and c.status == want.status and c.p_value is None, c.text
