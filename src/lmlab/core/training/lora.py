"""Cached-trunk LoRA fine-tuning pieces shared by the adaptation area (``nonzero_lora``, ``model_swarms``).

Moved here from ``nonzero_lora`` (behaviour unchanged) once ``model_swarms`` needed them too:

* `PaddedCache`: the frozen trunk's output (`lmlab.core.training.partial.FrozenTrunk`) for a list of (prompt, answer)
  sequences, right-padded to one length and run once; a training batch is then one forward of the top blocks.
* `answer_scores`: per-sequence answer NLL (summed over the answer's tokens) and greedy exact match under a `TopK`.
* `index_batches`: seeded epochs of permutations cut into batches of train indices.
* `train_steps`: one optimiser step per batch at a constant learning rate (AdamW without weight decay by default).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch


def index_batches(n_train: int, steps: int, batch: int, seed: int) -> list[list[int]]:
    """`steps` batches of train indices: seeded epochs of permutations, cut into batches of `batch`."""
    rng = np.random.default_rng(seed)
    order: list[int] = []
    while len(order) < steps * batch:
        order += rng.permutation(n_train).tolist()
    return [order[i * batch : (i + 1) * batch] for i in range(steps)]


class PaddedCache:
    """The frozen trunk's output for every (prompt, answer) sequence, right-padded to one length and run once.

    One padded batch instead of `lmlab.core.training.sft.SeqCache`'s per-length groups: a training batch of random
    items is
    then one forward of the top blocks (SeqCache would split it into ~6 groups of one or two sequences, and small
    matmuls are slow on CPU). Right padding: pad positions come after every real token, so no attention row is
    fully masked; ``tmask`` (N, T-1) marks the positions that predict an answer token.
    """

    def __init__(self, trunk: Any, seqs: list[tuple[list[int], int]], pad_id: int) -> None:
        if not seqs:
            raise ValueError("PaddedCache needs at least one sequence")
        width = max(len(ids) for ids, _ in seqs)
        n = len(seqs)
        ids = torch.full((n, width), pad_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        self.tmask = torch.zeros((n, width - 1), dtype=torch.bool)  # (N, T-1)
        for i, (row, n_prompt) in enumerate(seqs):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
            self.tmask[i, n_prompt - 1 : len(row) - 1] = True
        self.n = n
        self.cache = trunk(ids, attention_mask=mask)

    def batch(self, rows: list[int]) -> tuple[Any, torch.Tensor]:
        """(TrunkCache of `rows`, their target mask)."""
        from lmlab.core.training.partial import slice_cache

        idx = torch.tensor(rows, dtype=torch.long)
        return slice_cache(self.cache, idx), self.tmask.index_select(0, idx)


def answer_scores(topk: Any, cache: PaddedCache, chunk: int = 32) -> tuple[list[float], list[float]]:
    """Per sequence: the answer NLL (summed over its tokens) and greedy exact match (1.0 when the argmax is the
    gold token at every answer position) under `topk`."""
    nll: list[float] = []
    em: list[float] = []
    with torch.no_grad():
        for s in range(0, cache.n, chunk):
            sub, tm = cache.batch(list(range(s, min(cache.n, s + chunk))))
            h = topk.hidden_states(sub)[:, :-1]  # (b, T-1, hidden)
            tgt = sub.input_ids[:, 1:][tm]  # (N,)
            logp = torch.log_softmax(topk.head_logits(h[tm]).float(), dim=-1)  # (N, vocab)
            lp = logp.gather(-1, tgt[:, None]).squeeze(-1)  # (N,)
            hit = (logp.argmax(-1) == tgt).float()
            row = torch.arange(tm.shape[0])[:, None].expand_as(tm)[tm]  # (N,) the row of each answer token
            sums = torch.zeros(tm.shape[0]).index_add_(0, row, lp)
            hits = torch.zeros(tm.shape[0]).index_add_(0, row, hit)
            nll += (-sums).tolist()
            em += (hits == tm.sum(-1)).float().tolist()
    return nll, em


def adamw(model: Any, lr: float) -> torch.optim.Optimizer:
    """AdamW without weight decay over the trainable parameters of `model`."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters; expected a peft LoRA model")
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)


def train_steps(
    model: Any,
    loss_fn: Any,
    batches: Any,
    lr: float,
    *,
    max_grad_norm: float | None = 1.0,
    optimizer_fn: Any = None,
) -> list[float]:
    """Train `model` one optimiser step per batch at a **constant** `lr` (a warm-up would hide the small-lr effect).

    Args:
        loss_fn: ``loss_fn(model, batch) -> scalar tensor``.
        batches: an iterable of batches (whatever `loss_fn` takes).
        optimizer_fn: ``optimizer_fn(model, lr) -> torch.optim.Optimizer``; default AdamW without weight decay over
            the trainable parameters (e.g. pass peft's ``create_loraplus_optimizer`` for LoRA+).

    Returns:
        `list[float]`: the loss of every step.
    """
    if not (isinstance(lr, int | float) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    opt = (optimizer_fn or adamw)(model, lr)
    params = [p for g in opt.param_groups for p in g["params"]]
    model.train()
    losses = []
    for batch in batches:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model, batch)
        loss.backward()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


__all__ = ["PaddedCache", "adamw", "answer_scores", "index_batches", "train_steps"]
