"""Reflection-Window Decoding (Tang et al., ICML 2025): selective refinement of uncertain windows."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="reflection_window",
        name="Reflection-Window Decoding",
        area="decoding",
        paper="Reflection-Window Decoding: Text Generation with Selective Refinement",
        paper_url="https://arxiv.org/abs/2502.03678",
        code_url=None,
        config="lmlab.methods.decoding.reflection_window.config:ReflectionWindowConfig",
        run="lmlab.methods.decoding.reflection_window.experiment:run",
        claim=(
            "Refining uncertain windows raises the length-matched joint log-prob over greedy decoding while costing "
            "fewer forward passes than beam search."
        ),
        baselines=("greedy", "beam_search", "top_p"),
        default_model="smollm2-135m",
        suites=("countries", "instructions"),
        presets={
            "smoke": {
                "n_capitals": 2,
                "n_instructions": 1,
                "max_new_tokens": 8,
                "top_p_seeds": 1,
                "calibration_prompts": 2,
            },
            "quick": {
                "n_capitals": 6,
                "n_instructions": 2,
                "max_new_tokens": 24,
                "top_p_seeds": 0,
                "calibration_prompts": 3,
            },
        },
        tags=("decoding", "refinement"),
        bibtex=(
            "@inproceedings{tang2025reflection,\n  title={Reflection-Window Decoding: Text Generation with Selective "
            "Refinement},\n  author={Tang, Zeyu and Chen, Zhenhao and Song, Xiangchen and Li, Loka and Deng, Yunlong "
            "and Shen, Yifan and Chen, Guangyi and Spirtes, Peter and Zhang, Kun},\n  booktitle={ICML},\n"
            "  year={2025}}"
        ),
    )
)

# The algorithm imports torch; its names load on first use so that `lmlab list` stays torch-free.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method=(
        "RWOutput",
        "beam_refine_span",
        "reflection_window_generate",
        "should_pause",
    ),
)

__all__ = ["SPEC", *_LAZY]
