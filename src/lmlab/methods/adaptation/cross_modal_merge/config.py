"""Configuration of cross-modal merging and its proxy reproduction (glyph "VLM" + text-reasoning fine-tune)."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MERGES = ("layerswap", "ties", "dare_linear")


@dataclass
class CrossModalMergeConfig(BaseConfig):
    """Bring Reason to Vision (Chen et al., ICML 2025) on a synthetic proxy: a glyph-bitmap "VLM" and a
    text-reasoning fine-tune of the same base, merged on the decoder layers.

    The VLM-proxy is `model` + a `GlyphProjector` (5x5 bitmap -> `image_tokens` soft tokens) + a LoRA on every
    decoder layer, trained `vlm_steps` steps on "Digit <img> is" (perception, `noise` pixel flips) mixed with
    `vlm_text_mix` of text replay ("Digit 7 is"). The reasoning model is the same base + a LoRA trained
    `reason_steps` steps on "(a + b) mod 10 =" with the digits as text. Merges: linear at every α of `alphas`
    (the claim's α chosen on dev among `claim_alphas`), layerswap (at that α), TIES and DARE-linear. Probes (test
    split): perception, multimodal reasoning (two glyphs) and text reasoning, scored by log-likelihood over the ten
    digits.
    Knockout: each block of `block_size` layers reset to the base, for the VLM-proxy and the chosen merge.

    Args:
        alphas (`list[float]`): the linear merges evaluated (the weight of the VLM; 1.0 is the VLM itself).
        claim_alphas (`list[float]`): the α's the claim may use, chosen on the dev split (paper: 0.9; the spec's
            {0.9, 0.8} extended on both sides so that 0.9 is not the grid's edge: dev ties go to 0.9, and a strict
            dev winner at 0.95 or 0.5 sets the flag ``alpha_at_grid_edge``).
        perception_tol (`float`, defaults to 0.05): how far below the VLM-proxy's perception the merge may fall.
        merges (`list[str]`): other merge modes run (layerswap, ties, dare_linear).
        base_layer_num (`int`, defaults to 5): layerswap keeps layers <= this from the VLM.
        ties_weights, ties_density, dare_weights, dare_density: the TIES / DARE settings (official run script).
        block_size (`int`, defaults to 3): layers per knockout block (10 blocks on SmolLM2's 30 layers).
        knockout_items (`int`, defaults to 16): test items per probe in the knockout analysis.
        vlm_steps, reason_steps, batch, lr, projector_lr, rank, lora_alpha, target_modules: the fine-tunes.
        vlm_text_mix (`float`): share of text-replay items in the VLM-proxy's training pool.
        image_tokens (`int`, defaults to 2): soft tokens per glyph. noise (`float`): pixel-flip probability.
        reason_pairs (`str`): ``all`` (the reasoning fine-tune sees all 100 pairs as text: the probe measures
            cross-modal transfer of the skill) or ``train`` (only the train split's pairs: transfer plus
            generalisation to new sums).
        train_items, dev_items, test_items (`int`): glyph items per split and probe.
        finetune_cache (`bool`): keep the fine-tunes (LoRA factors + projector) under lmlab's cache folder.
    """

    alphas: list = param([0.95, 0.9, 0.8, 0.7, 0.5], "linear-merge α's evaluated (weight of the VLM)",
                         paper="0.9 for every pair; lmlab sweeps {1.0, 0.9, 0.8, 0.7, 0.5}")  # fmt: skip
    claim_alphas: list = param([0.95, 0.9, 0.8, 0.7, 0.5], "α's the claim may use (chosen on dev; ties: 0.9)",
                               paper="0.9 (spec: max over {0.8, 0.9}; extended so 0.9 is interior)")  # fmt: skip
    perception_tol: float = param(0.05, "perception may drop this much below the VLM-proxy's (non-inferiority)",
                                  paper="'minimal impact on perception' [secondary]")  # fmt: skip
    merges: list = param(list(MERGES), "other merge modes: " + ", ".join(MERGES),
                         paper="layerswap, ties, dareties, darelinear (merge.py)")  # fmt: skip
    base_layer_num: int = param(5, "layerswap: layers <= this keep the VLM's weights", paper="5 (α 0.9)")
    ties_weights: list = param([1.6, 0.2], "TIES weights (VLM, reasoning)", paper="(1.6, 0.2)")
    ties_density: float = param(0.2, "TIES density", paper="0.2")
    dare_weights: list = param([0.9, 0.2], "DARE-linear weights (VLM, reasoning)",
                               paper="(α, α2); merge.py's α2 defaults to 0.2")  # fmt: skip
    dare_density: float = param(0.2, "DARE-linear density", paper="0.2")
    block_size: int = param(3, "layers per knockout block", paper="per layer [verify]")
    knockout_items: int = param(16, "test items per probe in the knockout analysis")
    vlm_steps: int = param(50, "VLM-proxy training steps (projector + LoRA)", paper="LLaVA-NeXT pretraining + SFT")
    reason_steps: int = param(50, "reasoning fine-tune steps (LoRA)", paper="Dart-Math full fine-tuning")
    batch: int = param(8, "training items per step")
    lr: float = param(2e-3, "LoRA learning rate (AdamW, constant)")
    projector_lr: float = param(3e-3, "projector learning rate")
    rank: int = param(8, "LoRA rank r (both fine-tunes)", paper="full fine-tuning")
    lora_alpha: float = param(16.0, "LoRA alpha (s = alpha / r)")
    target_modules: list = param(list(TARGETS), "LoRA target modules (every decoder layer; never the embedding)")
    vlm_text_mix: float = param(0.25, "share of text replay in the VLM-proxy's training pool",
                                paper="LLaVA mixes text-only SFT data")  # fmt: skip
    image_tokens: int = param(2, "soft tokens per glyph image", paper="576-2880 visual tokens per image (LLaVA)")
    noise: float = param(0.04, "per-pixel flip probability of the glyphs")
    reason_pairs: str = param("all", "digit pairs the reasoning fine-tune sees as text", choices=("all", "train"))
    train_items: int = param(200, "VLM-proxy training glyphs (train split)")
    dev_items: int = param(24, "dev items of the multimodal reasoning probe (chooses α)")
    test_items: int = param(40, "test items per probe")
    finetune_cache: bool = param(True, "cache the fine-tunes under lmlab's cache folder")

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("alphas", "claim_alphas"):
            vals = getattr(self, name)
            if not isinstance(vals, list | tuple) or not vals:
                raise ValueError(f"{name} must be a non-empty list of numbers in [0, 1], got {vals!r}")
            for a in vals:
                if isinstance(a, bool) or not isinstance(a, int | float) or not 0 <= a <= 1:
                    raise ValueError(f"{name} entries must be numbers in [0, 1], got {a!r}")
        if not set(self.claim_alphas) <= set(self.alphas):
            raise ValueError(f"claim_alphas {self.claim_alphas} must be among alphas {self.alphas}")
        if any(a == 1 for a in self.claim_alphas):
            raise ValueError("claim_alphas must be < 1 (α = 1 is the VLM-proxy itself, the claim's baseline)")
        check_range("perception_tol", self.perception_tol, 0.0, 0.5)
        for m in self.merges:
            if m not in MERGES:
                raise ValueError(f"merges entries must be among {', '.join(MERGES)}, got {m!r}")
        check_range("base_layer_num", self.base_layer_num, -1)
        for name in ("ties_weights", "dare_weights"):
            w = getattr(self, name)
            if not isinstance(w, list | tuple) or len(w) != 2:
                raise ValueError(f"{name} must be [w_vlm, w_reason], got {w!r}")
        check_range("ties_density", self.ties_density, 0.0, 1.0, open_lo=True)
        check_range("dare_density", self.dare_density, 0.0, 1.0, open_lo=True)
        check_range("block_size", self.block_size, 1)
        check_range("knockout_items", self.knockout_items, 0)
        check_range("vlm_steps", self.vlm_steps, 1)
        check_range("reason_steps", self.reason_steps, 1)
        check_range("batch", self.batch, 1)
        check_range("lr", self.lr, 0.0, 1.0, open_lo=True)
        check_range("projector_lr", self.projector_lr, 0.0, 1.0, open_lo=True)
        check_range("rank", self.rank, 1)
        check_range("lora_alpha", self.lora_alpha, 0.0, open_lo=True)
        if not self.target_modules or any(t not in TARGETS for t in self.target_modules):
            raise ValueError(f"target_modules must be a non-empty subset of {', '.join(TARGETS)} (never the tied "
                             f"embedding), got {self.target_modules}")  # fmt: skip
        check_range("vlm_text_mix", self.vlm_text_mix, 0.0, 0.9)
        check_range("image_tokens", self.image_tokens, 1, 16)
        if isinstance(self.noise, bool) or not isinstance(self.noise, int | float) or not 0 < self.noise < 0.5:
            raise ValueError(f"noise must be in (0, 0.5) (noisy glyphs: enough distinct images), got {self.noise!r}")
        check_range("train_items", self.train_items, 1)
        check_range("dev_items", self.dev_items, 1)
        check_range("test_items", self.test_items, 1)
