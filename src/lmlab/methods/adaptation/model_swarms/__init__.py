"""Model Swarms (Feng et al., ICML 2025): particle-swarm search over LoRA experts with a dev-set utility."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="model_swarms",
        name="Model Swarms: collaborative swarm search over LoRA experts",
        area="adaptation",
        paper="Model Swarms: Collaborative Search to Adapt LLM Experts via Swarm Intelligence",
        paper_url="https://arxiv.org/abs/2410.11163",
        code_url="https://github.com/BunsenFeng/model_swarm",
        config="lmlab.methods.adaptation.model_swarms.config:ModelSwarmsConfig",
        run="lmlab.methods.adaptation.model_swarms.experiment:run",
        claim=(
            "A particle swarm over LoRA experts (inertia, personal best, global best, repel the worst, step decay, "
            "restarts), guided only by a small dev set of a new task, finds a model whose test accuracy beats the "
            "best single expert and the uniform soup, with TIES, DARE and random search at the same number of "
            "utility evaluations reported beside it."
        ),
        baselines=("best_single", "uniform_soup", "ties", "dare_linear", "random_search"),
        default_model="smollm2-135m",
        suites=("taskbank",),
        presets={
            "smoke": {
                "model": "tiny-llama",
                "experts": ["geography/iso3", "strings/uppercase", "arithmetic/add"],
                "dev_items": 4,
                "test_items": 6,
                "expert_items": 4,
                "expert_steps": 2,
                "expert_batch": 2,
                "rank": 2,
                "alpha": 4.0,
                "train_layers": 1,
                "max_iteration": 2,
                "patience": 2,
                "expert_cache": False,
            },
            "quick": {
                "experts": ["geography/iso3", "strings/uppercase", "geography/capital", "arithmetic/add"],
                "dev_items": 20,
                "test_items": 40,
                "expert_items": 24,
                "expert_steps": 15,
                "max_iteration": 2,
                "patience": 2,
            },
        },
        # default: the 10-minute class (15 swarm iterations x 4 equal-budget searchers; see config.py's budget note)
        budget_s={"smoke": 20.0, "quick": 60.0, "default": 600.0},
        requires=("peft",),
        tags=("adaptation", "lora", "merging", "search"),
        bibtex=(
            "@inproceedings{feng2025modelswarms,\n  title={Model Swarms: Collaborative Search to Adapt LLM Experts "
            "via Swarm Intelligence},\n  author={Feng, Shangbin and Wang, Zifeng and Wang, Yike and Ebrahimi, Sayna "
            "and Palangi, Hamid and Miculicich, Lesly and Kulshrestha, Achin and Rauschmayr, Nathalie and Choi, "
            "Yejin and Tsvetkov, Yulia and Lee, Chen-Yu and Pfister, Tomas},\n  booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# The algorithm imports torch; its names load on first use.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method="__all__",
    adapters=("ChoiceSet", "LoraSlot", "from_peft_state", "lora_state", "peft_state", "train_lora_expert"),
)

__all__ = ["SPEC", *_LAZY]
