"""Batched sampling with HF-style logits processors, and the reward model's prefix KV cache the processors share.

- `generate_batch`: a left-padded batch sampled with a KV cache; each step one LM forward on the active rows, the
  logits processors (FaRMA's `RewardGuidedLogitsProcessor` in `method.py`, ARGS / PARGS's `ARGSLogitsProcessor` in
  `baselines.py`), then a sample; finished rows leave the batch. It returns one `Generation` per row with what the
  row cost (LM and RM calls and tokens); `pad_token_id` is the one padding rule shared with the processors.
- `_RMState`: the reward model's KV cache over each row's committed prefix, reused across decoding steps (rows are
  matched by content, so it survives rows being dropped or reordered); both processors keep one.

Pure: no I/O, no printing.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from lmlab.core.inference.compute import ComputeMeter
from lmlab.core.inference.generation import _eos_ids, cache_kwargs, filter_logits, new_cache
from lmlab.methods.decoding.farma.reward_models import _decoder_of

# ----------------------------------------------------------------------------------------------------------------
# The reward model's KV cache, shared by the reward-guided logits processors


def _left_pad_mask(input_ids: torch.Tensor, pad_token_id: int | None) -> torch.Tensor:
    """1 except on leading pad tokens (left padding); all ones without a pad id. (batch, seq) long."""
    if pad_token_id is None:
        return torch.ones_like(input_ids)
    return ((input_ids != pad_token_id).long().cumsum(-1) > 0).long()


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


def _unique_rows(*tensors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(first index of each distinct row, inverse map) over the concatenated rows; None when all rows differ."""
    rows = torch.cat(tensors, -1).tolist()
    seen: dict[tuple[int, ...], int] = {}
    inverse = [seen.setdefault(tuple(r), len(seen)) for r in rows]
    if len(seen) == len(rows):
        return None
    first = [0] * len(seen)
    for i in reversed(range(len(rows))):
        first[inverse[i]] = i
    return torch.tensor(first, dtype=torch.long), torch.tensor(inverse, dtype=torch.long)


def _accepts(module: Any, name: str) -> bool:
    try:
        return name in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False


class _RMState:
    """The reward model's KV cache over each row's committed prefix, reused across calls.

    Rows are matched by content (a new row extends an old row's ids), so the state survives rows being dropped or
    reordered between calls (finished rows removed by `generate_batch`, beams reordered by `model.generate`): the KV
    of a prefix depends only on its ids. ``pending`` holds, for ARGS, the KV of each row's candidate tokens so the
    chosen candidate is appended without another forward. Anything unexpected falls back to a fresh prefill.
    """

    def __init__(self, rm: nn.Module, pad_token_id: int | None, meter: ComputeMeter | None, name: str | None):
        self.rm, self.pad, self.meter, self.name = rm, pad_token_id, meter, name
        self.ids: torch.Tensor | None = None  # (B, L): what `cache` holds
        self.cache: Any = None
        self.last_logits: torch.Tensor | None = None  # (B, out): the RM output at the last cached position
        self.pending: tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]] | None = None

    def reset(self) -> None:
        self.ids = self.cache = self.last_logits = self.pending = None

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor, cache: Any, keep_last: bool = True) -> Any:
        """One RM forward on `input_ids` (the new tokens) with the full mask; counts it on the meter."""
        kwargs: dict[str, Any] = {"attention_mask": mask, "position_ids": _positions(mask)[:, -input_ids.shape[1] :]}
        if cache is not None:
            kwargs.update(cache_kwargs(self.rm, cache))
        else:
            kwargs["use_cache"] = False
        if keep_last and _accepts(self.rm, "logits_to_keep"):
            kwargs["logits_to_keep"] = 1
        if self.meter is not None:
            with self.meter.track(self.rm, self.name):
                out = self.rm(input_ids=input_ids, **kwargs)
        else:
            out = self.rm(input_ids=input_ids, **kwargs)
        logits = out.logits  # (B, t, V) for a causal LM, (B, 1) for a sequence classifier
        return (logits[:, -1] if logits.dim() == 3 else logits).float()  # (B, V) or (B, 1)

    def _match(self, input_ids: torch.Tensor) -> torch.Tensor | None:
        """For each new row, the old row whose ids it extends; None if some row has no match."""
        if self.ids is None or input_ids.shape[1] < self.ids.shape[1]:
            return None
        old = {tuple(r): i for i, r in enumerate(self.ids.tolist())}
        prefix = input_ids[:, : self.ids.shape[1]].tolist()
        idx = [old.get(tuple(r)) for r in prefix]
        if any(i is None for i in idx):
            return None
        return torch.tensor(idx, dtype=torch.long)

    def sync(
        self, input_ids: torch.Tensor, mask: torch.Tensor, *, need_output: bool = True
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Make the cache hold all of `input_ids`; return the RM output at its last position and tokens fed per row."""
        idx = self._match(input_ids)
        if idx is None:  # first call, or rows we cannot place: prefill everything
            self.cache = new_cache(self.rm.body if hasattr(self.rm, "body") else self.rm)
            self.pending = None
            dedup = _unique_rows(input_ids, mask)
            if dedup is None:
                self.last_logits = self.forward(input_ids, mask, self.cache)
            else:  # rows sharing a prompt (several seeds or samples) are prefilled once, then copied
                first, inverse = (t.to(input_ids.device) for t in dedup)
                self.last_logits = self.forward(input_ids[first], mask[first], self.cache)[inverse]
                self.cache.batch_select_indices(inverse)
            self.ids = input_ids.clone()
            return self.last_logits, mask.sum(-1)
        if not torch.equal(idx, torch.arange(self.ids.shape[0])):
            self.cache.batch_select_indices(idx.to(input_ids.device))
            self.last_logits = self.last_logits[idx] if self.last_logits is not None else None
            if self.pending is not None:
                cands, kv = self.pending
                self.pending = (cands[idx], [(k[idx], v[idx]) for k, v in kv])
        held = self.ids.shape[1]
        fed = torch.zeros(input_ids.shape[0], dtype=torch.long, device=input_ids.device)
        if self.pending is not None and input_ids.shape[1] > held:
            cands, kv = self.pending
            hit = cands == input_ids[:, held : held + 1]  # (B, k): which candidate each row took
            if bool(hit.any(-1).all()):
                c = hit.float().argmax(-1)  # (B,)
                rows = torch.arange(input_ids.shape[0], device=input_ids.device)
                for layer, (k, v) in enumerate(kv):
                    self.cache.update(k[rows, c], v[rows, c], layer)  # (B, H, 1, D) appended, no forward
                held += 1
                self.last_logits = None  # the candidate's reward is not an output anyone needs again
        self.pending = None
        if input_ids.shape[1] > held:
            self.last_logits = self.forward(input_ids[:, held:], mask, self.cache)
            fed = mask[:, held:].sum(-1)
        self.ids = input_ids.clone()
        if need_output and self.last_logits is None:  # nothing left to feed but the output was dropped: recompute
            self.ids = None
            return self.sync(input_ids, mask)
        return self.last_logits, fed


# ----------------------------------------------------------------------------------------------------------------
# Batched sampling with processors


@dataclass
class Generation:
    """One generated response with what it cost (per sequence, real tokens only)."""

    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    stop_reason: str
    lm_calls: int = 0  # LM forwards of this row
    lm_tokens: int = 0  # tokens this row fed to the LM
    rm_calls: int = 0  # RM sequence evaluations (a FaRMA step is 1, an ARGS step k, a BoN score 1)
    rm_tokens: int = 0  # tokens this row fed to the RM
    reward: float | None = None  # Best-of-N: the winning RM score
    hidden: torch.Tensor | None = field(default=None, repr=False)  # body output at every token, (L, d)

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)


def pad_token_id(model: Any, tokenizer: Any, eos_token_id: int | Sequence[int] | None = None) -> int:
    """The id left-padded batches are padded with: the tokenizer's pad token, else its smallest EOS id, else 0.

    The one rule for `generate_batch`, `best_of_n` and the processors' ``pad_token_id`` (which must name the same id
    to tell left padding from real tokens).
    """
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    eos = _eos_ids(model, tokenizer, eos_token_id)
    return min(eos) if eos else 0


@torch.no_grad()
def generate_batch(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int = 32,
    do_sample: bool = True,
    temperature: float = 1.0,
    top_k: int = 0,
    logits_processors: Sequence[Any] = (),
    seed: int = 0,
    eos_token_id: int | Sequence[int] | None = None,
    return_hidden: bool = False,
    meter: ComputeMeter | None = None,
    meter_name: str | None = None,
) -> list[Generation]:
    """Sample a left-padded batch with a KV cache, HF-style logits processors, and finished rows dropped.

    Each step: one LM forward on the active rows, the processors on ``(ids (B, L), logits (B, V))``, then a sample
    from ``softmax(filter(scores))`` (temperature, then `top_k`) or the argmax. A row stops at EOS or
    `max_new_tokens`; finished rows leave the batch (the LM cache and the processors' RM caches drop them), so no
    compute is spent on them. Processors that expose ``row_calls`` / ``row_tokens`` are charged per row.

    Args:
        model, tokenizer: the HF causal LM and its tokenizer.
        prompts: token ids per row.
        max_new_tokens (`int`), do_sample (`bool`), temperature (`float`), top_k (`int`, 0 = off): the sampler.
        logits_processors: e.g. `RewardGuidedLogitsProcessor` (FaRMA) or `ARGSLogitsProcessor` (ARGS / PARGS).
        seed (`int`): seeds a private `torch.Generator` for the whole batch.
        eos_token_id: end token(s); default the model's generation config.
        return_hidden (`bool`, defaults to `False`): also return the body's final hidden state at every prompt and
            response token (``Generation.hidden``, (L, d)) -- the features a frozen-body reward model trains on.
            Each finished row is fed its last token once more for it (one extra LM forward per row).
        meter, meter_name: count the LM's forwards.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token-id lists")
    device = next(model.parameters()).device
    eos = _eos_ids(model, tokenizer, eos_token_id)
    pad = pad_token_id(model, tokenizer, eos_token_id)
    n = len(prompts)
    width = max(len(p) for p in prompts)
    if any(len(p) < width for p in prompts):  # left padding: the processors must recognise the same pad id
        for proc in logits_processors:
            if hasattr(proc, "pad") and proc.pad != pad:
                raise ValueError(
                    f"{type(proc).__name__} reads left padding as pad_token_id={proc.pad!r}, but generate_batch pads "
                    f"with {pad} (pad_token_id(model, tokenizer)); build the processor with pad_token_id={pad}"
                )
    ids = torch.full((n, width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(list(p))
        mask[i, width - len(p) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    generator = torch.Generator().manual_seed(int(seed))
    cache = new_cache(model)
    active = list(range(n))  # original row of each batch row
    finishing = [False] * n  # batch row has its last token and is fed once more for its hidden state
    out_tokens: list[list[int]] = [[] for _ in range(n)]
    hidden: list[list[torch.Tensor]] = [[] for _ in range(n)]
    stop = ["max_new_tokens"] * n
    cost = {key: [0] * n for key in ("lm_calls", "lm_tokens", "rm_calls", "rm_tokens")}
    captured: list[torch.Tensor] = []
    hook = None
    if return_hidden:
        hook = _decoder_of(model).register_forward_hook(lambda m, a, out: captured.append(out.last_hidden_state))
    for proc in logits_processors:
        if hasattr(proc, "reset"):
            proc.reset()

    def select(keep: list[int]) -> None:
        nonlocal ids, mask, active, finishing
        if len(keep) == len(active):
            return
        sel = torch.tensor(keep, dtype=torch.long, device=device)
        ids, mask = ids[sel], mask[sel]
        cache.batch_select_indices(sel)
        active, finishing = [active[j] for j in keep], [finishing[j] for j in keep]

    def lm_forward(feed: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        t = feed.shape[1]
        kwargs = {"attention_mask": mask, "position_ids": _positions(mask)[:, -t:], "logits_to_keep": 1}
        if meter is not None:
            with meter.track(model, meter_name):
                return model(input_ids=feed, **kwargs, **cache_kwargs(model, cache)).logits[:, -1].float()
        return model(input_ids=feed, **kwargs, **cache_kwargs(model, cache)).logits[:, -1].float()

    feed = ids
    dedup = _unique_rows(ids, mask)  # rows that share a prompt are prefilled once, then copied
    try:
        while active:
            t = feed.shape[1]
            if feed is ids and dedup is not None:
                first, inverse = (x.to(device) for x in dedup)
                logits = lm_forward(ids[first], mask[first])[inverse]
                cache.batch_select_indices(inverse)
                if captured:
                    captured[-1] = captured[-1][inverse]
            else:
                logits = lm_forward(feed, mask)
            fed = mask[:, -t:]
            for j, row in enumerate(active):
                cost["lm_calls"][row] += 1
                cost["lm_tokens"][row] += int(fed[j].sum())
                if return_hidden:
                    hidden[row].append(captured[-1][j, fed[j].bool()].float().cpu())  # real positions only
            captured.clear()
            keep = [j for j in range(len(active)) if not finishing[j]]
            if len(keep) < len(active):  # rows fed one last time for their hidden state are done now
                logits = logits[torch.tensor(keep, dtype=torch.long, device=device)]
                select(keep)
                if not active:
                    break
            scores = logits
            for proc in logits_processors:
                scores = proc(ids, scores)
                if hasattr(proc, "row_calls"):
                    for j, row in enumerate(active):
                        cost["rm_calls"][row] += int(proc.row_calls[j])
                        cost["rm_tokens"][row] += int(proc.row_tokens[j])
            if do_sample:
                probs = filter_logits(scores, temperature=temperature, top_k=top_k).softmax(-1).cpu()
                tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)
            else:
                tokens = scores.argmax(-1).cpu()
            ids = torch.cat([ids, tokens[:, None].to(device)], -1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], -1)
            for j, row in enumerate(active):
                tok = int(tokens[j])
                out_tokens[row].append(tok)
                if tok in eos:
                    stop[row] = "eos"
                finishing[j] = tok in eos or len(out_tokens[row]) >= max_new_tokens
            if not return_hidden:  # finished rows leave now; with hidden states they get one more forward
                keep = [j for j in range(len(active)) if not finishing[j]]
                tokens = tokens[torch.tensor(keep, dtype=torch.long)]
                select(keep)
            feed = tokens[:, None].to(device)
    finally:
        if hook is not None:
            hook.remove()
    return [
        Generation(
            prompt_ids=list(p),
            token_ids=out_tokens[i],
            text=tokenizer.decode(out_tokens[i], skip_special_tokens=True),
            stop_reason=stop[i],
            hidden=torch.cat(hidden[i]) if return_hidden else None,
            **{key: cost[key][i] for key in cost},
        )
        for i, p in enumerate(prompts)
    ]


__all__ = ["Generation", "generate_batch", "pad_token_id"]
