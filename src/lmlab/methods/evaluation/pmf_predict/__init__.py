"""PMF by MCMC (Zhao et al., ICML 2025): predict unknown benchmark scores, with uncertainty, from observed ones."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="pmf_predict",
        name="PMF (MCMC) prediction of model x task scores with uncertainty-ordered evaluation",
        area="evaluation",
        paper="Can We Predict Performance of Large Models across Vision-Language Tasks?",
        paper_url="https://arxiv.org/abs/2410.10112",
        code_url="https://github.com/Qinyu-Allen-Zhao/CrossPred-LVLM",
        config="lmlab.methods.evaluation.pmf_predict.config:PMFPredictConfig",
        run="lmlab.methods.evaluation.pmf_predict.experiment:run",
        claim=(
            "Probabilistic matrix factorisation sampled by MCMC (the paper's D = 10, alpha = 2) predicts held-out "
            "model x task scores with lower error than the mean-of-means baseline (both on the normalised scale) at "
            "20-80% masking, its posterior std ranks the actual errors better than the binomial sampling sd of its "
            "own mean, and revealing the most uncertain cells first lowers the error faster than revealing random "
            "cells."
        ),
        baselines=("mean_of_means", "global_mean", "mf_als", "binomial_sd", "random_reveal"),
        default_model="smollm2-135m",
        suites=("respcache:mixed",),
        presets={
            "smoke": {
                "cache": "synthetic",
                "items_per_cell": 10,
                "seeds": 3,
                "n_burn": 20,
                "n_draws": 20,
                "active_rounds": 2,
                "mask_levels": [0.2, 0.8],
                "tune": False,
            },
            "quick": {"seeds": 4, "n_burn": 50, "n_draws": 50},
        },
        requires=("scipy",),
        tags=("evaluation", "matrix-completion", "bayesian", "respcache"),
        bibtex=(
            "@inproceedings{zhao2025predict,\n  title={Can We Predict Performance of Large Models across "
            "Vision-Language Tasks?},\n  author={Zhao, Qinyu and Xu, Ming and Gupta, Kartik and Asthana, Akshay and "
            "Zheng, Liang and Gould, Stephen},\n  booktitle={ICML},\n  year={2025}}"
        ),
    )
)

__getattr__, _LAZY = lazy_exports(
    __name__,
    method=(
        "PMF",
        "PMFPrediction",
        "active_reveal",
        "als_mf_predict",
        "binomial_sd",
        "column_normalise",
        "coverage",
        "gibbs_pmf",
        "global_mean_predict",
        "group_mse",
        "load_crosspred_json",
        "mean_of_means_predict",
        "reveal_path",
        "rmse",
        "split_cells",
        "synthetic_low_rank",
    ),
    experiment=("column_tasks", "slice_matrix"),
)

__all__ = ["SPEC", *_LAZY]
