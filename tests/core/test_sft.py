"""lmlab.core.training.sft: trunk-cached scores equal the full model, SFT of the top blocks lowers the loss and leaves
the model
untouched, the encoding boundary, and one-line errors (tiny models only)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmlab.core.training.partial import FrozenTrunk
from lmlab.core.training.sft import SeqCache, encode_sequences, sequence_scores, sft_top_k

PROMPTS = ["What is 12 plus 30?\n", "Reverse the word cat.\n", "What is 11 plus 31?\n", "Capital of Peru?\n", "Hi\n"]
RESPONSES = ["SUM=(42)", "REV|tac|", "SUM=(42)", "ANSWER[Lima]", "ab"]


def test_encode_sequences_splits_at_the_prompt_boundary(tiny_tokenizer):
    from lmlab.core.inference.scoring import encode

    seqs = encode_sequences(tiny_tokenizer, PROMPTS, RESPONSES)
    for (ids, n_prompt), p, r in zip(seqs, PROMPTS, RESPONSES):
        assert ids == encode(tiny_tokenizer, p + r)
        assert 0 < n_prompt < len(ids)
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        encode_sequences(tiny_tokenizer, PROMPTS[:2], RESPONSES[:1])


def test_cached_scores_equal_the_full_model(tiny_llama, tiny_tokenizer):
    from lmlab.core.training.preference import seq_logprobs

    trunk = FrozenTrunk(tiny_llama, 1)
    cache = SeqCache(trunk, encode_sequences(tiny_tokenizer, PROMPTS, RESPONSES))
    assert len(cache.groups) < len(PROMPTS)  # sequences of one length share a forward
    got = sequence_scores(trunk.reference, cache, [4, 0, 2, 1, 3])
    with torch.no_grad():
        ref = seq_logprobs(tiny_llama, tiny_tokenizer, PROMPTS, RESPONSES)
    assert np.allclose([got[i] for i in range(5)], ref.sum.numpy(), atol=1e-4)


def test_sft_lowers_the_loss_changes_only_the_copy_and_is_seeded(tiny_llama, tiny_tokenizer):
    from types import SimpleNamespace

    trunk = FrozenTrunk(tiny_llama, 1)
    cache = SeqCache(trunk, encode_sequences(tiny_tokenizer, PROMPTS, RESPONSES))
    before = {n: p.detach().clone() for n, p in tiny_llama.named_parameters()}
    cfg = SimpleNamespace(lr=3e-3, epochs=8, train_batch=2)
    policy, losses = sft_top_k(trunk, cache, range(5), cfg, seed=0)
    assert len(losses) == 8 * 3  # epochs x ceil(5 / 2) steps
    assert np.mean(losses[-3:]) < np.mean(losses[:3])
    assert all(torch.equal(p, before[n]) for n, p in tiny_llama.named_parameters())
    trained = sequence_scores(policy, cache, range(5))
    base = sequence_scores(trunk.reference, cache, range(5))
    assert sum(trained.values()) > sum(base.values())
    _, again = sft_top_k(trunk, cache, range(5), cfg, seed=0)
    assert again == pytest.approx(losses)  # same seed, same order, same steps
    with pytest.raises(ValueError, match="seq_ids is empty"):
        sft_top_k(trunk, cache, [], cfg, seed=0)
