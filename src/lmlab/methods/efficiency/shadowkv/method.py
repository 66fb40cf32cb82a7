"""ShadowKV (Sun et al., ICML 2025): low-rank pre-RoPE keys, values apart, landmark selection, on-the-fly rebuild.

K_sel = RoPE(U[pos] · SV, pos),  pos = top-(budget/8) chunks of max_g Σ_q softmax(q · L^T / sqrt(d)) over landmarks L
(https://arxiv.org/abs/2410.21465; reference: ByteDance-Seed/ShadowKV ``models/kv_cache.py``, class `ShadowKVCache`).

Prefill, per layer (n prompt tokens, kv heads Hkv, head dim d, chunk c = 8):

1. SVD of the pre-RoPE keys with the kv heads concatenated, K_pre (n, Hkv·d) = U S Vᵀ; keep U_r (n, r), shared by
   all heads, and SV = diag(S_r) V_rᵀ reshaped to (Hkv, r, d). Prefill attention itself stays exact and dense.
2. ``chunks = n // c - local_chunks``; the trailing ``n - c·chunks`` tokens (the local window plus the alignment
   remainder) keep exact post-RoPE K and exact V, resident.
3. Landmarks: per chunk and kv head, the mean of its c post-RoPE keys.
4. Outliers: per chunk, min over its keys of cos(key, landmark); the `outlier_chunks` lowest chunks per kv head keep
   exact K and V, resident, and leave the landmark set.
5. All values go to the "offloaded" tier (here: a separate tensor, counted apart from the resident one).

Decode, per layer, for the q new tokens (1 at a decode step, more for a follow-up query):

1. ``p = softmax(q · Lᵀ · scale)`` over landmark chunks, per query head, in fp32; sum over the q tokens; max over the
   query heads of each GQA group; top ``budget / c`` chunks per kv head.
2. Rebuild the selected keys K_sel = U[pos] @ SV_h and apply RoPE at their original positions `pos`; gather their V
   from the offloaded tier.
3. Exact attention over [local ‖ outliers ‖ selected ‖ generated (incl. the new tokens)]; the new tokens are causal
   among themselves. Local and outlier tokens are on top of the sparse budget (reference; issue #15).

Baselines (``baselines.py``) share the `Selector` interface: full attention, Quest, Loki and StreamingLLM.
Everything runs inside a real HF model through `lmlab.core.inference.attention.use_controller` and
`KVSelectionController`.

Models (`model_support`): Llama (pre-RoPE keys = ``k_proj(x)``) and Gemma-3 text (pre-RoPE keys =
``k_norm(k_proj(x))``, the tensor transformers' `Gemma3Attention` rotates). Only full-attention layers are sparsified;
Gemma-3's sliding-window layers (5 of every 6) stay dense: their cache is already bounded by the window, and the
reference targets full-attention caches. Other model types are refused with an error naming the type. The prefill
is an explicit phase (`KVSelectionController.begin_prefill`), so a chunked prefill builds the state on the whole
prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from lmlab.core.inference.attention import (
    AttentionController,
    _hf_sdpa,
    chunk_positions,
    decoder_layers,
    group_scores,
    rope_at,
    sdpa_gqa,
    tensor_bytes,
    topk_sorted,
)

# ---------------------------------------------------------------------------------------------------------------
# The selector interface shared by ShadowKV and its baselines


class Selector:
    """A decode-time KV policy: `build` a per-layer state at prefill, `attend` with it at each decode step.

    `build` gets the layer's pre-RoPE keys of the whole prompt (B, n, Hkv·d) (after ``k_norm`` on Gemma-3), and its
    post-RoPE keys and values (B, Hkv, n, d), once the (possibly chunked) prefill is complete.

    `attend` gets the post-RoPE query of the q new tokens (B, Hq, q, d) and the exact K/V of every token generated
    after the prefill (B, Hkv, t, d), the new ones last (HF's cache acts as the generated buffer; prefill K/V are
    read only from the selector's own state). It returns (B, Hq, q, d) and the number of prefill tokens attended
    per kv head.
    """

    name = "selector"

    def build(self, k_pre: torch.Tensor | None, k: torch.Tensor, v: torch.Tensor, layer: int) -> Any:
        raise NotImplementedError

    def attend(
        self, state: Any, q: torch.Tensor, k_gen: torch.Tensor, v_gen: torch.Tensor, *, scaling: float, rope: Any
    ) -> tuple[torch.Tensor, int]:
        raise NotImplementedError

    def resident_bytes(self, state: Any) -> int:
        """Bytes this policy keeps resident (on the accelerator in the paper's setting) for one layer's prefill."""
        raise NotImplementedError

    def offloaded_bytes(self, state: Any) -> int:
        return 0


@dataclass
class ShadowKVState:
    """Per-layer ShadowKV state of a batch. Shapes: B batch, n prefill tokens, Hkv kv heads, d head dim.

    Attributes:
        U: (B, n, r) left singular vectors of the pre-RoPE keys (all heads share them).
        SV: (B, Hkv, r, d) diag(S_r) V_rᵀ per kv head.
        landmarks: (B, Hkv, C', d) post-RoPE chunk means of the non-outlier chunks; landmark_idx (B, Hkv, C') ids.
        outlier_k, outlier_v: (B, Hkv, O·c, d) exact post-RoPE K and V of the outlier chunks.
        local_k, local_v: (B, Hkv, n_local, d) exact K and V of the trailing local tokens.
        v_offload: (B, Hkv, n, d) every prefill value (the offloaded tier).
        singular_values: (B, min(n, Hkv·d)) full spectrum of the pre-RoPE keys (for the low-rank report).
    """

    U: torch.Tensor
    SV: torch.Tensor
    landmarks: torch.Tensor
    landmark_idx: torch.Tensor
    outlier_k: torch.Tensor
    outlier_v: torch.Tensor
    local_k: torch.Tensor
    local_v: torch.Tensor
    v_offload: torch.Tensor
    singular_values: torch.Tensor
    n: int
    n_chunks: int
    outlier_idx: torch.Tensor | None = None
    stats: dict[str, float] = field(default_factory=dict)

    def resident_bytes(self) -> int:
        return tensor_bytes(
            self.U,
            self.SV,
            self.landmarks,
            self.landmark_idx,
            self.outlier_k,
            self.outlier_v,
            self.local_k,
            self.local_v,
        )

    def offloaded_bytes(self) -> int:
        return tensor_bytes(self.v_offload)


def low_rank_keys(
    k_pre: torch.Tensor, rank: int, n_kv_heads: int, svd: tuple[torch.Tensor, ...] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SVD of the pre-RoPE keys (B, n, Hkv·d) -> U_r (B, n, r), SV (B, Hkv, r, d), all singular values (B, m).

    fp32 `torch.linalg.svd(full_matrices=False)` (the reference uses `torch.svd` in fp32: same factors). `svd`
    passes a precomputed ``(u, s, vh)`` of the same keys (shared by several ranks).
    """
    b, n, width = k_pre.shape
    d = width // n_kv_heads
    u, s, vh = svd if svd is not None else torch.linalg.svd(k_pre.float(), full_matrices=False)
    r = min(rank, s.shape[-1])
    sv = (s[:, :r, None] * vh[:, :r]).view(b, r, n_kv_heads, d).transpose(1, 2)  # (B, Hkv, r, d)
    return u[:, :, :r].contiguous(), sv.contiguous(), s


def rebuild_keys(
    U: torch.Tensor, SV: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """Keys of positions `pos` (B, Hkv, S) rebuilt from the low-rank factors and re-rotated at those positions."""
    b = U.shape[0]
    u_sel = U[torch.arange(b, device=U.device)[:, None, None], pos]  # (B, Hkv, S, r)
    k_sel = torch.matmul(u_sel, SV)  # (B, Hkv, S, d)
    return rope_at(k_sel, cos, sin, pos)


def landmarks_and_outliers(
    k_ctx: torch.Tensor, chunk_size: int, n_outliers: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chunk landmarks and outlier chunks of the context keys k_ctx (B, Hkv, C·c, d) (post-RoPE).

    Returns ``landmarks (B, Hkv, C - O, d)``, ``landmark_idx (B, Hkv, C - O)`` (ascending chunk ids),
    ``outlier_idx (B, Hkv, O)`` and the per-chunk minimum cosine similarity (B, Hkv, C).
    """
    b, h, n_ctx, d = k_ctx.shape
    c = n_ctx // chunk_size
    chunks = k_ctx.view(b, h, c, chunk_size, d)
    means = chunks.mean(dim=-2)  # (B, Hkv, C, d)
    cos_min = F.cosine_similarity(means.unsqueeze(3).expand_as(chunks), chunks, dim=-1).amin(dim=-1)  # (B,Hkv,C)
    o = min(n_outliers, c)
    outlier_idx = cos_min.topk(o, dim=-1, largest=False).indices.sort(dim=-1).values  # (B, Hkv, O)
    keep = torch.ones(b, h, c, dtype=torch.bool, device=k_ctx.device)
    keep.scatter_(-1, outlier_idx, False)
    all_idx = torch.arange(c, device=k_ctx.device).expand(b, h, c)
    landmark_idx = all_idx.masked_select(keep).view(b, h, c - o)
    landmarks = means.gather(2, landmark_idx.unsqueeze(-1).expand(b, h, c - o, d))
    return landmarks, landmark_idx, outlier_idx, cos_min


class ShadowKV(Selector):
    """ShadowKV as a `Selector` (see the module docstring).

    Args:
        sparse_budget (`int`): tokens rebuilt per step and kv head (multiple of `chunk_size`); reference 2048.
        rank (`int`): SVD rank r of the pre-RoPE keys (reference 160 of 1024).
        chunk_size (`int`): tokens per chunk / landmark (8).
        local_chunks (`int`): trailing chunks kept exact (4).
        outlier_chunks (`int`): outlier chunks per kv head kept exact (reference 48 at budget 2048).
        select_scale (`float`): scale of the landmark softmax (reference 1/sqrt(128); lmlab 1/sqrt(head_dim)).
        use_outliers (`bool`): False drops the outlier rule (ablation).
    """

    name = "shadowkv"

    def __init__(
        self,
        sparse_budget: int,
        rank: int,
        *,
        chunk_size: int = 8,
        local_chunks: int = 4,
        outlier_chunks: int = 48,
        select_scale: float = 0.125,
        shared: dict | None = None,
    ) -> None:
        if sparse_budget % chunk_size:
            raise ValueError(f"sparse_budget must be a multiple of chunk_size={chunk_size}, got {sparse_budget}")
        self.sparse_budget = int(sparse_budget)
        self.rank = int(rank)
        self.chunk_size = int(chunk_size)
        self.local_chunks = int(local_chunks)
        self.outlier_chunks = int(outlier_chunks)
        self.select_scale = float(select_scale)
        self.shared = shared  # per-layer memo filled by the controller's prefill (one SVD for every rank)

    def layout(self, n: int) -> dict[str, int]:
        """Token accounting for n prefill tokens: chunks, local, outlier and selected tokens, and their total."""
        c = max(0, n // self.chunk_size - self.local_chunks)
        o = min(self.outlier_chunks, c)
        sel = min(self.sparse_budget // self.chunk_size, c - o) * self.chunk_size
        local = n - c * self.chunk_size
        return {
            "chunks": c,
            "local": local,
            "outlier": o * self.chunk_size,
            "selected": sel,
            "total": local + o * self.chunk_size + sel,
        }

    def build(self, k_pre: torch.Tensor | None, k: torch.Tensor, v: torch.Tensor, layer: int) -> ShadowKVState:
        if k_pre is None:
            raise ValueError("ShadowKV needs the pre-RoPE keys (B, n, Hkv*d) (PreRopeKeyCapture), got None")
        b, h, n, d = k.shape
        svd = None
        if self.shared is not None:
            key = ("svd", layer)
            if key not in self.shared:
                self.shared[key] = torch.linalg.svd(k_pre.float(), full_matrices=False)
            svd = self.shared[key]
        U, SV, s = low_rank_keys(k_pre, self.rank, h, svd)
        lay = self.layout(n)
        c, cs = lay["chunks"], self.chunk_size
        n_ctx = c * cs
        local_k, local_v = k[:, :, n_ctx:].contiguous(), v[:, :, n_ctx:].contiguous()
        if c > 0:
            landmarks, landmark_idx, outlier_idx, _ = landmarks_and_outliers(k[:, :, :n_ctx], cs, self.outlier_chunks)
            opos = chunk_positions(outlier_idx, cs)  # (B, Hkv, O·c)
            outlier_k = k.gather(2, opos.unsqueeze(-1).expand(b, h, opos.shape[-1], d))
            outlier_v = v.gather(2, opos.unsqueeze(-1).expand(b, h, opos.shape[-1], d))
        else:
            landmarks = k.new_zeros(b, h, 0, d)
            landmark_idx = torch.zeros(b, h, 0, dtype=torch.long, device=k.device)
            outlier_idx = landmark_idx
            outlier_k = outlier_v = k.new_zeros(b, h, 0, d)
        return ShadowKVState(
            U=U.to(k.dtype),
            SV=SV.to(k.dtype),
            landmarks=landmarks.contiguous(),
            landmark_idx=landmark_idx.contiguous(),
            outlier_k=outlier_k.contiguous(),
            outlier_v=outlier_v.contiguous(),
            local_k=local_k,
            local_v=local_v,
            v_offload=v,  # the prefill values as HF handed them (its cache grows by cat: never mutated)
            singular_values=s,
            n=n,
            n_chunks=c,
            outlier_idx=outlier_idx,
        )

    def select(self, state: ShadowKVState, q: torch.Tensor) -> torch.Tensor:
        """Positions (B, Hkv, S) of the top ``budget / c`` landmark chunks for the new queries q (B, Hq, q, d)."""
        b, hq, ql, d = q.shape
        h = state.landmarks.shape[1]
        g = hq // h
        k_sel = self.sparse_budget // self.chunk_size
        if state.landmarks.shape[2] == 0 or k_sel == 0:
            return torch.zeros(b, h, 0, dtype=torch.long, device=q.device)
        # (B, Hkv, G*q, d) x (B, Hkv, d, C') -> (B, Hkv, G*q, C'): one GEMM per kv head, no broadcast copy
        logits = torch.matmul(q.reshape(b, h, g * ql, d), state.landmarks.transpose(-1, -2))
        p = torch.softmax(logits.float() * self.select_scale, dim=-1).view(b, hq, ql, -1)
        best = topk_sorted(group_scores(p, h), k_sel)  # (B, Hkv, k) indices into the landmark list
        chunks = state.landmark_idx.gather(-1, best)
        return chunk_positions(chunks, self.chunk_size)

    def attend(
        self,
        state: ShadowKVState,
        q: torch.Tensor,
        k_gen: torch.Tensor,
        v_gen: torch.Tensor,
        *,
        scaling: float,
        rope: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, int]:
        pos = self.select(state, q)
        k_sel = rebuild_keys(state.U, state.SV, pos, *rope).to(q.dtype)
        v_sel = state.v_offload.gather(2, pos.unsqueeze(-1).expand(*pos.shape, state.v_offload.shape[-1]))
        keys = torch.cat([state.local_k, state.outlier_k, k_sel, k_gen], dim=2)
        values = torch.cat([state.local_v, state.outlier_v, v_sel, v_gen], dim=2)
        attended = state.local_k.shape[2] + state.outlier_k.shape[2] + pos.shape[-1]
        return sdpa_gqa(q, keys, values, scaling=scaling), attended

    def resident_bytes(self, state: ShadowKVState) -> int:
        return state.resident_bytes()

    def offloaded_bytes(self, state: ShadowKVState) -> int:
        return state.offloaded_bytes()


# ---------------------------------------------------------------------------------------------------------------
# Model support: where the pre-RoPE keys are, which layers are sparsified, the RoPE tables of those layers

# model_type -> the attention submodule whose output RoPE is applied to. Llama: RoPE(k_proj(x)). Gemma-3
# (transformers' Gemma3Attention.forward): k = k_norm(k_proj(x).view(B, T, Hkv, d).transpose(1, 2)), then RoPE, so
# the pre-RoPE keys are k_norm's output (B, Hkv, T, d), not k_proj's.
PRE_ROPE_KEY_SITES: dict[str, str] = {"llama": "k_proj", "gemma3_text": "k_norm"}
FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"


@dataclass(frozen=True)
class ModelSupport:
    """What ShadowKV needs to know about a decoder: the pre-RoPE key site and the layers it sparsifies.

    Attributes:
        model_type: ``config.model_type``.
        key_site: ``"k_proj"`` or ``"k_norm"`` (the module whose output RoPE rotates).
        sparse_layers: full-attention layers (ShadowKV and its baselines apply there).
        dense_layers: sliding-window layers: their cache already holds at most `sliding_window` tokens, so they
            stay dense (exact HF SDPA with the sliding mask), as ShadowKV targets the full-attention cache.
    """

    model_type: str
    key_site: str
    sparse_layers: tuple[int, ...]
    dense_layers: tuple[int, ...]


def _text_config(model: Any) -> Any:
    cfg = model.config
    return getattr(cfg, "get_text_config", lambda: cfg)()


def model_support(model: Any) -> ModelSupport:
    """The `ModelSupport` of `model`; a one-line ValueError naming the model type when ShadowKV cannot handle it."""
    cfg = _text_config(model)
    mt = str(getattr(cfg, "model_type", type(model).__name__))
    if mt not in PRE_ROPE_KEY_SITES:
        known = ", ".join(repr(k) for k in sorted(PRE_ROPE_KEY_SITES))
        raise ValueError(
            f"ShadowKV does not support model type {mt!r}: expected one of {known} (where its pre-RoPE keys and RoPE "
            "tables are known)"
        )
    if getattr(cfg, "attn_logit_softcapping", None) is not None:
        raise ValueError(
            f"ShadowKV does not support {mt!r} with attn_logit_softcapping={cfg.attn_logit_softcapping}: expected "
            "None (the sparse attention is plain softmax)"
        )
    n_layers = len(decoder_layers(model))
    types = list(getattr(cfg, "layer_types", None) or [FULL_ATTENTION] * n_layers)
    bad = sorted({t for t in types if t not in (FULL_ATTENTION, SLIDING_ATTENTION)})
    if bad:
        raise ValueError(f"ShadowKV does not support layer types {bad} of {mt!r}: expected {FULL_ATTENTION!r} or "
                         f"{SLIDING_ATTENTION!r}")  # fmt: skip
    sparse = tuple(i for i, t in enumerate(types) if t == FULL_ATTENTION)
    if not sparse:
        raise ValueError(f"{mt!r} has no full-attention layer: nothing for ShadowKV to sparsify")
    dense = tuple(i for i, t in enumerate(types) if t != FULL_ATTENTION)
    return ModelSupport(mt, PRE_ROPE_KEY_SITES[mt], sparse, dense)


def rope_tables(model: Any, n_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin`` (n_positions, d) of the full-attention layers, from the model's own rotary embedding.

    Gemma-3 keeps one table per layer type (full-attention layers use ``rope_parameters["full_attention"]``, theta
    1e6, sliding ones theta 1e4); its rotary module then takes the layer type as a third argument.
    """
    inner = getattr(model, "model", model)
    rot = inner.rotary_emb
    ref = next(model.parameters())
    pos = torch.arange(n_positions, device=ref.device).unsqueeze(0)
    x = torch.zeros(1, device=ref.device, dtype=ref.dtype)
    if hasattr(rot, f"{FULL_ATTENTION}_inv_freq"):  # per-layer-type tables (Gemma-3)
        cos, sin = rot(x, pos, FULL_ATTENTION)
    else:
        cos, sin = rot(x, pos)
    return cos[0], sin[0]


class PreRopeKeyCapture:
    """Forward hooks on the pre-RoPE key site of the given layers: ``captured[layer]`` (B, T, Hkv·d) of the latest
    forward (the concatenated kv heads the ShadowKV SVD works on). Remove with `remove()`.

    ``k_proj`` already returns (B, T, Hkv·d); ``k_norm`` (Gemma-3) returns (B, Hkv, T, d) and is flattened back.
    """

    def __init__(self, model: Any, layers: tuple[int, ...], site: str) -> None:
        self.captured: dict[int, torch.Tensor] = {}
        self._handles = []
        mods = decoder_layers(model)
        for i in layers:
            self._handles.append(getattr(mods[i].self_attn, site).register_forward_hook(self._hook(i, site)))

    def _hook(self, i: int, site: str):  # noqa: ANN202
        def fn(_mod, _inp, out):  # noqa: ANN001, ANN202
            if site == "k_norm":  # (B, Hkv, T, d) -> (B, T, Hkv*d)
                out = out.transpose(1, 2).flatten(2)
            self.captured[i] = out.detach()

        return fn

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.captured.clear()


# ---------------------------------------------------------------------------------------------------------------
# Controller: run selectors inside a HF model


class KVSelectionController(AttentionController):
    """Prefill dense (building every selector's state per layer), decode with the `active` selector.

    Phase (explicit, never guessed from shapes): `begin_prefill(n)` declares that the next forward calls prefill n
    prompt tokens, in one call or in chunks (`prefill(..., controller=, chunk_tokens=)` does this). Every call until
    a layer's cache holds n tokens is prefill: exact HF SDPA, and the layer's pre-RoPE key chunks are collected; the
    call that completes the n tokens builds each selector's state on the whole prompt (pre-RoPE keys, post-RoPE keys
    and values). Without a declaration, a forward on an empty cache (cache length before the call = 0) is a one-shot
    prefill, so ``model.generate(ids)`` works as is. Every later call is decode (one token, or several for a
    follow-up query): the active selector attends over its state plus the tokens since the prefill.
    ``active="full"`` decodes with exact SDPA over the whole HF cache.

    Only full-attention layers are sparsified (`ModelSupport.sparse_layers`); Gemma-3's sliding-window layers stay
    dense. The cache length before a call is ``key_len - query_len`` on a full-attention layer (its HF cache keeps
    every token). Assumes unpadded batches (every row the same length), as the experiment builds them.

    Attributes:
        states: ``states[name][layer]``, rebuilt at every prefill, for the sparse layers.
        attended: ``attended[name]`` prefill tokens attended per kv head at each decode call of a sparse layer, for
            budget accounting measured from the selected tensors.
        support: the model's `ModelSupport` (set by `install`): which layers were sparsified.
    """

    def __init__(self, selectors: dict[str, Selector], active: str = "full", shared: dict | None = None) -> None:
        self.selectors = dict(selectors)
        self.shared = shared  # memo the selectors share within one layer's prefill; cleared per layer
        self.active = active
        self.states: dict[str, dict[int, Any]] = {name: {} for name in self.selectors}
        self.attended: dict[str, list[int]] = {}
        self.n_prefill = 0
        self.support: ModelSupport | None = None
        self._declared: int | None = None  # prefill length announced by `begin_prefill`, until every layer built
        self._built: set[int] = set()  # sparse layers whose state covers the current prefill
        self._pending: dict[int, list[torch.Tensor]] = {}  # pre-RoPE key chunks (B, T_i, Hkv*d) of a prefill
        self._capture: PreRopeKeyCapture | None = None
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def sparse_layers(self) -> tuple[int, ...]:
        return self.support.sparse_layers if self.support is not None else ()

    def install(self, model: Any) -> None:
        self.support = model_support(model)  # raises for an unsupported model before anything is hooked
        self._capture = PreRopeKeyCapture(model, self.support.sparse_layers, self.support.key_site)
        n_pos = int(getattr(_text_config(model), "max_position_embeddings", 8192) or 8192)
        self._rope = rope_tables(model, n_pos)

    def remove(self) -> None:
        if self._capture is not None:
            self._capture.remove()
        self._capture = None
        self._pending.clear()

    def begin_prefill(self, n_tokens: int) -> None:
        """Declare a prefill of `n_tokens` prompt tokens (any number of forward calls); drops the previous states."""
        if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 1:
            raise ValueError(f"begin_prefill needs a prompt length >= 1, got {n_tokens!r}")
        self._declared = n_tokens
        self._built.clear()
        self._pending.clear()
        for st in self.states.values():
            st.clear()

    def attend(self, module, query, key, value, attention_mask, *, scaling, **kwargs):  # noqa: ANN001, ANN201
        layer = int(module.layer_idx)
        if layer not in self.sparse_layers:  # sliding-window layer: dense, whatever the phase
            return _hf_sdpa(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
        q_len = query.shape[2]
        past = key.shape[2] - q_len  # cache length before this call (a full-attention cache keeps every token)
        if self._declared is not None and layer not in self._built:
            target: int | None = self._declared
        elif past == 0:
            target = q_len  # undeclared: a forward on an empty cache is a one-shot prefill
        else:
            target = None
        if target is not None:
            self._prefill_call(layer, past, q_len, target, key, value)
            return _hf_sdpa(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
        if self.active == "full" or self.active not in self.selectors:
            return _hf_sdpa(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
        sel = self.selectors[self.active]
        state = self.states[self.active].get(layer)
        if state is None:
            raise RuntimeError(f"layer {layer}: decode call before its prefill was completed (no {self.active} state)")
        n0 = state.n
        out, attended = sel.attend(
            state, query, key[:, :, n0:], value[:, :, n0:], scaling=float(scaling), rope=self._rope
        )
        self.attended.setdefault(self.active, []).append(attended)
        return out.transpose(1, 2).contiguous(), None

    def _prefill_call(
        self, layer: int, past: int, q_len: int, target: int, key: torch.Tensor, value: torch.Tensor
    ) -> None:
        """One prefill forward of a sparse layer: collect its pre-RoPE keys; build the states once n are in."""
        if past + q_len > target:
            raise ValueError(
                f"layer {layer}: a forward call of {q_len} tokens after {past} cached crosses the declared prefill "
                f"of {target} tokens; expected chunks that end exactly at the prefill length"
            )
        if past == 0:
            self._pending[layer] = []
        chunks = self._pending.setdefault(layer, [])
        have = sum(c.shape[1] for c in chunks)
        k_pre = self._capture.captured.get(layer) if self._capture is not None else None
        if have != past or k_pre is None or k_pre.shape[1] != q_len:
            raise RuntimeError(
                f"layer {layer}: prefill chunk of {q_len} tokens after {past} cached, but {have} pre-RoPE keys were "
                f"collected and {None if k_pre is None else k_pre.shape[1]} captured in this call"
            )
        chunks.append(k_pre)  # (B, q_len, Hkv*d)
        if past + q_len < target:
            return
        k_pre_all = torch.cat(chunks, dim=1)  # (B, n, Hkv*d): the whole prompt's pre-RoPE keys
        del self._pending[layer]
        if self.shared is not None:
            self.shared.clear()
        for name, sel in self.selectors.items():
            self.states[name][layer] = sel.build(k_pre_all, key, value, layer)  # key/value: (B, Hkv, n, d)
        self.n_prefill = target
        self._built.add(layer)
        if self._declared is not None and self._built >= set(self.sparse_layers):
            self._declared = None  # the declared prefill is complete: later calls are decode

    def resident_bytes(self, name: str) -> int:
        return sum(self.selectors[name].resident_bytes(s) for s in self.states[name].values())

    def offloaded_bytes(self, name: str) -> int:
        return sum(self.selectors[name].offloaded_bytes(s) for s in self.states[name].values())


# ---------------------------------------------------------------------------------------------------------------
# Model-level helpers


def rewind(cache: Any, n: int) -> None:
    """Crop a HF cache back to its first n tokens (drop everything decoded since)."""
    cur = cache.get_seq_length()
    if cur > n:
        cache.crop(n - cur)


def keep_past(cache: Any) -> None:
    """Let sliding-window cache layers (Gemma-3) keep what is decoded after the prefill, so `rewind` can crop them.

    transformers' `DynamicSlidingWindowLayer` otherwise drops tokens older than the window at each update and
    refuses to crop once the window is full.
    """
    for layer in getattr(cache, "layers", ()):
        if getattr(layer, "is_sliding", False) and hasattr(layer, "activate_past_recording"):
            layer.activate_past_recording()


@torch.no_grad()
def prefill(
    model: Any, ids: torch.Tensor, *, controller: KVSelectionController | None = None, chunk_tokens: int | None = None
) -> tuple[Any, torch.Tensor]:
    """Dense prefill of ids (B, n): ``(cache, last-position logits (B, V))``.

    `controller` (the active `KVSelectionController`) gets the prefill declared (`begin_prefill(n)`), so its states
    are built once the whole prompt is in, also over several forward calls of `chunk_tokens` tokens (chunked
    prefill); without it, only a one-shot prefill is allowed (the controller's empty-cache rule).
    """
    n = ids.shape[1]
    if chunk_tokens is not None and (isinstance(chunk_tokens, bool) or int(chunk_tokens) < 1):
        raise ValueError(f"chunk_tokens must be an int >= 1 or None, got {chunk_tokens!r}")
    step = n if chunk_tokens is None else int(chunk_tokens)
    if step < n and controller is None:
        raise ValueError(f"a chunked prefill (chunk_tokens={step} < {n} tokens) needs controller= to declare its end")
    if controller is not None:
        controller.begin_prefill(n)
    cache = None
    for start in range(0, n, step):
        out = model(input_ids=ids[:, start : start + step], cache=cache, use_cache=True, logits_to_keep=1)
        cache = out.cache
    keep_past(cache)
    return cache, out.logits[:, -1].float()


@torch.no_grad()
def teacher_forced_logprobs(model: Any, cache: Any, ids: torch.Tensor, n: int, steps: int) -> torch.Tensor:
    """Feed ids[:, n : n + steps] one token at a time after a prefill of n tokens; log-probs (B, steps, V).

    Row t is the prediction of token n + t + 1 made while decoding token n + t with the active policy.
    """
    rewind(cache, n)
    outs = []
    for t in range(steps):
        out = model(input_ids=ids[:, n + t : n + t + 1], cache=cache, use_cache=True)
        outs.append(torch.log_softmax(out.logits[:, -1].float(), dim=-1))
    rewind(cache, n)
    return torch.stack(outs, dim=1)


def fidelity(ref_lp: torch.Tensor, lp: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per (row, step) KL(ref ‖ method), top-1 agreement and ΔNLL of the true next tokens (B, T) from log-probs."""
    kl = (ref_lp.exp() * (ref_lp - lp)).sum(-1)
    top1 = (ref_lp.argmax(-1) == lp.argmax(-1)).float()
    nll_ref = -ref_lp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    nll = -lp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return {"kl": kl.clamp_min(0.0), "top1_agreement": top1, "delta_nll": nll - nll_ref}


def energy_rank(singular_values: torch.Tensor, fraction: float) -> int:
    """Smallest r with Σ_{i<=r} s_i² >= fraction · Σ s_i² (for one spectrum, 1-D)."""
    e = singular_values.double().pow(2)
    cum = e.cumsum(0) / e.sum().clamp_min(1e-30)
    return int(torch.searchsorted(cum, torch.tensor(fraction, dtype=cum.dtype) - 1e-12).item()) + 1


__all__ = [
    "PRE_ROPE_KEY_SITES",
    "KVSelectionController",
    "ModelSupport",
    "PreRopeKeyCapture",
    "Selector",
    "ShadowKV",
    "ShadowKVState",
    "energy_rank",
    "fidelity",
    "keep_past",
    "landmarks_and_outliers",
    "low_rank_keys",
    "model_support",
    "prefill",
    "rebuild_keys",
    "rewind",
    "rope_tables",
    "teacher_forced_logprobs",
]
