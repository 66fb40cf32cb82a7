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

The baselines (ARGS, PARGS, Best-of-N) are in `baselines.py`; the two reward models (`VChannelRM`, and `ScalarRM`
for the baselines) and their cached features in `reward_models.py`; the batched sampler the processors run in
(`generate_batch`) in `sampling.py`. Everything here is pure: no I/O, no printing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import LogitsProcessor

from lmlab.core.inference.compute import ComputeMeter
from lmlab.methods.decoding.farma.reward_models import RewardInputs, ScalarRM, VChannelRM
from lmlab.methods.decoding.farma.sampling import _left_pad_mask, _RMState

# ----------------------------------------------------------------------------------------------------------------
# Losses and trainers (on cached features)


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
# FaRMA's decoding step (an HF `LogitsProcessor`: usable in `model.generate`, lmlab's `decode`, and
# `generate_batch`)


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


__all__ = [
    "RewardGuidedLogitsProcessor",
    "TrainLog",
    "bt_accuracy",
    "bt_loss",
    "check_shared_vocab",
    "max_constraint_loss",
    "train_bt",
    "train_farma_rm",
    "train_max",
]
