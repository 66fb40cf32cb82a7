"""The two reward models on a frozen LM body, and the cached body features they score and train on.

lmlab's reward models sit on a frozen body (the LM's own decoder, shared, run under ``no_grad``) with trainable heads:

- `ScalarRM`: r(y) = u^T h_T(y), a linear head at the last token -- the full-sequence / prefix reward model of the
  baselines (ARGS, PARGS, Best-of-N), with the ``AutoModelForSequenceClassification`` interface (``logits`` (B, 1));
- `VChannelRM`: FaRMA's V-channel head f_theta(s) = W h'(s) + 1 v^T h(s) in R^|V| (an untied copy of the LM head plus
  a low-rank delta), with the ``AutoModelForCausalLM`` interface (``logits`` (B, seq, V)); its sequence reward is
  R(y) = f_theta(y_<T)[y_T].

Training runs on cached body features (`body_hidden_states`), so only the heads learn: `RewardInputs` holds what a
head needs to score N (prefix-)sequences, `reward_inputs` builds it from the cache. Both heads expose
``sequence_reward(RewardInputs)``, so the trainers of `method.py` take either. Pure: no I/O, no printing.
"""

from __future__ import annotations

import math
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from transformers.modeling_outputs import CausalLMOutputWithPast, SequenceClassifierOutputWithPast

from lmlab.core.inference.generation import cache_kwargs

HEAD_MODES = ("lowrank", "full")


def _decoder_of(model: Any) -> nn.Module:
    """The transformer body (embeddings + blocks + final norm) of a HF causal LM."""
    if hasattr(model, "get_decoder"):
        body = model.get_decoder()
        if body is not None:
            return body
    if hasattr(model, "model"):
        return model.model
    raise ValueError(f"cannot find the decoder body of {type(model).__name__}; expected a HF causal LM")


def _hidden_size(model: Any) -> int:
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(cfg.hidden_size)


def _last_real(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last position with mask 1 in each row, (batch,); -1 for an all-zero row."""
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, torch.full_like(positions, -1)).max(-1).values


class _FrozenBodyRM(nn.Module):
    """A reward model reading the frozen body of a causal LM. The body is shared, never trained, never copied."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def get_input_embeddings(self) -> nn.Module:
        return self.body.get_input_embeddings()

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
    ) -> torch.Tensor:
        """Final-norm hidden states of the frozen body, (batch, seq, d), without gradient."""
        kwargs: dict[str, Any] = {"use_cache": False}
        if cache is not None:
            kwargs = cache_kwargs(self.body, cache)
        with torch.no_grad():  # the body is frozen: features carry no gradient into the LM's weights
            out = self.body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
        return out.last_hidden_state.float()


class ScalarRM(_FrozenBodyRM):
    """r(y) = u^T h_T(y): a linear head on the frozen body's hidden state at the last token (ARGS / PARGS / BoN).

    ``forward`` follows `AutoModelForSequenceClassification`: ``logits`` (batch, 1) is the reward of each row's
    sequence, read at the last real position of the tokens fed (left-padded batches and KV-cached increments work).

    Args:
        body (`nn.Module`): a HF decoder body (``model.get_decoder()``), shared and frozen.
        hidden_size (`int`): its hidden size d.
    """

    def __init__(self, body: nn.Module, hidden_size: int) -> None:
        super().__init__(body)
        # no bias, as HF's `*ForSequenceClassification.score` (a bias cancels in every Bradley-Terry difference)
        self.head = nn.Linear(hidden_size, 1, bias=False)
        nn.init.zeros_(self.head.weight)  # r = 0 before training: no guidance from an untrained RM

    @classmethod
    def from_causal_lm(cls, model: Any) -> ScalarRM:
        return cls(_decoder_of(model), _hidden_size(model))

    def reward_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., d) -> (...)."""
        return self.head(hidden).squeeze(-1)

    def sequence_reward(self, inputs: RewardInputs) -> torch.Tensor:
        """Reward of each (prefix-)sequence from cached features: u^T h(y_<=T), (N,)."""
        return self.reward_from_hidden(inputs.last_hidden)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        use_cache: bool | None = None,
        **kwargs: Any,
    ) -> SequenceClassifierOutputWithPast:
        hidden = self.hidden_states(input_ids, attention_mask, position_ids, cache)  # (B, t, d)
        t = input_ids.shape[1]
        new_mask = attention_mask[:, -t:] if attention_mask is not None else torch.ones_like(input_ids)
        last = _last_real(new_mask).clamp(min=0)  # (B,)
        pooled = hidden[torch.arange(hidden.shape[0]), last]  # (B, d)
        return SequenceClassifierOutputWithPast(logits=self.reward_from_hidden(pooled)[:, None])

    def score(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Reward of each full sequence of a (right- or left-) padded batch, (batch,)."""
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        hidden = self.hidden_states(input_ids, mask)
        last = _last_real(mask)
        return self.reward_from_hidden(hidden[torch.arange(hidden.shape[0]), last])


class VChannelRM(_FrozenBodyRM):
    """f_theta(s) = W h'(s) + 1 v^T h(s) in R^|V|: FaRMA's V-channel head on a frozen body; R(y) = f(y_<T)[y_T].

    The V-channel reward model of https://arxiv.org/abs/2502.04517 (one logit per candidate next token).

    The head is an *untied* copy W0 of the LM head (SmolLM2 and Gemma tie it to the input embeddings: training a
    tied head would move the body's embeddings). ``mode="lowrank"`` keeps W0 frozen and trains a rank-r delta whose
    left factor lies in the head's own column space, ΔW = (W0 P) Q^T, i.e. h' = h + P Q^T h: with a frozen body a
    free LoRA factor would only move the rows of tokens that appear in the losses, while this delta moves every
    token's score. ``mode="full"`` trains all of W (V x d; 28M parameters on SmolLM2). Both add the rank-1 delta
    1 v^T (``shared_row``), a prefix value shared by all tokens: it cancels between candidates at one prefix but lets
    Bradley-Terry compare different prefixes. At initialisation f equals the LM's logits (P = 0, v = 0).

    ``forward`` follows `AutoModelForCausalLM` (``logits`` (batch, seq, V)), so the model drops into
    `RewardGuidedLogitsProcessor` like the official code's causal-LM reward model.

    Args:
        body (`nn.Module`): a HF decoder body, shared and frozen.
        head_weight (`torch.Tensor`): the LM head weight (V, d); it is cloned.
        mode (`str`, defaults to ``"lowrank"``): ``"lowrank"`` or ``"full"``.
        rank (`int`, defaults to 32): r of the low-rank delta (0: none).
        shared_row (`bool`, defaults to `True`): add the shared row term 1 v^T.
        seed (`int`, defaults to 0): seeds the random init of Q.
    """

    def __init__(
        self,
        body: nn.Module,
        head_weight: torch.Tensor,
        *,
        mode: str = "lowrank",
        rank: int = 32,
        shared_row: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(body)
        if mode not in HEAD_MODES:
            raise ValueError(f"mode must be one of {', '.join(HEAD_MODES)}, got {mode!r}")
        if rank < 0:
            raise ValueError(f"rank must be >= 0, got {rank}")
        if mode == "lowrank" and rank == 0 and not shared_row:
            raise ValueError("mode='lowrank' with rank=0 and shared_row=False has nothing to train")
        vocab, d = head_weight.shape
        self.mode = mode
        # untied: a private copy, so no gradient ever reaches the (tied) input embeddings
        self.weight = nn.Parameter(head_weight.detach().clone().float(), requires_grad=(mode == "full"))
        self.rank = rank
        if rank > 0:
            g = torch.Generator().manual_seed(seed)
            self.lora_q = nn.Parameter(torch.randn(d, rank, generator=g) / math.sqrt(d))  # (d, r)
            self.lora_p = nn.Parameter(torch.zeros(d, rank))  # (d, r), zero: the delta starts at 0
        else:
            self.register_parameter("lora_q", None)
            self.register_parameter("lora_p", None)
        self.shared = nn.Parameter(torch.zeros(d)) if shared_row else None

    @classmethod
    def from_causal_lm(cls, model: Any, **kwargs: Any) -> VChannelRM:
        head = model.get_output_embeddings()
        if head is None:
            raise ValueError(f"{type(model).__name__} has no output embeddings to copy into a V-channel head")
        return cls(_decoder_of(model), head.weight, **kwargs)

    def get_output_embeddings(self) -> Any:
        return types.SimpleNamespace(weight=self.weight)

    def _adapt(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.rank == 0:
            return hidden
        return hidden + (hidden @ self.lora_q) @ self.lora_p.T  # h + P Q^T h, (..., d)

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """f(s) for every token: (..., d) -> (..., V)."""
        out = self._adapt(hidden) @ self.weight.T
        if self.shared is not None:
            out = out + (hidden @ self.shared)[..., None]
        return out

    def gather_from_hidden(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """f(s)[a] for one token a per row without the full vocabulary: (N, d), (N,) -> (N,)."""
        out = (self._adapt(hidden) * self.weight[tokens]).sum(-1)
        if self.shared is not None:
            out = out + hidden @ self.shared
        return out

    def sequence_reward(self, inputs: RewardInputs) -> torch.Tensor:
        """R(y) = f(y_<T)[y_T] from cached features, (N,)."""
        return self.gather_from_hidden(inputs.prev_hidden, inputs.last_token)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        hidden = self.hidden_states(input_ids, attention_mask, position_ids, cache)  # (B, t, d)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return CausalLMOutputWithPast(logits=self.logits_from_hidden(hidden))

    def score(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Sequence reward R(y) = f(y_<T)[y_T] of each row of a padded batch, (batch,)."""
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        last = _last_real(mask)
        if bool((last < 1).any()):
            raise ValueError("VChannelRM.score needs sequences of at least 2 tokens (R(y) reads f(y_<T)[y_T])")
        hidden = self.hidden_states(input_ids, mask)
        rows = torch.arange(hidden.shape[0])
        return self.gather_from_hidden(hidden[rows, last - 1], input_ids[rows, last])


# ----------------------------------------------------------------------------------------------------------------
# Cached body features


@dataclass
class RewardInputs:
    """What the heads need to score N (prefix-)sequences y_1..y_T from cached body features.

    Attributes:
        prev_hidden (`torch.Tensor`): body output at position T-1, reading y_<T, (N, d) -- the V-channel head's input.
        last_token (`torch.Tensor`): y_T, (N,) long.
        last_hidden (`torch.Tensor`): body output at position T, reading y_<=T, (N, d) -- the scalar head's input,
            and the prefix whose best expansion the max constraint reads.
    """

    prev_hidden: torch.Tensor
    last_token: torch.Tensor
    last_hidden: torch.Tensor

    def __len__(self) -> int:
        return int(self.last_token.shape[0])

    def index(self, idx: torch.Tensor) -> RewardInputs:
        return RewardInputs(self.prev_hidden[idx], self.last_token[idx], self.last_hidden[idx])


@torch.no_grad()
def body_hidden_states(
    rm: _FrozenBodyRM, sequences: Sequence[Sequence[int]], *, batch_size: int = 16, pad_token_id: int = 0
) -> list[torch.Tensor]:
    """Final hidden states of the frozen body for each sequence, [(L_i, d)], computed once (right-padded batches)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    device = next(rm.body.parameters()).device
    out: list[torch.Tensor] = []
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))  # similar lengths, little padding
    result: dict[int, torch.Tensor] = {}
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        width = max(len(sequences[i]) for i in rows)
        ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, i in enumerate(rows):
            ids[j, : len(sequences[i])] = torch.tensor(list(sequences[i]))
            mask[j, : len(sequences[i])] = 1
        hidden = rm.hidden_states(ids.to(device), mask.to(device)).cpu()  # (b, width, d)
        for j, i in enumerate(rows):
            result[i] = hidden[j, : len(sequences[i])].clone()
    out = [result[i] for i in range(len(sequences))]
    return out


def reward_inputs(
    hidden: Sequence[torch.Tensor], sequences: Sequence[Sequence[int]], ends: Sequence[int] | None = None
) -> RewardInputs:
    """`RewardInputs` of the (prefix-)sequences ``sequences[i][:ends[i]]`` (default: whole sequences).

    Args:
        hidden: cached body features per sequence, [(L_i, d)] (`body_hidden_states`).
        sequences: token ids per sequence (the same as the features were computed on).
        ends: T_i, the number of leading tokens forming each (prefix-)sequence, 2 <= T_i <= L_i.
    """
    if len(hidden) != len(sequences):
        raise ValueError(f"got {len(hidden)} feature tensors for {len(sequences)} sequences")
    ends = [len(s) for s in sequences] if ends is None else list(ends)
    prev, tok, last = [], [], []
    for h, seq, t in zip(hidden, sequences, ends):
        if not 2 <= t <= len(seq):
            raise ValueError(f"prefix length must be in [2, {len(seq)}], got {t}")
        prev.append(h[t - 2])
        tok.append(int(seq[t - 1]))
        last.append(h[t - 1])
    d = hidden[0].shape[-1] if hidden else 0
    if not prev:
        return RewardInputs(torch.zeros(0, d), torch.zeros(0, dtype=torch.long), torch.zeros(0, d))
    return RewardInputs(torch.stack(prev), torch.tensor(tok, dtype=torch.long), torch.stack(last))


__all__ = [
    "HEAD_MODES",
    "RewardInputs",
    "ScalarRM",
    "VChannelRM",
    "body_hidden_states",
    "reward_inputs",
]
