"""Supervised fine-tuning of the top k blocks over a cached frozen trunk (the CPU SFT recipe of the alignment area).

`SeqCache` runs the frozen lower blocks (`lmlab.core.training.partial.FrozenTrunk`) once over token sequences (prompt
ids +
response ids), grouping sequences of one length so they share a forward without padding; `sft_top_k` fine-tunes a
trainable copy of the top blocks on any subset of them with `lmlab.core.training.preference.weighted_sft_loss` (uniform
weights, per-token mean NLL of the response), and `sequence_scores` gives summed response log-probs under any top
(the trained copy or ``trunk.reference``, the untouched model). Used by `graphfilter` and `swiftcode`.

Usage:
    >>> trunk = FrozenTrunk(model, k=4)
    >>> cache = SeqCache(trunk, encode_sequences(tok, prompts, responses))
    >>> policy, losses = sft_top_k(trunk, cache, range(len(prompts)), cfg, seed=0)  # cfg: lr, epochs, train_batch
    >>> scores = sequence_scores(policy, cache, range(len(prompts)))
    >>> full = merge_back(copy.deepcopy(model), policy)  # lmlab.core.training.partial: a full HF model for generation
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from lmlab.core.training.partial import response_token_logps, slice_cache

CACHE_CHUNK = 32  # sequences of one length per trunk / top-k forward


def encode_sequences(tokenizer: Any, prompts: Sequence[str], responses: Sequence[str]) -> list[tuple[list[int], int]]:
    """(ids, number of prompt tokens) per (prompt, response) pair, split at the boundary rule of
    `lmlab.core.inference.scoring.split_pair` (``enc(prompt + response)[len(common prefix):]``); prompts are used as
    given
    (apply a chat template or prompt format first).

    Raises:
        `ValueError`: for unequal lengths, or a pair whose prompt or response is empty after tokenisation.
    """
    from lmlab.core.inference.scoring import split_pair

    prompts, responses = list(prompts), list(responses)
    if len(prompts) != len(responses):
        raise ValueError(f"got {len(prompts)} prompts but {len(responses)} responses; expected one response each")
    out = []
    for prompt, resp in zip(prompts, responses):
        ctx_ids, cont = split_pair(tokenizer, prompt, resp)
        if not ctx_ids or not cont:
            raise ValueError(f"the pair ({prompt[-40:]!r}, {resp[:40]!r}) has an empty prompt or response after "
                             "tokenisation")  # fmt: skip
        out.append((ctx_ids + cont, len(ctx_ids)))
    return out


class SeqCache:
    """Trunk caches of token sequences (prompt ids + response ids), grouped by length.

    Args:
        trunk (`lmlab.core.training.partial.FrozenTrunk`): the frozen lower blocks.
        seqs (`list[tuple[list[int], int]]`): (ids, number of prompt tokens) per sequence; its position is its id.
    """

    def __init__(self, trunk: Any, seqs: Sequence[tuple[list[int], int]]) -> None:
        self.where: dict[int, tuple[int, int]] = {}
        self.groups: list[tuple[Any, torch.Tensor]] = []
        by_len: dict[int, list[int]] = defaultdict(list)
        for i, (ids, _) in enumerate(seqs):
            by_len[len(ids)].append(i)
        for length in sorted(by_len):
            members = by_len[length]
            for s in range(0, len(members), CACHE_CHUNK):
                chunk = members[s : s + CACHE_CHUNK]
                ids = torch.tensor([seqs[i][0] for i in chunk], dtype=torch.long)  # (b, length)
                tmask = torch.zeros(
                    len(chunk), length - 1, dtype=torch.bool
                )  # (b, length-1): predicts a response token
                for j, i in enumerate(chunk):
                    tmask[j, seqs[i][1] - 1 :] = True
                    self.where[i] = (len(self.groups), j)
                self.groups.append((trunk(ids), tmask))
        self.n_tokens = {i: len(seqs[i][0]) - seqs[i][1] for i in range(len(seqs))}

    def batches(self, seq_ids: Sequence[int]) -> Iterator[tuple[Any, torch.Tensor, list[int]]]:
        """(cache, target mask, sequence ids) per length group of `seq_ids`."""
        by_group: dict[int, list[int]] = defaultdict(list)
        for i in seq_ids:
            by_group[self.where[i][0]].append(i)
        for g, members in sorted(by_group.items()):
            cache, tmask = self.groups[g]
            rows = torch.tensor([self.where[i][1] for i in members], dtype=torch.long)
            yield slice_cache(cache, rows), tmask.index_select(0, rows), members


def sequence_scores(topk: Any, cache: SeqCache, seq_ids: Sequence[int]) -> dict[int, float]:
    """Summed response log-prob of each sequence under `topk`."""
    out: dict[int, float] = {}
    with torch.no_grad():
        for sub, tm, members in cache.batches(seq_ids):
            sums = response_token_logps(topk, sub, tm).sum(-1)  # (b,)
            out.update({i: float(s) for i, s in zip(members, sums)})
    return out


def sft_top_k(trunk: Any, cache: SeqCache, seq_ids: Sequence[int], cfg: Any, seed: int) -> tuple[Any, list[float]]:
    """Fine-tune a copy of the top blocks on `seq_ids` with `weighted_sft_loss` (uniform weights, per-token mean).

    Args:
        trunk (`FrozenTrunk`): the frozen lower blocks; `trunk.top_k()` gives the trainable copy (model untouched).
        cache (`SeqCache`): the cached sequences; seq_ids (`Sequence[int]`): the ones to train on.
        cfg: any object with ``lr`` (AdamW, no weight decay), ``epochs`` and ``train_batch`` (sequences per step;
            gradient-norm clip 1.0).
        seed (`int`): seeds the per-epoch order.

    Returns:
        `(TopK, list[float])`: the trained top (in eval mode) and the loss of every optimiser step.
    """
    from lmlab.core.training.preference import weighted_sft_loss

    if not len(seq_ids):
        raise ValueError("seq_ids is empty: sft_top_k needs at least one sequence to train on")

    policy = trunk.top_k()
    params = list(policy.trainable_parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    rng = np.random.default_rng(seed)
    ids = list(seq_ids)
    losses = []
    for _ in range(cfg.epochs):
        order = [ids[j] for j in rng.permutation(len(ids))]
        for s in range(0, len(order), cfg.train_batch):
            batch = order[s : s + cfg.train_batch]
            opt.zero_grad(set_to_none=True)
            total = 0.0
            for sub, tm, _ in cache.batches(batch):
                lp = response_token_logps(policy, sub, tm)  # (b, T-1)
                rows = weighted_sft_loss(lp, tm, reduction="none")  # (b,) per-token NLL per example
                loss = rows.sum() / len(batch)
                loss.backward()
                total += float(loss.detach())
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            losses.append(total)
    policy.eval()
    return policy, losses
