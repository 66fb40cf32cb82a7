"""Independence tests for language models (Zhu et al., ICML 2025): exact PERMTEST p-values and MATCH."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="model_independence",
        name="Independence Tests for Language Models",
        area="analysis",
        paper="Independence Tests for Language Models",
        paper_url="https://arxiv.org/abs/2502.12292",
        code_url="https://github.com/ahmeda14960/model-tracing",
        config="lmlab.methods.analysis.model_independence.config:ModelIndependenceConfig",
        run="lmlab.methods.analysis.model_independence.experiment:run",
        claim=(
            "Weight tests give exact p-values of H0 'independently initialised' (uniform on independent pairs, at the "
            "1/(T+1) floor on derived ones); a permutation + rotation of the residual stream that leaves outputs "
            "unchanged defeats them, while MATCH (gate vs up activation matching) still detects the copy and does "
            "not flag an independent model."
        ),
        baselines=("permtest_l2", "permtest_cos", "csw", "csh"),
        default_model="smollm2-135m",
        suites=("corpus",),
        presets={
            "smoke": {
                "model": "tiny-llama",
                "independent_model": "tiny-gemma3",
                "n_perm": 19,
                "blocks": 2,
                "n_texts": 2,
                "seq_len": 32,
                "finetune_steps": 1,
                "finetune_seq_len": 16,
                "prune_keep_blocks": 1,
                "prune_keep_units": 96,
                "prune_heal_steps": 1,
                "prune_calib": 2,
                "prune_seq_len": 16,
                "retrain_steps": 5,
                "retrain_batch": 16,
                "tiny_pairs": 6,
                "tiny_steps": 2,
                "tiny_ft_steps": 1,
                "tiny_seq_len": 16,
                "tiny_batch": 2,
            },
            "quick": {
                "derived": ["perm_rot"],
                "independent_model": None,
                "n_perm": 19,
                "n_texts": 4,
                "seq_len": 96,
                "tiny_steps": 20,
            },
        },
        tags=("analysis", "forensics", "provenance"),
        bibtex=(
            "@inproceedings{zhu2025independence,\n  title={Independence Tests for Language Models},\n  author={Zhu, "
            "Sally and Ahmed, Ahmed and Kuditipudi, Rohith and Liang, Percy},\n  booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# The algorithm imports torch; its names load on first use so that `lmlab list` stays torch-free.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method="__all__",
    baselines="__all__",
    pvalues="__all__",
    transforms="__all__",
)

__all__ = ["SPEC", *_LAZY]
