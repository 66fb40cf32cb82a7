"""Implicit PRM (Yuan et al., ICML 2025): an outcome reward model whose token log-ratios are process rewards.

``r_theta(y) = beta * log pi_theta(y|x) / pi_ref(y|x)`` -- https://arxiv.org/abs/2412.01981

1. Parameterise the outcome reward as the summed token log-ratio of a trainable policy pi_theta and its frozen
   initialisation pi_ref, and train it on response-level labels only (final answer correct or not): with the
   cross-entropy ``-(l log sig(r) + (1-l) log(1 - sig(r)))`` (`lmlab.core.training.preference.implicit_prm_ce_loss`) or
   DPO on (correct, incorrect) pairs of the same question (`lmlab.core.training.preference.dpo_loss`).
2. Proposition 3.1: ``q_t = sum_{i<=t} beta log pi_theta(y_i|y_<i) / pi_ref(y_i|y_<i)`` is a soft Q-value, so the
   process reward of step s is ``r_s = q_{end(s)} - q_{end(s-1)}``, the summed log-ratio of the step's tokens
   (`lmlab.core.training.preference.implicit_step_rewards`). The step rewards sum to the outcome reward by
   construction.
3. Best-of-N scores each candidate by an aggregate of its step rewards: ``min`` (the paper's [verify]), ``sum``
   (= the outcome reward) or ``last`` (q of the last step, the same as ``sum`` here); a weighted majority vote sums
   ``sigmoid(score)`` over candidates that share a final answer.

Training uses `lmlab.core.training.partial`: the lower ``L-k`` blocks run once under ``no_grad`` (`FrozenTrunk`);
pi_theta is
a trainable copy of the top ``k`` blocks and the final norm; pi_ref is the model's own top ``k`` blocks on the same
cache, so the reference costs k blocks. The LM head runs on response positions only (it costs ~8 SmolLM2 blocks per
token). The baselines share the machinery: `ValueModel` is a scalar head on a trainable top-k copy (an outcome RM
trained with Bradley-Terry, or a Math-Shepherd PRM trained with per-step BCE on Monte Carlo labels).

Everything here is pure: no I/O except `ImplicitPRM.save` / `load_implicit_prm`, which write/read a PRM folder.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lmlab.core.training.partial import FrozenTrunk, TopK, TrunkCache, response_token_logps
from lmlab.core.training.preference import (
    ResponseBatch,
    SeqLogps,
    bradley_terry_loss,
    build_response_batch,
    dpo_loss,
    implicit_prm_ce_loss,
    implicit_step_rewards,
    logps_from_token_logps,
    step_token_ends,
)
from lmlab.core.training.prm import CountingPRM

LOSSES = ("ce", "dpo")
BALANCES = ("none", "dataset", "instruction")
AGGREGATES = ("min", "sum", "last")
OUTPUTS = ("value", "step")
FORMAT_VERSION = 1
CONFIG_FILE = "implicit_prm.json"
WEIGHTS_FILE = "top_k.safetensors"


# ------------------------------------------------------------------------------------------------- tokenisation


@dataclass
class Encoded:
    """A tokenised batch of (prompt, steps) rows and where each step's tokens end.

    Attributes:
        batch (`ResponseBatch`): right-padded prompt + response ids; the response is ``delimiter.join(steps)``.
        step_ends (`list[list[int]]`): per row, the exclusive end of each step in response-token indices (the last
            equals the row's response length).
        prompt_lens (`list[int]`): per row, the number of tokens before the response.
    """

    batch: ResponseBatch
    step_ends: list[list[int]]
    prompt_lens: list[int]

    def __len__(self) -> int:
        return len(self.prompt_lens)


def _check_steps(steps: Sequence[str], i: int) -> None:
    if not steps:
        raise ValueError(f"row {i}: steps is empty; a response needs at least one step")
    for s in steps:
        if not isinstance(s, str) or not s:
            raise ValueError(f"row {i}: every step must be a non-empty string, got {s!r}")


def encode_steps(tokenizer: Any, prompts: Sequence[str], steps: Sequence[Sequence[str]], *, delimiter: str = "\n"
                 ) -> Encoded:  # fmt: skip
    """Tokenise ``prompt + delimiter.join(steps)`` rows with `build_response_batch`'s boundary rule and map steps
    to tokens by character offsets (`step_token_ends`): a step owns its text and the delimiter after it, and a token
    belongs to the step holding its first character, so BPE merges across a delimiter stay consistent."""
    if len(prompts) != len(steps):
        raise ValueError(f"got {len(prompts)} prompts but {len(steps)} step lists")
    if not delimiter:
        raise ValueError("delimiter must be a non-empty string, got ''")
    responses = []
    for i, st in enumerate(steps):
        _check_steps(st, i)
        responses.append(delimiter.join(st))
    batch = build_response_batch(tokenizer, list(prompts), responses, padding_side="right")
    ends_all, prompt_lens = [], []
    for i, (p, r, st) in enumerate(zip(prompts, responses, steps, strict=True)):
        n_resp = int(batch.response_mask[i].sum())
        offsets = tokenizer(p + r, add_special_tokens=True, return_offsets_mapping=True)["offset_mapping"]
        # the response tokens are the last n_resp of enc(prompt + response); a token merged across the boundary
        # starts in the prompt and goes to the first step
        resp_offsets = [(max(0, a - len(p)), max(0, b - len(p))) for a, b in offsets[len(offsets) - n_resp :]]
        char_ends, pos = [], 0
        for j, s in enumerate(st):
            pos += len(s) + (len(delimiter) if j < len(st) - 1 else 0)
            char_ends.append(pos)
        ends_all.append(step_token_ends(resp_offsets, char_ends))
        prompt_lens.append(int(batch.attention_mask[i].sum()) - n_resp)
    return Encoded(batch, ends_all, prompt_lens)


@dataclass
class Prepared:
    """One batch ready for training or scoring: its encoding, the frozen trunk's cache, the reference log-probs.

    Attributes:
        enc (`Encoded`); cache (`TrunkCache`); ref (`SeqLogps`): pi_ref's response log-probs (no grad);
        rows (`list[int]`): the batch's indices in the caller's example list.
    """

    enc: Encoded
    cache: TrunkCache
    ref: SeqLogps
    rows: list[int]


def _group_batches(groups: Sequence[Any], batch_size: int) -> list[list[int]]:
    """Consecutive whole groups, up to `batch_size` rows a batch (a larger group is a batch of its own)."""
    out: list[list[int]] = []
    cur: list[int] = []
    i = 0
    while i < len(groups):
        j = i
        while j < len(groups) and groups[j] == groups[i]:
            j += 1
        block = list(range(i, j))
        if cur and len(cur) + len(block) > batch_size:
            out.append(cur)
            cur = []
        cur += block
        i = j
    if cur:
        out.append(cur)
    return out


@torch.no_grad()
def prepare(
    trunk: FrozenTrunk,
    tokenizer: Any,
    prompts: Sequence[str],
    steps: Sequence[Sequence[str]],
    *,
    delimiter: str = "\n",
    batch_size: int = 16,
    groups: Sequence[Any] | None = None,
    callback: Callable[[int, int], None] | None = None,
) -> list[Prepared]:
    """Encode the rows, run the frozen trunk once per batch and cache pi_ref's response log-probs.

    Batches hold whole `groups` (the responses of one question, so DPO / Bradley-Terry pairs stay in one batch);
    rows of a group must be consecutive. `callback(done, total)` reports progress.
    """
    if not prompts:
        raise ValueError("no rows to prepare: need at least one (prompt, steps) row")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    groups = list(range(len(prompts))) if groups is None else list(groups)
    if len(groups) != len(prompts):
        raise ValueError(f"got {len(groups)} group ids for {len(prompts)} rows")
    seen: set[Any] = set()
    for i, g in enumerate(groups):
        if g in seen and groups[i - 1] != g:
            raise ValueError(f"rows of group {g!r} are not consecutive; sort the rows by group")
        seen.add(g)
    device = next(trunk.model.parameters()).device
    out = []
    batches = _group_batches(groups, batch_size)
    for n, rows in enumerate(batches):
        enc = encode_steps(tokenizer, [prompts[i] for i in rows], [steps[i] for i in rows], delimiter=delimiter)
        enc.batch = enc.batch.to(device)
        cache = trunk(enc.batch.input_ids, enc.batch.attention_mask, enc.batch.position_ids)
        ref = response_logps(trunk.reference, cache, enc)
        out.append(Prepared(enc, cache, ref, list(rows)))
        if callback is not None:
            callback(n + 1, len(batches))
    return out


# ---------------------------------------------------------------------------------------------------- log-probs


def response_logps(topk: TopK, cache: TrunkCache, enc: Encoded) -> SeqLogps:
    """Response-token log-probs of a cached batch under `topk` (pi_theta with grad, or the frozen pi_ref).

    Same numbers as `lmlab.core.training.partial.token_logps_from_cache` masked to the response, but the LM head runs
    on the
    response positions only.
    """
    tm = enc.batch.target_mask  # (B, T-1): position t predicts response token t+1
    return logps_from_token_logps(response_token_logps(topk, cache, tm), tm)


def step_rewards_of(policy: SeqLogps, ref: SeqLogps, enc: Encoded, beta: float) -> list[torch.Tensor]:
    """Per row, the implicit process rewards ``r_s`` (n_steps,) of `implicit_step_rewards`."""
    return [
        implicit_step_rewards(policy.per_token(i), ref.per_token(i), enc.step_ends[i], beta) for i in range(len(enc))
    ]


def aggregate(scores: Sequence[float] | torch.Tensor, how: str = "min") -> float:
    """Response score from step scores: ``min`` (weakest step), ``sum`` or ``last``."""
    vals = [float(v) for v in scores]
    if not vals:
        raise ValueError("no step scores to aggregate")
    if how == "min":
        return min(vals)
    if how == "sum":
        return math.fsum(vals)
    if how == "last":
        return vals[-1]
    raise ValueError(f"aggregate must be one of {', '.join(AGGREGATES)}, got {how!r}")


# ----------------------------------------------------------------------------------------------------- training


@dataclass
class TrainLog:
    """Loss per optimiser step and the number of steps skipped (a batch without a pair, for DPO / BT)."""

    losses: list[float]
    skipped: int = 0


def _pairs(rows: Sequence[int], labels: Sequence[float], groups: Sequence[Any]) -> tuple[list[int], list[int]]:
    """(chosen, rejected) batch positions: every (correct, incorrect) combination within one group."""
    chosen, rejected = [], []
    for a, ra in enumerate(rows):
        for b, rb in enumerate(rows):
            if groups[ra] == groups[rb] and labels[ra] > 0.5 and labels[rb] <= 0.5:
                chosen.append(a)
                rejected.append(b)
    return chosen, rejected


def balance_weights(labels: Sequence[float], groups: Sequence[Any], how: str) -> list[float]:
    """Class-balancing weights of the CE loss (the paper's dataset-wise / instruction-wise variants [verify]).

    ``dataset``: ``w = n / (2 n_class)`` over all rows; ``instruction``: the same within each group (a group with
    one class keeps weight 1); ``none``: all ones. Weights average 1 over their pool.
    """
    if how not in BALANCES:
        raise ValueError(f"balance must be one of {', '.join(BALANCES)}, got {how!r}")
    n = len(labels)
    if how == "none":
        return [1.0] * n

    def weights(idx: list[int]) -> dict[int, float]:
        pos = [i for i in idx if labels[i] > 0.5]
        neg = [i for i in idx if labels[i] <= 0.5]
        if not pos or not neg:
            return {i: 1.0 for i in idx}
        return {**{i: len(idx) / (2 * len(pos)) for i in pos}, **{i: len(idx) / (2 * len(neg)) for i in neg}}

    if how == "dataset":
        w = weights(list(range(n)))
    else:
        w = {}
        for g in dict.fromkeys(groups):
            w.update(weights([i for i in range(n) if groups[i] == g]))
    return [w[i] for i in range(n)]


def _epochs(module: nn.Module, param_groups: list[dict[str, Any]], batches: Sequence[Prepared],
            loss_fn: Callable[[Prepared], Any], *, seed: int, max_grad_norm: float = 1.0,
            callback: Callable[[int, int, float], None] | None = None, total: int = 0
            ) -> Iterator[TrainLog]:  # fmt: skip
    """AdamW over shuffled cached batches (fixed composition, order reshuffled each epoch), grad-norm clipping 1.0
    as TRL's default; one epoch per ``next``, yielding the running log with `module` in eval mode, for as long as the
    caller asks (so the epochs can be chosen on a dev split from the checkpoints of one run).

    `param_groups`: AdamW's groups, each ``{"params": [...], "lr": lr}`` (a fresh head can step faster than the
    pretrained blocks under it). `total`: the step count `callback(step, total, loss)` reports against."""
    for group in param_groups:
        if not group["lr"] > 0:
            raise ValueError(f"lr must be > 0, got {group['lr']}")
    opt = torch.optim.AdamW(param_groups, weight_decay=0.0)
    params = [p for group in param_groups for p in group["params"]]
    g = torch.Generator().manual_seed(int(seed))
    log = TrainLog([])
    step = 0
    while True:
        module.train()
        for b in torch.randperm(len(batches), generator=g).tolist():
            step += 1
            loss = loss_fn(batches[b])
            if loss is None:
                log.skipped += 1
                continue
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            opt.step()
            log.losses.append(float(loss.detach()))
            if callback is not None:
                callback(step, total, log.losses[-1])
        module.eval()
        yield log


def _take(run: Iterator[tuple[Any, TrainLog]], epochs: int) -> tuple[Any, TrainLog]:
    """The model and log after `epochs` epochs of `run` (then closed: its optimiser state is freed)."""
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    for _ in range(epochs):
        out = next(run)
    run.close()
    return out


def implicit_epochs(
    trunk: FrozenTrunk,
    batches: Sequence[Prepared],
    labels: Sequence[float],
    groups: Sequence[Any],
    *,
    loss: str = "ce",
    beta: float = 0.05,
    lr: float = 1e-4,
    balance: str = "none",
    seed: int = 0,
    callback: Callable[[int, int, float], None] | None = None,
    total: int = 0,
) -> Iterator[tuple[TopK, TrainLog]]:
    """`train_implicit` one epoch at a time: yields ``(policy, log)`` after every epoch (the same policy object,
    trained on); `select_recipe` scores these checkpoints on a dev split. Arguments as in `train_implicit`."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {loss!r}")
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    policy = trunk.top_k()
    weights = balance_weights(labels, groups, balance)

    def loss_fn(pb: Prepared) -> torch.Tensor | None:
        if loss == "ce":
            pol = response_logps(policy, pb.cache, pb.enc)
            lab = torch.tensor([float(labels[r]) for r in pb.rows])
            w = torch.tensor([weights[r] for r in pb.rows])
            return implicit_prm_ce_loss(pol.sum, pb.ref.sum, lab, beta=beta, weight=w)
        c, r = _pairs(pb.rows, labels, groups)
        if not c:
            return None
        pol = response_logps(policy, pb.cache, pb.enc)
        return dpo_loss(pol.sum[c], pol.sum[r], pb.ref.sum[c], pb.ref.sum[r], beta=beta)

    run = _epochs(policy, [{"params": list(policy.trainable_parameters()), "lr": lr}], batches, loss_fn, seed=seed,
                  callback=callback, total=total)  # fmt: skip
    return ((policy, log) for log in run)


def train_implicit(
    trunk: FrozenTrunk,
    batches: Sequence[Prepared],
    labels: Sequence[float],
    groups: Sequence[Any],
    *,
    loss: str = "ce",
    beta: float = 0.05,
    epochs: int = 2,
    lr: float = 1e-4,
    balance: str = "none",
    seed: int = 0,
    callback: Callable[[int, int, float], None] | None = None,
) -> tuple[TopK, TrainLog]:
    """Train pi_theta (a copy of the top k blocks) as an outcome RM ``r = beta log pi_theta/pi_ref``.

    Args:
        batches: `prepare` output for the training rows; labels (`Sequence[float]`): outcome label per row (1 =
            final answer correct); groups: question id per row (DPO pairs stay within a question).
        loss (`str`): ``"ce"`` (README's cross-entropy) or ``"dpo"`` (every correct x incorrect pair of a question).
        beta (`float`, defaults to 0.05): the paper's beta [verify].
        balance (`str`): CE class balancing, ``none`` | ``dataset`` | ``instruction``.

    Returns:
        (policy, log): the trained `TopK` and the loss per step.
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    run = implicit_epochs(trunk, batches, labels, groups, loss=loss, beta=beta, lr=lr, balance=balance, seed=seed,
                          callback=callback, total=epochs * len(batches))  # fmt: skip
    return _take(run, epochs)


class ValueModel(nn.Module):
    """A scalar head on a trainable top-k copy: ``v_t = w . h_t + b`` at every position (the ORM / explicit PRM).

    The value at a step's last token reads only the prefix (causal attention), so one pass gives the score of every
    step prefix and, at the prompt's last token, of the empty response.
    """

    def __init__(self, topk: TopK, seed: int = 0) -> None:
        super().__init__()
        self.topk = topk
        hidden = int(topk.norm.weight.shape[0])
        self.head = nn.Linear(hidden, 1)
        g = torch.Generator().manual_seed(int(seed))
        with torch.no_grad():
            self.head.weight.normal_(0.0, 1.0 / math.sqrt(hidden + 1), generator=g)
            self.head.bias.zero_()

    def forward(self, cache: TrunkCache) -> torch.Tensor:
        """Values (batch, T)."""
        return self.head(self.topk.hidden_states(cache)).squeeze(-1)

    def parameters_to_train(self) -> list[nn.Parameter]:
        return [*self.topk.trainable_parameters(), *self.head.parameters()]

    def param_groups(self, lr: float, head_lr: float | None = None) -> list[dict[str, Any]]:
        """AdamW groups: the pretrained blocks at `lr`, the freshly initialised head at `head_lr` (default `lr`)."""
        return [
            {"params": list(self.topk.trainable_parameters()), "lr": lr},
            {"params": list(self.head.parameters()), "lr": lr if head_lr is None else head_lr},
        ]


def prefix_values(values: torch.Tensor, enc: Encoded) -> list[torch.Tensor]:
    """Per row, ``[v(prompt), v(step 1 prefix), ..., v(all steps)]`` (n_steps + 1,) from (batch, T) values."""
    out = []
    for i in range(len(enc)):
        p = enc.prompt_lens[i]
        pos = [p - 1] + [p + e - 1 for e in enc.step_ends[i]]
        out.append(values[i, pos])
    return out


def value_model_epochs(
    trunk: FrozenTrunk,
    batches: Sequence[Prepared],
    *,
    objective: str,
    labels: Sequence[float] | None = None,
    groups: Sequence[Any] | None = None,
    step_labels: Sequence[Sequence[float]] | None = None,
    lr: float = 1e-4,
    head_lr: float | None = None,
    seed: int = 0,
    callback: Callable[[int, int, float], None] | None = None,
    total: int = 0,
) -> Iterator[tuple[ValueModel, TrainLog]]:
    """`train_value_model` one epoch at a time: yields ``(value model, log)`` after every epoch (the same model,
    trained on). Arguments as in `train_value_model`."""
    if objective == "bt":
        if labels is None or groups is None:
            raise ValueError("objective='bt' needs labels and groups")
    elif objective == "steps":
        if step_labels is None:
            raise ValueError("objective='steps' needs step_labels (one list per row)")
    else:
        raise ValueError(f"objective must be 'bt' or 'steps', got {objective!r}")
    for name, value in (("lr", lr), ("head_lr", lr if head_lr is None else head_lr)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    vm = ValueModel(trunk.top_k(), seed=seed)

    def loss_fn(pb: Prepared) -> torch.Tensor | None:
        if objective == "bt":
            c, r = _pairs(pb.rows, labels, groups)
            if not c:
                return None
            final = torch.stack([v[-1] for v in prefix_values(vm(pb.cache), pb.enc)])  # (B,)
            return bradley_terry_loss(final[c], final[r])
        vals = prefix_values(vm(pb.cache), pb.enc)
        logits, targets = [], []
        for v, row in zip(vals, pb.rows, strict=True):
            lab = step_labels[row]
            if len(lab) != len(v) - 1:
                raise ValueError(f"row {row}: {len(lab)} step labels for {len(v) - 1} steps")
            logits.append(v[1:])
            targets.append(torch.tensor(lab, dtype=v.dtype))
        return F.binary_cross_entropy_with_logits(torch.cat(logits), torch.cat(targets))

    run = _epochs(vm, vm.param_groups(lr, head_lr), batches, loss_fn, seed=seed, callback=callback, total=total)
    return ((vm, log) for log in run)


def train_value_model(
    trunk: FrozenTrunk,
    batches: Sequence[Prepared],
    *,
    objective: str,
    labels: Sequence[float] | None = None,
    groups: Sequence[Any] | None = None,
    step_labels: Sequence[Sequence[float]] | None = None,
    epochs: int = 2,
    lr: float = 1e-4,
    head_lr: float | None = None,
    seed: int = 0,
    callback: Callable[[int, int, float], None] | None = None,
) -> tuple[ValueModel, TrainLog]:
    """Train a `ValueModel`: ``objective="bt"`` is the outcome RM (Bradley-Terry on the final value of every
    correct x incorrect pair of a question, `bradley_terry_loss`); ``"steps"`` is the Math-Shepherd PRM (BCE of
    each step's value against its Monte Carlo label).

    `lr` steps the top-k blocks and `head_lr` (default `lr`) the freshly initialised scalar head: a 577-weight head
    drawn at scale 1/sqrt(hidden) moves about lr per AdamW step, so at a pretrained block's lr (1e-4) two epochs
    barely turn it and the blocks learn against a random readout."""
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    run = value_model_epochs(trunk, batches, objective=objective, labels=labels, groups=groups,
                             step_labels=step_labels, lr=lr, head_lr=head_lr, seed=seed, callback=callback,
                             total=epochs * len(batches))  # fmt: skip
    return _take(run, epochs)


# ---------------------------------------------------------------------------------------------- recipe search


@dataclass
class GridPoint:
    """One (lr, epochs) point of a recipe search and its dev score (higher is better; tuples compare in order)."""

    lr: float
    epochs: int
    score: tuple[float, ...]
    extension: bool = False  # added because the choice sat on the edge of the points before it


@dataclass
class Recipe:
    """A model's training recipe chosen on a dev split (`select_recipe`).

    Attributes:
        lr (`float`), epochs (`int`): the chosen point; score: its dev score.
        model: the trained model at that checkpoint (eval mode); log (`TrainLog`): its training up to there.
        grid (`list[GridPoint]`): every point scored, in the order tried.
        lr_at_edge, epochs_at_edge (`bool`): the choice is still the largest / smallest lr tried, or the most epochs
            tried at its lr (no longer run was seen to lose), after the extensions (widen the grid).
    """

    lr: float
    epochs: int
    score: tuple[float, ...]
    model: Any
    log: TrainLog
    grid: list[GridPoint]
    lr_at_edge: bool
    epochs_at_edge: bool


def _trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def select_recipe(
    start: Callable[[float], Iterator[tuple[Any, TrainLog]]],
    dev_score: Callable[[Any], tuple[float, ...]],
    lrs: Sequence[float],
    epoch_grid: Sequence[int],
    *,
    max_extensions: int = 2,
) -> Recipe:
    """Search of (lr, epochs) on a dev split, the same procedure for every model it compares.

    One run per lr (``start(lr)``, an epoch iterator such as `implicit_epochs`), scored by ``dev_score(model)`` at
    each epoch of `epoch_grid` (checkpoints of one run: more epochs cost training, not new runs). The highest score
    wins; ties go to the lr nearest the grid's (geometric) centre, then to fewer epochs, then to the point tried
    first, so an edge wins only by beating the inside. A choice on an edge extends the search, one point at a time,
    until it is inside on both axes or the axis has used its `max_extensions` points (a cap per axis, so an lr
    extension that loses does not use up the epochs'), the lr axis first: the smallest (largest) lr tried adds a run
    at the next lr down (up) by the grid's own spacing (a one-lr grid has no lr axis); a choice at the most epochs
    tried at its lr trains that same run one epoch more (successive halving: with ``epoch_grid=[1]`` every lr gets one
    epoch and only the winner trains on while dev improves). The model comes back with the chosen checkpoint's
    weights.
    """
    lrs = sorted(float(x) for x in lrs)
    epoch_grid = sorted(int(e) for e in epoch_grid)
    if not lrs or len(set(lrs)) != len(lrs) or lrs[0] <= 0:
        raise ValueError(f"lrs must be distinct positive numbers, got {lrs!r}")
    if not epoch_grid or len(set(epoch_grid)) != len(epoch_grid) or epoch_grid[0] < 1:
        raise ValueError(f"epoch_grid must be distinct ints >= 1, got {epoch_grid!r}")
    if max_extensions < 0:
        raise ValueError(f"max_extensions must be >= 0, got {max_extensions}")
    down = lrs[1] / lrs[0] if len(lrs) > 1 else 10.0
    up = lrs[-1] / lrs[-2] if len(lrs) > 1 else 10.0
    centre = sum(math.log(x) for x in lrs) / len(lrs)

    def rank(p: GridPoint) -> tuple:
        return p.score, -round(abs(math.log(p.lr) - centre), 9), -p.epochs

    grid: list[GridPoint] = []
    best: dict[str, Any] = {}  # point, model, state (the checkpoint's weights), log, run (alive while extendable)
    reached: dict[float, int] = {}  # lr -> epochs trained

    def consider(lr: float, epoch: int, model: Any, log: TrainLog, run: Any, extension: bool) -> None:
        point = GridPoint(lr, epoch, tuple(float(s) for s in dev_score(model)), extension)
        grid.append(point)
        if not best or rank(point) > rank(best["point"]):
            if best.get("run") is not None and best["run"] is not run:
                best["run"].close()
            best.update(point=point, model=model, state=_trainable_state(model), log=TrainLog(list(log.losses),
                        log.skipped), run=run)  # fmt: skip

    def run_lr(lr: float, extension: bool) -> None:
        run = start(lr)
        for epoch in range(1, epoch_grid[-1] + 1):
            model, log = next(run)
            if epoch in epoch_grid:
                consider(lr, epoch, model, log, run, extension)
        reached[lr] = epoch_grid[-1]
        if best["run"] is not run or best["point"].epochs != reached[lr]:
            run.close()  # keep a run alive only while its last epoch is the choice (it may be trained on)
            if best["run"] is run:
                best["run"] = None

    for lr in lrs:
        run_lr(lr, False)
    lr_extensions = epoch_extensions = 0
    while True:
        tried = sorted(reached)
        choice = best["point"]
        if len(tried) > 1 and choice.lr in (tried[0], tried[-1]) and lr_extensions < max_extensions:
            lr_extensions += 1
            run_lr(tried[0] / down if choice.lr == tried[0] else tried[-1] * up, True)
        elif best["run"] is not None and choice.epochs == reached[choice.lr] and epoch_extensions < max_extensions:
            epoch_extensions += 1
            run = best["run"]
            model, log = next(run)
            reached[choice.lr] += 1
            consider(choice.lr, reached[choice.lr], model, log, run, True)
            if best["point"].epochs != reached[choice.lr]:
                run.close()
                best["run"] = None
        else:
            break
    if best["run"] is not None:
        best["run"].close()
    model, choice = best["model"], best["point"]
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in best["state"]:
                p.copy_(best["state"][n])
    model.eval()
    tried = sorted(reached)
    epochs_here = sorted(p.epochs for p in grid if p.lr == choice.lr)
    return Recipe(
        lr=choice.lr,
        epochs=choice.epochs,
        score=choice.score,
        model=model,
        log=best["log"],
        grid=grid,
        lr_at_edge=len(tried) > 1 and choice.lr in (tried[0], tried[-1]),
        epochs_at_edge=choice.epochs == epochs_here[-1],
    )


# ------------------------------------------------------------------------------------------------- selection


def best_of_n_accuracy(scores: Sequence[float], correct: Sequence[bool]) -> float:
    """Expected accuracy of picking the top-scored candidate, ties broken uniformly at random."""
    if not scores or len(scores) != len(correct):
        raise ValueError(f"need one score per candidate, got {len(scores)} scores for {len(correct)} candidates")
    top = max(scores)
    tied = [bool(c) for s, c in zip(scores, correct, strict=True) if s == top]
    return sum(tied) / len(tied)


def distinct_pick_accuracy(texts: Sequence[Any], correct: Sequence[bool]) -> float:
    """Expected accuracy of a uniform pick among the distinct candidate `texts` (exact, not sampled).

    The trivial level of a top-1 scorer: any scorer gives identical texts identical scores, so it chooses among
    distinct texts, while a uniform pick among candidates (`random`) counts every copy of a repeated text (the
    error-free solution is the most repeated one). ``#distinct correct texts / #distinct texts``.
    """
    if not texts or len(texts) != len(correct):
        raise ValueError(f"need one text per candidate, got {len(texts)} texts for {len(correct)} flags")
    label: dict[Any, bool] = {}
    for t, c in zip(texts, correct, strict=True):
        if label.setdefault(t, bool(c)) != bool(c):
            raise ValueError(f"the same text {t!r} is labelled both correct and wrong")
    return sum(label.values()) / len(label)


def pair_accuracy(scores: Sequence[float], correct: Sequence[bool]) -> float | None:
    """Share of (correct, wrong) candidate pairs that `scores` order correctly, a tie counting 1/2 (the AUC within
    one problem); None when the candidates are not of both kinds."""
    if len(scores) != len(correct):
        raise ValueError(f"need one score per candidate, got {len(scores)} scores for {len(correct)} candidates")
    good = [float(s) for s, c in zip(scores, correct, strict=True) if c]
    bad = [float(s) for s, c in zip(scores, correct, strict=True) if not c]
    if not good or not bad:
        return None
    return sum(1.0 if g > b else 0.5 if g == b else 0.0 for g in good for b in bad) / (len(good) * len(bad))


def vote_accuracy(answers: Sequence[Any], correct: Sequence[bool], weights: Sequence[float] | None = None) -> float:
    """Expected accuracy of (weighted) majority vote over final answers, ties broken uniformly at random."""
    if not answers or len(answers) != len(correct):
        raise ValueError(f"need one answer per candidate, got {len(answers)} answers for {len(correct)} flags")
    w = [1.0] * len(answers) if weights is None else [float(x) for x in weights]
    total: dict[Any, float] = {}
    right: dict[Any, bool] = {}
    for a, c, x in zip(answers, correct, w, strict=True):
        total[a] = total.get(a, 0.0) + x
        right[a] = bool(c)
    top = max(total.values())
    tied = [a for a, v in total.items() if v == top]
    return sum(right[a] for a in tied) / len(tied)


def first_error_hit(step_drops: Sequence[float], first_error: int) -> float:
    """1.0 when the most negative of `step_drops` (over the operation steps) is at the true first wrong step."""
    vals = [float(v) for v in step_drops]
    if not 0 <= first_error < len(vals):
        raise ValueError(f"first_error {first_error} outside the {len(vals)} scored steps")
    return float(min(range(len(vals)), key=lambda i: vals[i]) == first_error)


# --------------------------------------------------------------------------------------------------- the PRM


class ImplicitPRM(CountingPRM):
    """An implicit PRM usable wherever lmlab takes a PRM (``score(question, steps) -> list[float]`` in [0, 1]).

    ``r_s = beta * sum_{t in step s} log pi_theta(y_t|y_<t) / pi_ref(y_t|y_<t)``; ``q_s = r_1 + ... + r_s``.

    Args:
        model: the base causal LM (pi_ref; never modified); tokenizer: its tokenizer.
        policy (`TopK`): the trained top-k copy (pi_theta's top blocks over the shared trunk).
        beta (`float`): the beta it was trained with.
        delimiter (`str`, defaults to ``"\\n"``): joins the steps into the response.
        template (`str`, defaults to ``"{question}\\n"``): the prompt text around the question.
        output (`str`, defaults to ``"value"``): what `score` returns: ``"value"`` = ``sigmoid(q_s)`` (the soft
            Q-value as a probability; CE trains ``sigmoid(r)`` to be P(correct)), ``"step"`` = ``sigmoid(r_s)``.
        base_model (`str`, *optional*): the spec `lmlab.core.inference.models.load_model` loads the base model from
        (needed
            by `save`).
    """

    name = "implicit"

    def __init__(self, model: Any, tokenizer: Any, policy: TopK, *, beta: float, delimiter: str = "\n",
                 template: str = "{question}\n", output: str = "value", base_model: str | None = None,
                 trunk: FrozenTrunk | None = None) -> None:  # fmt: skip
        super().__init__()
        if beta <= 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {', '.join(OUTPUTS)}, got {output!r}")
        if "{question}" not in template:
            raise ValueError(f"template must contain '{{question}}', got {template!r}")
        self.model, self.tokenizer, self.policy = model, tokenizer, policy
        self.trunk = trunk if trunk is not None else FrozenTrunk(model, policy.k)
        if self.trunk.k != policy.k or self.trunk.n_layers != policy.n_layers:
            raise ValueError(
                f"the policy holds the top {policy.k} of {policy.n_layers} blocks; the trunk does not match"
            )
        self.beta, self.delimiter, self.template, self.output, self.base_model = (
            float(beta), delimiter, template, output, base_model)  # fmt: skip
        self.policy.eval()
        self._flops_per_token = 2.0 * _flop_params(model) * (1 + policy.k / policy.n_layers)

    def prompt(self, question: str) -> str:
        return self.template.format(question=question)

    @torch.no_grad()
    def step_rewards_batch(self, questions: Sequence[str], steps: Sequence[Sequence[str]], *, batch_size: int = 16
                           ) -> list[torch.Tensor]:  # fmt: skip
        """The process rewards r_s of each (question, steps) row, (n_steps,) each."""
        prompts = [self.prompt(q) for q in questions]
        out: list[torch.Tensor] = []
        for pb in prepare(self.trunk, self.tokenizer, prompts, steps, delimiter=self.delimiter, batch_size=batch_size):
            pol = response_logps(self.policy, pb.cache, pb.enc)
            out += [r.cpu() for r in step_rewards_of(pol, pb.ref, pb.enc, self.beta)]
            self.flops += self._flops_per_token * float(pb.enc.batch.attention_mask.sum())
        return out

    def score_steps(self, question: str, steps: Sequence[str]) -> list[float]:
        """The raw process rewards ``r_s`` (unbounded; they sum to the outcome reward ``r``)."""
        return [float(v) for v in self.step_rewards_batch([question], [steps])[0]]

    def score(self, question: str, steps: Sequence[str]) -> list[float]:
        """The PRM interface: one value in [0, 1] per step (``sigmoid(q_s)`` or ``sigmoid(r_s)``, see `output`)."""
        self._count(steps)
        r = self.step_rewards_batch([question], [steps])[0]
        v = torch.cumsum(r, 0) if self.output == "value" else r
        return [float(x) for x in torch.sigmoid(v)]

    def response_score(self, question: str, steps: Sequence[str], aggregate_by: str = "min") -> float:
        """A response-level score: ``min`` / ``sum`` / ``last`` of the step rewards (sum = outcome reward)."""
        return aggregate(self.score_steps(question, steps), aggregate_by)

    def merged_policy(self) -> Any:
        """pi_theta as a full Hugging Face model (a copy; ``save_pretrained`` it to share the PRM's policy)."""
        import copy

        from lmlab.core.training.partial import merge_back

        return merge_back(copy.deepcopy(self.model), self.policy)

    def save(self, folder: str | Path) -> Path:
        """Write the PRM folder: ``implicit_prm.json`` (settings, base model) and the top-k weights (safetensors).

        The base model is not copied: `load_implicit_prm` loads it from `base_model` (an lmlab alias or folder).
        """
        from safetensors.torch import save_file

        if not self.base_model:
            raise ValueError("save needs base_model (the alias or folder load_model reads the base model from)")
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.policy.state_dict().items()}
        save_file(state, str(folder / WEIGHTS_FILE))
        meta = {
            "format_version": FORMAT_VERSION,
            "kind": "implicit_prm",
            "base_model": self.base_model,
            "k": self.policy.k,
            "n_layers": self.policy.n_layers,
            "beta": self.beta,
            "delimiter": self.delimiter,
            "template": self.template,
            "output": self.output,
        }
        (folder / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        return folder


def _flop_params(model: Any) -> int:
    from lmlab.core.inference.models import flop_params

    return flop_params(model)


def load_implicit_prm(folder: str | Path, *, model: Any = None, tokenizer: Any = None, device: str = "cpu",
                      dtype: str = "float32", output: str | None = None) -> ImplicitPRM:  # fmt: skip
    """Load a PRM folder written by `ImplicitPRM.save` (``--set prm=implicit:DIR`` resolves through here).

    Args:
        model, tokenizer (*optional*): the base model to use (default: ``load_model(base_model)`` from the folder).
        output (`str`, *optional*): override the saved `output` (``value`` or ``step``).
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg_path = folder / CONFIG_FILE
    if not cfg_path.is_file():
        raise ValueError(f"{folder} is not an implicit PRM folder: {CONFIG_FILE} is missing (write it with save)")
    meta = json.loads(cfg_path.read_text())
    if meta.get("kind") != "implicit_prm" or meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{cfg_path} is not an implicit PRM of format {FORMAT_VERSION}: {meta.get('kind')!r}")
    if model is None or tokenizer is None:
        from lmlab.core.inference.models import load_model

        model, tokenizer = load_model(meta["base_model"], device=device, dtype=dtype)
    trunk = FrozenTrunk(model, int(meta["k"]))
    if trunk.n_layers != meta["n_layers"]:
        raise ValueError(f"the base model has {trunk.n_layers} blocks, the PRM was trained on {meta['n_layers']}")
    policy = trunk.top_k()
    policy.load_state_dict(load_file(str(folder / WEIGHTS_FILE)))
    return ImplicitPRM(model, tokenizer, policy, beta=meta["beta"], delimiter=meta["delimiter"],
                       template=meta["template"], output=output or meta["output"], base_model=meta["base_model"],
                       trunk=trunk)  # fmt: skip


def train_implicit_prm(
    model: Any,
    tokenizer: Any,
    questions: Sequence[str],
    steps: Sequence[Sequence[str]],
    labels: Sequence[float],
    groups: Sequence[Any] | None = None,
    *,
    loss: str = "ce",
    beta: float = 0.05,
    k: int = 4,
    epochs: int = 2,
    lr: float = 1e-4,
    batch_size: int = 16,
    balance: str = "none",
    delimiter: str = "\n",
    template: str = "{question}\n",
    output: str = "value",
    base_model: str | None = None,
    seed: int = 0,
) -> ImplicitPRM:
    """Train an implicit PRM from outcome labels on your own model and data (one call).

    Args:
        questions, steps, labels: one row per response (its question, its steps, 1.0 if its final answer is
            correct); groups: question id per row (default: the question text), rows of one question consecutive.
        loss, beta, balance: see `train_implicit`; k: trainable top blocks (`lmlab.core.training.partial`).

    Example:
        >>> prm = train_implicit_prm(model, tok, qs, steps, labels, k=4, base_model="smollm2-135m")
        >>> prm.score_steps("Start with 3. Add 4.", ["3+4=7", "Answer: 7"])
    """
    if not (len(questions) == len(steps) == len(labels)):
        raise ValueError(f"got {len(questions)} questions, {len(steps)} step lists and {len(labels)} labels")
    groups = list(questions) if groups is None else list(groups)
    trunk = FrozenTrunk(model, k)
    prompts = [template.format(question=q) for q in questions]
    batches = prepare(trunk, tokenizer, prompts, steps, delimiter=delimiter, batch_size=batch_size, groups=groups)
    policy, _ = train_implicit(trunk, batches, [float(x) for x in labels], groups, loss=loss, beta=beta,
                               epochs=epochs, lr=lr, balance=balance, seed=seed)  # fmt: skip
    return ImplicitPRM(model, tokenizer, policy, beta=beta, delimiter=delimiter, template=template, output=output,
                       base_model=base_model, trunk=trunk)  # fmt: skip
