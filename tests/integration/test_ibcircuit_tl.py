"""Cross-check of IBCircuit's attribution-patching baseline against TransformerLens (the field's reference library).

lmlab hooks the per-head outputs of a plain HF model (``blocks.{l}.attn.hook_z`` = ``o_proj``'s input);
TransformerLens 4 wraps the same HF model in a ``TransformerBridge`` (``TransformerBridge.boot_transformers(name,
hf_model=..., tokenizer=...)``, offline) whose ``blocks.{l}.attn.hook_z`` is the same tensor. The test computes
node-level attribution patching the TransformerLens way (forward hooks caching z, backward hooks caching ∂m/∂z,
``run_with_cache`` on the corrupted prompts, ``(z_clean − z_corrupt)·∂m/∂z`` summed over positions and head dims)
and compares it with `eap_node_scores`, one head explicitly and the whole (L, H) matrix.

Skipped where ``transformer_lens`` is not importable (it is not a dependency of lmlab). What it needs, without
touching torch or transformers: ``pip install --no-deps transformer-lens`` (4.3.0: transformers >= 5.9, torch >=
2.6) plus ``beartype einops fancy-einsum jaxtyping wadler-lindig typeguard``; its other declared dependencies
(wandb, protobuf, transformers-stream-generator, better-abc) are not imported on this path.

The bridge replaces the HF model's modules and config in place, so it always gets its own copy of the model.
"""

from __future__ import annotations

import copy

import pytest
import torch

try:
    from transformer_lens.model_bridge import TransformerBridge
except Exception as e:  # not installed, or installed against another torch / transformers
    pytest.skip(f"transformer_lens is not importable here ({type(e).__name__}: {e})", allow_module_level=True)

from lmlab.methods.analysis.ibcircuit import method as M
from lmlab.methods.analysis.ibcircuit import task as T


def _bridge(model, tokenizer, tmp_path):
    """A TransformerBridge over a private copy of `model`. TransformerLens re-loads the tokenizer from its
    ``name_or_path`` (to set ``add_bos_token``), so the tokenizer goes through a local folder first (offline)."""
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(tmp_path / "tok")
    own = copy.deepcopy(model)
    return TransformerBridge.boot_transformers("lmlab-local", hf_model=own, tokenizer=tok, device="cpu")


def _layer(hook) -> int:  # the bridge reports the canonical name (blocks.{l}.attn.o.hook_in) of the hook_z alias
    return int(hook.name.split(".")[1])


def tl_attribution(bridge, batch: M.CircuitBatch) -> torch.Tensor:
    """Node attribution patching with TransformerLens hooks: ``|E_b Σ_{s,d} (z_clean − z_corrupt)·∂m_b/∂z|`` (L, H)."""
    is_z = lambda name: name.endswith("attn.hook_z")  # noqa: E731
    acts: dict[int, torch.Tensor] = {}
    grads: dict[int, torch.Tensor] = {}

    def save_act(z, hook):
        acts[_layer(hook)] = z.detach().clone()

    def save_grad(g, hook):
        grads[_layer(hook)] = g.detach().clone()

    bridge.reset_hooks()
    try:
        bridge.add_hook(is_z, save_act, "fwd")
        bridge.add_hook(is_z, save_grad, "bwd")
        logits = bridge(batch.input_ids, return_type="logits")  # (B, S, V)
        answer = logits[torch.arange(batch.size), batch.answer_pos]
        M.metric_values(answer, batch).sum().backward()  # sum: every prompt's own gradient
    finally:
        bridge.reset_hooks()
    with torch.no_grad():
        _, corrupt = bridge.run_with_cache(batch.corrupt_ids, names_filter=is_z)
    rows = []
    for layer in sorted(acts):
        z_cor = corrupt[f"blocks.{layer}.attn.hook_z"]
        assert z_cor.shape == acts[layer].shape == grads[layer].shape  # (B, S, H, D)
        rows.append(((acts[layer] - z_cor) * grads[layer]).sum((1, 3)).mean(0).abs())
    return torch.stack(rows)


def _cases(name):
    from lmlab.core.inference.tiny import make_byte_tokenizer, make_tiny_llama

    tok = make_byte_tokenizer()
    if name == "tiny-llama":
        model = make_tiny_llama(0).eval()
        return model, tok, T.ioi_dataset(tok, 6, 0, "fit", vocab=model.config.vocab_size)
    return T.make_induction_model(0), tok, T.induction_dataset(8, 0, "fit")  # token ids only: any tokenizer


@pytest.mark.parametrize("name", ["tiny-llama", "induction-2L"])
def test_bridge_sees_the_same_head_outputs(name, tmp_path):
    model, tok, batch = _cases(name)
    bridge = _bridge(model, tok, tmp_path)
    from lmlab.core.inference.hooks import run_with_cache

    with torch.no_grad():
        ours_logits, ours = run_with_cache(model, batch.input_ids, lambda n: n.endswith("attn.hook_z"))
        tl_logits, theirs = bridge.run_with_cache(batch.input_ids, names_filter=lambda n: n.endswith("attn.hook_z"))
    assert torch.allclose(ours_logits, tl_logits, atol=1e-5)
    n_layers, _, _ = M.check_model(model)
    for layer in range(n_layers):
        key = f"blocks.{layer}.attn.hook_z"
        assert torch.allclose(ours[key], theirs[key], atol=1e-6), layer


@pytest.mark.parametrize("name", ["tiny-llama", "induction-2L"])
def test_attribution_patching_matches_transformer_lens(name, tmp_path):
    model, tok, batch = _cases(name)
    ours = M.eap_node_scores(model, batch)
    theirs = tl_attribution(_bridge(model, tok, tmp_path), batch)
    assert theirs.shape == ours.shape
    layer, head = divmod(int(ours.argmax()), ours.shape[1])  # one head, by name: the top-scoring one
    assert float(ours[layer, head]) > 0
    assert float(theirs[layer, head]) == pytest.approx(float(ours[layer, head]), rel=1e-4, abs=1e-6)
    assert torch.allclose(ours, theirs, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
@pytest.mark.real_model
def test_attribution_patching_matches_transformer_lens_on_smollm2(smollm2, tmp_path):
    """The same check on SmolLM2-135M (GQA: 9 query heads, 3 KV heads), 4 IOI prompts. Not run by the author."""
    model, tok = smollm2
    v = model.get_output_embeddings().weight.shape[0]
    batch = T.ioi_dataset(tok, 4, 0, "fit", vocab=v)
    ours = M.eap_node_scores(model, batch)
    theirs = tl_attribution(_bridge(model, tok, tmp_path), batch)
    layer, head = divmod(int(ours.argmax()), ours.shape[1])
    assert float(theirs[layer, head]) == pytest.approx(float(ours[layer, head]), rel=1e-3)
    assert torch.allclose(ours, theirs, rtol=1e-3, atol=1e-5)
