"""Configuration of the one-shot pruning baselines (Wanda, SparseGPT, magnitude) and their comparison run."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param
from lmlab.core.pruning.masks import parse_mask_structure

PRUNERS = ("magnitude", "wanda", "sparsegpt")


@dataclass
class PruningConfig(BaseConfig):
    """One-shot post-training pruning of every decoder linear, compared side by side on held-out perplexity.

    Args:
        sparsity (`float`, defaults to 0.5): unstructured target sparsity of every block (Wanda Table 3 headline).
        structures (`list[str]`, defaults to ``["unstructured", "2:4"]``): mask structures run; ``"N:M"`` prunes N
            of every M consecutive input weights per row (official meaning; sparsity N/M).
        baselines (`list[str]`): the other pruners run next to the method (``magnitude``, ``wanda``, ``sparsegpt``).
        n_calib (`int`, defaults to 16): calibration windows, seeded random windows of the corpus train split
            (2048 tokens: SparseGPT's Hessian needs more tokens than the widest input, 1536 in SmolLM2).
        calib_seqlen (`int`, defaults to 128): tokens per calibration window (paper: 128 x 2048 C4 tokens).
        n_eval (`int`, defaults to 16): evaluation windows, the first non-overlapping ones of the corpus test split
            (one NLL per window: the CIs are over windows).
        eval_seqlen (`int`, defaults to 128): tokens per evaluation window (paper: WikiText-2 test at 2048).
        block_size (`int`, defaults to 128): SparseGPT's lazy-batch block (``blocksize``).
        dampening_frac (`float`, defaults to 0.01): SparseGPT's ``percdamp``.
        magnitude_group (`str`, defaults to ``"layer"``): magnitude's comparison group (official: the whole layer).
        track_dense (`bool`, defaults to `True`): propagate the dense model's hidden states too, for the
            accumulated per-block error vs depth.
        match_margin (`float`, defaults to 0.05): non-inferiority margin (nats of mean NLL) of "matches" claims.
        dense_margin (`float`, defaults to 0.25): margin (nats) of the "small increase over dense" check
            (LLaMA-2-7B at 50%: 5.12 -> 6.51 perplexity is +0.24 nats).
        speed (`bool`, defaults to `True`): measure storage and dense vs sparse latency in this run.
        speed_repeats (`int`, defaults to 5): timed rounds per workload (interleaved, `compare_timings`).
        prefill_tokens (`int`, defaults to 128): tokens of the prefill workload, and the context of the
            cached decode step (1 new token against a KV cache of this length).
        save_model (`str`, *optional*): write the method's unstructured pruned model here as a HF folder (usable as
            ``--model`` by any method).
    """

    sparsity: float = param(0.5, "unstructured target sparsity of every block", paper="0.5 (Wanda Table 3)")
    structures: list = param(
        ["unstructured", "2:4"], "mask structures run ('unstructured' or 'N:M')", paper="unstructured, 4:8, 2:4"
    )
    baselines: list = param(["magnitude", "sparsegpt"], "other pruners run side by side", paper="magnitude, SparseGPT")
    n_calib: int = param(
        16,
        "calibration windows (corpus train split); 16 x 128 = 2048 tokens > 1536, SmolLM2's widest linear input",
        paper="128 windows (C4 shard 0)",
    )
    calib_seqlen: int = param(128, "tokens per calibration window", paper="2048")
    n_eval: int = param(16, "evaluation windows (corpus test split)", paper="WikiText-2 test, all windows")
    eval_seqlen: int = param(128, "tokens per evaluation window", paper="2048")
    block_size: int = param(128, "SparseGPT lazy-batch block size", paper="128 [code]")
    dampening_frac: float = param(0.01, "SparseGPT Hessian dampening (percdamp)", paper="0.01 [code]")
    magnitude_group: str = param(
        "layer", "magnitude comparison group", paper="layer [code: prune_magnitude]", choices=("layer", "row")
    )
    track_dense: bool = param(True, "also propagate the dense hidden states (accumulated error vs depth)")
    match_margin: float = param(0.05, "non-inferiority margin (nats of mean NLL) of 'matches' claims")
    dense_margin: float = param(0.25, "margin (nats) of the 'small increase over dense' check")
    speed: bool = param(True, "measure storage and dense vs sparse latency in this run")
    speed_repeats: int = param(5, "timed rounds per latency workload")
    prefill_tokens: int = param(128, "tokens of the prefill workload and KV-cache length of the decode step")
    save_model: str | None = param(None, "write the method's unstructured pruned model here (HF folder)")

    method_id = "wanda"  # overridden by subclasses; not a field

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("sparsity", self.sparsity, 0.0, 1.0)
        if not self.structures:
            raise ValueError("structures must list at least one mask structure, got []")
        for s in self.structures:
            parse_mask_structure(s)
        for b in self.baselines:
            if b not in PRUNERS or b == self.method_id:
                others = ", ".join(p for p in PRUNERS if p != self.method_id)
                raise ValueError(f"baselines entries must be among {others}, got {b!r}")
        check_range("n_calib", self.n_calib, 1)
        check_range("calib_seqlen", self.calib_seqlen, 2)
        check_range("n_eval", self.n_eval, 1)
        check_range("eval_seqlen", self.eval_seqlen, 2)
        check_range("block_size", self.block_size, 1)
        check_range("dampening_frac", self.dampening_frac, 0.0, open_lo=True)
        check_range("match_margin", self.match_margin, 0.0)
        check_range("dense_margin", self.dense_margin, 0.0)
        check_range("speed_repeats", self.speed_repeats, 1)
        check_range("prefill_tokens", self.prefill_tokens, 1)


@dataclass
class WandaConfig(PruningConfig):
    """Wanda (Sun et al., ICLR 2024) against magnitude and SparseGPT; see `PruningConfig` for the fields."""

    method_id = "wanda"
