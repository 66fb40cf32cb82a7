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

    for kw, match in [({"claim_alphas": [0.6]}, "must be among alphas"), ({"alphas": [1.5]}, "numbers in"),
                      ({"claim_alphas": [1.0], "alphas": [1.0]}, "must be < 1"), ({"noise": 0.0}, "noise must be"),
                      ({"merges": ["slerp"]}, "merges entries"), ({"target_modules": ["embed_tokens"]}, "subset"),
                      ({"block_size": 0}, "block_size")]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            CrossModalMergeConfig(**kw)


# ---------------------------------------------------------------------------------------------------------------
# issue 34: task-vector norms, the training gates, α on dev off the grid's edge, the base row


def test_task_vector_norms_by_hand():
    from lmlab.methods.adaptation.cross_modal_merge.method import task_vector_norms

    # τ_a = (3, 0 | 0, 0), τ_b = (0, 4 | 0, 0) plus a tensor only τ_b has (a key missing from τ_a is no change)
    ta = {"model.layers.0.mlp.up_proj.weight": torch.tensor([[3.0, 0.0], [0.0, 0.0]])}
    tb = {"model.layers.0.mlp.up_proj.weight": torch.tensor([[0.0, 4.0], [0.0, 0.0]]),
          "model.layers.1.mlp.up_proj.weight": torch.tensor([[0.0, 0.0], [0.0, 3.0]])}  # fmt: skip
    out = task_vector_norms(ta, tb, [1.0, 0.5, 0.0])
    assert out["norm_a"] == pytest.approx(3.0) and out["norm_b"] == pytest.approx(5.0)
    assert out["ratio"] == pytest.approx(0.6) and out["cosine"] == pytest.approx(0.0)
    one, half, zero = out["by_alpha"]
    assert one["merged_norm"] == pytest.approx(3.0) and one["share_b"] == 0.0 and one["share_a"] == pytest.approx(1)
    # 0.5 τ_a + 0.5 τ_b = (1.5, 2 | 0, 0) and (0, 0 | 0, 1.5): norm sqrt(2.25 + 4 + 2.25)
    assert half["merged_norm"] == pytest.approx(8.5**0.5)
    assert half["share_b"] == pytest.approx(2.5 / 8.5**0.5) and half["b_to_a"] == pytest.approx(2.5 / 1.5)
    assert zero["merged_norm"] == pytest.approx(5.0) and zero["share_b"] == pytest.approx(1.0)
    # parallel vectors: the merged norm is the weighted sum, not the root of the sum of squares
    par = task_vector_norms(ta, {k: 2 * v for k, v in ta.items()}, [0.9])
    assert par["cosine"] == pytest.approx(1.0)
    assert par["by_alpha"][0]["merged_norm"] == pytest.approx(0.9 * 3 + 0.1 * 6)
    with pytest.raises(ValueError, match="share a base"):
        task_vector_norms(ta, {"model.layers.0.mlp.up_proj.weight": torch.zeros(3, 2)})


def test_task_vector_norms_match_the_weights_of_the_merged_tiny_model(tiny_llama, tiny_tokenizer):
    """The norms the experiment reports, from the LoRA task vectors, equal those of θ − θ_base read back from the
    model's own state dict after applying τ_vlm, τ_reason and each merge (a hand computation on the real weights)."""
    from peft import LoraConfig

    from lmlab.methods.adaptation.cross_modal_merge.method import task_vector_norms
    from lmlab.methods.adaptation.cross_modal_merge.proxy import (
        DigitScorer,
        apply_task_vector,
        dense_task_vector,
        train_lora,
    )

    model = copy.deepcopy(tiny_llama)
    for p in model.parameters():
        p.requires_grad_(False)
    scorer = DigitScorer(model, tiny_tokenizer, batch_size=4)
    torch.manual_seed(0)
    proj = GlyphProjector(25, model.config.hidden_size, 2)
    cfg = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj", "up_proj"], lora_dropout=0.0)
    vstate, _ = train_lora(model, scorer, _glyph_items("perception", "read", 4), cfg, steps=3, batch=2, lr=1e-2,
                           seed=0, projector=proj)  # fmt: skip
    rstate, _ = train_lora(model, scorer, _glyph_items("text_reason", "sum_mod10", 4), cfg, steps=3, batch=2,
                           lr=1e-2, seed=1)  # fmt: skip
    tau_v, tau_r = dense_task_vector(vstate), dense_task_vector(rstate)
    base_sd = {k: v.detach().clone().double() for k, v in model.state_dict().items()}
    base = {k: model.get_parameter(k).detach().clone() for k in tau_v}

    def delta(tau):  # θ − θ_base over the whole state dict, read from the model: (all parameters,)
        apply_task_vector(model, base, tau)
        sd = model.state_dict()
        return torch.cat([(sd[k].double() - base_sd[k]).flatten() for k in base_sd])

    d_v, d_r = delta(tau_v), delta(tau_r)
    out = task_vector_norms(tau_v, tau_r, [0.9, 0.5])
    assert out["norm_a"] == pytest.approx(float(d_v.norm()), rel=1e-5)
    assert out["norm_b"] == pytest.approx(float(d_r.norm()), rel=1e-5)
    assert out["ratio"] == pytest.approx(float(d_v.norm() / d_r.norm()), rel=1e-5)
    assert out["cosine"] == pytest.approx(float(d_v @ d_r / (d_v.norm() * d_r.norm())), abs=1e-5)
    for row in out["by_alpha"]:
        a = row["alpha"]
        d_m = delta(linear_merge(tau_v, tau_r, a, exclude=()))
        assert row["merged_norm"] == pytest.approx(float(d_m.norm()), rel=1e-5)
        assert row["share_b"] == pytest.approx(float((1 - a) * d_r.norm() / d_m.norm()), rel=1e-5)
    apply_task_vector(model, base, {})


def test_choose_alpha_breaks_dev_ties_towards_the_paper_and_flags_a_grid_edge():
    from lmlab.methods.adaptation.cross_modal_merge.experiment import choose_alpha

    # the old rule (ties: the larger α) picked the top edge of the grid on a tie
    assert choose_alpha({0.95: 0.25, 0.9: 0.25, 0.8: 0.25, 0.5: 0.25}) == (0.9, False)
    assert choose_alpha({0.95: 0.2, 0.9: 0.25, 0.8: 0.25}) == (0.9, False)
    assert choose_alpha({0.9: 0.2, 0.8: 0.3, 0.7: 0.3, 0.5: 0.1}) == (0.8, False)  # tie: the closer to 0.9
    assert choose_alpha({0.95: 0.2, 0.9: 0.25, 0.8: 0.3, 0.5: 0.1}) == (0.8, False)  # interior winner
    # a strict winner at either edge: the optimum may lie beyond the grid
    assert choose_alpha({0.95: 0.2, 0.9: 0.25, 0.5: 0.4}) == (0.5, True)
    assert choose_alpha({0.95: 0.4, 0.9: 0.25, 0.5: 0.2}) == (0.95, True)
    assert choose_alpha({0.9: float("nan")}) == (0.9, False)  # one candidate: no dev pass


def test_default_grid_has_the_papers_alpha_inside_and_claims_start_with_the_training_gates():
    from lmlab.methods.adaptation.cross_modal_merge.config import CrossModalMergeConfig
    from lmlab.methods.adaptation.cross_modal_merge.experiment import _claims

    cfg = CrossModalMergeConfig()
    assert min(cfg.claim_alphas) < 0.9 < max(cfg.claim_alphas)  # 0.9 is no edge of the dev grid
    claims = _claims(cfg)
    gated = [c for c in claims if c.gate]
    assert [(c.metric, c.method, c.baseline) for c in gated] == [
        ("perception_acc", "vlm", "base"),  # the VLM-proxy's LoRA learned to read (same projector as the base)
        ("text_reason_acc", "reason", "base"),  # the reasoning LoRA learned the skill
        ("mm_reason_acc", "merged", "vlm"),  # then the transfer
    ]
    assert claims[0] is gated[0] and claims[1] is gated[1]  # shown first


def test_smoke_run_reports_the_norm_rows_and_the_base_on_every_probe(tmp_path):
    from lmlab.runner import run_method

    result = run_method("cross_modal_merge", preset="smoke", model="tiny-llama", folder=tmp_path / "r",
                        show_progress=False, raise_errors=True, threads=1, write=False)  # fmt: skip
    m = {(r.system, r.metric): r.value for r in result.metrics}
    for metric in ("perception_acc", "mm_reason_acc", "text_reason_acc"):
        assert ("base", metric) in m, metric  # the untrained row of every probe, the gated one included
    assert m[("vlm", "tau_norm_ratio")] == pytest.approx(m[("vlm", "tau_norm")] / m[("reason", "tau_norm")])
    rows = {r["alpha"]: r for r in result.tables["merge_norms"]}
    a = result.flags["chosen_alpha"]
    assert rows[a]["chosen"] and m[("merged", "tau_reason_share")] == pytest.approx(rows[a]["reason_share"])
    assert rows[a]["reason_part"] == pytest.approx((1 - a) * m[("reason", "tau_norm")])
    assert rows[1.0]["merged_norm"] == pytest.approx(m[("vlm", "tau_norm")])
    assert rows[0.0]["merged_norm"] == pytest.approx(m[("reason", "tau_norm")])
    assert result.flags["alpha_at_grid_edge"] is False
    assert [c.gate for c in result.claims[:3]] == [True, True, True]
