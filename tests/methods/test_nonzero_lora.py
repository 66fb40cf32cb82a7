"""NZ-LoRA (Init[AB]) invariants on the tiny llama with peft: the paper's init scale, outputs unchanged at step 0
with the reset (exact up to float rounding), any LoRA config, the zero-init gradient fact, and bad input."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from lmlab.methods.adaptation.nonzero_lora import method as M

TARGETS = ["q_proj", "v_proj", "up_proj", "down_proj"]


def _peft(base, **kw):
    from peft import LoraConfig, get_peft_model

    cfg = dict(r=8, lora_alpha=16, target_modules=TARGETS, lora_dropout=0.0)
    cfg.update(kw)
    return get_peft_model(copy.deepcopy(base), LoraConfig(**cfg))


def _x() -> torch.Tensor:
    return torch.randint(0, 250, (2, 11), generator=torch.Generator().manual_seed(3))


def _logits(model, x) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=x).logits


@pytest.mark.parametrize("beta", [0.25, 1.0, 4.0])
def test_init_scale_matches_the_formula(tiny_llama, beta):
    model = _peft(tiny_llama)
    rec = M.init_nonzero_lora(model, beta_a=beta, beta_b=beta, generator=torch.Generator().manual_seed(0))
    assert len(rec.layers) == 2 * len(TARGETS)  # 2 blocks
    for info, (name, layer) in zip(rec.layers, M.lora_layers(model)):
        a, b = layer.lora_A["default"].weight.detach(), layer.lora_B["default"].weight.detach()
        n_in = a.shape[1]
        bound = math.sqrt(beta / n_in)
        assert info.name == name and info.bound_a == pytest.approx(bound) and info.bound_b == pytest.approx(bound)
        for w in (a, b):  # U(-bound, bound): inside, reaching near the edge, std bound / sqrt(3)
            assert float(w.abs().max()) <= bound
            assert float(w.abs().max()) > 0.9 * bound
            assert float(w.std()) == pytest.approx(bound / math.sqrt(3), rel=0.2)
    # beta = 1 is peft's kaiming-uniform(a=sqrt 5) bound for A: 1 / sqrt(n_in)
    assert M.nonzero_bound(64, 1.0) == pytest.approx(1 / 8)


def test_b_fan_out_uses_the_output_dimension(tiny_llama):
    model = _peft(tiny_llama, target_modules=["up_proj"])  # 64 -> 128: not square
    rec = M.init_nonzero_lora(model, beta_b=2.0, b_fan="out", generator=torch.Generator().manual_seed(0))
    info = rec.layers[0]
    assert (info.in_features, info.out_features) == (64, 128)
    assert info.bound_b == pytest.approx(math.sqrt(2.0 / 128)) and info.bound_a == pytest.approx(math.sqrt(1 / 64))


def test_reset_leaves_the_outputs_unchanged_at_step_0(tiny_llama):
    x = _x()
    ref = _logits(tiny_llama, x)
    model = _peft(tiny_llama)
    M.init_nonzero_lora(model, reset_weight=True, generator=torch.Generator().manual_seed(1))
    out = _logits(model, x)
    scale = float(ref.abs().max())
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * scale)
    # without the reset the same draws move the model: the check above is sensitive
    plain = _peft(tiny_llama)
    M.init_nonzero_lora(plain, reset_weight=False, generator=torch.Generator().manual_seed(1))
    assert float((_logits(plain, x) - ref).abs().max()) > 100 * float((out - ref).abs().max())
    # the factors really are non-zero at the paper's scale
    stats = M.lora_factor_stats(model)
    assert all(s["max_abs_b"] > 0.05 and s["product_fro"] > 0 for s in stats.values())


def test_reset_is_exact_in_float64(tiny_llama):
    base = copy.deepcopy(tiny_llama).double()
    x = _x()
    ref = _logits(base, x)
    model = _peft(base)
    M.init_nonzero_lora(model, reset_weight=True, generator=torch.Generator().manual_seed(1))
    assert float((_logits(model, x) - ref).abs().max()) < 1e-10


def test_any_lora_config_rslora_other_adapter_and_merge(tiny_llama):
    from peft import LoraConfig

    x = _x()
    ref = _logits(tiny_llama, x)
    all_targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = _peft(tiny_llama, r=4, lora_alpha=8, use_rslora=True, target_modules=all_targets)
    model.add_adapter("other", LoraConfig(r=2, lora_alpha=2, target_modules=["q_proj"]))
    before_default = {n: lyr.lora_B["default"].weight.clone() for n, lyr in M.lora_layers(model, "default")}
    rec = M.init_nonzero_lora(model, adapter="other", reset_weight=True, generator=torch.Generator().manual_seed(2))
    assert len(rec.layers) == 2 and all(info.r == 2 for info in rec.layers)
    # only the named adapter changed; the other still has peft's B = 0
    assert all(torch.equal(lyr.lora_B["default"].weight, before_default[n]) for n, lyr in M.lora_layers(model))
    model.set_adapter("other")
    torch.testing.assert_close(_logits(model, x), ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
    # rsLoRA: the reset used peft's scaling alpha / sqrt(r)
    m2 = _peft(tiny_llama, r=4, lora_alpha=8, use_rslora=True)
    rec2 = M.init_nonzero_lora(m2, reset_weight=True, generator=torch.Generator().manual_seed(2))
    assert rec2.layers[0].scaling == pytest.approx(8 / math.sqrt(4))
    torch.testing.assert_close(_logits(m2, x), ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
    # merge_and_unload folds s B0 A0 back into the reset W0: the plain model equals the pretrained one
    merged = m2.merge_and_unload()
    for (name, p), (_, q) in zip(merged.named_parameters(), tiny_llama.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def test_restore_and_rebuild_a_reset_base(tiny_llama):
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    model = _peft(tiny_llama)
    rec = M.init_nonzero_lora(model, reset_weight=True, generator=torch.Generator().manual_seed(4))
    init_adapter = {k: v.clone() for k, v in get_peft_model_state_dict(model).items()}
    reset_w = {n: lyr.get_base_layer().weight.clone() for n, lyr in M.lora_layers(model)}
    # rebuild from the saved initial adapter on a fresh base
    fresh = _peft(tiny_llama)
    set_peft_model_state_dict(fresh, init_adapter)
    M.reset_base_weight(fresh)
    for n, lyr in M.lora_layers(fresh):
        assert torch.equal(lyr.get_base_layer().weight, reset_w[n])
    # undo the reset with the kept factors
    M.restore_base_weight(model, rec)
    orig = dict(tiny_llama.named_parameters())
    for n, lyr in M.lora_layers(model):
        key = n.replace("base_model.model.", "", 1) + ".weight"
        torch.testing.assert_close(lyr.get_base_layer().weight, orig[key], rtol=0, atol=1e-6)


def test_zero_init_gives_no_gradient_to_A_at_step_0_and_nz_does(tiny_llama):
    """The paper's mechanism: with B0 = 0, dL/dA = 0 at step 0 (one update path); Init[AB] gives both factors a
    gradient from the first step."""
    x = _x()
    grads = {}
    for mode in ("zero", "nz"):
        torch.manual_seed(0)
        model = _peft(tiny_llama)
        M.init_lora(model, mode, generator=torch.Generator().manual_seed(0))
        out = model(input_ids=x, labels=x)
        out.loss.backward()
        layers = list(M.lora_layers(model))
        grads[mode] = [(float(lyr.lora_A["default"].weight.grad.abs().max()),
                        float(lyr.lora_B["default"].weight.grad.abs().max())) for _, lyr in layers]  # fmt: skip
    assert all(ga == 0.0 and gb > 0 for ga, gb in grads["zero"])
    assert all(ga > 0 and gb > 0 for ga, gb in grads["nz"])


def test_peft_init_false_is_not_init_ab_and_lmlab_replaces_it(tiny_llama):
    """peft's init_lora_weights=False keeps nn.Linear's default init, B's bound 1/sqrt(r) (peft's behaviour, kept as
    documentation). lmlab's part: mode 'zero' refuses such a model, and Init[AB] on it replaces both factors with
    draws within sqrt(beta / n_in)."""
    model = _peft(tiny_llama, init_lora_weights=False)
    _, layer = next(iter(M.lora_layers(model)))
    assert float(layer.lora_B["default"].weight.detach().abs().max()) > 2 * M.nonzero_bound(64, 1.0)  # peft
    with pytest.raises(ValueError, match="mode 'zero' expects peft's default init"):
        M.init_lora(model, "zero")
    M.init_lora(model, "nz", generator=torch.Generator().manual_seed(0))
    for _, lyr in M.lora_layers(model):
        bound = math.sqrt(1.0 / lyr.lora_A["default"].weight.shape[1])
        assert float(lyr.lora_A["default"].weight.abs().max()) <= bound
        assert float(lyr.lora_B["default"].weight.abs().max()) <= bound


# ----------------------------------------------------------------------------------------------------------------
# Init[AB] against the spec, with numbers computed here (bounds sqrt(beta / n_in), s = alpha / r), never the ones
# init_nonzero_lora reports; the second test breaks lmlab's init on purpose and checks that the first would fail


INIT_AB_CHECKS = [dict(beta=4.0, reset=True), dict(beta=0.25, reset=False)]


def _init_ab_violations(base, *, beta: float, reset: bool, r: int = 4, alpha: float = 12.0) -> list[str]:
    """Every way lmlab's Init[AB] on a float64 copy of `base` departs from the spec: A, B ~ U(±sqrt(beta / n_in));
    with the reset W0 <- W0 - s B0 A0 exactly (so W0 + s B A = the pretrained weight at step 0), without it W0
    untouched (W0 + s B A = the pretrained weight + the documented offset s B0 A0)."""
    model = _peft(copy.deepcopy(base).double(), r=r, lora_alpha=alpha)
    before = {n: lyr.get_base_layer().weight.detach().clone() for n, lyr in M.lora_layers(model)}
    gen = torch.Generator().manual_seed(5)
    M.init_nonzero_lora(model, beta_a=beta, beta_b=beta, reset_weight=reset, generator=gen)
    s = alpha / r  # peft's scaling, from the config, not from the layer
    out = []
    for name, lyr in M.lora_layers(model):
        a, b = lyr.lora_A["default"].weight.detach(), lyr.lora_B["default"].weight.detach()  # (r, n_in), (n_out, r)
        bound = math.sqrt(beta / a.shape[1])
        for factor, w in (("A", a), ("B", b)):  # >= 256 uniform draws: the max is within 20 % of the bound
            if not 0.8 * bound < float(w.abs().max()) <= bound:
                out.append(f"{name}: max|{factor}| = {float(w.abs().max()):.4g}, spec bound {bound:.4g}")
        w0 = lyr.get_base_layer().weight.detach()
        want = before[name] - s * (b @ a) if reset else before[name]
        if float((w0 - want).abs().max()) > 1e-12:
            out.append(f"{name}: base weight off by {float((w0 - want).abs().max()):.3g}")
        offset = w0 + s * (b @ a) - before[name]  # the step-0 change of the effective weight
        want_offset = torch.zeros_like(offset) if reset else s * (b @ a)
        if float((offset - want_offset).abs().max()) > 1e-12:
            out.append(f"{name}: step-0 offset off by {float((offset - want_offset).abs().max()):.3g}")
    return out


def test_init_ab_follows_the_spec(tiny_llama):
    for kw in INIT_AB_CHECKS:
        assert _init_ab_violations(tiny_llama, **kw) == [], kw


def _no_scaling(module, adapter, a, b):
    delta = b.to(torch.float64) @ a.to(torch.float64)  # s forgotten
    return delta.T if module.fan_in_fan_out else delta


@torch.no_grad()
def _adds_instead(module, delta):
    w = module.get_base_layer().weight
    w.data.copy_(w.data - delta.to(w.dtype))  # the sign of the reset flipped


BROKEN_INITS = {
    "reset without the scaling s": lambda mp: mp.setattr(M, "_delta_fp32", _no_scaling),
    "reset with the wrong sign": lambda mp: mp.setattr(M, "_add_to_base", _adds_instead),
    "reset skipped": lambda mp: mp.setattr(M, "_add_to_base", lambda module, delta: None),
    "beta ignored": lambda mp: mp.setattr(M, "nonzero_bound", lambda fan, beta: math.sqrt(1.0 / fan)),
    "bound without the square root": lambda mp: mp.setattr(M, "nonzero_bound", lambda fan, beta: beta / fan),
}


@pytest.mark.parametrize("broken", sorted(BROKEN_INITS))
def test_the_init_ab_check_fails_on_a_broken_init(tiny_llama, monkeypatch, broken):
    BROKEN_INITS[broken](monkeypatch)
    assert any(_init_ab_violations(tiny_llama, **kw) for kw in INIT_AB_CHECKS)


def test_same_generator_same_init(tiny_llama):
    a, b = _peft(tiny_llama), _peft(tiny_llama)
    M.apply_nonzero_lora_init(a, generator=torch.Generator().manual_seed(7))
    M.apply_nonzero_lora_init(b, generator=torch.Generator().manual_seed(7))
    for (_, la), (_, lb) in zip(M.lora_layers(a), M.lora_layers(b)):
        assert torch.equal(la.lora_A["default"].weight, lb.lora_A["default"].weight)
        assert torch.equal(la.lora_B["default"].weight, lb.lora_B["default"].weight)


def test_lr_sweep_on_the_full_peft_model(tiny_llama):
    from peft import LoraConfig, get_peft_model

    x = _x()

    def build():
        return get_peft_model(copy.deepcopy(tiny_llama), LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS))

    def loss_fn(model, batch):
        return model(input_ids=batch, labels=batch).loss

    def eval_fn(model):
        logp = torch.log_softmax(model(input_ids=x).logits[:, :-1].float(), -1)
        return {"nll": (-logp.gather(-1, x[:, 1:, None]).squeeze(-1).sum(-1)).tolist()}

    base = eval_fn(tiny_llama)["nll"]
    runs = M.lr_sweep(build, loss_fn, eval_fn, [x, x], lrs=[1e-3, 1e-2], seeds=[0], eval_step0=True)
    assert [(r.mode, r.lr) for r in runs] == [(m, lr) for m in M.INIT_MODES for lr in (1e-3, 1e-2)]
    assert all(len(r.losses) == 2 and len(r.eval["nll"]) == 2 for r in runs)
    for r in runs:
        if r.mode in ("zero", "nz_reset"):  # both start at the pretrained model
            assert r.eval0["nll"] == pytest.approx(base, rel=1e-5, abs=1e-4)
        else:
            assert abs(r.eval0["nll"][0] - base[0]) > 1e-3
        assert r.eval["nll"][0] < r.eval0["nll"][0]  # training on the same sequence lowers its NLL
    rows = M.sweep_table(runs)
    assert len(rows) == 6 and {r["n"] for r in rows} == {2}


def test_padded_cache_scores_match_full_model_loglikelihood(tiny_llama, tiny_tokenizer):
    from lmlab.core.inference.scoring import _pad_id, loglikelihood
    from lmlab.core.training.partial import FrozenTrunk
    from lmlab.core.training.sft import encode_sequences
    from lmlab.methods.adaptation.nonzero_lora.experiment import PaddedCache, answer_scores

    pairs = [("Q: a?\nA:", " XYZ"), ("Q: longer question here?\nA:", " AB"), ("Q: b?\nA:", " Q")]
    trunk = FrozenTrunk(tiny_llama, 1)
    cache = PaddedCache(trunk, encode_sequences(tiny_tokenizer, *zip(*pairs)), _pad_id(tiny_tokenizer))
    nll, em = answer_scores(trunk.reference, cache)
    want = [-lp for lp, _ in loglikelihood(tiny_llama, tiny_tokenizer, pairs)]
    assert nll == pytest.approx(want, rel=1e-4, abs=1e-4)
    assert set(em) <= {0.0, 1.0}


def test_bad_input_errors(tiny_llama):
    model = _peft(tiny_llama)
    with pytest.raises(ValueError, match="beta_a must be a finite number > 0"):
        M.init_nonzero_lora(model, beta_a=0.0)
    with pytest.raises(ValueError, match="beta_b must be"):
        M.init_nonzero_lora(model, beta_b=float("nan"))
    with pytest.raises(ValueError, match="b_fan must be one of"):
        M.init_nonzero_lora(model, b_fan="both")
    with pytest.raises(ValueError, match="no peft LoRA layer holds adapter 'nope'"):
        M.init_nonzero_lora(model, adapter="nope")
    with pytest.raises(ValueError, match="no peft LoRA layer"):
        M.init_nonzero_lora(copy.deepcopy(tiny_llama))  # a plain model, not a peft one
    with pytest.raises(ValueError, match="mode must be one of"):
        M.init_lora(model, "gaussian")
    M.init_lora(model, "nz")
    with pytest.raises(ValueError, match="mode 'zero' expects peft's default init"):
        M.init_lora(model, "zero")
    with pytest.raises(ValueError, match="embedding LoRA"):
        M.init_nonzero_lora(_peft(tiny_llama, target_modules=["embed_tokens"]))
    with pytest.raises(ValueError, match="DoRA"):
        M.init_nonzero_lora(_peft(tiny_llama, use_dora=True))
    merged = _peft(tiny_llama)
    merged.merge_adapter()
    with pytest.raises(ValueError, match="unmerge"):
        M.init_nonzero_lora(merged)
    with pytest.raises(ValueError, match="fan must be an int"):
        M.nonzero_bound(0, 1.0)
    with pytest.raises(ValueError, match="lr must be a finite number > 0"):
        M.train_steps(model, lambda m, b: torch.zeros(()), [0], 0.0)
    with pytest.raises(ValueError, match="must be non-empty"):
        M.lr_sweep(lambda: model, None, None, [0], lrs=[])
    rec = M.init_nonzero_lora(model, reset_weight=False)
    with pytest.raises(ValueError, match="nothing to restore"):
        M.restore_base_weight(model, rec)


def test_config_validation_and_constants():
    from lmlab.methods.adaptation.nonzero_lora import config as C

    assert C.INIT_MODES == M.INIT_MODES and C.B_FANS == M.B_FANS
    cfg = C.NonZeroLoRAConfig()
    assert cfg.n_seeds >= 3 and cfg.claim_lrs == 2 and "zero" in cfg.inits
    for bad, match in [
        ({"inits": ["zero", "nz_reset"]}, "inits must include 'nz'"),
        ({"inits": ["zero", "nz", "pissa"]}, "inits entries"),
        ({"lrs": []}, "lrs must be"),
        ({"lrs": [0.0]}, "lrs entries"),
        ({"target_modules": ["embed_tokens"]}, "target_modules"),
        ({"claim_lrs": 9}, "claim_lrs"),
        ({"beta": 0.0}, "beta"),
        ({"b_fan": "both"}, "b_fan"),
    ]:
        with pytest.raises(ValueError, match=match):
            C.NonZeroLoRAConfig(**bad)


# ----------------------------------------------------------------------------------------------------------------
# the experiment's checks: the item-clustered claim and the every-seed sign check (fake runs, no training)


def _fake_train(seed_effects: list[float], dev_best: float, n_items: int = 20):
    """``train(mode, lr, seeds) -> SweepRuns`` without training, and the seeds: item i's held-out NLL is 13 + i/10
    plus small noise under zero init, shifted by `seed_effects[k]` for nz and nz_reset in seed k (any lr); the dev
    NLL of every run is 9 + (log10 lr - log10 dev_best)^2 (+ a small per-item offset): lowest at `dev_best`."""
    seeds = [101 + k for k in range(len(seed_effects))]

    def train(mode: str, lr: float, run_seeds: list[int]) -> list:
        out = []
        for seed in run_seeds:
            k = seeds.index(seed)
            gen = torch.Generator().manual_seed(1000 * k + M.INIT_MODES.index(mode))
            shift = 0.0 if mode == "zero" else seed_effects[k]
            nll = (13 + torch.arange(n_items) / 10 + shift + 0.004 * torch.randn(n_items, generator=gen)).tolist()
            dev = [9 + (math.log10(lr) - math.log10(dev_best)) ** 2 + 0.01 * j for j in range(6)]
            out.append(M.SweepRun(mode, float(lr), seed, 1.0, [2.0, 1.0], {"nll": nll, "em": [0.0] * n_items,
                                                                         "dev_nll": dev}))  # fmt: skip
        return out

    return train, seeds


def _fake_result(cfg, train, seeds, n_items: int = 20):
    """The run's recording and claims on fake runs: the grid for every seed, then `search_inits`."""
    from lmlab.methods.adaptation.nonzero_lora.experiment import _record, lr_grid, search_inits
    from lmlab.registry import get_method
    from lmlab.runner import RunContext

    runs = [r for s in seeds for mode in cfg.inits for lr in lr_grid(cfg) for r in train(mode, lr, [s])]
    n_grid = len(runs)
    searches = search_inits(runs, cfg, seeds, train)
    ids = [f"c{i}" for i in range(n_items)]
    ctx = RunContext(get_method("nonzero_lora"), cfg, show_progress=False)
    step0 = {m: {"nll": [13.0] * n_items} for m in ("nz", "nz_reset")}
    result = ctx.finish(_record(ctx, cfg, runs, [], seeds, ids, [13.5] * n_items, step0, searches))
    return result, searches, runs[n_grid:]


@pytest.mark.parametrize("seed_effects, every_seed", [([-0.05, -0.04, -0.06], "supported"),
                                                       ([-0.06, -0.06, 0.02], "not_supported")])  # fmt: skip
def test_every_seed_check_holds_only_when_each_seed_mean_has_the_sign(seed_effects, every_seed):
    """One seed whose mean effect goes the other way leaves the pooled item-clustered claim supported (the mean over
    seeds is still negative, and the bootstrap resamples items, not seeds) but fails the every-seed check."""
    from lmlab.methods.adaptation.nonzero_lora.config import NonZeroLoRAConfig

    train, seeds = _fake_train(seed_effects, dev_best=2e-5)
    cfg = NonZeroLoRAConfig(lrs=[1e-5, 3e-5], n_seeds=len(seeds), eval_items=20)
    result, _, _ = _fake_result(cfg, train, seeds)
    ids = [f"c{i}" for i in range(20)]
    gated = [c for c in result.claims if c.gate]
    pooled = [c for c in gated if "/seed" not in c.method]
    every = [c for c in gated if "/seed" in c.method]
    assert len(pooled) == len(every) == 4  # {nz, nz_reset} x the 2 smallest lrs
    assert all(c.status == "supported" for c in pooled), [(c.text, c.status) for c in pooled]
    assert all(c.status == every_seed and c.null_status != "supported" for c in every), [(c.text, c.status)
                                                                                         for c in every]  # fmt: skip
    worst = max(range(3), key=lambda k: seed_effects[k])
    assert all(c.method.endswith(f"/seed{worst}") and c.baseline.endswith(f"/seed{worst}") for c in every)
    n_neg = sum(e < 0 for e in seed_effects)
    assert result.flags["seeds_below_zero_init"]["nz@1e-05"] == f"{n_neg} of 3"
    rows = {(m.system, m.metric): m for m in result.metrics}
    summary = rows[("nz-zero@1e-05", "seed_effect_nll")]  # the seed-level summary: mean of the 3 seed effects
    assert summary.n == 3 and summary.value == pytest.approx(np.mean(seed_effects), abs=0.01)
    assert ("nz_reset@3e-05/seed2", "eval_nll") in rows and rows[("zero@1e-05/seed0", "eval_nll")].n == len(ids)
    assert len(result.tables["per_seed_effects"]) == 2 * 2 * 3


def test_one_seed_gives_no_every_seed_check():
    from lmlab.methods.adaptation.nonzero_lora.config import NonZeroLoRAConfig
    from lmlab.methods.adaptation.nonzero_lora.experiment import claims

    cfg = NonZeroLoRAConfig(lrs=[1e-5, 3e-5], n_seeds=1)
    per_seed = {(m, lr): [-0.05] for m in ("nz", "nz_reset") for lr in (1e-5, 3e-5)}
    out = claims(cfg, [1e-5, 3e-5], {"nz": 3e-5, "zero": 3e-5, "nz_reset": 3e-5}, per_seed, {})
    assert not [c for c in out if "/seed" in c.method] and sum(c.gate for c in out) == 4


def test_a_dev_curve_still_falling_at_the_top_is_extended_until_the_choice_is_interior():
    """The last default run's case: every init's dev NLL still falling at the grid's top lr (1e-3). The shared search
    extends each init's grid at its top ratio (1e-3 / 3e-4) on the first seed, the choice 1e-3 x 10/3 is interior,
    the other seeds run there, and the best-lr rows and claims use it; capped at one extension the same curve leaves
    the choice on the top edge, flagged, and the claims at a chosen lr (not the gated fixed-lr ones) are FRAGILE."""
    from lmlab.methods.adaptation.nonzero_lora.config import NonZeroLoRAConfig

    train, seeds = _fake_train([-0.05, -0.04, -0.06], dev_best=3e-3)
    cfg = NonZeroLoRAConfig(n_seeds=3, eval_items=20)  # the default grid 3e-5 .. 1e-3
    top = max(cfg.lrs)
    up = top / sorted(cfg.lrs)[-2]
    result, searches, extra = _fake_result(cfg, train, seeds)
    for mode in cfg.inits:
        found = searches[mode]
        tried = [lr for lr, *_ in found.tried]
        assert tried[-2:] == pytest.approx([top * up, top * up**2]) and found.extensions == 2
        assert found.chosen == pytest.approx(top * up) and found.chosen > top and found.edge is None
        assert min(tried) < found.chosen < max(tried)
    # first-seed runs at both extensions per init, then the 2 other seeds at the chosen one per init
    assert sorted((r.mode, r.seed) for r in extra if r.lr > top * up * 1.01) == sorted((m, seeds[0])
                                                                                       for m in cfg.inits)  # fmt: skip
    assert len([r for r in extra if r.lr == searches["nz"].chosen]) == 3 * len(cfg.inits)
    rows = {(m.system, m.metric): m for m in result.metrics}
    best = _system("nz", searches["nz"].chosen)
    assert rows[("nz@best", "eval_nll")].value == pytest.approx(rows[(best, "eval_nll")].value)
    assert rows[("nz@best", "eval_nll")].n == 20 and (_system("nz", top * up**2), "eval_nll") not in rows
    assert result.flags["best_lr"]["zero"] == pytest.approx(top * up) and result.flags["lr_still_on_edge"] == {}
    search = result.tables["lr_search"]
    assert len(search) == len(cfg.inits) * (len(cfg.lrs) + 2) and sum(r["extension"] for r in search) == 6
    assert [r["lr"] for r in search if r["chosen"]] == pytest.approx([top * up] * 3)
    assert not result.flags["fragile_claims"]

    capped = NonZeroLoRAConfig(n_seeds=3, eval_items=20, lr_max_extensions=1)
    result, searches, _ = _fake_result(capped, train, seeds)
    assert all(f.chosen == pytest.approx(top * up) and f.edge == "top" for f in searches.values())
    assert result.flags["lr_still_on_edge"] == {m: "top" for m in capped.inits}
    fragile = [c for c in result.claims if c.text.startswith("FRAGILE")]
    assert fragile and all(not c.gate and "best lr" in c.text for c in fragile)
    assert len(fragile) == 2  # nz vs zero at their best lrs; nz vs nz_reset at nz's best lr


def _system(mode: str, lr: float) -> str:
    """The experiment's system name of (init, lr)."""
    from lmlab.methods.adaptation.nonzero_lora.experiment import system

    return system(mode, lr)
