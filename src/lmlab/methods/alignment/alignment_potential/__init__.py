"""M_AP (Huang et al., ICML 2025): select preference pairs by the gap from the implicit to the explicit margin."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="alignment_potential",
        name="Alignment Potential (M_AP) preference-data selection",
        area="alignment",
        paper="Larger or Smaller Reward Margins to Select Preferences for (LLM) Alignment?",
        paper_url="https://arxiv.org/abs/2503.01864",
        code_url="https://github.com/Hesse73/Alignment-Potential-Metric",
        config="lmlab.methods.alignment.alignment_potential.config:AlignmentPotentialConfig",
        run="lmlab.methods.alignment.alignment_potential.experiment:run",
        claim=(
            "Training DPO or SimPO on the 40% of a preference pool with the highest alignment potential "
            "z(explicit margin) - z(|implicit margin|) gives higher held-out preference accuracy than the 40% with "
            "the largest explicit margins, the smallest implicit margins, or a random 40%."
        ),
        baselines=("random", "explicit_only", "implicit_only", "map_xlogp", "full_pool"),
        default_model="smollm2-135m",
        suites=("countries",),
        presets={
            "smoke": {
                "model": "tiny-llama",
                "pool_size": 10,
                "test_size": 6,
                "k_layers": 1,
                "epochs": 1,
                "replicates": 2,
                "train_batch": 4,
                "score_batch": 8,
                "selections": ["random", "explicit_only", "implicit_only", "map"],
                "simpo_selections": ["random", "map"],
            },
            "quick": {
                "pool_size": 40,
                "test_size": 30,
                "k_layers": 2,
                "replicates": 2,
                "selections": ["random", "map"],
                "simpo_selections": [],
            },
        },
        tags=("alignment", "data-selection", "preference", "dpo", "simpo"),
        bibtex=(
            "@inproceedings{huang2025larger,\n  title={Larger or Smaller Reward Margins to Select Preferences for "
            "{LLM} Alignment?},\n  author={Huang, Kexin and Wu, Junkang and Chen, Ziqian and Wang, Xue and Gao, "
            "Jinyang and Ding, Bolin and Wu, Jiancan and He, Xiangnan and Wang, Xiang},\n  booktitle={ICML},\n  "
            "year={2025}}"
        ),
    )
)

# The algorithm imports torch; its names load on first use so that `lmlab list` stays torch-free.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method=(
        "MAPScores",
        "PairCache",
        "PairScores",
        "alignment_potential",
        "encode_pairs",
        "implicit_margin",
        "map_from_logps",
        "map_score",
        "metric_scores",
        "preference_accuracy",
        "random_indices",
        "response_logps",
        "reward_margins",
        "rm_margin",
        "score_pairs",
        "select",
        "select_size",
        "slice_cache",
        "top_k_indices",
        "train_preference",
        "zscore",
    ),
)

__all__ = ["SPEC", *_LAZY]
