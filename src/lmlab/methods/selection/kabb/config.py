"""Configuration of KABB and its reproduction: a bandit stream over the response cache (no model is loaded)."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_distinct_seeds, check_range, param

# the spec's experts (selection.md, kabb "Reproduction in lmlab"): domain experts, generalists and a junk floor
DEFAULT_EXPERTS = ("smol-pot", "smol-lora-geo", "gemma-fewshot", "smol-sc5", "smol", "tiny-random")


@dataclass
class KABBConfig(BaseConfig):
    """KABB (Zhang et al., ICML 2025) vs Thompson sampling, UCB1, random-k, all experts and the best fixed subset.

    Experts are the cache's variants; a round draws one query of the stream, the bandit picks `top_k` experts, their
    cached answer keys are voted (weights: posterior means), and each chosen expert is rewarded with its own
    correctness. Capability tags come from a profiling split disjoint from the stream (the tasks where an expert
    beats the pool's mean accuracy). The task mix drifts at round `rounds` x `drift_at`. Each cache seed's queries are
    dealt into `blocks` disjoint blocks; a (cache seed, block) is the claims' unit, with `seeds` bandit runs each.

    Budget: default 3 cache seeds x 4 blocks x 5 seeds = 60 runs of 2,000 rounds, about 3x the 20 runs of the
    earlier design (measured 16.5 s): about 1 min on 2 quiet cores, within the 5-minute budget.

    Args:
        cache (`str`, defaults to ``"mixed"``): response-cache suite, or ``"synthetic"``.
        cache_seeds (`list`, defaults to [0, 1, 2]): the cache seeds read (independent replicates).
        blocks (`int`, defaults to 4): disjoint query blocks per cache seed (the CI unit).
        rounds (`int`, defaults to 2000): bandit rounds per run.
        seeds (`int`, defaults to 5): bandit runs per block (averaged inside the unit).
        top_k (`int`, defaults to 2): experts per query.
        gamma (`float`, defaults to 0.99): per-round decay of α, β.
    """

    cache: str = param("mixed", "response-cache suite, or 'synthetic' (a planted table)")
    synthetic_queries: int = param(120, "queries of the synthetic cache (cache='synthetic')")
    synthetic_variants: int = param(6, "variants of the synthetic cache (cache='synthetic')")
    variants: list = param(
        list(DEFAULT_EXPERTS),
        "expert pool; those missing from the cache are skipped (fewer than top_k + 1 present, or []: every variant)",
    )
    cache_seeds: list = param([0, 1, 2], "cache seeds read, one cache each (independent queries, shots, samples)")
    blocks: int = param(4, "disjoint query blocks per cache seed, stratified by task (the claims' unit)")
    rounds: int = param(2000, "bandit rounds per run", paper="[verify]")
    seeds: int = param(5, "bandit runs per (cache seed, block), averaged inside the unit")
    top_k: int = param(2, "experts selected per query", paper="2 [code]")
    gamma: float = param(0.99, "decay of α and β per round", paper="0.99 per wall-clock second [code]")
    weights: list = param([0.4, 0.3, 0.3], "distance weights (w1 overlap, w2 dependency, w3 history)",
                          paper="(0.4, 0.3, 0.3) [code]")  # fmt: skip
    use_hist: bool = param(True, "the hist term of the distance (double-counts the posterior)", paper="on [code]")
    difficulty_range: list = param([1.0, 5.0], "task difficulty range [min, max]", paper="[1, 5] [code]")
    alpha_floor: float = param(1e-3, "clamp of α·exp(-Dist)", paper="unclamped [code]")
    profile_fraction: float = param(0.3, "share of each task's queries profiling the capability tags (not streamed)")
    drift_at: float = param(0.5, "the task mix drifts at this fraction of the rounds")
    drift_share: float = param(0.8, "share of the stream drawn from the favoured half of the tasks in each phase")
    epsilon: float = param(0.1, "exploration rate of the ε-greedy baseline")
    cold_rounds: int = param(200, "rounds of the cold-start accuracy")
    window: int = param(200, "rounds after the drift of the recovery accuracy")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.cache, str) or not self.cache:
            raise ValueError(f"cache must be a suite name or 'synthetic', got {self.cache!r}")
        check_range("synthetic_queries", self.synthetic_queries, 6)
        check_range("synthetic_variants", self.synthetic_variants, 2, 10)
        check_distinct_seeds("cache_seeds", self.cache_seeds)
        check_range("blocks", self.blocks, 1, 50)
        check_range("rounds", self.rounds, 10)
        check_range("seeds", self.seeds, 1)
        check_range("top_k", self.top_k, 1)
        if self.variants and len(self.variants) <= self.top_k:
            raise ValueError(f"variants must list more than top_k={self.top_k} experts, got {self.variants}")
        check_range("gamma", self.gamma, 0.0, 1.0, open_lo=True)
        if len(self.weights) != 3 or min(self.weights) < 0:
            raise ValueError(f"weights must be three values >= 0, got {self.weights}")
        if len(self.difficulty_range) != 2 or self.difficulty_range[0] > self.difficulty_range[1]:
            raise ValueError(f"difficulty_range must be [min, max] with min <= max, got {self.difficulty_range}")
        check_range("alpha_floor", self.alpha_floor, 0.0, 1.0, open_lo=True)
        check_range("profile_fraction", self.profile_fraction, 0.05, 0.9)
        check_range("drift_at", self.drift_at, 0.1, 0.9)
        check_range("drift_share", self.drift_share, 0.0, 1.0)
        check_range("epsilon", self.epsilon, 0.0, 1.0)
        check_range("cold_rounds", self.cold_rounds, 1)
        check_range("window", self.window, 1)
        if self.cold_rounds > self.rounds:
            raise ValueError(f"cold_rounds must be <= rounds ({self.rounds}), got {self.cold_rounds}")
