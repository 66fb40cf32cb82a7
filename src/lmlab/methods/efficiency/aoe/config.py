"""Configuration of Autonomy-of-Experts (AoE) and its two-part reproduction."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param

ABLATIONS = ("aoe_no_aux", "dense")


@dataclass
class AoEConfig(BaseConfig):
    """AoE (Lv et al., ICML 2025) against a router MoE (part A, from scratch) and post-hoc rules (part B, SmolLM2).

    Part A: tiny Llama-style LMs trained from scratch on `fact_corpus` documents plus `corpus` prose, with every FFN
    an `AoEMoE` or a `RouterMoE` of equal total parameters (AoE's d_wide solved for it), over `n_seeds` seeds.
    Part B: `model`'s (SmolLM2) FFNs split into `b_experts` groups, top-`b_top_k` groups kept per token by the AoE
    low-rank norm, the exact norm, the gate norm, a fitted router, or at random; held-out perplexity on `corpus`.

    Args:
        pretrain (`bool`): run part A. moefy (`bool`): run part B.
        n_experts, top_k (`int`, 8 and 2): experts and active experts per token (paper [unverified]: 8, top-2).
        d_low (`int`, 16): AoE gate rank (official `moe.py`: 128 at the authors' width; toy width here).
        moe_d_ff (`int`, 128): router-MoE expert width; AoE's d_wide is solved for equal total parameters.
        aux_coef (`float`, 0.01): load-balancing loss weight, same for both models.
        renormalize (`bool`, True): renormalise the top-k gate weights (`moe.py`: yes; megablocks `AoE.py`: no).
        d_model, n_layers, n_heads (`int`): the tiny LM. vocab_size: word-tokenizer size.
        n_seeds (`int`, 6): model seeds (init and data order). steps, train_batch_size, seq_len, lr, warmup: training.
        n_facts (`int`): size of the fact_corpus world (all its documents are used, 10% held out);
            n_corpus_passages (`int`): corpus training passages; eval_windows: held-out windows per domain.
        ablations (`list[str]`): extra part-A systems: ``aoe_no_aux`` (AoE, aux weight 0), ``dense`` (dense FFN with
            the MoE's active parameters, k x moe_d_ff).
        timing_repeats (`int`): interleaved timing rounds (forward and train step) of the trained models.
        b_experts, b_top_k, b_d_low (`int`, 8, 6, 32): part B split, kept groups and SVD rank.
        b_rules (`list[str]`): part-B rules besides ``dense``.
        n_eval_passages, eval_tokens (`int`): held-out corpus passages (test split) and tokens per passage.
        n_router_passages (`int`): train-split passages whose FFN inputs fit the linear router; router_ridge its
            ridge strength.
    """

    model: str = param("smollm2-135m", "part B model (its FFNs are split into experts)", paper="n/a (paper trains)")
    pretrain: bool = param(True, "run part A: AoE vs router MoE trained from scratch")
    moefy: bool = param(True, "run part B: a pretrained model's FFNs split into experts, ranking rules compared")
    # -- part A: the layers
    n_experts: int = param(8, "experts per layer", paper="8 (small models) [unverified]")
    top_k: int = param(2, "experts per token", paper="2 [unverified]")
    d_low: int = param(16, "AoE gate rank d_low (toy width; spec range 16-32)", paper="128 (moe.py dim4route)")
    moe_d_ff: int = param(128, "router-MoE expert width (AoE d_wide solved for equal params)", paper="4096 (fuel_dim)")
    aux_coef: float = param(0.01, "load-balancing loss weight, identical for AoE and MoE", paper="[unverified]")
    renormalize: bool = param(True, "renormalise top-k gate weights", paper="True (moe.py); False (megablocks)")
    # -- part A: the model and its training
    d_model: int = param(96, "tiny LM width", paper="732M-4B total params")
    n_layers: int = param(2, "tiny LM layers (spec: 4; 2 fit the 5-minute budget)")
    n_heads: int = param(4, "attention heads")
    vocab_size: int = param(2048, "word-tokenizer vocabulary (fitted on the training text)")
    n_seeds: int = param(
        6,
        "model seeds (init and data order), same for every system; the CI's unit (6: fewest a 95% check decides on)",
    )
    steps: int = param(200, "training steps per model", paper="~100B tokens [unverified]")
    train_batch_size: int = param(16, "training windows per step")
    seq_len: int = param(64, "tokens per training window")
    lr: float = param(3e-3, "AdamW peak learning rate (warm-up + cosine)")
    warmup: int = param(20, "warm-up steps")
    n_facts: int = param(800, "facts in the fact_corpus world (each in 3 sentences; ~0.47 documents per fact)")
    n_corpus_passages: int = param(160, "corpus (stdlib prose) training passages (at most the train split)")
    eval_windows: int = param(24, "held-out windows per domain (fact docs, corpus prose)")
    ablations: list = param([], f"extra part-A systems: {', '.join(ABLATIONS)}")
    timing_repeats: int = param(5, "interleaved timing rounds (>= 5 per the fair-timing protocol)")
    # -- part B
    b_experts: int = param(8, "groups of d_ff units per FFN (SmolLM2: 1536 -> 8 x 192)")
    b_top_k: int = param(6, "groups kept per token (top-4 of 8 already breaks SmolLM2: NLL ~10 for every rule)")
    b_d_low: int = param(32, "rank of the SVD factor of each group's gate weights")
    b_rules: list = param(["oracle", "gate_norm", "aoe_lowrank", "router", "random"], "part-B ranking rules")
    n_eval_passages: int = param(16, "held-out corpus passages (test split)")
    eval_tokens: int = param(128, "tokens per evaluation passage")
    n_router_passages: int = param(16, "train-split passages to fit the linear router")
    router_ridge: float = param(1e-2, "ridge strength of the router fit (relative to the input scale)")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("n_experts", self.n_experts, 2)
        check_range("top_k", self.top_k, 1, self.n_experts)
        check_range("d_low", self.d_low, 1, self.d_model)
        check_range("moe_d_ff", self.moe_d_ff, 1)
        check_range("aux_coef", self.aux_coef, 0.0)
        check_range("d_model", self.d_model, 8)
        check_range("n_heads", self.n_heads, 1)  # before the modulo: n_heads=0 would divide by zero
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_heads, got n_heads={self.n_heads}")
        check_range("n_layers", self.n_layers, 1)
        check_range("vocab_size", self.vocab_size, 16)
        check_range("n_seeds", self.n_seeds, 1)
        check_range("steps", self.steps, 1)
        check_range("train_batch_size", self.train_batch_size, 1)
        check_range("seq_len", self.seq_len, 4)
        check_range("lr", self.lr, 0.0, open_lo=True)
        check_range("warmup", self.warmup, 0)
        check_range("n_facts", self.n_facts, 5)
        check_range("n_corpus_passages", self.n_corpus_passages, 1)
        check_range("eval_windows", self.eval_windows, 1)
        for a in self.ablations:
            if a not in ABLATIONS:
                raise ValueError(f"ablations entries must be one of {', '.join(ABLATIONS)}, got {a!r}")
        check_range("timing_repeats", self.timing_repeats, 1)
        check_range("b_experts", self.b_experts, 2)
        check_range("b_top_k", self.b_top_k, 1, self.b_experts)
        check_range("b_d_low", self.b_d_low, 1)
        rules = ("oracle", "gate_norm", "aoe_lowrank", "router", "random")
        for r in self.b_rules:
            if r not in rules:
                raise ValueError(f"b_rules entries must be one of {', '.join(rules)}, got {r!r}")
        if self.moefy and not {"aoe_lowrank", "random"} <= set(self.b_rules):
            raise ValueError(f"b_rules must include 'aoe_lowrank' and 'random' (the claim), got {self.b_rules!r}")
        check_range("n_eval_passages", self.n_eval_passages, 1)
        check_range("eval_tokens", self.eval_tokens, 8)
        check_range("n_router_passages", self.n_router_passages, 1)
        check_range("router_ridge", self.router_ridge, 0.0)
        if not (self.pretrain or self.moefy):
            raise ValueError("at least one of pretrain and moefy must be true, got both false")
