"""ShadowKV (Sun et al., ICML 2025): low-rank pre-RoPE key cache, values apart, landmark-selected sparse decode."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="shadowkv",
        name="ShadowKV",
        area="efficiency",
        paper="ShadowKV: KV Cache in Shadows for High-Throughput Long-Context LLM Inference",
        paper_url="https://arxiv.org/abs/2410.21465",
        code_url="https://github.com/ByteDance-Seed/ShadowKV",
        config="lmlab.methods.efficiency.shadowkv.config:ShadowKVConfig",
        run="lmlab.methods.efficiency.shadowkv.experiment:run",
        claim=(
            "Decoding from a low-rank pre-RoPE key cache with landmark-selected chunks rebuilt on the fly (values "
            "kept apart) stays closer to full attention than Quest and StreamingLLM at an equal total attended "
            "budget, with a resident KV footprint several times smaller than full K+V."
        ),
        baselines=("full_attention", "quest", "loki", "streaming_llm"),
        default_model="smollm2-135m",
        suites=("corpus", "ruler"),
        presets={
            "smoke": {
                "model": "tiny-llama",
                "context_tokens": 192,
                "n_prompts": 2,
                "decode_steps": 4,
                "sparse_budget": 16,
                "budgets": [16],
                "rank": 8,
                "ranks": [],
                "loki_rank": 4,
                "retrieval_tokens": 448,
                "n_retrieval": 1,
                "new_tokens": 3,
                "bench_tokens": 256,
                "bench_batches": [1, 2],
                "bench_repeats": 2,
            },
            "quick": {
                "context_tokens": 1024,
                "n_prompts": 2,
                "decode_steps": 16,
                "sparse_budget": 64,
                "budgets": [64],
                "ranks": [],
                "ablations": False,
                "retrieval_tokens": 768,
                "n_retrieval": 2,
                "new_tokens": 6,
                "bench_tokens": 2048,
                "bench_batches": [1, 8],
                "bench_repeats": 5,
            },
        },
        tags=("efficiency", "kv-cache", "sparse-attention", "long-context"),
        bibtex=(
            "@inproceedings{sun2025shadowkv,\n  title={ShadowKV: KV Cache in Shadows for High-Throughput Long-Context "
            "LLM Inference},\n  author={Sun, Hanshi and Chang, Li-Wen and Bao, Wenlei and Zheng, Size and Zheng, "
            "Ningxin and Liu, Xin and Dong, Harry and Chi, Yuejie and Chen, Beidi},\n  booktitle={ICML},\n"
            "  year={2025}}"
        ),
    )
)

# The algorithm imports torch; its names load on first use so that `lmlab list` stays torch-free.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method="__all__",
)

__all__ = ["SPEC", *_LAZY]
