"""Configuration of IBCircuit and its reproduction (IOI, digit greater-than, induction ground truth)."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param

TASKS = ("induction", "ioi", "greater_than")
SYSTEMS = ("ibcircuit", "eap", "hap", "random")


@dataclass
class IBCircuitConfig(BaseConfig):
    """IBCircuit (Bian et al., ICML 2025) node-level discovery vs attribution patching, head importance and random.

    Per task: ω is fitted on `n_fit` prompts (``split="fit"``); EAP and HAP are computed on the same prompts; every
    method's ranking is then scored on `n_eval` held-out prompts by the same position-wise mean ablation (the mean
    of each head's output over the fit prompts) at every circuit size in `ks`. Prompts are the independent unit.
    Gated on IOI: |F − 1| (F the normalised faithfulness, mean over `ks`) and KL, each below every baseline's.

    Budget: meant for the 5-minute class (142 s measured at n_eval = 16, 2026-12-04; ~170 s estimated at n_eval =
    48); the n_eval = 48 run of 2026-12-07 took 337 s contended (load ~3.5 on 2 cores): a quiet time is still due.

    Args:
        tasks (`list[str]`): among ``induction`` (hand-built 2-layer model with known heads), ``ioi``,
            ``greater_than`` (both on `model`).
        n_fit, n_eval (`int`, defaults to 16, 48): prompts to fit on (paper: 100, full batch) / held-out prompts
            to score on (48: the gated |F − 1| check resolves ≈ 0.1 of the full model's metric there, 16 resolved
            ≈ 0.18, see the README's Power; scoring is ~32 gradient-free forwards per task, so the 32 extra
            prompts cost ~12 s per real task (estimated) against ~50 s of fitting).
        steps (`int`, defaults to 60): Adam steps of IBCircuit on the real model (paper: 1300 epochs).
        induction_steps (`int`, defaults to 100): Adam steps on the tiny induction model.
        lr (`float`, defaults to 0.1): Adam learning rate (paper: 0.05).
        alpha, beta (`float`, defaults to 1, 1): faithfulness / compression weights (paper: 1, 1).
        init_mean, init_std (`float`, defaults to 5.0, 0.01): ω initialisation (paper: same).
        per_example (`bool`, defaults to `True`): one ω per prompt and head (official code).
        loss (`str`, defaults to ``"kl"``): faithfulness term, ``kl`` or ``ce`` (official default ``kl``).
        ib_seed (`int`, defaults to 42): seed of ω's init and the noise (official 42).
        ks (`list[int]`): circuit sizes of the faithfulness curve (clipped to the model's head count).
        thresholds (`list[float]`): λ̄ thresholds of the official readout (reported).
        n_random (`int`, defaults to 3): random rankings averaged per prompt for the random baseline.
        hap_reference (`str`, defaults to ``"mean"``): HAP's gate interpolates toward the mean (the evaluation's
            ablation) or toward zero (Michel et al.'s ξ·z).
        exact_patching (`bool`, defaults to `False`): also rank real-model heads by one-at-a-time mean-ablation
            patching (L·H forwards, 270 on SmolLM2); always on for the induction model.
    """

    tasks: list = param(list(TASKS), "tasks run, among: " + ", ".join(TASKS), paper="IOI, Greater-Than")
    n_fit: int = param(16, "prompts the bottleneck is fitted on (full batch)", paper="100")
    n_eval: int = param(48, "held-out prompts every circuit is scored on (the independent unit of every check)")
    steps: int = param(60, "Adam steps of IBCircuit on the real model", paper="1300 full-batch epochs [code]")
    induction_steps: int = param(100, "Adam steps of IBCircuit on the tiny induction model")
    lr: float = param(0.1, "Adam learning rate of ω", paper="0.05 [code]")
    alpha: float = param(1.0, "weight of the faithfulness KL", paper="1 [code]")
    beta: float = param(1.0, "weight of the compression KL", paper="1 [code]")
    init_mean: float = param(5.0, "mean of ω's initialisation (λ = sigmoid(5) ≈ 0.993)", paper="5.0 [code]")
    init_std: float = param(0.01, "std of ω's initialisation", paper="0.01 [code]")
    per_example: bool = param(True, "one ω per prompt and head (False: one per head)", paper="True [code]")
    loss: str = param("kl", "faithfulness term", paper="'kl' [code]", choices=("kl", "ce"))
    ib_seed: int = param(42, "seed of ω's init and the bottleneck noise", paper="42 [code]")
    ks: list = param(
        [5, 10, 20, 40, 80],
        "circuit sizes (top-k heads) of the faithfulness curve",
        paper="thresholds 0.8/0.6/0.4/0.2 and curves over nodes",
    )
    thresholds: list = param([0.8, 0.6, 0.4, 0.2], "λ̄ thresholds of the official readout", paper="same [code]")
    n_random: int = param(3, "random rankings averaged per prompt (random baseline)")
    hap_reference: str = param("mean", "HAP gate target", paper="zero (ξ·z, Michel et al.)", choices=("mean", "zero"))
    exact_patching: bool = param(False, "rank real-model heads by one-at-a-time mean-ablation patching too")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.tasks or any(t not in TASKS for t in self.tasks):
            raise ValueError(f"tasks must be a non-empty list among {', '.join(TASKS)}, got {self.tasks!r}")
        check_range("n_fit", self.n_fit, 2)
        check_range("n_eval", self.n_eval, 1)
        check_range("steps", self.steps, 0)
        check_range("induction_steps", self.induction_steps, 0)
        check_range("lr", self.lr, 0.0, open_lo=True)
        check_range("alpha", self.alpha, 0.0)
        check_range("beta", self.beta, 0.0)
        if self.alpha == 0 and self.beta == 0:
            raise ValueError("alpha and beta cannot both be 0, got alpha=0, beta=0")
        check_range("init_std", self.init_std, 0.0)
        if not self.ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in self.ks):
            raise ValueError(f"ks must be a non-empty list of ints >= 1, got {self.ks!r}")
        if any(not isinstance(t, (int, float)) or not 0.0 <= t <= 1.0 for t in self.thresholds):
            raise ValueError(f"thresholds must be numbers in [0, 1], got {self.thresholds!r}")
        check_range("n_random", self.n_random, 1)
