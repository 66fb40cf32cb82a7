"""MPO (Wang et al., ICML 2025): log-linear mixing of single-objective policies with MaxMin mirror-descent weights."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="mpo",
        name="MPO: Mixing Preference Optimization",
        area="alignment",
        paper="MPO: An Efficient Post-Processing Framework for Mixing Diverse Preference Alignment",
        paper_url="https://arxiv.org/abs/2502.18699",
        code_url=None,
        config="lmlab.methods.alignment.mpo.config:MPOConfig",
        run="lmlab.methods.alignment.mpo.experiment:run",
        claim=(
            "Log-linearly mixing single-objective policies, pi ∝ prod_k pi_k^lambda_k, with weights from batch "
            "stochastic mirror descent reaches the MaxMin optimum and gives a higher worst-objective reward than "
            "uniform weights, every single-objective policy and reward soups (parameter averaging), without RL."
        ),
        baselines=("uniform", "single_policies", "reward_soup", "prob_mix", "maxmin_opt"),
        default_model="smollm2-135m",
        suites=("countries",),
        presets={
            "smoke": {
                "model": "tiny-llama",
                "n_train": 3,
                "n_test": 3,
                "n_candidates": 4,
                "k_layers": 1,
                "md_steps": 50,
                "n_samples": 4,
                "dpo_epochs": 1,
                "dpo_pairs": 2,
                "group_prompts": 3,
                "gen_prompts": 2,
                "gen_samples": 2,
                "max_new_tokens": 4,
            },
            "quick": {
                "n_train": 12,
                "n_test": 20,
                "train_policies": False,
            },
        },
        tags=("alignment", "multi-objective", "post-processing", "decoding"),
        bibtex=(
            "@inproceedings{wang2025mpo,\n  title={{MPO}: An Efficient Post-Processing Framework for Mixing Diverse "
            "Preference Alignment},\n  author={Wang, Tianze and Gui, Dongnan and Hu, Yifan and Lin, Shuhang and "
            "Zhang, Linjun},\n  booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# The algorithm imports numpy / torch; its names load on first use so that `lmlab list` stays light.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method=(
        "arithmetic_mix",
        "closed_form_policies",
        "closed_form_policy",
        "cutting_plane_minimize",
        "dual_value",
        "expected_rewards",
        "kl_to_reference",
        "log_linear_mix",
        "maxmin_lp",
        "maxmin_optimum",
        "mixture_generate",
        "mpo_weights",
        "normalize_logps",
        "policy_model",
        "regularised_maxmin_value",
        "response_logps",
        "soup_topk",
        "train_dpo_policy",
        "worst_objective",
        "zscore_fit",
    ),
)

__all__ = ["SPEC", *_LAZY]
