"""Implicit PRM (Yuan et al., ICML 2025): an outcome RM r = beta log(pi/pi_ref) whose log-ratios are step rewards."""

from lmlab.core.training.prm import register_prm_loader
from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="implicit_prm",
        name="Implicit PRM (Free Process Rewards without Process Labels)",
        area="alignment",
        paper="Free Process Rewards without Process Labels",
        paper_url="https://arxiv.org/abs/2412.01981",
        code_url="https://github.com/PRIME-RL/ImplicitPRM",
        config="lmlab.methods.alignment.implicit_prm.config:ImplicitPRMConfig",
        run="lmlab.methods.alignment.implicit_prm.experiment:run",
        claim=(
            "An outcome reward model parameterised as beta log(pi_theta/pi_ref) and trained on response-level labels "
            "only gives step rewards (summed token log-ratios) that pick better best-of-N answers than majority vote "
            "and than a Monte Carlo-labelled PRM, localise the first wrong step above chance, and need a fraction of "
            "the MC PRM's training rollouts."
        ),
        baselines=("orm", "mc_prm", "majority_vote", "random"),
        default_model="smollm2-135m",
        suites=("arith_chain",),
        presets={
            "smoke": {
                "k": 1,
                "lrs": [1e-4, 1e-3],
                "epoch_grid": [1],
                "max_extensions": 0,
                "batch_size": 8,
                "n_train": 3,
                "n_dev": 1,
                "n_responses": 4,
                "n_eval": 3,
                "n_candidates": 4,
                "mc_rollouts": 2,
            },
            "quick": {"n_train": 16, "n_dev": 4, "n_eval": 12, "n_candidates": 4},
        },
        # default over 5 min: the claim needs every reward model tuned by its own dev search (19-21 one-epoch grid
        # points, ~550 s at the 2026-12-07 run's rate; README, Timing)
        budget_s={"smoke": 10.0, "quick": 60.0, "default": 600.0},
        tags=("alignment", "reward-model", "prm", "best-of-n"),
        bibtex=(
            "@inproceedings{yuan2025implicitprm,\n  title={Free Process Rewards without Process Labels},\n"
            "  author={Yuan, Lifan and Li, Wendi and Chen, Huayu and Cui, Ganqu and Ding, Ning and Zhang, Kaiyan "
            "and Zhou, Bowen and Liu, Zhiyuan and Peng, Hao},\n  booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# The algorithm imports torch; its names load on first use so that `lmlab list` stays torch-free.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method=(
        "ImplicitPRM",
        "Recipe",
        "ValueModel",
        "aggregate",
        "balance_weights",
        "best_of_n_accuracy",
        "distinct_pick_accuracy",
        "encode_steps",
        "first_error_hit",
        "implicit_epochs",
        "load_implicit_prm",
        "pair_accuracy",
        "prepare",
        "response_logps",
        "select_recipe",
        "train_implicit",
        "train_implicit_prm",
        "train_value_model",
        "value_model_epochs",
        "vote_accuracy",
    ),
)

# `--set prm=implicit:DIR` in rsd / spec_search (any method that takes a saved PRM) loads the folder this method saves
register_prm_loader("implicit", "lmlab.methods.alignment.implicit_prm.method:load_implicit_prm")

__all__ = ["SPEC", *_LAZY]
