"""Custom attention inside HF models, and the budget-selection helpers of KV-selection methods.

One attention function, ``"lmlab_sparse"``, is registered with `transformers.AttentionInterface` (and the SDPA mask
builder with `AttentionMaskInterface`, so HF prepares the same 4-D mask it prepares for ``"sdpa"``). It dispatches
each call to the innermost active `AttentionController` (a context manager, `use_controller`), or to HF's SDPA when
none is active. A controller sees every attention call of the model with the post-RoPE query, the key/value the HF
cache returned (past + new, post-RoPE), the layer index and the positions, and returns the attention output:

    with use_controller(model, MyController()):
        model.generate(ids, max_new_tokens=8)          # every layer's attention goes through the controller

The model is left as it was on exit (``config._attn_implementation`` restored, hooks removed). Pre-RoPE keys, which
HF never hands to the attention function, are captured with a forward hook on each layer's ``k_proj``
(`KProjCapture`).

Helpers for decode-time KV selection at a token budget (shapes: B batch, Hq query heads, Hkv kv heads, G = Hq/Hkv,
q new tokens, N candidates, S selected tokens, d head dim):

- `group_scores`: per-query-head scores (B, Hq, q, N) -> per-kv-head scores (B, Hkv, N), summing over the new
  tokens and taking the max over the G query heads of a group (ShadowKV's rule; one gathered set per kv head keeps
  GQA's memory saving).
- `topk_sorted`, `chunk_positions`, `gather_tokens`, `sink_recent_positions`: indices and gathers.
- `rope_at`, `rotary_tables`: RoPE at arbitrary (gathered) positions, exactly as HF's `apply_rotary_pos_emb`.
- `sdpa_gqa`: exact attention of q new tokens over a key set whose last q entries are those tokens (causal among
  them, full over the rest), GQA-aware, via `F.scaled_dot_product_attention`.
- `tensor_bytes`: bytes of tensors, for memory accounting counted from the tensors themselves.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

ATTN_NAME = "lmlab_sparse"

_ACTIVE: list[AttentionController] = []
_REGISTERED = False


def register_attention() -> str:
    """Register ``"lmlab_sparse"`` with transformers (idempotent); returns the name to pass as attn_implementation."""
    global _REGISTERED
    if not _REGISTERED:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(ATTN_NAME, lmlab_attention_forward)
        AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)
        _REGISTERED = True
    return ATTN_NAME


def _hf_sdpa(module, query, key, value, attention_mask, **kwargs):  # noqa: ANN001, ANN202
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def lmlab_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The registered attention function: the active controller's `attend`, or HF's SDPA when none is active.

    Shapes: query (B, Hq, q, d) post-RoPE; key/value (B, Hkv, L, d) from the HF cache (past + new). Returns
    ``(out (B, q, Hq, d), None)`` like every HF attention function.
    """
    if not _ACTIVE:
        return _hf_sdpa(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    return _ACTIVE[-1].attend(module, query, key, value, attention_mask, scaling=scaling, **kwargs)


class AttentionController:
    """Base controller: dense attention through HF's SDPA. Subclasses override `attend` (and `install`/`remove`)."""

    def install(self, model: Any) -> None:  # hooks, tables
        """Called on entering `use_controller`."""

    def remove(self) -> None:
        """Called on leaving `use_controller` (also on errors)."""

    def attend(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        *,
        scaling: float | None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        return _hf_sdpa(module, query, key, value, attention_mask, scaling=scaling, **kwargs)


def _attn_config(model: Any) -> Any:
    cfg = model.config
    return getattr(cfg, "get_text_config", lambda: cfg)()


@contextlib.contextmanager
def use_controller(model: Any, controller: AttentionController) -> Iterator[AttentionController]:
    """Route every attention call of `model` through `controller` inside the block; restore everything after."""
    name = register_attention()
    configs = {id(c): c for c in (model.config, _attn_config(model))}
    previous = {k: c._attn_implementation for k, c in configs.items()}
    controller.install(model)
    _ACTIVE.append(controller)
    try:
        for c in configs.values():
            c._attn_implementation = name
        yield controller
    finally:
        _ACTIVE.remove(controller)
        for k, c in configs.items():
            c._attn_implementation = previous[k]
        controller.remove()


class KProjCapture:
    """Forward hooks on every decoder layer's ``self_attn.k_proj``: the last pre-RoPE keys per layer.

    ``captured[layer]`` is the k_proj output of the latest forward, (B, T, Hkv * d): the concatenated kv heads the
    ShadowKV SVD works on. Remove with `remove()`.
    """

    def __init__(self, model: Any) -> None:
        self.captured: dict[int, torch.Tensor] = {}
        self._handles = []
        for i, layer in enumerate(decoder_layers(model)):
            self._handles.append(layer.self_attn.k_proj.register_forward_hook(self._hook(i)))

    def _hook(self, i: int):  # noqa: ANN202
        def fn(_mod, _inp, out):  # noqa: ANN001, ANN202
            self.captured[i] = out.detach()

        return fn

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.captured.clear()


def decoder_layers(model: Any) -> list[Any]:
    """The decoder layers of a llama-like HF causal LM (``model.model.layers``)."""
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no .model.layers: not a llama-like decoder")
    return list(layers)


# ---------------------------------------------------------------------------------------------------------------
# RoPE at arbitrary positions


def rotary_tables(model: Any, n_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin`` of shape (n_positions, d) from the model's own rotary embedding (same numbers HF applies)."""
    inner = getattr(model, "model", model)
    rot = inner.rotary_emb
    ref = next(model.parameters())
    pos = torch.arange(n_positions, device=ref.device).unsqueeze(0)
    cos, sin = rot(torch.zeros(1, device=ref.device, dtype=ref.dtype), pos)
    return cos[0], sin[0]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_at(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """RoPE of `x` (..., S, d) at integer positions `pos` (..., S), with tables (P, d): ``x cos + rot(x) sin``."""
    c = cos[pos]  # (..., S, d)
    s = sin[pos]
    return x * c + _rotate_half(x) * s


def unrope_at(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Inverse of `rope_at` (RoPE is a rotation): ``x cos - rot(x) sin``."""
    return x * cos[pos] - _rotate_half(x) * sin[pos]


# ---------------------------------------------------------------------------------------------------------------
# Selection helpers


def group_scores(scores: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """(B, Hq, q, N) per-query-head scores -> (B, Hkv, N): sum over the q new tokens, max over each GQA group."""
    b, hq, _, n = scores.shape
    s = scores.sum(dim=2)  # (B, Hq, N)
    if hq == n_kv_heads:
        return s
    return s.view(b, n_kv_heads, hq // n_kv_heads, n).amax(dim=2)


def topk_sorted(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the top `k` (capped at N) along the last dim, sorted ascending (positions stay in order)."""
    k = min(int(k), scores.shape[-1])
    return scores.topk(k, dim=-1).indices.sort(dim=-1).values


def chunk_positions(chunk_idx: torch.Tensor, chunk_size: int, offset: int = 0) -> torch.Tensor:
    """Chunk ids (..., C) -> token positions (..., C * chunk_size): ``offset + c * chunk_size + j``."""
    ar = torch.arange(chunk_size, device=chunk_idx.device)
    pos = chunk_idx.unsqueeze(-1) * chunk_size + ar + offset
    return pos.flatten(-2)


def gather_tokens(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """x (B, H, L, d), pos (B, H, S) -> (B, H, S, d)."""
    return x.gather(2, pos.unsqueeze(-1).expand(*pos.shape, x.shape[-1]))


def sink_recent_positions(n: int, budget: int, sink: int, *, device: Any = None) -> torch.Tensor:
    """StreamingLLM's kept positions among n past tokens: the first `sink` and the most recent ``budget - sink``."""
    if budget >= n:
        return torch.arange(n, device=device)
    sink = min(sink, budget)
    return torch.cat([torch.arange(sink, device=device), torch.arange(n - (budget - sink), n, device=device)])


def sdpa_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scaling: float | None) -> torch.Tensor:
    """Exact attention of q new tokens (B, Hq, q, d) over keys (B, Hkv, L, d) whose last q entries are those tokens.

    The new tokens attend causally among themselves and fully to the first L - q keys (bottom-right causal, as
    flash-attention's ``causal=True`` with q < L). Returns (B, Hq, q, d).
    """
    ql, kl = q.shape[2], k.shape[2]
    gqa = q.shape[1] != k.shape[1]
    if ql == 1:
        # one new token: pack the G query heads of a group as G "rows" of one kv head (one GEMM per kv head)
        b, hq, _, d = q.shape
        h = k.shape[1]
        out = F.scaled_dot_product_attention(q.reshape(b, h, hq // h, d), k, v, scale=scaling)
        return out.reshape(b, hq, 1, d)
    if ql == kl:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=gqa)
    i = torch.arange(ql, device=q.device).unsqueeze(1)
    j = torch.arange(kl, device=q.device).unsqueeze(0)
    mask = j <= i + (kl - ql)  # (q, L) bool, True = attend
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling, enable_gqa=gqa)


def tensor_bytes(*tensors: torch.Tensor | None) -> int:
    """Total bytes of the given tensors (None ignored): ``numel * element_size``."""
    return int(sum(t.numel() * t.element_size() for t in tensors if t is not None))


def softmax_scale(head_dim: int, mode: float | str | None) -> float:
    """Scale of landmark/score softmaxes: ``1/sqrt(head_dim)`` for None/"head_dim", else ``1/sqrt(mode)``."""
    if mode is None or mode == "head_dim":
        return 1.0 / math.sqrt(head_dim)
    return 1.0 / math.sqrt(float(mode))


__all__ = [
    "ATTN_NAME",
    "AttentionController",
    "KProjCapture",
    "chunk_positions",
    "decoder_layers",
    "gather_tokens",
    "group_scores",
    "lmlab_attention_forward",
    "register_attention",
    "rope_at",
    "rotary_tables",
    "sdpa_gqa",
    "sink_recent_positions",
    "softmax_scale",
    "tensor_bytes",
    "topk_sorted",
    "unrope_at",
    "use_controller",
]
