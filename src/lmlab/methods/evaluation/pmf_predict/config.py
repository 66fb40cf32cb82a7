"""Configuration of PMF-by-MCMC score prediction and its reproduction on the response cache."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param


@dataclass
class PMFPredictConfig(BaseConfig):
    """PMF by Gibbs sampling (Zhao et al., ICML 2025) against mean-of-means, global mean and plain MF (ALS).

    One matrix per cache seed in `cache_seeds` (a cache seed = an independent sample of queries: the replicate):
    rows = variants, columns = (task, query chunk) slices of `items_per_cell` queries, cell = mean `column` over the
    slice. On each matrix, `seeds` random masks per level of `mask_levels`; the masks of one matrix overlap, so they
    are averaged, not counted: every gated claim resamples (cache seed, task) clusters, the disjoint query sets.

    Budget: the default preset runs 3 cache seeds x 3 levels x 10 masks (about 7 PMF fits each) plus 3 x 10 active
    masks x 4 orders x 6 fits, about 1,300 Gibbs fits of 200 sweeps on 13 x 24: an estimated 60-90 s on 2 quiet cores
    (within the 5 minute budget).

    Args:
        cache (`str`, defaults to ``"mixed"``): response-cache suite (``"synthetic"``: `synthetic_cache`).
        cache_seeds (`list[int]`, defaults to [0, 1, 2]): the cache files (independent query samples) read.
        items_per_cell (`int`, defaults to 20): queries per matrix cell (`--limit` caps it; the spec asks 16-20).
        column (`str`, defaults to ``"correct"``): the cached column averaged in a cell.
        mask_levels (`list[float]`): shares of cells held out (paper: 20% default, 80% sparse).
        seeds (`int`, defaults to 10): random masks per level and cache seed (averaged within a cluster).
        rank, alpha, n_burn, n_draws, init_std: PMF (paper: D = 10, α = 2, N(0, 0.05²) init, 500 tune + 100 draws).
        prior (`str`): ``fixed`` (paper PMF) or ``bpmf`` (Normal-Wishart hyperpriors); the other is reported too.
        tune (`bool`): also report a tuned PMF (``pmf_tuned``) and tune MF, each picking (rank, α) / (rank, λ) from
            its grid on a validation split of the train cells (same budget: the grids have the same size); the gated
            ``pmf`` is always the paper's (rank, alpha). False: MF takes its grid's first entry, no pmf_tuned.
        pmf_grid, mf_grid: the tuning grids.
        val_fraction (`float`): share of train cells held out for tuning.
        interval_level (`float`): level of the predictive intervals whose coverage is reported.
        active_mask, active_rounds, active_step: active evaluation (reveal `active_step` of all cells per round).
    """

    cache: str = param("mixed", "response-cache suite; 'synthetic' = the planted synthetic_cache")
    cache_seeds: list = param([0, 1, 2], "response-cache seeds (independent query samples; the CI replicate)")
    items_per_cell: int = param(20, "queries averaged in one (task, chunk) cell", paper="a whole dataset per cell")
    column: str = param("correct", "cached column averaged per cell", choices=("correct", "answer_logprob"))
    mask_levels: list = param([0.2, 0.5, 0.8], "shares of cells masked", paper="20% (default), 80% (sparse) [code]")
    seeds: int = param(10, "random masks per level and cache seed (averaged within a cluster, not the unit)")
    rank: int = param(10, "latent dimension D", paper="10 [code: run_pmf.py --dim]")
    alpha: float = param(2.0, "likelihood precision α (normalised scale)", paper="2 [code: --alpha]")
    n_burn: int = param(100, "Gibbs sweeps discarded", paper="500 NUTS tuning steps [code]")
    n_draws: int = param(100, "Gibbs sweeps kept", paper="100 NUTS draws [code: --draws]")
    init_std: float = param(0.05, "std of the initial U, V", paper="0.05 [code: --std]")
    prior: str = param(
        "fixed", "PMF prior of the method", paper="fixed N(0, I) (PMF) [code]", choices=("fixed", "bpmf")
    )
    tune: bool = param(True, "report a tuned PMF and tune MF on a validation split (the gated PMF is untuned)")
    pmf_grid: list = param([[10, 2.0], [2, 2.0], [10, 0.5], [2, 8.0]], "PMF (rank, alpha) candidates")
    mf_grid: list = param([[10, 1.0], [2, 1.0], [10, 10.0], [2, 0.1]], "plain MF (rank, ridge λ) candidates")
    val_fraction: float = param(0.2, "share of train cells held out for tuning")
    interval_level: float = param(0.9, "level of the predictive intervals")
    active_mask: float = param(0.8, "masked share in active evaluation", paper="80% [code: active_eval.py]")
    active_rounds: int = param(5, "reveal rounds", paper="9 rounds: 5%, 5%, then 10% [code]")
    active_step: float = param(0.05, "share of all cells revealed per round", paper="0.05 first rounds [code]")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.cache:
            raise ValueError("cache must name a response-cache suite (e.g. 'mixed') or 'synthetic', got ''")
        seeds = self.cache_seeds if isinstance(self.cache_seeds, list) else []
        if not seeds or any(type(c) is not int or c < 0 for c in seeds) or len(set(seeds)) != len(seeds):
            raise ValueError(f"cache_seeds must list distinct seeds >= 0, got {self.cache_seeds!r}")
        check_range("items_per_cell", self.items_per_cell, 1)
        if not self.mask_levels:
            raise ValueError("mask_levels must list at least one share in (0, 1), got []")
        for m in self.mask_levels:
            if not 0.0 < float(m) < 1.0:
                raise ValueError(f"mask_levels entries must be in (0, 1), got {m!r}")
        check_range("seeds", self.seeds, 1)
        check_range("rank", self.rank, 1)
        check_range("alpha", self.alpha, 0.0, open_lo=True)
        check_range("n_burn", self.n_burn, 0)
        check_range("n_draws", self.n_draws, 2)
        check_range("init_std", self.init_std, 0.0, open_lo=True)
        for name in ("pmf_grid", "mf_grid"):
            grid = getattr(self, name)
            if not grid or any(len(g) != 2 or int(g[0]) < 1 or not float(g[1]) > 0 for g in grid):
                raise ValueError(f"{name} must be a non-empty list of [rank >= 1, value > 0] pairs, got {grid!r}")
        if len(self.pmf_grid) != len(self.mf_grid):
            raise ValueError(f"pmf_grid and mf_grid must have the same size (same tuning budget), got "
                             f"{len(self.pmf_grid)} and {len(self.mf_grid)}")  # fmt: skip
        check_range("val_fraction", self.val_fraction, 0.0, 0.5, open_lo=True)
        check_range("interval_level", self.interval_level, 0.0, 0.999, open_lo=True)
        if not 0.0 < self.active_mask < 1.0:
            raise ValueError(f"active_mask must be in (0, 1), got {self.active_mask!r}")
        check_range("active_rounds", self.active_rounds, 0)
        check_range("active_step", self.active_step, 0.0, 1.0, open_lo=True)
