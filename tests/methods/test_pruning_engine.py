"""The shared pruning engine (`lmlab.core.pruning`) on tiny models and synthetic layers."""

from __future__ import annotations

import copy

import pytest
import torch

from lmlab.core.pruning import (
    LayerStats,
    SparseLinear,
    block_linears,
    collect_layer_stats,
    decoder_blocks,
    lowest_k,
    magnitude_prune,
    matrix_mask,
    model_sparsity,
    nm_mask,
    nm_valid,
    owl_from_ratios,
    owl_sparsities,
    parse_mask_structure,
    prune_model,
    row_mask,
    save_pruned,
    sparse_copy,
    sparsegpt_prune_weight,
    storage_report,
    wanda_prune_weight,
)

METHODS = ("magnitude", "wanda", "sparsegpt")


def _calib(n: int = 4, seq: int = 32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, 260, (n, seq), generator=g)


def _stats(c_in: int = 128, tokens: int = 512, seed: int = 0) -> tuple[torch.Tensor, LayerStats]:
    g = torch.Generator().manual_seed(seed)
    # correlated inputs with a few outlier channels (what makes activation-aware pruning matter)
    x = torch.randn(tokens, c_in, generator=g) @ (torch.eye(c_in) + 0.3 * torch.randn(c_in, c_in, generator=g))
    x[:, :4] *= 8.0
    return x, LayerStats(0, "synthetic", 4, tokens, x.T @ x)


# -- masks --------------------------------------------------------------------------------------------------------


def test_lowest_k_equals_a_stable_sort_with_ties():
    g = torch.Generator().manual_seed(1)
    scores = torch.randint(0, 5, (16, 40), generator=g).float()  # many ties
    for k in (0, 1, 7, 20, 39, 40):
        ref = torch.zeros_like(scores, dtype=torch.bool)
        if k:
            ref.scatter_(1, torch.sort(scores, dim=1, stable=True).indices[:, :k], True)
        assert torch.equal(lowest_k(scores, k, dim=1), ref)
    flat = scores.flatten()
    ref = torch.zeros_like(flat, dtype=torch.bool)
    ref[torch.sort(flat, stable=True).indices[:123]] = True
    assert torch.equal(matrix_mask(scores, 123 / flat.numel()), ref.view_as(scores))


def test_row_matrix_and_nm_masks_are_exact():
    scores = torch.rand(12, 64)
    assert (row_mask(scores, 0.3).sum(1) == int(64 * 0.3)).all()
    assert int(matrix_mask(scores, 0.7).sum()) == int(12 * 64 * 0.7)
    for n, m in ((2, 4), (4, 8)):
        mask = nm_mask(scores, n, m)
        assert (mask.reshape(12, 64 // m, m).sum(-1) == n).all()
        # the pruned ones are the lowest of their group
        kept_min = scores.masked_fill(mask, float("inf")).reshape(12, -1, m).min(-1).values
        pruned_max = scores.masked_fill(~mask, float("-inf")).reshape(12, -1, m).max(-1).values
        assert (pruned_max <= kept_min).all()


def test_parse_mask_structure():
    assert parse_mask_structure("unstructured") is None
    assert parse_mask_structure("2:4") == (2, 4) and parse_mask_structure("4:8") == (4, 8)
    for bad in ("2-4", "4:2", "0:4", "half"):
        with pytest.raises(ValueError, match="mask_structure"):
            parse_mask_structure(bad)
    with pytest.raises(ValueError, match="multiple of 4"):
        nm_mask(torch.rand(3, 10), 2, 4)


# -- per-linear rules -----------------------------------------------------------------------------------------------


def test_wanda_closed_form():
    # column norms ||X_j|| = (10, 1, 1, 1): Wanda scores of the row (0.5, 1, 2, 3) are (5, 1, 2, 3)
    gram = torch.diag(torch.tensor([100.0, 1.0, 1.0, 1.0]))
    stats = LayerStats(0, "x", 1, 4, gram)
    w = torch.tensor([[0.5, 1.0, 2.0, 3.0], [3.0, -2.0, 1.0, 0.5]])
    out = wanda_prune_weight(w, stats, 0.5)
    assert torch.equal(out, torch.tensor([[0.5, 0.0, 0.0, 3.0], [3.0, -2.0, 0.0, 0.0]]))
    # magnitude (per layer) drops the smallest |W| instead, including the outlier channel's weight
    mag = magnitude_prune(w, stats, 0.5)
    assert mag[0, 0] == 0 and mag[0, 1] == 0 and mag[1, 3] == 0
    # 2:4 per row: the same as 50% here (one group of 4 per row)
    assert torch.equal(wanda_prune_weight(w, stats, 0.5, (2, 4)), out)


def _official_sparsegpt(W, H, sparsity, prune_n=0, prune_m=0, blocksize=128, percdamp=0.01):
    """IST-DASLab/sparsegpt ``fasterprune`` (as in locuslab/wanda lib/sparsegpt.py), transcribed for the test;
    the unstructured threshold takes exactly int(numel * s) entries (lmlab's documented deviation)."""
    W = W.clone().float()
    H = H.clone()
    columns = W.shape[1]
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    damp = percdamp * torch.mean(torch.diag(H))
    diag = torch.arange(columns)
    H[diag, diag] += damp
    H = torch.linalg.cholesky(H)
    H = torch.cholesky_inverse(H)
    Hinv = torch.linalg.cholesky(H, upper=True)
    for i1 in range(0, columns, blocksize):
        i2 = min(i1 + blocksize, columns)
        count = i2 - i1
        W1 = W[:, i1:i2].clone()
        Q1 = torch.zeros_like(W1)
        Err1 = torch.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        if prune_n == 0:
            tmp = W1**2 / (torch.diag(Hinv1).reshape((1, -1))) ** 2
            k = int(tmp.numel() * sparsity)
            mask1 = torch.zeros(tmp.numel(), dtype=torch.bool)
            mask1[torch.sort(tmp.flatten(), stable=True)[1][:k]] = True
            mask1 = mask1.view_as(tmp)
        else:
            mask1 = torch.zeros_like(W1) == 1
        for i in range(count):
            w = W1[:, i]
            d = Hinv1[i, i]
            if prune_n != 0 and i % prune_m == 0:
                tmp = W1[:, i : (i + prune_m)] ** 2 / (torch.diag(Hinv1)[i : (i + prune_m)].reshape((1, -1))) ** 2
                mask1.scatter_(1, i + torch.topk(tmp, prune_n, dim=1, largest=False)[1], True)
            q = w.clone()
            q[mask1[:, i]] = 0
            Q1[:, i] = q
            err1 = (w - q) / d
            W1[:, i:] -= err1.unsqueeze(1).matmul(Hinv1[i, i:].unsqueeze(0))
            Err1[:, i] = err1
        W[:, i1:i2] = Q1
        W[:, i2:] -= Err1.matmul(Hinv[i1:i2, i2:])
    return W


@pytest.mark.parametrize("nm", [None, (2, 4), (4, 8)])
def test_sparsegpt_matches_the_official_algorithm(nm):
    x, stats = _stats(c_in=96)
    w = torch.randn(40, 96, generator=torch.Generator().manual_seed(3))
    ours = sparsegpt_prune_weight(w, stats, 0.5, nm, block_size=32)
    ref = _official_sparsegpt(w, stats.hessian(), 0.5, *(nm or (0, 0)), blocksize=32)
    assert torch.equal(ours == 0, ref == 0)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("nm", [None, (2, 4)])
def test_sparsegpt_reconstruction_error_below_magnitude_and_wanda(nm):
    x, stats = _stats(c_in=64)
    w = torch.randn(64, 64, generator=torch.Generator().manual_seed(5))
    errs = {}
    for name, fn in (("magnitude", magnitude_prune), ("wanda", wanda_prune_weight), ("sparsegpt", None)):
        new = sparsegpt_prune_weight(w, stats, 0.5, nm) if fn is None else fn(w, stats, 0.5, nm)
        assert abs(float((new == 0).float().mean()) - 0.5) < 1e-9
        errs[name] = stats.reconstruction_error(w, new)[0]
        # the Gram-matrix formula equals the error measured on the inputs
        direct = float(((x @ (w - new).T) ** 2).sum())
        assert errs[name] == pytest.approx(direct, rel=1e-3)
    assert errs["sparsegpt"] < errs["wanda"] and errs["sparsegpt"] < errs["magnitude"]
    if nm is None:  # at 2:4 both must drop 2 of the 4 outlier channels: Wanda's edge over magnitude can vanish
        assert errs["wanda"] < errs["magnitude"]


# -- the engine on tiny models ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("structure", ["unstructured", "2:4", "4:8"])
def test_exact_sparsity_per_layer_and_per_group(tiny_llama, method, structure):
    model = copy.deepcopy(tiny_llama)
    nm = parse_mask_structure(structure)
    s = 0.5 if nm else 0.3
    report = prune_model(model, _calib(), method=method, sparsity=s, mask_structure=structure)
    n_linears = sum(len(block_linears(b)) for b in decoder_blocks(model))
    assert len(report.layers) == n_linears == 14 and len(report.blocks) == 2
    for rec in report.layers:
        w = dict(block_linears(decoder_blocks(model)[rec.block]))[rec.name].weight
        if nm:
            assert nm_valid(w, *nm)
            assert (w.reshape(w.shape[0], -1, nm[1]) == 0).sum(-1).eq(nm[0]).all()
        elif method == "wanda":  # per output row
            assert ((w == 0).sum(1) == int(w.shape[1] * s)).all()
        elif method == "magnitude":  # per layer
            assert int((w == 0).sum()) == int(w.numel() * s)
        else:  # SparseGPT: per 128-column block over all rows
            assert int((w == 0).sum()) == sum(
                int(w.shape[0] * min(128, w.shape[1] - c) * s) for c in range(0, w.shape[1], 128)
            )
        assert rec.sparsity == pytest.approx(float((w == 0).float().mean()))
        assert rec.rel_recon_error > 0
    # embeddings and the tied LM head stay dense
    assert torch.equal(model.get_input_embeddings().weight, tiny_llama.get_input_embeddings().weight)


def test_per_block_sparsity_list_and_errors(tiny_llama):
    model = copy.deepcopy(tiny_llama)
    report = prune_model(model, _calib(), method="wanda", sparsity=[0.25, 0.75])
    assert [round(b.sparsity, 6) for b in report.blocks] == [0.25, 0.75]
    assert report.target_sparsities == [0.25, 0.75]
    with pytest.raises(ValueError, match="one value per block"):
        prune_model(copy.deepcopy(tiny_llama), _calib(), sparsity=[0.5])
    with pytest.raises(ValueError, match=r"sparsity of block 1 must be in \[0, 1\]"):
        prune_model(copy.deepcopy(tiny_llama), _calib(), sparsity=[0.5, 1.5])
    with pytest.raises(ValueError, match="sparsity must be 0.5"):
        prune_model(copy.deepcopy(tiny_llama), _calib(), sparsity=0.7, mask_structure="2:4")
    with pytest.raises(ValueError, match="pruning method"):
        prune_model(copy.deepcopy(tiny_llama), _calib(), method="obs")


@pytest.mark.parametrize("arch", ["tiny_llama", "tiny_gemma"])
def test_propagation_equals_running_the_pruned_model(arch, request):
    model = copy.deepcopy(request.getfixturevalue(arch))
    calib = _calib()
    report = prune_model(model, calib, method="sparsegpt", sparsity=0.5, keep_outputs=True, batch_size=3)
    with torch.no_grad():
        hidden = model(input_ids=calib, output_hidden_states=True, use_cache=False).hidden_states
    # hidden_states[l + 1] is block l's output for every block but the last (the final norm follows it)
    for b in range(len(report.blocks) - 1):
        torch.testing.assert_close(report.block_outputs[b], hidden[b + 1], rtol=1e-4, atol=1e-4)


def test_block_diagnostics_and_dense_tracking(tiny_llama):
    model = copy.deepcopy(tiny_llama)
    none = prune_model(copy.deepcopy(tiny_llama), _calib(), method=None, sparsity=0.0)
    assert all(b.out_error == 0 and b.dense_error == 0 for b in none.blocks)
    assert all(r.sparsity == 0 and r.recon_error == 0 for r in none.layers)
    report = prune_model(model, _calib(), method="wanda", sparsity=0.5)
    assert all(b.out_error > 0 and b.dense_error > 0 for b in report.blocks)
    # block 0 sees the dense inputs: its accumulated error is its local error
    assert report.blocks[0].dense_error == pytest.approx(report.blocks[0].out_error, rel=1e-5)


def test_cached_dense_outputs_give_the_same_dense_errors(tiny_llama):
    calib = _calib()
    reference = prune_model(copy.deepcopy(tiny_llama), calib, method=None, sparsity=0.0, keep_outputs=True,
                            track_dense=False, batch_size=3).block_outputs  # fmt: skip
    tracked = prune_model(copy.deepcopy(tiny_llama), calib, method="wanda", sparsity=[0.3, 0.6], batch_size=3)
    cached = prune_model(copy.deepcopy(tiny_llama), calib, method="wanda", sparsity=[0.3, 0.6], batch_size=3,
                         dense_outputs=reference)  # fmt: skip
    assert [b.dense_error for b in cached.blocks] == pytest.approx([b.dense_error for b in tracked.blocks], rel=1e-6)
    assert [b.out_error for b in cached.blocks] == [b.out_error for b in tracked.blocks]
    with pytest.raises(ValueError, match="dense_outputs must hold one"):
        prune_model(copy.deepcopy(tiny_llama), calib, method="wanda", dense_outputs=reference[:1])


def test_custom_prune_fn_callback_and_stats(tiny_llama):
    calls = []

    def keep_first_half(weight, stats, sparsity, nm):  # a plug-in: zero the second half of the inputs
        assert isinstance(stats, LayerStats) and stats.gram.shape == (weight.shape[1],) * 2
        assert stats.n_tokens == 4 * 32 and stats.n_samples == 4
        out = weight.clone()
        out[:, weight.shape[1] // 2 :] = 0
        return out

    model = copy.deepcopy(tiny_llama)
    report = prune_model(
        model,
        _calib(),
        method=keep_first_half,
        sparsity=0.5,
        keep_stats=lambda b, n: b == 1,
        on_layer=lambda rec, st, old, new: calls.append((rec.block, rec.name)),
    )
    assert len(calls) == 14 and report.method == "keep_first_half"
    assert set(report.stats) == {(1, name) for name in block_linears(decoder_blocks(model)[1])}
    assert all(r.sparsity == 0.5 for r in report.layers)
    # the dense model's statistics, without pruning
    stats = collect_layer_stats(copy.deepcopy(tiny_llama), _calib())
    assert len(stats) == 14
    q = stats[(0, "self_attn.q_proj")]
    k = stats[(0, "self_attn.k_proj")]
    torch.testing.assert_close(q.gram, k.gram)  # q and k read the same normed hidden states
    assert (q.sq_norm > 0).all()


def test_layer_filter_prunes_only_selected(tiny_llama):
    model = copy.deepcopy(tiny_llama)
    prune_model(model, _calib(), method="magnitude", sparsity=0.5, layer_filter=lambda b, n: n.startswith("mlp"))
    for name, m in block_linears(decoder_blocks(model)[0]).items():
        assert (int((m.weight == 0).sum()) > 0) == name.startswith("mlp")


def test_owl_allocation():
    ratios = [1.0, 3.0, 2.0, 5.0]
    s = owl_from_ratios(ratios, 0.7, lmbda=0.08)
    assert sum(s) / len(s) == pytest.approx(0.7)
    assert max(s) - min(s) == pytest.approx(0.16)
    assert s[3] == min(s) and s[0] == max(s)  # more outliers -> lower sparsity
    assert owl_from_ratios([2.0, 2.0], 0.5) == [0.5, 0.5]


def test_owl_sparsities_on_tiny_model(tiny_llama):
    alloc = owl_sparsities(copy.deepcopy(tiny_llama), _calib(), 0.6, lmbda=0.05)
    assert len(alloc.sparsities) == 2 and len(alloc.outlier_ratios) == 2
    assert sum(alloc.sparsities) / 2 == pytest.approx(0.6)
    assert all(0.55 - 1e-9 <= x <= 0.65 + 1e-9 for x in alloc.sparsities)


# -- saving, storage, CSR ------------------------------------------------------------------------------------------


def test_save_and_load_round_trip(tiny_llama, tiny_tokenizer, tmp_path):
    from lmlab.core.inference.models import load_model

    model = copy.deepcopy(tiny_llama)
    prune_model(model, _calib(), method="wanda", sparsity=0.5)
    folder = save_pruned(model, tiny_tokenizer, tmp_path / "pruned", info={"method": "wanda"})
    loaded, tok = load_model(str(folder), fresh=True)
    assert model_sparsity(loaded)["sparsity"] == pytest.approx(0.5)
    ids = _calib(2, 16)
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name
    with torch.no_grad():  # (the reloaded model may use another attention kernel: equal up to rounding)
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, rtol=1e-4, atol=1e-4)
    assert tok("abc")["input_ids"] == tiny_tokenizer("abc")["input_ids"]
    assert (folder / "lmlab_pruning.json").is_file()


def test_saved_model_runs_as_model_of_a_method(tiny_llama, tiny_tokenizer, tmp_path):
    from lmlab.runner import run_method

    model = copy.deepcopy(tiny_llama)
    prune_model(model, _calib(), method="magnitude", sparsity=0.5)
    folder = save_pruned(model, tiny_tokenizer, tmp_path / "pruned")
    result = run_method(
        "wanda",
        preset="smoke",
        model=str(folder),
        write=False,
        show_progress=False,
        raise_errors=True,
        speed=False,
        threads=1,
    )
    assert result.run_info["status"] == "ok"
    assert result.meta_info["models"][str(folder)]["layers"] == 2


def test_storage_and_sparse_linear():
    lin = torch.nn.Linear(64, 32, bias=True)
    with torch.no_grad():
        lin.weight.mul_(torch.rand(32, 64) > 0.5)
    x = torch.randn(3, 5, 64)
    torch.testing.assert_close(SparseLinear(lin)(x), lin(x), rtol=1e-5, atol=1e-5)


def test_storage_report_and_sparse_copy(tiny_llama):
    model = copy.deepcopy(tiny_llama)
    prune_model(model, _calib(), method="wanda", mask_structure="2:4")
    st = storage_report(model, nm=(2, 4))
    assert st["nnz"] == st["numel"] // 2
    assert st["dense_bytes"] == 4 * st["numel"]
    assert st["bitmask_bytes"] == pytest.approx(st["nnz"] * 4 + st["numel"] / 8, abs=14)
    assert st["nm_bytes"] == pytest.approx(st["numel"] / 2 * 4 + st["numel"] / 2 * 2 / 8, abs=14)
    csr = sparse_copy(model, True)
    ids = _calib(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(csr(input_ids=ids).logits, model(input_ids=ids).logits, rtol=1e-4, atol=1e-4)


def test_a_block_without_nn_linear_is_refused_not_left_dense():
    """GPT-2's Conv1D holds its weights (C_in, C_out): silently skipping it reported sparsity 0 on a dense model."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from lmlab.core.pruning import prune_model

    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32)).eval()
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="type Conv1D"):
        prune_model(model, ids, method="wanda", sparsity=0.5)


def test_latency_report_decode_is_a_cached_step(tiny_llama):
    """ "decode" is one token against a KV cache of the prefill length (it was a 1-token forward without cache)."""
    from lmlab.core.pruning import latency_report

    calls = []

    def spy(module, args, kwargs):
        past = kwargs.get("cache", kwargs.get("past_key_values"))
        calls.append((kwargs["input_ids"].shape[1], 0 if past is None else past.get_seq_length()))

    handle = tiny_llama.register_forward_pre_hook(spy, with_kwargs=True)
    try:
        rep = latency_report({"a": tiny_llama}, prefill_tokens=12, repeats=2, warmup=2)
    finally:
        handle.remove()
    assert set(rep) == {"decode", "prefill"}
    decode_calls = [c for c in calls if c[0] == 1]
    assert decode_calls and all(length == 12 for _, length in decode_calls)  # every timed step sees 12 cached tokens
