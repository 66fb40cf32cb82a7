"""Scoring primitives: token log-probs, continuation log-likelihood, rolling perplexity, choices, chat prompts.

lm-evaluation-harness's three request types map onto `loglikelihood` (``(logprob, is_greedy)`` per context /
continuation pair), `loglikelihood_rolling` (total log-prob of a text, sliding window) and generation (in
`lmlab.core.inference.generation`).

Batches are **left**-padded with an attention mask and explicit position ids (``cumsum(mask) - 1``), so every row's
scored tokens sit at the end and the LM head only runs on the last positions (``logits_to_keep``): the head is 28M
MACs per token for SmolLM2 and 168M for Gemma. All log-probs are computed in float32.

Context/continuation boundary: the pair is tokenized as one text and the boundary is the longest common prefix of
``enc(context + continuation)`` and ``enc(context)``. When BPE merges across the boundary, the merged token belongs to
the continuation (TRL's ``build_tokenized_answer`` does the same), so the continuation's tokens are exactly the ones
a model would produce after that context.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


def encode(tokenizer: Any, text: str, *, add_special_tokens: bool = True) -> list[int]:
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


def split_pair(tokenizer: Any, context: str, continuation: str, *, add_special_tokens: bool = True) -> tuple:
    """Token ids ``(context_ids, continuation_ids)`` with the boundary rule of the module docstring."""
    full = encode(tokenizer, context + continuation, add_special_tokens=add_special_tokens)
    ctx = encode(tokenizer, context, add_special_tokens=add_special_tokens)
    k = 0
    while k < min(len(full), len(ctx)) and full[k] == ctx[k]:
        k += 1
    return full[:k], full[k:]


def _left_pad(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if len(r):
            ids[i, width - len(r) :] = torch.tensor(list(r), dtype=torch.long)
            mask[i, width - len(r) :] = 1
    position_ids = (mask.cumsum(-1) - 1).clamp_min(0)
    return ids.to(device), mask.to(device), position_ids.to(device)


@torch.no_grad()
def continuation_logprobs(
    model: Any,
    contexts: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int]],
    *,
    batch_size: int = 8,
    pad_id: int = 0,
) -> list[tuple[list[float], bool]]:
    """Per-token log-probs of each continuation given its context, from token ids.

    Returns, per pair, ``(logprobs, is_greedy)``: the log-prob of every continuation token (in order) and whether
    each was the argmax. Contexts must be non-empty (the first continuation token needs a predicting position).
    """
    if len(contexts) != len(continuations):
        raise ValueError(f"got {len(contexts)} contexts but {len(continuations)} continuations")
    for i, ctx in enumerate(contexts):
        if len(ctx) == 0:
            raise ValueError(f"context {i} is empty: prepend a BOS token to score a text from its first token")
    device = _device(model)
    order = sorted(range(len(contexts)), key=lambda i: -(len(contexts[i]) + len(continuations[i])))
    out: list[tuple[list[float], bool] | None] = [None] * len(contexts)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        rows = [list(contexts[i]) + list(continuations[i]) for i in idx]
        ids, mask, pos = _left_pad(rows, pad_id, device)
        keep = max(len(continuations[i]) for i in idx) + 1
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=keep).logits
        logprobs = F.log_softmax(logits.float(), dim=-1)  # (batch, keep, vocab)
        for row, i in enumerate(idx):
            c = len(continuations[i])
            if c == 0:
                out[i] = ([], True)
                continue
            # the logit at position keep-1-c-1+j predicts continuation token j
            lp = logprobs[row, keep - 1 - c : keep - 1]  # (c, vocab)
            target = torch.tensor(list(continuations[i]), device=device)
            token_lp = lp.gather(-1, target[:, None]).squeeze(-1)
            greedy = bool((lp.argmax(-1) == target).all())
            out[i] = (token_lp.tolist(), greedy)
    return out  # type: ignore[return-value]


def loglikelihood(
    model: Any,
    tokenizer: Any,
    requests: Sequence[tuple[str, str]],
    *,
    batch_size: int = 8,
) -> list[tuple[float, bool]]:
    """lm-eval's ``loglikelihood``: ``(sum log p(continuation | context), is_greedy)`` per (context, continuation)."""
    pairs = [split_pair(tokenizer, c, x) for c, x in requests]
    scored = continuation_logprobs(
        model, [p[0] for p in pairs], [p[1] for p in pairs], batch_size=batch_size, pad_id=_pad_id(tokenizer)
    )
    return [(float(sum(lp)), greedy) for lp, greedy in scored]


def _pad_id(tokenizer: Any) -> int:
    pid = tokenizer.pad_token_id
    return int(pid if pid is not None else (tokenizer.eos_token_id or 0))


@dataclass(frozen=True)
class SequenceLogprob:
    """Log-probs of a response given a prompt: ``total``, ``mean`` per token and the per-token vector."""

    total: float
    mean: float
    per_token: tuple[float, ...]
    n_tokens: int


def sequence_logprob(model: Any, tokenizer: Any, prompt: str, response: str) -> SequenceLogprob:
    """Log-probs of `response` after `prompt` (strings; the boundary rule of the module docstring)."""
    ctx, cont = split_pair(tokenizer, prompt, response)
    ((lp, _),) = continuation_logprobs(model, [ctx], [cont], pad_id=_pad_id(tokenizer))
    n = len(lp)
    return SequenceLogprob(float(sum(lp)), float(sum(lp) / n) if n else 0.0, tuple(lp), n)


@torch.no_grad()
def token_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """log p(x_t | x_<t) for t = 1..T-1 of each row: shape (batch, seq-1), float32. Masked positions give 0.

    A row's first real token has no context (with left padding it would be predicted from a pad position): 0 too.
    """
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    pos = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos).logits
    lp = F.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return lp * (attention_mask[:, 1:] * attention_mask[:, :-1]).to(lp.dtype)


def loglikelihood_rolling(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    max_length: int | None = None,
    stride: int | None = None,
    batch_size: int = 4,
) -> list[float]:
    """lm-eval's ``loglikelihood_rolling``: total log-prob of each text, every token scored once.

    The text is prefixed with BOS (or EOS where there is no BOS) so that its first token is scored too. Texts longer
    than `max_length` (default: the model's context, capped at 2048) are scored in windows: each window predicts
    `stride` new tokens (default max_length // 2) with the preceding tokens as context.
    """
    return [float(sum(v)) for v in rolling_token_logprobs(model, tokenizer, texts, max_length, stride, batch_size)]


def rolling_token_logprobs(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    max_length: int | None = None,
    stride: int | None = None,
    batch_size: int = 4,
) -> list[list[float]]:
    """Per-token log-probs (nats) of each whole text, with the windowing of `loglikelihood_rolling`."""
    ctx_max = getattr(model.config, "max_position_embeddings", 2048) or 2048
    max_length = int(max_length or min(ctx_max, 2048))
    stride = int(stride or max(1, max_length // 2))
    if not 1 <= stride <= max_length - 1:
        raise ValueError(f"stride must be in [1, max_length-1] = [1, {max_length - 1}], got {stride}")
    start_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    contexts: list[list[int]] = []
    conts: list[list[int]] = []
    owner: list[int] = []
    for t, text in enumerate(texts):
        ids = [start_id] + encode(tokenizer, text, add_special_tokens=False)
        # window k predicts tokens [1 + k*stride, 1 + (k+1)*stride) (the first window predicts up to max_length-1)
        pos = 1
        while pos < len(ids):
            n_pred = (max_length - 1) if pos == 1 else stride
            end = min(len(ids), pos + n_pred)
            ctx_start = max(0, end - max_length)
            contexts.append(ids[ctx_start:pos])
            conts.append(ids[pos:end])
            owner.append(t)
            pos = end
    scored = continuation_logprobs(model, contexts, conts, batch_size=batch_size, pad_id=_pad_id(tokenizer))
    out: list[list[float]] = [[] for _ in texts]
    for t, (lp, _) in zip(owner, scored):
        out[t].extend(lp)
    return out


def perplexity(model: Any, tokenizer: Any, texts: Sequence[str], **kwargs: Any) -> float:
    """exp(mean negative log-likelihood per token) over all tokens of all `texts`."""
    per = rolling_token_logprobs(model, tokenizer, texts, **kwargs)
    n = sum(len(v) for v in per)
    if n == 0:
        raise ValueError("perplexity of empty texts is undefined")
    return math.exp(-sum(sum(v) for v in per) / n)


def choice_logprobs(
    model: Any, tokenizer: Any, context: str, choices: Sequence[str], *, normalize: bool = False
) -> list[float]:
    """log p(choice | context) for each choice (mean per token if `normalize`)."""
    scored = continuation_logprobs(
        model,
        *zip(*[split_pair(tokenizer, context, c) for c in choices]),
        pad_id=_pad_id(tokenizer),
    )
    return [(sum(lp) / max(1, len(lp))) if normalize else float(sum(lp)) for lp, _ in scored]


def choice_accuracy(
    model: Any,
    tokenizer: Any,
    items: Sequence[tuple[str, Sequence[str], int]],
    *,
    normalize: bool = False,
) -> list[int]:
    """1/0 per item ``(context, choices, gold_index)``: is the gold choice the most likely one?"""
    out = []
    for context, choices, gold in items:
        scores = choice_logprobs(model, tokenizer, context, choices, normalize=normalize)
        out.append(int(max(range(len(scores)), key=scores.__getitem__) == gold))
    return out


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def chat_prompt(
    tokenizer: Any,
    user: str,
    *,
    system: str | None = None,
    history: Sequence[dict[str, str]] = (),
) -> str:
    """The text that asks an instruct model to answer `user`: its chat template with the generation prompt.

    Without a chat template (base models such as Gemma-3-270M), falls back to ``"Question: ...\\nAnswer:"``.
    """
    if not has_chat_template(tokenizer):
        head = f"{system}\n\n" if system else ""
        turns = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in history)
        return f"{head}{turns}Question: {user}\nAnswer:"
    messages: list[dict[str, str]] = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.extend(history)
    messages.append({"role": "user", "content": user})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a prompt with the tokenizer's special tokens, without doubling a BOS that a chat template wrote."""
    ids = encode(tokenizer, text)
    bos = tokenizer.bos_token_id
    if bos is not None and len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
        ids = ids[1:]
    return ids
