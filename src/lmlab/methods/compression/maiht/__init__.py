"""mAIHT (Wen, Zuo & Pan, ICML 2025): per-layer l0-penalised reconstruction by monotone accelerated IHT."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="maiht",
        name="mAIHT: monotone accelerated iterative hard thresholding pruner",
        area="compression",
        paper="An Efficient Pruner for Large Language Model with Theoretical Guarantee",
        paper_url="https://openreview.net/forum?id=nh9mBCYeF7",
        code_url="https://github.com/zuoooooooo/mAIHT-pruning",
        config="lmlab.methods.compression.maiht.config:MAIHTConfig",
        run="lmlab.methods.compression.maiht.experiment:run",
        claim=(
            "Solving each layer's l0-penalised reconstruction with monotone accelerated IHT gives lower layer-wise "
            "reconstruction error than SparseGPT and Wanda, and lower perplexity than Wanda at high unstructured "
            "sparsity, with an objective that never increases."
        ),
        baselines=("magnitude", "wanda", "sparsegpt", "iht", "aiht"),
        default_model="smollm2-135m",
        suites=("corpus",),
        presets={
            "smoke": {
                "study_layers": ["0:self_attn.q_proj", "1:mlp.down_proj"],
                "study_iters": 5,
                "study_refine": 3,
                "iters": 4,
                "refine": 3,
                "n_calib": 2,
                "seq_len": 16,
                "n_test": 3,
            },
            "quick": {
                "study_layers": [
                    "2:self_attn.q_proj",
                    "2:self_attn.k_proj",
                    "2:self_attn.o_proj",
                    "15:self_attn.q_proj",
                    "15:self_attn.k_proj",
                    "15:self_attn.o_proj",
                ],
                "study_iters": 20,
                "study_refine": 30,
                "full_prune": False,
                "n_calib": 8,
            },
        },  # fmt: skip
        tags=("compression", "pruning", "optimisation"),
        bibtex=(
            "@inproceedings{wen2025maiht,\n  title={An Efficient Pruner for Large Language Model with Theoretical "
            "Guarantee},\n  author={Wen, Canhong and Zuo, Yihong and Pan, Wenliang},\n  booktitle={ICML},\n"
            "  year={2025}}"
        ),
    )
)

# The algorithm imports torch; its names load on first use so that `lmlab list` stays torch-free.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method=(
        "solve",
        "SolveResult",
        "objective",
        "hard_threshold",
        "normalized_problem",
        "reconstruction_error",
    ),
    experiment=("maiht_prune_fn",),
)

__all__ = ["SPEC", *_LAZY]
