"""Invariants of d_reft: D-LoReFT with sigma 0 is LoReFT, the identity edit, orthonormal R, gradients only into the
intervention, positions, KV-cached option scoring, save/load, and one-line errors on bad input."""

from __future__ import annotations

import random

import pytest
import torch

from lmlab.core.inference.hooks import HookPoint
from lmlab.methods.adaptation.d_reft.method import (
    DLoreftIntervention,
    InterventionHandle,
    LoreftIntervention,
    ReftConfig,
    attach_interventions,
    make_intervention,
    option_logprobs,
    parse_positions,
    positions_from_mask,
    train_intervention,
)
from lmlab.methods.adaptation.d_reft.task import (
    CONTINENT_OPTIONS,
    HELDOUT_TEMPLATES,
    TRAIN_TEMPLATES,
    accepted_indices,
    render,
    typo,
)

D, R = 64, 4


def _pair(seed: int = 0, **kw):
    """A D-LoReFT with random non-trivial weights and a LoReFT with the same R, W, b."""
    torch.manual_seed(seed)
    div = DLoreftIntervention(D, R, **kw)
    with torch.no_grad():
        div.learned_source.weight.normal_(0, 0.3)
        div.learned_source.bias.normal_(0, 0.3)
        div.logvar_network.weight.normal_(0, 0.3)
    liv = LoreftIntervention(D, R)
    missing, unexpected = liv.load_state_dict(div.state_dict(), strict=False)
    assert not missing and all(k.startswith("logvar_network") for k in unexpected)
    return div, liv


def test_sigma_zero_equals_loreft_exactly():
    div, liv = _pair(sigma_clamp=(0.0, 0.0))
    div.train()  # sampling on: sigma is clamped to exactly 0
    h = torch.randn(3, 7, D)
    assert torch.equal(div(h), liv(h))


def test_mean_at_eval_equals_loreft_exactly_and_sampling_differs():
    div, liv = _pair(sample_at_eval=False)
    div.eval()
    h = torch.randn(5, D)
    assert torch.equal(div(h), liv(h))
    div.sample_at_eval = True
    out = div(h)
    assert not torch.equal(out, liv(h))
    # the sampled edit lives in R's row space: the orthogonal complement is untouched
    r = div.R.detach()
    resid = (out - liv(h)) - (out - liv(h)) @ r.T @ r
    assert resid.abs().max() < 1e-5


def test_noise_is_sigma_times_eps_in_the_subspace():
    div, liv = _pair()
    div.train()
    h = torch.randn(4, D)
    eps = torch.randn(4, R)
    std, _ = div.sigma(h)
    std = std.detach()
    expected = liv(h) + (std * eps) @ div.R
    torch.testing.assert_close(div(h, eps=eps), expected, rtol=1e-5, atol=1e-6)
    assert float(std.min()) >= 0.001 - 1e-6 and float(std.max()) <= 0.2 + 1e-6


def test_identity_loreft_is_exactly_the_identity():
    liv = LoreftIntervention(D, R).set_identity()
    r = liv.R.detach()
    torch.testing.assert_close(r @ r.T, torch.eye(R), atol=1e-5, rtol=0)
    h = torch.randn(2, 9, D)
    assert torch.equal(liv(h), h)


def test_identity_on_the_model_leaves_logits_unchanged(tiny_llama):
    ids = torch.randint(3, 250, (2, 9))
    with torch.no_grad():
        ref = tiny_llama(input_ids=ids).logits
    with attach_interventions(tiny_llama, ReftConfig(0, R, "f3+l3"), LoreftIntervention(D, R).set_identity()) as h:
        h.set_locations(positions_from_mask("f3+l3", torch.ones_like(ids)), ids.shape[1])
        with torch.no_grad():
            out = tiny_llama(input_ids=ids).logits
    assert torch.equal(out, ref)


def test_hook_touches_only_the_requested_positions():
    liv = LoreftIntervention(D, R)
    with torch.no_grad():
        liv.learned_source.bias.fill_(1.0)
    cfg = ReftConfig(0, R, "f2+l1")
    hd = InterventionHandle(model=torch.nn.Identity(), config=cfg, interventions=[liv])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    locs = positions_from_mask("f2+l1", mask)
    hd.set_locations(locs, 7)
    x = torch.randn(2, 7, D)
    out = hd.hook_fn(x, hook=HookPoint(name="blocks.0.hook_resid_post", layer=0))
    changed = (out - x).abs().sum(-1) > 0
    assert changed.tolist() == [[False, False, True, True, False, False, True], [True, True] + [False] * 4 + [True]]
    # a forward of another length (a KV-cached decoding step) is left alone
    assert hd.hook_fn(torch.randn(2, 1, D), hook=HookPoint(name="blocks.0.hook_resid_post", layer=0)) is None


def test_generate_edits_the_prompt_pass_only(tiny_llama, tiny_tokenizer):
    class Counting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.calls = LoreftIntervention(D, R), []

        def forward(self, h):
            self.calls.append(h.shape[0])
            return self.inner(h)

    iv = Counting()
    enc = tiny_tokenizer(["continent of fr"], return_tensors="pt")
    with attach_interventions(tiny_llama, ReftConfig(0, R, "f2+l2"), iv) as hd:
        hd.set_locations(positions_from_mask("f2+l2", enc["attention_mask"]), enc["input_ids"].shape[1])
        with torch.no_grad():
            out = tiny_llama.generate(**enc, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert out.shape[1] > enc["input_ids"].shape[1]
    assert iv.calls == [4]  # one call, on the prompt pass, at the 2 + 2 prompt positions


def test_positions_follow_pyreft_and_padding_side():
    assert parse_positions("f3+l3") == (3, 3) and parse_positions("f1") == (1, 0) and parse_positions("l5") == (0, 5)
    left = torch.tensor([[0, 0, 1, 1, 1, 1, 1]])
    right = torch.tensor([[1, 1, 1, 1, 1, 0, 0]])
    pl, pr = positions_from_mask("f3+l3", left), positions_from_mask("f3+l3", right)
    # n = 5 caps both groups at n // 2 = 2 (pyreft's get_intervention_locations); unused slots are -1
    assert pl.tolist() == [[2, 3, -1, 5, 6, -1]]
    assert pr.tolist() == [[0, 1, -1, 3, 4, -1]]
    # a prompt inside a longer (prompt + answer) row: only the prompt's tokens
    assert positions_from_mask("f1+l1", right, [3]).tolist() == [[0, 2]]


def _tiny_pairs(tok, n=6):
    pairs = []
    for i in range(n):
        prompt = tok(f"Q{i}: continent of x{i}?").input_ids
        pairs.append((prompt, tok(" Asia" if i % 2 else " Africa", add_special_tokens=False).input_ids))
    return pairs


@pytest.mark.parametrize("kind", ["loreft", "d_loreft"])
def test_gradients_reach_only_the_intervention(tiny_llama, tiny_tokenizer, kind):
    torch.manual_seed(0)
    iv = make_intervention(kind, D, R)
    before_model = {k: v.detach().clone() for k, v in tiny_llama.state_dict().items()}
    before_iv = {k: v.detach().clone() for k, v in iv.state_dict().items()}
    with attach_interventions(tiny_llama, ReftConfig(1, R, "f2+l2"), iv) as hd:
        stats = train_intervention(tiny_llama, hd, _tiny_pairs(tiny_tokenizer), steps=3, batch_size=4, lr=1e-2,
                                   generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert len(stats.losses) == 3 and all(torch.isfinite(torch.tensor(stats.losses)))
    assert all(p.grad is None for p in tiny_llama.parameters())
    after = tiny_llama.state_dict()
    assert all(torch.equal(before_model[k], after[k]) for k in before_model)
    changed = {k for k, v in iv.state_dict().items() if not torch.equal(v, before_iv[k])}
    assert "learned_source.weight" in changed and any("rotate_layer" in k for k in changed)
    if kind == "d_loreft":
        assert "logvar_network.weight" in changed
    r = iv.R.detach()
    torch.testing.assert_close(r @ r.T, torch.eye(R), atol=1e-4, rtol=0)  # still orthonormal after training


def test_training_lowers_the_loss(tiny_llama, tiny_tokenizer):
    torch.manual_seed(1)
    iv = LoreftIntervention(D, R)
    with attach_interventions(tiny_llama, ReftConfig(0, R, "f3+l3"), iv) as hd:
        stats = train_intervention(tiny_llama, hd, _tiny_pairs(tiny_tokenizer), steps=25, batch_size=6, lr=2e-2,
                                   warmup_ratio=0.0, generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert stats.losses[-1] < 0.8 * stats.losses[0]


def test_kv_option_scoring_equals_scoring_each_sequence(tiny_llama, tiny_tokenizer):
    torch.manual_seed(2)
    iv = LoreftIntervention(D, R)
    with torch.no_grad():
        iv.learned_source.weight.normal_(0, 0.5)
    prompts = [tiny_tokenizer(t).input_ids for t in ("hello there", "abc", "continent of fr")]
    opts = [[tiny_tokenizer(x, add_special_tokens=False).input_ids for x in (" A", " Bq", " Ccc")]] * 3
    with attach_interventions(tiny_llama, ReftConfig(0, R, "f2+l2"), iv) as hd:
        kv = option_logprobs(tiny_llama, hd, prompts, opts, batch_size=2)
        for p, os_, row in zip(prompts, opts, kv):
            for o, got in zip(os_, row):
                ids = torch.tensor([p + o])
                hd.set_locations(positions_from_mask("f2+l2", torch.ones_like(ids), [len(p)]), ids.shape[1])
                with torch.no_grad():
                    lp = torch.log_softmax(tiny_llama(input_ids=ids).logits[0].float(), -1)
                want = float(sum(lp[len(p) - 1 + j, o[j]] for j in range(len(o))))
                assert got == pytest.approx(want, abs=1e-4)


def test_sampling_is_reproducible_with_a_generator():
    div, _ = _pair()
    div.eval()
    h = torch.randn(3, D)
    div.generator = torch.Generator().manual_seed(5)
    a = div(h)
    div.generator = torch.Generator().manual_seed(5)
    assert torch.equal(a, div(h))


def test_kl_term_only_when_beta_positive():
    div, _ = _pair(kl_beta=0.1)
    div.train()
    div(torch.randn(4, D))
    kl = div.kl_loss()
    assert kl.requires_grad and float(kl.detach()) > 0
    off, _ = _pair()
    off.train()
    off(torch.randn(4, D))
    assert float(off.kl_loss()) == 0.0


def test_save_load_roundtrip(tmp_path):
    from lmlab.methods.adaptation.d_reft.storage import load_interventions, save_interventions

    div, _ = _pair(sample_at_eval=False)
    cfg = ReftConfig(3, R, "f2+l2")
    save_interventions(tmp_path / "iv", cfg, div)
    cfg2, (div2,) = load_interventions(tmp_path / "iv")
    assert cfg2 == cfg and isinstance(div2, DLoreftIntervention) and not div2.sample_at_eval
    div.eval()
    h = torch.randn(2, D)
    assert torch.equal(div(h), div2(h))


def test_task_transforms():
    assert set(TRAIN_TEMPLATES).isdisjoint(HELDOUT_TEMPLATES)
    text = render(TRAIN_TEMPLATES[0], "France")
    assert typo(text, 0.0, random.Random(0)) == text
    a, b = typo(text, 0.3, random.Random(1)), typo(text, 0.3, random.Random(1))
    assert a == b and a != text and a.endswith("A:")
    assert render("{c} is", "the Bahamas") == "The Bahamas is"

    class Ex:
        id, target, meta = "x", "Europe", {"answers": ["Europe", "Asia"]}

    assert accepted_indices(Ex()) == (CONTINENT_OPTIONS.index("Asia"), CONTINENT_OPTIONS.index("Europe"))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: parse_positions("x3"), "positions must look like"),
        (lambda: parse_positions("f0+l0"), "at least one token"),
        (lambda: ReftConfig(-1), "layer must be an int >= 0"),
        (lambda: ReftConfig(0, component="attention_output"), "component must be one of"),
        (lambda: DLoreftIntervention(D, R, sigma_clamp=(0.3, 0.1)), "sigma_clamp must be"),
        (lambda: DLoreftIntervention(D, R, logvar_clamp=(1.0, -1.0)), "logvar_clamp must be"),
        (lambda: DLoreftIntervention(D, R, kl_beta=-1.0), "kl_beta must be >= 0"),
        (lambda: DLoreftIntervention(D, 0), "rank must be in"),
        (lambda: make_intervention("lora", D, R), "kind must be 'loreft' or 'd_loreft'"),
        (lambda: typo("abc", 1.5, random.Random(0)), "typo rate must be in"),
    ],
)
def test_bad_input_raises_one_line_errors(make, match):
    with pytest.raises(ValueError, match=match) as e:
        make()
    assert "\n" not in str(e.value)


def test_bad_model_inputs(tiny_llama, tiny_tokenizer):
    with pytest.raises(ValueError, match=r"layer must be in \[0, 1\]"):
        attach_interventions(tiny_llama, ReftConfig(5, R), LoreftIntervention(D, R))
    with attach_interventions(tiny_llama, ReftConfig(0, R), LoreftIntervention(D, R)) as hd:
        with pytest.raises(ValueError, match="needs at least one"):
            train_intervention(tiny_llama, hd, [], steps=1)
        with pytest.raises(ValueError, match="empty prompt or answer"):
            train_intervention(tiny_llama, hd, [([1, 2], [])], steps=1)
        with pytest.raises(ValueError, match="expected 2 non-empty options"):
            option_logprobs(tiny_llama, hd, [[1, 2], [3]], [[[4], [5]], [[4]]])
    with pytest.raises(ValueError, match="prompt length must be in"):
        positions_from_mask("f1", torch.ones(1, 3, dtype=torch.long), [4])


@pytest.mark.parametrize(
    "over, match",
    [
        ({"layers": []}, "layers must be a non-empty list"),
        ({"layers": [0, 0]}, "must not repeat"),
        ({"steps": 0}, "steps must be in"),
        ({"positions": "middle"}, "positions must look like"),
        ({"sigma_clamp": [0.5, 0.1]}, "sigma_clamp must be"),
        ({"noise_scales": [0.0]}, "noise_scales entries must be numbers > 0"),
        ({"typo_rate": 2.0}, "typo_rate must be in"),
    ],
)
def test_config_validation(over, match):
    from lmlab.methods.adaptation.d_reft.config import DReftConfig

    with pytest.raises(ValueError, match=match):
        DReftConfig(**over)


def test_layer_beyond_the_model_is_refused(tmp_path):
    from lmlab.runner import run_method

    with pytest.raises(ValueError, match=r"layers entries must be < 2"):
        run_method("d_reft", preset="smoke", model="tiny-llama", folder=tmp_path / "r", show_progress=False,
                   raise_errors=True, threads=1, layers=[5], write=False)  # fmt: skip


def test_default_recipe_trains_long_enough_and_claims_start_with_the_training_gate():
    """Issue 34 / review defect 7: 20 steps left LoReFT indistinguishable from the bare model, so the D-vs-pointwise
    check had nothing to separate. The default now trains >= 60 steps, and the first claim, gated, is that the trained
    LoReFT moved away from the bare model."""
    from lmlab.methods.adaptation.d_reft.config import DReftConfig
    from lmlab.methods.adaptation.d_reft.experiment import _claims

    cfg = DReftConfig()
    assert cfg.steps >= 60
    assert cfg.seeds >= 2 and len(cfg.layers) >= 2  # the replicate and the early-vs-late comparison are kept
    claims = _claims(cfg, ["paraphrase", "typo", "noise_1"])
    first = claims[0]
    assert first.gate and (first.method, first.baseline, first.direction) == ("loreft", "base", ">")
    assert first.metric == f"gold_logp_clean_L{cfg.layers[0]}"
    gated = [c for c in claims if c.gate]
    assert gated[0] is first and len(gated) == 2  # the training gate, then D-LoReFT above LoReFT at layer 0


def test_smoke_run_records_the_gate_metric_and_the_bare_model_row_first(tmp_path):
    from lmlab.runner import run_method

    result = run_method("d_reft", preset="smoke", model="tiny-llama", folder=tmp_path / "r", show_progress=False,
                        raise_errors=True, threads=1, write=False)  # fmt: skip
    m = {(r.system, r.metric): r.value for r in result.metrics}
    for system in ("base", "loreft", "d_loreft"):
        assert m[(system, "gold_logp_clean_L0")] <= 0.0  # a log-probability normalised over the options
    assert result.claims[0].baseline == "base" and result.claims[0].gate
    for name in ("accuracy", "sigma_vs_accuracy"):
        assert result.tables[name][0]["system"] == "base", name
