"""Control Variates Evaluation (Zhou, Song & Zanette, ICML 2025): unbiased win rates from human + synthetic labels."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="cv_winrate",
        name="Control-variates win rate from few human labels and many synthetic ones",
        area="evaluation",
        paper="Accelerating Unbiased LLM Evaluation via Synthetic Feedback",
        paper_url="https://arxiv.org/abs/2502.10563",
        code_url="https://github.com/Zanette-Labs/control_variates_evaluation",
        config="lmlab.methods.evaluation.cv_winrate.config:CVWinrateConfig",
        run="lmlab.methods.evaluation.cv_winrate.experiment:run",
        claim=(
            "The control-variates estimator of a win rate, mixing n human labels with synthetic labels on all N "
            "pairs, has lower MSE than the human-only mean at the same n and far less bias than synthetic-only, "
            "with a saving of human labels close to the predicted rho^2 = corr(human, synthetic)^2 (gated on planted "
            "judges of rho^2 0.1 / 0.3 / 0.5; the zoo's own judges are reported)."
        ),
        baselines=("human_only", "synthetic_only", "ppi"),
        default_model="smollm2-135m",
        suites=("respcache:mixed",),
        presets={
            "smoke": {
                "cache": "synthetic",
                "repeats": 200,
                "n_labels": [10, 20, 40],
                "claim_n": 40,
                "sim_seeds": 6,
                "sim_items": 200,
            },
            "quick": {"repeats": 1000},
        },
        requires=("scipy",),
        tags=("evaluation", "statistics", "win-rate", "respcache"),
        bibtex=(
            "@inproceedings{zhou2025accelerating,\n  title={Accelerating Unbiased LLM Evaluation via Synthetic "
            "Feedback},\n  author={Zhou, Zhaoyi and Song, Yuda and Zanette, Andrea},\n  booktitle={ICML},\n"
            "  year={2025}}"
        ),
    )
)

__getattr__, _LAZY = lazy_exports(
    __name__,
    method=(
        "ALPHA_CLIP",
        "CVEstimate",
        "LogisticJudge",
        "bt_judge",
        "calibrate_judge_noise",
        "control_variates_estimate",
        "fit_alpha",
        "human_only",
        "labels_needed",
        "noisy_oracle_judge",
        "ppi",
        "ppi_plus_plus_lambda",
        "predicted_saving",
        "repeat_estimates",
        "simulated_human",
        "synthetic_only",
    ),
    experiment=("pair_tables", "simulated_sweep"),
)

__all__ = ["SPEC", *_LAZY]
