"""Memory Layers at Scale (Berges et al., ICML 2025): product-key memory layers with shared values (Memory+)."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="memory_layers",
        name="Memory Layers at Scale (Memory+)",
        area="efficiency",
        paper="Memory Layers at Scale",
        paper_url="https://arxiv.org/abs/2412.09764",
        code_url="https://github.com/facebookresearch/memory",
        config="lmlab.methods.efficiency.memory_layers.config:MemoryLayersConfig",
        run="lmlab.methods.efficiency.memory_layers.experiment:run",
        claim=(
            "Replacing an FFN by a product-key memory layer raises factual recall over dense models at equal and "
            "~2x FLOPs and over a parameter-matched MoE, with ~no gain on a non-factual control domain."
        ),
        baselines=("dense", "dense_2x", "moe", "pkm"),
        default_model="tiny-llama",
        suites=("fact_corpus",),
        presets={
            "smoke": {
                "systems": ["dense", "memory", "moe"],
                "n_facts": 40,
                "hidden": 32,
                "n_layers": 2,
                "d_ff": 64,
                "seq_len": 32,
                "memory_layers": [1],
                "n_keys": 16,
                "knn": 4,
                "k_dim": 16,
                "steps": 8,
                "train_batch_size": 4,
                "warmup": 2,
                "n_control": 8,
                "timing_repeats": 1,
                "timing_batch": 2,
            },
            "quick": {
                "systems": ["dense", "memory"],
                "n_facts": 200,
                "steps": 200,
                "train_batch_size": 16,
                "n_control": 80,
                "timing_repeats": 3,
            },
        },
        tags=("efficiency", "pretraining", "memory"),
    )
)

# The algorithm imports torch; its names load on first use so that `lmlab list` stays torch-free.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method=(
        "ProductKeyMemory",
        "SwitchMoE",
        "ValueTable",
        "add_memory_layers",
        "add_moe_layers",
        "brute_force_topk",
        "memory_cost",
        "memory_param_groups",
        "model_costs",
        "product_key_topk",
    ),
)

__all__ = ["SPEC", *_LAZY]
