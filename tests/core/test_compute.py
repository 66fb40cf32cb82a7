"""Compute accounting on tiny models: per-row forward calls, prefill vs decode tokens, FLOPs, hook hygiene."""

from __future__ import annotations

import pytest
import torch

from lmlab.core.inference.compute import ComputeMeter, ModelCost, measure
from lmlab.core.inference.generation import decode, hf_generate
from lmlab.core.inference.models import flop_params
from lmlab.core.inference.scoring import continuation_logprobs

FLOP_PARAMS = 90688  # tiny llama, see tests/core/test_models.py::test_flop_params_hand_count


def _hook_counts(model):
    return [
        (
            len(m._forward_hooks),
            len(m._forward_pre_hooks),
            len(m._forward_hooks_with_kwargs),
            len(m._forward_pre_hooks_with_kwargs),
        )
        for m in model.modules()
    ]


def _forward(model, batch, seq, *, positional=False):
    ids = torch.randint(4, 260, (batch, seq), generator=torch.Generator().manual_seed(batch * 100 + seq))
    with torch.no_grad():
        return model(ids, use_cache=False) if positional else model(input_ids=ids, use_cache=False)


def test_track_counts_rows_batches_tokens_and_flops(tiny_llama):
    assert flop_params(tiny_llama) == FLOP_PARAMS
    meter = ComputeMeter()
    with meter.track(tiny_llama, "target") as m:
        assert m is meter
        _forward(tiny_llama, 3, 5)  # prefill: 3 rows of 5
        _forward(tiny_llama, 2, 1)  # decode step of 2 rows
        _forward(tiny_llama, 1, 7, positional=True)  # input_ids passed positionally
    cost = meter.models["target"]
    assert cost.forward_calls == 3 + 2 + 1
    assert cost.forward_batches == 3
    assert cost.prefill_tokens == 15 + 7
    assert cost.decode_tokens == 2
    assert cost.tokens == 24
    assert cost.flops == 2 * FLOP_PARAMS * 24
    assert cost.wall_s > 0
    assert set(meter.models) == {"target"}
    total = meter.total()
    assert (total.forward_calls, total.tokens, total.flops) == (6, 24, cost.flops)
    d = meter.to_dict()
    assert d["per_model"]["target"]["tokens"] == 24 and d["total"]["forward_batches"] == 3


def test_hooks_are_removed_after_the_context(tiny_llama):
    before = _hook_counts(tiny_llama)
    meter = ComputeMeter()
    with meter.track(tiny_llama, "a"):
        assert _hook_counts(tiny_llama) != before
        _forward(tiny_llama, 1, 4)
    assert _hook_counts(tiny_llama) == before
    _forward(tiny_llama, 1, 4)  # not counted any more
    assert meter.models["a"].forward_batches == 1
    # also when the block raises
    with pytest.raises(RuntimeError, match="boom"), meter.track(tiny_llama, "a"):
        _forward(tiny_llama, 1, 4)
        raise RuntimeError("boom")
    assert _hook_counts(tiny_llama) == before
    assert meter.models["a"].forward_batches == 2


def test_two_models_and_default_label(tiny_llama, tiny_gemma):
    meter = ComputeMeter()
    with meter.track(tiny_llama), meter.track(tiny_gemma, "draft"):
        _forward(tiny_llama, 2, 3)
        _forward(tiny_gemma, 1, 1)
        _forward(tiny_gemma, 1, 1)
    assert set(meter.models) == {"LlamaForCausalLM", "draft"}
    assert meter.models["LlamaForCausalLM"].prefill_tokens == 6
    draft = meter.models["draft"]
    assert (draft.forward_calls, draft.decode_tokens, draft.prefill_tokens) == (2, 2, 0)
    assert draft.flops == 2 * flop_params(tiny_gemma) * 2
    assert meter.total().forward_calls == 4
    meter.reset()
    assert meter.models == {} and meter.total() == ModelCost()


def test_measure_gives_deltas(tiny_llama):
    meter = ComputeMeter()
    with meter.track(tiny_llama, "m"):
        _forward(tiny_llama, 2, 4)
        with measure(meter) as delta:
            assert delta == {}
            _forward(tiny_llama, 3, 1)
        _forward(tiny_llama, 1, 9)
    assert delta["m"].forward_calls == 3
    assert delta["m"].forward_batches == 1
    assert (delta["m"].decode_tokens, delta["m"].prefill_tokens) == (3, 0)
    assert delta["m"].flops == 2 * FLOP_PARAMS * 3
    assert meter.models["m"].forward_calls == 6
    # a model first seen inside the block appears in the delta with its whole cost
    with measure(meter) as delta2, meter.track(tiny_llama, "new"):
        _forward(tiny_llama, 1, 2)
    assert delta2["new"].prefill_tokens == 2 and delta2["m"] == ModelCost()
    with measure(None) as nothing:
        _forward(tiny_llama, 1, 2)
    assert nothing == {}


def test_cost_arithmetic():
    a = ModelCost(forward_calls=3, forward_batches=1, prefill_tokens=10, decode_tokens=2, flops=5.0, wall_s=1.0)
    b = ModelCost(forward_calls=1, forward_batches=1, prefill_tokens=4, decode_tokens=1, flops=2.0, wall_s=0.5)
    diff = a.minus(b)
    assert diff == ModelCost(2, 0, 6, 1, 3.0, 0.5)
    b.add(diff)
    assert b == a
    meter = ComputeMeter()
    meter.record("x", batch=4, seq=1, flop_params=10)
    meter.record("x", batch=1, seq=6, flop_params=10)
    assert meter.models["x"] == ModelCost(5, 2, 6, 4, 2.0 * 10 * 10, 0.0)


def test_decode_forward_calls_match_the_meter(tiny_llama, tiny_tokenizer):
    from lmlab.core.inference.generation import Rewind

    fired = []

    def rewind_once(state):
        if state.step == 6 and not fired:
            fired.append(1)
            return Rewind(2)
        return None

    meter = ComputeMeter()
    out = decode(
        tiny_llama,
        tiny_tokenizer,
        "Count me",
        max_new_tokens=12,
        meter=meter,
        meter_name="t",
        step_callback=rewind_once,
    )
    cost = meter.models["t"]
    assert out.n_forward_calls == cost.forward_calls == cost.forward_batches == 12 + 2
    assert out.n_forward_tokens == cost.tokens
    assert cost.prefill_tokens == len(out.prompt_ids)  # one prefill; every other feed is one token
    assert cost.decode_tokens == 12 - 1 + 2
    assert cost.flops == 2 * FLOP_PARAMS * cost.tokens
    # a meter that wraps a decode from outside counts the same forwards
    outer = ComputeMeter()
    with outer.track(tiny_llama, "t"):
        again = decode(tiny_llama, tiny_tokenizer, "Count me", max_new_tokens=12)
    assert outer.models["t"].forward_calls == again.n_forward_calls == 12


def test_hf_generate_and_scoring_are_counted(tiny_llama, tiny_tokenizer):
    meter = ComputeMeter()
    outs = hf_generate(tiny_llama, tiny_tokenizer, ["ab", "abcd", "a"], max_new_tokens=5, meter=meter, meter_name="g")
    cost = meter.models["g"]
    assert all(len(o.token_ids) == 5 for o in outs)
    assert cost.forward_batches == 5  # one prefill of the padded batch, then 4 decode steps
    assert cost.forward_calls == 3 * 5
    assert cost.prefill_tokens == 3 * 4  # padding positions are computed, so they count
    assert cost.decode_tokens == 3 * 4
    with meter.track(tiny_llama, "s"):
        continuation_logprobs(tiny_llama, [[1, 70], [1, 70, 71, 72]], [[73], [74, 75]], batch_size=1)
    s = meter.models["s"]
    assert (s.forward_batches, s.forward_calls, s.prefill_tokens) == (2, 2, 3 + 6)
