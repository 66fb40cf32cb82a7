"""MMInference inside a Hugging Face model: an attention function registered as ``"mminference"``.

``transformers.AttentionInterface.register("mminference", mminference_attention)`` plus
``model.config._attn_implementation = "mminference"`` routes every attention call of a llama-style model here. The
function receives post-RoPE ``query`` (b, h_q, n, d) and ``key``/``value`` (b, h_kv, n, d). Per-layer state lives in
an `MMInferenceController` attached to the attention modules (``module.mminference``), never in globals:

- ``"dense"``: transformers' own SDPA path (the baseline, bit for bit);
- ``"capture"``: store (q, k, v) per layer, return dense (calibration input for the pattern search);
- ``"sparse"``: online index build + block-sparse kernel (`method.sparse_prefill`), timed per layer;
- ``"shadow"``: compute dense and sparse on the same q, k, v, return dense; interleaved timing of SDPA against the
  sparse path (index included) with `compare_timings`, and the relative L2 error of the sparse output.

Decode steps (q_len != kv_len), short inputs (< ``min_len``) and padded batches (an explicit mask) always take the
dense SDPA path: MMInference only changes prefill.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from lmlab.methods.efficiency.mminference.method import sparse_prefill

NAME = "mminference"


@dataclass
class LayerRecord:
    """What one attention call of one layer measured."""

    layer: int
    n: int
    mode: str
    seconds: float = 0.0  # sparse path (index + kernel), or dense in "dense" mode
    index_s: float = 0.0
    density: float = 1.0  # mean kept causal pairs / n(n+1)/2 over query heads
    work: float = 1.0  # computed score entries / dense causal entries
    rel_l2: float | None = None  # shadow mode: ||sparse - dense|| / ||dense||
    timing: Any = None  # shadow mode: TimingReport (sdpa vs mminference)


@dataclass
class MMInferenceController:
    """Per-model MMInference state: patterns, mode and what the attention calls recorded.

    Args:
        patterns: ``{layer: {head: [kind, *args(, recall)]}}`` (MInference's best-pattern layout); missing heads are
            dense.
        block_size, last_q, forced_columns, forced_diagonals: kernel and VS-estimation settings (see `method`).
        min_len (`int`): shorter prefills run dense.
        mode (`str`): ``dense``, ``capture``, ``sparse`` or ``shadow``.
        shadow_repeats, shadow_warmup (`int`): timed rounds and warm-ups of the shadow comparison per layer.
    """

    patterns: dict[int, dict[int, Any]] = field(default_factory=dict)
    block_size: int = 128
    last_q: int = 64
    forced_columns: int = 30
    forced_diagonals: int = 100
    min_len: int = 256
    mode: str = "sparse"
    shadow_repeats: int = 3
    shadow_warmup: int = 2
    records: list[LayerRecord] = field(default_factory=list)
    captured: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def sparse(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
        return sparse_prefill(
            q,
            k,
            v,
            self.patterns.get(layer, {}),
            block_size=self.block_size,
            last_q=self.last_q,
            scale=scale,
            forced_columns=self.forced_columns,
            forced_diagonals=self.forced_diagonals,
        )


def register() -> None:
    """Register ``"mminference"`` with transformers' attention (and mask) interfaces (idempotent)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(NAME, mminference_attention)
    # SDPA's mask rules: no mask for an unpadded causal prefill (the sparse path), a real mask for padded batches
    AttentionMaskInterface.register(NAME, sdpa_mask)


def _attention_modules(model: Any) -> list[Any]:
    return [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "q_proj")]


@contextmanager
def attached(model: Any, controller: MMInferenceController) -> Iterator[MMInferenceController]:
    """Route `model`'s attention through MMInference with `controller` inside the block; restore it afterwards."""
    register()
    previous = model.config._attn_implementation
    modules = _attention_modules(model)
    for m in modules:
        m.mminference = controller
    model.config._attn_implementation = NAME
    try:
        yield controller
    finally:
        model.config._attn_implementation = previous
        for m in modules:
            if getattr(m, "mminference", None) is controller:
                del m.mminference


def mminference_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: see the module docstring. Returns ``(out (b, n, h_q, d), None)``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def dense() -> torch.Tensor:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )[0]

    ctl: MMInferenceController | None = getattr(module, "mminference", None)
    n = query.shape[2]
    if (
        ctl is None
        or ctl.mode == "dense"
        or n != key.shape[2]
        or n < ctl.min_len
        or attention_mask is not None
        or module.training
    ):
        return dense(), None
    layer = int(module.layer_idx)
    scale = float(scaling if scaling is not None else query.shape[-1] ** -0.5)
    if ctl.mode == "capture":
        ctl.captured[layer] = (query[0].detach().clone(), key[0].detach().clone(), value[0].detach().clone())
        return dense(), None
    if ctl.mode == "sparse":
        t0 = time.perf_counter()
        out, index = ctl.sparse(layer, query, key, value, scale)
        dt = time.perf_counter() - t0
        ctl.records.append(LayerRecord(layer, n, "sparse", dt, index.index_s, float(index.density.mean()), index.work))
        return out.transpose(1, 2).contiguous(), None
    if ctl.mode == "shadow":
        from lmlab.core.timing import compare_timings

        ref = dense()
        holder: dict[str, Any] = {}

        def run_sparse() -> None:
            holder["out"], holder["index"] = ctl.sparse(layer, query, key, value, scale)

        report = compare_timings(
            {"sdpa": dense, "mminference": run_sparse}, repeats=ctl.shadow_repeats, warmup=ctl.shadow_warmup
        )
        out = holder["out"].transpose(1, 2)
        rel = float((out - ref).norm() / ref.norm().clamp_min(1e-30))
        index = holder["index"]
        ctl.records.append(
            LayerRecord(
                layer,
                n,
                "shadow",
                report.stats["mminference"].median,
                index.index_s,
                float(index.density.mean()),
                index.work,
                rel,
                report,
            )
        )
        return ref, None
    raise ValueError(f"MMInferenceController.mode must be dense, capture, sparse or shadow, got {ctl.mode!r}")


__all__ = ["NAME", "LayerRecord", "MMInferenceController", "attached", "mminference_attention", "register"]
