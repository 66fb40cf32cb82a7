"""Configuration of SWIFTCODE and its reproduction (seeded code tasks, sandboxed selection, SFT, pass@1 and NET)."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param
from lmlab.methods.alignment.swiftcode.method import RULES, TIMINGS
from lmlab.methods.alignment.swiftcode.tasks import FAMILIES, KINDS

SYSTEMS = ("swiftcode", "random_correct", "slowest_correct", "base")
GENERATORS = ("template", "llm")


@dataclass
class SwiftCodeConfig(BaseConfig):
    """SWIFTCODE (Huang et al., ICML 2025) on lmlab's sixteen seeded code-task families.

    Candidates for each training task come from the variant bank (``template``, standing in for the paper's strong
    code LLMs) and from samples of `model` (``llm``, the first `llm_tasks` training tasks); every candidate runs in
    `lmlab.core.execution.sandbox`: small tests, then the stress input (time: min over `timing_runs` runs of the min of
    `repeat` calls; memory: tracemalloc peak). Each system fine-tunes the top `train_layers` blocks on one
    candidate per task (same tasks, count and steps) and is scored on the held-out tasks (new function names) by
    greedy decoding: pass@1 and NET = ET / ET_canonical. The claims' CIs resample task families (the independent
    unit: held-out tasks are renamed instances of a family), so the default uses every family.

    Args:
        families (`list[str]`): task families (default all sixteen).
        n_train (`int`, defaults to 48), n_eval (`int`, defaults to 64): training / held-out tasks, round robin over
            the families (3 and 4 per family by default).
        stress_scale (`float`, defaults to 1.0): stress input size (1.0 sizes the slow idiom to tens of ms).
        generators (`list[str]`): candidate sources, among ``template`` and ``llm``.
        template_kinds (`list[str]`): variant-bank kinds offered (fast, slow, buggy).
        llm_models (`list[str]`, defaults to ``["self"]``): models sampled (``self`` is `model`).
        llm_tasks (`int`, defaults to 8), llm_samples (`int`, defaults to 2), llm_temperature (`float`, 0.8),
            llm_max_new_tokens (`int`, 96): LLM candidates (samples of `model`).
        rule (`str`), time_margin (`float`): the selection rule (`method.select_most_efficient`).
        timing (`str`, defaults to ``"wall"``): ``wall`` seconds, or ``lines`` (deterministic line events).
        timing_runs (`int`, 2), repeat (`int`, 3): sandbox runs per candidate, timed calls per run.
        sandbox_timeout_s, sandbox_memory_mb, sandbox_workers, sandbox_backend, allow_unsandboxed: the sandbox.
        systems (`list[str]`): among swiftcode, random_correct, slowest_correct (control) and base.
        train_layers, epochs, lr, train_batch: SFT of the top blocks from the cached frozen trunk.
        max_new_tokens (`int`, defaults to 128): greedy budget of a held-out answer.
    """

    families: list = param(list(FAMILIES), "task families, among: " + ", ".join(FAMILIES),
                           paper="EffiInstruct: open code-instruction tasks, 5 languages [verify]")  # fmt: skip
    n_train: int = param(48, "training tasks, round robin over families (3 per family for all 16)",
                         paper="~65K tasks [verify]")  # fmt: skip
    n_eval: int = param(64, "held-out tasks (reserved function names), 4 per family for all 16; CIs by family",
                        paper="EffiBench 1000 / HumanEval 164")  # fmt: skip
    stress_scale: float = param(1.0, "stress input size scale (1.0: the slow idiom takes tens of ms)")
    generators: list = param(list(GENERATORS), "candidate sources: template (variant bank, LLM stand-in), llm (model)",
                             paper="several open code LLMs")  # fmt: skip
    template_kinds: list = param(list(KINDS), "variant-bank kinds offered as candidates")
    llm_models: list = param(["self"], "models sampled for LLM candidates (self = model; e.g. gemma3-270m)",
                             paper="several open code LLMs (DeepSeek-Coder, Qwen2.5-Coder, ...)")  # fmt: skip
    llm_tasks: int = param(8, "training tasks that also get LLM samples (the first ones)")
    llm_samples: int = param(2, "LLM samples per such task")
    llm_temperature: float = param(0.8, "LLM sampling temperature", paper="[verify]")
    llm_max_new_tokens: int = param(96, "token budget of one LLM sample")
    rule: str = param("lexicographic", "selection rule", paper="lowest time and memory (combination unpublished)",
                      choices=RULES)  # fmt: skip
    time_margin: float = param(1.5, "times within this ratio of the fastest tie (broken by memory, then length)")
    timing: str = param("wall", "wall: perf_counter seconds; lines: deterministic line events (pure-Python only)",
                        paper="EffiBench ET (mprof sampling)", choices=TIMINGS)  # fmt: skip
    timing_runs: int = param(2, "sandbox runs timing each candidate (ET = min over runs)")
    repeat: int = param(3, "timed calls per run (min of k)")
    sandbox_timeout_s: float = param(10.0, "wall / CPU limit of one sandbox run", paper="10 s [code: run_code.sh]")
    sandbox_memory_mb: int = param(512, "address-space limit of one sandbox run")
    sandbox_workers: int = param(2, "parallel sandboxes")
    sandbox_backend: str = param("unshare", "sandbox backend", choices=("unshare", "bwrap"))
    allow_unsandboxed: bool = param(
        False, "run candidates without isolation if no sandbox works (never for model code)"
    )
    systems: list = param(["swiftcode", "random_correct", "base"], "systems compared, among: " + ", ".join(SYSTEMS))
    train_layers: int = param(6, "top blocks fine-tuned (frozen trunk below)", paper="full fine-tuning")
    epochs: int = param(3, "SFT epochs", paper="4 [code: LLaMA-Factory yaml]")
    lr: float = param(2e-4, "AdamW learning rate of the top blocks", paper="5e-6 cosine, warmup 0.03, full FT [code]")
    train_batch: int = param(8, "SFT sequences per optimiser step", paper="16 (8 x 2 accumulation) [code]")
    max_new_tokens: int = param(128, "greedy token budget of a held-out answer", paper="vLLM greedy [code]")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.families:
            raise ValueError("families must name at least one family, got an empty list")
        for f in self.families:
            if f not in FAMILIES:
                raise ValueError(f"families entries must be among {', '.join(FAMILIES)}, got {f!r}")
        check_range("n_train", self.n_train, 1)
        check_range("n_eval", self.n_eval, 1)
        check_range("stress_scale", self.stress_scale, 0.0, 10.0, open_lo=True)
        if not self.generators:
            raise ValueError("generators must name at least one candidate source, got an empty list")
        for g in self.generators:
            if g not in GENERATORS:
                raise ValueError(f"generators entries must be among {', '.join(GENERATORS)}, got {g!r}")
        for k in self.template_kinds:
            if k not in KINDS:
                raise ValueError(f"template_kinds entries must be among {', '.join(KINDS)}, got {k!r}")
        if not self.llm_models or not all(isinstance(m, str) and m for m in self.llm_models):
            raise ValueError(
                f"llm_models must be a non-empty list of model aliases ('self' = model), got {self.llm_models!r}"
            )
        check_range("llm_tasks", self.llm_tasks, 0)
        check_range("llm_samples", self.llm_samples, 1)
        check_range("llm_temperature", self.llm_temperature, 0.0, open_lo=True)
        check_range("llm_max_new_tokens", self.llm_max_new_tokens, 1)
        if self.rule not in RULES:
            raise ValueError(f"rule must be one of {', '.join(RULES)}, got {self.rule!r}")
        check_range("time_margin", self.time_margin, 1.0)
        if self.timing not in TIMINGS:
            raise ValueError(f"timing must be one of {', '.join(TIMINGS)}, got {self.timing!r}")
        check_range("timing_runs", self.timing_runs, 1, 10)
        check_range("repeat", self.repeat, 1, 100)
        check_range("sandbox_timeout_s", self.sandbox_timeout_s, 0.0, 600.0, open_lo=True)
        check_range("sandbox_memory_mb", self.sandbox_memory_mb, 64, 65536)
        check_range("sandbox_workers", self.sandbox_workers, 1, 64)
        for s in self.systems:
            if s not in SYSTEMS:
                raise ValueError(f"systems entries must be among {', '.join(SYSTEMS)}, got {s!r}")
        for need in ("swiftcode", "random_correct", "base"):
            if need not in self.systems:
                raise ValueError(
                    f"systems must include {need!r} (the method or a claim's baseline), got {self.systems}"
                )
        check_range("train_layers", self.train_layers, 1)
        check_range("epochs", self.epochs, 1)
        check_range("lr", self.lr, 0.0, open_lo=True)
        check_range("train_batch", self.train_batch, 1)
        check_range("max_new_tokens", self.max_new_tokens, 1)
