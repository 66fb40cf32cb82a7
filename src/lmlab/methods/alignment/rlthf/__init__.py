"""RLTHF (Xu et al., ICML 2025): targeted human correction of AI-labelled preferences via the reward distribution."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="rlthf",
        name="RLTHF: targeted human feedback for LLM alignment",
        area="alignment",
        paper="RLTHF: Targeted Human Feedback for LLM Alignment",
        paper_url="https://arxiv.org/abs/2502.13417",
        code_url=None,
        config="lmlab.methods.alignment.rlthf.config:RLTHFConfig",
        run="lmlab.methods.alignment.rlthf.experiment:run",
        claim=(
            "Sending to the annotator only the AI-labelled pairs below the knee of the reward model's sorted margins, "
            "amplifying the corrections and dropping the rest of that tail, gives a reward model with higher "
            "held-out accuracy than random selection, uncertainty sampling and AI labels alone at the same oracle "
            "budget (6% of the pool), close to full annotation, under a systematically biased AI labeller."
        ),
        baselines=("random", "uncertainty", "ai_only", "full", "self"),
        default_model="minilm",
        suites=("countries",),
        presets={
            "smoke": {
                "embedder": "hashing",
                "max_train_prompts": 24,
                "max_test_prompts": 12,
                "n_train_pairs": 200,
                "n_test_pairs": 60,
                "replicates": 2,
                "iterations": 2,
                "pca_dim": 32,
                "n_folds": 3,
                "max_dev_prompts": 12,
                "n_dev_pairs": 60,
                "dev_replicates": 1,
                "backoff_grid": [0.0, 0.5, 1.0],
            },
            "quick": {
                "max_train_prompts": 90,
                "max_test_prompts": 45,
                "n_train_pairs": 600,
                "n_test_pairs": 300,
                "replicates": 6,
                "iterations": 2,
                "pca_dim": 96,
                "max_dev_prompts": 30,
                "n_dev_pairs": 300,
            },
        },
        requires=("kneed",),
        tags=("alignment", "preference-data", "human-in-the-loop", "reward-model"),
        bibtex=(
            "@inproceedings{xu2025rlthf,\n  title={RLTHF: Targeted Human Feedback for LLM Alignment},\n  author={Xu, "
            "Yifei and Chakraborty, Tusher and K{\\i}c{\\i}man, Emre and Aryal, Bibek and Rodrigues, Eduardo and "
            "Sharma, Srinagesh and Estevao, Roberto and de Luis Balaguer, Maria Angels and Wolk, Jessica and Padilha, "
            "Rafael and Nunes, Leonardo and Balakrishnan, Shobana and Lu, Songwu and Chandra, Ranveer},\n  "
            "booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# The algorithm imports numpy and torch; its names load on first use.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method=(
        "Curation",
        "Iteration",
        "Regions",
        "backoff_drop",
        "bt_margins",
        "crossfit_margins",
        "curate",
        "fit_bt",
        "group_folds",
        "kneedle",
        "reward_regions",
        "rolling_mean",
    ),
)

__all__ = ["SPEC", *_LAZY]
