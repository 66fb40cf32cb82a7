"""Configuration of PLE (Progressively Label Enhancement) and its reproduction (positive travel-story continuation)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param

# PLE's online loop run for each of these (method.SYSTEMS); "sft" (the starting policy) is always evaluated
LOOP_SYSTEMS = ("ple", "ple_fixed", "ple_rank_only", "raft_plain", "raft_guided", "always_rank_dpo")
DEFAULT_SYSTEMS = ("ple", "ple_fixed", "raft_plain", "raft_guided", "always_rank_dpo")


@dataclass
class PLEConfig(BaseConfig):
    """PLE (Liu, Xu and Geng, ICML 2025, Algorithm 1) and the baselines of its Table 1 that fit a CPU run.

    Every system starts from the same SFT policy (the top `k_layers` blocks fine-tuned on `n_sft` neutral
    continuations) and runs `iterations` rounds of the online loop on the same `queries_per_iter` fresh queries per
    round: generate y ~ pi(.|x) and y^p ~ pi(.|p + x), score both with the rule-based reward, train on the plain x.
    The first round's generations are shared (same policy, same seed); later rounds are on-policy. ``raft_plain``
    instead samples `raft_k` plain answers per query each round (on-policy, never the principle) and SFTs on the
    best. Every system is then decoded greedily on `n_test` held-out queries *without* the principle.

    Args:
        n_sft (`int`, defaults to 64): D_sft, neutral continuations (spec: 64).
        iterations (`int`, defaults to 3): I, rounds of generate -> score -> train.
        queries_per_iter (`int`, defaults to 16): fresh queries per round (spec: 32; 16 for the 5-minute budget,
            which also pays for raft_plain's k samples per query).
        n_test (`int`, defaults to 40): held-out queries (test-split countries), the unit of every claim.
        systems (`list[str]`): loop systems run besides ``sft``: ``ple``, ``ple_fixed``, ``ple_rank_only``,
            ``raft_plain`` (the paper's RAFT: best of `raft_k` plain samples), ``raft_guided`` (best of y, y^p),
            ``always_rank_dpo``.
        tau0, alpha, threshold_schedule, reverse_case, reward_norm: PLE's threshold and routing (`PLEOptions`).
        rank_kind, rank_beta, rank_sft_weight, wsft_temperature: the two losses.
        dpo_beta (`float`, defaults to 0.1): beta of always-rank DPO (TRL's default).
        raft_k (`int`, defaults to 4): plain samples per query of ``raft_plain`` (the paper: RAFT via LMFlow, 4).
        k_layers (`int`, defaults to 4): trainable top blocks (frozen trunk cached below).
        lr, epochs, train_batch: AdamW per round, shared by every system (same steps).
        sft_lr, sft_epochs: the SFT stage.
        temperature, top_p: sampling of the training responses (the held-out decoding is greedy).
        eval_guided (`bool`, defaults to True): also decode the SFT policy *with* the principle on the held-out
            queries (the behaviour PLE distils; a reference row, not a baseline).
        chat (`bool`, *optional*): chat template (default: when the tokenizer has one).
        system_prompt (`str`, *optional*, defaults to ``""``): the template's system turn (``""``: an empty one;
            None: the template's default, 17 more tokens per sequence on SmolLM2).
    """

    n_sft: int = param(64, "D_sft: neutral template continuations", paper="HH-RLHF SFT split")
    iterations: int = param(3, "I: rounds of generate -> score -> train", paper="input of Algorithm 1")
    queries_per_iter: int = param(16, "fresh queries per round (spec: 32)", paper="the query set in batches")
    n_test: int = param(40, "held-out queries decoded without the principle (claims' unit)")
    systems: list = param(list(DEFAULT_SYSTEMS), "loop systems besides sft, among: " + ", ".join(LOOP_SYSTEMS))
    tau0: float = param(0.2, "initial threshold on normalised rewards", paper="0.2")
    alpha: float = param(0.9, "threshold decay tau_{i+1} = alpha tau_i", paper="0.9")
    threshold_schedule: str = param(
        "geometric", "threshold schedule", paper="tau_{i+1} = alpha tau_i [verify]",
        choices=("geometric", "fixed", "ema"),
    )  # fmt: skip
    reverse_case: str = param(
        "wsft", "pairs with r - r^p > tau: weighted SFT or reversed ranking", paper="not specified",
        choices=("wsft", "rank"),
    )  # fmt: skip
    reward_norm: str = param(
        "batch_z", "reward normalisation per round", paper="normalised [verify]", choices=("batch_z", "minmax", "none")
    )
    rank_kind: str = param("pro", "pairwise ranking loss on mean log-probs", paper="ranking loss [verify]",
                           choices=("pro", "rrhf"))  # fmt: skip
    rank_beta: float = param(1.0, "scale of the ranking loss's log-prob difference")
    rank_sft_weight: float = param(1.0, "SFT term on y^p added to the ranking loss (as RRHF / PRO)")
    wsft_temperature: float = param(1.0, "softmax temperature of the weighted-SFT weights", paper="[verify]")
    dpo_beta: float = param(0.1, "beta of always-rank DPO", paper="0.1 (TRL default)")
    raft_k: int = param(4, "plain samples per query of raft_plain (SFT on the best)", paper="4 (RAFT via LMFlow)")
    k_layers: int = param(4, "trainable top blocks (frozen trunk below)", paper="LoRA r=8 on all linear modules")
    lr: float = param(1e-4, "AdamW learning rate of the online rounds (every system)", paper="3e-6 (DPO, 7B, code)")
    epochs: int = param(2, "passes over a round's pairs")
    train_batch: int = param(4, "pairs per optimiser step")
    sft_lr: float = param(5e-5, "AdamW learning rate of the SFT stage")
    sft_epochs: int = param(1, "SFT epochs over D_sft")
    max_new_tokens: int = param(20, "response budget (spec: <= 24 tokens)")
    gen_batch: int = param(16, "prompts decoded together")
    temperature: float = param(0.7, "sampling temperature of the training responses")
    top_p: float = param(0.9, "nucleus of the training responses")
    eval_guided: bool = param(True, "also decode SFT with the principle on the held-out queries (reference row)")
    chat: bool | None = param(None, "chat template (None: when the tokenizer has one)")
    system_prompt: str | None = param("", "system turn of the chat template ('' empty, None template default)")

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("n_sft", "iterations", "queries_per_iter", "n_test", "k_layers", "epochs", "train_batch",
                     "sft_epochs", "gen_batch", "raft_k"):  # fmt: skip
            check_range(name, getattr(self, name), 1)
        if not self.systems:
            raise ValueError(f"systems must name at least one of {', '.join(LOOP_SYSTEMS)}, got []")
        for s in self.systems:
            if s not in LOOP_SYSTEMS:
                hint = " ('raft' is now 'raft_guided'; 'raft_plain' is the paper's RAFT)" if s == "raft" else ""
                raise ValueError(f"systems entries must be among {', '.join(LOOP_SYSTEMS)}, got {s!r}{hint}")
        if "ple" not in self.systems:
            raise ValueError(f"systems must include 'ple' (the method), got {self.systems}")
        if not math.isfinite(self.tau0):
            raise ValueError(f"tau0 must be a finite number (a threshold on normalised rewards), got {self.tau0!r}")
        check_range("alpha", self.alpha, 0.0, 1.0, open_lo=True)
        for name in ("rank_beta", "wsft_temperature", "dpo_beta", "lr", "sft_lr", "temperature"):
            check_range(name, getattr(self, name), 0.0, open_lo=True)
        check_range("rank_sft_weight", self.rank_sft_weight, 0.0)
        check_range("top_p", self.top_p, 0.0, 1.0, open_lo=True)
