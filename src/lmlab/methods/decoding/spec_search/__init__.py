"""Speculative Search (Wang et al., ICML 2025): small-model thought drafts, PRM-gated, large-model corrections."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="spec_search",
        name="Speculative Search",
        area="decoding",
        paper="Accelerating Large Language Model Reasoning via Speculative Search",
        paper_url="https://arxiv.org/abs/2505.02865",
        code_url="https://github.com/MIRALab-USTC/LLMReasoning-SpecSearch",
        config="lmlab.methods.decoding.spec_search.config:SpecSearchConfig",
        run="lmlab.methods.decoding.spec_search.experiment:run",
        claim=(
            "Drafting reasoning steps with a small model, keeping those a PRM scores above an EMA threshold of the "
            "large model's step quality and letting the large model rewrite the rest, matches large-model-only "
            "search accuracy with fewer large-model tokens at a lower cost."
        ),
        baselines=("large_beam", "small_beam", "accept_all", "fixed_threshold"),
        default_model="smollm2-135m",
        suites=("capital_steps",),
        presets={
            "smoke": {
                "large_model": "tiny-gemma3",
                "n_questions": 2,
                "calib_questions": 1,
                "n_steps": 2,
                "n": 2,
                "n_shots": 1,
                "max_step_tokens": 4,
                "prms": ["noisy"],
                "ablations": False,
                "small_fmt": "fewshot",
            },
            "quick": {
                "n_questions": 4,
                "calib_questions": 3,
                "n_steps": 2,
                "n": 3,
                "prms": ["noisy"],
                "ablations": False,
                "small_fmt": "fewshot",
            },
        },
        tags=("decoding", "search", "speculative"),
        bibtex=(
            "@inproceedings{wang2025accelerating,\n  title={Accelerating Large Language Model Reasoning via "
            "Speculative Search},\n  author={Wang, Zhihai and Wang, Jie and Pan, Jilai and Xia, Xilin and Zhen, "
            "Huiling and Yuan, Mingxuan and Hao, Jianye and Wu, Feng},\n  booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# The algorithm imports torch; its names load on first use so that `lmlab list` stays torch-free.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method="__all__",
    search="__all__",
    speculative_decoding="__all__",
    thought_model="__all__",
)

__all__ = ["SPEC", *_LAZY]
