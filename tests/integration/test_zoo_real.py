"""The response-cache zoo on SmolLM2-135M: the real model beats the junk floor, truncation buys cost.

A trimmed build (16 mixed queries, 3 variants, ~1 min on 2 cores): SmolLM2 zero-shot answers more queries correctly
than the random tiny llama (which answers none of them in practice), and its first 10 blocks cost fewer FLOPs on
every query than the full 30 (same prompts, cost = 2 x flop params x tokens with the head counted in both).
"""

from __future__ import annotations

import numpy as np
import pytest

from lmlab.zoo.build import build_cache

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_smol_beats_tiny_random_and_trunc10_is_cheaper(smollm2, tmp_path):
    cache = build_cache("mixed", 0, 16, variants=["smol", "smol-trunc10", "tiny-random"], out=tmp_path,
                        progress=False)  # fmt: skip
    assert not cache.failed, cache.failed
    acc = {v: t["all"] for v, t in cache.accuracy_table().items()}
    assert acc["smol"] > acc["tiny-random"]
    vids, _, cost = cache.matrix("cost_flops", variants=["smol", "smol-trunc10"])
    _, _, prompt = cache.matrix("n_prompt_tokens", variants=["smol", "smol-trunc10"])
    assert (prompt[0] == prompt[1]).all()  # same prompts and tokenizer
    assert cost[1].mean() < cost[0].mean()
    p = {v: cache.variants[v]["flop_params"] for v in vids}
    assert p["smol-trunc10"] < 0.5 * p["smol"]  # 10 of 30 blocks plus the shared head
    assert np.isfinite(cost).all()
