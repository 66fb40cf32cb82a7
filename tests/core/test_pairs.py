"""Invariants of the cached-pair kit (`lmlab.core.training.pairs`) on the tiny llama: cached scores equal the full
model's,
row slices of a cache score like the full batch, and `policy_model` decodes a TopK's blocks without touching the
model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmlab.core.inference.tiny import make_byte_tokenizer, make_tiny_llama
from lmlab.core.training import pairs as P
from lmlab.core.training.partial import FrozenTrunk
from lmlab.core.training.preference import seq_logprobs

PROMPTS = ["What is the capital of Norway?", "Name a colour.", "2 + 2 ="]
CHOSEN = ["The capital of Norway is Oslo.", "Blue.", " 4"]
REJECTED = ["Bergen, a lovely city by the sea.", "A colour is a thing.", " 5, clearly"]


@pytest.fixture(scope="module")
def tiny():
    return make_tiny_llama(seed=5, n_layers=3), make_byte_tokenizer()


def test_cached_pair_scores_equal_full_model_and_slices_equal_full_batch(tiny):
    model, tok = tiny
    ps, cs, rs = P.format_pairs(tok, PROMPTS, CHOSEN, REJECTED)
    with torch.no_grad():
        full = seq_logprobs(model, tok, ps + ps, cs + rs, chat=False)  # rows [chosen; rejected]
    trunk = FrozenTrunk(model, 2)
    pairs = P.encode_pairs(trunk, tok, PROMPTS, CHOSEN, REJECTED)
    assert pairs.n_pairs == 3 and pairs.rows([0, 2]).tolist() == [0, 2, 3, 5]
    sc = P.score_pairs(trunk.reference, pairs, batch_size=4)  # chunks cross the chosen/rejected boundary
    np.testing.assert_allclose(np.r_[sc.chosen_sum, sc.rejected_sum], full.sum.double().numpy(), atol=1e-4)
    np.testing.assert_array_equal(np.r_[sc.chosen_len, sc.rejected_len], full.n_tokens.numpy())
    # any subset of rows, in any order, scores as those rows of the full batch
    rows = torch.tensor([4, 1, 3])
    sub = P.response_logps(trunk.reference, P.slice_cache(pairs.cache, rows), pairs.response_mask[rows])
    np.testing.assert_allclose(sub.sum.double().numpy(), full.sum[rows].double().numpy(), atol=1e-4)


def test_policy_model_uses_the_topk_blocks_and_leaves_the_model_alone(tiny):
    model, tok = tiny
    trunk = FrozenTrunk(model, 1)
    policy = trunk.top_k()
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.tensor([tok("Name a colour.")["input_ids"]])
    with torch.no_grad():
        full = P.policy_model(model, policy)
        got = full(input_ids=ids).logits
        want = policy(trunk(ids))  # the TopK on the cached trunk
        same = P.policy_model(model, trunk.reference)(input_ids=ids).logits
        base = model(input_ids=ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(same, base, atol=1e-5, rtol=1e-4)
    assert full.get_input_embeddings() is model.get_input_embeddings()  # shared, not copied
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_bad_input_raises_one_line_errors(tiny):
    model, tok = tiny
    trunk = FrozenTrunk(model, 1)
    with pytest.raises(ValueError, match="no preference pairs"):
        P.encode_pairs(trunk, tok, [], [], [])
    with pytest.raises(ValueError, match="got 2 prompts, 1 chosen"):
        P.format_pairs(tok, ["a", "b"], ["c"], ["d", "e"])
    pairs = P.encode_pairs(trunk, tok, PROMPTS, CHOSEN, REJECTED)
    with pytest.raises(ValueError, match=r"rows must be .* in \[0, 6\)"):
        P.slice_cache(pairs.cache, [6])
    with pytest.raises(ValueError, match="batch_size"):
        P.score_pairs(trunk.reference, pairs, batch_size=0)
