"""Representation interventions at named hook points: steering vectors and LoReFT low-rank edits.

An *intervention* is any callable (usually an `nn.Module`) mapping activations ``(..., d)`` to the same shape. It is
applied at a hook point of `lmlab.core.inference.hooks` (e.g. ``"blocks.3.hook_resid_post"``) at chosen sequence
positions
with `attach_intervention` (a context manager) or `intervention_hook` (a hook function for ``fwd=[...]``).

- `SteeringVector`: ``Φ(h) = h + α v`` (activation addition / contrastive steering).
- `LoReFTIntervention`: ``Φ(h) = h + Rᵀ(W h + b − R h)`` (Wu et al. 2024, "ReFT: Representation Finetuning for
  Language Models", as in pyreft's ``LoreftIntervention``), with ``R ∈ R^{r×d}`` constrained to orthonormal rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.nn.utils import parametrizations

from lmlab.core.inference.hooks import HookFn, HookPoint, Positions, _at, _pos_index, _seq_dim, hooks

__all__ = ["LoReFTIntervention", "SteeringVector", "attach_intervention", "intervention_hook"]


class SteeringVector(nn.Module):
    """Adds a fixed direction: ``Φ(h) = h + alpha * vector``.

    Args:
        vector: The direction, shape (d,) (or any shape broadcasting against the activation's trailing dims).
        alpha: Scale.
        trainable: Make `vector` an `nn.Parameter` (e.g. to optimise a steering vector); otherwise a buffer.

    Example:
        >>> sv = SteeringVector(v, alpha=4.0)
        >>> with sv.attach(model, "blocks.1.hook_resid_post", positions=[-1]):
        ...     out = model.generate(ids)
    """

    def __init__(self, vector: torch.Tensor, alpha: float = 1.0, *, trainable: bool = False) -> None:
        super().__init__()
        vector = torch.as_tensor(vector).detach().clone()
        if trainable:
            self.vector = nn.Parameter(vector)
        else:
            self.register_buffer("vector", vector)
        self.alpha = float(alpha)

    @classmethod
    def from_contrast(
        cls, positive: torch.Tensor, negative: torch.Tensor, alpha: float = 1.0, *, normalize: bool = False
    ) -> SteeringVector:
        """Difference of means ``mean(positive) − mean(negative)`` over all but the last dim (Turner et al. /
        Rimsky et al. style). With `normalize`, the vector has unit norm.
        """
        pos = positive.reshape(-1, positive.shape[-1]).float().mean(0)  # (d,)
        neg = negative.reshape(-1, negative.shape[-1]).float().mean(0)  # (d,)
        vec = pos - neg
        if normalize:
            vec = vec / vec.norm().clamp_min(1e-12)
        return cls(vec.to(positive.dtype), alpha)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """``h + alpha * vector``; h: (..., d)."""
        return h + self.alpha * self.vector.to(device=h.device, dtype=h.dtype)

    def attach(
        self, model: nn.Module, name: str, positions: Positions = None
    ) -> contextlib.AbstractContextManager[nn.Module]:
        """`attach_intervention` of this vector at hook `name`."""
        return attach_intervention(model, name, self, positions)


class LoReFTIntervention(nn.Module):
    """Low-rank linear subspace ReFT: ``Φ(h) = h + Rᵀ(W h + b − R h)``.

    ``R`` (rank, d) has orthonormal rows (kept so by `torch.nn.utils.parametrizations.orthogonal`), ``W`` (rank, d)
    and ``b`` (rank,) are a learned linear projection. The edit replaces the coordinates of `h` in the subspace
    spanned by R's rows with ``W h + b`` and leaves the orthogonal complement untouched. pyreft's
    ``LoreftIntervention`` stores R as a (d, rank) matrix with orthonormal columns; this is its transpose.

    Args:
        d: Hidden size.
        rank: Subspace dimension r (1 <= r <= d).
        dropout: Dropout on the output (pyreft's default is 0).
        act_fn: Optional activation on ``W h + b`` (pyreft's ``act_fn``, default identity).

    Attributes:
        rotate_layer: ``nn.Linear(d, rank, bias=False)`` with orthogonal parametrization; ``R = rotate_layer.weight``.
        learned_source: ``nn.Linear(d, rank)``; ``W = learned_source.weight``, ``b = learned_source.bias``.
    """

    def __init__(
        self,
        d: int,
        rank: int,
        *,
        dropout: float = 0.0,
        act_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if not 1 <= rank <= d:
            raise ValueError(f"rank must be in [1, d={d}], got {rank}")
        self.d, self.rank = d, rank
        self.rotate_layer = parametrizations.orthogonal(nn.Linear(d, rank, bias=False, dtype=dtype))
        self.learned_source = nn.Linear(d, rank, dtype=dtype)
        self.dropout = nn.Dropout(dropout)
        self.act_fn = act_fn

    @property
    def R(self) -> torch.Tensor:  # noqa: N802 - the paper's symbol
        """The (rank, d) projection with orthonormal rows."""
        return self.rotate_layer.weight

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Apply the edit to h: (..., d) -> (..., d)."""
        r = self.R.to(h.dtype)  # (rank, d)
        if self.act_fn is None:
            # (W h + b) - R h as one product (W - R) h + b: the same value, one matmul instead of two, and exactly
            # zero when W = R (two separate products round differently on some CPU kernels)
            diff = nn.functional.linear(h, self.learned_source.weight - r, self.learned_source.bias)  # (..., rank)
        else:
            diff = self.act_fn(self.learned_source(h)) - self.rotate_layer(h)  # (..., rank)
        delta = torch.matmul(diff, r)  # (..., d) = Rᵀ(W h + b − R h)
        return self.dropout(h + delta)

    @torch.no_grad()
    def set_identity(self) -> LoReFTIntervention:
        """Set ``W = R`` and ``b = 0`` (the edit becomes the identity); returns self."""
        self.learned_source.weight.copy_(self.R)
        self.learned_source.bias.zero_()
        return self


def intervention_hook(intervention: Callable[[torch.Tensor], torch.Tensor], positions: Positions = None) -> HookFn:
    """A hook function applying `intervention` to the activation at `positions` of the sequence dim.

    Args:
        intervention: Maps (..., d) to the same shape (e.g. `SteeringVector`, `LoReFTIntervention`).
        positions: Sequence positions (int, list, slice, index tensor), relative to each forward call's input
            (with a KV cache, later calls see only new tokens); ``None`` for all positions.

    Returns:
        ``fn(tensor, *, hook) -> tensor`` for `lmlab.core.inference.hooks.hooks`. Gradients flow through it to the
        intervention's parameters.
    """
    idx = _pos_index(positions)

    def hook_fn(tensor: torch.Tensor, *, hook: HookPoint) -> torch.Tensor:
        if positions is None:
            return intervention(tensor)
        dim = _seq_dim(hook.name)
        out = tensor.clone()
        out[_at(dim, idx)] = intervention(tensor[_at(dim, idx)])
        return out

    return hook_fn


@contextlib.contextmanager
def attach_intervention(
    model: nn.Module,
    name: str,
    intervention: Callable[[torch.Tensor], torch.Tensor],
    positions: Positions = None,
) -> Iterator[nn.Module]:
    """Context manager applying `intervention` at hook point `name` (aliases allowed) for `positions`.

    The hook is removed on exit, also after an exception.

    Example:
        >>> reft = LoReFTIntervention(d=576, rank=4)
        >>> with attach_intervention(model, "blocks.15.hook_resid_post", reft, positions=[-1]):
        ...     loss = model(**batch, labels=labels).loss
    """
    with hooks(model, fwd=[(name, intervention_hook(intervention, positions))]):
        yield model
