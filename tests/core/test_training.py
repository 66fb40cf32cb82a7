"""The shared pretraining loop: seeded data order, learning actually happens, schedules and groups behave."""

from __future__ import annotations

import math

import pytest
import torch

from lmlab.core.inference.tiny import make_word_tokenizer, tiny_config
from lmlab.core.training.pretrain import (
    WindowSampler,
    cosine_lr,
    count_parameters,
    encode_documents,
    eval_lm_loss,
    lm_loss,
    pretrain_lm,
)
from lmlab.data.fact_corpus import documents


@pytest.fixture(scope="module")
def stream():
    docs = documents(120, seed=0)
    tok = make_word_tokenizer(docs, max_vocab=512)
    ids = encode_documents(tok, docs)
    return tok, ids


def _model(vocab: int, seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config("llama", n_layers=2, hidden=32, vocab_size=vocab)
    cfg.tie_word_embeddings = False
    return AutoModelForCausalLM.from_config(cfg)


def test_window_sampler_is_seeded(stream):
    _, ids = stream
    a = next(WindowSampler(ids, 16, 4, seed=3))
    b = next(WindowSampler(ids, 16, 4, seed=3))
    assert a.shape == (4, 17) and torch.equal(a, b)
    assert not torch.equal(a, next(WindowSampler(ids, 16, 4, seed=4)))
    with pytest.raises(ValueError, match="shorter"):
        WindowSampler(ids[:10], 16, 4)


def test_pretraining_lowers_the_loss_and_is_deterministic(stream):
    tok, ids = stream
    split = int(len(ids) * 0.9)
    runs = []
    for _ in range(2):
        model = _model(len(tok))
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        start = eval_lm_loss(model, ids[split:], seq_len=32)
        result = pretrain_lm(model, ids[:split], steps=40, batch_size=8, seq_len=32, lr=1e-2, warmup=5, seed=0,
                             eval_ids=ids[split:], eval_every=20)  # fmt: skip
        runs.append(result)
        assert result.final_eval_loss < start - 0.5  # it learns
        assert all(not torch.equal(before[n], p) for n, p in model.named_parameters())  # every parameter moved
        assert result.tokens == 40 * 8 * 32 and result.eval_steps == [20, 40]
    assert runs[0].losses == runs[1].losses  # same seeds, same data order, same numbers


def test_eval_loss_matches_a_hand_computation(stream):
    tok, ids = stream
    model = _model(len(tok)).eval()
    windows = torch.stack([ids[i * 16 : i * 16 + 17] for i in range(3)])
    with torch.no_grad():
        logits = model(input_ids=windows[:, :-1]).logits
        want = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))
    assert math.isclose(eval_lm_loss(model, ids[: 3 * 16 + 1], seq_len=16), float(want), rel_tol=1e-5)
    assert math.isclose(float(lm_loss(model, windows)), float(want), rel_tol=1e-5)


def test_fixed_lr_group_and_schedule(stream):
    tok, ids = stream
    model = _model(len(tok))
    head = list(model.lm_head.parameters())
    rest = [p for n, p in model.named_parameters() if not n.startswith("lm_head")]
    groups = [{"params": rest}, {"params": head, "lr": 1e-3, "fixed_lr": True}]
    result = pretrain_lm(model, ids, steps=6, batch_size=2, seq_len=8, lr=1e-2, warmup=2, param_groups=groups)
    assert all(lrs[1] == 1e-3 for lrs in result.lrs)  # the fixed group ignores the schedule
    assert result.lrs[0][0] < result.lrs[1][0] and result.lrs[-1][0] < result.lrs[1][0]  # warm-up, then decay
    assert cosine_lr(0, steps=10, warmup=0, min_ratio=0.1) == 1.0
    assert math.isclose(cosine_lr(10, steps=10, warmup=0, min_ratio=0.1), 0.1)


def test_count_parameters(stream):
    tok, _ = stream
    model = _model(len(tok))
    total = sum(p.numel() for p in model.parameters())
    assert count_parameters(model) == total
    assert count_parameters(model, exclude_embeddings=True) == total - model.get_input_embeddings().weight.numel()
