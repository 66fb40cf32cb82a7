"""Configuration of control-variates win-rate estimation and its reproduction on the response cache."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_distinct_seeds, check_range, param


@dataclass
class CVWinrateConfig(BaseConfig):
    """Control Variates Evaluation (Zhou, Song & Zanette, ICML 2025) against human-only, synthetic-only and PPI.

    Args:
        cache (`str`, defaults to ``"mixed"``): response-cache suite (``"synthetic"``: `synthetic_cache`).
        cache_seeds (`list[int]`, defaults to ``[0, 1, 2]``): the cache seeds of the zoo part, one cache each (a cache
            seed = another sample of queries, shots and model samples: the independent unit of every zoo row's CI).
        max_pairs (`int`, defaults to 78): model pairs used per cache seed, in pool order (`--limit` caps it).
        n_labels (`list[int]`): human-label counts n (kept where n <= N/2).
        claim_n (`int`, defaults to 50): n of the gated MSE / bias checks (the largest kept n <= it).
        repeats (`int`, defaults to 2000): random labeled subsets per pair and n.
        tau, tie_eps, style_weight: the simulated human (lmlab's; the paper has real humans).
        keep_ties (`bool`): keep tied labels (official `keep_ties` switch).
        judge_temperature (`float`): T of the log-prob judge σ((ℓ_A − ℓ_B)/T).
        finetune_l2 (`float`): L2 of the finetuned judge's logistic head.
        alpha_clip (`list`, defaults to ``[0.0, 2.0]``): range of the fitted α (``[]``: unclipped, the official code).
        sim_rho2 (`list`, defaults to ``[0.1, 0.3, 0.5]``): ρ² of the planted noisy-oracle judges (the gated sweep).
        sim_seeds (`int`, defaults to 20): simulated populations per ρ² (the independent unit of the sweep's CIs).
        sim_items, sim_gap_mean, sim_gap_sd, sim_judge_bias: a simulated population: N items with quality gap
            d ~ N(mean, sd), the simulated human's z, and ẑ = σ((d + bias + s·ξ)/τ).
        saving_tol (`float`, defaults to 0.05): the gated band |measured saving − ρ²| < tol.

    Budget: default 5.9 s on 2 quiet cores with one 120-query cache (measured, 77 pairs + the sweep); with the
    three 480-query caches (3 × 55 pairs, n ∈ {10, 20, 50, 100}) ≈ 40 s (estimate: 24 ms per 2000 labeled subsets
    of N = 480, measured, × 8 per pair × 165 pairs, + the 2 s sweep), quick ≈ 20 s; inside the 5-minute budget.
    """

    cache: str = param("mixed", "response-cache suite; 'synthetic' = the planted synthetic_cache")
    cache_seeds: list = param([0, 1, 2], "cache seeds of the zoo part, one cache each (the CI unit of its rows)")
    max_pairs: int = param(78, "model pairs used per cache seed (pool order)",
                           paper="LLM pairs of Chatbot Arena / MT-Bench")  # fmt: skip
    n_labels: list = param([10, 20, 50, 100], "human-label counts n (n <= N/2 kept)")
    claim_n: int = param(50, "n of the gated checks")
    repeats: int = param(2000, "random labeled subsets per pair and n", paper="bootstrap repeats [code]")
    tau: float = param(0.25, "simulated-human temperature τ", paper="real human labels")
    tie_eps: float = param(0.05, "|q_A - q_B| below this is a tie (½)")
    style_weight: float = param(0.1, "weight of conciseness in the simulated human's quality")
    keep_ties: bool = param(True, "keep tied labels", paper="keep_ties switch [code]")
    judge_temperature: float = param(1.0, "T of the log-prob judge", paper="σ(r_A − r_B), T = 1 [paper]")
    finetune_l2: float = param(1.0, "L2 of the finetuned judge's logistic head")
    alpha_clip: list = param([0.0, 2.0], "range of the fitted α ([] = unclipped)", paper="unclipped [code]")
    sim_rho2: list = param([0.1, 0.3, 0.5], "ρ² of the planted judges (gated sweep)",
                           paper="ρ² 0.06-0.25 of real reward models / GPT-4 [code: saving.json]")  # fmt: skip
    sim_seeds: int = param(20, "simulated populations per ρ² (the sweep's independent unit)")
    sim_items: int = param(400, "items N of a simulated population", paper="N = 400 (spec)")
    sim_gap_mean: float = param(0.1, "mean of the simulated quality gap d = q_A - q_B")
    sim_gap_sd: float = param(1.0, "sd of the simulated quality gap d (the zoo's 70% ties cap ρ² near 0.5)")
    sim_judge_bias: float = param(0.2, "bias b of the planted judge σ((d + b + s·ξ)/τ)")
    saving_tol: float = param(0.05, "gated band |measured saving - ρ²| < tol")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.cache:
            raise ValueError("cache must name a response-cache suite (e.g. 'mixed') or 'synthetic', got ''")
        check_distinct_seeds("cache_seeds", self.cache_seeds)
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
        clip = self.alpha_clip
        if clip and (len(clip) != 2 or not float(clip[0]) < float(clip[1])):
            raise ValueError(f"alpha_clip must be [] (unclipped) or [low, high] with low < high, got {clip!r}")
        rho2 = self.sim_rho2
        if not rho2 or any(not 0.0 < float(r) < 1.0 for r in rho2) or len({round(100 * r) for r in rho2}) < len(rho2):
            raise ValueError(f"sim_rho2 must list distinct (to 0.01) target ρ² values in (0, 1), got {rho2!r}")
        check_range("sim_seeds", self.sim_seeds, 2)
        check_range("sim_items", self.sim_items, 20)
        check_range("sim_gap_sd", self.sim_gap_sd, 0.0, open_lo=True)
        check_range("saving_tol", self.saving_tol, 0.0, 1.0, open_lo=True)
