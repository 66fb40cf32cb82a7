"""SparseGPT (Frantar & Alistarh, ICML 2023): one-shot OBS pruning with lazy column updates."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="sparsegpt",
        name="SparseGPT",
        area="compression",
        paper="SparseGPT: Massive Language Models Can Be Accurately Pruned in One-Shot",
        paper_url="https://arxiv.org/abs/2301.00774",
        code_url="https://github.com/IST-DASLab/sparsegpt",
        config="lmlab.methods.compression.sparsegpt.config:SparseGPTConfig",
        run="lmlab.methods.compression.sparsegpt.experiment:run",
        claim=(
            "One-shot SparseGPT prunes to 50% unstructured sparsity with a small perplexity increase over the dense "
            "model and far better perplexity than magnitude pruning."
        ),
        baselines=("magnitude", "wanda"),
        default_model="smollm2-135m",
        suites=("corpus",),
        presets={
            "smoke": {
                "model": "tiny-llama",
                "n_calib": 2,
                "calib_seqlen": 32,
                "n_eval": 6,
                "eval_seqlen": 32,
                "speed_repeats": 2,
                "prefill_tokens": 16,
            },
            "quick": {
                "n_calib": 12,
                "n_eval": 8,
                "structures": ["unstructured"],
                "baselines": ["magnitude"],
                "track_dense": False,
                "speed": False,
            },
        },
        tags=("compression", "pruning", "baseline"),
    )
)

# The algorithm imports torch; its names load on first use so that `lmlab list` stays torch-free.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method="__all__",
)

__all__ = ["SPEC", *_LAZY]
