"""Fractal text analysis (Alabdulmohsin & Steiner, ICML 2025): Hurst and self-similarity exponents of bits per token,
human text vs LLM generations, and detection with (H, S) beside mean bits."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

_SMOKE_GRID = {"scales": [4, 6, 8, 12, 16, 24, 32], "taus": [1, 2, 4, 8, 16]}

SPEC = register_method(
    MethodSpec(
        id="fractal_text",
        name="Fractal parameters of LLM vs human text",
        area="analysis",
        paper="A Tale of Two Structures: Do LLMs Capture the Fractal Complexity of Language?",
        paper_url="https://arxiv.org/abs/2502.14924",
        code_url="https://github.com/google-research/google-research/tree/master/fractals_language",
        config="lmlab.methods.analysis.fractal_text.config:FractalTextConfig",
        run="lmlab.methods.analysis.fractal_text.experiment:run",
        claim=(
            "The fractal parameters of human text (Hurst H and self-similarity S of its bits-per-token series) sit "
            "in a narrow range, while those of LLM generations move with the decoding temperature and the prompt "
            "(lower temperature: higher H), an instruction-tuned generator strays further from human text than a "
            "pretrained one, and (H, S) beside the first-order statistics of the bits detect LLM text better than "
            "mean bits alone and than [mean, std] of the bits."
        ),
        baselines=("mean_bits_only", "first_order", "human_text"),
        default_model="smollm2-135m",
        suites=("corpus",),
        presets={
            "smoke": {
                "model": "tiny-llama",
                "generator_b": None,
                "conditions": ["prefix@0.5", "prefix@1.5"],
                "human_domains": ["stdlib"],
                "n_human": 6,
                "human_tokens": 96,
                "n_generate": 6,
                "max_new_tokens": 48,
                "drop_first": 8,
                "window": 128,
                "samples_per_doc": 20,
                "eps": 0.2,
                "n_boot": 100,
                "calibration_draws": 4,
                "folds": 3,
                "batch_size": 6,
                **_SMOKE_GRID,
            },
            "quick": {
                "generator_b": None,
                "conditions": ["prefix@0.5", "prefix@1.5"],
                "human_domains": ["stdlib"],
                "n_human": 8,
                "human_tokens": 160,
                "n_generate": 8,
                "max_new_tokens": 128,
                "batch_size": 8,
                "scales": [8, 12, 16, 24, 32, 48, 64],
                "taus": [1, 2, 4, 8, 16, 32],
                "folds": 4,
                "n_boot": 500,
                "calibration_draws": 10,
            },
        },
        budget_s={"smoke": 10.0, "quick": 60.0, "default": 300.0},
        requires=("sklearn",),
        tags=("analysis", "forensics", "detection"),
        bibtex=(
            "@inproceedings{alabdulmohsin2025tale,\n  title={A Tale of Two Structures: Do {LLMs} Capture the Fractal "
            "Complexity of Language?},\n  author={Alabdulmohsin, Ibrahim and Steiner, Andreas},\n  booktitle={ICML},\n"
            "  year={2025}}"
        ),
    )
)

# The algorithm imports numpy / torch / scikit-learn; its names load on first use so that `lmlab list` stays fast.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method=(
        "FractalTable",
        "auroc",
        "bits_series",
        "bootstrap_ci",
        "detect",
        "dfa",
        "fractal_table",
        "fractional_gaussian_noise",
        "hurst_rs",
        "increments",
        "jackknife_pseudovalues",
        "placement_values",
        "self_similarity",
        "token_bits",
        "usable",
    ),
)

__all__ = ["SPEC", *_LAZY]
