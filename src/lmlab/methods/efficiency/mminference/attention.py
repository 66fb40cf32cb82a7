"""MMInference inside a Hugging Face model: an `AttentionController` of `lmlab.core.inference.attention`.

``with use_controller(model, MMInferenceController(...)):`` routes every attention call of a llama-style model
through lmlab's one registered attention function (``"lmlab_sparse"``) to `MMInferenceController.attend`, which
receives post-RoPE ``query`` (b, h_q, n, d) and ``key``/``value`` (b, h_kv, n, d). Per-layer state lives in the
controller, never in globals. Modes:

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
from dataclasses import dataclass, field
from typing import Any

import torch

from lmlab.core.inference.attention import AttentionController
from lmlab.methods.efficiency.mminference.method import sparse_prefill


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
class MMInferenceController(AttentionController):
    """Per-model MMInference state: patterns, mode and what the attention calls recorded.

    Args:
        patterns: ``{layer: {head: [kind, *args(, recall)]}}`` (MInference's best-pattern layout); missing heads are
            dense.
        block_size, last_q, forced_columns, forced_diagonals: kernel and VS-estimation settings (see `method`).
        min_len (`int`): shorter prefills run dense.
        mode (`str`): ``dense``, ``capture``, ``sparse`` or ``shadow``.
        shadow_repeats, shadow_warmup (`int`): timed rounds and warm-ups of the shadow comparison per layer.
        layout (`modality.ModalityLayout`, *optional*): the modality spans of the input being prefilled, needed by
            MMInference's mixed-modality kinds (``q_boundary``, ``2d_boundary``, ``vision_grid``).
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
    layout: Any = None
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
            layout=self.layout,
        )

    def attend(
        self,
        module: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        *,
        scaling: float | None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        """See the module docstring. Returns ``(out (b, n, h_q, d), None)``."""

        sdpa = super().attend  # the dense baseline: HF's own SDPA path, bit for bit

        def dense() -> torch.Tensor:
            return sdpa(module, query, key, value, attention_mask, scaling=scaling, **kwargs)[0]

        n = query.shape[2]
        if (
            self.mode == "dense"
            or n != key.shape[2]
            or n < self.min_len
            or attention_mask is not None
            or module.training
        ):
            return dense(), None
        layer = int(module.layer_idx)
        scale = float(scaling if scaling is not None else query.shape[-1] ** -0.5)
        if self.mode == "capture":
            self.captured[layer] = (query[0].detach().clone(), key[0].detach().clone(), value[0].detach().clone())
            return dense(), None
        if self.mode == "sparse":
            t0 = time.perf_counter()
            out, index = self.sparse(layer, query, key, value, scale)
            dt = time.perf_counter() - t0
            self.records.append(
                LayerRecord(layer, n, "sparse", dt, index.index_s, float(index.density.mean()), index.work)
            )
            return out.transpose(1, 2).contiguous(), None
        if self.mode == "shadow":
            from lmlab.core.stats.timing import compare_timings

            ref = dense()
            holder: dict[str, Any] = {}

            def run_sparse() -> None:
                holder["out"], holder["index"] = self.sparse(layer, query, key, value, scale)

            report = compare_timings(
                {"sdpa": dense, "mminference": run_sparse}, repeats=self.shadow_repeats, warmup=self.shadow_warmup
            )
            out = holder["out"].transpose(1, 2)
            rel = float((out - ref).norm() / ref.norm().clamp_min(1e-30))
            index = holder["index"]
            self.records.append(
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
        raise ValueError(f"MMInferenceController.mode must be dense, capture, sparse or shadow, got {self.mode!r}")


__all__ = ["LayerRecord", "MMInferenceController"]
