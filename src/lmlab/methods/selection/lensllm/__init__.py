"""LensLLM (Zeng et al., ICML 2025): the NTK-based rectified scaling law for LLM selection from small fine-tunes."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="lensllm",
        name="LensLLM: NTK-based rectified scaling law for LLM selection",
        area="selection",
        paper="LensLLM: Unveiling Fine-Tuning Dynamics for LLM Selection",
        paper_url="https://arxiv.org/abs/2505.03793",
        code_url="https://github.com/Susan571/LENSLLM",
        config="lmlab.methods.selection.lensllm.config:LensLLMConfig",
        run="lmlab.methods.selection.lensllm.experiment:run",
        claim=(
            "Fitting L(D) = B / (F(Θ, t) + D^β) + E (F the NTK-linearised training residual) to fine-tuning losses on "
            "small subsets predicts each candidate's loss at the full budget with lower error than the rectified "
            "scaling law and than the same law with F a free constant (no NTK), all fitted alike, and ranks "
            "candidates better than zero-shot loss and model size, at a fraction of the compute of fine-tuning every "
            "candidate fully."
        ),
        baselines=("lens_free", "rectified", "ats", "subtuning", "zeroshot", "modelsize"),
        default_model="smollm2-135m",
        suites=("taskbank",),
        presets={
            "smoke": {
                "model": "tiny-llama",
                # tiny candidates only: no peft import (16 s on a busy 2-core machine); LoRA paths are unit-tested
                "candidates": ["tiny", "tiny-wide", "tiny-deep"],
                "sizes": [0, 2, 4, 8],
                "target_size": 16,
                "n_seeds": 2,
                "val_size": 8,
                "test_size": 16,
                "train_layers": 1,
                "n_probe": 4,
                "n_restarts": 2,
            },
            "quick": {
                "candidates": ["tiny", "tiny-wide", "base-trunc10"],
                "n_seeds": 3,
                "test_size": 100,
            },
        },
        requires=("scipy", "peft"),
        tags=("selection", "scaling-law", "ntk", "fine-tuning"),
        bibtex=(
            "@inproceedings{zeng2025lensllm,\n  title={LensLLM: Unveiling Fine-Tuning Dynamics for LLM Selection},\n"
            "  author={Zeng, Xinyue and Wang, Haohui and Lin, Junhong and Wu, Jun and Cody, Tyler and Zhou, Dawei},\n"
            "  booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# The algorithm imports numpy/scipy (and torch for the NTK); its names load on first use.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method="__all__",
)

__all__ = ["SPEC", *_LAZY]
