"""Configuration of ShadowKV and its reproduction (fidelity, retrieval, memory, spectrum, decode-attention timing)."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param

RULER_TASKS = ("passkey", "niah_multikey", "vt", "fwe")


@dataclass
class ShadowKVConfig(BaseConfig):
    """ShadowKV (Sun et al., ICML 2025) against full attention, Quest, Loki and StreamingLLM at equal total budget.

    Args:
        sparse_budget (`int`, defaults to 128): headline number of rebuilt (selected) tokens per kv head and step.
        budgets (`list[int]`): sparse budgets of the fidelity sweep (the headline one is always included).
        rank (`int`, defaults to 48): SVD rank of the pre-RoPE keys (of Hkv·d = 192 for SmolLM2).
        ranks (`list[int]`): rank sweep (ShadowKV at the headline budget); empty to skip.
        chunk_size (`int`, defaults to 8), local_chunks (`int`, defaults to 4): as the reference.
        outlier_chunks (`int`, *optional*): outlier chunks per kv head; None scales the reference's 48 chunks at
            budget 2048 to the budget: ``max(1, round(48 * budget / 2048))``.
        select_scale (`str` or `float`, defaults to ``"head_dim"``): the landmark softmax divides by sqrt(this);
            ``"head_dim"`` uses the model's head dim (the reference hard-codes 128).
        quest_page (`int`, defaults to 16): Quest's page size; loki_rank (`int`, defaults to 16): Loki's principal
            dimensions (d/4); sink (`int`, defaults to 4): StreamingLLM's sink tokens.
        context_tokens (`int`, defaults to 2048): prefill length of the teacher-forced fidelity prompts.
        n_prompts (`int`, defaults to 8): fidelity prompts (batched), the independent units (clusters) of the
            fidelity metrics; decode_steps: teacher-forced steps T per prompt.
        prefill_chunk (`int`, *optional*): prefill in forward calls of this many tokens (chunked prefill); None
            prefills each prompt in one call, as the reference's attention does.
        retrieval_task, retrieval_tokens, n_retrieval: RULER task, prompt length and examples of the retrieval test.
        retrieval_prefill (`str`, defaults to ``"prompt"``): what is prefilled densely before the policy decodes:
            the whole prompt but its last token (the paper's protocol) or only the haystack (``"context"``: the
            question goes through the decode path as one multi-token query).
        retrieval_gate (`float`, defaults to 0.5): dense accuracy needed before methods are compared on a task.
        new_tokens (`int`, defaults to 8): greedy tokens generated per retrieval answer.
        bench_tokens, bench_batches, bench_repeats: decode-attention microbenchmark (context, batch sizes, rounds).
        ablations (`bool`, defaults to `True`): also run ShadowKV without outlier chunks (same total budget).
    """

    sparse_budget: int = param(
        128, "selected tokens per kv head per step (multiple of chunk_size)", paper="2048 (1.56% of 128K) [code]"
    )
    budgets: list = param([64, 128, 256], "sparse budgets of the fidelity sweep", paper="1.56% of context")
    rank: int = param(48, "SVD rank of pre-RoPE keys (of Hkv*d=192 for SmolLM2)", paper="160 of 1024 [code]")
    ranks: list = param([16, 96], "extra ranks for the rank sweep at the headline budget", paper="ablation [paper]")
    chunk_size: int = param(8, "tokens per chunk/landmark", paper="8 [code]")
    local_chunks: int = param(4, "trailing chunks kept exact", paper="4 [code]")
    outlier_chunks: int | None = param(
        None, "outlier chunks per kv head (None: 48 scaled by budget/2048)", paper="48 at budget 2048 [code]"
    )
    select_scale: str | float = param(
        "head_dim", "landmark softmax uses 1/sqrt(this); 'head_dim' = model head dim", paper="128 (hard-coded) [code]"
    )
    quest_page: int = param(16, "Quest page size", paper="16 (Quest)")
    loki_rank: int = param(16, "Loki principal dimensions for approximate scores (d/4)", paper="d/4 (Loki)")
    sink: int = param(4, "StreamingLLM sink tokens", paper="4 (StreamingLLM)")
    context_tokens: int = param(2048, "fidelity prompt length (prefill)", paper="RULER 128K, LongBench [paper]")
    n_prompts: int = param(8, "fidelity prompts (one batch); the unit of the KL/top-1 CIs and claims (>= 6 to decide)")
    prefill_chunk: int | None = param(
        None,
        "prompt tokens per prefill forward call (None: one call)",
        paper="one attention call (MLP chunked) [code]",
    )
    decode_steps: int = param(32, "teacher-forced decode steps T per prompt")
    retrieval_task: str = param("passkey", "RULER-like task of the retrieval test", choices=RULER_TASKS)
    retrieval_tokens: int = param(
        1024, "retrieval prompt length (SmolLM2's dense passkey accuracy drops below the gate at 1536)",
        paper="RULER 4K-128K [paper]",
    )  # fmt: skip
    n_retrieval: int = param(8, "retrieval examples")
    retrieval_prefill: str = param(
        "prompt",
        "dense prefill of the whole prompt but its last token ('prompt', paper) or only the haystack ('context')",
        paper="whole prompt (prefill > 4k tokens) [code]",
        choices=("prompt", "context"),
    )
    retrieval_gate: float = param(0.5, "dense accuracy needed to compare methods on the task")
    new_tokens: int = param(8, "greedy tokens per retrieval answer")
    bench_tokens: int = param(4096, "context of the decode-attention microbenchmark")
    bench_batches: list = param([1, 8], "batch sizes of the decode-attention microbenchmark")
    bench_repeats: int = param(7, "interleaved timed rounds per batch size")
    ablations: bool = param(True, "also run ShadowKV without outlier chunks (same total budget)")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("chunk_size", self.chunk_size, 1)
        check_range("local_chunks", self.local_chunks, 0)
        check_range("rank", self.rank, 1)
        check_range("outlier_chunks", self.outlier_chunks, 0)
        for name, value in [("sparse_budget", self.sparse_budget), *(("budgets", b) for b in self.budgets)]:
            if isinstance(value, bool) or not isinstance(value, int) or value < self.chunk_size:
                raise ValueError(f"{name} must be ints >= chunk_size={self.chunk_size}, got {value!r}")
            if value % self.chunk_size:
                raise ValueError(f"{name} must be multiples of chunk_size={self.chunk_size}, got {value!r}")
        for r in self.ranks:
            if isinstance(r, bool) or not isinstance(r, int) or r < 1:
                raise ValueError(f"ranks must be ints >= 1, got {r!r}")
        if self.select_scale != "head_dim":
            if isinstance(self.select_scale, str) or self.select_scale <= 0:
                raise ValueError(f"select_scale must be 'head_dim' or a number > 0, got {self.select_scale!r}")
        check_range("quest_page", self.quest_page, 1)
        check_range("loki_rank", self.loki_rank, 1)
        check_range("sink", self.sink, 0)
        check_range("context_tokens", self.context_tokens, 64)
        check_range("n_prompts", self.n_prompts, 1)
        check_range("prefill_chunk", self.prefill_chunk, 1)
        check_range("decode_steps", self.decode_steps, 1)
        check_range("retrieval_tokens", self.retrieval_tokens, 256)
        check_range("n_retrieval", self.n_retrieval, 0)
        check_range("retrieval_gate", self.retrieval_gate, 0.0, 1.0)
        check_range("new_tokens", self.new_tokens, 1)
        check_range("bench_tokens", self.bench_tokens, 64)
        check_range("bench_repeats", self.bench_repeats, 1)
        for b in self.bench_batches:
            if isinstance(b, bool) or not isinstance(b, int) or b < 1:
                raise ValueError(f"bench_batches must be ints >= 1, got {b!r}")

    def outliers_for(self, budget: int) -> int:
        """Outlier chunks at a sparse budget (the configured number, or the reference ratio 48 per 2048)."""
        if self.outlier_chunks is not None:
            return int(self.outlier_chunks)
        return max(1, round(48 * budget / 2048))
