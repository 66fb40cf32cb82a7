"""LoRA-Gen with SmolLM2-135M-Instruct (edge) and Gemma-3-270M (frozen cloud): the claim's direction, trimmed."""

from __future__ import annotations

import pytest

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_claim_direction_on_smollm2_with_gemma_cloud(smollm2, gemma3):
    result = run_method(
        "lora_gen",
        preset="quick",
        write=False,
        show_progress=False,
        raise_errors=True,
        threads=1,
        timing_repeats=2,
        merge_repeats=1,
    )
    systems = ("query_only", "task_prompt", "multitask_lora", "multitask_lora_ctx", "per_task_lora", "lora_gen")
    em = {s: result.metric(s, "em_seen").value for s in systems}
    # the bare query does not say which task is wanted: the untuned edge model answers none of them in format
    assert em["query_only"] < em["task_prompt"]
    # the bare-query multi-task LoRA gives one answer per query shared by k tasks: bounded by ~1/k; the same LoRA
    # with the task prompt in context is not (it is the fair baseline the claim is gated against)
    assert em["multitask_lora"] <= result.metric("multitask_lora", "em_seen_ceiling").value + 1e-9
    assert em["multitask_lora_ctx"] > em["multitask_lora"]
    # the generated, merged LoRA specialises the edge model per task (documented direction at this budget:
    # lora_gen ahead of the bare-query LoRA on the seen tasks)
    assert em["lora_gen"] > em["multitask_lora"]
    assert em["lora_gen"] > em["query_only"]
    gated = [c for c in result.claims if c.gate]
    assert gated and all(c.baseline == "multitask_lora_ctx" for c in gated)
    # the generator routes tasks differently (no expert collapse) and the peft export merges to the same weights
    assert result.metric("lora_gen", "distinct_routings").value > 1
    assert result.metric("lora_gen", "peft_merge_max_abs_diff").value < 1e-5
    # the system prompt is gone from the edge's context: many times fewer tokens
    assert result.metric("lora_gen", "compression_ratio").value > 5
    assert result.metric("lora_gen", "generate_merge_ms").value > 0
    assert {c.metric for c in result.claims} >= {"em_seen", "em_unseen", "latency_ms"}


def test_merged_smollm2_saves_and_loads_back_as_a_model(smollm2, tmp_path):
    import copy

    import torch

    from lmlab.core.inference.models import load_model, save_hf_folder
    from lmlab.methods.compression.lora_gen.edge import target_modules, top_layer_ids
    from lmlab.methods.compression.lora_gen.method import LoRAGenerator, export_peft

    model, tok = smollm2
    edge = copy.deepcopy(model)
    mods = target_modules(edge, top_layer_ids(edge, 2), ["gate_proj", "up_proj", "down_proj"])
    gen = LoRAGenerator(16, {n: tuple(m.weight.shape) for n, m in mods.items()}, seed=0)
    with torch.no_grad():
        for b in gen.B:
            b.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(1))
    gates = gen.gate(torch.randn(1, 5, 16, generator=torch.Generator().manual_seed(2))).gates[0]
    merged = export_peft(edge, gen, gates).merge_and_unload()
    save_hf_folder(merged, tok, tmp_path / "smollm2-lora-gen")
    loaded, loaded_tok = load_model(str(tmp_path / "smollm2-lora-gen"), fresh=True)
    name = gen.module_names[0]
    assert torch.equal(loaded.get_submodule(name).weight, merged.get_submodule(name).weight)
    assert not torch.equal(loaded.get_submodule(name).weight, model.get_submodule(name).weight)
    ids = loaded_tok("France ->", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, merged(ids).logits, atol=1e-3)
