"""TransformerLens-style named hook points on Hugging Face llama-family and gemma3 models.

No TransformerLens dependency: every name is served by a plain PyTorch hook (``register_forward_hook`` /
``register_forward_pre_hook(with_kwargs=True)``) on the Hugging Face modules, registered for the lifetime of a
`hooks` context and always removed on exit (also when the body raises). The model's weights, config and code are
never changed.

Names (``{l}`` is the decoder-layer index; shapes for a forward over ``seq`` new tokens). Every name means the
tensor TransformerLens means by it (``HookedTransformer``; the ``*.hook_out`` names are those of its
``TransformerBridge``, whose components hook each Hugging Face module's output): a TransformerLens user never silently
gets another tensor. RMSNorm below is ``gain * x / rms(x)`` with ``rms(x) = sqrt(mean(x**2) + eps)`` (computed in
float32); ``gain`` is the norm's ``weight`` (gemma3: ``1 + weight``).

==================================  ==========================================================================
name                                what is hooked (llama / SmolLM2, and gemma3 where it differs)
==================================  ==========================================================================
``hook_embed``                      output of ``model.embed_tokens``: token embeddings after any scaling
                                    (gemma3: already multiplied by sqrt(d_model)). (batch, seq, d_model)
``blocks.{l}.hook_resid_pre``       hidden state entering decoder layer ``l`` (pre-hook with kwargs on the
                                    layer). (batch, seq, d_model)
``blocks.{l}.ln1.hook_normalized``  ``x / rms(x)`` of ``input_layernorm``'s input x, *before* the gain (as
                                    TransformerLens, whose folded ln1 has no gain). (batch, seq, d_model)
``blocks.{l}.ln1.hook_out``         output of ``input_layernorm`` (``gain * hook_normalized``): the attention
                                    input. (batch, seq, d_model)
``blocks.{l}.attn.hook_q``          ``q_proj`` output per head, before RoPE (gemma3: also before ``q_norm``).
                                    (batch, seq, n_heads, head_dim)
``blocks.{l}.attn.hook_k``          ``k_proj`` output per key/value head, before RoPE (gemma3: before ``k_norm``).
                                    (batch, seq, n_kv_heads, head_dim), GQA heads are not repeated
``blocks.{l}.attn.hook_v``          ``v_proj`` output per key/value head. (batch, seq, n_kv_heads, head_dim)
``blocks.{l}.attn.hook_pattern``    attention probabilities after softmax (and after the causal / sliding-window
                                    mask), GQA-expanded. (batch, n_heads, q_seq, k_seq). Eager attention only.
``blocks.{l}.attn.hook_z``          per-head attention outputs: ``o_proj``'s input (pre-hook) reshaped.
                                    (batch, seq, n_heads, head_dim)
``blocks.{l}.attn.hook_out``        output of ``self_attn`` (= ``o_proj``'s output; gemma3: *before*
                                    ``post_attention_layernorm``). (batch, seq, d_model)
``blocks.{l}.hook_attn_out``        attention output as added to the residual stream. llama: the same tensor as
                                    ``attn.hook_out``; gemma3: ``post_attention_layernorm``'s output.
``blocks.{l}.hook_resid_mid``       residual stream between attention and MLP: ``resid_pre + hook_attn_out``
                                    (llama: the input of ``post_attention_layernorm``; gemma3: the input of
                                    ``pre_feedforward_layernorm``). (batch, seq, d_model)
``blocks.{l}.ln2.hook_normalized``  ``x / rms(x)`` of the pre-MLP norm's input, before the gain (llama
                                    ``post_attention_layernorm``; gemma3 ``pre_feedforward_layernorm``).
``blocks.{l}.ln2.hook_out``         output of that norm: the MLP input. (batch, seq, d_model)
``blocks.{l}.mlp.hook_pre``         ``gate_proj`` output, before the activation (TransformerLens ``x @ W_gate``).
                                    (batch, seq, d_mlp)
``blocks.{l}.mlp.hook_pre_linear``  ``up_proj`` output (TransformerLens ``x @ W_in``). (batch, seq, d_mlp)
``blocks.{l}.mlp.hook_post``        ``down_proj``'s input ``act(hook_pre) * hook_pre_linear`` (pre-hook); what
                                    ROME/MEMIT call the key. (batch, seq, d_mlp)
``blocks.{l}.mlp.hook_out``         output of ``mlp`` (= ``down_proj``'s output; gemma3: *before*
                                    ``post_feedforward_layernorm``). (batch, seq, d_model)
``blocks.{l}.hook_mlp_out``         MLP output as added to the residual stream. llama: the same tensor as
                                    ``mlp.hook_out``; gemma3: ``post_feedforward_layernorm``'s output.
``blocks.{l}.hook_resid_post``      output of decoder layer ``l`` (= ``resid_mid + hook_mlp_out``); equals
                                    ``blocks.{l+1}.hook_resid_pre``. (batch, seq, d_model)
``ln_final.hook_normalized``        ``x / rms(x)`` of the final norm ``model.norm``'s input, before the gain.
``ln_final.hook_out``               output of ``model.norm`` (what ``lm_head`` reads).
==================================  ==========================================================================

Identities (checked in tests/core/test_hooks.py) for both architectures:
``resid_post = (resid_pre + hook_attn_out) + hook_mlp_out``,
``mlp.hook_post @ down_proj.weight.T = mlp.hook_out`` and
``sum_h head_contributions(z)[..., h, :] (+ o_proj.bias) = attn.hook_out`` (for gemma3
``hook_attn_out = post_attention_layernorm(attn.hook_out)``).

Aliases: the ``hook_`` prefix may be dropped from the last part (``blocks.0.resid_pre``, ``blocks.0.attn.out``,
``blocks.0.mlp.post``, ``blocks.0.attn.pattern``, ``embed``, ...); ``ln_final`` is ``ln_final.hook_out``.
Before issue 35, ``mlp.hook_pre`` named ``down_proj``'s input (now ``mlp.hook_post``), ``ln*.hook_normalized``
the norms' outputs (now ``ln*.hook_out``) and, on gemma3, ``attn.hook_out`` / ``mlp.hook_out`` the post-norm outputs
(now ``hook_attn_out`` / ``hook_mlp_out``).

How the awkward points are served:

- ``hook_pattern``: while a pattern hook is active, the module-level ``eager_attention_forward`` of the attention
  class's modeling module (the function HF's attention ``forward`` falls back to for ``attn_implementation="eager"``)
  is replaced by a dispatcher. For attention modules without an active pattern hook it calls the original
  unchanged; for hooked ones it calls the original, hands the returned probabilities to the hook functions, and if
  one returns a new pattern, recomputes the head outputs as ``pattern @ repeat_kv(value)``, so edited patterns
  propagate. This works with and without ``output_attentions`` and for every eager call (also during ``generate``).
  The original is restored when the last pattern hook on that modeling module is removed. Non-eager models
  (``sdpa``, flash) never compute probabilities; asking for a pattern raises with a hint to reload the model with
  ``attn_implementation="eager"``. Modify a pattern by returning a new tensor: in-place edits are not propagated.
- ``hook_resid_mid``: no HF module receives exactly this tensor as both the residual and the norm input, so it is
  served at the attention-output point: the layer's residual (captured from ``input_layernorm``'s input) is added
  to the attention output (bitwise the model's own sum); if a hook function returns a new ``mid``, the attention
  output is replaced by ``mid - residual``. Reading is exact; writing is exact up to one float rounding of that
  difference (a hook that returns an equal tensor changes nothing).
- ``ln*.hook_normalized``: HF's RMSNorm never exposes ``x / rms(x)``, so a forward hook on the norm recomputes it
  from the norm's input with the norm's own formula (float32, cast to the input dtype as llama does); if a hook
  function returns a new one, the norm's output becomes ``gain * new`` in the norm's own order of operations (exact
  for llama and in float32; gemma3 in half precision multiplies in float32, so there `new`, rounded to the input
  dtype, differs from the norm's internal value by that rounding).
- ``mlp.hook_pre`` / ``hook_pre_linear`` / ``hook_post`` need a gated MLP with ``gate_proj``, ``up_proj`` and
  ``down_proj`` (all llama-family and gemma3 models); another MLP is refused with a one-line error.

Hook functions have TransformerLens' signature ``fn(tensor, *, hook) -> tensor | None``: returning a tensor (of the
same shape) replaces the activation; ``hook`` is a `HookPoint` with ``.name`` (canonical name), ``.layer`` (int or
``None``) and ``.ctx`` (a dict private to that function for the life of the `hooks` context).
"""

from __future__ import annotations

import contextlib
import difflib
import re
import sys
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = [
    "ActivationCache",
    "HookNameError",
    "HookPoint",
    "ablate_heads",
    "add_vector",
    "head_contributions",
    "hook_names",
    "hooks",
    "model_inputs",
    "patch_activation",
    "resolve_hook_name",
    "run_with_cache",
    "run_with_hooks",
]

HookFn = Callable[..., "torch.Tensor | None"]
NameFilter = str | Callable[[str], bool]
Positions = int | Sequence[int] | slice | torch.Tensor | None

# Canonical per-layer suffixes, in forward order (TransformerLens' names and meanings).
_LAYER_SUFFIXES: tuple[str, ...] = (
    "hook_resid_pre",
    "ln1.hook_normalized",
    "ln1.hook_out",
    "attn.hook_q",
    "attn.hook_k",
    "attn.hook_v",
    "attn.hook_pattern",
    "attn.hook_z",
    "attn.hook_out",
    "hook_attn_out",
    "hook_resid_mid",
    "ln2.hook_normalized",
    "ln2.hook_out",
    "mlp.hook_pre",
    "mlp.hook_pre_linear",
    "mlp.hook_post",
    "mlp.hook_out",
    "hook_mlp_out",
    "hook_resid_post",
)
# TransformerLens' meaning of each MLP point, for the error on a model whose MLP is not gated (gate/up/down_proj).
_MLP_POINTS: dict[str, tuple[str, str]] = {
    "mlp.hook_pre": ("gate_proj", "the gate pre-activation x @ W_gate, before the nonlinearity"),
    "mlp.hook_pre_linear": ("up_proj", "the linear branch x @ W_in"),
    "mlp.hook_post": ("down_proj", "act(hook_pre) * hook_pre_linear, the input of W_out"),
}
_LAYER_RE = re.compile(r"^blocks\.(\d+)\.(.+)$")


class HookNameError(KeyError, ValueError):
    """An unknown hook name (a `KeyError` and a `ValueError`), with close matches in the message."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


@dataclass(eq=False)
class HookPoint:
    """What a hook function receives as ``hook``: the canonical ``name``, its ``layer`` and a private ``ctx`` dict."""

    name: str
    layer: int | None = None
    ctx: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------------------
# Model structure
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Arch:
    """The modules and sizes hooks need, read off a Hugging Face causal LM."""

    text_model: nn.Module
    embed: nn.Module
    layers: Sequence[nn.Module]
    norm: nn.Module
    sandwich: bool  # gemma2/3-style post-attention / post-feedforward norms inside the residual branch
    n_heads: int
    n_kv_heads: int
    head_dim: int
    attn_impl: str

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def attn_out_module(self, layer: int) -> nn.Module:
        blk = self.layers[layer]
        return blk.post_attention_layernorm if self.sandwich else blk.self_attn

    def mlp_out_module(self, layer: int) -> nn.Module:
        blk = self.layers[layer]
        return blk.post_feedforward_layernorm if self.sandwich else blk.mlp

    def ln2_module(self, layer: int) -> nn.Module:
        blk = self.layers[layer]
        return blk.pre_feedforward_layernorm if self.sandwich else blk.post_attention_layernorm


def _text_model(model: nn.Module) -> nn.Module:
    inner = getattr(model, "model", None)
    for cand in (inner, getattr(inner, "language_model", None), getattr(model, "language_model", None), model):
        if cand is not None and hasattr(cand, "layers") and hasattr(cand, "embed_tokens") and hasattr(cand, "norm"):
            return cand
    raise TypeError(
        f"{type(model).__name__} is not a supported decoder-only model: expected `.model.layers`, "
        "`.model.embed_tokens` and `.model.norm` (llama / gemma3 layout)"
    )


def _arch(model: nn.Module) -> _Arch:
    text = _text_model(model)
    layers = text.layers
    if len(layers) == 0:
        raise TypeError(f"{type(model).__name__} has no decoder layers")
    blk = layers[0]
    attn = blk.self_attn
    cfg = attn.config
    sandwich = hasattr(blk, "pre_feedforward_layernorm") and hasattr(blk, "post_feedforward_layernorm")
    n_heads = int(cfg.num_attention_heads)
    return _Arch(
        text_model=text,
        embed=text.embed_tokens,
        layers=layers,
        norm=text.norm,
        sandwich=sandwich,
        n_heads=n_heads,
        n_kv_heads=int(getattr(cfg, "num_key_value_heads", None) or n_heads),
        head_dim=int(attn.head_dim),
        attn_impl=str(getattr(cfg, "_attn_implementation", None) or "eager"),
    )


def _is_eager(arch: _Arch) -> bool:
    return arch.attn_impl == "eager"


def _eager_error(name: str, arch: _Arch) -> ValueError:
    return ValueError(
        f"{name} needs eager attention, but this model uses attn_implementation={arch.attn_impl!r}; "
        'load it with attn_implementation="eager"'
    )


# ---------------------------------------------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------------------------------------------


def _all_names(arch: _Arch, include_pattern: bool = True) -> list[str]:
    names = ["hook_embed"]
    for layer in range(arch.n_layers):
        for suffix in _LAYER_SUFFIXES:
            if suffix == "attn.hook_pattern" and not include_pattern:
                continue
            names.append(f"blocks.{layer}.{suffix}")
    names += ["ln_final.hook_normalized", "ln_final.hook_out"]
    return names


def hook_names(model: nn.Module) -> list[str]:
    """All canonical hook names of `model`, in forward order.

    ``blocks.{l}.attn.hook_pattern`` is listed only when the model runs eager attention.
    """
    arch = _arch(model)
    return _all_names(arch, include_pattern=_is_eager(arch))


def _alias_candidates(name: str) -> list[str]:
    """Canonical spellings `name` may stand for (purely textual; the caller checks which exist)."""
    name = name.strip()
    cands = [name]
    m = _LAYER_RE.match(name)
    prefix, rest = (f"blocks.{m.group(1)}.", m.group(2)) if m else ("", name)
    parts = rest.split(".")
    if not parts[-1].startswith("hook_"):
        parts[-1] = "hook_" + parts[-1]
        cands.append(prefix + ".".join(parts))
    if rest == "ln_final":  # the module: its output
        cands.append("ln_final.hook_out")
    return cands


def _resolve(name: str, arch: _Arch) -> str:
    known = _all_names(arch)
    known_set = set(known)
    for cand in _alias_candidates(name):
        if cand in known_set:
            if cand.endswith("attn.hook_pattern") and not _is_eager(arch):
                raise _eager_error(cand, arch)
            return cand
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; see hook_names(model) ({arch.n_layers} layers)"
    raise HookNameError(f"unknown hook name {name!r}{hint}")


def resolve_hook_name(model: nn.Module, name: str) -> str:
    """The canonical name for `name` (aliases resolved). Raises `HookNameError` with close matches if unknown."""
    return _resolve(name, _arch(model))


def _layer_of(name: str) -> int | None:
    m = _LAYER_RE.match(name)
    return int(m.group(1)) if m else None


def _suffix_of(name: str) -> str:
    m = _LAYER_RE.match(name)
    return m.group(2) if m else name


def _seq_dim(name: str) -> int:
    """The sequence (query-position) dimension of the activation at `name`."""
    return 2 if name.endswith("hook_pattern") else 1


# ---------------------------------------------------------------------------------------------------------------
# The pattern dispatcher (wraps the modeling module's eager_attention_forward)
# ---------------------------------------------------------------------------------------------------------------

_PATTERN_LOCK = threading.Lock()
_PATTERN_FNS: weakref.WeakKeyDictionary[nn.Module, list[tuple[object, Callable[[torch.Tensor], torch.Tensor]]]] = (
    weakref.WeakKeyDictionary()
)
_PATTERN_INSTALLS: dict[str, list[Any]] = {}  # modeling module name -> [original fn, refcount]


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    # (batch, kv_heads, seq, head_dim) -> (batch, kv_heads * n_rep, seq, head_dim), as HF's repeat_kv
    if n_rep == 1:
        return x
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


def _make_dispatcher(original: Callable[..., Any]) -> Callable[..., Any]:
    def eager_attention_forward(module: nn.Module, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        out, weights = original(module, *args, **kwargs)
        entries = _PATTERN_FNS.get(module)
        if not entries or weights is None:
            return out, weights
        pattern = weights
        for _token, apply in list(entries):
            pattern = apply(pattern)
        if pattern is weights:
            return out, weights
        value = args[2] if len(args) > 2 else kwargs["value"]  # (batch, kv_heads, k_seq, head_dim)
        groups = int(getattr(module, "num_key_value_groups", 1))
        v = _repeat_kv(value, groups)
        out = torch.matmul(pattern.to(v.dtype), v).transpose(1, 2).contiguous()  # (batch, q_seq, heads, head_dim)
        return out, pattern

    eager_attention_forward._lmlab_original = original  # type: ignore[attr-defined]
    return eager_attention_forward


def _install_pattern_fn(attn: nn.Module, token: object, apply: Callable[[torch.Tensor], torch.Tensor]) -> None:
    modname = type(attn).__module__
    mod = sys.modules.get(modname)
    if mod is None or not callable(getattr(mod, "eager_attention_forward", None)):
        raise NotImplementedError(
            f"cannot hook attention patterns of {type(attn).__name__}: its module {modname} has no "
            "eager_attention_forward"
        )
    with _PATTERN_LOCK:
        inst = _PATTERN_INSTALLS.get(modname)
        if inst is None:
            original = mod.eager_attention_forward
            mod.eager_attention_forward = _make_dispatcher(original)
            inst = _PATTERN_INSTALLS[modname] = [original, 0]
        inst[1] += 1
        _PATTERN_FNS.setdefault(attn, []).append((token, apply))


def _uninstall_pattern_fn(attn: nn.Module, token: object) -> None:
    modname = type(attn).__module__
    with _PATTERN_LOCK:
        entries = _PATTERN_FNS.get(attn)
        if entries is not None:
            entries[:] = [e for e in entries if e[0] is not token]
            if not entries:
                del _PATTERN_FNS[attn]
        inst = _PATTERN_INSTALLS.get(modname)
        if inst is not None:
            inst[1] -= 1
            if inst[1] <= 0:
                mod = sys.modules.get(modname)
                if mod is not None:
                    mod.eager_attention_forward = inst[0]
                del _PATTERN_INSTALLS[modname]


class _PatternHandle:
    def __init__(self, attn: nn.Module, token: object) -> None:
        self.attn, self.token = attn, token

    def remove(self) -> None:
        if self.attn is not None:
            _uninstall_pattern_fn(self.attn, self.token)
            self.attn = None


# ---------------------------------------------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------------------------------------------

_Entries = list[tuple[HookPoint, HookFn]]


def _apply_fns(entries: _Entries, x: torch.Tensor) -> torch.Tensor:
    """Run the hook functions in order; each sees the previous one's result. Returns `x` itself if none replaced it."""
    for hp, fn in entries:
        out = fn(x, hook=hp)
        if out is None:
            continue
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"hook function for {hp.name} returned {type(out).__name__}; expected a tensor or None")
        if out.shape != x.shape:
            raise ValueError(
                f"hook function for {hp.name} returned shape {tuple(out.shape)}, expected {tuple(x.shape)}"
            )
        x = out
    return x


def _heads_apply(entries: _Entries, flat: torch.Tensor, n_heads: int, head_dim: int) -> torch.Tensor:
    # flat: (batch, seq, n_heads * head_dim) <-> (batch, seq, n_heads, head_dim)
    view = flat.unflatten(-1, (n_heads, head_dim))
    new = _apply_fns(entries, view)
    return flat if new is view else new.flatten(-2)


def _fwd_out_hook(apply: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., Any]:
    def hook(_module: nn.Module, _args: Any, output: Any) -> Any:
        tensor = output[0] if isinstance(output, tuple) else output
        new = apply(tensor)
        if new is tensor:
            return None
        return (new, *output[1:]) if isinstance(output, tuple) else new

    return hook


def _pre_arg0_hook(apply: Callable[[torch.Tensor], torch.Tensor], kwname: str) -> Callable[..., Any]:
    def hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if args:
            tensor = args[0]
            new = apply(tensor)
            return None if new is tensor else ((new, *args[1:]), kwargs)
        tensor = kwargs[kwname]
        new = apply(tensor)
        if new is tensor:
            return None
        return args, {**kwargs, kwname: new}

    return hook


def _first_input(args: tuple[Any, ...], kwargs: dict[str, Any], kwname: str) -> torch.Tensor:
    return args[0] if args else kwargs[kwname]


def _normalized_hook(norm: nn.Module, name: str, entries: _Entries) -> Callable[..., Any]:
    """Forward hook (with kwargs) on an RMSNorm serving TransformerLens' ``hook_normalized`` = x / rms(x), pre-gain.

    llama-style norms return ``weight * normalized.to(dtype)``; gemma-style ones ``(normalized * (1 + weight))`` in
    float32, then cast. A replaced `normalized` is turned into the norm's output by the same expression.
    """
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    weight = getattr(norm, "weight", None)
    if eps is None or not isinstance(weight, torch.Tensor):
        raise NotImplementedError(
            f"{name} is TransformerLens' x / rms(x) before the norm's gain; {type(norm).__name__} is not an RMSNorm "
            "with `weight` and `eps` / `variance_epsilon`"
        )
    offset_gain = type(norm).__name__.startswith("Gemma")  # gemma RMSNorms scale by (1 + weight)

    def hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: torch.Tensor) -> Any:
        x = args[0] if args else next(iter(kwargs.values()))  # (batch, seq, d)
        xf = x.float()
        normalized = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
        new = _apply_fns(entries, normalized)
        if new is normalized:
            return None
        if offset_gain:
            return (new.float() * (1.0 + weight.float())).type_as(x)
        return weight * new.to(x.dtype)

    return hook


def _mlp_linear(blk: nn.Module, suffix: str, name: str) -> nn.Module:
    """The MLP projection serving `suffix` (see `_MLP_POINTS`); a one-line error if the MLP is not gated."""
    mlp = blk.mlp
    if not all(isinstance(getattr(mlp, p, None), nn.Module) for p in ("gate_proj", "up_proj", "down_proj")):
        raise NotImplementedError(
            f"{name} is TransformerLens' {_MLP_POINTS[suffix][1]}; {type(mlp).__name__} is not a gated MLP with "
            "gate_proj, up_proj and down_proj"
        )
    return getattr(mlp, _MLP_POINTS[suffix][0])


def _register(arch: _Arch, name: str, entries: _Entries) -> list[Any]:
    """Register the PyTorch hook(s) serving canonical `name`; returns removable handles."""
    layer = _layer_of(name)
    suffix = _suffix_of(name)
    handles: list[Any] = []
    if name == "hook_embed":
        handles.append(arch.embed.register_forward_hook(_fwd_out_hook(lambda t: _apply_fns(entries, t))))
        return handles
    if name == "ln_final.hook_normalized":
        handles.append(arch.norm.register_forward_hook(_normalized_hook(arch.norm, name, entries), with_kwargs=True))
        return handles
    if name == "ln_final.hook_out":
        handles.append(arch.norm.register_forward_hook(_fwd_out_hook(lambda t: _apply_fns(entries, t))))
        return handles
    assert layer is not None
    blk = arch.layers[layer]
    attn = blk.self_attn

    def plain(t: torch.Tensor) -> torch.Tensor:
        return _apply_fns(entries, t)

    if suffix == "hook_resid_pre":
        handles.append(blk.register_forward_pre_hook(_pre_arg0_hook(plain, "hidden_states"), with_kwargs=True))
    elif suffix == "hook_resid_post":
        handles.append(blk.register_forward_hook(_fwd_out_hook(plain)))
    elif suffix in ("ln1.hook_normalized", "ln2.hook_normalized"):
        norm = blk.input_layernorm if suffix == "ln1.hook_normalized" else arch.ln2_module(layer)
        handles.append(norm.register_forward_hook(_normalized_hook(norm, name, entries), with_kwargs=True))
    elif suffix == "ln1.hook_out":
        handles.append(blk.input_layernorm.register_forward_hook(_fwd_out_hook(plain)))
    elif suffix == "ln2.hook_out":
        handles.append(arch.ln2_module(layer).register_forward_hook(_fwd_out_hook(plain)))
    elif suffix in ("attn.hook_q", "attn.hook_k", "attn.hook_v"):
        proj = getattr(attn, suffix[-1] + "_proj")
        n = arch.n_heads if suffix == "attn.hook_q" else arch.n_kv_heads
        handles.append(
            proj.register_forward_hook(_fwd_out_hook(lambda t, n=n: _heads_apply(entries, t, n, arch.head_dim)))
        )
    elif suffix == "attn.hook_z":
        handles.append(
            attn.o_proj.register_forward_pre_hook(
                _pre_arg0_hook(lambda t: _heads_apply(entries, t, arch.n_heads, arch.head_dim), "input"),
                with_kwargs=True,
            )
        )
    elif suffix == "attn.hook_out":
        handles.append(attn.register_forward_hook(_fwd_out_hook(plain)))
    elif suffix == "hook_attn_out":
        handles.append(arch.attn_out_module(layer).register_forward_hook(_fwd_out_hook(plain)))
    elif suffix == "hook_resid_mid":
        # The residual entering the attention branch is exactly input_layernorm's input (same tensor object).
        stash: dict[str, torch.Tensor] = {}

        def grab(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            stash["resid"] = _first_input(args, kwargs, "hidden_states")

        def mid_apply(attn_out: torch.Tensor) -> torch.Tensor:
            resid = stash.pop("resid", None)  # (batch, seq, d_model)
            if resid is None:  # attention called outside its decoder layer: no residual stream here
                return attn_out
            mid = resid + attn_out  # bitwise the model's own `residual + hidden_states`
            new = _apply_fns(entries, mid)
            if new is mid or torch.equal(new, mid):
                return attn_out
            return new - resid

        handles.append(blk.input_layernorm.register_forward_pre_hook(grab, with_kwargs=True))
        handles.append(arch.attn_out_module(layer).register_forward_hook(_fwd_out_hook(mid_apply)))
    elif suffix == "attn.hook_pattern":
        if not _is_eager(arch):
            raise _eager_error(name, arch)
        token = object()
        _install_pattern_fn(attn, token, plain)
        handles.append(_PatternHandle(attn, token))
    elif suffix in ("mlp.hook_pre", "mlp.hook_pre_linear"):
        handles.append(_mlp_linear(blk, suffix, name).register_forward_hook(_fwd_out_hook(plain)))
    elif suffix == "mlp.hook_post":
        down = _mlp_linear(blk, suffix, name)
        handles.append(down.register_forward_pre_hook(_pre_arg0_hook(plain, "input"), with_kwargs=True))
    elif suffix == "mlp.hook_out":
        handles.append(blk.mlp.register_forward_hook(_fwd_out_hook(plain)))
    elif suffix == "hook_mlp_out":
        handles.append(arch.mlp_out_module(layer).register_forward_hook(_fwd_out_hook(plain)))
    else:  # pragma: no cover - names are validated before
        raise HookNameError(f"unknown hook name {name!r}")
    return handles


def _expand(arch: _Arch, name_or_filter: NameFilter) -> list[str]:
    if isinstance(name_or_filter, str):
        return [_resolve(name_or_filter, arch)]
    if callable(name_or_filter):
        names = [n for n in _all_names(arch, include_pattern=_is_eager(arch)) if name_or_filter(n)]
        if not names:
            raise ValueError("hook filter matched no hook names; see hook_names(model)")
        return names
    raise TypeError(f"expected a hook name or a filter callable, got {type(name_or_filter).__name__}")


@contextlib.contextmanager
def hooks(model: nn.Module, fwd: Sequence[tuple[NameFilter, HookFn]] = ()) -> Iterator[nn.Module]:
    """Context manager that attaches forward hook functions at named points and always removes them on exit.

    Args:
        model: A Hugging Face llama-family or gemma3 causal LM (or its inner text model).
        fwd: ``(name_or_filter, fn)`` pairs. `name_or_filter` is a hook name (aliases allowed) or a callable
            ``name -> bool`` over the canonical names. `fn(tensor, *, hook)` may return a tensor of the same shape
            to replace the activation. Functions at one point run in the order given, each seeing the previous
            result; points run in forward order.

    Yields:
        The model.

    Raises:
        HookNameError: An unknown name (the message suggests close matches). Nothing is registered then.
        ValueError: A pattern hook on a model that does not run eager attention.
        NotImplementedError: An MLP point on a model whose MLP is not gated (``gate_proj``/``up_proj``/``down_proj``),
            or ``hook_normalized`` on a norm that is not an RMSNorm. Nothing stays registered then.

    Example:
        >>> with hooks(model, fwd=[("blocks.0.hook_resid_post", add_vector(v))]):
        ...     logits = model(ids).logits
    """
    arch = _arch(model)
    grouped: dict[str, _Entries] = {}
    for name_or_filter, fn in fwd:
        for name in _expand(arch, name_or_filter):
            grouped.setdefault(name, []).append((HookPoint(name=name, layer=_layer_of(name)), fn))
    order = {n: i for i, n in enumerate(_all_names(arch))}
    handles: list[Any] = []
    try:
        for name in sorted(grouped, key=order.__getitem__):
            handles.extend(_register(arch, name, grouped[name]))
        yield model
    finally:
        for handle in reversed(handles):
            handle.remove()


# ---------------------------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------------------------

_FORWARD_KEYS = ("input_ids", "attention_mask", "position_ids", "inputs_embeds")


def model_inputs(model: nn.Module, inputs: Any) -> dict[str, Any]:
    """Forward kwargs from `inputs`: a tensor / list of token ids, or a tokenizer's dict (``input_ids``, ...).

    1-D ids become a batch of one; tensors move to the model's device; keys other than ``input_ids``,
    ``attention_mask``, ``position_ids`` and ``inputs_embeds`` (e.g. ``token_type_ids``) are dropped.
    """
    device = next(model.parameters()).device
    if isinstance(inputs, Mapping):
        kw = {k: inputs[k] for k in _FORWARD_KEYS if k in inputs and inputs[k] is not None}
    else:
        kw = {"input_ids": inputs}
    for key, val in list(kw.items()):
        if not isinstance(val, torch.Tensor):
            val = torch.as_tensor(val)
        if key != "inputs_embeds" and val.dim() == 1:
            val = val.unsqueeze(0)  # (seq,) -> (1, seq)
        elif key == "inputs_embeds" and val.dim() == 2:
            val = val.unsqueeze(0)
        kw[key] = val.to(device)
    if "input_ids" not in kw and "inputs_embeds" not in kw:
        raise ValueError("inputs must be token ids or a dict with 'input_ids' (or 'inputs_embeds')")
    return kw


def _forward_logits(model: nn.Module, inputs: Any, no_grad: bool, forward_kwargs: dict[str, Any]) -> torch.Tensor:
    kw = {"use_cache": False, **model_inputs(model, inputs), **forward_kwargs}
    with torch.no_grad() if no_grad else contextlib.nullcontext():
        out = model(**kw)
    return out.logits if hasattr(out, "logits") else out[0]


def run_with_hooks(
    model: nn.Module,
    inputs: Any,
    fwd: Sequence[tuple[NameFilter, HookFn]] = (),
    *,
    no_grad: bool = True,
    **forward_kwargs: Any,
) -> torch.Tensor:
    """One forward pass with hook functions attached (see `hooks`); returns the logits (batch, seq, vocab).

    Args:
        model: The causal LM.
        inputs: Token ids (tensor or list, 1-D or (batch, seq)) or a tokenizer's output dict.
        fwd: ``(name_or_filter, fn)`` pairs, as for `hooks`.
        no_grad: Run under ``torch.no_grad()`` (default). Pass False to backpropagate through hooks.
        **forward_kwargs: Extra keyword arguments for ``model(...)`` (``use_cache`` defaults to False).
    """
    with hooks(model, fwd):
        return _forward_logits(model, inputs, no_grad, forward_kwargs)


class ActivationCache(Mapping):
    """Detached activations by canonical hook name (aliases work for lookup).

    Example:
        >>> logits, cache = run_with_cache(model, ids)
        >>> cache["blocks.0.hook_resid_post"].shape  # (batch, seq, d_model)
        >>> cache.stack("hook_resid_post").shape  # (n_layers, batch, seq, d_model)
    """

    def __init__(self, data: Mapping[str, torch.Tensor] | None = None) -> None:
        self._data: dict[str, torch.Tensor] = dict(data or {})

    def _key(self, name: str) -> str:
        for cand in _alias_candidates(name):
            if cand in self._data:
                return cand
        close = difflib.get_close_matches(name, list(self._data), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise HookNameError(f"{name!r} is not in this cache ({len(self._data)} names){hint}")

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._data[self._key(name)]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and any(c in self._data for c in _alias_candidates(name))

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __setitem__(self, name: str, value: torch.Tensor) -> None:
        self._data[name] = value

    def __repr__(self) -> str:
        return (
            f"ActivationCache({len(self._data)} names: {', '.join(list(self._data)[:4])}{', ...' * (len(self) > 4)})"
        )

    def stack(self, suffix: str) -> torch.Tensor:
        """Stack ``blocks.{l}.<suffix>`` over layers: (n_layers, *activation_shape).

        `suffix` is the per-layer part of a name, e.g. ``"hook_resid_post"``, ``"resid_post"``, ``"attn.hook_z"``.
        """
        canon = None
        probe_layers = sorted({_layer_of(k) for k in self._data if _layer_of(k) is not None})
        for layer in probe_layers:
            for cand in _alias_candidates(f"blocks.{layer}.{suffix}"):
                if cand in self._data:
                    canon = _suffix_of(cand)
                    break
            if canon is not None:
                break
        if canon is None:
            raise HookNameError(f"no blocks.*.{suffix} in this cache")
        tensors = [self._data[f"blocks.{ly}.{canon}"] for ly in probe_layers if f"blocks.{ly}.{canon}" in self._data]
        return torch.stack(tensors)

    def to(self, device: torch.device | str) -> ActivationCache:
        """A copy with every tensor on `device`."""
        return ActivationCache({k: v.to(device) for k, v in self._data.items()})


def run_with_cache(
    model: nn.Module,
    inputs: Any,
    names: NameFilter | Sequence[str] | None = None,
    *,
    no_grad: bool = True,
    **forward_kwargs: Any,
) -> tuple[torch.Tensor, ActivationCache]:
    """One forward pass recording activations; returns ``(logits, cache)``.

    Args:
        model: The causal LM.
        inputs: Token ids or a tokenizer's output dict (see `model_inputs`).
        names: ``None`` (every name of `hook_names`), a list of names (aliases allowed), a single name, or a filter
            ``name -> bool``.
        no_grad: Run under ``torch.no_grad()`` (default).
        **forward_kwargs: Extra keyword arguments for ``model(...)``.

    Returns:
        The logits (batch, seq, vocab) and an `ActivationCache` of detached copies keyed by canonical name. The
        recording functions run after any hooks already attached (e.g. by an enclosing `hooks` context), so they
        see patched values. If the model runs several forward calls, the last one wins.
    """
    arch = _arch(model)
    if names is None:
        selected: list[str] = _all_names(arch, include_pattern=_is_eager(arch))
    elif isinstance(names, str) or callable(names):
        selected = _expand(arch, names)
    else:
        selected = [_resolve(n, arch) for n in names]
    store: dict[str, torch.Tensor] = {}

    def record(tensor: torch.Tensor, *, hook: HookPoint) -> None:
        store[hook.name] = tensor.detach().clone()

    logits = run_with_hooks(
        model, inputs, [(n, record) for n in dict.fromkeys(selected)], no_grad=no_grad, **forward_kwargs
    )
    order = {n: i for i, n in enumerate(_all_names(arch))}
    return logits, ActivationCache({k: store[k] for k in sorted(store, key=order.__getitem__)})


# ---------------------------------------------------------------------------------------------------------------
# Helpers: patching, steering, head ablation
# ---------------------------------------------------------------------------------------------------------------


def _pos_index(positions: Positions) -> Any:
    if positions is None:
        return slice(None)
    if isinstance(positions, (int, slice)):
        return positions
    if isinstance(positions, torch.Tensor):
        return positions.long()
    return torch.as_tensor(list(positions), dtype=torch.long)


def _at(dim: int, idx: Any) -> tuple[Any, ...]:
    return (slice(None),) * dim + (idx,)


def patch_activation(
    name: str,
    source_cache: Mapping[str, torch.Tensor],
    positions: Positions = None,
    *,
    source_positions: Positions = None,
) -> HookFn:
    """A hook function that overwrites the activation with ``source_cache[name]`` (activation patching).

    Args:
        name: Name whose cached activation is the source (aliases allowed with an `ActivationCache`). The returned
            function is usually attached at the same name.
        source_cache: The source run's cache (e.g. from `run_with_cache`).
        positions: Sequence positions to patch (int, list, slice, index tensor); ``None`` patches everything. For
            ``hook_pattern`` these are query positions.
        source_positions: Positions to read in the source (default: `positions`), for sources of another length.

    Returns:
        ``fn(tensor, *, hook) -> tensor``. A batch-1 source broadcasts over the target batch.
    """
    source = source_cache[name]
    tgt_idx = _pos_index(positions)
    src_idx = tgt_idx if source_positions is None else _pos_index(source_positions)

    def hook_fn(tensor: torch.Tensor, *, hook: HookPoint) -> torch.Tensor:
        dim = _seq_dim(hook.name)
        src = source.to(device=tensor.device, dtype=tensor.dtype)
        out = tensor.clone()
        out[_at(dim, tgt_idx)] = src[_at(dim, src_idx)]
        return out

    return hook_fn


def add_vector(vector: torch.Tensor, positions: Positions = None, scale: float = 1.0) -> HookFn:
    """A hook function adding ``scale * vector`` to the activation (activation steering).

    `vector` broadcasts against the activation's trailing dims, e.g. (d_model,) at a residual point or
    (n_heads, head_dim) at ``attn.hook_z``. `positions` restricts the addition to some sequence positions.
    """

    idx = _pos_index(positions)

    def hook_fn(tensor: torch.Tensor, *, hook: HookPoint) -> torch.Tensor:
        delta = scale * vector.to(device=tensor.device, dtype=tensor.dtype)
        if positions is None:
            return tensor + delta
        dim = _seq_dim(hook.name)
        out = tensor.clone()
        out[_at(dim, idx)] = out[_at(dim, idx)] + delta
        return out

    return hook_fn


def ablate_heads(
    layer: int,
    heads: int | Sequence[int],
    mode: str = "zero",
    mean_cache: Mapping[str, torch.Tensor] | torch.Tensor | None = None,
    positions: Positions = None,
) -> tuple[str, HookFn]:
    """A ``(name, fn)`` pair ablating attention heads of `layer` at ``blocks.{layer}.attn.hook_z``.

    Args:
        layer: Decoder layer.
        heads: Head index or indices.
        mode: ``"zero"`` sets the heads' outputs z to 0; ``"mean"`` sets them to their mean over the batch and
            positions of a reference run.
        mean_cache: For ``"mean"``: a cache holding ``blocks.{layer}.attn.hook_z`` of the reference run, or a z
            tensor (batch, seq, n_heads, head_dim) or an already averaged (n_heads, head_dim). (Pad positions are
            included in the average; pass an averaged tensor to exclude them.)
        positions: Sequence positions to ablate (default all).

    Returns:
        A pair to put in ``fwd=[...]`` of `hooks` / `run_with_hooks`.
    """
    name = f"blocks.{layer}.attn.hook_z"
    head_idx = [heads] if isinstance(heads, int) else list(heads)
    if mode not in ("zero", "mean"):
        raise ValueError(f"mode must be 'zero' or 'mean', got {mode!r}")
    mean: torch.Tensor | None = None
    if mode == "mean":
        if mean_cache is None:
            raise ValueError("mode='mean' needs mean_cache (a cache with attn.hook_z, or a z tensor)")
        z = mean_cache if isinstance(mean_cache, torch.Tensor) else mean_cache[name]
        mean = z if z.dim() == 2 else z.reshape(-1, *z.shape[-2:]).float().mean(0)  # (n_heads, head_dim)
    pos = _pos_index(positions)

    def hook_fn(z: torch.Tensor, *, hook: HookPoint) -> torch.Tensor:
        # z: (batch, seq, n_heads, head_dim)
        out = z.clone()
        for h in head_idx:
            if mean is None:
                out[:, pos, h] = 0.0
            else:
                out[:, pos, h] = mean[h].to(device=z.device, dtype=z.dtype)
        return out

    return name, hook_fn


def head_contributions(model: nn.Module, layer: int, z: torch.Tensor) -> torch.Tensor:
    """Per-head contributions ``z_h @ W_O[:, h-slice].T`` of layer `layer`: (batch, seq, n_heads, d_model).

    Their sum over heads (plus ``o_proj.bias`` if any) is ``o_proj``'s output ``blocks.{layer}.attn.hook_out``. That
    is ``hook_attn_out`` for llama; for gemma3 apply ``post_attention_layernorm`` to the sum to get ``hook_attn_out``
    (the norm is not linear, so per-head terms do not pass through it separately).

    Args:
        model: The model.
        layer: Decoder layer.
        z: ``blocks.{layer}.attn.hook_z`` (batch, seq, n_heads, head_dim).
    """
    arch = _arch(model)
    w_o = arch.layers[layer].self_attn.o_proj.weight  # (d_model, n_heads * head_dim)
    w_o = w_o.view(w_o.shape[0], arch.n_heads, arch.head_dim)  # (d_model, n_heads, head_dim)
    return torch.einsum("bshd,mhd->bshm", z.to(w_o.dtype), w_o)
