"""Configuration of control-variates win-rate estimation and its reproduction on the response cache."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param


@dataclass
class CVWinrateConfig(BaseConfig):
    """Control Variates Evaluation (Zhou, Song & Zanette, ICML 2025) against human-only, synthetic-only and PPI.

    Args:
        cache (`str`, defaults to ``"mixed"``): response-cache suite (``"synthetic"``: `synthetic_cache`).
        cache_seed (`int`, defaults to 0): seed of the cache file.
        max_pairs (`int`, defaults to 78): model pairs used, in pool order (`--limit` caps it).
        n_labels (`list[int]`): human-label counts n (kept where n <= N/2).
        claim_n (`int`, defaults to 50): n of the gated MSE / bias checks (the largest kept n <= it).
        repeats (`int`, defaults to 2000): random labeled subsets per pair and n.
        tau, tie_eps, style_weight: the simulated human (lmlab's; the paper has real humans).
        keep_ties (`bool`): keep tied labels (official `keep_ties` switch).
        judge_temperature (`float`): T of the log-prob judge σ((ℓ_A − ℓ_B)/T).
        finetune_l2 (`float`): L2 of the finetuned judge's logistic head.
    """

    cache: str = param("mixed", "response-cache suite; 'synthetic' = the planted synthetic_cache")
    cache_seed: int = param(0, "seed of the response-cache file")
    max_pairs: int = param(78, "model pairs used (pool order)", paper="LLM pairs of Chatbot Arena / MT-Bench")
    n_labels: list = param([10, 20, 50, 100], "human-label counts n (n <= N/2 kept)")
    claim_n: int = param(50, "n of the gated checks")
    repeats: int = param(2000, "random labeled subsets per pair and n", paper="bootstrap repeats [code]")
    tau: float = param(0.25, "simulated-human temperature τ", paper="real human labels")
    tie_eps: float = param(0.05, "|q_A - q_B| below this is a tie (½)")
    style_weight: float = param(0.1, "weight of conciseness in the simulated human's quality")
    keep_ties: bool = param(True, "keep tied labels", paper="keep_ties switch [code]")
    judge_temperature: float = param(1.0, "T of the log-prob judge", paper="σ(r_A − r_B), T = 1 [paper]")
    finetune_l2: float = param(1.0, "L2 of the finetuned judge's logistic head")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.cache:
            raise ValueError("cache must name a response-cache suite (e.g. 'mixed') or 'synthetic', got ''")
        check_range("cache_seed", self.cache_seed, 0)
        check_range("max_pairs", self.max_pairs, 1)
        if not self.n_labels or any(int(n) < 2 for n in self.n_labels):
            raise ValueError(f"n_labels must list human-label counts >= 2, got {self.n_labels!r}")
        check_range("claim_n", self.claim_n, 2)
        check_range("repeats", self.repeats, 10)
        check_range("tau", self.tau, 0.0, open_lo=True)
        check_range("tie_eps", self.tie_eps, 0.0)
        check_range("style_weight", self.style_weight, 0.0, 1.0)
        check_range("judge_temperature", self.judge_temperature, 0.0, open_lo=True)
        check_range("finetune_l2", self.finetune_l2, 0.0, open_lo=True)
