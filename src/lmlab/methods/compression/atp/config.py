"""Configuration of ATP (arithmetic-progression layer-wise sparsity) and its reproduction."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param

PRUNERS = ("wanda", "sparsegpt")


@dataclass
class ATPConfig(BaseConfig):
    """ATP (Huang et al., ICML 2025) against uniform, OWL and reversed allocations, on Wanda and SparseGPT.

    Args:
        sparsity (`float`, defaults to 0.7): target mean sparsity S (the paper's headline setting).
        betas (`list[float]`): the beta grid searched on the validation split (0 = uniform); the official grid runs
            0.002, 0.004, ... up to beta_max (0.0207 for 30 blocks at S = 0.7), where the top block collapses.
        pruners (`list[str]`): base pruners (``wanda``, ``sparsegpt``); SparseGPT runs at uniform, OWL and the
            beta Wanda's search chose (a SparseGPT search of its own would cost 8 more 60-100 s prunes).
        sparsegpt_search (`bool`): search beta with SparseGPT too instead of reusing Wanda's beta.
        owl (`bool`): run the OWL allocation baseline (M = 5, lambda = 0.08).
        reverse (`bool`): run the reversed progression (beta* < 0) sanity check.
        n_calib, seq_len: calibration windows x tokens (train split of the `corpus` suite).
        n_val, n_test: evaluation windows of `seq_len` tokens (dev and test splits, disjoint modules).
        cloze (`bool`): the zero-shot proxy: 4-way capital multiple choice by log-likelihood (countries suite).
        n_cloze: capital questions.
    """

    model: str = param("smollm2-135m", "model to prune", paper="LLaMA-2-7B (also LLaMA-1/3, OPT, Mistral)")
    sparsity: float = param(0.7, "target mean sparsity S", paper="0.7 (headline)")
    betas: list = param(
        [0.0, 0.002, 0.004, 0.006, 0.008, 0.010, 0.012, 0.014],
        "beta grid (validation split); stops short of beta_max where the top block collapses",
        paper="0.002, 0.004, ... while legal (search.sh), chosen on the WikiText-2 test split",
    )
    pruners: list = param(["wanda", "sparsegpt"], "base pruners", paper="Wanda and SparseGPT")
    sparsegpt_search: bool = param(False, "search beta with SparseGPT too (else reuse Wanda's beta*)")
    owl: bool = param(True, "OWL allocation baseline (M = 5, lambda = 0.08)", paper="OWL among the baselines")
    owl_m: float = param(5.0, "OWL outlier threshold M (times the layer mean score)", paper="5 (OWL)")
    owl_lambda: float = param(0.08, "OWL sparsity spread lambda", paper="0.08 (OWL)")
    reverse: bool = param(True, "reversed progression (decreasing sparsity) sanity check")
    n_calib: int = param(16, "calibration windows", paper="128 x 2048 C4 tokens, seed 1")
    seq_len: int = param(128, "tokens per calibration / evaluation window", paper="2048")
    n_val: int = param(16, "validation windows (beta selection)", paper="WikiText-2 test (leaks the test set)")
    n_test: int = param(24, "test windows (reported perplexity)", paper="WikiText-2 test, seqlen 2048")
    cloze: bool = param(True, "4-way capital cloze by log-likelihood (zero-shot proxy)", paper="7 zero-shot tasks")
    n_cloze: int = param(60, "capital cloze questions")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("sparsity", self.sparsity, 0.0, 0.99)
        if not self.betas:
            raise ValueError("betas=[]: expected at least one beta (0.0 is the uniform baseline)")
        for beta in self.betas:
            check_range("betas", beta, 0.0, 1.0)
        bad = [p for p in self.pruners if p not in PRUNERS]
        if bad or not self.pruners:
            raise ValueError(f"pruners={self.pruners!r}: expected a non-empty subset of {', '.join(PRUNERS)}")
        if "wanda" not in self.pruners:
            raise ValueError(f"pruners={self.pruners!r}: 'wanda' is required (its search chooses beta)")
        for name in ("n_calib", "n_val", "n_test"):
            check_range(name, getattr(self, name), 1, 100000)
        check_range("seq_len", self.seq_len, 8, 8192)
        check_range("n_cloze", self.n_cloze, 1, 10000)
