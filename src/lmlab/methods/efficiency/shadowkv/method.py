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
Everything runs inside a real HF model through `lmlab.core.attention.use_controller` and `KVSelectionController`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from lmlab.core.attention import (
    AttentionController,
    KProjCapture,
    _hf_sdpa,
    chunk_positions,
    group_scores,
    rope_at,
    rotary_tables,
    sdpa_gqa,
    tensor_bytes,
    topk_sorted,
)

# ---------------------------------------------------------------------------------------------------------------
# The selector interface shared by ShadowKV and its baselines


class Selector:
    """A decode-time KV policy: `build` a per-layer state at prefill, `attend` with it at each decode step.

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
            raise ValueError("ShadowKV needs the pre-RoPE keys (KProjCapture on k_proj)")
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
# Controller: run selectors inside a HF model


class KVSelectionController(AttentionController):
    """Prefill dense (building every selector's state per layer), decode with the `active` selector.

    A call whose query covers the whole key range (no past) is a prefill: exact SDPA, and each selector's `build`
    runs on that layer's pre-RoPE keys (captured from ``k_proj``), post-RoPE keys and values. Any later call is a
    decode step (one token, or several for a follow-up query): the active selector attends over its state plus the
    tokens generated since the prefill. ``active="full"`` decodes with exact SDPA over the whole HF cache.

    Assumes unpadded batches (every row the same length), as the experiment builds them.

    Attributes:
        states: ``states[name][layer]``, rebuilt at every prefill.
        attended: ``attended[name]`` prefill tokens attended per kv head at each decode call (summed over layers /
            n_layers), for budget accounting measured from the selected tensors.
    """

    def __init__(self, selectors: dict[str, Selector], active: str = "full", shared: dict | None = None) -> None:
        self.selectors = dict(selectors)
        self.shared = shared  # memo the selectors share within one layer's prefill; cleared per layer
        self.active = active
        self.states: dict[str, dict[int, Any]] = {name: {} for name in self.selectors}
        self.attended: dict[str, list[int]] = {}
        self.n_prefill = 0
        self._capture: KProjCapture | None = None
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None
        self._model: Any = None

    def install(self, model: Any) -> None:
        self._model = model
        self._capture = KProjCapture(model)
        n_pos = int(getattr(model.config, "max_position_embeddings", 8192) or 8192)
        self._rope = rotary_tables(model, n_pos)

    def remove(self) -> None:
        if self._capture is not None:
            self._capture.remove()
        self._capture = None

    def attend(self, module, query, key, value, attention_mask, *, scaling, **kwargs):  # noqa: ANN001, ANN201
        layer = int(module.layer_idx)
        if query.shape[2] == key.shape[2]:  # prefill: exact, and build every selector's state
            k_pre = self._capture.captured.get(layer) if self._capture is not None else None
            if self.shared is not None:
                self.shared.clear()
            for name, sel in self.selectors.items():
                self.states[name][layer] = sel.build(k_pre, key, value, layer)
            self.n_prefill = key.shape[2]
            return _hf_sdpa(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
        if self.active == "full" or self.active not in self.selectors:
            return _hf_sdpa(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
        sel = self.selectors[self.active]
        state = self.states[self.active][layer]
        n0 = state.n
        out, attended = sel.attend(
            state, query, key[:, :, n0:], value[:, :, n0:], scaling=float(scaling), rope=self._rope
        )
        self.attended.setdefault(self.active, []).append(attended)
        return out.transpose(1, 2).contiguous(), None

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


@torch.no_grad()
def prefill(model: Any, ids: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """Dense prefill of ids (B, n) under whatever controller is active: ``(cache, last-position logits (B, V))``."""
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    return out.cache, out.logits[:, -1].float()


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
    "KVSelectionController",
    "Selector",
    "ShadowKV",
    "ShadowKVState",
    "energy_rank",
    "fidelity",
    "landmarks_and_outliers",
    "low_rank_keys",
    "prefill",
    "rebuild_keys",
    "rewind",
    "teacher_forced_logprobs",
]
