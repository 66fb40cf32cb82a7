"""Frozen trunk + trainable top-k: exactness against the full model, gradient isolation, LoRA, merge-back."""

from __future__ import annotations

import copy

import pytest
import torch

from lmlab.core.inference.tiny import make_tiny_model
from lmlab.core.training.partial import (
    FrozenTrunk,
    logits_from_cache,
    merge_back,
    token_logps_from_cache,
    trainable_names,
)


def _left_padded_batch(seed: int = 0, t: int = 24) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 260, (3, t), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    mask[1, :11] = 0  # row 2 unpadded; t > gemma3 tiny's sliding window (16) so the sliding mask matters
    ids[mask == 0] = 0
    return ids, mask, (mask.cumsum(-1) - 1).clamp_min(0)


def _full_logits(model, ids, mask, pos):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, position_ids=pos).logits


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize(("n_layers", "k"), [(2, 1), (2, 2), (3, 1), (3, 2)])
def test_cache_plus_topk_equals_full_model(arch, n_layers, k):
    model = make_tiny_model(0, arch=arch, n_layers=n_layers)
    ids, mask, pos = _left_padded_batch()
    full = _full_logits(model, ids, mask, pos)
    trunk = FrozenTrunk(model, k)
    cache = trunk(ids, attention_mask=mask)  # default positions = cumsum(mask) - 1
    real = mask.bool()
    for topk in (trunk.reference, trunk.top_k()):
        out = logits_from_cache(topk, cache)
        assert out.shape == full.shape
        torch.testing.assert_close(out[real], full[real], atol=1e-5, rtol=0)
    # logits_to_keep slices the same numbers
    last = logits_from_cache(trunk.reference, cache, logits_to_keep=3)
    torch.testing.assert_close(last, full[:, -3:], atol=1e-5, rtol=0)


def test_token_logps_from_cache_match_full_forward():
    model = make_tiny_model(0, n_layers=2)
    ids, mask, pos = _left_padded_batch(1)
    full = torch.log_softmax(_full_logits(model, ids, mask, pos)[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    trunk = FrozenTrunk(model, 1)
    lp = token_logps_from_cache(trunk.reference, trunk(ids, attention_mask=mask))
    pair = (mask[:, 1:] * mask[:, :-1]).bool()
    torch.testing.assert_close(lp[pair], full[pair], atol=1e-5, rtol=0)
    assert bool((lp[~pair] == 0).all())


def test_gradients_reach_only_topk_parameters():
    model = make_tiny_model(0, n_layers=3)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trunk = FrozenTrunk(model, 1)
    ids, mask, _ = _left_padded_batch(2)
    cache = trunk(ids, attention_mask=mask)
    assert not cache.hidden.requires_grad
    policy = trunk.top_k()
    names = trainable_names(policy)
    assert names and all(n.startswith(("layers.0.", "norm.")) for n in names)  # the copied top block + final norm
    assert not any("head" in n or "embed" in n for n in names)  # the shared (tied) head stays frozen
    token_logps_from_cache(policy, cache).sum().backward()
    grads = {n: p.grad for n, p in policy.named_parameters()}
    assert all(g is not None and g.abs().sum() > 0 for g in grads.values())
    # nothing of the original model got a gradient, and its weights are untouched
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    # the reference has nothing to train and builds no graph
    assert list(trunk.reference.trainable_parameters()) == []
    assert not token_logps_from_cache(trunk.reference, cache).requires_grad


def _train_a_little(policy, cache, steps: int = 3) -> None:
    opt = torch.optim.SGD(list(policy.trainable_parameters()), lr=0.5)
    for _ in range(steps):
        opt.zero_grad()
        (-token_logps_from_cache(policy, cache).sum()).backward()
        opt.step()


def test_merge_back_full_forward_equals_topk_path(tmp_path):
    from transformers import AutoModelForCausalLM

    model = make_tiny_model(0, n_layers=3)
    trunk = FrozenTrunk(model, 2)
    ids, mask, pos = _left_padded_batch(3)
    cache = trunk(ids, attention_mask=mask)
    policy = trunk.top_k()
    _train_a_little(policy, cache)
    trained = logits_from_cache(policy, cache).detach()
    # training moved the policy away from the reference (so the equality below is not vacuous)
    assert (trained - logits_from_cache(trunk.reference, cache)).abs().max() > 0.1
    merged = merge_back(copy.deepcopy(model), policy)
    real = mask.bool()
    torch.testing.assert_close(_full_logits(merged, ids, mask, pos)[real], trained[real], atol=1e-5, rtol=0)
    # the original (the reference) is unchanged, and the merged model round-trips as a standard HF folder
    torch.testing.assert_close(_full_logits(model, ids, mask, pos), logits_from_cache(trunk.reference, cache))
    merged.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    torch.testing.assert_close(_full_logits(again, ids, mask, pos)[real], trained[real], atol=1e-5, rtol=0)


def test_lora_on_topk_trains_adapters_only_and_merges_back():
    from peft import LoraConfig

    model = make_tiny_model(0, n_layers=2)
    trunk = FrozenTrunk(model, 1)
    ids, mask, pos = _left_padded_batch(4)
    cache = trunk(ids, attention_mask=mask)
    torch.manual_seed(0)  # peft draws LoRA's A from the global generator
    policy = trunk.top_k(train_norm=False, lora=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    names = trainable_names(policy)
    assert names and all(n.startswith("layers.0.") and "lora_" in n for n in names)
    assert not any(k.startswith("lora.") for k in policy.state_dict())  # the blocks are listed once
    # B = 0 at init: a fresh LoRA is the identity
    torch.testing.assert_close(logits_from_cache(policy, cache), logits_from_cache(trunk.reference, cache))
    _train_a_little(policy, cache)
    trained = logits_from_cache(policy, cache).detach()
    assert (trained - logits_from_cache(trunk.reference, cache)).abs().max() > 0.1
    merged = merge_back(copy.deepcopy(model), policy)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    real = mask.bool()
    # W + BA merged vs W x + B(A x) adapted differ by float rounding only (logits here are O(10-100))
    torch.testing.assert_close(_full_logits(merged, ids, mask, pos)[real], trained[real], atol=1e-4, rtol=1e-4)


def test_bad_inputs_are_refused_with_one_line_errors():
    model = make_tiny_model(0, n_layers=2)
    with pytest.raises(ValueError, match=r"k must be an int in \[1, 2\].*got 3"):
        FrozenTrunk(model, 3)
    with pytest.raises(ValueError, match="not a supported decoder-only LM"):
        FrozenTrunk(torch.nn.Linear(2, 2), 1)
    with pytest.raises(ValueError, match="tied to the input embeddings"):
        FrozenTrunk(model, 1).top_k(train_head=True)
    ids, mask, _ = _left_padded_batch()
    cache = FrozenTrunk(model, 1)(ids, attention_mask=mask)
    with pytest.raises(ValueError, match="made for the top 1 of 2 blocks"):
        logits_from_cache(FrozenTrunk(model, 2).reference, cache)
    with pytest.raises(ValueError, match="model has 3 blocks"):
        merge_back(make_tiny_model(0, n_layers=3), FrozenTrunk(model, 1).top_k())


@pytest.mark.slow
@pytest.mark.real_model
@pytest.mark.parametrize("fixture", ["smollm2", "gemma3"])
def test_real_model_cache_plus_top4_equals_full_model(request, fixture):
    """SmolLM2-135M (30 blocks, tied head) and Gemma-3-270M (sliding and full attention layers): the trunk
    split at k = 4 reproduces the full model's response log-probs on a left-padded chat batch."""
    from lmlab.core.training.preference import build_response_batch, logps_from_token_logps

    model, tok = request.getfixturevalue(fixture)
    chat = bool(getattr(tok, "chat_template", None))
    batch = build_response_batch(
        tok, ["What is 2+2?", "Name a colour."], [" 4.", " Blue, like the sky."], chat=chat, padding_side="left"
    )
    trunk = FrozenTrunk(model, 4)
    cache = trunk(batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids)
    ours = logps_from_token_logps(token_logps_from_cache(trunk.reference, cache), batch.target_mask)
    with torch.no_grad():
        logits = model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
        ).logits
    full = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    torch.testing.assert_close(ours.sum, (full * batch.target_mask).sum(-1), atol=1e-3, rtol=1e-5)
