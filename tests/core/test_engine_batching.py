"""`lmlab.core.inference.engine.batching.regroup`: rows of separately prefilled caches decode together as if alone."""

from __future__ import annotations

import pytest
import torch

from lmlab.core.inference.engine import get_engine
from lmlab.core.inference.engine.batching import regroup, row_tokens
from lmlab.core.inference.tiny import make_tiny_model


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def engine(request):
    model = make_tiny_model(0, arch=request.param, n_layers=2)
    return get_engine(model, "fp32")


def _alone(engine, prompt, steps):
    """Greedy logits of `prompt` decoded alone on a batch-1 cache: [steps + 1, vocab]."""
    cache = engine.new_cache(1, len(prompt) + steps + 2)
    logits = [engine.forward(torch.tensor([prompt]), cache)[0]]
    for _ in range(steps):
        tok = int(logits[-1].argmax())
        logits.append(engine.forward(torch.tensor([[tok]]), cache)[0])
    return torch.stack(logits)


def _prefill(engine, prompt):
    cache = engine.new_cache(1, len(prompt) + 4)
    return cache, engine.forward(torch.tensor([prompt]), cache)[0]


# prompt lengths straddle gemma3's sliding window (16): short rows, a row past the window, rows joining late
PROMPTS = [[5, 9, 14, 3], list(range(10, 31)), [40, 41, 42, 43, 44, 45, 46, 47, 48]]


def test_rows_joining_and_leaving_decode_as_if_alone(engine):
    steps = 12
    want = [_alone(engine, p, steps) for p in PROMPTS]
    got: list[list[torch.Tensor]] = [[] for _ in PROMPTS]
    # rows 0 and 1 start together; row 2 joins after 4 steps; row 0 leaves after 8 steps
    caches, last = [], []
    for i in (0, 1):
        c, lg = _prefill(engine, PROMPTS[i])
        caches.append(c)
        got[i].append(lg)
        last.append(int(lg.argmax()))
    cache = regroup([(c, [0]) for c in caches])
    rows = [0, 1]
    for step in range(1, steps + 1 + 4):
        if step == 5:
            c2, lg = _prefill(engine, PROMPTS[2])
            got[2].append(lg)
            cache = regroup([(cache, range(len(rows))), (c2, [0])])
            rows.append(2)
            last.append(int(lg.argmax()))
        if step == 9:
            keep = [j for j, r in enumerate(rows) if r != 0]
            cache = regroup([(cache, keep)])
            rows, last = [rows[j] for j in keep], [last[j] for j in keep]
        logits = engine.forward(torch.tensor([[t] for t in last]), cache)
        last = []
        for j, r in enumerate(rows):
            if len(got[r]) <= steps:
                got[r].append(logits[j])
            last.append(int(logits[j].argmax()))
        if all(len(g) > steps for g in got[1:]):
            break
    assert len(got[0]) == 9  # prefill + 8 steps before it left
    for r, (g, w) in enumerate(zip(got, want)):
        g = torch.stack(g)
        assert torch.allclose(g, w[: len(g)], atol=1e-4), f"row {r} drifted: {float((g - w[: len(g)]).abs().max())}"
        assert g.argmax(-1).tolist() == w[: len(g)].argmax(-1).tolist()


def test_regroup_drops_columns_every_row_pads(engine):
    long_cache, _ = _prefill(engine, PROMPTS[1])
    short_cache, _ = _prefill(engine, PROMPTS[0])
    both = regroup([(long_cache, [0]), (short_cache, [0])])
    assert both.length == len(PROMPTS[1]) and both.pad_list == [0, len(PROMPTS[1]) - len(PROMPTS[0])]
    only_short = regroup([(both, [1])])
    assert only_short.length == len(PROMPTS[0]) and only_short.pad_list == [0]
    assert not only_short.padded
    assert [row_tokens(both, r) for r in (0, 1)] == [len(PROMPTS[1]), len(PROMPTS[0])]


def test_a_row_copied_twice_forks(engine):
    cache, lg = _prefill(engine, PROMPTS[2])
    twin = regroup([(cache, [0, 0])])
    tok = int(lg.argmax())
    out = engine.forward(torch.tensor([[tok], [tok]]), twin)
    assert torch.equal(out[0], out[1])


def test_bad_rows_are_refused(engine):
    cache, _ = _prefill(engine, PROMPTS[0])
    with pytest.raises(ValueError, match="row 3 is out of range"):
        regroup([(cache, [3])])
    assert regroup([(cache, [])]) is None
