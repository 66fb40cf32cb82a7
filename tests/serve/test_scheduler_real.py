"""The scheduler on SmolLM2: batching pays (8 concurrent requests beat 8 sequential ones), outputs unchanged."""

from __future__ import annotations

import time

import pytest

from lmlab.core.inference.generation import decode
from lmlab.core.inference.scoring import chat_prompt, encode_prompt
from lmlab.serve.scheduler import GenRequest, Scheduler

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "Write one sentence about the sea.",
    "What is 12 plus 7?",
    "Give a synonym for happy.",
    "Why is the sky blue?",
    "List two fruits that are red.",
    "What does a bee make?",
]


def _ids(tok, q):
    return encode_prompt(tok, chat_prompt(tok, q))


def test_concurrent_requests_get_more_tokens_per_second_with_the_same_text(smollm2):
    model, tok = smollm2
    prompts = [_ids(tok, q) for q in QUESTIONS]
    with Scheduler(model, tok, engine="fast", max_batch=8) as s:
        s.submit(GenRequest(prompts[0], max_tokens=8, temperature=0)).result(120)  # warm-up
        t0 = time.perf_counter()
        sequential = [s.submit(GenRequest(p, max_tokens=24, temperature=0)).result(120) for p in prompts]
        t_seq = time.perf_counter() - t0
        t0 = time.perf_counter()
        handles = [s.submit(GenRequest(p, max_tokens=24, temperature=0)) for p in prompts]
        concurrent = [h.result(120) for h in handles]
        t_con = time.perf_counter() - t0
    tokens_seq = sum(f.n_completion_tokens for f in sequential)
    tokens_con = sum(f.n_completion_tokens for f in concurrent)
    assert tokens_seq == tokens_con
    # the same greedy text, batched or not (and as `decode` alone gives it)
    assert [f.text for f in concurrent] == [f.text for f in sequential]
    alone = decode(model, tok, prompts[3], max_new_tokens=24, engine="fast")
    assert sequential[3].text == alone.text
    speedup = (tokens_con / t_con) / (tokens_seq / t_seq)
    assert speedup > 1.5, f"8 concurrent requests were only {speedup:.2f}x the tokens/s of 8 sequential ones"
