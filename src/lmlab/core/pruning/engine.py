"""The sequential layer-by-layer calibration engine shared by Wanda, SparseGPT, OWL, ATP and mAIHT.

For each decoder block l = 0..L-1 (locuslab/wanda ``prune_wanda`` / ``prune_sparsegpt``):

1. run the (still dense) block on its current calibration inputs with a forward hook on every ``nn.Linear`` of the
   block (q, k, v, o, gate, up, down; never ``lm_head`` or the embeddings), accumulating each linear's input Gram
   matrix ``sum_t x_t x_t^T`` in fp32;
2. prune every linear of the block with the block's sparsity ``s_l`` (a per-linear ``prune_fn``);
3. run the now-sparse block again on the same inputs: its outputs are the next block's inputs, so later blocks are
   calibrated on the outputs of the already-pruned earlier blocks.

Block-0 inputs and every block's keyword arguments (attention mask, ``position_embeddings=(cos, sin)``, position ids)
are captured with ``register_forward_pre_hook(..., with_kwargs=True)`` on every block during one dense forward per
calibration batch: Gemma 3 passes different masks and rotary tables to its sliding and full attention layers, so
kwargs are recorded per block, not only at block 0 (the official "Catcher" captures only ``attention_mask`` and
``position_ids`` at block 0, which breaks on transformers 5).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lmlab.core.pruning.masks import parse_mask_structure
from lmlab.core.pruning.solvers import LayerStats, PruneFn, get_prune_fn, wanda_scores

OnLayer = Callable[["LayerRecord", LayerStats, torch.Tensor, torch.Tensor], None]


# ----------------------------------------------------------------------------------------------------------------
# model structure


def decoder_blocks(model: Any) -> nn.ModuleList:
    """The decoder blocks of a llama / gemma3 style causal LM (``model.model.layers``)."""
    for path in ("model.layers", "model.language_model.layers", "model.decoder.layers", "transformer.h"):
        obj = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        if isinstance(obj, nn.ModuleList) and len(obj) > 0:
            return obj
    raise ValueError(f"cannot find the decoder blocks of {type(model).__name__} (expected model.model.layers)")


def block_linears(block: nn.Module) -> dict[str, nn.Linear]:
    """Every ``nn.Linear`` inside a block, by name relative to the block, in module order.

    A block holding a weight matrix in another layer type (GPT-2's ``Conv1D`` stores (C_in, C_out)) raises instead
    of being left silently dense with a reported sparsity of 0.
    """
    other = [
        (name, type(m).__name__)
        for name, m in block.named_modules()
        if not isinstance(m, nn.Linear | nn.Embedding)
        and isinstance(getattr(m, "weight", None), torch.Tensor)
        and m.weight.dim() == 2
    ]
    if other:
        name, kind = other[0]
        raise ValueError(
            f"cannot prune layer {name!r} of type {kind}: lmlab's pruners handle nn.Linear weights (C_out, C_in) only "
            f"({len(other)} such layer(s) in this block); convert the model's {kind} layers to nn.Linear first"
        )
    return {name: m for name, m in block.named_modules() if isinstance(m, nn.Linear)}


def resolve_sparsities(sparsity: float | Sequence[float], n_blocks: int) -> list[float]:
    """A float -> the same for every block; a list -> checked to have one value per block in [0, 1]."""
    if isinstance(sparsity, int | float) and not isinstance(sparsity, bool):
        values = [float(sparsity)] * n_blocks
    else:
        values = [float(s) for s in sparsity]
        if len(values) != n_blocks:
            raise ValueError(f"sparsity list must have one value per block ({n_blocks}), got {len(values)}")
    for i, s in enumerate(values):
        if not 0.0 <= s <= 1.0:
            raise ValueError(f"sparsity of block {i} must be in [0, 1], got {s!r}")
    return values


# ----------------------------------------------------------------------------------------------------------------
# results


@dataclass
class LayerRecord:
    """Diagnostics of one pruned linear.

    Attributes:
        block, name: where it is.
        shape: ``(C_out, C_in)``.
        target_sparsity: the block's sparsity (N/M for N:M masks).
        sparsity: measured fraction of exact zeros after pruning.
        recon_error: ``sum_t ||W x_t - W' x_t||^2`` over the calibration tokens (exact, from the Gram matrix).
        rel_recon_error: that divided by ``sum_t ||W x_t||^2``.
        seconds: wall time of the prune_fn call.
    """

    block: int
    name: str
    shape: tuple[int, int]
    target_sparsity: float
    sparsity: float
    recon_error: float
    rel_recon_error: float
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class BlockRecord:
    """Diagnostics of one pruned block.

    Attributes:
        block: index.
        target_sparsity: the block's sparsity.
        sparsity: measured sparsity over the block's linears.
        out_error: ``||Y - Y'||^2 / ||Y||^2`` of the block's output, dense vs pruned block on the same inputs.
        dense_error: ``||h_l - h'_l||^2 / ||h_l||^2`` of the block's output against the fully dense model's
            hidden state at the same depth (the accumulated, propagated error; None when not tracked).
    """

    block: int
    target_sparsity: float
    sparsity: float
    out_error: float
    dense_error: float | None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class PruneReport:
    """What `prune_model` did: per-linear and per-block diagnostics, totals, and any kept statistics."""

    method: str
    mask_structure: str
    target_sparsities: list[float]
    layers: list[LayerRecord] = field(default_factory=list)
    blocks: list[BlockRecord] = field(default_factory=list)
    stats: dict[tuple[int, str], LayerStats] = field(default_factory=dict)
    seconds: float = 0.0
    n_calib_tokens: int = 0
    block_outputs: list[torch.Tensor] | None = None  # with keep_outputs: per block, (n_windows, seq, hidden)

    @property
    def sparsity(self) -> float:
        """Measured sparsity over all pruned linears (weighted by size)."""
        total = sum(r.shape[0] * r.shape[1] for r in self.layers)
        zeros = sum(r.sparsity * r.shape[0] * r.shape[1] for r in self.layers)
        return zeros / total if total else 0.0

    @property
    def n_params(self) -> int:
        return sum(r.shape[0] * r.shape[1] for r in self.layers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "mask_structure": self.mask_structure,
            "target_sparsities": list(self.target_sparsities),
            "sparsity": self.sparsity,
            "n_params": self.n_params,
            "seconds": self.seconds,
            "n_calib_tokens": self.n_calib_tokens,
            "layers": [r.to_dict() for r in self.layers],
            "blocks": [r.to_dict() for r in self.blocks],
        }


# ----------------------------------------------------------------------------------------------------------------
# capture


class _Stop(Exception):
    pass


@dataclass
class BlockInputs:
    """Captured calibration inputs: block-0 hidden states per batch, and every block's call arguments per batch."""

    hidden: list[torch.Tensor]  # per batch: (batch, seq, hidden)
    calls: list[list[tuple[tuple, dict]]]  # [block][batch] -> (extra positional args, kwargs)


@torch.no_grad()
def capture_block_inputs(model: Any, calib_ids: torch.Tensor, *, batch_size: int = 8) -> BlockInputs:
    """Run the dense model on `calib_ids` (n, seq) and record block-0 inputs and every block's call arguments.

    The forward stops at the last block (its pre-hook raises), so the LM head never runs.
    """
    blocks = decoder_blocks(model)
    for block in blocks:
        block_linears(block)  # an unsupported layer type is refused before any calibration forward
    hidden: list[torch.Tensor] = []
    calls: list[list[tuple[tuple, dict]]] = [[] for _ in blocks]

    def make_hook(index: int) -> Callable:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            kwargs = dict(kwargs)
            if args:
                h, rest = args[0], tuple(args[1:])
            else:
                h, rest = kwargs.pop("hidden_states"), ()
            if index == 0:
                hidden.append(h.detach())
            calls[index].append((rest, kwargs))
            if index == len(blocks) - 1:
                raise _Stop

        return hook

    handles = [b.register_forward_pre_hook(make_hook(i), with_kwargs=True) for i, b in enumerate(blocks)]
    try:
        device = next(model.parameters()).device
        for batch in calib_ids.split(batch_size):
            try:
                model(input_ids=batch.to(device), use_cache=False)
            except _Stop:
                pass
    finally:
        for h in handles:
            h.remove()
    return BlockInputs(hidden, calls)


def _run_block(block: nn.Module, h: torch.Tensor, call: tuple[tuple, dict]) -> torch.Tensor:
    rest, kwargs = call
    out = block(h, *rest, **kwargs)
    return out[0] if isinstance(out, tuple) else out


class _GramCollector:
    """Forward hook accumulating ``sum_t x_t x_t^T`` of a linear's inputs in fp32."""

    def __init__(self, module: nn.Linear) -> None:
        n = module.in_features
        self.gram = torch.zeros(n, n, dtype=torch.float32, device=module.weight.device)
        self.n_samples = 0
        self.n_tokens = 0
        self.out_sq = 0.0  # sum_t ||W x_t||^2 (the reference of the relative reconstruction error)

    def __call__(self, module: nn.Module, inputs: tuple, output: Any) -> None:
        x = inputs[0].detach()
        self.n_samples += x.shape[0] if x.dim() == 3 else 1
        x = x.reshape(-1, x.shape[-1]).float()  # (tokens, C_in)
        self.n_tokens += x.shape[0]
        self.gram.addmm_(x.T, x)
        y = output.detach().float()
        if module.bias is not None:
            y = y - module.bias.float()
        self.out_sq += float(y.pow(2).sum())


def _sq(t: torch.Tensor) -> float:
    return float(t.float().pow(2).sum())


# ----------------------------------------------------------------------------------------------------------------
# the engine


@torch.no_grad()
def prune_model(
    model: Any,
    calib_ids: torch.Tensor,
    *,
    method: str | PruneFn | None = "wanda",
    sparsity: float | Sequence[float] = 0.5,
    mask_structure: str = "unstructured",
    block_size: int = 128,
    dampening_frac: float = 0.01,
    magnitude_group: str = "layer",
    batch_size: int = 8,
    keep_stats: bool | Callable[[int, str], bool] = False,
    on_layer: OnLayer | None = None,
    track_dense: bool = True,
    layer_filter: Callable[[int, str], bool] | None = None,
    keep_outputs: bool = False,
    dense_outputs: Sequence[torch.Tensor] | None = None,
) -> PruneReport:
    """Prune `model` in place, block by block, on calibration windows `calib_ids` (n, seq) (see the module doc).

    Args:
        model: a llama / gemma3 style causal LM (``model.model.layers``), modified in place.
        calib_ids (`torch.Tensor`): (n_windows, seq_len) calibration token ids.
        method: ``"magnitude"``, ``"wanda"``, ``"sparsegpt"``, a ``prune_fn(weight, stats, sparsity, nm) ->
            new_weight``, or None (no pruning: only statistics and diagnostics, e.g. for OWL or a study).
        sparsity: one float for every block, or one value per block (ATP / OWL allocations; block 0 first).
        mask_structure (`str`): ``"unstructured"`` or ``"N:M"`` (prune N of every M; the sparsity is then N/M and a
            different `sparsity` raises).
        block_size, dampening_frac: SparseGPT's lazy-batch block size (128) and percdamp (0.01).
        magnitude_group: ``"layer"`` (official) or ``"row"``, for magnitude pruning.
        batch_size: calibration windows per block forward.
        keep_stats: keep the `LayerStats` (Gram matrices) of all linears (True) or of those where
            ``keep_stats(block, name)`` is true, in ``report.stats``.
        on_layer: called after each linear as ``on_layer(record, stats, old_weight, new_weight)``.
        track_dense (`bool`): also propagate the dense model's hidden states, for ``BlockRecord.dense_error``.
        layer_filter: prune only linears where ``layer_filter(block, name)`` is true (others stay dense).
        keep_outputs (`bool`): keep every block's propagated calibration outputs in ``report.block_outputs``.
        dense_outputs: the dense model's output of every block on these same windows, (n_windows, seq, d) each (the
            ``block_outputs`` of ``prune_model(model, calib_ids, method=None, keep_outputs=True)``): with
            `track_dense`, used for ``dense_error`` instead of propagating the dense states again (one block forward
            less per block; for callers that prune many copies of one model on the same windows).

    Returns:
        `PruneReport`.
    """
    t_start = time.perf_counter()
    blocks = decoder_blocks(model)
    nm = parse_mask_structure(mask_structure)
    if nm is not None:
        target = nm[0] / nm[1]
        if isinstance(sparsity, Sequence):
            bad = [s for s in sparsity if abs(float(s) - target) > 1e-9]
        else:
            bad = [sparsity] if abs(float(sparsity) - target) > 1e-9 else []
        if bad:
            raise ValueError(
                f"mask_structure {mask_structure!r} prunes {target:g} of every layer; sparsity must be {target:g}, "
                f"got {sparsity!r}"
            )
        sparsities = [target] * len(blocks)
    else:
        sparsities = resolve_sparsities(sparsity, len(blocks))
    if method is None:
        prune_fn, method_name = None, "none"
    elif isinstance(method, str):
        prune_fn = get_prune_fn(
            method, block_size=block_size, dampening_frac=dampening_frac, magnitude_group=magnitude_group
        )
        method_name = method
    elif callable(method):
        prune_fn, method_name = method, getattr(method, "__name__", "custom")
    else:
        raise ValueError(f"method must be a name, a prune_fn or None, got {method!r}")
    if calib_ids.dim() != 2 or calib_ids.shape[0] < 1:
        raise ValueError(f"calib_ids must be (n_windows, seq_len) with n_windows >= 1, got {tuple(calib_ids.shape)}")

    was_training = model.training
    model.eval()
    captured = capture_block_inputs(model, calib_ids, batch_size=batch_size)
    inps = captured.hidden
    n_windows = len(calib_ids)
    if dense_outputs is not None and (len(dense_outputs) != len(blocks) or dense_outputs[0].shape[0] != n_windows):
        raise ValueError(
            f"dense_outputs must hold one (n_windows={n_windows}, seq, d) tensor per block ({len(blocks)}), got "
            f"{len(dense_outputs)} of shape {tuple(dense_outputs[0].shape) if len(dense_outputs) else None}"
        )
    dense = [h.clone() for h in inps] if track_dense and dense_outputs is None else None
    report = PruneReport(method_name, mask_structure or "unstructured", sparsities, n_calib_tokens=calib_ids.numel())

    for b, block in enumerate(blocks):
        calls = captured.calls[b]
        linears = block_linears(block)
        collectors = {name: _GramCollector(m) for name, m in linears.items()}
        handles = [m.register_forward_hook(collectors[name]) for name, m in linears.items()]
        try:
            local_dense = [_run_block(block, h, c) for h, c in zip(inps, calls)]
        finally:
            for h in handles:
                h.remove()
        if not track_dense:
            dense_out = None
        elif dense_outputs is not None:  # the same batches as `inps` (calib_ids.split(batch_size))
            dense_out = list(dense_outputs[b].split(batch_size))
        else:  # propagate the dense states (before this block's weights are pruned)
            dense_out = dense = [_run_block(block, h, c) for h, c in zip(dense, calls)]

        zeros = total = 0
        for name, module in linears.items():
            col = collectors[name]
            stats = LayerStats(b, name, col.n_samples, col.n_tokens, col.gram)
            old = module.weight.data.detach().float().clone()
            t0 = time.perf_counter()
            if prune_fn is not None and (layer_filter is None or layer_filter(b, name)):
                new = prune_fn(old.clone(), stats, sparsities[b], nm).float()
                if new.shape != old.shape:
                    raise ValueError(f"prune_fn returned shape {tuple(new.shape)} for {name}, expected {old.shape}")
                module.weight.data.copy_(new.to(module.weight.dtype))
            else:
                new = old
            seconds = time.perf_counter() - t0
            n_zero = int((module.weight.data == 0).sum())
            err, rel = stats.reconstruction_error(old, new, ref=col.out_sq) if new is not old else (0.0, 0.0)
            rec = LayerRecord(
                b,
                name,
                (old.shape[0], old.shape[1]),
                sparsities[b],
                n_zero / old.numel(),
                err,
                rel,
                seconds,
            )
            report.layers.append(rec)
            zeros += n_zero
            total += old.numel()
            if on_layer is not None:
                on_layer(rec, stats, old, new)
            if keep_stats is True or (callable(keep_stats) and keep_stats(b, name)):
                report.stats[(b, name)] = stats
        outs = [_run_block(block, h, c) for h, c in zip(inps, calls)] if prune_fn is not None else local_dense
        out_err = sum(_sq(a - o) for a, o in zip(local_dense, outs)) / max(sum(_sq(a) for a in local_dense), 1e-30)
        dense_err = None
        if dense_out is not None:
            dense_err = sum(_sq(a - o) for a, o in zip(dense_out, outs)) / max(sum(_sq(a) for a in dense_out), 1e-30)
        report.blocks.append(BlockRecord(b, sparsities[b], zeros / max(total, 1), out_err, dense_err))
        if keep_outputs:
            report.block_outputs = (report.block_outputs or []) + [torch.cat(outs)]
        inps = outs
    model.train(was_training)
    report.seconds = time.perf_counter() - t_start
    return report


@torch.no_grad()
def collect_layer_stats(
    model: Any,
    calib_ids: torch.Tensor,
    *,
    keep: bool | Callable[[int, str], bool] = True,
    batch_size: int = 8,
) -> dict[tuple[int, str], LayerStats]:
    """The input statistics (Gram matrices) of the dense model's linears, without pruning anything.

    With no pruning, "sequential" and dense propagation coincide. For statistics under an upstream-pruned model,
    pass ``keep_stats`` (or ``on_layer``) to `prune_model` instead.
    """
    report = prune_model(
        model, calib_ids, method=None, batch_size=batch_size, keep_stats=keep, track_dense=False, sparsity=0.0
    )
    return report.stats


# ----------------------------------------------------------------------------------------------------------------
# OWL


@dataclass
class OWLAllocation:
    """OWL's per-block sparsities and the outlier ratios (percent) they came from."""

    sparsities: list[float]
    outlier_ratios: list[float]


def owl_from_ratios(outlier_ratios: Sequence[float], sparsity: float, lmbda: float = 0.08) -> list[float]:
    """OWL's allocation from per-block outlier ratios D (official luuyin/OWL ``prune_wanda_outlier``):

    ``D~ = (D - min D) / (max D - min D) * 2 lambda``; density ``= D~ - mean(D~) + (1 - S)``; sparsity = 1 - density,
    set to 0.01 where it would be <= 0. The mean stays S, the range is S +- lambda, and blocks with more outliers get
    lower sparsity.
    """
    d = torch.tensor([float(x) for x in outlier_ratios], dtype=torch.float64)
    spread = float(d.max() - d.min())
    norm = (d - d.min()) / spread * (2 * lmbda) if spread > 0 else torch.zeros_like(d)
    density = norm - norm.mean() + (1.0 - sparsity)
    out = []
    for x in (1.0 - density).tolist():
        out.append(0.01 if x <= 0 else float(x))
    return out


@torch.no_grad()
def owl_sparsities(
    model: Any,
    calib_ids: torch.Tensor,
    sparsity: float,
    *,
    m: float = 5.0,
    lmbda: float = 0.08,
    batch_size: int = 8,
) -> OWLAllocation:
    """OWL (Yin et al., ICML 2024): per-block sparsity from the block's outlier ratio of Wanda scores.

    ``D_l`` = percentage of the block's Wanda scores |W| * ||X|| (all its linears together) above ``m`` times their
    mean, on the dense model's calibration activations (the official first pass prunes nothing); then
    `owl_from_ratios`. Official defaults: M (``Hyper_m``) = 5, lambda (``Lamda``) = 0.08.
    """
    per_block: dict[int, list[torch.Tensor]] = {}

    def on_layer(rec: LayerRecord, stats: LayerStats, old: torch.Tensor, new: torch.Tensor) -> None:
        per_block.setdefault(rec.block, []).append(wanda_scores(old, stats).flatten())

    ratios: list[float] = []
    blocks = decoder_blocks(model)

    # finalize each block as soon as the next one starts, so only one block's scores are held at a time
    def finalize(b: int) -> None:
        scores = torch.cat(per_block.pop(b))
        ratios.append(100.0 * float((scores > m * scores.mean()).sum()) / scores.numel())

    def on_layer_streaming(rec: LayerRecord, stats: LayerStats, old: torch.Tensor, new: torch.Tensor) -> None:
        if rec.block > 0 and (rec.block - 1) in per_block:
            finalize(rec.block - 1)
        on_layer(rec, stats, old, new)

    prune_model(
        model,
        calib_ids,
        method=None,
        sparsity=0.0,
        batch_size=batch_size,
        on_layer=on_layer_streaming,
        track_dense=False,
    )
    finalize(len(blocks) - 1)
    return OWLAllocation(owl_from_ratios(ratios, sparsity, lmbda), ratios)


__all__ = [
    "BlockInputs",
    "BlockRecord",
    "LayerRecord",
    "OWLAllocation",
    "PruneReport",
    "block_linears",
    "capture_block_inputs",
    "collect_layer_stats",
    "decoder_blocks",
    "owl_from_ratios",
    "owl_sparsities",
    "prune_model",
    "resolve_sparsities",
]
