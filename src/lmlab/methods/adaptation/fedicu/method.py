"""FedICU-style (reconstructed): consensus / divergence splitting with importance-aware updating.

Liao et al., *Splitting with Importance-aware Updating for Heterogeneous Federated Learning with Large Language
Models*, ICML 2025 (PMLR 267:37495-37510), official code https://github.com/liaosunny123/FedICU (not reviewed).
Only the abstract was available: what it states is [abstract], the equations below are lmlab's reconstruction
(spec "fedicu", ``/work/shared/methods/adaptation.md``) and every output says "reconstructed".

Engine convention (`lmlab.core.federated.engine`): Δ = w_global - w_local, the server applies ``w <- w - (update)``.

**Client k, round t** (`FedICU.client_update`), from the global LoRA tensors θ:

    θ_k = AdamW^τ(θ) (reset every round)          Δ_k = θ - θ_k,   ḡ_k = Σ_{s<τ} ∇L_k(θ^(s))     per LoRA tensor
    I_k = |Δ_k ⊙ ḡ_k|  ("taylor", first-order loss change)  or  |Δ_k|  ("magnitude")
    M_k = top-⌈ρ·numel⌉ entries of I_k, per tensor              Δ̂_k = M_k ⊙ Δ_k               (`importance_mask`)

and uploads, per tensor, the kept values (float32) and their flat indices (int32): ⌈ρ d⌉ floats instead of d
(ρ = 1: the dense Δ_k, no indices). Masked-out entries are neither uploaded nor changed.

**Server** (`FedICU.server_aggregate`), per tensor (per LoRA matrix; `split_consensus_divergence`):

    c = Σ_k p_k Δ̂_k  (p_k ∝ n_k)     Δ̂_k = (<Δ̂_k, c> / ||c||²) c + r_k,   r_k ⊥ c      (consensus + divergence)
    Δ_global = c + λ_t Σ_k w_k r_k

* ``balancing="probe"`` (server-side probe set, ≤ 32 items): ℓ_k = probe loss of θ - (c + r_k),
  ``w_k = softmax_k(-ℓ_k / T)``; λ_t = argmin over `lambda_grid` of the probe loss of θ - (c + λ Σ w_k r_k).
* ``balancing="cosine"`` (no server data): ``w_k ∝ max(0, cos(Δ̂_k, mean_{j≠k} Δ̂_j))`` (over all tensors), λ = 0.5
  (the spec's cos(r_k, ·) is always <= 0 with equal p_k: see `cosine_weights`).

Reductions (tested): one client, or identical clients, give r_k = 0 and Δ_global = c = FedAvg's Σ p_k Δ̂_k; with
ρ = 1 that is FedAvg exactly.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from lmlab.core.federated.engine import ClientData, FedMethod, Payload, client_weights, local_delta
from lmlab.methods.adaptation.fedicu.config import BALANCING, IMPORTANCE

FAITHFUL_LABEL = "FedICU-style (reconstructed)"


def kept_count(numel: int, rho: float) -> int:
    """Entries kept of a tensor of `numel` entries at upload fraction `rho` (at least one)."""
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"rho must be in (0, 1], got {rho!r}")
    if numel < 1:
        raise ValueError(f"numel must be >= 1, got {numel!r}")
    return max(1, min(numel, math.ceil(rho * numel - 1e-9)))


def topk_mask(scores: torch.Tensor, rho: float) -> torch.Tensor:
    """Boolean mask (shape of `scores`) of its top-⌈ρ·numel⌉ entries (ties: lowest flat index first)."""
    flat = scores.detach().reshape(-1).double()
    k = kept_count(flat.numel(), rho)
    # a stable sort makes ties deterministic (torch.topk does not promise an order among equal values)
    idx = torch.sort(-flat, stable=True).indices[:k]
    mask = torch.zeros(flat.numel(), dtype=torch.bool)
    mask[idx] = True
    return mask.reshape(scores.shape)


def importance(delta: torch.Tensor, grad_sum: torch.Tensor | None, kind: str = "taylor") -> torch.Tensor:
    """Per-entry importance: |Δ ⊙ ḡ| (``taylor``) or |Δ| (``magnitude``; also the fallback without ḡ)."""
    if kind not in IMPORTANCE:
        raise ValueError(f"importance must be one of {', '.join(IMPORTANCE)}, got {kind!r}")
    if kind == "taylor" and grad_sum is not None:
        return (delta * grad_sum.to(delta.dtype)).abs()
    return delta.abs()


def importance_mask(
    delta: Mapping[str, torch.Tensor],
    grad_sum: Mapping[str, torch.Tensor] | None,
    rho: float,
    kind: str = "taylor",
) -> OrderedDict[str, torch.Tensor]:
    """Per tensor, the top-ρ mask of the importance of `delta` (the entries a client uploads)."""
    return OrderedDict((k, topk_mask(importance(d, None if grad_sum is None else grad_sum[k], kind), rho))
                       for k, d in delta.items())  # fmt: skip


def encode_sparse(
    delta: Mapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor] | None
) -> dict[str, torch.Tensor]:
    """Payload arrays: ``value.<name>`` (float32 kept entries) + ``index.<name>`` (int32 flat indices); no mask: the
    dense ``delta.<name>``."""
    out: dict[str, torch.Tensor] = {}
    for k, d in delta.items():
        if masks is None:
            out[f"delta.{k}"] = d.detach().float().contiguous()
            continue
        flat_idx = torch.nonzero(masks[k].reshape(-1), as_tuple=False).reshape(-1)
        out[f"index.{k}"] = flat_idx.to(torch.int32)
        out[f"value.{k}"] = d.detach().reshape(-1)[flat_idx].float().contiguous()
    return out


def decode_sparse(
    arrays: Mapping[str, torch.Tensor], like: Mapping[str, torch.Tensor]
) -> OrderedDict[str, torch.Tensor]:
    """Dense Δ̂ per tensor of `like` from `encode_sparse`'s arrays (zeros where nothing was uploaded)."""
    out = OrderedDict()
    for k, ref in like.items():
        if f"delta.{k}" in arrays:
            out[k] = arrays[f"delta.{k}"].to(ref.dtype).reshape(ref.shape).clone()
        elif f"value.{k}" in arrays and f"index.{k}" in arrays:
            flat = torch.zeros(ref.numel(), dtype=ref.dtype)
            flat[arrays[f"index.{k}"].long()] = arrays[f"value.{k}"].to(ref.dtype)
            out[k] = flat.reshape(ref.shape)
        else:
            raise ValueError(f"the payload has no update for tensor {k!r} (expected delta.{k} or value./index.{k})")
    return out


def split_consensus_divergence(
    deltas: Sequence[torch.Tensor], weights: Sequence[float]
) -> tuple[torch.Tensor, list[float], list[torch.Tensor]]:
    """One tensor's split: c = Σ p_k Δ_k, α_k = <Δ_k, c> / ||c||², r_k = Δ_k - α_k c (so <r_k, c> = 0).

    Returns (c, [α_k], [r_k]) in the dtype of the deltas (computed in float64). ||c|| = 0: α_k = 0, r_k = Δ_k.
    """
    if not deltas or len(deltas) != len(weights):
        raise ValueError(f"expected one weight per delta and at least one delta, got {len(deltas)} deltas and "
                         f"{len(weights)} weights")  # fmt: skip
    dtype = deltas[0].dtype
    d64 = [d.double() for d in deltas]
    c = sum(float(w) * d for w, d in zip(weights, d64))
    cc = float((c * c).sum())
    alphas = [float((d * c).sum()) / cc if cc > 0 else 0.0 for d in d64]
    rs = [(d - a * c).to(dtype) for a, d in zip(alphas, d64)]
    return c.to(dtype), alphas, rs


def softmax_weights(losses: Sequence[float], temperature: float) -> list[float]:
    """w_k = softmax_k(-ℓ_k / T)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    z = -np.asarray(losses, dtype=float) / temperature
    z = np.exp(z - z.max())
    return (z / z.sum()).tolist()


def cosine_weights(deltas: Sequence[Mapping[str, torch.Tensor]]) -> list[float]:
    """No-server-data weights: w_k ∝ max(0, cos(Δ̂_k, mean_{j≠k} Δ̂_j)) over all tensors (all 0 when none is > 0;
    a single client: [1.0]): a client's divergence counts as much as its update agrees with the others'.

    The spec's cos(r_k, mean_{j≠k} Δ̂_j) is degenerate: with p_k = 1/K, mean_{j≠k} Δ̂_j = (K c - Δ̂_k) / (K - 1) and
    r_k ⊥ c, so <r_k, mean_{j≠k} Δ̂_j> = -||r_k||² / (K - 1) <= 0 and every weight clips to 0 (tested).
    """
    n = len(deltas)
    if n == 1:
        return [1.0]
    flat_d = [torch.cat([d[k].reshape(-1).double() for k in d]) for d in deltas]
    total = sum(flat_d)
    raw = []
    for k in range(n):
        other = (total - flat_d[k]) / (n - 1)
        den = float(flat_d[k].norm() * other.norm())
        raw.append(max(0.0, float(flat_d[k] @ other) / den) if den > 0 else 0.0)
    s = sum(raw)
    return [x / s for x in raw] if s > 0 else [0.0] * n


def _step(state: Mapping[str, torch.Tensor], update: Mapping[str, torch.Tensor]) -> OrderedDict[str, torch.Tensor]:
    return OrderedDict((k, v - update[k].to(v.dtype)) for k, v in state.items())


def fedicu_combine(
    global_state: Mapping[str, torch.Tensor],
    deltas: Sequence[Mapping[str, torch.Tensor]],
    weights: Sequence[float],
    *,
    balancing: str = "probe",
    probe_fn: Callable[[Mapping[str, torch.Tensor]], float] | None = None,
    lambda_grid: Sequence[float] = (0.0, 0.25, 0.5, 1.0),
    temperature: float = 1.0,
    fallback_lambda: float = 0.5,
) -> tuple[OrderedDict[str, torch.Tensor], dict[str, Any]]:
    """The server rule on dense (masked) client deltas: θ <- θ - (c + λ Σ_k w_k r_k); (new state, stats).

    ``balancing="probe"`` needs `probe_fn(state) -> loss` (lower is better); with ``probe_fn=None`` the cosine
    fallback applies (w_k by `cosine_weights`, λ = `fallback_lambda`).
    """
    if balancing not in BALANCING:
        raise ValueError(f"balancing must be one of {', '.join(BALANCING)}, got {balancing!r}")
    names = list(global_state)
    c: OrderedDict[str, torch.Tensor] = OrderedDict()
    rs: list[OrderedDict[str, torch.Tensor]] = [OrderedDict() for _ in deltas]
    ortho = 0.0
    for k in names:
        ck, _, rk = split_consensus_divergence([d[k] for d in deltas], weights)
        c[k] = ck
        for i, r in enumerate(rk):
            rs[i][k] = r
            cn = float(ck.double().norm())
            if cn > 0:  # |cos(r_k, c)| per tensor: 0 up to rounding (the split's guarantee)
                ortho = max(ortho, abs(float((r.double() * ck.double()).sum())) / (cn * max(float(r.double().norm()),
                                                                                                1e-30)))  # fmt: skip
    c_norm = float(math.sqrt(sum(float((v.double() ** 2).sum()) for v in c.values())))
    stats: dict[str, Any] = {"consensus_norm": c_norm,
                             "max_abs_cos_r_c": ortho}  # fmt: skip
    if balancing == "probe" and probe_fn is not None:
        cand = [probe_fn(_step(global_state, {k: c[k] + r[k] for k in names})) for r in rs]
        w = softmax_weights(cand, temperature)
        div = {k: sum(wi * r[k] for wi, r in zip(w, rs)) for k in names}
        grid = [float(x) for x in lambda_grid]
        scores = [probe_fn(_step(global_state, {k: c[k] + lam * div[k] for k in names})) for lam in grid]
        best = int(np.argmin(scores))
        lam = grid[best]
        stats.update({"probe_loss": float(scores[best]), "candidate_losses": [float(x) for x in cand]})
    else:
        w = cosine_weights(deltas)
        div = {k: sum(wi * r[k] for wi, r in zip(w, rs)) for k in names}
        lam = float(fallback_lambda)
    update = OrderedDict((k, c[k] + lam * div[k]) for k in names)
    stats.update(
        {
            "lambda": lam,
            "weights": [float(x) for x in w],
            "divergence_norm": float(math.sqrt(sum(float((v.double() ** 2).sum()) for v in div.values()))),
        }
    )
    return _step(global_state, update), stats


class FedICU(FedMethod):
    """FedICU-style (reconstructed) as a `lmlab.core.federated.engine.FedMethod` (equations in the module docstring).

    Hyperparameters (they travel in the round config): ``lr``, ``local_steps``, ``local_batch``, ``grad_clip``,
    ``optimizer`` (``adamw``, reset every round), ``rho`` (upload fraction, 0.3), ``importance`` (``taylor`` |
    ``magnitude``), ``balancing`` (``probe`` | ``cosine``), ``lambda_grid``, ``temperature``, ``fallback_lambda``,
    ``equal_weight`` (False: p_k ∝ n_k).

    Args:
        probe_fn (`Callable[[state], float]`, *optional*): the server's probe loss of a candidate state (server
            side only; never sent). None: the cosine fallback, whatever ``balancing`` says.
    """

    name = "fedicu"

    def __init__(self, probe_fn: Callable[[Mapping[str, torch.Tensor]], float] | None = None, **hparams: Any) -> None:
        rho = float(hparams.get("rho", 0.3))
        kept_count(1, rho)  # validates rho
        for key, allowed in (("importance", IMPORTANCE), ("balancing", BALANCING)):
            if key in hparams and hparams[key] not in allowed:
                raise ValueError(f"{key} must be one of {', '.join(allowed)}, got {hparams[key]!r}")
        super().__init__(**hparams)
        self.probe_fn = probe_fn

    def client_update(self, global_state, client: ClientData, cfg, *, client_id, round_idx) -> Payload:  # noqa: D102
        cfg = {"optimizer": "adamw", **dict(cfg)}
        rho = float(cfg.get("rho", 0.3))
        kind = str(cfg.get("importance", "taylor"))
        delta, losses, gsum = local_delta(global_state, client, cfg, client_id=client_id, round_idx=round_idx,
                                          accumulate=kind == "taylor")  # fmt: skip
        masks = None if rho >= 1.0 else importance_mask(delta, gsum, rho, kind)
        arrays = encode_sparse(delta, masks)
        kept = (
            sum(int(m.sum()) for m in masks.values()) if masks is not None else sum(d.numel() for d in delta.values())
        )
        return Payload(arrays, {"train_loss": float(np.mean(losses)), "num_examples": float(len(client.rows)),
                                "kept_fraction": kept / max(1, sum(d.numel() for d in delta.values()))})  # fmt: skip

    def server_aggregate(self, global_state, payloads, cfg, *, round_idx):  # noqa: D102
        w = client_weights(payloads, bool(cfg.get("equal_weight", False)))
        deltas = [decode_sparse(p.arrays, global_state) for p in payloads]
        new, st = fedicu_combine(
            global_state,
            deltas,
            w,
            balancing=str(cfg.get("balancing", "probe")),
            probe_fn=self.probe_fn,
            lambda_grid=[float(x) for x in cfg.get("lambda_grid", [0.0, 0.25, 0.5, 1.0])],
            temperature=float(cfg.get("temperature", 1.0)),
            fallback_lambda=float(cfg.get("fallback_lambda", 0.5)),
        )
        stats = {"lambda": st["lambda"], "consensus_norm": st["consensus_norm"],
                 "divergence_norm": st["divergence_norm"], "max_abs_cos_r_c": st["max_abs_cos_r_c"],
                 "train_loss": float(np.mean([p.metrics.get("train_loss", math.nan) for p in payloads])),
                 **{f"w_{i}": float(x) for i, x in enumerate(st["weights"])}}  # fmt: skip
        if "probe_loss" in st:
            stats["probe_loss"] = st["probe_loss"]
        return new, stats


__all__ = [
    "BALANCING",
    "FAITHFUL_LABEL",
    "FedICU",
    "IMPORTANCE",
    "cosine_weights",
    "decode_sparse",
    "encode_sparse",
    "fedicu_combine",
    "importance",
    "importance_mask",
    "kept_count",
    "softmax_weights",
    "split_consensus_divergence",
    "topk_mask",
]
