"""Invariants of the lifelong-editing toolkit: ROME's rank-one update, MEMIT vs ROME on one edit, LoRA-Merge's
interpolation, FT's parameter set, the prefix-cached scorer, retention bookkeeping over re-edits, RAG's memory,
the GeoBigEdit stream, and one-line errors on bad input."""

from __future__ import annotations

import copy

import pytest
import torch

from lmlab import data
from lmlab.methods.analysis.wikibigedit import baselines as B
from lmlab.methods.analysis.wikibigedit import locate_edit as L
from lmlab.methods.analysis.wikibigedit import method as M
from lmlab.methods.analysis.wikibigedit.config import WikiBigEditConfig


@pytest.fixture(scope="module")
def soft_llama():
    """A tiny llama with init std 0.1: attention is diffuse enough that one position's MLP output moves the
    next-token distribution (the default std 0.5 gives near one-hot attention)."""
    from lmlab.core.inference.tiny import make_tiny_model

    return make_tiny_model(seed=0, init_std=0.1)


def _rank_ratio(delta: torch.Tensor) -> float:
    s = torch.linalg.svdvals(delta.double())
    return float(s[1] / s[0])


# A subject ending at "A:" puts ROME's key at the last prompt token: the edit reaches the answer in a 2-layer
# random model without depending on attention routing (the real models carry it through attention).
EDIT = M.EditRecord(key="capital/NO", src="What is the capital of Norway?", alt="Bergen", subject="Norway? A:",
                    sentence="The capital of Norway is Bergen.")  # fmt: skip
OTHER = M.EditRecord(key="capital/PE", src="What is the capital of Peru?", alt="Lima", subject="Peru? A:")


# ----------------------------------------------------------------------------------------------------------------
# ROME


def test_rome_update_maps_the_key_to_the_value_and_spares_orthogonal_keys():
    g = torch.Generator().manual_seed(0)
    d, m = 6, 10
    w = torch.randn(d, m, generator=g, dtype=torch.float64)
    k_star, k_plain, v = (torch.randn(n, generator=g, dtype=torch.float64) for n in (m, m, d))
    a = torch.randn(m, m, generator=g, dtype=torch.float64)
    cov = a @ a.T + 0.1 * torch.eye(m, dtype=torch.float64)
    for cov_i in (None, cov):
        for k in (None, k_plain):  # R-ROME (k = k*) and ROME (the plain prompt's key)
            dw = L.rome_update(w, k_star, v, k=k, cov=cov_i)
            key = k_star if k is None else k
            assert torch.allclose((w + dw) @ key, v, atol=1e-10)
            assert _rank_ratio(dw) < 1e-10
            u = k_star if cov_i is None else torch.linalg.solve(cov_i, k_star)
            other = torch.randn(m, generator=g, dtype=torch.float64)
            other = other - (other @ u) / (u @ u) * u  # u^T k' = 0: an unrelated key in ROME's metric
            assert torch.allclose((w + dw) @ other, w @ other, atol=1e-10)
    # a broken direction (u orthogonal to the key) is refused rather than dividing by zero
    e1, e2 = torch.eye(m, dtype=torch.float64)[:2]
    with pytest.raises(ValueError, match="orthogonal"):
        L.rome_update(w, e1, v, k=e2)


def test_rome_edit_changes_the_target_fact_and_keeps_an_unrelated_key(soft_llama, tiny_tokenizer):
    model = copy.deepcopy(soft_llama)
    tok = tiny_tokenizer
    down = M.decoder_layers(model)[0].mlp.down_proj
    w0 = down.weight.detach().clone()
    pre = M.score_answers(model, tok, [EDIT.src], [EDIT.alt], prefix="")[0]
    k_other = L.mlp_keys(model, tok, [M.qa_prompt(OTHER.src)], [OTHER.subject], 0)[0]
    editor = L.ROMEEditor(model, tok, layer=0, templates=["{}"], steps=25, lr=0.5)
    stats = editor.edit_one(EDIT)
    post = M.score_answers(model, tok, [EDIT.src], [EDIT.alt], prefix="")[0]
    # the target fact moves: the new answer's teacher-forced log-prob rises by several nats
    assert post.logprob > pre.logprob + 2.0, (pre.logprob, post.logprob)
    assert stats["v_loss_last"] < stats["v_loss_first"]
    # the update is rank one and puts v* exactly at k*
    dw1 = down.weight.detach() - w0
    assert _rank_ratio(dw1) < 1e-3
    assert stats["rank_one_residual"] < 1e-5
    # an unrelated prompt's key, minus its component along k* (C = I), keeps its MLP output exactly
    k_star = L.mlp_keys(model, tok, [M.qa_prompt(EDIT.src)], [EDIT.subject], 0)[0]
    # the key is read before down_proj: the edit of layer 0's down_proj cannot change it
    assert torch.allclose(k_star, L.mlp_keys(soft_llama, tok, [M.qa_prompt(EDIT.src)], [EDIT.subject], 0)[0])
    ortho = k_other - (k_other @ k_star) / (k_star @ k_star) * k_star
    before = w0.double() @ ortho
    assert torch.allclose(down.weight.detach().double() @ ortho, before, atol=1e-5 * float(before.norm()))
    # lifelong: a second edit adds its own rank-one update on top, the first one is never rolled back
    editor.edit_one(OTHER)
    dw2 = down.weight.detach() - w0 - dw1
    assert _rank_ratio(dw2) < 1e-3 and float(dw2.norm()) > 0
    assert _rank_ratio(down.weight.detach() - w0) > 1e-3  # two edits: rank two


# ----------------------------------------------------------------------------------------------------------------
# MEMIT


def test_memit_update_with_one_edit_is_romes_update():
    g = torch.Generator().manual_seed(1)
    d, m = 5, 8
    w = torch.randn(d, m, generator=g, dtype=torch.float64)
    k, r = torch.randn(m, 1, generator=g, dtype=torch.float64), torch.randn(d, 1, generator=g, dtype=torch.float64)
    eye = torch.eye(m, dtype=torch.float64)
    rome = L.rome_update(w, k[:, 0], (w @ k + r)[:, 0])  # residual r at k* = k
    assert torch.allclose(L.memit_update(k, r, eye, 1e-9), rome, atol=1e-8)
    # with a covariance and the paper's lambda: ROME's covariance-adjusted update shrunk by q / (lam + q)
    a = torch.randn(m, m, generator=g, dtype=torch.float64)
    cov = a @ a.T + eye
    q = float(k[:, 0] @ torch.linalg.solve(cov, k[:, 0]))
    rome_c = L.rome_update(w, k[:, 0], (w @ k + r)[:, 0], cov=cov)
    assert torch.allclose(L.memit_update(k, r, cov, 15000.0), rome_c * q / (15000.0 + q), atol=1e-12)
    # a batch: the least-squares solution of min |dW K - R|^2 + lam tr(dW C dW^T)
    kb, rb = torch.randn(m, 3, generator=g, dtype=torch.float64), torch.randn(d, 3, generator=g, dtype=torch.float64)
    dw = L.memit_update(kb, rb, cov, 2.0)
    grad = (dw @ kb - rb) @ kb.T + 2.0 * dw @ cov
    assert torch.allclose(grad, torch.zeros_like(grad), atol=1e-9)


def test_memit_editor_with_one_edit_and_one_layer_matches_rome(soft_llama, tiny_tokenizer):
    # z at resid_post of the only layer = v* at its MLP output (the same sum); no weight decay / clamp, whose
    # scale is the norm of the hooked vector and so differs between the two points
    kw = dict(steps=8, lr=0.5, weight_decay=0.0, clamp_norm_factor=1e6)
    a, b = copy.deepcopy(soft_llama), copy.deepcopy(soft_llama)
    w0 = M.decoder_layers(soft_llama)[1].mlp.down_proj.weight.detach().clone()
    L.ROMEEditor(a, tiny_tokenizer, layer=1, templates=["{}"], **kw).apply([EDIT])
    m = w0.shape[1]
    L.MEMITEditor(b, tiny_tokenizer, layers=[1], templates=["{}"], covs={1: torch.eye(m, dtype=torch.float64)},
                  lam=1e-6, **kw).apply([EDIT])  # fmt: skip
    da = M.decoder_layers(a)[1].mlp.down_proj.weight.detach() - w0
    db = M.decoder_layers(b)[1].mlp.down_proj.weight.detach() - w0
    assert float(da.norm()) > 0
    assert float((da - db).norm() / da.norm()) < 1e-2


def test_memit_spreads_a_batch_over_its_layers_and_needs_every_covariance(tiny_llama, tiny_tokenizer):
    model = copy.deepcopy(tiny_llama)
    w0 = [layer.mlp.down_proj.weight.detach().clone() for layer in M.decoder_layers(model)]
    m = w0[0].shape[1]
    covs = {i: torch.eye(m, dtype=torch.float64) for i in (0, 1)}
    with pytest.raises(ValueError, match="missing \\[1\\]"):
        L.MEMITEditor(model, tiny_tokenizer, layers=[0, 1], templates=["{}"], covs={0: covs[0]})
    ed = L.MEMITEditor(model, tiny_tokenizer, layers=[0, 1], templates=["{}"], covs=covs, lam=1.0, steps=3)
    ed.apply([EDIT, OTHER])
    for i, layer in enumerate(M.decoder_layers(model)):
        assert float((layer.mlp.down_proj.weight.detach() - w0[i]).norm()) > 0, i
    assert ed.n_edits == 2


def test_memit_spreads_the_residual_over_the_remaining_layers(tiny_llama, tiny_tokenizer, monkeypatch):
    model = copy.deepcopy(tiny_llama)
    m = M.decoder_layers(model)[0].mlp.down_proj.in_features
    covs = {i: torch.eye(m, dtype=torch.float64) for i in (0, 1)}
    zs, resids = [], []
    real_z, real_u = L.optimise_value, L.memit_update
    monkeypatch.setattr(L, "optimise_value", lambda *a, **k: zs.append(real_z(*a, **k)) or zs[-1])
    monkeypatch.setattr(L, "memit_update", lambda k, r, c, lam: resids.append(r) or real_u(k, r, c, lam))
    ed = L.MEMITEditor(model, tiny_tokenizer, layers=[0, 1], templates=["{}"], covs=covs, lam=1.0, steps=3)
    cur = ed._resid_at([EDIT], 1)  # (d, 1) before any update
    ed.apply([EDIT])
    full = zs[0].target[:, None] - cur
    assert torch.allclose(resids[0], full / 2, atol=1e-6)  # layer 0 of 2 takes half of the residual
    assert len(resids) == 2 and not torch.allclose(resids[1], full)  # layer 1 sees the residual left after layer 0


# ----------------------------------------------------------------------------------------------------------------
# LoRA, LoRA-Merge, FT


def test_merge_interpolation_keeps_alpha_of_the_update_on_the_adapted_weights_only(tiny_llama):
    from peft import LoraConfig, get_peft_model

    base = copy.deepcopy(tiny_llama)
    before = {n: p.detach().clone() for n, p in base.named_parameters()}
    peft_model = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    g = torch.Generator().manual_seed(0)
    deltas = {}
    for name, module in peft_model.named_modules():
        if hasattr(module, "lora_B") and "default" in getattr(module, "lora_B", {}):
            with torch.no_grad():
                module.lora_B["default"].weight.copy_(torch.randn(module.lora_B["default"].weight.shape, generator=g))
            deltas[name.split("base_model.model.", 1)[1] + ".weight"] = module.get_delta_weight("default").detach()
    assert deltas and all(".q_proj." in n or ".v_proj." in n for n in deltas)
    merged = B.merge_lora_interpolate(peft_model, 0.25)
    after = dict(merged.named_parameters())
    assert set(after) == set(before)  # adapters removed
    for n, p in after.items():
        expected = before[n] + 0.25 * deltas[n] if n in deltas else before[n]
        assert torch.allclose(p.detach(), expected, atol=1e-6), n


def test_lora_editors_train_their_adapters_and_merge_resets_them(tiny_llama, tiny_tokenizer):
    w_q = tiny_llama.model.layers[0].self_attn.q_proj.weight.detach().clone()
    plain = B.LoRAEditor(copy.deepcopy(tiny_llama), tiny_tokenizer, epochs=3, lr=1e-2)
    plain.apply([EDIT])
    first = {n: p.detach().clone() for n, p in plain.model.named_parameters() if "lora_B" in n}
    assert first and all(float(v.abs().sum()) > 0 for v in first.values())  # B starts at 0: training moved it
    plain.apply([OTHER])  # the same adapter trains on
    assert any(not torch.equal(first[n], p) for n, p in plain.model.named_parameters() if "lora_B" in n)
    merge = B.LoRAEditor(copy.deepcopy(tiny_llama), tiny_tokenizer, epochs=3, lr=1e-2, merge_alpha=0.25)
    merge.apply([EDIT])
    assert not any("lora_" in n for n, _ in merge.model.named_parameters())  # merged into the base, no adapter
    assert not torch.equal(merge.model.model.layers[0].self_attn.q_proj.weight, w_q)
    assert torch.equal(
        merge.model.model.layers[0].mlp.down_proj.weight, tiny_llama.model.layers[0].mlp.down_proj.weight
    )


def test_ft_trains_only_the_chosen_down_proj(tiny_llama, tiny_tokenizer):
    model = copy.deepcopy(tiny_llama)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    B.FTEditor(model, tiny_tokenizer, layers=[1], epochs=3, lr=1e-2).apply([EDIT])
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == {"model.layers.1.mlp.down_proj.weight"}  # the tied embedding is untouched


# ----------------------------------------------------------------------------------------------------------------
# Scoring and lifelong bookkeeping


def test_prefix_cached_scores_equal_the_concatenated_sequences(tiny_llama, tiny_tokenizer):
    from lmlab.core.inference.scoring import encode, split_pair

    qs, ans = [EDIT.src, OTHER.src, "Which river flows through Rome?"], ["Bergen", "Lima", "Tiber"]
    got = M.score_answers(tiny_llama, tiny_tokenizer, qs, ans, batch_size=2)
    for q, a, s in zip(qs, ans, got):
        pre = encode(tiny_tokenizer, M.FEWSHOT, add_special_tokens=True)
        ctx, cont = split_pair(tiny_tokenizer, M.qa_prompt(q), " " + a, add_special_tokens=False)
        ids = torch.tensor([pre + ctx + cont])
        with torch.no_grad():
            lp = torch.log_softmax(tiny_llama(input_ids=ids).logits[0].float(), -1)
        c = len(pre) + len(ctx)
        rows = lp[c - 1 : c - 1 + len(cont)]
        target = torch.tensor(cont)
        assert s.n_tokens == len(cont)
        assert s.pred == tuple(rows.argmax(-1).tolist())
        assert s.token_acc == pytest.approx(float((rows.argmax(-1) == target).float().mean()))
        assert s.logprob == pytest.approx(float(rows.gather(-1, target[:, None]).sum()), abs=1e-3)


def _fact(key, alt, increment, subject="Norway", loc=("What is the capital of Sweden?", "Stockholm")):
    return M.EditRecord(key=key, src=f"What is the {key.split('/')[0]} of {subject}?", alt=alt, subject=subject,
                        increment=increment, sentence=f"The {key.split('/')[0]} of {subject} is {alt}.",
                        loc=loc[0], loc_ans=loc[1])  # fmt: skip


def test_retention_bookkeeping_scores_the_latest_value_and_splits_current_from_past(
    tiny_llama, tiny_tokenizer, monkeypatch
):
    a1, b1 = _fact("capital/NO", "Bergen", 0), _fact("currency/NO", "Euro", 0)
    # the re-edit's locality question differs from the original's (as for a city moved to another country)
    c2 = _fact("capital/SE", "Malmo", 1, "Sweden")
    a2 = _fact("capital/NO", "Trondheim", 1, loc=("What is the capital of Finland?", "Helsinki"))
    seen: list[list[tuple[str, str]]] = []
    real = M.score_answers

    def spy(model, tok, questions, answers, **kw):
        seen.append(list(zip(questions, answers)))
        return real(model, tok, questions, answers, **kw)

    editor = B.RAGEditor(tiny_llama, tiny_tokenizer, B.hashing_embedder())
    ref = M.make_reference(
        tiny_llama, tiny_tokenizer, [a1, b1, c2, a2], [("What is the capital of Chile?", "Santiago")], []
    )
    monkeypatch.setattr(M, "score_answers", spy)
    res = M.run_lifelong(editor, [[a1, b1], [c2, a2]], ref)
    assert [r.n_edits for r in res] == [2, 3]  # a re-edit is one fact, not a new one
    assert res[0].current == ["capital/NO", "currency/NO"] and res[0].past == []
    assert sorted(res[1].current) == ["capital/NO", "capital/SE"] and res[1].past == ["currency/NO"]
    last = dict(seen[-1])
    assert last[a2.src] == "Trondheim"  # the latest value is scored
    assert all(a != "Bergen" for _, a in seen[-1])  # the overwritten one never is
    assert set(res[1].scores["edit"]) == {"capital/NO", "capital/SE", "currency/NO"}
    assert set(res[1].scores["locality"]) == {"capital/NO", "currency/NO", "capital/SE"}
    assert ("What is the capital of Finland?", "Helsinki") in last.items()  # the latest record's locality question
    assert len(ref.loc_pred) == 2  # one reference per locality question, not per fact key
    assert len(res[1].general) == 1
    # RAG: the re-edit replaced its memory entry, so the stale value cannot be retrieved
    assert len(editor.memory) == 3 and editor.memory["capital/NO"][0] == a2.sentence
    assert "Trondheim" in editor.contexts([a2.src])[0]
    # without past evaluation only the current increment is scored
    res2 = M.run_lifelong(B.RAGEditor(tiny_llama, tiny_tokenizer, B.hashing_embedder()), [[a1, b1], [c2, a2]], ref,
                          eval_past=False)  # fmt: skip
    assert res2[1].past == [] and set(res2[1].scores["edit"]) == {"capital/NO", "capital/SE"}


def test_first_increment_curves_drop_re_edited_facts():
    from types import SimpleNamespace

    from lmlab.methods.analysis.wikibigedit.experiment import _curve_row, _record_final

    recorded = {}
    ctx = SimpleNamespace(record=lambda system, metric, vals, **kw: recorded.__setitem__((system, metric), list(vals)))
    first = M.IncrementResult(0, 2, ["a", "b"], [], {"edit": {"a": 1.0, "b": 0.5}, "locality": {"a": 1.0, "b": 1.0}},
                              [1.0], [], 0.0, 0.0)  # fmt: skip
    last = M.IncrementResult(1, 3, ["a", "c"], ["b"], {"edit": {"a": 0.0, "b": 0.25, "c": 1.0},
                             "locality": {"a": 0.5, "b": 0.5, "c": 1.0}}, [0.0], [], 0.0, 0.0)  # fmt: skip
    facts = {k: M.EditRecord(key=k, src="q", alt="x", subject="s") for k in "abc"}
    _record_final(ctx, "rome", [first, last], facts)
    # "a" was re-edited in increment 1: only "b" is tracked from right after increment 0 to the end
    assert recorded[("rome@after_first", "first_increment_acc")] == [0.5]
    assert recorded[("rome@after_last", "first_increment_acc")] == [0.25]
    assert recorded[("rome", "edit_acc")] == [0.0, 1.0] and recorded[("rome", "retention")] == [0.25]
    # three increments, "b" re-edited in the middle one: it is not tracked either, although it is "past" at the end
    middle = M.IncrementResult(1, 3, ["b", "c"], ["a"], {"edit": {"a": 0.9, "b": 1.0, "c": 1.0}}, [0.5], [], 0.0, 0.0)
    end = M.IncrementResult(2, 3, [], ["a", "b", "c"], {"edit": {"a": 0.3, "b": 0.2, "c": 0.1}}, [0.0], [], 0.0, 0.0)
    recorded.clear()
    _record_final(ctx, "rome", [first, middle, end], facts)
    assert recorded[("rome@after_first", "first_increment_acc")] == [1.0]  # only "a"
    assert recorded[("rome@after_last", "first_increment_acc")] == [0.3]
    row = _curve_row("rome", last)
    assert row["edit"] == 0.5 and row["retention"] == 0.25 and row["n_edits"] == 3


def test_edit_api_evaluates_after_the_whole_batch(tiny_llama, tiny_tokenizer):
    editor = B.RAGEditor(tiny_llama, tiny_tokenizer, B.hashing_embedder())
    out = editor.edit(
        [EDIT.src, OTHER.src],
        ["Bergen", "Lima"],
        ["Norway", "Peru"],
        rephrase_prompts=["Which city is the capital of Norway?", "Which city is the capital of Peru?"],
        locality_inputs={"prompt": ["What is the capital of Chile?"], "ground_truth": ["Santiago"]},
        portability_inputs={"prompt": ["What is the capital of Norway?"], "ground_truth": ["Bergen"]},
    )
    assert len(out["rewrite_acc"]) == 2 and len(out["rephrase_acc"]) == 2
    assert len(out["locality"]) == 1 and len(out["portability"]) == 1
    with pytest.raises(ValueError, match="sequential_edit must be True"):
        editor.edit([EDIT.src], ["Bergen"], ["Norway"], sequential_edit=False)


# ----------------------------------------------------------------------------------------------------------------
# The GeoBigEdit stream


def test_geobigedit_stream_has_timestamps_re_edits_real_changes_and_multi_hop():
    stream = data.load("geobigedit", None, seed=0, split="test", increments=4, edits_per_increment=16)
    assert len(stream) == 64
    tags = {e.meta["tag"] for e in stream}
    assert tags == {"counterfactual", "new_fact", "real_change", "re_edit"}
    latest: dict[str, str] = {}
    for e in stream:
        if e.meta["tag"] == "re_edit":
            assert e.meta["key"] in latest and e.meta["increment"] >= 1
            assert e.meta["previous"] == latest[e.meta["key"]] and e.target != e.meta["previous"]
        latest[e.meta["key"]] = e.target
    by_inc: dict[int, list[str]] = {}
    for e in stream:
        if e.meta["tag"] == "real_change":
            by_inc.setdefault(e.meta["increment"], []).append(e.meta["date"])
    assert len(by_inc) >= 2
    spans = [(min(v), max(v)) for _, v in sorted(by_inc.items())]
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # genuine timestamps: increments in date order
    assert all(e.meta["timestamp"].startswith(min(by_inc[e.meta["increment"]])) for e in stream
               if e.meta["increment"] in by_inc)  # fmt: skip
    assert any(e.meta["mhop"] for e in stream)
    edited_capitals = {e.meta["key"] for e in stream if e.meta["relation"] == "capital"}
    assert all(f"capital/{e.meta['loc_country']}" not in edited_capitals for e in stream)  # locality is never edited
    general = data.load("geobigedit", None, seed=0, split="test", kind="general", increments=4, edits_per_increment=16)
    assert not {g.meta["key"] for g in general} & {e.meta["key"] for e in stream}


def test_default_stream_leaves_min_n_facts_to_every_gated_check():
    # the claims read the last increment's facts (edit accuracy) and the first increment's facts that no later
    # increment re-edits (ROME's degradation); a decisive status needs min_n of them after filter_edits, which
    # dropped 2 of 18 edits (11%) in the 2026-12-04 run: leave room for 20%
    from lmlab.core.stats.uncertainty import default_min_n
    from lmlab.data.geobigedit import increments_of

    cfg = WikiBigEditConfig()
    stream = data.load("geobigedit", None, seed=cfg.seed, split="test", increments=cfg.increments,
                       edits_per_increment=cfg.edits_per_increment, reedit_fraction=cfg.reedit_fraction)  # fmt: skip
    incs = increments_of(stream)
    later = {e.meta["key"] for inc in incs[1:] for e in inc}
    first_kept = {e.meta["key"] for e in incs[0]} - later
    last = {e.meta["key"] for e in incs[-1]}
    need = default_min_n(0.95)
    assert int(0.8 * len(last)) >= need and int(0.8 * len(first_kept)) >= need, (len(last), len(first_kept))
    assert "memit" not in cfg.methods  # MEMIT is the full setting: its ~110 s would break the 5-minute default


class _Noop(M.Editor):
    def apply(self, requests):
        return {}


def test_rag_is_scored_after_shots_that_show_a_retrieved_fact_in_use(tiny_llama, tiny_tokenizer, monkeypatch):
    from lmlab.methods.analysis.wikibigedit.experiment import _editor

    fact = _fact("capital/NO", "Bergen", 0)
    ref = M.make_reference(tiny_llama, tiny_tokenizer, [fact], [], [])
    prefixes: list[str] = []
    real = M.score_answers

    def spy(model, tok, questions, answers, **kw):
        prefixes.append(kw.get("prefix"))
        return real(model, tok, questions, answers, **kw)

    monkeypatch.setattr(M, "score_answers", spy)
    rag = B.RAGEditor(tiny_llama, tiny_tokenizer, B.hashing_embedder())
    M.run_lifelong(rag, [[fact]], ref)
    lines = prefixes[-1].strip().split("\n")
    facts, qas = lines[0::2], lines[1::2]
    assert len(qas) == 3 and all(f.startswith("Fact: ") for f in facts) and all(q.startswith("Q: ") for q in qas)
    plain = dict(line.split(" A: ") for line in M.FEWSHOT.strip().split("\n"))
    shots = [q.split(" A: ") for q in qas]
    assert [q for q, _ in shots] == list(plain)  # the same questions as every other editor's shots
    used = [a in f for (_, a), f in zip(shots, facts)]
    assert any(used) and not all(used)  # shots that use their fact, and one that ignores an unrelated fact
    # one shot follows a fact that contradicts the plain shots' answer (the stream's edits are counterfactuals)
    assert any(u and plain[q] != a for u, (q, a) in zip(used, shots))
    # every other editor keeps the plain shots; so does the EasyEdit-shaped API of each
    prefixes.clear()
    M.run_lifelong(_Noop(tiny_llama, tiny_tokenizer), [[fact]], ref)
    assert set(prefixes) == {M.FEWSHOT}
    prefixes.clear()
    rag.edit([EDIT.src], ["Bergen"], ["Norway"])
    assert set(prefixes) == {B.FEWSHOT_FACTS}
    # the experiment builds RAG with the fact shots, or the plain ones when asked
    for fact_shots, want in ((True, B.FEWSHOT_FACTS), (False, M.FEWSHOT)):
        cfg = WikiBigEditConfig(retriever="hashing", rag_fact_shots=fact_shots)
        assert _editor("rag", cfg, tiny_llama, tiny_tokenizer, {}).shots == want


def test_fine_tuning_lrs_are_the_recipes_scaled_rate_times_a_dev_searched_multiplier(tiny_llama, tiny_tokenizer):
    import math

    from lmlab.methods.analysis.wikibigedit.experiment import _editor, scaled_lr, search_editor_lrs

    cfg = WikiBigEditConfig()
    shared = {"ft_layers": [1]}
    # lora_main.py: lr * batch_size / 256, for LoRA and (the same loop) FT
    assert scaled_lr(cfg, "lora") == pytest.approx(cfg.lora_lr * cfg.lora_batch / 256)
    assert scaled_lr(cfg, "lora_merge") == scaled_lr(cfg, "lora")
    assert _editor("lora", cfg, tiny_llama, tiny_tokenizer, shared).lr == pytest.approx(5e-3 * 4 / 256)
    assert _editor("ft", cfg, tiny_llama, tiny_tokenizer, shared).lr == pytest.approx(5e-4 * 4 / 256)
    unscaled = WikiBigEditConfig(lora_lr_batch_scaling=False)
    assert _editor("ft", unscaled, tiny_llama, tiny_tokenizer, shared).lr == pytest.approx(5e-4)
    # the dev search: LoRA's best lies between the grid's top two points, FT's at its bottom point
    target = {"lora": 40 * scaled_lr(cfg, "lora"), "ft": scaled_lr(cfg, "ft")}
    calls: list[tuple[str, float]] = []

    def dev_score(name, lr):
        calls.append((name, lr))
        return (math.log(lr) - math.log(target[name])) ** 2

    res = search_editor_lrs(cfg, dev_score)
    assert set(res) == {"lora", "ft"}  # LoRA-Merge has no search of its own
    lora_tried = sorted(lr / scaled_lr(cfg, "lora") for lr, _, _ in res["lora"].tried)
    assert lora_tried == pytest.approx([1, 8, 64, 512])  # the top-edge choice extended the grid at its ratio
    assert res["lora"].chosen == pytest.approx(64 * scaled_lr(cfg, "lora")) and res["lora"].edge is None
    assert res["ft"].chosen == pytest.approx(scaled_lr(cfg, "ft")) and res["ft"].extensions == 1
    chosen = {**shared, "lr": {n: r.chosen for n, r in res.items()}}
    assert _editor("lora_merge", cfg, tiny_llama, tiny_tokenizer, chosen).lr == res["lora"].chosen
    assert _editor("ft", cfg, tiny_llama, tiny_tokenizer, chosen).lr == res["ft"].chosen
    # only the editors that run are searched; LoRA-Merge alone still needs LoRA's search
    assert set(search_editor_lrs(WikiBigEditConfig(methods=["lora_merge", "rome"]), dev_score)) == {"lora"}
    assert search_editor_lrs(WikiBigEditConfig(methods=["rag", "rome"]), dev_score) == {}


def test_fine_tuned_editors_must_beat_the_unedited_model_and_rag_shots_are_reported():
    from types import SimpleNamespace

    from lmlab.methods.analysis.wikibigedit.experiment import RAG_PLAIN, _claims

    systems = ("pre_edit", "rag", RAG_PLAIN, "lora", "lora_merge", "ft", "rome")
    vals = {(s, "edit_acc"): [0.5, 0.25, 1.0] for s in systems}
    ctx = SimpleNamespace(has=lambda s, m: (s, m) in vals, values=lambda s, m: vals[(s, m)])
    claims = _claims(ctx, WikiBigEditConfig())
    trained = {c.method for c in claims if c.baseline == "pre_edit" and c.min_effect == 0 and c.gate}
    assert trained == {"lora", "lora_merge", "ft"}  # gated: training has to move the model
    shots = [c for c in claims if RAG_PLAIN in (c.method, c.baseline)]
    assert [(c.method, c.baseline, c.gate) for c in shots] == [("rag", RAG_PLAIN, False)]
    assert all(RAG_PLAIN not in (c.method, c.baseline) for c in claims if c.gate)  # never RAG's "best other"


# ----------------------------------------------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"methods": []}, "methods must name"),
        ({"methods": ["rag", "wise"]}, "'wise'"),
        ({"methods": ["rag", "rag"]}, "must not repeat"),
        ({"increments": 0}, "increments"),
        ({"reedit_fraction": 1.0}, "reedit_fraction"),
        ({"merge_alpha": 0.0}, "merge_alpha"),
        ({"memit_layers": [5, 3]}, "memit_layers"),
        ({"ft_layers": []}, "ft_layers"),
        ({"rome_clamp": 0.0}, "rome_clamp"),
        ({"lr_search": []}, "lr_search"),
        ({"lr_search": [1.0, 1.0]}, "lr_search"),
        ({"lr_search": [0.0, 8.0]}, "lr_search"),
        ({"lr_dev_edits": 0}, "lr_dev_edits"),
    ],
)
def test_config_rejects_bad_values(kw, match):
    with pytest.raises(ValueError, match=match) as err:
        WikiBigEditConfig(**kw)
    assert "\n" not in str(err.value)


def test_bad_inputs_get_one_line_errors(tiny_llama, tiny_gemma, tiny_tokenizer):
    cases = [
        (lambda: L.ROMEEditor(copy.deepcopy(tiny_gemma), tiny_tokenizer, layer=0, templates=["{}"]), "gemma3"),
        (lambda: L.ROMEEditor(tiny_llama, tiny_tokenizer, layer=5, templates=["{}"]), "rome_layer"),
        (lambda: B.FTEditor(copy.deepcopy(tiny_llama), tiny_tokenizer, layers=[2]), "ft_layers"),
        (lambda: M.score_answers(tiny_llama, tiny_tokenizer, ["q"], [""]), "answer 0 is empty"),
        (lambda: M.score_answers(tiny_llama, tiny_tokenizer, ["q", "r"], ["a"]), "2 questions but 1 answers"),
        (lambda: L.subject_last_index(tiny_tokenizer, "Q: x A:", "Norway"), "'Norway' does not occur"),
        (lambda: B.RAGEditor(tiny_llama, tiny_tokenizer, B.hashing_embedder(), top_k=0), "top_k"),
        (lambda: B.LoRAEditor(tiny_llama, tiny_tokenizer, merge_alpha=1.5), "merge_alpha"),
        (lambda: L.compute_covariance(tiny_llama, tiny_tokenizer, [0], []), "at least one text"),
        (lambda: data.load("geobigedit", None, increments=0), "increments must be an int"),
        (lambda: data.load("geobigedit", None, increments=200, edits_per_increment=64), "pool of editable facts"),
    ]
    for fn, match in cases:
        with pytest.raises(ValueError, match=match) as err:
            fn()
        assert "\n" not in str(err.value), match
