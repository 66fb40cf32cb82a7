"""Configuration of Reward-Guided Speculative Decoding (RSD) and its reproduction."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param
from lmlab.core.training.prm import is_prm_spec

PRMS = ("noisy", "probe", "oracle")
FORMATS = ("auto", "chat", "fewshot")


@dataclass
class RSDConfig(BaseConfig):
    """RSD (Liao et al., ICML 2025) and its experiment against draft-only, target-only and SD-equivalent decoding.

    `model` (from `BaseConfig`) is the draft; `target_model` the target.

    Args:
        target_model (`str`, defaults to ``"gemma3-270m"``): the target model (paper: Qwen2.5-Math-7B-Instruct).
        threshold (`float`, defaults to 0.7): delta of the headline threshold rule (official ``prm_threshold``).
        thresholds (`list[float]`, defaults to ``[0.3, 0.5, 0.7, 0.9]``): the delta sweep (delta is PRM-specific).
        prm (`str`, defaults to ``"noisy"``): the headline PRM: `NoisyOraclePRM` (eps = `prm_eps`), or a saved PRM
            ``"implicit:DIR"`` (`lmlab.core.training.prm.load_prm`; added to `prms` when missing).
        prms (`list[str]`): PRMs run, each at every threshold: ``noisy``, ``probe`` (MiniLM logistic probe trained
            on the train split) and ``oracle`` (flagged ``oracle_prm``).
        prm_eps (`float`, defaults to 0.15): label-flip rate of the noisy PRM; prm_sigma its Gaussian noise (0.1).
        prm_flop_params (`int`, defaults to 22713216): every PRM call is charged 2 x this x (tokens of question +
            steps): an all-MiniLM-L6-v2-sized PRM that reads the whole prefix, as the official Skywork PRM does.
        delimiter (`str`, defaults to ``"\\n"``): step delimiter (official ``"\\n\\n"``; one line per step here).
        max_steps (`int`, defaults to 100): most steps per answer (official).
        max_step_tokens (`int`, defaults to 16): token budget per step (official 4096; a capital fits in < 10).
        max_total_tokens (`int`, defaults to 4096): stop at this many prompt + answer tokens (official).
        temperature (`float`, defaults to 0.0): 0 = greedy (official); > 0 samples, seeded.
        n_questions (`int`, defaults to 24): test questions (spec: 40, trimmed to the 5-minute budget).
        n_countries (`int`, defaults to 3): steps per question.
        n_calibration (`int`, defaults to 8): calibration questions (dev split) for the precondition and the
            prompt-format choice.
        draft_format, target_format (`str`, defaults to ``"auto"``): ``chat``, ``fewshot``, or ``auto`` (the most
            step-accurate on the calibration split; ties go to the cheaper).
        n_shots (`int`, defaults to 2): solved examples (train split) in the few-shot format.
        step_prefixes (`bool`, defaults to `True`): give each step its ``"Country:"`` start.
        theory_check (`bool`, defaults to `True`): run soft (min(1, c r)) and random acceptance at RSD's acceptance
            rate; theory_seeds: seeds of those stochastic rules, averaged per question.
    """

    model: str = param("smollm2-135m", "draft model", paper="Qwen2.5-Math-1.5B-Instruct [code]")
    target_model: str = param("gemma3-270m", "target model", paper="Qwen2.5-Math-7B-Instruct (also 72B)")
    threshold: float = param(0.7, "delta of the headline threshold rule omega(r) = 1{r >= delta}", paper="0.7 [code]")
    thresholds: list = param([0.3, 0.5, 0.7, 0.9], "delta sweep (delta is PRM-specific)")
    prm: str = param(
        "noisy",
        f"headline PRM: {', '.join(PRMS)} or a saved PRM 'implicit:DIR'",
        paper="Skywork-o1-Open-PRM-Qwen-2.5-1.5B [code]",
    )
    prms: list = param(["noisy", "probe", "oracle"], "PRMs run at every threshold (oracle results are flagged)")
    prm_eps: float = param(0.15, "label-flip probability of the noisy PRM")
    prm_sigma: float = param(0.1, "Gaussian noise of the noisy PRM")
    prm_flop_params: int = param(22713216, "PRM cost per input token / 2 (all-MiniLM-L6-v2 size), whole prefix/call")
    delimiter: str = param("\n", "step delimiter", paper="'\\n\\n' [code]")
    max_steps: int = param(100, "most steps per answer", paper="100 [code]")
    max_step_tokens: int = param(16, "token budget per step", paper="4096 (max_tokens_per_call) [code]")
    max_total_tokens: int = param(4096, "stop at this many prompt + answer tokens", paper="4096 [code]")
    temperature: float = param(0.0, "0 = greedy; > 0 samples (seeded)", paper="0 (greedy) [code]")
    n_questions: int = param(24, "test questions (capital_steps, test split)", paper="GSM8K, MATH500, ... [paper]")
    n_countries: int = param(3, "steps (countries) per question")
    n_calibration: int = param(8, "calibration questions (dev split): precondition and prompt-format choice")
    draft_format: str = param("auto", "draft prompt format", paper="qwen25-math-cot [code]", choices=FORMATS)
    target_format: str = param("auto", "target prompt format", paper="qwen25-math-cot [code]", choices=FORMATS)
    n_shots: int = param(2, "solved examples (train split) in the few-shot format")
    step_prefixes: bool = param(True, "give each step its 'Country:' start (the model writes the capital)")
    theory_check: bool = param(True, "soft and random acceptance at RSD's acceptance rate (matched budget)")
    theory_seeds: int = param(3, "seeds of the stochastic rules, averaged per question")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("threshold", self.threshold, 0.0)
        if not self.thresholds:
            raise ValueError("thresholds must list at least one delta, got []")
        for t in self.thresholds:
            if isinstance(t, bool) or not isinstance(t, int | float) or t < 0:
                raise ValueError(f"thresholds must be numbers >= 0, got {t!r}")
        if not self.prms:
            raise ValueError("prms must list at least one PRM, got []")
        if self.prm not in PRMS and not is_prm_spec(self.prm):
            raise ValueError(f"prm must be one of {', '.join(PRMS)} or 'implicit:DIR', got {self.prm!r}")
        if is_prm_spec(self.prm) and self.prm not in self.prms:
            self.prms = [*self.prms, self.prm]
        for p in self.prms:
            if p not in PRMS and not is_prm_spec(p):
                raise ValueError(f"prms entries must be one of {', '.join(PRMS)} or 'implicit:DIR', got {p!r}")
        if self.prm not in self.prms:
            raise ValueError(f"prm {self.prm!r} must be one of prms {self.prms!r}")
        check_range("prm_eps", self.prm_eps, 0.0, 1.0)
        check_range("prm_sigma", self.prm_sigma, 0.0)
        check_range("prm_flop_params", self.prm_flop_params, 0)
        if not self.delimiter:
            raise ValueError("delimiter must be a non-empty string, got ''")
        check_range("max_steps", self.max_steps, 1)
        check_range("max_step_tokens", self.max_step_tokens, 1)
        check_range("max_total_tokens", self.max_total_tokens, 1)
        check_range("temperature", self.temperature, 0.0)
        check_range("n_questions", self.n_questions, 1)
        check_range("n_countries", self.n_countries, 1)
        check_range("n_calibration", self.n_calibration, 1)
        check_range("n_shots", self.n_shots, 0)
        check_range("theory_seeds", self.theory_seeds, 1)
