"""Configuration of LoRA-Gen and its reproduction."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param

RELATION_NAMES = ("capital", "continent", "first_letter", "last_letter", "uppercase")
FORMAT_NAMES = ("plain", "upper", "bracket")
MODES = ("frozen_cloud",)


@dataclass
class LoRAGenConfig(BaseConfig):
    """LoRA-Gen (Xiao et al., ICML 2025) and its experiment against query-only, task-prompt-in-context, a matched
    multi-task LoRA with the task prompt in context (the fair baseline), the same LoRA on the bare query, and one
    LoRA per task (the oracle).

    `model` (from `BaseConfig`) is the edge model; `cloud_model` the frozen cloud model.

    Args:
        cloud_model (`str`, defaults to ``"gemma3-270m"``): cloud LM reading the system prompt (paper: a larger LM,
            LoRA-tuned; not verified which).
        mode (`str`, defaults to ``"frozen_cloud"``): meta tokens = learned queries over cached frozen cloud states
            (the only mode implemented).
        n_experts, rank, top_k, lora_alpha: LoRA expert pool per edge block, expert rank, experts kept per block,
            LoRA alpha (update scale alpha / rank).
        n_top_layers (`int`, defaults to 6): LoRA on the last N edge blocks (the rest is cached once).
        targets (`list[str]`): edge modules carrying LoRA in those blocks.
        attn_dim (`int`, defaults to 64): width of the meta tokens / cross-attention.
        noisy_gating (`bool`, defaults to `True`): Shazeer's noisy top-k during training.
        balance_weight (`float`, defaults to 0.1): weight of the CV^2 expert-importance loss.
        relations, formats, unseen_tasks: the task grid (see ``tasks.py``) and the ``relation/format`` pairs held
            out from generator training.
        n_train, n_test (`int`): queries per task from the suites' train / test splits.
        n_shots (`int`, defaults to 3): few-shot lines in a system prompt; prompt_variants: system prompts per task.
        steps, tasks_per_step, examples_per_task, lr: training, one budget for every trained system (the same
            batches; the per-task LoRAs split each batch by task).
        baseline_rank (`int`, *optional*): rank of every LoRA baseline (each per-task adapter too); default:
            matched to LoRA-Gen's trainable parameters (rounded up).
        latency_new_tokens (`int`, defaults to 8): greedy tokens per timed query (KV cache on, fixed length).
        latency_queries (`int`, defaults to 2): test queries timed; timing_repeats (6): interleaved rounds.
        merge_repeats (`int`, defaults to 3): timed runs of the one-time generate-and-merge.
    """

    model: str = param("smollm2-135m", "edge model", paper="TinyLLaMA-1.1B (reasoning), Gemma-2B (agents)")
    cloud_model: str = param("gemma3-270m", "frozen cloud model", paper="larger LoRA-tuned LM [not verified]")
    mode: str = param("frozen_cloud", "meta tokens from cached frozen cloud states", choices=MODES)
    n_experts: int = param(8, "LoRA experts per edge block", paper="not verified")
    rank: int = param(4, "rank of each expert", paper="not verified")
    top_k: int = param(2, "experts kept per block (KeepTopK)", paper="not verified")
    lora_alpha: float = param(8.0, "LoRA alpha (scale alpha / rank)", paper="not verified")
    n_top_layers: int = param(6, "LoRA on the last N edge blocks (bottom blocks cached)", paper="not verified")
    targets: list = param(["gate_proj", "up_proj", "down_proj"], "edge modules with LoRA", paper="not verified")
    attn_dim: int = param(64, "meta-token / cross-attention width")
    noisy_gating: bool = param(True, "noisy top-k gating during training", paper="noisy top-k [not verified]")
    balance_weight: float = param(0.1, "weight of the CV^2 importance loss", paper="not verified; Shazeer: 0.1")
    relations: list = param(["continent", "first_letter", "uppercase"], "relations of the task grid")
    formats: list = param(list(FORMAT_NAMES), "output formats of the task grid")
    unseen_tasks: list = param(
        ["continent/upper", "first_letter/bracket"], "relation/format pairs held out in training"
    )
    n_train: int = param(32, "training queries per task (suite train split)")
    n_test: int = param(12, "test queries per task (suite test split)")
    n_shots: int = param(5, "few-shot lines in each system prompt", paper="description + few-shot examples")
    prompt_variants: int = param(2, "system prompts per task (different shots)")
    steps: int = param(60, "optimiser steps (every trained system alike; per-task LoRAs split each batch by task)")
    tasks_per_step: int = param(4, "tasks per step")
    examples_per_task: int = param(8, "examples per task per step")
    lr: float = param(3e-3, "AdamW learning rate (every trained system)")
    baseline_rank: int | None = param(None, "rank of every LoRA baseline (None: matched trainable parameters)")
    latency_new_tokens: int = param(8, "greedy tokens per timed query")
    latency_queries: int = param(2, "test queries in the latency comparison")
    timing_repeats: int = param(6, "interleaved timing rounds (>= 6: the claim check needs 6 paired values)")
    merge_repeats: int = param(3, "timed runs of generate-and-merge")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("n_experts", self.n_experts, 1)
        check_range("rank", self.rank, 1)
        check_range("top_k", self.top_k, 1, self.n_experts)
        check_range("lora_alpha", self.lora_alpha, 0.0, open_lo=True)
        check_range("n_top_layers", self.n_top_layers, 1)
        check_range("attn_dim", self.attn_dim, 1)
        check_range("balance_weight", self.balance_weight, 0.0)
        for name, values, allowed in (
            ("relations", self.relations, RELATION_NAMES),
            ("formats", self.formats, FORMAT_NAMES),
        ):
            if not values:
                raise ValueError(f"{name} must list at least one of {', '.join(allowed)}, got []")
            for v in values:
                if v not in allowed:
                    raise ValueError(f"{name} entries must be one of {', '.join(allowed)}, got {v!r}")
        if not self.targets:
            raise ValueError("targets must list at least one module name, got []")
        for u in self.unseen_tasks:
            parts = str(u).split("/")
            if len(parts) != 2 or parts[0] not in self.relations or parts[1] not in self.formats:
                raise ValueError(f"unseen_tasks entries must be relation/format within relations x formats, got {u!r}")
        check_range("n_train", self.n_train, 1)
        check_range("n_test", self.n_test, 1)
        check_range("n_shots", self.n_shots, 0)
        check_range("prompt_variants", self.prompt_variants, 1)
        check_range("steps", self.steps, 1)
        check_range("tasks_per_step", self.tasks_per_step, 1)
        check_range("examples_per_task", self.examples_per_task, 1)
        check_range("lr", self.lr, 0.0, open_lo=True)
        check_range("baseline_rank", self.baseline_rank, 1)
        check_range("latency_new_tokens", self.latency_new_tokens, 1)
        check_range("latency_queries", self.latency_queries, 1)
        check_range("timing_repeats", self.timing_repeats, 1)
        check_range("merge_repeats", self.merge_repeats, 1)
