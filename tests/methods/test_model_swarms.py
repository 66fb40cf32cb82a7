"""Model Swarms invariants: checkpoint algebra, the velocity formula by hand, a one-particle swarm at rest stays
put, g never decreases, restarts reset x and v, patience, TIES / DARE against mergekit's definitions on tiny
tensors (closed form), equal evaluation budgets across searchers, LoRA vs dense evaluation, bad input; and the
experiment's design: the default target (geography/currency_code) and experts, a geography target's dev pool held out
by country from the experts' training and the test split, the selectable capital_upper composite and its case trap,
the "best expert > base" sanity gate read first, and the exact "g >= best expert" invariant."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lmlab.methods.adaptation.model_swarms import method as M


def _vec(seed: int, d: int = 6) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"m.lora_A": torch.randn(1, d, generator=g), "m.lora_B": torch.randn(d, 1, generator=g)}


def _quadratic(target: dict[str, torch.Tensor]):
    def u(state):
        return -float(sum(((state[k] - target[k]) ** 2).sum() for k in target))

    return u


# ---------------------------------------------------------------------------------------------------------------
# algebra and the update


def test_merge_is_linear_tensor_by_tensor():
    a, b = _vec(0), _vec(1)
    m = M.merge([0.3, -1.2], [a, b])
    for k in a:
        assert torch.allclose(m[k], 0.3 * a[k] - 1.2 * b[k])
    assert all(torch.equal(M.merge([1.0], [a])[k], a[k]) for k in a)
    soup = M.uniform_soup([a, b])
    assert all(torch.allclose(soup[k], (a[k] + b[k]) / 2) for k in a)


def test_velocity_formula_with_fixed_randoms_matches_a_hand_computation():
    w = M.normalized_weights((0.5, 1.0, 1.0, 0.25), (0.4, 0.3, 0.3, 0.3))
    raw = (0.2, 0.3, 0.3, 0.075)
    assert w == pytest.approx(tuple(r / 0.875 for r in raw))
    assert sum(w) == pytest.approx(1.0)
    assert M.normalized_weights((1, 1, 1, 1), (0.4, 0.3, 0.3, 0.3), repel=False)[3] == 0.0
    t = lambda x: {"k": torch.tensor([x])}  # noqa: E731
    v, x, p, g, gw = t(1.0), t(2.0), t(3.0), t(5.0), t(-1.0)
    got = M.velocity_update(v, x, p, g, gw, w)["k"].item()
    want = w[0] * 1.0 + w[1] * (3.0 - 2.0) + w[2] * (5.0 - 2.0) + w[3] * (2.0 - (-1.0))
    assert got == pytest.approx(want)


@pytest.mark.parametrize("init", ["zero", "random", "best"])
def test_one_particle_with_zero_velocity_stays_put(init):
    x0 = _vec(3)
    vals = iter([0.1, 0.5, 0.2, 0.9, 0.4, 0.3, 0.7])  # whatever the utility says
    res = M.ModelSwarm([x0], lambda s: next(vals), M.SwarmConfig(velocity_init=init, max_iteration=6,
                                                                 patience=100)).search()  # fmt: skip
    assert res.iterations == 6 and res.evaluations == 7
    for k in x0:
        assert torch.equal(res.final_positions[0][k], x0[k])
        assert torch.equal(res.global_best[k], x0[k])


def test_global_best_never_decreases_and_the_swarm_beats_the_best_expert():
    experts = [_vec(s) for s in range(6)]
    target = M.uniform_soup(experts)  # inside the hull, at no expert
    u = M.CountingUtility(_quadratic(target))
    res = M.ModelSwarm(experts, u, M.SwarmConfig(max_iteration=30, patience=30, seed=0)).search()
    g = res.g_history
    assert all(b >= a for a, b in zip(g, g[1:]))
    assert g[-1] == max(u.history) == res.global_best_utility
    assert res.global_best_utility > max(_quadratic(target)(e) for e in experts)
    assert res.evaluations == u.calls == 6 * (1 + res.iterations)
    # personal bests are each particle's best utility so far
    assert res.personal_best_utilities == [max(h) for h in res.particle_history]


def test_restart_resets_position_and_velocity():
    experts = [_vec(s) for s in range(3)]
    cfg = dict(phi_v=0.5, phi_p=0.5, phi_g=0.0, phi_w=0.0, max_iteration=3, patience=2, restart_patience=0.5)
    const = lambda s: 0.0  # noqa: E731 (no particle ever improves: every one is stray from iteration 1)
    on = M.ModelSwarm(experts, const, M.SwarmConfig(restart=True, **cfg)).search()
    assert on.restarts[:3] == [(1, 0), (1, 1), (1, 2)]
    for x, e in zip(on.final_positions, experts):  # x <- p, v <- 0: only (p - x) = 0 and v = 0 remain
        assert all(torch.equal(x[k], e[k]) for k in e)
    off = M.ModelSwarm(experts, const, M.SwarmConfig(restart=False, **cfg)).search()
    assert not off.restarts
    assert any(not torch.equal(off.final_positions[0][k], experts[0][k]) for k in experts[0])


def test_patience_stops_when_g_is_unchanged():
    experts = [_vec(s) for s in range(2)]
    res = M.ModelSwarm(experts, lambda s: 1.0, M.SwarmConfig(patience=3, max_iteration=50, restart=False)).search()
    assert res.stopped == "patience" and res.iterations == 3 and res.evaluations == 2 * 4
    assert len(res.g_history) == 4


def test_populate_adds_children_on_the_line_of_two_parents():
    experts = [_vec(s) for s in range(2)]
    sw = M.ModelSwarm(experts, lambda s: 0.0, M.SwarmConfig(populate_to=4, max_iteration=0))
    res = sw.search()
    assert len(res.populated) == 2 and len(res.particle_history) == 4 and res.evaluations == 4
    for a, b, w in res.populated:
        assert 0 <= w <= 2 and a != b


# ---------------------------------------------------------------------------------------------------------------
# TIES / DARE: mergekit's definitions (generalized_task_arithmetic.py, sparsify.py at a6e4028), closed form

D1 = torch.tensor([1.0, -2.0, 0.5, 3.0])
D2 = torch.tensor([2.0, 1.5, -0.1, -1.0])
D3 = torch.tensor([-0.5, -3.0, 0.2, 2.0])


def test_ties_matches_the_closed_form():
    # density 0.5 keeps 2 of 4: D1 -> [0, -2, 0, 3], D2 -> [2, 1.5, 0, 0], D3 -> [0, -3, 0, 2]
    # elected signs (sum of weighted deltas): +, -, + (sum 0: nothing agrees), +; disjoint mean over the agreeing
    out = M.ties_merge([D1, D2, D3], [1.0, 1.0, 1.0], density=0.5)
    assert torch.allclose(out, torch.tensor([2.0, -2.5, 0.0, 2.5]))
    assert torch.allclose(M.ties_merge([D1, D2, D3], [1.0, 1.0, 1.0], density=0.5, lam=2.0),
                          torch.tensor([4.0, -5.0, 0.0, 5.0]))  # fmt: skip
    # mergekit elects the sign from the *weighted* deltas and divides by the agreeing weights: with D2 weighted 4,
    # position 1 sums to -2 + 6 - 3 = +1, so only D2 agrees there: 6 / 4 = 1.5
    out = M.ties_merge([D1, D2, D3], [1.0, 4.0, 1.0], density=0.5)
    assert torch.allclose(out, torch.tensor([2.0, 1.5, 0.0, 2.5]))


def test_ties_equals_peft_merge_utils_at_equal_weights():
    from peft.utils.merge_utils import ties

    ours = M.ties_merge([D1, D2, D3], [1.0, 1.0, 1.0], density=0.5)
    theirs = ties([D1, D2, D3], torch.tensor([1.0, 1.0, 1.0]), 0.5)
    assert torch.allclose(ours, theirs)
    # with unequal weights peft elects the sign from the unweighted deltas and divides by a count: not mergekit
    theirs = ties([D1, D2, D3], torch.tensor([1.0, 4.0, 1.0]), 0.5)
    assert not torch.allclose(M.ties_merge([D1, D2, D3], [1.0, 4.0, 1.0], density=0.5), theirs)


def test_dare_linear_matches_the_closed_form():
    # density 1 drops nothing: the weighted sum (no normalisation)
    assert torch.allclose(M.dare_linear_merge([D1, D2], [0.5, 2.0], density=1.0), 0.5 * D1 + 2.0 * D2)
    big = [torch.randn(400, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    out = M.dare_linear_merge(big, [0.5, 2.0], density=0.3, generator=torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(7)  # the same drops, by hand: keep w.p. density, rescale to the L1 norm
    want = torch.zeros(400)
    for d, w in zip(big, [0.5, 2.0]):
        m = torch.bernoulli(torch.full_like(d, 0.3), generator=g)
        want += w * (d * m) * (d.abs().sum() / (d * m).abs().sum())
    assert torch.allclose(out, want, atol=1e-6)
    one = M.dare_linear_merge([big[0]], [1.0], density=0.3, generator=torch.Generator().manual_seed(1))
    assert float(one.abs().sum()) == pytest.approx(float(big[0].abs().sum()), rel=1e-5)  # mergekit's L1 rescale
    assert 0.15 < float((one != 0).float().mean()) < 0.45


def test_dare_density_rescale_equals_peft_dare_linear():
    from peft.utils.merge_utils import dare_linear

    big = [torch.randn(300, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    torch.manual_seed(11)
    theirs = dare_linear(big, torch.tensor([0.5, 2.0]), 0.4)
    ours = M.dare_linear_merge(big, [0.5, 2.0], density=0.4, generator=torch.Generator().manual_seed(11),
                               rescale="density")  # fmt: skip
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_lora_task_vectors_are_scaled_products():
    st = {"x.lora_A": torch.tensor([[1.0, 2.0]]), "x.lora_B": torch.tensor([[3.0], [-1.0]])}
    tv = M.lora_task_vectors(st, scaling=0.5)
    assert torch.allclose(tv["x"], 0.5 * torch.tensor([[3.0, 6.0], [-1.0, -2.0]]))


# ---------------------------------------------------------------------------------------------------------------
# budgets


def test_evaluation_budget_is_exactly_equal_across_searchers():
    experts = [_vec(s) for s in range(4)]
    target = M.merge([0.7, 0.5, -0.2, 0.0], experts)
    swarm_u = M.CountingUtility(_quadratic(target))
    M.ModelSwarm(experts, swarm_u, M.SwarmConfig(max_iteration=5, patience=5)).search()
    budget = swarm_u.calls
    rs_u = M.CountingUtility(_quadratic(target), budget)
    M.random_search(experts, rs_u, budget, seed=0)
    vectors = [M.lora_task_vectors(e, 1.0) for e in experts]
    ties_u = M.CountingUtility(lambda d: -float(sum(v.abs().sum() for v in d.values())), budget)
    M.knob_search(lambda k: M.merge_task_vectors("ties", vectors, [1.0] * 4, density=k["density"], lam=k["lam"]),
                  ties_u, budget, first={"density": 0.5, "lam": 1.0}, ranges={"density": (0.2, 0.9),
                                                                            "lam": (0.5, 1.5)})  # fmt: skip
    assert swarm_u.calls == rs_u.calls == ties_u.calls == budget == 4 * 6
    with pytest.raises(M.BudgetExceeded):
        rs_u(experts[0])
    capped = M.CountingUtility(_quadratic(target))
    res = M.ModelSwarm(experts, capped, M.SwarmConfig(max_iteration=50, patience=50), max_evaluations=10).search()
    assert res.stopped == "budget" and capped.calls == 8  # 4 initial + one iteration of 4; a second would be 12


def test_smoke_run_gives_every_searcher_the_same_budget(tmp_path):
    from lmlab.runner import run_method

    result = run_method("model_swarms", preset="smoke", write=False, show_progress=False, raise_errors=True,
                        threads=1, save_model=str(tmp_path / "best"))  # fmt: skip
    calls = result.flags["equal_budget"]
    assert set(calls) == {"model_swarms", "random_search", "ties", "dare_linear"}
    assert len(set(calls.values())) == 1 and calls["model_swarms"] == result.flags["evaluation_budget"]
    evals = {m.system: m.value for m in result.metrics if m.metric == "utility_evaluations"}
    assert evals["best_single"] == 3 and {evals[s] for s in calls} == {float(calls["model_swarms"])}
    g = result.flags["swarm"]["g_history"]
    assert all(b >= a for a, b in zip(g, g[1:]))
    # the invariant is asserted exactly, the sanity gate is read first, and the base model is in every table
    check = result.flags["g_reaches_best_expert"]
    assert check["holds"] and check["g_dev"] == g[-1] and check["gain"] >= 0
    assert result.flags["signal"]["status"] in ("signal", "no signal")
    first = result.claims[0]
    assert (first.metric, first.method, first.baseline, first.gate) == ("dev_acc", "best_single", "base", True)
    assert not any(c.mechanism for c in result.claims)
    assert result.tables["experts"][0]["expert"] == "base"
    assert all("base_dev" in row for row in result.tables["swarm_history"])
    for metric in ("test_acc", "dev_acc"):
        assert {"base", "model_swarms", "best_single"} <= {m.system for m in result.metrics if m.metric == metric}
    # the default target is a task-bank family: no case trap, and no expert is a component by construction
    assert not any(m.metric == "test_case_trap" for m in result.metrics)
    assert all(row["component"] is None for row in result.tables["experts"])
    # the saved folder is a plain HF model usable as --model
    from transformers import AutoModelForCausalLM

    from lmlab.core.inference.models import load_model

    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "best")
    base, _ = load_model("tiny-llama")
    last = len(base.model.layers) - 1
    w_saved = saved.model.layers[last].self_attn.q_proj.weight
    w_base = base.model.layers[last].self_attn.q_proj.weight
    assert w_saved.shape == w_base.shape and not torch.equal(w_saved, w_base)  # the swarm's LoRA is merged in
    assert torch.equal(saved.model.layers[0].self_attn.q_proj.weight, base.model.layers[0].self_attn.q_proj.weight)


# ---------------------------------------------------------------------------------------------------------------
# the experiment's design: the target, the sanity gate, the exact invariant


class _DataCtx:
    """The part of the runner's context that `target_items` uses: seeded task-bank data, capped by cfg.limit."""

    def __init__(self, cfg):
        self.cfg = cfg

    def data(self, suite, n, *, split="test", **kw):
        from lmlab import data

        n = n if self.cfg.limit is None else self.cfg.limit if n is None else min(n, self.cfg.limit)
        return data.load(suite, n, seed=self.cfg.seed, split=split, **kw)


def test_default_target_and_experts_are_the_configs_and_validate():
    from lmlab.methods.adaptation.model_swarms import SPEC
    from lmlab.methods.adaptation.model_swarms.config import (
        COMPOSITES,
        DEFAULT_EXPERTS,
        DEFAULT_TARGET,
        ModelSwarmsConfig,
    )

    cfg = ModelSwarmsConfig()  # the default config validates
    # two experts that carry parts of currency codes (ISO-3, uppercase) and four that carry less or none; 6, as the
    # capital_upper design, so the budget B = 6 (1 + iterations) is unchanged
    assert cfg.target == DEFAULT_TARGET == "geography/currency_code"
    assert cfg.experts == DEFAULT_EXPERTS == ["geography/iso3", "strings/uppercase", "geography/capital",
                                              "geography/continent", "strings/reverse", "arithmetic/add"]  # fmt: skip
    assert cfg.target not in cfg.experts and cfg.target not in COMPOSITES and len(cfg.experts) == 6
    for name, preset in SPEC.presets.items():  # every preset searches for the default target with other experts
        pcfg = ModelSwarmsConfig(**preset)
        assert pcfg.target == DEFAULT_TARGET not in pcfg.experts, name
    with pytest.raises(ValueError, match="is one of the experts' families"):
        ModelSwarmsConfig(experts=[*DEFAULT_EXPERTS, DEFAULT_TARGET])
    ModelSwarmsConfig(target="composite/capital_upper")  # still selectable


# the composite's experts when it was the default: its two components and four that carry no part of it
CAPITAL_UPPER_EXPERTS = ["geography/capital", "strings/uppercase", "geography/continent", "strings/reverse",
                         "arithmetic/add", "units/length"]  # fmt: skip
# (target, experts): the default (its experts), the selectable composite, and another geography family
GEO_TARGETS = [
    ("geography/currency_code", None),
    ("composite/capital_upper", CAPITAL_UPPER_EXPERTS),
    ("geography/continent", ["geography/iso3", "geography/capital", "strings/uppercase"]),
]


@pytest.mark.parametrize("target,experts", GEO_TARGETS)
def test_geography_dev_pool_is_disjoint_by_country_from_training_and_test(target, experts):
    from lmlab.methods.adaptation.model_swarms import experiment as E
    from lmlab.methods.adaptation.model_swarms.config import ModelSwarmsConfig, items_family

    cfg = ModelSwarmsConfig(target=target, **({"experts": experts} if experts else {}))
    ctx = _DataCtx(cfg)
    trained = {f: E.family_items(ctx, cfg, f, cfg.expert_items, "train", 0) for f in cfg.experts}
    dev, test = E.target_items(ctx, cfg, trained)
    dev_split = E.family_items(ctx, cfg, items_family(target), None, "dev", cfg.n_choices)
    # 40 dev items although the dev split has 24 countries: the pool goes on into held-out train-split countries
    assert (len(dev), len(test)) == (cfg.dev_items, cfg.test_items) and len(dev_split) < cfg.dev_items
    seen = {e.meta["iso2"] for f, items in trained.items() if f.startswith("geography/") for e in items}
    dev_c, test_c = [e.meta["iso2"] for e in dev], {e.meta["iso2"] for e in test}
    assert seen and len(set(dev_c)) == len(dev) and len(test_c) == len(test)
    assert not set(dev_c) & test_c and not set(dev_c) & seen and not test_c & seen
    assert dev_c[: len(dev_split)] == [e.meta["iso2"] for e in dev_split]  # the dev split first
    train_c = {e.meta["iso2"] for e in E.family_items(ctx, cfg, items_family(target), None, "train", 0)}
    assert set(dev_c[len(dev_split) :]) <= train_c  # then train-split countries no geography expert saw
    with pytest.raises(ValueError, match="dev_items must be <= "):
        E.target_items(ctx, dataclasses.replace(cfg, dev_items=500), trained)
    if target == "geography/currency_code" and experts is None:
        # the pool size the README and config.py state for the default experts (seed 0): 24 dev + 19 held out
        E.target_items(ctx, dataclasses.replace(cfg, dev_items=43), trained)
        with pytest.raises(ValueError, match="dev_items must be <= 43"):
            E.target_items(ctx, dataclasses.replace(cfg, dev_items=44), trained)


def test_capital_upper_composite_keeps_its_case_trap():
    from lmlab.methods.adaptation.model_swarms import experiment as E
    from lmlab.methods.adaptation.model_swarms.config import COMPOSITES, ModelSwarmsConfig

    cfg = ModelSwarmsConfig(target="composite/capital_upper", experts=CAPITAL_UPPER_EXPERTS)
    assert set(COMPOSITES[cfg.target]) <= set(cfg.experts)
    assert E._component(cfg, "strings/uppercase") and E._component(cfg, "arithmetic/add") is False
    assert E._component(ModelSwarmsConfig(), "geography/iso3") is None
    trained = {f: E.family_items(_DataCtx(cfg), cfg, f, cfg.expert_items, "train", 0) for f in cfg.experts}
    dev, test = E.target_items(_DataCtx(cfg), cfg, trained)
    for ex in dev + test:
        # the answer in uppercase, the same capital in another case (the trap), other capitals in uppercase
        gold, trap = ex.choices[ex.meta["answer_index"]], ex.choices[ex.meta["trap_index"]]
        assert gold == ex.target == gold.upper() and trap != gold and trap.upper() == gold
        others = [c for i, c in enumerate(ex.choices) if i not in (ex.meta["answer_index"], ex.meta["trap_index"])]
        assert len(set(ex.choices)) == cfg.n_choices and all(c == c.upper() != gold for c in others)
        assert ex.prompt.startswith("Q: What is the capital of") and "uppercase letters" in ex.prompt


def test_smoke_run_on_capital_upper_reports_the_case_trap():
    from lmlab.runner import run_method

    result = run_method("model_swarms", preset="smoke", write=False, show_progress=False, raise_errors=True,
                        threads=1, target="composite/capital_upper",
                        experts=["geography/capital", "strings/uppercase", "arithmetic/add"])  # fmt: skip
    for metric in ("test_acc", "dev_acc", "test_case_trap"):
        assert {"base", "model_swarms", "best_single"} <= {m.system for m in result.metrics if m.metric == metric}
    rows = result.tables["experts"]
    assert all("test_case_trap" in row for row in rows)
    assert [row["component"] for row in rows] == [False, True, True, False]  # base, capital, uppercase, add


def test_sanity_gate_is_read_first_and_can_fail():
    from lmlab.methods.adaptation.model_swarms import experiment as E
    from lmlab.results import RunResult, evaluate_claim

    claims = E.claims()
    sanity = claims[0]
    assert (sanity.metric, sanity.method, sanity.baseline, sanity.direction) == ("dev_acc", "best_single", "base", ">")
    assert sanity.gate and not sanity.mechanism
    ids = [f"item{i}" for i in range(40)]
    base = [1.0 if i % 4 == 0 else 0.0 for i in range(40)]

    def run_with(best):
        results = [evaluate_claim(sanity, best, base, clusters=ids)]
        return E.state_signal(RunResult("model_swarms", {}, {}, claims=results, notes=["design note"]))

    flat = run_with(list(base))  # the best expert is no better than the base model
    assert flat.flags["signal"]["status"] == "no signal" and flat.notes[0].startswith("NO SIGNAL")
    assert flat.status != "supported"
    lifted = run_with([1.0 if i % 4 != 3 else 0.0 for i in range(40)])  # 0.75 vs 0.25
    assert lifted.flags["signal"]["status"] == "signal" and lifted.notes == ["design note"]
    assert lifted.status == "supported"


def test_g_at_least_the_best_expert_is_an_exact_invariant_not_a_bootstrap_claim():
    from lmlab.methods.adaptation.model_swarms import experiment as E

    assert not any(c.mechanism or (c.metric, c.method) == ("dev_acc", "model_swarms") for c in E.claims())
    experts = [_vec(s) for s in range(5)]
    u = _quadratic(M.uniform_soup(experts))
    res = M.ModelSwarm(experts, u, M.SwarmConfig(max_iteration=8, patience=8, seed=1)).search()
    single = M.best_single(experts, u)
    flag = E.g_reaches_best_expert(res, single)
    assert flag["holds"] and flag["gain"] == res.global_best_utility - single.best_utility > 0
    lower = dataclasses.replace(res, global_best_utility=single.best_utility - 1e-9)
    lower.g_history = [*res.g_history[:-1], single.best_utility - 1e-9]
    with pytest.raises(RuntimeError, match="global best decreased|below the best expert"):
        E.g_reaches_best_expert(lower, single)
    with pytest.raises(RuntimeError, match="does not start at its best initial particle"):
        E.g_reaches_best_expert(dataclasses.replace(res, g_history=[res.g_history[0] - 1, *res.g_history[1:]]),
                                single)  # fmt: skip
    with pytest.raises(RuntimeError, match="not the end of g's history"):
        E.g_reaches_best_expert(dataclasses.replace(res, global_best_utility=res.global_best_utility + 1), single)


# ---------------------------------------------------------------------------------------------------------------
# LoRA particles on the tiny llama


def test_dense_delta_scores_equal_the_lora_particle(tiny_llama, tiny_tokenizer):
    from peft import LoraConfig

    from lmlab.core.inference.scoring import _pad_id
    from lmlab.core.training.lora import PaddedCache, answer_scores
    from lmlab.core.training.partial import FrozenTrunk
    from lmlab.core.training.sft import encode_sequences
    from lmlab.methods.adaptation.model_swarms.adapters import LoraSlot, from_peft_state, lora_state, peft_state

    trunk = FrozenTrunk(tiny_llama, 1)
    lcfg = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    slot = LoraSlot(trunk, lcfg)
    pairs = [("Q: a?\nA:", " XYZ"), ("Q: longer question here?\nA:", " AB")]
    cache = PaddedCache(trunk, encode_sequences(tiny_tokenizer, *zip(*pairs)), _pad_id(tiny_tokenizer))
    zero = lora_state(slot.lora)  # peft's init: B = 0, the base model
    ref, _ = answer_scores(trunk.reference, cache)
    assert answer_scores(slot.load(zero), cache)[0] == pytest.approx(ref, abs=1e-5)
    state = {k: torch.randn(t.shape, generator=torch.Generator().manual_seed(i)) * 0.3
             for i, (k, t) in enumerate(zero.items())}  # fmt: skip
    lora_nll, _ = answer_scores(slot.load(state), cache)
    dense_nll, _ = answer_scores(slot.load_dense(M.lora_task_vectors(state, slot.scaling)), cache)
    assert dense_nll == pytest.approx(lora_nll, abs=1e-4)
    assert lora_nll != pytest.approx(ref, abs=1e-3)
    keys = peft_state(state, slot.first_block)
    assert "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight" in keys
    back = from_peft_state(keys, slot.first_block)
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)


# ---------------------------------------------------------------------------------------------------------------
# bad input


def test_bad_input_errors():
    from lmlab.methods.adaptation.model_swarms.config import ModelSwarmsConfig

    with pytest.raises(ValueError, match="same LoRA rank"):
        M.merge([1, 1], [_vec(0, 4), _vec(1, 6)])
    with pytest.raises(ValueError, match="same target modules"):
        M.merge([1, 1], [_vec(0), {"other.lora_A": torch.zeros(1, 6), "m.lora_B": torch.zeros(6, 1)}])
    with pytest.raises(ValueError, match="one per state"):
        M.merge([1.0], [_vec(0), _vec(1)])
    with pytest.raises(ValueError, match="at least one LoRA state dict"):
        M.ModelSwarm([], lambda s: 0.0)
    with pytest.raises(ValueError, match="velocity_init must be one of"):
        M.SwarmConfig(velocity_init="sideways")
    with pytest.raises(ValueError, match="phi_v must be a finite number >= 0"):
        M.SwarmConfig(phi_v=-1)
    with pytest.raises(ValueError, match="budget must be None or an int >= 1"):
        M.CountingUtility(lambda s: 0.0, budget=0)
    with pytest.raises(ValueError, match="budget must be an int >= 1"):
        M.random_search([_vec(0)], lambda s: 0.0, 0)
    with pytest.raises(ValueError, match="finite number"):
        M.CountingUtility(lambda s: float("nan"))(_vec(0))
    with pytest.raises(ValueError, match="density must be in"):
        M.ties_merge([D1], [1.0], density=0.0)
    with pytest.raises(ValueError, match="max_evaluations=2 is below"):
        M.ModelSwarm([_vec(0), _vec(1), _vec(2)], lambda s: 0.0, max_evaluations=2).search()
    with pytest.raises(ValueError, match="target must be one of"):
        ModelSwarmsConfig(target="arithmetic/divide")
    with pytest.raises(ValueError, match="target must be one of composite/capital_upper"):
        ModelSwarmsConfig(target="composite/capital_lower")
    with pytest.raises(ValueError, match="is one of the experts' families"):
        ModelSwarmsConfig(target="arithmetic/add")
    with pytest.raises(ValueError, match="is one of the experts' families"):
        ModelSwarmsConfig(target="geography/iso3")
    with pytest.raises(ValueError, match="experts must be a non-empty list"):
        ModelSwarmsConfig(experts=[])
    with pytest.raises(ValueError, match="density_range must be"):
        ModelSwarmsConfig(density_range=[0.9, 0.1])


def test_config_tuples_agree_with_the_code():
    from lmlab.data.taskbank import DOMAINS
    from lmlab.methods.adaptation.model_swarms import config as C

    assert C.VELOCITY_INITS == M.VELOCITY_INITS
    assert all(DOMAINS[d] == ts for d, ts in C.TASKBANK.items())
