"""Configuration of the implicit PRM (Yuan et al., ICML 2025) and its reproduction."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param
from lmlab.methods.alignment.implicit_prm.method import AGGREGATES, BALANCES, LOSSES, OUTPUTS

ORM_LOSSES = ("bt",)


@dataclass
class ImplicitPRMConfig(BaseConfig):
    """Implicit PRM (CE and DPO) against an outcome RM, a Monte Carlo (Math-Shepherd) PRM, majority vote and random.

    Args:
        beta (`float`, defaults to 0.05): beta of ``r = beta log pi_theta/pi_ref`` (paper about 0.05 [verify]).
        losses (`list[str]`, defaults to ``["ce", "dpo"]``): implicit-PRM objectives trained (paper: CE, DPO, KTO,
            NCA); headline (`str`, defaults to ``"ce"``): the one the claims gate on.
        ce_balance (`str`, defaults to ``"none"``): CE class balancing (``dataset`` / ``instruction``, the paper's
            balanced variants).
        aggregate (`str`, defaults to ``"min"``): best-of-N score from step rewards (paper: min [verify]); the
            ``sum`` (= outcome reward) selection is reported beside it.
        k (`int`, defaults to 4): trainable top blocks over the frozen, cached trunk (SmolLM2 has 30).
        lrs (`list[float]`, defaults to ``[3e-5, 1e-4, 3e-4]``), epoch_grid (`list[int]`, defaults to ``[1]``):
            the recipe grid every reward model (the implicit PRMs and both baselines) is tuned over on the dev split,
            one run per lr with checkpoints at the epochs (`method.select_recipe`); the same grid for each system.
        head_lr_scale (`float`, defaults to 30): a value model's freshly initialised scalar head steps at this
            multiple of its blocks' lr (3e-3 at lr 1e-4: the head needs it to turn in a few dozen steps).
        max_extensions (`int`, defaults to 2): extra points a system's search gets on each axis while its choice
            sits on that axis' edge (the next lr out by the grid's spacing; one more epoch of the chosen run): with
            ``epoch_grid=[1]`` the winning lr trains on while dev improves. A cap per axis: a shared one let an lr
            extension that lost use up the epochs' and left the CE PRM on its epoch edge (2026-12-07 run).
        batch_size: responses per training / scoring batch.
        n_train (`int`, defaults to 92): training problems, of which n_dev (`int`, defaults to 12) are held back
            as the dev split (with `n_candidates` candidates each, like the test), so 80 problems train; n_responses
            (`int`, defaults to 4): solver responses per remaining training problem, with outcome labels only
            (paper: UltraInteract, 8 rollouts per instruction). Budget: the default runs about 10 minutes on 2
            cores, not 5 (README, Timing): every reward model's own dev search is what makes the baselines worth
            comparing against; 12 dev problems instead of 20 pay for the per-axis extension cap.
        n_eval (`int`, defaults to 40): held-out problems; n_candidates (`int`, defaults to 8): best-of-N's N.
        error_rate (`float`, defaults to 0.3): probability that the noisy solver writes a wrong result at a step
            (+-1, +-10 or +- a wrong operator's distance, the sign a fair coin: `task._corrupt`).
        min_ops, max_ops (`int`, defaults to 3 and 4): operations per problem (one step each, then the answer).
        mc_rollouts (`int`, defaults to 4): Math-Shepherd completions per step prefix (the explicit-PRM baseline).
        orm_loss (`str`, defaults to ``"bt"``): the outcome RM's objective: Bradley-Terry on correct x incorrect
            pairs of a question (`lmlab.core.training.preference.bradley_terry_loss`).
        output (`str`, defaults to ``"value"``): what the saved PRM's ``score`` returns for rsd / spec_search:
            ``sigmoid(q_s)`` (``value``) or ``sigmoid(r_s)`` (``step``).
        save_dir (`str`, *optional*): save the headline implicit PRM there (use it with ``--set prm=implicit:DIR``).
    """

    beta: float = param(0.05, "beta of r = beta * log(pi_theta / pi_ref)", paper="about 0.05 [verify]")
    losses: list = param(["ce", "dpo"], "implicit-PRM objectives trained", paper="CE, DPO, KTO, NCA")
    headline: str = param("ce", "implicit-PRM objective the claims gate on", choices=LOSSES)
    ce_balance: str = param(
        "none", "CE class balancing", paper="dataset-wise and instruction-wise balanced variants", choices=BALANCES
    )
    aggregate: str = param("min", "best-of-N score from step rewards", paper="min over steps [verify]",
                           choices=AGGREGATES)  # fmt: skip
    k: int = param(4, "trainable top blocks (frozen, cached trunk below)", paper="full fine-tuning of Llama-3.1-8B")
    lrs: list = param([3e-5, 1e-4, 3e-4], "AdamW lrs of the trainable blocks tried for every reward model on dev",
                      lo=0.0, open_lo=True, nonempty=True)  # fmt: skip
    epoch_grid: list = param([1], "training epochs tried for every reward model on dev (checkpoints of one run)",
                             lo=1, nonempty=True)  # fmt: skip
    head_lr_scale: float = param(30.0, "a value model's fresh scalar head steps at this multiple of its blocks' lr",
                                 lo=0.0, open_lo=True)  # fmt: skip
    max_extensions: int = param(2, "extra points per axis (lr, epochs) of a reward model's dev search while its "
                                "choice sits on that axis' edge", lo=0)  # fmt: skip
    batch_size: int = param(16, "responses per training / scoring batch (whole questions)")
    n_train: int = param(92, "training problems (the dev split included)", paper="UltraInteract math instructions")
    n_dev: int = param(12, "training problems held back as the dev split that chooses every reward model's recipe")
    n_responses: int = param(4, "solver responses per training problem (outcome labels)", paper="8 rollouts")
    n_eval: int = param(40, "held-out problems", paper="MATH-500")
    n_candidates: int = param(8, "best-of-N candidates per held-out problem", paper="N = 4, 16, 64")
    error_rate: float = param(0.3, "probability of a wrong result at each solver step (errors propagate)")
    min_ops: int = param(3, "fewest operations per problem")
    max_ops: int = param(4, "most operations per problem")
    mc_rollouts: int = param(4, "Math-Shepherd completions per step prefix (explicit-PRM baseline)",
                             paper="N = 8 completions (Math-Shepherd) [verify]")  # fmt: skip
    orm_loss: str = param("bt", "outcome RM objective: Bradley-Terry on within-question pairs", choices=ORM_LOSSES)
    output: str = param("value", "saved PRM's score(): sigmoid(q_s) ('value') or sigmoid(r_s) ('step')",
                        choices=OUTPUTS)  # fmt: skip
    save_dir: str | None = param(None, "save the headline implicit PRM in this folder (None: do not save)")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("beta", self.beta, 0.0, open_lo=True)
        if not self.losses or any(x not in LOSSES for x in self.losses) or len(set(self.losses)) != len(self.losses):
            raise ValueError(f"losses must be distinct entries of {', '.join(LOSSES)}, got {self.losses!r}")
        if self.headline not in self.losses:
            raise ValueError(f"headline {self.headline!r} must be one of losses {self.losses!r}")
        check_range("k", self.k, 1)
        if len(set(self.lrs)) != len(self.lrs):
            raise ValueError(f"lrs must be distinct, got {self.lrs!r}")
        if any(not isinstance(e, int) or isinstance(e, bool) for e in self.epoch_grid):
            raise ValueError(f"epoch_grid must hold whole numbers of epochs, got {self.epoch_grid!r}")
        if len(set(self.epoch_grid)) != len(self.epoch_grid):
            raise ValueError(f"epoch_grid must be distinct, got {self.epoch_grid!r}")
        check_range("n_train", self.n_train, 2)
        check_range("n_dev", self.n_dev, 1, self.n_train - 1)
        check_range("n_responses", self.n_responses, 2)
        check_range("n_eval", self.n_eval, 1)
        check_range("n_candidates", self.n_candidates, 2)
        check_range("error_rate", self.error_rate, 0.0, 1.0)
        check_range("min_ops", self.min_ops, 2)
        check_range("max_ops", self.max_ops, self.min_ops)
        check_range("mc_rollouts", self.mc_rollouts, 1)
