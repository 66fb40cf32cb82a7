"""Invariants of LoRA-Gen on the tiny random llama (edge) and gemma (cloud)."""

from __future__ import annotations

import copy

import pytest
import torch

from lmlab.methods.compression.lora_gen.baselines import (
    cache_prompt_context,
    lora_parameters,
    train_lora,
    train_lora_ctx,
    train_lora_per_task,
)
from lmlab.methods.compression.lora_gen.edge import (
    EdgeTop,
    Packed,
    answer_loss,
    pack,
    score_logits,
    score_with_prefix,
    stop_token_ids,
    target_modules,
    top_layer_ids,
)
from lmlab.methods.compression.lora_gen.method import (
    LoRAGenerator,
    MixtureHooks,
    export_peft,
    keep_top_k_softmax,
    merge_deltas,
    train_generator,
    unmerge,
)
from lmlab.methods.compression.lora_gen.tasks import build_tasks, system_prompt, task_names
from lmlab.methods.compression.lora_gen.training import batch_stream

TARGETS = ["gate_proj", "up_proj", "down_proj"]
PROMPTS = ["Given a word, reply with its first letter.\nplanet -> p\n", "Given a country, reply with its continent.\n"]


@pytest.fixture()
def edge(tiny_llama):
    return copy.deepcopy(tiny_llama)  # private: weights are merged in place


def _generator(model, *, n_experts=4, rank=2, top_k=2, seed=0, random_b=True):
    mods = target_modules(model, top_layer_ids(model, 2), TARGETS)
    gen = LoRAGenerator(
        32, {n: tuple(m.weight.shape) for n, m in mods.items()}, n_experts=n_experts, rank=rank, top_k=top_k, seed=seed
    )
    if random_b:  # B starts at 0 (Delta W = 0); give it values so the equalities below are not trivially 0 = 0
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for b in gen.B:
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)
    return gen


def _cloud(batch=3, width=7, dim=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(batch, width, dim, generator=g)
    mask = torch.ones(batch, width, dtype=torch.bool)
    mask[0, 5:] = False
    return states, mask


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_keep_top_k_softmax_sums_to_one_with_exactly_k_entries():
    logits = torch.randn(5, 3, 8, generator=torch.Generator().manual_seed(0))
    for k in (1, 2, 8):
        g = keep_top_k_softmax(logits, k)
        assert torch.allclose(g.sum(-1), torch.ones(5, 3))
        assert (g.gt(0).sum(-1) == k).all()
        # the kept entries are the k largest logits, and their ratio is exp(logit difference) (a softmax over them)
        kept = g.gt(0)
        assert (
            logits.masked_fill(~kept, float("inf")).amin(-1) >= logits.masked_fill(kept, -float("inf")).amax(-1)
        ).all()
    g = keep_top_k_softmax(torch.tensor([[0.0, 1.0, 3.0]]), 2)
    assert torch.allclose(g, torch.tensor([[0.0, 1 / (1 + torch.e**2), torch.e**2 / (1 + torch.e**2)]]))
    with pytest.raises(ValueError, match="k must be"):
        keep_top_k_softmax(logits, 9)


def test_generator_output_shapes_and_gate_properties(edge):
    gen = _generator(edge, n_experts=4, rank=2, top_k=2)
    states, mask = _cloud()
    out = gen.gate(states, mask)
    assert out.gates.shape == (3, 2, 4) and out.logits.shape == (3, 2, 4)
    assert torch.allclose(out.gates.sum(-1), torch.ones(3, 2)) and (out.gates.gt(0).sum(-1) == 2).all()
    deltas = gen.deltas(out.gates[0])
    assert list(deltas) == gen.module_names and len(deltas) == 2 * len(TARGETS)
    for name, d in deltas.items():
        assert d.shape == edge.get_submodule(name).weight.shape
    # noise only when training, and seeded
    a = gen.gate(states, mask, noisy=True, generator=torch.Generator().manual_seed(3)).logits
    b = gen.gate(states, mask, noisy=True, generator=torch.Generator().manual_seed(3)).logits
    assert torch.equal(a, b) and not torch.equal(a, out.logits)
    # padding is ignored: appending masked junk to a prompt does not change its gates
    longer = torch.cat([states, torch.randn(3, 4, 32) * 50], 1)
    longer_mask = torch.cat([mask, torch.zeros(3, 4, dtype=torch.bool)], 1)
    assert torch.allclose(gen.gate(longer, longer_mask).gates, out.gates, atol=1e-6)
    with pytest.raises(ValueError, match="gates must have shape"):
        gen.deltas(out.gates)


def test_zero_mixture_is_the_base_model_exactly(edge, tiny_tokenizer):
    gen = _generator(edge)
    ids = tiny_tokenizer("France -> Europe", return_tensors="pt").input_ids
    before_w, before = _weights(edge), edge(ids).logits
    originals = merge_deltas(edge, gen.deltas(torch.zeros(gen.n_layers, gen.n_experts)))
    after_w = _weights(edge)
    assert all(torch.equal(before_w[k], after_w[k]) for k in before_w)
    assert torch.equal(edge(ids).logits, before)
    unmerge(edge, originals)


def test_merged_weights_are_base_plus_scaled_sum_of_expert_products(edge):
    gen = _generator(edge, n_experts=4, rank=2, top_k=2)
    gates = gen.gate(*_cloud()).gates[1]
    base = _weights(edge)
    originals = merge_deltas(edge, gen.deltas(gates))
    for j, name in enumerate(gen.module_names):
        layer = gen.module_layer[j]
        expected = base[name + ".weight"].clone()
        for i in range(gen.n_experts):  # W + (alpha / r) sum_i g_i B_i A_i, expert by expert
            expected += gen.scale * gates[layer, i] * (gen.B[j][i] @ gen.A[j][i])
        assert torch.allclose(edge.get_submodule(name).weight, expected, atol=1e-6)
        # not the separately mixed (sum g_i B_i)(sum g_i A_i) (peft's "linear" combination)
        wrong = (
            gen.scale
            * torch.einsum("n,nor->or", gates[layer], gen.B[j])
            @ torch.einsum("n,nri->ri", gates[layer], gen.A[j])
        )
        assert not torch.allclose(edge.get_submodule(name).weight - base[name + ".weight"], wrong, atol=1e-6)
    unmerge(edge, originals)


def test_merge_then_unmerge_restores_weights_bit_for_bit(edge):
    gen = _generator(edge)
    base = _weights(edge)
    gates = gen.gate(*_cloud()).gates
    for t in range(3):  # several tasks in a row, as in the experiment's evaluation loop
        originals = merge_deltas(edge, gen.deltas(gates[t]))
        assert any(not torch.equal(base[n + ".weight"], edge.get_submodule(n).weight) for n in gen.module_names)
        unmerge(edge, originals)
    assert all(torch.equal(v, edge.state_dict()[k]) for k, v in base.items())


def test_merged_forward_equals_unmerged_mixture_forward(edge, tiny_tokenizer):
    gen = _generator(edge)
    gates = gen.gate(*_cloud()).gates
    ids = tiny_tokenizer(["planet -> p", "France -> [Europe]"], return_tensors="pt", padding=True).input_ids
    with torch.no_grad(), MixtureHooks(edge, gen) as hooks:
        hooks.gates = gates[:2]  # per-example gates: row 0 task 0, row 1 task 1
        unmerged = edge(ids).logits
    for row in range(2):
        originals = merge_deltas(edge, gen.deltas(gates[row]))
        with torch.no_grad():
            merged = edge(ids[row : row + 1]).logits
        unmerge(edge, originals)
        assert torch.allclose(merged, unmerged[row : row + 1], atol=1e-4)


def test_peft_cat_export_merges_to_the_same_weights_and_unloads(edge, tiny_tokenizer):
    gen = _generator(edge)
    gates = gen.gate(*_cloud()).gates[2]
    base = _weights(edge)
    peft_model = export_peft(copy.deepcopy(edge), gen, gates)
    lora = peft_model.base_model.model.get_submodule(gen.module_names[0])
    assert lora.r["lora_gen"] == gen.top_k * gen.rank and lora.scaling["lora_gen"] == pytest.approx(gen.scale)
    ids = tiny_tokenizer("planet ->", return_tensors="pt").input_ids
    with torch.no_grad():
        unmerged_peft = peft_model(ids).logits
        merged = peft_model.merge_and_unload()
    originals = merge_deltas(edge, gen.deltas(gates))
    for name in gen.module_names:
        assert torch.allclose(merged.get_submodule(name).weight, edge.get_submodule(name).weight, atol=1e-6)
    with torch.no_grad():
        assert torch.allclose(edge(ids).logits, unmerged_peft, atol=1e-4)
    unmerge(edge, originals)
    # peft's merge/unmerge toggle gives the base weights back (within float tolerance)
    again = export_peft(copy.deepcopy(edge), gen, gates)
    again.merge_adapter()
    again.unmerge_adapter()
    restored = again.unload()
    for name in gen.module_names:
        assert torch.allclose(restored.get_submodule(name).weight, base[name + ".weight"], atol=1e-6)


def test_merged_model_saves_as_an_hf_folder_that_load_model_reads(edge, tiny_tokenizer, tmp_path):
    from lmlab.core.inference.models import load_model, save_hf_folder

    gen = _generator(edge)
    gates = gen.gate(*_cloud()).gates[0]
    merged = export_peft(copy.deepcopy(edge), gen, gates).merge_and_unload()
    save_hf_folder(merged, tiny_tokenizer, tmp_path / "merged")
    loaded, tok = load_model(str(tmp_path / "merged"), fresh=True)
    ids = tok("planet ->", return_tensors="pt").input_ids
    assert not any("lora" in k for k in loaded.state_dict())
    for name in gen.module_names:  # the merged weights round-trip exactly
        assert torch.equal(loaded.get_submodule(name).weight, merged.get_submodule(name).weight)
    with torch.no_grad():  # (the folder loads with sdpa attention, the tiny model was built with eager)
        assert torch.allclose(loaded(ids).logits, merged(ids).logits, atol=1e-4)


def test_edge_top_on_cached_trunk_equals_the_full_forward(tiny_llama, tiny_tokenizer):
    from lmlab.core.inference.tiny import make_tiny_llama

    model = make_tiny_llama(seed=1, n_layers=4)
    pairs = [
        (tiny_tokenizer("France ->")["input_ids"], tiny_tokenizer(" Europe", add_special_tokens=False)["input_ids"])
    ]
    pairs.append(
        (tiny_tokenizer("planet ->")["input_ids"], tiny_tokenizer(" p", add_special_tokens=False)["input_ids"])
    )
    packed = pack(pairs, pad_id=0, stop_id=tiny_tokenizer("\n")["input_ids"][-1])
    assert packed.target.tolist()[: len(pairs[0][1]) + 1] == pairs[0][1] + [packed.ids[0, len(sum(pairs[0], []))]]
    top = EdgeTop(model, 2)
    assert top.start == 2 and top.top_ids == [2, 3]
    with torch.no_grad():
        cached = top.answer_logits(top.trunk(packed.ids), packed)
        full = model(packed.ids).logits[packed.pos_b, packed.pos_t]
    assert torch.allclose(cached, full, atol=1e-4)
    # the whole model as "top" (n_top >= layers) works too: the trunk is the embedding output
    all_top = EdgeTop(model, 10)
    with torch.no_grad():
        assert torch.allclose(all_top.answer_logits(all_top.trunk(packed.ids), packed), full, atol=1e-4)


def test_greedy_exact_match_and_prefix_scoring(tiny_llama, tiny_tokenizer):
    stops = stop_token_ids(tiny_tokenizer)
    newline = tiny_tokenizer("\n")["input_ids"][-1]
    assert newline in stops and tiny_tokenizer.eos_token_id in stops
    prefix = tiny_tokenizer("Reply with the first letter.\n")["input_ids"]
    pairs = [(tiny_tokenizer("planet ->")["input_ids"], tiny_tokenizer(" p")["input_ids"])]
    packed = pack(pairs, 0, newline)
    joint = pack([(prefix + p, a) for p, a in pairs], 0, newline)
    with torch.no_grad():
        logits = tiny_llama(joint.ids).logits[joint.pos_b, joint.pos_t]
        one_pass = score_logits(logits, joint, stops)
        shared = score_with_prefix(tiny_llama, prefix, packed, stops)
    assert shared.exact == one_pass.exact and shared.nll == pytest.approx(one_pass.nll, abs=1e-4)
    # exact match is all-or-nothing: the argmax itself as the answer scores 1
    pred = logits.argmax(-1)
    forced = Packed(joint.ids, joint.pos_b, joint.pos_t, pred.clone(), joint.is_stop, joint.prompt_len)
    forced.target[forced.is_stop] = newline
    score = score_logits(logits, forced, stops | {int(pred[-1])})
    assert score.exact == [1.0] and score.predicted == [pred[:-1].tolist()]


def test_training_changes_the_trainable_parameters_and_only_them(edge, tiny_tokenizer, tiny_gemma):
    gen = _generator(edge, random_b=False)
    gen.cloud_norm = torch.nn.LayerNorm(32, elementwise_affine=False)
    pairs = [
        (tiny_tokenizer(q)["input_ids"], tiny_tokenizer(a, add_special_tokens=False)["input_ids"])
        for q, a in [("planet ->", " p"), ("France ->", " Europe"), ("garden ->", " g"), ("Peru ->", " South America")]
    ]
    packed = pack(pairs, 0, tiny_tokenizer("\n")["input_ids"][-1])
    top = EdgeTop(edge, 2)
    hidden = top.trunk(packed.ids)
    states, mask = _cloud(batch=2)
    gen.set_cloud_stats(states, mask)
    before, edge_before = {k: v.clone() for k, v in gen.state_dict().items()}, _weights(edge)
    log = train_generator(
        gen, top, hidden, packed, [0, 1, 0, 1], states, mask, {0: [0], 1: [1]},
        steps=3, tasks_per_step=2, per_task=2, lr=1e-2, balance_weight=0.1,
    )  # fmt: skip
    assert len(log.loss) == 3 and all(torch.isfinite(torch.tensor(log.loss)))
    changed = {k for k, v in gen.state_dict().items() if not torch.equal(v, before[k])}
    assert {"B.0", "A.0", "router", "meta_queries", "k_proj.weight", "pool_proj.weight"} <= changed
    assert not {"cloud_mean", "cloud_std"} & changed  # fixed statistics, not trained
    assert all(torch.equal(v, edge.state_dict()[k]) for k, v in edge_before.items())  # the edge stays frozen
    assert all(p.requires_grad for p in edge.parameters())  # and its flags are restored


def test_balance_loss_penalises_collapse():
    gen = LoRAGenerator(8, {"model.layers.0.mlp.up_proj": (4, 4)}, n_experts=4, rank=1, top_k=1)
    uniform = torch.eye(4)[:, None, :]  # four tasks, one expert each
    collapsed = torch.zeros(4, 1, 4)
    collapsed[:, 0, 0] = 1.0
    assert float(gen.balance_loss(uniform)) == pytest.approx(0.0) and float(gen.balance_loss(collapsed)) == 3.0


def test_tasks_split_queries_and_hold_out_whole_tasks():
    from lmlab import data

    tasks = build_tasks(
        lambda s, n, split, task: data.load(s, n, seed=0, split=split, task=task),
        ["continent", "uppercase"],
        ["plain", "upper", "bracket"],
        ["continent/upper"],
        n_train=6,
        n_test=4,
        n_shots=2,
        n_variants=2,
    )
    assert [t.name for t in tasks] == task_names(["continent", "uppercase"], ["plain", "upper", "bracket"])
    assert "uppercase/upper" not in [t.name for t in tasks]
    for t in tasks:
        assert {i.query for i in t.train}.isdisjoint({i.query for i in t.test})
        assert t.seen == (t.name != "continent/upper") and len(t.prompts) == 2 and t.prompts[0] != t.prompts[1]
        assert t.prompts[0].startswith(t.description) and t.prompts[0].endswith("\n")
    bracket = next(t for t in tasks if t.name == "continent/bracket")
    assert all(i.answer.startswith("[") and i.answer.endswith("]") for i in bracket.test)
    # the bare query does not name the task: the same countries appear in every continent task
    assert [i.query for i in tasks[0].test] == [i.query for i in bracket.test]
    assert system_prompt("continent", "upper", []).count("\n") == 1
    with pytest.raises(ValueError, match="unseen_tasks"):
        build_tasks(lambda *a, **k: [], ["continent"], ["plain"], ["capital/plain"], n_train=1, n_test=1, n_shots=0,
                    n_variants=1)  # fmt: skip


def test_config_validation():
    from lmlab.methods.compression.lora_gen.config import LoRAGenConfig

    cfg = LoRAGenConfig()
    assert cfg.n_experts == 8 and cfg.top_k == 2 and cfg.cloud_model == "gemma3-270m"
    for kw, message in [
        ({"top_k": 9}, "top_k"),
        ({"rank": 0}, "rank"),
        ({"relations": ["weather"]}, "relations"),
        ({"unseen_tasks": ["capital/italic"]}, "unseen_tasks"),
        ({"lr": 0.0}, "lr"),
        ({"mode": "paper"}, "mode"),
        ({"targets": []}, "targets"),
    ]:
        with pytest.raises(ValueError, match=message):
            LoRAGenConfig(**kw)


# -- the baselines: prompt-in-context LoRA, bare-query LoRA, per-task LoRA ------------------------------------------


def _peft(model, r=4, adapter="default", seed=0, random_b=False):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    cfg = LoraConfig(r=r, lora_alpha=2 * r, target_modules=TARGETS, layers_to_transform=top_layer_ids(model, 2),
                     lora_dropout=0.0, init_lora_weights=not random_b)  # fmt: skip
    return get_peft_model(model, cfg, adapter_name=adapter), cfg


def _prefix_setup(tok):
    prompts = {
        0: tok("Reply with the first letter.\nplanet -> p\n")["input_ids"],
        1: tok("Reply with the continent.\n")["input_ids"],
    }
    pairs = [
        (tok(q, add_special_tokens=False)["input_ids"], tok(a, add_special_tokens=False)["input_ids"])
        for q, a in [("planet ->", " p"), ("France ->", " Europe"), ("garden ->", " g"), ("Peru ->", " South America")]
    ]
    return prompts, pairs, tok("\n")["input_ids"][-1]


@pytest.mark.parametrize("n_top", [2, 4])
def test_shared_prefix_top_pass_equals_the_full_forward_with_the_prompt(tiny_tokenizer, n_top):
    """Logits AND LoRA gradients of the cached-trunk, prompt-once path equal the plain forward of prompt + query:
    the prompt-in-context LoRA is trained on exactly what it is evaluated on (`score_with_prefix`)."""
    from lmlab.core.inference.tiny import make_tiny_llama

    model = make_tiny_llama(seed=1, n_layers=4)
    peft_model, _ = _peft(model, random_b=True)  # B != 0: the LoRA changes the prompt's keys / values
    prompts, pairs, nl = _prefix_setup(tiny_tokenizer)
    top = EdgeTop(model, n_top)
    context = cache_prompt_context(top, prompts, {0: [0, 2], 1: [1, 3]}, pairs, 0, nl)
    groups = [(1, [3, 1, 3]), (0, [2])]  # a repeated example, prompts of different lengths
    pre, lens, owner, hidden, sub = context.batch(groups)
    assert pre.shape[0] == 2 and lens.tolist() == [len(prompts[1]), len(prompts[0])] and owner.tolist() == [0, 0, 0, 1]
    params = lora_parameters(model)
    loss = answer_loss(top.answer_logits_with_prefix(pre, lens, owner, hidden, sub), sub)
    got_grads = torch.autograd.grad(loss, params)
    got = top.answer_logits_with_prefix(pre, lens, owner, hidden, sub).detach()
    full = pack([(prompts[j] + pairs[r][0], pairs[r][1]) for j, rs in groups for r in rs], 0, nl)
    logits = model(full.ids).logits[full.pos_b, full.pos_t]
    ref_grads = torch.autograd.grad(answer_loss(logits, full), params)
    assert torch.allclose(got, logits.detach(), atol=1e-4)
    assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-3) for a, b in zip(got_grads, ref_grads))
    # the prompt matters: the same queries behind the other prompt give other logits
    other = top.answer_logits_with_prefix(pre.flip(0), lens.flip(0), owner, hidden, sub).detach()
    assert not torch.allclose(other, got, atol=1e-3)


def test_packed_subset_keeps_every_occurrence_of_a_repeated_row(tiny_tokenizer):
    _, pairs, nl = _prefix_setup(tiny_tokenizer)
    packed = pack(pairs, 0, nl)
    once = packed.subset([1])
    twice = packed.subset([1, 1])
    assert twice.n == 2 and len(twice.target) == 2 * len(once.target)
    assert twice.pos_b.tolist() == [0] * len(once.target) + [1] * len(once.target)
    assert torch.equal(twice.target, once.target.repeat(2))
    # unique rows: unchanged behaviour, rows in the requested order
    swapped = packed.subset([2, 0])
    assert torch.equal(swapped.ids, packed.ids[[2, 0]])
    assert sorted(swapped.target[swapped.pos_b == 1].tolist()) == sorted(packed.target[packed.pos_b == 0].tolist())


def test_bare_query_ceiling_is_one_over_the_tasks_sharing_a_query():
    from lmlab import data
    from lmlab.methods.compression.lora_gen.tasks import bare_query_ceiling

    assert bare_query_ceiling([("a", "x"), ("a", "y"), ("a", "z"), ("b", "x")]) == pytest.approx(2 / 4)
    assert bare_query_ceiling([("a", "x"), ("a", "x"), ("a", "z")]) == pytest.approx(2 / 3)  # equal answers count
    tasks = build_tasks(lambda s, n, split, task: data.load(s, n, seed=0, split=split, task=task), ["continent"],
                        ["plain", "upper", "bracket"], [], n_train=2, n_test=4, n_shots=1, n_variants=1)  # fmt: skip
    assert bare_query_ceiling([(i.query, i.answer) for t in tasks for i in t.test]) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="at least one"):
        bare_query_ceiling([])


def _budget_setup(tok):
    prompts, pairs, nl = _prefix_setup(tok)
    pairs = pairs + [(tok("Chad ->", add_special_tokens=False)["input_ids"],
                      tok(" Africa", add_special_tokens=False)["input_ids"])]  # fmt: skip
    task_of = [0, 1, 0, 1, 2]  # three tasks; task 2 has one example (drawn with repetition)
    prompts[2] = tok("Reply with the continent in brackets.\n")["input_ids"]
    prompts_of_task = {0: [0], 1: [1], 2: [2]}
    bos = tok("")["input_ids"]  # the bare query starts the sequence (the prompts carry it otherwise)
    bare = pack([(bos + q, a) for q, a in pairs], 0, nl)
    return prompts, pairs, nl, task_of, prompts_of_task, bare


def test_every_trained_system_gets_the_same_batches_steps_and_parameters(edge, tiny_tokenizer):
    import copy as _copy

    prompts, pairs, nl, task_of, prompts_of_task, bare = _budget_setup(tiny_tokenizer)
    kw = dict(steps=4, tasks_per_step=2, per_task=2, lr=1e-2, seed=3)
    # bare-query multi-task LoRA
    m1 = _copy.deepcopy(edge)
    _peft(m1)
    top1 = EdgeTop(m1, 2)
    log_bare = train_lora(top1, top1.trunk(bare.ids), bare, task_of, prompts_of_task, **kw)
    # the prompt-in-context LoRA: same rank, same batches
    m2 = _copy.deepcopy(edge)
    _peft(m2)
    top2 = EdgeTop(m2, 2)
    before = [p.detach().clone() for p in lora_parameters(m2)]
    context = cache_prompt_context(top2, prompts, {j: [r for r, t in enumerate(task_of) if t == j] for j in prompts},
                                   pairs, 0, nl)  # fmt: skip
    log_ctx = train_lora_ctx(top2, context, task_of, prompts_of_task, **kw)
    assert any(not torch.equal(a, b) for a, b in zip(before, lora_parameters(m2)))
    # one LoRA per task
    m3 = _copy.deepcopy(edge)
    peft3, cfg3 = _peft(m3, adapter="t0")
    for t in (1, 2):
        peft3.add_adapter(f"t{t}", cfg3)
    top3 = EdgeTop(m3, 2)
    adapters = {t: f"t{t}" for t in (0, 1, 2)}
    before3 = {n: [p.detach().clone() for p in lora_parameters(peft3, n)] for n in adapters.values()}
    log_pt = train_lora_per_task(peft3, top3, top3.trunk(bare.ids), bare, task_of, prompts_of_task, adapters, **kw)

    # the same examples in the same steps, for every system (LoRA-Gen's generator uses the same stream)
    stream = list(batch_stream(task_of, prompts_of_task, steps=4, tasks_per_step=2, per_task=2, seed=3))
    expected = [[r for _, rs in batch for r in rs] for batch, _ in stream]
    assert log_bare.rows == log_ctx.rows == log_pt.rows == expected
    assert log_bare.examples == log_ctx.examples == log_pt.examples == 4 * 2 * 2
    assert log_bare.opt_steps == {"lora": 4} and log_ctx.opt_steps == {"lora": 4}
    drawn = {t: sum(t == bt for batch, _ in stream for bt, _ in batch) for t in adapters}
    assert log_pt.opt_steps == {adapters[t]: drawn[t] for t in adapters} and sum(drawn.values()) == 4 * 2
    # same parameter count per served model: each task's adapter = the multi-task LoRA
    n_multi = sum(p.numel() for p in lora_parameters(m1))
    assert n_multi == sum(p.numel() for p in lora_parameters(m2))
    assert all(sum(p.numel() for p in lora_parameters(peft3, n)) == n_multi for n in adapters.values())
    # an adapter changes only when its task is drawn (each is trained on its own task's examples only)
    for t, name in adapters.items():
        changed = any(not torch.equal(a, b) for a, b in zip(before3[name], lora_parameters(peft3, name)))
        assert changed == (drawn[t] > 0)


def test_experiment_gates_against_the_prompt_in_context_lora_with_one_budget():
    from lmlab.runner import run_method

    r = run_method("lora_gen", preset="smoke", model="tiny-llama", write=False, plots=False, show_progress=False,
                   raise_errors=True, threads=1)  # fmt: skip
    cfg = r.config
    value = {(m.system, m.metric): m for m in r.metrics}
    systems = ("query_only", "task_prompt", "multitask_lora", "multitask_lora_ctx", "per_task_lora", "lora_gen")
    assert all((s, "em_seen") in value for s in systems)
    gated = [c for c in r.claims if c.gate]
    assert {c.metric for c in gated} == {"em_seen", "em_unseen", "latency_ms"}
    assert all(c.method == "lora_gen" and c.baseline == "multitask_lora_ctx" for c in gated)
    reported = {c.baseline for c in r.claims if not c.gate}
    assert {"multitask_lora", "per_task_lora"} <= reported
    # the fair baseline has the prompt in context, as the prompt-in-context base model does
    assert value[("multitask_lora_ctx", "context_tokens")].value == value[("task_prompt", "context_tokens")].value
    assert value[("multitask_lora_ctx", "context_tokens")].value > value[("lora_gen", "context_tokens")].value
    # one budget: same examples, same optimiser steps (summed over the per-task adapters), same rank / parameters
    trained = ("lora_gen", "multitask_lora", "multitask_lora_ctx", "per_task_lora")
    n_examples = cfg["steps"] * cfg["tasks_per_step"] * cfg["examples_per_task"]
    assert all(value[(s, "train_examples")].value == n_examples for s in trained)
    n_seen = 2 * 2 - len(cfg["unseen_tasks"])
    for s in ("lora_gen", "multitask_lora", "multitask_lora_ctx"):
        assert value[(s, "optimizer_steps")].value == cfg["steps"]
    assert value[("per_task_lora", "optimizer_steps")].value == cfg["steps"] * min(cfg["tasks_per_step"], n_seen)
    n_multi = value[("multitask_lora", "trainable_params")].value
    assert value[("multitask_lora_ctx", "trainable_params")].value == n_multi
    assert value[("per_task_lora", "trainable_params_per_task")].value == n_multi
    assert value[("per_task_lora", "trainable_params")].value == n_seen * n_multi
    assert value[("multitask_lora_ctx", "rank")].value == value[("multitask_lora", "rank")].value
    assert n_multi >= value[("lora_gen", "trainable_params")].value
    # the bare LoRA's ceiling is computed, and it bounds it; timing values carry a timing unit
    assert value[("multitask_lora", "em_seen")].value <= value[("multitask_lora", "em_seen_ceiling")].value + 1e-9
    for (s, m), row in value.items():
        if m in ("latency_ms", "generate_merge_ms", "cloud_forward_ms", "generate_merge_ms_per_query"):
            assert row.unit == "ms", (s, m)
        if m.endswith("_s"):
            assert row.unit == "s", (s, m)
    assert "speedup_vs_multitask_lora_ctx" in r.flags["timing"]
