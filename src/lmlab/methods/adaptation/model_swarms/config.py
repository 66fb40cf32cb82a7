"""Configuration of Model Swarms and its reproduction (task-bank LoRA experts -> a composite target task)."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param

# the same tuples as method.py's / taskbank's (kept here so that reading the config imports no torch)
VELOCITY_INITS = ("random", "zero", "best")
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TASKBANK = {
    "geography": ("capital", "continent", "iso3", "currency_code"),
    "arithmetic": ("add", "sub", "mul", "two_step"),
    "strings": ("reverse", "uppercase", "count"),
    "units": ("length", "mass", "time", "volume"),
}
# composite targets: built in composite.py from the task bank's items; the values are the families whose skills it
# combines, the first being the family whose items it re-phrases (the experts train on those families, never on the
# composite). Selectable, not the default: at this scale no expert beats the base model on it (README, Deviations).
COMPOSITES = {"composite/capital_upper": ("geography/capital", "strings/uppercase")}
# the default target: no expert trains on it, two carry parts of it (an ISO 4217 code is mostly the ISO 3166 alpha-2
# code plus a letter: iso3 and uppercase transfer on dev in the lead's probe), four carry less or none (the swarm has
# to find the useful ones). Six experts, so the budget B is that of the capital_upper design.
DEFAULT_TARGET = "geography/currency_code"
DEFAULT_EXPERTS = ["geography/iso3", "strings/uppercase", "geography/capital", "geography/continent",
                   "strings/reverse", "arithmetic/add"]  # fmt: skip
# the official run scripts' grids (search_*.sh), sampled with a fixed seed when hparams="sampled"
GRIDS = {
    "phi_v": (0.1, 0.2, 0.3),
    "phi_p": (0.1, 0.2, 0.3, 0.4, 0.5),
    "phi_g": (0.2, 0.3, 0.4, 0.5, 0.6),
    "phi_w": (0.01, 0.05, 0.1),
    "step": (0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
}


def items_family(target: str) -> str:
    """The task-bank family whose items `target` is made of: a composite's first component, else the target."""
    return COMPOSITES[target][0] if target in COMPOSITES else target


def is_geography(target: str) -> bool:
    """A target made of country items: its dev pool is widened by the train-split countries no expert saw."""
    return items_family(target).startswith("geography/")


def parse_target(name: str) -> str:
    """A composite target (`COMPOSITES`) as is, or a task-bank family checked by `parse_family`."""
    if name in COMPOSITES:
        return name
    if isinstance(name, str) and name.startswith("composite/"):
        raise ValueError(f"target must be one of {', '.join(COMPOSITES)} or a task-bank family, got {name!r}")
    parse_family(name, "target")
    return name


def parse_family(name: str, what: str) -> tuple[str, str]:
    """``"domain/task"`` -> (domain, task) of the task bank, or a one-line ValueError naming `what`."""
    if not isinstance(name, str) or name.count("/") != 1:
        raise ValueError(f"{what} must be 'domain/task' of the task bank (e.g. 'arithmetic/add'), got {name!r}")
    domain, task = name.split("/")
    if task not in TASKBANK.get(domain, ()):
        opts = ", ".join(f"{d}/{t}" for d, ts in TASKBANK.items() for t in ts)
        raise ValueError(f"{what} must be one of {opts}, got {name!r}")
    return domain, task


@dataclass
class ModelSwarmsConfig(BaseConfig):
    """Model Swarms (Feng et al., ICML 2025) against best-single, uniform soup, TIES, DARE and random search.

    Each expert is a LoRA (r, α, `target_modules`) on the top `train_layers` blocks of `model` (frozen trunk cached
    once), trained `expert_steps` AdamW steps on the train split of one task-bank family of `experts`. The search
    objective is log-likelihood multiple-choice accuracy (`n_choices` options) on `dev_items` dev items of `target`,
    a task no expert was trained on (default ``geography/currency_code``: the ISO-3 and uppercase experts carry parts
    of it, capital, continent, reverse and add less or none); every system is reported on `test_items` test items.
    A geography target's dev items are the dev-split countries, then the train-split countries no geography expert
    trained on (43 with the default experts at seed 0), so dev, test and training are disjoint by country. The
    swarm's utility evaluations set the budget: random search, TIES and DARE (density and λ tuned on dev) get exactly
    as many.

    Budget note: the default preset takes up to ~7 min on 2 quiet cores (estimate, not yet measured on this target:
    ≈ 0.8 s per 40-item dev evaluation, as the former two_step target's, whose items are as long in tokens; the
    10-minute class, because the gated claim is the search's gain over its start and needs the spec's 15 iterations
    to move; patience 5 can stop it earlier, ≈ 4.5 min near 8). Every searcher's dev evaluations scale with
    B = N (1 + iterations) = 6 + 6 · 15 = 96 at most.

    Args:
        experts (`list[str]`): one task-bank family (``domain/task``) per expert (paper: 10 Tulu-v2 subsets).
        target (`str`): the task searched for: a task-bank family no expert trains on (default
            ``geography/currency_code``, "What is the ISO 4217 currency code of X?"), or ``composite/capital_upper``
            ("What is the capital of X? Write the answer in uppercase letters.", built from the capital and
            uppercase families, with a case-trap option; `composite.py`; no signal at this scale, so not the
            default).
        digits (`int`): operand digits of arithmetic families. n_choices (`int`): options per item.
        expert_items, expert_steps, expert_batch, expert_lr: the experts' training (train split, constant lr).
        shared_init (`bool`): one LoRA init for every expert (so A / B algebra compares like with like).
        rank, alpha, target_modules, train_layers: the LoRA and where it sits.
        hparams (`str`): ``sampled`` (φ's and λ drawn from the run scripts' grids with `search_seed`) or ``fixed``
            (the values below, ``search.py``'s defaults).
        phi_v, phi_p, phi_g, phi_w, step, step_decay, step_floor, patience, max_iteration, restart_patience,
        velocity_init, populate_to, search_seed: see `SwarmConfig`.
        merge_density, density_range, lambda_range: TIES / DARE's first draw and tuning ranges.
        dare_rescale (`str`): ``l1`` (mergekit) or ``density`` (DARE paper, peft).
        save_model (`str`, *optional*): write the swarm's best model (LoRA merged) here as a HF folder.
        expert_cache (`bool`): keep trained experts under lmlab's cache folder (keyed by everything that shapes them).
    """

    experts: list = param(list(DEFAULT_EXPERTS), "one task-bank family (domain/task) per LoRA expert",
                          paper="10 Tulu-v2 LoRA experts of Gemma-7B-it")  # fmt: skip
    target: str = param(DEFAULT_TARGET, "search objective: a task-bank family no expert trains on, or a composite "
                        "of expert families", paper="MMLU, GSM8K, ... (9 single tasks)")  # fmt: skip
    digits: int = param(2, "operand digits of arithmetic families (1 digit leaves 15 distinct train items of sub)")
    n_choices: int = param(4, "options per multiple-choice item", paper="MC accuracy")
    dev_items: int = param(40, "dev items of the utility (a geography target: the dev-split countries, then the "
                           "train-split countries no geography expert trained on; 43 with the default experts at "
                           "seed 0)", paper="200 [secondary]")  # fmt: skip
    test_items: int = param(120, "test items reported (a geography target: at most the 122 test-split countries)",
                            paper="1000 [secondary]")  # fmt: skip
    expert_items: int = param(40, "train items per expert")
    expert_steps: int = param(30, "AdamW steps per expert", paper="SFT on a Tulu-v2 subset")
    expert_batch: int = param(8, "sequences per expert step")
    expert_lr: float = param(1e-3, "expert learning rate (constant)")
    rank: int = param(8, "LoRA rank r (every expert)", paper="[verify]")
    alpha: float = param(16.0, "LoRA alpha (s = alpha / r)", paper="[verify]")
    target_modules: list = param(["q_proj", "v_proj", "up_proj", "down_proj"], "LoRA target modules")
    train_layers: int = param(2, "top blocks carrying the LoRA over a cached frozen trunk", paper="all layers")
    hparams: str = param("sampled", "swarm hyperparameters: drawn from the run-script grids, or the fixed values",
                         choices=("sampled", "fixed"))  # fmt: skip
    phi_v: float = param(0.4, "inertia φ_v (hparams=fixed)", paper="0.4 (search.py); scripts {0.1, 0.2, 0.3}")
    phi_p: float = param(0.3, "cognitive φ_p (hparams=fixed)", paper="0.3; scripts {0.1..0.5}")
    phi_g: float = param(0.3, "social φ_g (hparams=fixed)", paper="0.3; scripts {0.2..0.6}")
    phi_w: float = param(0.3, "repel φ_w (hparams=fixed)", paper="0.3; scripts {0.01, 0.05, 0.1}")
    step: float = param(1.0, "initial step length λ (hparams=fixed)", paper="1; scripts {0.5..1.0}")
    step_decay: float = param(0.95, "λ <- max(λ · step_decay, step_floor) per iteration", paper="0.95")
    step_floor: float = param(0.1, "minimum step length", paper="0.1")
    patience: int = param(5, "stop when g is unchanged for this many iterations", paper="10 (spec's lmlab default: 5)")
    max_iteration: int = param(15, "iteration cap (the default run's budget driver: see the budget note)",
                               paper="200 (spec's lmlab default: 15)")  # fmt: skip
    restart_patience: float = param(0.67, "restart after restart_patience x patience stale evaluations",
                                    paper="0.67 (scripts)")  # fmt: skip
    velocity_init: str = param("random", "initial velocity", paper="random", choices=VELOCITY_INITS)
    populate_to: int = param(0, "grow the pool to this many particles first (0: off)", paper="20 (scripts)")
    search_seed: int = param(42, "grid-sampling seed; the swarm's draws use (seed, search_seed)",
                             paper="42 (search.py)")  # fmt: skip
    random_concentration: float = param(1.0, "Dirichlet concentration of random search's mixing weights")
    merge_density: float = param(0.5, "TIES / DARE density of the first (default) draw", paper="0.5 [verify]")
    density_range: list = param([0.2, 0.9], "TIES / DARE density range searched on dev")
    lambda_range: list = param([0.5, 1.5], "TIES / DARE λ (task-vector scale) range searched on dev")
    dare_rescale: str = param("l1", "DARE rescale: l1 (mergekit) or density (paper, peft)", choices=("l1", "density"))
    shared_init: bool = param(True, "every expert starts from the same LoRA init (one seed); data order differs",
                              paper="fixed-seed HF fine-tuning of each expert [verify]")  # fmt: skip
    max_grad_norm: float = param(1.0, "gradient-norm clip of expert training")
    save_model: str | None = param(None, "write the swarm's best model (LoRA merged) here as a HF folder")
    expert_cache: bool = param(True, "cache trained experts under lmlab's cache folder")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.experts, list) or not self.experts:
            raise ValueError(f"experts must be a non-empty list of task-bank families, got {self.experts!r}")
        for e in self.experts:
            parse_family(e, "experts entries")
        parse_target(self.target)
        if self.target in self.experts:
            raise ValueError(f"target {self.target!r} is one of the experts' families; expected a task no expert "
                             "trained on")  # fmt: skip
        if len(set(self.experts)) != len(self.experts):
            raise ValueError(f"experts entries must be distinct families, got {self.experts}")
        check_range("digits", self.digits, 1, 3)
        check_range("n_choices", self.n_choices, 2, 10)
        check_range("dev_items", self.dev_items, 1)
        check_range("test_items", self.test_items, 1)
        check_range("expert_items", self.expert_items, 1)
        check_range("expert_steps", self.expert_steps, 1)
        check_range("expert_batch", self.expert_batch, 1)
        check_range("expert_lr", self.expert_lr, 0.0, 1.0, open_lo=True)
        check_range("rank", self.rank, 1)
        check_range("alpha", self.alpha, 0.0, open_lo=True)
        if not self.target_modules or any(t not in TARGETS for t in self.target_modules):
            raise ValueError(f"target_modules must be a non-empty subset of {', '.join(TARGETS)} (never the tied "
                             f"embedding), got {self.target_modules}")  # fmt: skip
        check_range("train_layers", self.train_layers, 1)
        for name in ("phi_v", "phi_p", "phi_g", "phi_w"):
            check_range(name, getattr(self, name), 0.0)
        check_range("step", self.step, 0.0, open_lo=True)
        check_range("step_decay", self.step_decay, 0.0, 1.0, open_lo=True)
        check_range("step_floor", self.step_floor, 0.0)
        check_range("patience", self.patience, 1)
        check_range("max_iteration", self.max_iteration, 0)
        check_range("restart_patience", self.restart_patience, 0.0, open_lo=True)
        check_range("populate_to", self.populate_to, 0)
        check_range("random_concentration", self.random_concentration, 0.0, open_lo=True)
        check_range("merge_density", self.merge_density, 0.0, 1.0, open_lo=True)
        for name in ("density_range", "lambda_range"):
            r = getattr(self, name)
            if not isinstance(r, list | tuple) or len(r) != 2 or not 0 < r[0] <= r[1]:
                raise ValueError(f"{name} must be [lo, hi] with 0 < lo <= hi, got {r!r}")
        if self.density_range[1] > 1:
            raise ValueError(f"density_range must lie in (0, 1], got {self.density_range!r}")
        check_range("max_grad_norm", self.max_grad_norm, 0.0, open_lo=True)
