"""Reasoning-as-Logic-Units (Li et al., ICML 2025): align a program's logic units with NL reasoning."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="ralu",
        name="Reasoning-as-Logic-Units (RaLU)",
        area="decoding",
        paper=(
            "Reasoning-as-Logic-Units: Scaling Test-Time Reasoning in Large Language Models Through Logic Unit "
            "Alignment"
        ),
        paper_url="https://arxiv.org/abs/2502.07803",
        code_url="https://github.com/DeepAccept/RaLU",
        config="lmlab.methods.decoding.ralu.config:RaLUConfig",
        run="lmlab.methods.decoding.ralu.experiment:run",
        claim=(
            "Mechanism check (scale proxy): at an equal judge-call budget, judging, refining and rewinding a buggy "
            "program unit by unit repairs it at least as often as line by line, which beats whole-program "
            "refinement: pass@1 oracle > RaLU-CFG >= line-by-line > whole-program >= initial."
        ),
        baselines=("initial", "whole_refine", "ralu_line", "oracle_cfg"),
        default_model="smollm2-135m",
        suites=("humaneval",),
        presets={
            "smoke": {
                "n_problems": 1,
                "n_rewrites": 1,
                "rewrite_max_tokens": 8,
                "max_branches": 1,
                "systems": ["initial", "whole_refine", "ralu_line", "ralu_cfg", "oracle_cfg"],
            },
            "quick": {"n_problems": 5},
        },
        tags=("decoding", "refinement", "code"),
        bibtex=(
            "@inproceedings{li2025ralu,\n  title={Reasoning-as-Logic-Units: Scaling Test-Time Reasoning in Large "
            "Language Models Through Logic Unit Alignment},\n  author={Li, Cheryl and Xu, Tianyuan and Guo, Yiwen},\n"
            "  booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# Exported names load on first use, as in every method package (`lmlab list` imports only the specs).
__getattr__, _LAZY = lazy_exports(
    __name__,
    method="__all__",
    backends="__all__",
    program="__all__",
    cfg_build="__all__",
    cfg="__all__",
    units="__all__",
    mutations="__all__",
)

__all__ = ["SPEC", *_LAZY]
