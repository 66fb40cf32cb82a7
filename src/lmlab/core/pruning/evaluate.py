"""Data, evaluation, saving and honest speed for pruned models.

- `token_stream`, `calibration_windows`, `eval_windows`: calibration and evaluation text from the offline `corpus`
  suite (CPython docstrings), whose train / dev / test splits come from disjoint modules.
- `window_nll`: mean next-token NLL of each evaluation window (per-window values, so CIs exist); perplexity is
  ``exp(mean NLL)``.
- `save_pruned`: a standard Hugging Face folder that `lmlab.core.inference.models.load_model(folder)` (and every
method's
  ``--model``) loads back.
- `storage_report`: bytes of the pruned linears as dense fp32, CSR (int32 indices), bitmask and N:M-compressed.
- `SparseLinear`, `csr_plan`, `sparse_copy`, `latency_report`: a per-layer dispatcher that runs a linear through torch
  CSR only where a micro-benchmark on this machine shows it beats dense, and an interleaved latency comparison
  (`lmlab.core.stats.timing.compare_timings`) of dense vs dispatched vs all-CSR models in the same process.
"""

from __future__ import annotations

import copy
import json
import math
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lmlab.core.pruning.engine import block_linears, decoder_blocks

# ----------------------------------------------------------------------------------------------------------------
# data


def token_stream(tokenizer: Any, texts: Sequence[str]) -> torch.Tensor:
    """(N,) token ids of `texts`, each followed by EOS (`lmlab.core.training.pretrain.encode_documents`)."""
    from lmlab.core.training.pretrain import encode_documents

    return encode_documents(tokenizer, texts)


def calibration_windows(stream: torch.Tensor, n: int, seq_len: int, *, seed: int = 0) -> torch.Tensor:
    """(n, seq_len) random windows of a token stream, seeded (the papers: random windows of C4 documents)."""
    if len(stream) < seq_len + 1:
        raise ValueError(f"the calibration stream ({len(stream)} tokens) is shorter than one window of {seq_len}")
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(stream) - seq_len, (n,), generator=g)
    return torch.stack([stream[s : s + seq_len] for s in starts.tolist()])


def eval_windows(stream: torch.Tensor, n: int, seq_len: int) -> torch.Tensor:
    """The first `n` non-overlapping windows of `seq_len` tokens (fewer if the stream is short; at least one)."""
    avail = len(stream) // seq_len
    if avail < 1:
        raise ValueError(f"the evaluation stream ({len(stream)} tokens) is shorter than one window of {seq_len}")
    k = min(n, avail)
    return stream[: k * seq_len].reshape(k, seq_len)


@torch.no_grad()
def window_nll(model: Any, windows: torch.Tensor, *, batch_size: int = 8) -> list[float]:
    """Mean next-token NLL (nats) of each (seq_len,) window: tokens 2..T predicted from their prefix in the window."""
    device = next(model.parameters()).device
    out: list[float] = []
    for batch in windows.split(batch_size):
        batch = batch.to(device)
        logits = model(input_ids=batch, use_cache=False).logits[:, :-1].float()  # (b, T-1, vocab)
        nll = F.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none")  # (b, T-1)
        out.extend(nll.mean(dim=1).tolist())
    return out


def perplexity_from_nll(values: Sequence[float]) -> float:
    """exp(mean NLL) (every window has the same number of predictions)."""
    return math.exp(sum(values) / len(values))


def record_perplexity(ctx: Any, system: str, values: Sequence[float], note: str = "") -> Any:
    """Record per-window NLLs as ``nll`` (with its CI) and ``perplexity`` = exp(mean NLL) with CI = exp(NLL CI)."""
    from lmlab.results import MetricRow

    row = ctx.record(system, "nll", list(values), unit="nats", note=note or "mean next-token NLL per eval window")
    lo = math.exp(row.ci_low) if row.ci_low is not None else None
    hi = math.exp(row.ci_high) if row.ci_high is not None else None
    ctx.metrics.append(MetricRow(system, "perplexity", math.exp(row.value), lo, hi, row.n, ctx.cfg.seed, "",
                                 "exp(mean NLL); CI = exp(NLL CI)"))  # fmt: skip
    return row


# ----------------------------------------------------------------------------------------------------------------
# sparsity and saving


def model_sparsity(model: Any) -> dict[str, Any]:
    """Measured sparsity of the decoder blocks' linears, per block and overall (zeros / weights)."""
    per_block = []
    zeros = total = 0
    for block in decoder_blocks(model):
        z = t = 0
        for m in block_linears(block).values():
            z += int((m.weight == 0).sum())
            t += m.weight.numel()
        per_block.append(z / t if t else 0.0)
        zeros, total = zeros + z, total + t
    return {"sparsity": zeros / total if total else 0.0, "per_block": per_block, "n_params": total}


def save_pruned(model: Any, tokenizer: Any, folder: str | Path, *, info: dict[str, Any] | None = None) -> Path:
    """Write a pruned model as a plain HF folder (fp32 safetensors, config, tokenizer) plus ``lmlab_pruning.json``.

    The zeros are stored densely (safetensors has no sparse format); `lmlab.core.inference.models.load_model(folder)`
    and
    ``lmlab run ID --model folder`` load it back with its sparsity intact.
    """
    from lmlab.core.inference.models import save_hf_folder

    folder = Path(folder)
    save_hf_folder(model, tokenizer, folder)
    meta = {"measured": model_sparsity(model), **(info or {})}
    (folder / "lmlab_pruning.json").write_text(json.dumps(meta, indent=2, default=str))
    return folder


# ----------------------------------------------------------------------------------------------------------------
# storage


def storage_report(model: Any, *, nm: tuple[int, int] | None = None, value_bytes: int = 4) -> dict[str, float]:
    """Bytes of the blocks' linear weights in several formats (values in `value_bytes`, fp32 by default).

    - ``dense``: every weight;
    - ``csr``: nnz values + nnz int32 column indices + (rows + 1) int32 row pointers (torch CSR, int32);
    - ``bitmask``: nnz values + 1 bit per weight (compressed-tensors' "sparse-bitmask" idea);
    - ``nm`` (N:M masks only): the kept (M-N)/M values + ceil(log2 M) index bits per kept value (the 2:4
      "semi-structured" layout: 2 bits per kept value).
    """
    dense = csr = bitmask = nm_bytes = 0.0
    nnz_total = numel_total = 0
    for block in decoder_blocks(model):
        for m in block_linears(block).values():
            w = m.weight
            numel = w.numel()
            nnz = int((w != 0).sum())
            dense += numel * value_bytes
            csr += nnz * (value_bytes + 4) + (w.shape[0] + 1) * 4
            bitmask += nnz * value_bytes + math.ceil(numel / 8)
            if nm is not None:
                n, mm = nm
                kept = numel * (mm - n) // mm
                nm_bytes += kept * value_bytes + math.ceil(kept * math.ceil(math.log2(mm)) / 8)
            nnz_total += nnz
            numel_total += numel
    out = {"dense_bytes": dense, "csr_bytes": csr, "bitmask_bytes": bitmask, "nnz": nnz_total, "numel": numel_total}
    if nm is not None:
        out["nm_bytes"] = nm_bytes
    return out


# ----------------------------------------------------------------------------------------------------------------
# honest speed: CSR only where it measurably wins


class SparseLinear(nn.Module):
    """``y = x W^T + b`` with W stored as a torch CSR tensor (int32 indices, ~20-25% faster than int64 on CPU)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach()
        with warnings.catch_warnings():  # "CSR support is in beta" / "invariant checks disabled"
            warnings.simplefilter("ignore", UserWarning)
            csr = w.to_sparse_csr()
            self.weight_csr = torch.sparse_csr_tensor(
                csr.crow_indices().int(), csr.col_indices().int(), csr.values(), size=w.shape
            )
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])  # (tokens, C_in)
        y = torch.sparse.mm(self.weight_csr, x2.T).T  # (tokens, C_out)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)


def _bench(fn: Any, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


@torch.no_grad()
def csr_plan(model: Any, *, tokens: int = 1, repeats: int = 7) -> dict[tuple[int, str], dict[str, float]]:
    """Per linear: median dense and CSR seconds of one forward on `tokens` tokens, and whether CSR wins here."""
    plan = {}
    for b, block in enumerate(decoder_blocks(model)):
        for name, m in block_linears(block).items():
            x = torch.randn(tokens, m.in_features, dtype=m.weight.dtype, device=m.weight.device)
            sparse = SparseLinear(m)
            t_dense = _bench(lambda m=m, x=x: m(x), repeats)
            t_csr = _bench(lambda s=sparse, x=x: s(x), repeats)
            plan[(b, name)] = {"dense_s": t_dense, "csr_s": t_csr, "use_csr": t_csr < t_dense}
    return plan


def sparse_copy(model: Any, use: Any = True) -> Any:
    """A deep copy of `model` whose block linears selected by ``use`` (True: all; a plan from `csr_plan`: those it
    marks) run as `SparseLinear`."""
    clone = copy.deepcopy(model)
    for b, block in enumerate(decoder_blocks(clone)):
        for name, m in list(block_linears(block).items()):
            chosen = use is True or (isinstance(use, dict) and use.get((b, name), {}).get("use_csr", False))
            if not chosen:
                continue
            parent = block.get_submodule(name.rsplit(".", 1)[0]) if "." in name else block
            setattr(parent, name.rsplit(".", 1)[-1], SparseLinear(m))
    return clone


@torch.no_grad()
def _decode_step(model: Any, ids: torch.Tensor) -> Any:
    """One cached decode step at context ``ids.shape[1]``: the prompt is prefilled once into a KV cache (untimed);
    each call feeds one token against that cache and then crops the cache back, so every timed call does the same
    work as a real decode step (attention over the cached context, GEMVs on the weights)."""
    from lmlab.core.inference.generation import cache_kwargs, crop_cache, new_cache

    cache = new_cache(model)
    with torch.no_grad():
        model(input_ids=ids, logits_to_keep=1, **cache_kwargs(model, cache))
    length = ids.shape[1]
    step_ids = ids[:, -1:]

    def step() -> Any:
        out = model(input_ids=step_ids, logits_to_keep=1, **cache_kwargs(model, cache))
        if not crop_cache(cache, length):
            raise ValueError(f"latency_report: the KV cache of {type(model).__name__} cannot be cropped back")
        return out

    return step


def latency_report(
    models: dict[str, Any], *, prefill_tokens: int = 128, repeats: int = 5, warmup: int = 2, seed: int = 0
) -> dict[str, Any]:
    """Interleaved timings (`compare_timings`) of each model on one cached decode step at a `prefill_tokens`-token
    context ("decode", GEMV-bound: 1 new token against the KV cache) and a `prefill_tokens`-token forward
    ("prefill"); the first model is the baseline of the speedup ratios. Decode tokens/s is ``1 / time``."""
    from lmlab.core.stats.timing import compare_timings

    first = next(iter(models.values()))
    vocab = first.config.get_text_config().vocab_size if hasattr(first.config, "get_text_config") else 100
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1, prefill_tokens), generator=g)
    out: dict[str, Any] = {}
    with torch.no_grad():
        decode_fns = {name: _decode_step(m, ids) for name, m in models.items()}
        out["decode"] = compare_timings(decode_fns, repeats=repeats, warmup=warmup)
        prefill_fns = {
            name: (lambda m=m: m(input_ids=ids, use_cache=False, logits_to_keep=1)) for name, m in models.items()
        }
        out["prefill"] = compare_timings(prefill_fns, repeats=repeats, warmup=warmup)
    return out


__all__ = [
    "SparseLinear",
    "calibration_windows",
    "csr_plan",
    "eval_windows",
    "latency_report",
    "model_sparsity",
    "perplexity_from_nll",
    "record_perplexity",
    "save_pruned",
    "sparse_copy",
    "storage_report",
    "token_stream",
    "window_nll",
]
