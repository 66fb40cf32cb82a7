"""Preference pairs on a frozen trunk: templating, one trunk pass per pair set, response log-probs of the top blocks.

The CPU training recipe of the alignment area (`lmlab.core.training.partial`) runs the lower blocks once per sequence
and
trains only the top k. Methods that train on (prompt, chosen, rejected) pairs share the pieces here:

- `chat_texts` / `format_pairs`: plain texts ready for `lmlab.core.training.preference.build_pair_batch(...,
chat=False)`:
  the chat template with an explicit system turn (and no doubled BOS), or a template-free ``Question/Answer`` form;
- `encode_pairs` -> `PairCache`: the pairs tokenised with TRL's boundary rule (`lmlab.core.training.preference`),
left-padded,
  rows ``[chosen_0..chosen_{n-1}, rejected_0..rejected_{n-1}]``, run once through a `FrozenTrunk`;
- `slice_cache` (from `lmlab.core.training.partial`, re-exported): the `TrunkCache` of a subset of rows (minibatches);
- `response_logps`: `SeqLogps` of cached rows under a `TopK` (`lmlab.core.training.partial.response_token_logps`, the
LM head
  on response positions only, then `lmlab.core.training.preference.logps_from_token_logps`);
- `score_pairs` -> `PairScores`: summed / mean log-probs of every cached pair under a policy or the reference;

Pure: tensors and arrays in, values out; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lmlab.core.inference.scoring import has_chat_template
from lmlab.core.training.partial import (  # noqa: F401 (re-exported: policy_model, slice_cache)
    FrozenTrunk,
    TopK,
    TrunkCache,
    policy_model,
    response_token_logps,
    slice_cache,
)
from lmlab.core.training.preference import SeqLogps, build_pair_batch, logps_from_token_logps

__all__ = [
    "PairCache",
    "PairScores",
    "chat_texts",
    "encode_pairs",
    "format_pairs",
    "response_logps",
    "score_pairs",
    "slice_cache",
]


# ------------------------------------------------------------------------------------------------- templating


def _chat(tokenizer: Any, chat: bool | None) -> bool:
    return has_chat_template(tokenizer) if chat is None else bool(chat)


def chat_texts(tokenizer: Any, prompt: str, response: str, *, system: str | None = "") -> tuple[str, str]:
    """``(templated prompt, response + end-of-turn)`` of one turn, with the generation prompt in the prompt part.

    ``system=""`` inserts an empty system turn, as the alignment-handbook's ``maybe_insert_system_message`` does in
    SimPO's training and in M_AP's ``infer_scripts/infer_dataset.py`` (``auto_insert_empty_system_msg``); None keeps
    the template's own default (SmolLM2's writes a 17-token system prompt). A BOS that the tokenizer adds itself is
    cut from the text so that it is not written twice.
    """
    head_msgs = ([] if system is None else [{"role": "system", "content": system}]) + [
        {"role": "user", "content": prompt}
    ]
    head = tokenizer.apply_chat_template(head_msgs, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template([*head_msgs, {"role": "assistant", "content": response}], tokenize=False)
    if not full.startswith(head):
        raise ValueError("the chat template's [user, assistant] text does not start with its [user] + generation text")
    bos = getattr(tokenizer, "bos_token", None)
    adds = tokenizer("x")["input_ids"] != tokenizer("x", add_special_tokens=False)["input_ids"]
    if adds and bos and head.startswith(bos):  # the tokenizer adds its BOS itself: do not write it twice
        head, full = head[len(bos) :], full[len(bos) :]
    return head, full[len(head) :]


def format_pairs(
    tokenizer: Any,
    prompts: Sequence[str],
    chosen: Sequence[str],
    rejected: Sequence[str],
    *,
    chat: bool | None = None,
    system: str | None = "",
) -> tuple[list[str], list[str], list[str]]:
    """Plain texts ``(prompts, chosen, rejected)`` ready for ``build_pair_batch(..., chat=False)``: chat-templated
    (`chat_texts`) when the tokenizer has a template (or `chat`), else ``"Question: ...\\nAnswer:"`` + " response"."""
    ps, cs, rs = list(prompts), list(chosen), list(rejected)
    if not len(ps) == len(cs) == len(rs):
        raise ValueError(f"got {len(ps)} prompts, {len(cs)} chosen and {len(rs)} rejected responses")
    if not _chat(tokenizer, chat):
        heads = [
            f"Question: {p}\nAnswer:" for p in ps
        ]  # lmlab.core.inference.scoring.chat_prompt's template-free format
        return heads, [" " + c for c in cs], [" " + r for r in rs]
    heads, out_c, out_r = [], [], []
    for p, c, r in zip(ps, cs, rs):
        head, tail_c = chat_texts(tokenizer, p, c, system=system)
        _, tail_r = chat_texts(tokenizer, p, r, system=system)
        heads.append(head)
        out_c.append(tail_c)
        out_r.append(tail_r)
    return heads, out_c, out_r


# ------------------------------------------------------------------------------------------ the cached pairs


@dataclass
class PairCache:
    """Preference pairs run once through a frozen trunk: rows ``[chosen_0..chosen_{n-1}, rejected_0..]``.

    Attributes:
        cache (`TrunkCache`): the trunk's output, (2n, T, hidden), left-padded (responses end every row).
        response_mask (`torch.BoolTensor`, (2n, T)): True on response tokens.
        n_pairs (`int`).
    """

    cache: TrunkCache
    response_mask: torch.Tensor
    n_pairs: int

    def rows(self, pair_idx: Any) -> torch.Tensor:
        """Row indices ``[chosen rows; rejected rows]`` of pairs `pair_idx`, shape (2b,)."""
        idx = torch.as_tensor(np.asarray(pair_idx), dtype=torch.long).reshape(-1)
        return torch.cat([idx, idx + self.n_pairs])


def encode_pairs(
    trunk: FrozenTrunk,
    tokenizer: Any,
    prompts: Sequence[str],
    chosen: Sequence[str],
    rejected: Sequence[str],
    *,
    chat: bool | None = None,
    system: str | None = "",
) -> PairCache:
    """Template pairs (`format_pairs`), tokenise them (TRL's boundary rule, `lmlab.core.training.preference`) and run
    the
    frozen trunk over them once."""
    if not len(prompts):
        raise ValueError("no preference pairs to encode: prompts is empty")
    ps, cs, rs = format_pairs(tokenizer, prompts, chosen, rejected, chat=chat, system=system)
    batch = build_pair_batch(tokenizer, ps, cs, rs, chat=False, padding_side="left")  # (2n, T)
    cache = trunk(batch.input_ids, batch.attention_mask, batch.position_ids)
    return PairCache(cache, batch.response_mask, len(ps))


def response_logps(topk: TopK, cache: TrunkCache, response_mask: torch.Tensor) -> SeqLogps:
    """`SeqLogps` of the response tokens of a cached batch under `topk` (`response_token_logps`: the LM head only
    where it predicts a response token). Gradients flow through a trainable `topk`; equals
    `lmlab.core.training.preference.seq_logprobs` of the full model (tested).

    Args:
        response_mask (`torch.BoolTensor`, (b, T)): True on response tokens (`ResponseBatch.response_mask`).
    """
    b, t = cache.input_ids.shape
    if response_mask.shape != (b, t):
        raise ValueError(f"response_mask has shape {tuple(response_mask.shape)}, expected {(b, t)}")
    target = response_mask[:, 1:].bool()  # (b, T-1): position j predicts response token j+1
    if not bool(target.any(-1).all()):
        raise ValueError("every row needs at least one response token after a context token")
    full = response_token_logps(topk, cache, target)  # (b, T-1), 0 off the response
    return logps_from_token_logps(full, target)


@dataclass
class PairScores:
    """Summed and mean response log-probs of cached pairs (float64 numpy, shape (n,) each) and token counts."""

    chosen_sum: np.ndarray
    rejected_sum: np.ndarray
    chosen_mean: np.ndarray
    rejected_mean: np.ndarray
    chosen_len: np.ndarray
    rejected_len: np.ndarray


@torch.no_grad()
def score_pairs(topk: TopK, pairs: PairCache, *, batch_size: int = 16) -> PairScores:
    """`PairScores` of every pair under `topk` (a trained policy or ``trunk.reference``), `batch_size` rows a pass."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    was_training = topk.training
    topk.eval()
    sums, means, lens = [], [], []
    n_rows = 2 * pairs.n_pairs
    for s in range(0, n_rows, batch_size):
        rows = torch.arange(s, min(n_rows, s + batch_size))
        out = response_logps(topk, slice_cache(pairs.cache, rows), pairs.response_mask.index_select(0, rows))
        sums.append(out.sum.double())  # (rows,)
        means.append(out.mean.double())
        lens.append(out.n_tokens)
    topk.train(was_training)
    s_, m_, n_ = torch.cat(sums).numpy(), torch.cat(means).numpy(), torch.cat(lens).numpy()  # (2n,)
    h = pairs.n_pairs
    return PairScores(s_[:h], s_[h:], m_[:h], m_[h:], n_[:h], n_[h:])


# ----------------------------------------------------------------------------------------- decoding a policy
