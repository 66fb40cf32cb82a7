"""Configuration of MPO (Mixing Preference Optimization) and its reproduction."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param
from lmlab.methods.alignment.mpo.method import SAMPLERS, SCHEDULES


@dataclass
class MPOConfig(BaseConfig):
    """MPO (Wang et al., ICML 2025): log-linear mixing of single-objective policies, MaxMin weights by batch
    stochastic mirror descent.

    The reproduction has two levels on capital questions of the `countries` suite with templated candidate answers
    and three conflicting rule objectives (correct / concise / detail, see `task.py`):

    1. exact: pi_ref is the model's distribution over each prompt's candidates; the single-objective policies are
       the exact ``pi_k ∝ pi_ref exp(z_k / beta)``; MPO's weights against the exact MaxMin optimum (cutting-plane
       LPs), uniform weights, each single policy and the probability mixture;
    2. trained (`train_policies`): one DPO policy per objective on the frozen trunk's top `k_layers` blocks;
       a gate that training moved each policy (its own objective's expected reward on the held-out candidates above
       pi_ref's); MPO's mixture against uniform weights, each single policy and the reward soup (parameter
       averaging), on the held-out candidate sets and (`gen_prompts` > 0) in sampled free generation with
       token-level mixing (reported only).

    Args:
        n_train (`int`, defaults to 32): train prompts (weight search, DPO data, z-normalisation statistics).
        n_test (`int`, defaults to 32): held-out prompts (every reported number).
        n_candidates (`int`, defaults to 8): candidate answers per prompt (spec: 16 samples per prompt).
        p_wrong (`float`, defaults to 0.35): chance that a stated fact of a candidate is wrong.
        beta (`float`, defaults to 0.5): KL weight of the exact single policies and of the MaxMin problem.
        eta (`float`, defaults to 2.0): mirror-descent step (eta_0 of the schedule).
        md_batch (`int`, defaults to 8): prompts per mirror-descent step.
        md_steps (`int`, defaults to 2000): mirror-descent steps.
        md_schedule (`str`, defaults to ``"sqrt"``): step schedule, ``eta / sqrt(t + 1)`` or constant.
        sampler (`str`, defaults to ``"exact"``): the per-prompt estimate of E_{pi_lambda}[r] (see `mpo_weights`).
        n_samples (`int`, defaults to 16): draws per prompt of the sampled estimators (also run as an ablation).
        maxmin_tol (`float`, defaults to 0.02): mechanism check: on the train prompts, the mean over prompts of
            ``max_k |E_mpo[z_k] - E_maxmin*[z_k]|`` (a two-sided bound on |W(mpo) - W(MaxMin*)|) below this many
            reward standard deviations (spec: within ~1% of |W(MaxMin*)|, reported as the `maxmin_check` flag).
        k_layers (`int`, defaults to 4): trainable top blocks of each DPO policy (frozen trunk below).
        train_policies (`bool`, defaults to True): run level 2.
        dpo_beta, dpo_lr, dpo_epochs, dpo_pairs, group_prompts: DPO's beta, AdamW learning rate, passes over the
            train groups, preference pairs per prompt and objective, prompts per cached training group.
        reward_signal (`str`, defaults to ``"true"``): rewards of level 2's weight search: the rule rewards of the
            candidates, or the policies' implicit rewards ``dpo_beta log(pi_k / pi_ref)`` (also run as ablation).
        gen_prompts (`int`, defaults to 16): held-out prompts decoded with token-level mixing (0: skip).
        gen_samples (`int`, defaults to 4): samples per generation prompt, the same generator seeds in every system.
        gen_temperature (`float`, defaults to 1.0): sampling temperature of the generations (1: the mixture's own
            distribution; greedy decoding is not offered: it left the compared systems' texts identical).
        chat (`bool`, defaults to False): wrap prompts in the chat template (costs ~30 tokens per sequence).
        ref_score (`str`, defaults to ``"mean"``): a policy's distribution over a prompt's candidates is
            ``softmax(score / score_temperature)`` with score the mean token log-prob (``"sum"``: the sequence
            log-prob, which puts nearly all mass on the shortest templated answer).
        score_temperature (`float`, defaults to 1.0): tau of that softmax.
    """

    n_train: int = param(32, "train prompts (weight search, DPO pairs, z-normalisation)")
    n_test: int = param(32, "held-out prompts (all reported numbers)", paper="held-out HH-RLHF / TL;DR prompts")
    n_candidates: int = param(8, "candidate answers per prompt", paper="spec level 1: 16 samples per prompt")
    p_wrong: float = param(0.35, "chance that a stated fact of a candidate is wrong")
    beta: float = param(0.5, "KL weight of the exact single policies and the MaxMin problem", paper="[verify]")
    eta: float = param(2.0, "mirror-descent step eta_0", paper="[verify]; spec default 0.5")
    md_batch: int = param(8, "prompts per mirror-descent step", paper="[verify]; spec 8")
    md_steps: int = param(2000, "mirror-descent steps", paper="[verify]; spec 200")
    md_schedule: str = param("sqrt", "mirror-descent step schedule", choices=SCHEDULES)
    sampler: str = param("exact", "estimate of E_{pi_lambda}[r] per prompt", choices=SAMPLERS)
    n_samples: int = param(16, "draws per prompt of the sampled estimators")
    maxmin_tol: float = param(0.02, "mechanism check: mean_x max_k |E_mpo[z_k] - E_MaxMin*[z_k]| (train), std units",
                              paper="spec: |W(mpo) - W(MaxMin*)| <= 1% of |W(MaxMin*)|")  # fmt: skip
    k_layers: int = param(4, "trainable top blocks of each DPO policy", paper="full fine-tune (spec: top 4)")
    train_policies: bool = param(True, "level 2: DPO single-objective policies, mixture, soup, generation")
    dpo_beta: float = param(0.1, "DPO beta of the single-objective policies", paper="0.1 (DPO)")
    dpo_lr: float = param(1e-4, "AdamW learning rate of the top blocks")
    dpo_epochs: int = param(3, "passes over the train groups per policy")
    dpo_pairs: int = param(6, "preference pairs per prompt and objective", paper="spec: ~100 pairs per policy")
    group_prompts: int = param(4, "prompts per cached training / scoring group")
    reward_signal: str = param("true", "level-2 weight-search rewards", choices=("true", "implicit"))
    gen_prompts: int = param(16, "held-out prompts decoded with token-level mixing (0: skip)")
    gen_samples: int = param(4, "samples per generation prompt (same seeds for every system)")
    gen_temperature: float = param(1.0, "sampling temperature of the generations")
    chat: bool = param(False, "wrap prompts in the chat template")
    ref_score: str = param("mean", "candidate-set log-score of a policy: mean or summed token log-prob",
                           paper="sequence log-prob (sum)", choices=("mean", "sum"))  # fmt: skip
    score_temperature: float = param(1.0, "temperature tau of the candidate-set distribution softmax(score / tau)")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("n_train", self.n_train, 1)
        check_range("n_test", self.n_test, 1)
        check_range("n_candidates", self.n_candidates, 2, 16)
        check_range("p_wrong", self.p_wrong, 0.0, 1.0)
        check_range("beta", self.beta, 0.0, open_lo=True)
        check_range("eta", self.eta, 0.0, open_lo=True)
        check_range("md_batch", self.md_batch, 1)
        check_range("md_steps", self.md_steps, 1)
        check_range("n_samples", self.n_samples, 1)
        check_range("maxmin_tol", self.maxmin_tol, 0.0, open_lo=True)
        check_range("k_layers", self.k_layers, 1)
        check_range("dpo_beta", self.dpo_beta, 0.0, open_lo=True)
        check_range("dpo_lr", self.dpo_lr, 0.0, open_lo=True)
        check_range("dpo_epochs", self.dpo_epochs, 1)
        check_range("dpo_pairs", self.dpo_pairs, 1)
        check_range("group_prompts", self.group_prompts, 1)
        check_range("gen_prompts", self.gen_prompts, 0)
        check_range("gen_samples", self.gen_samples, 1)
        check_range("gen_temperature", self.gen_temperature, 0.0, open_lo=True)
        check_range("score_temperature", self.score_temperature, 0.0, open_lo=True)
