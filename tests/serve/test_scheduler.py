"""The continuous-batching scheduler of `lmlab serve`, on the tiny model (no HTTP)."""

from __future__ import annotations

import time

import pytest
import torch

from lmlab.core.inference.generation import decode
from lmlab.core.inference.scoring import token_logprobs
from lmlab.core.inference.tiny import make_byte_tokenizer, make_tiny_model
from lmlab.serve.scheduler import GenRequest, Scheduler, TextStream

PROMPTS = ["The capital of France", "Once upon a time, in a land far away, there lived", "1, 2, 3,"]


@pytest.fixture(scope="module")
def tiny():
    return make_tiny_model(0, arch="llama", n_layers=2), make_byte_tokenizer()


@pytest.fixture()
def sched(tiny):
    model, tok = tiny
    s = Scheduler(model, tok, engine="fast", max_batch=8, max_context=512)
    yield s
    s.close()


def _ids(tok, text):
    return tok(text)["input_ids"]


def test_concurrent_greedy_requests_match_decoding_alone(tiny, sched):
    model, tok = tiny
    handles = []
    for i, p in enumerate(PROMPTS):  # staggered: later ones join a running batch
        handles.append(sched.submit(GenRequest(_ids(tok, p), max_tokens=20, temperature=0, logprobs=0,
                                               request_id=f"r{i}")))  # fmt: skip
        time.sleep(0.01)
    for h, p in zip(handles, PROMPTS):
        fin = h.result(timeout=60)
        alone = decode(model, tok, _ids(tok, p), max_new_tokens=20, eos_token_id=2, engine="fast")
        assert [t.token_id for t in fin.tokens] == alone.token_ids, fin.request_id
        assert torch.allclose(torch.tensor([t.logprob for t in fin.tokens]), torch.tensor(alone.token_logprobs),
                              atol=1e-4)  # fmt: skip
        assert fin.n_completion_tokens == len(alone.token_ids) and fin.n_prompt_tokens == len(_ids(tok, p))
        assert fin.finish_reason == ("stop" if alone.stop_reason == "eos" else "length")
    assert sched.stats()["steps"] < sum(len(h.result().tokens) for h in handles)  # rows shared steps


def test_echo_logprobs_equal_scoring(tiny, sched):
    model, tok = tiny
    ids = _ids(tok, PROMPTS[1])
    fin = sched.submit(GenRequest(ids, max_tokens=0, logprobs=2, echo_logprobs=True)).result(timeout=30)
    assert fin.tokens == [] and fin.finish_reason == "length"
    assert fin.prompt_tokens[0].logprob is None and [t.token_id for t in fin.prompt_tokens] == ids
    want = token_logprobs(model, torch.tensor([ids]))[0]
    got = torch.tensor([t.logprob for t in fin.prompt_tokens[1:]])
    assert torch.allclose(got, want, atol=1e-4)
    assert all(len(t.top) == 2 and t.top[0][2] >= t.top[1][2] for t in fin.prompt_tokens[1:])


@pytest.mark.parametrize("engine", ["fast", "hf"])
@pytest.mark.parametrize("ending", ["length", "stop"])
def test_deltas_join_to_the_final_text_and_tokens(tiny, engine, ending):
    model, tok = tiny
    ids = _ids(tok, PROMPTS[0])
    with Scheduler(model, tok, engine=engine) as s:
        free = s.submit(GenRequest(ids, max_tokens=16, temperature=0)).result(30)
        assert free.finish_reason == "length"  # this prompt runs to the budget
        # a budget whose last token completes a character, so the last token's own text must reach the deltas
        gen = [t.token_id for t in free.tokens]
        n = max(k for k in range(1, 17) if not tok.decode(gen[:k]).endswith("\ufffd"))
        free = s.submit(GenRequest(ids, max_tokens=n, temperature=0)).result(30)
        assert len(free.text) >= 6, free.text
        stop = [free.text[4:6]] if ending == "stop" else []
        h = s.submit(GenRequest(ids, max_tokens=n, temperature=0, stop=stop))
        fin = h.result(timeout=30)
    assert fin.finish_reason == ending
    assert fin.text == (free.text[: free.text.index(stop[0])] if stop else free.text)
    deltas = h.deltas()
    assert "".join(d.text for d in deltas) == fin.text
    assert [t.token_id for d in deltas for t in d.tokens] == [t.token_id for t in fin.tokens]


def test_seeded_sampling_does_not_depend_on_batch_companions(tiny, sched):
    _, tok = tiny
    req = dict(max_tokens=16, temperature=1.0, top_p=0.9, seed=7)
    alone = sched.submit(GenRequest(_ids(tok, PROMPTS[2]), **req)).result(timeout=30)
    others = [sched.submit(GenRequest(_ids(tok, p), max_tokens=16, temperature=1.0, seed=i))
              for i, p in enumerate(PROMPTS)]  # fmt: skip
    again = sched.submit(GenRequest(_ids(tok, PROMPTS[2]), **req)).result(timeout=30)
    for o in others:
        o.result(timeout=30)
    assert [t.token_id for t in again.tokens] == [t.token_id for t in alone.tokens]
    other_seed = sched.submit(GenRequest(_ids(tok, PROMPTS[2]), **{**req, "seed": 8})).result(timeout=30)
    assert [t.token_id for t in other_seed.tokens] != [t.token_id for t in alone.tokens]


def test_more_requests_than_slots_all_finish(tiny):
    model, tok = tiny
    with Scheduler(model, tok, max_batch=2) as s:
        hs = [s.submit(GenRequest(_ids(tok, p), max_tokens=8, temperature=0, request_id=str(i)))
              for i, p in enumerate(PROMPTS * 2)]  # fmt: skip
        fins = [h.result(timeout=60) for h in hs]
    assert [f.request_id for f in fins] == [str(i) for i in range(6)]
    assert fins[0].text == fins[3].text  # the same prompt, greedy, in different batches


def test_cancel_frees_the_slot(tiny, sched):
    _, tok = tiny
    h = sched.submit(GenRequest(_ids(tok, PROMPTS[1]), max_tokens=400, temperature=1.0, seed=0))
    deadline = time.time() + 20
    while sched.stats()["active"] == 0 and time.time() < deadline:
        time.sleep(0.005)
    h.cancel()
    fin = h.result(timeout=20)
    assert fin.finish_reason == "cancelled" and len(fin.tokens) < 400
    assert sched.stats()["active"] == 0


def test_hf_engine_gives_the_same_greedy_tokens(tiny, sched):
    model, tok = tiny
    with Scheduler(model, tok, engine="hf") as s:
        hf = s.submit(GenRequest(_ids(tok, PROMPTS[0]), max_tokens=12, temperature=0, logprobs=1)).result(30)
    fast = sched.submit(GenRequest(_ids(tok, PROMPTS[0]), max_tokens=12, temperature=0, logprobs=1)).result(30)
    assert [t.token_id for t in hf.tokens] == [t.token_id for t in fast.tokens]
    assert hf.text == fast.text and hf.n_completion_tokens == fast.n_completion_tokens


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prompt_ids": []}, "prompt is empty"),
        ({"max_tokens": -1}, "max_tokens must be >= 0, got -1"),
        ({"max_tokens": 600}, "exceeds the context limit of 512"),
        ({"temperature": -0.5}, "temperature must be >= 0"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"prompt_ids": [5, 99999]}, "token id 99999 is outside the vocabulary"),
        ({"seed": 2**70}, "seed must be in"),  # torch's generator would overflow inside the batch
    ],
)
def test_bad_requests_are_refused_with_the_value(tiny, sched, kwargs, message):
    _, tok = tiny
    fields = {"prompt_ids": _ids(tok, "hi"), **kwargs}
    with pytest.raises(ValueError, match=message):
        sched.submit(GenRequest(**fields))


def test_one_failing_request_does_not_fail_its_batch_companions(tiny, sched, monkeypatch):
    """A request whose sampling goes wrong ends alone; before, the worker failed every running row with it."""
    _, tok = tiny
    victim = sched.submit(GenRequest(_ids(tok, PROMPTS[1]), max_tokens=200, temperature=0, request_id="victim"))
    deadline = time.time() + 20
    while sched.stats()["active"] == 0 and time.time() < deadline:
        time.sleep(0.005)
    # a temperature so small that logits / temperature overflows samples at its limit, greedy
    tiny_t = sched.submit(GenRequest(_ids(tok, "hi"), max_tokens=6, temperature=1e-300, request_id="tiny-t"))
    greedy = sched.submit(GenRequest(_ids(tok, "hi"), max_tokens=6, temperature=0))
    assert tiny_t.result(30).error is None and tiny_t.result().text == greedy.result(30).text
    # any other failure of one row (here a planted one) finishes that row with an error, alone
    real_choose = sched._choose

    def choose(row, logits):
        if row.request.request_id == "boom" and row.tokens:
            raise RuntimeError("planted")
        return real_choose(row, logits)

    monkeypatch.setattr(sched, "_choose", choose)
    boom = sched.submit(GenRequest(_ids(tok, "hi"), max_tokens=20, temperature=0, request_id="boom"))
    assert boom.result(30).error == "RuntimeError: planted" and boom.result().finish_reason == "error"
    fin = victim.result(60)
    assert fin.error is None and fin.finish_reason in ("length", "stop") and fin.n_completion_tokens > 6


class _CharTok:
    """decode() of ids as characters, for TextStream tests."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def test_text_stream_holds_back_a_possible_stop_string():
    s = TextStream(_CharTok(), stop=["END"])
    out = [s.push(ord(c)) for c in "abcE"]
    assert "".join(out) == "abc"  # 'E' may start "END"
    assert s.push(ord("x")) == "Ex" and not s.stopped
    for c in "yEN":
        s.push(ord(c))
    s.push(ord("D"))
    assert s.stopped and s.text == "abcExy" and s.flush() == ""
    assert s.released == len(s.text)


def test_text_stream_holds_back_an_incomplete_character():
    class Bytes:
        def decode(self, ids, skip_special_tokens=True):
            return bytes(ids).decode("utf-8", errors="replace")

    s = TextStream(Bytes())
    euro = "€".encode()
    assert s.push(ord("a")) == "a"
    assert s.push(euro[0]) == "" and s.push(euro[1]) == ""
    assert s.push(euro[2]) == "€"


def test_penalize_closed_form():
    from lmlab.core.inference.generation import penalize

    logits = torch.zeros(6)
    out = penalize(logits, [2, 2, 5], frequency=0.5, presence=0.25)
    assert out.tolist() == [0, 0, -1.25, 0, 0, -0.75]
    assert penalize(logits, [], 1.0, 1.0) is logits


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_penalties_change_the_choice_and_leave_log_probs_raw(tiny, engine):
    model, tok = tiny
    ids = _ids(tok, PROMPTS[2])
    with Scheduler(model, tok, engine=engine) as s:
        plain = s.submit(GenRequest(ids, max_tokens=24, temperature=0, logprobs=0)).result(30)
        # negative penalties favour repetition: the random tiny model does not repeat by itself
        pen = s.submit(
            GenRequest(ids, max_tokens=24, temperature=0, logprobs=0, frequency_penalty=-2.0, presence_penalty=-1.0)
        ).result(30)  # fmt: skip
    gen = [t.token_id for t in plain.tokens]
    got = [t.token_id for t in pen.tokens]
    assert got != gen
    # each penalised choice is the argmax of the raw logits minus the penalties of what came before
    seq = list(ids)
    for k, t in enumerate(pen.tokens):
        with torch.no_grad():
            raw = model(input_ids=torch.tensor([seq])).logits[0, -1]
        lp = torch.log_softmax(raw, -1)
        assert abs(float(lp[t.token_id]) - t.logprob) < 1e-4  # reported log-prob: the raw distribution's
        counts = torch.bincount(torch.tensor(got[:k], dtype=torch.long), minlength=raw.shape[-1]).float()
        assert t.token_id == int((raw + 2.0 * counts + 1.0 * (counts > 0).float()).argmax())
        seq.append(t.token_id)
        if k >= 8:
            break


def test_bad_penalty_is_named(tiny, sched):
    _, tok = tiny
    with pytest.raises(ValueError, match=r"frequency_penalty must be in \[-2, 2\], got 3"):
        sched.submit(GenRequest(_ids(tok, "hi"), frequency_penalty=3.0))
