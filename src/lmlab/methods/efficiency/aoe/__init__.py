"""Autonomy-of-Experts (Lv et al., ICML 2025): router-free MoE, experts ranked by their own activation norm."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="aoe",
        name="Autonomy-of-Experts",
        area="efficiency",
        paper="Autonomy-of-Experts Models",
        paper_url="https://arxiv.org/abs/2501.13074",
        code_url="https://github.com/trestad/Autonomy-of-Experts",
        config="lmlab.methods.efficiency.aoe.config:AoEConfig",
        run="lmlab.methods.efficiency.aoe.experiment:run",
        claim=(
            "Router-free experts that rank themselves by the norm of a low-rank pre-activation beat a router MoE "
            "(softmax top-k + aux loss) at equal total parameters, with better expert-load balance; in a pretrained "
            "FFN split into experts, the low-rank norm picks better experts than chance."
        ),
        baselines=("router_moe", "random_choice", "fitted_router", "oracle_norm", "dense_ffn"),
        default_model="smollm2-135m",
        suites=("fact_corpus", "corpus"),
        presets={
            "smoke": {
                "d_model": 32,
                "n_layers": 1,
                "n_heads": 2,
                "n_experts": 4,
                "d_low": 4,
                "moe_d_ff": 16,
                "vocab_size": 128,
                "n_seeds": 1,
                "steps": 3,
                "train_batch_size": 4,
                "seq_len": 16,
                "warmup": 1,
                "n_facts": 20,
                "n_corpus_passages": 4,
                "eval_windows": 2,
                "timing_repeats": 1,
                "b_experts": 4,
                "b_top_k": 2,
                "b_d_low": 4,
                "n_eval_passages": 2,
                "eval_tokens": 16,
                "n_router_passages": 2,
            },
            "quick": {
                "d_model": 64,
                "n_layers": 2,
                "steps": 60,
                "n_seeds": 1,
                "n_facts": 300,
                "n_corpus_passages": 80,
                "eval_windows": 12,
                "timing_repeats": 3,
                "b_rules": ["aoe_lowrank", "router", "random"],
                "n_eval_passages": 8,
                "n_router_passages": 8,
            },
        },
        tags=("efficiency", "moe", "pretraining"),
        bibtex=(
            "@inproceedings{lv2025autonomyofexperts,\n  title={Autonomy-of-Experts Models},\n  author={Lv, Ang and "
            "Xie, Ruobing and Qian, Yining and Wu, Songhao and Sun, Xingwu and Kang, Zhanhui and Wang, Di and Yan, "
            "Rui},\n  booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# The algorithm imports torch; its names load on first use so that `lmlab list` stays torch-free.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method=(
        "AoEMoE",
        "DenseFFN",
        "MoEfiedFFN",
        "RouterMoE",
        "aoe_d_wide_for_params",
        "balance_stats",
        "dense_mixture",
        "fit_router",
        "install_ffn",
        "load_balancing_loss",
        "moefy",
        "set_rule",
        "svd_low_rank_down",
        "total_aux_loss",
        "unmoefy",
    ),
)

__all__ = ["SPEC", *_LAZY]
