"""MMInference's modality part: permutations, grid order, Q-boundary / 2D-boundary masks, online index, kernel.

Brute-force references are built here from the definitions in `modality`'s docstring (Li et al., ICML 2025, Sec. 3):
key coordinate c = kperm^-1; a row i of modality m keeps j <= i when c(i) - c(j) is in S_m, c(j) in V_m, or j = i.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lmlab.methods.efficiency.mminference.blocks import effective_mask
from lmlab.methods.efficiency.mminference.method import build_layer_index, sparse_attention
from lmlab.methods.efficiency.mminference.modality import (
    MM_SPACE_KINDS,
    ModalityLayout,
    grid_order,
    group_recall,
    inverse_permutation,
    keyspace_sums,
    kind_orders,
    last_query_rows,
    mm_blocks,
    mm_estimate,
    mm_estimate_from_map,
    mm_recall,
    mm_token_mask,
    modality_permutation,
    search_mm_head,
)
from lmlab.methods.efficiency.mminference.patterns import causal_attention_probs, recall

KW = {"forced_columns": 4, "forced_diagonals": 8}

# layouts: (pieces, stride); every vision piece is a whole number of rows of its stride
LAYOUTS = [
    ([("vision", 24)], 4),
    ([("text", 5), ("vision", 12), ("text", 3)], 4),
    ([("text", 5), ("vision", 12), ("text", 3), ("vision", 8), ("text", 4)], 4),
    ([("vision", 18), ("text", 7), ("vision", 6)], 3),
    ([("text", 9)], 2),  # text only: the stride is unused
]


def _layout(pieces, stride):
    return ModalityLayout.from_pieces(pieces, stride=stride)


def _brute_order(layout, *, modality_first: bool, grid: bool) -> list[int]:
    """Key / query order by hand: vision spans then text spans, vision spans phase-major when `grid`."""
    if not modality_first:
        return list(range(layout.n))
    out: list[int] = []
    for mod in ("vision", "text"):
        for a, e, m in layout.spans:
            if m != mod:
                continue
            if grid and m == "vision":
                s = layout.stride
                rows = (e - a) // s
                out += [a + r * s + c for c in range(s) for r in range(rows)]  # column c, every row r, then c + 1
            else:
                out += list(range(a, e))
    return out


BRUTE_KPERM = {
    "vs_attn": {"modality_first": False, "grid": False},
    "q_boundary": {"modality_first": False, "grid": False},  # keys stay in place, only rows are grouped
    "2d_boundary": {"modality_first": True, "grid": False},
    "vision_grid": {"modality_first": True, "grid": True},
}


def _modality_of(layout) -> list[str]:
    return [m for a, e, m in layout.spans for _ in range(a, e)]


def _brute_mask(kind, layout, est) -> torch.Tensor:
    """M_K(i, j) from the definition, one pair at a time."""
    n = layout.n
    order = _brute_order(layout, **BRUTE_KPERM[kind])
    c = {pos: rank for rank, pos in enumerate(order)}
    mod = _modality_of(layout)
    sets = {m: ({int(x) for x in cols}, {int(x) for x in diags}) for m, (cols, diags) in est.items()}
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        cols, diags = sets[mod[i]]
        for j in range(i + 1):
            mask[i, j] = j == i or (c[i] - c[j]) in diags or c[j] in cols
    return mask


def _random_est(layout, seed, v=5, s=7):
    """A per-modality index with random key coordinates and random (also negative) distances."""
    g = torch.Generator().manual_seed(seed)
    n = layout.n
    return {
        m: (torch.randperm(n, generator=g)[:v], torch.randint(-n + 1, n, (s,), generator=g))
        for m in layout.modalities()
    }


def _row_recall(a, mask, rows):
    return float((a[rows] * mask[rows]).sum(-1).mean())


# ---------------------------------------------------------------------------------------------------------------
# 1. permutations


@pytest.mark.parametrize("grid", [False, True])
@pytest.mark.parametrize("pieces,stride", LAYOUTS)
def test_modality_permutation_is_a_bijection_vision_first_text_in_order(pieces, stride, grid):
    layout = _layout(pieces, stride)
    n = layout.n
    perm = modality_permutation(layout, grid=grid)
    assert perm.dtype == torch.long and perm.shape == (n,)
    assert torch.equal(perm.sort().values, torch.arange(n))  # each position exactly once
    assert perm.tolist() == _brute_order(layout, modality_first=True, grid=grid)
    inv = inverse_permutation(perm)
    assert torch.equal(perm[inv], torch.arange(n)) and torch.equal(inv[perm], torch.arange(n))
    labels = layout.labels()[perm]  # 0 = vision, 1 = text
    assert torch.equal(labels, labels.sort().values)  # all vision, then all text
    text = perm[labels == 1]
    assert torch.equal(text, text.sort().values)  # text keeps its relative order
    if not grid:
        vision = perm[labels == 0]
        assert torch.equal(vision, vision.sort().values)


def test_kind_orders_follow_the_table():
    layout = _layout(*LAYOUTS[2])
    n = layout.n
    for kind in MM_SPACE_KINDS:
        qperm, kperm = kind_orders(kind, layout)
        grid = kind == "vision_grid"
        assert qperm.tolist() == _brute_order(layout, modality_first=kind != "vs_attn", grid=grid)
        assert kperm.tolist() == _brute_order(layout, **BRUTE_KPERM[kind])
    assert torch.equal(kind_orders("q_boundary", layout)[1], torch.arange(n))


# ---------------------------------------------------------------------------------------------------------------
# 2. grid order: column-stride structure becomes contiguous


def test_grid_order_makes_each_column_and_its_stride_neighbours_contiguous():
    a, rows, s = 7, 5, 6  # one image of 5 rows x 6 tokens after 7 text tokens
    layout = _layout([("text", a), ("vision", rows * s), ("text", 4)], s)
    perm = modality_permutation(layout, grid=True)
    inv = inverse_permutation(perm)
    assert grid_order(a, a + rows * s, s).tolist() == [a + r * s + c for c in range(s) for r in range(rows)]
    for c in range(s):
        ranks = inv[torch.arange(a + c, a + rows * s, s)]  # one image column, top to bottom
        assert torch.equal(ranks, ranks[0] + torch.arange(rows))  # consecutive permuted ranks
    # a "pixel above" pattern (i - j = S inside the image) is the first sub-diagonal after the permutation
    n = layout.n
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    vis = (i >= a) & (i < a + rows * s) & (j >= a)
    above = vis & (i - j == s)
    pr, pc = above[perm][:, perm].nonzero(as_tuple=True)
    assert len(pr) == (rows - 1) * s and torch.equal(pr - pc, torch.ones_like(pr))
    # a vertical line at one phase (keys a + r S + c) is one contiguous key range in vision_grid coordinates
    _, kperm = kind_orders("vision_grid", layout)
    coords = inverse_permutation(kperm)[torch.arange(a + 2, a + rows * s, s)].sort().values
    assert torch.equal(coords, coords[0] + torch.arange(rows))


@pytest.mark.parametrize("kind", MM_SPACE_KINDS)
def test_mm_blocks_are_pure_consecutive_and_one_grid_phase(kind):
    layout = _layout(*LAYOUTS[2])
    n = layout.n
    qperm, kperm = kind_orders(kind, layout)
    starts, bmod = mm_blocks(layout, qperm, kperm, 5)
    assert starts[0] == 0 and starts[-1] == n and (starts[1:] > starts[:-1]).all()
    c = inverse_permutation(kperm)
    labels = layout.labels()
    for b in range(len(bmod)):
        rows = qperm[int(starts[b]) : int(starts[b + 1])]
        assert len(rows) <= 5
        if kind != "vs_attn":  # vs_attn blocks are plain contiguous blocks of the unpermuted rows
            assert (labels[rows] == bmod[b]).all()  # a block never mixes modalities
        assert torch.equal(c[rows], c[rows[0]] + torch.arange(len(rows)))  # one slash = one key range
        assert (rows[1:] > rows[:-1]).all()
        if kind == "vision_grid" and int(bmod[b]) == 0:
            a = next(a for a, e, m in layout.spans if a <= int(rows[0]) < e)
            assert len({int(r - a) % layout.stride for r in rows}) == 1  # no block straddles two phases


# ---------------------------------------------------------------------------------------------------------------
# 5. Q-boundary / 2D-boundary token masks


@pytest.mark.parametrize("kind", MM_SPACE_KINDS)
@pytest.mark.parametrize("pieces,stride", LAYOUTS)
def test_token_mask_is_causal_and_matches_the_definition(kind, pieces, stride):
    layout = _layout(pieces, stride)
    n = layout.n
    est = _random_est(layout, seed=n)
    mask = mm_token_mask(kind, layout, est)
    assert mask.shape == (n, n) and mask.dtype == torch.bool
    assert not mask.triu(1).any()  # causal
    assert mask.diagonal().all()  # every row keeps itself
    assert torch.equal(mask, _brute_mask(kind, layout, est))


def test_hand_worked_q_boundary_and_2d_boundary_rows():
    # text 0..3 | vision 4..11 | text 12..15; both modalities keep distances {0, 1, 2}, no verticals
    layout = _layout([("text", 4), ("vision", 8), ("text", 4)], 4)
    none = torch.zeros(0, dtype=torch.long)
    est = {"vision": (none, torch.tensor([1, 2])), "text": (none, torch.tensor([1, 2]))}
    q = mm_token_mask("q_boundary", layout, est)
    b2 = mm_token_mask("2d_boundary", layout, est)

    def row(mask, i):
        return mask[i].nonzero()[:, 0].tolist()

    # Q-boundary: per-modality index, keys in place: the first text token after the image sees image tokens
    assert row(q, 12) == [10, 11, 12] and row(q, 4) == [2, 3, 4]
    # 2D boundary: keys grouped by modality (vision 0..7, text 8..15): text's recent past is the text before
    # the image, and the image opens a fresh window that does not reach the preceding text
    assert row(b2, 12) == [2, 3, 12] and row(b2, 13) == [3, 12, 13]
    assert row(b2, 4) == [4] and row(b2, 5) == [4, 5] and row(b2, 6) == [4, 5, 6]
    assert row(b2, 0) == [0] and row(b2, 2) == [0, 1, 2]
    # a 2D-boundary vertical on text key coordinate 8 (= original token 0) is seen by every text row only
    est_v = {"vision": (none, none), "text": (torch.tensor([8]), none)}
    col0 = mm_token_mask("2d_boundary", layout, est_v)[:, 0]
    assert col0.nonzero()[:, 0].tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    # 2D boundary: no text row reaches a vision key by a slash of length <= 2, no vision row reaches a text key
    text = torch.tensor([0, 1, 2, 3, 12, 13, 14, 15])
    vision = torch.arange(4, 12)
    assert not b2[text][:, vision].any() and not b2[vision][:, text].any()


def _recall_cases():
    for kind in MM_SPACE_KINDS:
        for pieces, stride in LAYOUTS[1:4]:
            one_image = sum(m == "vision" for m, _ in pieces) == 1
            yield pytest.param(kind, pieces, stride, id=f"{kind}-{'one' if one_image else 'many'}-image")


@pytest.mark.parametrize("kind,pieces,stride", list(_recall_cases()))
def test_mm_recall_equals_mask_recall(kind, pieces, stride):
    layout = _layout(pieces, stride)
    n = layout.n
    g = torch.Generator().manual_seed(1)
    a = causal_attention_probs(torch.randn(n, 8, generator=g), torch.randn(n, 8, generator=g))
    est = _random_est(layout, seed=2)
    assert mm_recall(a, kind, layout, est) == pytest.approx(recall(a, mm_token_mask(kind, layout, est)), abs=1e-5)


def _brute_keyspace_sums(a, rows, kinv):
    n = a.shape[-1]
    dist = torch.zeros(2 * n - 1, dtype=a.dtype)
    cols = torch.zeros(n, dtype=a.dtype)
    for i in rows.tolist():
        for j in range(n):
            dist[kinv[i] - kinv[j] + n - 1] += a[i, j]
            cols[kinv[j]] += a[i, j]
    return dist, cols


@pytest.mark.parametrize("kind", ["q_boundary", "2d_boundary"])
def test_keyspace_sums_match_brute_force(kind):
    layout = _layout(*LAYOUTS[2])
    n = layout.n
    g = torch.Generator().manual_seed(3)
    a = causal_attention_probs(torch.randn(n, 8, generator=g), torch.randn(n, 8, generator=g))
    _, kperm = kind_orders(kind, layout)
    kinv = inverse_permutation(kperm)
    for code in (0, 1):
        rows = (layout.labels() == code).nonzero()[:, 0]
        dist, cols = keyspace_sums(a, rows, kperm, kinv)
        bd, bc = _brute_keyspace_sums(a, rows, kinv)
        assert torch.allclose(dist, bd, atol=1e-6) and torch.allclose(cols, bc, atol=1e-6)


def test_keyspace_sums_match_brute_force_on_one_image():
    """One image in grid order is a consecutive but unordered set of rows: it must not be read as one slice."""
    layout = _layout([("text", 5), ("vision", 32), ("text", 7)], 4)
    n = layout.n
    g = torch.Generator().manual_seed(0)
    a = causal_attention_probs(torch.randn(n, 8, generator=g), torch.randn(n, 8, generator=g))
    _, kperm = kind_orders("vision_grid", layout)
    kinv = inverse_permutation(kperm)
    rows = (layout.labels() == 0).nonzero()[:, 0]
    dist, cols = keyspace_sums(a, rows, kperm, kinv)
    bd, bc = _brute_keyspace_sums(a, rows, kinv)
    assert torch.allclose(cols, bc, atol=1e-6)  # column sums do not depend on the row order
    assert torch.allclose(dist, bd, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# 4. online estimate on planted maps


def _planted_map(n, boost, strength=9.0, seed=0):
    """Causal softmax of faint noise plus `strength` on the (n, n) bool `boost`."""
    g = torch.Generator().manual_seed(seed)
    logits = 0.3 * torch.randn(n, n, generator=g) + strength * boost
    logits.masked_fill_(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(logits, -1)


TEXT, ROWS, STRIDE = 16, 16, 16  # text 0..15 | image 16 x 16 at 16..271 | text 272..287
IMG = _layout([("text", TEXT), ("vision", ROWS * STRIDE), ("text", TEXT)], STRIDE)


def _image_rows():
    return torch.arange(TEXT, TEXT + ROWS * STRIDE)


def test_estimate_recovers_a_planted_row_stride():
    # every pixel attends the pixel above it (i - j = S inside the image), text rows attend their 3 nearest
    n = IMG.n
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    img = (i >= TEXT) & (i < TEXT + ROWS * STRIDE)
    boost = (img & (j >= TEXT) & (i - j == STRIDE)) | (~img & (i - j >= 0) & (i - j < 3))
    a = _planted_map(n, boost)
    kw = {"forced_columns": 0, "forced_diagonals": 1}
    vis = _image_rows()
    g = torch.Generator().manual_seed(5)
    rand = {
        m: (torch.randperm(n, generator=g)[:30], torch.randint(1, n, (50,), generator=g)) for m in ("vision", "text")
    }
    for kind, planted_distance in [("vs_attn", STRIDE), ("2d_boundary", STRIDE), ("vision_grid", 1)]:
        est = mm_estimate_from_map(a, IMG, kind, 30, 50, last_q=32, **kw)
        assert planted_distance in est["vision"][1].tolist()  # the row stride, in the kind's key coordinates
        rec = _row_recall(a, mm_token_mask(kind, IMG, est), vis)
        assert rec > 0.9
        assert _row_recall(a, mm_token_mask(kind, IMG, rand), vis) < rec - 0.5  # a random index of equal size


def test_estimate_recovers_planted_grid_columns_as_one_key_range():
    # every pixel attends column 5 of each image row (MMInference's grid head)
    n = IMG.n
    cols = torch.arange(TEXT + 5, TEXT + ROWS * STRIDE, STRIDE)
    boost = torch.zeros(n, n, dtype=torch.bool)
    boost[TEXT : TEXT + ROWS * STRIDE, cols] = True
    boost |= torch.eye(n, dtype=torch.bool)
    a = _planted_map(n, boost)
    est = mm_estimate_from_map(a, IMG, "vision_grid", 30, 50, last_q=32, forced_columns=0, forced_diagonals=1)
    kinv = inverse_permutation(kind_orders("vision_grid", IMG)[1])
    planted = kinv[cols].sort().values
    assert set(planted.tolist()) <= set(est["vision"][0].tolist())
    assert torch.equal(planted, planted[0] + torch.arange(ROWS))  # the grid lines are one contiguous key range
    assert _row_recall(a, mm_token_mask("vision_grid", IMG, est), _image_rows()) > 0.9


def test_estimate_from_qk_equals_estimate_from_the_map():
    layout = _layout(*LAYOUTS[2])
    n = layout.n
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(2, n, 8, generator=g), torch.randn(2, n, 8, generator=g)
    for kind in MM_SPACE_KINDS:
        est = mm_estimate(q, k, layout, kind, 30, 50, last_q=6, **KW)
        assert set(est) == {"vision", "text"}
        for h in range(2):
            ref = mm_estimate_from_map(causal_attention_probs(q[h], k[h]), layout, kind, 30, 50, last_q=6, **KW)
            for m in est:
                assert set(est[m][0][h].tolist()) == set(ref[m][0].tolist())
                assert set(est[m][1][h].tolist()) == set(ref[m][1].tolist())
        kinv = inverse_permutation(kind_orders(kind, layout)[1])
        for m in est:  # forced in: the first 4 original positions, distances 0..7
            assert set(kinv[:4].tolist()) <= set(est[m][0][0].tolist())
            assert set(range(8)) <= set(est[m][1][0].tolist())
    assert last_query_rows(layout, "vision", 6).tolist() == list(range(22, 28))  # last image 20..27
    assert last_query_rows(layout, "text", 6).tolist() == list(range(28, 32))  # last text span is 4 long


def test_search_prefers_2d_boundary_when_text_attends_across_the_image():
    # text 0..63 | image 64..127 | text 128..159: text rows attend 2D-boundary distances 1..40 (the text before
    # the image counts as recent); in place the last span's rows need two slashes per distance (d and d + 64),
    # past the 50-slash budget
    layout = _layout([("text", 64), ("vision", 64), ("text", 32)], 16)
    n = layout.n
    est = {
        "vision": (torch.zeros(0, dtype=torch.long), torch.arange(1, 4)),
        "text": (torch.zeros(0, dtype=torch.long), torch.arange(1, 41)),
    }
    a = _planted_map(n, mm_token_mask("2d_boundary", layout, est), strength=6.0)
    space = [("vs_attn", 30, 50), ("q_boundary", 30, 50), ("2d_boundary", 30, 50)]
    best, recs = search_mm_head(a, layout, space, last_q=64, forced_columns=0, forced_diagonals=1)
    assert best == ("2d_boundary", 30, 50)
    assert recs["2d_boundary_30_50"] > max(recs["q_boundary_30_50"], recs["vs_attn_30_50"]) + 0.05
    assert recs["2d_boundary_30_50"] > 0.95


# ---------------------------------------------------------------------------------------------------------------
# 3. kernel: dense-equivalent and exact under the permuted blocks


def _qkv(hq, hkv, n, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(h, n, d, generator=g) for h in (hq, hkv, hkv))


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, enable_gqa=True)[0]


@pytest.mark.parametrize("block", [7, 16, 128])
def test_mm_sparse_attention_keeping_every_key_equals_sdpa(block):
    layout = _layout([("text", 13), ("vision", 48), ("text", 9), ("vision", 24), ("text", 11)], 8)
    n = layout.n
    q, k, v = _qkv(6, 3, n)
    # v = n keeps every key coordinate as a vertical; s = 2n keeps every distance: both are dense
    pats = {
        0: ("q_boundary", n, 0),
        1: ("2d_boundary", 0, 2 * n),
        2: ("vision_grid", n, 0),
        3: ("vision_grid", 0, 2 * n),
        4: ("2d_boundary", n, 0),
        5: ("q_boundary", 0, 2 * n),
    }
    index = build_layer_index(q, k, pats, block_size=block, last_q=8, layout=layout, **KW)
    assert len(index.dense_heads) == 0 and len(index.groups) == 6
    assert all(g.qperm is not None for g in index.groups)  # the permuted path ran
    assert torch.allclose(index.density, torch.ones(6, dtype=torch.float64))
    assert torch.allclose(sparse_attention(q, k, v, index), _sdpa(q, k, v), atol=1e-5)


def test_mm_sparse_attention_is_exact_softmax_over_its_effective_mask():
    layout = _layout([("text", 20), ("vision", 96), ("text", 30), ("vision", 48), ("text", 22)], 8)
    n, d = layout.n, 16
    block = 5  # small blocks keep 30 verticals + 50 slashes sparse at n = 216
    q, k, v = _qkv(4, 2, n, d, seed=1)
    pats = {0: ("q_boundary", 30, 50), 1: ("2d_boundary", 30, 50), 2: ("vision_grid", 30, 50), 3: ("dense",)}
    index = build_layer_index(q, k, pats, block_size=block, last_q=16, layout=layout, **KW)
    out = sparse_attention(q, k, v, index)
    groups = {int(g.heads[0]): g for g in index.groups}
    i = torch.arange(n)
    for h in range(3):
        kind = pats[h][0]
        mask = effective_mask(groups[h], n, block)
        est_h = mm_estimate(q[h : h + 1], k[h // 2 : h // 2 + 1], layout, kind, 30, 50, last_q=16, **KW)
        est = {m: (cols[0], diags[0]) for m, (cols, diags) in est_h.items()}  # this head's (V_m, S_m)
        token = mm_token_mask(kind, layout, est)
        assert not (token & ~mask).any()  # blocks expand the token-level pattern, never drop from it
        assert not (mask & (i[None, :] > i[:, None])).any()
        assert 0.05 < float(index.density[h]) < 0.9  # really sparse, not everything
        assert float(index.density[h]) == pytest.approx(float(mask.sum()) / (n * (n + 1) / 2), rel=1e-9)
        s = (q[h] @ k[h // 2].T / math.sqrt(d)).masked_fill(~mask, float("-inf"))
        assert torch.allclose(out[h], torch.softmax(s, -1) @ v[h // 2], atol=1e-5)
        a = causal_attention_probs(q[h], k[h // 2])
        assert group_recall(a, groups[h], n, block) == pytest.approx(recall(a, mask), abs=1e-5)
    assert torch.allclose(out[3], _sdpa(q, k, v)[3], atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# 6. bad inputs


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: inverse_permutation(torch.tensor([0, 2, 2, 1])), r"permutation of range\(4\)"),
        (lambda: inverse_permutation(torch.tensor([0, 1, 4])), r"permutation of range\(3\)"),
        (lambda: inverse_permutation(torch.tensor([0, 1], dtype=torch.int32)), "torch.int32"),
        (lambda: kind_orders("3d_boundary", IMG), "'3d_boundary'"),
        (lambda: ModalityLayout(((0, 4, "audio"),)), "'audio'"),
        (lambda: ModalityLayout(((0, 4, "text"), (5, 8, "vision"))), r"\(5, 8, 'vision'\)"),
        (lambda: ModalityLayout(((0, 6, "vision"),), stride=4), "stride 4"),
        (lambda: ModalityLayout(((0, 8, "vision"),), stride=0), "got 0"),
        (lambda: ModalityLayout.from_pieces([("text", 3), ("vision", 0)]), "got 0 for 'vision'"),
        (lambda: modality_permutation(_layout([("vision", 8)], None), grid=True), "stride"),
        (lambda: last_query_rows(_layout([("text", 8)], None), "vision", 4), "'vision'"),
        (lambda: mm_estimate(torch.zeros(1, 10, 4), torch.zeros(1, 10, 4), IMG, "2d_boundary", 30, 50), "10"),
        (lambda: mm_token_mask("vs_attn", IMG, {"audio": (torch.zeros(0), torch.zeros(0))}), "'audio'"),
    ],
)
def test_bad_inputs_raise_value_error_naming_the_value(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_mixed_modality_patterns_without_a_layout_name_the_kinds():
    q, k, _ = _qkv(2, 1, 40)
    with pytest.raises(ValueError, match="2d_boundary, q_boundary"):
        build_layer_index(q, k, {0: ("q_boundary", 30, 50), 1: ("2d_boundary", 30, 50)})
