"""Invariants of Speculative Search on the tiny random models (same byte tokenizer)."""

from __future__ import annotations

import copy
import hashlib
import math

import pytest
import torch

from lmlab.core.inference.compute import ComputeMeter
from lmlab.core.inference.generation import decode
from lmlab.methods.decoding.spec_search import (
    SpeculativeThoughtModel,
    ThoughtModel,
    beam_search,
    ema_update,
    select_top,
    spec_search,
    speculative_decode,
)
from lmlab.methods.decoding.spec_search.search import Path, aggregate_scores

QUESTION = "Countries: Aa, Bb, Cc"
PREFIXES = ["Aa:", "Bb:", "Cc:"]


class HashPRM:
    """A deterministic PRM: each step's score is a hash of its text, in [0, 1)."""

    def __init__(self) -> None:
        self.calls = 0
        self.steps_scored = 0
        self.flops = 0.0
        self.seen: list[tuple[str, ...]] = []

    @staticmethod
    def value(step: str) -> float:
        return int(hashlib.sha256(step.encode()).hexdigest()[:8], 16) / 16**8

    def score(self, question, steps):
        self.calls += 1
        self.steps_scored += len(steps)
        self.seen.append(tuple(steps))
        return [self.value(s) for s in steps]


def _models(small_model, large_model, tok, meter=None, **kw):
    small = ThoughtModel(small_model, tok, name="small", fmt="fewshot", max_step_tokens=5, meter=meter, **kw)
    large = ThoughtModel(large_model, tok, name="large", fmt="fewshot", max_step_tokens=5, meter=meter, **kw)
    return small, large


@pytest.fixture(scope="module")
def tiny_llama_b():
    """A second tiny llama (other seed) sharing the byte tokenizer: a same-vocabulary 'small' model."""
    from lmlab.core.inference.tiny import make_tiny_llama

    return make_tiny_llama(seed=1)


def test_ema_update_arithmetic():
    assert ema_update(0.2, [1.0], 0.9) == pytest.approx(0.9 * 0.2 + 0.1 * 1.0)
    assert ema_update(0.5, [1.0, 0.0, 0.2], 0.8) == pytest.approx(0.8 * 0.5 + 0.2 * 0.4)
    assert ema_update(0.5, [1.0, 0.0, 0.2], 0.8, "max") == pytest.approx(0.8 * 0.5 + 0.2 * 1.0)
    assert ema_update(0.37, [], 0.9) == 0.37  # no large-model thought at this step: keep beta
    assert ema_update(0.3, [0.9], 1.0) == 0.3 and ema_update(0.3, [0.9], 0.0) == pytest.approx(0.9)
    with pytest.raises(ValueError, match="estimator"):
        ema_update(0.3, [0.9], 0.9, "median")


def test_select_top_keeps_the_best_by_prm_value():
    paths = [Path(("a",), (0.2,)), Path(("b",), (0.9,)), Path(("c",), (0.5,)), Path(("d",), (0.9,))]
    assert [p.steps for p in select_top(paths, 2)] == [("b",), ("d",)]  # ties keep the earlier path
    two = [Path(("a", "x"), (1.0, 0.0)), Path(("b", "y"), (0.4, 0.4))]
    assert select_top(two, 1, "mean")[0].steps == ("a", "x")
    assert select_top(two, 1, "min")[0].steps == ("b", "y")
    assert select_top(two, 1, "last")[0].steps == ("b", "y")
    assert aggregate_scores([0.5, 0.5], "prod") == 0.25
    with pytest.raises(ValueError, match="aggregate"):
        aggregate_scores([0.5], "sum")


def test_beam_keeps_the_top_b_children_by_prm(tiny_llama, tiny_tokenizer):
    prm = HashPRM()
    _, large = _models(tiny_llama, tiny_llama, tiny_tokenizer)
    res = beam_search(QUESTION, large, prm, n=3, beam_width=2, step_prefixes=PREFIXES, seed=0)
    last = [s for s in prm.seen if len(s) == len(PREFIXES)]
    assert len(last) == 2 * 3  # B kept (distinct) paths x N thoughts at the last depth
    value = {s: sum(map(HashPRM.value, s)) / len(s) for s in last}
    best = sorted(value, key=lambda s: -value[s])[:2]
    assert [tuple(p.steps) for p in res.beams] == best
    assert res.steps == list(best[0]) and res.value == pytest.approx(value[best[0]])
    assert res.provenance == ["large"] * 3


def test_threshold_minus_inf_accepts_every_draft_and_never_calls_the_large_model(
    tiny_llama, tiny_gemma, tiny_tokenizer
):
    meter = ComputeMeter()
    small, large = _models(tiny_gemma, tiny_llama, tiny_tokenizer, meter)
    res = spec_search(QUESTION, small, large, HashPRM(), n=3, step_prefixes=PREFIXES, threshold=-math.inf)
    assert res.acceptance_rate == 1.0 and res.n_large_thoughts == 0
    assert res.provenance == ["draft"] * 3
    assert "large" not in meter.models and res.cost["large"]["calls"] == 0
    # with every draft accepted SpecSearch is exactly small-only beam search (same thought seeds)
    alone = beam_search(QUESTION, small, HashPRM(), n=3, step_prefixes=PREFIXES)
    assert res.steps == alone.steps and res.value == alone.value


def test_threshold_plus_inf_makes_the_large_model_write_every_step(tiny_llama, tiny_gemma, tiny_tokenizer):
    small, large = _models(tiny_gemma, tiny_llama, tiny_tokenizer, ComputeMeter())
    res = spec_search(QUESTION, small, large, HashPRM(), n=3, step_prefixes=PREFIXES, threshold=math.inf)
    assert res.acceptance_rate == 0.0 and res.n_accepted == 0
    assert set(res.provenance) == {"correction"}
    assert all(d.n_corrections == d.n_drafts for d in res.depths)  # one correction per rejected draft
    alone = beam_search(QUESTION, large, HashPRM(), n=3, step_prefixes=PREFIXES)
    assert res.steps == alone.steps  # the corrections are the large model's own samples


def test_rejection_rule_and_ema_thresholds(tiny_llama, tiny_gemma, tiny_tokenizer):
    small, large = _models(tiny_gemma, tiny_llama, tiny_tokenizer)
    theta = 0.7
    res = spec_search(QUESTION, small, large, HashPRM(), n=3, step_prefixes=PREFIXES, theta=theta)
    root = res.depths[0]
    # default cold start: one large-model thought gives beta_0; the root's other thoughts are drafted and gated
    assert root.n_cold_start == 1 and root.n_drafts == 3
    assert res.thresholds[0] == pytest.approx(root.large_scores[0])
    assert root.n_accepted == sum(v >= root.threshold for v in root.draft_scores)
    for prev, nxt in zip(res.depths, res.depths[1:]):
        assert nxt.threshold == pytest.approx(ema_update(prev.threshold, prev.large_scores, theta))
        # a draft is accepted iff its score reaches the threshold
        assert nxt.n_accepted == sum(v >= nxt.threshold for v in nxt.draft_scores)
        assert nxt.n_drafts > 0
    assert 0.0 <= res.acceptance_rate <= 1.0
    assert set(res.provenance) <= {"draft", "correction", "cold_start"}


def test_whole_root_cold_start_is_large_only_at_depth_0(tiny_llama, tiny_gemma, tiny_tokenizer):
    """``n_cold_start=n`` (the old default, now an ablation): the large model writes the whole root, so depth 0 is
    large-only search by construction; the default drafts the root."""
    small, large = _models(tiny_gemma, tiny_llama, tiny_tokenizer)
    res = spec_search(QUESTION, small, large, HashPRM(), n=3, step_prefixes=PREFIXES[:1], n_cold_start=3)
    root = res.depths[0]
    assert root.n_cold_start == 3 and root.n_drafts == 0 and res.provenance == ["cold_start"]
    assert res.thresholds[0] == pytest.approx(sum(root.large_scores) / 3)
    alone = beam_search(QUESTION, large, HashPRM(), n=3, step_prefixes=PREFIXES[:1])
    assert res.steps == alone.steps
    default = spec_search(QUESTION, small, large, HashPRM(), n=3, step_prefixes=PREFIXES[:1])
    assert default.depths[0].n_cold_start == 1 and default.depths[0].n_drafts == 3


def test_config_defaults_to_one_cold_start_thought():
    from lmlab.methods.decoding.spec_search.config import SpecSearchConfig

    assert SpecSearchConfig().n_cold_start == 1


def test_fixed_threshold_has_no_cold_start(tiny_llama, tiny_gemma, tiny_tokenizer):
    small, large = _models(tiny_gemma, tiny_llama, tiny_tokenizer)
    res = spec_search(QUESTION, small, large, HashPRM(), n=3, step_prefixes=PREFIXES, threshold=0.5)
    assert res.thresholds == [0.5, 0.5, 0.5] and res.depths[0].n_cold_start == 0
    for d in res.depths:
        assert d.n_accepted == sum(v >= 0.5 for v in d.draft_scores)
        assert d.n_corrections == d.n_drafts - d.n_accepted  # n drafts per node: one correction per rejection


def test_batched_thoughts_equal_single_thoughts_and_the_prefix_cache_changes_nothing(tiny_llama, tiny_tokenizer):
    cached = ThoughtModel(tiny_llama, tiny_tokenizer, name="a", fmt="fewshot", max_step_tokens=6, meter=ComputeMeter())
    plain = ThoughtModel(
        tiny_llama,
        tiny_tokenizer,
        name="b",
        fmt="fewshot",
        max_step_tokens=6,
        prefix_cache=False,
        meter=ComputeMeter(),
    )
    seeds = [11, 12, 13, 14]
    batch = cached.sample(QUESTION, ["Aa: x"], seeds, temperature=0.9, step_prefix="Bb:")
    singles = [plain.sample(QUESTION, ["Aa: x"], [s], temperature=0.9, step_prefix="Bb:")[0] for s in seeds]
    assert [o.token_ids for o in batch] == [o.token_ids for o in singles]
    again = cached.sample(QUESTION, ["Aa: x"], seeds, temperature=0.9, step_prefix="Bb:")
    assert [o.text for o in again] == [o.text for o in batch]
    # the second call found its whole prompt cached: it prefilled (almost) nothing
    assert cached.meter.models["a"].prefill_tokens < plain.meter.models["b"].prefill_tokens / 2


@pytest.mark.parametrize("gamma", [1, 3])
def test_speculative_verification_reproduces_the_target_greedy_output(tiny_llama, tiny_llama_b, tiny_tokenizer, gamma):
    target = ThoughtModel(tiny_llama, tiny_tokenizer, name="t", max_step_tokens=24, prefix_cache=False)
    noisy = copy.deepcopy(tiny_llama)  # a drafter that agrees with the target on some tokens, not all
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(0)))
    rates = []
    for draft_model in (tiny_llama, noisy, tiny_llama_b):
        draft = ThoughtModel(draft_model, tiny_tokenizer, name="d", max_step_tokens=24, prefix_cache=False)
        for prompt in ("The quick brown fox", "Once upon a time,"):
            ids = tiny_tokenizer(prompt)["input_ids"]
            greedy = decode(tiny_llama, tiny_tokenizer, ids, max_new_tokens=20, eos_token_id=[])
            out = speculative_decode(target, draft, ids, max_new_tokens=20, gamma=gamma, temperature=0.0)
            assert out.token_ids == greedy.token_ids
            rates.append(out.acceptance_rate)
    assert rates[0] == 1.0 and min(rates) < 1.0  # self-drafting accepts everything; the others do not


def test_speculative_sampling_with_the_target_as_drafter_accepts_everything(tiny_llama, tiny_tokenizer):
    target = ThoughtModel(tiny_llama, tiny_tokenizer, name="t", max_step_tokens=24, prefix_cache=False)
    ids = tiny_tokenizer("Hello")["input_ids"]
    out = speculative_decode(target, target, ids, max_new_tokens=12, gamma=4, temperature=0.8, seed=3)
    assert out.acceptance_rate == 1.0 and len(out.token_ids) == 12 and out.n_rounds == 3  # 4 drafted + 1 bonus


def test_sd_corrector_is_lossless_for_greedy_thoughts(tiny_llama, tiny_llama_b, tiny_tokenizer):
    small, large = _models(tiny_llama_b, tiny_llama, tiny_tokenizer)
    kw = dict(n=2, step_prefixes=PREFIXES, temperature=0.0)
    sd = spec_search(QUESTION, small, large, HashPRM(), threshold=math.inf, corrector="sd", **kw)
    alone = beam_search(QUESTION, large, HashPRM(), **kw)
    assert sd.steps == alone.steps


def test_sd_corrector_needs_the_same_tokenizer(tiny_llama, tiny_tokenizer):
    class OtherTokenizer:
        def get_vocab(self):
            return {"a": 0}

    large = ThoughtModel(tiny_llama, tiny_tokenizer, name="large", fmt="fewshot")
    other = ThoughtModel(tiny_llama, tiny_tokenizer, name="small", fmt="fewshot")
    other.tokenizer = OtherTokenizer()
    with pytest.raises(ValueError, match="same tokenizer|tokenizer"):
        SpeculativeThoughtModel(large, other)


def test_costs_and_latency_are_reported(tiny_llama, tiny_gemma, tiny_tokenizer):
    meter = ComputeMeter()
    small, large = _models(tiny_gemma, tiny_llama, tiny_tokenizer, meter)
    prm = HashPRM()
    res = spec_search(QUESTION, small, large, prm, n=3, step_prefixes=PREFIXES)
    for role in ("small", "large"):
        c = res.cost[role]
        assert c["forward_calls"] > 0 and c["decode_tokens"] > 0 and c["flops"] > 0
        assert c["flops"] == pytest.approx(2 * c["flop_params"] * (c["prefill_tokens"] + c["decode_tokens"]))
    assert res.cost["prm"]["calls"] == prm.calls and res.cost["prm"]["steps_scored"] == prm.steps_scored
    assert {"draft", "evaluate", "correct", "select", "total"} <= set(res.latency)
    assert res.latency["total"] >= res.latency["draft"] + res.latency["correct"]


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"n": 0}, "n "),
        ({"beam_width": 0}, "beam_width"),
        ({"theta": 1.5}, "theta"),
        ({"threshold": "x"}, "threshold"),
        ({"corrector": "uag"}, "corrector"),
        ({"estimator": "median"}, "estimator"),
        ({"n_cold_start": 0}, "n_cold_start"),
        ({"step_prefixes": []}, "step_prefixes"),
    ],
)
def test_bad_arguments(tiny_llama, tiny_tokenizer, kw, message):
    small, large = _models(tiny_llama, tiny_llama, tiny_tokenizer)
    args = {"step_prefixes": PREFIXES, **kw}
    with pytest.raises(ValueError, match=message):
        spec_search(QUESTION, small, large, HashPRM(), **args)


def test_config_validation():
    from lmlab.methods.decoding.spec_search.config import SpecSearchConfig

    with pytest.raises(ValueError, match="prms"):
        SpecSearchConfig(prms=["gold"])
    with pytest.raises(ValueError, match="theta"):
        SpecSearchConfig(theta=2.0)
    with pytest.raises(ValueError, match="n_cold_start"):
        SpecSearchConfig(n=4, n_cold_start=5)


def test_calibration_countries_are_clustered_by_question():
    from lmlab.runner import run_method

    result = run_method("spec_search", preset="smoke", model="tiny-llama", write=False, show_progress=False,
                        raise_errors=True, threads=1, calib_questions=2)  # fmt: skip
    pre = next(c for c in result.claims if c.metric == "calib_step_accuracy")
    assert pre.n == 2 and pre.n_values == 2 * result.config["n_steps"]
    assert result.metric("large_model", "calib_step_accuracy").n == 2
