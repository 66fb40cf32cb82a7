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
cached (`EdgeTop`).

Baselines trained here on the same batches (`batch_stream`): `train_lora`, one conventional (peft) LoRA on the
bare query (it cannot know the task: the query is shared by every task of its input type); `train_lora_ctx`, the same
LoRA with the task's system prompt in the edge context (the paper's conventional LoRA: the prompt runs once per
step through the top blocks, `EdgeTop.answer_logits_with_prefix`, its trunk is cached, `cache_prompt_context`);
`train_lora_per_task`, one peft adapter per task (the oracle), each stepping on its task's share of every batch.

Equivalences used by the tests:
- sum_i g_i B_i A_i = [g_1 B_1 ... g_n B_n] [A_1; ...; A_n]: a rank-(k r) LoRA with the k selected experts
  concatenated (peft's ``combination_type="cat"``), which is how `export_peft` hands a generated LoRA to peft.
  Mixing A and B separately, (sum g_i B_i)(sum g_i A_i) (peft's ``"linear"``), is a different matrix.
- all-zero gates give Delta W = 0: the merged edge model is the base model, bit for bit.
- the shared-prefix top pass equals the full forward of prompt + continuation (logits and LoRA gradients).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

# -- the edge model's structure ------------------------------------------------------------------------------------


def _base(model: Any) -> Any:
    """The decoder stack of a causal LM (``model.model`` for llama / gemma), or the model itself."""
    return getattr(model, "model", model)


def decoder_layers(model: Any) -> nn.ModuleList:
    base = _base(model)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no decoder layer list at .model.layers")
    return layers


def top_layer_ids(model: Any, n_top: int) -> list[int]:
    """Indices of the last `n_top` decoder blocks (all of them when the model is shallower)."""
    if n_top < 1:
        raise ValueError(f"n_top must be >= 1, got {n_top}")
    n = len(decoder_layers(model))
    return list(range(max(0, n - n_top), n))


def target_modules(model: Any, layer_ids: Sequence[int], targets: Sequence[str]) -> dict[str, nn.Linear]:
    """``{module name: nn.Linear}`` of the `targets` (e.g. ``gate_proj``) inside the blocks `layer_ids`, in order.

    Embeddings and the (tied) LM head are never targets: LoRA on them would also change the input embedding.
    """
    wanted = set(layer_ids)
    found: dict[str, nn.Linear] = {}
    for name, module in model.named_modules():
        parts = name.split(".")
        if not isinstance(module, nn.Linear) or parts[-1] not in targets or "layers" not in parts:
            continue
        layer = int(parts[parts.index("layers") + 1])
        if layer in wanted:
            found[name] = module
    missing = [t for t in targets if not any(n.endswith("." + t) for n in found)]
    if missing:
        raise ValueError(f"target module(s) {missing} not found in blocks {list(layer_ids)} of {type(model).__name__}")
    order = {t: i for i, t in enumerate(targets)}
    return dict(sorted(found.items(), key=lambda kv: (_layer_of(kv[0]), order[kv[0].split(".")[-1]])))


def _layer_of(name: str) -> int:
    parts = name.split(".")
    return int(parts[parts.index("layers") + 1])


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


# -- the edge side: trunk caching and teacher-forced scoring ----------------------------------------------------


class _Stop(Exception):
    pass


@dataclass
class Packed:
    """Right-padded sequences prompt + answer + terminator, and the positions that predict answer tokens.

    ids (N, T); `pos_b`, `pos_t`: flat indices of the predicting positions; `target`: the token each predicts; `row`:
    which example each belongs to; `is_stop`: True at the terminator position (the one after the answer).
    """

    ids: torch.Tensor
    pos_b: torch.Tensor
    pos_t: torch.Tensor
    target: torch.Tensor
    is_stop: torch.Tensor
    prompt_len: list[int] = field(default_factory=list)

    @property
    def n(self) -> int:
        return self.ids.shape[0]

    def subset(self, rows: Sequence[int]) -> Packed:
        """The rows `rows` in that order, repeats allowed (a batch draws one example twice when its task has fewer
        examples than the batch wants): row b of the result is ``rows[b]``, with all of its positions."""
        rows = list(rows)
        rows_t = torch.as_tensor(rows, dtype=torch.long)
        if len(set(rows)) == len(rows):  # positions keep their packed order
            remap = torch.full((self.n,), -1, dtype=torch.long)
            remap[rows_t] = torch.arange(len(rows_t))
            keep = remap[self.pos_b] >= 0
            new_b, idx = remap[self.pos_b[keep]], keep.nonzero().flatten()
        else:  # a repeated row gets its positions once per occurrence
            sel = [torch.nonzero(self.pos_b == r).flatten() for r in rows]
            idx = torch.cat(sel)
            new_b = torch.cat([torch.full((len(p),), b, dtype=torch.long) for b, p in enumerate(sel)])
        return Packed(
            self.ids[rows_t],
            new_b,
            self.pos_t[idx],
            self.target[idx],
            self.is_stop[idx],
            [self.prompt_len[r] for r in rows],
        )


def pack(examples: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int, stop_id: int) -> Packed:
    """Pack (prompt ids, answer ids) pairs as prompt + answer + [stop_id], right-padded with `pad_id`."""
    seqs = [list(p) + list(a) + [stop_id] for p, a in examples]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    pb, pt, tg, st = [], [], [], []
    for b, ((p, a), s) in enumerate(zip(examples, seqs)):
        if not p:
            raise ValueError("every prompt needs at least one token")
        ids[b, : len(s)] = torch.tensor(s)
        for j in range(len(a) + 1):
            pb.append(b)
            pt.append(len(p) - 1 + j)
            tg.append(s[len(p) + j])
            st.append(j == len(a))
    return Packed(
        ids,
        torch.tensor(pb),
        torch.tensor(pt),
        torch.tensor(tg),
        torch.tensor(st, dtype=torch.bool),
        [len(p) for p, _ in examples],
    )


class EdgeTop:
    """Run an edge LM split at block `start`: the bottom blocks once (cached), the top blocks and head many times.

    Args:
        model: a llama-style causal LM (``model.model.layers``, ``model.model.norm``, output embeddings).
        n_top (`int`): number of top blocks (those that carry LoRA); ``start = n_layers - n_top``.
    """

    def __init__(self, model: Any, n_top: int) -> None:
        self.model = model
        self.layers = decoder_layers(model)
        self.top_ids = top_layer_ids(model, n_top)
        self.start = self.top_ids[0]
        self._kwargs: dict[int, list[dict[str, Any]]] = {}

    @torch.no_grad()
    def trunk(self, ids: torch.Tensor, *, batch_size: int = 32) -> torch.Tensor:
        """Hidden states entering block `start` for right-padded `ids` (N, T) -> (N, T, d)."""
        box: list[torch.Tensor] = []

        def grab(module: nn.Module, args: tuple, kwargs: dict) -> None:
            box.append((args[0] if args else kwargs["hidden_states"]).detach())
            raise _Stop  # the blocks above `start` are not needed

        handle = self.layers[self.start].register_forward_pre_hook(grab, with_kwargs=True)
        try:
            for i in range(0, ids.shape[0], batch_size):
                try:
                    _base(self.model)(input_ids=ids[i : i + batch_size], use_cache=False)
                except _Stop:
                    pass
        finally:
            handle.remove()
        return torch.cat(box)

    @torch.no_grad()
    def layer_kwargs(self, width: int) -> list[dict[str, Any]]:
        """The keyword arguments (mask, rotary embeddings, positions) each top block gets at sequence length `width`,
        captured from a batch-1 forward (they broadcast over any batch of right-padded sequences)."""
        if width not in self._kwargs:
            captured: dict[int, dict[str, Any]] = {}

            def make(i: int) -> Callable[..., None]:
                def grab(module: nn.Module, args: tuple, kwargs: dict) -> None:
                    captured[i] = {k: v for k, v in kwargs.items() if k not in ("hidden_states", "cache")}

                return grab

            handles = [self.layers[i].register_forward_pre_hook(make(i), with_kwargs=True) for i in self.top_ids]
            try:
                _base(self.model)(input_ids=torch.zeros((1, width), dtype=torch.long), use_cache=False)
            finally:
                for h in handles:
                    h.remove()
            self._kwargs[width] = [captured[i] for i in self.top_ids]
        return self._kwargs[width]

    def top(self, hidden: torch.Tensor) -> torch.Tensor:
        """Top blocks + final norm: (B, T, d) -> (B, T, d)."""
        h = hidden
        for i, kw in zip(self.top_ids, self.layer_kwargs(hidden.shape[1])):
            h = self.layers[i](h, **kw)
            if isinstance(h, tuple):
                h = h[0]
        return _base(self.model).norm(h)

    def answer_logits(self, hidden: torch.Tensor, packed: Packed) -> torch.Tensor:
        """Logits at the answer-predicting positions of `packed` (M, vocab), from cached `hidden` (N, T, d)."""
        h = self.top(hidden)
        return self.model.get_output_embeddings()(h[packed.pos_b, packed.pos_t])

    # -- a shared prefix (the system prompt in context) ------------------------------------------------------------

    @torch.no_grad()
    def trunk_with_prefix(
        self, prefix: Sequence[int], ids: torch.Tensor, *, batch_size: int = 32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden states entering block `start` for the sequences ``prefix + ids[i]``, the prefix run once.

        Returns the prefix's (Tp, d) and the continuations' (N, T, d) (right-padded `ids` (N, T), positions shifted
        by Tp). The bottom blocks' KV cache of the prefix is repeated over each chunk, as in `score_with_prefix`.
        """
        from transformers import DynamicCache

        box: list[torch.Tensor] = []

        def grab(module: nn.Module, args: tuple, kwargs: dict) -> None:
            box.append((args[0] if args else kwargs["hidden_states"]).detach())
            raise _Stop

        pre = torch.tensor([list(prefix)], dtype=torch.long)

        def run_prefix() -> Any:
            cache = DynamicCache(config=self.model.config)
            try:  # the prefix fills the cache of blocks < start, then the hook stops the forward
                _base(self.model)(input_ids=pre, cache=cache, use_cache=True)
            except _Stop:
                pass
            return cache

        handle = self.layers[self.start].register_forward_pre_hook(grab, with_kwargs=True)
        parts = []
        try:
            run_prefix()
            prefix_h = box.pop()[0]  # (Tp, d)
            for i in range(0, ids.shape[0], batch_size):
                chunk = ids[i : i + batch_size]
                if self.start > 0:  # a fresh prefix cache per chunk, repeated over its rows
                    cache = run_prefix()
                    box.pop()
                    cache.batch_repeat_interleave(chunk.shape[0])
                    # positions continue after the prefix; the chunk attends to the cached prefix keys
                    kw: dict[str, Any] = {"cache": cache, "use_cache": True}
                else:  # the trunk is the embedding output: it does not depend on the prefix
                    kw = {"use_cache": False}
                try:
                    _base(self.model)(input_ids=chunk, **kw)
                except _Stop:
                    pass
                parts.append(box.pop())
        finally:
            handle.remove()
        return prefix_h, torch.cat(parts)

    def top_with_prefix(
        self, prefix_hidden: torch.Tensor, prefix_len: torch.Tensor, owner: torch.Tensor, hidden: torch.Tensor
    ) -> torch.Tensor:
        """Top blocks + final norm for continuations of shared prefixes, each prefix run once (gradients flow
        through the prefix's keys and values, so a LoRA on the top blocks learns from the prompt in context).

        Args:
            prefix_hidden: (P, Tp, d) right-padded prefix trunks; prefix_len: (P,) their lengths.
            owner: (B,) which prefix each continuation follows; hidden: (B, T, d) continuation trunks.
        Returns: (B, T, d), equal to the full forward of ``prefix[owner[b]] + continuation[b]`` at its positions.
        """
        n_p, t_p = prefix_hidden.shape[:2]
        n_b, t_q = hidden.shape[:2]
        neg = torch.finfo(hidden.dtype).min
        ar_p, ar_q = torch.arange(t_p), torch.arange(t_q)
        # prefix pass: causal (its right padding is never attended to by a real prefix token)
        mask_p = torch.zeros(n_p, 1, t_p, t_p, dtype=hidden.dtype)
        mask_p.masked_fill_(ar_p[None, :] > ar_p[:, None], neg)
        pos_p = ar_p.expand(n_p, t_p)
        # continuation pass: keys [prefix (t_p); own tokens (t_q)]; the owner's prefix up to its length, causal after
        lens = prefix_len[owner]  # (B,)
        allowed = torch.cat(
            [
                (ar_p[None, None, :] < lens[:, None, None]).expand(n_b, t_q, t_p),
                (ar_q[None, :] <= ar_q[:, None]).expand(n_b, t_q, t_q),
            ],
            -1,
        )  # (B, t_q, t_p + t_q)
        mask_q = torch.zeros(n_b, 1, t_q, t_p + t_q, dtype=hidden.dtype).masked_fill_(~allowed[:, None], neg)
        pos_q = lens[:, None] + ar_q[None, :]  # (B, t_q)
        rotary = _base(self.model).rotary_emb
        kv = _PrefixKV()
        hp, hq = prefix_hidden, hidden
        for i in self.top_ids:
            layer = self.layers[i]
            kv.owner = None
            hp = layer(hp, attention_mask=mask_p, position_ids=pos_p, position_embeddings=rotary(hp, pos_p), cache=kv)
            hp = hp[0] if isinstance(hp, tuple) else hp
            kv.owner = owner
            hq = layer(hq, attention_mask=mask_q, position_ids=pos_q, position_embeddings=rotary(hq, pos_q), cache=kv)
            hq = hq[0] if isinstance(hq, tuple) else hq
        return _base(self.model).norm(hq)

    def answer_logits_with_prefix(
        self,
        prefix_hidden: torch.Tensor,
        prefix_len: torch.Tensor,
        owner: torch.Tensor,
        hidden: torch.Tensor,
        packed: Packed,
    ) -> torch.Tensor:
        """`answer_logits` for continuations of shared prefixes (`top_with_prefix`): (M, vocab)."""
        h = self.top_with_prefix(prefix_hidden, prefix_len, owner, hidden)
        return self.model.get_output_embeddings()(h[packed.pos_b, packed.pos_t])


class _PrefixKV:
    """A minimal stand-in for a transformers `Cache` (attention calls only ``update``): in the prefix pass
    (``owner is None``) it keeps each block's prefix keys / values (P, kv_heads, Tp, hd) and returns them; in the
    continuation pass it prepends the owner prefix's ones to the continuation's (B, kv_heads, Tp + T, hd)."""

    def __init__(self) -> None:
        self.store: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.owner: torch.Tensor | None = None

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.owner is None:
            self.store[layer_idx] = (key, value)
            return key, value
        pk, pv = self.store[layer_idx]
        return torch.cat([pk[self.owner], key], 2), torch.cat([pv[self.owner], value], 2)


def answer_loss(logits: torch.Tensor, packed: Packed) -> torch.Tensor:
    """Mean cross-entropy of the answer tokens (and the terminator) over all predicted positions."""
    return F.cross_entropy(logits.float(), packed.target)


@dataclass
class Scores:
    """Per-example greedy exact match (1.0 / 0.0) and answer NLL (nats per answer token), and the argmax tokens."""

    exact: list[float]
    nll: list[float]
    predicted: list[list[int]]


def score_logits(logits: torch.Tensor, packed: Packed, stop_ids: set[int]) -> Scores:
    """Greedy exact match: every answer token is the argmax and the argmax after the answer is a stop token.

    Equivalent to greedy decoding producing exactly the answer and then stopping (lm-eval's ``is_greedy`` plus a
    stop check), computed in one teacher-forced pass.
    """
    pred = logits.argmax(-1)
    logp = torch.log_softmax(logits.float(), -1)
    tok_nll = -logp.gather(-1, packed.target[:, None])[:, 0]
    stop = torch.tensor([int(p) in stop_ids for p in pred.tolist()], dtype=torch.bool)
    ok = torch.where(packed.is_stop, stop, pred == packed.target)
    n = packed.n
    exact = [1.0] * n
    nll_sum, count = [0.0] * n, [0] * n
    predicted: list[list[int]] = [[] for _ in range(n)]
    for b, good, is_stop, v, p in zip(
        packed.pos_b.tolist(), ok.tolist(), packed.is_stop.tolist(), tok_nll.tolist(), pred.tolist()
    ):
        if not good:
            exact[b] = 0.0
        if not is_stop:
            nll_sum[b] += v
            count[b] += 1
            predicted[b].append(p)
    return Scores(exact, [s / max(c, 1) for s, c in zip(nll_sum, count)], predicted)


@torch.no_grad()
def score_top(top: EdgeTop, hidden: torch.Tensor, packed: Packed, stop_ids: set[int], *, chunk: int = 64) -> Scores:
    """`score_logits` for the edge model as it is now (merged weights, hooks or peft layers), from cached trunks."""
    parts = []
    for i in range(0, packed.n, chunk):
        rows = list(range(i, min(packed.n, i + chunk)))
        sub = packed.subset(rows)
        parts.append(score_logits(top.answer_logits(hidden[rows], sub), sub, stop_ids))
    return Scores(
        [x for p in parts for x in p.exact], [x for p in parts for x in p.nll], [x for p in parts for x in p.predicted]
    )


@torch.no_grad()
def score_with_prefix(
    model: Any, prefix: Sequence[int], packed: Packed, stop_ids: set[int], *, chunk: int = 32
) -> Scores:
    """`score_logits` for prompts that all start with the same `prefix` (the system prompt in context): the prefix
    is run once per chunk and its KV cache shared, the rows of `packed` continue it (their positions shift by it)."""
    pre = torch.tensor([list(prefix)], dtype=torch.long)
    parts = []
    for i in range(0, packed.n, chunk):
        rows = list(range(i, min(packed.n, i + chunk)))
        sub = packed.subset(rows)
        out = model(input_ids=pre, use_cache=True)
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        cache.batch_repeat_interleave(len(rows))
        logits = model(input_ids=sub.ids, cache=cache, use_cache=True).logits
        parts.append(score_logits(logits[sub.pos_b, sub.pos_t], sub, stop_ids))
    return Scores(
        [x for p in parts for x in p.exact], [x for p in parts for x in p.nll], [x for p in parts for x in p.predicted]
    )


def stop_token_ids(tokenizer: Any) -> set[int]:
    """Tokens that end an answer: EOS and every token whose text starts with a newline."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    for tok, i in tokenizer.get_vocab().items():
        text = tokenizer.convert_tokens_to_string([tok])
        if text.startswith("\n"):
            ids.add(int(i))
    return ids


# -- training ------------------------------------------------------------------------------------------------------


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
    "EdgeTop",
    "GateOutput",
    "LoRAGenerator",
    "MixtureHooks",
    "Packed",
    "PromptContext",
    "Scores",
    "TrainLog",
    "answer_loss",
    "batch_stream",
    "cache_prompt_context",
    "decoder_layers",
    "encode_cloud",
    "export_peft",
    "keep_top_k_softmax",
    "lora_parameters",
    "lora_params_per_rank",
    "merge_deltas",
    "pack",
    "sample_step",
    "score_logits",
    "score_top",
    "score_with_prefix",
    "selected_experts",
    "stop_token_ids",
    "target_modules",
    "top_layer_ids",
    "train_generator",
    "train_lora",
    "train_lora_ctx",
    "train_lora_per_task",
    "unmerge",
]
