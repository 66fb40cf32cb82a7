"""Compute accounting: forward passes, tokens processed, a FLOP proxy and wall time, per model.

Many claims in the catalogue are efficiency claims ("fewer target-model FLOPs", "1 reward call per token instead of
k"), so every experiment counts what each model did. `ComputeMeter.track(model, name)` attaches a forward hook to the
model, so whatever calls it (lmlab's decode loop, `model.generate`, the scorers) is counted the same way.

Counting rules, per model forward call on input of shape (batch, seq):

- ``forward_calls`` += batch: one call per *sequence* row (4 beams in one batched call are 4 calls);
- ``forward_batches`` += 1: actual invocations of the model;
- ``prefill_tokens`` += batch * seq when seq > 1, else ``decode_tokens`` += batch (padding positions count: they
  are computed);
- ``flops`` += 2 * flop_params * batch * seq, with `flop_params` from `lmlab.core.inference.models.flop_params` (all
  non-embedding weights plus the LM head; attention's n^2 term is left out, it is small at our lengths);
- ``wall_s`` += the forward's wall time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class ModelCost:
    """Counters for one model."""

    forward_calls: int = 0
    forward_batches: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    flops: float = 0.0
    wall_s: float = 0.0

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens

    def add(self, other: ModelCost) -> None:
        for key, value in asdict(other).items():
            setattr(self, key, getattr(self, key) + value)

    def minus(self, other: ModelCost) -> ModelCost:
        return ModelCost(**{k: v - getattr(other, k) for k, v in asdict(self).items()})

    def to_dict(self) -> dict[str, float]:
        d = asdict(self)
        d["tokens"] = self.tokens
        return d


@dataclass
class ComputeMeter:
    """Per-model compute counters. Use `track` to count a model's forwards, or `record` to count by hand.

    Example:
        >>> meter = ComputeMeter()
        >>> with meter.track(model, "target"):
        ...     model.generate(**inputs, max_new_tokens=8)
        >>> meter.total().forward_calls
    """

    models: dict[str, ModelCost] = field(default_factory=dict)

    def record(self, name: str, *, batch: int, seq: int, flop_params: int, wall_s: float = 0.0) -> None:
        cost = self.models.setdefault(name, ModelCost())
        cost.forward_calls += batch
        cost.forward_batches += 1
        if seq > 1:
            cost.prefill_tokens += batch * seq
        else:
            cost.decode_tokens += batch * seq
        cost.flops += 2.0 * flop_params * batch * seq
        cost.wall_s += wall_s

    @contextlib.contextmanager
    def track(self, model: Any, name: str | None = None) -> Iterator[ComputeMeter]:
        """Count every forward of `model` (the top-level module) while the context is open."""
        from lmlab.core.inference.models import flop_params

        label = name or getattr(model, "lmlab_spec", None) or type(model).__name__
        n_params = flop_params(model)
        starts: list[float] = []

        def pre_hook(module: Any, args: tuple, kwargs: dict) -> None:
            starts.append(time.perf_counter())

        def post_hook(module: Any, args: tuple, kwargs: dict, output: Any) -> None:
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is None:
                ids = kwargs.get("inputs_embeds")
            batch, seq = (int(ids.shape[0]), int(ids.shape[1])) if ids is not None else (1, 1)
            wall = time.perf_counter() - starts.pop() if starts else 0.0
            self.record(label, batch=batch, seq=seq, flop_params=n_params, wall_s=wall)

        h1 = model.register_forward_pre_hook(pre_hook, with_kwargs=True)
        h2 = model.register_forward_hook(post_hook, with_kwargs=True)
        try:
            yield self
        finally:
            h1.remove()
            h2.remove()

    def total(self) -> ModelCost:
        out = ModelCost()
        for cost in self.models.values():
            out.add(cost)
        return out

    def snapshot(self) -> dict[str, ModelCost]:
        return {k: ModelCost(**asdict(v)) for k, v in self.models.items()}

    def since(self, snapshot: dict[str, ModelCost]) -> dict[str, ModelCost]:
        """Cost accrued after `snapshot` (per model)."""
        return {k: v.minus(snapshot.get(k, ModelCost())) for k, v in self.models.items()}

    def to_dict(self) -> dict[str, Any]:
        return {"per_model": {k: v.to_dict() for k, v in self.models.items()}, "total": self.total().to_dict()}

    def reset(self) -> None:
        self.models.clear()


@contextlib.contextmanager
def measure(meter: ComputeMeter | None) -> Iterator[dict[str, ModelCost]]:
    """Yield a dict that, on exit, holds the per-model cost accrued inside the block."""
    delta: dict[str, ModelCost] = {}
    if meter is None:
        yield delta
        return
    before = meter.snapshot()
    try:
        yield delta
    finally:
        delta.update(meter.since(before))
