"""Every lmlab hook name means the tensor TransformerLens means by it (issue 35), checked against TransformerLens.

TransformerLens 4 wraps the same HF model in a ``TransformerBridge`` (offline, on a private copy: the bridge replaces
the model's modules in place) whose names follow ``HookedTransformer`` (``mlp.hook_pre`` = gate pre-activation,
``hook_pre_linear`` = up projection, ``hook_post`` = ``down_proj``'s input, ``ln*.hook_normalized`` = x / rms(x)
before the gain, ``hook_attn_out`` / ``hook_mlp_out`` after gemma3's post-norms) plus each component's ``hook_out``.
On the tiny llama and gemma3 models with random norm gains (so a gain-applied tensor cannot pass for a normalized
one), every name lmlab serves must be a name the bridge has, with the same tensor.

Skipped where ``transformer_lens`` is not importable (not an lmlab dependency; see test_ibcircuit_tl.py for the
install line).
"""

from __future__ import annotations

import copy

import pytest
import torch

try:
    from transformer_lens.model_bridge import TransformerBridge
except Exception as e:  # not installed, or installed against another torch / transformers
    pytest.skip(f"transformer_lens is not importable here ({type(e).__name__}: {e})", allow_module_level=True)

from lmlab.core.inference.hooks import run_with_cache

IDS = torch.tensor([[1, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108]])  # (1, 12)


def _gained(arch: str):
    from lmlab.core.inference.tiny import make_tiny_model

    model = make_tiny_model(3, arch=arch)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, mod in model.named_modules():
            if name.endswith("layernorm") or name == "model.norm":
                mod.weight.copy_(torch.rand(mod.weight.shape, generator=gen) + 0.5)
    return model


def _bridge(model, tmp_path):
    from transformers import AutoTokenizer

    from lmlab.core.inference.tiny import make_byte_tokenizer

    make_byte_tokenizer().save_pretrained(tmp_path / "tok")  # TransformerLens re-loads it from a path
    tok = AutoTokenizer.from_pretrained(tmp_path / "tok")
    own = copy.deepcopy(model)
    own.config.architectures = [type(model).__name__]  # how the bridge picks its adapter
    return TransformerBridge.boot_transformers("lmlab-local", hf_model=own, tokenizer=tok, device="cpu")


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_every_hook_name_is_transformer_lens_tensor(arch, tmp_path):
    model = _gained(arch)
    bridge = _bridge(model, tmp_path)
    with torch.no_grad():
        ours_logits, ours = run_with_cache(model, IDS)
        tl_logits, theirs = bridge.run_with_cache(IDS)
    torch.testing.assert_close(ours_logits, tl_logits, rtol=1e-5, atol=1e-5)
    missing = [name for name in ours if name not in theirs]
    assert not missing, f"lmlab names TransformerLens does not have: {missing}"
    differ = [
        name
        for name in ours
        if ours[name].shape != theirs[name].shape or not torch.allclose(ours[name], theirs[name], rtol=1e-5, atol=1e-5)
    ]
    assert not differ, f"same name, another tensor than TransformerLens: {differ}"
