"""M_AP: the alignment-potential metric for preference-data selection (Huang et al., ICML 2025).

    M_AP(x, y_w, y_l) = |r_ex(y_w) - r_ex(y_l)| - |r_hat_theta(y_w) - r_hat_theta(y_l)|

"the gap from the current implicit margin to the target explicit margin" (paper, arXiv 2503.01864). The official
code (github.com/Hesse73/Alignment-Potential-Metric) computes it on dataset z-scores:

    rm_margin            = max(all_rm_scores) - min(all_rm_scores)                        (cal_logps.py)
    logp_margin_norm_abs = | mean_t log pi_theta(y_w,t | x, y_w,<t) - mean_t log pi_theta(y_l,t | x, y_l,<t) |
    score                = z(rm_margin) - w * z(logp_margin_norm_abs),  z(v) = (v - mean v) / std v  (ddof 0)
    keep                 = argsort(score)[-k:],  k = int(select_ratio * n)                 (metric_selection.py)

with the implicit reward the reference-free, length-normalised (SimPO-form) log-prob of the policy that is about to
be trained, beta dropped (the z-score removes it). ``w = 1`` is metric ``rm-logp``; ``rm-xlogp`` takes
``--logp_weight`` (2.5 in ``generation/process_dataset.py``). The code's baselines are ``rm_margin`` (score
``z(rm_margin)``: the largest explicit margins), ``logp_margin_norm_abs`` (score ``-z(|margin|)``: the smallest
implicit margins) and ``rand`` (``np.random.choice`` after ``np.random.seed(42)``).

The module also holds the CPU training kit the reproduction uses: pairs encoded once through a frozen trunk
and their response log-probs from the top k blocks with the LM head on response positions only
(`lmlab.core.training.pairs`:
`encode_pairs`, `response_logps`, `score_pairs`, re-exported here), and DPO / SimPO on a kept subset of them
(`train_preference`, losses from `lmlab.core.training.preference`). Everything here is pure: tensors and arrays in,
values out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch

from lmlab.core.training.pairs import (  # the generic pair kit, re-exported here (names kept importable)
    PairCache,
    PairScores,
    chat_texts,  # noqa: F401
    encode_pairs,  # noqa: F401
    format_pairs,
    response_logps,
    score_pairs,  # noqa: F401
    slice_cache,
)
from lmlab.core.training.partial import FrozenTrunk, TopK
from lmlab.core.training.preference import dpo_loss, pair_logps, simpo_loss

METRICS = ("rm-logp", "rm-xlogp", "rm_margin", "logp_margin_norm_abs")
REDUCTIONS = ("mean", "sum")
OBJECTIVES = ("dpo", "simpo")

T = TypeVar("T")


# ------------------------------------------------------------------------------------------------ the metric


def _finite_1d(x: Any, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} must be finite, got {int((~np.isfinite(a)).sum())} non-finite values")
    return a


def zscore(x: Any) -> np.ndarray:
    """Dataset z-score ``(x - mean) / std`` with the population std (numpy's ddof 0, as the official code).

    A constant vector (std 0, e.g. a pool of one pair) gives zeros: the code would divide by zero and get NaN.
    """
    a = _finite_1d(x, "values")
    sd = a.std()
    return np.zeros_like(a) if sd == 0 else (a - a.mean()) / sd


def rm_margin(all_rm_scores: Sequence[Sequence[float]]) -> np.ndarray:
    """Explicit margin per pair: ``max(all_rm_scores) - min(all_rm_scores)`` (``cal_logps.py``), shape (n,)."""
    rows = list(all_rm_scores)
    if not rows:
        raise ValueError("all_rm_scores is empty: need one list of reward scores per pair")
    out = []
    for i, r in enumerate(rows):
        r = np.asarray(r, dtype=np.float64).reshape(-1)
        if r.size < 2 or not np.isfinite(r).all():
            raise ValueError(f"pair {i}: all_rm_scores needs >= 2 finite reward scores, got {r.tolist()}")
        out.append(r.max() - r.min())
    return np.asarray(out)


def implicit_margin(chosen_logps: Any, rejected_logps: Any, *, signed: bool = False) -> np.ndarray:
    """Implicit margin per pair: ``|lp(y_w) - lp(y_l)|`` (``logp_margin_norm_abs``), or signed; shape (n,).

    Pass mean (length-normalised) log-probs for the code's metric, summed ones for the ``sum`` reduction.
    """
    c = _finite_1d(chosen_logps, "chosen_logps")
    r = _finite_1d(rejected_logps, "rejected_logps")
    if c.shape != r.shape:
        raise ValueError(f"chosen_logps {c.shape} and rejected_logps {r.shape} must have the same length")
    m = c - r
    return m if signed else np.abs(m)


def metric_scores(
    rm_margins: Any,
    implicit_margins: Any,
    metric: str = "rm-logp",
    *,
    logp_weight: float = 1.0,
) -> np.ndarray:
    """Selection score per pair for one of the code's metrics (higher = kept first), shape (n,).

    ``rm-logp``: ``z(rm) - z(imp)`` (M_AP); ``rm-xlogp``: ``z(rm) - w z(imp)``; ``rm_margin``: ``z(rm)``
    (explicit-only); ``logp_margin_norm_abs``: ``-z(imp)`` (implicit-only: smallest implicit margins first).
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    if not (isinstance(logp_weight, (int, float)) and math.isfinite(logp_weight) and logp_weight >= 0):
        raise ValueError(f"logp_weight must be a finite number >= 0, got {logp_weight!r}")
    rm = _finite_1d(rm_margins, "rm_margins")
    imp = _finite_1d(implicit_margins, "implicit_margins")
    if rm.shape != imp.shape:
        raise ValueError(f"rm_margins {rm.shape} and implicit_margins {imp.shape} must have the same length")
    z_rm, z_imp = zscore(rm), zscore(imp)
    if metric == "rm-logp":
        return z_rm - z_imp
    if metric == "rm-xlogp":
        return z_rm - float(logp_weight) * z_imp
    if metric == "rm_margin":
        return z_rm
    return -z_imp


def map_score(rm_margins: Any, implicit_margins: Any, *, w: float = 1.0) -> np.ndarray:
    """M_AP per pair: ``z(rm_margin) - w * z(implicit_margin)``, shape (n,) (metric ``rm-xlogp``; ``rm-logp`` at 1)."""
    return metric_scores(rm_margins, implicit_margins, "rm-xlogp", logp_weight=w)


def select_size(n: int, ratio: float) -> int:
    """``int(ratio * n)`` as the code's ``select_size``, but at least one pair (the code would keep none)."""
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"the pool must hold at least one pair, got n={n!r}")
    if not 0 < ratio <= 1:
        raise ValueError(f"ratio must be in (0, 1], got {ratio!r}")
    return max(1, int(ratio * n))


def top_k_indices(scores: Any, k: int) -> np.ndarray:
    """Indices of the k highest scores as the code returns them: ``np.argsort(scores)[-k:]`` (ascending score)."""
    s = _finite_1d(scores, "scores")
    if not isinstance(k, (int, np.integer)) or not 1 <= k <= s.size:
        raise ValueError(f"k must be an int in [1, {s.size}], got {k!r}")
    return np.argsort(s)[-k:]


def random_indices(n: int, k: int, seed: int = 42) -> np.ndarray:
    """The code's random baseline: ``np.random.seed(seed); np.random.choice(n, k, replace=False)`` (same draws)."""
    if not isinstance(k, (int, np.integer)) or not 1 <= k <= n:
        raise ValueError(f"k must be an int in [1, {n}], got {k!r}")
    return np.random.RandomState(seed).choice(n, k, replace=False)


def select(dataset: Sequence[T], scores: Any, ratio: float = 0.4) -> tuple[list[T], np.ndarray]:
    """Keep the top ``int(ratio * len(dataset))`` items by `scores`: ``(subset, indices)`` (code's order)."""
    items = list(dataset)
    s = _finite_1d(scores, "scores")
    if len(items) != s.size:
        raise ValueError(f"got {len(items)} items but {s.size} scores")
    idx = top_k_indices(s, select_size(len(items), ratio))
    return [items[i] for i in idx], idx


@dataclass
class MAPScores:
    """M_AP of a preference set and its parts, each shape (n,).

    Attributes:
        score: ``z(rm_margin) - w z(implicit_margin)``; rm_margin, implicit_margin: the raw margins;
        z_rm, z_implicit: their z-scores; chosen_logps, rejected_logps: the policy's (mean or summed) log-probs.
    """

    score: np.ndarray
    rm_margin: np.ndarray
    implicit_margin: np.ndarray
    z_rm: np.ndarray
    z_implicit: np.ndarray
    chosen_logps: np.ndarray
    rejected_logps: np.ndarray


def map_from_logps(
    all_rm_scores: Sequence[Sequence[float]],
    chosen_logps: Any,
    rejected_logps: Any,
    *,
    w: float = 1.0,
    signed: bool = False,
) -> MAPScores:
    """`MAPScores` from reward scores and already computed policy log-probs of the chosen and rejected responses."""
    rm = rm_margin(all_rm_scores)
    imp = implicit_margin(chosen_logps, rejected_logps, signed=signed)
    if rm.shape != imp.shape:
        raise ValueError(f"got {rm.size} reward-score rows but {imp.size} log-prob pairs")
    return MAPScores(
        map_score(rm, imp, w=w),
        rm,
        imp,
        zscore(rm),
        zscore(imp),
        np.asarray(chosen_logps, float),
        np.asarray(rejected_logps, float),
    )


@torch.no_grad()
def alignment_potential(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    chosen: Sequence[str],
    rejected: Sequence[str],
    all_rm_scores: Sequence[Sequence[float]],
    *,
    w: float = 1.0,
    signed: bool = False,
    reduction: str = "mean",
    chat: bool | None = None,
    system: str | None = "",
    batch_size: int = 8,
) -> MAPScores:
    """M_AP of each pair under the policy `model` that is about to be trained (``cal_logps.py`` + the metric).

    ``M_AP = z(max(rm) - min(rm)) - w * z(|lp(y_w) - lp(y_l)|)``, lp the mean (``reduction="mean"``, the code's)
    or summed response log-prob of the chat-templated pair (paper: https://arxiv.org/abs/2503.01864).

    Args:
        model, tokenizer: any Hugging Face causal LM (the policy before training, not another model).
        prompts, chosen, rejected (`Sequence[str]`): the preference pairs (plain user prompt, response texts).
        all_rm_scores (`Sequence[Sequence[float]]`): explicit reward scores per pair (>= 2 each; for a binarised
            pair pass ``[r(chosen), r(rejected)]``).
        w (`float`, *optional*, defaults to `1.0`): weight of the implicit term (``rm-xlogp``'s ``--logp_weight``).
        signed (`bool`, *optional*, defaults to `False`): signed implicit margin instead of its absolute value.
        reduction (`str`, *optional*, defaults to ``"mean"``): ``"mean"`` (length-normalised) or ``"sum"``.
        chat (`bool`, *optional*): apply the chat template; default: when the tokenizer has one.
        system (`str`, *optional*, defaults to ``""``): system turn of the template (`chat_texts`); None keeps the
            template's default system prompt.
        batch_size (`int`, *optional*, defaults to `8`): pairs per forward pass.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    ps, cs, rs = list(prompts), list(chosen), list(rejected)
    if not ps:
        raise ValueError("no preference pairs: prompts, chosen and rejected are empty")
    if not len(ps) == len(cs) == len(rs) == len(all_rm_scores):
        raise ValueError(
            f"got {len(ps)} prompts, {len(cs)} chosen, {len(rs)} rejected and {len(all_rm_scores)} reward rows"
        )
    ps, cs, rs = format_pairs(tokenizer, ps, cs, rs, chat=chat, system=system)
    lc, lr = [], []
    for s in range(0, len(ps), batch_size):
        out = pair_logps(
            model,
            tokenizer,
            ps[s : s + batch_size],
            cs[s : s + batch_size],
            rs[s : s + batch_size],
            chat=False,  # already templated by format_pairs
            padding_side="left",
        )
        pick = (lambda x: x.mean) if reduction == "mean" else (lambda x: x.sum)
        lc.append(pick(out.chosen).double().cpu())
        lr.append(pick(out.rejected).double().cpu())
    return map_from_logps(all_rm_scores, torch.cat(lc).numpy(), torch.cat(lr).numpy(), w=w, signed=signed)


# --------------------------------------------------------------------------------- cached-trunk training kit


@dataclass
class PreferenceTrainResult:
    """A trained policy (`TopK` over the trunk) and its per-step losses."""

    policy: TopK
    losses: list[float] = field(default_factory=list)
    steps: int = 0


def _lr_multiplier(step: int, steps: int, warmup: int) -> float:
    """Linear warm-up then cosine decay to 0 (the SimPO recipe's ``lr_scheduler_type: cosine``)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def train_preference(
    trunk: FrozenTrunk,
    pairs: PairCache,
    pair_idx: Any,
    *,
    objective: str = "dpo",
    ref: PairScores | None = None,
    beta: float = 0.1,
    gamma: float = 0.0,
    lr: float = 1e-5,
    epochs: int = 1,
    batch_size: int = 4,
    warmup_ratio: float = 0.1,
    max_grad_norm: float = 1.0,
    weight: Any = None,
    seed: int = 0,
    callback: Callable[[int, float], None] | None = None,
) -> PreferenceTrainResult:
    """DPO or SimPO on the pairs `pair_idx` of `pairs`, training a fresh copy of the trunk's top k blocks.

    DPO: ``-logsig(beta * ((pc - rc) - (pr - rr)))`` with summed log-probs and the frozen reference's precomputed
    `ref` (``precompute_ref_log_probs``); SimPO: ``-logsig(beta * (pc/|y_w| - pr/|y_l|) - gamma)``, no reference.
    AdamW, linear warm-up + cosine decay, gradient-norm clip, pairs reshuffled each epoch from `seed`.

    Args:
        trunk (`FrozenTrunk`): the trunk `pairs` was encoded with; its top k blocks are copied, never modified.
        pair_idx: indices of the kept pairs (a selection).
        weight: optional per-pair weights aligned with `pairs` (shape (n_pairs,)), e.g. M_AP-derived ones.
        callback: called as ``callback(step, loss)`` after every step (progress, logging).
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    idx = np.asarray(pair_idx, dtype=np.int64).reshape(-1)
    if idx.size == 0:
        raise ValueError("pair_idx is empty: a selection must keep at least one pair")
    if idx.min() < 0 or idx.max() >= pairs.n_pairs:
        raise ValueError(
            f"pair_idx must index the {pairs.n_pairs} encoded pairs, got values in [{idx.min()}, {idx.max()}]"
        )
    if objective == "dpo" and ref is None:
        raise ValueError("objective='dpo' needs the reference's PairScores (ref=score_pairs(trunk.reference, pairs))")
    for name, v, lo in (("epochs", epochs, 1), ("batch_size", batch_size, 1)):
        if not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    w_all = None if weight is None else torch.as_tensor(np.asarray(weight, dtype=np.float32))
    if w_all is not None and w_all.shape != (pairs.n_pairs,):
        raise ValueError(f"weight must have one value per encoded pair ({pairs.n_pairs},), got {tuple(w_all.shape)}")
    policy = trunk.top_k()
    opt = torch.optim.AdamW(list(policy.trainable_parameters()), lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(int(seed))
    per_epoch = math.ceil(idx.size / batch_size)
    steps = epochs * per_epoch
    warmup = int(round(warmup_ratio * steps))
    result = PreferenceTrainResult(policy)
    step = 0
    for _ in range(epochs):
        order = idx[torch.randperm(idx.size, generator=gen).numpy()]
        for s in range(0, order.size, batch_size):
            b = order[s : s + batch_size]
            rows = pairs.rows(b)
            out = response_logps(policy, slice_cache(pairs.cache, rows), pairs.response_mask.index_select(0, rows))
            h = b.size
            pc, pr = out.sum[:h], out.sum[h:]
            w = None if w_all is None else w_all[torch.as_tensor(b)]
            if objective == "dpo":
                rc = torch.as_tensor(ref.chosen_sum[b], dtype=pc.dtype)  # type: ignore[union-attr]
                rr = torch.as_tensor(ref.rejected_sum[b], dtype=pc.dtype)  # type: ignore[union-attr]
                loss = dpo_loss(pc, pr, rc, rr, beta=beta, weight=w)
            else:
                lc, lr_ = out.n_tokens[:h].to(pc.dtype), out.n_tokens[h:].to(pc.dtype)
                loss = simpo_loss(pc, pr, lc, lr_, beta=beta, gamma=gamma, weight=w)
            for g in opt.param_groups:
                g["lr"] = lr * _lr_multiplier(step, steps, warmup)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(list(policy.trainable_parameters()), max_grad_norm)
            opt.step()
            result.losses.append(float(loss.detach()))
            step += 1
            if callback is not None:
                callback(step, result.losses[-1])
    result.steps = step
    policy.eval()
    return result


def preference_accuracy(margin: Any) -> np.ndarray:
    """Per-pair accuracy of a reward margin ``r(preferred) - r(other)``: 1 if > 0, 0.5 if exactly 0, else 0."""
    m = _finite_1d(margin, "margin")
    return np.where(m > 0, 1.0, np.where(m == 0, 0.5, 0.0))


def reward_margins(scores: PairScores, objective: str, ref: PairScores | None = None) -> np.ndarray:
    """Implicit-reward margin (first minus second response of each pair) of a policy for its objective, (n,).

    DPO: ``(pc - rc) - (pr - rr)`` of summed log-probs (beta > 0 does not change the sign); SimPO: ``pc/|y_w| -
    pr/|y_l|`` (its reference-free reward).
    """
    if objective == "dpo":
        if ref is None:
            raise ValueError("the DPO reward margin needs the reference's PairScores")
        return (scores.chosen_sum - ref.chosen_sum) - (scores.rejected_sum - ref.rejected_sum)
    if objective == "simpo":
        return scores.chosen_mean - scores.rejected_mean
    raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
