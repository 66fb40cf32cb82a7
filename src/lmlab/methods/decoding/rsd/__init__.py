"""Reward-Guided Speculative Decoding (Liao et al., ICML 2025): a PRM gates draft steps, the target fixes the rest."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="rsd",
        name="Reward-Guided Speculative Decoding",
        area="decoding",
        paper="Reward-Guided Speculative Decoding for Efficient LLM Reasoning",
        paper_url="https://arxiv.org/abs/2501.19324",
        code_url="https://github.com/BaohaoLiao/RSD",
        config="lmlab.methods.decoding.rsd.config:RSDConfig",
        run="lmlab.methods.decoding.rsd.experiment:run",
        claim=(
            "Keeping a draft step when its process reward is >= delta (else the target rewrites it) keeps accuracy "
            "within 2 points of target-only and above draft-only, at fewer target-model and total FLOPs than "
            "target-only."
        ),
        baselines=("draft_only", "target_only", "sd_equivalent"),
        default_model="smollm2-135m",
        suites=("capital_steps",),
        presets={
            "smoke": {
                "target_model": "tiny-gemma3",
                "n_questions": 2,
                "n_countries": 2,
                "n_calibration": 2,
                "thresholds": [0.7],
                "prms": ["noisy"],
                "draft_format": "fewshot",
                "target_format": "fewshot",
                "n_shots": 1,
                "max_step_tokens": 4,
                "theory_seeds": 1,
            },
            "quick": {
                "n_questions": 8,
                "n_countries": 2,
                "n_calibration": 6,
                "thresholds": [0.7],
                "prms": ["noisy"],
                "draft_format": "fewshot",
                "target_format": "fewshot",
                "theory_check": False,
            },
        },
        tags=("decoding", "speculative", "prm"),
        bibtex=(
            "@inproceedings{liao2025rsd,\n  title={Reward-Guided Speculative Decoding for Efficient LLM Reasoning},\n"
            "  author={Liao, Baohao and Xu, Yuhui and Dong, Hanze and Li, Junnan and Monz, Christof and Savarese, "
            "Silvio and Sahoo, Doyen and Xiong, Caiming},\n  booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# The algorithm imports torch; its names load on first use so that `lmlab list` stays torch-free.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method=(
        "ConstantOmega",
        "RSDOutput",
        "SoftOmega",
        "StepCache",
        "StepRecord",
        "ThresholdOmega",
        "match_soft_scale",
        "rsd_generate",
        "single_model_generate",
    ),
)

__all__ = ["SPEC", *_LAZY]
