"""Invariants of cross-modal merging (Chen et al., ICML 2025) and its glyph proxy (tiny tensors, tiny llama)."""

from __future__ import annotations

import copy

import pytest
import torch

from lmlab.methods.adaptation.cross_modal_merge.method import (
    GlyphProjector,
    dare_merge,
    effective_blocks,
    layer_blocks,
    layer_index,
    layer_knockout,
    layer_norms,
    layerswap_merge,
    linear_merge,
    task_vector,
    ties_merge,
)


def _sd(seed: int, n_layers: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    sd = {"model.embed_tokens.weight": torch.randn(11, 4, generator=g),
          "lm_head.weight": torch.randn(11, 4, generator=g),
          "model.norm.weight": torch.randn(4, generator=g)}  # fmt: skip
    for i in range(n_layers):
        sd[f"model.layers.{i}.self_attn.q_proj.weight"] = torch.randn(4, 4, generator=g)
        sd[f"model.layers.{i}.mlp.up_proj.weight"] = torch.randn(6, 4, generator=g)
    return sd


def test_layer_index_parses_layers_not_the_first_integer():
    assert layer_index("model.layers.12.mlp.up_proj.weight") == 12
    assert layer_index("model.layers.3.self_attn.q_proj.weight") == 3
    # merge.py's first-integer rule would read 2 here
    assert layer_index("vision2.model.layers.7.mlp.down_proj.weight") == 7
    assert layer_index("model.embed_tokens.weight") is None
    assert layer_index("model.norm.weight") is None


def test_alpha_one_gives_the_vlm_exactly_and_zero_the_reasoner():
    a, b = _sd(0), _sd(1)
    m1 = linear_merge(a, b, 1.0)
    assert all(torch.equal(m1[k], a[k]) for k in a)
    m0 = linear_merge(a, b, 0.0)
    for k in a:
        want = a[k] if k in ("model.embed_tokens.weight", "lm_head.weight") else b[k]
        assert torch.equal(m0[k], want)


def test_excluded_keys_keep_the_vlm_values():
    a, b = _sd(0), _sd(1)
    m = linear_merge(a, b, 0.3)
    assert torch.equal(m["model.embed_tokens.weight"], a["model.embed_tokens.weight"])
    assert torch.equal(m["lm_head.weight"], a["lm_head.weight"])
    k = "model.layers.1.mlp.up_proj.weight"
    assert torch.allclose(m[k], 0.3 * a[k] + 0.7 * b[k])
    # the final norm has no layer index and is merged (merge.py merges every non-excluded key)
    assert torch.allclose(m["model.norm.weight"], 0.3 * a["model.norm.weight"] + 0.7 * b["model.norm.weight"])


def test_merge_in_task_vector_space_equals_merge_of_models():
    base, a, b = _sd(0), _sd(1), _sd(2)
    ta, tb = task_vector(a, base, exclude=()), task_vector(b, base, exclude=())
    direct = linear_merge(a, b, 0.8, exclude=())
    via_tau = linear_merge(ta, tb, 0.8, exclude=())
    for k in direct:
        assert torch.allclose(direct[k], base[k] + via_tau[k], atol=1e-6)
    # = θ_base + α τ_vlm + (1 − α) τ_reason
    k = "model.layers.0.self_attn.q_proj.weight"
    assert torch.allclose(direct[k], base[k] + 0.8 * ta[k] + 0.2 * tb[k], atol=1e-6)


def test_alpha_schedule_and_layerswap():
    a, b = _sd(0, n_layers=4), _sd(1, n_layers=4)
    m = linear_merge(a, b, 0.5, alpha_schedule={2: 1.0})
    k2, k3 = "model.layers.2.mlp.up_proj.weight", "model.layers.3.mlp.up_proj.weight"
    assert torch.equal(m[k2], a[k2].float())
    assert torch.allclose(m[k3], 0.5 * a[k3] + 0.5 * b[k3])
    ls = layerswap_merge(a, b, 0.9, base_layer_num=1)
    for i in range(4):
        k = f"model.layers.{i}.self_attn.q_proj.weight"
        want = a[k] if i <= 1 else 0.9 * a[k] + 0.1 * b[k]
        assert torch.allclose(ls[k], want)


def test_ties_and_dare_match_peft_merge_utils():
    from peft.utils import merge_utils

    base, a, b = _sd(0), _sd(1), _sd(2)
    k = "model.layers.0.mlp.up_proj.weight"
    t = ties_merge(a, b, base, (1.6, 0.2), 0.5)
    want = base[k] + merge_utils.ties([a[k] - base[k], b[k] - base[k]], torch.tensor([1.6, 0.2]), 0.5)
    assert torch.allclose(t[k], want)
    assert torch.equal(t["lm_head.weight"], a["lm_head.weight"])
    d1 = dare_merge(a, b, base, (0.9, 0.1), 0.5, seed=3)
    d2 = dare_merge(a, b, base, (0.9, 0.1), 0.5, seed=3)
    assert all(torch.equal(d1[x], d2[x]) for x in d1)  # seeded drops
    # density 1: DARE-linear is task arithmetic (no drop, no rescale)
    full = dare_merge(a, b, base, (0.9, 0.1), 1.0)
    assert torch.allclose(full[k], base[k] + 0.9 * (a[k] - base[k]) + 0.1 * (b[k] - base[k]), atol=1e-6)


def test_dare_rescale_is_assigned():
    """The official repo's copy of random_pruning drops the 1/density rescale; peft 0.21.2 assigns it."""
    base = {"model.layers.0.mlp.up_proj.weight": torch.zeros(200, 200)}
    a = {"model.layers.0.mlp.up_proj.weight": torch.ones(200, 200)}
    d = dare_merge(a, base, base, (1.0, 0.0), 0.25, seed=0)["model.layers.0.mlp.up_proj.weight"]
    kept = d[d != 0]
    assert torch.allclose(kept, torch.full_like(kept, 4.0))  # 1 / density
    assert 0.2 < kept.numel() / d.numel() < 0.3


def test_knockout_changes_only_that_layers_tensors():
    base, theta = _sd(0), _sd(1)
    ko = layer_knockout(theta, base, [1])
    for k in theta:
        if layer_index(k) == 1:
            assert torch.equal(ko[k], base[k])
        else:
            assert ko[k] is theta[k]
    # a knockout resets to the base, never to zero
    assert not torch.equal(ko["model.layers.1.mlp.up_proj.weight"], torch.zeros(6, 4))


def test_blocks_norms_and_spread():
    assert layer_blocks(30, 3) == [list(range(i, i + 3)) for i in range(0, 30, 3)]
    assert layer_blocks(5, 2) == [[0, 1], [2, 3], [4]]
    tau = {"model.layers.1.mlp.up_proj.weight": torch.full((2, 2), 3.0), "model.norm.weight": torch.ones(4)}
    assert layer_norms(tau, 3) == [0.0, 6.0, 0.0]
    assert effective_blocks([1.0, 0.0, 0.0]) == 1.0
    assert effective_blocks([1.0, 1.0, 1.0, 1.0]) == pytest.approx(4.0)
    assert effective_blocks([-1.0, 0.0]) == 0.0


def test_projector_shapes():
    proj = GlyphProjector(25, 8, n_tokens=3)
    out = proj(torch.zeros(5, 25))
    assert out.shape == (5, 3, 8)
    with pytest.raises(ValueError, match="pixels must have shape"):
        proj(torch.zeros(5, 24))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: linear_merge({}, {}, 0.5), "theta_a is empty"),
        (lambda: linear_merge(_sd(0), {"model.norm.weight": torch.ones(4)}, 0.5), "theta_b has no tensor"),
        (lambda: linear_merge(_sd(0), _sd(1), float("nan")), "alpha must be a finite number"),
        (lambda: layerswap_merge(_sd(0), _sd(1), 0.9, base_layer_num=-3), "base_layer_num must be"),
        (lambda: ties_merge(_sd(0), _sd(1), _sd(2), (1.0, 0.2), 0.0), "density must be in"),
        (lambda: ties_merge(_sd(0), _sd(1), _sd(2), (1.0,), 0.2), "weights must be"),
        (lambda: layer_knockout(_sd(0), _sd(1), []), "layers is empty"),
        (lambda: layer_knockout(_sd(0), _sd(1), [9]), "no tensor of theta"),
        (lambda: layer_blocks(30, 0), "block_size must be"),
    ],
)
def test_bad_input_is_one_line_value_error(call, match):
    with pytest.raises(ValueError, match=match) as e:
        call()
    assert "\n" not in str(e.value)


def test_shape_mismatch_is_rejected():
    a, b = _sd(0), _sd(1)
    b["model.layers.0.mlp.up_proj.weight"] = torch.zeros(3, 4)
    with pytest.raises(ValueError, match="share a base"):
        linear_merge(a, b, 0.5)


# ---------------------------------------------------------------------------------------------------------------
# the proxy on the tiny llama


def _glyph_items(probe, task, n=4):
    from lmlab.data.taskbank import tasks
    from lmlab.methods.adaptation.cross_modal_merge.proxy import build_items

    return build_items(tasks("glyphs", n, seed=0, split="test", task=task, noise=0.05, n_choices=0), probe)


def test_scorer_matches_full_vocabulary_loglikelihood(tiny_llama, tiny_tokenizer):
    from lmlab.methods.adaptation.cross_modal_merge.proxy import DigitScorer

    torch.manual_seed(0)
    scorer = DigitScorer(tiny_llama, tiny_tokenizer, batch_size=2)
    items = _glyph_items("text_reason", "sum_mod10", 3)
    correct, lp = scorer.score(items)
    assert len(correct) == 3 and all(c in (0.0, 1.0) for c in correct) and all(v <= 0 for v in lp)
    # text items: the same log-probs as a plain forward of the token ids (batching and padding change nothing)
    with torch.no_grad():
        for it, v in zip(items, lp):
            ids = list(scorer.bos)
            for p in it.pieces:
                ids += tiny_tokenizer(p, add_special_tokens=False)["input_ids"]
            ids += scorer.prefix
            logits = tiny_llama(input_ids=torch.tensor([ids])).logits[0, -1]
            d = torch.log_softmax(torch.log_softmax(logits.float(), -1)[scorer.digit_ids], -1)
            assert d[it.answer].item() == pytest.approx(v, abs=1e-4)


def test_images_need_a_projector(tiny_llama, tiny_tokenizer):
    from lmlab.methods.adaptation.cross_modal_merge.proxy import DigitScorer

    scorer = DigitScorer(tiny_llama, tiny_tokenizer)
    with pytest.raises(ValueError, match="no projector"):
        scorer.score(_glyph_items("perception", "read", 2))


def test_train_lora_restores_the_model_and_changes_parameters(tiny_llama, tiny_tokenizer):
    from peft import LoraConfig

    from lmlab.methods.adaptation.cross_modal_merge.proxy import (
        DigitScorer,
        apply_task_vector,
        dense_task_vector,
        train_lora,
    )

    model = copy.deepcopy(tiny_llama)
    for p in model.parameters():
        p.requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    scorer = DigitScorer(model, tiny_tokenizer, batch_size=4)
    torch.manual_seed(0)
    proj = GlyphProjector(25, model.config.hidden_size, 2)
    proj0 = {k: v.clone() for k, v in proj.state_dict().items()}
    items = _glyph_items("perception", "read", 4)
    cfg = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj", "up_proj"], lora_dropout=0.0)
    state, losses = train_lora(model, scorer, items, cfg, steps=3, batch=2, lr=1e-2, seed=0, projector=proj)
    assert len(losses) == 3
    after = model.state_dict()
    assert set(after) == set(before) and all(torch.equal(after[k], before[k]) for k in before)  # LoRA removed
    assert any(not torch.equal(proj.state_dict()[k], proj0[k]) for k in proj0)  # the projector trained
    tau = dense_task_vector(state)
    assert tau and all(layer_index(k) is not None for k in tau)
    assert any(t.abs().sum() > 0 for t in tau.values())  # B moved off zero
    base = {k: model.get_parameter(k).detach().clone() for k in tau}
    apply_task_vector(model, base, tau)
    k = next(iter(tau))
    assert torch.allclose(model.get_parameter(k), base[k] + tau[k])
    apply_task_vector(model, base, {})
    assert torch.equal(model.get_parameter(k), base[k])


def test_config_rejects_bad_values():
    from lmlab.methods.adaptation.cross_modal_merge.config import CrossModalMergeConfig

    for kw, match in [({"claim_alphas": [0.7]}, "must be among alphas"), ({"alphas": [1.5]}, "numbers in"),
                      ({"claim_alphas": [1.0], "alphas": [1.0]}, "must be < 1"), ({"noise": 0.0}, "noise must be"),
                      ({"merges": ["slerp"]}, "merges entries"), ({"target_modules": ["embed_tokens"]}, "subset"),
                      ({"block_size": 0}, "block_size")]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            CrossModalMergeConfig(**kw)
