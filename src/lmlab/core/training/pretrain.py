"""Minimal training loops that fit a 2-core CPU: from-scratch pretraining of tiny causal LMs.

Several claims are about pretraining (memory layers, mixture-of-experts variants, low-precision training), so they
are reproduced on tiny Llama-style models trained from scratch on lmlab's synthetic corpora. This module holds the
shared loop so that methods and their baselines train identically: the same data order (one seeded window sampler),
the same AdamW + warm-up + cosine schedule, the same evaluation, and the same accounting (tokens, wall time,
tokens/s).

    loss = -(1/T) sum_t log p(x_{t+1} | x_<=t)   over random windows of `seq_len + 1` tokens

Usage:
    >>> ids = encode_documents(tok, docs)                     # (N,) one long token stream
    >>> result = pretrain_lm(model, ids, steps=200, batch_size=16, seq_len=64, lr=3e-3, seed=0,
    ...                      eval_ids=held_out_ids)
    >>> result.final_eval_loss, result.tokens_per_s
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F


def encode_documents(tokenizer: Any, docs: Iterable[str], *, eos: bool = True) -> torch.Tensor:
    """Concatenate the documents' token ids into one (N,) stream, each followed by EOS (if the tokenizer has one)."""
    out: list[int] = []
    eos_id = tokenizer.eos_token_id
    for doc in docs:
        out.extend(tokenizer(doc, add_special_tokens=False)["input_ids"])
        if eos and eos_id is not None:
            out.append(eos_id)
    return torch.tensor(out, dtype=torch.long)


class WindowSampler:
    """Random training windows of ``seq_len + 1`` tokens from a token stream, in a seeded order.

    The same (stream, seq_len, batch_size, seed) gives the same batches, so a method and its baselines see
    identical data in identical order.
    """

    def __init__(self, ids: torch.Tensor, seq_len: int, batch_size: int, seed: int = 0):
        if ids.ndim != 1:
            raise ValueError(f"ids must be a 1-D token stream, got shape {tuple(ids.shape)}")
        if len(ids) < seq_len + 2:
            raise ValueError(f"the token stream ({len(ids)} tokens) is shorter than seq_len + 2 = {seq_len + 2}")
        self.ids, self.seq_len, self.batch_size = ids, seq_len, batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def __next__(self) -> torch.Tensor:
        starts = torch.randint(0, len(self.ids) - self.seq_len - 1, (self.batch_size,), generator=self.generator)
        return torch.stack([self.ids[s : s + self.seq_len + 1] for s in starts.tolist()])  # (batch, seq_len + 1)

    def __iter__(self) -> WindowSampler:
        return self


def lm_loss(model: Any, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of a (batch, seq + 1) window batch (inputs = [:-1], targets = [1:])."""
    logits = model(input_ids=batch[:, :-1]).logits  # (batch, seq, vocab)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


@torch.no_grad()
def eval_lm_loss(model: Any, ids: torch.Tensor, *, seq_len: int, batch_size: int = 16, max_windows: int = 64) -> float:
    """Mean next-token loss over the first `max_windows` non-overlapping windows of a held-out stream."""
    n = min(max_windows, (len(ids) - 1) // seq_len)
    if n < 1:
        raise ValueError(f"the evaluation stream ({len(ids)} tokens) is shorter than one window of {seq_len + 1}")
    was_training = model.training
    model.eval()
    windows = torch.stack([ids[i * seq_len : i * seq_len + seq_len + 1] for i in range(n)])
    total = 0.0
    for start in range(0, n, batch_size):
        batch = windows[start : start + batch_size]
        total += float(lm_loss(model, batch)) * len(batch)
    model.train(was_training)
    return total / n


def cosine_lr(step: int, *, steps: int, warmup: int, min_ratio: float) -> float:
    """Multiplier of the base learning rate: linear warm-up, then cosine decay to `min_ratio`."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


@dataclass
class TrainResult:
    """Loss curves and accounting of one `pretrain_lm` run."""

    losses: list[float]
    eval_steps: list[int] = field(default_factory=list)
    eval_losses: list[float] = field(default_factory=list)
    tokens: int = 0
    wall_s: float = 0.0
    lrs: list[list[float]] = field(default_factory=list)  # learning rate of each parameter group, per step

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def final_eval_loss(self) -> float:
        return self.eval_losses[-1] if self.eval_losses else float("nan")

    def tail_loss(self, fraction: float = 0.1) -> float:
        """Mean of the last `fraction` of the evaluations (or of the training losses without evaluations)."""
        values = self.eval_losses or self.losses
        k = max(1, int(round(len(values) * fraction)))
        return float(sum(values[-k:]) / k)


def pretrain_lm(
    model: Any,
    train_ids: torch.Tensor,
    *,
    steps: int,
    batch_size: int = 16,
    seq_len: int = 64,
    lr: float = 3e-3,
    weight_decay: float = 0.1,
    warmup: int = 20,
    min_lr_ratio: float = 0.1,
    grad_clip: float | None = 1.0,
    betas: tuple[float, float] = (0.9, 0.95),
    seed: int = 0,
    param_groups: Sequence[dict[str, Any]] | None = None,
    eval_ids: torch.Tensor | None = None,
    eval_every: int = 0,
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor] | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> TrainResult:
    """Pretrain `model` in place with AdamW on random windows of `train_ids`.

    Args:
        model: a causal LM (``model(input_ids=...).logits``), trained in place.
        train_ids (`torch.Tensor`): (N,) token stream.
        steps, batch_size, seq_len: the budget (tokens = steps * batch_size * seq_len).
        lr, weight_decay, warmup, min_lr_ratio, grad_clip, betas: AdamW with linear warm-up and cosine decay.
        seed (`int`): seeds the window sampler (the data order); seed the model's init yourself.
        param_groups: optional AdamW parameter groups (dicts with ``params`` and e.g. their own ``lr`` or
            ``fixed_lr=True`` to exempt a group from the schedule, or ``clip_group=NAME`` to clip the gradients of
            the groups sharing NAME apart from the rest, as memory-layer values are); default: all trainable
            parameters, with no weight decay on 1-D tensors (norms, biases).
        eval_ids (`torch.Tensor`, *optional*): held-out stream, evaluated every `eval_every` steps and at the end.
        loss_fn: ``(model, batch) -> loss`` to add auxiliary losses (default `lm_loss`).
        on_step: called with (step, loss) after every step.
    """
    if steps < 1 or batch_size < 1 or seq_len < 1:
        raise ValueError(f"steps, batch_size and seq_len must be >= 1, got {steps}, {batch_size}, {seq_len}")
    if param_groups is None:
        params = [p for p in model.parameters() if p.requires_grad]
        decay = [p for p in params if p.ndim >= 2]
        no_decay = [p for p in params if p.ndim < 2]
        param_groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    groups = [dict(g) for g in param_groups]
    for g in groups:
        g.setdefault("lr", lr)
        g["base_lr"] = g["lr"]
    fixed = [bool(g.pop("fixed_lr", False)) for g in groups]
    clip_keys = [g.pop("clip_group", None) for g in groups]  # groups sharing a key are clipped together
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=betas, weight_decay=weight_decay)
    sampler = WindowSampler(train_ids, seq_len, batch_size, seed)
    loss_fn = loss_fn or lm_loss
    result = TrainResult(losses=[])
    model.train()
    t0 = time.perf_counter()
    for step in range(steps):
        scale = cosine_lr(step, steps=steps, warmup=warmup, min_ratio=min_lr_ratio)
        for g, is_fixed in zip(optimizer.param_groups, fixed):
            g["lr"] = g["base_lr"] if is_fixed else g["base_lr"] * scale
        result.lrs.append([g["lr"] for g in optimizer.param_groups])
        batch = next(sampler)
        loss = loss_fn(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip is not None:
            clip_sets: dict[Any, list[torch.Tensor]] = {}
            for g, key in zip(optimizer.param_groups, clip_keys):
                clip_sets.setdefault(key, []).extend(g["params"])
            for clip_params in clip_sets.values():
                torch.nn.utils.clip_grad_norm_(clip_params, grad_clip)
        optimizer.step()
        result.losses.append(float(loss.detach()))
        result.tokens += batch.shape[0] * (batch.shape[1] - 1)
        if on_step is not None:
            on_step(step, result.losses[-1])
        last = step == steps - 1
        if eval_ids is not None and ((eval_every and (step + 1) % eval_every == 0) or last):
            pause = time.perf_counter()
            result.eval_steps.append(step + 1)
            result.eval_losses.append(eval_lm_loss(model, eval_ids, seq_len=seq_len, batch_size=batch_size))
            t0 += time.perf_counter() - pause  # evaluation is not charged to training throughput
    result.wall_s = time.perf_counter() - t0
    model.eval()
    return result


def count_parameters(model: Any, *, trainable_only: bool = False, exclude_embeddings: bool = False) -> int:
    """Parameter count (shared tensors once), optionally without the input embedding and a tied LM head."""
    seen: dict[int, torch.Tensor] = {}
    for p in model.parameters():
        if trainable_only and not p.requires_grad:
            continue
        seen[p.data_ptr()] = p
    if exclude_embeddings and hasattr(model, "get_input_embeddings"):
        seen.pop(model.get_input_embeddings().weight.data_ptr(), None)
    return sum(p.numel() for p in seen.values())
