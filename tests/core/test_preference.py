"""Preference losses against TRL 1.16 and their closed forms; response log-probs against a manual forward.

TRL functions tested against (trl 1.16.0, under .venv/lib/python3.11/site-packages/trl):
- ``DPOTrainer._compute_loss`` (trainer/dpo_trainer.py:1285, ``loss_type="sigmoid"`` at :1388), called on a
  stand-in trainer and model that return fixed per-token log-probs (``precompute_ref_logps=True``);
- ``CPOTrainer.cpo_loss`` (experimental/cpo/cpo_trainer.py:678; ``"simpo"`` at :715, ``"sigmoid"`` with label
  smoothing at :724);
- ``RewardTrainer.compute_loss`` (trainer/reward_trainer.py:778, the loss at :790);
- ``CPOTrainer.build_tokenized_answer`` (experimental/cpo/cpo_trainer.py:427) and ``DPOTrainer._prepare_dataset``
  (trainer/dpo_trainer.py:1036, boundary by ``common_prefix_length``) for the prompt/response split.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from lmlab.core.inference.tiny import make_byte_tokenizer, make_tiny_llama, tiny_config
from lmlab.core.training.preference import (
    bradley_terry_loss,
    build_pair_batch,
    build_response_batch,
    dpo_loss,
    implicit_prm_ce_loss,
    implicit_reward,
    implicit_step_rewards,
    pair_logps,
    ranking_loss,
    seq_logprobs,
    simpo_loss,
    step_token_ends,
    weighted_sft_loss,
)


class _Acc:
    """Single-process stand-in for the accelerate.Accelerator a TRL trainer holds."""

    device = torch.device("cpu")

    def gather_for_metrics(self, x):
        return x

    def gather(self, x):
        return x


@pytest.fixture(scope="module")
def trl_trainers():
    pytest.importorskip("trl")
    from trl import DPOTrainer, RewardTrainer
    from trl.experimental.cpo import CPOTrainer

    return SimpleNamespace(dpo=DPOTrainer, cpo=CPOTrainer, reward=RewardTrainer)


def _fixed_batch(b: int = 5, t: int = 9, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    completion_mask = torch.zeros(2 * b, t, dtype=torch.long)
    for i in range(2 * b):
        start = int(torch.randint(1, 4, (1,), generator=g))
        end = int(torch.randint(start + 2, t + 1, (1,), generator=g))
        completion_mask[i, start:end] = 1
    token_logps = -3 * torch.rand(2 * b, t - 1, generator=g) * completion_mask[:, 1:]  # masked as TRL's fused head
    ref = -20 * torch.rand(2, b, generator=g)
    return token_logps, completion_mask, ref[0], ref[1]


def _trl_dpo_loss(trl_trainers, token_logps, completion_mask, ref_c, ref_r, beta):
    def model(**_):
        z = torch.zeros_like(token_logps)
        return SimpleNamespace(log_probs=token_logps, entropy=z, mean_logits=z, is_top1=z.bool())

    model.training = True
    trainer = SimpleNamespace(
        model=model,
        accelerator=_Acc(),
        aux_loss_enabled=False,
        ld_alpha=None,
        precompute_ref_logps=True,
        f_divergence_type="reverse_kl",
        loss_types=["sigmoid"],
        loss_weights=[1.0],
        beta=beta,
        label_smoothing=0.0,
        use_weighting=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
        _total_train_tokens=0,
        _tp_size=1,
    )
    n, t = completion_mask.shape
    inputs = {
        "input_ids": torch.zeros(n, t, dtype=torch.long),
        "attention_mask": torch.ones(n, t, dtype=torch.long),
        "completion_mask": completion_mask,
        "ref_chosen_logps": ref_c,
        "ref_rejected_logps": ref_r,
    }
    return trl_trainers.dpo._compute_loss(trainer, model, inputs, False), trainer._metrics["train"]


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_dpo_loss_equals_trl_dpo_trainer(trl_trainers, beta):
    token_logps, cmask, ref_c, ref_r = _fixed_batch()
    expected, metrics = _trl_dpo_loss(trl_trainers, token_logps, cmask, ref_c, ref_r, beta)
    s = token_logps.sum(-1)
    b = len(ref_c)
    ours = dpo_loss(s[:b], s[b:], ref_c, ref_r, beta=beta)
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=1e-6)
    # and TRL's logged reward margin is beta times our margin
    margin = beta * ((s[:b] - ref_c) - (s[b:] - ref_r))
    assert metrics["rewards/margins"][0] == pytest.approx(margin.mean().item(), rel=1e-5)


def test_dpo_label_smoothing_equals_trl_cdpo_form(trl_trainers):
    # TRL 1.16's DPOTrainer "sigmoid" has no smoothing; its cDPO form survives in CPO's "sigmoid" loss, which on
    # (pc - rc, pr - rr) is exactly DPO with label smoothing.
    g = torch.Generator().manual_seed(1)
    pc, pr, rc, rr = (-10 * torch.rand(6, generator=g) for _ in range(4))
    trainer = SimpleNamespace(alpha=0.0, accelerator=_Acc(), loss_type="sigmoid", beta=0.3, label_smoothing=0.2)
    expected, _, _ = trl_trainers.cpo.cpo_loss(trainer, pc - rc, pr - rr)
    ours = dpo_loss(pc, pr, rc, rr, beta=0.3, label_smoothing=0.2, reduction="none")
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=1e-6)


def test_dpo_gradient_closed_form_and_zero_weight():
    g = torch.Generator().manual_seed(2)
    pc, pr = (-10 * torch.rand(4, generator=g)).requires_grad_(), (-10 * torch.rand(4, generator=g)).requires_grad_()
    rc, rr = -10 * torch.rand(4, generator=g), -10 * torch.rand(4, generator=g)
    w = torch.tensor([1.0, 0.0, 2.0, 0.5])
    beta = 0.2
    dpo_loss(pc, pr, rc, rr, beta=beta, weight=w).backward()
    m = (pc - rc) - (pr - rr)
    expected = -beta * torch.sigmoid(-beta * m.detach()) * w / 4  # dL/dpc; dL/dpr = -dL/dpc
    torch.testing.assert_close(pc.grad, expected)
    torch.testing.assert_close(pr.grad, -expected)
    assert pc.grad[1] == 0 and pr.grad[1] == 0  # weight 0: no gradient at all
    # at equal log-ratios (m = 0) the gradient is -beta/2, not 0
    a = torch.zeros(1, requires_grad=True)
    dpo_loss(a, torch.zeros(1), torch.zeros(1), torch.zeros(1), beta=beta).backward()
    assert a.grad.item() == pytest.approx(-beta / 2)


def test_dpo_gradient_through_the_model_vanishes_for_identical_chosen_and_rejected(tiny_tokenizer):
    policy = make_tiny_llama(seed=0)
    reference = make_tiny_llama(seed=1)
    prompts = ["Q: 2+2=", "Q: name a colour:"]
    with torch.no_grad():
        ref = pair_logps(reference, tiny_tokenizer, prompts, [" 4", " red"], [" 4", " red"])

    def grad_norm(chosen, rejected):
        policy.zero_grad()
        pol = pair_logps(policy, tiny_tokenizer, prompts, chosen, rejected)
        r = pair_logps(reference, tiny_tokenizer, prompts, chosen, rejected) if chosen != rejected else ref
        dpo_loss(pol.chosen.sum, pol.rejected.sum, r.chosen.sum.detach(), r.rejected.sum.detach()).backward()
        return sum(float(p.grad.abs().sum()) for p in policy.parameters() if p.grad is not None)

    different = grad_norm([" 4", " red"], [" 5", " dog"])
    same = grad_norm([" 4", " red"], [" 4", " red"])
    assert different > 1e-2
    assert same < 1e-6 * different


def test_simpo_equals_trl_cpo_simpo(trl_trainers):
    g = torch.Generator().manual_seed(3)
    pc, pr = -30 * torch.rand(6, generator=g), -30 * torch.rand(6, generator=g)
    lc, lr = torch.randint(1, 20, (6,), generator=g).float(), torch.randint(1, 20, (6,), generator=g).float()
    for beta, gamma, eps in [(2.0, 1.0, 0.0), (2.5, 0.5, 0.1)]:
        trainer = SimpleNamespace(
            alpha=0.0, accelerator=_Acc(), loss_type="simpo", simpo_gamma=gamma, beta=beta, label_smoothing=eps
        )
        # CPO's simpo consumes length-averaged log-probs (average_log_prob=True, cpo_trainer.py:850)
        expected, _, _ = trl_trainers.cpo.cpo_loss(trainer, pc / lc, pr / lr)
        ours = simpo_loss(pc, pr, lc, lr, beta=beta, gamma=gamma, label_smoothing=eps, reduction="none")
        torch.testing.assert_close(ours, expected, atol=1e-6, rtol=1e-6)
        closed = -F.logsigmoid(beta * pc / lc - beta * pr / lr - gamma)
        if eps == 0:
            torch.testing.assert_close(ours, closed)


def test_bradley_terry_closed_form_and_trl_reward_trainer(trl_trainers):
    rc = torch.tensor([1.0, -0.5, 2.0, 0.0])
    rr = torch.tensor([0.0, 0.5, -1.0, 0.0])
    closed = torch.log1p(torch.exp(-(rc - rr)))  # -log sigmoid(d) = log(1 + e^-d)
    torch.testing.assert_close(bradley_terry_loss(rc, rr, reduction="none"), closed)
    assert bradley_terry_loss(rc, rr, weight=torch.tensor([0, 0, 0, 2.0])).item() == pytest.approx(
        2 * closed[3].item() / 4
    )
    for margin in (None, torch.tensor([0.5, 0.0, 1.0, 0.2])):
        trainer = SimpleNamespace(
            model=SimpleNamespace(training=True),
            args=SimpleNamespace(center_rewards_coefficient=None),
            accelerator=_Acc(),
            _total_train_tokens=0,
            _tp_size=1,
            _metrics=defaultdict(lambda: defaultdict(list)),
        )
        inputs = {"input_ids": torch.zeros(8, 3, dtype=torch.long), "attention_mask": torch.ones(8, 3)}
        if margin is not None:
            inputs["margin"] = margin

        def model(**_):
            return SimpleNamespace(logits=torch.cat([rc, rr])[:, None])

        expected = trl_trainers.reward.compute_loss(trainer, model, inputs)
        torch.testing.assert_close(bradley_terry_loss(rc, rr, margin=margin), expected)


def test_ranking_losses():
    s = torch.tensor([[0.5, -0.2, -1.0], [-1.0, 0.0, 0.3]])
    # PRO, n = 2, is -logsigmoid(beta (s1 - s2))
    two = ranking_loss(s[:, :2], kind="pro", beta=2.0, reduction="none")
    torch.testing.assert_close(two, -F.logsigmoid(2.0 * (s[:, 0] - s[:, 1])))
    # PRO, n = 3: -log softmax(s)_0 - log softmax(s[1:])_0
    pro = ranking_loss(s, kind="pro", reduction="none")
    manual = -(torch.log_softmax(s, -1)[:, 0] + torch.log_softmax(s[:, 1:], -1)[:, 0])
    torch.testing.assert_close(pro, manual)
    # a masked third candidate gives the n = 2 loss
    masked = ranking_loss(s, kind="pro", beta=2.0, mask=torch.tensor([[1, 1, 0], [1, 1, 0]]), reduction="none")
    torch.testing.assert_close(masked, two)
    # the correctly ordered row has the lower PRO loss
    assert pro[0] < pro[1]
    # RRHF hinge: 0 when ordered, the sum of violations otherwise
    rr = ranking_loss(s, kind="rrhf", reduction="none")
    assert rr[0] == 0
    assert rr[1].item() == pytest.approx((0.0 - -1.0) + (0.3 - -1.0) + (0.3 - 0.0))


def test_weighted_sft_loss():
    lp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    w = torch.tensor([0.25, 1.0])
    assert weighted_sft_loss(lp, mask, weight=w).item() == pytest.approx((0.25 * 1.5 + 1.0 * 0.5) / 2)
    assert weighted_sft_loss(lp, mask, normalize="sum", reduction="none").tolist() == pytest.approx([3.0, 1.5])


def test_implicit_prm_ce_is_bce_on_the_scaled_log_ratio():
    g = torch.Generator().manual_seed(4)
    pol, ref = -20 * torch.rand(8, generator=g), -20 * torch.rand(8, generator=g)
    labels = torch.tensor([1, 0, 1, 1, 0, 0, 1, 0.0])
    r = implicit_reward(pol, ref, beta=0.05)
    torch.testing.assert_close(r, 0.05 * (pol - ref))
    expected = F.binary_cross_entropy_with_logits(r, labels)
    torch.testing.assert_close(implicit_prm_ce_loss(pol, ref, labels, beta=0.05), expected)


def test_implicit_step_rewards_sum_to_the_outcome_log_ratio(tiny_tokenizer):
    policy, reference = make_tiny_llama(seed=0), make_tiny_llama(seed=1)
    steps = ["Step 1: 3*4=12\n", "Step 2: 12+5=17\n", "Answer: 17"]
    response = "".join(steps)
    with torch.no_grad():
        pol = seq_logprobs(policy, tiny_tokenizer, "Start with 3.", response)
        ref = seq_logprobs(reference, tiny_tokenizer, "Start with 3.", response)
    # byte tokenizer: one token per byte, so the step token ends are the char ends
    offsets = [(i, i + 1) for i in range(len(response))]
    char_ends = [sum(len(s) for s in steps[: i + 1]) for i in range(len(steps))]
    ends = step_token_ends(offsets, char_ends)
    assert ends == char_ends
    beta = 0.05
    rewards = implicit_step_rewards(pol.per_token(0), ref.per_token(0), ends, beta)
    assert rewards.shape == (3,)
    outcome = implicit_reward(pol.sum, ref.sum, beta=beta)[0]
    torch.testing.assert_close(rewards.sum(), outcome, atol=1e-5, rtol=1e-6)
    # each step's reward is its own tokens' scaled log-ratio
    d = pol.per_token(0) - ref.per_token(0)
    torch.testing.assert_close(rewards[1], beta * d[ends[0] : ends[1]].sum())
    with pytest.raises(ValueError, match="ending at T="):
        implicit_step_rewards(pol.per_token(0), ref.per_token(0), ends[:-1], beta)


def test_step_token_ends_assigns_merged_tokens_by_their_first_char():
    # "ab\ncd" with steps "ab\n" | "cd": the BPE token "\nc" spans the boundary; it starts at the newline (char 2),
    # step 1's last char, so it counts in step 1.
    offsets = [(0, 2), (2, 4), (4, 5)]  # "ab", "\nc", "d"
    assert step_token_ends(offsets, [3, 5]) == [2, 3]
    with pytest.raises(ValueError, match="holds no token"):
        step_token_ends([(0, 5)], [2, 5])


def _manual_logps(model, tok, prompt, response):
    full = tok(prompt + response)["input_ids"]
    ctx = tok(prompt)["input_ids"]
    k = 0
    while k < min(len(full), len(ctx)) and full[k] == ctx[k]:
        k += 1
    ids = torch.tensor([full])
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
    return lp[torch.arange(k - 1, len(full) - 1), ids[0, k:]]


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_seq_logprobs_equal_a_manual_forward(tiny_llama, tiny_tokenizer, padding_side):
    prompts = ["Q: what is 2+2?\nA:", "Hi", "Tell me a story about a cat."]
    responses = [" 4", " there, how are you doing today?", " Once"]
    out = seq_logprobs(tiny_llama, tiny_tokenizer, prompts, responses, padding_side=padding_side, batch_size=2)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        manual = _manual_logps(tiny_llama, tiny_tokenizer, p, r)
        torch.testing.assert_close(out.per_token(i), manual, atol=1e-5, rtol=0)
        assert out.n_tokens[i] == len(r.encode())
        assert out.sum[i].item() == pytest.approx(manual.sum().item(), abs=1e-4)
        assert out.mean[i].item() == pytest.approx(manual.mean().item(), abs=1e-5)


def test_seq_logprobs_carries_gradients_unless_no_grad(tiny_llama, tiny_tokenizer):
    assert seq_logprobs(tiny_llama, tiny_tokenizer, "a", "b").sum.requires_grad
    with torch.no_grad():
        assert not seq_logprobs(tiny_llama, tiny_tokenizer, "a", "b").sum.requires_grad


def _merge_tokenizer():
    """Byte-level BPE with one merge, "a" + "b" -> "ab" (id 260), so "xa" | "b" merges across the boundary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    base = make_byte_tokenizer(chat_template=False)
    vocab = dict(base.get_vocab())
    vocab["ab"] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def test_boundary_merge_goes_to_the_response_as_trl_does(trl_trainers):
    from transformers import AutoModelForCausalLM

    tok = _merge_tokenizer()
    ab = tok.convert_tokens_to_ids("ab")
    assert tok("xab!")["input_ids"] == [tok.convert_tokens_to_ids("x"), ab, tok.convert_tokens_to_ids("!")]
    batch = build_response_batch(tok, ["xa", "q"], ["b!", "ab"])
    first = batch.input_ids[0][batch.response_mask[0]].tolist()
    assert first[0] == ab and len(first) == 2  # the merged token is the response's first token
    # TRL's CPO/SimPO rule gives the same split
    trl_split = trl_trainers.cpo.build_tokenized_answer(SimpleNamespace(processing_class=tok), "xa", "b!")
    assert trl_split["input_ids"] == first
    assert (
        batch.input_ids[0][batch.attention_mask[0].bool() & ~batch.response_mask[0]].tolist()
        == (trl_split["prompt_input_ids"])
    )
    # and the log-prob is that of "ab" after "x", from a manual forward
    torch.manual_seed(0)
    cfg = tiny_config("llama", vocab_size=len(tok))
    cfg.initializer_range = 0.5
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    out = seq_logprobs(model, tok, "xa", "b!")
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=torch.tensor([tok("xab!")["input_ids"]])).logits[0], -1)
    torch.testing.assert_close(out.per_token(0), torch.stack([lp[0, ab], lp[1, tok.convert_tokens_to_ids("!")]]))


def test_pair_tokens_match_trl_dpo_dataset_preparation(trl_trainers):
    from datasets import Dataset

    tok = _merge_tokenizer()
    rows = [
        {"prompt": "Say x", "chosen": "yz", "rejected": "no"},  # no merge
        {"prompt": "xa", "chosen": "bc", "rejected": "bd"},  # both completions merge with the prompt's "a"
    ]
    trainer = SimpleNamespace(_tokenizer=tok)
    args = SimpleNamespace(dataset_num_proc=None, max_length=None, truncation_mode="keep_start")
    prepared = trl_trainers.dpo._prepare_dataset(trainer, Dataset.from_list(rows), tok, args, "train")
    batch = build_pair_batch(
        tok, [r["prompt"] for r in rows], [r["chosen"] + "</s>" for r in rows], [r["rejected"] + "</s>" for r in rows]
    )
    n = len(rows)
    for i, ex in enumerate(prepared):
        for j, key in ((i, "chosen_ids"), (n + i, "rejected_ids")):
            ours = batch.input_ids[j][batch.response_mask[j]].tolist()
            assert ours == ex[key], (i, key, ours, ex[key])


def test_bad_inputs_are_refused(tiny_tokenizer):
    z = torch.zeros(3)
    with pytest.raises(ValueError, match="share one shape"):
        dpo_loss(z, z, z, torch.zeros(2))
    with pytest.raises(ValueError, match="weight has shape"):
        dpo_loss(z, z, z, z, weight=torch.ones(2))
    with pytest.raises(ValueError, match=r"label_smoothing must lie in \[0, 0.5\)"):
        dpo_loss(z, z, z, z, label_smoothing=0.5)
    with pytest.raises(ValueError, match="lengths must be > 0"):
        simpo_loss(z, z, torch.ones(3), torch.tensor([1.0, 0.0, 2.0]))
    with pytest.raises(ValueError, match="got 2 prompts but 1 responses"):
        build_response_batch(tiny_tokenizer, ["a", "b"], ["c"])
    with pytest.raises(ValueError, match="no token before the response"):
        build_response_batch(tiny_tokenizer, [""], ["c"])
    with pytest.raises(ValueError, match="chat=True needs a tokenizer with a chat template"):
        build_response_batch(make_byte_tokenizer(chat_template=False), ["a"], ["b"], chat=True)
    with pytest.raises(ValueError, match="kind must be 'pro' or 'rrhf'"):
        ranking_loss(torch.zeros(2, 2), kind="listnet")


def test_chat_mode_scores_the_assistant_turn(tiny_llama, tiny_tokenizer):
    out = seq_logprobs(tiny_llama, tiny_tokenizer, "2+2?", "4", chat=True)
    # the response is the assistant content plus the template's end of turn: "4</s>\n" -> 3 tokens
    assert out.n_tokens.tolist() == [3]
    head = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True
    )
    manual = _manual_logps(tiny_llama, tiny_tokenizer, head, "4</s>\n")
    torch.testing.assert_close(out.per_token(0), manual, atol=1e-5, rtol=0)
