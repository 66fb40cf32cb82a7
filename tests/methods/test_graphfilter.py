"""Invariants of GraphFilter: the lazy heap is exact, covered n-grams are covered, the loop re-computes coverage,
the IFD quality, the baselines, and the cached-trunk SFT harness of the reproduction (tiny models only)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lmlab.methods.alignment.graphfilter import method as M

WORDS = [f"w{i}" for i in range(30)]


def _random_pool(rng: np.random.Generator) -> list[str]:
    n = int(rng.integers(2, 40))
    vocab = WORDS[: int(rng.integers(2, 30))]
    return [" ".join(rng.choice(vocab, size=int(rng.integers(1, 8)))) for _ in range(n)]


# ---------------------------------------------------------------------------------------------------------------
# the lazy heap picks exactly what the naive loop picks (seeded random pools; hypothesis is not installed)


@pytest.mark.parametrize("combine", ["mul", "add"])
@pytest.mark.parametrize("reset", [True, False])
def test_lazy_heap_picks_exactly_what_the_naive_loop_picks(combine, reset):
    rng = np.random.default_rng(123 if reset else 7)
    resets_seen = 0
    for trial in range(120):
        texts = _random_pool(rng)
        graph = M.build_ngram_graph(texts, ngram_range=(1, int(rng.integers(1, 4))))
        n = len(texts)
        # every third pool has coarse qualities: many exact ties, decided by Q then by rank
        quality = [None, rng.random(n), np.round(rng.random(n), 1)][trial % 3]
        k = int(rng.integers(1, n + 1))
        seed = None if trial % 2 else trial
        kw = dict(quality=quality, combine=combine, lam=float(rng.uniform(0.1, 3.0)), reset=reset, seed=seed)
        lazy = M.select_on_graph(graph, k, lazy=True, **kw)
        naive = M.select_on_graph(graph, k, lazy=False, **kw)
        assert lazy.order == naive.order, (trial, texts, k)
        assert lazy.resets == naive.resets
        assert np.array_equal(lazy.priority, naive.priority) and np.array_equal(lazy.gain, naive.gain)
        assert np.array_equal(lazy.covered, naive.covered)
        assert len(set(lazy.order)) == k
        resets_seen += len(lazy.resets)
    if reset:
        assert resets_seen > 0  # the pools do exhaust their n-grams, so the reset path is exercised


def test_lazy_heap_evaluates_fewer_priorities_on_a_large_pool():
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, size=6)) for _ in range(400)]
    graph = M.build_ngram_graph(texts)
    q = rng.random(400)
    lazy = M.select_on_graph(graph, 30, quality=q)
    naive = M.select_on_graph(graph, 30, quality=q, lazy=False)
    assert lazy.order == naive.order
    assert lazy.evaluations < naive.evaluations / 5


def _reference_greedy(texts, k, quality, ngram_range=(1, 3)):
    """An independent float implementation: n-gram sets, a dict of TF-IDF weights, full recomputation."""
    graph = M.build_ngram_graph(texts, ngram_range=ngram_range)
    w = graph.weights.tocsr()
    rows = []
    for u in range(len(texts)):
        span = slice(w.indptr[u], w.indptr[u + 1])
        rows.append({graph.vocabulary[j]: v for j, v in zip(w.indices[span], w.data[span])})
    q = np.asarray(quality) / max(quality)
    covered: set[str] = set()
    order: list[int] = []
    while len(order) < k:
        left = [u for u in range(len(texts)) if u not in order]
        if all(set(rows[u]) <= covered for u in left):
            covered = set()
        best = max(left, key=lambda u: (q[u] * math.fsum(v for g, v in rows[u].items() if g not in covered), -u))
        order.append(best)
        covered |= set(rows[best])
    return order


def test_selection_matches_an_independent_reference_implementation():
    rng = np.random.default_rng(5)
    for _ in range(40):
        texts = _random_pool(rng)
        quality = rng.uniform(0.1, 1.0, len(texts))  # continuous: no ties for the two to break differently
        k = int(rng.integers(1, len(texts) + 1))
        assert M.select_on_graph(M.build_ngram_graph(texts), k, quality=quality).order == _reference_greedy(
            texts, k, quality
        )


def test_coverage_is_recomputed_after_each_pick():
    # a static ranking by Q * D would take the near-duplicate "x y z" second; the set cover takes "q r" instead
    texts = ["x y z", "x y z w", "q r"]
    sel = M.graphfilter_select(texts, 2, ngram_range=(1, 1))
    assert sel.order == [1, 2]
    assert sel.gain[1] > 0
    static = np.argsort(-M.build_ngram_graph(texts, ngram_range=(1, 1)).weights.sum(axis=1).A1)
    assert list(static[:2]) != sel.order


def test_every_ngram_reported_covered_is_covered():
    from sklearn.feature_extraction.text import TfidfVectorizer

    rng = np.random.default_rng(11)
    for trial in range(20):
        texts = _random_pool(rng)
        k = int(rng.integers(1, len(texts) + 1))
        sel = M.graphfilter_select(texts, k, quality=rng.random(len(texts)), reset=bool(trial % 2))
        analyse = TfidfVectorizer(ngram_range=(1, 3), token_pattern=M.TOKEN_PATTERN).build_analyzer()
        in_selected = set().union(*(analyse(texts[u]) for u in sel.order))
        reported = set(sel.covered_ngrams)
        assert reported <= in_selected  # every reported n-gram occurs in a selected example
        assert reported == in_selected  # and nothing a selected example holds is left out
        assert sel.coverage == pytest.approx(len(reported) / len(sel.vocabulary))


def test_gain_is_the_newly_covered_tfidf_weight():
    rng = np.random.default_rng(2)
    texts = [" ".join(rng.choice(WORDS[:12], size=5)) for _ in range(25)]
    graph = M.build_ngram_graph(texts)
    sel = M.select_on_graph(graph, 10, quality=rng.random(25), reset=False)
    covered = np.zeros(graph.n_ngrams, dtype=bool)
    w = graph.weights
    for u, g in zip(sel.order, sel.gain):
        cols, vals = w.indices[w.indptr[u] : w.indptr[u + 1]], w.data[w.indptr[u] : w.indptr[u + 1]]
        assert g == pytest.approx(vals[~covered[cols]].sum(), abs=1e-6)
        covered[cols] = True


def test_reset_restarts_coverage_when_every_ngram_is_covered():
    texts = ["a b", "a b", "c", "c", "a b"]
    sel = M.graphfilter_select(texts, 4, ngram_range=(1, 1))
    assert sel.resets == [2]  # "a b" and "c" cover everything; the graph resets before the third pick
    assert sorted(sel.order[:2]) in ([0, 2], [0, 3], [1, 2], [1, 3], [2, 4], [3, 4])
    assert sel.gain[2] > 0
    off = M.graphfilter_select(texts, 4, ngram_range=(1, 1), reset=False)
    assert off.resets == [] and off.gain[2] == 0 and len(set(off.order)) == 4


def test_multiplicative_priority_is_scale_invariant_in_quality_and_additive_is_a_different_rule():
    rng = np.random.default_rng(3)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 9)))) for _ in range(60)]
    q = rng.uniform(0.05, 1.0, 60)
    graph = M.build_ngram_graph(texts)
    a = M.select_on_graph(graph, 20, quality=q)
    assert M.select_on_graph(graph, 20, quality=7.5 * q).order == a.order
    assert M.select_on_graph(graph, 20, quality=q, combine="add", lam=0.05).order != a.order


def test_quality_floor_and_ifd_filter():
    q = M.rescale_quality([0.0, np.nan, 2.0, 1.0], 4, eps=1e-3)
    assert np.allclose(q, [1e-3, 1e-3, 1.0, 0.5])
    assert np.allclose(M.rescale_quality(None, 3), 1.0)
    assert np.allclose(M.quality_from_ifd([0.5, 1.0, 1.3, np.nan, 0.9]), [0.5, 0, 0, 0, 0.9])
    assert np.allclose(M.quality_from_ifd([0.5, 1.3], max_ifd=None), [0.5, 1.3])
    # an example of quality 0 still has a positive priority: it is chosen once the others run out
    sel = M.graphfilter_select(["a", "b", "c"], 3, quality=[1.0, 0.0, 1.0])
    assert sel.order[-1] == 1 and sel.priority[-1] > 0


def test_baselines():
    assert M.quality_only_select([0.2, 0.9, 0.9, 0.1], 3) == [1, 2, 0]
    r = M.random_select(50, 10, seed=4)
    assert len(set(r)) == 10 and r == M.random_select(50, 10, seed=4)
    # two tight clusters far apart: K-center takes one point of each before a second of either
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(0, 0.01, (10, 3)), rng.normal(5, 0.01, (10, 3))])
    for seed in range(5):
        order = M.k_center_greedy(x, 3, seed=seed)
        assert {int(i >= 10) for i in order[:2]} == {0, 1}
        # each pick is the point farthest from its nearest earlier pick
        for t in range(1, 3):
            d = np.min(((x[:, None] - x[order[:t]][None]) ** 2).sum(-1), axis=1)
            d[order[:t]] = -1
            assert order[t] == int(np.argmax(d))


# ---------------------------------------------------------------------------------------------------------------
# bad input


def test_bad_inputs_are_one_line_value_errors():
    graph = M.build_ngram_graph(["a b", "c d", "e"])
    cases = [
        (lambda: M.build_ngram_graph([]), "texts is empty"),
        (lambda: M.build_ngram_graph(["", " "]), "no n-gram"),
        (lambda: M.build_ngram_graph(["a"], ngram_range=(2, 1)), "ngram_range"),
        (lambda: M.select_on_graph(graph, 0), "k must be an int in \\[1, 3\\]"),
        (lambda: M.select_on_graph(graph, 4), "k must be an int in \\[1, 3\\]"),
        (lambda: M.select_on_graph(graph, 2, quality=[1.0, 2.0]), "quality has 2 values, expected one per example"),
        (lambda: M.select_on_graph(graph, 2, quality=[1.0, -2.0, 1.0]), "quality must be >= 0"),
        (lambda: M.select_on_graph(graph, 2, combine="max"), "combine must be one of mul, add"),
        (lambda: M.select_on_graph(graph, 2, lam=-1.0), "lam must be"),
        (lambda: M.select_on_graph(graph, 2, eps=0.0), "eps must be in"),
        (lambda: M.k_center_greedy(np.zeros(5), 2), "x must be an \\(n, d\\) array"),
        (lambda: M.ifd_scores(None, None, ["a"], []), "got 1 instructions but 0 responses"),
    ]
    for fn, match in cases:
        with pytest.raises(ValueError, match=match) as err:
            fn()
        assert "\n" not in str(err.value)


def test_config_rejects_bad_values():
    from lmlab.methods.alignment.graphfilter.config import GraphFilterConfig

    for kw, match in [
        ({"k": 300}, "k must be <= pool_size"),
        ({"pool_size": 600}, "pool_size must be <= master_pool_size"),
        ({"systems": ["random", "graphfilter", "bm25"]}, "systems entries must be among"),
        ({"systems": ["graphfilter", "k_center"]}, "systems must include 'random'"),
        ({"corrupt_fraction": 1.5}, "corrupt_fraction must be in"),
        ({"quality": "perplexity"}, "quality must be one of ifd, oracle"),
        ({"timing_pool": 10}, "timing_pool must be 0"),
        ({"train_layers": 0}, "train_layers must be in"),
    ]:
        with pytest.raises(ValueError, match=match):
            GraphFilterConfig(**kw)


def test_run_rejects_more_trained_layers_than_the_model_has(tmp_path):
    from lmlab.runner import run_method

    with pytest.raises(ValueError, match="train_layers must be <= 2"):
        run_method("graphfilter", preset="smoke", write=False, show_progress=False, raise_errors=True,
                   train_layers=3, replicates=1)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# IFD and the cached-trunk SFT harness (tiny llama)


def test_ifd_is_the_conditional_over_the_alone_perplexity(tiny_llama, tiny_tokenizer):
    from lmlab.core.inference.scoring import sequence_logprob, split_pair

    instr, resp = ["What is two plus two?", "Name a colour."], ["The answer is 4.", "Blue, like the sky."]
    s = M.ifd_scores(tiny_llama, tiny_tokenizer, instr, resp)
    assert np.allclose(s.ifd, s.ppl_conditional / s.ppl_alone)
    # PPL(y) by hand: every token of the response, predicted after the template's answer marker "\n" alone
    ctx, cont = split_pair(tiny_tokenizer, "\n", resp[1])
    assert cont == split_pair(tiny_tokenizer, M.format_prompt(instr[1]), resp[1])[1]  # the conditional's tokens
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        lp = torch.log_softmax(tiny_llama(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
    assert s.ppl_alone[1] == pytest.approx(math.exp(-float(lp[len(ctx) - 1 :].mean())), rel=1e-5)
    # PPL(y | x) by hand: the response after "{instruction}\n"
    c = sequence_logprob(tiny_llama, tiny_tokenizer, M.format_prompt(instr[0]), resp[0])
    assert s.ppl_conditional[0] == pytest.approx(math.exp(-c.mean), rel=1e-5)
    alone = M.response_nll_alone(tiny_llama, tiny_tokenizer, ["x", ""])
    assert np.isfinite(alone[0]) and np.isnan(alone[1])  # one token is scored (from the marker); empty: undefined


class _ContextFreeLM(torch.nn.Module):
    """log p(token | anything) = one fixed unigram distribution: the instruction cannot help, so IFD must be 1."""

    def __init__(self, vocab: int = 260) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.unigram = torch.nn.Parameter(4.0 * torch.randn(vocab, generator=g))

    def forward(self, input_ids, attention_mask=None, position_ids=None, logits_to_keep=0, **kw):  # noqa: ANN001
        b, t = input_ids.shape
        keep = logits_to_keep or t
        return type("Out", (), {"logits": self.unigram.expand(b, keep, -1)})()


def test_both_perplexities_average_the_same_response_tokens(tiny_tokenizer):
    # Under a context-free LM, PPL(y | x) = PPL(y) exactly when both average the same tokens of y. The old
    # unconditional score read encode(y) on its own: without a BOS its first token was never predicted, so the two
    # averaged different token sets (N vs N-1) and IFD moved with the first token's log-prob alone (the review's
    # artefact: clean tagged items ~3, untagged corruptions 0.63).
    lm = _ContextFreeLM()
    instr = ["What is 12 plus 30?", "Capital of Peru?", "Reverse cat.", "Hi"]
    resp = ["SUM=(42)", "ANSWER[Lima]", "tac", "ab"]
    s = M.ifd_scores(lm, tiny_tokenizer, instr, resp)
    assert np.allclose(s.ifd, 1.0, rtol=1e-5), s.ifd
    # and through the experiment's route: conditional NLL over the split_pair continuation, alone from the marker
    from lmlab.core.inference.scoring import sequence_logprob

    nll_cond = [-sequence_logprob(lm, tiny_tokenizer, M.format_prompt(x), y).mean for x, y in zip(instr, resp)]
    assert np.allclose(M.ifd_from_nll(nll_cond, M.response_nll_alone(lm, tiny_tokenizer, resp)), 1.0, rtol=1e-5)
    with pytest.raises(ValueError, match="template must contain"):
        M.answer_marker("no slot")


def test_cached_trunk_scores_equal_the_full_model_and_ifd_path(tiny_llama, tiny_tokenizer):
    from lmlab.core.training.partial import FrozenTrunk
    from lmlab.core.training.preference import seq_logprobs
    from lmlab.methods.alignment.graphfilter import experiment as E

    pairs = [("What is 12 plus 30?", "SUM=(42)"), ("Reverse the word cat.", "REV|tac|"),
             ("What is 11 plus 31?", "SUM=(42)"), ("Capital of Peru?", "ANSWER[Lima]"), ("Hi", "ab")]  # fmt: skip
    seqs = E._encode_pairs(tiny_tokenizer, pairs)
    trunk = FrozenTrunk(tiny_llama, 1)
    cache = E.SeqCache(trunk, seqs)
    assert len(cache.groups) < len(pairs)  # equal lengths share a forward
    got = E.sequence_scores(trunk.reference, cache, [4, 0, 2, 1, 3])
    with torch.no_grad():
        ref = seq_logprobs(tiny_llama, tiny_tokenizer, [M.format_prompt(p) for p, _ in pairs], [r for _, r in pairs])
    assert np.allclose([got[i] for i in range(5)], ref.sum.numpy(), atol=1e-4)
    # the experiment's IFD route (cache + reference) equals the public ifd_scores
    nll = np.array([-got[i] / cache.n_tokens[i] for i in range(5)])
    alone = M.response_nll_alone(tiny_llama, tiny_tokenizer, [r for _, r in pairs])
    api = M.ifd_scores(tiny_llama, tiny_tokenizer, [p for p, _ in pairs], [r for _, r in pairs])
    assert np.allclose(M.ifd_from_nll(nll, alone), api.ifd, rtol=1e-4)


def test_sft_on_the_cached_trunk_lowers_the_loss_and_changes_only_the_top(tiny_llama, tiny_tokenizer):
    from types import SimpleNamespace

    from lmlab.core.training.partial import FrozenTrunk
    from lmlab.methods.alignment.graphfilter import experiment as E

    pairs = [(f"What is {a} plus {b}?", f"SUM=({a + b})") for a, b in [(1, 2), (3, 4), (10, 5), (7, 7), (2, 9)]]
    trunk = FrozenTrunk(tiny_llama, 1)
    cache = E.SeqCache(trunk, E._encode_pairs(tiny_tokenizer, pairs))
    before = {n: p.detach().clone() for n, p in tiny_llama.named_parameters()}
    cfg = SimpleNamespace(lr=3e-3, epochs=8, train_batch=2)
    policy, losses = E.sft_top_k(trunk, cache, range(5), cfg, seed=0)
    assert np.mean(losses[-3:]) < np.mean(losses[:3])
    assert all(torch.equal(p, before[n]) for n, p in tiny_llama.named_parameters())  # the model is untouched
    trained = E.sequence_scores(policy, cache, range(5))
    base = E.sequence_scores(trunk.reference, cache, range(5))
    assert sum(trained.values()) > sum(base.values())


# ---------------------------------------------------------------------------------------------------------------
# the selection-time claim: end to end (featurisation + graph + loop), with a margin; loops alone are reported


class _RecordingCtx:
    def __init__(self):
        self.values, self.tables, self.flags = {}, {}, {}

    def record(self, system, metric, values, **kw):
        self.values[(system, metric)] = list(values)

    def record_value(self, system, metric, value, **kw):
        self.values[(system, metric)] = [value]

    def flag(self, key, value):
        self.flags[key] = value

    def table(self, name, rows):
        self.tables[name] = rows


def test_the_gated_time_claim_is_end_to_end_and_a_tie_does_not_hold():
    from lmlab.methods.alignment.graphfilter import experiment as E
    from lmlab.methods.alignment.graphfilter.config import GraphFilterConfig
    from lmlab.results import evaluate_claim

    cfg = GraphFilterConfig()  # IFD quality, K-center among the systems
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, size=8)) for _ in range(120)]
    q, emb = rng.random(120), rng.standard_normal((120, 16))
    (claim,) = [c for c in E.end_to_end_claims(cfg, cfg.systems, 120) if c.gate]
    assert (claim.metric, claim.method, claim.baseline, claim.direction) == ("end_to_end_s", "graphfilter", "k_center",
                                                                              "<")  # fmt: skip
    # the featurisation decides it: an IFD pass dearer than the embeddings fails the claim, a cheaper one passes it
    for scoring, expect in [({"ifd": 5.0, "embed": 0.0}, "not_supported"), ({"ifd": 0.0, "embed": 5.0}, "supported")]:
        t = E.end_to_end_times(texts, q, emb, cfg.systems, cfg, 20, scoring, repeats=6)
        assert set(t) == {*cfg.systems, "graphfilter_naive"}
        for system, parts in t.items():
            assert len(parts["total_s"]) == 6
            assert np.allclose(parts["total_s"], np.add(parts["scoring_s"], parts["build_s"]) + parts["loop_s"])
            assert (min(parts["build_s"]) > 0) == (system in E.GRAPH_SYSTEMS)
        assert t["graphfilter"]["scoring_s"] == [scoring["ifd"]] * 6 == t["quality_only"]["scoring_s"]
        assert t["k_center"]["scoring_s"] == [scoring["embed"]] * 6 and t["random"]["scoring_s"] == [0.0] * 6
        assert evaluate_claim(claim, t["graphfilter"]["total_s"], t["k_center"]["total_s"]).status == expect
    # a 10 ms edge (the README's quiet loop-only tie, 0.07 vs 0.08 s) is inside the margin: it does not hold
    tie = evaluate_claim(claim, [0.07, 0.071, 0.069, 0.07, 0.072, 0.07], [0.08, 0.081, 0.079, 0.08, 0.08, 0.082])
    assert tie.status == "not_supported"
    # with the oracle as Q the quality costs nothing: not the paper's pipeline, reported only
    oracle = GraphFilterConfig(quality="oracle")
    assert [c.gate for c in E.end_to_end_claims(oracle, oracle.systems, 120)] == [False]
    assert E.end_to_end_claims(cfg, ["graphfilter", "random"], 120) == []


def test_loop_only_timing_is_reported_not_gated_and_end_to_end_is_recorded_for_every_selector():
    from lmlab.methods.alignment.graphfilter import experiment as E
    from lmlab.methods.alignment.graphfilter.config import GraphFilterConfig

    cfg = GraphFilterConfig(timing_pool=100, timing_repeats=2)
    ctx = _RecordingCtx()
    claims = E._timing(cfg, ctx)
    assert claims and not any(c.gate for c in claims)  # loop-only: info rows
    assert len(ctx.values[("graphfilter", "loop_time_s")]) == 2
    pool = [E.Item(str(i), "arithmetic", f"What is {i} plus {i + 1}?", str(2 * i + 1), f"SUM=({2 * i + 1})")
            for i in range(40)]  # fmt: skip
    rng = np.random.default_rng(1)
    claims = E._end_to_end(cfg, ctx, pool, rng.random(40), rng.standard_normal((40, 8)), {"ifd": 2.0, "embed": 0.5},
                           cfg.systems)  # fmt: skip
    assert [c.gate for c in claims] == [True]
    for system in (*cfg.systems, "graphfilter_naive"):
        assert len(ctx.values[(system, "end_to_end_s")]) == 2
    rows = {r["system"]: r for r in ctx.tables["selection_cost"]}
    assert rows["graphfilter"]["median_total_s"] >= 2.0 and rows["k_center"]["median_scoring_s"] == 0.5
    assert rows["diversity_only"]["median_scoring_s"] == 0.0 and rows["diversity_only"]["median_build_s"] > 0


def test_smoke_run_records_end_to_end_time_for_every_selector(tmp_path):
    from lmlab.runner import run_method

    result = run_method("graphfilter", preset="smoke", write=False, show_progress=False, raise_errors=True,
                        threads=1, timing_repeats=2)  # fmt: skip
    e2e = {m.system for m in result.metrics if m.metric == "end_to_end_s"}
    assert e2e == {*result.config["systems"], "graphfilter_naive"}
    (claim,) = [c for c in result.claims if c.metric == "end_to_end_s"]
    assert claim.gate and claim.baseline == "k_center" and claim.min_effect == result.config["time_margin_s"]
    assert {r["system"] for r in result.tables["selection_cost"]} == e2e
    assert np.isfinite(result.flags["ifd"]["mean_clean"])


# ---------------------------------------------------------------------------------------------------------------
# the reproduction's pool


class _Ctx:
    def __init__(self, limit=None):
        self.limit = limit

    def data(self, suite, n, *, split="test", **kw):
        from lmlab import data

        return data.load(suite, n if self.limit is None else min(n, self.limit), seed=0, split=split, **kw)


def test_pool_is_imbalanced_and_corrupted_and_eval_is_balanced():
    from types import SimpleNamespace

    from lmlab.methods.alignment.graphfilter import experiment as E

    cfg = SimpleNamespace(
        master_pool_size=200, majority_share=0.5, corrupt_fraction=0.2, seed=0, eval_per_family=3, eval_split="test"
    )
    banks = {f.name: E._value_bank(f, 0) for f in E.FAMILIES}
    pool = E.build_pool(_Ctx(), cfg, banks)
    assert len(pool) == 200
    fams = [it.family for it in pool]
    assert fams.count(E.MAJORITY) == 100 and min(fams.count(f.name) for f in E.FAMILIES) >= 4
    bad = [it for it in pool if it.corruption]
    assert 0.15 <= len(bad) / len(pool) <= 0.25
    for it in pool:
        fam = next(f for f in E.FAMILIES if f.name == it.family)
        assert (it.response == fam.fmt(it.value)) == (it.corruption is None)
    evals = E.build_eval(_Ctx(), cfg, banks)
    assert len(evals) == 3 * len(E.FAMILIES)
    for it in evals:
        fam = next(f for f in E.FAMILIES if f.name == it.family)
        assert len(set(it.options)) == 5 and it.options[it.gold] == fam.fmt(it.value)
        assert it.value in it.options  # the untagged distractor
    sub = E.subpool(pool, 100, seed=1)
    assert len(set(sub)) == 100
    assert sum(pool[i].family == E.MAJORITY for i in sub) == 50
    assert sub != sorted(sub)  # a shuffled order: index ties do not follow the family order
