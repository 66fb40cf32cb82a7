"""Invariants of the implicit PRM on the tiny llama: step rewards tile the outcome log-ratio, training signs, the
task's exact labels, selection rules, the saved-PRM round trip, and rsd / spec_search running on an implicit PRM."""

from __future__ import annotations

import math
import random

import pytest
import torch

from lmlab.core.inference.models import load_model
from lmlab.core.training.preference import seq_logprobs
from lmlab.core.training.prm import PRM, is_prm_spec, load_prm
from lmlab.methods.alignment.implicit_prm import method as M
from lmlab.methods.alignment.implicit_prm import task as T
from lmlab.methods.alignment.implicit_prm.config import ImplicitPRMConfig
from lmlab.runner import run_method

QS = ["Start with 3. Add 4. Multiply by 2.", "Start with 5. Subtract 1. Add 2."]
GOOD = [["3+4=7", "7*2=14", "Answer: 14"], ["5-1=4", "4+2=6", "Answer: 6"]]
BAD = [["3+4=8", "8*2=16", "Answer: 16"], ["5-1=5", "5+2=7", "Answer: 7"]]


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama")  # the alias a saved PRM names as its base model


def _train(tiny, loss="ce", epochs=1, lr=1e-4, k=1):
    model, tok = tiny
    qs = [QS[0], QS[0], QS[1], QS[1]]
    steps = [GOOD[0], BAD[0], GOOD[1], BAD[1]]
    labels = [1.0, 0.0, 1.0, 0.0]
    return M.train_implicit_prm(model, tok, qs, steps, labels, groups=[0, 0, 1, 1], loss=loss, k=k, epochs=epochs,
                                lr=lr, batch_size=4, base_model="tiny-llama")  # fmt: skip


@pytest.fixture(scope="module")
def trained(tiny):
    return _train(tiny, epochs=3, lr=3e-3)


# ------------------------------------------------------------------------------------------- the core invariant


def test_step_rewards_sum_to_the_outcome_log_ratio_and_match_a_full_forward(tiny, trained):
    model, tok = tiny
    policy = trained.merged_policy()
    for q, steps in [(QS[0], GOOD[0]), (QS[1], BAD[1])]:
        r = trained.score_steps(q, steps)
        prompt, response = trained.prompt(q), "\n".join(steps)
        with torch.no_grad():
            lp_pol = seq_logprobs(policy, tok, prompt, response).per_token(0)  # full model, all heads
            lp_ref = seq_logprobs(model, tok, prompt, response).per_token(0)
        outcome = trained.beta * float(lp_pol.sum() - lp_ref.sum())
        assert abs(math.fsum(r) - outcome) < 1e-5  # the invariant: sum_s r_s = beta log pi/pi_ref
        assert abs(outcome) > 1e-3  # trained: the log-ratio is not identically 0
        # byte tokenizer: one token per character; a step owns its text and the delimiter after it
        lens = [len(s) + 1 for s in steps[:-1]] + [len(steps[-1])]
        ends = [sum(lens[: i + 1]) for i in range(len(lens))]
        starts = [0, *ends[:-1]]
        expect = [trained.beta * float((lp_pol[a:b] - lp_ref[a:b]).sum()) for a, b in zip(starts, ends)]
        assert r == pytest.approx(expect, abs=1e-5)


def test_untrained_policy_gives_zero_rewards(tiny):
    # pi_theta is initialised from pi_ref: before training every token log-ratio is 0
    model, tok = tiny
    trunk = M.FrozenTrunk(model, 1)
    prm = M.ImplicitPRM(model, tok, trunk.top_k(), beta=0.05, trunk=trunk)
    assert prm.score_steps(QS[0], GOOD[0]) == pytest.approx([0.0, 0.0, 0.0], abs=1e-6)
    assert prm.score(QS[0], GOOD[0]) == pytest.approx([0.5, 0.5, 0.5], abs=1e-6)


def test_encode_steps_maps_tokens_to_steps_by_offsets(tiny):
    _, tok = tiny
    enc = M.encode_steps(tok, ["Q\n", "Hello\n"], [["ab", "c"], ["x", "yz", "w"]])
    assert enc.step_ends == [[3, 4], [2, 5, 6]]  # "ab\n" | "c" and "x\n" | "yz\n" | "w"
    assert enc.prompt_lens == [2, 6]
    assert [int(n) for n in enc.batch.response_mask.sum(-1)] == [4, 6]


# ---------------------------------------------------------------------------------------------------- training


@pytest.mark.parametrize("loss", ["ce", "dpo"])
def test_training_moves_the_outcome_reward_toward_the_labels(tiny, loss):
    prm = _train(tiny, loss=loss, epochs=4, lr=3e-3)
    good = [prm.response_score(q, s, "sum") for q, s in zip(QS, GOOD)]
    bad = [prm.response_score(q, s, "sum") for q, s in zip(QS, BAD)]
    assert min(good) > max(bad)
    if loss == "ce":  # CE fits sigmoid(r) to the labels themselves, not only the order
        assert min(good) > 0 > max(bad)


def test_value_model_bt_and_steps_objectives(tiny):
    model, tok = tiny
    trunk = M.FrozenTrunk(model, 1)
    prompts = [QS[0] + "\n", QS[0] + "\n", QS[1] + "\n", QS[1] + "\n"]
    steps = [GOOD[0], BAD[0], GOOD[1], BAD[1]]
    batches = M.prepare(trunk, tok, prompts, steps, batch_size=4, groups=[0, 0, 1, 1])
    labels, groups = [1.0, 0.0, 1.0, 0.0], [0, 0, 1, 1]
    vm, log = M.train_value_model(trunk, batches, objective="bt", labels=labels, groups=groups, epochs=20, lr=3e-3)
    assert log.losses[-1] < log.losses[0]
    with torch.no_grad():
        final = [v[-1].item() for v in M.prefix_values(vm(batches[0].cache), batches[0].enc)]
    assert final[0] > final[1] and final[2] > final[3]
    step_labels = [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    vm, log = M.train_value_model(trunk, batches, objective="steps", step_labels=step_labels, epochs=20, lr=3e-3)
    assert log.losses[-1] < 0.5 * log.losses[0]


def test_value_model_head_steps_at_its_own_lr(tiny):
    # issue 34 / review defect 1: the baselines' fresh heads trained at the implicit PRM's lr 1e-4, which turns a
    # 1/sqrt(hidden)-scale head by ~1e-4 per AdamW step (2 epochs could not fit it); the head now has its own lr
    model, tok = tiny
    trunk = M.FrozenTrunk(model, 1)
    batches = M.prepare(trunk, tok, [QS[0], QS[0]], [GOOD[0], BAD[0]], batch_size=2, groups=[0, 0])
    kw = dict(objective="bt", labels=[1.0, 0.0], groups=[0, 0], epochs=1, seed=0)
    before = M.ValueModel(trunk.top_k(), seed=0)
    vm, log = M.train_value_model(trunk, batches, lr=1e-4, head_lr=3e-2, **kw)
    assert len(log.losses) == 1  # one AdamW step: each weight with a gradient moves by its group's lr
    head_step = (vm.head.weight - before.head.weight).abs().max().item()
    block_step = max((a - b).abs().max().item() for a, b in zip(vm.topk.parameters(), before.topk.parameters()))
    assert head_step == pytest.approx(3e-2, rel=1e-3) and block_step == pytest.approx(1e-4, rel=1e-3)
    same, _ = M.train_value_model(trunk, batches, lr=1e-4, **kw)  # head_lr defaults to lr
    assert (same.head.weight - before.head.weight).abs().max().item() == pytest.approx(1e-4, rel=1e-3)


class _Knob(torch.nn.Module):
    """A fake model whose weights are (lr, epochs trained): `select_recipe` must hand back the chosen checkpoint."""

    def __init__(self, lr):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([lr, 0.0], dtype=torch.float64))


def _fake_runs(started):
    def start(lr):
        started.append(lr)
        m = _Knob(lr)
        while True:
            with torch.no_grad():
                m.w[1] += 1
            yield m, M.TrainLog([float(m.w[1].detach())])

    return start


def _peak_at(best_lr, best_epochs):
    """Dev score peaking at (best_lr, best_epochs), read off the model's weights."""
    return lambda m: (-abs(math.log10(m.w[0].item() / best_lr)) - 0.1 * abs(m.w[1].item() - best_epochs),)


def test_select_recipe_picks_the_dev_best_checkpoint_and_restores_it():
    started = []
    r = M.select_recipe(_fake_runs(started), _peak_at(1e-4, 1), [3e-4, 1e-4, 3e-5], [1, 2], max_extensions=2)
    assert (r.lr, r.epochs) == (1e-4, 1) and not r.lr_at_edge and not r.epochs_at_edge
    assert started == [3e-5, 1e-4, 3e-4]  # one run per lr; the epochs are checkpoints of it, no extension needed
    assert [(p.lr, p.epochs) for p in r.grid] == [(lr, e) for lr in started for e in (1, 2)]
    assert r.model.w.tolist() == [1e-4, 1.0]  # the run went on to epoch 2; the chosen checkpoint's weights are back
    assert r.log.losses == [1.0] and r.score == max(p.score for p in r.grid)


def test_select_recipe_extends_a_choice_on_the_grid_edge():
    started = []
    r = M.select_recipe(_fake_runs(started), _peak_at(1e-2, 1), [3e-5, 1e-4, 3e-4], [1, 2], max_extensions=1)
    assert started == pytest.approx([3e-5, 1e-4, 3e-4, 9e-4])  # the largest lr won: one more run, 3x up
    assert r.lr == pytest.approx(9e-4) and r.lr_at_edge  # still on the edge after the single allowed extension
    assert [p.extension for p in r.grid] == [False] * 6 + [True] * 2
    started = []
    r = M.select_recipe(_fake_runs(started), _peak_at(1e-6, 1), [3e-5, 1e-4, 3e-4], [1, 2], max_extensions=3)
    assert started == pytest.approx([3e-5, 1e-4, 3e-4, 9e-6, 2.7e-6, 8.1e-7])  # down by the grid's 10/3 spacing
    assert r.lr == pytest.approx(8.1e-7) and r.lr_at_edge
    r = M.select_recipe(_fake_runs([]), _peak_at(1e-4, 4), [3e-5, 1e-4, 3e-4], [1, 2], max_extensions=5)
    assert (r.lr, r.epochs) == (1e-4, 4) and not r.epochs_at_edge  # trained on to epoch 5, which lost to 4
    assert [(p.epochs, p.extension) for p in r.grid if p.lr == 1e-4] == [(1, False), (2, False), (3, True),
                                                                          (4, True), (5, True)]  # fmt: skip
    # the default search (epoch_grid [1]): every lr gets one epoch, only the winning run trains on while dev improves
    started = []
    r = M.select_recipe(_fake_runs(started), _peak_at(1e-4, 2), [3e-5, 1e-4, 3e-4], [1], max_extensions=2)
    assert started == [3e-5, 1e-4, 3e-4] and (r.lr, r.epochs) == (1e-4, 2) and not r.epochs_at_edge
    assert [(p.lr, p.epochs, p.extension) for p in r.grid] == [(3e-5, 1, False), (1e-4, 1, False), (3e-4, 1, False),
                                                               (1e-4, 2, True), (1e-4, 3, True)]  # fmt: skip
    r = M.select_recipe(_fake_runs([]), _peak_at(1e-4, 2), [3e-5, 1e-4, 3e-4], [1], max_extensions=0)
    assert r.epochs == 1 and r.epochs_at_edge  # never trained on, so one epoch is not known to be enough
    # a flat dev score: ties go inside the grid (centre lr, fewest epochs), so no edge is chosen and nothing extends
    started = []
    r = M.select_recipe(_fake_runs(started), lambda m: (0.5,), [3e-5, 1e-4, 3e-4], [1, 2], max_extensions=2)
    assert (r.lr, r.epochs, len(started)) == (1e-4, 1, 3)
    with pytest.raises(ValueError, match="lrs must be distinct positive"):
        M.select_recipe(_fake_runs([]), lambda m: (0.0,), [1e-4, 1e-4], [1])
    with pytest.raises(ValueError, match="epoch_grid must be distinct ints"):
        M.select_recipe(_fake_runs([]), lambda m: (0.0,), [1e-4], [0, 1])


def test_select_recipe_caps_each_axis_separately():
    # issue 34: the 2026-12-07 CE search spent its shared cap of 2 on an lr extension (9e-4, lost) and on epoch 2
    # (won), and stopped on the epoch edge. Each axis now has its own cap, so the winning run trains on until an
    # epoch loses: on the old shared cap this search ends at (3e-4, 2) with epochs_at_edge and no epoch-3 point
    started = []
    r = M.select_recipe(_fake_runs(started), _peak_at(3e-4, 2), [3e-5, 1e-4, 3e-4], [1], max_extensions=2)
    assert started == pytest.approx([3e-5, 1e-4, 3e-4, 9e-4])  # one lr extension: 9e-4 loses, the lr is inside
    assert [(p.lr, p.epochs) for p in r.grid if p.extension] == [(pytest.approx(9e-4), 1), (3e-4, 2), (3e-4, 3)]
    assert (r.lr, r.epochs) == (3e-4, 2) and not r.lr_at_edge and not r.epochs_at_edge  # inside on both axes
    # the cap still binds per axis: a dev score that keeps improving with epochs stops after 2 more, on the edge
    r = M.select_recipe(_fake_runs([]), _peak_at(3e-4, 9), [3e-5, 1e-4, 3e-4], [1], max_extensions=2)
    assert (r.lr, r.epochs) == (3e-4, 3) and r.epochs_at_edge
    assert sum(p.extension for p in r.grid) == 3  # 1 lr + 2 epochs
    r = M.select_recipe(_fake_runs([]), _peak_at(1e-2, 9), [3e-5, 1e-4, 3e-4], [1], max_extensions=1)
    assert r.lr == pytest.approx(9e-4) and r.lr_at_edge and r.epochs == 2 and r.epochs_at_edge  # 1 + 1


@pytest.fixture(scope="module")
def tuned_smoke():
    grid = dict(epoch_grid=[1, 2], lrs=[1e-4, 3e-4, 1e-3], max_extensions=1)
    return run_method("implicit_prm", preset="smoke", model="tiny-llama", write=False, show_progress=False,
                      raise_errors=True, threads=1, **grid)  # fmt: skip


def test_every_reward_model_gets_its_own_recipe_from_the_same_dev_search(tuned_smoke):
    # issue 34 / review defect 1: the ORM and MC PRM reused the implicit PRM's lr and epochs; each system now picks
    # its own (lr, epochs) on a dev split carved from the training problems, over a grid of the same size
    r, cfg = tuned_smoke, tuned_smoke.config
    data = r.meta_info["data"]
    assert data["arith_chain/dev"]["n"] == cfg["n_dev"] and data["arith_chain/dev"]["from"] == "train split"
    assert data["arith_chain/train"]["n"] == cfg["n_train"] - cfg["n_dev"]
    grid = r.tables["recipe_grid"]
    systems = ["implicit_prm_ce", "implicit_prm_dpo", "orm", "mc_prm"]
    for name in systems:
        rows = [g for g in grid if g["system"] == name]
        assert len([g for g in rows if not g["extension"]]) == len(cfg["lrs"]) * len(cfg["epoch_grid"])
        (chosen,) = [g for g in rows if g["chosen"]]
        assert chosen["dev_bon_acc"] == max(g["dev_bon_acc"] for g in rows)
        assert r.metric(name, "chosen_lr").value == chosen["lr"]
        assert r.metric(name, "chosen_epochs").value == chosen["epochs"]
        for g in rows:
            key = f"dev_bon_acc[lr={g['lr']:.2g},epochs={g['epochs']}]"
            assert r.metric(name, key).value == pytest.approx(g["dev_bon_acc"], abs=1e-4)
        # the chosen checkpoint is the model evaluated: its dev score, recomputed after the search, matches
        assert r.metric(name, "dev_bon_acc").value == pytest.approx(chosen["dev_bon_acc"], abs=1e-4)
    for name in ("orm", "mc_prm"):
        assert r.metric(name, "chosen_head_lr").value == pytest.approx(cfg["head_lr_scale"] * r.metric(name,
                                                                       "chosen_lr").value)  # fmt: skip


def test_baselines_are_checked_against_a_scorers_floor_and_gate_only_when_they_beat_it(tuned_smoke):
    # the floor of a scorer is the uniform pick among distinct texts (a scorer without signal ranks one text per group
    # of identical candidates); the copy-counting random pick is what majority vote exploits, not a scorer's floor
    r = tuned_smoke
    sane = r.flags["baselines_beat_random_on_dev"]
    by = {(c.method, c.baseline, c.metric): c for c in r.claims}
    for b in ("orm", "mc_prm"):
        check = by[(b, "random_distinct_text", "dev_bon_acc")]
        assert check.mechanism and check.status in ("supported", "inconclusive", "not_supported")
        assert (b, "random", "dev_bon_acc") not in by
        assert sane[b] == (r.metric(b, "dev_bon_acc").value > r.metric("random_distinct_text", "dev_bon_acc").value)
        assert not by[(b, "random_distinct_text", "bon_acc")].gate  # the same check on the held-out problems
        assert ("NOT MEANINGFUL" in by[("implicit_prm_ce", b, "bon_acc")].text) == (not sane[b])
    assert by[("implicit_prm_ce", "mc_prm", "bon_acc")].gate == sane["mc_prm"]
    assert not by[("implicit_prm_ce", "orm", "bon_acc")].gate
    assert by[("majority_vote", "random", "bon_acc")]  # voting is judged against the copy-counting pick
    # the paper's claim against majority vote (section 5.1, official README) is the reward-WEIGHTED vote for CE; the
    # min-step pick alone (below majority vote for CE in the paper) is reported only
    assert by[("implicit_prm_ce_wmv", "majority_vote", "bon_acc")].gate
    assert not by[("implicit_prm_ce", "majority_vote", "bon_acc")].gate


def test_trivial_pick_and_size_shortcut_rows_are_reported(tuned_smoke):
    # README: a scorer picks among distinct texts (the random pick counts copies of the error-free solution), and
    # value heads leaned on the answer's size; both levels are rows of every run, with every scorer's pair accuracy
    # and the time of each phase
    r = tuned_smoke
    for name in ("random", "random_distinct_text", "smallest_answer"):
        assert 0.0 <= r.metric(name, "bon_acc").value <= 1.0
    assert r.metric("random_distinct_text", "dev_bon_acc").n == r.config["n_dev"]
    pair_rows = {row.system for row in r.metrics if row.metric == "pair_acc"}
    assert pair_rows == {"implicit_prm_ce", "implicit_prm_dpo", "orm", "mc_prm", "smallest_answer"}
    assert all(0.0 <= r.metric(n, "pair_acc").value <= 1.0 for n in pair_rows)
    for name in ("implicit_prm_ce", "implicit_prm_dpo", "orm", "mc_prm"):
        assert r.metric(name, "search_s").value > 0
    assert r.metric("timing", "prepare_s").value > 0


def test_pairs_stay_within_a_question_and_balance_weights():
    chosen, rejected = M._pairs([0, 1, 2, 3, 4], [1.0, 0.0, 0.0, 1.0, 0.0], ["a", "a", "a", "b", "b"])
    assert sorted(zip(chosen, rejected)) == [(0, 1), (0, 2), (3, 4)]
    w = M.balance_weights([1.0, 0.0, 0.0, 0.0], ["a", "a", "b", "b"], "dataset")
    assert w == pytest.approx([2.0, 2 / 3, 2 / 3, 2 / 3])  # each class carries half the total weight
    w = M.balance_weights([1.0, 0.0, 0.0, 0.0], ["a", "a", "b", "b"], "instruction")
    assert w == pytest.approx([1.0, 1.0, 1.0, 1.0])  # group b has one class only: unchanged
    assert M.balance_weights([1.0, 0.0], [0, 0], "none") == [1.0, 1.0]


def test_dpo_is_skipped_on_batches_without_a_pair(tiny):
    model, tok = tiny
    trunk = M.FrozenTrunk(model, 1)
    batches = M.prepare(trunk, tok, [QS[0], QS[0]], [GOOD[0], GOOD[0]], groups=[0, 0])
    _, log = M.train_implicit(trunk, batches, [1.0, 1.0], [0, 0], loss="dpo", epochs=2)
    assert log.losses == [] and log.skipped == 2


# --------------------------------------------------------------------------------------------- selection rules


def test_best_of_n_and_votes_break_ties_in_expectation():
    assert M.best_of_n_accuracy([0.1, 0.9, 0.9], [False, True, False]) == 0.5
    assert M.best_of_n_accuracy([0.1, 0.9, 0.2], [False, True, False]) == 1.0
    assert M.vote_accuracy([3, 3, 5], [True, True, False]) == 1.0
    assert M.vote_accuracy([3, 5], [True, False]) == 0.5
    assert M.vote_accuracy([3, 3, 5], [True, True, False], weights=[0.1, 0.1, 0.9]) == 0.0
    assert M.first_error_hit([0.1, -2.0, -1.0], 1) == 1.0 and M.first_error_hit([0.1, -2.0, -1.0], 2) == 0.0
    assert M.aggregate([1.0, -2.0, 0.5], "min") == -2.0 and M.aggregate([1.0, -2.0, 0.5], "sum") == -0.5
    assert M.aggregate([1.0, -2.0, 0.5], "last") == 0.5


def test_distinct_pick_counts_texts_not_copies():
    # 3 copies of the correct text among 5 candidates: a random candidate is right 3/5 of the time, a uniform pick
    # among the 3 distinct texts 1/3 (exact, not sampled)
    texts = [("a",), ("a",), ("b",), ("a",), ("c",)]
    correct = [True, True, False, True, False]
    assert M.distinct_pick_accuracy(texts, correct) == pytest.approx(1 / 3)
    assert M.distinct_pick_accuracy([("a",), ("b",)], [True, True]) == 1.0
    with pytest.raises(ValueError, match="labelled both"):
        M.distinct_pick_accuracy([("a",), ("a",)], [True, False])
    with pytest.raises(ValueError, match="one text per candidate"):
        M.distinct_pick_accuracy([("a",)], [True, False])


# ------------------------------------------------------------------------------------------------------ the task


def _check_line(line: str) -> bool:
    lhs, rhs = line.split("=")
    for sym, fn in (("*", lambda a, b: a * b), ("+", lambda a, b: a + b)):
        if sym in lhs:
            a, b = lhs.split(sym)
            return fn(int(a), int(b)) == int(rhs)
    a, b = lhs[1:].split("-", 1) if lhs.startswith("-") else lhs.split("-", 1)
    a = "-" + a if lhs.startswith("-") else a
    return int(a) - int(b) == int(rhs)


def test_solver_labels_are_exact_and_errors_propagate():
    probs = T.make_problems(30, 0, "train")
    rng = random.Random(0)
    for pr in probs:
        clean = T.noisy_solution(pr, 0.0, rng)
        assert clean.correct and clean.first_error is None and all(clean.step_ok)
        assert clean.answer == int(pr.target) and all(_check_line(s) for s in clean.steps[:-1])
        for c in T.candidates_for(pr, 4, 0.5, rng):
            ok = [_check_line(s) for s in c.steps[:-1]]
            if c.first_error is None:
                assert all(ok) and c.correct
            else:  # the first locally wrong line is the first error
                assert not ok[c.first_error] and all(ok[: c.first_error])
            for prev, line in zip(c.steps[:-2], c.steps[1:-1]):  # errors propagate: each line starts from the last
                assert line.startswith(prev.rsplit("=", 1)[1])
            assert c.steps[-1] == f"Answer: {c.answer}"
    assert T.noisy_solution(probs[0], 1.0, rng).first_error == 0


def test_mc_labels_equal_the_exact_prefix_labels_without_completion_noise():
    pr = T.make_problems(1, 0, "train")[0]
    rng = random.Random(1)
    for _ in range(10):
        c = T.noisy_solution(pr, 0.5, rng)
        labels, rollouts, tokens = T.mc_step_labels(pr, c, 3, 0.0, rng, len)
        assert labels[: c.n_ops] == [float(x) for x in c.step_ok]
        assert labels[-1] == float(c.correct)
        assert rollouts == 3 * (c.n_ops - 1) and tokens > 0


def test_solver_errors_are_symmetric_around_the_true_result():
    # issue 34 / README: the first mix (+1, -1, +10, the wrong operator's result) put wrong results above the true
    # one about 2:1. Now every size is as likely above as below, given the step (fails on the old mix: +10 had no -10)
    rng = random.Random(0)
    offsets: dict[int, int] = {}
    for _ in range(30000):
        op = rng.choice(list(T.OPS))
        value, x = rng.randint(0, 60), rng.randint(2, 3) if op == "mul" else rng.randint(1, 9)
        result = T._apply(value, op, x)
        d = T._corrupt(value, op, x, result, rng) - result
        assert d != 0  # always wrong
        offsets[d] = offsets.get(d, 0) + 1
    above = sum(c for d, c in offsets.items() if d > 0)
    assert abs(above / sum(offsets.values()) - 0.5) < 0.01
    for size in {abs(d) for d in offsets}:
        up, down = offsets.get(size, 0), offsets.get(-size, 0)
        assert abs(up - down) <= 4 * math.sqrt(up + down) + 2, (size, up, down)


def _shortcut_stats(n: int, seed: int) -> dict[str, float]:
    probs = T.make_problems(n, seed, "train")
    rng = random.Random(seed)
    above = below = 0
    pairs, pairs_abs, pick_min, pick_max, pick_small, distinct = [], [], [], [], [], []
    for pr in probs:
        cands = T.candidates_for(pr, 8, 0.3, rng)
        ok = [c.correct for c in cands]
        above += sum(c.answer > int(pr.target) for c in cands)
        below += sum(c.answer < int(pr.target) for c in cands)
        pair = M.pair_accuracy([-c.answer for c in cands], ok)  # "the smaller answer is right"
        if pair is not None:
            pairs.append(pair)
            pairs_abs.append(M.pair_accuracy([-abs(c.answer) for c in cands], ok))
        pick_min.append(M.best_of_n_accuracy([-c.answer for c in cands], ok))
        pick_max.append(M.best_of_n_accuracy([c.answer for c in cands], ok))
        pick_small.append(M.best_of_n_accuracy([-abs(c.answer) for c in cands], ok))
        distinct.append(M.distinct_pick_accuracy([c.steps for c in cands], ok))
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {"above": above / (above + below), "pair": mean(pairs), "pair_abs": mean(pairs_abs),
            "pick_min": mean(pick_min), "pick_max": mean(pick_max), "pick_small": mean(pick_small),
            "distinct": mean(distinct)}  # fmt: skip


def test_the_answer_size_shortcut_carries_no_signal_on_generated_data():
    # 200 seeded problems x 8 candidates, as the run draws them. Old mix: wrong answers above the target 0.65 of the
    # time, "smaller is right" orders 0.65 of the correct x wrong pairs right (|answer|: 0.68), and the smallest
    # answer is correct 0.115 of the time against the largest's 0.005
    s = _shortcut_stats(200, 0)
    assert abs(s["above"] - 0.5) < 0.05
    assert abs(s["pair"] - 0.5) < 0.05  # the signed size ranks pairs at chance
    assert s["pair_abs"] < 0.6  # |answer| keeps a little: wrong answers that cross below 0 (README)
    assert abs(s["pick_min"] - s["pick_max"]) < 0.04  # the two extremes are equally (rarely) right
    # with wrong answers on both sides the correct one sits inside, so an extreme pick is right less often than a
    # uniform pick among the distinct texts (it is not a scorer's floor; the distinct-text pick is)
    assert s["pick_small"] <= s["distinct"]


def test_splits_are_disjoint():
    train = {e.id for e in T.make_problems(40, 0, "train")}
    test = {e.id for e in T.make_problems(40, 0, "test")}
    assert not train & test


# ------------------------------------------------------------------------------------- saving and the PRM interface


def test_save_load_round_trip_and_core_resolver(trained, tmp_path):
    assert isinstance(trained, PRM)
    trained.save(tmp_path / "prm")
    assert is_prm_spec(f"implicit:{tmp_path / 'prm'}") and not is_prm_spec("noisy") and not is_prm_spec("implicit:")
    loaded = load_prm(f"implicit:{tmp_path / 'prm'}")
    assert loaded.score_steps(QS[1], BAD[1]) == pytest.approx(trained.score_steps(QS[1], BAD[1]), abs=1e-6)
    scores = loaded.score(QS[1], BAD[1])
    r = trained.score_steps(QS[1], BAD[1])
    assert scores == pytest.approx([1 / (1 + math.exp(-sum(r[: i + 1]))) for i in range(len(r))], abs=1e-6)
    assert loaded.calls == 1 and loaded.steps_scored == 3 and loaded.flops > 0
    step = M.load_implicit_prm(tmp_path / "prm", output="step")
    assert step.score(QS[1], BAD[1]) == pytest.approx([1 / (1 + math.exp(-x)) for x in r], abs=1e-6)
    with pytest.raises(ValueError, match="not an implicit PRM folder"):
        M.load_implicit_prm(tmp_path)


def test_rsd_runs_with_an_implicit_prm(trained, tmp_path):
    folder = trained.save(tmp_path / "prm")
    spec = f"implicit:{folder}"
    result = run_method("rsd", preset="smoke", model="tiny-llama", sets=[f"prm={spec}"], write=False,
                        show_progress=False, raise_errors=True, threads=1)  # fmt: skip
    assert result.config["prm"] == spec and spec in result.config["prms"]
    calls = result.metric(f"rsd_{spec}_d0.7", "prm_calls")
    assert calls.value > 0
    assert any(c.method == f"rsd_{spec}_d0.7" for c in result.claims)  # checked as the headline PRM


def test_spec_search_takes_an_implicit_prm_as_headline(trained, tmp_path):
    from lmlab.methods.decoding.spec_search.config import SpecSearchConfig

    folder = trained.save(tmp_path / "prm")
    cfg = SpecSearchConfig(prm=f"implicit:{folder}", prms=["noisy"])
    assert cfg.prms == [f"implicit:{folder}", "noisy"]
    with pytest.raises(ValueError, match="prm must be one of"):
        SpecSearchConfig(prm="implicit:")


# ----------------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"beta": 0.0}, "beta"),
        ({"losses": ["ce", "kto"]}, "losses"),
        ({"headline": "dpo", "losses": ["ce"]}, "headline"),
        ({"n_candidates": 1}, "n_candidates"),
        ({"min_ops": 4, "max_ops": 3}, "max_ops"),
        ({"error_rate": 1.5}, "error_rate"),
        ({"aggregate": "max"}, "aggregate"),
        ({"k": 0}, "k"),
        ({"n_dev": 100}, "n_dev"),
        ({"lrs": [1e-4, 1e-4]}, "lrs"),
        ({"lrs": [0.0]}, "lrs"),
        ({"epoch_grid": [0]}, "epoch_grid"),
        ({"epoch_grid": [1.5]}, "epoch_grid"),
        ({"head_lr_scale": 0.0}, "head_lr_scale"),
        ({"max_extensions": -1}, "max_extensions"),
    ],
)
def test_config_rejects_bad_values(kw, match):
    with pytest.raises(ValueError, match=match):
        ImplicitPRMConfig(**kw)


def test_bad_inputs_give_one_line_errors(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="k must be an int in"):
        M.FrozenTrunk(model, 5)
    with pytest.raises(ValueError, match="not a supported decoder-only LM"):
        M.FrozenTrunk(torch.nn.Linear(2, 2), 1)
    with pytest.raises(ValueError, match="steps is empty"):
        M.encode_steps(tok, ["Q\n"], [[]])
    with pytest.raises(ValueError, match="non-empty string"):
        M.encode_steps(tok, ["Q\n"], [["a", ""]])
    with pytest.raises(ValueError, match="aggregate must be one of"):
        M.aggregate([1.0], "max")
    with pytest.raises(ValueError, match="loss must be one of"):
        M.train_implicit(M.FrozenTrunk(model, 1), [], [], [], loss="kto")
    with pytest.raises(ValueError, match="no rows"):
        M.prepare(M.FrozenTrunk(model, 1), tok, [], [])
    with pytest.raises(ValueError, match="not consecutive"):
        M.prepare(M.FrozenTrunk(model, 1), tok, ["a", "b", "c"], [["x"], ["y"], ["z"]], groups=[0, 1, 0])
    with pytest.raises(ValueError, match="output must be one of"):
        M.ImplicitPRM(model, tok, M.FrozenTrunk(model, 1).top_k(), beta=0.05, output="prob")
    with pytest.raises(ValueError, match="save needs base_model"):
        M.ImplicitPRM(model, tok, M.FrozenTrunk(model, 1).top_k(), beta=0.05).save("unused")
    from lmlab.methods.decoding.rsd.config import RSDConfig

    with pytest.raises(ValueError, match="prm must be one of"):
        RSDConfig(prm="nonsense")
