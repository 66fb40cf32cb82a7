"""Invariants of MMInference: recall algebra, block indices, planted-pattern search, kernel exactness, HF wiring."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lmlab.core.inference.attention import use_controller
from lmlab.methods.efficiency.mminference.attention import MMInferenceController
from lmlab.methods.efficiency.mminference.blocks import block_coverage
from lmlab.methods.efficiency.mminference.config import MMInferenceConfig
from lmlab.methods.efficiency.mminference.experiment import natural_ids, periodic_ids, sdpa
from lmlab.methods.efficiency.mminference.method import (
    amdahl_bound,
    attention_flop_share,
    build_layer_index,
    default_search_space,
    search_head,
    sparse_attention,
)
from lmlab.methods.efficiency.mminference.patterns import (
    PatternSets,
    _MapStats,
    causal_attention_probs,
    diagonal_sums,
    pattern_sets,
    recall,
    token_mask,
    vs_estimate,
    vs_scores,
    vs_topk,
)

VS_KW = {"forced_columns": 4, "forced_diagonals": 8}


def _qkv(hq=4, hkv=2, n=203, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(hq, n, d, generator=g),
        torch.randn(hkv, n, d, generator=g),
        torch.randn(hkv, n, d, generator=g),
    )


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, enable_gqa=True)[0]


def _planted(n, *, cols=(), diags=(), rows=(), strength=9.0, seed=0):
    """A causal attention map whose mass sits on planted columns, diagonals and full rows (plus faint noise)."""
    g = torch.Generator().manual_seed(seed)
    logits = 0.3 * torch.randn(n, n, generator=g)
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    boost = torch.zeros(n, n, dtype=torch.bool)
    for c in cols:
        boost |= j == c
    for d in diags:
        boost |= (i - j) == d
    logits = logits + strength * boost
    for r in rows:
        logits[r, : r + 1] = strength
    logits.masked_fill_(j > i, float("-inf"))
    return torch.softmax(logits, -1)


# ---------------------------------------------------------------------------------------------------------------
# recall algebra


def test_diagonal_sums_match_brute_force():
    q, k, _ = _qkv(1, 1, 97)
    a = causal_attention_probs(q[0], k[0])
    brute = torch.stack([a.diagonal(-d).sum() for d in range(97)])
    assert torch.allclose(diagonal_sums(a), brute, atol=1e-6)
    last = a[-13:]
    brute_last = torch.zeros(97)
    for r in range(13):
        i = 97 - 13 + r
        for d in range(i + 1):
            brute_last[d] += a[i, i - d]
    assert torch.allclose(diagonal_sums(last), brute_last, atol=1e-6)


@pytest.mark.parametrize(
    "pattern",
    [
        ("a_shape", 8, 40),
        ("grid_attn", 16, False, True, 12, 1),
        ("grid_attn", 16, True, True, 12, 15),
        ("vs_attn", 32, 60),
    ],
)
def test_set_recall_equals_mask_recall(pattern):
    q, k, _ = _qkv(1, 1, 180)
    a = causal_attention_probs(q[0], k[0])
    vs = vs_topk(*vs_scores(a[-16:].clone(), **VS_KW), 32, 60) if pattern[0] == "vs_attn" else None
    sets = pattern_sets(pattern, 180, vs_indices=vs)
    assert _MapStats(a).recall(sets) == pytest.approx(recall(a, token_mask(sets, 180)), abs=1e-5)


def test_vs_estimate_from_qk_equals_last_rows_of_the_map():
    q, k, _ = _qkv(2, 2, 150)
    cols, diags = vs_estimate(q, k, 35, 60, last_q=16, **VS_KW)
    for h in range(2):
        a = causal_attention_probs(q[h], k[h])
        c2, d2 = vs_topk(*vs_scores(a[-16:].clone(), **VS_KW), 35, 60)
        assert set(c2.tolist()) == set(cols[h].tolist())
        assert set(d2.tolist()) == set(diags[h].tolist())
        assert set(range(4)) <= set(cols[h].tolist()) and set(range(8)) <= set(diags[h].tolist())  # forced in


# ---------------------------------------------------------------------------------------------------------------
# online index


def _block_union(mask, n, block):
    nb = (n + block - 1) // block
    rows = []
    for b in range(nb):
        r0, r1 = b * block, min(n, (b + 1) * block)
        cov = mask[r0:r1].any(0)
        cov[r0:r1] = True  # the diagonal is always kept
        cov[r1:] = False
        rows.append(cov)
    return torch.stack(rows)


@pytest.mark.parametrize("n,block", [(203, 32), (256, 64), (130, 128)])
@pytest.mark.parametrize(
    "pattern",
    [("a_shape", 8, 40), ("a_shape", 0, 1), ("grid_attn", 16, False, True, 12, 1), ("grid_attn", 10, True, True, 5, 9),
     ("vs_attn", 30, 50)],
)  # fmt: skip
def test_block_coverage_is_the_block_union_of_the_token_mask(pattern, n, block):
    g = torch.Generator().manual_seed(n)
    vs = (
        (torch.randperm(n, generator=g)[:30], torch.randperm(n, generator=g)[:50]) if pattern[0] == "vs_attn" else None
    )
    sets = pattern_sets(pattern, n, vs_indices=vs)
    # horizontal grid lines are dense rows, computed apart from the blocks
    no_rows = PatternSets(sets.diags, sets.cols, torch.zeros(0, dtype=torch.long))
    expected = _block_union(token_mask(no_rows, n), n, block)
    assert torch.equal(block_coverage(sets, n, block), expected)


def test_layer_index_groups_list_each_blocks_covered_keys_in_order():
    q, k, _ = _qkv(6, 2, 203)
    pats = {
        0: ("a_shape", 8, 40),
        1: ("vs_attn", 30, 50),
        2: ("grid_attn", 16, True, True, 12, 1),
        3: ("dense",),
        4: ("a_shape", 8, 40),
        5: ["grid_attn", 16, True, True, 12, 1, 0.97],
    }  # a trailing recall is ignored
    index = build_layer_index(q, k, pats, block_size=32, last_q=16, **VS_KW)
    assert index.dense_heads.tolist() == [3]
    groups = {tuple(g.heads.tolist()): g for g in index.groups}
    assert set(groups) == {(1,), (0, 4), (2, 5)}  # static patterns share one index, each VS head has its own
    cols, diags = vs_estimate(q[1:2], k[0:1], 30, 50, last_q=16, **VS_KW)
    for heads, vs in [((0, 4), None), ((1,), (cols[0], diags[0])), ((2, 5), None)]:
        sets = pattern_sets(pats[heads[0]], 203, vs_indices=vs)
        cov = block_coverage(sets, 203, 32)
        g = groups[heads]
        for b in range(cov.shape[0]):
            m = int(g.counts[b])
            assert g.keys[b, :m].tolist() == cov[b].nonzero()[:, 0].tolist()
            assert (g.keys[b, m:] == 203).all()
        assert g.rows.tolist() == sets.rows.tolist()
    assert groups[(2, 5)].rows.tolist() == list(range(1, 203, 16))
    assert index.density[3] == 1.0 and (index.density[[0, 1, 2, 4, 5]] < 1).all()
    assert index.density[0] == index.density[4] and index.density[2] == index.density[5]


# ---------------------------------------------------------------------------------------------------------------
# kernel


@pytest.mark.parametrize("n,block", [(203, 32), (256, 64), (77, 128)])
def test_sparse_prefill_with_a_dense_mask_equals_sdpa(n, block):
    q, k, v = _qkv(4, 2, n)
    index = build_layer_index(q, k, {h: ("a_shape", 0, n) for h in range(4)}, block_size=block)
    assert torch.allclose(index.density, torch.ones(4, dtype=torch.float64))
    assert torch.allclose(sparse_attention(q, k, v, index), _sdpa(q, k, v), atol=1e-5)
    dense_index = build_layer_index(q, k, {}, block_size=block)  # every head dense: SDPA itself
    assert torch.allclose(sparse_attention(q, k, v, dense_index), _sdpa(q, k, v), atol=1e-6)


def test_sparse_attention_is_exact_softmax_over_the_block_expanded_mask():
    n, d = 203, 16
    q, k, v = _qkv(4, 2, n, d)
    pats = {0: ("a_shape", 8, 40), 1: ("vs_attn", 30, 50), 2: ("grid_attn", 16, True, True, 12, 1), 3: ("dense",)}
    index = build_layer_index(q, k, pats, block_size=32, last_q=16, **VS_KW)
    out = sparse_attention(q, k, v, index)
    cols, diags = vs_estimate(q[1:2], k[0:1], 30, 50, last_q=16, **VS_KW)
    i = torch.arange(n)
    for h, vs in [(0, None), (1, (cols[0], diags[0])), (2, None)]:
        sets = pattern_sets(pats[h], n, vs_indices=vs)
        mask = block_coverage(sets, n, 32)[i // 32] & (i[None, :] <= i[:, None])
        mask[sets.rows] = i[None, :] <= sets.rows[:, None]
        s = (q[h] @ k[h // 2].T / math.sqrt(d)).masked_fill(~mask, float("-inf"))
        assert torch.allclose(out[h], torch.softmax(s, -1) @ v[h // 2], atol=1e-5)
        kept = float(mask.sum()) / (n * (n + 1) / 2)
        assert float(index.density[h]) == pytest.approx(kept, rel=1e-9)
    assert torch.allclose(out[3], _sdpa(q, k, v)[3], atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# offline search on planted maps

N = 384
SPACE = default_search_space(a_shape=(8, 64), vs=((30, 64), (30, 128)), grid_stride=16, grid_local=16)


def _search(a):
    return search_head(a, SPACE, minimal_delta=0.01, last_q=32, control_sink=8, **VS_KW)


def test_search_picks_planted_a_shape_and_rejects_grid():
    a = _planted(N, cols=range(8), diags=range(64))
    best, recs = _search(a)
    assert best == ("a_shape", 8, 64)
    assert recs["a_shape_8_64"] > 0.95
    assert abs(recs["grid_phase_gain"]) < 0.01  # negative control: no period-16 structure


def test_search_picks_planted_vertical_slash():
    cols = [0, 1, 2, 3, 97, 151, 230, 301]
    diags = [0, 1, 2, 3, 4, 5, 6, 7, 90, 170, 250]
    a = _planted(N, cols=cols, diags=diags)
    best, recs = _search(a)
    assert best[0] == "vs_attn"
    assert recs["_".join(map(str, best))] > recs["a_shape_8_64"] + 0.1


def test_search_picks_planted_grid_with_its_phase():
    # 48 lines at phase 1 of stride 8: more than the VS candidates' 30 verticals can hold
    space = default_search_space(a_shape=(8, 64), vs=((30, 64), (30, 128)), grid_stride=8, grid_local=8)
    a = _planted(N, cols=range(1, N, 8), diags=range(9))
    best, recs = search_head(a, space, last_q=32, control_sink=8, **VS_KW)
    assert best == ("grid_attn", 8, False, True, 8, 1)
    assert recs["grid_attn_8_False_True_8_1"] > 0.95
    assert recs["grid_phase_gain"] > 0.1
    # the same grid candidates on a map without that period: grid is not chosen, and its lines carry no structure
    best, recs = search_head(_planted(N, cols=range(8), diags=range(64)), space, last_q=32, control_sink=8, **VS_KW)
    assert best[0] != "grid_attn" and abs(recs["grid_phase_gain"]) < 0.01


def test_search_keeps_dense_below_min_recall():
    a = _planted(N, cols=[0], diags=[0], strength=0.0)  # flat attention: no pattern reaches the threshold
    best, _ = search_head(a, SPACE, min_recall=0.95, last_q=32, **VS_KW)
    assert best == ("dense",)


# ---------------------------------------------------------------------------------------------------------------
# inside the HF model


def test_hf_sparse_prefill_with_dense_patterns_matches_sdpa(tiny_llama):
    model = tiny_llama
    ids = torch.randint(3, 250, (1, 300), generator=torch.Generator().manual_seed(0))
    with sdpa(model):
        with torch.no_grad():
            ref = model(ids, use_cache=False).logits
        layers = model.config.num_hidden_layers
        pats = {layer: {h: ["a_shape", 0, 10**6] for h in range(4)} for layer in range(layers)}
        ctl = MMInferenceController(patterns=pats, block_size=32, min_len=64)
        with torch.no_grad(), use_controller(model, ctl):
            out = model(ids, use_cache=False).logits
        assert model.config._attn_implementation == "sdpa"  # restored
        assert not hasattr(model.model.layers[0].self_attn, "mminference")
    assert [r.layer for r in ctl.records] == list(range(layers))  # the sparse path ran in every layer
    assert all(r.mode == "sparse" and r.density == pytest.approx(1.0) for r in ctl.records)
    assert torch.allclose(out, ref, atol=1e-4)


def test_hf_capture_shadow_and_dense_decode(tiny_llama):
    model = tiny_llama
    ids = torch.randint(3, 250, (1, 128), generator=torch.Generator().manual_seed(1))
    cap = MMInferenceController(mode="capture", min_len=64)
    with torch.no_grad(), use_controller(model, cap):
        out = model(ids, use_cache=True)
        cache = out.cache
        model(ids[:, -1:], cache=cache, use_cache=True)  # decode: q_len 1, dense, nothing captured again
    assert sorted(cap.captured) == [0, 1]
    q, k, v = cap.captured[0]
    assert q.shape == (4, 128, 16) and k.shape == (2, 128, 16) and v.shape == (2, 128, 16)
    pats = {layer: {h: ["a_shape", 4, 16] for h in range(4)} for layer in range(2)}
    shadow = MMInferenceController(patterns=pats, mode="shadow", block_size=32, min_len=64, shadow_repeats=1)
    with torch.no_grad(), use_controller(model, shadow):
        shadow_logits = model(ids, use_cache=False).logits
    with torch.no_grad(), sdpa(model):
        dense_logits = model(ids, use_cache=False).logits
    assert torch.allclose(shadow_logits, dense_logits, atol=1e-5)  # shadow returns the dense output
    assert len(shadow.records) == 2 and all(r.rel_l2 is not None and r.rel_l2 > 0 for r in shadow.records)
    assert all(set(r.timing.names) == {"sdpa", "mminference"} for r in shadow.records)


# ---------------------------------------------------------------------------------------------------------------
# analytic lines and config


def test_amdahl_and_attention_share_closed_forms():
    assert amdahl_bound(0.0, 0.1) == 1.0
    assert amdahl_bound(1.0, 0.25) == pytest.approx(4.0)
    assert amdahl_bound(0.4, 0.2) == pytest.approx(1 / (0.6 + 0.08))
    # SmolLM2: 9 heads x 64, 7.08 MFLOP/token/layer of linear work -> share n / (n + 6146)
    for n in (2048, 4096, 8192):
        share = attention_flop_share(n, n_heads=9, head_dim=64, linear_flops_per_token=7.08e6)
        assert share == pytest.approx(n / (n + 7.08e6 / 1152), rel=1e-9)


@pytest.mark.parametrize(
    "field,value",
    [("block_size", 8), ("minimal_delta", 1.5), ("timing_warmup", 1), ("a_shape", [64]), ("vs_sizes", [[0, 5]]),
     ("timing_repeats", [3]), ("baselines", ["flexprefill"]), ("eval_task", "qa")],
)  # fmt: skip
def test_bad_config_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        MMInferenceConfig(**{field: value})


def test_calibration_inputs_have_the_requested_shape(tiny_tokenizer):
    nat = natural_ids(tiny_tokenizer, 300, seed=0)
    per = periodic_ids(tiny_tokenizer, 300, 16, seed=0)
    assert nat.shape == (1, 300) and per.shape == (1, 300)
    marker = tiny_tokenizer("\n<image>", add_special_tokens=False)["input_ids"]
    for start in range(16, 300 - len(marker), 16):  # every frame opens with the marker at phase 0
        assert per[0, start : start + len(marker)].tolist() == marker
