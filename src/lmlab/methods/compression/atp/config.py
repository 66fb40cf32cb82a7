"""Configuration of ATP (arithmetic-progression layer-wise sparsity) and its reproduction."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param

PRUNERS = ("wanda", "sparsegpt")


@dataclass
class ATPConfig(BaseConfig):
    """ATP (Huang et al., ICML 2025) against uniform, OWL and reversed allocations, on Wanda and SparseGPT.

    Args:
        sparsity (`float`, defaults to 0.7): target mean sparsity S (the paper's headline setting): the gated claims,
            the reversed-progression check, the cloze proxy and the error-vs-depth figure are at this level.
        sweep (`list[float]`, defaults to [0.5, 0.6]): further mean sparsities at which uniform, OWL and ATP (own beta
            search each) are compared; reported as a table and a figure, not gated.
        sweep_pruners (`list[str]`, defaults to ["wanda"]): the base pruners run at the sweep levels; SparseGPT there
            costs three more ~15 s prunes per level, past the 5-minute default budget (add it with
            ``--set sweep_pruners=[wanda,sparsegpt]``).
        betas (`list[float]`, defaults to [0, 0.004, ..., 0.02]): the beta grid searched on the validation split at
            every level (0 = uniform; betas above a level's beta_max are skipped); the official grid steps 0.002 up to
            beta_max (0.0207 for 30 blocks at S = 0.7, where the top block collapses): ours steps 0.004 so that three
            levels fit the 5-minute default.
        search_patience (`int`, defaults to 1): the walk up the grid stops after this many betas in a row whose
            validation perplexity does not beat the best so far (the curve is U-shaped); 0 walks the whole grid.
        pruners (`list[str]`): base pruners (``wanda``, ``sparsegpt``); SparseGPT runs at uniform, OWL and the
            beta Wanda's search chose (a SparseGPT search of its own costs 3-6 more ~15 s prunes).
        sparsegpt_search (`bool`): search beta with SparseGPT too instead of reusing Wanda's beta.
        owl (`bool`): run the OWL allocation baseline (M = 5; lambda searched on validation, see owl_lambdas).
        owl_lambdas (`list[float]`): OWL's lambda grid, searched like beta (same validation windows, same patience,
            the same number of candidates): a baseline with a knob gets the method's tuning budget.
        reverse (`bool`): run the reversed progression (beta* < 0) sanity check.
        n_calib, seq_len: calibration windows x tokens (train split of the `corpus` suite); 12 x 128 = 1536 tokens,
            the width of SmolLM2's `down_proj` input (fewer leaves SparseGPT's Hessian rank-deficient).
        n_val, n_test: evaluation windows of `seq_len` tokens (dev and test splits, disjoint modules). The default
            sizes (12 calibration, 12 validation, 16 test windows) keep three sparsity levels, two pruners and ~20
            prunes within 5 minutes.
        cloze (`bool`): the zero-shot proxy: 4-way capital multiple choice by log-likelihood (countries suite).
        n_cloze: capital questions.
    """

    model: str = param("smollm2-135m", "model to prune", paper="LLaMA-2-7B (also LLaMA-1/3, OPT, Mistral)")
    sparsity: float = param(0.7, "target mean sparsity S", paper="0.7 (headline)")
    sweep: list = param([0.5, 0.6], "further mean sparsities compared (not gated)", paper="50%, 60%, 70% and beyond")
    sweep_pruners: list = param(["wanda"], "base pruners run at the sweep levels (SparseGPT adds 3 prunes per level)")
    betas: list = param(
        [0.0, 0.004, 0.008, 0.012, 0.016, 0.02],
        "beta grid (validation split, searched at every level, walked in order; illegal betas skipped)",
        paper="0.002, 0.004, ... while legal (search.sh), chosen on the WikiText-2 test split",
    )
    search_patience: int = param(
        1, "stop the grid walk after this many betas worse than the best so far (0 = whole grid, as search.sh)"
    )
    pruners: list = param(["wanda", "sparsegpt"], "base pruners", paper="Wanda and SparseGPT")
    sparsegpt_search: bool = param(False, "search beta with SparseGPT too (else reuse Wanda's beta*)")
    owl: bool = param(True, "OWL allocation baseline (M = 5, lambda = 0.08)", paper="OWL among the baselines")
    owl_m: float = param(5.0, "OWL outlier threshold M (times the layer mean score)", paper="5 (OWL)")
    owl_lambda: float = param(
        0.08, "OWL sparsity spread lambda (used as is when owl_lambdas is empty)", paper="0.08 (OWL)"
    )
    owl_lambdas: list = param(
        [0.0, 0.04, 0.08, 0.12, 0.16, 0.2],
        "OWL lambda grid searched on the same validation windows, walked with the same patience, as many candidates "
        "as the beta grid: the baseline gets ATP's tuning budget ([] = the fixed owl_lambda)",
        paper="OWL's fixed lambda 0.08 (the ATP paper does not tune it)",
    )
    reverse: bool = param(True, "reversed progression (decreasing sparsity) sanity check")
    n_calib: int = param(12, "calibration windows", paper="128 x 2048 C4 tokens, seed 1")
    seq_len: int = param(128, "tokens per calibration / evaluation window", paper="2048")
    n_val: int = param(12, "validation windows (beta selection)", paper="WikiText-2 test (leaks the test set)")
    n_test: int = param(16, "test windows (reported perplexity)", paper="WikiText-2 test, seqlen 2048")
    cloze: bool = param(True, "4-way capital cloze by log-likelihood (zero-shot proxy)", paper="7 zero-shot tasks")
    n_cloze: int = param(40, "capital cloze questions")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("sparsity", self.sparsity, 0.0, 0.99)
        for level in self.sweep:
            check_range("sweep", level, 0.0, 0.99)
        if not self.betas:
            raise ValueError("betas=[]: expected at least one beta (0.0 is the uniform baseline)")
        for beta in self.betas:
            check_range("betas", beta, 0.0, 1.0)
        bad = [p for p in self.pruners if p not in PRUNERS]
        if bad or not self.pruners:
            raise ValueError(f"pruners={self.pruners!r}: expected a non-empty subset of {', '.join(PRUNERS)}")
        bad = [p for p in self.sweep_pruners if p not in self.pruners]
        if bad:
            raise ValueError(f"sweep_pruners={self.sweep_pruners!r}: expected a subset of pruners={self.pruners!r}")
        if "wanda" not in self.pruners:
            raise ValueError(f"pruners={self.pruners!r}: 'wanda' is required (its search chooses beta)")
        check_range("search_patience", self.search_patience, 0, 1000)
        for lam in self.owl_lambdas:
            check_range("owl_lambdas", lam, 0.0, 1.0)
        for name in ("n_calib", "n_val", "n_test"):
            check_range(name, getattr(self, name), 1, 100000)
        check_range("seq_len", self.seq_len, 8, 8192)
        check_range("n_cloze", self.n_cloze, 1, 10000)
