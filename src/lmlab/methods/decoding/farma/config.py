"""Configuration of FaRMA and its reproduction against top-k sampling, Best-of-N, ARGS and PARGS."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param
from lmlab.methods.decoding.farma.reward_models import HEAD_MODES

GOLD_REWARDS = ("positivity", "topic_period")


@dataclass
class FarmaConfig(BaseConfig):
    """FaRMA (Rashid et al., ICML 2025): V-channel reward model, one RM call per token, vs ARGS / PARGS / Best-of-N.

    Args:
        max_new_tokens (`int`, defaults to 16): evaluation generation length (official TL;DR test: 64).
        w (`float`, defaults to 1.0): RM weight of every reward-guided decoder (official: 1.0).
        k (`int`, defaults to 10): top-k of FaRMA / candidates of ARGS and PARGS / k of the top-k baseline
            (official: 10).
        mode (`int`, defaults to 2): 2 samples from the softmax over the top-k scores, 1 takes the argmax (official
            default 2).
        w_sweep (`list[float]`, defaults to [0.5, 2.0]): extra FaRMA weights (raw logits make w scale-dependent).
        gold (`str`, defaults to ``"positivity"``): the offline rule-based gold reward.
        pref_prompts (`int`, defaults to 60): prompts sampled for preference data (about 60 in the spec).
        samples_per_prompt (`int`, defaults to 4): samples per preference prompt.
        pref_tokens (`int`, defaults to 24): length of preference samples.
        pref_temperature (`float`, defaults to 1.0): sampling temperature of preference data.
        min_margin (`float`, defaults to 1.0): minimum gold-score gap for a preference pair.
        rm_val_fraction (`float`, defaults to 0.2): preference prompts held out to measure each RM's BT accuracy.
        eval_prompts (`int`, defaults to 20): held-out decoding prompts; eval_seeds (`int`, defaults to 2) each.
        eval_batch (`int`, defaults to 40): rows decoded together (every system uses the same batches; CPU
            decode steps cost about the same from 10 to 80 rows, so one batch is cheapest).
        best_of_n (`int`, defaults to 4): N of Best-of-N (0 skips it).
        run_pargs, run_init_control, run_no_max_ablation (`bool`): optional systems.
        latency_prompts (`int`, defaults to 1): held-out prompts decoded one at a time (batch 1) to time top-k,
            FaRMA, ARGS with its k candidates in one forward and ARGS scoring them one forward at a time.
        head (`str`, defaults to ``"lowrank"``): V-head parameterisation; rank (`int`, defaults to 32).
        iterations (`int`, defaults to 7): BT/max alternations (official 7; the evaluated checkpoint is the last BT
            phase, ``RM_BT_iter{iterations}``).
        bt_epochs, max_epochs (`float`, default 1.0): epochs per phase (official 1 and 1).
        lr (`float`, defaults to 1e-3), train_batch (`int`, defaults to 16): AdamW on cached features (official: 5e-6,
            8 x 8 accumulation x 2 GPUs, full fine-tuning).
        max_min_prefix (`int`, defaults to 1): first response prefix length of the max constraint (official 11).
        pargs_min_prefix (`int`, defaults to 2): first prefix length of PARGS's partial pairs (official 2).
        stop_gradient (`bool`, defaults to `False`): detach the max target (official: no).
        noninferiority (`float`, defaults to 0.25): FaRMA's gold reward may fall below ARGS's / PARGS's by at most
            this much (a quarter of a lexicon word per response) and still count as "competitive".
    """

    max_new_tokens: int = param(
        16, "evaluation generation length (tokens); shorter than official for the CPU budget", paper="64 (TL;DR)"
    )
    w: float = param(1.0, "RM weight of every reward-guided decoder", paper="1.0 (RM_test.py)")
    k: int = param(10, "FaRMA top-k / ARGS and PARGS candidates / top-k of the sampling baseline", paper="10")
    mode: int = param(2, "2: sample from softmax over the top-k scores; 1: argmax", paper="2", choices=(1, 2))
    w_sweep: list = param([0.5, 2.0], "extra FaRMA weights (w is scale-dependent with raw logits)")
    gold: str = param("positivity", "offline rule-based gold reward", choices=GOLD_REWARDS)
    pref_prompts: int = param(
        60, "prompts sampled for preference data (SmolLM2 samples, CPU budget)", paper="8,000 TL;DR pairs per epoch"
    )
    samples_per_prompt: int = param(4, "samples per preference prompt")
    pref_tokens: int = param(24, "length of preference samples (tokens)", paper="human summaries, max_length 512")
    pref_temperature: float = param(1.0, "sampling temperature of preference data")
    min_margin: float = param(1.0, "minimum gold-score gap for a preference pair")
    rm_val_fraction: float = param(0.2, "share of preference prompts held out for RM BT accuracy")
    eval_prompts: int = param(20, "held-out decoding prompts (CPU budget)", paper="100 test prompts, seed 44")
    eval_seeds: int = param(2, "sampling seeds per decoding prompt")
    eval_batch: int = param(40, "rows decoded together (same batches for every system)")
    best_of_n: int = param(4, "N of Best-of-N (0 skips it)", paper="Best-of-N baseline")
    run_pargs: bool = param(True, "run PARGS (prefix-trained scalar RM)")
    latency_prompts: int = param(1, "prompts decoded one at a time to time FaRMA vs ARGS (batched / one by one)")
    run_init_control: bool = param(True, "control: FaRMA with the untrained V head (the LM head copy)")
    run_no_max_ablation: bool = param(True, "ablation: FaRMA's V head trained by the BT phases only (no L_max)")
    head: str = param(
        "lowrank",
        "V head on a frozen body: low-rank delta or full untied copy (CPU)",
        paper="full model trained",
        choices=HEAD_MODES,
    )
    rank: int = param(32, "rank of the V head's low-rank delta")
    iterations: int = param(7, "BT/max alternations; the last BT phase is evaluated", paper="7 (RM_FaRMA_train.sh)")
    bt_epochs: float = param(1.0, "BT epochs per phase", paper="1")
    max_epochs: float = param(1.0, "max-constraint epochs per phase", paper="1")
    lr: float = param(1e-3, "AdamW learning rate of the heads (heads only, ~100 steps)", paper="5e-6 (full model)")
    train_batch: int = param(16, "training batch (pairs or partial sequences)", paper="8 x 8 accum. x 2 GPUs")
    max_min_prefix: int = param(
        1, "first response prefix length of L_max (24-token responses, not ~50)", paper="11 (i from 10)"
    )
    pargs_min_prefix: int = param(2, "first prefix length of PARGS's partial pairs", paper="2 (i from 1)")
    stop_gradient: bool = param(False, "detach the max target in L_max (ablation)", paper="False (both sides)")
    noninferiority: float = param(0.25, "gold FaRMA may lose to ARGS / PARGS and still count as comparable")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("w", self.w, 0.0)
        check_range("k", self.k, 1)
        for i, w in enumerate(self.w_sweep):
            if not isinstance(w, int | float) or w < 0:
                raise ValueError(f"w_sweep[{i}] must be a number >= 0, got {w!r}")
        check_range("pref_prompts", self.pref_prompts, 2)
        check_range("samples_per_prompt", self.samples_per_prompt, 2)
        check_range("pref_tokens", self.pref_tokens, 2)
        check_range("pref_temperature", self.pref_temperature, 0.0, open_lo=True)
        check_range("min_margin", self.min_margin, 0.0)
        check_range("rm_val_fraction", self.rm_val_fraction, 0.0, 0.9)
        check_range("eval_prompts", self.eval_prompts, 1)
        check_range("eval_seeds", self.eval_seeds, 1)
        check_range("eval_batch", self.eval_batch, 1)
        check_range("best_of_n", self.best_of_n, 0)
        check_range("latency_prompts", self.latency_prompts, 0)
        check_range("rank", self.rank, 0)
        check_range("iterations", self.iterations, 1)
        check_range("bt_epochs", self.bt_epochs, 0.0, open_lo=True)
        check_range("max_epochs", self.max_epochs, 0.0)
        check_range("lr", self.lr, 0.0, open_lo=True)
        check_range("train_batch", self.train_batch, 1)
        check_range("max_min_prefix", self.max_min_prefix, 1)
        check_range("pargs_min_prefix", self.pargs_min_prefix, 1)
        check_range("noninferiority", self.noninferiority, 0.0)
