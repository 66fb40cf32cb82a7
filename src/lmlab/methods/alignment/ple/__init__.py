"""PLE (Liu, Xu and Geng, ICML 2025): principle-guided pairs, ranking loss above a decaying threshold, else WSFT."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="ple",
        name="PLE: Progressively Label Enhancement",
        area="alignment",
        paper="Progressively Label Enhancement for Large Language Model Alignment",
        paper_url="https://arxiv.org/abs/2408.02599",
        code_url="https://github.com/palm-biaoliu/PLE",
        config="lmlab.methods.alignment.ple.config:PLEConfig",
        run="lmlab.methods.alignment.ple.experiment:run",
        claim=(
            "Training on the policy's own principle-guided and plain answers, with a ranking loss where the guided "
            "answer's normalised reward is higher by more than a decaying threshold tau_i = 0.2 * 0.9^i and "
            "reward-weighted SFT on both otherwise, gives a higher held-out reward without the principle than SFT, "
            "RAFT (SFT on the best of 4 plain samples) and always-rank DPO on the same queries and budget."
        ),
        baselines=("sft", "raft_plain", "raft_guided", "always_rank_dpo", "ple_fixed", "ple_rank_only"),
        default_model="smollm2-135m",
        suites=("countries",),
        presets={
            "smoke": {
                "model": "tiny-llama",
                "n_sft": 4,
                "iterations": 2,
                "queries_per_iter": 4,
                "n_test": 4,
                "systems": ["ple", "ple_fixed", "raft_plain", "raft_guided", "always_rank_dpo"],
                "k_layers": 1,
                "epochs": 1,
                "max_new_tokens": 6,
                "gen_batch": 8,
                "eval_guided": True,
            },
            "quick": {
                "n_sft": 32,
                "iterations": 1,
                "queries_per_iter": 12,
                "n_test": 20,
                "systems": ["ple", "raft_plain"],
                "max_new_tokens": 16,
                "eval_guided": False,
            },
        },
        tags=("alignment", "preference", "online", "principle"),
        bibtex=(
            "@inproceedings{liu2025ple,\n  title={Progressively Label Enhancement for Large Language Model "
            "Alignment},\n  author={Liu, Biao and Xu, Ning and Geng, Xin},\n  booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# The algorithm imports numpy / torch; its names load on first use so that `lmlab list` stays light.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method=(
        "PLEOptions",
        "PLEResult",
        "PLETrainResult",
        "PolicyGenerator",
        "RANK",
        "WSFT",
        "dpo_pair_loss",
        "next_threshold",
        "normalize_rewards",
        "ple_align",
        "ple_pair_loss",
        "ple_train",
        "raft_pair_loss",
        "raft_plain_round",
        "raft_select",
        "route_pairs",
        "sft_train",
        "threshold_at",
        "wsft_weights",
    ),
    task=("PRINCIPLE", "sentiment_reward", "utility", "utility_parts"),
)

__all__ = ["SPEC", *_LAZY]
