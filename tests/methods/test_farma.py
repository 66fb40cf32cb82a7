"""Invariants of FaRMA (V-channel RM, one call per token) and its ARGS / PARGS / Best-of-N baselines (tiny models)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LogitsProcessorList

from lmlab.core.inference.generation import decode
from lmlab.methods.decoding.farma import (
    ARGSLogitsProcessor,
    RewardGuidedLogitsProcessor,
    ScalarRM,
    VChannelRM,
    best_of_n,
    body_hidden_states,
    bt_accuracy,
    generate_batch,
    max_constraint_loss,
    reward_inputs,
    score_responses,
    train_bt,
    train_farma_rm,
    train_max,
)

PROMPTS = ["The quick brown fox", "Once upon a time,", "Hi"]


def _ids(tok, texts):
    return [tok(t)["input_ids"] for t in texts]


def _vrm(model, seed=1, **kw):
    """A V-channel RM whose low-rank delta and shared row are non-zero (so f differs from the LM's logits)."""
    rm = VChannelRM.from_causal_lm(model, rank=4, **kw)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        rm.lora_p.copy_(torch.randn(rm.lora_p.shape, generator=g))
        rm.shared.copy_(torch.randn(rm.shared.shape, generator=g))
    return rm


def _srm(model, seed=2):
    rm = ScalarRM.from_causal_lm(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        rm.head.weight.copy_(torch.randn(rm.head.weight.shape, generator=g))
    return rm


class VHeadAsScalar(torch.nn.Module):
    """The sequence reward R(y) = f(y_<T)[y_T] of a V-channel RM behind the scalar-RM interface (no cache)."""

    def __init__(self, vrm):
        super().__init__()
        self.vrm = vrm

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, **kw):
        assert cache is None
        logits = self.vrm(input_ids, attention_mask=attention_mask, position_ids=position_ids).logits  # (B, T, V)
        r = logits[:, -2].gather(-1, input_ids[:, -1:])  # f(y_<T)[y_T]
        return type("Out", (), {"logits": r})()


def test_single_call_scores_equal_the_per_candidate_rewards_they_replace(tiny_llama, tiny_tokenizer):
    rm = _vrm(tiny_llama)
    prefix = tiny_tokenizer("Once upon a")["input_ids"]
    with torch.no_grad():
        one_call = rm(torch.tensor([prefix])).logits[0, -1]  # f(s)[a] for every a, one forward
    candidates = torch.topk(one_call, 12).indices.tolist() + [0, 7, 259]
    seqs = torch.tensor([prefix + [a] for a in candidates])
    per_candidate = rm.score(seqs)  # R(s + a), one forward per candidate sequence
    assert torch.allclose(one_call[candidates], per_candidate, atol=1e-4)


def test_v_head_sequence_reward_is_the_last_tokens_logit(tiny_llama, tiny_tokenizer):
    rm = _vrm(tiny_llama)
    y = tiny_tokenizer("A sunny day at the beach.")["input_ids"]
    T = len(y)
    with torch.no_grad():
        logits = rm(torch.tensor([y])).logits[0]  # (T, V); row t reads y_1..y_{t+1}
    expected = logits[T - 2, y[T - 1]]  # 1-based: logits[T-1, y_T], the logit of y_T given y_<T
    assert torch.allclose(rm.score(torch.tensor([y])), expected[None], atol=1e-5)
    # the same number from cached body features, as the trainer sees it
    feats = body_hidden_states(rm, [y])
    assert torch.allclose(rm.sequence_reward(reward_inputs(feats, [y])), expected[None], atol=1e-4)


def test_padded_batches_score_like_single_sequences(tiny_llama, tiny_tokenizer):
    vrm, srm = _vrm(tiny_llama), _srm(tiny_llama)
    seqs = _ids(tiny_tokenizer, PROMPTS)
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
    for rm in (vrm, srm):
        alone = torch.cat([rm.score(torch.tensor([s])) for s in seqs])
        assert torch.allclose(rm.score(ids, mask), alone, atol=1e-4)


def test_max_loss_is_zero_when_logits_are_constant_along_the_optimal_path():
    c = torch.tensor([0.3, 2.0, -1.0, 0.5])  # the same logit vector at every prefix
    steps = 5
    best = int(c.argmax())
    taken = c[best].repeat(steps)  # f(y_<t)[y_t] along the path that always takes the argmax
    next_logits = c.repeat(steps, 1)  # f(y_<=t)
    assert float(max_constraint_loss(taken, next_logits)) == 0.0
    assert float(max_constraint_loss(c[0].repeat(steps), next_logits)) > 0  # a sub-optimal path is penalised


def test_max_loss_is_zero_on_a_v_head_with_constant_logits(tiny_llama, tiny_tokenizer):
    rm = VChannelRM.from_causal_lm(tiny_llama, rank=0, shared_row=True)
    with torch.no_grad():
        rm.weight.zero_()  # f(s) = 0 for every s: constant along every path
    y = tiny_tokenizer("Hello there, world")["input_ids"]
    partial = reward_inputs(body_hidden_states(rm, [y] * 4), [y] * 4, [3, 5, 7, 9])
    loss = max_constraint_loss(rm.gather_from_hidden(partial.prev_hidden, partial.last_token),
                               rm.logits_from_hidden(partial.last_hidden))  # fmt: skip
    assert float(loss.detach()) == 0.0


@pytest.mark.parametrize("mode", ["lowrank", "full"])
def test_training_moves_the_heads_and_nothing_of_the_body(tiny_llama, tiny_tokenizer, mode):
    lm = copy.deepcopy(tiny_llama)  # tied embeddings: a trained tied head would move the input embeddings
    assert lm.get_output_embeddings().weight.data_ptr() == lm.get_input_embeddings().weight.data_ptr()
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    vrm = VChannelRM.from_causal_lm(lm, mode=mode, rank=4 if mode == "lowrank" else 0)
    srm = ScalarRM.from_causal_lm(lm)
    heads_before = [{k: v.clone() for k, v in m.named_parameters() if not k.startswith("body.")} for m in (vrm, srm)]
    seqs = _ids(tiny_tokenizer, ["a good day!", "a bad day.", "so nice", "so sad", "great fun", "awful pain"])
    feats = body_hidden_states(vrm, seqs)
    chosen, rejected = reward_inputs(feats[0::2], seqs[0::2]), reward_inputs(feats[1::2], seqs[1::2])
    partial = reward_inputs(feats[0::2] * 3, seqs[0::2] * 3, [3, 4, 5] * 3)
    log = train_farma_rm(vrm, chosen, rejected, partial, iterations=2, lr=1e-2, batch_size=2)
    assert [p for p, _, _ in log.phases] == ["bt", "max", "bt"] and log.steps > 0
    train_bt(srm, chosen, rejected, epochs=3, lr=1e-2, batch_size=2)
    for model, old in zip((vrm, srm), heads_before):
        for name, p in model.named_parameters():
            if name in old and p.requires_grad:
                assert not torch.equal(p, old[name]), f"{name} did not change"
    for name, v in lm.state_dict().items():  # body, input embeddings and the LM head: untouched
        assert torch.equal(v, before[name]), name


def test_bt_training_separates_pairs_and_accuracy_counts(tiny_llama, tiny_tokenizer):
    srm = ScalarRM.from_causal_lm(tiny_llama)
    seqs = _ids(tiny_tokenizer, ["good good", "bad bad", "good day", "bad day", "good fun", "bad fun"])
    feats = body_hidden_states(srm, seqs)
    chosen, rejected = reward_inputs(feats[0::2], seqs[0::2]), reward_inputs(feats[1::2], seqs[1::2])
    assert bt_accuracy(srm, chosen, rejected) == [0.5, 0.5, 0.5]  # untrained head: r = 0, ties
    losses = train_bt(srm, chosen, rejected, epochs=30, lr=5e-2, batch_size=3)
    assert losses[-1] < losses[0]
    assert bt_accuracy(srm, chosen, rejected) == [1.0, 1.0, 1.0]


def test_max_training_lowers_the_max_loss(tiny_llama, tiny_tokenizer):
    rm = VChannelRM.from_causal_lm(tiny_llama, rank=4)
    y = tiny_tokenizer("The cat sat on the mat and slept")["input_ids"]
    partial = reward_inputs(body_hidden_states(rm, [y] * 8), [y] * 8, list(range(3, 11)))
    losses = train_max(rm, partial, epochs=40, lr=1e-2, batch_size=8)
    assert losses[-1] < 0.5 * losses[0]


def test_w0_processor_is_top_k_sampling_inside_model_generate(tiny_llama, tiny_tokenizer):
    rm = _vrm(tiny_llama)
    ids = torch.tensor([tiny_tokenizer("Once upon a time")["input_ids"]])
    kw = dict(max_new_tokens=12, do_sample=True, pad_token_id=0, eos_token_id=None)
    torch.manual_seed(3)
    guided = tiny_llama.generate(ids, logits_processor=LogitsProcessorList([RewardGuidedLogitsProcessor(rm, 0.0, 5)]),
                                 top_k=None, **kw)  # fmt: skip
    torch.manual_seed(3)
    plain = tiny_llama.generate(ids, top_k=5, **kw)
    assert guided.tolist() == plain.tolist()


def test_processor_in_model_generate_follows_the_combined_top_k(tiny_llama, tiny_tokenizer):
    rm = _vrm(tiny_llama)
    ids = torch.tensor([tiny_tokenizer("Once upon a time")["input_ids"]])
    proc = RewardGuidedLogitsProcessor(rm, 1.0, 3)
    out = tiny_llama.generate(ids, logits_processor=LogitsProcessorList([proc]), do_sample=False, max_new_tokens=6,
                              pad_token_id=0, eos_token_id=None)  # fmt: skip
    seq = ids[0].tolist()
    for tok in out[0, ids.shape[1] :].tolist():  # greedy (mode 1) = argmax of l_LM + w f over the whole vocab
        with torch.no_grad():
            lm = tiny_llama(torch.tensor([seq])).logits[0, -1]
            f = rm(torch.tensor([seq])).logits[0, -1]
        assert tok == int((lm + f).argmax())
        seq.append(tok)
    assert proc.rm_calls == 6  # one RM call per generated token


def test_w0_processor_is_top_k_sampling_in_lmlab_decode(tiny_llama, tiny_tokenizer):
    rm = _vrm(tiny_llama)
    a = decode(tiny_llama, tiny_tokenizer, PROMPTS[0], max_new_tokens=10, do_sample=True, seed=4,
               logits_processors=[RewardGuidedLogitsProcessor(rm, 0.0, 6)])  # fmt: skip
    b = decode(tiny_llama, tiny_tokenizer, PROMPTS[0], max_new_tokens=10, do_sample=True, seed=4, top_k=6)
    assert a.token_ids == b.token_ids


def test_w0_in_generate_batch_is_top_k_sampling(tiny_llama, tiny_tokenizer):
    rm, prompts = _vrm(tiny_llama), _ids(tiny_tokenizer, PROMPTS)
    guided = generate_batch(tiny_llama, tiny_tokenizer, prompts, max_new_tokens=8, seed=5,
                            logits_processors=[RewardGuidedLogitsProcessor(rm, 0.0, 4, pad_token_id=0)])  # fmt: skip
    plain = generate_batch(tiny_llama, tiny_tokenizer, prompts, max_new_tokens=8, seed=5, top_k=4)
    assert [g.token_ids for g in guided] == [p.token_ids for p in plain]
    assert all(g.rm_calls == g.n_tokens for g in guided)  # FaRMA: 1 RM call per generated token


def test_generate_batch_matches_one_by_one_greedy_decoding(tiny_llama, tiny_tokenizer):
    prompts = _ids(tiny_tokenizer, PROMPTS)
    outs = generate_batch(tiny_llama, tiny_tokenizer, prompts, max_new_tokens=10, do_sample=False)
    for p, o in zip(prompts, outs):
        ref = decode(tiny_llama, tiny_tokenizer, p, max_new_tokens=10)
        assert o.token_ids == ref.token_ids
        assert o.lm_calls == ref.n_forward_calls


def test_cached_rm_scores_equal_recomputed_ones_while_rows_finish(tiny_llama, tiny_tokenizer):
    """The RM caches survive left padding and rows leaving the batch (EOS), for FaRMA and ARGS alike."""
    vrm, srm = _vrm(tiny_llama), _srm(tiny_llama)
    prompts = _ids(tiny_tokenizer, PROMPTS * 2)
    eos = [101, 102, 103, 104, 105]  # frequent "EOS" tokens, so rows finish at different steps
    kw = dict(max_new_tokens=12, seed=6, eos_token_id=eos)
    for make in (
        lambda c: RewardGuidedLogitsProcessor(vrm, 1.0, 5, pad_token_id=0, use_cache=c),
        lambda c: ARGSLogitsProcessor(srm, 1.0, 5, pad_token_id=0, use_cache=c),
        lambda c: ARGSLogitsProcessor(srm, 1.0, 5, pad_token_id=0, use_cache=c, batch_candidates=False),
    ):
        cached = generate_batch(tiny_llama, tiny_tokenizer, prompts, logits_processors=[make(True)], **kw)
        fresh = generate_batch(tiny_llama, tiny_tokenizer, prompts, logits_processors=[make(False)], **kw)
        assert [g.token_ids for g in cached] == [g.token_ids for g in fresh]
        assert any(g.stop_reason == "eos" for g in cached) and any(g.n_tokens > 3 for g in cached)


def test_args_candidate_rewards_are_per_candidate_sequence_rewards(tiny_llama, tiny_tokenizer):
    srm = _srm(tiny_llama)
    prompts = _ids(tiny_tokenizer, PROMPTS)
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])  # left padded
    cands = torch.tensor([[5, 60, 200], [7, 8, 9], [100, 101, 102]])
    for batched, rows in ((True, 160), (True, 4), (False, 160)):  # candidate_rows=4: one row per forward
        proc = ARGSLogitsProcessor(srm, 1.0, 3, pad_token_id=0, batch_candidates=batched, candidate_rows=rows)
        got = proc.candidate_rewards(ids, cands)
        want = torch.tensor([[float(srm.score(torch.tensor([p + [a]]))) for a in row] for p, row in
                             zip(prompts, cands.tolist())])  # fmt: skip
        assert torch.allclose(got, want, atol=1e-4)
        assert proc.row_tokens.tolist() == [len(p) + 3 for p in prompts]


def test_farma_over_the_whole_vocab_is_args_with_its_own_sequence_reward(tiny_llama, tiny_tokenizer):
    """FaRMA's one call equals ARGS scoring every token separately with R(s + a) = f(s)[a]."""
    vrm = _vrm(tiny_llama)
    vocab = tiny_llama.config.vocab_size
    prompts = _ids(tiny_tokenizer, PROMPTS)
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    with torch.no_grad():
        scores = tiny_llama(ids, attention_mask=(ids != 0).long()).logits[:, -1]
    farma = RewardGuidedLogitsProcessor(vrm, 1.5, vocab, pad_token_id=0)(ids, scores)
    args = ARGSLogitsProcessor(VHeadAsScalar(vrm), 1.5, vocab, pad_token_id=0, use_cache=False)(ids, scores)
    assert torch.allclose(farma, args, atol=1e-3)
    g1 = generate_batch(
        tiny_llama,
        tiny_tokenizer,
        prompts,
        max_new_tokens=5,
        seed=8,
        logits_processors=[RewardGuidedLogitsProcessor(vrm, 1.0, vocab, pad_token_id=0)],
    )
    g2 = generate_batch(tiny_llama, tiny_tokenizer, prompts, max_new_tokens=5, seed=8,
                        logits_processors=[ARGSLogitsProcessor(VHeadAsScalar(vrm), 1.0, vocab, pad_token_id=0,
                                                               use_cache=False)])  # fmt: skip
    assert [g.token_ids for g in g1] == [g.token_ids for g in g2]
    assert all(g.rm_calls == g.n_tokens for g in g1) and all(g.rm_calls == vocab * g.n_tokens for g in g2)


def test_args_keeps_only_the_lm_top_k(tiny_llama, tiny_tokenizer):
    srm = _srm(tiny_llama)
    ids = torch.tensor([tiny_tokenizer("Hello")["input_ids"]])
    scores = tiny_llama(ids).logits[:, -1].detach()
    out = ARGSLogitsProcessor(srm, 2.0, 4)(ids, scores)
    assert set(torch.isfinite(out[0]).nonzero().flatten().tolist()) == set(torch.topk(scores[0], 4).indices.tolist())


def test_best_of_n_returns_the_best_scored_sample(tiny_llama, tiny_tokenizer):
    srm = _srm(tiny_llama)
    prompts = _ids(tiny_tokenizer, PROMPTS[:2])
    outs = best_of_n(tiny_llama, tiny_tokenizer, srm, prompts, 3, max_new_tokens=6, top_k=10, seed=9)
    for o in outs:
        assert o.rm_calls == 3
        assert abs(float(srm.score(torch.tensor([o.prompt_ids + o.token_ids])).detach()) - o.reward) < 1e-4


def test_works_on_gemma_with_sliding_window(tiny_gemma, tiny_tokenizer):
    vrm, srm = _vrm(tiny_gemma), _srm(tiny_gemma)
    prompts = _ids(tiny_tokenizer, ["A prompt that is long enough to pass the sliding window", "Short"])
    for proc in (RewardGuidedLogitsProcessor(vrm, 1.0, 5, pad_token_id=0),
                 ARGSLogitsProcessor(srm, 1.0, 5, pad_token_id=0, batch_candidates=False)):  # fmt: skip
        outs = generate_batch(tiny_gemma, tiny_tokenizer, prompts, max_new_tokens=6, seed=1, logits_processors=[proc])
        assert all(o.n_tokens == 6 for o in outs)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda m: RewardGuidedLogitsProcessor(VChannelRM.from_causal_lm(m), 1.0, 0), "k"),
        (lambda m: ARGSLogitsProcessor(ScalarRM.from_causal_lm(m), float("nan"), 3), "w"),
        (lambda m: VChannelRM.from_causal_lm(m, mode="tied"), "mode"),
        (lambda m: VChannelRM.from_causal_lm(m, rank=-1), "rank"),
    ],
)
def test_bad_arguments(tiny_llama, make, message):
    with pytest.raises(ValueError, match=message):
        make(tiny_llama)


def test_hidden_states_captured_while_sampling_equal_a_fresh_body_pass(tiny_llama, tiny_tokenizer):
    prompts = _ids(tiny_tokenizer, PROMPTS + PROMPTS[:2])  # repeated prompts are prefilled once
    first = generate_batch(tiny_llama, tiny_tokenizer, prompts, max_new_tokens=7, seed=2, eos_token_id=[])
    eos = [first[0].token_ids[2]]  # makes at least the first row stop early
    outs = generate_batch(tiny_llama, tiny_tokenizer, prompts, max_new_tokens=7, seed=2, eos_token_id=eos,
                          return_hidden=True)  # fmt: skip
    seqs = [o.prompt_ids + o.token_ids for o in outs]
    fresh = body_hidden_states(ScalarRM.from_causal_lm(tiny_llama), seqs)
    plain = generate_batch(tiny_llama, tiny_tokenizer, prompts, max_new_tokens=7, seed=2, eos_token_id=eos)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]  # capturing changes nothing sampled
    assert {o.stop_reason for o in outs} == {"eos", "max_new_tokens"}
    for o, f in zip(outs, fresh):
        assert o.hidden.shape == f.shape
        assert torch.allclose(o.hidden, f, atol=1e-4)


def test_shared_prompt_scoring_equals_full_sequence_scores(tiny_llama, tiny_tokenizer):
    prompts = _ids(tiny_tokenizer, [PROMPTS[0], PROMPTS[0], PROMPTS[2], PROMPTS[1]])
    responses = [[70, 71, 72], [80], [90, 91], [100, 101, 102, 103]]
    for rm in (_vrm(tiny_llama), _srm(tiny_llama)):
        got = score_responses(rm, prompts, responses)
        want = torch.cat([rm.score(torch.tensor([p + r])).detach() for p, r in zip(prompts, responses)])
        assert torch.allclose(got, want, atol=1e-4)


class _OtherVocabRM(torch.nn.Module):
    """A causal-LM-shaped reward model over a different vocabulary size (as a sibling model with extra tokens)."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kw):
        from transformers.modeling_outputs import CausalLMOutputWithPast

        return CausalLMOutputWithPast(logits=torch.zeros(input_ids.shape[0], input_ids.shape[1], self.vocab))


def test_farma_refuses_an_rm_with_another_vocabulary(tiny_llama, tiny_tokenizer):
    """The old processor silently truncated to the smaller vocabulary; now a mismatch names both sizes."""
    from lmlab.methods.decoding.farma import check_shared_vocab

    ids = torch.tensor([tiny_tokenizer("Once upon a time")["input_ids"]])
    scores = tiny_llama(ids).logits[:, -1]
    v = scores.shape[-1]
    proc = RewardGuidedLogitsProcessor(_OtherVocabRM(v - 4), 1.0, 3, use_cache=False)
    with pytest.raises(ValueError, match=f"LM vocab size {v} and RM vocab size {v - 4}"):
        proc(ids, scores)
    with pytest.raises(ValueError, match="share one vocabulary"):
        check_shared_vocab(100, 101)
    check_shared_vocab(v, v)
    RewardGuidedLogitsProcessor(_OtherVocabRM(v), 1.0, 3, use_cache=False)(ids, scores)  # same size: fine


def test_one_pad_id_rule_for_generate_batch_and_its_processors(tiny_llama, tiny_tokenizer):
    """generate_batch left-pads with `pad_token_id(model, tokenizer)` and refuses a processor that reads another pad
    id (which would count the padding as real tokens); without a tokenizer pad token the rule is the smallest EOS."""
    from lmlab.methods.decoding.farma import pad_token_id

    assert pad_token_id(tiny_llama, tiny_tokenizer) == tiny_tokenizer.pad_token_id == 0
    no_pad = copy.deepcopy(tiny_tokenizer)
    no_pad.pad_token = None
    assert no_pad.pad_token_id is None
    eos = tiny_llama.generation_config.eos_token_id
    assert pad_token_id(tiny_llama, no_pad) == (min(eos) if isinstance(eos, list) else eos) != 0
    prompts = _ids(tiny_tokenizer, PROMPTS)  # different lengths: the batch is left-padded
    rm = _vrm(tiny_llama)
    with pytest.raises(ValueError, match="pad_token_id"):
        generate_batch(tiny_llama, no_pad, prompts, max_new_tokens=3,
                       logits_processors=[RewardGuidedLogitsProcessor(rm, 1.0, 4, pad_token_id=0)])  # fmt: skip
    pad = pad_token_id(tiny_llama, no_pad)

    def farma(rows):
        proc = RewardGuidedLogitsProcessor(rm, 1.0, 4, pad_token_id=pad)
        return generate_batch(tiny_llama, no_pad, rows, max_new_tokens=4, do_sample=False, logits_processors=[proc])

    for p, g in zip(prompts, farma(prompts)):  # the agreed pad id makes a padded row score like the row alone
        assert g.token_ids == farma([p])[0].token_ids


def test_rm_call_counts_are_mechanism_checks_and_never_gate():
    """1 vs k RM calls per token holds by construction: reported as a mechanism check; the gated checks are all on
    the gold reward, and none holds when FaRMA is replaced by its baseline."""
    from lmlab.methods.decoding.farma.config import FarmaConfig
    from lmlab.methods.decoding.farma.experiment import build_claims
    from lmlab.results import evaluate_claim

    claims = build_claims(FarmaConfig())
    calls = [c for c in claims if c.metric == "rm_calls_per_token"]
    assert len(calls) == 2 and all(c.mechanism and not c.gate for c in calls)
    gated = [c for c in claims if c.gate]
    assert gated and {c.metric for c in gated} == {"gold"}
    rng = torch.Generator().manual_seed(0)
    base = torch.randn(40, generator=rng).tolist()
    topics = [i // 2 for i in range(40)]  # prompts x 2 seeds
    nulls = [evaluate_claim(c, base, base, clusters=topics).status for c in gated]
    assert "supported" not in [s for c, s in zip(gated, nulls) if c.min_effect >= 0]


def test_prompts_x_seeds_are_clustered_by_prompt(tmp_path):
    """Each held-out prompt is decoded with several seeds: the gold values of one prompt are one cluster, so n counts
    prompts (the old run counted prompt x seed rows as independent)."""
    from lmlab.runner import run_method

    result = run_method("farma", preset="smoke", model="tiny-llama", write=False, show_progress=False,
                        raise_errors=True, threads=1, eval_seeds=2)  # fmt: skip
    prompts = result.meta_info["data"]["farma_topics/eval"]["n"]
    gold = result.metric("farma", "gold")
    head = next(c for c in result.claims if c.metric == "gold" and c.baseline == "top_k" and c.method == "farma")
    assert gold.n == head.n == prompts and head.n_values == 2 * prompts
