"""The conventional LoRAs LoRA-Gen is compared with, trained on the same batches as its generator
(`training.batch_stream`), on the same edge modules, through the same cached trunks (`edge.EdgeTop`).

- `train_lora`: one conventional (peft) LoRA on the bare query (it cannot know the task: the query is shared by every
  task of its input type).
- `train_lora_ctx`: the same LoRA with the task's system prompt in the edge context (the paper's conventional LoRA:
  the prompt runs once per step through the top blocks, `EdgeTop.answer_logits_with_prefix`, its trunk is cached,
  `cache_prompt_context` -> `PromptContext`).
- `train_lora_per_task`: one peft adapter per task (the oracle), each stepping on its task's share of every batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from lmlab.methods.compression.lora_gen.edge import EdgeTop, Packed, answer_loss, pack
from lmlab.methods.compression.lora_gen.training import TrainLog, _Batch, _fit, _update


def lora_parameters(model: Any, adapter: str | None = None) -> list[nn.Parameter]:
    """The ``lora_`` parameters of a peft-wrapped model: the trainable ones, or every one of `adapter`."""
    if adapter is None:
        return [p for n, p in model.named_parameters() if p.requires_grad and "lora_" in n]
    return [p for n, p in model.named_parameters() if "lora_" in n and n.split(".")[-2] == adapter]


def _no_lora(what: str) -> ValueError:
    return ValueError(f"{what} has no lora_ parameters (wrap it with peft first)")


def _lora_step(
    top: EdgeTop, lr: float, loss_of: Callable[[_Batch, list[int]], torch.Tensor]
) -> tuple[Callable[[_Batch, list[int]], float], TrainLog]:
    """`_fit`'s step and log for the one shared LoRA on `top.model`: an AdamW step per batch on
    ``loss_of(batch, prompt_idx)``. `train_lora` and `train_lora_ctx` differ only in that loss."""
    params = lora_parameters(top.model)
    if not params:
        raise _no_lora("the model")
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    log = TrainLog(opt_steps={"lora": 0})

    def step(batch: _Batch, prompt_idx: list[int]) -> float:
        loss = loss_of(batch, prompt_idx)
        _update(opt, loss)
        log.opt_steps["lora"] += 1
        return float(loss.detach())

    return step, log


def train_lora(
    top: EdgeTop,
    hidden: torch.Tensor,
    packed: Packed,
    task_of: Sequence[int],
    prompts_of_task: dict[int, list[int]],
    *,
    steps: int,
    tasks_per_step: int,
    per_task: int,
    lr: float,
    seed: int = 0,
    on_step: Callable[[int, float], None] | None = None,
) -> TrainLog:
    """Fit the LoRA parameters already on `top.model` (e.g. a peft model's) on the bare queries, with the same
    batches (`batch_stream`), steps and optimiser as `train_generator` (the conventional multi-task LoRA).

    The bare query is shared by every task of its input type, so this LoRA cannot tell those tasks apart: it gives
    one answer per query, and at most one of the k tasks sharing it can be right (the ~1/k ceiling,
    `tasks.bare_query_ceiling`)."""

    def loss_of(batch: _Batch, _: list[int]) -> torch.Tensor:
        rows = [r for _, rs in batch for r in rs]
        sub = packed.subset(rows)
        return answer_loss(top.answer_logits(hidden[rows], sub), sub)

    return _fit(top.model, *_lora_step(top, lr, loss_of), task_of, prompts_of_task, steps=steps,
                tasks_per_step=tasks_per_step, per_task=per_task, seed=seed, on_step=on_step)  # fmt: skip


@dataclass
class PromptContext:
    """Cached trunks of training examples with a system prompt in context (`cache_prompt_context`).

    `prefix`: ``{prompt index: (Tp, d)}`` trunk of each system prompt; `hidden` (M, T, d) and `packed` (M rows):
    the continuations (query + answer + terminator, no BOS: the prompt has it) with that prompt in context;
    `row`: ``{(example index, prompt index): row of hidden / packed}``.
    """

    prefix: dict[int, torch.Tensor]
    hidden: torch.Tensor
    packed: Packed
    row: dict[tuple[int, int], int]

    def batch(
        self, groups: Sequence[tuple[int, Sequence[int]]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Packed]:
        """Inputs of `EdgeTop.answer_logits_with_prefix` for ``[(prompt index, example rows)]``: the prompts
        right-padded (P, Tp, d), their lengths (P,), the owner prompt of each row (B,), the rows' trunks (B, T, d)
        and their `Packed`."""
        prompts = [j for j, _ in groups]
        t_p = max(self.prefix[j].shape[0] for j in prompts)
        d = self.hidden.shape[-1]
        pre = self.hidden.new_zeros(len(prompts), t_p, d)
        for k, j in enumerate(prompts):
            pre[k, : self.prefix[j].shape[0]] = self.prefix[j]
        lens = torch.tensor([self.prefix[j].shape[0] for j in prompts])
        rows = [self.row[(r, j)] for j, rs in groups for r in rs]
        owner = torch.tensor([k for k, (_, rs) in enumerate(groups) for _ in rs])
        return pre, lens, owner, self.hidden[rows], self.packed.subset(rows)


@torch.no_grad()
def cache_prompt_context(
    top: EdgeTop,
    prompts: dict[int, Sequence[int]],
    rows_of_prompt: dict[int, Sequence[int]],
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    pad_id: int,
    stop_id: int,
) -> PromptContext:
    """Trunks of every example ``pairs[r]`` (query ids without BOS, answer ids) behind each system prompt
    ``prompts[j]`` (token ids, with BOS) for r in ``rows_of_prompt[j]`` (the prompt's task's examples)."""
    order = [(r, j) for j in prompts for r in rows_of_prompt[j]]
    packed = pack([pairs[r] for r, _ in order], pad_id, stop_id)
    prefix, parts, start = {}, [], 0
    for j, ids in prompts.items():
        n = len(rows_of_prompt[j])
        if not n:
            continue
        width = int(packed.pos_t[(packed.pos_b >= start) & (packed.pos_b < start + n)].max()) + 2
        prefix[j], h = top.trunk_with_prefix(ids, packed.ids[start : start + n, :width])  # no all-pad columns
        parts.append(F.pad(h, (0, 0, 0, packed.ids.shape[1] - width)))  # (n, T, d), zeros where padding
        start += n
    return PromptContext(prefix, torch.cat(parts), packed, {o: m for m, o in enumerate(order)})


def train_lora_ctx(
    top: EdgeTop,
    context: PromptContext,
    task_of: Sequence[int],
    prompts_of_task: dict[int, list[int]],
    *,
    steps: int,
    tasks_per_step: int,
    per_task: int,
    lr: float,
    seed: int = 0,
    on_step: Callable[[int, float], None] | None = None,
) -> TrainLog:
    """Fit the LoRA on `top.model` with each task's system prompt in context (the paper's conventional LoRA, which
    sees the task description the generator sees): the same batches as `train_generator`, including the prompt
    variant of each task, so the two differ only in where the prompt goes (edge context vs generated weights).

    Each step runs every prompt of the batch once through the top blocks and its examples as continuations
    (`EdgeTop.answer_logits_with_prefix`); the gradient flows through the prompt's keys and values too."""

    def loss_of(batch: _Batch, prompt_idx: list[int]) -> torch.Tensor:
        pre, lens, owner, hidden, sub = context.batch([(j, rs) for (_, rs), j in zip(batch, prompt_idx)])
        return answer_loss(top.answer_logits_with_prefix(pre, lens, owner, hidden, sub), sub)

    return _fit(top.model, *_lora_step(top, lr, loss_of), task_of, prompts_of_task, steps=steps,
                tasks_per_step=tasks_per_step, per_task=per_task, seed=seed, on_step=on_step)  # fmt: skip


def train_lora_per_task(
    peft_model: Any,
    top: EdgeTop,
    hidden: torch.Tensor,
    packed: Packed,
    task_of: Sequence[int],
    prompts_of_task: dict[int, list[int]],
    adapters: dict[int, str],
    *,
    steps: int,
    tasks_per_step: int,
    per_task: int,
    lr: float,
    seed: int = 0,
    on_step: Callable[[int, float], None] | None = None,
) -> TrainLog:
    """One LoRA per task (the oracle: it is chosen by the task, so it knows the task without any prompt).

    The multi-task budget split by task: the same batches as `train_lora` (`batch_stream`), and each task's
    adapter ``adapters[task]`` (peft, one per task on `peft_model`, own AdamW) takes one step on exactly the
    examples of its task in each batch. Every system thus sees the same examples, as often, with the same forward
    / backward tokens; a task's adapter takes as many optimiser steps as its task is drawn (about
    ``steps * tasks_per_step / n_tasks``), each on ``per_task`` examples."""
    opts = {}
    for t, name in adapters.items():
        params = lora_parameters(peft_model, name)
        if not params:
            raise _no_lora(f"adapter {name!r}")
        opts[t] = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    log = TrainLog(opt_steps={name: 0 for name in adapters.values()})

    def step(batch: _Batch, _: list[int]) -> float:
        total, weight = 0.0, 0
        for t, rs in batch:
            if t not in adapters:
                raise ValueError(f"task {t} has no adapter; adapters cover tasks {sorted(adapters)}")
            peft_model.set_adapter(adapters[t])  # active and trainable; the other adapters are frozen and off
            sub = packed.subset(rs)
            loss = answer_loss(top.answer_logits(hidden[rs], sub), sub)
            _update(opts[t], loss)
            log.opt_steps[adapters[t]] += 1
            total += float(loss.detach()) * len(sub.target)
            weight += len(sub.target)
        return total / max(weight, 1)  # the batch's mean answer CE, as the shared LoRAs log it

    return _fit(top.model, step, log, task_of, prompts_of_task, steps=steps, tasks_per_step=tasks_per_step,
                per_task=per_task, seed=seed, on_step=on_step)  # fmt: skip


def lora_params_per_rank(shapes: dict[str, tuple[int, int]]) -> int:
    """Parameters of a rank-1 LoRA on these modules: sum of (in + out)."""
    return sum(o + i for o, i in shapes.values())


__all__ = [
    "PromptContext",
    "cache_prompt_context",
    "lora_parameters",
    "lora_params_per_rank",
    "train_lora",
    "train_lora_ctx",
    "train_lora_per_task",
]
