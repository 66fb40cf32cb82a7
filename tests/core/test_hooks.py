"""Invariants of the named hook points on tiny llama and gemma3 models (exactness, identities, hook hygiene)."""

from __future__ import annotations

import sys

import pytest
import torch

from lmlab.core.inference.hooks import (
    ActivationCache,
    HookNameError,
    ablate_heads,
    add_vector,
    head_contributions,
    hook_names,
    hooks,
    patch_activation,
    resolve_hook_name,
    run_with_cache,
    run_with_hooks,
)

ARCHS = ["llama", "gemma3"]
IDS = torch.tensor([[1, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108]])  # (1, 12)
OTHER = torch.tensor([[1, 84, 104, 101, 32, 99, 97, 116, 32, 115, 97, 116]])  # (1, 12)


@pytest.fixture(params=ARCHS)
def model(request, tiny_llama, tiny_gemma):
    return tiny_llama if request.param == "llama" else tiny_gemma


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def _hook_state(model) -> list[tuple[str, int, int, int, int]]:
    return [
        (
            name,
            len(mod._forward_hooks),
            len(mod._forward_pre_hooks),
            len(getattr(mod, "_forward_hooks_with_kwargs", {})),
            len(getattr(mod, "_forward_pre_hooks_with_kwargs", {})),
        )
        for name, mod in model.named_modules()
    ]


def _ln2(blk):
    """The pre-MLP norm: llama's post_attention_layernorm, gemma3's pre_feedforward_layernorm."""
    return getattr(blk, "pre_feedforward_layernorm", None) or blk.post_attention_layernorm


def _eager_fn(model):
    return sys.modules[type(model.model.layers[0].self_attn).__module__].eager_attention_forward


# --- names ------------------------------------------------------------------------------------------------------


def test_hook_names_and_aliases(model):
    names = hook_names(model)
    n_layers = len(model.model.layers)
    assert names[0] == "hook_embed" and names[-2:] == ["ln_final.hook_normalized", "ln_final.hook_out"]
    assert len(names) == 3 + 19 * n_layers
    for layer in range(n_layers):
        for suffix in ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "attn.hook_z", "attn.hook_pattern"):
            assert f"blocks.{layer}.{suffix}" in names
    assert resolve_hook_name(model, "blocks.1.resid_pre") == "blocks.1.hook_resid_pre"
    assert resolve_hook_name(model, "blocks.1.resid_post") == "blocks.1.hook_resid_post"
    assert resolve_hook_name(model, "blocks.0.attn.out") == "blocks.0.attn.hook_out"
    assert resolve_hook_name(model, "blocks.0.mlp.out") == "blocks.0.mlp.hook_out"
    assert resolve_hook_name(model, "blocks.0.attn.pattern") == "blocks.0.attn.hook_pattern"
    # TransformerLens' names are canonical and are never redirected to another point.
    assert resolve_hook_name(model, "blocks.0.attn_out") == "blocks.0.hook_attn_out"
    assert resolve_hook_name(model, "blocks.0.hook_mlp_out") == "blocks.0.hook_mlp_out"
    assert resolve_hook_name(model, "blocks.0.mlp.hook_post") == "blocks.0.mlp.hook_post"
    assert resolve_hook_name(model, "blocks.0.mlp.pre") == "blocks.0.mlp.hook_pre"
    assert resolve_hook_name(model, "blocks.0.mlp.pre_linear") == "blocks.0.mlp.hook_pre_linear"
    assert resolve_hook_name(model, "blocks.0.ln1.normalized") == "blocks.0.ln1.hook_normalized"
    assert resolve_hook_name(model, "ln_final") == "ln_final.hook_out"
    assert resolve_hook_name(model, "embed") == "hook_embed"


def test_unknown_names_error(tiny_llama):
    with pytest.raises(HookNameError) as err:
        resolve_hook_name(tiny_llama, "blocks.0.hook_resid_psot")
    msg = str(err.value)
    assert "\n" not in msg and "blocks.0.hook_resid_psot" in msg and "blocks.0.hook_resid_post" in msg
    assert isinstance(err.value, KeyError) and isinstance(err.value, ValueError)
    with pytest.raises(KeyError, match="blocks.9.hook_resid_pre"):
        resolve_hook_name(tiny_llama, "blocks.9.hook_resid_pre")
    before = _hook_state(tiny_llama)
    with pytest.raises(ValueError, match="attn.hook_zz"):
        with hooks(
            tiny_llama, fwd=[("blocks.0.hook_resid_pre", lambda t, *, hook: None), ("blocks.0.attn.hook_zz", print)]
        ):
            pass
    assert _hook_state(tiny_llama) == before
    with pytest.raises(ValueError, match="matched no hook names"):
        run_with_hooks(tiny_llama, IDS, fwd=[(lambda name: False, print)])


# --- closed-form identities ----------------------------------------------------------------------------------------


def test_cache_reproduces_logits_closed_form(model):
    logits, cache = run_with_cache(model, IDS)
    ref = _logits(model, IDS)
    assert torch.equal(logits, ref)
    last = len(model.model.layers) - 1
    with torch.no_grad():
        normed = model.model.norm(cache[f"blocks.{last}.hook_resid_post"])
        closed = model.lm_head(normed)
        cap = getattr(model.config, "final_logit_softcapping", None)
        if cap is not None:
            closed = torch.tanh(closed / cap) * cap
    assert torch.equal(normed, cache["ln_final.hook_out"])
    torch.testing.assert_close(closed, ref, rtol=0, atol=1e-5)


def test_residual_stream_decomposition(model):
    _, cache = run_with_cache(model, IDS)
    n_layers = len(model.model.layers)
    assert torch.equal(cache["hook_embed"], cache["blocks.0.hook_resid_pre"])
    scale = model.model.embed_tokens(IDS) if hasattr(model.model.embed_tokens, "embed_scale") else None
    if scale is not None:  # gemma3: embeddings are scaled by sqrt(d_model) before the hook
        raw = model.model.embed_tokens.weight[IDS] * model.config.hidden_size**0.5
        torch.testing.assert_close(cache["hook_embed"], raw, rtol=1e-6, atol=1e-6)
    for layer in range(n_layers):
        pre = cache[f"blocks.{layer}.hook_resid_pre"]
        attn_out = cache[f"blocks.{layer}.hook_attn_out"]
        mlp_out = cache[f"blocks.{layer}.hook_mlp_out"]
        mid = cache[f"blocks.{layer}.hook_resid_mid"]
        post = cache[f"blocks.{layer}.hook_resid_post"]
        # Same summation order as the model: exact for both architectures (gemma3's outs are post-norm).
        assert torch.equal(mid, pre + attn_out)
        assert torch.equal(post, mid + mlp_out)
        if layer + 1 < n_layers:
            assert torch.equal(post, cache[f"blocks.{layer + 1}.hook_resid_pre"])
    stacked = cache.stack("hook_resid_post")  # (layers, batch, seq, d)
    assert stacked.shape == (n_layers, *IDS.shape, model.config.hidden_size)
    assert torch.equal(cache.stack("resid_post"), stacked)


def test_per_head_contributions_sum_to_attn_out(model):
    _, cache = run_with_cache(model, IDS)
    sandwich = hasattr(model.model.layers[0], "post_feedforward_layernorm")
    for layer, blk in enumerate(model.model.layers):
        z = cache[f"blocks.{layer}.attn.hook_z"]  # (batch, seq, heads, head_dim)
        contrib = head_contributions(model, layer, z)  # (batch, seq, heads, d_model)
        assert contrib.shape == (*z.shape[:3], model.config.hidden_size)
        total = contrib.sum(2)
        attn_out = cache[f"blocks.{layer}.attn.hook_out"]  # o_proj's output on both architectures
        with torch.no_grad():
            torch.testing.assert_close(total, blk.self_attn.o_proj(z.flatten(-2)), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(total, attn_out, rtol=1e-5, atol=1e-5)
            # llama: hook_attn_out is that same tensor; gemma3: post_attention_layernorm of it.
            expected = blk.post_attention_layernorm(attn_out) if sandwich else attn_out
        assert torch.equal(expected, cache[f"blocks.{layer}.hook_attn_out"])


def test_qkv(model):
    _, cache = run_with_cache(model, IDS)
    attn = model.model.layers[0].self_attn
    ln1 = cache["blocks.0.ln1.hook_out"]
    n_heads, n_kv = model.config.num_attention_heads, model.config.num_key_value_heads
    with torch.no_grad():
        assert torch.equal(cache["blocks.0.attn.hook_q"], attn.q_proj(ln1).unflatten(-1, (n_heads, -1)))
        assert torch.equal(cache["blocks.0.attn.hook_k"], attn.k_proj(ln1).unflatten(-1, (n_kv, -1)))
        assert torch.equal(cache["blocks.0.attn.hook_v"], attn.v_proj(ln1).unflatten(-1, (n_kv, -1)))


def test_mlp_hooks_are_transformer_lens_tensors(model):
    """TransformerLens' GatedMLP: pre = x @ W_gate, pre_linear = x @ W_in, post = act(pre) * pre_linear,
    mlp_out = post @ W_out, with W_gate = gate_proj.weight.T, W_in = up_proj.weight.T, W_out = down_proj.weight.T."""
    _, cache = run_with_cache(model, IDS)
    for layer, blk in enumerate(model.model.layers):
        mlp = blk.mlp
        with torch.no_grad():
            x = _ln2(blk)(cache[f"blocks.{layer}.hook_resid_mid"])  # the MLP input (batch, seq, d_model), by hand
            pre = x @ mlp.gate_proj.weight.T  # (batch, seq, d_mlp)
            pre_linear = x @ mlp.up_proj.weight.T
            post = mlp.act_fn(pre) * pre_linear
            out = post @ mlp.down_proj.weight.T  # (batch, seq, d_model)
            post_ffn = getattr(blk, "post_feedforward_layernorm", None)
            mlp_out = post_ffn(out) if post_ffn is not None else out
        tol = {"rtol": 1e-5, "atol": 1e-5}
        torch.testing.assert_close(cache[f"blocks.{layer}.mlp.hook_pre"], pre, **tol)
        torch.testing.assert_close(cache[f"blocks.{layer}.mlp.hook_pre_linear"], pre_linear, **tol)
        torch.testing.assert_close(cache[f"blocks.{layer}.mlp.hook_post"], post, **tol)
        torch.testing.assert_close(cache[f"blocks.{layer}.mlp.hook_post"] @ mlp.down_proj.weight.T, out, **tol)
        torch.testing.assert_close(cache[f"blocks.{layer}.mlp.hook_out"], out, **tol)  # the MLP module's output
        torch.testing.assert_close(cache[f"blocks.{layer}.hook_mlp_out"], mlp_out, **tol)  # what the residual adds
        # The same shape (d_mlp) at all three points: a wrong one would not error, so they must differ in value.
        assert not torch.allclose(cache[f"blocks.{layer}.mlp.hook_pre"], cache[f"blocks.{layer}.mlp.hook_post"])
    # Writes propagate: a zero linear branch zeroes the down_proj input and the MLP's output.
    zero = lambda t, *, hook: torch.zeros_like(t)  # noqa: E731
    with hooks(model, fwd=[("blocks.1.mlp.pre_linear", zero)]):
        _, zeroed = run_with_cache(model, IDS, names=["blocks.1.mlp.hook_post", "blocks.1.mlp.hook_out"])
    assert torch.all(zeroed["blocks.1.mlp.hook_post"] == 0) and torch.all(zeroed["blocks.1.mlp.hook_out"] == 0)


def test_mlp_hooks_refused_on_an_ungated_mlp():
    from torch import nn

    class Ungated(nn.Module):  # up -> act -> down: TransformerLens' hook_pre would be the up projection here
        def __init__(self, mlp):
            super().__init__()
            self.up_proj, self.down_proj, self.act_fn = mlp.up_proj, mlp.down_proj, mlp.act_fn

        def forward(self, x):
            return self.down_proj(self.act_fn(self.up_proj(x)))

    from lmlab.core.inference.tiny import make_tiny_llama

    fresh = make_tiny_llama(2)
    fresh.model.layers[0].mlp = Ungated(fresh.model.layers[0].mlp)
    for name in ("blocks.0.mlp.hook_pre", "blocks.0.mlp.hook_pre_linear", "blocks.0.mlp.hook_post"):
        with pytest.raises(NotImplementedError, match="TransformerLens") as err:
            run_with_cache(fresh, IDS, names=[name])
        assert "\n" not in str(err.value)
    assert all(h[1:] == (0, 0, 0, 0) for h in _hook_state(fresh))
    _, cache = run_with_cache(fresh, IDS, names=["blocks.0.mlp.hook_out"])  # the other points still work
    assert cache["blocks.0.mlp.hook_out"].shape == (*IDS.shape, 64)


@pytest.fixture(scope="module", params=ARCHS)
def gained_model(request):
    """A fresh tiny model whose RMSNorm gains are random (the shared fixtures' gains are the identity)."""
    from lmlab.core.inference.tiny import make_tiny_model

    fresh = make_tiny_model(3, arch=request.param)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, mod in fresh.named_modules():
            if name.endswith("layernorm") or name == "model.norm":
                mod.weight.copy_(torch.rand(mod.weight.shape, generator=gen) + 0.5)
    return fresh


def test_norm_hooks_are_transformer_lens_tensors(gained_model):
    """TransformerLens' RMSNorm: hook_normalized = x / sqrt(mean(x**2) + eps), *before* the gain; the norm module's
    output (``hook_out``, TransformerBridge's name) is ``gain * hook_normalized``."""
    model = gained_model
    gemma = "Gemma" in type(model).__name__
    _, cache = run_with_cache(model, IDS)
    last = len(model.model.layers) - 1
    points = []  # (hook prefix, the norm's input, the norm)
    for ly, blk in enumerate(model.model.layers):
        points.append((f"blocks.{ly}.ln1", f"blocks.{ly}.hook_resid_pre", blk.input_layernorm))
        points.append((f"blocks.{ly}.ln2", f"blocks.{ly}.hook_resid_mid", _ln2(blk)))
    points.append(("ln_final", f"blocks.{last}.hook_resid_post", model.model.norm))
    for prefix, resid_name, norm in points:
        x = cache[resid_name]  # (batch, seq, d_model)
        eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
        by_hand = x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
        normalized = cache[f"{prefix}.hook_normalized"]
        torch.testing.assert_close(normalized, by_hand, rtol=1e-5, atol=1e-5)
        gain = 1.0 + norm.weight if gemma else norm.weight
        with torch.no_grad():
            assert torch.equal(cache[f"{prefix}.hook_out"], norm(x))
            torch.testing.assert_close(cache[f"{prefix}.hook_out"], gain * normalized, rtol=1e-6, atol=1e-6)
        assert not torch.allclose(normalized, cache[f"{prefix}.hook_out"])
    # Writing hook_normalized feeds gain * new into the model: doubling it doubles the norm's output.
    double = lambda t, *, hook: 2 * t  # noqa: E731
    with hooks(model, fwd=[("blocks.0.ln1.hook_normalized", double)]):
        _, doubled = run_with_cache(model, IDS, names=["blocks.0.ln1.hook_out"])
    torch.testing.assert_close(doubled["blocks.0.ln1.hook_out"], 2 * cache["blocks.0.ln1.hook_out"])


# --- attention patterns --------------------------------------------------------------------------------------------


def test_pattern_rows_sum_to_one_and_causal(model):
    ids = torch.arange(40, 64).unsqueeze(0)  # (1, 24): longer than gemma3's tiny sliding window (16)
    _, cache = run_with_cache(model, ids, names=lambda n: n.endswith("hook_pattern"))
    assert len(cache) == len(model.model.layers)
    for layer in range(len(model.model.layers)):
        pat = cache[f"blocks.{layer}.attn.pattern"]  # (batch, heads, q, k)
        assert pat.shape == (1, model.config.num_attention_heads, 24, 24)
        torch.testing.assert_close(pat.sum(-1), torch.ones(pat.shape[:-1]), rtol=0, atol=1e-5)
        assert torch.all(pat.triu(1) == 0)
        window = getattr(model.model.layers[layer].self_attn, "sliding_window", None)
        if window:
            assert torch.all(pat.tril(-window) == 0)
    assert not hasattr(_eager_fn(model), "_lmlab_original")


def test_pattern_edits_propagate(model):
    ref = _logits(model, IDS)
    same = run_with_hooks(model, IDS, fwd=[("blocks.0.attn.hook_pattern", lambda p, *, hook: p.clone())])
    assert torch.equal(same, ref)  # the recomputed head outputs are bitwise the model's

    def bos_only(pattern, *, hook):
        out = torch.zeros_like(pattern)
        out[..., 0] = 1.0
        return out

    seen = {}

    def grab(t, *, hook):
        seen[hook.name] = t.clone()

    logits = run_with_hooks(
        model,
        IDS,
        fwd=[
            ("blocks.0.attn.hook_pattern", bos_only),
            ("blocks.0.attn.hook_z", grab),
            ("blocks.0.attn.hook_v", grab),
        ],
    )
    z, v = seen["blocks.0.attn.hook_z"], seen["blocks.0.attn.hook_v"]  # (b, s, heads, hd), (b, s, kv, hd)
    groups = z.shape[2] // v.shape[2]
    expected = v[:, :1].repeat_interleave(groups, dim=2).expand_as(z)
    torch.testing.assert_close(z, expected, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(logits, ref)


def test_pattern_requires_eager():
    from lmlab.core.inference.tiny import make_tiny_model

    sdpa = make_tiny_model(0, attn_implementation="sdpa")
    assert "blocks.0.attn.hook_pattern" not in hook_names(sdpa)
    with pytest.raises(ValueError, match='attn_implementation="eager"'):
        run_with_cache(sdpa, IDS, names=["blocks.0.attn.pattern"])
    logits, cache = run_with_cache(sdpa, IDS)  # everything else works without eager
    assert "blocks.1.attn.hook_z" in cache and torch.equal(logits, _logits(sdpa, IDS))


# --- steering and patching -----------------------------------------------------------------------------------------


def test_zero_steering_and_identity_patch_are_exact(model):
    ref = _logits(model, IDS)
    d = model.config.hidden_size
    resid = lambda n: "resid" in n or n.endswith("_out")  # every d_model point but the embedding
    assert torch.equal(run_with_hooks(model, IDS, fwd=[(resid, add_vector(torch.zeros(d)))]), ref)
    _, cache = run_with_cache(model, IDS)
    fwd = [(name, patch_activation(name, cache)) for name in hook_names(model)]
    assert torch.equal(run_with_hooks(model, IDS, fwd=fwd), ref)


def test_patching_from_another_input(model):
    ref = _logits(model, IDS)
    src_logits, src = run_with_cache(model, OTHER)
    changed = run_with_hooks(
        model, IDS, fwd=[("blocks.1.hook_resid_mid", patch_activation("blocks.1.resid_mid", src))]
    )
    assert not torch.allclose(changed, ref)
    # Patching the whole input of layer 0 makes the run the source run.
    whole = run_with_hooks(
        model, IDS, fwd=[("blocks.0.hook_resid_pre", patch_activation("blocks.0.hook_resid_pre", src))]
    )
    assert torch.equal(whole, src_logits)
    # Patching one position leaves earlier positions untouched (causality) and changes that one.
    one = run_with_hooks(
        model, IDS, fwd=[("blocks.0.resid_pre", patch_activation("blocks.0.resid_pre", src, positions=5))]
    )
    assert torch.equal(one[:, :5], ref[:, :5])
    assert not torch.allclose(one[:, 5], ref[:, 5])


def test_steering_at_resid_mid_matches_attn_out(model):
    v = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    a = run_with_hooks(model, IDS, fwd=[("blocks.0.hook_resid_mid", add_vector(v, positions=[2, 3], scale=0.5))])
    b = run_with_hooks(model, IDS, fwd=[("blocks.0.hook_attn_out", add_vector(v, positions=[2, 3], scale=0.5))])
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(a, _logits(model, IDS))


def test_ablate_all_heads_zero_gives_zero_attn_out(model):
    n_heads = model.config.num_attention_heads
    _, cache = run_with_cache(model, IDS, names=["blocks.1.attn.hook_out", "blocks.1.attn.hook_z"])
    assert cache["blocks.1.attn.hook_out"].abs().sum() > 0
    with hooks(model, fwd=[ablate_heads(1, range(n_heads))]):
        _, ablated = run_with_cache(model, IDS, names=["blocks.1.attn.hook_out", "blocks.1.attn.hook_z"])
    assert torch.all(ablated["blocks.1.attn.hook_out"] == 0)
    assert torch.all(ablated["blocks.1.attn.hook_z"] == 0)
    # Mean ablation of head 2 replaces it by its mean over batch and positions; other heads are untouched.
    with hooks(model, fwd=[ablate_heads(1, [2], mode="mean", mean_cache=cache)]):
        _, mean_abl = run_with_cache(model, IDS, names=["blocks.1.attn.hook_z"])
    z, z2 = cache["blocks.1.attn.hook_z"], mean_abl["blocks.1.attn.hook_z"]
    torch.testing.assert_close(z2[:, :, 2], z[:, :, 2].mean((0, 1)).expand_as(z2[:, :, 2]))
    assert torch.equal(z2[:, :, [0, 1, 3]], z[:, :, [0, 1, 3]])
    with pytest.raises(ValueError, match="mean_cache"):
        ablate_heads(0, 1, mode="mean")


# --- hook mechanics --------------------------------------------------------------------------------------------


def test_hooks_removed_on_exit_and_on_exception():
    from lmlab.core.inference.tiny import make_tiny_model

    for arch in ARCHS:
        fresh = make_tiny_model(1, arch=arch)
        names = hook_names(fresh)
        noop = lambda t, *, hook: None
        with hooks(fresh, fwd=[(lambda n: True, noop)]):
            assert any(h[1] or h[2] for h in _hook_state(fresh))
            assert hasattr(_eager_fn(fresh), "_lmlab_original")
            _logits(fresh, IDS)
        assert all(h[1:] == (0, 0, 0, 0) for h in _hook_state(fresh))
        assert not hasattr(_eager_fn(fresh), "_lmlab_original")

        def boom(t, *, hook):
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"):
            run_with_hooks(fresh, IDS, fwd=[(names[5], boom), ("blocks.1.attn.hook_pattern", noop)])
        with pytest.raises(KeyError):
            with hooks(fresh, fwd=[(lambda n: True, noop)]):
                raise KeyError("body failed")
        assert all(h[1:] == (0, 0, 0, 0) for h in _hook_state(fresh))
        assert not hasattr(_eager_fn(fresh), "_lmlab_original")


def test_hook_point_name_layer_ctx_and_chaining(tiny_llama):
    calls = []

    def count(t, *, hook):
        hook.ctx["n"] = hook.ctx.get("n", 0) + 1
        calls.append((hook.name, hook.layer, hook.ctx["n"]))

    with hooks(tiny_llama, fwd=[("blocks.1.resid_post", count), ("hook_embed", count)]):
        _logits(tiny_llama, IDS)
        _logits(tiny_llama, IDS)
    assert calls == [("hook_embed", None, 1), ("blocks.1.hook_resid_post", 1, 1)] + [
        ("hook_embed", None, 2),
        ("blocks.1.hook_resid_post", 1, 2),
    ]
    # Two functions at one point run in order, the second sees the first's result; nested contexts compose.
    seen = []
    with hooks(tiny_llama, fwd=[("blocks.0.hook_resid_post", lambda t, *, hook: t * 0 + 1.0)]):
        with hooks(tiny_llama, fwd=[("blocks.0.hook_resid_post", lambda t, *, hook: seen.append(t.clone()))]):
            _logits(tiny_llama, IDS)
    assert torch.all(seen[0] == 1.0)
    with pytest.raises(ValueError, match="shape"):
        run_with_hooks(tiny_llama, IDS, fwd=[("blocks.0.hook_resid_pre", lambda t, *, hook: t[:, :1])])


def test_run_with_cache_inputs_and_selection(tiny_llama, tiny_tokenizer):
    batch = tiny_tokenizer(["hello world", "hi"], return_tensors="pt", padding=True)
    logits, cache = run_with_cache(tiny_llama, batch, names=["blocks.0.resid_post", "blocks.1.attn.z"])
    assert isinstance(cache, ActivationCache)
    assert list(cache.keys()) == ["blocks.0.hook_resid_post", "blocks.1.attn.hook_z"]
    assert "blocks.0.resid_post" in cache and "blocks.1.hook_resid_post" not in cache
    assert cache["blocks.0.resid_post"].shape == (2, batch["input_ids"].shape[1], 64)
    assert not cache["blocks.0.hook_resid_post"].requires_grad
    with torch.no_grad():
        ref = tiny_llama(**batch).logits
    assert torch.equal(logits, ref)
    one, _ = run_with_cache(tiny_llama, IDS[0], names="blocks.0.hook_resid_pre")  # 1-D ids: batch of one
    assert one.shape == (1, IDS.shape[1], 260)
    with pytest.raises(KeyError, match="did you mean"):
        cache["blocks.0.hook_resid_psot"]
