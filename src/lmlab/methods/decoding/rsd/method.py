"""Reward-Guided Speculative Decoding: a process reward gates each draft step; rejected steps go to the target.

    P_RSD(y_i | z_i) = omega(r(y_i | z_i)) P_m(y_i | z_i) + nu_omega(z_i) P_M(y_i | z_i),
    nu_omega(z) = 1 - E_{y ~ P_m(. | z)}[omega(r(y | z))],      optimal omega(r) = 1{r >= delta}

Liao et al., "Reward-Guided Speculative Decoding for Efficient LLM Reasoning", ICML 2025
(https://arxiv.org/abs/2501.19324). Official code: https://github.com/BaohaoLiao/RSD (`get_responses` in
`main_online.py`), which this module follows step for step:

1. the draft writes the next step (greedy, stop at the step delimiter);
2. the PRM scores the question plus all steps so far with the draft step appended; only the *last* step's reward r
   is used (official: Skywork PRM, sigmoid of the value head at the step token);
3. the draft step is kept with probability omega(r) (official: ``r >= prm_threshold``, delta = 0.7); otherwise it is
   discarded (its tokens still count: "discarded draft tokens") and the *target* writes the step from the same
   prefix. Target steps are never re-scored;
4. stop when the kept step ended the answer (EOS), at `max_steps` (100) steps, or when question + answer reach
   `max_total_tokens` (4096) under either tokenizer.

Reported as in the official code: ``num_draft_tokens`` (kept + discarded), ``num_target_tokens`` and the token
acceptance rate ``kept / (kept + discarded)`` draft tokens, plus a per-step provenance log and the compute of each
model (`ComputeMeter`: forward calls, prefill/decode tokens, FLOPs, wall time).

Models exchange steps as text through `lmlab.core.inference.steps.StepModel` (any Hugging Face causal LM pair,
different
tokenizers allowed). There is no KV cache across calls, so every call re-prefills its prompt; the meter counts that
as run. `RSDOutput.kv_tokens` also gives what a per-model KV cache would need: the first call's prompt, then only the
tokens a model has not seen, i.e. the new steps and, after a switch, the other model's steps (the re-prefill cost of
switching models).

Everything here is pure: no I/O, no printing.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lmlab.core.inference.compute import ComputeMeter, ModelCost
from lmlab.core.inference.scoring import encode_prompt
from lmlab.core.inference.steps import StepModel, StepOutput
from lmlab.core.stats.seeding import seeded_rng

ROLES = ("draft", "target")


# -- acceptance rules omega(r) -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ThresholdOmega:
    """omega(r) = 1{r >= delta}: the rule the paper proves optimal under a budget on target calls (official default
    ``prm_threshold`` delta = 0.7). delta = 0 keeps every draft step; delta > 1 keeps none (rewards lie in [0, 1])."""

    delta: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.delta):
            raise ValueError(f"threshold delta must be a finite number, got {self.delta!r}")

    def __call__(self, reward: float) -> float:
        return 1.0 if reward >= self.delta else 0.0


@dataclass(frozen=True)
class SoftOmega:
    """omega(r) = min(1, c * r): a smooth rule (c = 1 is the linear rule omega = r); a theory-check baseline."""

    c: float = 1.0

    def __post_init__(self) -> None:
        if not (self.c >= 0 and math.isfinite(self.c)):
            raise ValueError(f"soft rule scale c must be a finite number >= 0, got {self.c!r}")

    def __call__(self, reward: float) -> float:
        return min(1.0, max(0.0, self.c * reward))


@dataclass(frozen=True)
class ConstantOmega:
    """omega(r) = p: keep a draft step at random with probability p, ignoring the reward; a theory-check baseline."""

    p: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"constant acceptance probability p must be in [0, 1], got {self.p!r}")

    def __call__(self, reward: float) -> float:
        return self.p


def match_soft_scale(rewards: Sequence[float], acceptance: float, *, tol: float = 1e-9) -> float:
    """The c for which the soft rule min(1, c * r) keeps, in expectation, the fraction `acceptance` of steps with
    rewards `rewards` (mean of min(1, c * r) = acceptance), found by bisection; the theory check's matched budget.

    Returns `math.inf` when even c = inf cannot reach `acceptance` (too many zero rewards): then the soft rule keeps
    every step with r > 0.
    """
    if not 0.0 <= acceptance <= 1.0:
        raise ValueError(f"acceptance must be in [0, 1], got {acceptance!r}")
    r = [max(0.0, float(x)) for x in rewards]
    if not r:
        raise ValueError("match_soft_scale needs at least one reward")
    if acceptance == 0.0:
        return 0.0
    if sum(x > 0 for x in r) / len(r) < acceptance:
        return math.inf

    def kept(c: float) -> float:
        return sum(min(1.0, c * x) for x in r) / len(r)

    lo, hi = 0.0, 1.0
    while kept(hi) < acceptance:
        hi *= 2.0
    while hi - lo > tol * max(1.0, hi):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if kept(mid) < acceptance else (lo, mid)
    return hi


# -- outputs -------------------------------------------------------------------------------------------------------


@dataclass
class StepRecord:
    """Provenance of one kept step.

    Attributes:
        index (`int`): step number (0-based).
        source (`str`): ``"draft"`` (the draft step was kept) or ``"target"`` (the target wrote it).
        text (`str`): the kept step.
        reward (`float` or `None`): PRM reward of the draft proposal (`None` where no PRM was called).
        accept_prob (`float` or `None`): omega(reward).
        accepted (`bool` or `None`): whether the draft proposal was kept.
        draft_text (`str` or `None`): the draft proposal, kept or discarded.
        draft_tokens (`int`): tokens the draft generated for this step (kept or discarded).
        target_tokens (`int`): tokens the target generated for this step (0 when the draft step was kept).
        step_prefix (`str`): the given start of the step, if any (not generated).
    """

    index: int
    source: str
    text: str
    reward: float | None
    accept_prob: float | None
    accepted: bool | None
    draft_text: str | None
    draft_tokens: int
    target_tokens: int
    step_prefix: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class RSDOutput:
    """What `rsd_generate` (and `single_model_generate`) return.

    Attributes:
        text (`str`): the kept steps joined by the delimiter.
        steps (`list[str]`): the kept steps.
        log (`list[StepRecord]`): per-step provenance (draft/target, reward, tokens).
        num_draft_tokens (`int`): draft tokens generated, discarded ones included (official ``num_draft_tokens``).
        num_accepted_draft_tokens / num_discarded_draft_tokens (`int`): the two parts of it.
        num_target_tokens (`int`): target tokens generated (official ``num_target_tokens``).
        acceptance_rate (`float`): kept / (kept + discarded) draft tokens (official; 0 when the draft wrote nothing).
        n_prm_calls (`int`): PRM calls (one per draft proposal).
        n_switches (`int`): model calls whose model differs from the previous call's (each forces a re-prefill).
        stop_reason (`str`): ``"eos"``, ``"max_steps"``, ``"max_total_tokens"`` or ``"prefixes"`` (one step per
            given prefix written).
        meter (`ComputeMeter`): compute of this generation, as run, under ``draft``, ``target`` and ``prm``:
            forward calls, prefill tokens (every call re-prefills its prompt), decode tokens, FLOPs
            (2 x flop_params x tokens) and wall time.
        kv_tokens (`dict[str, int]`): tokens each model would process with its own KV cache kept between its calls
            (first prompt once, then only unseen tokens; after a switch, the other model's steps are re-prefilled).
        kv_flops (`dict[str, float]`): 2 x flop_params x `kv_tokens`, per model.
    """

    text: str
    steps: list[str]
    log: list[StepRecord]
    num_draft_tokens: int
    num_accepted_draft_tokens: int
    num_discarded_draft_tokens: int
    num_target_tokens: int
    acceptance_rate: float
    n_prm_calls: int
    n_switches: int
    stop_reason: str
    meter: ComputeMeter
    kv_tokens: dict[str, int] = field(default_factory=dict)
    kv_flops: dict[str, float] = field(default_factory=dict)

    @property
    def n_draft_proposals(self) -> int:
        return sum(rec.draft_text is not None for rec in self.log)

    @property
    def step_acceptance_rate(self) -> float:
        """Kept draft steps / draft proposals (0 when there were none)."""
        proposals = self.n_draft_proposals
        return sum(bool(rec.accepted) for rec in self.log) / proposals if proposals else 0.0

    @property
    def target_step_rate(self) -> float:
        """Fraction of kept steps written by the target (the target-invocation rate)."""
        return sum(rec.source == "target" for rec in self.log) / len(self.log) if self.log else 0.0


# -- step calls, memoised ------------------------------------------------------------------------------------------


@dataclass
class _Call:
    out: StepOutput
    cost: ModelCost  # what this call measured (forward calls, prefill/decode tokens, FLOPs, wall)
    prompt_ids: list[int]


class StepCache:
    """A memo of greedy steps, so that systems sharing a prefix (a threshold sweep, the baselines) decode it once.

    Greedy steps are a deterministic function of (model, prompt format, question, steps so far, step prefix). A hit
    returns the stored step and charges the stored cost (forward calls, tokens, FLOPs and the measured wall time) to
    the caller's meter, so each system is billed exactly as if it had run the call itself. Sampled steps are never
    cached.
    """

    def __init__(self) -> None:
        self._store: dict[tuple, _Call] = {}
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._store)


def _model_key(sm: StepModel) -> tuple:
    return (id(sm.model), id(sm.tokenizer), type(sm).__name__, sm.fmt, sm.shots, sm.delimiter, sm.max_step_tokens)


def _call_step(
    sm: StepModel,
    question: str,
    steps: Sequence[str],
    prefix: str,
    sampling: dict[str, Any],
    cache: StepCache | None,
) -> _Call:
    key = (_model_key(sm), question, tuple(steps), prefix)
    use_cache = cache is not None and not sampling.get("do_sample", False)
    if use_cache and key in cache._store:
        cache.hits += 1
        return cache._store[key]
    meter = ComputeMeter()
    view = copy.copy(sm)  # same model and format; its own meter so this call's cost is measured alone
    view.meter, view.name = meter, "step"
    out = view.next_step(question, list(steps), step_prefix=prefix, **sampling)
    cost = meter.models.get("step", ModelCost())
    prompt_ids = encode_prompt(sm.tokenizer, sm.render(question, list(steps), prefix))
    call = _Call(out, cost, prompt_ids)
    if use_cache:
        cache.misses += 1
        cache._store[key] = call
    return call


def _charge(own: ComputeMeter, external: ComputeMeter | None, prefix: str, role: str, cost: ModelCost) -> None:
    # the output's meter uses the plain role names; an external meter (shared by many systems) the prefixed ones
    own.models.setdefault(role, ModelCost()).add(cost)
    if external is not None:
        external.models.setdefault(prefix + role, ModelCost()).add(cost)


class _KVCost:
    """Tokens each model would process with its own KV cache kept between its calls (a cost model, not run)."""

    def __init__(self) -> None:
        self.cached: dict[str, list[int]] = {}
        self.tokens: dict[str, int] = {}

    def add(self, role: str, prompt_ids: Sequence[int], generated: Sequence[int]) -> None:
        prev = self.cached.get(role, [])
        common = 0
        for a, b in zip(prompt_ids, prev):
            if a != b:
                break
            common += 1
        common = min(common, len(prompt_ids) - 1)  # at least the last prompt token is fed to get the next logits
        # the prompt tail the cache lacks, then one forward per generated token but the last (never fed back)
        self.tokens[role] = self.tokens.get(role, 0) + len(prompt_ids) - common + max(len(generated) - 1, 0)
        self.cached[role] = list(prompt_ids) + list(generated[:-1])


def _as_step_model(m: Any, role: str, delimiter: str, max_step_tokens: int) -> StepModel:
    if isinstance(m, StepModel):
        return m
    if isinstance(m, tuple | list) and len(m) == 2:
        return StepModel(m[0], m[1], name=role, delimiter=delimiter, max_step_tokens=max_step_tokens)
    raise ValueError(f"{role} must be a StepModel or a (model, tokenizer) pair, got {type(m).__name__}")


def _check_common(max_steps: int, max_total_tokens: int, max_step_tokens: int) -> None:
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps must be an int >= 1, got {max_steps!r}")
    if max_total_tokens < 1:
        raise ValueError(f"max_total_tokens must be >= 1, got {max_total_tokens!r}")
    if max_step_tokens < 1:
        raise ValueError(f"max_step_tokens must be >= 1, got {max_step_tokens!r}")


def _too_long(models: Sequence[StepModel], question: str, steps: Sequence[str], limit: int) -> bool:
    # official: stop once prompt + response reaches the limit under either model's tokenizer
    return any(len(encode_prompt(sm.tokenizer, sm.render(question, steps))) >= limit for sm in models)


def _flop_params(sm: StepModel) -> int:
    from lmlab.core.inference.models import flop_params

    return flop_params(sm.model)


def _sampling(do_sample: bool, temperature: float, top_p: float, seed: int, question: str, i: int, role: str):
    if not do_sample:
        return {}
    from lmlab.core.stats.seeding import derive_seed

    return {
        "do_sample": True,
        "temperature": temperature,
        "top_p": top_p,
        "seed": derive_seed(seed, role, question, i),
    }


# -- the algorithm -------------------------------------------------------------------------------------------------


def rsd_generate(
    draft: StepModel | tuple[Any, Any],
    target: StepModel | tuple[Any, Any],
    prm: Any,
    question: str,
    *,
    threshold: float = 0.7,
    omega: Callable[[float], float] | None = None,
    delimiter: str = "\n\n",
    max_steps: int = 100,
    step_prefixes: Sequence[str] | None = None,
    max_step_tokens: int = 4096,
    max_total_tokens: int = 4096,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    meter: ComputeMeter | None = None,
    meter_prefix: str = "",
    cache: StepCache | None = None,
    prm_flop_params: int | None = None,
    prm_tokenizer: Any | None = None,
) -> RSDOutput:
    """P_RSD(y|z) = omega(r(y|z)) P_m(y|z) + nu_omega(z) P_M(y|z), omega(r) = 1{r >= delta}
    (https://arxiv.org/abs/2501.19324).

    Each step: the draft proposes, the PRM scores it in the context of the full prefix, the proposal is kept with
    probability omega(r), otherwise the target writes the step from the same prefix (see the module docstring).

    Args:
        draft, target: `StepModel`s (their own prompt format, delimiter and step budget), or ``(model, tokenizer)``
            pairs of any Hugging Face causal LMs, wrapped with `delimiter` and `max_step_tokens` (chat format when
            the tokenizer has a chat template, else few-shot without shots).
        prm: any object with ``score(question, steps) -> list[float]`` (rewards in [0, 1], one per step); only the
            last step's reward is read.
        question (`str`): the problem.
        threshold (`float`, defaults to 0.7): delta of the threshold rule (official ``prm_threshold``); ignored when
            `omega` is given.
        omega (`Callable[[float], float]`, *optional*): a general acceptance rule r -> probability in [0, 1]
            (`ThresholdOmega`, `SoftOmega`, `ConstantOmega`, or your own). A probability strictly between 0 and 1 is
            drawn with a generator seeded by (`seed`, `question`), one uniform per step whatever the rule, so rules
            compared on the same question share their random numbers.
        delimiter (`str`, defaults to ``"\\n\\n"``): step delimiter (official ``step_word``), for wrapped pairs.
        max_steps (`int`, defaults to 100): most steps (official).
        step_prefixes (`Sequence[str]`, *optional*): the given start of each step (e.g. ``"Peru:"``); then exactly
            ``min(len(step_prefixes), max_steps)`` steps are written, EOS or not.
        max_step_tokens (`int`, defaults to 4096): token budget per step for wrapped pairs (official
            ``max_tokens_per_call``).
        max_total_tokens (`int`, defaults to 4096): stop once question + answer reach this many tokens under either
            tokenizer (official).
        do_sample, temperature, top_p: sampling instead of greedy (official: greedy, temperature 0); seeds derive
            from `seed`.
        meter (`ComputeMeter`, *optional*): also charge this generation's compute here, under
            ``meter_prefix + "draft" | "target" | "prm"`` (the StepModels' own meters are not used).
        meter_prefix (`str`): prefix of the names in `meter` (e.g. the system's name).
        cache (`StepCache`, *optional*): memo of greedy steps shared between generations (costs are still charged).
        prm_flop_params (`int`, *optional*): charge each PRM call 2 x this x (tokens of question + steps), a PRM that
            reads the whole prefix (official Skywork PRM). Default: the PRM's own ``flops`` counter if it has one
            (e.g. `ProbePRM`), else 0.
        prm_tokenizer (*optional*): tokenizer counting the PRM's input tokens (default: the draft's).

    Returns:
        `RSDOutput`.
    """
    _check_common(max_steps, max_total_tokens, max_step_tokens)
    draft_sm = _as_step_model(draft, "draft", delimiter, max_step_tokens)
    target_sm = _as_step_model(target, "target", delimiter, max_step_tokens)
    if draft_sm.delimiter != target_sm.delimiter:
        raise ValueError(
            "draft and target must use the same step delimiter, got "
            f"{draft_sm.delimiter!r} and {target_sm.delimiter!r}"
        )
    if not callable(getattr(prm, "score", None)):
        raise ValueError(f"prm must have a score(question, steps) method, got {type(prm).__name__}")
    rule = omega if omega is not None else ThresholdOmega(float(threshold))
    prm_tok = prm_tokenizer if prm_tokenizer is not None else draft_sm.tokenizer

    own = ComputeMeter()
    rng = seeded_rng(seed, "rsd_accept", question)
    kv = _KVCost()
    prefixes = list(step_prefixes) if step_prefixes is not None else None
    n_steps = min(max_steps, len(prefixes)) if prefixes is not None else max_steps
    steps: list[str] = []
    log: list[StepRecord] = []
    last_model, n_switches, n_prm = None, 0, 0
    stop_reason = "prefixes" if prefixes is not None else "max_steps"

    for i in range(n_steps):
        prefix = prefixes[i] if prefixes is not None else ""
        d = _call_step(
            draft_sm,
            question,
            steps,
            prefix,
            _sampling(do_sample, temperature, top_p, seed, question, i, "draft"),
            cache,
        )
        _charge(own, meter, meter_prefix, "draft", d.cost)
        kv.add("draft", d.prompt_ids, d.out.token_ids)
        n_switches += last_model is not None and last_model != "draft"
        last_model = "draft"

        # the PRM scores the whole prefix with the draft step appended; only the last step's reward is used
        flops_before = getattr(prm, "flops", None)
        t0 = time.perf_counter()
        reward = float(prm.score(question, [*steps, d.out.text])[-1])
        prm_cost = ModelCost(forward_calls=1, forward_batches=1, wall_s=time.perf_counter() - t0)
        n_prm_tokens = len(prm_tok(question + "\n" + draft_sm.delimiter.join([*steps, d.out.text]))["input_ids"])
        prm_cost.prefill_tokens = n_prm_tokens
        if prm_flop_params is not None:
            prm_cost.flops = 2.0 * prm_flop_params * n_prm_tokens
        elif flops_before is not None:
            prm_cost.flops = float(prm.flops - flops_before)
        _charge(own, meter, meter_prefix, "prm", prm_cost)
        n_prm += 1

        p = float(rule(reward))
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"omega must return a probability in [0, 1], got {p!r} for reward {reward!r}")
        accepted = bool(rng.random() < p)  # p = 1 always keeps, p = 0 never does
        if accepted:
            chosen, source, target_tokens = d.out, "draft", 0
        else:
            t = _call_step(
                target_sm,
                question,
                steps,
                prefix,
                _sampling(do_sample, temperature, top_p, seed, question, i, "target"),
                cache,
            )
            _charge(own, meter, meter_prefix, "target", t.cost)
            kv.add("target", t.prompt_ids, t.out.token_ids)
            n_switches += 1  # the target follows the draft call
            last_model = "target"
            chosen, source, target_tokens = t.out, "target", t.out.n_tokens
        log.append(
            StepRecord(i, source, chosen.text, reward, p, accepted, d.out.text, d.out.n_tokens, target_tokens, prefix)
        )
        if prefixes is not None or chosen.text:
            steps.append(chosen.text)
        if prefixes is None and chosen.finished:
            stop_reason = "eos"
            break
        if _too_long((draft_sm, target_sm), question, steps, max_total_tokens):
            stop_reason = "max_total_tokens"
            break

    return _finish(steps, log, draft_sm, target_sm, own, kv, n_prm, n_switches, stop_reason)


def single_model_generate(
    model: StepModel | tuple[Any, Any],
    question: str,
    *,
    role: str = "target",
    delimiter: str = "\n\n",
    max_steps: int = 100,
    step_prefixes: Sequence[str] | None = None,
    max_step_tokens: int = 4096,
    max_total_tokens: int = 4096,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    meter: ComputeMeter | None = None,
    meter_prefix: str = "",
    cache: StepCache | None = None,
) -> RSDOutput:
    """The draft-only or target-only baseline: one model writes every step, with RSD's stopping rules and accounting.

    Same arguments as `rsd_generate`; `role` (``"draft"`` or ``"target"``) names the model in the log and meters.
    Under greedy decoding, `rsd_generate` with threshold 0 writes exactly the draft-only answer and with threshold
    above 1 exactly the target-only answer.
    """
    if role not in ROLES:
        raise ValueError(f"role must be 'draft' or 'target', got {role!r}")
    _check_common(max_steps, max_total_tokens, max_step_tokens)
    sm = _as_step_model(model, role, delimiter, max_step_tokens)
    own = ComputeMeter()
    kv = _KVCost()
    prefixes = list(step_prefixes) if step_prefixes is not None else None
    n_steps = min(max_steps, len(prefixes)) if prefixes is not None else max_steps
    steps: list[str] = []
    log: list[StepRecord] = []
    stop_reason = "prefixes" if prefixes is not None else "max_steps"
    for i in range(n_steps):
        prefix = prefixes[i] if prefixes is not None else ""
        c = _call_step(
            sm, question, steps, prefix, _sampling(do_sample, temperature, top_p, seed, question, i, role), cache
        )
        _charge(own, meter, meter_prefix, role, c.cost)
        kv.add(role, c.prompt_ids, c.out.token_ids)
        n = c.out.n_tokens
        is_draft = role == "draft"
        log.append(
            StepRecord(
                i,
                role,
                c.out.text,
                None,
                None,
                True if is_draft else None,
                c.out.text if is_draft else None,
                n if is_draft else 0,
                0 if is_draft else n,
                prefix,
            )
        )
        if prefixes is not None or c.out.text:
            steps.append(c.out.text)
        if prefixes is None and c.out.finished:
            stop_reason = "eos"
            break
        if _too_long((sm,), question, steps, max_total_tokens):
            stop_reason = "max_total_tokens"
            break
    models = {role: sm}
    return _finish(steps, log, models.get("draft"), models.get("target"), own, kv, 0, 0, stop_reason)


def _finish(
    steps: list[str],
    log: list[StepRecord],
    draft_sm: StepModel | None,
    target_sm: StepModel | None,
    meter: ComputeMeter,
    kv: _KVCost,
    n_prm: int,
    n_switches: int,
    stop_reason: str,
) -> RSDOutput:
    kept = sum(r.draft_tokens for r in log if r.source == "draft")
    discarded = sum(r.draft_tokens for r in log if r.source == "target")
    delimiter = (draft_sm or target_sm).delimiter
    models = {"draft": draft_sm, "target": target_sm}
    return RSDOutput(
        text=delimiter.join(steps),
        steps=steps,
        log=log,
        num_draft_tokens=kept + discarded,
        num_accepted_draft_tokens=kept,
        num_discarded_draft_tokens=discarded,
        num_target_tokens=sum(r.target_tokens for r in log),
        acceptance_rate=kept / (kept + discarded) if kept + discarded else 0.0,
        n_prm_calls=n_prm,
        n_switches=n_switches,
        stop_reason=stop_reason,
        meter=meter,
        kv_tokens=dict(kv.tokens),
        kv_flops={r: 2.0 * _flop_params(models[r]) * n for r, n in kv.tokens.items()},
    )
