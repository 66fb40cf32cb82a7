"""`lmlab.core.execution.backends`: the local backend equals the core primitives it wraps, the frequency penalty is
OpenAI's,
backend specs parse or fail with one line, and the OpenAI backend's own logic (offsets, errors) holds offline.

The OpenAI backend against a real server (`lmlab serve` on loopback) is tests/serve/test_backend_e2e.py.
"""

from __future__ import annotations

import socket

import pytest
import torch

from lmlab.core.execution.backends import (
    BACKEND_FORMS,
    BackendError,
    BackendHTTPError,
    FrequencyPenalty,
    LocalBackend,
    OpenAIBackend,
    TextBackend,
    _refuses_echo,
    continuation_span,
    make_backend,
    parse_backend,
    render_chat,
)
from lmlab.core.inference.generation import decode
from lmlab.core.inference.scoring import continuation_logprobs, encode_prompt, loglikelihood, split_pair

ATOL = 1e-5


@pytest.fixture()
def local(tiny_llama, tiny_tokenizer):
    return LocalBackend(tiny_llama, tiny_tokenizer)


# ----------------------------------------------------------------------------------------------------------------
# LocalBackend against the primitives


def test_local_generate_is_decode_at_temperature_zero(local, tiny_llama, tiny_tokenizer):
    prompt = "The capital of France is"
    want = decode(tiny_llama, tiny_tokenizer, prompt, max_new_tokens=16)
    (got,) = local.generate(prompt, max_tokens=16, logprobs=True)
    assert got.text == want.text and got.token_ids == want.token_ids
    assert torch.allclose(torch.tensor(got.token_logprobs), torch.tensor(want.token_logprobs), atol=ATOL)
    assert got.finish_reason == "length" and got.n_completion_tokens == 16
    assert got.n_prompt_tokens == len(encode_prompt(tiny_tokenizer, prompt))
    # greedy: n choices are n copies; without logprobs=True none are returned
    many = local.generate(prompt, max_tokens=16, n=3)
    assert [c.text for c in many] == [want.text] * 3 and all(c.token_logprobs is None for c in many)
    # a stop string cuts the text before it and finishes with "stop"
    stop = want.text[5]
    (cut,) = local.generate(prompt, max_tokens=16, stop=[stop])
    assert cut.text == want.text[: want.text.index(stop)] and cut.finish_reason == "stop"


def test_local_sampling_is_seeded_per_choice(local):
    a = local.generate("abc", max_tokens=12, temperature=1.0, n=3, seed=5)
    b = local.generate("abc", max_tokens=12, temperature=1.0, n=3, seed=5)
    assert [c.text for c in a] == [c.text for c in b]
    assert len({c.text for c in a}) > 1  # choice i is seeded seed + i
    (first,) = local.generate("abc", max_tokens=12, temperature=1.0, seed=5)
    assert first.text == a[0].text
    # unseeded choices differ too (decode alone would give every one seed 0)
    assert len({c.text for c in local.generate("abc", max_tokens=12, temperature=1.0, n=3)}) > 1


def test_local_chat_decodes_the_chat_template(local, tiny_llama, tiny_tokenizer):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
    text = tiny_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    want = decode(tiny_llama, tiny_tokenizer, text, max_new_tokens=20)
    bare = decode(tiny_llama, tiny_tokenizer, msgs[-1]["content"], max_new_tokens=20)
    assert bare.text != want.text  # the check below can tell the template from a bare prompt
    got = local.chat(msgs, max_tokens=20, logprobs=True)
    assert got.text == want.text and got.n_prompt_tokens == len(want.prompt_ids)
    assert torch.allclose(torch.tensor(got.token_logprobs), torch.tensor(want.token_logprobs), atol=ATOL)
    # "developer" is OpenAI's newer name for "system"
    dev = local.chat([{"role": "developer", "content": "Be brief."}, msgs[1]], max_tokens=20)
    assert dev.text == want.text


def test_render_chat_without_a_template_is_the_plain_question_answer_form():
    from lmlab.core.inference.tiny import make_byte_tokenizer

    tok = make_byte_tokenizer(chat_template=False)
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    assert render_chat(tok, msgs) == "S\n\nUser: a\nAssistant: b\nQuestion: c\nAnswer:"
    with pytest.raises(ValueError, match=r"messages\[-1\]\['role'\] must be 'user'.*got 'assistant'"):
        render_chat(tok, msgs[:3])


def test_local_score_is_continuation_logprobs(local, tiny_llama, tiny_tokenizer):
    context, continuation = "The cat", " sat on the mat"
    ctx, cont = split_pair(tiny_tokenizer, context, continuation)
    ((want, _),) = continuation_logprobs(tiny_llama, [ctx], [cont])
    got = local.score(context, continuation)
    assert len(got) == len(cont) and torch.allclose(torch.tensor(got), torch.tensor(want), atol=ATOL)
    ((total, _),) = loglikelihood(tiny_llama, tiny_tokenizer, [(context, continuation)])
    assert sum(got) == pytest.approx(total, abs=1e-4)
    assert local.score(context, "") == []
    with pytest.raises(ValueError, match="context is empty"):
        local.score("", continuation)


def test_both_backends_satisfy_the_protocol(local):
    assert isinstance(local, TextBackend)
    assert isinstance(OpenAIBackend("http://127.0.0.1:9/v1"), TextBackend)  # no request is made on construction


# ----------------------------------------------------------------------------------------------------------------
# Frequency penalty


def test_frequency_penalty_subtracts_penalty_times_generated_count():
    prompt = [5, 5, 5]  # prompt tokens are not counted
    ids = torch.tensor([prompt + [7, 7, 9]])  # (1, 6)
    scores = torch.zeros(1, 12)
    out = FrequencyPenalty(0.5, len(prompt))(ids, scores)
    want = torch.zeros(1, 12)
    want[0, 7], want[0, 9] = -1.0, -0.5
    assert torch.equal(out, want)
    assert torch.equal(FrequencyPenalty(-0.5, len(prompt))(ids, scores), -want)  # negative favours repeats


def test_frequency_penalty_changes_the_choice_of_a_repeated_token(local, tiny_llama, tiny_tokenizer):
    msgs = [{"role": "user", "content": "Say something."}]
    plain = local.chat(msgs, max_tokens=48)
    penalised = local.chat(msgs, max_tokens=48, frequency_penalty=2.0)
    a, b = plain.token_ids, penalised.token_ids
    k = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
    assert k is not None, "the penalty changed nothing: pick a prompt whose greedy answer repeats a token"
    # the answers agree until the first repeat the penalty talks the model out of: the plain answer's token there
    # had already been generated (the penalty touches nothing else), and the penalised one is the argmax of
    # logits - 2 * counts
    assert a[k] in a[:k]
    ids = encode_prompt(tiny_tokenizer, render_chat(tiny_tokenizer, msgs)) + a[:k]
    with torch.no_grad():
        logits = tiny_llama(input_ids=torch.tensor([ids])).logits[0, -1]  # (vocab,)
    counts = torch.bincount(torch.tensor(a[:k]), minlength=logits.shape[-1]).float()
    assert int((logits - 2.0 * counts).argmax()) == b[k]


# ----------------------------------------------------------------------------------------------------------------
# Bad input: one line naming the value, before any model call or request


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(temperature=-1.0), r"temperature must be >= 0 .*got -1\.0"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\], got 0\.0"),
        (dict(max_tokens=-2), r"max_tokens must be an integer >= 0, got -2"),
        (dict(stop=[""]), r"stop strings must be non-empty strings, got ''"),
        (dict(frequency_penalty=3.0), r"frequency_penalty must be in \[-2, 2\], got 3\.0"),
        (dict(seed="1"), r"seed must be an integer or None, got '1'"),
    ],
)
def test_bad_arguments_fail_before_any_call(local, kw, match):
    remote = OpenAIBackend("http://127.0.0.1:9/v1", max_retries=0)  # the network guard fails any request
    for backend in (local, remote):
        with pytest.raises(ValueError, match=match) as info:
            backend.chat([{"role": "user", "content": "hi"}], **{"max_tokens": 4, **kw})
        assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "messages, match",
    [
        ([], r"messages must be a non-empty list"),
        ([{"role": "robot", "content": "x"}], r"messages\[0\]\['role'\] must be one of .*got 'robot'"),
        ([{"role": "user"}], r"messages\[0\] must be a dict with 'role' and 'content'"),
        ([{"role": "user", "content": 3}], r"messages\[0\]\['content'\] must be a string, got int"),
    ],
)
def test_bad_messages_fail_with_the_index(local, messages, match):
    with pytest.raises(ValueError, match=match):
        local.chat(messages, max_tokens=4)
    with pytest.raises(ValueError, match=match):
        OpenAIBackend("http://127.0.0.1:9/v1").chat(messages, max_tokens=4)


def test_generate_needs_n_at_least_one_and_an_integer_budget(local):
    with pytest.raises(ValueError, match=r"n must be an integer >= 1, got 0"):
        local.generate("x", max_tokens=4, n=0)
    with pytest.raises(ValueError, match=r"max_tokens must be an integer >= 0 for generate, got None"):
        local.generate("x", max_tokens=None)


# ----------------------------------------------------------------------------------------------------------------
# Specs


@pytest.mark.parametrize(
    "spec, want",
    [
        ("openai:http://127.0.0.1:8000/v1", ("openai", "http://127.0.0.1:8000/v1")),
        ("openai:https://api.example.com/v1#gpt-4o", ("openai", "https://api.example.com/v1#gpt-4o")),
        ("local:tiny-llama", ("local", "tiny-llama")),
        ("tiny-llama", ("local", "tiny-llama")),
        ("runs/lora_gen/model", ("local", "runs/lora_gen/model")),
        ("models/dir::file.gguf", ("local", "models/dir::file.gguf")),
        ("pretrained=dir,gguf_file=f.gguf", ("local", "pretrained=dir,gguf_file=f.gguf")),
    ],
)
def test_parse_backend_accepts(spec, want):
    assert parse_backend(spec) == want


@pytest.mark.parametrize(
    "spec, match",
    [
        ("", "is empty"),
        ("openai", "names no URL"),
        ("openai:", "names no URL"),
        ("openai:localhost:8000/v1", "must start with http:// or https://"),
        ("openai:ftp://host/v1", "must start with http:// or https://"),
        ("openai:http://host:99999/v1", "is not a valid URL"),
        ("openai:http:///v1", "name a host"),
        ("openai:http://host/v1#", "empty model name"),
        ("local:", "names no model"),
        ("http://127.0.0.1:8000/v1", "unknown kind 'http'"),
        ("vllm:http://host/v1", "unknown kind 'vllm'"),
    ],
)
def test_parse_backend_rejects_with_one_line_naming_the_spec(spec, match):
    with pytest.raises(ValueError, match=match) as info:
        parse_backend(spec)
    message = str(info.value)
    assert repr(spec) in message and "\n" not in message
    assert "openai:" in message or "local:" in message  # it says what is accepted


def test_backend_forms_name_both_kinds():
    assert "openai:" in BACKEND_FORMS and "local:" in BACKEND_FORMS


def test_make_backend_builds_each_kind_without_a_request(tiny_llama, tiny_tokenizer):
    asked = []

    def load(spec):
        asked.append(spec)
        return tiny_llama, tiny_tokenizer

    for spec in ("local:tiny-llama", "tiny-llama"):
        b = make_backend(spec, load_local=load)
        assert isinstance(b, LocalBackend) and b.model is tiny_llama and b.name == "local:tiny-llama"
    assert asked == ["tiny-llama", "tiny-llama"]
    b = make_backend("openai:http://127.0.0.1:8000/v1#served")
    assert isinstance(b, OpenAIBackend) and (b.base_url, b.model) == ("http://127.0.0.1:8000/v1", "served")
    assert make_backend("openai:http://127.0.0.1:8000/v1/").model == "default"
    with pytest.raises(ValueError, match="unknown kind"):
        make_backend("vllm:x", load_local=load)
    assert len(asked) == 2  # a bad spec loads nothing


def test_openai_backend_reads_the_key_from_the_named_variable(monkeypatch):
    monkeypatch.setenv("MY_KEY", "sk-test")
    assert OpenAIBackend("http://127.0.0.1:9/v1", api_key_env="MY_KEY").client.api_key == "sk-test"
    monkeypatch.delenv("MY_KEY")
    assert OpenAIBackend("http://127.0.0.1:9/v1", api_key_env="MY_KEY").client.api_key == "EMPTY"


# ----------------------------------------------------------------------------------------------------------------
# OpenAIBackend's own logic, offline


def test_continuation_span_from_offsets():
    # one token per word, the continuation's first token merged with the context's last character
    tokens, offsets = ["The", " ca", "t sat"], [0, 3, 6]
    assert continuation_span(tokens, offsets, "The cat sat", 7, 11) == (2, 3)
    # a server that counts a BOS "<s>" the echoed text does not hold: every offset is 3 too far
    tokens, offsets = ["<s>", "The", " cat", " sat"], [0, 3, 6, 10]
    assert continuation_span(tokens, offsets, "The cat sat", 7, 11) == (3, 4)
    # a generated token after the prompt (a server that read max_tokens=0 as 1) is not part of the continuation
    tokens, offsets = ["The", " cat", " sat", " on"], [0, 3, 7, 11]
    assert continuation_span(tokens, offsets, "The cat sat on", 7, 11) == (2, 3)
    with pytest.raises(ValueError, match="got 2 tokens but 1 text offsets"):
        continuation_span(["a", "b"], [0], "ab", 1, 2)


@pytest.mark.parametrize(
    "status, param, code, message, refuses",
    [
        (400, "echo", None, "echo is not supported", True),
        (400, None, None, "logprobs are not supported for this model", True),
        (422, "max_tokens", None, "must be >= 1", True),
        (404, None, None, "Not Found", True),  # a chat-only server: no /completions
        (404, "model", "model_not_found", "no such model", False),  # a wrong model name is the caller's to fix
        (404, None, "model_not_found", "The model `x` does not exist", False),  # OpenAI's own shape
        (400, "prompt", "context_length_exceeded", "prompt too long", False),
        (500, None, None, "boom", False),
    ],
)
def test_which_http_errors_mean_the_server_cannot_score(status, param, code, message, refuses):
    assert _refuses_echo(BackendHTTPError(f"u answered HTTP {status}: {message}", status, param, code)) is refuses


@pytest.mark.loopback
def test_connection_refused_is_one_line_naming_the_url():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    backend = OpenAIBackend(f"http://127.0.0.1:{port}/v1", max_retries=0, timeout=5)
    with pytest.raises(BackendError) as info:
        backend.chat([{"role": "user", "content": "hi"}], max_tokens=2)
    message = str(info.value)
    assert message.startswith(f"http://127.0.0.1:{port}/v1/chat/completions: no answer") and "\n" not in message
