"""PLE: Progressively Label Enhancement for LLM alignment (Liu, Xu and Geng, ICML 2025, arXiv 2408.02599).

Algorithm 1 of the paper, with the loss details the paper leaves open marked [verify]:

    SFT pi_theta on D_sft
    tau_0 = 0.2
    for i = 0 .. I-1:
        for a batch of queries x (fresh each iteration: on-policy):
            y   ~ pi_theta(. | x)            y^p ~ pi_theta(. | p (+) x)          (p: the principle)
            r   = R~(x, y)                   r^p = R~(x, y^p)                    (normalised rewards)
            if r^p - r > tau_i:  L = L_rank(y^p > y | x)                          (ranking loss)
            else:                L = w^p L_sft(y^p | x) + w L_sft(y | x),  (w^p, w) = softmax(r^p, r)
        tau_{i+1} = alpha * tau_i                                                  (alpha = 0.9)

Both branches train pi_theta conditioned on the *plain* x: the principle is distilled into the unprompted policy.

- ``L_rank`` [verify]: the pairwise PRO / RRHF loss on length-normalised log-probs
  ``-logsig(beta (s(y^p) - s(y)))``, ``s(y) = (1/|y|) log pi(y|x)`` (`lmlab.core.training.preference.ranking_loss`),
  plus
  ``rank_sft_weight`` times the SFT loss of y^p, as RRHF and PRO add to their ranking term.
- ``L_sft`` is `lmlab.core.training.preference.weighted_sft_loss` (per-token NLL) with the softmax weights above.
- The case ``r - r^p > tau`` (the plain answer better) is not specified; ``reverse_case="wsft"`` (the literal
  reading of Algorithm 1: not above the threshold, so weighted SFT) or ``"rank"`` (rank y over y^p).
- Rewards are normalised per batch (``reward_norm``; the threshold is meaningful only on normalised rewards).
- ``threshold_schedule``: ``"geometric"`` (tau_i = tau_0 alpha^i, the paper), ``"fixed"`` (tau_i = tau_0, the
  "PLE without the progressive part" ablation) or ``"ema"`` (tau_{i+1} = alpha tau_i + (1 - alpha) mean gap_i).

Baselines run through the same online loop, on the same queries, generations at iteration 0, steps and seeds:

- ``raft``: RAFT (Dong et al. 2023): SFT on the higher-reward response of the pair (best of the two candidates);
- ``always_rank_dpo``: DPO (`lmlab.core.training.preference.dpo_loss`, the SFT policy as reference) on y^p > y for
every
  pair, no threshold;
- ``ple_fixed``: PLE with a constant threshold; ``ple_rank_only``: PLE's ranking loss on every pair.

Training is the CPU recipe of the alignment area: a frozen trunk whose outputs are cached once per batch
(`lmlab.core.training.partial.FrozenTrunk`), the top k blocks trained (`TopK`). Pure: no I/O, no printing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lmlab.core.training.pairs import (
    PairCache,
    encode_pairs,
    format_pairs,
    policy_model,
    response_logps,
    score_pairs,
    slice_cache,
)
from lmlab.core.training.partial import FrozenTrunk, TopK, TrunkCache
from lmlab.core.training.preference import SeqLogps, build_response_batch, dpo_loss, ranking_loss, weighted_sft_loss

SYSTEMS = ("ple", "ple_fixed", "ple_rank_only", "raft", "always_rank_dpo")
SCHEDULES = ("geometric", "fixed", "ema")
REVERSE_CASES = ("wsft", "rank")
REWARD_NORMS = ("batch_z", "minmax", "none")
RANK_KINDS = ("pro", "rrhf")

# route codes of a pair
RANK, WSFT, RANK_REV = 0, 1, 2
ROUTE_NAMES = {RANK: "rank", WSFT: "wsft", RANK_REV: "rank_rev"}


# ------------------------------------------------------------------------------------------ the PLE decisions


def _vec(x: Any, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    if a.size == 0:
        raise ValueError(f"{name} is empty: need at least one reward")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} must be finite, got {int((~np.isfinite(a)).sum())} non-finite values")
    return a


def normalize_rewards(r_plain: Any, r_guided: Any, mode: str = "batch_z") -> tuple[np.ndarray, np.ndarray]:
    """Normalise a batch's rewards jointly over both responses of every pair, shapes (B,) each.

    ``batch_z``: ``(r - mean) / std`` over the 2B rewards (population std; a constant batch gives zeros);
    ``minmax``: ``(r - min) / (max - min)`` into [0, 1]; ``none``: unchanged.
    """
    if mode not in REWARD_NORMS:
        raise ValueError(f"reward_norm must be one of {', '.join(REWARD_NORMS)}, got {mode!r}")
    a, b = _vec(r_plain, "r_plain"), _vec(r_guided, "r_guided")
    if a.shape != b.shape:
        raise ValueError(f"r_plain {a.shape} and r_guided {b.shape} must have one reward per pair each")
    if mode == "none":
        return a, b
    both = np.concatenate([a, b])
    if mode == "batch_z":
        sd = both.std()
        return (np.zeros_like(a), np.zeros_like(b)) if sd == 0 else ((a - both.mean()) / sd, (b - both.mean()) / sd)
    lo, span = both.min(), both.max() - both.min()
    return (np.zeros_like(a), np.zeros_like(b)) if span == 0 else ((a - lo) / span, (b - lo) / span)


def threshold_at(i: int, tau0: float, alpha: float, schedule: str = "geometric") -> float:
    """tau_i of the closed-form schedules: ``tau0 * alpha**i`` (geometric) or ``tau0`` (fixed)."""
    if schedule == "geometric":
        return float(tau0) * float(alpha) ** int(i)
    if schedule == "fixed":
        return float(tau0)
    raise ValueError(
        f"schedule must be 'geometric' or 'fixed' here ('ema' needs the gaps: next_threshold), got {schedule!r}"
    )


def next_threshold(tau: float, gaps: Any, *, schedule: str = "geometric", alpha: float = 0.9) -> float:
    """tau_{i+1} from tau_i and iteration i's normalised gaps ``r^p - r`` (used by ``ema`` only)."""
    if schedule == "geometric":
        return alpha * tau
    if schedule == "fixed":
        return tau
    if schedule == "ema":
        return alpha * tau + (1.0 - alpha) * float(_vec(gaps, "gaps").mean())
    raise ValueError(f"threshold_schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")


def route_pairs(gaps: Any, tau: float, *, reverse_case: str = "wsft") -> np.ndarray:
    """Route code per pair: RANK if ``r^p - r > tau``; RANK_REV if ``r - r^p > tau`` and ``reverse_case="rank"``;
    otherwise WSFT. Shape (B,), int."""
    if reverse_case not in REVERSE_CASES:
        raise ValueError(f"reverse_case must be one of {', '.join(REVERSE_CASES)}, got {reverse_case!r}")
    g = _vec(gaps, "gaps")
    out = np.full(g.shape, WSFT, dtype=np.int64)
    out[g > tau] = RANK
    if reverse_case == "rank":
        out[-g > tau] = RANK_REV
    return out


def wsft_weights(rn_guided: Any, rn_plain: Any, temperature: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """``(w^p, w) = softmax(r^p / T, r / T)`` per pair (each row sums to 1), shapes (B,) each."""
    if not temperature > 0:
        raise ValueError(f"wsft_temperature must be > 0, got {temperature}")
    g, p = _vec(rn_guided, "rn_guided") / temperature, _vec(rn_plain, "rn_plain") / temperature
    m = np.maximum(g, p)
    eg, ep = np.exp(g - m), np.exp(p - m)
    return eg / (eg + ep), ep / (eg + ep)


# ----------------------------------------------------------------------------------------------- the losses


def _rows(seq: SeqLogps, sl: slice) -> SeqLogps:
    return SeqLogps(seq.token_logps[sl], seq.mask[sl], seq.sum[sl], seq.mean[sl], seq.n_tokens[sl])


def _nll(seq: SeqLogps) -> torch.Tensor:
    """Per-row mean-token NLL (batch,)."""
    return weighted_sft_loss(seq.token_logps, seq.mask, reduction="none")


def ple_pair_loss(
    guided: SeqLogps,
    plain: SeqLogps,
    routes: Any,
    w_guided: Any,
    w_plain: Any,
    *,
    rank_kind: str = "pro",
    rank_beta: float = 1.0,
    rank_sft_weight: float = 1.0,
) -> torch.Tensor:
    """PLE's loss per pair (B,), both responses scored under the plain query.

    RANK: ``L_rank([s(y^p), s(y)]) + c * NLL(y^p)``; RANK_REV: ``L_rank([s(y), s(y^p)]) + c * NLL(y)``;
    WSFT: ``w^p NLL(y^p) + w NLL(y)``; s the mean response log-prob, c = `rank_sft_weight`.
    """
    if rank_kind not in RANK_KINDS:
        raise ValueError(f"rank_kind must be one of {', '.join(RANK_KINDS)}, got {rank_kind!r}")
    r = torch.as_tensor(np.asarray(routes), dtype=torch.long)
    b = guided.mean.shape[0]
    if r.shape != (b,) or plain.mean.shape != (b,):
        raise ValueError(f"routes {tuple(r.shape)}, guided ({b},) and plain {tuple(plain.mean.shape)} must match")
    dt = guided.mean.dtype
    wg, wp = torch.as_tensor(np.asarray(w_guided), dtype=dt), torch.as_tensor(np.asarray(w_plain), dtype=dt)
    nll_g, nll_p = _nll(guided), _nll(plain)  # (B,)
    fwd = ranking_loss(torch.stack([guided.mean, plain.mean], -1), kind=rank_kind, beta=rank_beta, reduction="none")
    rev = ranking_loss(torch.stack([plain.mean, guided.mean], -1), kind=rank_kind, beta=rank_beta, reduction="none")
    rank = fwd + rank_sft_weight * nll_g
    rank_rev = rev + rank_sft_weight * nll_p
    wsft = wg * nll_g + wp * nll_p
    return torch.where(r == RANK, rank, torch.where(r == RANK_REV, rank_rev, wsft))


def raft_pair_loss(guided: SeqLogps, plain: SeqLogps, r_guided: Any, r_plain: Any) -> torch.Tensor:
    """RAFT's loss per pair (B,): the NLL of the higher-reward response (y^p on a tie)."""
    take_g = torch.as_tensor(np.asarray(r_guided) >= np.asarray(r_plain))
    return torch.where(take_g, _nll(guided), _nll(plain))


def dpo_pair_loss(guided: SeqLogps, plain: SeqLogps, ref_guided: Any, ref_plain: Any, *, beta: float) -> torch.Tensor:
    """Always-rank DPO per pair (B,): ``-logsig(beta ((pi(y^p) - ref(y^p)) - (pi(y) - ref(y))))``, summed log-probs."""
    dt = guided.sum.dtype
    rg, rp = torch.as_tensor(np.asarray(ref_guided), dtype=dt), torch.as_tensor(np.asarray(ref_plain), dtype=dt)
    return dpo_loss(guided.sum, plain.sum, rg, rp, beta=beta, reduction="none")


# ---------------------------------------------------------------------------------------- the training kit


@dataclass
class RowCache:
    """Single responses run once through a frozen trunk (left-padded): the cache and the response mask (n, T)."""

    cache: TrunkCache
    response_mask: torch.Tensor
    n: int


def encode_rows(
    trunk: FrozenTrunk,
    tokenizer: Any,
    prompts: Sequence[str],
    responses: Sequence[str],
    *,
    chat: bool | None = None,
    system: str | None = None,
) -> RowCache:
    """Template (prompt, response) rows as `lmlab.core.training.pairs.format_pairs` does and cache the trunk."""
    if not len(prompts):
        raise ValueError("no rows to encode: prompts is empty")
    heads, tails, _ = format_pairs(tokenizer, prompts, responses, responses, chat=chat, system=system)
    batch = build_response_batch(tokenizer, heads, tails, chat=False, padding_side="left")
    with torch.no_grad():
        cache = trunk(batch.input_ids, batch.attention_mask, batch.position_ids)
    return RowCache(cache, batch.response_mask, len(heads))


def prompt_heads(tokenizer: Any, prompts: Sequence[str], *, chat: bool | None = None, system: str | None = None):
    """The templated prompt texts (generation prompt included) that training scores responses after."""
    dummy = ["."] * len(prompts)
    return format_pairs(tokenizer, prompts, dummy, dummy, chat=chat, system=system)[0]


@torch.no_grad()
def row_logps(policy: TopK, rows: RowCache, *, batch_size: int = 16) -> SeqLogps:
    """Response log-probs of every cached row under `policy` (no grad), a `SeqLogps` of n rows."""
    parts = []
    was = policy.training
    policy.eval()
    for s in range(0, rows.n, batch_size):
        idx = torch.arange(s, min(rows.n, s + batch_size))
        parts.append(response_logps(policy, slice_cache(rows.cache, idx), rows.response_mask.index_select(0, idx)))
    policy.train(was)
    return SeqLogps(*(torch.cat([getattr(p, f) for p in parts]) for f in ("token_logps", "mask", "sum", "mean",
                                                                              "n_tokens")))  # fmt: skip


def fit(
    policy: TopK,
    opt: torch.optim.Optimizer,
    cache: TrunkCache,
    response_mask: torch.Tensor,
    n_units: int,
    rows_of: Callable[[np.ndarray], np.ndarray],
    loss_of: Callable[[np.ndarray, SeqLogps], torch.Tensor],
    *,
    epochs: int,
    batch_size: int,
    seed: int,
    max_grad_norm: float = 1.0,
) -> list[float]:
    """Minibatch training over `n_units` units (rows or pairs), reshuffled each epoch from `seed`.

    `rows_of(units)` gives the cache rows of a minibatch of units, `loss_of(units, seq)` the per-unit loss (b,)
    from their `SeqLogps`; the step minimises its mean. Returns the per-step losses.
    """
    if n_units < 1:
        raise ValueError("nothing to train on: no units")
    gen = torch.Generator().manual_seed(int(seed))
    params = list(policy.trainable_parameters())
    losses = []
    policy.train()
    for _ in range(epochs):
        order = torch.randperm(n_units, generator=gen).numpy()
        for s in range(0, n_units, batch_size):
            units = order[s : s + batch_size]
            rows = torch.as_tensor(rows_of(units), dtype=torch.long)
            seq = response_logps(policy, slice_cache(cache, rows), response_mask.index_select(0, rows))
            loss = loss_of(units, seq).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            opt.step()
            losses.append(float(loss.detach()))
    policy.eval()
    return losses


def clone_policy(trunk: FrozenTrunk, policy: TopK | None) -> TopK:
    """A fresh trainable copy of `policy` (or of the model's own top blocks when None), sharing the frozen head."""
    new = trunk.top_k()
    if policy is not None:
        new.load_state_dict(policy.state_dict())
    return new


def sft_train(
    trunk: FrozenTrunk,
    tokenizer: Any,
    prompts: Sequence[str],
    responses: Sequence[str],
    *,
    lr: float = 5e-5,
    epochs: int = 1,
    batch_size: int = 8,
    max_grad_norm: float = 1.0,
    seed: int = 0,
    chat: bool | None = None,
    system: str | None = None,
) -> tuple[TopK, list[float]]:
    """Step 1 of Algorithm 1: SFT (mean-token NLL) of a fresh copy of the top k blocks on D_sft."""
    if len(prompts) != len(responses):
        raise ValueError(f"got {len(prompts)} SFT prompts but {len(responses)} responses")
    rows = encode_rows(trunk, tokenizer, prompts, responses, chat=chat, system=system)
    policy = clone_policy(trunk, None)
    opt = torch.optim.AdamW(list(policy.trainable_parameters()), lr=lr, weight_decay=0.0)
    losses = fit(policy, opt, rows.cache, rows.response_mask, rows.n, lambda u: u, lambda u, s: _nll(s),
                 epochs=epochs, batch_size=batch_size, seed=seed, max_grad_norm=max_grad_norm)  # fmt: skip
    return policy, losses


# ------------------------------------------------------------------------------------------- generation


class PolicyGenerator:
    """Generates responses of a `TopK` policy over the model's frozen trunk, batched, with a per-run cache.

    The policy's blocks are put into a memory-light full model (`lmlab.core.training.pairs.policy_model`: the trunk
    modules shared, only the top blocks copied) and decoded with `lmlab.core.inference.generation.decode_batch` (the
    fast
    engine where it supports the model). A request is cached under ``(tag, prompts, sampling settings, seed)``:
    the caller names the policy's state by `tag` (e.g. ``"sft"``), so systems that start from the same policy
    share its first-iteration generations and nothing is decoded twice.

    Args:
        model, tokenizer: the HF model whose trunk the policies extend.
        max_new_tokens (`int`): response budget; batch_size (`int`): prompts decoded together.
        stop_strings (`Sequence[str]`): end a response at one of these (cut before it).
        engine (`str`, *optional*): ``"fast"``, ``"fast-int4"`` or ``"hf"`` (default: the process default).
        meter: an optional `ComputeMeter`.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_new_tokens: int = 20,
        batch_size: int = 16,
        stop_strings: Sequence[str] = ("\n",),
        engine: str | None = None,
        meter: Any = None,
    ) -> None:
        if max_new_tokens < 1 or batch_size < 1:
            raise ValueError(f"max_new_tokens and batch_size must be >= 1, got {max_new_tokens}, {batch_size}")
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.batch_size = int(max_new_tokens), int(batch_size)
        self.stop_strings, self.engine, self.meter = tuple(stop_strings), engine, meter
        self.cache: dict[tuple, list[str]] = {}
        self.generated_tokens = 0
        self.calls = 0

    def __call__(
        self,
        policy: TopK | None,
        heads: Sequence[str],
        *,
        tag: str,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> list[str]:
        """Responses to the templated prompts `heads` (`prompt_heads`) under `policy` (None: the model itself)."""
        from lmlab.core.inference.generation import decode_batch

        heads = list(heads)
        key = (tag, tuple(heads), bool(do_sample), float(temperature) if do_sample else 0.0,
               float(top_p) if do_sample else 1.0, int(seed) if do_sample else 0, self.max_new_tokens)  # fmt: skip
        if key in self.cache:
            return list(self.cache[key])
        full = self.model if policy is None else policy_model(self.model, policy)
        outs = decode_batch(full, self.tokenizer, heads, max_new_tokens=self.max_new_tokens, do_sample=do_sample,
                            temperature=temperature, top_p=top_p, stop_strings=self.stop_strings, seed=seed,
                            batch_size=self.batch_size, meter=self.meter, engine=self.engine)  # fmt: skip
        texts = [o.text.strip() for o in outs]
        self.generated_tokens += sum(o.n_tokens for o in outs)
        self.calls += 1
        self.cache[key] = texts
        return list(texts)


# ------------------------------------------------------------------------------------------ the online loop


@dataclass
class PLEOptions:
    """PLE's knobs (paper values where it gives them) and the shared training / generation budget.

    Args:
        tau0 (`float`, defaults to 0.2): initial threshold on normalised rewards [paper].
        alpha (`float`, defaults to 0.9): decay factor [paper].
        iterations (`int`, defaults to 3): I, iterations of generate -> score -> train.
        queries_per_iter (`int`, defaults to 16): queries per iteration (fresh ones each iteration).
        threshold_schedule (`str`, defaults to ``"geometric"``): ``geometric``, ``fixed`` or ``ema``.
        reverse_case (`str`, defaults to ``"wsft"``): the plain answer better by > tau: ``wsft`` or ``rank``.
        reward_norm (`str`, defaults to ``"batch_z"``): ``batch_z``, ``minmax`` or ``none``.
        rank_kind (`str`, defaults to ``"pro"``), rank_beta (1.0), rank_sft_weight (1.0): the ranking branch.
        wsft_temperature (`float`, defaults to 1.0): softmax temperature of the weighted-SFT weights.
        dpo_beta (`float`, defaults to 0.1): beta of the always-rank DPO baseline.
        lr (5e-5), epochs (2), train_batch (4), max_grad_norm (1.0): AdamW training per iteration.
        do_sample (True), temperature (0.7), top_p (0.9): how training responses are generated.
    """

    tau0: float = 0.2
    alpha: float = 0.9
    iterations: int = 3
    queries_per_iter: int = 16
    threshold_schedule: str = "geometric"
    reverse_case: str = "wsft"
    reward_norm: str = "batch_z"
    rank_kind: str = "pro"
    rank_beta: float = 1.0
    rank_sft_weight: float = 1.0
    wsft_temperature: float = 1.0
    dpo_beta: float = 0.1
    lr: float = 5e-5
    epochs: int = 2
    train_batch: int = 4
    max_grad_norm: float = 1.0
    do_sample: bool = True
    temperature: float = 0.7
    top_p: float = 0.9

    def __post_init__(self) -> None:
        checks = (("tau0", self.tau0, -math.inf), ("alpha", self.alpha, 0.0), ("rank_beta", self.rank_beta, 0.0),
                  ("wsft_temperature", self.wsft_temperature, 0.0), ("dpo_beta", self.dpo_beta, 0.0),
                  ("lr", self.lr, 0.0), ("temperature", self.temperature, 0.0))  # fmt: skip
        for name, v, lo in checks:
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > lo):
                raise ValueError(f"{name} must be a finite number > {lo}, got {v!r}")
        if self.alpha > 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        for name, v in (("iterations", self.iterations), ("queries_per_iter", self.queries_per_iter),
                        ("epochs", self.epochs), ("train_batch", self.train_batch)):  # fmt: skip
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        for name, v, allowed in (("threshold_schedule", self.threshold_schedule, SCHEDULES),
                                 ("reverse_case", self.reverse_case, REVERSE_CASES),
                                 ("reward_norm", self.reward_norm, REWARD_NORMS),
                                 ("rank_kind", self.rank_kind, RANK_KINDS)):  # fmt: skip
            if v not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {v!r}")
        if self.rank_sft_weight < 0 or self.max_grad_norm < 0:
            raise ValueError("rank_sft_weight and max_grad_norm must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass
class IterationRecord:
    """One iteration of one system: its on-policy data, decisions and training."""

    iteration: int
    tau: float
    queries: list[str]
    plain: list[str]  # y ~ pi(.|x)
    guided: list[str]  # y^p ~ pi(.|p + x)
    r_plain: np.ndarray  # raw rewards (B,)
    r_guided: np.ndarray
    gap: np.ndarray  # normalised r^p - r (B,)
    routes: np.ndarray  # route codes (B,) (RAFT: RANK when y^p is kept; DPO: RANK)
    losses: list[float]
    margin_before: np.ndarray  # s(y^p) - s(y) under the plain x, mean log-probs, before this iteration's steps
    margin_after: np.ndarray

    def share(self, code: int) -> float:
        return float(np.mean(self.routes == code)) if self.routes.size else 0.0


@dataclass
class PLEResult:
    """The trained policy (a `TopK` over the trunk) and one `IterationRecord` per iteration."""

    system: str
    policy: TopK
    records: list[IterationRecord] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return sum(len(r.losses) for r in self.records)


def _check_queries(queries: Sequence[str], opts: PLEOptions) -> list[str]:
    qs = list(queries)
    if isinstance(queries, str) or not qs or not all(isinstance(q, str) and q.strip() for q in qs):
        raise ValueError("queries must be a non-empty sequence of non-empty strings")
    need = opts.iterations * opts.queries_per_iter
    if len(qs) < need:
        raise ValueError(
            f"got {len(qs)} queries, need iterations x queries_per_iter = {opts.iterations} x "
            f"{opts.queries_per_iter} = {need} (fresh queries every iteration)"
        )
    return qs


def ple_align(
    trunk: FrozenTrunk,
    tokenizer: Any,
    queries: Sequence[str],
    principle: str,
    reward_fn: Callable[[str, str], float],
    generate: Callable[..., list[str]],
    *,
    system: str = "ple",
    opts: PLEOptions | None = None,
    init_policy: TopK | None = None,
    init_tag: str = "init",
    chat: bool | None = None,
    system_prompt: str | None = None,
    seed: int = 0,
    run_tag: str | None = None,
    callback: Callable[[IterationRecord], None] | None = None,
) -> PLEResult:
    """The online loop of Algorithm 1 for PLE or one of its baselines (module docstring), from `init_policy`.

    Args:
        trunk (`FrozenTrunk`): the frozen trunk; every system trains a copy of its top k blocks.
        queries (`Sequence[str]`): D_query, at least ``iterations * queries_per_iter``; iteration i takes the
            i-th chunk.
        principle (`str`): p; the guided query is ``principle + " " + x``.
        reward_fn: ``R(x, y) -> float``, called with the *plain* query.
        generate: ``generate(policy, heads, *, tag, do_sample, temperature, top_p, seed) -> list[str]``, e.g. a
            `PolicyGenerator`.
        system (`str`): ``ple``, ``ple_fixed``, ``ple_rank_only``, ``raft`` or ``always_rank_dpo``.
        init_policy (`TopK`, *optional*): the SFT policy (also DPO's reference); None: the model's own blocks.
        init_tag (`str`): the generation-cache name of `init_policy` (iteration 0 is shared across systems).
        seed (`int`): seeds sampling (the same per iteration for every system) and minibatch order.
        run_tag (`str`, *optional*): generation-cache name of this run's later iterations (default: `system`);
            give distinct names to runs of one system with different settings that share a generator.
        callback: called with each `IterationRecord`.
    """
    opts = opts or PLEOptions()
    if system not in SYSTEMS:
        raise ValueError(f"system must be one of {', '.join(SYSTEMS)}, got {system!r}")
    if not isinstance(principle, str) or not principle.strip():
        raise ValueError("principle must be a non-empty string")
    qs = _check_queries(queries, opts)
    policy = clone_policy(trunk, init_policy)
    reference = clone_policy(trunk, init_policy) if system == "always_rank_dpo" else None
    opt = torch.optim.AdamW(list(policy.trainable_parameters()), lr=opts.lr, weight_decay=0.0)
    schedule = "fixed" if system == "ple_fixed" else opts.threshold_schedule
    tau = float(opts.tau0)
    result = PLEResult(system, policy)
    b = opts.queries_per_iter
    for i in range(opts.iterations):
        xs = qs[i * b : (i + 1) * b]
        heads = prompt_heads(tokenizer, xs, chat=chat, system=system_prompt)
        heads_p = prompt_heads(tokenizer, [f"{principle} {x}" for x in xs], chat=chat, system=system_prompt)
        # on-policy: the current policy answers both; iteration 0's policy is init_policy for every system
        tag = init_tag if i == 0 else f"{run_tag or system}@{i}"
        texts = generate(None if (i == 0 and init_policy is None) else policy, heads + heads_p, tag=tag,
                         do_sample=opts.do_sample, temperature=opts.temperature, top_p=opts.top_p,
                         seed=seed + 7919 * i)  # fmt: skip
        ys, yps = texts[:b], texts[b:]
        r = np.array([float(reward_fn(x, y)) for x, y in zip(xs, ys)])
        rp = np.array([float(reward_fn(x, y)) for x, y in zip(xs, yps)])
        rn, rnp = normalize_rewards(r, rp, opts.reward_norm)
        gap = rnp - rn
        # both responses under the plain query: rows [y^p_0..y^p_{B-1}, y_0..y_{B-1}]
        pairs: PairCache = encode_pairs(trunk, tokenizer, xs, yps, ys, chat=chat, system=system_prompt)
        before = score_pairs(policy, pairs)
        if system in ("ple", "ple_fixed"):
            routes = route_pairs(gap, tau, reverse_case=opts.reverse_case)
        elif system == "ple_rank_only":
            routes = np.full(b, RANK, dtype=np.int64)
        elif system == "raft":
            routes = np.where(rp >= r, RANK, RANK_REV)  # which response RAFT keeps (y^p on a tie)
        else:
            routes = np.full(b, RANK, dtype=np.int64)
        wg, wp = wsft_weights(rnp, rn, opts.wsft_temperature)
        ref_g = ref_p = None
        if reference is not None:
            ref = score_pairs(reference, pairs)
            ref_g, ref_p = ref.chosen_sum, ref.rejected_sum

        def loss_of(units: np.ndarray, seq: SeqLogps, r=r, rp=rp, routes=routes, wg=wg, wp=wp, ref_g=ref_g,
                    ref_p=ref_p) -> torch.Tensor:  # fmt: skip
            h = len(units)
            g, p = _rows(seq, slice(0, h)), _rows(seq, slice(h, None))
            if system == "raft":
                return raft_pair_loss(g, p, rp[units], r[units])
            if system == "always_rank_dpo":
                return dpo_pair_loss(g, p, ref_g[units], ref_p[units], beta=opts.dpo_beta)
            return ple_pair_loss(g, p, routes[units], wg[units], wp[units], rank_kind=opts.rank_kind,
                                 rank_beta=opts.rank_beta, rank_sft_weight=opts.rank_sft_weight)  # fmt: skip

        losses = fit(policy, opt, pairs.cache, pairs.response_mask, b, pairs.rows, loss_of, epochs=opts.epochs,
                     batch_size=opts.train_batch, seed=seed + 104729 * (i + 1),
                     max_grad_norm=opts.max_grad_norm)  # fmt: skip
        after = score_pairs(policy, pairs)
        m_before, m_after = before.chosen_mean - before.rejected_mean, after.chosen_mean - after.rejected_mean
        rec = IterationRecord(i, tau, xs, ys, yps, r, rp, gap, routes, losses, m_before, m_after)
        result.records.append(rec)
        if callback is not None:
            callback(rec)
        tau = next_threshold(tau, gap, schedule=schedule, alpha=opts.alpha)
    policy.eval()
    return result


@dataclass
class PLETrainResult:
    """`ple_train`'s output: the merged full model, the trained `TopK`, the SFT policy and the loop's records."""

    model: Any
    policy: TopK
    sft_policy: TopK | None
    result: PLEResult


def ple_train(
    model: Any,
    tokenizer: Any,
    queries: Sequence[str],
    principle: str,
    reward_fn: Callable[[str, str], float],
    *,
    sft_prompts: Sequence[str] = (),
    sft_responses: Sequence[str] = (),
    k_layers: int = 4,
    opts: PLEOptions | None = None,
    system: str = "ple",
    sft_lr: float = 5e-5,
    sft_epochs: int = 1,
    max_new_tokens: int = 20,
    gen_batch: int = 16,
    chat: bool | None = None,
    system_prompt: str | None = None,
    seed: int = 0,
) -> PLETrainResult:
    """PLE end to end on a user's HF causal LM: SFT on D_sft (if given), the online loop, merged into a new model.

    Returns a `PLETrainResult` whose ``model`` is a full HF model (the trunk shared with `model`, the trained top
    blocks merged; ``model.save_pretrained(DIR)`` saves it) and whose ``result.records`` hold per-iteration stats
    (tau_i, routed shares, rewards). `model` itself is not modified.
    """
    trunk = FrozenTrunk(model, k_layers)
    sft = None
    if len(sft_prompts):
        sft, _ = sft_train(trunk, tokenizer, sft_prompts, sft_responses, lr=sft_lr, epochs=sft_epochs, seed=seed,
                           chat=chat, system=system_prompt)  # fmt: skip
    gen = PolicyGenerator(model, tokenizer, max_new_tokens=max_new_tokens, batch_size=gen_batch)
    res = ple_align(trunk, tokenizer, queries, principle, reward_fn, gen, system=system, opts=opts, init_policy=sft,
                    init_tag="sft" if sft is not None else "base", chat=chat, system_prompt=system_prompt,
                    seed=seed)  # fmt: skip
    return PLETrainResult(policy_model(model, res.policy), res.policy, sft, res)
