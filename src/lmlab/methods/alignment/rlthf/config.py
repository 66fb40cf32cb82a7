"""Configuration of RLTHF and its reproduction (country-fact preference pairs, simulated AI judge, budgeted oracle)."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param

STRATEGIES = ("rlthf", "random", "uncertainty", "self")
NOISE_MODELS = ("systematic", "flip")


@dataclass
class RLTHFConfig(BaseConfig):
    """RLTHF (Xu et al., ICML 2025) against random selection, uncertainty sampling, AI-only and full annotation.

    Each replicate draws `n_train_pairs` training and `n_test_pairs` held-out pairs (disjoint countries) from the
    fixed response variants of the `countries` prompts (`task.py`), labels the training pool with the AI labeller of
    each noise model, and runs every strategy with its own `GroundTruthAnnotator` of the same budget
    (``round(human_fraction * n_train_pairs)`` unique pairs, `iterations` rounds). The reward model is a linear
    Bradley-Terry head on frozen sentence embeddings (`embedder`), reduced to `pca_dim` principal directions of the
    training responses and standardised. Replicates are the independent unit of every CI and claim.

    Args:
        n_train_pairs (`int`, defaults to 3000): training pool (paper: HH-RLHF 161K, TL;DR 93K).
        n_test_pairs (`int`, defaults to 1000): held-out pairs, labelled by the clean oracle, never charged.
        max_train_prompts / max_test_prompts (`int`, *optional*): cap the prompts (and the texts embedded).
        variants_per_prompt (`int`, defaults to 8): attribute combinations per prompt (of the 32 in `task.GRID`).
        replicates (`int`, defaults to 8): seeded pair draws, labeller and annotator noise, folds (>= 6 to decide).
        noise_models (`list[str]`): ``systematic`` (`SimulatedJudge`: politeness blind spot, length bias, errors at
            small margins) and ``flip`` (`FlipJudge`: uniform flips).
        judge_length_bias, judge_temperature: the systematic judge (about 80% accurate with the defaults).
        flip_prob (`float`, defaults to 0.2): the uniform labeller's error rate (about the systematic judge's).
        human_noise_temperature (`float`, *optional*): Bradley-Terry noise of the human; None = clean oracle.
        human_fraction (`float`, defaults to 0.06): total annotator budget as a share of the pool (paper: 6-7%).
        iterations (`int`, defaults to 4): rounds; each sends ``budget / iterations`` pairs (1.5% of the pool).
        amplification (`float`, defaults to 5): weight (copies) of a human label, every strategy alike.
        backoff (`float`, *optional*): the back-off ratio b in [0, 2] of RLTHF and self (`method.backoff_drop`):
            b in [0, 1] drops the lowest b share of the un-annotated pairs below the knee each round, b in (1, 2]
            all of them plus the lowest b - 1 share of those between the elbow and the knee (2: only the confident
            region above the elbow is kept). None (default): chosen on the dev split, per strategy and noise model.
        backoff_grid (`list[float]`): the values tried on the dev split; while the best is the largest one (and
            below 2, the natural bound), the grid grows by its last step.
        dev_replicates (`int`, defaults to 2) and n_dev_pairs (`int`, defaults to 1000): the dev stage that
            chooses the back-off: its own pools drawn from the training prompts, each curated with the same
            annotator budget, the RM scored on pairs of the suite's dev split (countries disjoint from train and
            test), labelled by the clean oracle and uncounted. The test pairs never enter the choice.
        max_dev_prompts (`int`, *optional*): cap on the dev prompts.
        query_order (`str`): ``random`` draw below the knee, or the ``lowest`` margins first.
        n_folds, l2, pca_dim: the reward model (cross-fitted scoring, L2, feature width).
        smooth, split: the reward-distribution curve (rolling-mean window share; rank share between elbow and knee).
        strategies (`list[str]`): curation strategies run beside ``ai_only`` and ``full`` (always run).
        model (`str`, defaults to ``"minilm"``): the frozen sentence encoder (all-MiniLM-L6-v2; any BERT-style one).
        embedder (`str`): ``model`` (mean-pooled `model` embeddings) or ``hashing`` (a model-free stand-in for tests).
        target_len (`int`, defaults to 3): the utility's preferred length in sentences.
    """

    model: str = param("minilm", "sentence encoder of the reward model (BERT-style; with embedder='model')")
    n_train_pairs: int = param(3000, "training pairs per replicate", paper="161K (HH-RLHF), 93K (TL;DR)")
    n_test_pairs: int = param(1000, "held-out pairs per replicate (clean oracle labels, uncounted)")
    max_train_prompts: int | None = param(None, "cap on training prompts (None: every usable one)")
    max_test_prompts: int | None = param(None, "cap on held-out prompts (None: every usable one)")
    variants_per_prompt: int = param(8, "response variants (attribute combinations) per prompt")
    replicates: int = param(8, "independent replicates (the unit of CIs and claims)", paper="one run per dataset")
    noise_models: list = param(list(NOISE_MODELS), "AI-labeller noise models, among: " + ", ".join(NOISE_MODELS))
    judge_length_bias: float = param(0.5, "systematic judge: utility credited per sentence of length")
    judge_temperature: float = param(1.0, "systematic judge: T of sigmoid(dJ / T) (errors where |dJ| < T)")
    flip_prob: float = param(0.2, "uniform labeller: flip probability")
    human_noise_temperature: float | None = param(None, "human Bradley-Terry noise T (None: clean oracle)")
    human_fraction: float = param(0.06, "annotator budget as a share of the pool", paper="6-7% in total")
    iterations: int = param(4, "annotation rounds", paper="several [verify]")
    amplification: float = param(5.0, "weight (copies) of a human-labelled pair", paper="named, value [verify]")
    backoff: float | None = param(
        None,
        "back-off ratio in [0, 2] (0-1: share of the below-knee tail dropped, 1-2: on up to the elbow); None: tuned",
        paper="back-off ratio beta [verify]",
    )
    backoff_grid: list = param(
        [0.0, 0.25, 0.5, 0.75, 1.0], "back-off values tried on the dev split (grown while the best is the largest)"
    )
    dev_replicates: int = param(2, "replicates of the dev stage that chooses the back-off (same annotator budget)")
    n_dev_pairs: int = param(1000, "dev pairs per dev replicate (suite's dev split, clean oracle, uncounted)")
    max_dev_prompts: int | None = param(None, "cap on dev prompts (None: every usable one)")
    query_order: str = param(
        "random",
        "which below-knee pairs go to the human",
        paper="below the knee [verify]",
        choices=("random", "lowest"),
    )
    n_folds: int = param(5, "cross-fitting folds (grouped by prompt)")
    l2: float = param(0.03, "L2 strength of the linear Bradley-Terry reward model (mean-loss scale)")
    pca_dim: int = param(192, "principal directions of the response embeddings kept as RM features")
    smooth: float = param(0.02, "rolling-mean window of the sorted margins, as a share of the pool")
    split: float = param(0.5, "rank share where the elbow's (upper) and knee's (lower) halves meet", paper="[verify]")
    strategies: list = param(list(STRATEGIES), "curation strategies, among: " + ", ".join(STRATEGIES))
    embedder: str = param(
        "model", "RM features: `model`'s sentence embeddings, or hashing", choices=("model", "hashing")
    )
    target_len: int = param(3, "preferred length (sentences) of the utility U")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("n_train_pairs", self.n_train_pairs, 16)
        check_range("n_test_pairs", self.n_test_pairs, 1)
        check_range("max_train_prompts", self.max_train_prompts, 2)
        check_range("max_test_prompts", self.max_test_prompts, 1)
        check_range("variants_per_prompt", self.variants_per_prompt, 2, 32)
        check_range("replicates", self.replicates, 1)
        if not self.noise_models or any(m not in NOISE_MODELS for m in self.noise_models):
            raise ValueError(
                f"noise_models must be a non-empty list among {', '.join(NOISE_MODELS)}, got {self.noise_models}"
            )
        check_range("judge_length_bias", self.judge_length_bias, 0.0)
        check_range("judge_temperature", self.judge_temperature, 0.0, open_lo=True)
        check_range("flip_prob", self.flip_prob, 0.0, 0.5)
        check_range("human_noise_temperature", self.human_noise_temperature, 0.0, open_lo=True)
        check_range("human_fraction", self.human_fraction, 0.0, 0.5, open_lo=True)
        check_range("iterations", self.iterations, 1, 50)
        check_range("amplification", self.amplification, 1.0)
        check_range("backoff", self.backoff, 0.0, 2.0)
        if not self.backoff_grid or len(set(self.backoff_grid)) != len(self.backoff_grid):
            raise ValueError(f"backoff_grid must be a non-empty list of distinct values, got {self.backoff_grid}")
        for b in self.backoff_grid:
            check_range("backoff_grid values", b, 0.0, 2.0)
        check_range("dev_replicates", self.dev_replicates, 1)
        check_range("n_dev_pairs", self.n_dev_pairs, 1)
        check_range("max_dev_prompts", self.max_dev_prompts, 1)
        check_range("n_folds", self.n_folds, 2, 20)
        check_range("l2", self.l2, 0.0, open_lo=True)
        check_range("pca_dim", self.pca_dim, 2)
        check_range("smooth", self.smooth, 0.0, 0.49)
        check_range("split", self.split, 0.1, 0.9)
        check_range("target_len", self.target_len, 1, 8)
        if "rlthf" not in self.strategies or any(s not in STRATEGIES for s in self.strategies):
            raise ValueError(
                f"strategies must include 'rlthf' and be among {', '.join(STRATEGIES)}, got {self.strategies}"
            )
