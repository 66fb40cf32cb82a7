"""Ferret (Shu et al., ICML 2025) and its zeroth-order baseline FedKSeed, as engine-agnostic federated functions.

Ferret = first-order local updates + shared-randomness projection + server reconstruction, as the official code
defines it [code: allen4747/Ferret@1a412a9, ``optimizers/ferret_optimizer.py``, ``client.py``, ``server.py``]:

**Setup.** The server draws K candidate seeds ``s_k ~ U{1, ..., 10^11 - 1}`` once (``main.py``); every train message
carries them. The trainable tensors are walked in order and cut into blocks (``_group_parameters``): a block is closed
when adding the next tensor would exceed ``0.9 * median(numel)``.

**Client** (``local_train_with_seed_pool`` + ``project_update``), from the global w:

    w' = SGD^τ(w)   (lr η, momentum 0, weight decay 0)            Δ_g = w_g - w'_g  per block g (d_g entries)
    n_g = max(int(K · ||Δ_g|| / max_h ||Δ_h||), 2)                 (adaptive number of seeds per block)
    S_g = n_g indices drawn without replacement from {0..K-1}
    v_{k,g} = TruncNormal(0, 1; [-1/sqrt(d_g), 1/sqrt(d_g)])^{d_g}, generated from seed s_k   (``base``)
    γ_{k,g} = <Δ_g, v_{k,g}> · d_g / n_g   for k in S_g, 0 otherwise

and uploads (S_g, γ_{S_g,g}) for every block: Σ_g n_g floats (plus the indices), instead of d.

**Server** (``aggregate_seed_pool`` + ``update_global_model_by_seed_pool`` + ``FerretFramework.update``):

    Γ <- μ·Γ + Σ_i p_i γ^(i)                   (μ = 0 in the script; p_i = 1/M with --equal_weight)
    u_{k,g} = Γ_{k,g} · v_{k,g},  u_{k,g} <- u_{k,g} · min(1, max_norm / ||u_{k,g}||)   (max_norm = 10)
    w_g <- w_g - η_s Σ_k u_{k,g}               (η_s = slr: 10, annealed linearly / cosine / not at all)

With the code's bases E[v vᵀ] = I / (3 d_g), so E[Σ_k γ_k v_k] = Δ / 3; η_s = 10 absorbs the factor.

``coordinates="lstsq"`` is the exact (least-squares) projection [verify: the paper's own equation]: γ_{S,g} = argmin
||Δ_g - V_S γ||, i.e. V_S⁺ Δ_g (min-norm least squares), so Σ_k γ_k v_k = P_{span V_S} Δ_g, which **is Δ_g** as soon
as n_g >= d_g (the bases span R^{d_g}); use η_s = 1 with it. It costs O(d n²) per block and is meant for small
blocks and tests, not for LLM-sized blocks.

FedKSeed (Qin et al., ICML 2024) [code: zhenqincn/FedKSeed, ``optimizers/mezo_optimizer.py``]: each local step picks
one of K candidate seeds, z ~ N(0, I) from it, g = (L(w + εz) - L(w - εz)) / 2ε on the step's batch, w <- w - η g z,
and accumulates g per seed; the client uploads the accumulated scalar per used seed; the server replays
w <- w - η Σ_k (Σ_i p_i g_{i,k}) z_k.
"""

from __future__ import annotations

import math
from collections import OrderedDict, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lmlab.core.federated.engine import (
    ClientData,
    FedMethod,
    Payload,
    client_rng,
    client_weights,
    first_order_delta,
    local_batches,
)
from lmlab.core.stats.seeding import derive_seed
from lmlab.methods.adaptation.ferret.config import ANNEALS, BASES, COORDINATES

SEED_HIGH = 10**11  # candidate seeds are uniform in [1, 10^11) (np.random.randint(1, 100000000000, K))


# ---------------------------------------------------------------------------------------------------------------
# blocks, bases, seeds


@dataclass(frozen=True)
class BlockLayout:
    """Blocks of the trainable state: per block, the tensor names (in state order) and its size d_g."""

    groups: tuple[tuple[str, ...], ...]
    sizes: tuple[int, ...]
    shapes: tuple[tuple[str, tuple[int, ...]], ...]

    def flatten(self, state: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        """One flat float32 vector per block (the tensors of the block concatenated in order)."""
        return [torch.cat([state[n].reshape(-1).float() for n in g]) for g in self.groups]

    def unflatten(self, flats: Sequence[torch.Tensor]) -> OrderedDict[str, torch.Tensor]:
        shape_of = dict(self.shapes)
        out: OrderedDict[str, torch.Tensor] = OrderedDict()
        for g, flat in zip(self.groups, flats):
            start = 0
            for n in g:
                size = math.prod(shape_of[n])
                out[n] = flat[start : start + size].reshape(shape_of[n])
                start += size
        return OrderedDict((n, out[n]) for n, _ in self.shapes)


def block_layout(state: Mapping[str, torch.Tensor]) -> BlockLayout:
    """Ferret's parameter groups: walk the tensors in order; close a group when adding the next one would exceed
    ``int(0.9 * median(numel))`` (``FerretFramework._group_parameters``)."""
    if not state:
        raise ValueError("the trainable state is empty; Ferret needs at least one trainable tensor")
    numels = [int(t.numel()) for t in state.values()]
    target = int(0.9 * float(np.median(numels)))
    groups: list[list[str]] = []
    current: list[str] = []
    dim = 0
    for name, n in zip(state, numels):
        if dim + n > target and current:
            groups.append(current)
            current, dim = [], 0
        current.append(name)
        dim += n
    if current:
        groups.append(current)
    size_of = dict(zip(state, numels))
    return BlockLayout(tuple(tuple(g) for g in groups), tuple(sum(size_of[n] for n in g) for g in groups),
                       tuple((n, tuple(t.shape)) for n, t in state.items()))  # fmt: skip


def candidate_seeds(k: int, seed: int) -> list[int]:
    """The K shared seeds, drawn once by the server (integers uniform in [1, 10^11))."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise ValueError(f"K (number of candidate seeds) must be an int >= 2, got {k!r}")
    rng = np.random.default_rng(derive_seed(seed, "ferret-candidate-seeds"))
    return [int(s) for s in rng.integers(1, SEED_HIGH, size=k)]


def basis(seed: int, d: int, kind: str = "trunc_normal") -> torch.Tensor:
    """The random base v (d,) of one seed: ``trunc_normal_(mean 0, std 1, a = -1/sqrt(d), b = 1/sqrt(d))`` drawn
    after seeding with `seed` (``kind="uniform"``: U(-1/sqrt(d), 1/sqrt(d)), the same law to O(1/d), faster).
    Regenerated bit-identically from the seed on every party."""
    if kind not in BASES:
        raise ValueError(f"basis kind must be one of {', '.join(BASES)}, got {kind!r}")
    g = torch.Generator().manual_seed(int(seed))
    v = torch.empty(int(d), dtype=torch.float32)
    r = float(d) ** -0.5
    if kind == "uniform":
        return v.uniform_(-r, r, generator=g)
    return torch.nn.init.trunc_normal_(v, mean=0.0, std=1.0, a=-r, b=r, generator=g)


def adaptive_n_seeds(norms: Sequence[float], k: int) -> list[int]:
    """n_g = max(int(K ||Δ_g|| / max_h ||Δ_h||), 2); a NaN block gets 2; the max over blocks is floored at 1e-8."""
    finite = [float(x) for x in norms if math.isfinite(float(x))]
    max_norm = max([1e-8, *finite])
    return [2 if not math.isfinite(float(x)) else min(k, max(int(float(x) / max_norm * k), 2)) for x in norms]


def project_block(delta: torch.Tensor, seeds: Sequence[int], *, coordinates: str = "code",
                  kind: str = "trunc_normal") -> torch.Tensor:  # fmt: skip
    """The coordinates γ (n,) of a flat block update `delta` (d,) on the bases of `seeds` (n of them).

    ``"code"``: γ_k = <Δ, v_k> · d / n (the official estimator). ``"lstsq"``: γ = V⁺ Δ with V = [v_1 .. v_n] (d, n).
    """
    d, n = int(delta.numel()), len(seeds)
    if n == 0:
        return torch.zeros(0)
    if coordinates == "code":
        return torch.stack([torch.dot(delta, basis(s, d, kind)) for s in seeds]) * (d / n)
    if coordinates == "lstsq":
        v = torch.stack([basis(s, d, kind) for s in seeds], dim=1).double()  # (d, n)
        return (torch.linalg.pinv(v) @ delta.double()).float()
    raise ValueError(f"coordinates must be one of {', '.join(COORDINATES)}, got {coordinates!r}")


def reconstruct_block(coords: Mapping[int, float], seeds: Sequence[int], d: int, *, max_norm: float | None = 10.0,
                      kind: str = "trunc_normal") -> tuple[torch.Tensor, int]:  # fmt: skip
    """Σ_k clip(Γ_k v_k) (d,) over the non-zero coordinates `coords` (seed index -> Γ_k) of one block, each term
    clipped to norm `max_norm` (None: no clip); also the number of clipped terms. Zero coordinates are skipped
    (their term is 0)."""
    out = torch.zeros(int(d), dtype=torch.float32)
    clipped = 0
    for k in sorted(coords):
        gamma = float(coords[k])
        if gamma == 0.0 or not math.isfinite(gamma):
            continue
        u = basis(seeds[k], d, kind).mul_(gamma)
        norm = float(torch.linalg.vector_norm(u))
        if not math.isfinite(norm):
            continue
        if max_norm is not None and max_norm / (norm + 1e-8) < 1:
            u.mul_(max_norm / (norm + 1e-8))
            clipped += 1
        out.add_(u)
    return out, clipped


def ferret_project(delta: Mapping[str, torch.Tensor], seeds: Sequence[int], rng: np.random.Generator, *,
                   coordinates: str = "code", kind: str = "trunc_normal") -> dict[str, torch.Tensor]:  # fmt: skip
    """A client's upload for the update `delta` (named tensors): per block g, ``idx.g`` (n_g seed indices, int32)
    and ``gamma.g`` (n_g float32 coordinates), with n_g by `adaptive_n_seeds`."""
    layout = block_layout(delta)
    flats = layout.flatten(delta)
    k = len(seeds)
    ns = adaptive_n_seeds([float(torch.linalg.vector_norm(f)) for f in flats], k)
    arrays: dict[str, torch.Tensor] = {}
    for g, (flat, n) in enumerate(zip(flats, ns)):
        idx = np.sort(rng.choice(k, size=n, replace=False))
        arrays[f"idx.{g}"] = torch.tensor(idx, dtype=torch.int32)
        arrays[f"gamma.{g}"] = project_block(flat, [seeds[i] for i in idx], coordinates=coordinates, kind=kind)
    return arrays


def coordinate_matrix(arrays: Mapping[str, torch.Tensor], k: int, n_blocks: int) -> torch.Tensor:
    """The dense K x G matrix of one upload (zeros where a seed was not picked for a block)."""
    m = torch.zeros(k, n_blocks, dtype=torch.float64)
    for g in range(n_blocks):
        idx, gam = arrays.get(f"idx.{g}"), arrays.get(f"gamma.{g}")
        if idx is None or gam is None:
            raise ValueError(f"a Ferret upload has no idx.{g} / gamma.{g} (expected {n_blocks} blocks)")
        m[idx.long(), g] = gam.double()
    return m


def ferret_reconstruct(
    gamma: torch.Tensor,
    seeds: Sequence[int],
    layout: BlockLayout,
    *,
    max_norm: float | None = 10.0,
    kind: str = "trunc_normal",
) -> tuple[list[torch.Tensor], int]:
    """Per block, Σ_k clip(Γ_{k,g} v_{k,g}) from the K x G matrix `gamma`; and the number of clipped terms."""
    out, clipped = [], 0
    for g, d in enumerate(layout.sizes):
        col = gamma[:, g]
        coords = {int(k): float(col[k]) for k in torch.nonzero(col).flatten().tolist()}
        u, c = reconstruct_block(coords, seeds, d, max_norm=max_norm, kind=kind)
        out.append(u)
        clipped += c
    return out, clipped


def server_lr(round_idx: int, rounds: int, slr_max: float, slr_min: float = 0.0, anneal: str = "none") -> float:
    """η_s of round r (1-based): ``main.py``'s linear / cosine annealing over R rounds, or constant ``slr_max``."""
    r, big_r = round_idx - 1, max(1, rounds)
    if anneal == "linear":
        return slr_min + (slr_max - slr_min) * (1 - r / big_r)
    if anneal == "cosine":
        return slr_min + (slr_max - slr_min) * (1 + math.cos(math.pi * r / big_r)) / 2
    if anneal == "none":
        return slr_max
    raise ValueError(f"anneal must be one of {', '.join(ANNEALS)}, got {anneal!r}")


# ---------------------------------------------------------------------------------------------------------------
# the federated methods


class Ferret(FedMethod):
    """Ferret as a `lmlab.core.federated.engine.FedMethod`.

    Hyperparameters (all travel in the round config): ``lr``, ``local_steps``, ``local_batch``, ``grad_clip``,
    ``K``, ``server_lr`` (slr_max), ``slr_min``, ``anneal``, ``rounds`` (for annealing), ``max_norm`` (per-seed clip;
    <= 0: none), ``momentum`` (server), ``equal_weight``, ``coordinates``, ``basis``. `setup` draws the K seeds.
    """

    name = "ferret"

    def setup(self, global_state: Mapping[str, torch.Tensor], seed: int) -> None:
        super().setup(global_state, seed)
        self.seeds = candidate_seeds(int(self.hparams.get("K", 64)), seed)
        self.layout = block_layout(global_state)
        self.pool = torch.zeros(len(self.seeds), len(self.layout.sizes), dtype=torch.float64)  # Γ, kept across rounds

    def round_config(self, round_idx: int) -> dict[str, Any]:
        return {**super().round_config(round_idx), "seeds": list(self.seeds)}

    def client_update(self, global_state, client: ClientData, cfg, *, client_id, round_idx) -> Payload:  # noqa: D102
        delta, losses = first_order_delta(global_state, client, cfg, client_id=client_id, round_idx=round_idx)
        rng = client_rng(cfg["seed"], client_id, round_idx, "ferret-picks")
        arrays = ferret_project(delta, [int(s) for s in cfg["seeds"]], rng,
                                coordinates=str(cfg.get("coordinates", "code")),
                                kind=str(cfg.get("basis", "trunc_normal")))  # fmt: skip
        n_coords = sum(int(t.numel()) for k, t in arrays.items() if k.startswith("gamma."))
        return Payload(arrays, {"train_loss": float(np.mean(losses)), "num_examples": float(len(client.rows)),
                                "n_coords": float(n_coords)})  # fmt: skip

    def server_aggregate(self, global_state, payloads, cfg, *, round_idx):  # noqa: D102
        seeds = [int(s) for s in cfg["seeds"]]
        layout = block_layout(global_state)
        w = client_weights(payloads, bool(cfg.get("equal_weight", True)))
        pool = (
            self.pool
            if getattr(self, "pool", None) is not None and self.pool.shape == (len(seeds), len(layout.sizes))
            else torch.zeros(len(seeds), len(layout.sizes), dtype=torch.float64)
        )
        pool = pool * float(cfg.get("momentum", 0.0))
        for wi, p in zip(w, payloads):
            pool = pool + wi * coordinate_matrix(p.arrays, len(seeds), len(layout.sizes))
        self.pool = pool
        max_norm = float(cfg.get("max_norm", 10.0))
        updates, clipped = ferret_reconstruct(pool, seeds, layout, max_norm=max_norm if max_norm > 0 else None,
                                              kind=str(cfg.get("basis", "trunc_normal")))  # fmt: skip
        eta = server_lr(round_idx, int(cfg.get("rounds", 1)), float(cfg.get("server_lr", 10.0)),
                        float(cfg.get("slr_min", 0.0)), str(cfg.get("anneal", "none")))  # fmt: skip
        step = layout.unflatten(updates)
        new = OrderedDict((k, v - eta * step[k].to(v.dtype)) for k, v in global_state.items())
        stats = {"server_lr": eta, "clipped_terms": float(clipped), "nonzero_coords": float((pool != 0).sum()),
                 "train_loss": float(np.mean([p.metrics.get("train_loss", math.nan) for p in payloads]))}  # fmt: skip
        return new, stats


def _gaussian_direction(seed: int, shapes: Sequence[torch.Size]) -> list[torch.Tensor]:
    """z ~ N(0, I) over the trainable tensors, generated in order from one generator seeded with `seed`."""
    g = torch.Generator().manual_seed(int(seed))
    return [torch.randn(s, generator=g) for s in shapes]


class FedKSeed(FedMethod):
    """FedKSeed (zeroth-order, K shared seeds) as a `FedMethod`.

    Hyperparameters: ``lr`` (η, client and server), ``zo_eps`` (ε, 5e-4), ``local_steps``, ``local_batch``, ``K``
    (candidate seeds), ``equal_weight``. Upload: the accumulated scalar gradient of every seed used this round.
    """

    name = "fedkseed"

    def setup(self, global_state: Mapping[str, torch.Tensor], seed: int) -> None:
        super().setup(global_state, seed)
        self.seeds = candidate_seeds(int(self.hparams.get("K", 1024)), derive_seed(seed, "fedkseed"))

    def round_config(self, round_idx: int) -> dict[str, Any]:
        return {**super().round_config(round_idx), "seeds": list(self.seeds)}

    def client_update(self, global_state, client: ClientData, cfg, *, client_id, round_idx) -> Payload:  # noqa: D102
        task = client.task
        task.set_state(global_state)
        task.module.eval()  # MeZO: no dropout
        rng = client_rng(cfg["seed"], client_id, round_idx, "order")
        batches = local_batches(client.rows, int(cfg["local_steps"]), int(cfg["local_batch"]), rng)
        pick = client_rng(cfg["seed"], client_id, round_idx, "fedkseed-picks")
        seeds = [int(s) for s in cfg["seeds"]]
        lr, eps = float(cfg["lr"]), float(cfg.get("zo_eps", 5e-4))
        params = [p for _, p in task.named]
        pool: dict[int, float] = defaultdict(float)
        losses = []
        with torch.no_grad():
            for batch in batches:
                k = int(pick.integers(len(seeds)))
                z = _gaussian_direction(seeds[k], [p.shape for p in params])
                for p, zi in zip(params, z):
                    p.add_(zi, alpha=eps)
                l1 = float(task.loss(batch))
                for p, zi in zip(params, z):
                    p.add_(zi, alpha=-2 * eps)
                l2 = float(task.loss(batch))
                for p, zi in zip(params, z):
                    p.add_(zi, alpha=eps)
                if not (math.isfinite(l1) and math.isfinite(l2)):
                    continue
                g = (l1 - l2) / (2 * eps)
                for p, zi in zip(params, z):
                    p.add_(zi, alpha=-lr * g)
                pool[k] += g
                losses.append(l1)
        idx = sorted(pool)
        arrays = {"idx": torch.tensor(idx, dtype=torch.int32), "grad": torch.tensor([pool[i] for i in idx],
                                                                                    dtype=torch.float32)}  # fmt: skip
        return Payload(arrays, {"train_loss": float(np.mean(losses)) if losses else math.nan,
                                "num_examples": float(len(client.rows))})  # fmt: skip

    def server_aggregate(self, global_state, payloads, cfg, *, round_idx):  # noqa: D102
        seeds = [int(s) for s in cfg["seeds"]]
        w = client_weights(payloads, bool(cfg.get("equal_weight", True)))
        agg: dict[int, float] = defaultdict(float)
        for wi, p in zip(w, payloads):
            for i, g in zip(p.arrays["idx"].tolist(), p.arrays["grad"].double().tolist()):
                agg[int(i)] += wi * g
        lr = float(cfg["lr"])
        new = OrderedDict((k, v.detach().clone()) for k, v in global_state.items())
        tensors = list(new.values())
        for k in sorted(agg):
            for t, zi in zip(tensors, _gaussian_direction(seeds[k], [t.shape for t in tensors])):
                t.add_(zi.to(t.dtype), alpha=-lr * agg[k])
        losses = [p.metrics.get("train_loss", math.nan) for p in payloads]
        return new, {"seeds_used": float(len(agg)), "train_loss": float(np.nanmean(losses)) if any(
            math.isfinite(x) for x in losses) else math.nan}  # fmt: skip


__all__ = [
    "ANNEALS",
    "BASES",
    "COORDINATES",
    "BlockLayout",
    "FedKSeed",
    "Ferret",
    "adaptive_n_seeds",
    "basis",
    "block_layout",
    "candidate_seeds",
    "coordinate_matrix",
    "ferret_project",
    "ferret_reconstruct",
    "project_block",
    "reconstruct_block",
    "server_lr",
]
