"""Configuration of the FP-quantization-training scaling-law reproduction (Sun et al., ICML 2025)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param

TARGETS = ("x", "w", "grad_out")
NAMED_BLOCKS = ("channel", "tensor")
_FORMAT = re.compile(r"[eE](\d+)[mM](\d+)")


def _check_format(name: str, value: object) -> None:
    m = _FORMAT.fullmatch(str(value)) if isinstance(value, str) else None
    if not m or not (1 <= int(m.group(1)) <= 7 and int(m.group(2)) <= 10):
        raise ValueError(f"{name} must be FP format names like 'E2M1' (1 <= E <= 7, 0 <= M <= 10), got {value!r}")


def _check_block(name: str, value: object) -> None:
    if value in NAMED_BLOCKS:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise ValueError(f"{name} must be an int >= 2, 'channel' or 'tensor', got {value!r}")


@dataclass
class FPQuantScalingConfig(BaseConfig):
    """Tiny Llama-style LMs trained from scratch with simulated FP (ExMy) quantization, a sweep, and the law's fit.

    Every run (the fp32 baseline and each quantized one) starts from the same initialisation and sees the same
    batches in the same order; only the quantizer differs.

    Args:
        model (`str`, defaults to ``"tiny-llama"``): the only architecture: a Llama built from a local config
            (`hidden`, `n_layers`; 4 query / 2 KV heads) and trained from scratch on the byte-level `corpus` suite.
        hidden, n_layers, tie_embeddings: model width, depth and LM-head tying (paper: Llama models of tens to
            hundreds of millions of parameters [verify]).
        steps, train_batch_size, seq_len, lr, warmup, weight_decay: AdamW pretraining (core `pretrain_lm`).
        eval_every, eval_windows: held-out evaluation cadence and size (windows of `seq_len` + 1 bytes, test split).
        formats (`list[str]`): ExMy formats of the E/M sweep, all at `block_size`.
        block_size: elements per scaling factor in the E/M sweep (int, ``"channel"`` or ``"tensor"``).
        block_format (`str`): the format of the block-size sweep; block_sizes: its group sizes (32 is reused from the
            E/M sweep when `block_format` is in `formats`).
        targets (`list[str]`): quantized GEMM operands, a subset of x (activations), w (weights), grad_out (dY).
        scale_dtype (`str`): ``fp32`` scaling factors, or ``e8m0`` (power-of-two, OCP MX).
        subnormals (`bool`): the formats keep their subnormal values.
        n_seeds (`int`): training seeds per run (init and data order); per-window losses are averaged over them.
        fit_kappa (`bool`): also fit the exponent of log2(B) (1 in the paper's law).
    """

    model: str = param("tiny-llama", "from-scratch Llama (the only choice)", paper="Llama-style LMs [verify]")
    hidden: int = param(96, "model width (4 query / 2 KV heads)", paper="hundreds to thousands")
    n_layers: int = param(2, "transformer layers", paper="tens")
    tie_embeddings: bool = param(False, "tie the LM head to the input embedding", paper="untied (Llama) [verify]")
    steps: int = param(300, "training steps per run", paper="tens of billions of tokens per run [verify]")
    train_batch_size: int = param(16, "training windows per step")
    seq_len: int = param(64, "training window length (bytes)")
    lr: float = param(3e-3, "peak AdamW learning rate (linear warm-up, cosine decay to 10 %)")
    warmup: int = param(30, "warm-up steps")
    weight_decay: float = param(0.1, "AdamW weight decay")
    eval_every: int = param(30, "evaluate every this many steps (and at the end)")
    eval_windows: int = param(128, "held-out windows per evaluation, spread over the corpus test split")
    formats: list = param(
        ["E1M2", "E2M1", "E3M0", "E1M4", "E2M3", "E3M2", "E4M1", "E4M3"],
        "ExMy formats of the exponent/mantissa sweep (FP4, FP6, FP8)",
        paper="E1-E6 x M0-M6 (many ExMy) [verify]",
    )
    block_size: int | str = param(32, "elements per scaling factor in the E/M sweep", paper="swept")
    block_format: str = param("E2M1", "format of the block-size sweep")
    block_sizes: list = param(
        [16, 64, "channel", "tensor"], "block-size sweep", paper="block-wise to per-tensor [verify]"
    )
    targets: list = param(
        ["x", "w"],
        "quantized GEMM operands",
        paper="forward and backward GEMM inputs studied; the set behind the law: [verify]",
    )
    scale_dtype: str = param("fp32", "scaling-factor precision", paper="fp32 [verify]", choices=("fp32", "e8m0"))
    subnormals: bool = param(True, "formats keep subnormal values", paper="[verify]")
    n_seeds: int = param(1, "training seeds per run (losses averaged)")
    fit_kappa: bool = param(True, "fit the exponent of log2(B) too", paper="1 (log2 B enters linearly)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dtype != "float32":
            raise ValueError(
                f"dtype must be float32 for fp_quant_scaling (fp32 master weights and baseline), got {self.dtype!r}"
            )
        if self.model != "tiny-llama":
            raise ValueError(
                f"model must be 'tiny-llama' (fp_quant_scaling trains tiny Llamas from scratch), got {self.model!r}"
            )
        check_range("hidden", self.hidden, 16, 1024)
        if self.hidden % 4:
            raise ValueError(f"hidden must be a multiple of 4 (4 attention heads), got {self.hidden!r}")
        check_range("n_layers", self.n_layers, 1, 16)
        check_range("steps", self.steps, 1)
        check_range("train_batch_size", self.train_batch_size, 1)
        check_range("seq_len", self.seq_len, 4, 512)
        check_range("lr", self.lr, 0.0, 1.0, open_lo=True)
        check_range("warmup", self.warmup, 0)
        check_range("weight_decay", self.weight_decay, 0.0)
        check_range("eval_every", self.eval_every, 0)
        check_range("eval_windows", self.eval_windows, 1)
        if not isinstance(self.formats, list | tuple) or not self.formats:
            raise ValueError(f"formats must be a non-empty list of names like 'E2M1', got {self.formats!r}")
        for f in self.formats:
            _check_format("formats", f)
        if len({str(f).upper() for f in self.formats}) != len(self.formats):
            raise ValueError(f"formats must not repeat a format, got {self.formats!r}")
        _check_block("block_size", self.block_size)
        _check_format("block_format", self.block_format)
        if not isinstance(self.block_sizes, list | tuple):
            raise ValueError(f"block_sizes must be a list, got {self.block_sizes!r}")
        for b in self.block_sizes:
            _check_block("block_sizes", b)
        if (
            not self.targets
            or any(t not in TARGETS for t in self.targets)
            or len(set(self.targets)) != len(self.targets)
        ):
            raise ValueError(f"targets must be a non-empty subset of {', '.join(TARGETS)}, got {self.targets!r}")
        check_range("n_seeds", self.n_seeds, 1, 10)
