"""Configuration of the potemkin benchmark (Procedure 1), its automatic lower bound (Procedure 2) and incoherence."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param

ALL_CONCEPTS: tuple[str, ...] = (
    "strict_dominance",
    "weak_dominance",
    "pure_nash",
    "pareto_optimality",
    "zero_sum",
    "symmetric_game",
    "palindrome",
    "prime",
    "perfect_square",
    "arithmetic_progression",
)
LB_SUITES: tuple[str, ...] = ("arithmetic", "countries")
MODES: tuple[str, ...] = ("completions", "chat")


@dataclass
class PotemkinConfig(BaseConfig):
    """Potemkin understanding (Mancoridis et al., ICML 2025) on concepts with programmatic ground truth.

    Every LLM system answers the same seeded questions; the oracle (programmatic solver), a random responder and two
    constant Yes/No responders (the oracle answering always Yes / always No) are the metric controls (oracle: every
    rate 0; random: the x2-scaled rates about 1; constant: classify rate and incoherence 1, lower bound 0 / 2). Each
    gated check asks for a value strictly between the oracle's and the nearest constant responder's above it.

    Budget: default about 275 s on 2 quiet cores (estimated: 266 s measured before the self-grade calibration added
    48 scoring calls per model), quick about 60 s.

    Args:
        models (`list[str]`): the local models compared (empty: `model` alone); ``tiny-llama`` beside real models
            is a control (its checks are reported, not gated).
        backend (`str`, defaults to ``"local"``): ``local`` (the `models`), or one backend spec for a single LLM
            system: ``openai:http://HOST:PORT/v1[#MODEL]`` (any OpenAI-compatible server, key from
            ``$OPENAI_API_KEY``) or ``local:MODEL``.
        mode (`str`, defaults to ``"completions"``): ``completions`` (log-likelihood scoring: needs a server that
            echoes prompt log-probs, e.g. `lmlab serve` or vLLM) or ``chat`` (letters / yes / no parsed from chat
            replies; any chat endpoint).
        concepts (`list[str]`): concept keys (`lmlab.methods.evaluation.potemkin.concepts.CONCEPTS`).
        n_classify (`int`, defaults to 8): balanced yes/no classify questions per concept, even (they also fit the
            concept's yes/no threshold; paper: varies by concept).
        n_generate, n_edit (`int`): use questions per concept (paper: varies by concept).
        n_incoherence (`int`, defaults to 4): generate-then-self-classify attempts per concept, even (half examples,
            half non-examples; paper: 10; the default budget).
        n_options (`int`, defaults to 4): options of the definition keystone (the paper grades free-form ones).
        max_tokens (`int`, defaults to 36): generation cap of generate / edit / incoherence answers (a game needs
            about 33 tokens; words and numbers are capped at 12, `Concept.answer_tokens`).
        lb_suites (`list[str]`): suites of Procedure 2 (``arithmetic``, ``countries``).
        lb_questions (`int`, defaults to 12): keystone questions per suite in Procedure 2.
        calibrate (`bool`, defaults to True): decide yes/no against a log-odds threshold fitted on balanced items
            (the median, per concept / per Procedure-2 suite; `method.BackendAgent`); False: the plain
            log p(" Yes") > log p(" No") (the uncalibrated metrics are reported either way).
    """

    models: list = param(["smollm2-135m", "gemma3-270m", "tiny-llama"], "local models compared (empty: model)",
                         paper="9 frontier LLMs (Table 1)")  # fmt: skip
    backend: str = param("local", "local (the models) or one backend spec: openai:URL[#MODEL] or local:MODEL")
    mode: str = param("completions", "completions (log-likelihood scoring) or chat (parsed replies)", choices=MODES)
    concepts: list = param(list(ALL_CONCEPTS), "concept keys", paper="32 concepts in 3 domains")
    n_classify: int = param(8, "classify questions per concept (balanced yes/no, even: the calibration items)")
    n_generate: int = param(2, "constrained generate questions per concept")
    n_edit: int = param(2, "edit questions per concept (alternately into and out of the concept)")
    n_incoherence: int = param(4, "generate-then-self-classify attempts per concept (even)", paper="10 per concept")
    n_options: int = param(4, "options of the definition keystone", paper="free-form definition, expert-graded")
    max_tokens: int = param(36, "generation cap of generate / edit / incoherence answers (games; others 12)")
    lb_suites: list = param(
        list(LB_SUITES), "suites of Procedure 2", paper="questions of existing benchmarks [verify]"
    )
    lb_questions: int = param(12, "keystone questions per suite in Procedure 2")
    calibrate: bool = param(
        True,
        "yes/no by a log-odds threshold fitted on balanced items (False: log p(Yes) > log p(No))",
        paper="not calibrated; the spec's pitfall asks to calibrate or balance",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        from lmlab.methods.evaluation.potemkin.concepts import get_concepts

        get_concepts(self.concepts)
        if not isinstance(self.models, list) or not all(isinstance(m, str) and m for m in self.models):
            raise ValueError(f"models must be a list of model specs, got {self.models!r}")
        if len(set(self.models)) != len(self.models):
            raise ValueError(f"models must not repeat, got {self.models}")
        if self.backend != "local":
            from lmlab.core.execution.backends import parse_backend

            try:
                parse_backend(self.backend)
            except ValueError as e:
                raise ValueError(f"backend must be 'local' or a backend spec: {e}") from None
        check_range("n_classify", self.n_classify, 2)
        check_range("n_generate", self.n_generate, 0)
        check_range("n_edit", self.n_edit, 0)
        check_range("n_incoherence", self.n_incoherence, 2)
        for name in ("n_classify", "n_incoherence"):
            if getattr(self, name) % 2:
                raise ValueError(f"{name} must be even (balanced yes/no items), got {getattr(self, name)}")
        check_range("n_options", self.n_options, 2, 8)
        check_range("max_tokens", self.max_tokens, 1)
        check_range("lb_questions", self.lb_questions, 0)
        bad = [s for s in self.lb_suites if s not in LB_SUITES]
        if bad:
            raise ValueError(f"lb_suites must be among {', '.join(LB_SUITES)}, got {bad[0]!r}")
