"""Configuration of NZ-LoRA (Init[AB]) and its reproduction: a learning-rate sweep x {zero, nz, nz+reset}."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param

# the same tuples as method.py's (kept here so that reading the config imports no torch; a test checks they agree)
INIT_MODES = ("zero", "nz", "nz_reset")
B_FANS = ("in", "out")
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class NonZeroLoRAConfig(BaseConfig):
    """NZ-LoRA (Li et al., ICML 2025) against peft's zero init on a learning-rate sweep.

    Every (seed, init, lr) run trains a fresh LoRA for `steps` AdamW steps at a constant lr (no weight decay, no
    warm-up) on the task bank's ``geography/<task>`` train split, on the top `train_layers` blocks of `model` (the
    frozen trunk below is cached once), and scores the held-out test items by the NLL of the gold answer (teacher
    forcing) and by greedy exact match. Seeds change the LoRA init draws and the batch order, never the data; the
    claims' unit is the held-out item (values of every seed clustered by item), and each gated claim is checked
    again on its least favourable seed (the sign must hold in every seed's mean).

    Every init's best lr is chosen on dev by the shared search (`lmlab.core.training.lr_search.search_lr`, the same
    rule for every init): the first seed's dev NLL at each grid lr, and a choice on an edge of the grid extends it
    one step past that edge at the grid's own ratio there, up to `lr_max_extensions` first-seed runs per init; the
    other seeds then run at each chosen lr outside the grid. A choice still on an edge after them marks the claims
    that use it fragile. The gated claims compare the inits at fixed grid lrs, which no search enters.

    Budget (default, 2 quiet cores, estimated from the 2-seed run's ~6 s per run + ~15 s loading): 5 grid lrs x 3
    inits x 3 seeds = 45 runs, plus the search's runs past the top edge (the last run chose the top lr, 1e-3, for
    every init): 2 per init on the first seed and, at a chosen extension, the 2 other seeds for zero, nz, nz_reset
    = 12 runs; 57 runs ~ 360 s. Over the 5-minute target, inside the 10-minute allowance, because the claim needs
    both ends: the gated lrs are the smallest (the paper's claim is about small learning rates), and the best-lr
    comparison needs the search past the top.

    Args:
        lrs (`list[float]`): the learning-rate grid (paper: sweeps over ~1e-5..1e-3 [verify]); its `claim_lrs`
            smallest are the gated lrs.
        lr_max_extensions (`int`, defaults to 2): first-seed runs per init past an edge of `lrs` (0 = the grid only).
        inits (`list[str]`): init modes run, among ``zero`` (peft's Init[A]), ``nz`` (Init[AB]), ``nz_reset``.
        n_seeds (`int`, defaults to 3): training seeds, i.e. init draws and batch orders (>= 3 in the default run:
            effects of 0.02-0.07 nats may be no larger than init-draw variance; 1 = no seed check).
        steps (`int`): optimiser steps per run (equal for every run). train_batch (`int`): sequences per step.
        rank, alpha, target_modules: the LoRA (peft ``LoraConfig``).
        beta (`float`, defaults to 1.0): β_A = β_B of the non-zero inits (1 = peft's bound for A).
        b_fan (`str`, defaults to ``"in"``): dimension in B's bound (``in`` [3rd-party code] or ``out`` [verify]).
        train_layers (`int`): top blocks carrying the LoRA (the CPU budget; the paper adapts every layer).
        task (`str`): the task-bank geography task trained and scored.
        eval_items, dev_items (`int`): test items scored; dev items that pick each init's best lr (first seed).
        claim_lrs (`int`, defaults to 2): the smallest lrs at which "nz NLL < zero NLL" is gated.
        beta_sweep (`list[float]`): extra β values run for ``nz`` and ``nz_reset`` at `beta_sweep_lr` ([] = off).
    """

    lrs: list = param([1e-5, 3e-5, 1e-4, 3e-4, 1e-3], "learning-rate grid (constant lr)",
                      paper="sweeps ~1e-5..1e-3 per task [verify]")  # fmt: skip
    lr_max_extensions: int = param(2, "dev-search runs per init past an edge of lrs, at the grid's ratio there "
                                      "(first seed)")  # fmt: skip
    inits: list = param(list(INIT_MODES), "init modes among " + ", ".join(INIT_MODES))
    n_seeds: int = param(3, "training seeds (LoRA init draws and batch order); claims cluster them by item and "
                            "check the sign in every seed")  # fmt: skip
    steps: int = param(30, "AdamW steps per run", paper="epochs of full datasets [verify]")
    train_batch: int = param(8, "sequences per optimiser step", paper="16 [verify]")
    rank: int = param(8, "LoRA rank r", paper="[verify]")
    alpha: float = param(16.0, "LoRA alpha (s = alpha / r)", paper="[verify]")
    target_modules: list = param(["q_proj", "v_proj", "up_proj", "down_proj"], "LoRA target modules",
                                 paper="q,k,v,o,up,down (Llama) [verify]")  # fmt: skip
    beta: float = param(1.0, "init scale beta of both factors, U(±sqrt(beta/n_in))", paper="swept [verify]")
    b_fan: str = param("in", "dimension in B's bound", paper="n_in [3rd-party code]", choices=B_FANS)
    train_layers: int = param(4, "top blocks carrying the LoRA over a cached frozen trunk", paper="all layers")
    task: str = param("iso3", "task-bank geography task", choices=("iso3", "currency_code", "capital", "continent"))
    eval_items: int = param(50, "held-out test items scored")
    dev_items: int = param(24, "dev items that select each init's best lr")
    claim_lrs: int = param(2, "number of smallest lrs where nz < zero is gated")
    max_grad_norm: float = param(1.0, "gradient-norm clip", paper="1.0 (HF Trainer default) [verify]")
    beta_sweep: list = param([], "extra betas for nz and nz_reset at beta_sweep_lr ([] = off)",
                             paper="init-scale ablation [verify]")  # fmt: skip
    beta_sweep_lr: float = param(1e-4, "lr of the beta sweep")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.lrs or len(set(self.lrs)) != len(self.lrs):
            raise ValueError(f"lrs must be a non-empty list of distinct learning rates, got {self.lrs}")
        for lr in self.lrs:
            check_range("lrs entries", lr, 0.0, 1.0, open_lo=True)
        for m in self.inits:
            if m not in INIT_MODES:
                raise ValueError(f"inits entries must be among {', '.join(INIT_MODES)}, got {m!r}")
        for need in ("zero", "nz"):
            if need not in self.inits:
                raise ValueError(f"inits must include {need!r} (the gated comparison), got {self.inits}")
        check_range("lr_max_extensions", self.lr_max_extensions, 0)
        check_range("n_seeds", self.n_seeds, 1)
        check_range("steps", self.steps, 1)
        check_range("train_batch", self.train_batch, 1)
        check_range("rank", self.rank, 1)
        check_range("alpha", self.alpha, 0.0, open_lo=True)
        if not self.target_modules or any(t not in TARGETS for t in self.target_modules):
            raise ValueError(f"target_modules must be a non-empty subset of {', '.join(TARGETS)} (never the tied "
                             f"embedding), got {self.target_modules}")  # fmt: skip
        check_range("beta", self.beta, 0.0, open_lo=True)
        check_range("train_layers", self.train_layers, 1)
        check_range("eval_items", self.eval_items, 6)
        check_range("dev_items", self.dev_items, 1)
        if not 1 <= self.claim_lrs <= len(self.lrs):
            raise ValueError(f"claim_lrs must be in [1, {len(self.lrs)}] (the number of lrs), got {self.claim_lrs}")
        check_range("max_grad_norm", self.max_grad_norm, 0.0, open_lo=True)
        for b in self.beta_sweep:
            check_range("beta_sweep entries", b, 0.0, open_lo=True)
        if len(set(self.beta_sweep)) != len(self.beta_sweep):
            raise ValueError(f"beta_sweep entries must be distinct, got {self.beta_sweep}")
        check_range("beta_sweep_lr", self.beta_sweep_lr, 0.0, 1.0, open_lo=True)
