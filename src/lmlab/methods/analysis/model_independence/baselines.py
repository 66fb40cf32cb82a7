"""The paper's constrained tests, lmlab's baselines for MATCH: PERMTEST (φ_L2, φ_cos), CSW and CSH.

* `permtest` (Algorithm 1): p̂ = (1 + #{t : φ(π_t(θ_a), θ_b) ≥ φ(θ_a, θ_b)}) / (T + 1), exact, floor 1/(T + 1);
  φ_L2 = −mean_W ||W_a − W_b||_F, φ_cos = mean_W cos(vec W_a, vec W_b).
* `csw_test`: per block, Spearman(LAP_max(cos(rows of W_up^a, rows of W_up^b)), identity); Fisher.
* `csh_from_activations`: the same on the activations of ``up_proj``.

All need the same architecture (the same unit indexing); a permutation + rotation of the residual stream defeats
them. Equations and code references: the docstring of `method.py`. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from lmlab.methods.analysis.model_independence.method import MLPActivations
from lmlab.methods.analysis.model_independence.pvalues import P_FLOOR, BlockTest, identity_test
from lmlab.methods.analysis.model_independence.transforms import (
    _BLOCK_RE,
    _glu,
    _permuted,
    index_plan,
    n_blocks,
    random_permutations,
)


@dataclass
class PermTestResult:
    """PERMTEST output: exact p-values (floor 1/(T+1)) and the observed and null statistics (larger = more similar)."""

    p: dict[str, float]
    observed: dict[str, float]
    null: dict[str, list[float]]
    n_perm: int
    tensors: list[str] = field(default_factory=list)

    @property
    def floor(self) -> float:
        return 1.0 / (self.n_perm + 1)


STATISTICS = ("l2", "cos")


def _same_architecture(model_a: nn.Module, model_b: nn.Module, what: str) -> dict[str, tuple[Any, ...]]:
    plan = index_plan(model_a)
    shapes_b = {n: tuple(p.shape) for n, p in model_b.named_parameters()}
    for name, p in model_a.named_parameters():
        if shapes_b.get(name) != tuple(p.shape):
            raise ValueError(
                f"{what} needs two models of the same architecture: model_b's {name!r} has shape "
                f"{shapes_b.get(name)}, expected {tuple(p.shape)} (use MATCH for different architectures)"
            )
    return plan


def _select(plan: dict[str, tuple[Any, ...]], tensors: str, blocks: Sequence[int] | None) -> list[str]:
    if tensors not in ("all", "blocks"):
        raise ValueError(f"tensors must be 'all' or 'blocks', got {tensors!r}")
    names = []
    for name in plan:
        m = _BLOCK_RE.match(name)
        if tensors == "blocks" and m is None:
            continue
        if m is not None and blocks is not None and int(m.group(1)) not in blocks:
            continue
        names.append(name)
    return names


@torch.no_grad()
def permtest(
    model_a: nn.Module,
    model_b: nn.Module,
    *,
    n_perm: int = 99,
    seed: int = 0,
    blocks: Sequence[int] | None = None,
    tensors: str = "all",
) -> PermTestResult:
    """PERMTEST (Algorithm 1): p̂ = (1 + #{t : φ(π_t θ_a, θ_b) ≥ φ(θ_a, θ_b)}) / (T + 1) for φ_L2 and φ_cos.

    The statistics read the tensors chosen by `tensors` (``"all"``: every parameter, as ``l2.py``; ``"blocks"``: the
    decoder blocks only) restricted to `blocks` (default all). Any function of the model is a valid statistic, so a
    subset keeps the p-value exact; it only changes the power. π_t = `random_permutations` (seeded).

    Args:
        model_a, model_b: two models of the same architecture (same parameter names and shapes).
        n_perm (`int`, defaults to 99): T (code ``main.py --num_perm 99``); the p-value floor is 1/(T + 1).
        seed (`int`): seeds the permutation draws.
        blocks (`list[int]`, *optional*): blocks whose tensors enter the statistic.
        tensors (`str`, defaults to ``"all"``): ``"all"`` or ``"blocks"``.

    Returns:
        `PermTestResult` with ``p["l2"]``, ``p["cos"]`` and the null statistics.
    """
    if n_perm < 1:
        raise ValueError(f"n_perm must be >= 1, got {n_perm}")
    plan = _same_architecture(model_a, model_b, "PERMTEST")
    names = _select(plan, tensors, blocks)
    if not names:
        raise ValueError(f"no tensors selected (tensors={tensors!r}, blocks={list(blocks or [])})")
    pa = dict(model_a.named_parameters())
    pb = dict(model_b.named_parameters())
    w_a = {n: pa[n].detach().float().contiguous() for n in names}
    w_b = {n: pb[n].detach().float().reshape(-1) for n in names}
    # permutation-invariant squared norms (float64): ||π(W_a) − W_b||² = ||W_a||² + ||W_b||² − 2<π(W_a), W_b>, so one
    # gather and one dot product per tensor and draw (the cost of a draw is a pass over the selected tensors)
    sq_a = {n: float(w_a[n].double().square().sum()) for n in names}
    sq_b = {n: float(w_b[n].double().square().sum()) for n in names}

    def stats(mlp_perms: Sequence[torch.Tensor] | None, emb_perm: torch.Tensor | None) -> dict[str, float]:
        l2, cos = [], []
        for n in names:
            wa = w_a[n] if emb_perm is None else _permuted(w_a[n], plan[n], mlp_perms, emb_perm)
            dot = float(torch.dot(wa.reshape(-1), w_b[n]))
            l2.append(math.sqrt(max(sq_a[n] + sq_b[n] - 2.0 * dot, 0.0)))
            cos.append(dot / max(math.sqrt(sq_a[n] * sq_b[n]), P_FLOOR))
        return {"l2": -float(np.mean(l2)), "cos": float(np.mean(cos))}

    observed = stats(None, None)
    gen = torch.Generator().manual_seed(seed)
    null: dict[str, list[float]] = {s: [] for s in STATISTICS}
    for _ in range(n_perm):
        mlp_perms, emb_perm = random_permutations(model_a, gen)
        for s, v in stats(mlp_perms, emb_perm).items():
            null[s].append(v)
    p = {s: (1 + sum(v >= observed[s] for v in null[s])) / (n_perm + 1) for s in STATISTICS}
    return PermTestResult(p=p, observed=observed, null=null, n_perm=n_perm, tensors=names)


@torch.no_grad()
def csw_test(model_a: nn.Module, model_b: nn.Module, blocks: Sequence[int] | None = None) -> BlockTest:
    """CSW (``csu.py``): per block, Spearman(LAP_max(cos(rows of W_up^a, rows of W_up^b)), identity); Fisher.

    Args:
        model_a, model_b: two models of the same architecture.
        blocks (`list[int]`, *optional*): blocks tested (default all).
    """
    _same_architecture(model_a, model_b, "CSW")
    blocks = list(range(n_blocks(model_a))) if blocks is None else list(blocks)
    ps = [identity_test(_glu(model_a, i).up_proj.weight, _glu(model_b, i).up_proj.weight, "cosine")[0] for i in blocks]
    return BlockTest(blocks=[(i, i) for i in blocks], p=ps)


def csh_from_activations(
    acts_a: MLPActivations,
    acts_b: MLPActivations,
    block_pairs: Sequence[tuple[int, int]],
    *,
    pools_a: Sequence[torch.Tensor] | None = None,
    pools_b: Sequence[torch.Tensor] | None = None,
) -> BlockTest:
    """CSH (``csh.py``): Spearman(LAP_max(cos of up_proj activation rows), identity) per block; Fisher."""
    ps = [
        identity_test(acts_a.units(i, "up", pools_a), acts_b.units(j, "up", pools_b), "cosine")[0]
        for i, j in block_pairs
    ]
    return BlockTest(blocks=list(block_pairs), p=ps)


__all__ = [
    "PermTestResult",
    "csh_from_activations",
    "csw_test",
    "permtest",
]
