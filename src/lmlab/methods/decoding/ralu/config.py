"""Configuration of RaLU and its mechanism check on HumanEval mutants."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param

SYSTEMS: tuple[str, ...] = ("initial", "whole_refine", "ralu_line", "ralu_cfg", "oracle_cfg")
# plus the specs "openai:URL[#MODEL]" and "local:MODEL" (`lmlab.core.execution.backends.parse_backend`)
BACKENDS: tuple[str, ...] = ("hf", "openai")


@dataclass
class RaLUConfig(BaseConfig):
    """RaLU (Li et al., ICML 2025) and its experiment: repairing one injected bug per HumanEval program.

    Args:
        n_problems (`int`, defaults to 25): mutated programs (problems with at least `min_units` CFG units).
        min_units (`int`, defaults to 3): fewest CFG units a problem needs to enter the pool.
        split (`str`, defaults to ``"test"``): HumanEval split (lmlab's seeded 40/10/50 partition).
        systems (`list[str]`): which of ``initial``, ``whole_refine``, ``ralu_line``, ``ralu_cfg``, ``oracle_cfg``
            to run (``initial`` and ``ralu_cfg`` are always run: the budget is RaLU-CFG's).
        max_branches (`int`, defaults to 3): rewinds per unit (official 3).
        max_valid_num (`int`, defaults to 1): attempts per prompt on an unusable reply (official 1).
        threshold (`float`, defaults to 51.0): confidence (0-100) a unit judged correct must exceed (official 51).
        temperature (`float`, defaults to 0.7): sent with every call (official 0.7; the HF roles are deterministic).
        judge_bias (`float`, defaults to 0.0): added to log P("OK") by the HF judge (0: the plain comparison).
        n_rewrites (`int`, defaults to 2): fixes sampled from the model per WRONG verdict (spec: 2).
        rewrite_max_tokens (`int`, defaults to 48): token cap of a sampled fix.
        budget (`int`, *optional*): unit-call budget per problem for every system; None: RaLU-CFG's own count on
            that problem (the equal-budget design).
        operators (`list[str]`): mutation operators used for injection.
        backend (`str`, defaults to ``"hf"``): ``hf`` (the local model `model` with constrained roles),
            ``local:MODEL`` (the same on MODEL), ``openai:URL[#MODEL]`` (an OpenAI-compatible server running the
            official prompts freely, through `lmlab.core.execution.backends.OpenAIBackend`; key from
            ``$OPENAI_API_KEY``), or
            ``openai`` (the same at `openai_base_url`, the older form).
        openai_base_url (`str`), openai_model (`str`): the endpoint when ``backend="openai"``; `openai_model` is
            also the served name when an ``openai:URL`` spec has no ``#MODEL``.
        openai_max_tokens (`int`, *optional*): completion cap per call on an API backend (None: none, as the
            official code).
        synthesis (`str`, defaults to ``"reassemble"``): ``reassemble`` accepted units, or ``llm`` (official).
        sandbox_workers (`int`, defaults to 2): parallel sandboxed test runs.
        sandbox_timeout_s (`float`, defaults to 10.0): per-run limit of the HumanEval tests.
    """

    n_problems: int = param(25, "mutated HumanEval programs", paper="HumanEval+ 164, MBPP+ 378 (LLM drafts)")
    min_units: int = param(3, "fewest CFG units a problem needs")
    split: str = param("test", "HumanEval split", choices=("train", "dev", "test"))
    systems: list = param(list(SYSTEMS), "systems to run (initial and ralu_cfg always run)")
    max_branches: int = param(3, "rewind-and-correct attempts per unit", paper="3 (src/utils.py)")
    max_valid_num: int = param(1, "attempts per prompt on an unusable reply", paper="1 (src/utils.py)")
    threshold: float = param(51.0, "confidence (0-100) a unit judged correct must exceed", paper="51 (src/RaLU.py)")
    temperature: float = param(0.7, "sampling temperature sent with each call", paper="0.7 (src/bot.py)")
    judge_bias: float = param(0.0, "added to log P(OK) by the local judge (0: plain comparison)")
    n_rewrites: int = param(2, "fixes sampled from the model per WRONG verdict")
    rewrite_max_tokens: int = param(48, "token cap of a sampled fix")
    budget: int | None = param(None, "unit calls per problem for every system (None: RaLU-CFG's own count)")
    operators: list = param(
        ["cmp", "off_by_one", "and_or", "swap_const", "wrong_return"], "mutation operators used for injection"
    )
    backend: str = param(
        "hf", "LLM backend: hf (local model, constrained roles), local:MODEL, openai:URL[#MODEL], or openai"
    )
    openai_base_url: str = param("http://127.0.0.1:8000/v1", "OpenAI-compatible endpoint (backend=openai)")
    openai_model: str = param("default", "served model name (backend=openai)", paper="gpt-4o / 70B+ models")
    openai_max_tokens: int | None = param(None, "completion cap per call on an API backend (None: none, official)")
    synthesis: str = param("reassemble", "final program: reassemble units or llm", choices=("reassemble", "llm"))
    sandbox_workers: int = param(2, "parallel sandboxed test runs")
    sandbox_timeout_s: float = param(10.0, "time limit of one HumanEval test run (s)")

    def __post_init__(self) -> None:
        self._check_backend()
        super().__post_init__()
        from lmlab.methods.decoding.ralu.mutations import OPERATORS

        check_range("n_problems", self.n_problems, 1)
        check_range("min_units", self.min_units, 1)
        check_range("max_branches", self.max_branches, 0)
        check_range("max_valid_num", self.max_valid_num, 1)
        check_range("threshold", self.threshold, 0.0, 100.0)
        check_range("temperature", self.temperature, 0.0)
        check_range("n_rewrites", self.n_rewrites, 0)
        check_range("rewrite_max_tokens", self.rewrite_max_tokens, 1)
        check_range("budget", self.budget, 1)
        check_range("sandbox_workers", self.sandbox_workers, 1)
        check_range("sandbox_timeout_s", self.sandbox_timeout_s, 0.0, 3600.0, open_lo=True)
        check_range("openai_max_tokens", self.openai_max_tokens, 1)
        bad = [s for s in self.systems if s not in SYSTEMS]
        if bad:
            raise ValueError(f"systems must be among {', '.join(SYSTEMS)}, got {bad[0]!r}")
        bad = [o for o in self.operators if o not in OPERATORS]
        if bad or not self.operators:
            raise ValueError(f"operators must be a non-empty subset of {', '.join(OPERATORS)}, got {self.operators!r}")

    def _check_backend(self) -> None:
        """ValueError naming `backend` unless it is hf, openai, openai:URL[#MODEL] or local:MODEL; ``local:MODEL``
        sets `model` (it is ``hf`` on that model)."""
        from lmlab.core.execution.backends import parse_backend

        forms = "hf, openai, openai:URL[#MODEL] or local:MODEL"
        if self.backend == "openai":
            try:
                parse_backend(f"openai:{self.openai_base_url}")
            except ValueError:
                url = self.openai_base_url
                raise ValueError(f"openai_base_url must be http(s)://HOST[:PORT]/PATH, got {url!r}") from None
            return
        if self.backend in BACKENDS:
            return
        try:
            kind, arg = parse_backend(self.backend)
        except ValueError as e:
            raise ValueError(f"backend must be {forms}, got {self.backend!r}: {e}") from None
        if kind == "local":
            if not self.backend.startswith("local:"):
                raise ValueError(f"backend must be {forms}, got {self.backend!r}")
            self.model = arg
