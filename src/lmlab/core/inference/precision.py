"""A bf16 compute path for prefill, scoring and training, chosen once per run (``compute_dtype`` in the config).

`compute(dtype)` is one context manager the runner enters around a method's run (``--set compute_dtype=bfloat16``),
instead of a ``compute_dtype`` argument threaded through every scoring and training call site. The core loops take
their losses and log-softmaxes from ``logits.float()`` (scoring, training, partial, sft, preference), so under CPU
autocast those reductions stay fp32 with no edits, and every code path a method runs (its own forward passes
included) gets the same precision.

- ``float32`` (the default): a no-op (bit-exact with no context; inside an outer bf16 context it switches autocast
  off).
- ``bfloat16``: ``torch.autocast(device_type, dtype=torch.bfloat16, cache_enabled=False)``. Matmuls / linears run in
  bf16 on bf16 casts of the weights; parameters (fp32 master weights), gradients and optimizer state stay fp32. The
  weight-cast cache is OFF because one context spans many optimizer steps: with it on, autocast would keep serving
  the bf16 copy cast before an in-place ``optimizer.step()`` (stale weights; tests/core/test_precision.py checks
  that a step inside one context is seen by the next forward).

The context covers everything the method runs, decode included: whether bf16 is faster for a given shape on a given
machine is measured by ``lmlab bench suite`` (its ``core.matmul`` and ``core.prefill_bf16`` rows), not assumed here.
`check_cost` measures what bf16 costs in accuracy on the same windows: KL(fp32 || bf16), top-1 agreement,
perplexities.

Usage:
    >>> with precision.compute("bfloat16"):
    ...     result = pretrain_lm(model, ids, steps=100)          # fp32 params + AdamW state, bf16 matmuls
    >>> precision.check_cost(model, ids, seq_len=128)            # KL(fp32 || bf16), top-1 agreement, perplexities
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import torch
import torch.nn.functional as F

COMPUTE_DTYPES = ("float32", "bfloat16")
_CURRENT: ContextVar[str] = ContextVar("lmlab_compute_dtype", default="float32")


def check_compute_dtype(dtype: Any) -> str:
    """Return `dtype` as one of `COMPUTE_DTYPES` (``torch.float32`` / ``torch.bfloat16`` accepted) or raise."""
    if isinstance(dtype, torch.dtype):
        dtype = {torch.float32: "float32", torch.bfloat16: "bfloat16"}.get(dtype, str(dtype))
    if dtype not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype must be one of {', '.join(COMPUTE_DTYPES)}, got {dtype!r}")
    return str(dtype)


def current() -> str:
    """The compute dtype of the innermost `compute` context (``"float32"`` outside any)."""
    return _CURRENT.get()


@contextlib.contextmanager
def compute(dtype: Any = "float32", *, device_type: str = "cpu") -> Iterator[str]:
    """Run the enclosed forward / backward passes in `dtype` compute (see the module docstring); yields its name.

    Args:
        dtype (`str`, *optional*, defaults to `"float32"`): ``float32`` or ``bfloat16``.
        device_type (`str`, *optional*, defaults to `"cpu"`): the autocast device (``"cuda"`` for a GPU model).
    """
    name = check_compute_dtype(dtype)
    token = _CURRENT.set(name)
    try:
        if name == "bfloat16":
            with torch.autocast(device_type, dtype=torch.bfloat16, cache_enabled=False):
                yield name
        elif torch.is_autocast_enabled(device_type):
            with torch.autocast(device_type, enabled=False):
                yield name
        else:
            yield name
    finally:
        _CURRENT.reset(token)


def _windows(ids: torch.Tensor, seq_len: int, n_windows: int) -> torch.Tensor:
    ids = ids.reshape(-1).long()
    n = min(n_windows, len(ids) // seq_len)
    if seq_len < 2 or n < 1:
        raise ValueError(f"need at least one window of seq_len={seq_len} >= 2 tokens, the stream has {len(ids)}")
    return torch.stack([ids[i * seq_len : (i + 1) * seq_len] for i in range(n)])  # (n, seq_len)


@torch.no_grad()
def check_cost(
    model: Any, ids: torch.Tensor, *, seq_len: int = 128, n_windows: int = 16, batch_size: int = 4
) -> dict[str, Any]:
    """The cost of bf16 compute on held-out text: next-token distributions of fp32 vs bf16 on the same windows.

    KL(fp32 || bf16) = sum_v p32(v) (log p32(v) - log p16(v)), averaged over every predicting position.

    Args:
        model: a causal LM with fp32 weights (bf16 weights would make the "fp32" side bf16 too).
        ids (`torch.Tensor`): a token stream (any shape, flattened); e.g.
            `lmlab.core.training.pretrain.encode_documents` of held-out documents.
        seq_len, n_windows, batch_size: non-overlapping windows of `seq_len` tokens, the first `n_windows` of them.

    Returns:
        dict with ``kl_mean``, ``kl_max`` (nats / token), ``top1_agreement``, ``ppl_fp32``, ``ppl_bf16``,
        ``max_abs_logit_diff``, ``n_tokens`` (predicted positions), ``n_windows``, ``seq_len``, ``weight_dtype``.
    """
    windows = _windows(ids, seq_len, n_windows).to(next(model.parameters()).device)
    was_training = model.training
    model.eval()
    kl_sum = kl_max = agree = nll32 = nll16 = diff = 0.0
    n_tok = 0
    try:
        for start in range(0, len(windows), batch_size):
            batch = windows[start : start + batch_size]  # (b, T)
            logits = {}
            for dtype in COMPUTE_DTYPES:
                with compute(dtype):
                    logits[dtype] = model(input_ids=batch).logits[:, :-1].float()  # (b, T-1, vocab)
            lp32 = F.log_softmax(logits["float32"], dim=-1)
            lp16 = F.log_softmax(logits["bfloat16"], dim=-1)
            kl = (lp32.exp() * (lp32 - lp16)).sum(-1)  # (b, T-1)
            tgt = batch[:, 1:, None]
            kl_sum += float(kl.sum())
            kl_max = max(kl_max, float(kl.max()))
            agree += float((lp32.argmax(-1) == lp16.argmax(-1)).sum())
            nll32 -= float(lp32.gather(-1, tgt).sum())
            nll16 -= float(lp16.gather(-1, tgt).sum())
            diff = max(diff, float((logits["float32"] - logits["bfloat16"]).abs().max()))
            n_tok += kl.numel()
    finally:
        model.train(was_training)
    return {
        "kl_mean": kl_sum / n_tok,
        "kl_max": kl_max,
        "top1_agreement": agree / n_tok,
        "ppl_fp32": math.exp(nll32 / n_tok),
        "ppl_bf16": math.exp(nll16 / n_tok),
        "max_abs_logit_diff": diff,
        "n_tokens": n_tok,
        "n_windows": len(windows),
        "seq_len": seq_len,
        "weight_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
    }
