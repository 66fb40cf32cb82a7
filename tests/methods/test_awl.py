"""AWL invariants: the balancing rule, the tool-usage-accuracy formula, the ReAct parser and tool executor, the
tool-derived data builders, loss masking of observations, and the SFT loop over the cached trunk."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from lmlab.core.execution.tools import ToolCall
from lmlab.data.tools import default_tools
from lmlab.methods.adaptation.awl.method import (
    ANSWER_TOOL,
    STOP,
    Step,
    TraceCache,
    balance_repeat,
    calls_tool,
    clone_topk,
    encode_segments,
    extract_answer,
    first_action,
    format_react,
    keep_correct,
    make_stage2_data,
    make_tool_only_data,
    make_wkl_data,
    observe_all,
    parse_react,
    problem_from_example,
    render_prompt,
    run_with_tools,
    sft_steps,
    split_easy_hard,
    tool_example,
)
from lmlab.methods.adaptation.awl.metric import (
    compare_tua,
    n_for_power,
    tool_usage_accuracy,
    tool_usage_accuracy_rows,
    tua_bootstrap_ci,
    tua_influence,
)


def _problems(n_arith=6, n_geo=4):
    from lmlab.data.taskbank import tasks

    exs = tasks("arithmetic", n_arith, seed=0, split="train", task="mul", digits=3, n_choices=0)
    exs += tasks("arithmetic", 3, seed=0, split="train", task="sub", digits=1, n_choices=0)
    exs += tasks("geography", n_geo, seed=0, split="train", task="capital", n_choices=0)
    return [problem_from_example(e) for e in exs]


# ----------------------------------------------------------------------------------------------------------------
# the balancing rule and the metric


def test_balance_repeats_the_minority_by_integer_division():
    e, h = balance_repeat([1, 2], list(range(7)))
    assert e == [1, 2, 1, 2, 1, 2] and h == list(range(7))  # 7 // 2 = 3 copies
    e, h = balance_repeat(list(range(5)), ["a", "b"])
    assert e == list(range(5)) and h == ["a", "b", "a", "b"]  # 5 // 2 = 2
    assert balance_repeat([1, 2, 3], [4, 5, 6]) == ([1, 2, 3], [4, 5, 6])
    assert balance_repeat([], [1, 2]) == ([], [1, 2])  # nothing to repeat


def test_tool_usage_accuracy_on_a_hand_built_table():
    # items: (no-tool correct, used tool); easy = correct
    correct = [1, 1, 0, 0, 0]
    used = [0, 1, 1, 1, 0]
    # P(no tool | easy) = 1/2, P(tool | hard) = 2/3
    assert tool_usage_accuracy(correct, used) == pytest.approx(0.5 * 0.5 + 0.5 * 2 / 3)
    # the vectorised form, row by row, with an empty class in the last row
    tables = np.array([correct, [1, 1, 1, 1, 1]], bool), np.array([used, [0, 1, 0, 0, 0]], bool)
    rows = tool_usage_accuracy_rows(*tables)
    assert rows == pytest.approx([0.5 * 0.5 + 0.5 * 2 / 3, 0.8])


def test_tool_usage_accuracy_extremes():
    correct = [1, 0, 1, 0, 0]
    assert tool_usage_accuracy(correct, [1] * 5) == pytest.approx(0.5)  # always a tool: over-reliance
    assert tool_usage_accuracy(correct, [0] * 5) == pytest.approx(0.5)  # never a tool
    assert tool_usage_accuracy(correct, [0, 1, 0, 1, 1]) == pytest.approx(1.0)  # the right decision everywhere
    assert tool_usage_accuracy(correct, [1, 0, 1, 0, 0]) == pytest.approx(0.0)
    # one class only: the mean is over the class present
    assert tool_usage_accuracy([1, 1, 1, 1], [0, 0, 0, 1]) == pytest.approx(0.75)
    assert tool_usage_accuracy([0, 0], [1, 0]) == pytest.approx(0.5)


def _fixed_weight_scores(correct, used):
    """The per-item scores the experiment bootstrapped before: weights n / (2 n_class) fixed from the full sample."""
    c, u = np.asarray(correct, bool), np.asarray(used, bool)
    n, n_easy = c.size, int(c.sum())
    classes = int(n_easy > 0) + int(n_easy < n)  # one class empty: the rate of the other
    return (c != u) * np.where(c, n / (classes * max(n_easy, 1)), n / (classes * max(n - n_easy, 1)))


def test_tua_ci_recomputes_the_class_sizes_per_resample():
    from lmlab.core.stats.uncertainty import bootstrap_ci

    # every decision right, both classes present: TUA is 1 in every sample (a class that vanishes leaves the rate of
    # the other, also 1), so its sampling distribution is a point. The fixed weights let the resampled mean drift with
    # the number of easy copies drawn: a wide interval that even passes 1, the largest TUA there is.
    correct, used = [1] * 4 + [0] * 16, [0] * 4 + [1] * 16
    assert tua_bootstrap_ci(correct, used, seed=3) == (1.0, 1.0, 1.0)
    _, lo, hi = bootstrap_ci(_fixed_weight_scores(correct, used), seed=3)
    assert hi > 1.2 and lo < 0.8
    # each resample's TUA is the formula on the drawn items (same draws: default_rng(seed), one row per resample)
    correct, used = [1, 1, 0, 0, 0, 1, 0, 0, 1, 0], [0, 1, 1, 1, 0, 0, 1, 0, 0, 1]
    draws = np.random.default_rng(5).integers(0, 10, size=(200, 10))
    boot = [tool_usage_accuracy([correct[i] for i in row], [used[i] for i in row]) for row in draws]
    point, lo, hi = tua_bootstrap_ci(correct, used, n_resamples=200, seed=5)
    assert point == pytest.approx(tool_usage_accuracy(correct, used))
    assert (lo, hi) == pytest.approx(tuple(np.quantile(boot, [0.025, 0.975])))


def test_tua_ci_covers_where_the_fixed_weights_do_not():
    from lmlab.core.stats.uncertainty import bootstrap_ci

    # population: 3 of 30 items easy (one answered directly), every hard item with the tool; TUA = ½ · 1/3 + ½ = 2/3.
    # Samples of 30 items from it: the recomputed 95% CI covers 2/3 far more often than the fixed-weight one, whose
    # weights freeze a class size that varies from sample to sample (measured 0.86 vs 0.66 at these seeds)
    pop_c, pop_u = np.array([1] * 3 + [0] * 27, bool), np.array([0, 1, 1] + [1] * 27, bool)
    truth = tool_usage_accuracy(pop_c, pop_u)
    rng = np.random.default_rng(0)
    hits_new = hits_old = 0
    sims = 150
    for s in range(sims):
        i = rng.integers(0, 30, 30)
        _, lo, hi = tua_bootstrap_ci(pop_c[i], pop_u[i], seed=s)
        hits_new += lo <= truth <= hi
        _, lo, hi = bootstrap_ci(_fixed_weight_scores(pop_c[i], pop_u[i]), seed=s)
        hits_old += lo <= truth <= hi
    assert hits_new / sims > 0.8 and hits_old / sims < 0.75


def test_compare_tua_pairs_the_items_and_decides_like_compare():
    perfect_c, perfect_u = [1] * 8 + [0] * 12, [0] * 8 + [1] * 12
    never_c, never_u = [1] * 6 + [0] * 14, [0] * 20  # never calls a tool: TUA 0.5 in every resample
    r = compare_tua(perfect_c, perfect_u, never_c, never_u, seed=1)
    assert (r.effect, r.ci_low, r.ci_high, r.status) == (0.5, 0.5, 0.5, "supported") and r.n == 20
    assert r.p_value < 0.01 and r.mean_a == 1.0 and r.mean_b == 0.5
    assert compare_tua(never_c, never_u, perfect_c, perfect_u, direction="<", seed=1).status == "supported"
    assert compare_tua(never_c, never_u, perfect_c, perfect_u, seed=1).status == "not_supported"
    # the same items for both systems: identical records differ by exactly 0 in every resample
    same = compare_tua(perfect_c, never_u, perfect_c, never_u, seed=2)
    assert (same.ci_low, same.ci_high, same.status, same.p_value) == (0.0, 0.0, "not_supported", 1.0)
    assert compare_tua(perfect_c[:4], perfect_u[:4], never_c[:4], never_u[:4]).status == "inconclusive"  # < min_n
    with pytest.raises(ValueError, match="same items: got 20 for A and 4 for B"):
        compare_tua(perfect_c, perfect_u, never_c[:4], never_u[:4])


def test_experiment_records_tua_and_its_claims_with_the_recomputed_bootstrap():
    from lmlab.config import build_config
    from lmlab.core.stats.seeding import derive_seed
    from lmlab.methods.adaptation.awl import SPEC
    from lmlab.methods.adaptation.awl.experiment import _power, _record_tua, _tua_claims
    from lmlab.runner import RunContext

    cfg = build_config(SPEC.config_class(), {"model": "tiny-llama"})
    ctx = RunContext(SPEC, cfg, show_progress=False)
    perfect_c, perfect_u = [1.0] * 8 + [0.0] * 12, [0.0] * 8 + [1.0] * 12
    always_c = [1.0] * 5 + [0.0] * 15
    per_item = {"awl": {"acc_no_tools": perfect_c, "tool_call_rate": perfect_u},
                "tool_only": {"acc_no_tools": always_c, "tool_call_rate": [1.0] * 20}}  # fmt: skip
    _record_tua(ctx, cfg, ["awl", "tool_only"], per_item)
    row = {m.system: m for m in ctx.metrics if m.metric == "tool_usage_acc"}
    assert (row["awl"].value, row["awl"].ci_low, row["awl"].ci_high, row["awl"].n) == (1.0, 1.0, 1.0, 20)
    assert (row["tool_only"].ci_low, row["tool_only"].ci_high) == (0.5, 0.5)
    (claim,) = _tua_claims(cfg, ["awl", "tool_only"], per_item)
    ref = compare_tua(perfect_c, perfect_u, always_c, [1.0] * 20,
                      seed=derive_seed(cfg.seed, "claim", "awl", "tool_only", "tool_usage_acc"))  # fmt: skip
    got = (claim.metric, claim.baseline, claim.status, claim.null_status)
    assert got == ("tool_usage_acc", "tool_only", "supported", "not_supported")
    assert claim.ci == (ref.ci_low, ref.ci_high) == (0.5, 0.5) and claim.gate
    power = _power(["awl", "tool_only"], per_item)
    assert power["tool_usage_acc:awl>tool_only"] == {"effect": 0.1272, "effect_from": "paper (vs base)",
                                                     "sd_per_item": 0.0, "n_needed": 6, "n_has": 20}  # fmt: skip
    assert power["tool_call_rate:awl<tool_only"]["effect"] == -0.4  # 12 / 20 calls against 20 / 20


def test_tua_influence_gives_the_bootstrap_spread_and_n_for_power():
    rng = np.random.default_rng(0)
    correct = rng.random(400) < 0.35
    used = np.where(correct, rng.random(400) < 0.36, rng.random(400) < 0.69)  # p_easy 0.64, p_hard 0.69
    inf = tua_influence(correct, used)
    assert abs(inf.mean()) < 1e-12
    _, lo, hi = tua_bootstrap_ci(correct, used, n_resamples=2000, seed=0)
    assert inf.std() / np.sqrt(400) == pytest.approx((hi - lo) / (2 * 1.96), rel=0.1)
    # one class empty: the influence of a plain rate
    assert tua_influence([1, 1, 1, 1], [0, 0, 0, 1]) == pytest.approx([0.25, 0.25, 0.25, -0.75])
    # (z_.975 + z_.8)² · sd² / effect² = 7.849 · 0.25 / 0.1272² = 121.3 -> 122 items
    assert n_for_power(0.5, 0.1272) == 122 and n_for_power(0.0, 0.1) == 0
    with pytest.raises(ValueError, match="effect must be non-zero"):
        n_for_power(0.5, 0.0)


def test_metric_and_split_bad_input():
    with pytest.raises(ValueError, match="got 2 no-tool correctness flags but 3 tool-use flags"):
        tool_usage_accuracy([1, 0], [1, 0, 1])
    with pytest.raises(ValueError, match="no records"):
        tool_usage_accuracy([], [])
    with pytest.raises(ValueError, match="got 2 problems but 1 correctness flags"):
        split_easy_hard(["a", "b"], [True])
    assert split_easy_hard(["a", "b", "c"], [True, False, 1.0]) == ([0, 2], [1])


# ----------------------------------------------------------------------------------------------------------------
# ReAct text, the tool executor and the data


def test_react_parse_and_format_round_trip():
    text = "Thought: I need the calculator\nAction: calculator[12*37]\nObservation: 444\nAnswer: 444"
    steps = parse_react(text)
    assert [s.kind for s in steps] == ["thought", "action", "observation", "answer"]
    assert format_react(steps) == text
    assert parse_react("Answer: two\nlines") == [Step("answer", "two\nlines")]
    assert parse_react("hello\nAction: answer_question") == [Step("text", "hello"), Step("action", ANSWER_TOOL)]
    with pytest.raises(ValueError, match="step kind must be"):
        format_react([Step("plan", "x")])


def test_action_detection_and_answer_extraction():
    assert first_action("Action: calculator[1+2]\nObservation:") == ToolCall("calculator", "1+2")
    assert calls_tool("Action: lookup[France, capital]\n")
    assert not calls_tool(f"Action: {ANSWER_TOOL}\n2 + 2 = 4. Answer: 4")
    assert not calls_tool("2 + 2 = 4. Answer: 4")  # no action at all
    assert first_action("Action: ???") is None and not calls_tool("Action: ???")
    assert extract_answer("12 * 37 = 444. Answer: 444.\n") == "444."
    assert extract_answer("Answer: 1\nAnswer: Paris") == "Paris"
    assert extract_answer("  Paris  ") == "Paris"


def test_tool_derived_solutions_are_correct_and_templated():
    from lmlab.data.taskbank import grade

    probs = _problems()
    tools = default_tools()
    obs = observe_all(probs, tools)
    kept, kept_obs = keep_correct(probs, obs, grade)
    assert len(kept) == len(probs)  # every tool output is the gold answer
    assert obs[0] == probs[0].answer
    wkl = make_wkl_data(probs, obs)
    assert wkl[0].setting == "no_tools" and wkl[0].response == f"{probs[0].fact} {obs[0]}. Answer: {obs[0]}"
    assert "calculator" not in wkl[0].response and "Action" not in wkl[0].response  # tool-free
    geo = [w for w, p in zip(wkl, probs) if p.domain == "geography"][0]
    geo_p = [p for p in probs if p.domain == "geography"][0]
    country = geo_p.question.split(" of ", 1)[1].rstrip("?")
    assert geo.response == f"The capital of {country} is {geo_p.answer}. Answer: {geo_p.answer}"
    # a wrong tool output is dropped (the teacher's filter)
    bad = list(obs)
    bad[0] = "0"
    assert len(keep_correct(probs, bad, grade)[0]) == len(probs) - 1


def test_stage2_data_composition_and_tool_only():
    probs = _problems()
    obs = observe_all(probs, default_tools())
    easy, hard = [0, 1], [2, 3, 4, 5, 6, 7, 8]
    data = make_stage2_data(probs, obs, easy, hard, balance="repeat")
    kinds = [d.kind for d in data]
    assert kinds.count("wkl") == len(probs)
    assert kinds.count("direct") == 2 * (7 // 2) and kinds.count("tool") == 7
    assert {d.problem_id for d in data if d.kind == "direct"} == {probs[0].id, probs[1].id}
    assert all(d.setting == "tools" for d in data if d.kind != "wkl")
    plain = make_stage2_data(probs, obs, easy, hard, balance="none")
    assert [d.kind for d in plain].count("direct") == 2
    direct = [d for d in data if d.kind == "direct"][0]
    assert direct.response.startswith(f"Action: {ANSWER_TOOL}\n")
    tool = [d for d in data if d.kind == "tool"][0]
    assert tool.response == f"Action: {probs[2].call}\n{STOP} {obs[2]}\nAnswer: {obs[2]}"
    assert [t for _, t in tool.segments] == [True, False, True]  # the observation is an input
    only = make_tool_only_data(probs, obs)
    assert len(only) == len(probs) and all(d.kind == "tool" for d in only)
    with pytest.raises(ValueError, match="balance must be 'repeat' or 'none', got 'weights'"):
        make_stage2_data(probs, obs, easy, hard, balance="weights")
    with pytest.raises(ValueError, match="easy/hard indices must be in"):
        make_stage2_data(probs, obs, [99], hard)


def test_problem_from_example_rejects_other_tasks():
    from lmlab.data.taskbank import tasks

    ex = tasks("strings", 1, seed=0, split="train", task="reverse", n_choices=0)[0]
    with pytest.raises(ValueError, match="is strings/reverse; expected arithmetic add/sub/mul or geography"):
        problem_from_example(ex)


# ----------------------------------------------------------------------------------------------------------------
# encoding, masking and training on the tiny model


def test_observation_tokens_are_not_targets(tiny_tokenizer):
    tools = default_tools()
    p = _problems()[0]
    ex = tool_example(p, tools.observe(p.call))
    prompt = render_prompt(tiny_tokenizer, "tools", p.question, tools)
    ids, target = encode_segments(tiny_tokenizer, prompt, ex.segments)
    assert len(ids) == len(target) and target[-1] and ids[-1] == tiny_tokenizer.eos_token_id
    n_prompt = target.index(True)
    assert tiny_tokenizer.decode(ids[:n_prompt]).endswith(prompt[-10:])
    target_text = tiny_tokenizer.decode([i for i, t in zip(ids[:-1], target[:-1]) if t])
    assert target_text == f"Action: {p.call}\n{STOP}Answer: {p.answer}"
    masked = tiny_tokenizer.decode([i for i, t in zip(ids[n_prompt:], target[n_prompt:]) if not t])
    assert masked == f" {p.answer}\n"


def test_trace_cache_masks_and_sft_steps_train(tiny_llama, tiny_tokenizer):
    from lmlab.core.training.partial import FrozenTrunk, response_token_logps

    torch.manual_seed(0)
    tools = default_tools()
    probs = _problems(2, 1)
    obs = observe_all(probs, tools)
    exs = make_wkl_data(probs, obs) + make_tool_only_data(probs, obs)
    enc = [encode_segments(tiny_tokenizer, render_prompt(tiny_tokenizer, e.setting, e.question, tools), e.segments)
           for e in exs]  # fmt: skip
    trunk = FrozenTrunk(tiny_llama, 1)
    cache = TraceCache(trunk, enc, groups=[0 if e.kind == "wkl" else 1 for e in exs], pad_id=0)
    # the target mask of every sequence is its flags shifted by one (position t predicts token t + 1)
    for i, (ids, flags) in enumerate(enc):
        g, row = cache.where[i]
        tm = cache.caches[g].tmask[row]
        assert tm[: len(ids) - 1].tolist() == flags[1:] and not tm[len(ids) - 1 :].any()
    # sequences cached later (the direct answers after the split) continue the numbering in a new group
    new = cache.extend(enc[:1], groups=[5])
    assert new == [len(enc)] and cache.n == len(enc) + 1 and cache.where[new[0]][0] == len(cache.caches) - 1
    g, row = cache.where[new[0]]
    assert cache.caches[g].tmask[row, : len(enc[0][0]) - 1].tolist() == enc[0][1][1:]
    policy = trunk.top_k()
    before = copy.deepcopy(policy.state_dict())
    seq = list(range(len(enc)))

    @torch.no_grad()
    def loss_of(tk):
        total = 0.0
        for sub, tm, _ in cache.batches(seq):
            lp = response_token_logps(tk, sub, tm)
            total += float(-(lp.sum() / tm.sum()))
        return total

    l0 = loss_of(policy)
    losses = sft_steps(policy, cache, seq, steps=12, batch=4, lr=3e-3, warmup_ratio=0.1, seed=0)
    assert len(losses) == 12 and loss_of(policy) < l0
    changed = [k for k, v in policy.state_dict().items() if not torch.equal(v, before[k])]
    assert changed  # trained parameters moved
    # stage 2 starts from a copy: training the clone leaves stage 1 as it was, and the head stays shared
    stage1 = copy.deepcopy(policy.state_dict())
    clone = clone_topk(policy)
    assert clone.lm_head is policy.lm_head
    sft_steps(clone, cache, seq[:2], steps=2, batch=2, lr=3e-3, seed=1)
    assert all(torch.equal(v, stage1[k]) for k, v in policy.state_dict().items())
    with pytest.raises(ValueError, match="seq_ids is empty"):
        sft_steps(policy, cache, [], steps=1, batch=1, lr=1e-3)


# ----------------------------------------------------------------------------------------------------------------
# the tool loop


def test_run_with_tools_executes_the_call_and_continues(monkeypatch, tiny_tokenizer):
    import lmlab.core.inference.generation as gen

    seen = []

    class Out:
        def __init__(self, text):
            self.text = text

    def fake_decode(model, tok, prompts, **kw):
        seen.append(list(prompts))
        assert kw["stop_strings"] == (STOP,)
        outs = []
        for p in prompts:
            if p.endswith(f"{STOP} 444\n"):
                outs.append(Out("Answer: 444"))
            elif "direct" in p:
                outs.append(Out(f"Action: {ANSWER_TOOL}\n2 + 2 = 4. Answer: 4"))
            else:
                outs.append(Out("Action: calculator[12*37]\n"))
        return outs

    monkeypatch.setattr(gen, "decode_batch", fake_decode)
    traces = run_with_tools(None, tiny_tokenizer, ["Q: 12*37 ", "Q: direct "], default_tools(), max_turns=2)
    t, d = traces
    assert t.used_tool and t.calls == ["calculator[12*37]"] and t.observations == ["444"] and t.answer == "444"
    assert t.text == f"Action: calculator[12*37]\n{STOP} 444\nAnswer: 444"
    assert not d.used_tool and d.calls == [] and d.answer == "4"
    assert len(seen) == 2 and seen[1] == [f"Q: 12*37 Action: calculator[12*37]\n{STOP} 444\n"]
    # one turn: the call is recorded as tool use but not executed, and the answer is read from the model's text
    one = run_with_tools(None, tiny_tokenizer, ["Q: 12*37 "], default_tools(), max_turns=1)[0]
    assert one.used_tool and one.calls == [] and one.answer == "Action: calculator[12*37]"
    with pytest.raises(ValueError, match="max_turns must be >= 1, got 0"):
        run_with_tools(None, tiny_tokenizer, ["x"], default_tools(), max_turns=0)


def test_tool_errors_reach_the_model_as_observations(monkeypatch, tiny_tokenizer):
    import lmlab.core.inference.generation as gen

    class Out:
        def __init__(self, text):
            self.text = text

    def fake_decode(model, tok, prompts, **kw):
        return [Out("Answer: ?") if STOP in p else Out("Action: calculator[__import__('os')]\n") for p in prompts]

    monkeypatch.setattr(gen, "decode_batch", fake_decode)
    t = run_with_tools(None, tiny_tokenizer, ["Q "], default_tools())[0]
    assert t.observations[0].startswith("Error: calculator: a call is not allowed")


# ----------------------------------------------------------------------------------------------------------------
# config


@pytest.mark.parametrize(
    "kw, needle",
    [({"domains": ["chemistry"]}, "domains entries must be among arithmetic, geography, got 'chemistry'"),
     ({"domains": []}, "domains must be a non-empty list"),
     ({"systems": ["tool_only", "base"]}, "systems must include 'awl'"),
     ({"systems": ["awl"]}, "at least one baseline"),
     ({"systems": ["awl", "gpt4"]}, "systems entries must be among"),
     ({"n_train": 1}, "n_train must be in [2, inf], got 1"),
     ({"stage1_steps": 0}, "stage1_steps must be in [1, inf], got 0"),
     ({"lr": 0.0}, "lr must be in (0.0, 1.0], got 0.0"),
     ({"warmup_ratio": 0.9}, "warmup_ratio must be in [0.0, 0.5], got 0.9"),
     ({"balance": "weights"}, "balance must be one of repeat, none, got 'weights'"),
     ({"max_turns": 0}, "max_turns must be in [1, 4], got 0")],
)  # fmt: skip
def test_config_rejects_bad_values(kw, needle):
    from lmlab.methods.adaptation.awl.config import AWLConfig

    with pytest.raises(ValueError) as e:
        AWLConfig(**kw)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_train_layers_above_the_model_depth_is_refused(tmp_path):
    from lmlab.runner import run_method

    with pytest.raises(ValueError, match="train_layers must be <= 2"):
        run_method("awl", preset="smoke", model="tiny-llama", folder=tmp_path / "r", show_progress=False,
                   raise_errors=True, threads=1, train_layers=5)  # fmt: skip


def test_train_awl_splits_with_the_wkl_model_and_adds_direct_answers_for_easy(monkeypatch, tiny_llama, tiny_tokenizer):
    import lmlab.core.inference.generation as gen
    from lmlab.methods.adaptation.awl.method import train_awl, train_tool_only

    probs = _problems(2, 2)
    seen = {}

    class Out:
        def __init__(self, text):
            self.text = text

    def fake_decode(model, tok, prompts, **kw):
        seen["model"] = model
        # the first two problems answered correctly: they are the easy ones
        return [Out(f"Answer: {probs[i].answer}" if i < 2 else "Answer: ?") for i in range(len(prompts))]

    monkeypatch.setattr(gen, "decode_batch", fake_decode)
    run = train_awl(tiny_llama, tiny_tokenizer, probs, default_tools(), train_layers=1, stage1_steps=2,
                    stage2_steps=2, batch=2, lr=1e-3, seed=0)  # fmt: skip
    assert run.easy == [0, 1] and run.hard == list(range(2, len(probs)))
    # the split was judged by the stage-1 model, not by the base model
    judge = seen["model"]
    assert judge is not tiny_llama
    top = dict(run.wkl.layers[0].named_parameters())
    assert all(torch.equal(p, top[n]) for n, p in judge.model.layers[-1].named_parameters())
    assert not all(torch.equal(p, top[n]) for n, p in tiny_llama.model.layers[-1].named_parameters())
    # direct answers cached for the easy problems only; stage 2 moved away from stage 1
    assert {k for k in run.seq_of if k[1] == "direct"} == {(probs[0].id, "direct"), (probs[1].id, "direct")}
    assert len(run.losses["wkl"]) == 2 and len(run.losses["awl"]) == 2
    assert any(not torch.equal(a, b) for a, b in zip(run.wkl.parameters(), run.awl.parameters()))
    policy, losses = train_tool_only(run, steps=3, batch=2, lr=1e-3)
    assert len(losses) == 3 and policy is not run.awl
    with pytest.raises(ValueError, match="which must be 'awl' or 'wkl', got 'base'"):
        run.full_model(tiny_llama, "base")
