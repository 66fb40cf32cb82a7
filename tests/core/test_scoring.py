"""Scoring primitives against hand computations on tiny models (exact log-probs, padding invariance, windowing)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lmlab.core.inference.scoring import (
    chat_prompt,
    choice_accuracy,
    choice_logprobs,
    continuation_logprobs,
    encode,
    encode_prompt,
    has_chat_template,
    loglikelihood,
    loglikelihood_rolling,
    perplexity,
    rolling_token_logprobs,
    sequence_logprob,
    split_pair,
    token_logprobs,
)
from lmlab.core.inference.tiny import make_byte_tokenizer

BOS = 1


@pytest.fixture(params=["llama", "gemma3"])
def model(request, tiny_llama, tiny_gemma):
    return tiny_llama if request.param == "llama" else tiny_gemma


def _ids(text: str) -> list[int]:
    """Byte-tokenizer ids of `text` (one id per byte, offset by the 4 specials)."""
    from lmlab.core.inference.tiny import make_byte_tokenizer

    return list(make_byte_tokenizer()(text, add_special_tokens=False)["input_ids"])


def _full_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log_softmax of one unpadded row: (len(ids), vocab), row t predicts token t+1."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    return F.log_softmax(logits.float(), dim=-1)


def _hand_continuation(model, ctx: list[int], cont: list[int]) -> list[float]:
    lp = _full_logprobs(model, ctx + cont)
    return [float(lp[len(ctx) - 1 + j, t]) for j, t in enumerate(cont)]


def _greedy_chain(model, ctx: list[int], n: int) -> list[int]:
    ids = list(ctx)
    for _ in range(n):
        ids.append(int(_full_logprobs(model, ids)[-1].argmax()))
    return ids[len(ctx) :]


PAIRS = [
    ("The cat sat on", " the mat."),
    ("A", "bc"),
    ("Once upon a time, in a land far, far away, there lived", " a very small dragon"),
    ("x", "y"),
    ("Hello", ", world! How are you today?"),
]


# --- continuation_logprobs ------------------------------------------------------------------------------------------


def test_continuation_logprobs_equal_hand_computation(model):
    contexts = [[BOS] + _ids(c) for c, _ in PAIRS]
    conts = [_ids(x) for _, x in PAIRS]
    batched = continuation_logprobs(model, contexts, conts, batch_size=8)
    assert len(batched) == len(PAIRS)
    for (lps, _), ctx, cont in zip(batched, contexts, conts):
        assert len(lps) == len(cont)
        expected = _hand_continuation(model, ctx, cont)
        assert max(abs(a - b) for a, b in zip(lps, expected)) < 1e-5
        assert all(v <= 0 for v in lps)


def test_padding_and_batching_do_not_change_scores(model):
    contexts = [[BOS] + _ids(c) for c, _ in PAIRS]
    conts = [_ids(x) for _, x in PAIRS]
    alone = [continuation_logprobs(model, [c], [x])[0] for c, x in zip(contexts, conts)]
    for batch_size in (2, 3, 8):  # several batch splits, each left-padded differently; order must be restored
        batched = continuation_logprobs(model, contexts, conts, batch_size=batch_size)
        for (lp_b, g_b), (lp_a, g_a) in zip(batched, alone):
            assert len(lp_b) == len(lp_a)
            assert max(abs(a - b) for a, b in zip(lp_b, lp_a)) < 1e-5
            assert g_b == g_a
    # a different pad id is masked out too
    other_pad = continuation_logprobs(model, contexts, conts, pad_id=200)
    for (lp_b, _), (lp_a, _) in zip(other_pad, alone):
        assert max(abs(a - b) for a, b in zip(lp_b, lp_a)) < 1e-5


def test_is_greedy(model):
    ctx = [BOS] + _ids("Greedy chains are")
    chain = _greedy_chain(model, ctx, 6)
    assert continuation_logprobs(model, [ctx], [chain])[0][1] is True
    # first token and last token changed: not greedy
    wrong_last = chain[:-1] + [(chain[-1] + 1) % 256 + 4]
    wrong_first = [(chain[0] + 1) % 256 + 4] + chain[1:]
    # batched with padding next to a longer row, the flags are still per row
    long_ctx = [BOS] + _ids("a much longer context that forces left padding on the other rows")
    out = continuation_logprobs(model, [ctx, ctx, ctx, long_ctx], [chain, wrong_last, wrong_first, _ids("!")])
    assert [g for _, g in out[:3]] == [True, False, False]
    # the greedy prefix of the wrong chains is still greedy token by token
    assert out[1][0][:-1] == pytest.approx(out[0][0][:-1], abs=1e-5)


def test_empty_continuation_and_errors(tiny_llama):
    out = continuation_logprobs(tiny_llama, [[BOS, 70], [BOS, 71, 72]], [[], [73]])
    assert out[0] == ([], True)
    assert len(out[1][0]) == 1
    with pytest.raises(ValueError, match="context 1 is empty"):
        continuation_logprobs(tiny_llama, [[BOS], []], [[70], [71]])
    with pytest.raises(ValueError, match="2 contexts but 1 continuations"):
        continuation_logprobs(tiny_llama, [[BOS], [BOS]], [[70]])


def test_token_logprobs_with_left_padding(tiny_llama):
    rows = [[BOS] + _ids("abcdef"), [BOS] + _ids("xy")]
    ids = torch.tensor([rows[0], [0] * 4 + rows[1]])
    mask = torch.tensor([[1] * 7, [0] * 4 + [1] * 3])
    lp = token_logprobs(tiny_llama, ids, mask)
    assert lp.shape == (2, 6)
    for r, row in enumerate(rows):
        full = _full_logprobs(tiny_llama, row)
        expected = torch.tensor([float(full[t, row[t + 1]]) for t in range(len(row) - 1)])
        got = lp[r, 6 - (len(row) - 1) :]
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    # pad targets, and the first real token (predicted from a pad position: no context), give 0
    assert torch.equal(lp[1, :4], torch.zeros(4))
    assert float(lp[1].sum()) == pytest.approx(float(lp[1, 4:].sum()))
    unpadded = token_logprobs(tiny_llama, torch.tensor([rows[1]]))
    torch.testing.assert_close(lp[1, 4:], unpadded[0], atol=1e-5, rtol=0)


# --- split_pair -----------------------------------------------------------------------------------------------------


def test_split_pair_exact_boundary_without_merges(tiny_tokenizer):
    for context, continuation in PAIRS + [("ends with space ", "x"), ("émoji 🙂", " ünïcode")]:
        ctx, cont = split_pair(tiny_tokenizer, context, continuation)
        assert ctx == encode(tiny_tokenizer, context)
        assert cont == encode(tiny_tokenizer, continuation, add_special_tokens=False)
        assert tiny_tokenizer.decode(cont) == continuation


def _merging_tokenizer():
    """The byte tokenizer plus one BPE merge ``a b -> ab`` (id 260), to make a merge across the boundary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    base = make_byte_tokenizer(chat_template=False)
    vocab = dict(base.get_vocab())
    vocab["ab"] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def test_split_pair_bpe_merge_goes_to_the_continuation():
    tok = _merging_tokenizer()
    ab = tok.convert_tokens_to_ids("ab")
    assert encode(tok, "xab") == [_ids("x")[0], ab]
    ctx, cont = split_pair(tok, "xa", "by")
    assert ctx == _ids("x")  # the context token "a" merged into "ab": it belongs to the continuation
    assert cont == [ab, _ids("y")[0]]
    assert ctx + cont == encode(tok, "xaby")
    assert tok.decode(cont) == "aby"
    # no merge across the boundary: exact split
    assert split_pair(tok, "xb", "ay") == (_ids("xb"), _ids("ay"))


@pytest.mark.slow
@pytest.mark.real_model
def test_split_pair_bpe_merge_smollm2(smollm2):
    _, tok = smollm2
    context, continuation = "The capital of France is Par", "is, a city."
    full = encode(tok, context + continuation)
    ctx, cont = split_pair(tok, context, continuation)
    assert ctx + cont == full
    assert ctx == encode(tok, context)[: len(ctx)]
    assert len(ctx) < len(encode(tok, context))  # "Par" + "is" merged: the boundary moved left
    assert tok.decode(cont).endswith(continuation)
    assert tok.decode(ctx) + tok.decode(cont) == context + continuation


# --- loglikelihood and rolling ------------------------------------------------------------------------------------


def test_loglikelihood_sums(tiny_llama, tiny_tokenizer):
    requests = [(c, x) for c, x in PAIRS]
    out = loglikelihood(tiny_llama, tiny_tokenizer, requests, batch_size=2)
    for (total, greedy), (c, x) in zip(out, requests):
        ctx, cont = split_pair(tiny_tokenizer, c, x)
        assert isinstance(total, float) and isinstance(greedy, bool)
        assert total == pytest.approx(sum(_hand_continuation(tiny_llama, ctx, cont)), abs=1e-4)
    s = sequence_logprob(tiny_llama, tiny_tokenizer, PAIRS[0][0], PAIRS[0][1])
    assert s.n_tokens == len(PAIRS[0][1])
    assert s.total == pytest.approx(out[0][0], abs=1e-5)
    assert s.mean == pytest.approx(s.total / s.n_tokens)
    assert sum(s.per_token) == pytest.approx(s.total)


def test_loglikelihood_greedy_flag(tiny_llama, tiny_tokenizer):
    context = "The"  # its greedy chain is valid UTF-8, so the continuation can be given as text
    chain = _greedy_chain(tiny_llama, _ids(context), 5)
    continuation = tiny_tokenizer.decode(chain)
    assert _ids(continuation) == chain  # the byte tokenizer round-trips
    (lp, greedy), (_, not_greedy) = loglikelihood(
        tiny_llama, tiny_tokenizer, [(context, continuation), (context, "!!")]
    )
    assert greedy is True
    assert _greedy_chain(tiny_llama, _ids(context), 1) != _ids("!")
    assert not_greedy is False
    assert lp == pytest.approx(sum(_hand_continuation(tiny_llama, _ids(context), chain)), abs=1e-4)


TEXT = "Rolling perplexity scores every token of a text exactly once, window after window."


def test_rolling_equals_direct_sum_after_bos(model, tiny_tokenizer):
    ids = [BOS] + _ids(TEXT)
    lp = _full_logprobs(model, ids)
    direct = [float(lp[t, ids[t + 1]]) for t in range(len(ids) - 1)]
    per = rolling_token_logprobs(model, tiny_tokenizer, [TEXT])[0]
    assert len(per) == len(ids) - 1
    assert max(abs(a - b) for a, b in zip(per, direct)) < 1e-5
    (total,) = loglikelihood_rolling(model, tiny_tokenizer, [TEXT])
    assert total == pytest.approx(sum(direct), abs=1e-3)
    # a window that covers the whole text changes nothing
    (covering,) = loglikelihood_rolling(model, tiny_tokenizer, [TEXT], max_length=len(ids) + 5)
    assert covering == pytest.approx(total, abs=1e-3)


@pytest.mark.parametrize("max_length, stride", [(16, 4), (24, 8), (32, None), (9, 8)])
def test_rolling_windows_score_each_token_once_with_its_window(tiny_llama, tiny_tokenizer, max_length, stride):
    ids = [BOS] + _ids(TEXT)
    per = rolling_token_logprobs(tiny_llama, tiny_tokenizer, [TEXT, "ab"], max_length=max_length, stride=stride)
    assert len(per[0]) == len(ids) - 1
    assert len(per[1]) == 2
    # hand windows: the first predicts tokens 1..max_length-1 from BOS; each next one `stride` tokens with the
    # preceding tokens as context, every forward at most max_length long
    stride = stride or max_length // 2
    expected: list[float] = []
    pos = 1
    while pos < len(ids):
        end = min(len(ids), pos + (max_length - 1 if pos == 1 else stride))
        start = max(0, end - max_length)
        window = ids[start:end]
        assert len(window) <= max_length
        lp = _full_logprobs(tiny_llama, window)
        expected += [float(lp[t - start - 1, ids[t]]) for t in range(pos, end)]
        pos = end
    assert len(expected) == len(ids) - 1
    assert max(abs(a - b) for a, b in zip(per[0], expected)) < 1e-5


LONG_TEXT = (
    "The history of the bicycle begins in the early nineteenth century, when inventors in Europe experimented with "
    "two-wheeled machines propelled by the rider's feet. Over the following decades, pedals, chains and pneumatic "
    "tyres turned the bicycle into a practical means of transport, and by the end of the century millions of people "
    "rode them to work, to school and into the countryside."
)


@pytest.mark.slow
@pytest.mark.real_model
def test_rolling_window_close_to_unwindowed_smollm2(smollm2):
    # needs a trained model: a random tiny model has no "enough context" (its scores do not converge with context)
    model, tok = smollm2
    per = rolling_token_logprobs(model, tok, [LONG_TEXT])[0]
    assert len(per) == len(encode(tok, LONG_TEXT, add_special_tokens=False))
    full = sum(per)
    errors = []
    for max_length in (64, 16, 4):
        windowed = rolling_token_logprobs(model, tok, [LONG_TEXT], max_length=max_length)[0]
        assert len(windowed) == len(per)  # every token once, whatever the window
        errors.append(abs(sum(windowed) - full))
    assert errors[0] < 0.02 * abs(full)
    assert errors[0] < errors[1] < errors[2]  # more context, closer to the unwindowed score


def test_rolling_bad_stride(tiny_llama, tiny_tokenizer):
    with pytest.raises(ValueError, match="stride"):
        rolling_token_logprobs(tiny_llama, tiny_tokenizer, [TEXT], max_length=8, stride=8)


def test_perplexity_is_exp_of_minus_mean(tiny_llama, tiny_tokenizer):
    texts = [TEXT, "short", "another text of another length"]
    per = rolling_token_logprobs(tiny_llama, tiny_tokenizer, texts)
    flat = [v for row in per for v in row]
    assert len(flat) == sum(len(t.encode()) for t in texts)
    ppl = perplexity(tiny_llama, tiny_tokenizer, texts)
    assert ppl == pytest.approx(math.exp(-sum(flat) / len(flat)), rel=1e-9)
    assert ppl > 1.0
    with pytest.raises(ValueError, match="empty"):
        perplexity(tiny_llama, tiny_tokenizer, ["", ""])


# --- choices --------------------------------------------------------------------------------------------------------


def test_choice_logprobs_and_accuracy(tiny_llama, tiny_tokenizer):
    context = "Pick one:"
    choices = [" alpha", " b", " gamma ray", " delta"]
    raw = choice_logprobs(tiny_llama, tiny_tokenizer, context, choices)
    expected = [t for t, _ in loglikelihood(tiny_llama, tiny_tokenizer, [(context, c) for c in choices])]
    assert raw == pytest.approx(expected, abs=1e-5)
    norm = choice_logprobs(tiny_llama, tiny_tokenizer, context, choices, normalize=True)
    assert norm == pytest.approx([r / len(c) for r, c in zip(raw, choices)], abs=1e-5)

    best = max(range(len(choices)), key=raw.__getitem__)
    best_norm = max(range(len(choices)), key=norm.__getitem__)
    items = [(context, choices, g) for g in range(len(choices))]
    assert choice_accuracy(tiny_llama, tiny_tokenizer, items) == [int(g == best) for g in range(len(choices))]
    assert choice_accuracy(tiny_llama, tiny_tokenizer, items, normalize=True) == [
        int(g == best_norm) for g in range(len(choices))
    ]


# --- prompts --------------------------------------------------------------------------------------------------------


def test_chat_prompt_with_template(tiny_tokenizer):
    assert has_chat_template(tiny_tokenizer)
    assert chat_prompt(tiny_tokenizer, "hi") == "<s>user\nhi</s>\n<s>assistant\n"
    history = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}]
    assert chat_prompt(tiny_tokenizer, "q2", system="be brief", history=history) == (
        "<s>system\nbe brief</s>\n<s>user\nq1</s>\n<s>assistant\na1</s>\n<s>user\nq2</s>\n<s>assistant\n"
    )


def test_chat_prompt_without_template():
    tok = make_byte_tokenizer(chat_template=False)
    assert not has_chat_template(tok)
    assert chat_prompt(tok, "What is 2+2?") == "Question: What is 2+2?\nAnswer:"
    history = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}]
    assert chat_prompt(tok, "q2", system="Be brief.", history=history) == (
        "Be brief.\n\nUser: q1\nAssistant: a1\nQuestion: q2\nAnswer:"
    )


def _bos_adding_tokenizer():
    from tokenizers import processors

    tok = make_byte_tokenizer()
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


def test_encode_prompt_does_not_double_bos():
    tok = _bos_adding_tokenizer()
    assert encode(tok, "hi") == [BOS] + _ids("hi")
    assert encode(tok, "<s>hi")[:2] == [BOS, BOS]  # the tokenizer alone would double it
    assert encode_prompt(tok, "hi") == [BOS] + _ids("hi")
    prompt = chat_prompt(tok, "hi")
    ids = encode_prompt(tok, prompt)
    assert ids[:2] == [BOS] + _ids("u")
    assert ids == encode(tok, prompt)[1:]
    assert tok.decode(ids) == prompt
    # a tokenizer that adds no BOS keeps the template's one
    plain = make_byte_tokenizer()
    assert encode_prompt(plain, prompt) == ids
    assert encode_prompt(plain, "hi") == _ids("hi")
