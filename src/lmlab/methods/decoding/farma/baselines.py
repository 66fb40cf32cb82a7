"""FaRMA's baselines: ARGS / PARGS (k reward-model calls per token) and Best-of-N, on the scalar-RM interface.

Each uses a reward model with ``rm(...).logits`` of shape (batch, 1), the reward of each row's sequence (`ScalarRM`
in `reward_models.py`):

- ARGS (Khanov et al., 2024): candidates are the LM's top-k tokens; each is scored by a full-sequence reward model on
  prefix + candidate, k RM calls per token, s(a) = l_LM(a) + w * r([s, a]) (`ARGSLogitsProcessor`);
- PARGS (Rashid et al., "A Critical Look at Tokenwise Reward-Guided Text Generation"): the same loop with a reward
  model trained by Bradley-Terry on equal-length *prefix* pairs;
- Best-of-N: N sampled responses, the one with the highest full-sequence reward (`best_of_n`, ranking with
  `score_responses`, which prefills each distinct prompt once; `score_sequences` scores plain token-id sequences).

Pure: no I/O, no printing.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn
from transformers import LogitsProcessor

from lmlab.core.inference.compute import ComputeMeter
from lmlab.core.inference.generation import crop_cache, new_cache
from lmlab.methods.decoding.farma.reward_models import RewardInputs, ScalarRM, VChannelRM
from lmlab.methods.decoding.farma.sampling import (
    Generation,
    _left_pad_mask,
    _positions,
    _RMState,
    _unique_rows,
    generate_batch,
    pad_token_id,
)

# ----------------------------------------------------------------------------------------------------------------
# ARGS / PARGS: k candidates per token, each scored by a full-sequence reward model


class ARGSLogitsProcessor(LogitsProcessor):
    """ARGS / PARGS decoding step: candidates = top-k of l_LM, s(a) = l_LM(a) + w * r([s, a]) (k RM calls per token).

    `rm` is a scalar reward model with the sequence-classification interface: ``forward(input_ids, attention_mask,
    position_ids, cache)`` returns ``logits`` (batch, 1), the reward of each row's sequence at its last fed token
    (`ScalarRM`). ARGS uses one trained on full sequences, PARGS one trained on prefix pairs. The score of a
    candidate is the LM's raw logit plus w times its reward (ARGS's ``rewards * weight + prescreen_logits``); PARGS's
    official code adds log-probabilities instead, which differ by a per-row constant and so give the same top-k and
    the same softmax over it.

    Args:
        rm: the scalar reward model.
        w (`float`, defaults to 1.0), k (`int`, defaults to 10): weight and number of candidates.
        batch_candidates (`bool`, defaults to `True`): score the k candidates of all rows in one RM forward of
            batch x k rows over a copied prefix cache (the official ARGS code); ``False`` runs k forwards of one
            candidate per row each (the official PARGS loop scores candidates one by one).
        candidate_rows (`int`, defaults to 160): most sequences per batched candidate forward (memory bound).
        pad_token_id, use_cache, meter, meter_name: as in `RewardGuidedLogitsProcessor`.
    """

    def __init__(
        self,
        rm: nn.Module,
        w: float = 1.0,
        k: int = 10,
        *,
        batch_candidates: bool = True,
        candidate_rows: int = 160,
        pad_token_id: int | None = None,
        use_cache: bool = True,
        meter: ComputeMeter | None = None,
        meter_name: str | None = None,
    ) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if not math.isfinite(w):
            raise ValueError(f"w must be finite, got {w}")
        self.rm, self.w, self.k, self.pad = rm, float(w), int(k), pad_token_id
        if candidate_rows < 1:
            raise ValueError(f"candidate_rows must be >= 1, got {candidate_rows}")
        self.batch_candidates, self.candidate_rows, self.use_cache = batch_candidates, candidate_rows, use_cache
        self.state = _RMState(rm, pad_token_id, meter, meter_name)
        self.rm_calls = 0
        self.rm_tokens = 0
        self.row_calls = torch.zeros(0, dtype=torch.long)
        self.row_tokens = torch.zeros(0, dtype=torch.long)

    def reset(self) -> None:
        self.state.reset()

    def candidate_rewards(self, input_ids: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """r([s_b, a]) for each row b and candidate a = candidates[b, j], (batch, k)."""
        b, k = candidates.shape
        mask = _left_pad_mask(input_ids, self.pad).to(input_ids.device)
        ones = torch.ones(b, 1, dtype=mask.dtype, device=mask.device)
        ext_mask = torch.cat([mask, ones], -1)  # (B, L+1): prefix + candidate
        if not self.use_cache:  # the whole prefix + candidate for every candidate, as the official ARGS first step
            seqs = torch.cat([input_ids.repeat_interleave(k, 0), candidates.reshape(-1, 1)], -1)  # (B*k, L+1)
            rewards = self.state.forward(seqs, ext_mask.repeat_interleave(k, 0), None)[:, 0].view(b, k)
            self.row_tokens = (ext_mask.sum(-1) * k).cpu().long()
            return rewards
        _, fed = self.state.sync(input_ids, mask, need_output=False)
        cache = self.state.cache
        kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        if self.batch_candidates:
            # one forward of (rows x k) candidates over a copy of the prefix cache, in chunks of at most
            # `candidate_rows` sequences to bound the copied cache's memory
            per = max(1, self.candidate_rows // k)
            parts: list[torch.Tensor] = []
            part_kv: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
            for start in range(0, b, per):
                rows = torch.arange(start, min(start + per, b), device=input_ids.device)
                expanded = copy.deepcopy(cache)
                if len(rows) < b:
                    expanded.batch_select_indices(rows)
                expanded.batch_repeat_interleave(k)
                out = self.state.forward(candidates[rows].reshape(-1, 1), ext_mask[rows].repeat_interleave(k, 0),
                                         expanded)  # fmt: skip
                parts.append(out[:, 0].view(len(rows), k))
                # the candidates' own KV, kept to append the chosen one next step without another forward
                part_kv.append(
                    [
                        (
                            layer.keys[:, :, -1:].unflatten(0, (len(rows), k)),
                            layer.values[:, :, -1:].unflatten(0, (len(rows), k)),
                        )
                        for layer in expanded.layers
                    ]
                )
            rewards = torch.cat(parts)
            for layer in range(len(part_kv[0])):
                kv.append((torch.cat([p[layer][0] for p in part_kv]), torch.cat([p[layer][1] for p in part_kv])))
        else:
            cols, slices = [], []
            held = cache.get_seq_length()
            # feed-then-crop when every layer can roll back; a sliding-window layer gets a private copy instead
            croppable = cache.is_croppable and not any(cache.is_sliding)
            for j in range(k):
                work = cache if croppable else copy.deepcopy(cache)
                cols.append(self.state.forward(candidates[:, j : j + 1], ext_mask, work)[:, 0])
                slices.append(
                    [(layer.keys[:, :, -1:].clone(), layer.values[:, :, -1:].clone()) for layer in work.layers]
                )
                if work is cache and not crop_cache(cache, held):
                    raise RuntimeError("could not crop the reward model's cache back after a candidate")
            rewards = torch.stack(cols, -1)  # (B, k)
            for layer in range(len(slices[0])):
                kv.append(
                    (torch.stack([s[layer][0] for s in slices], 1), torch.stack([s[layer][1] for s in slices], 1))
                )
        self.state.pending = (candidates.clone(), kv)
        self.row_tokens = (fed.cpu() + k).long()
        return rewards

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        k = min(self.k, scores.shape[-1])
        top = torch.topk(scores, k, dim=-1)  # the LM's k candidates per row, (B, k)
        rewards = self.candidate_rewards(input_ids, top.indices).to(scores.device)
        self.row_calls = torch.full((input_ids.shape[0],), k, dtype=torch.long)
        self.rm_calls += input_ids.shape[0] * k
        self.rm_tokens += int(self.row_tokens.sum())
        out = torch.full_like(scores, float("-inf"))
        return out.scatter(-1, top.indices, top.values + self.w * rewards)


# ----------------------------------------------------------------------------------------------------------------
# Full-sequence scoring and Best-of-N


@torch.no_grad()
def score_sequences(
    rm: ScalarRM | VChannelRM,
    sequences: Sequence[Sequence[int]],
    *,
    batch_size: int = 16,
    pad_token_id: int = 0,
    meter: ComputeMeter | None = None,
    meter_name: str | None = None,
) -> torch.Tensor:
    """Full-sequence rewards ``rm.score`` of token-id sequences (right-padded batches), (N,)."""
    out = torch.zeros(len(sequences))
    device = next(rm.body.parameters()).device
    for start in range(0, len(sequences), batch_size):
        rows = list(sequences[start : start + batch_size])
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, r in enumerate(rows):
            ids[j, : len(r)] = torch.tensor(list(r))
            mask[j, : len(r)] = 1
        if meter is not None:
            with meter.track(rm, meter_name):
                out[start : start + len(rows)] = rm.score(ids.to(device), mask.to(device)).cpu()
        else:
            out[start : start + len(rows)] = rm.score(ids.to(device), mask.to(device)).cpu()
    return out


@torch.no_grad()
def score_responses(
    rm: ScalarRM | VChannelRM,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    pad_token_id: int = 0,
    meter: ComputeMeter | None = None,
    meter_name: str | None = None,
) -> torch.Tensor:
    """Full-sequence rewards of prompt + response pairs, each distinct prompt prefilled once, (N,).

    Equals ``rm.score(prompt + response)`` (the scalar head at the last token, or R(y) = f(y_<T)[y_T]); Best-of-N
    scores N samples per prompt, so sharing the prompt's KV saves most of the RM's work.
    """
    if len(prompts) != len(responses):
        raise ValueError(f"got {len(prompts)} prompts for {len(responses)} responses")
    if any(len(r) == 0 for r in responses) or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts and responses must be non-empty")
    device = next(rm.body.parameters()).device
    n, width = len(prompts), max(len(p) for p in prompts)
    p_ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    p_mask = torch.zeros_like(p_ids)
    for i, p in enumerate(prompts):
        p_ids[i, width - len(p) :], p_mask[i, width - len(p) :] = torch.tensor(list(p)), 1
    r_width = max(len(r) for r in responses)
    r_ids = torch.full((n, r_width), pad_token_id, dtype=torch.long)
    r_mask = torch.zeros_like(r_ids)
    for i, r in enumerate(responses):
        r_ids[i, : len(r)], r_mask[i, : len(r)] = torch.tensor(list(r)), 1
    p_ids, p_mask, r_ids, r_mask = p_ids.to(device), p_mask.to(device), r_ids.to(device), r_mask.to(device)
    cache = new_cache(rm.body)

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        dedup = _unique_rows(p_ids, p_mask)
        first, inverse = dedup if dedup is not None else (torch.arange(n), torch.arange(n))
        first, inverse = first.to(device), inverse.to(device)
        h_prompt = rm.hidden_states(p_ids[first], p_mask[first], _positions(p_mask[first]), cache)[inverse]
        cache.batch_select_indices(inverse)
        mask = torch.cat([p_mask, r_mask], -1)  # left-padded prompt, right-padded response
        h_resp = rm.hidden_states(r_ids, mask, _positions(mask)[:, width:], cache)  # (N, R, d)
        return h_prompt[:, -1], h_resp

    if meter is not None:
        with meter.track(rm, meter_name):
            last_prompt, h_resp = run()
    else:
        last_prompt, h_resp = run()
    rows = torch.arange(n, device=device)
    lengths = r_mask.sum(-1)  # (N,)
    last = h_resp[rows, lengths - 1]
    prev = torch.where((lengths >= 2)[:, None], h_resp[rows, (lengths - 2).clamp(min=0)], last_prompt)
    return rm.sequence_reward(RewardInputs(prev, r_ids[rows, lengths - 1], last)).cpu()


def best_of_n(
    model: Any,
    tokenizer: Any,
    rm: ScalarRM | VChannelRM,
    prompts: Sequence[Sequence[int]],
    n: int,
    *,
    max_new_tokens: int = 32,
    top_k: int = 0,
    temperature: float = 1.0,
    seed: int = 0,
    meter: ComputeMeter | None = None,
    meter_name: str | None = None,
    rm_meter_name: str | None = None,
) -> list[Generation]:
    """Best-of-N: N samples per prompt (one batch), each scored by the full-sequence RM; keep the best.

    Costs are charged to the returned row: the LM work of all N samples and N RM calls on full sequences (each
    sample's own prompt + response tokens; the scorer prefills a shared prompt only once).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    repeated = [list(p) for p in prompts for _ in range(n)]
    samples = generate_batch(model, tokenizer, repeated, max_new_tokens=max_new_tokens, do_sample=True,
                             temperature=temperature, top_k=top_k, seed=seed, meter=meter,
                             meter_name=meter_name)  # fmt: skip
    seqs = [s.prompt_ids + s.token_ids for s in samples]
    pad = pad_token_id(model, tokenizer)
    rewards = score_responses(rm, [s.prompt_ids for s in samples], [s.token_ids for s in samples],
                              pad_token_id=pad, meter=meter, meter_name=rm_meter_name)  # fmt: skip
    out = []
    for i in range(len(prompts)):
        group = samples[i * n : (i + 1) * n]
        scores = rewards[i * n : (i + 1) * n]
        best = group[int(scores.argmax())]
        out.append(
            Generation(
                prompt_ids=best.prompt_ids,
                token_ids=best.token_ids,
                text=best.text,
                stop_reason=best.stop_reason,
                lm_calls=sum(s.lm_calls for s in group),
                lm_tokens=sum(s.lm_tokens for s in group),
                rm_calls=n,
                rm_tokens=sum(len(seqs[i * n + j]) for j in range(n)),
                reward=float(scores.max()),
            )
        )
    return out


__all__ = ["ARGSLogitsProcessor", "best_of_n", "score_responses", "score_sequences"]
