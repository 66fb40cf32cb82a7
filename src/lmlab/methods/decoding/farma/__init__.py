"""FaRMA (Rashid et al., ICML 2025): reward-guided text generation with one reward-model call per token."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="farma",
        name="FaRMA: cost-effective reward-guided text generation",
        area="decoding",
        paper="Towards Cost-Effective Reward Guided Text Generation",
        paper_url="https://arxiv.org/abs/2502.04517",
        code_url="https://github.com/ahmadrash/FaRMA",
        config="lmlab.methods.decoding.farma.config:FarmaConfig",
        run="lmlab.methods.decoding.farma.experiment:run",
        claim=(
            "A V-channel reward model scores every next token in one call, so reward-guided decoding reaches the "
            "gold reward of ARGS/PARGS (above plain sampling) with 1 reward-model call per token instead of k."
        ),
        baselines=("top_k_sampling", "best_of_n", "args", "pargs"),
        default_model="smollm2-135m",
        suites=(),
        presets={
            "smoke": {
                "eval_prompts": 2,
                "eval_seeds": 1,
                "eval_batch": 2,
                "pref_prompts": 3,
                "samples_per_prompt": 2,
                "pref_tokens": 6,
                "max_new_tokens": 4,
                "iterations": 1,
                "rank": 4,
                "best_of_n": 2,
                "w_sweep": [],
                "run_init_control": False,
                "run_no_max_ablation": False,
                "latency_prompts": 1,
            },
            "quick": {
                "eval_prompts": 5,
                "eval_seeds": 2,
                "pref_prompts": 20,
                "samples_per_prompt": 3,
                "pref_tokens": 16,
                "max_new_tokens": 12,
                "iterations": 3,
                "bt_epochs": 5.0,
                "max_epochs": 5.0,
                "best_of_n": 0,
                "w_sweep": [],
                "run_pargs": False,
                "run_init_control": False,
                "run_no_max_ablation": False,
                "latency_prompts": 1,
            },
        },
        tags=("decoding", "reward-guided"),
        bibtex=(
            "@inproceedings{rashid2025farma,\n  title={Towards Cost-Effective Reward Guided Text Generation},\n"
            "  author={Rashid, Ahmad and Wu, Ruotian and Fan, Rongqi and Li, Hongliang and Kristiadi, Agustinus "
            "and Poupart, Pascal},\n  booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# The algorithm imports torch; its names load on first use so that `lmlab list` stays torch-free.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method="__all__",
    baselines="__all__",
    reward_models="__all__",
    sampling="__all__",
)

__all__ = ["SPEC", *_LAZY]
