"""Configuration of cascade routing and its reproduction on the response cache (no model is loaded)."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_distinct_seeds, check_range, param

# the spec's cost-sorted pool (selection.md, "Reproduction in lmlab"): heterogeneous, from junk to self-consistency
DEFAULT_POOL = ("tiny-random", "smol", "smol-fewshot", "gemma-fewshot", "smol-pot", "smol-sc5")


@dataclass
class CascadeRoutingConfig(BaseConfig):
    """Cascade routing (Dekoninck et al., ICML 2025) vs routing, the optimal cascade, the threshold cascade and the
    linear interpolation of single models, on lmlab's response cache.

    One cache per cache seed (`cache_seeds`: independent samples of queries, shots and model samples, the replicate
    of the whole pipeline). Per seed, each split permutes its queries: `test_fraction` are the test queries; of the
    rest, `fit_fraction` fit the quality estimators and the others tune λ (disjoint, as the official README asks).
    Budgets sweep `budgets_per_interval` points between consecutive single-model costs; the metric is the normalised
    area under the test quality-cost curve (x100). The claims' unit is the test query: `bootstrap` resamples of
    each seed's queries (stratified by seed), every AUC recomputed; a gated check also needs its effect's sign on
    every seed.

    Budget: the default (3 seeds x 1 split of 480 queries, 6 variants) is estimated at about 30 s on 2 quiet cores
    (the run on one 120-query seed took 1.0 s per split, linear in queries) plus the bootstrap; well within 5 min.

    Args:
        cache (`str`, defaults to ``"mixed"``): response-cache suite (``load_cache``) or ``"synthetic"``.
        cache_seeds (`list[int]`, defaults to ``[0, 1, 2]``): the cache seeds (one cache each).
        variants (`list[str]`): pool (empty: every variant of the cache), sorted by mean cost.
        splits (`int`, defaults to 1): random train/test splits per cache seed.
        max_depth (`int`, defaults to 3): at most this many models per query for cascade routing.
        search_evals (`int`, defaults to 50): per-step λ search evaluations (0: constant λ only).
        option_features (`bool`, defaults to `True`): the option-probability features where the cache has them.
        noise_levels (`list`): (σ_before, σ_after) pairs of the simulation sweep (RouterBench low / medium / high).
        bootstrap (`int`, defaults to 1000): query resamples of the claims' CIs.
    """

    cache: str = param("mixed", "response-cache suite, or 'synthetic' (a planted table)")
    cache_seeds: list = param([0, 1, 2], "cache seeds, one cache each (the replicates; CIs stratified by seed)")
    synthetic_queries: int = param(120, "queries of the synthetic cache (cache='synthetic')")
    synthetic_variants: int = param(6, "variants of the synthetic cache (cache='synthetic')")
    variants: list = param(
        list(DEFAULT_POOL),
        "pool of variants, sorted by mean cost; those missing from the cache "
        "are skipped (fewer than 2 present, or []: every variant, at most 8)",
    )
    splits: int = param(1, "random train/test splits per cache seed", paper="a fixed split per benchmark")
    test_fraction: float = param(0.5, "share of queries held out for testing")
    fit_fraction: float = param(0.5, "share of the training queries fitting the estimators (the rest tunes λ)",
                                paper="estimator and λ data disjoint (README)")  # fmt: skip
    max_depth: int = param(3, "most models run per query by cascade routing", paper="optional (max_depth)")
    force_order: bool = param(True, "run models in pool (cost) order, skips allowed", paper="cascade mode")
    do_speedup: bool = param(True, "Lemma-1 pruning of supermodels", paper="on (do_speedup)")
    max_lambda: float = param(1e4, "start of the λ doubling (costs are normalised by the dearest model)", paper="1e4")
    const_iterations: int = param(30, "bisection steps of the constant-λ strategy", paper="20-30 (routing 50-100)")
    search_evals: int = param(50, "per-step λ search evaluations (0: constant λ only)", paper="TPE, 100-300")
    max_factor: float = param(4.0, "per-step search range: U(0, max_factor x constant λ)", paper="4")
    n_samples: int = param(100, "scrambled-Sobol samples of E[max]", paper="100")
    budgets_per_interval: int = param(5, "budgets per interval between consecutive single-model costs", paper="5")
    lr_c: float = param(1.0, "inverse L2 strength of the logistic quality estimators", paper="sklearn default 1.0")
    option_features: bool = param(True, "top option probability, entropy and JS divergence (MC rows)",
                                  paper="add_entropy, add_js_divergence on")  # fmt: skip
    bootstrap: int = param(1000, "query resamples (stratified by cache seed) of the claims' CIs")
    noise_levels: list = param([[0.6, 0.3], [1.6, 0.8], [2.4, 1.2]], "(σ_before, σ_after) of the simulation sweep",
                               paper="low 0.6/0.3, medium 1.6/0.8, high 2.4/1.2")  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.cache, str) or not self.cache:
            raise ValueError(f"cache must be a suite name or 'synthetic', got {self.cache!r}")
        check_range("synthetic_queries", self.synthetic_queries, 6)
        check_range("synthetic_variants", self.synthetic_variants, 2, 10)
        if self.variants and len(self.variants) < 2:
            raise ValueError(f"variants must list >= 2 models (or be empty for all), got {self.variants}")
        check_distinct_seeds("cache_seeds", self.cache_seeds)
        check_range("splits", self.splits, 1)
        check_range("bootstrap", self.bootstrap, 100)
        check_range("test_fraction", self.test_fraction, 0.05, 0.95)
        check_range("fit_fraction", self.fit_fraction, 0.05, 0.95)
        check_range("max_depth", self.max_depth, 1)
        check_range("max_lambda", self.max_lambda, 0.0, open_lo=True)
        check_range("const_iterations", self.const_iterations, 1)
        check_range("search_evals", self.search_evals, 0)
        check_range("max_factor", self.max_factor, 1.0)
        check_range("n_samples", self.n_samples, 2)
        check_range("budgets_per_interval", self.budgets_per_interval, 2)
        check_range("lr_c", self.lr_c, 0.0, open_lo=True)
        if not self.noise_levels or any(
            not isinstance(p, list | tuple) or len(p) != 2 or min(p) < 0 for p in self.noise_levels
        ):
            raise ValueError(
                f"noise_levels must be a non-empty list of [σ_before, σ_after] >= 0, got {self.noise_levels}"
            )
