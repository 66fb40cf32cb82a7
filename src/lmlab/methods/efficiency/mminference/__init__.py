"""MMInference (Li et al., ICML 2025): per-head pattern search, modality-aware permutation, sparse prefill."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="mminference",
        name="MMInference (modality-aware permutation sparse attention)",
        area="efficiency",
        paper=(
            "MMInference: Accelerating Pre-filling for Long-Context VLMs via Modality-Aware Permutation Sparse "
            "Attention"
        ),
        paper_url="https://arxiv.org/abs/2504.16083",
        code_url="https://github.com/microsoft/MInference",
        config="lmlab.methods.efficiency.mminference.config:MMInferenceConfig",
        run="lmlab.methods.efficiency.mminference.experiment:run",
        claim=(
            "With per-head sparse patterns from an offline recall search (A-shape, vertical-slash, grid only where "
            "the input is periodic), sparse prefill inside the model stays closer to dense than static A-shape and "
            "its attention and end-to-end prefill (online index included) are faster than dense SDPA at 4k tokens; "
            "on mixed prose / picture prompts, the modality-aware permutation with Q-boundary, 2D-boundary and grid "
            "patterns keeps more attention mass and a lower NLL than vertical-slash without permutation at the "
            "same per-row budget."
        ),
        baselines=("dense_sdpa", "a_shape", "vertical_slash"),
        default_model="smollm2-135m",
        suites=("ruler", "glyphs"),
        presets={
            "smoke": {
                "model": "tiny-llama",
                "block_size": 32,
                "last_q": 16,
                "forced_columns": 4,
                "forced_diagonals": 8,
                "a_shape": [8, 64],
                "vs_sizes": [[16, 32], [16, 64]],
                "grid_stride": 16,
                "grid_local": 16,
                "min_recall": 0.0,
                "calib_tokens": 256,
                "periodic_tokens": 256,
                "n_eval": 2,
                "eval_tokens": 320,
                "nll_tokens": 32,
                "gen_tokens": 2,
                "bench_lengths": [256, 512],
                "timing_repeats": [2, 1],
                "timing_layers": 1,
                "baselines": ["a_shape"],
                "mm_images": 2,
                "mm_chars": 2,
                "mm_scale": 1,
                "mm_prose_chars": 100,
                "n_mm": 2,
                "mm_vs": [16, 32],
                "mm_recall_layers": 2,
                "mm_timing_repeats": 2,
            },
            "quick": {
                "calib_tokens": 1024,
                "periodic_tokens": 1024,
                "n_eval": 2,
                "eval_tokens": 1024,
                "nll_tokens": 128,
                "gen_tokens": 6,
                "bench_lengths": [2048, 4096],
                "timing_repeats": [6, 2],
                "timing_layers": 1,
                "baselines": ["a_shape"],
                "mm_chars": 3,
                "mm_scale": 1,
                "mm_prose_chars": 250,
                "n_mm": 6,
                "mm_vs": [48, 96],
                "mm_recall_layers": 3,
            },
        },
        tags=("efficiency", "sparse-attention", "prefill", "long-context"),
        bibtex=(
            "@inproceedings{li2025mminference,\n  title={MMInference: Accelerating Pre-filling for Long-Context VLMs "
            "via Modality-Aware Permutation Sparse Attention},\n  author={Li, Yucheng and Jiang, Huiqiang and Zhang, "
            "Chengruidong and Wu, Qianhui and Luo, Xufang and Ahn, Surin and Abdi, Amir H. and Li, Dongsheng and Gao, "
            "Jianfeng and Yang, Yuqing and Qiu, Lili},\n  booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# The algorithm imports torch; its names load on first use so that `lmlab list` stays torch-free.
__getattr__, _LAZY = lazy_exports(
    __name__,
    patterns="__all__",
    blocks="__all__",
    method="__all__",
    modality="__all__",
    attention="__all__",
)

__all__ = ["SPEC", *_LAZY]
