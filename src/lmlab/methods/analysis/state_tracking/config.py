"""Configuration of the state-tracking reproduction: tiny trackers on S3 / S5, curricula, diagnostics, classifier."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param

GROUP_NAMES = ("S3", "S5")
CONDITION_NAMES = ("plain", "parity_cur", "topic")


@dataclass
class StateTrackingConfig(BaseConfig):
    """(How) Do Language Models Track State? (Li, Guo & Andreas, ICML 2025).

    Trains `seeds` tiny llamas per group (S3 by default; S5 optional) and condition from scratch on permutation
    composition with state supervision until they learn it (validation accuracy at the training length >=
    `stop_acc`, at most `steps`), then classifies each learned run's mechanism (AA vs PAA) from linear probes,
    parity-controlled activation patching and the error parities of its curve, read on test stories and lengths
    disjoint from the outcomes, and compares AA with PAA runs on convergence speed and generalisation. Fields
    prefixed ``s5_`` override the S3 values for S5. With `tracker` set, nothing is trained: the diagnostics run on
    that saved model.

    Budget note: the default preset is in the 10-minute class (budget 600 s): the claim needs 12 seeds (the
    unpaired AA-vs-PAA checks need >= 6 seeds on each side, `min_n`) and trackers that learn the task (the spec's
    ~2000 steps). Measured on 2 quiet cores (one seed, both conditions, 104 s): a plain run stopped learned at 800
    steps in 52 s; the parity curriculum run did not learn in 2000 steps (43 s) and so adds no labelled run. The
    default therefore trains the plain condition only, 12 seeds ~ 12 x 52 s ~ 10.5 min; the parity curriculum stays
    one flag away (``--set conditions=[plain,parity_cur]``, ~ 2x the time). S5 (never learned at this scale) is left
    out of the default.

    Args:
        model (`str`): unused: the trackers are built from scratch (`make_tracker`); recorded for the CLI.
        tracker (`str`, *optional*): a saved tracker folder (``save_pretrained`` of `make_tracker`'s model) to
            analyse instead of training.
        groups (`list[str]`): ``S3`` and/or ``S5`` (code: ``--num_items 3|5``); default S3 only (S5 is not
            learned at CPU scale and took budget from the seeds).
        conditions (`list[str]`): ``plain`` (state supervision), ``parity_cur`` (parity labels first,
            ``--is_parity_cur``), ``topic`` (next-token pretraining on topic-model data first); default ``plain``.
        seeds (`int`, defaults to 12): runs per group x condition; a seed fixes the init and the state-phase
            data, shared by the conditions (paired design). The unpaired AA-vs-PAA checks count seeds and need >= 6
            on each side (`min_n`), so fewer than 12 seeds cannot decide them unless the labels split evenly.
        n_layers, hidden, init_std: the tiny llama (4 heads, SwiGLU MLP 2x).
        train_len, steps, pre_steps, eval_len: story length of training, state-phase steps at most (the cap when
            `stop_acc` stops training earlier), steps of the intermediate (parity / topic) phase, story length of the
            generalisation test.
        stop_acc (`float`, *optional*): train until the validation accuracy at prefix length train_len reaches it
            (checked every `eval_every` steps); None: train all `steps`. Above `learned_min` so that a stopped run
            passes the learned test on the test stories.
        train_batch, lr, warmup_frac, weight_decay, grad_clip: AdamW with warm-up and cosine decay.
        n_val, eval_every, acc_threshold: validation stories (suite dev split) scored every `eval_every` steps;
            convergence = first step at mean accuracy >= `acc_threshold` over prefix lengths 1..train_len.
        n_eval, n_patch: test stories (suite test split), split in two halves: the first for the mechanism
            (probes on their first train_len actions, half to fit, half to score; `n_patch` base stories for
            patching; error parities), the second for the outcomes (accuracy at train_len, `long_acc`).
        learned_min (`float`): a run counts as learned when its accuracy at prefix length train_len (outcome
            stories) reaches it; only learned runs are labelled and compared.
        paa_threshold (`float`): PAA when the mean of the three mechanism indices exceeds it.
        frontier_margin (`float`): error parities are read where chance + margin < accuracy < 1.
        probe_max_iter, probe_c: the logistic-regression probes.
    """

    model: str = param("tiny-llama", "unused: the trackers are built from scratch (recorded for the CLI only)")
    tracker: str | None = param(None, "analyse this saved tracker folder instead of training (None: train)")
    groups: list = param(["S3"], "permutation groups: S3 and/or S5 (S5 is not learned at CPU scale)",
                         paper="S3 and S5 [code]")  # fmt: skip
    conditions: list = param(
        ["plain"],
        "training conditions: plain, parity_cur (parity labels first), topic (topic-model NTP first); default plain "
        "only (a measured parity_cur run did not learn in 2000 steps: see the budget note)",
        paper="direct_state; --is_parity_cur; next_token topic pretraining [code]",
    )
    seeds: int = param(12, "runs per group x condition (the independent unit; >= 6 per side decide the checks)",
                       paper="seed 42, one run [code]")  # fmt: skip
    n_layers: int = param(3, "tracker layers", paper="GPT-2 (12) / Pythia-70M..1B")
    hidden: int = param(48, "tracker width (4 heads)", paper="768 (GPT-2)")
    init_std: float = param(0.02, "init std of the from-scratch trackers", paper="HF initializer_range 0.02")
    train_len: int = param(6, "actions per training story (S3)", paper="100 [code: --story_length]")
    steps: int = param(2000, "state-supervision steps at most (S3; stop_acc stops earlier)",
                       paper="20 epochs of 950k stories [code]; spec ~2000")  # fmt: skip
    stop_acc: float | None = param(0.95, "stop the state phase once validation accuracy at train_len reaches this "
                                   "(None: all steps)")  # fmt: skip
    pre_steps: int = param(100, "steps of the intermediate parity / topic phase (S3)", paper="a full run [code]")
    eval_len: int = param(18, "actions per generalisation story (S3)", paper="up to 200 [code: eval.py --max_len]")
    s5_train_len: int = param(4, "actions per training story (S5)", paper="100 [code]")
    s5_steps: int = param(150, "state-supervision steps (S5)")
    s5_pre_steps: int = param(40, "intermediate-phase steps (S5)")
    s5_eval_len: int = param(12, "actions per generalisation story (S5)", paper="up to 200 [code]")
    train_batch: int = param(128, "stories per training step", paper="256 [code: train.sh]")
    lr: float = param(6e-3, "AdamW peak learning rate (tiny from-scratch models train fast)", paper="HF 5e-5")
    warmup_frac: float = param(0.1, "linear warm-up share of each phase", paper="HF default 0")
    weight_decay: float = param(0.01, "AdamW weight decay", paper="HF default 0")
    grad_clip: float = param(1.0, "gradient-norm clipping", paper="1.0 [code: max_grad_norm]")
    n_val: int = param(256, "validation stories (suite dev split)", paper="5% of the data [code]")
    eval_every: int = param(50, "state-phase steps between validation scores")
    acc_threshold: float = param(0.9, "convergence: validation accuracy reached at this value")
    n_eval: int = param(512, "test stories (suite test split): half for the mechanism, half for the outcomes",
                        paper="10000 / 1000")  # fmt: skip
    n_patch: int = param(64, "base stories of the patching experiments", paper="--n_prompts 1 [code default]")
    learned_min: float = param(0.9, "a run is learned when its accuracy at prefix length train_len reaches this")
    paa_threshold: float = param(0.4, "PAA when the mean mechanism index exceeds this")
    frontier_margin: float = param(0.1, "error parities are read where chance + margin < accuracy < 1")
    probe_max_iter: int = param(200, "logistic-regression probe iterations", paper="5000 [code]")
    probe_c: float = param(1.0, "logistic-regression probe inverse regularisation", paper="1.0 (sklearn default)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.groups:
            raise ValueError(f"groups must list at least one of {', '.join(GROUP_NAMES)}, got []")
        for g in self.groups:
            if g not in GROUP_NAMES:
                raise ValueError(f"groups entries must be among {', '.join(GROUP_NAMES)}, got {g!r}")
        if len(set(self.groups)) != len(self.groups):
            raise ValueError(f"groups must not repeat, got {self.groups}")
        if not self.conditions:
            raise ValueError(f"conditions must list at least one of {', '.join(CONDITION_NAMES)}, got []")
        for c in self.conditions:
            if c not in CONDITION_NAMES:
                raise ValueError(f"conditions entries must be among {', '.join(CONDITION_NAMES)}, got {c!r}")
        if len(set(self.conditions)) != len(self.conditions):
            raise ValueError(f"conditions must not repeat, got {self.conditions}")
        check_range("seeds", self.seeds, 1)
        check_range("n_layers", self.n_layers, 2)
        check_range("hidden", self.hidden, 8)
        if self.hidden % 8:
            raise ValueError(f"hidden must be a multiple of 8 (4 heads of even RoPE width), got {self.hidden}")
        check_range("init_std", self.init_std, 0.0, open_lo=True)
        for prefix in ("", "s5_"):
            train_len, eval_len = getattr(self, f"{prefix}train_len"), getattr(self, f"{prefix}eval_len")
            check_range(f"{prefix}train_len", train_len, 2, 32)
            check_range(f"{prefix}steps", getattr(self, f"{prefix}steps"), 1)
            check_range(f"{prefix}pre_steps", getattr(self, f"{prefix}pre_steps"), 0)
            if not train_len < eval_len <= 64:
                raise ValueError(
                    f"{prefix}eval_len must be in ({prefix}train_len={train_len}, 64] (the suite's longest story), "
                    f"got {eval_len}"
                )
        check_range("train_batch", self.train_batch, 1)
        check_range("lr", self.lr, 0.0, open_lo=True)
        check_range("warmup_frac", self.warmup_frac, 0.0, 1.0)
        check_range("weight_decay", self.weight_decay, 0.0)
        check_range("grad_clip", self.grad_clip, 0.0, open_lo=True)
        check_range("n_val", self.n_val, 1)
        check_range("eval_every", self.eval_every, 1)
        check_range("acc_threshold", self.acc_threshold, 0.0, 1.0, open_lo=True)
        check_range("n_eval", self.n_eval, 4)
        check_range("n_patch", self.n_patch, 1)
        check_range("learned_min", self.learned_min, 0.0, 1.0)
        if self.stop_acc is not None:
            check_range("stop_acc", self.stop_acc, 0.0, 1.0, open_lo=True)
            if self.stop_acc < self.learned_min:
                raise ValueError(
                    f"stop_acc must be >= learned_min={self.learned_min} (a run stopped below it is never learned), "
                    f"got {self.stop_acc}"
                )
        check_range("paa_threshold", self.paa_threshold, -1.0, 1.0)
        check_range("frontier_margin", self.frontier_margin, 0.0, 1.0)
        check_range("probe_max_iter", self.probe_max_iter, 1)
        check_range("probe_c", self.probe_c, 0.0, open_lo=True)

    def group_settings(self, group: str) -> tuple[int, int, int, int]:
        """(train_len, steps, pre_steps, eval_len) of `group`."""
        prefix = "s5_" if group == "S5" else ""
        return tuple(getattr(self, f"{prefix}{k}") for k in ("train_len", "steps", "pre_steps", "eval_len"))
