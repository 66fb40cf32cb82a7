"""LoRA-Gen: a frozen cloud LM turns a task's system prompt into per-layer mixtures of LoRA experts for an edge LM.

Delta W_l = (alpha / r) sum_i g_{l,i} B_{l,i} A_{l,i},   g_l = Softmax(KeepTopK(W_r m_l + noise, k))
(https://arxiv.org/abs/2506.11638)

The cloud model reads the system prompt (task description plus few-shot examples) once. Per edge layer l a meta
token m_l summarises it; a router maps m_l to gates g_l over a pool of n LoRA experts (A_{l,i}, B_{l,i}) of rank r.
The gates depend on the task only, never on the edge model's tokens, so Delta W_l is one fixed matrix per task and
is merged into the edge weights (W_l <- W_l + Delta W_l): the edge model then answers the bare query, with its own
architecture and cost, and without the system prompt in its context (the context compression).

lmlab's variant (``mode="frozen_cloud"``): the cloud LM is frozen and its last hidden states of the system prompt are
cached; the meta token m_l is a learned query q_l cross-attending over them (one attention layer), instead of L
special tokens appended to the cloud input with the cloud LM LoRA-tuned (the paper's set-up, too slow to
back-propagate through on 2 CPU cores). Gating is Shazeer et al.'s noisy top-k (the softmax over the k kept logits,
so the k gates are positive and sum to 1), with their CV^2 importance loss against expert collapse. LoRA sits on the
top `n_top` edge blocks only, so the bottom blocks' hidden states of the training examples are computed once and
cached (`edge.EdgeTop`).

This file holds the algorithm: the generator (`LoRAGenerator`, `keep_top_k_softmax`), merging a generated LoRA into
the edge weights (`merge_deltas` / `unmerge`, or through peft with `export_peft`), the unmerged per-example branch
used in training (`MixtureHooks`), the cloud encoding of the system prompts (`encode_cloud`) and the generator's
training (`train_generator`). Beside it: `edge.py` (the edge model split at its top blocks, and scoring),
`training.py` (the batches and loop every trained system shares) and `baselines.py` (the conventional LoRAs trained
on the same batches: bare query, system prompt in context, one per task).

Equivalences used by the tests:
- sum_i g_i B_i A_i = [g_1 B_1 ... g_n B_n] [A_1; ...; A_n]: a rank-(k r) LoRA with the k selected experts
  concatenated (peft's ``combination_type="cat"``), which is how `export_peft` hands a generated LoRA to peft.
  Mixing A and B separately, (sum g_i B_i)(sum g_i A_i) (peft's ``"linear"``), is a different matrix.
- all-zero gates give Delta W = 0: the merged edge model is the base model, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from lmlab.methods.compression.lora_gen.edge import EdgeTop, Packed, _base, _layer_of, answer_loss
from lmlab.methods.compression.lora_gen.training import TrainLog, _Batch, _fit, _update

# -- the generator -------------------------------------------------------------------------------------------------


@dataclass
class GateOutput:
    """Gates of a batch of system prompts: `gates` (batch, n_layers, n_experts), exactly `top_k` positive entries
    per (prompt, layer), summing to 1; `logits` the (noisy when training) router logits they came from."""

    gates: torch.Tensor
    logits: torch.Tensor


class LoRAGenerator(nn.Module):
    """Meta tokens, per-layer routers and the LoRA expert pool of LoRA-Gen (the trainable part; cloud and edge are
    frozen).

    g_l = Softmax(KeepTopK(W_r,l m_l + eps * Softplus(W_noise,l m_l), k)),  m_l = Attn(q_l, LN(H_cloud)) + P z
    Delta W_{l,t} = (alpha / r) sum_i g_{l,i} B_{l,t,i} A_{l,t,i}   for every target module t of edge block l.

    Args:
        cloud_dim (`int`): hidden size of the cloud LM.
        shapes (`dict[str, tuple[int, int]]`): ``{edge module name: (out_features, in_features)}`` (`target_modules`).
        n_experts (`int`, defaults to 8): experts per edge block.
        rank (`int`, defaults to 4): rank r of every expert.
        top_k (`int`, defaults to 2): experts kept per block (KeepTopK).
        alpha (`float`, defaults to 8.0): LoRA alpha; the update is scaled by alpha / r.
        attn_dim (`int`, defaults to 64): width of the meta tokens and of the cross-attention.
        seed (`int`, defaults to 0): initialisation seed.
    """

    def __init__(
        self,
        cloud_dim: int,
        shapes: dict[str, tuple[int, int]],
        *,
        n_experts: int = 8,
        rank: int = 4,
        top_k: int = 2,
        alpha: float = 8.0,
        attn_dim: int = 64,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be in [1, n_experts={n_experts}], got {top_k}")
        if rank < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        if not shapes:
            raise ValueError("shapes must name at least one edge module")
        self.module_names = list(shapes)
        self.layer_ids = sorted({_layer_of(n) for n in self.module_names})
        self.module_layer = [self.layer_ids.index(_layer_of(n)) for n in self.module_names]
        self.n_experts, self.rank, self.top_k, self.alpha = n_experts, rank, top_k, float(alpha)
        self.scale = self.alpha / rank
        n_layers = len(self.layer_ids)
        gen = torch.Generator().manual_seed(seed)
        # experts: A like peft's kaiming-uniform init, B = 0 (every generated Delta W starts at 0)
        self.A = nn.ParameterList()
        self.B = nn.ParameterList()
        for name in self.module_names:
            out_f, in_f = shapes[name]
            bound = 1.0 / math.sqrt(in_f)
            self.A.append(nn.Parameter((torch.rand(n_experts, rank, in_f, generator=gen) * 2 - 1) * bound))
            self.B.append(nn.Parameter(torch.zeros(n_experts, out_f, rank)))
        self.cloud_norm = nn.LayerNorm(cloud_dim, elementwise_affine=False)
        self.meta_queries = nn.Parameter(torch.randn(n_layers, attn_dim, generator=gen) / math.sqrt(attn_dim))
        self.k_proj = nn.Linear(cloud_dim, attn_dim, bias=False)
        self.v_proj = nn.Linear(cloud_dim, attn_dim, bias=False)
        with torch.no_grad():
            for lin in (self.k_proj, self.v_proj):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen) / math.sqrt(cloud_dim))
        # a summary of the whole prompt, standardised with fixed statistics of the training prompts
        # (`set_cloud_stats`): the prompts of different tasks share most tokens, so their raw mean states differ
        # only slightly
        self.pool_proj = nn.Linear(cloud_dim, attn_dim, bias=False)
        with torch.no_grad():
            self.pool_proj.weight.copy_(torch.randn(self.pool_proj.weight.shape, generator=gen) / math.sqrt(cloud_dim))
        self.register_buffer("cloud_mean", torch.zeros(cloud_dim))
        self.register_buffer("cloud_std", torch.ones(cloud_dim))
        self.router = nn.Parameter(torch.randn(n_layers, attn_dim, n_experts, generator=gen) / math.sqrt(attn_dim))
        self.noise = nn.Parameter(torch.zeros(n_layers, attn_dim, n_experts))  # Shazeer: W_noise starts at 0

    @property
    def n_layers(self) -> int:
        return len(self.layer_ids)

    @staticmethod
    def pooled(cloud_states: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Masked mean of the cloud states over the prompt: (batch, T, d) -> (batch, d)."""
        if mask is None:
            return cloud_states.mean(1)
        w = mask.to(cloud_states.dtype)[..., None]
        return (cloud_states * w).sum(1) / w.sum(1).clamp_min(1.0)

    @torch.no_grad()
    def set_cloud_stats(self, cloud_states: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Fix the per-feature mean / std of the pooled prompt states (from the training prompts only)."""
        p = self.pooled(cloud_states, mask)
        self.cloud_mean.copy_(p.mean(0))
        self.cloud_std.copy_(p.std(0, unbiased=False).clamp_min(1e-4) if p.shape[0] > 1 else torch.ones_like(p[0]))

    def meta_tokens(self, cloud_states: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """m_l = softmax(q_l K^T / sqrt(d)) V + P z over the cloud states: (batch, T, cloud_dim) -> (batch, L, d).

        z is the prompt's pooled state standardised by `set_cloud_stats`.
        """
        h = self.cloud_norm(cloud_states)
        k, v = self.k_proj(h), self.v_proj(h)  # (batch, T, d)
        scores = torch.einsum("ld,btd->blt", self.meta_queries, k) / math.sqrt(k.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask.bool()[:, None, :], float("-inf"))
        z = (self.pooled(cloud_states, mask) - self.cloud_mean) / self.cloud_std
        return torch.einsum("blt,btd->bld", scores.softmax(-1), v) + self.pool_proj(z)[:, None, :]

    def gate(
        self,
        cloud_states: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        noisy: bool = False,
        generator: torch.Generator | None = None,
    ) -> GateOutput:
        """Noisy top-k gating (Shazeer et al., 2017) per edge layer: `GateOutput` with gates (batch, n_layers, n)."""
        m = self.meta_tokens(cloud_states, mask)
        logits = torch.einsum("bld,ldn->bln", m, self.router)
        if noisy:
            std = F.softplus(torch.einsum("bld,ldn->bln", m, self.noise))
            eps = torch.randn(logits.shape, generator=generator, dtype=logits.dtype)
            logits = logits + eps * std
        return GateOutput(keep_top_k_softmax(logits, self.top_k), logits)

    def deltas(self, gates: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{module name: Delta W (out, in)}`` for ONE task's gates (n_layers, n_experts)."""
        if gates.shape != (self.n_layers, self.n_experts):
            raise ValueError(f"gates must have shape ({self.n_layers}, {self.n_experts}), got {tuple(gates.shape)}")
        out = {}
        for j, name in enumerate(self.module_names):
            g = gates[self.module_layer[j]]
            out[name] = self.scale * torch.einsum("n,nor,nri->oi", g, self.B[j], self.A[j])
        return out

    def lora_output(self, j: int, x: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
        """The unmerged LoRA branch of module j: (alpha/r) sum_i g_{b,i} B_i A_i x_b for per-example gates (batch, n).

        x: (batch, T, in) -> (batch, T, out). Equal to x @ Delta W^T of `deltas` for that example's task.
        """
        n, r = self.n_experts, self.rank
        a = self.A[j].reshape(n * r, -1)  # (n r, in): all experts' A stacked
        b = self.B[j].permute(1, 0, 2).reshape(-1, n * r)  # (out, n r): all experts' B side by side
        u = F.linear(x, a).unflatten(-1, (n, r)) * gates[:, None, :, None]  # (batch, T, n, r), gated per expert
        return self.scale * F.linear(u.flatten(-2), b)

    def balance_loss(self, gates: torch.Tensor) -> torch.Tensor:
        """CV^2 of expert importance (sum of gates over the batch), averaged over layers (Shazeer et al., 2017)."""
        importance = gates.sum(0)  # (n_layers, n)
        mean = importance.mean(-1)
        var = importance.var(-1, unbiased=False)
        return (var / (mean**2 + 1e-10)).mean()

    def n_trainable(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def expert_parameters(self) -> int:
        return sum(p.numel() for p in list(self.A) + list(self.B))


def keep_top_k_softmax(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Softmax(KeepTopK(logits, k)) over the last dim: the k largest logits keep their value, the rest -inf."""
    if not 1 <= k <= logits.shape[-1]:
        raise ValueError(f"k must be in [1, {logits.shape[-1]}], got {k}")
    vals, idx = logits.topk(k, dim=-1)
    kept = torch.full_like(logits, float("-inf")).scatter(-1, idx, vals)
    return kept.softmax(-1)


# -- merging -------------------------------------------------------------------------------------------------------


@torch.no_grad()
def merge_deltas(model: Any, deltas: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """W <- W + Delta W in place (reparameterisation); returns the original weights for an exact `unmerge`."""
    originals = {}
    for name, delta in deltas.items():
        lin = model.get_submodule(name)
        if tuple(delta.shape) != tuple(lin.weight.shape):
            raise ValueError(f"delta for {name} has shape {tuple(delta.shape)}, weight {tuple(lin.weight.shape)}")
        originals[name] = lin.weight.detach().clone()
        lin.weight.add_(delta.to(lin.weight.dtype))
    return originals


@torch.no_grad()
def unmerge(model: Any, originals: dict[str, torch.Tensor]) -> None:
    """Restore the weights saved by `merge_deltas` (bit for bit)."""
    for name, weight in originals.items():
        model.get_submodule(name).weight.copy_(weight)


def selected_experts(gates: torch.Tensor, k: int) -> torch.Tensor:
    """(n_layers, k) expert indices to export: the positive gates (top-k), or the first k when a layer's are all 0."""
    return gates.topk(k, dim=-1).indices.sort(-1).values


@torch.no_grad()
def export_peft(model: Any, generator: LoRAGenerator, gates: torch.Tensor, *, adapter_name: str = "lora_gen") -> Any:
    """Wrap `model` (modified in place) in a peft `PeftModel` holding the generated LoRA as one rank-(k r) adapter.

    Per target module: lora_A = [A_i1; ...; A_ik] (k r, in), lora_B = [g_i1 B_i1 ... g_ik B_ik] (out, k r), with
    lora_alpha = alpha k so peft's scaling lora_alpha / (k r) equals alpha / r: B_cat A_cat = sum_i g_i B_i A_i,
    peft's ``"cat"`` combination. ``.merge_and_unload()`` then gives the plain merged edge model, ``.unload()`` the
    base model back; ``.merge_adapter()`` / ``.unmerge_adapter()`` toggle it.
    """
    from peft import LoraConfig, get_peft_model

    k, r = generator.top_k, generator.rank
    targets = sorted({n.split(".")[-1] for n in generator.module_names})
    config = LoraConfig(
        r=k * r,
        lora_alpha=generator.alpha * k,
        target_modules=targets,
        layers_to_transform=list(generator.layer_ids),
        lora_dropout=0.0,
        bias="none",
        init_lora_weights=False,
    )
    peft_model = get_peft_model(model, config, adapter_name=adapter_name)
    chosen = selected_experts(gates, k)
    for j, name in enumerate(generator.module_names):
        layer = generator.module_layer[j]
        idx = chosen[layer]
        a_cat = generator.A[j][idx].reshape(k * r, -1)  # (k r, in)
        b_cat = (generator.B[j][idx] * gates[layer, idx][:, None, None]).permute(1, 0, 2).reshape(-1, k * r)
        lora = peft_model.base_model.model.get_submodule(name)
        lora.lora_A[adapter_name].weight.copy_(a_cat)
        lora.lora_B[adapter_name].weight.copy_(b_cat)
    return peft_model


class MixtureHooks:
    """Forward hooks adding the unmerged, per-example LoRA-Gen branch to the edge's target modules (for training).

    Set ``hooks.gates`` (batch, n_layers, n_experts) before each forward; use as a context manager.
    """

    def __init__(self, model: Any, generator: LoRAGenerator) -> None:
        self.model, self.generator = model, generator
        self.gates: torch.Tensor | None = None
        self._handles: list[Any] = []

    def __enter__(self) -> MixtureHooks:
        for j, name in enumerate(self.generator.module_names):
            self._handles.append(self.model.get_submodule(name).register_forward_hook(self._hook(j)))
        return self

    def _hook(self, j: int) -> Callable[..., torch.Tensor]:
        layer = self.generator.module_layer[j]

        def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
            if self.gates is None:
                return output
            return output + self.generator.lora_output(j, inputs[0], self.gates[:, layer])

        return hook

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


# -- the cloud side ------------------------------------------------------------------------------------------------


@torch.no_grad()
def encode_cloud(cloud: Any, tokenizer: Any, texts: Sequence[str], *, batch_size: int = 8) -> tuple[torch.Tensor, ...]:
    """Last-layer hidden states of the frozen cloud LM over each system prompt: (N, T, d) and its mask (N, T).

    Runs the decoder stack only (no LM head: Gemma-3's 262k-word head would dominate the cost).
    """
    base = _base(cloud)
    rows = [tokenizer(t)["input_ids"] for t in texts]
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    states, masks = [], []
    for i in range(0, len(rows), batch_size):
        chunk = rows[i : i + batch_size]
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for b, r in enumerate(chunk):
            ids[b, : len(r)] = torch.tensor(r)
            mask[b, : len(r)] = 1
        out = base(input_ids=ids, attention_mask=mask, use_cache=False)
        states.append(out.last_hidden_state.float())
        masks.append(mask.bool())
    return torch.cat(states), torch.cat(masks)


# -- training ---------------------------------------------------------------------------------------------------------


def train_generator(
    generator: LoRAGenerator,
    top: EdgeTop,
    hidden: torch.Tensor,
    packed: Packed,
    task_of: Sequence[int],
    cloud_states: torch.Tensor,
    cloud_mask: torch.Tensor,
    prompts_of_task: dict[int, list[int]],
    *,
    steps: int,
    tasks_per_step: int,
    per_task: int,
    lr: float,
    balance_weight: float,
    noisy: bool = True,
    seed: int = 0,
    on_step: Callable[[int, float], None] | None = None,
) -> TrainLog:
    """Fit the generator end to end through the frozen edge top blocks (answer cross-entropy + w CV^2 balance).

    Each step samples tasks, one cached cloud encoding of each task's system prompt (its prompt variants differ in
    their few-shot examples), and examples of those tasks; the gates of a task apply to its examples only.
    """
    noise_gen = torch.Generator().manual_seed(seed)
    frozen = [p for p in top.model.parameters() if p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in generator.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    log = TrainLog(opt_steps={"generator": 0})
    hooks = MixtureHooks(top.model, generator)

    def step(batch: _Batch, prompt_idx: list[int]) -> float:
        g = generator.gate(cloud_states[prompt_idx], cloud_mask[prompt_idx], noisy=noisy, generator=noise_gen)
        rows = [r for _, rs in batch for r in rs]
        owner = torch.tensor([k for k, (_, rs) in enumerate(batch) for _ in rs])
        hooks.gates = g.gates[owner]  # (batch, n_layers, n): each example gets its task's gates
        sub = packed.subset(rows)
        ce = answer_loss(top.answer_logits(hidden[rows], sub), sub)
        bal = generator.balance_loss(g.gates)
        _update(opt, ce + balance_weight * bal)
        log.opt_steps["generator"] += 1
        log.balance.append(float(bal.detach()))
        return float(ce.detach())  # the logged loss is the answer CE, comparable with the LoRAs'

    try:
        with hooks:
            _fit(generator, step, log, task_of, prompts_of_task, steps=steps, tasks_per_step=tasks_per_step,
                 per_task=per_task, seed=seed, on_step=on_step)  # fmt: skip
            hooks.gates = None
    finally:
        for p in frozen:
            p.requires_grad_(True)
    return log


__all__ = [
    "GateOutput",
    "LoRAGenerator",
    "MixtureHooks",
    "encode_cloud",
    "export_peft",
    "keep_top_k_softmax",
    "merge_deltas",
    "selected_experts",
    "train_generator",
    "unmerge",
]
