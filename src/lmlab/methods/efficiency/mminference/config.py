"""Configuration of MMInference (per-head pattern search + sparse prefill) and its reproduction."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param

EVAL_TASKS = ("passkey", "niah_multikey", "vt")


@dataclass
class MMInferenceConfig(BaseConfig):
    """MMInference (Li et al., ICML 2025) against dense SDPA, A-shape and vertical-slash prefill.

    Budgets are absolute token counts scaled from the paper's 128k-1M contexts to 2-8k (see README "Deviations").

    Args:
        block_size (`int`, defaults to 128): query/key block of the CPU kernel (official Triton kernels: 64).
        last_q (`int`, defaults to 64): queries of the online VS estimate (MInference 64; MMInference 257 in its
            search space and 182 in its VS kernel).
        forced_columns, forced_diagonals (`int`, defaults to 30, 100): VS columns/diagonals always kept.
        a_shape (`list[int]`, defaults to ``[64, 512]``): sink and local window of the A-shape candidate.
        vs_sizes (`list[list[int]]`, defaults to ``[[128, 256], [128, 512]]``): (vertical, slash) candidates.
        grid_stride (`int`, defaults to 32): period (tokens per frame) of the periodic calibration input; the grid
            candidates use it on both inputs. grid_local (`int`, defaults to 128): local band of the grid candidate.
        grid_phase_gain (`float`, defaults to 0.05): lmlab's negative control counts a grid head only if its lines at
            the searched phase beat lines at the median phase by this much recall (sinks included on both sides).
        minimal_delta (`float`, defaults to 0.01): recall gain needed to switch to a later candidate.
        min_recall (`float`, defaults to 0.95): heads whose best recall stays below run dense (lmlab; 0 = off).
        calib_tokens, periodic_tokens (`int`): lengths of the natural and periodic calibration inputs.
        eval_task (`str`), n_eval (`int`), eval_tokens (`int`): held-out RULER examples for NLL and retrieval.
        nll_tokens (`int`, defaults to 256): scored prompt positions (``logits_to_keep``); gen_tokens: greedy answer.
        bench_lengths (`list[int]`): prefill lengths of the speed runs; timing_repeats: timed rounds per length.
        timing_layers (`int`, defaults to 2): layers (evenly spaced over depth) in the speed runs.
        timing_threads (`int`, defaults to 1): torch threads during timing (fair-timing protocol).
        baselines (`list[str]`): static baselines run on every head: ``a_shape``, ``vertical_slash``.
        max_delta_nll (`float`, defaults to 0.1): non-inferiority margin of the NLL claim (nats/token).
        mm_images, mm_chars, mm_scale, mm_prose_chars (`int`): shape of the mixed-modality prompts (`glyphs` suite):
            pictures per prompt, symbols per picture, pixel repetition, characters per prose paragraph.
        n_mm (`int`, defaults to 6): held-out mixed-modality windows (glyphs test split; one calibration prompt
            from the train split).
        mm_vs (`list[int]`, defaults to ``[128, 256]``): the one per-row budget [vertical, slash] of every
            mixed-modality system (equal budget: VS without permutation, Q-boundary, 2D-boundary, grid, searched).
        mm_recall_layers (`int`, defaults to 5): layers (evenly spaced) where held-out attention recall is measured.
        mm_timing_repeats (`int`, defaults to 6): timed rounds of the mixed-modality per-layer kernel comparison.
    """

    block_size: int = param(128, "query/key block of the CPU kernel", paper="64 (Triton kernels)")
    last_q: int = param(
        64,
        "queries of the online VS estimate",
        paper="64 (MInference); 257 (MMInference search), 182 (its VS kernel) [code]",
    )
    forced_columns: int = param(30, "VS columns always kept (attention sinks)", paper="30 [code]")
    forced_diagonals: int = param(100, "VS diagonals always kept (local window)", paper="100 [code]")
    a_shape: list = param([64, 512], "A-shape candidate: [sink, local]", paper="[128, 4096] [code]")
    vs_sizes: list = param(
        [[128, 256], [128, 512]],
        "VS candidates: [[vertical, slash], ...]",
        paper="[[1000, 1024], [1000, 2048]] [code]",
    )
    grid_stride: int = param(
        32, "grid stride (tokens per frame of the periodic input)", paper="tokens per frame / sub-stride"
    )
    grid_local: int = param(128, "local band of the grid candidate", paper="1024 [code]")
    grid_phase_gain: float = param(0.05, "negative control: a grid head's lines must beat a typical phase by this")
    minimal_delta: float = param(0.01, "recall gain needed to switch to a later candidate", paper="0.01 [code]")
    min_recall: float = param(0.95, "heads with best recall below this run dense (lmlab; 0 = off)", paper="none")
    calib_tokens: int = param(2048, "natural-text calibration length", paper="one calibration input")
    periodic_tokens: int = param(1024, "periodic-frames calibration length (the negative control only)")
    eval_task: str = param("passkey", "RULER task of the held-out quality check", choices=EVAL_TASKS)
    n_eval: int = param(6, "held-out RULER examples (test split; >= 6 for a decisive clustered claim)")
    eval_tokens: int = param(2048, "prompt length of the held-out examples")
    nll_tokens: int = param(256, "scored positions at the end of each prompt (logits_to_keep)")
    gen_tokens: int = param(8, "greedy answer tokens")
    bench_lengths: list = param([4096, 8192], "prefill lengths of the speed runs")
    timing_repeats: list = param([6, 3], "timed rounds per bench length (>= 6 for a decisive claim)")
    timing_warmup: int = param(2, "untimed warm-up rounds (fair-timing protocol: >= 2)")
    timing_layers: int = param(2, "layers (evenly spaced over depth) in the speed runs")
    timing_threads: int = param(1, "torch threads during timing")
    baselines: list = param(["a_shape", "vertical_slash"], "static baselines on every head")
    max_delta_nll: float = param(0.1, "non-inferiority margin of the NLL claim (nats/token)")
    mm_images: int = param(2, "pictures per mixed-modality prompt (glyphs suite)")
    mm_chars: int = param(2, "font symbols per picture")
    mm_scale: int = param(2, "pixel repetition of the pictures (9 x scale rows)")
    mm_prose_chars: int = param(400, "characters of each prose paragraph around the pictures")
    n_mm: int = param(6, "held-out mixed-modality windows (glyphs test split; >= 6 for a decisive claim)")
    mm_vs: list = param(
        [128, 256],
        "per-row budget [vertical, slash] shared by every mixed-modality system (equal budget)",
        paper="[1000, 2048] (mix-modality search space) [code]",
    )
    mm_recall_layers: int = param(5, "layers (evenly spaced) where held-out attention recall is measured")
    mm_timing_repeats: int = param(6, "timed rounds of the mixed-modality per-layer kernel comparison")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("block_size", self.block_size, 16, 4096)
        check_range("last_q", self.last_q, 1)
        check_range("forced_columns", self.forced_columns, 0)
        check_range("forced_diagonals", self.forced_diagonals, 1)
        if len(self.a_shape) != 2 or any(not isinstance(x, int) or x < 0 for x in self.a_shape) or not self.a_shape[1]:
            raise ValueError(f"a_shape must be [sink >= 0, local >= 1], got {self.a_shape!r}")
        bad = [p for p in self.vs_sizes if len(p) != 2 or any(not isinstance(x, int) or x < 1 for x in p)]
        if not self.vs_sizes or bad:
            raise ValueError(
                f"vs_sizes must be a non-empty list of [vertical >= 1, slash >= 1], got {self.vs_sizes!r}"
            )
        check_range("grid_stride", self.grid_stride, 2)
        check_range("grid_local", self.grid_local, 0)
        check_range("grid_phase_gain", self.grid_phase_gain, 0.0, 1.0)
        check_range("minimal_delta", self.minimal_delta, 0.0, 1.0)
        check_range("min_recall", self.min_recall, 0.0, 1.0)
        check_range("calib_tokens", self.calib_tokens, 256)
        check_range("periodic_tokens", self.periodic_tokens, 256)
        check_range("n_eval", self.n_eval, 1)
        check_range("eval_tokens", self.eval_tokens, 256)
        check_range("nll_tokens", self.nll_tokens, 2, self.eval_tokens)
        check_range("gen_tokens", self.gen_tokens, 1)
        if not self.bench_lengths or any(not isinstance(n, int) or n < 256 for n in self.bench_lengths):
            raise ValueError(f"bench_lengths must be a non-empty list of ints >= 256, got {self.bench_lengths!r}")
        if len(self.timing_repeats) != len(self.bench_lengths) or any(
            not isinstance(r, int) or r < 1 for r in self.timing_repeats
        ):
            raise ValueError(
                f"timing_repeats must give one int >= 1 per bench length ({len(self.bench_lengths)}), "
                f"got {self.timing_repeats!r}"
            )
        check_range("timing_warmup", self.timing_warmup, 2)
        check_range("timing_layers", self.timing_layers, 1)
        check_range("timing_threads", self.timing_threads, 1)
        for b in self.baselines:
            if b not in ("a_shape", "vertical_slash"):
                raise ValueError(f"baselines entries must be a_shape or vertical_slash, got {b!r}")
        check_range("max_delta_nll", self.max_delta_nll, 0.0)
        check_range("mm_images", self.mm_images, 1, 16)
        check_range("mm_chars", self.mm_chars, 1, 12)
        check_range("mm_scale", self.mm_scale, 1, 4)
        check_range("mm_prose_chars", self.mm_prose_chars, 0, 100_000)
        check_range("n_mm", self.n_mm, 1)
        if len(self.mm_vs) != 2 or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in self.mm_vs):
            raise ValueError(f"mm_vs must be [vertical >= 1, slash >= 1], got {self.mm_vs!r}")
        check_range("mm_recall_layers", self.mm_recall_layers, 1)
        check_range("mm_timing_repeats", self.mm_timing_repeats, 1)
