"""Wanda (Sun et al., ICLR 2024): pruning by weights and activations, |W| * ||X||_2 per output row."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="wanda",
        name="Wanda: Pruning by Weights and Activations",
        area="compression",
        paper="A Simple and Effective Pruning Approach for Large Language Models",
        paper_url="https://arxiv.org/abs/2306.11695",
        code_url="https://github.com/locuslab/wanda",
        config="lmlab.methods.compression.wanda.config:WandaConfig",
        run="lmlab.methods.compression.wanda.experiment:run",
        claim=(
            "One-shot Wanda pruning (|W| * ||X||_2, compared per output row) matches SparseGPT and beats magnitude "
            "pruning by a wide margin on held-out perplexity at 50% unstructured sparsity, with no weight update."
        ),
        baselines=("magnitude", "sparsegpt"),
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
                "n_calib": 4,
                "n_eval": 8,
                "structures": ["unstructured"],
                "baselines": ["magnitude"],
                "track_dense": False,
                "speed_repeats": 3,
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
