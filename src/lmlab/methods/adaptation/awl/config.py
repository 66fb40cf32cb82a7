"""Configuration of AWL (WKL -> easy/hard split -> mixed TUA SFT) and its reproduction against base, WKL only and
tool-only SFT."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param

SYSTEMS = ("awl", "tool_only", "wkl", "base")
DOMAINS = ("arithmetic", "geography")
BALANCES = ("repeat", "none")


@dataclass
class AWLConfig(BaseConfig):
    """AWL (Lyu et al., ICML 2025) on two tool domains, with the paper's ablations as baselines.

    Training problems (task-bank train splits) get their solution from lmlab's tools (calculator, country lookup):
    stage 1 (WKL) fine-tunes the top `train_layers` blocks of `model` (frozen trunk cached once) on no-tool prompt
    -> tool-free solution; the WKL model answers every training problem greedily without tools (easy = correct);
    stage 2 continues from the WKL weights on the mixed data (WKL again, easy -> ``Action: answer_question`` +
    solution, hard -> tool trace; minority repeated). Tool-only SFT trains a fresh copy on tool traces for every
    problem for the same total steps. Every system answers the held-out test items (task-bank test splits) without
    tools and with tools (ReAct decoding, tools executed, <= 2 turns); test easy/hard is each system's own no-tool
    correctness. Held-out items are the claims' unit.

    Args:
        domains (`list[str]`): ``arithmetic`` (calculator) and/or ``geography`` (lookup).
        n_train, n_test (`int`): problems per domain (train / test splits).
        systems (`list[str]`): among ``awl``, ``tool_only``, ``wkl`` (stage 1 alone), ``base``.
        stage1_steps, stage2_steps (`int`): SFT steps of each stage (tool-only SFT gets their sum).
        train_batch (`int`): sequences per step (paper: effective batch 16).
        lr, warmup_ratio: AdamW with a cosine schedule and linear warm-up.
        train_layers (`int`): top blocks fine-tuned over the frozen trunk (paper: full fine-tuning).
        balance (`str`): ``repeat`` (the code's rule) or ``none``.
        max_turns (`int`): model turns in the tool setting (a tool call, then the answer).
    """

    domains: list = param(list(DOMAINS), "tool domains among " + ", ".join(DOMAINS),
                          paper="Mujoco, PDE, Climate, Epidemiology, MATH, SciBench")  # fmt: skip
    n_train: int = param(40, "training problems per domain", paper="dataset-sized [verify]")
    n_test: int = param(32, "held-out test problems per domain (the claims' unit)", paper="dataset-sized [verify]")
    systems: list = param(list(SYSTEMS), "systems evaluated, among " + ", ".join(SYSTEMS),
                          paper="base, WKL only, tool-trace SFT, AWL")  # fmt: skip
    stage1_steps: int = param(20, "WKL SFT steps", paper="2 epochs")
    stage2_steps: int = param(20, "mixed (TUA) SFT steps, from the WKL weights", paper="2 epochs")
    train_batch: int = param(8, "sequences per optimiser step", paper="16 (1 x 16 accumulation)")
    lr: float = param(5e-4, "peak AdamW learning rate (top blocks)", paper="1e-5 (full FT of 8B) [verify]")
    warmup_ratio: float = param(0.1, "linear warm-up share of the steps (then cosine to 0)", paper="0.1")
    train_layers: int = param(2, "top blocks fine-tuned over the cached frozen trunk", paper="full fine-tuning")
    balance: str = param("repeat", "easy/hard balancing of the stage-2 data", paper="repeat minority",
                         choices=BALANCES)  # fmt: skip
    max_turns: int = param(2, "model turns in the tool setting", paper="agent loop until answer_question")
    max_new_tokens: int = param(32, "new tokens per turn (greedy)", paper="cutoff 5000 tokens")
    batch_size: int = param(16, "prompts per batched generation")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.domains:
            raise ValueError(f"domains must be a non-empty list among {', '.join(DOMAINS)}, got {self.domains!r}")
        for d in self.domains:
            if d not in DOMAINS:
                raise ValueError(f"domains entries must be among {', '.join(DOMAINS)}, got {d!r}")
        for s in self.systems:
            if s not in SYSTEMS:
                raise ValueError(f"systems entries must be among {', '.join(SYSTEMS)}, got {s!r}")
        if "awl" not in self.systems or len(set(self.systems)) < 2:
            raise ValueError(f"systems must include 'awl' and at least one baseline, got {self.systems!r}")
        check_range("n_train", self.n_train, 2)
        check_range("n_test", self.n_test, 1)
        check_range("stage1_steps", self.stage1_steps, 1)
        check_range("stage2_steps", self.stage2_steps, 1)
        check_range("train_batch", self.train_batch, 1)
        check_range("lr", self.lr, 0.0, 1.0, open_lo=True)
        check_range("warmup_ratio", self.warmup_ratio, 0.0, 0.5)
        check_range("train_layers", self.train_layers, 1)
        check_range("max_turns", self.max_turns, 1, 4)
