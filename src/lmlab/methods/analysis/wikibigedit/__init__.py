"""Lifelong knowledge editing at scale (WikiBigEdit, Thede et al., ICML 2025) on the offline GeoBigEdit stream."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="wikibigedit",
        name="WikiBigEdit: Understanding the Limits of Lifelong Knowledge Editing in LLMs",
        area="analysis",
        paper="Understanding the Limits of Lifelong Knowledge Editing in LLMs",
        paper_url="https://arxiv.org/abs/2503.05683",
        code_url="https://github.com/ExplainableML/WikiBigEdit",
        config="lmlab.methods.analysis.wikibigedit.config:WikiBigEditConfig",
        run="lmlab.methods.analysis.wikibigedit.experiment:run",
        claim=(
            "Edited increment after increment, retrieval (RAG) keeps the highest edit accuracy, retention of past "
            "increments and multi-hop accuracy; among parametric editors LoRA-Merge keeps locality and general "
            "ability best and retains more than plain LoRA and FT; sequential ROME edits the current increment but "
            "forgets past ones and drifts on unrelated facts as edits accumulate."
        ),
        baselines=("rag", "lora", "lora_merge", "ft", "rome", "memit", "pre_edit"),
        default_model="smollm2-135m",
        suites=("geobigedit", "humaneval", "corpus"),
        presets={
            "smoke": {
                "model": "tiny-llama",
                "methods": ["rag", "lora", "lora_merge", "ft", "rome", "memit"],
                "increments": 2,
                "edits_per_increment": 3,
                "n_general": 3,
                "n_fluency": 1,
                "retriever": "hashing",
                "lora_epochs": 3,
                "rome_layer": 0,
                "rome_steps": 3,
                "rome_templates": 1,
                "rome_template_tokens": 2,
                "memit_layers": [0, 1],
                "ft_layers": [1],
                "cov_samples": 4,
                "cov_tokens": 16,
                "lr_search": [1.0, 64.0],
                "lr_max_extensions": 0,
                "lr_dev_edits": 3,
            },
            "quick": {
                "methods": ["rag", "lora_merge"],
                "increments": 2,
                "edits_per_increment": 6,
                "n_general": 10,
                "n_fluency": 3,
                "lr_search": [8.0, 64.0],
                "lr_max_extensions": 0,
                "lr_dev_edits": 6,
            },
        },
        budget_s={"smoke": 10.0, "quick": 60.0, "default": 300.0},
        requires=("peft", "sklearn"),
        tags=("analysis", "knowledge-editing", "lifelong"),
        bibtex=(
            "@inproceedings{thede2025wikibigedit,\n  title={Understanding the Limits of Lifelong Knowledge Editing in "
            "LLMs},\n  author={Thede, Lukas and Roth, Karsten and Bethge, Matthias and Akata, Zeynep and Hartvigsen, "
            "Tom},\n  booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# The algorithm imports torch; its names load on first use so that `lmlab list` stays torch-free.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method="__all__",
    baselines="__all__",
    locate_edit="__all__",
    experiment=("build_geobigedit",),
)

__all__ = ["SPEC", *_LAZY]
