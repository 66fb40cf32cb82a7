"""The decode loop against `model.generate` and teacher forcing on tiny models: exact tokens, traces, rewinds."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lmlab.core.inference.generation import (
    DecodeState,
    Replace,
    Rewind,
    Stop,
    decode,
    decode_many,
    entropy_from_logprobs,
    filter_logits,
    forward_tokens,
    hf_generate,
)

EOS = 2
PROMPTS = ["Hello world", "The quick brown fox", "x"]
LONG_PROMPT = "A prompt longer than the sliding window"  # 39 tokens > 16


def no_repeat(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Ban the last 4 tokens: the random tiny gemma otherwise repeats one token forever, whatever the context."""
    scores = scores.clone()
    for row in range(ids.shape[0]):
        scores[row, ids[row, -4:]] = float("-inf")
    return scores


@pytest.fixture(params=["llama", "gemma3"])
def arch(request):
    return request.param


@pytest.fixture()
def model(arch, tiny_llama, tiny_gemma):
    return tiny_llama if arch == "llama" else tiny_gemma


@pytest.fixture()
def procs(arch):
    return (no_repeat,) if arch == "gemma3" else ()


def teacher_forced(model, prompt_ids, gen_ids):
    """(entropies, token log-probs) of `gen_ids` after `prompt_ids`, from one cache-free forward."""
    ids = list(prompt_ids) + list(gen_ids)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
    lp = F.log_softmax(logits, dim=-1)[len(prompt_ids) - 1 : len(ids) - 1]
    ent = -(lp.exp() * lp).sum(-1)
    tok_lp = lp.gather(-1, torch.tensor(gen_ids)[:, None]).squeeze(-1)
    return ent.tolist(), tok_lp.tolist()


def assert_traces_exact(model, out, *, skip=()):
    ent, lp = teacher_forced(model, out.prompt_ids, out.token_ids)
    assert len(out.entropies) == len(out.token_ids) == len(out.token_logprobs)
    for i in range(len(out.token_ids)):
        if i in skip:
            continue
        assert out.entropies[i] == pytest.approx(ent[i], abs=1e-4), i
        assert out.token_logprobs[i] == pytest.approx(lp[i], abs=1e-4), i


def hf_greedy(model, prompt_ids, max_new_tokens, processors=()):
    from transformers import LogitsProcessorList

    ids = torch.tensor([prompt_ids])
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        logits_processor=LogitsProcessorList(processors),
    )
    return out[0, len(prompt_ids) :].tolist()


def once_at(step, action):
    """A callback that returns `action` the first time the generation reaches `step` tokens, then accepts."""
    fired = []

    def callback(state: DecodeState):
        if not fired and state.step == step:
            fired.append(list(state.ids))
            return action
        return None

    callback.fired = fired
    return callback


# --- greedy decoding ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prompt", PROMPTS + [LONG_PROMPT])
def test_greedy_decode_equals_generate(model, tiny_tokenizer, procs, prompt):
    out = decode(model, tiny_tokenizer, prompt, max_new_tokens=30, logits_processors=procs)
    assert out.prompt_ids == tiny_tokenizer(prompt)["input_ids"]
    assert out.token_ids == hf_greedy(model, out.prompt_ids, 30, procs)
    assert out.n_tokens == 30 and out.stop_reason == "max_new_tokens"
    assert out.n_forward_calls == 30  # one prefill, then one token per step (the last token is never fed)
    assert out.n_forward_tokens == len(out.prompt_ids) + 29
    assert out.text == tiny_tokenizer.decode(out.token_ids, skip_special_tokens=True)
    if procs:
        assert len(set(out.token_ids)) > 5  # the comparison is not trivially a repeated token


def test_greedy_gemma_without_processor_equals_generate(tiny_gemma, tiny_tokenizer):
    out = decode(tiny_gemma, tiny_tokenizer, LONG_PROMPT, max_new_tokens=24)
    assert out.token_ids == hf_greedy(tiny_gemma, out.prompt_ids, 24)


def test_traces_equal_teacher_forcing(model, tiny_tokenizer, procs):
    for prompt in (PROMPTS[0], LONG_PROMPT):
        out = decode(model, tiny_tokenizer, prompt, max_new_tokens=30, logits_processors=procs)
        assert_traces_exact(model, out)
        assert all(0 <= e <= math.log(260) + 1e-4 for e in out.entropies)


def test_prompt_as_ids_and_errors(tiny_llama, tiny_tokenizer):
    ids = tiny_tokenizer(PROMPTS[1])["input_ids"]
    assert decode(tiny_llama, tiny_tokenizer, ids, max_new_tokens=8).token_ids == hf_greedy(tiny_llama, ids, 8)
    with pytest.raises(ValueError, match="prompt is empty"):
        decode(tiny_llama, tiny_tokenizer, [], max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        decode(tiny_llama, tiny_tokenizer, ids, max_new_tokens=-1)


@pytest.mark.parametrize("n", [0, 1, 7])
def test_max_new_tokens_respected(tiny_llama, tiny_tokenizer, n):
    out = decode(tiny_llama, tiny_tokenizer, PROMPTS[0], max_new_tokens=n)
    assert out.n_tokens == n
    assert out.stop_reason == "max_new_tokens"
    assert out.n_forward_calls == n  # nothing is computed for n = 0
    assert out.token_ids == (hf_greedy(tiny_llama, out.prompt_ids, n) if n else [])


def test_hf_generate_batched_equals_unbatched(model, tiny_tokenizer):
    prompts = PROMPTS + [LONG_PROMPT]
    batched = hf_generate(model, tiny_tokenizer, prompts, max_new_tokens=20, batch_size=4)
    for prompt, b in zip(prompts, batched):
        alone = hf_generate(model, tiny_tokenizer, [prompt], max_new_tokens=20)[0]
        assert b.prompt_ids == alone.prompt_ids == tiny_tokenizer(prompt)["input_ids"]
        assert b.token_ids == alone.token_ids
        assert b.token_ids == decode(model, tiny_tokenizer, prompt, max_new_tokens=20).token_ids
        assert b.text == tiny_tokenizer.decode(b.token_ids, skip_special_tokens=True)
    # two batches of two: the same again
    pairs = hf_generate(model, tiny_tokenizer, prompts, max_new_tokens=20, batch_size=2)
    assert [p.token_ids for p in pairs] == [b.token_ids for b in batched]


# --- callbacks ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prompt", ["x", PROMPTS[0], LONG_PROMPT])
@pytest.mark.parametrize("step, k", [(6, 3), (10, 10), (12, 1)])
def test_rewind_once_gives_the_same_greedy_sequence(model, tiny_tokenizer, procs, arch, prompt, step, k):
    base = decode(model, tiny_tokenizer, prompt, max_new_tokens=24, logits_processors=procs)
    cb = once_at(step, Rewind(k))
    out = decode(model, tiny_tokenizer, prompt, max_new_tokens=24, logits_processors=procs, step_callback=cb)
    assert cb.fired, "the callback never reached its step"
    assert out.token_ids == base.token_ids
    assert out.stop_reason == "max_new_tokens"
    assert out.n_forward_calls == base.n_forward_calls + k  # the k rewound tokens are chosen again
    assert out.events == [{"type": "rewind", "at": step - k, "removed": k}]
    assert_traces_exact(model, out)
    assert out.entropies == pytest.approx(base.entropies, abs=1e-4)
    P = len(out.prompt_ids)
    cropped_tokens = base.n_forward_tokens + k  # a cropped cache refeeds only the rewound positions
    if arch == "gemma3" and P + step - 1 >= 16:
        # the sliding-window layer holds more than its window and cannot crop: the loop re-prefilled everything
        assert out.n_forward_tokens == cropped_tokens + P + step - k - 1
    else:
        assert out.n_forward_tokens == cropped_tokens


@pytest.mark.parametrize("prompt", ["x", PROMPTS[0], LONG_PROMPT])
@pytest.mark.parametrize("step, n", [(5, 2), (9, 0), (12, 4)])
def test_replace_continues_like_a_fresh_decode(model, tiny_tokenizer, procs, arch, prompt, step, n):
    new = tuple(tiny_tokenizer("XYZ", add_special_tokens=False)["input_ids"])
    M = 26
    cb = once_at(step, Replace(n, new))
    out = decode(model, tiny_tokenizer, prompt, max_new_tokens=M, logits_processors=procs, step_callback=cb)
    assert cb.fired
    before = cb.fired[0][len(out.prompt_ids) :]  # the generated tokens when the callback fired
    prefix = before[: step - n]
    assert out.token_ids[: step - n + len(new)] == prefix + list(new)
    assert out.events == [{"type": "replace", "at": step - n, "removed": n, "added": len(new)}]
    assert out.n_tokens == M
    # the rest is what a fresh greedy decode from prompt + prefix + new gives
    fresh = decode(
        model,
        tiny_tokenizer,
        out.prompt_ids + prefix + list(new),
        max_new_tokens=M - len(prefix) - len(new),
        logits_processors=procs,
    )
    assert out.token_ids[len(prefix) + len(new) :] == fresh.token_ids
    # the replaced tokens have no trace (NaN); every other recorded value is the teacher-forced one
    replaced = range(len(prefix), len(prefix) + len(new))
    assert all(math.isnan(out.token_logprobs[i]) and math.isnan(out.entropies[i]) for i in replaced)
    assert_traces_exact(model, out, skip=set(replaced))
    assert out.token_logprobs[len(prefix) + len(new) :] == pytest.approx(fresh.token_logprobs, abs=1e-4)


def test_replace_with_given_traces_and_eos(tiny_llama, tiny_tokenizer):
    cb = once_at(4, Replace(1, (70, 71), entropies=(0.5, 0.25), logprobs=(-1.0, -2.0)))
    out = decode(tiny_llama, tiny_tokenizer, PROMPTS[0], max_new_tokens=10, step_callback=cb)
    assert out.token_ids[3:5] == [70, 71]
    assert out.entropies[3:5] == [0.5, 0.25] and out.token_logprobs[3:5] == [-1.0, -2.0]
    assert_traces_exact(tiny_llama, out, skip={3, 4})
    # a replacement containing EOS ends the sequence at the EOS
    out = decode(
        tiny_llama, tiny_tokenizer, PROMPTS[0], max_new_tokens=10, step_callback=once_at(4, Replace(2, (70, EOS, 71)))
    )
    assert out.token_ids[-2:] == [70, EOS] and out.n_tokens == 4
    assert out.stop_reason == "eos"
    # a replacement beyond the budget is cut to max_new_tokens
    out = decode(
        tiny_llama, tiny_tokenizer, PROMPTS[0], max_new_tokens=6, step_callback=once_at(5, Replace(0, (70,) * 5))
    )
    assert out.n_tokens == 6 and out.token_ids[-1] == 70
    with pytest.raises(ValueError, match="remove 5 tokens but only 3 exist"):
        decode(tiny_llama, tiny_tokenizer, PROMPTS[0], max_new_tokens=6, step_callback=once_at(3, Rewind(5)))


def test_fork_cache_is_private_and_exact(model, tiny_tokenizer, procs, arch):
    seen = {}

    def callback(state: DecodeState):
        if state.step == 10:
            length = len(state.ids) - 3
            fork, held = state.fork_cache(length)
            assert held <= length
            logits = forward_tokens(model, state.ids[held : length + 1], fork)  # one token past the fork
            seen["fork"] = (held, logits, list(state.ids[: length + 1]))
            # fiddle with the fork: the live cache must not care
            forward_tokens(model, [5, 6, 7], fork)
        return None

    prompt = LONG_PROMPT if arch == "gemma3" else PROMPTS[0]
    base = decode(model, tiny_tokenizer, prompt, max_new_tokens=16, logits_processors=procs)
    out = decode(model, tiny_tokenizer, prompt, max_new_tokens=16, logits_processors=procs, step_callback=callback)
    assert out.token_ids == base.token_ids
    assert_traces_exact(model, out)
    held, logits, prefix = seen["fork"]
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([prefix]), use_cache=False).logits[0, -1]
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)
    if arch == "gemma3":
        assert held == 0  # a sliding layer past its window cannot crop: the fork starts empty
    else:
        assert held == len(prefix) - 1


def test_stop_callback(tiny_llama, tiny_tokenizer):
    base = decode(tiny_llama, tiny_tokenizer, PROMPTS[1], max_new_tokens=20)
    out = decode(tiny_llama, tiny_tokenizer, PROMPTS[1], max_new_tokens=20, step_callback=once_at(5, Stop()))
    assert out.stop_reason == "callback"
    assert out.token_ids == base.token_ids[:5]  # the current token is kept
    assert out.n_forward_calls == 5
    out = decode(tiny_llama, tiny_tokenizer, PROMPTS[1], max_new_tokens=20, step_callback=once_at(3, Stop("mine")))
    assert out.stop_reason == "mine" and out.n_tokens == 3


def test_callback_state(tiny_llama, tiny_tokenizer):
    states = []

    def callback(state: DecodeState):
        states.append((state.step, state.token_id, list(state.generated), state.prompt_len, state.is_eos))
        lp = state.logprobs
        assert lp.shape == (260,)
        assert float(entropy_from_logprobs(lp)) == pytest.approx(state.entropies[-1], abs=1e-6)
        assert float(lp[state.token_id]) == pytest.approx(state.token_logprobs[-1], abs=1e-6)

    out = decode(tiny_llama, tiny_tokenizer, PROMPTS[0], max_new_tokens=6, step_callback=callback)
    P = len(out.prompt_ids)
    assert [s[0] for s in states] == list(range(1, 7))
    assert [s[1] for s in states] == out.token_ids
    assert states[-1][2] == out.token_ids and {s[3] for s in states} == {P}
    assert not any(s[4] for s in states)


# --- stopping -------------------------------------------------------------------------------------------------------


def test_stop_strings_cut_the_text(tiny_llama, tiny_tokenizer):
    # prompt "The": the greedy text starts "ssss\x05" (valid UTF-8), so a stop string inside it is well defined
    base = decode(tiny_llama, tiny_tokenizer, "The", max_new_tokens=20)
    assert base.text.startswith("ssss")
    out = decode(tiny_llama, tiny_tokenizer, "The", max_new_tokens=20, stop_strings=["ss\x05"])
    assert out.stop_reason == "stop_string"
    assert out.text == "ss"  # cut before the stop string
    assert out.token_ids == base.token_ids[:5]  # generation ends on the token completing the stop string
    out = decode(tiny_llama, tiny_tokenizer, "The", max_new_tokens=20, stop_strings=["never there", "sss"])
    assert out.text == "" and out.token_ids == base.token_ids[:3]
    out = decode(tiny_llama, tiny_tokenizer, "The", max_new_tokens=20, stop_strings=["never there"])
    assert out.stop_reason == "max_new_tokens" and out.token_ids == base.token_ids
    hf = hf_generate(tiny_llama, tiny_tokenizer, ["The"], max_new_tokens=20, stop_strings=["ss\x05"])[0]
    assert hf.text == "ss"


def test_eos_forced_at_step_3(tiny_llama, tiny_tokenizer):
    prompt_len = len(tiny_tokenizer(PROMPTS[0])["input_ids"])

    def force_eos(ids, scores):
        if ids.shape[1] == prompt_len + 2:  # choosing the third token
            keep = scores[:, EOS].clone()
            scores = torch.full_like(scores, float("-inf"))
            scores[:, EOS] = keep
        return scores

    base = decode(tiny_llama, tiny_tokenizer, PROMPTS[0], max_new_tokens=10)
    assert EOS not in base.token_ids[:3]
    out = decode(tiny_llama, tiny_tokenizer, PROMPTS[0], max_new_tokens=10, logits_processors=[force_eos])
    assert out.stop_reason == "eos"
    assert out.token_ids == base.token_ids[:2] + [EOS]
    assert out.text == tiny_tokenizer.decode(base.token_ids[:2], skip_special_tokens=True)
    assert out.n_forward_calls == 3
    assert_traces_exact(tiny_llama, out)  # the recorded log-prob of EOS is the raw one, not the forced 0
    assert out.token_logprobs[2] < -1e-3
    # another end token
    other = decode(tiny_llama, tiny_tokenizer, PROMPTS[0], max_new_tokens=10, eos_token_id=[base.token_ids[1], 99])
    assert other.stop_reason == "eos" and other.token_ids == base.token_ids[:2]
    # the callback sees is_eos
    flags = []
    decode(
        tiny_llama,
        tiny_tokenizer,
        PROMPTS[0],
        max_new_tokens=10,
        logits_processors=[force_eos],
        step_callback=lambda s: flags.append(s.is_eos),
    )
    assert flags == [False, False, True]


# --- sampling -------------------------------------------------------------------------------------------------------


def test_sampling_is_seeded(tiny_llama, tiny_tokenizer):
    kw = dict(max_new_tokens=20, do_sample=True)
    rng = torch.random.get_rng_state()
    a = decode(tiny_llama, tiny_tokenizer, PROMPTS[0], seed=1, **kw)
    assert torch.equal(torch.random.get_rng_state(), rng)  # a private generator: the global RNG is untouched
    torch.manual_seed(12345)
    b = decode(tiny_llama, tiny_tokenizer, PROMPTS[0], seed=1, **kw)
    c = decode(tiny_llama, tiny_tokenizer, PROMPTS[0], seed=2, **kw)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids
    greedy = decode(tiny_llama, tiny_tokenizer, PROMPTS[0], max_new_tokens=20)
    assert a.token_ids != greedy.token_ids
    assert_traces_exact(tiny_llama, a)  # traces come from the raw distribution, whatever was sampled
    # top-k 1 sampling is greedy; so is a vanishing nucleus
    assert decode(tiny_llama, tiny_tokenizer, PROMPTS[0], top_k=1, seed=3, **kw).token_ids == greedy.token_ids
    assert decode(tiny_llama, tiny_tokenizer, PROMPTS[0], top_p=1e-6, seed=3, **kw).token_ids == greedy.token_ids
    hot = decode(tiny_llama, tiny_tokenizer, PROMPTS[0], temperature=5.0, seed=1, **kw)
    assert hot.token_ids != a.token_ids
    assert_traces_exact(tiny_llama, hot)  # temperature shapes the choice only


def test_decode_many(tiny_llama, tiny_tokenizer):
    outs = decode_many(tiny_llama, tiny_tokenizer, PROMPTS, max_new_tokens=8)
    assert [o.token_ids for o in outs] == [
        decode(tiny_llama, tiny_tokenizer, p, max_new_tokens=8).token_ids for p in PROMPTS
    ]
    sampled = decode_many(tiny_llama, tiny_tokenizer, [PROMPTS[0]] * 3, max_new_tokens=12, do_sample=True, seed=10)
    for i, o in enumerate(sampled):
        expected = decode(tiny_llama, tiny_tokenizer, PROMPTS[0], max_new_tokens=12, do_sample=True, seed=10 + i)
        assert o.token_ids == expected.token_ids
    assert sampled[0].token_ids != sampled[1].token_ids


# --- filter_logits --------------------------------------------------------------------------------------------------

PROBS = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])  # sorted: 1 (0.4), 3 (0.3), 4 (0.15), 2 (0.1), 0 (0.05)


def _kept(logits):
    return set(torch.nonzero(torch.isfinite(logits)).flatten().tolist())


@pytest.mark.parametrize(
    "k, kept", [(1, {1}), (2, {1, 3}), (4, {1, 3, 4, 2}), (5, {0, 1, 2, 3, 4}), (9, {0, 1, 2, 3, 4})]
)
def test_top_k(k, kept):
    out = filter_logits(PROBS.log(), top_k=k)
    assert _kept(out) == kept
    torch.testing.assert_close(out[list(kept)], PROBS.log()[list(kept)])


@pytest.mark.parametrize(
    "p, kept",
    [
        (0.0, {1}),  # the top token always stays
        (1e-9, {1}),
        (0.39, {1}),
        (0.45, {1, 3}),  # 0.4 < p: the next token is needed to reach p
        (0.69, {1, 3}),
        (0.75, {1, 3, 4}),
        (0.9, {1, 3, 4, 2}),
        (0.99, {0, 1, 2, 3, 4}),
        (1.0, {0, 1, 2, 3, 4}),
    ],
)
def test_top_p_keeps_the_smallest_prefix_reaching_p(p, kept):
    out = filter_logits(PROBS.log(), top_p=p)
    assert _kept(out) == kept
    assert float(PROBS[list(kept)].sum()) >= p
    assert torch.isfinite(out.softmax(-1)).all()


def test_filters_batched_with_temperature():
    logits = torch.stack([PROBS.log(), PROBS.flip(0).log()])  # (2, 5)
    out = filter_logits(logits, top_k=3, top_p=0.6)
    assert _kept(out[0]) == {1, 3}
    assert _kept(out[1]) == {3, 1}  # flipped: indices 4-1 = 3 and 4-3 = 1
    hot = filter_logits(PROBS.log(), temperature=2.0)
    torch.testing.assert_close(hot, PROBS.log() / 2.0)
    # a high temperature flattens the distribution: top-p then needs more tokens
    assert len(_kept(filter_logits(PROBS.log(), temperature=4.0, top_p=0.69))) > 2
    with pytest.raises(ValueError, match="temperature"):
        filter_logits(PROBS.log(), temperature=0.0)
