"""Invariants of Reward-Guided Speculative Decoding on the tiny random llama (draft) and gemma (target)."""

from __future__ import annotations

import math

import pytest

from lmlab.core.inference.compute import ComputeMeter
from lmlab.core.inference.models import flop_params
from lmlab.core.inference.scoring import encode_prompt
from lmlab.core.inference.steps import StepModel
from lmlab.methods.decoding.rsd import (
    ConstantOmega,
    SoftOmega,
    StepCache,
    ThresholdOmega,
    match_soft_scale,
    rsd_generate,
    single_model_generate,
)

QUESTIONS = [
    "Give the capital of each country, one per line.\nCountries: Peru, Chile, Ghana",
    "Give the capital of each country, one per line.\nCountries: Norway, Japan",
]
PREFIXES = ["Peru:", "Chile:", "Ghana:"]


class ScriptedPRM:
    """Returns the next scripted reward for the last step and records what it was asked to score."""

    def __init__(self, rewards):
        self.rewards = list(rewards)
        self.calls: list[tuple[str, list[str]]] = []

    def score(self, question, steps):
        self.calls.append((question, list(steps)))
        reward = self.rewards[(len(self.calls) - 1) % len(self.rewards)]
        return [0.5] * (len(steps) - 1) + [reward]


@pytest.fixture(scope="module")
def pair(tiny_llama, tiny_gemma, tiny_tokenizer):
    kw = dict(fmt="fewshot", delimiter="\n", max_step_tokens=6)
    return StepModel(tiny_llama, tiny_tokenizer, name="d", **kw), StepModel(tiny_gemma, tiny_tokenizer, name="t", **kw)


def _same_cost(a, b):
    assert (a.forward_calls, a.prefill_tokens, a.decode_tokens, a.flops) == (
        b.forward_calls,
        b.prefill_tokens,
        b.decode_tokens,
        b.flops,
    )


@pytest.mark.parametrize("prefixes", [None, PREFIXES])
def test_threshold_zero_is_exactly_draft_only(pair, prefixes):
    draft, target = pair
    for q in QUESTIONS:
        rsd = rsd_generate(
            draft, target, ScriptedPRM([0.0, 0.3]), q, threshold=0.0, max_steps=3, step_prefixes=prefixes
        )
        alone = single_model_generate(draft, q, role="draft", max_steps=3, step_prefixes=prefixes)
        assert rsd.steps == alone.steps and rsd.text == alone.text
        assert rsd.num_draft_tokens == alone.num_draft_tokens > 0
        assert rsd.num_target_tokens == 0 and rsd.num_discarded_draft_tokens == 0
        assert rsd.acceptance_rate == 1.0 and rsd.step_acceptance_rate == 1.0
        assert all(r.source == "draft" for r in rsd.log)
        assert "target" not in rsd.meter.models
        _same_cost(rsd.meter.models["draft"], alone.meter.models["draft"])


@pytest.mark.parametrize("prefixes", [None, PREFIXES])
def test_threshold_above_one_is_exactly_target_only(pair, prefixes):
    draft, target = pair
    for q in QUESTIONS:
        rsd = rsd_generate(
            draft, target, ScriptedPRM([1.0, 0.9]), q, threshold=1.01, max_steps=3, step_prefixes=prefixes
        )
        alone = single_model_generate(target, q, role="target", max_steps=3, step_prefixes=prefixes)
        assert rsd.steps == alone.steps and rsd.text == alone.text
        assert rsd.num_target_tokens == alone.num_target_tokens > 0
        # every draft proposal was generated, scored and discarded
        assert rsd.num_discarded_draft_tokens == rsd.num_draft_tokens > 0 and rsd.acceptance_rate == 0.0
        assert all(r.source == "target" and r.accepted is False for r in rsd.log)
        _same_cost(rsd.meter.models["target"], alone.meter.models["target"])
        assert rsd.target_step_rate == 1.0


def test_acceptance_accounting_and_provenance(pair, tiny_tokenizer):
    draft, target = pair
    q = QUESTIONS[0]
    prm = ScriptedPRM([0.9, 0.1, 0.8, 0.2])
    out = rsd_generate(draft, target, prm, q, threshold=0.5, step_prefixes=PREFIXES + ["Togo:"])
    assert [r.source for r in out.log] == ["draft", "target", "draft", "target"]
    assert [r.reward for r in out.log] == [0.9, 0.1, 0.8, 0.2]
    kept = sum(r.draft_tokens for r in out.log if r.accepted)
    discarded = sum(r.draft_tokens for r in out.log if not r.accepted)
    assert (out.num_accepted_draft_tokens, out.num_discarded_draft_tokens) == (kept, discarded)
    assert out.num_draft_tokens == kept + discarded
    assert out.acceptance_rate == pytest.approx(kept / (kept + discarded))
    assert out.step_acceptance_rate == 0.5 and out.target_step_rate == 0.5
    assert out.num_target_tokens == sum(r.target_tokens for r in out.log)
    assert out.n_prm_calls == 4 and out.n_switches == 3  # d, d->t, t->d, d, d->t
    steps_before: list[str] = []
    for rec, (question, scored) in zip(out.log, prm.calls):
        # the PRM saw the whole prefix with the draft step appended; target steps were never re-scored
        assert question == q and scored == [*steps_before, rec.draft_text]
        assert rec.text == (rec.draft_text if rec.source == "draft" else rec.text)
        assert (rec.target_tokens == 0) == (rec.source == "draft")
        assert rec.text.startswith(rec.step_prefix.rstrip(":"))
        steps_before.append(rec.text)
    assert out.steps == steps_before and len(prm.calls) == len(out.log)


def test_meter_counts_every_forward_and_prefill(pair, tiny_llama, tiny_gemma, tiny_tokenizer):
    draft, target = pair
    q = QUESTIONS[1]
    external = ComputeMeter()
    out = rsd_generate(
        draft,
        target,
        ScriptedPRM([0.9, 0.1, 0.2]),
        q,
        threshold=0.5,
        step_prefixes=PREFIXES,
        meter=external,
        meter_prefix="sys/",
        prm_flop_params=1000,
    )
    d, t, p = (out.meter.models[k] for k in ("draft", "target", "prm"))
    # one forward per generated token (the prefill yields the first), discarded draft tokens included
    assert d.forward_calls == out.num_draft_tokens and t.forward_calls == out.num_target_tokens
    # each call re-prefills its whole prompt: the question in the model's format plus the steps so far
    steps_before: list[str] = []
    prefill = {"draft": 0, "target": 0}
    for rec in out.log:
        prefill["draft"] += len(encode_prompt(tiny_tokenizer, draft.render(q, steps_before, rec.step_prefix)))
        if rec.source == "target":
            prefill["target"] += len(encode_prompt(tiny_tokenizer, target.render(q, steps_before, rec.step_prefix)))
        steps_before.append(rec.text)
    assert (d.prefill_tokens, t.prefill_tokens) == (prefill["draft"], prefill["target"])
    assert d.flops == 2.0 * flop_params(tiny_llama) * d.tokens and t.flops == 2.0 * flop_params(tiny_gemma) * t.tokens
    assert p.forward_calls == out.n_prm_calls == 3 and p.flops == 2.0 * 1000 * p.prefill_tokens > 0
    for role in ("draft", "target", "prm"):
        _same_cost(external.models[f"sys/{role}"], out.meter.models[role])
    # a per-model KV cache never needs more than the as-run re-prefill, and less once a model is called twice
    assert out.kv_tokens["draft"] < d.tokens and out.kv_tokens["target"] <= t.tokens


def test_step_cache_changes_no_output_and_no_cost(pair):
    draft, target = pair
    cache = StepCache()
    kw = dict(threshold=0.5, step_prefixes=PREFIXES)
    plain = rsd_generate(draft, target, ScriptedPRM([0.9, 0.1, 0.2]), QUESTIONS[0], **kw)
    first = rsd_generate(draft, target, ScriptedPRM([0.9, 0.1, 0.2]), QUESTIONS[0], cache=cache, **kw)
    again = rsd_generate(draft, target, ScriptedPRM([0.9, 0.1, 0.2]), QUESTIONS[0], cache=cache, **kw)
    assert cache.misses == 5 and cache.hits == 5  # 3 draft + 2 target calls, all reused the second time
    for out in (first, again):
        assert out.steps == plain.steps and out.kv_tokens == plain.kv_tokens
        for role in ("draft", "target"):
            _same_cost(out.meter.models[role], plain.meter.models[role])


def test_omega_rules_and_matched_scale():
    assert ThresholdOmega(0.7)(0.7) == 1.0 and ThresholdOmega(0.7)(0.6999) == 0.0
    assert SoftOmega(2.0)(0.3) == pytest.approx(0.6) and SoftOmega(2.0)(0.8) == 1.0
    assert ConstantOmega(0.25)(0.99) == 0.25
    rewards = [0.0, 0.2, 0.4, 1.0]
    c = match_soft_scale(rewards, 0.5)
    assert sum(min(1.0, c * r) for r in rewards) / 4 == pytest.approx(0.5, abs=1e-6)
    assert match_soft_scale(rewards, 0.0) == 0.0
    assert match_soft_scale(rewards, 0.8) == math.inf  # one reward in four is 0: at most 3/4 can be kept
    for bad in (
        lambda: ThresholdOmega(math.nan),
        lambda: SoftOmega(-1.0),
        lambda: ConstantOmega(1.5),
        lambda: match_soft_scale(rewards, 2.0),
        lambda: match_soft_scale([], 0.5),
    ):
        with pytest.raises(ValueError):
            bad()


def test_stochastic_rules_are_seeded_and_share_random_numbers(pair):
    draft, target = pair
    kw = dict(step_prefixes=PREFIXES, cache=StepCache())
    a = rsd_generate(draft, target, ScriptedPRM([0.5]), QUESTIONS[0], omega=ConstantOmega(0.5), seed=3, **kw)
    b = rsd_generate(draft, target, ScriptedPRM([0.5]), QUESTIONS[0], omega=ConstantOmega(0.5), seed=3, **kw)
    assert [r.accepted for r in a.log] == [r.accepted for r in b.log]
    # omega = r at r = 0.5 draws the same uniforms as the constant 0.5 rule: same decisions
    c = rsd_generate(draft, target, ScriptedPRM([0.5]), QUESTIONS[0], omega=SoftOmega(1.0), seed=3, **kw)
    assert [r.accepted for r in c.log] == [r.accepted for r in a.log]
    decisions = {
        tuple(
            r.accepted
            for r in rsd_generate(
                draft, target, ScriptedPRM([0.5]), QUESTIONS[0], omega=ConstantOmega(0.5), seed=s, **kw
            ).log
        )
        for s in range(6)
    }
    assert len(decisions) > 1


def test_generation_stops_at_max_steps_and_total_tokens(pair):
    draft, target = pair
    out = rsd_generate(draft, target, ScriptedPRM([0.9]), QUESTIONS[0], max_steps=2, step_prefixes=PREFIXES)
    assert len(out.steps) == 2 and out.stop_reason == "prefixes"
    short = rsd_generate(draft, target, ScriptedPRM([0.9]), QUESTIONS[0], step_prefixes=PREFIXES, max_total_tokens=5)
    assert len(short.steps) == 1 and short.stop_reason == "max_total_tokens"


def test_model_pairs_are_wrapped(tiny_llama, tiny_gemma, tiny_tokenizer):
    out = rsd_generate(
        (tiny_llama, tiny_tokenizer),
        (tiny_gemma, tiny_tokenizer),
        ScriptedPRM([0.9, 0.1]),
        QUESTIONS[1],
        delimiter="\n",
        max_steps=2,
        max_step_tokens=4,
    )
    assert len(out.log) >= 1 and out.num_draft_tokens > 0


def test_bad_arguments(pair):
    draft, target = pair
    prm = ScriptedPRM([0.5])
    cases = [
        (dict(threshold=math.nan), "threshold"),
        (dict(max_steps=0), "max_steps"),
        (dict(omega=lambda r: 2.0), "probability"),
    ]
    for kw, message in cases:
        with pytest.raises(ValueError, match=message):
            rsd_generate(draft, target, prm, QUESTIONS[0], **kw)
    with pytest.raises(ValueError, match="draft"):
        rsd_generate("not a model", target, prm, QUESTIONS[0])
    with pytest.raises(ValueError, match="prm"):
        rsd_generate(draft, target, object(), QUESTIONS[0])
    other = StepModel(target.model, target.tokenizer, name="t2", fmt="fewshot", delimiter="\n\n")
    with pytest.raises(ValueError, match="delimiter"):
        rsd_generate(draft, other, prm, QUESTIONS[0])
    with pytest.raises(ValueError, match="role"):
        single_model_generate(draft, QUESTIONS[0], role="judge")


def test_config_validation():
    from lmlab.methods.decoding.rsd.config import RSDConfig

    assert RSDConfig().threshold == 0.7 and RSDConfig().delimiter == "\n"
    for kw, message in [
        ({"prms": ["gpt4"]}, "prms"),
        ({"thresholds": [-0.1]}, "thresholds"),
        ({"prm": "oracle", "prms": ["noisy"]}, "prm"),
        ({"prm_eps": 2.0}, "prm_eps"),
        ({"n_questions": 0}, "n_questions"),
        ({"draft_format": "xml"}, "draft_format"),
    ]:
        with pytest.raises(ValueError, match=message):
            RSDConfig(**kw)


def test_per_step_metrics_are_clustered_by_question():
    """Calibration step accuracy (the precondition) and the PRM's draft-step classification have one value per step:
    the steps of a question are one cluster, so n counts questions."""
    from lmlab.runner import run_method

    result = run_method("rsd", preset="smoke", model="tiny-llama", write=False, show_progress=False,
                        raise_errors=True, threads=1)  # fmt: skip
    pre = next(c for c in result.claims if c.metric == "calib_step_accuracy")
    n_questions = result.meta_info["data"]["capital_steps/dev"]["n"]
    n_countries = result.config["n_countries"]
    assert pre.n == n_questions and pre.n_values == n_questions * n_countries
    row = next(m for m in result.metrics if m.metric == "draft_step_classification_accuracy")
    assert row.n == result.meta_info["data"]["capital_steps/test"]["n"]  # every question drafts its steps
