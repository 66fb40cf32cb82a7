"""Invariants of Reflection-Window decoding on the tiny random llama."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lmlab.core.inference.compute import ComputeMeter
from lmlab.core.inference.generation import decode, forward_tokens, new_cache
from lmlab.methods.decoding.reflection_window import beam_refine_span, reflection_window_generate, should_pause

PROMPTS = ["The quick brown fox", "Once upon a time,", "In 1905, Einstein"]


def teacher_forced(model, prompt_ids, tokens):
    """Raw log-prob and entropy of each token given everything before it (one full forward, no cache)."""
    ids = torch.tensor([list(prompt_ids) + list(tokens)])
    with torch.no_grad():
        lp = F.log_softmax(model(ids).logits[0].float(), -1)
    start = len(prompt_ids) - 1
    rows = lp[start : start + len(tokens)]
    token_lp = rows.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)
    entropy = -(rows.exp() * rows).sum(-1)
    return token_lp, entropy


def test_pause_rules():
    assert should_pause([0.6, 0.7, 0.8, 0.9], 0.5, "all")
    assert not should_pause([0.6, 0.4, 0.8, 0.9], 0.5, "all")
    assert should_pause([0.1, 0.1, 0.1, 0.9], 0.5, "any")
    assert not should_pause([0.1, 0.1, 0.1, 0.2], 0.5, "any")
    assert should_pause([0.1, 0.1, 0.1, 1.9], 0.5, "mean")  # mean 0.55
    assert not should_pause([0.9, 0.9, 0.9, 0.1], 0.5, "current")
    assert not should_pause([], 0.5, "all")
    with pytest.raises(ValueError, match="rule"):
        should_pause([1.0], 0.5, "sometimes")


def test_infinite_sigma_is_exactly_greedy(tiny_llama, tiny_tokenizer):
    for prompt in PROMPTS:
        greedy = decode(tiny_llama, tiny_tokenizer, prompt, max_new_tokens=20)
        rw = reflection_window_generate(tiny_llama, tiny_tokenizer, prompt, max_new_tokens=20, sigma=1e9)
        assert rw.token_ids == greedy.token_ids
        assert rw.n_pauses == 0 and rw.n_regenerated_tokens == 0
        assert rw.n_forward_calls == greedy.n_forward_calls


@pytest.mark.parametrize("rule", ["all", "mean", "current"])
def test_refinements_never_lower_the_window_and_the_cache_is_never_stale(tiny_llama, tiny_tokenizer, rule):
    outs = reflection_window_generate(tiny_llama, tiny_tokenizer, PROMPTS, max_new_tokens=24, sigma=0.5, rule=rule)
    assert sum(o.n_pauses for o in outs) > 0, "sigma=0.5 should pause on the tiny model"
    for out in outs:
        token_lp, entropy = teacher_forced(tiny_llama, out.prompt_ids, out.token_ids)
        # every recorded value (refined spans included) is what the model gives the final sequence
        assert torch.allclose(torch.tensor(out.token_logprobs), token_lp, atol=1e-4)
        assert torch.allclose(torch.tensor(out.entropies), entropy, atol=1e-4)
        previous_end = -math.inf
        for ref in out.refinements:
            assert ref.new_logprob >= ref.old_logprob - 1e-5
            assert ref.position >= previous_end  # cool-down: refined windows never overlap
            previous_end = ref.position + len(ref.new_tokens)
        assert out.n_regenerated_tokens == 4 * out.n_pauses


def test_refined_span_scores_match_teacher_forcing(tiny_llama, tiny_tokenizer):
    out = reflection_window_generate(tiny_llama, tiny_tokenizer, PROMPTS[0], max_new_tokens=24, sigma=0.5)
    ref = next(r for r in out.refinements)
    prefix = out.prompt_ids + out.token_ids[: ref.position]
    token_lp, _ = teacher_forced(tiny_llama, prefix, ref.new_tokens)
    assert abs(float(token_lp.sum()) - ref.new_logprob) < 1e-4


def _prefix_state(model, prefix):
    cache = new_cache(model)
    logits = forward_tokens(model, prefix, cache)
    return cache, F.log_softmax(logits, -1)


def test_beam_with_full_width_finds_the_exact_optimum(tiny_llama, tiny_tokenizer):
    prefix = tiny_tokenizer("Hello there")["input_ids"]
    vocab = tiny_llama.config.vocab_size
    cache, first = _prefix_state(tiny_llama, prefix)
    result = beam_refine_span(tiny_llama, cache, first, length=2, beam_width=vocab, eos_ids=set(), allow_eos=True)
    # brute force over all vocab^2 spans: log p(a) + log p(b | a)
    ids = torch.tensor([prefix + [a] for a in range(vocab)])
    with torch.no_grad():
        second = F.log_softmax(tiny_llama(ids).logits[:, -1].float(), -1)  # (vocab, vocab)
    joint = first[:, None] + second
    best = int(joint.argmax())
    assert result.best.tokens == [best // vocab, best % vocab]
    assert abs(result.best.score - float(joint.max())) < 1e-4


def test_beam_width_one_is_the_greedy_span(tiny_llama, tiny_tokenizer):
    prefix = tiny_tokenizer("Once upon")["input_ids"]
    cache, first = _prefix_state(tiny_llama, prefix)
    result = beam_refine_span(tiny_llama, cache, first, length=4, beam_width=1, eos_ids=set())
    greedy = decode(tiny_llama, tiny_tokenizer, prefix, max_new_tokens=4, eos_token_id=[])
    assert result.best.tokens == greedy.token_ids


def test_original_span_is_kept_as_a_candidate(tiny_llama, tiny_tokenizer):
    from lmlab.methods.decoding.reflection_window.method import SpanCandidate

    prefix = tiny_tokenizer("Once upon")["input_ids"]
    cache, first = _prefix_state(tiny_llama, prefix)
    impossible = SpanCandidate([5, 6, 7], 1e9, [0.0] * 3, [0.0] * 3)  # scores above anything a beam can reach
    result = beam_refine_span(tiny_llama, cache, first, length=3, beam_width=2, eos_ids=set(), original=impossible)
    assert result.best is impossible


def test_eos_is_masked_inside_refined_spans(tiny_llama, tiny_tokenizer):
    prefix = tiny_tokenizer("Once upon")["input_ids"]
    cache, first = _prefix_state(tiny_llama, prefix)
    favourite = int(first.argmax())
    result = beam_refine_span(tiny_llama, cache, first, length=3, beam_width=3, eos_ids={favourite})
    assert favourite not in result.best.tokens and len(result.best.tokens) == 3


def test_forward_calls_match_the_meter(tiny_llama, tiny_tokenizer):
    meter = ComputeMeter()
    out = reflection_window_generate(tiny_llama, tiny_tokenizer, PROMPTS[1], max_new_tokens=24, sigma=0.5,
                                     meter=meter, meter_name="rw")  # fmt: skip
    assert out.n_pauses > 0
    assert meter.models["rw"].forward_calls == out.n_forward_calls
    assert meter.models["rw"].tokens == out.n_forward_tokens


def test_sampling_base_rule_is_seeded(tiny_llama, tiny_tokenizer):
    kw = dict(max_new_tokens=16, sigma=0.5, do_sample=True, top_p=0.9)
    a = reflection_window_generate(tiny_llama, tiny_tokenizer, PROMPTS[2], seed=1, **kw)
    b = reflection_window_generate(tiny_llama, tiny_tokenizer, PROMPTS[2], seed=1, **kw)
    assert a.token_ids == b.token_ids


def test_works_on_gemma_with_sliding_window(tiny_gemma, tiny_tokenizer):
    # the tiny gemma's sliding window is 16 tokens: refinements past it must rebuild the prefix, not read stale KV
    prompt = "A long enough prompt to pass the window"
    out = reflection_window_generate(tiny_gemma, tiny_tokenizer, prompt, max_new_tokens=20, sigma=0.0, rule="any")
    assert out.n_pauses > 0
    token_lp, _ = teacher_forced(tiny_gemma, out.prompt_ids, out.token_ids)
    assert torch.allclose(torch.tensor(out.token_logprobs), token_lp, atol=1e-4)


@pytest.mark.parametrize("kw, message", [({"sigma": -1}, "sigma"), ({"window": 0}, "window"),
                                          ({"beam_width": 0}, "beam_width"), ({"rule": "x"}, "rule")])  # fmt: skip
def test_bad_arguments(tiny_llama, tiny_tokenizer, kw, message):
    with pytest.raises(ValueError, match=message):
        reflection_window_generate(tiny_llama, tiny_tokenizer, "hi", **kw)
