"""`lmlab.core.execution.backends.OpenAIBackend` against `lmlab serve` on loopback, in front of the tiny random llama.

Through HTTP and the official `openai` client, generate / chat / score must give what `LocalBackend` gives on the
same model (same text at temperature 0, log-probs within 1e-4), errors must come back as one line naming the URL,
and an API-only method (ralu, smoke preset, ``backend="openai:URL"``) must run end to end against the server
without loading a local model.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("openai")
app_mod = pytest.importorskip("lmlab.serve.app")
sched_mod = pytest.importorskip("lmlab.serve.scheduler")
testing_mod = pytest.importorskip("lmlab.serve.testing")

from lmlab.core.execution.backends import BackendHTTPError, BackendUnsupported, LocalBackend, OpenAIBackend  # noqa: E402
from lmlab.core.inference.tiny import make_byte_tokenizer, make_tiny_llama  # noqa: E402

pytestmark = pytest.mark.loopback

ATOL = 1e-4
# ralu's official system prompt alone is ~2,300 characters, one byte token each on the tiny tokenizer
MAX_CONTEXT = 8192


@pytest.fixture(scope="module")
def tiny():
    return make_tiny_llama(0), make_byte_tokenizer()


@pytest.fixture(scope="module")
def sched(tiny):
    model, tok = tiny
    s = sched_mod.Scheduler(model, tok, engine="fast", max_batch=8, max_context=MAX_CONTEXT)
    yield s
    s.close()


@pytest.fixture(scope="module")
def server(tiny, sched):
    _, tok = tiny
    with testing_mod.ServerThread(app_mod.create_app(sched, tok, served_name="tiny")) as srv:
        yield srv


@pytest.fixture()
def remote(server):
    return OpenAIBackend(server.base_url, "tiny", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def local(tiny):
    return LocalBackend(*tiny)


def _close(a, b):
    assert a is not None and b is not None and len(a) == len(b)
    return torch.allclose(torch.tensor(a), torch.tensor(b), atol=ATOL)


@pytest.mark.parametrize("prompt", ["The capital of France is", "def f(x):\n    return", "abc"])
def test_generate_through_the_server_equals_local(remote, local, prompt):
    (want,) = local.generate(prompt, max_tokens=16, logprobs=True)
    (got,) = remote.generate(prompt, max_tokens=16, logprobs=True)
    assert got.text == want.text and got.finish_reason == want.finish_reason == "length"
    assert _close(got.token_logprobs, want.token_logprobs)
    assert (got.n_prompt_tokens, got.n_completion_tokens) == (want.n_prompt_tokens, want.n_completion_tokens)
    # a stop string: both cut before it and finish with "stop"
    stop = want.text[4]
    (a,) = local.generate(prompt, max_tokens=16, stop=[stop])
    (b,) = remote.generate(prompt, max_tokens=16, stop=[stop])
    assert a.text == b.text == want.text[: want.text.index(stop)] and a.finish_reason == b.finish_reason == "stop"
    # n greedy choices: n copies of the same text, each with its own token count
    many = remote.generate(prompt, max_tokens=8, n=3)
    assert [c.text for c in many] == [local.generate(prompt, max_tokens=8)[0].text] * 3
    assert [c.n_completion_tokens for c in many] == [8, 8, 8]


def test_an_answer_that_ends_at_eos_is_counted_alike(remote, local):
    # "1+1=" reaches EOS after 28 tokens on this seed: both report "stop" and count the EOS token alike
    (want,) = local.generate("1+1=", max_tokens=200, logprobs=True)
    (got,) = remote.generate("1+1=", max_tokens=200, logprobs=True)
    assert want.finish_reason == got.finish_reason == "stop" and want.n_completion_tokens < 200
    assert got.text == want.text and got.n_completion_tokens == want.n_completion_tokens
    assert _close(got.token_logprobs, want.token_logprobs)


def test_chat_through_the_server_equals_local(remote, local):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
    want = local.chat(msgs, max_tokens=24, logprobs=True)
    got = remote.chat(msgs, max_tokens=24, logprobs=True)
    assert got.text == want.text and _close(got.token_logprobs, want.token_logprobs)
    assert got.n_prompt_tokens == want.n_prompt_tokens and got.finish_reason == want.finish_reason
    assert remote.chat(msgs, max_tokens=24).token_logprobs is None  # only when asked
    # a multi-turn dialogue goes through the same template on both sides
    turns = [*msgs, {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3 + 3?"}]
    assert remote.chat(turns, max_tokens=12).text == local.chat(turns, max_tokens=12).text


@pytest.mark.parametrize(
    "context, continuation",
    [("The cat", " sat on the mat"), ("x", "y"), ("Question: 2 + 2 =", " 4\n"), ("long " * 200, "tail")],
)
def test_score_through_the_server_equals_local(remote, local, context, continuation):
    want = local.score(context, continuation)
    got = remote.score(context, continuation)
    assert len(got) == len(continuation)  # one byte token per character on the tiny tokenizer
    assert _close(got, want)


def test_errors_are_one_line_naming_the_url(server):
    wrong = OpenAIBackend(server.base_url, "not-served", max_retries=0)
    with pytest.raises(BackendHTTPError) as info:
        wrong.chat([{"role": "user", "content": "hi"}], max_tokens=2)
    message = str(info.value)
    assert message.startswith(f"{server.base_url}/chat/completions answered HTTP 404:") and "\n" not in message
    assert "not-served" in message
    # a wrong model name is not "this server cannot score": it is the caller's to fix
    with pytest.raises(BackendHTTPError) as info:
        wrong.score("a", "b")
    assert not isinstance(info.value, BackendUnsupported) and info.value.status_code == 404


def test_ralu_smoke_runs_end_to_end_against_the_server(server, sched, monkeypatch, tmp_path):
    from lmlab.runner import RunContext, run_method

    def no_local_model(self, *args, **kwargs):
        raise AssertionError("ralu on an API backend must not load a local model")

    monkeypatch.setattr(RunContext, "load_model", no_local_model)
    before = sched.stats()["generated_tokens"]
    backend = f"openai:{server.base_url}#tiny"
    result = run_method("ralu", preset="smoke", model="tiny-llama", backend=backend, openai_max_tokens=16,
                        folder=tmp_path / "ralu", show_progress=False, raise_errors=True, threads=1)  # fmt: skip
    assert result.run_info["status"] == "ok" and result.config["backend"] == backend
    assert result.flags["llm_backend"] == f"openai:{server.base_url}#tiny"
    rows = {(m.system, m.metric): m for m in result.metrics}
    for system in ("ralu_cfg", "ralu_line", "whole_refine", "initial"):
        assert rows[(system, "pass@1")].n == 1
    assert rows[("ralu_cfg", "llm_calls")].value >= 1 and rows[("ralu_cfg", "tokens")].value > 0
    assert result.claims  # the verdict itself does not matter on a random model
    # the calls reached the server: it generated tokens for them (at most 16 per call)
    generated = sched.stats()["generated_tokens"] - before
    assert 0 < generated <= 16 * sum(rows[(s, "llm_calls")].value for s in ("ralu_cfg", "ralu_line", "whole_refine"))
    assert (tmp_path / "ralu" / "result.json").exists()


# ----------------------------------------------------------------------------------------------------------------
# real model (slow; not run in the fast suite)


@pytest.mark.slow
@pytest.mark.real_model
def test_smollm2_through_the_server_equals_local(smollm2):
    """A BPE tokenizer and a real chat template: pieces of several characters, merges across the score boundary."""
    model, tok = smollm2
    local = LocalBackend(model, tok)
    with sched_mod.Scheduler(model, tok, engine="fast", max_batch=4, max_context=1024) as s:
        with testing_mod.ServerThread(app_mod.create_app(s, tok, served_name="smollm2")) as srv:
            remote = OpenAIBackend(srv.base_url, "smollm2", max_retries=0, timeout=120)
            msgs = [{"role": "user", "content": "What is the capital of France?"}]
            want, got = local.chat(msgs, max_tokens=16, logprobs=True), remote.chat(msgs, max_tokens=16, logprobs=True)
            assert got.text == want.text and "paris" in got.text.lower()
            assert torch.allclose(torch.tensor(got.token_logprobs), torch.tensor(want.token_logprobs), atol=1e-3)
            # " Paris." and "Par" + "is" split mid-word: the boundary token belongs to the continuation on both sides
            for context, continuation in [("The capital of France is", " Paris."), ("The capital of France is Par",
                                                                                   "is.")]:  # fmt: skip
                a, b = local.score(context, continuation), remote.score(context, continuation)
                assert len(a) == len(b) and torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-3)
