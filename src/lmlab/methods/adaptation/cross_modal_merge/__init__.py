"""Bring Reason to Vision (Chen et al., ICML 2025): merge a VLM's language tower with a same-base reasoning LLM."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="cross_modal_merge",
        name="Cross-modal merging: bring an LLM's reasoning to a VLM (proxy: glyph 'VLM' + text reasoning)",
        area="adaptation",
        paper="Bring Reason to Vision: Understanding Perception and Reasoning through Model Merging",
        paper_url="https://arxiv.org/abs/2505.05464",
        code_url="https://github.com/shiqichen17/VLM_Merging",
        config="lmlab.methods.adaptation.cross_modal_merge.config:CrossModalMergeConfig",
        run="lmlab.methods.adaptation.cross_modal_merge.experiment:run",
        claim=(
            "On a synthetic proxy (a glyph-bitmap 'VLM' and a text-reasoning fine-tune of the same base, each gated "
            "on having learned its skill), linearly merging the decoder weights (α on the VLM, chosen on dev among "
            "0.95-0.5, ties to the paper's 0.9) raises multimodal-reasoning accuracy above the VLM-proxy's without "
            "training, while perception stays within a few points; a per-block knockout locates perception and "
            "reasoning across layers (reported)."
        ),
        baselines=("vlm", "base", "reason", "layerswap", "ties", "dare_linear"),
        default_model="smollm2-135m",
        suites=("taskbank",),
        presets={
            "smoke": {
                "model": "tiny-llama",
                "alphas": [0.9, 0.5],
                "claim_alphas": [0.9],
                "vlm_steps": 3,
                "reason_steps": 3,
                "batch": 4,
                "rank": 2,
                "lora_alpha": 4.0,
                "train_items": 8,
                "dev_items": 4,
                "test_items": 8,
                "knockout_items": 4,
                "block_size": 2,
                "finetune_cache": False,
            },
            "quick": {
                "alphas": [0.9],
                "claim_alphas": [0.9],
                "merges": [],
                "vlm_steps": 12,
                "reason_steps": 12,
                "train_items": 96,
                "test_items": 24,
                "knockout_items": 12,
                "block_size": 10,
            },
        },
        budget_s={"smoke": 20.0, "quick": 60.0, "default": 300.0},
        requires=("peft",),
        tags=("adaptation", "merging", "lora", "multimodal-proxy"),
        bibtex=(
            "@inproceedings{chen2025bringreason,\n  title={Bring Reason to Vision: Understanding Perception and "
            "Reasoning through Model Merging},\n  author={Chen, Shiqi and Zhang, Jinghan and Zhu, Tongyao and Liu, "
            "Wei and Gao, Siyang and Xiong, Miao and Li, Manling and He, Junxian},\n  booktitle={ICML},\n  "
            "year={2025}}"
        ),
    )
)

# The algorithm imports torch (and peft for TIES / DARE); its names load on first use.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method="__all__",
    proxy="__all__",
)

__all__ = ["SPEC", *_LAZY]
