"""The training protocol shared by every trained system: LoRA-Gen's generator (`method.train_generator`) and the
conventional LoRAs (`baselines.py`).

One seeded stream of batches (`batch_stream`: per step, `tasks_per_step` tasks, `per_task` examples of each and one
system-prompt variant per task, drawn by `sample_step`), the loop over it (`_fit`: one optimiser step or more per
batch, logged) and its record (`TrainLog`). The same `seed` gives every system the very same examples in the same
steps, so the systems differ only in what they train and where the task description goes.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn as nn


@dataclass
class TrainLog:
    """What a training run did: loss per step (answer cross-entropy; the balance term for LoRA-Gen), the example
    rows of every step's batch (`rows`, the same for every trained system: `batch_stream`), optimiser steps per
    trained parameter set (`opt_steps`: one entry for a shared model, one per adapter for per-task LoRAs), wall s."""

    loss: list[float] = field(default_factory=list)
    balance: list[float] = field(default_factory=list)
    rows: list[list[int]] = field(default_factory=list)
    opt_steps: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def examples(self) -> int:
        """Training examples consumed (with repetition)."""
        return sum(len(r) for r in self.rows)


def sample_step(
    task_of: Sequence[int], tasks: Sequence[int], tasks_per_step: int, per_task: int, rng: random.Random
) -> list[tuple[int, list[int]]]:
    """One step's batch: `tasks_per_step` distinct tasks, each with `per_task` of its examples (with replacement
    only when it has fewer)."""
    by_task: dict[int, list[int]] = {}
    for i, t in enumerate(task_of):
        by_task.setdefault(t, []).append(i)
    pool = [t for t in tasks if by_task.get(t)]
    chosen = rng.sample(pool, min(tasks_per_step, len(pool)))
    out = []
    for t in chosen:
        rows = by_task[t]
        pick = rng.sample(rows, per_task) if len(rows) >= per_task else [rng.choice(rows) for _ in range(per_task)]
        out.append((t, pick))
    return out


def batch_stream(
    task_of: Sequence[int],
    prompts_of_task: dict[int, list[int]],
    *,
    steps: int,
    tasks_per_step: int,
    per_task: int,
    seed: int = 0,
) -> Iterator[tuple[list[tuple[int, list[int]]], list[int]]]:
    """The training batches shared by every trained system: per step, ``[(task, example rows)]`` from
    `sample_step` and, per task of the batch, the system prompt (an index into `prompts_of_task[task]`'s values)
    that LoRA-Gen's generator reads and the prompt-in-context LoRA has in context. Systems that ignore the prompt
    draw it anyway, so that the same `seed` gives every system the very same examples."""
    rng = random.Random(seed)
    prompt_rng = random.Random(seed + 1)
    tasks = sorted(prompts_of_task)
    for _ in range(steps):
        batch = sample_step(task_of, tasks, tasks_per_step, per_task, rng)
        yield batch, [prompt_rng.choice(prompts_of_task[t]) for t, _ in batch]


_Batch = list[tuple[int, list[int]]]  # one step's [(task, example rows)], as `batch_stream` yields it


def _update(opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    """One optimiser step on `loss`."""
    opt.zero_grad()
    loss.backward()
    opt.step()


def _fit(
    module: nn.Module,
    step: Callable[[_Batch, list[int]], float],
    log: TrainLog,
    task_of: Sequence[int],
    prompts_of_task: dict[int, list[int]],
    *,
    steps: int,
    tasks_per_step: int,
    per_task: int,
    seed: int,
    on_step: Callable[[int, float], None] | None,
) -> TrainLog:
    """The loop of every trained system, so that each sees the same `batch_stream` batches for one `seed`.

    ``step(batch, prompt_idx)`` (the ``[(task, example rows)]`` of one step and each task's prompt index) takes that
    batch's optimiser step(s) and returns the loss to log; this logs it with the batch's rows, calls
    ``on_step(step index, loss)``, keeps `module` in training mode meanwhile and times the run (`log.wall_s`)."""
    stream = batch_stream(
        task_of, prompts_of_task, steps=steps, tasks_per_step=tasks_per_step, per_task=per_task, seed=seed
    )
    t0 = time.perf_counter()
    module.train()
    try:
        for i, (batch, prompt_idx) in enumerate(stream):
            log.loss.append(step(batch, prompt_idx))
            log.rows.append([r for _, rs in batch for r in rs])
            if on_step is not None:
                on_step(i, log.loss[-1])
    finally:
        module.eval()
    log.wall_s = time.perf_counter() - t0
    return log


__all__ = [
    "TrainLog",
    "batch_stream",
    "sample_step",
]
