"""Configuration of Speculative Search and its reproduction."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param
from lmlab.core.training.prm import is_prm_spec
from lmlab.methods.decoding.spec_search.method import ESTIMATORS
from lmlab.methods.decoding.spec_search.search import AGGREGATES

PRM_NAMES = ("noisy", "probe", "oracle")
FORMATS = ("auto", "chat", "fewshot")


@dataclass
class SpecSearchConfig(BaseConfig):
    """Speculative Search (Wang et al., ICML 2025) against small-only and large-only PRM beam search.

    `model` is the small (draft) model, `large_model` the large one. Paper values marked "secondary" come from
    summaries of the paper (the official repository and the paper's appendix were not reachable offline).

    Args:
        large_model (`str`, defaults to ``"gemma3-270m"``): the large model (paper: Qwen2.5-72B / Llama3-70B).
        n (`int`, defaults to 4): thoughts per node, N (paper: tree width 6, secondary); 4 fits the 5-minute budget.
        beam_width (`int`, defaults to 2): beam width B (paper: 2, secondary).
        n_steps (`int`, defaults to 3): countries per question = search depth (paper: depth up to 50).
        theta (`float`, defaults to 0.9): EMA weight (paper: 0.9, secondary; 0.8-0.95 in its sensitivity study).
        estimator (`str`, defaults to ``"mean"``): estimate of the large model's step quality (spec: mean; a secondary
            summary says the paper uses the max over large and accepted thoughts).
        n_cold_start (`int`, *optional*, defaults to 1): large-model thoughts at the root; beta_0 is their mean
            score and the small model drafts the root's other thoughts (paper [verify]: beta_0 from "one or a few"
            large-model thoughts at t = 0; the official code was not reachable). ``None`` = all `n`: the large model
            writes the whole root, so depth 0 equals large-only search by construction; the experiment reports it as
            the ``cold_start_all`` ablation.
        n_large_per_step (`int`, defaults to 1): large-model thoughts at the best node of each later depth, so the EMA
            is fed even when every draft passes (a secondary summary: the large model "additionally generates one").
        temperature (`float`, defaults to 0.7): sampling temperature of every thought.
        max_step_tokens (`int`, defaults to 10): token budget of one thought (a capital name).
        aggregate (`str`, defaults to ``"mean"``): path value from step scores, for beam selection and the answer.
        fixed_threshold (`float`, defaults to 0.5): the fixed-threshold ablation (the midpoint of the PRM's range).
        prms (`list[str]`, defaults to ``["noisy", "probe"]``): PRMs to run the headline check with (the first is the
            headline); ``"oracle"`` adds the oracle upper bound (flagged ``oracle_prm``); a saved PRM is named
            ``"implicit:DIR"`` (`lmlab.core.training.prm.load_prm`).
        prm (`str`, *optional*): the headline PRM, put first in `prms` (``--set prm=implicit:DIR``); None keeps
            `prms` as given.
        noisy_eps, noisy_sigma: `NoisyOraclePRM` label-flip probability and noise.
        ablations (`bool`, defaults to `True`): run accept-every-draft and fixed-threshold with the headline PRM.
        cold_start_ablation (`bool`, defaults to `False`): with `ablations`, also the whole-root cold start
            (``cold_start_all``): off by default, for the 5-minute budget (the default took 321 s with it).
        n_questions (`int`, defaults to 12): test questions. calib_questions (`int`, defaults to 7): calibration
            (dev split) questions for the precondition and the prompt formats (7 x 3 = 21 countries).
        small_fmt, large_fmt (`str`, defaults to ``"auto"``): prompt format per model; ``auto`` picks, on the
            calibration split, the format with the higher greedy step accuracy.
        n_shots (`int`, defaults to 2): few-shot examples (train split).
        prefix_cache (`bool`, defaults to `True`): engine-style prefix KV cache (the few-shot scaffold is pinned once,
            each search starts otherwise cold); off: every call re-prefills its prompt.
        comparable_margin (`float`, defaults to 0.05): "comparable accuracy" = step accuracy at least the large-only
            beam's minus this margin (the CI's lower bound must clear it).
        speedup_target (`float`, defaults to 1.2): the cost-model speedup FLOPs(large-only) / FLOPs(SpecSearch) to
            reach.
        projected_ratio (`float`, defaults to 10.0): size ratio for the projected cost (paper: 72B / 7B).
    """

    large_model: str = param("gemma3-270m", "large model alias or folder", paper="Qwen2.5-72B / Llama3-70B")
    n: int = param(4, "thoughts per node N", paper="tree width 6 (secondary)")
    beam_width: int = param(2, "beam width B", paper="2 (secondary)")
    n_steps: int = param(3, "countries per question (search depth)", paper="depth <= 50 on MATH/GSM8K")
    theta: float = param(0.9, "EMA weight of the rejection threshold", paper="0.9 (secondary)")
    estimator: str = param(
        "mean", "estimate of the large model's step quality", paper="max (secondary)", choices=ESTIMATORS
    )
    n_cold_start: int | None = param(
        1,
        "large-model thoughts at the root, giving beta_0 (None: all n, the large model writes the root)",
        paper="one or a few large-model thoughts at t = 0 [verify]",
    )
    n_large_per_step: int = param(1, "large-model thoughts per later depth feeding the EMA", paper="1 (secondary)")
    temperature: float = param(0.7, "sampling temperature of thoughts")
    max_step_tokens: int = param(10, "token budget of one thought")
    aggregate: str = param("mean", "path value from step scores", choices=AGGREGATES)
    fixed_threshold: float = param(
        0.5, "threshold of the fixed-threshold ablation", paper="fixed threshold (value not found)"
    )
    prms: list = param(["noisy", "probe"], "PRMs for the headline check (first = headline); 'oracle' adds the bound")
    prm: str | None = param(None, "headline PRM, put first in prms (e.g. a saved PRM 'implicit:DIR'); None: prms[0]")
    noisy_eps: float = param(0.15, "NoisyOraclePRM label-flip probability")
    noisy_sigma: float = param(0.1, "NoisyOraclePRM noise std")
    ablations: bool = param(True, "run accept-every-draft and fixed-threshold ablations (headline PRM)")
    cold_start_ablation: bool = param(False, "with ablations, also the whole-root cold start (cold_start_all)")
    n_questions: int = param(12, "test questions", paper="100 MATH / GSM8K problems")
    calib_questions: int = param(7, "calibration (dev split) questions")
    small_fmt: str = param("auto", "prompt format of the small model", choices=FORMATS)
    large_fmt: str = param("auto", "prompt format of the large model", choices=FORMATS)
    n_shots: int = param(2, "few-shot examples (train split)")
    prefix_cache: bool = param(True, "engine-style prefix KV cache", paper="vLLM serving (its caching unstated)")
    comparable_margin: float = param(0.05, "margin of 'comparable' step accuracy vs the large-only beam")
    speedup_target: float = param(1.2, "cost-model speedup to reach", paper="up to 2.12x over SD, 4.11x over AR")
    projected_ratio: float = param(10.0, "size ratio of the projected cost model", paper="72B / 7B")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("n", self.n, 1)
        check_range("beam_width", self.beam_width, 1)
        check_range("n_steps", self.n_steps, 1)
        check_range("theta", self.theta, 0.0, 1.0)
        if self.n_cold_start is not None:
            check_range("n_cold_start", self.n_cold_start, 1, self.n)
        check_range("n_large_per_step", self.n_large_per_step, 0, self.n)
        check_range("temperature", self.temperature, 0.0, open_lo=True)
        check_range("max_step_tokens", self.max_step_tokens, 1)
        check_range("noisy_eps", self.noisy_eps, 0.0, 1.0)
        check_range("noisy_sigma", self.noisy_sigma, 0.0)
        check_range("n_questions", self.n_questions, 1)
        check_range("calib_questions", self.calib_questions, 1)
        check_range("n_shots", self.n_shots, 0)
        check_range("comparable_margin", self.comparable_margin, 0.0, 1.0)
        check_range("speedup_target", self.speedup_target, 0.0, open_lo=True)
        check_range("projected_ratio", self.projected_ratio, 0.0, open_lo=True)
        if self.prm is not None:
            if self.prm not in PRM_NAMES and not is_prm_spec(self.prm):
                raise ValueError(f"prm must be one of {', '.join(PRM_NAMES)} or 'implicit:DIR', got {self.prm!r}")
            self.prms = [self.prm, *[p for p in self.prms if p != self.prm]]
        if not self.prms:
            raise ValueError("prms must name at least one PRM (noisy, probe, oracle), got []")
        for p in self.prms:
            if p not in PRM_NAMES and not is_prm_spec(p):
                raise ValueError(f"prms entries must be one of {', '.join(PRM_NAMES)} or 'implicit:DIR', got {p!r}")
        if len(set(self.prms)) != len(self.prms):
            raise ValueError(f"prms must not repeat a PRM, got {self.prms!r}")
