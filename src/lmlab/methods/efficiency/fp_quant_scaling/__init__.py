"""Scaling Laws for Floating-Point Quantization Training (Sun et al., ICML 2025): simulated ExMy training."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="fp_quant_scaling",
        name="Scaling Laws for Floating-Point Quantization Training",
        area="efficiency",
        paper="Scaling Laws for Floating-Point Quantization Training",
        paper_url="https://arxiv.org/abs/2501.02423",
        code_url=None,
        config="lmlab.methods.efficiency.fp_quant_scaling.config:FPQuantScalingConfig",
        run="lmlab.methods.efficiency.fp_quant_scaling.experiment:run",
        claim=(
            "Under FP-quantized training the loss penalty follows log2(B) / (gamma (E+0.5)^delta (M+0.5)^nu): the "
            "best FP4 split is E2M1, exponent bits matter slightly more than mantissa bits (delta > nu) and the "
            "penalty grows with log2 of the scaling block size."
        ),
        baselines=("fp32_training", "other_ExMy_splits", "other_block_sizes"),
        default_model="tiny-llama",
        suites=("corpus",),
        presets={
            "smoke": {
                "hidden": 32,
                "n_layers": 1,
                "steps": 6,
                "train_batch_size": 4,
                "seq_len": 16,
                "warmup": 2,
                "eval_every": 3,
                "eval_windows": 4,
                "formats": ["E2M1", "E4M3"],
                "block_sizes": ["tensor"],
            },
            "quick": {
                "steps": 150,
                "warmup": 15,
                "eval_every": 30,
                "formats": ["E1M2", "E2M1", "E3M0"],
                "block_sizes": ["tensor"],
            },
        },
        tags=("efficiency", "quantization", "scaling-law", "training"),
        bibtex=(
            "@inproceedings{sun2025scaling,\n  title={Scaling Laws for Floating-Point Quantization Training},\n"
            "  author={Sun, Xingwu and Li, Shuaipeng and Xie, Ruobing and Han, Weidong and Wu, Kan and Yang, Zhen "
            "and Li, Yixing and Wang, An and Li, Shuai and Xue, Jinbao and Cheng, Yu and Tao, Yangyu and Kang, "
            "Zhanhui and Xu, Chengzhong and Wang, Di and Jiang, Jie},\n  booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# The algorithm imports torch; its names load on first use so that `lmlab list` stays torch-free.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method=(
        "FPFormat",
        "FPQuantLinear",
        "fp_quantize",
        "fp_values",
        "fp_round",
        "group_size",
        "ste",
        "precision_term",
        "optimal_exponent_continuous",
        "PrecisionFit",
        "quantize_linears",
        "unified_loss",
        "critical_data_size",
        "optimal_split",
        "optimal_precision",
        "fit_precision_term",
        "fit_precision_term_free_offset",
        "PAPER_CONSTANTS",
    ),
)

__all__ = ["SPEC", *_LAZY]
