"""Configuration of LensLLM and its reproduction (candidates fine-tuned on nested task-bank subsets)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param

SYSTEMS = ("lensllm", "lensllm_phase", "lens_free", "rectified", "ats", "subtuning", "zeroshot", "modelsize")
TINY_VARIANTS = {"tiny": (11, 2, 64), "tiny-wide": (12, 2, 128), "tiny-deep": (13, 4, 64)}  # seed, layers, hidden
CANDIDATE_RE = re.compile(r"^(base|base-trunc[1-9][0-9]*|gemma3|tiny|tiny-wide|tiny-deep)$")


@dataclass
class LensLLMConfig(BaseConfig):
    """LensLLM (Zeng et al., ICML 2025) against the baselines of its Table 2 that fit a CPU run.

    Every candidate is fine-tuned on nested random subsets (one nested chain per data seed) of a task-bank task and
    scored on a fixed test set; the losses at `sizes` feed every selector, the loss at `target_size` is the ground
    truth each selector predicts. Each (candidate, size, seed) fine-tune runs once per run and is shared by all
    selectors. Data seeds are the independent unit of the claims (>= 6 to decide).

    Args:
        candidates (`list[str]`): ``base`` (the `model`), ``base-truncN`` (its first N blocks, final norm and head),
            ``gemma3`` (Gemma-3-270M), ``tiny`` / ``tiny-wide`` / ``tiny-deep`` (seeded random llamas, 2L-64h /
            2L-128h / 4L-64h, byte tokenizer, every block trained).
        sizes (`list[int]`): fitted subset sizes (0 = zero-shot; paper: 200·2^i); target_size (`int`): D*.
        n_seeds (`int`, defaults to 6): data seeds (nested subset chains, adapter inits).
        task, digits: the task-bank arithmetic task of every fine-tune; val_size / test_size: fixed splits.
        train_layers, rank, alpha, target_modules, lr, train_batch, epochs, evals_per_epoch, patience: the fine-tune
            (LoRA on the top blocks over a cached frozen trunk; tiny candidates train every block).
        n_probe, eta, mode, n_restarts: the NTK and the fit (`n_restarts` for every law: LensLLM, the free-F
            ablation ``lens_free`` and the rectified law share one optimiser, tolerance and restart budget).
    """

    candidates: list = param(["tiny", "tiny-wide", "tiny-deep", "base-trunc20", "base"],
                             "candidate models: base, base-truncN, gemma3, tiny, tiny-wide, tiny-deep",
                             paper="14 models (OPT, T5, Cerebras, mT5, BART, GPT-2, LaMini)")  # fmt: skip
    sizes: list = param([0, 4, 8, 16, 32], "fitted subset sizes (0 = zero-shot)",
                        paper="200·2^i, 200 ... 1,638,400 (plus 0) [paper]")  # fmt: skip
    target_size: int = param(128, "D*: the fine-tuning budget whose test loss is predicted", paper="the full set")
    n_seeds: int = param(6, "data seeds (nested subset chains); the claims' unit", paper="one run")
    task: str = param("add", "task-bank arithmetic task fine-tuned on", choices=("add", "sub", "mul"))
    digits: int = param(2, "operand digits of the arithmetic task")
    val_size: int = param(32, "validation examples (early stopping)", paper="patience 3 [code: train.py]")
    test_size: int = param(200, "fixed test examples (loss = mean summed answer NLL, nats)")
    train_layers: int = param(1, "top blocks adapted by LoRA over the cached frozen trunk", paper="full model")
    rank: int = param(8, "LoRA rank", paper="full fine-tuning")
    alpha: float = param(16.0, "LoRA alpha")
    target_modules: list = param(["q_proj", "v_proj"], "LoRA target modules of the top blocks")
    lr: float = param(1e-3, "AdamW learning rate (constant)", paper="[verify]")
    train_batch: int = param(8, "examples per optimiser step")
    epochs: int = param(3, "maximum epochs over a subset")
    evals_per_epoch: int = param(2, "validation evaluations per epoch (early stopping)")
    patience: int = param(3, "evaluations without improvement before stopping", paper="3 [code: train.py]")
    n_probe: int = param(16, "NTK probe examples (dev split)", paper="probe inputs X [paper]")
    eta: float = param(0.01, "η of exp(−ηΘt) (Θ normalised by its top eigenvalue)", paper="0.01 [code]")
    mode: str = param("prediction", "LensLLM fit of the gated system: t free or the observed step",
                      paper="prediction (t free, init 500) / phase_fitting [code]",
                      choices=("prediction", "phase_fitting"))  # fmt: skip
    n_restarts: int = param(4, "restarts of each law fit (LensLLM, lens_free and rectified alike; one optimiser "
                            "and tolerance for all)",
                            paper="LensLLM 1 (L-BFGS-B), rectified 3 from one initial point (BFGS), scipy's "
                                  "default tolerances [code]")  # fmt: skip
    ats_k: int = param(3, "AtS: points of the first log-log fit", paper="3 [code]")
    ats_delta: float = param(5.0, "AtS: standardised-residual threshold", paper="5 [code]")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.candidates, list) or len(self.candidates) < 2:
            raise ValueError(f"candidates must be a list of >= 2 candidate names, got {self.candidates!r}")
        for c in self.candidates:
            if not isinstance(c, str) or not CANDIDATE_RE.match(c):
                raise ValueError(f"candidates entries must be base, base-truncN, gemma3, tiny, tiny-wide or "
                                 f"tiny-deep, got {c!r}")  # fmt: skip
        if len(set(self.candidates)) != len(self.candidates):
            raise ValueError(f"candidates must be distinct, got {self.candidates}")
        if not isinstance(self.sizes, list) or not all(isinstance(s, int) and s >= 0 for s in self.sizes):
            raise ValueError(f"sizes must be a list of ints >= 0, got {self.sizes!r}")
        if sorted(set(self.sizes)) != list(self.sizes) or 0 not in self.sizes or len(self.sizes) < 3:
            raise ValueError(
                f"sizes must be increasing, distinct, start at 0 and hold >= 2 sizes > 0, got {self.sizes}"
            )
        check_range("target_size", self.target_size, 1)
        if self.target_size <= max(self.sizes):
            raise ValueError(f"target_size must exceed the largest fitted size ({max(self.sizes)}), got "
                             f"{self.target_size}")  # fmt: skip
        check_range("n_seeds", self.n_seeds, 1)
        check_range("digits", self.digits, 1, 3)
        check_range("val_size", self.val_size, 1)
        check_range("test_size", self.test_size, 1)
        check_range("train_layers", self.train_layers, 1)
        check_range("rank", self.rank, 1)
        check_range("alpha", self.alpha, 0.0, open_lo=True)
        if not self.target_modules:
            raise ValueError("target_modules must name at least one linear layer, got []")
        check_range("lr", self.lr, 0.0, open_lo=True)
        check_range("train_batch", self.train_batch, 1)
        check_range("epochs", self.epochs, 1)
        check_range("evals_per_epoch", self.evals_per_epoch, 1)
        check_range("patience", self.patience, 1)
        check_range("n_probe", self.n_probe, 1)
        check_range("eta", self.eta, 0.0, open_lo=True)
        check_range("n_restarts", self.n_restarts, 1)
        check_range("ats_k", self.ats_k, 2)
        check_range("ats_delta", self.ats_delta, 0.0, open_lo=True)
