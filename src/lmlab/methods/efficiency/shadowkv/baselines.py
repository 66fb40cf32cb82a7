"""The paper's KV-selection baselines as `Selector`s, at an equal total attended-token budget.

- `FullKV`: every prefill token (the upper bound; decode itself goes through HF's SDPA).
- `Quest` (Tang et al., 2024): pages of `page_size` post-RoPE keys summarised by their element-wise min and max;
  page score ``Σ_i max(q_i kmin_i, q_i kmax_i)`` (an upper bound of q·k inside the page); the top pages are attended
  exactly. The trailing partial page (the "current" page) is always attended.
- `Loki` (Singhania et al., 2024): an offline PCA basis of the keys per layer and kv head (from a calibration
  text); approximate scores in the top `rank` principal dimensions; exact attention over the top-`budget` tokens.
- `StreamingLLM` (Xiao et al., 2024): `sink` first tokens plus the most recent ones.

All select per kv head with ShadowKV's GQA rule (sum over new tokens, max over the query heads of a group), so every
policy gathers one token set per kv head. Each `attend` returns the number of prefill tokens it attended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lmlab.core.inference.attention import (
    chunk_positions,
    gather_tokens,
    group_scores,
    sdpa_gqa,
    sink_recent_positions,
    tensor_bytes,
    topk_sorted,
)
from lmlab.methods.efficiency.shadowkv.method import Selector


@dataclass
class KVState:
    """Generic per-layer state: kept K/V (B, Hkv, L, d) plus optional summaries."""

    k: torch.Tensor
    v: torch.Tensor
    n: int
    extra: dict[str, torch.Tensor]


class FullKV(Selector):
    """Every prefill token, exact (decode through the same exact attention as the selectors)."""

    name = "full"

    def build(self, k_pre: Any, k: torch.Tensor, v: torch.Tensor, layer: int) -> KVState:
        return KVState(k, v, k.shape[2], {})

    def attend(self, state: KVState, q, k_gen, v_gen, *, scaling, rope):  # noqa: ANN001, ANN201
        keys = torch.cat([state.k, k_gen], dim=2)
        values = torch.cat([state.v, v_gen], dim=2)
        return sdpa_gqa(q, keys, values, scaling=scaling), state.n

    def resident_bytes(self, state: KVState) -> int:
        return tensor_bytes(state.k, state.v)


class StreamingLLM(Selector):
    """Attention sinks + recent window: the `sink` first and ``budget - sink`` last prefill tokens (rest evicted)."""

    name = "streaming"

    def __init__(self, budget: int, sink: int = 4) -> None:
        self.budget = int(budget)
        self.sink = int(sink)

    def build(self, k_pre: Any, k: torch.Tensor, v: torch.Tensor, layer: int) -> KVState:
        pos = sink_recent_positions(k.shape[2], self.budget, self.sink, device=k.device)
        return KVState(k[:, :, pos].contiguous(), v[:, :, pos].contiguous(), k.shape[2], {})

    def attend(self, state: KVState, q, k_gen, v_gen, *, scaling, rope):  # noqa: ANN001, ANN201
        keys = torch.cat([state.k, k_gen], dim=2)
        values = torch.cat([state.v, v_gen], dim=2)
        return sdpa_gqa(q, keys, values, scaling=scaling), state.k.shape[2]

    def resident_bytes(self, state: KVState) -> int:
        return tensor_bytes(state.k, state.v)


class Quest(Selector):
    """Query-aware page selection with min/max page summaries; `budget` total prefill tokens attended."""

    name = "quest"

    def __init__(self, budget: int, page_size: int = 16) -> None:
        self.budget = int(budget)
        self.page_size = int(page_size)

    def build(self, k_pre: Any, k: torch.Tensor, v: torch.Tensor, layer: int) -> KVState:
        b, h, n, d = k.shape
        p = n // self.page_size
        pages = k[:, :, : p * self.page_size].view(b, h, p, self.page_size, d)
        extra = {"kmin": pages.amin(dim=3).contiguous(), "kmax": pages.amax(dim=3).contiguous()}
        return KVState(k, v, n, extra)

    def attend(self, state: KVState, q, k_gen, v_gen, *, scaling, rope):  # noqa: ANN001, ANN201
        b, hq, ql, d = q.shape
        kmin, kmax = state.extra["kmin"], state.extra["kmax"]  # (B, Hkv, P, d)
        h, p = kmin.shape[1], kmin.shape[2]
        g = hq // h
        tail = state.n - p * self.page_size  # the current, partial page: always attended
        room = max(0, self.budget - tail)
        n_pages, rest = min(room // self.page_size, p), room % self.page_size
        qg = q.reshape(b, h, g * ql, 1, d)
        ub = torch.maximum(qg * kmin.unsqueeze(2), qg * kmax.unsqueeze(2)).sum(-1)  # (B, Hkv, G*q, P)
        score = group_scores(ub.view(b, hq, ql, p), h)  # (B, Hkv, P)
        take = min(n_pages + (1 if rest else 0), p)
        ranked = score.topk(take, dim=-1).indices  # by decreasing upper bound
        pos = chunk_positions(ranked[..., :n_pages].sort(dim=-1).values, self.page_size)
        if take > n_pages:  # equal token budget: the next-best page contributes its first `rest` tokens
            part = ranked[..., n_pages:] * self.page_size + torch.arange(rest, device=q.device)
            pos = torch.cat([pos, part], dim=-1)
        if tail:
            tail_pos = torch.arange(p * self.page_size, state.n, device=q.device).expand(b, h, tail)
            pos = torch.cat([pos, tail_pos], dim=-1)
        keys = torch.cat([gather_tokens(state.k, pos), k_gen], dim=2)
        values = torch.cat([gather_tokens(state.v, pos), v_gen], dim=2)
        return sdpa_gqa(q, keys, values, scaling=scaling), pos.shape[-1]

    def resident_bytes(self, state: KVState) -> int:
        # Quest keeps the whole KV cache resident, plus its page summaries
        return tensor_bytes(state.k, state.v, state.extra["kmin"], state.extra["kmax"])


def loki_basis(keys: torch.Tensor) -> torch.Tensor:
    """PCA basis (Hkv, d, d) of calibration keys (Hkv, N, d), columns by decreasing variance (uncentred: a rotation,
    so full-dimension scores are exact)."""
    cov = keys.double().transpose(1, 2) @ keys.double()  # (Hkv, d, d)
    evals, evecs = torch.linalg.eigh(cov)
    return evecs.flip(-1).to(keys.dtype)


class Loki(Selector):
    """Low-rank approximate scores in a calibrated PCA basis; exact attention over the top-`budget` tokens.

    Args:
        budget (`int`): prefill tokens attended per kv head.
        rank (`int`): principal dimensions used for the approximate scores (Loki: d/4 or d/8).
        bases (`dict[int, Tensor]`): per layer (Hkv, d, d) PCA bases from `loki_basis` on calibration keys.
    """

    name = "loki"

    def __init__(self, budget: int, rank: int, bases: dict[int, torch.Tensor], shared: dict | None = None) -> None:
        self.budget = int(budget)
        self.rank = int(rank)
        self.bases = bases
        self.shared = shared  # per-layer memo of the rotated keys (shared by every budget)

    def build(self, k_pre: Any, k: torch.Tensor, v: torch.Tensor, layer: int) -> KVState:
        basis = self.bases[layer].to(k.dtype)  # (Hkv, d, d)
        key = ("loki", layer, id(self.bases))
        if self.shared is not None and key in self.shared:
            rotated = self.shared[key]
        else:
            rotated = torch.matmul(k, basis.unsqueeze(0))  # keys in the PCA basis (B, Hkv, n, d)
            if self.shared is not None:
                self.shared[key] = rotated
        return KVState(rotated, v, k.shape[2], {"basis": basis})

    def attend(self, state: KVState, q, k_gen, v_gen, *, scaling, rope):  # noqa: ANN001, ANN201
        b, hq, ql, d = q.shape
        basis = state.extra["basis"]
        h = basis.shape[0]
        g = hq // h
        qr = torch.matmul(q.reshape(b, h, g * ql, d), basis.unsqueeze(0))  # rotated queries (B, Hkv, G*q, d)
        approx = torch.matmul(qr[..., : self.rank], state.k[..., : self.rank].transpose(-1, -2)) * scaling
        p = torch.softmax(approx.float(), dim=-1).view(b, hq, ql, -1)
        pos = topk_sorted(group_scores(p, h), self.budget)  # (B, Hkv, S)
        kg = torch.matmul(k_gen, basis.unsqueeze(0))
        keys = torch.cat([gather_tokens(state.k, pos), kg], dim=2)
        values = torch.cat([gather_tokens(state.v, pos), v_gen], dim=2)
        # full-dimension scores in the rotated basis equal q·k exactly (orthonormal basis)
        return sdpa_gqa(qr.reshape(b, hq, ql, d), keys, values, scaling=scaling), pos.shape[-1]

    def resident_bytes(self, state: KVState) -> int:
        return tensor_bytes(state.k, state.v)


class KeyCollector(Selector):
    """Not a policy: records each layer's pre-RoPE keys, post-RoPE keys and values at prefill (spectra, Loki
    calibration). Never made active."""

    name = "collector"

    def build(self, k_pre: Any, k: torch.Tensor, v: torch.Tensor, layer: int) -> KVState:
        extra = {"k_pre": k_pre} if k_pre is not None else {}
        return KVState(k, v, k.shape[2], extra)

    def resident_bytes(self, state: KVState) -> int:
        return 0


__all__ = ["FullKV", "KVState", "KeyCollector", "Loki", "Quest", "StreamingLLM", "loki_basis"]
