"""SWIFTCODE (Huang et al., ICML 2025): keep the fastest, leanest correct candidate per task (sandboxed), then SFT."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="swiftcode",
        name="SWIFTCODE: efficiency-aware code fine-tuning (SwiftCoder / EffiCoder)",
        area="alignment",
        paper="SwiftCoder: Enhancing Code Generation in Large Language Models through Efficiency-Aware Fine-tuning",
        paper_url="https://arxiv.org/abs/2410.10209",
        code_url="https://github.com/huangd1999/EffiCoder",
        config="lmlab.methods.alignment.swiftcode.config:SwiftCodeConfig",
        run="lmlab.methods.alignment.swiftcode.experiment:run",
        claim=(
            "Fine-tuning on the most efficient correct candidate of each task (candidates from several generators, "
            "measured in a sandbox: correctness first, then execution time and memory) gives lower normalised "
            "execution time on held-out tasks than fine-tuning on a random correct candidate, and higher pass@1 "
            "than the base model."
        ),
        baselines=("random_correct", "slowest_correct", "base"),
        default_model="smollm2-135m",
        suites=(),  # tasks.py builds its own seeded tasks (not a registered lmlab.data suite)
        presets={
            "smoke": {
                "model": "tiny-llama",
                "families": ["pair_sum", "fibonacci"],
                "n_train": 4,
                "n_eval": 2,
                "stress_scale": 0.2,
                "timing": "lines",
                "llm_tasks": 1,
                "llm_samples": 1,
                "llm_max_new_tokens": 16,
                "sandbox_timeout_s": 5.0,
                "train_layers": 1,
                "epochs": 1,
                "train_batch": 4,
                "max_new_tokens": 16,
            },
            "quick": {
                "families": ["pair_sum", "count_members"],
                "n_train": 16,
                "n_eval": 8,
                "stress_scale": 0.5,
                "generators": ["template"],
                "train_layers": 4,
            },
        },
        # default over 5 min: the claim needs >= 6 families solved by both SFT systems, so all 16 run (~6.5 min)
        budget_s={"smoke": 20.0, "quick": 60.0, "default": 600.0},
        tags=("alignment", "code", "sft", "sandbox", "efficiency"),
        bibtex=(
            "@inproceedings{huang2025swiftcoder,\n  title={SwiftCoder: Enhancing Code Generation in Large Language "
            "Models through Efficiency-Aware Fine-tuning},\n  author={Huang, Dong and Zeng, Guangtao and Dai, Jianbo "
            "and Luo, Meng and Weng, Han and Qing, Yuhao and Cui, Heming and Guo, Zhijiang and Zhang, Jie M.},\n  "
            "booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# The algorithm imports numpy (and the sandbox); its names load on first use.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method=(
        "Candidate",
        "MeasureSettings",
        "Measurement",
        "TaskSelection",
        "dedupe_candidates",
        "extract_code",
        "measure_efficiency",
        "measure_many",
        "select_most_efficient",
        "select_random_correct",
        "select_slowest_correct",
        "swiftcode_select",
        "template_candidates",
        "user_prompt",
    ),
    tasks=("FAMILIES", "CodeTask", "Family", "Variant", "build_tasks", "make_task"),
)

__all__ = ["SPEC", *_LAZY]
