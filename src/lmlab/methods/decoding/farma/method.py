"""FaRMA: reward-guided decoding where one reward-model call scores every candidate next token.

    s_t(a) = l_LM(a | x, y_<t) + w * f_theta(x, y_<t)[a]  for all a in V;   y_t ~ softmax(top-k_a s_t(a))

Rashid, Wu, Fan, Li, Kristiadi, Poupart, "Towards Cost-Effective Reward Guided Text Generation", ICML 2025
(https://arxiv.org/abs/2502.04517; official code https://github.com/ahmadrash/FaRMA).

The reward model is a causal LM whose V-channel head reads as the rewards of all one-token expansions,
r_theta(s, a) = f_theta(s)[a], so one forward pass on the prefix s scores every candidate a. Its sequence reward is
R(y) = f_theta(y_<T)[y_T], the logit of the last token given the rest. Training alternates (official
``RM_FaRMA_train.sh``, ``reward_trainer_explicit.py`` / ``reward_trainer_optimal.py``):

- Bradley-Terry on full preference pairs: L_BT = -log sigmoid(R(y+) - R(y-) [- margin]) [+ c * mean((R+ + R-)^2)];
- the max constraint on partial chosen sequences: L_max = MSE(f(y_<t)[y_t], max_a f(y_<=t)[a]) -- the value of a
  prefix equals the value of its best one-token expansion; gradients flow through both sides (stop-gradient on the
  target is an ablation here).

Decoding (official ``RGTG_decoding_v2``, mode 2): one LM call and one RM call on the same prefix, the combined score
l_LM(a) + w * l_RM(a) over the RM vocabulary (raw logits, w = 1), top-k = 10 of it over the *whole* vocabulary, and a
sample from the softmax over those k values (mode 1: argmax).

Baselines on the same scalar-RM interface (``rm(...).logits`` of shape (batch, 1), the reward of each row's sequence):

- ARGS (Khanov et al., 2024): candidates are the LM's top-k tokens; each is scored by a full-sequence reward model on
  prefix + candidate, k RM calls per token, s(a) = l_LM(a) + w * r([s, a]);
- PARGS (Rashid et al., "A Critical Look at Tokenwise Reward-Guided Text Generation"): the same loop with a reward
  model trained by Bradley-Terry on equal-length *prefix* pairs;
- Best-of-N: N sampled responses, the one with the highest full-sequence reward.

lmlab's reward models sit on a frozen body (the LM's own decoder, shared, run under ``no_grad``) with trainable heads:
`ScalarRM` (a linear head) and `VChannelRM` (an untied copy of the LM head plus a low-rank delta). Training runs on
cached body features (`body_hidden_states`), so only the heads learn. Everything here is pure: no I/O, no printing.
"""

from __future__ import annotations

import copy
import inspect
import math
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import LogitsProcessor
from transformers.modeling_outputs import CausalLMOutputWithPast, SequenceClassifierOutputWithPast

from lmlab.core.inference.compute import ComputeMeter
from lmlab.core.inference.generation import _eos_ids, cache_kwargs, crop_cache, filter_logits, new_cache

HEAD_MODES = ("lowrank", "full")

# ----------------------------------------------------------------------------------------------------------------
# Reward models on a frozen body


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
# Cached features, losses and trainers


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


def bt_loss(
    r_chosen: torch.Tensor,
    r_rejected: torch.Tensor,
    *,
    margin: torch.Tensor | None = None,
    center_rewards_coefficient: float | None = None,
) -> torch.Tensor:
    """-log sigmoid(r+ - r- [- margin]) [+ c * mean((r+ + r-)^2)], as the official ``RewardTrainerExplicit``."""
    diff = r_chosen - r_rejected
    if margin is not None:
        diff = diff - margin
    loss = -F.logsigmoid(diff).mean()
    if center_rewards_coefficient:
        loss = loss + center_rewards_coefficient * ((r_chosen + r_rejected) ** 2).mean()
    return loss


def max_constraint_loss(
    r_taken: torch.Tensor, next_logits: torch.Tensor, *, stop_gradient: bool = False
) -> torch.Tensor:
    """MSE(f(y_<t)[y_t], max_a f(y_<=t)[a]) over N partial sequences: (N,), (N, V) -> scalar.

    The official ``RewardTrainerOptimal`` lets the gradient flow through both sides; ``stop_gradient=True`` detaches
    the max (a Bellman-target-style ablation).
    """
    target = next_logits.max(-1).values
    if stop_gradient:
        target = target.detach()
    return F.mse_loss(r_taken, target)


def _trainable(module: nn.Module) -> list[nn.Parameter]:
    # the body's parameters are never trained, whatever their requires_grad says (it is the LM's, shared)
    body_ids = {id(p) for p in getattr(module, "body", nn.Module()).parameters()}
    return [p for p in module.parameters() if p.requires_grad and id(p) not in body_ids]


def _run_phase(
    params: list[nn.Parameter],
    n: int,
    step_loss: Callable[[torch.Tensor], torch.Tensor],
    *,
    epochs: float,
    lr: float,
    batch_size: int,
    seed: int,
    max_grad_norm: float = 1.0,
) -> list[float]:
    """One trainer run as the official scripts launch it: fresh AdamW, linear decay to 0, no warmup, clip 1.0."""
    if n == 0 or epochs <= 0:
        return []
    steps_per_epoch = math.ceil(n / batch_size)
    total = max(1, round(epochs * steps_per_epoch))
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1.0 - s / total))
    g = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    order = torch.randperm(n, generator=g)
    pos = 0
    for _ in range(total):
        if pos >= n:
            order, pos = torch.randperm(n, generator=g), 0
        idx = order[pos : pos + batch_size]
        pos += batch_size
        loss = step_loss(idx)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    return losses


def train_bt(
    rm: ScalarRM | VChannelRM,
    chosen: RewardInputs,
    rejected: RewardInputs,
    *,
    epochs: float = 1.0,
    lr: float = 1e-3,
    batch_size: int = 16,
    seed: int = 0,
    margin: torch.Tensor | None = None,
    center_rewards_coefficient: float | None = None,
) -> list[float]:
    """Bradley-Terry on pairs (full sequences for ARGS / FaRMA, equal-length prefixes for PARGS); returns losses.

    Works for both heads through ``rm.sequence_reward``: u^T h(y) (scalar) or f(y_<T)[y_T] (V-channel).
    """
    if len(chosen) != len(rejected):
        raise ValueError(f"chosen and rejected must pair up, got {len(chosen)} and {len(rejected)}")

    def step(idx: torch.Tensor) -> torch.Tensor:
        m = margin[idx] if margin is not None else None
        return bt_loss(
            rm.sequence_reward(chosen.index(idx)),
            rm.sequence_reward(rejected.index(idx)),
            margin=m,
            center_rewards_coefficient=center_rewards_coefficient,
        )

    return _run_phase(_trainable(rm), len(chosen), step, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed)


def train_max(
    rm: VChannelRM,
    partial: RewardInputs,
    *,
    epochs: float = 1.0,
    lr: float = 1e-3,
    batch_size: int = 16,
    seed: int = 0,
    stop_gradient: bool = False,
) -> list[float]:
    """The max constraint on partial sequences y_<=t: MSE(f(y_<t)[y_t], max_a f(y_<=t)[a]); returns losses."""

    def step(idx: torch.Tensor) -> torch.Tensor:
        batch = partial.index(idx)
        return max_constraint_loss(
            rm.gather_from_hidden(batch.prev_hidden, batch.last_token),
            rm.logits_from_hidden(batch.last_hidden),
            stop_gradient=stop_gradient,
        )

    return _run_phase(_trainable(rm), len(partial), step, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed)


@dataclass
class TrainLog:
    """Per-phase losses of an alternating run: ``phases[i] = (name, iteration, losses)``."""

    phases: list[tuple[str, int, list[float]]] = field(default_factory=list)

    def last(self, name: str) -> float:
        for phase, _, losses in reversed(self.phases):
            if phase == name and losses:
                return losses[-1]
        return math.nan

    @property
    def steps(self) -> int:
        return sum(len(losses) for _, _, losses in self.phases)


def train_farma_rm(
    rm: VChannelRM,
    chosen: RewardInputs,
    rejected: RewardInputs,
    partial: RewardInputs,
    *,
    iterations: int = 7,
    bt_epochs: float = 1.0,
    max_epochs: float = 1.0,
    lr: float = 1e-3,
    batch_size: int = 16,
    seed: int = 0,
    stop_gradient: bool = False,
    partial_per_phase: int | None = None,
    end_with_bt: bool = True,
    on_phase: Callable[[str, int], None] | None = None,
) -> TrainLog:
    """FaRMA's alternating schedule: per iteration one BT phase on full pairs, then one max phase on partials.

    The official ``RM_FaRMA_train.sh`` runs 7 iterations of (1 BT epoch, 1 max epoch) and evaluates a checkpoint
    saved right after a BT phase (``RM_BT_iter2`` for TL;DR, ``iter7`` for HH, ``iter5`` for UltraFeedback); with
    ``end_with_bt`` the last iteration's max phase is skipped, so the result is ``RM_BT_iter{iterations}``.

    Args:
        rm (`VChannelRM`): the reward model (trained in place).
        chosen, rejected (`RewardInputs`): full preference pairs.
        partial (`RewardInputs`): partial chosen sequences for the max constraint.
        iterations (`int`, defaults to 7): alternations.
        bt_epochs, max_epochs (`float`, default 1.0): epochs per phase.
        lr (`float`), batch_size (`int`), seed (`int`): optimiser settings (fresh AdamW per phase, as the official
            scripts launch one trainer per phase).
        stop_gradient (`bool`, defaults to `False`): detach the max target (the official code does not).
        partial_per_phase (`int`, *optional*): random partial sequences per max phase (the official scripts draw
            8,000 per phase, as many as BT pairs); None uses all.
        end_with_bt (`bool`, defaults to `True`): skip the last max phase.
        on_phase: called as ``on_phase(name, iteration)`` after every phase (e.g. to measure held-out accuracy).
    """
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    log = TrainLog()
    g = torch.Generator().manual_seed(seed)
    for it in range(1, iterations + 1):
        losses = train_bt(rm, chosen, rejected, epochs=bt_epochs, lr=lr, batch_size=batch_size,
                          seed=seed * 1000 + 2 * it)  # fmt: skip
        log.phases.append(("bt", it, losses))
        if on_phase is not None:
            on_phase("bt", it)
        if end_with_bt and it == iterations:
            break
        part = partial
        if partial_per_phase is not None and len(partial) > partial_per_phase:
            part = partial.index(torch.randperm(len(partial), generator=g)[:partial_per_phase])
        losses = train_max(rm, part, epochs=max_epochs, lr=lr, batch_size=batch_size, seed=seed * 1000 + 2 * it + 1,
                           stop_gradient=stop_gradient)  # fmt: skip
        log.phases.append(("max", it, losses))
        if on_phase is not None:
            on_phase("max", it)
    return log


@torch.no_grad()
def bt_accuracy(rm: ScalarRM | VChannelRM, chosen: RewardInputs, rejected: RewardInputs) -> list[float]:
    """Per pair: 1 if R(y+) > R(y-), 0.5 on a tie, else 0."""
    if len(chosen) == 0:
        return []
    a, b = rm.sequence_reward(chosen), rm.sequence_reward(rejected)
    return [1.0 if x > y else 0.5 if x == y else 0.0 for x, y in zip(a.tolist(), b.tolist())]


# ----------------------------------------------------------------------------------------------------------------
# Reward-guided logits processors (HF `LogitsProcessor`s: usable in `model.generate`, lmlab's `decode`, and
# `generate_batch` below)


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


class RewardGuidedLogitsProcessor(LogitsProcessor):
    """FaRMA decoding step: s(a) = l_LM(a) + w * f_theta(s)[a] over the RM vocabulary, keep its top-k (one RM call).

    Rashid et al., ICML 2025 (https://arxiv.org/abs/2502.04517), official ``RGTG_decoding_v2`` in ``RM_test.py``.

    Returns scores that are -inf outside the top-k of the combined score and the combined score inside, so that
    sampling (``do_sample=True``, temperature 1, no other filter) draws from the softmax over those k values -- the
    official mode 2 -- and greedy decoding takes their argmax (mode 1). With ``w = 0`` it is top-k sampling of the LM.

    Works in ``model.generate(..., logits_processor=LogitsProcessorList([proc]))``, in lmlab's `decode` and in
    `generate_batch`. Left padding is recognised from leading ``pad_token_id`` tokens (the processor only sees ids).

    Args:
        rm: a V-channel reward model: any causal LM whose ``forward(input_ids, attention_mask, position_ids, cache)``
            returns ``logits`` (batch, seq, V_RM) -- `VChannelRM` or a plain HF causal LM as in the official code.
        w (`float`, defaults to 1.0): the RM weight (official ``w=1.0``).
        k (`int`, defaults to 10): candidates kept (official ``topk=10``).
        pad_token_id (`int`, *optional*): the pad id of left-padded batches (in `generate_batch`:
            ``pad_token_id(model, tokenizer)``, which it checks).
        use_cache (`bool`, defaults to `True`): keep the RM's KV cache across steps (the official loop re-runs the
            whole prefix every step; both give the same scores).
        meter, meter_name: count the RM's forwards.

    Attributes:
        rm_calls (`int`): RM sequence evaluations so far (one per row per step).
        rm_tokens (`int`): real tokens fed to the RM so far.
        row_calls, row_tokens (`torch.Tensor`): the same for each row of the last call, (batch,).
    """

    def __init__(
        self,
        rm: nn.Module,
        w: float = 1.0,
        k: int = 10,
        *,
        pad_token_id: int | None = None,
        use_cache: bool = True,
        meter: ComputeMeter | None = None,
        meter_name: str | None = None,
    ) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if not math.isfinite(w):
            raise ValueError(f"w must be finite, got {w}")
        self.rm, self.w, self.k, self.pad, self.use_cache = rm, float(w), int(k), pad_token_id, use_cache
        self.state = _RMState(rm, pad_token_id, meter, meter_name)
        self.rm_calls = 0
        self.rm_tokens = 0
        self.row_calls = torch.zeros(0, dtype=torch.long)
        self.row_tokens = torch.zeros(0, dtype=torch.long)

    def reset(self) -> None:
        self.state.reset()

    def rm_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """f_theta(s) at the end of each row, (batch, V_RM): one RM call per row."""
        mask = _left_pad_mask(input_ids, self.pad).to(input_ids.device)
        if self.use_cache:
            logits, fed = self.state.sync(input_ids, mask)
        else:
            logits, fed = self.state.forward(input_ids, mask, None), mask.sum(-1)
        self.row_calls = torch.ones(input_ids.shape[0], dtype=torch.long)
        self.row_tokens = fed.cpu().long()
        self.rm_calls += input_ids.shape[0]
        self.rm_tokens += int(self.row_tokens.sum())
        return logits

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        rm_logits = self.rm_logits(input_ids).to(scores.device)  # (B, V_RM)
        check_shared_vocab(scores.shape[-1], rm_logits.shape[-1])
        combined = scores + self.w * rm_logits  # (B, V)
        k = min(self.k, combined.shape[-1])
        kth = torch.topk(combined, k, dim=-1).values[:, -1:]
        return combined.masked_fill(combined < kth, float("-inf"))


def check_shared_vocab(lm_vocab: int, rm_vocab: int) -> None:
    """FaRMA adds the RM's logit of token a to the LM's logit of token a: both must index one vocabulary.

    The official code slices ``l_LM[:V_RM]``, which silently pairs different tokens when the two models' vocabularies
    differ; here a mismatch is an error (build the V-channel RM on the LM itself: `VChannelRM.from_causal_lm(lm)`).
    """
    if lm_vocab != rm_vocab:
        raise ValueError(
            f"FaRMA needs the LM and the reward model to share one vocabulary, got LM vocab size {lm_vocab} and RM "
            f"vocab size {rm_vocab} (build the RM on the LM: VChannelRM.from_causal_lm(lm))"
        )


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
# Batched sampling with processors, and Best-of-N


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
