"""Configuration of Memory Layers at Scale (Memory+) and its from-scratch reproduction."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param

SYSTEMS = ("dense", "memory", "dense_2x", "moe", "pkm")


@dataclass
class MemoryLayersConfig(BaseConfig):
    """Memory+ (Berges et al., ICML 2025) against dense models at equal and ~2x FLOPs and a parameter-matched MoE.

    Every model is a tiny Llama trained from scratch, in this process, on the same token stream in the same order
    (`lmlab.core.training.pretrain.pretrain_lm`): the `fact_corpus` documents plus closed-book QA about the *train*
    split of
    the facts; evaluation asks the *test* facts with QA templates never seen in training, and held-out arithmetic
    (the non-factual control). `model` is unused: the models are built from scratch (the word tokenizer is fitted
    on the training text).

    Args:
        systems (`list[str]`): ``memory`` (Memory+), ``dense`` (same FLOPs), ``dense_2x`` (more layers, ~2x FLOPs),
            ``moe`` (top-1 MoE in the memory's place, total parameters matched), ``pkm`` (memory without swilu).
        n_facts (`int`, defaults to 400): facts in the world (spec: 2k-20k; trimmed to the CPU budget).
        repeats, facts_per_doc, control_fraction: how the facts are rendered into training documents.
        hidden, n_layers, heads, d_ff, seq_len: the dense model (4 layers, d=64).
        memory_layers (`list[int]`): decoder layers whose FFN becomes a memory (official "4,12,20" of 24).
        n_keys, mem_heads, knn, k_dim, v_dim, swilu, gated, query_batchnorm, share_values: the memory layer.
        lr, value_lr, steps, train_batch_size, warmup, weight_decay, grad_clip: training (AdamW, cosine).
        dense_2x_layers (`int`): layers of the ~2x-FLOPs dense model.
        moe_experts (`int`, defaults to 0): experts of the MoE; 0 = solved so that total parameters match the
            memory model's; moe_top_k, moe_aux_weight: its routing.
        n_qa, n_control: evaluation questions (None = all test-split facts).
        timing_repeats, timing_batch: interleaved forward-timing rounds and their batch (tokens/s).
    """

    model: str = param("tiny-llama", "unused: every model is built from scratch (recorded for the CLI only)")
    systems: list = param(["dense", "memory", "dense_2x", "moe"], "systems trained side by side (see SYSTEMS)")
    n_facts: int = param(400, "facts in the synthetic world", paper="natural pretraining data (DCLM), 1T tokens")
    repeats: int = param(3, "times each fact appears in the training documents")
    facts_per_doc: int = param(8, "fact sentences per training document")
    control_fraction: float = param(0.2, "share of arithmetic (control) documents")
    hidden: int = param(64, "model width d", paper="1024 (373M) ... 4096 (8B)")
    n_layers: int = param(4, "decoder layers of the dense / memory model", paper="24 (373M), 32 (7B)")
    heads: int = param(4, "attention heads")
    d_ff: int = param(256, "SwiGLU FFN width (4d)")
    seq_len: int = param(64, "training window", paper="4096")
    memory_layers: list = param([2], "layers whose FFN is replaced by a memory", paper="4,12,20 of 24 [code]")
    n_keys: int = param(
        128, "sub-keys per side, N = n_keys^2 slots (16k: CPU time and memory)", paper="1024 [code]; up to 8192"
    )
    mem_heads: int = param(4, "memory heads", paper="4 [code]")
    knn: int = param(32, "slots read per memory head (and per-side top-k)", paper="32 [code]")
    k_dim: int = param(64, "query / key width, two halves (scaled down with d=64)", paper="512 [code]")
    v_dim: int = param(-1, "value width (-1 = model width)", paper="-1 = d [code]")
    swilu: bool = param(True, "Memory+ output W_o(y * silu(W_s x)) (False = plain PKM)", paper="True [code]")
    gated: bool = param(False, "extra sigmoid output gate (mem_gated)", paper="False [code]")
    query_batchnorm: bool = param(False, "BatchNorm1d after the query projection", paper="False [code]")
    share_values: bool = param(True, "one value table for all memory layers", paper="True [code]")
    lr: float = param(
        3e-3,
        "AdamW LR of all but the memory values (tiny from-scratch models train at a larger LR)",
        paper="1e-4 (373M) [code]",
    )
    value_lr: float = param(
        3e-2,
        "LR of the value table (own group, same schedule): 10x the base LR as in the paper",
        paper="1e-3 [code] (10x base)",
    )
    steps: int = param(400, "training steps (same for every system)", paper="128k steps x 8 x 4096 tokens")
    train_batch_size: int = param(32, "training windows per step", paper="8 x 4096 tokens per GPU")
    warmup: int = param(30, "linear warm-up steps", paper="4000 [code]")
    weight_decay: float = param(0.1, "AdamW weight decay", paper="0.1 [code]")
    grad_clip: float = param(1.0, "gradient-norm clip (values clipped apart)", paper="1.0 [code]")
    dense_2x_layers: int = param(8, "layers of the ~2x-FLOPs dense baseline")
    moe_experts: int = param(0, "MoE experts (0 = solved to match the memory model's total parameters)")
    moe_top_k: int = param(1, "experts per token of the MoE (1 = active FLOPs of one FFN)")
    moe_aux_weight: float = param(0.01, "weight of the Switch load-balancing loss")
    n_qa: int | None = param(None, "test-split QA questions (None = all)")
    n_control: int = param(150, "held-out arithmetic questions (control domain)")
    timing_repeats: int = param(5, "interleaved forward-timing rounds (0 = no timing)")
    timing_batch: int = param(8, "batch of the timed forwards (x seq_len tokens)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.systems:
            raise ValueError("systems must list at least one system, got []")
        for s in self.systems:
            if s not in SYSTEMS:
                raise ValueError(f"systems entries must be one of {', '.join(SYSTEMS)}, got {s!r}")
        if "memory" not in self.systems or "dense" not in self.systems:
            raise ValueError(f"systems must include 'memory' and 'dense' (the claim's pair), got {self.systems!r}")
        check_range("n_facts", self.n_facts, 10)
        check_range("repeats", self.repeats, 1)
        check_range("facts_per_doc", self.facts_per_doc, 1)
        check_range("control_fraction", self.control_fraction, 0.0, 0.9)
        check_range("hidden", self.hidden, 8)
        check_range("n_layers", self.n_layers, 1)
        check_range("heads", self.heads, 1)
        if self.hidden % self.heads:
            raise ValueError(f"hidden must be a multiple of heads={self.heads}, got {self.hidden}")
        check_range("d_ff", self.d_ff, 1)
        check_range("seq_len", self.seq_len, 4)
        if not self.memory_layers:
            raise ValueError("memory_layers must list at least one layer index, got []")
        for i in self.memory_layers:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.n_layers:
                raise ValueError(f"memory_layers entries must be ints in [0, {self.n_layers - 1}], got {i!r}")
        check_range("n_keys", self.n_keys, 2)
        check_range("mem_heads", self.mem_heads, 1)
        check_range("knn", self.knn, 1, self.n_keys)
        check_range("k_dim", self.k_dim, 2)
        if self.k_dim % 2:
            raise ValueError(f"k_dim must be even (two halves), got {self.k_dim}")
        if self.v_dim != -1:
            check_range("v_dim", self.v_dim, 1)
        check_range("lr", self.lr, 0.0, open_lo=True)
        check_range("value_lr", self.value_lr, 0.0, open_lo=True)
        check_range("steps", self.steps, 1)
        check_range("train_batch_size", self.train_batch_size, 1)
        check_range("warmup", self.warmup, 0)
        check_range("weight_decay", self.weight_decay, 0.0)
        check_range("grad_clip", self.grad_clip, 0.0, open_lo=True)
        check_range("dense_2x_layers", self.dense_2x_layers, 1)
        check_range("moe_experts", self.moe_experts, 0)
        if self.moe_experts == 1:
            raise ValueError("moe_experts must be 0 (solved) or >= 2, got 1")
        check_range("moe_top_k", self.moe_top_k, 1)
        check_range("moe_aux_weight", self.moe_aux_weight, 0.0)
        check_range("n_qa", self.n_qa, 1)
        check_range("n_control", self.n_control, 1)
        check_range("timing_repeats", self.timing_repeats, 0)
        check_range("timing_batch", self.timing_batch, 1)
