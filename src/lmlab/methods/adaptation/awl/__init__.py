"""AWL (Lyu et al., ICML 2025): learn world knowledge from tool-derived solutions, then adapt tool use per problem."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="awl",
        name="Adapting While Learning: World Knowledge Learning + Tool Usage Adaptation",
        area="adaptation",
        paper="Adapting While Learning: Grounding LLMs for Scientific Problems with Tool Usage Adaptation",
        paper_url="https://arxiv.org/abs/2411.00412",
        code_url="https://github.com/Rose-STL-Lab/Adapting-While-Learning",
        config="lmlab.methods.adaptation.awl.config:AWLConfig",
        run="lmlab.methods.adaptation.awl.experiment:run",
        claim=(
            "Fine-tuning on tool-derived solutions (WKL) and then on a mix where problems the WKL model already "
            "solves are answered directly and the others with a tool trace (TUA) gives a higher balanced tool-usage "
            "accuracy than the base model, WKL alone and tool-only SFT, a higher no-tool answer accuracy than the "
            "base model, and fewer tool calls than tool-only SFT."
        ),
        baselines=("tool_only", "wkl", "base"),
        default_model="smollm2-135m",
        suites=("taskbank",),
        presets={
            "smoke": {
                "model": "tiny-llama",
                "domains": ["arithmetic", "geography"],
                "n_train": 6,
                "n_test": 4,
                "stage1_steps": 2,
                "stage2_steps": 2,
                "train_batch": 4,
                "train_layers": 1,
                "max_new_tokens": 8,
            },
            "quick": {
                "domains": ["arithmetic"],
                "n_train": 30,
                "n_test": 20,
                "systems": ["awl", "tool_only"],
                "stage1_steps": 12,
                "stage2_steps": 12,
            },
        },
        budget_s={"smoke": 20.0, "quick": 60.0, "default": 300.0},
        tags=("adaptation", "tools", "sft", "agents"),
        bibtex=(
            "@inproceedings{lyu2025awl,\n  title={Adapting While Learning: Grounding LLMs for Scientific Problems "
            "with Tool Usage Adaptation},\n  author={Lyu, Bohan and Cao, Yadi and Watson-Parris, Duncan and Bergen, "
            "Leon and Berg-Kirkpatrick, Taylor and Yu, Rose},\n  booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# The algorithm imports torch (training, decoding); its names load on first use.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method="__all__",
    metric="__all__",
)

__all__ = ["SPEC", *_LAZY]
