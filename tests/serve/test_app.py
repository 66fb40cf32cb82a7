"""`lmlab serve`'s HTTP layer, spoken to by the official `openai` client on loopback.

Two servers: one in front of the real continuous-batching `Scheduler` on the tiny random llama (answers are
checked against `lmlab.core.inference.scoring` and against the scheduler run directly), and one in front of
`FakeScheduler`
below (the HTTP contract alone: error shapes, ids, usage arithmetic, SSE framing, and that a client that goes away
cancels its handles, which a fake can show deterministically because its requests never end on their own).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from lmlab.core.inference.scoring import continuation_logprobs, encode_prompt
from lmlab.core.inference.tiny import make_byte_tokenizer, make_tiny_llama
from lmlab.serve.app import create_app, validation_param
from lmlab.serve.scheduler import Delta, Finished, GenRequest, Scheduler, TokenInfo
from lmlab.serve.testing import ServerThread

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx2")

pytestmark = pytest.mark.loopback

MAX_CONTEXT = 256
ATOL = 1e-4


# ----------------------------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def tiny():
    return make_tiny_llama(0), make_byte_tokenizer()


@pytest.fixture(scope="module")
def sched(tiny):
    model, tok = tiny
    s = Scheduler(model, tok, engine="fast", max_batch=8, max_context=MAX_CONTEXT)
    yield s
    s.close()


@pytest.fixture(scope="module")
def server(tiny, sched):
    _, tok = tiny
    with ServerThread(create_app(sched, tok, served_name="tiny")) as srv:
        yield srv


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="EMPTY", max_retries=0, timeout=60)


def _direct(sched, ids, **kw):
    """The scheduler run without HTTP: the reference for what the server must return."""
    return sched.submit(GenRequest(list(ids), **kw)).result(60)


class FakeHandle:
    """A request that emits one ``"x"`` token per `delay` seconds, up to max_tokens (forever when `endless`)."""

    def __init__(self, sched: FakeScheduler, request: GenRequest) -> None:
        self.sched, self.request = sched, request
        self.cancelled = threading.Event()

    async def events(self):
        r, tokens = self.request, []
        while not self.cancelled.is_set() and (self.sched.endless or len(tokens) < r.max_tokens):
            await asyncio.sleep(self.sched.delay)
            tokens.append(TokenInfo(ord("x"), "x", -0.5 if r.logprobs is not None else None))
            yield Delta(r.request_id, "x", tokens[-1:])
        self.sched.active.discard(self)
        reason = "cancelled" if self.cancelled.is_set() else "length"
        yield Finished(r.request_id, "x" * len(tokens), tokens, reason, len(r.prompt_ids), len(tokens))

    def cancel(self) -> None:
        # only cancel() (or a natural end) frees the slot: a server that forgets to call it keeps `active` up
        self.cancelled.set()
        self.sched.active.discard(self)


class FakeScheduler:
    """The `Scheduler` contract without a model (`submit`, `stats`, `max_context`)."""

    max_context = 64

    def __init__(self) -> None:
        self.delay, self.endless = 0.0, False
        self.active: set[FakeHandle] = set()
        self.submitted: list[FakeHandle] = []

    def submit(self, request: GenRequest) -> FakeHandle:
        h = FakeHandle(self, request)
        self.active.add(h)
        self.submitted.append(h)
        return h

    def stats(self) -> dict:
        return {"active": len(self.active), "queued": 0, "steps": 0, "max_batch": 8, "engine": "fake"}


@pytest.fixture(scope="module")
def fake_server():
    fake = FakeScheduler()
    with ServerThread(create_app(fake, make_byte_tokenizer(), served_name="fake-model")) as srv:
        srv.fake = fake
        yield srv


@pytest.fixture()
def fake(fake_server):
    f = fake_server.fake
    f.delay, f.endless = 0.0, False
    f.submitted.clear()
    yield f
    for h in list(f.active):
        h.cancel()


@pytest.fixture()
def fake_client(fake_server):
    return openai.OpenAI(base_url=fake_server.base_url, api_key="EMPTY", max_retries=0, timeout=30)


def _health(srv) -> dict:
    return httpx.get(srv.url + "/health", timeout=5).json()


def _wait_idle(srv, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        h = _health(srv)
        if h["active"] == 0 or time.monotonic() > deadline:
            return h
        time.sleep(0.05)


# ----------------------------------------------------------------------------------------------------------------
# log-probs against lmlab.core.inference.scoring


def test_echo_logprobs_of_the_prompt_equal_scoring(client, tiny):
    model, tok = tiny
    prompt = "Hello world"
    r = client.completions.create(model="tiny", prompt=prompt, echo=True, logprobs=1, max_tokens=0)
    (choice,) = r.choices
    ids = encode_prompt(tok, prompt)
    ((want, _),) = continuation_logprobs(model, [ids[:1]], [ids[1:]])
    lp = choice.logprobs
    assert choice.text == prompt
    assert lp.tokens == [tok.decode([i]) for i in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # the first token has no context
    assert torch.allclose(torch.tensor(lp.token_logprobs[1:]), torch.tensor(want), atol=ATOL)
    assert lp.text_offset == list(range(len(prompt)))  # one character per byte token
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 0


def test_generated_logprobs_equal_scoring_of_prompt_plus_completion(client, tiny, sched):
    model, tok = tiny
    prompt = "The capital of France"
    ids = encode_prompt(tok, prompt)
    ref = _direct(sched, ids, max_tokens=12, temperature=0)
    gen = [t.token_id for t in ref.tokens]
    ((want, greedy),) = continuation_logprobs(model, [ids], [gen])
    assert greedy  # temperature 0 picks every token by argmax
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == ref.text
    assert torch.allclose(torch.tensor(lp.token_logprobs), torch.tensor(want), atol=ATOL)
    for tok_text, chosen, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        # the 2 alternatives plus the chosen one; greedy: the chosen one is the most likely
        assert 1 <= len(top) <= 3 and top[tok_text] == chosen and max(top.values()) == pytest.approx(chosen)
    assert lp.text_offset[0] == len(prompt)

    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=12, temperature=0,
        logprobs=True, top_logprobs=2,
    )  # fmt: skip
    chat_ids = encode_prompt(tok, tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                          add_generation_prompt=True))  # fmt: skip
    chat_ref = _direct(sched, chat_ids, max_tokens=12, temperature=0)
    ((chat_want, _),) = continuation_logprobs(model, [chat_ids], [[t.token_id for t in chat_ref.tokens]])
    content = chat.choices[0].logprobs.content
    assert torch.allclose(torch.tensor([c.logprob for c in content]), torch.tensor(chat_want), atol=ATOL)
    assert all(len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob == pytest.approx(c.logprob) for c in content)
    # `bytes` are the tokens' raw bytes: joined, they decode to the answer (partial UTF-8 characters included)
    raw = b"".join(bytes(c.bytes) for c in content)
    assert raw.decode("utf-8", errors="replace") == chat.choices[0].message.content


# ----------------------------------------------------------------------------------------------------------------
# streaming, chat template, n / seed, stop, usage


def test_streaming_gives_the_non_streamed_text(client):
    kw = dict(model="tiny", prompt="Once upon a time", max_tokens=20, temperature=0)
    whole = client.completions.create(**kw).choices[0]
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        whole.finish_reason
    ]
    assert chunks[-1].usage.completion_tokens == 20 and not chunks[-1].choices

    # several prompts and choices interleave in one stream; each index still joins to its own answer
    kw = dict(model="tiny", prompt=["abc", "xyz"], n=2, max_tokens=10, temperature=0)
    whole = {c.index: c.text for c in client.completions.create(**kw).choices}
    joined = dict.fromkeys(whole, "")
    for c in client.completions.create(**kw, stream=True):
        joined[c.choices[0].index] += c.choices[0].text
    assert joined == whole and whole[0] != whole[2]

    msgs = [{"role": "user", "content": "Tell me a story"}]
    chat = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=20, temperature=0)
    stream = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=20, temperature=0, stream=True)
    parts = list(stream)
    assert parts[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in parts) == chat.choices[0].message.content
    assert parts[-1].choices[0].finish_reason == chat.choices[0].finish_reason


def test_chat_applies_the_chat_template(client, tiny, sched):
    _, tok = tiny
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
    ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)["input_ids"]
    want = _direct(sched, ids, max_tokens=16, temperature=0)
    plain = _direct(sched, encode_prompt(tok, msgs[-1]["content"]), max_tokens=16, temperature=0)
    assert plain.text != want.text  # the check below can tell a templated prompt from a bare one
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=16, temperature=0)
    assert r.choices[0].message.content == want.text
    assert r.usage.prompt_tokens == len(ids)


def test_n_choices_greedy_identical_and_seeded_sampling_reproducible(client):
    kw = dict(model="tiny", prompt="abc", max_tokens=12)
    greedy = client.completions.create(**kw, n=3, temperature=0)
    assert [c.index for c in greedy.choices] == [0, 1, 2]
    assert len({c.text for c in greedy.choices}) == 1

    a = client.completions.create(**kw, n=3, temperature=1, seed=7)
    b = client.completions.create(**kw, n=3, temperature=1, seed=7)
    other = client.completions.create(**kw, n=3, temperature=1, seed=8)
    texts = [c.text for c in a.choices]
    assert texts == [c.text for c in b.choices]
    assert len(set(texts)) > 1  # the choices differ (choice i is seeded seed + i) ...
    assert texts != [c.text for c in other.choices]  # ... and the seed matters
    one = client.completions.create(**kw, n=1, temperature=1, seed=7)
    assert one.choices[0].text == texts[0]
    assert a.usage.prompt_tokens == 3 and a.usage.completion_tokens == sum(12 for _ in a.choices)


def test_stop_cuts_before_the_stop_string_and_length_when_max_tokens(client):
    full = client.completions.create(model="tiny", prompt="Hello world", max_tokens=24, temperature=0).choices[0]
    assert full.finish_reason == "length"
    # a printable ASCII character first seen at k >= 2 after an ASCII-only prefix (no partial UTF-8 to blur k)
    k = next(i for i in range(2, len(full.text)) if full.text[i].isascii() and full.text[i].isprintable()
             and full.text[i] not in full.text[:i] and full.text[:i].isascii())  # fmt: skip
    r = client.completions.create(
        model="tiny", prompt="Hello world", max_tokens=24, temperature=0, stop=[full.text[k], "never-there"]
    )
    assert r.choices[0].text == full.text[:k] and r.choices[0].finish_reason == "stop"
    short = client.completions.create(model="tiny", prompt="Hello world", max_tokens=3, temperature=0)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 3


def test_usage_counts_equal_the_tokenizer_counts(client, tiny, sched):
    _, tok = tiny
    prompts = ["xyz", "The quick brown fox"]
    r = client.completions.create(model="tiny", prompt=prompts, max_tokens=9, temperature=0, n=2, logprobs=0)
    assert len(r.choices) == 4 and [c.index for c in r.choices] == [0, 1, 2, 3]
    n_prompt = [len(encode_prompt(tok, p)) for p in prompts]
    assert r.usage.prompt_tokens == sum(n_prompt)  # once per prompt, not per choice
    refs = [_direct(sched, encode_prompt(tok, p), max_tokens=9, temperature=0) for p in prompts]
    assert r.usage.completion_tokens == sum(2 * len(f.tokens) for f in refs)
    assert [len(c.logprobs.tokens) for c in r.choices] == [len(refs[0].tokens)] * 2 + [len(refs[1].tokens)] * 2
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_concurrent_requests_all_answered_once_with_their_ids(server, client, tiny, sched):
    _, tok = tiny
    prompts = [f"request number {i}:" for i in range(8)]
    refs = [_direct(sched, encode_prompt(tok, p), max_tokens=16, temperature=0).text for p in prompts]

    def one(i):
        raw = client.completions.with_raw_response.create(
            model="tiny", prompt=prompts[i], max_tokens=16, temperature=0, extra_headers={"X-Request-Id": f"req-{i}"}
        )
        return i, raw.headers.get("x-request-id"), raw.parse()

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    assert sorted(echo for _, echo, _ in results) == sorted(f"req-{i}" for i in range(8))
    assert all(echo == f"req-{i}" for i, echo, _ in results)
    assert len({body.id for _, _, body in results}) == 8
    assert all(body.id.startswith("cmpl-") for _, _, body in results)
    assert [body.choices[0].text for _, _, body in results] == refs  # each got its own prompt's answer
    assert _wait_idle(server)["active"] == 0


# ----------------------------------------------------------------------------------------------------------------
# HTTP contract (fake scheduler)


def _completion_ok(c, model="fake-model"):
    r = c.completions.create(model=model, prompt="hi", max_tokens=2)
    assert r.choices[0].text == "xx"


BAD_COMPLETIONS = [
    (dict(model="nope"), 404, "model", "model_not_found"),
    (dict(max_tokens=-1), 400, "max_tokens", None),
    (dict(temperature=-1), 400, "temperature", None),
    (dict(top_p=0), 400, "top_p", None),
    (dict(n=0), 400, "n", None),
    (dict(logprobs=9), 400, "logprobs", None),
    (dict(prompt="a" * 100), 400, "prompt", "context_length_exceeded"),
    (dict(prompt="a" * 60, max_tokens=10), 400, "max_tokens", "context_length_exceeded"),
    (dict(prompt=["ok", "a" * 100]), 400, "prompt.1", "context_length_exceeded"),
    (dict(stop=[""]), 400, "stop", None),
    (dict(extra_body={"max_tokens": "5"}), 400, "max_tokens", None),  # wrong type: no coercion
    (dict(extra_body={"prompt": 5}), 400, "prompt", None),
    (dict(extra_body={"echo": "yes"}), 400, "echo", None),
    (dict(extra_body={"lmlab": {"strategy": "nope"}}), 400, "lmlab.strategy", None),
    (dict(extra_body={"lmlab": {"strategy": "reflection_window", "sigma": -1}}), 400, "lmlab.sigma", None),
    (dict(extra_body={"lmlab": {"strategy": "reflection_window", "bogus": 1}}), 400, "lmlab.bogus", None),
    (dict(extra_body={"lmlab": "reflection_window"}), 400, "lmlab", None),
]


@pytest.mark.parametrize("kw,status,param,code", BAD_COMPLETIONS, ids=lambda v: str(v)[:40])
def test_bad_completion_requests_get_openai_errors_naming_the_field(fake_client, fake, kw, status, param, code):
    args = {"model": "fake-model", "prompt": "hi", "max_tokens": 2, **kw}
    with pytest.raises(openai.APIStatusError) as e:
        fake_client.completions.create(**args)
    assert e.value.status_code == status
    err = e.value.body
    assert set(err) == {"message", "type", "param", "code"}  # the client unwraps {"error": {...}}
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["code"] == code
    assert err["message"] and "\n" not in err["message"]
    assert fake.submitted == []  # refused before anything reached the scheduler
    _completion_ok(fake_client)  # and the server keeps serving


BAD_CHATS = [
    (dict(messages=[]), "messages"),
    (dict(messages=[{"role": "robot", "content": "hi"}]), "messages.0.role"),
    (dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
     "messages.0.content.0.type"),
    (dict(top_logprobs=2), "top_logprobs"),  # without logprobs=true
    (dict(top_logprobs=50, logprobs=True), "top_logprobs"),
    (dict(max_completion_tokens=100), "max_completion_tokens"),
    (dict(messages=[{"role": "user", "content": "a" * 100}]), "messages"),
    (dict(extra_body={"logprobs": 1}), "logprobs"),
]  # fmt: skip


@pytest.mark.parametrize("kw,param", BAD_CHATS, ids=lambda v: str(v)[:40])
def test_bad_chat_requests_get_openai_errors_naming_the_field(fake_client, fake, kw, param):
    args = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **kw}
    with pytest.raises(openai.BadRequestError) as e:
        fake_client.chat.completions.create(**args)
    assert e.value.body["param"] == param and e.value.body["type"] == "invalid_request_error"
    ok = fake_client.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=3)  # fmt: skip
    assert ok.choices[0].message.content == "xxx"


@pytest.mark.parametrize(
    "body,param",
    [(b'{"model": "fake-model", "prompt": ', "body"), (b"[1, 2]", "body"), (b'{"prompt": "hi"}', "model")],
)
def test_malformed_bodies_are_400_in_openai_shape(fake_server, fake_client, fake, body, param):
    r = httpx.post(fake_server.base_url + "/completions", content=body,
                   headers={"content-type": "application/json", "X-Request-Id": "bad-1"})  # fmt: skip
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert r.headers["x-request-id"] == "bad-1"
    _completion_ok(fake_client)


def test_unknown_body_fields_are_ignored_and_default_model_matches(fake_client, fake):
    r = fake_client.completions.create(
        model="default", prompt="hi", max_tokens=2, frequency_penalty=0.5, extra_body={"no_such_field": [1]}
    )
    assert r.choices[0].text == "xx" and r.model == "default"
    models = fake_client.models.list()
    assert [m.id for m in models.data] == ["fake-model"]


def test_request_options_reach_the_scheduler(fake_client, fake):
    fake_client.completions.create(model="fake-model", prompt=["ab", "cde"], max_tokens=2, n=2, temperature=0.5,
                                   top_p=0.9, seed=11, stop="zz", logprobs=3, echo=True)  # fmt: skip
    reqs = [h.request for h in fake.submitted]
    tok = make_byte_tokenizer()
    assert [r.prompt_ids for r in reqs] == [encode_prompt(tok, "ab")] * 2 + [encode_prompt(tok, "cde")] * 2
    assert [r.seed for r in reqs] == [11, 12, 11, 12]  # choice i: seed + i
    assert all(r.temperature == 0.5 and r.top_p == 0.9 and r.stop == ["zz"] and r.logprobs == 3 for r in reqs)
    assert all(r.echo_logprobs and r.strategy is None and r.max_tokens == 2 for r in reqs)
    assert all(r.frequency_penalty == 0.0 and r.presence_penalty == 0.0 for r in reqs)
    assert len({r.request_id for r in reqs}) == 4

    fake.submitted.clear()
    fake_client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}],
                                        max_tokens=2, frequency_penalty=0.3, presence_penalty=-0.5)  # fmt: skip
    (req,) = [h.request for h in fake.submitted]
    assert (req.frequency_penalty, req.presence_penalty) == (0.3, -0.5)
    with pytest.raises(openai.BadRequestError) as err:  # a strategy's decoder applies no penalty: refused
        fake_client.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": "hi"}],
            frequency_penalty=0.3,
            extra_body={"lmlab": {"strategy": "beam_search"}},
        )
    assert err.value.body["param"] == "frequency_penalty"
    with pytest.raises(openai.BadRequestError) as err:
        fake_client.completions.create(model="fake-model", prompt="hi", presence_penalty=2.5)
    assert err.value.body["param"] == "presence_penalty"

    fake.submitted.clear()
    fake_client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}],
                                        extra_body={"lmlab": {"strategy": "beam_search", "num_beams": 2}})  # fmt: skip
    (req,) = [h.request for h in fake.submitted]
    assert req.strategy.name == "beam_search" and req.strategy.params.num_beams == 2
    # chat without max_tokens: up to the context limit
    assert req.max_tokens == FakeScheduler.max_context - len(req.prompt_ids)


def test_launch_default_strategy_applies_and_is_checked_at_launch(fake):
    with pytest.raises(ValueError, match="lmlab.sigma"):
        create_app(fake, make_byte_tokenizer(), served_name="m", default_strategy={"strategy": "reflection_window",
                                                                                    "sigma": -1})  # fmt: skip
    app = create_app(fake, make_byte_tokenizer(), served_name="m", default_strategy={"strategy": "beam_search"})
    with ServerThread(app) as srv:
        c = openai.OpenAI(base_url=srv.base_url, api_key="EMPTY", max_retries=0)
        c.completions.create(model="m", prompt="hi", max_tokens=2)
        assert fake.submitted[-1].request.strategy.name == "beam_search"


def test_usage_counts_prompts_once_and_completions_per_choice(fake_client, fake):
    r = fake_client.completions.create(model="fake-model", prompt=["ab", "cde"], max_tokens=2, n=3)
    assert r.usage.prompt_tokens == 2 + 3 and r.usage.completion_tokens == 6 * 2 and r.usage.total_tokens == 17
    assert [c.index for c in r.choices] == list(range(6)) and r.id.startswith("cmpl-")


def test_request_id_header_echoed_else_user_field(fake_client, fake):
    raw = fake_client.completions.with_raw_response.create(model="fake-model", prompt="hi", max_tokens=1,
                                                           extra_headers={"X-Request-Id": "abc-1"})  # fmt: skip
    assert raw.headers["x-request-id"] == "abc-1"
    raw = fake_client.chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=1, user="user-7"
    )
    assert raw.headers["x-request-id"] == "user-7" and raw.parse().id.startswith("chatcmpl-")
    with pytest.raises(openai.NotFoundError) as e:
        fake_client.with_options(default_headers={"X-Request-Id": "abc-2"}).completions.create(model="x", prompt="")
    assert e.value.response.headers["x-request-id"] == "abc-2"


def test_stream_is_openai_sse_framing(fake_server, fake):
    body = {"model": "fake-model", "prompt": "hi", "max_tokens": 3, "stream": True, "logprobs": 0}
    with httpx.stream("POST", fake_server.base_url + "/completions", json=body, timeout=10) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e and not e.startswith(":")]  # ":" lines are keep-alive pings
    assert raw.endswith("data: [DONE]\n\n") and events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") and "\n" not in e for e in events)
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == "xxx"
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert sum(len(c["choices"][0]["logprobs"]["tokens"]) for c in chunks if c["choices"][0]["logprobs"]) == 3


def test_client_that_disconnects_mid_stream_frees_its_slot(fake_server, fake):
    fake.delay, fake.endless = 0.02, True
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.Client(timeout=10) as http:
        with http.stream("POST", fake_server.base_url + "/chat/completions", json=body) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]
            assert any(line.startswith("data: ") for line in got)
            assert _health(fake_server)["active"] == 1  # still generating while we read
    assert _wait_idle(fake_server)["active"] == 0
    assert all(h.cancelled.is_set() for h in fake.submitted)


def test_client_that_gives_up_on_a_plain_request_frees_its_slot(fake_server, fake):
    fake.delay, fake.endless = 0.02, True
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(fake_server.base_url + "/completions", json={"model": "fake-model", "prompt": "hi"}, timeout=0.5)
    assert _wait_idle(fake_server)["active"] == 0
    assert [h.cancelled.is_set() for h in fake.submitted] == [True]


def test_health_reports_the_scheduler(fake_server, fake):
    h = _health(fake_server)
    assert h == {"status": "ok", "model": "fake-model", "engine": "fake", "active": 0, "queued": 0, "steps": 0,
                 "max_batch": 8}  # fmt: skip


def test_validation_param_stops_at_union_members():
    union = [{"loc": ("body", "prompt", "str"), "type": "string_type"},
             {"loc": ("body", "prompt", "list[int]", 0), "type": "int_type"}]  # fmt: skip
    assert validation_param(union) == "prompt"
    assert validation_param([{"loc": ("body", "messages", 2, "role"), "type": "literal_error"}]) == "messages.2.role"
    assert validation_param([{"loc": ("body", 7), "type": "json_invalid"}]) == "body"


def test_cli_serve_refuses_a_bad_strategy_before_loading(capsys):
    from lmlab.cli import build_parser, main

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["serve", "--help"])
    assert e.value.code == 0
    assert main(["serve", "--model", "tiny-llama", "--strategy", "{nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lmlab: error: --strategy must be a JSON object") and "\n" not in err


# ----------------------------------------------------------------------------------------------------------------
# a burst of concurrent valid and malformed requests


def _malformed(model: str) -> list[tuple[str, bytes | dict, str, int, str]]:
    """(path, body, content type, status, param) of requests the server must refuse in OpenAI's error shape."""
    ok = {"model": model, "prompt": "hi", "max_tokens": 2}
    return [
        ("/completions", b'{"model": "m", "prompt": ', "application/json", 400, "body"),  # truncated JSON
        ("/completions", b"\xff\xfe{}", "application/json", 400, "body"),  # not UTF-8
        ("/completions", b"[1, 2]", "application/json", 400, "body"),  # not an object
        ("/completions", b"", "application/json", 400, "body"),  # no body at all
        ("/completions", json.dumps(ok).encode(), "text/plain", 400, "body"),  # not sent as JSON
        ("/completions", {**ok, "max_tokens": "5"}, "application/json", 400, "max_tokens"),  # wrong type
        ("/completions", {**ok, "prompt": 5}, "application/json", 400, "prompt"),
        ("/completions", {**ok, "model": "nope"}, "application/json", 404, "model"),
        ("/completions", {**ok, "max_tokens": -1}, "application/json", 400, "max_tokens"),
        ("/completions", {**ok, "seed": 2**70, "temperature": 1.0}, "application/json", 400, "seed"),
        ("/chat/completions", {"model": model, "messages": [{"role": "robot", "content": "hi"}]}, "application/json",
         400, "messages.0.role"),
        ("/chat/completions", {"model": model, "messages": "hi"}, "application/json", 400, "messages"),
    ]  # fmt: skip


def _burst(srv, client, model: str, answer, n_valid: int = 32) -> None:
    """`n_valid` concurrent completions (some streamed; request ``i`` asks ``1 + i % 4`` tokens of its own prompt)
    interleaved with every `_malformed` request (twice), clients that drop a stream or give up on a plain request,
    and a tiny-temperature request; then checks that each valid one got exactly one answer, its own, and each
    malformed one a 4xx in OpenAI's shape. `answer(prompt, max_tokens)` is the expected text."""
    import random

    prompts = [f"burst request {i:02d}" for i in range(n_valid)]

    def valid(i: int) -> tuple[str, int, str, str, str, int]:
        kw = {"model": model, "prompt": prompts[i], "max_tokens": 1 + i % 4, "temperature": 0}
        if i % 4 == 3:  # streamed
            with httpx.stream("POST", srv.base_url + "/completions", json={**kw, "stream": True}, timeout=60,
                              headers={"X-Request-Id": f"burst-{i}"}) as r:  # fmt: skip
                raw = r.read().decode()
            events = [e[len("data: ") :] for e in raw.split("\n\n") if e.startswith("data: ")]
            assert events[-1] == "[DONE]", raw
            chunks = [json.loads(e) for e in events[:-1]]
            (id_,) = {c["id"] for c in chunks}
            return "valid", i, r.headers["x-request-id"], id_, "".join(c["choices"][0]["text"] for c in chunks), 200
        got = client.completions.with_raw_response.create(**kw, extra_headers={"X-Request-Id": f"burst-{i}"})
        body = got.parse()
        assert len(body.choices) == 1 and body.usage.completion_tokens <= kw["max_tokens"]
        return "valid", i, got.headers["x-request-id"], body.id, body.choices[0].text, got.status_code

    def malformed(k: int) -> tuple[str, int, Any, int]:
        path, body, ctype, _, _ = bad[k % len(bad)]
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = httpx.post(srv.base_url + path, content=content, timeout=60,
                       headers={"content-type": ctype, "X-Request-Id": f"bad-{k}"})  # fmt: skip
        return "bad", k, r, 0

    def drop(k: int) -> tuple[str, int, None, None]:
        body = {"model": model, "messages": [{"role": "user", "content": f"drop {k}"}], "max_tokens": 30,
                "stream": True}  # fmt: skip
        with httpx.Client(timeout=60) as http:
            if k % 2:
                with http.stream("POST", srv.base_url + "/chat/completions", json=body) as r:
                    lines = r.iter_lines()
                    assert next(lines).startswith("data: ")  # gone after the first chunk
            else:  # a plain request whose client gives up
                try:
                    http.post(srv.base_url + "/completions", json={"model": model, "prompt": "x", "max_tokens": 30},
                              timeout=0.05)  # fmt: skip
                except httpx.TimeoutException:
                    pass
        return "drop", k, None, None

    def tiny_temperature() -> tuple[str, str, str]:
        kw = {"model": model, "prompt": prompts[0], "max_tokens": 4}
        got = client.completions.create(**kw, temperature=1e-300)  # the limit of sampling: greedy
        return "tiny-t", got.choices[0].text, answer(prompts[0], 4)

    bad = _malformed(model)
    calls = [lambda i=i: valid(i) for i in range(n_valid)]
    calls += [lambda k=k: malformed(k) for k in range(2 * len(bad))]
    calls += [lambda k=k: drop(k) for k in range(4)] + [tiny_temperature]
    random.Random(0).shuffle(calls)
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda f: f(), calls))

    answers = sorted((r for r in results if r[0] == "valid"), key=lambda r: r[1])
    assert [r[1] for r in answers] == list(range(n_valid))  # every valid request answered, once
    assert [r[2] for r in answers] == [f"burst-{i}" for i in range(n_valid)]  # each under its own request id
    assert all(r[5] == 200 for r in answers)
    assert len({r[3] for r in answers}) == n_valid and all(r[3].startswith("cmpl-") for r in answers)
    assert [r[4] for r in answers] == [answer(prompts[i], 1 + i % 4) for i in range(n_valid)]  # its own answer
    for _, k, r, _ in (r for r in results if r[0] == "bad"):
        _, _, _, status, param = bad[k % len(bad)]
        assert r.status_code == status, (bad[k % len(bad)], r.text)
        assert set(r.json()) == {"error"} and set(r.json()["error"]) == {"message", "type", "param", "code"}
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["param"] == param, (bad[k % len(bad)], err)
        assert err["message"] and "\n" not in err["message"] and r.headers["x-request-id"] == f"bad-{k}"
    ((_, got, want),) = [r for r in results if r[0] == "tiny-t"]
    assert got == want
    assert _wait_idle(srv, 20)["active"] == 0  # the dropped clients' slots are free
    after = client.completions.create(model=model, prompt=prompts[1], max_tokens=3, temperature=0)
    assert after.choices[0].text == answer(prompts[1], 3)  # and the server still answers


def test_burst_of_concurrent_valid_and_malformed_requests_fake(fake_server, fake_client, fake):
    fake.delay = 0.005  # the dropped streams are still running when their clients go
    _burst(fake_server, fake_client, "fake-model", lambda prompt, k: "x" * k)
    tok = make_byte_tokenizer()
    reqs = [h.request for h in fake.submitted]
    assert len({r.request_id for r in reqs}) == len(reqs)  # no request submitted twice
    sent = [tuple(encode_prompt(tok, f"burst request {i:02d}")) for i in range(32)]
    got = [tuple(r.prompt_ids) for r in reqs]
    # each valid prompt once; request 0's prompt also by the tiny-temperature one, request 1's by the one after
    assert [got.count(p) for p in sent] == [2, 2] + [1] * 30
    assert len(reqs) == 32 + 1 + 4 + 1  # nothing malformed reached the scheduler (+ 4 dropped, 1 after)


def test_burst_of_concurrent_valid_and_malformed_requests_tiny_llama(server, client, tiny, sched):
    _, tok = tiny
    refs: dict[tuple[str, int], str] = {}

    def answer(prompt: str, k: int) -> str:
        if (prompt, k) not in refs:
            refs[prompt, k] = _direct(sched, encode_prompt(tok, prompt), max_tokens=k, temperature=0).text
        return refs[prompt, k]

    for i in range(32):  # the references, computed before the burst
        answer(f"burst request {i:02d}", 1 + i % 4)
    answer("burst request 00", 4)
    _burst(server, client, "tiny", answer)


# ----------------------------------------------------------------------------------------------------------------
# real model (slow; not run in the fast suite)


@pytest.mark.slow
@pytest.mark.real_model
def test_smollm2_chat_stream_matches_and_echo_logprobs_equal_scoring(smollm2):
    model, tok = smollm2
    with Scheduler(model, tok, engine="fast", max_batch=4, max_context=1024) as s:
        with ServerThread(create_app(s, tok, served_name="smollm2")) as srv:
            c = openai.OpenAI(base_url=srv.base_url, api_key="EMPTY", max_retries=0, timeout=120)
            msgs = [{"role": "user", "content": "What is the capital of France?"}]
            whole = c.chat.completions.create(model="smollm2", messages=msgs, max_tokens=16, temperature=0)
            parts = list(c.chat.completions.create(model="smollm2", messages=msgs, max_tokens=16, temperature=0,
                                                   stream=True))  # fmt: skip
            assert "".join(p.choices[0].delta.content or "" for p in parts) == whole.choices[0].message.content
            assert "paris" in whole.choices[0].message.content.lower()
            text = "The capital of France is Paris."
            r = c.completions.create(model="smollm2", prompt=text, echo=True, logprobs=1, max_tokens=0)
            ids = encode_prompt(tok, text)
            ((want, _),) = continuation_logprobs(model, [ids[:1]], [ids[1:]])
            got = r.choices[0].logprobs.token_logprobs
            assert got[0] is None and torch.allclose(torch.tensor(got[1:]), torch.tensor(want), atol=1e-3)
