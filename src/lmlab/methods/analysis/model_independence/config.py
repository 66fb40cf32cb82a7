"""Configuration of the independence tests (PERMTEST, CSW, CSH, MATCH) and their reproduction."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param

DERIVED = ("finetune", "perm_rot", "pruned", "retrained")


@dataclass
class ModelIndependenceConfig(BaseConfig):
    """Independence tests for language models (Zhu et al., ICML 2025).

    Two modes. With `a` and `b` set, the tests run on those two models only (``lmlab run model_independence --set
    a=DIR --set b=DIR``). Otherwise the reproduction runs: calibration and power on `tiny_pairs` independently
    seeded tiny llamas, then models derived from `model` (SmolLM2) and one independent real model.

    Args:
        a (`str`, *optional*): model A of pair mode (alias, HF folder or GGUF).
        b (`str`, *optional*): model B of pair mode.
        n_perm (`int`, defaults to 99): PERMTEST permutations T; p floor 1/(T + 1) (code: ``--num_perm 99``).
        alpha (`float`, defaults to 0.05): level of the false-positive rate on independent pairs.
        match_threshold (`float`, defaults to 1e-6): "detected" / localized-match threshold on Spearman p-values.
        blocks (`int`, defaults to 6): blocks tested, evenly spaced (paper: every block; 32 for Llama-7B).
        perm_tensors (`str`, defaults to ``"blocks"``): tensors PERMTEST's statistics read (``all`` as ``l2.py``).
        match_cost (`str`, defaults to ``"cosine"``): MATCH's LAP cost, as Algorithm 2 (code: ``sqeuclidean``,
            which misses fine-tuned and pruned-then-healed tiny copies that cosine detects; see the README).
        columns (`str`, defaults to ``"auto"``): activation columns: shared tokens, or words across tokenizers.
        n_texts, seq_len: activation inputs: texts of the corpus test split, `seq_len` tokens each.
        derived (`list[str]`): derived pairs built from `model`.
        independent_model (`str`, *optional*): an independently trained model tested against `model` by MATCH.
        finetune_*: the fine-tuned copy (full AdamW on corpus dev passages); `finetune_min_change` is the relative
            weight change per tested block that the gated check requires (tiny copies: the same floor).
        prune_*: the structurally pruned copy: `prune_keep_blocks` blocks (a deep run dropped, `deep_block_keep`),
            `prune_keep_units` MLP units per block (activation importance on `prune_calib` train windows), then
            `prune_heal_steps` AdamW steps; the gated localized check must recover its kept-block map.
        retrain_*: one MLP block re-initialised and distilled on its real inputs.
        generalized_*: the generalized robust test (Algorithm 5) on the retrained block; 0 steps skip it.
        tiny_*: the calibration pairs of tiny llamas trained from independent seeds on the same data order.
        fpr_margin (`float`, defaults to 0.15): calibration claim: FPR upper CI bound below alpha + margin.
        localized (`bool`): pair mode: also run block x block localized matching.

    Budget: the default preset is sized for <= 5 min on 2 quiet cores (144 s measured before the 24-step fine-tune,
    the structured pruning with its heal and the 30 x 20 localized matching were added; estimate ~235 s).
    """

    a: str | None = param(None, "pair mode: model A (alias, HF folder or GGUF)")
    b: str | None = param(None, "pair mode: model B")
    n_perm: int = param(99, "PERMTEST permutations T (p floor 1/(T+1))", paper="99 [code: main.py --num_perm]")
    alpha: float = param(0.05, "level of the false-positive rate on independent pairs", paper="0.05")
    match_threshold: float = param(1e-6, "Spearman p below this counts as detected", paper="1e-6 (localized testing)")
    blocks: int = param(6, "blocks tested per model, evenly spaced", paper="all (32 for Llama-7B)")
    perm_tensors: str = param(
        "blocks",
        "tensors read by PERMTEST's statistics",
        paper="all parameters [code: l2.py]",
        choices=("blocks", "all"),
    )
    match_cost: str = param(
        "cosine",
        "MATCH's LAP cost on unit activations (squared Euclidean loses moved copies: README)",
        paper="cosine (Alg. 2); squared Euclidean [code: match_wmats]",
        choices=("sqeuclidean", "cosine"),
    )
    columns: str = param("auto", "activation columns: shared tokens or words", choices=("auto", "tokens", "words"))
    n_texts: int = param(8, "activation input texts (corpus test split)", paper="WikiText-103, batch 1")
    seq_len: int = param(128, "tokens per activation input text", paper="512 [code: --block_size]")
    derived: list = param(list(DERIVED), "derived pairs built from the model: " + ", ".join(DERIVED))
    independent_model: str | None = param("gemma3-270m", "independent model tested by MATCH (None: skip)")
    finetune_steps: int = param(
        24, "AdamW steps of the fine-tuned copy", paper="many tokens (Vicuna, CodeLlama, ...); spec: a few hundred"
    )
    # 3e-4 moved the tested blocks by 0.63% (relative Frobenius, default run of 2026-12-07), under the 1% floor; an
    # AdamW step's size is ~ proportional to lr, so 1e-3 is expected to move them ~2%
    finetune_lr: float = param(1e-3, "fine-tuning peak learning rate (cosine decay)")
    finetune_batch: int = param(2, "fine-tuning windows per step")
    finetune_seq_len: int = param(64, "fine-tuning window length")
    finetune_min_change: float = param(0.01, "gated floor of the fine-tune's relative weight change per tested block")
    prune_keep_blocks: int = param(20, "blocks kept by the structured pruning", paper="spec: 20 of 30")
    prune_keep_units: int = param(1024, "MLP units kept per block", paper="spec: 1024 of 1536")
    prune_heal_steps: int = param(8, "AdamW healing steps after the structured pruning", paper="spec: 'briefly heal'")
    prune_calib: int = param(4, "calibration windows of the unit importance (train split)")
    prune_seq_len: int = param(128, "tokens per calibration window")
    retrain_block: int | None = param(None, "block retrained from scratch (None: the middle tested block)")
    retrain_steps: int = param(100, "distillation steps of the retrained block", paper="10000 [code]")
    retrain_batch: int = param(256, "distillation batch of the retrained block", paper="5000 [code]")
    retrain_lr: float = param(1e-3, "Adam learning rate of the retrained block", paper="1e-3 [code]")
    generalized_steps: int = param(0, "generalized test distillation steps (0: skip)", paper="10000 [code]")
    generalized_batch: int = param(1024, "generalized test batch of X ~ N(0, I)", paper="5000 [code]")
    tiny_pairs: int = param(20, "independent tiny-model pairs (calibration); 0 skips", paper="210 real pairs")
    tiny_layers: int = param(2, "tiny model layers")
    tiny_hidden: int = param(64, "tiny model width (MLP: 2x)")
    tiny_steps: int = param(40, "training steps of each tiny model")
    tiny_lr: float = param(3e-3, "tiny model learning rate")
    tiny_batch: int = param(8, "tiny model training windows per step")
    tiny_seq_len: int = param(64, "tiny model training window length")
    tiny_ft_steps: int = param(10, "fine-tuning steps of each tiny model's derived copy")
    tiny_init_std: float = param(0.02, "tiny model init std", paper="HF initializer_range 0.02")
    fpr_margin: float = param(0.15, "calibration claim: FPR CI upper bound must stay below alpha + margin")
    localized: bool = param(False, "pair mode: also run block x block localized matching")

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.a is None) != (self.b is None):
            raise ValueError(f"pair mode needs both a and b, got a={self.a!r}, b={self.b!r}")
        check_range("n_perm", self.n_perm, 1)
        check_range("alpha", self.alpha, 0.0, 1.0, open_lo=True)
        check_range("match_threshold", self.match_threshold, 0.0, 1.0, open_lo=True)
        check_range("blocks", self.blocks, 1)
        check_range("n_texts", self.n_texts, 1)
        check_range("seq_len", self.seq_len, 4)
        for d in self.derived:
            if d not in DERIVED:
                raise ValueError(f"derived entries must be among {', '.join(DERIVED)}, got {d!r}")
        check_range("finetune_steps", self.finetune_steps, 1)
        check_range("finetune_lr", self.finetune_lr, 0.0, open_lo=True)
        check_range("finetune_batch", self.finetune_batch, 1)
        check_range("finetune_seq_len", self.finetune_seq_len, 2)
        check_range("finetune_min_change", self.finetune_min_change, 0.0, open_lo=True)
        check_range("prune_keep_blocks", self.prune_keep_blocks, 1)
        check_range("prune_keep_units", self.prune_keep_units, 1)
        check_range("prune_heal_steps", self.prune_heal_steps, 0)
        check_range("prune_calib", self.prune_calib, 1)
        check_range("prune_seq_len", self.prune_seq_len, 2)
        check_range("retrain_block", self.retrain_block, 0)
        check_range("retrain_steps", self.retrain_steps, 1)
        check_range("retrain_batch", self.retrain_batch, 1)
        check_range("retrain_lr", self.retrain_lr, 0.0, open_lo=True)
        check_range("generalized_steps", self.generalized_steps, 0)
        check_range("generalized_batch", self.generalized_batch, 1)
        check_range("tiny_pairs", self.tiny_pairs, 0)
        check_range("tiny_layers", self.tiny_layers, 1)
        check_range("tiny_hidden", self.tiny_hidden, 8)
        if self.tiny_hidden % 8:
            raise ValueError(
                f"tiny_hidden must be a multiple of 8 (4 heads of even RoPE width), got {self.tiny_hidden}"
            )
        check_range("tiny_steps", self.tiny_steps, 1)
        check_range("tiny_lr", self.tiny_lr, 0.0, open_lo=True)
        check_range("tiny_batch", self.tiny_batch, 1)
        check_range("tiny_seq_len", self.tiny_seq_len, 2)
        check_range("tiny_ft_steps", self.tiny_ft_steps, 1)
        check_range("tiny_init_std", self.tiny_init_std, 0.0, open_lo=True)
        check_range("fpr_margin", self.fpr_margin, 0.0, 1.0)
