"""Memory Layers at Scale (Berges et al., ICML 2025, https://arxiv.org/abs/2412.09764): product-key memory (Memory+).

    y = sum_h sum_{i in I_h} softmax_i(s_h) V[i],   out = W_o( y * silu(W_s x) )            (Memory+, swilu)
    I_h = top-k over the k x k candidates {(a, b)} of  s1[a] + s2[b],  a in top-k(q1_h . K1_h), b in top-k(q2_h . K2_h)
    q = W_q x + b_q (heads x k_dim), q_h = [q1_h, q2_h],  slot index = a * n_keys + b,  N = n_keys^2 slots

A drop-in replacement for the FFN of chosen transformer blocks: `ProductKeyMemory` maps (B, T, d) -> (B, T, d) like a
Hugging Face `LlamaMLP`, so ``layer.mlp = ProductKeyMemory(...)`` keeps the model's forward (see `add_memory_layers`).
Follows the official `lingua/product_key/memory.py` (`HashingMemory`, facebookresearch/memory @ 7f85280):

- keys: ``(2 * heads * n_keys, k_dim / 2)``, U(+-1/sqrt(k_dim)); queries: ``Linear(d, heads * k_dim, bias=True)``,
  xavier-uniform, optionally followed by ``BatchNorm1d`` (``mem_query_batchnorm``, off in the official code and
  configs; on in Lample et al. 2019's original PKM);
- two top-k's over the sub-keys, top-k over the k^2 Cartesian candidates, softmax per head over its k scores, one
  ``embedding_bag(mode="sum", per_sample_weights)`` over the heads * k slots (heads are summed);
- values: one table of N x v_dim, N(0, v_dim^-1/2), shared by all memory layers of a model (``mem_share_values``);
  its parameters get their own optimizer group with a higher base learning rate (``value_fixed_lr`` = 1e-3 against
  the model's 1e-4 in the official configs; the official LambdaLR scheduler scales every group, the value group
  included) and their gradients are clipped apart from the rest (official ``train.py``);
- Memory+: ``value_proj(y * silu(swilu_projection(x)))``, both Linear with bias, N(0, d^-1/2); ``swilu=False`` is the
  plain PKM ablation (no projection when v_dim == d); optional sigmoid gate ``sigmoid(W_g x)`` (``mem_gated``).

Sharing is explicit here (a `ValueTable` handed to every layer of one model), not the official class attribute
``HashingMemory.VALUES``, which would silently share one table between all models built in a process.

Also here: the baselines' building blocks (`SwitchMoE`, a top-1 mixture of SwiGLU experts with the Switch
load-balancing loss), tiny Llama builders, the optimizer parameter groups and the analytic FLOPs / bytes per token of
every block.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# -- product-key lookup ----------------------------------------------------------------------------------------------


def product_key_topk(
    q1: torch.Tensor, q2: torch.Tensor, keys1: torch.Tensor, keys2: torch.Tensor, knn: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-`knn` slots of a product-key memory, per row and head, without scoring all n_keys^2 slots.

    Args:
        q1, q2: (bs, heads, half) the two halves of the queries.
        keys1, keys2: (heads, n_keys, half) the two sub-key sets of each head.
        knn (`int`): slots kept per head (k), also the top-k on each side.

    Returns:
        ``(scores, indices)``, both (bs, heads, knn), sorted by decreasing score; slot index = a * n_keys + b.
    """
    bs, heads, _ = q1.shape
    n_keys = keys1.shape[1]
    s1 = torch.einsum("bhd,hkd->bhk", q1, keys1)  # (bs, heads, n_keys)
    s2 = torch.einsum("bhd,hkd->bhk", q2, keys2)  # (bs, heads, n_keys)
    s1, i1 = s1.topk(knn, dim=2)  # (bs, heads, knn)
    s2, i2 = s2.topk(knn, dim=2)  # (bs, heads, knn)
    all_scores = (s1.unsqueeze(3) + s2.unsqueeze(2)).view(bs, heads, knn * knn)  # (bs, heads, knn^2)
    all_idx = (i1.unsqueeze(3) * n_keys + i2.unsqueeze(2)).view(bs, heads, knn * knn)  # (bs, heads, knn^2)
    scores, best = all_scores.topk(knn, dim=2, sorted=True)  # (bs, heads, knn)
    return scores, all_idx.gather(2, best)


def brute_force_topk(
    q1: torch.Tensor, q2: torch.Tensor, keys1: torch.Tensor, keys2: torch.Tensor, knn: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: score all n_keys^2 product keys [K1_a, K2_b] and take the top-`knn` (O(N); for tests)."""
    bs, heads, _ = q1.shape
    s1 = torch.einsum("bhd,hkd->bhk", q1, keys1)  # (bs, heads, n_keys)
    s2 = torch.einsum("bhd,hkd->bhk", q2, keys2)
    full = (s1.unsqueeze(3) + s2.unsqueeze(2)).reshape(bs, heads, -1)  # (bs, heads, n_keys^2), index a*n + b
    return full.topk(knn, dim=2, sorted=True)


# -- the memory layer ------------------------------------------------------------------------------------------------


class ValueTable(nn.Module):
    """The value table: N x v_dim, read as an EmbeddingBag (weighted sum), shared by a model's memory layers."""

    def __init__(self, size: int, v_dim: int):
        super().__init__()
        self.size, self.v_dim = size, v_dim
        self.weight = nn.Parameter(torch.empty(size, v_dim))
        self.weight.pk_value_param = True  # official marker: own LR group, own gradient clipping
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, mean=0.0, std=self.v_dim**-0.5)

    def forward(self, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        # indices, weights: (bs, bag) -> (bs, v_dim), one bag per row
        return F.embedding_bag(indices, self.weight, per_sample_weights=weights, mode="sum")


class ProductKeyMemory(nn.Module):
    """Product-key memory layer (Memory+ by default), a drop-in for a transformer block's FFN: (B, T, d) -> (B, T, d).

    Args:
        input_dim (`int`): model width d.
        output_dim (`int`, *optional*): output width (default d).
        n_keys (`int`, defaults to 128): sub-keys per side; N = n_keys^2 slots (official ``mem_n_keys`` 1024).
        heads (`int`, defaults to 4): memory heads, summed (official 4).
        knn (`int`, defaults to 16): slots read per head, also the per-side top-k (official 32).
        k_dim (`int`, defaults to 64): query / key width, split into two halves (official 512).
        v_dim (`int`, defaults to -1): value width; -1 = output_dim (official).
        swilu (`bool`, defaults to True): Memory+ output ``W_o(y * silu(W_s x))``; False = plain PKM.
        gated (`bool`, defaults to False): multiply the output by ``sigmoid(W_g x)`` (official ``mem_gated``).
        query_bias (`bool`, defaults to True) and query_batchnorm (`bool`, defaults to False): the query network
            (official defaults; batch-norm is Lample et al. 2019's original choice).
        values (`ValueTable`, *optional*): a shared table; default: a new one of N x v_dim.
        value_lr (`float`, *optional*, defaults to 1e-3): the value table's learning rate (``value_fixed_lr``); read
            by `memory_param_groups`. None = the model's learning rate.
    """

    def __init__(
        self,
        input_dim: int,
        output_dim: int | None = None,
        *,
        n_keys: int = 128,
        heads: int = 4,
        knn: int = 16,
        k_dim: int = 64,
        v_dim: int = -1,
        swilu: bool = True,
        gated: bool = False,
        query_bias: bool = True,
        query_batchnorm: bool = False,
        values: ValueTable | None = None,
        value_lr: float | None = 1e-3,
    ):
        super().__init__()
        output_dim = output_dim or input_dim
        if k_dim < 2 or k_dim % 2:
            raise ValueError(f"k_dim must be an even number >= 2, got {k_dim}")
        if heads < 1:
            raise ValueError(f"heads must be >= 1, got {heads}")
        if not 1 <= knn <= n_keys:
            raise ValueError(f"knn must be in [1, n_keys={n_keys}], got {knn}")
        self.input_dim, self.output_dim = input_dim, output_dim
        self.n_keys, self.heads, self.knn, self.k_dim = n_keys, heads, knn, k_dim
        self.size = n_keys**2
        self.v_dim = v_dim if v_dim > 0 else output_dim
        self.swilu = swilu
        self.value_lr = value_lr
        self.keys = nn.Parameter(torch.empty(2 * heads * n_keys, k_dim // 2))
        self.query_proj = nn.Linear(input_dim, heads * k_dim, bias=query_bias)
        self.query_bn = nn.BatchNorm1d(heads * k_dim) if query_batchnorm else None
        if values is None:
            values = ValueTable(self.size, self.v_dim)
        if values.size != self.size or values.v_dim != self.v_dim:
            raise ValueError(
                f"shared values are {values.size} x {values.v_dim}, this layer needs {self.size} x {self.v_dim}"
            )
        self.values = values
        # official: a value projection when v_dim is set explicitly or with swilu
        self.value_proj = nn.Linear(self.v_dim, output_dim) if (v_dim > 0 or swilu) else None
        self.swilu_projection = nn.Linear(input_dim, self.v_dim) if swilu else None
        self.gating = nn.Linear(input_dim, 1) if gated else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.k_dim)
        nn.init.uniform_(self.keys, -bound, bound)
        nn.init.xavier_uniform_(self.query_proj.weight)
        if self.query_proj.bias is not None:
            nn.init.zeros_(self.query_proj.bias)
        if self.value_proj is not None:
            nn.init.normal_(self.value_proj.weight, std=self.output_dim**-0.5)
            nn.init.zeros_(self.value_proj.bias)
        if self.swilu_projection is not None:
            nn.init.normal_(self.swilu_projection.weight, std=self.output_dim**-0.5)
            nn.init.zeros_(self.swilu_projection.bias)
        if self.gating is not None:
            nn.init.normal_(self.gating.weight, std=self.input_dim**-0.5)

    def lookup(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(bs, d) -> (scores, indices), both (bs, heads, knn): the slots read for each row."""
        q = self.query_proj(x)  # (bs, heads * k_dim)
        if self.query_bn is not None:
            q = self.query_bn(q)
        q = q.view(len(x), self.heads, self.k_dim)
        half = self.k_dim // 2
        keys = self.keys.view(self.heads, 2, self.n_keys, half)
        return product_key_topk(q[..., :half], q[..., half:], keys[:, 0], keys[:, 1], self.knn)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        shape = hidden.shape
        x = hidden.reshape(-1, self.input_dim)  # (bs, d)
        scores, indices = self.lookup(x)  # (bs, heads, knn)
        weights = F.softmax(scores.float(), dim=-1).type_as(scores)  # per head, then heads are summed
        y = self.values(indices.view(len(x), -1), weights.view(len(x), -1))  # (bs, v_dim)
        if self.swilu_projection is not None:
            y = self.value_proj(y * F.silu(self.swilu_projection(x)))
        elif self.value_proj is not None:
            y = self.value_proj(y)
        if self.gating is not None:
            y = torch.sigmoid(self.gating(x)) * y
        return y.view(*shape[:-1], self.output_dim)


# -- the MoE baseline ------------------------------------------------------------------------------------------------


class SwitchMoE(nn.Module):
    """Top-k mixture of SwiGLU experts (llama FFNs) with a softmax router and the Switch load-balancing loss.

    out = sum_{e in top-k} g_e * FFN_e(x), g = softmax(W_r x) (renormalised over the top-k when k > 1);
    aux = E * sum_e f_e * P_e (f_e: share of tokens routed to e, P_e: mean router probability), kept in `aux_loss`.
    """

    def __init__(self, d: int, d_ff: int, n_experts: int, top_k: int = 1):
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be in [1, n_experts={n_experts}], got {top_k}")
        self.d, self.d_ff, self.n_experts, self.top_k = d, d_ff, n_experts, top_k
        self.router = nn.Linear(d, n_experts, bias=False)
        self.w_gate = nn.Parameter(torch.empty(n_experts, d, d_ff))
        self.w_up = nn.Parameter(torch.empty(n_experts, d, d_ff))
        self.w_down = nn.Parameter(torch.empty(n_experts, d_ff, d))
        for w in (self.router.weight, self.w_gate, self.w_up, self.w_down):
            nn.init.normal_(w, std=0.02)
        self.aux_loss = torch.zeros(())
        self.last_load = torch.zeros(n_experts)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        shape = hidden.shape
        x = hidden.reshape(-1, self.d)  # (bs, d)
        probs = F.softmax(self.router(x).float(), dim=-1)  # (bs, E)
        gate, expert = probs.topk(self.top_k, dim=-1)  # (bs, k)
        if self.top_k > 1:
            gate = gate / gate.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        flat_expert = expert.reshape(-1)
        flat_gate = gate.reshape(-1).to(x.dtype)
        rows = torch.arange(len(x)).repeat_interleave(self.top_k)
        for e in range(self.n_experts):
            sel = (flat_expert == e).nonzero(as_tuple=True)[0]
            if len(sel) == 0:
                continue
            r = rows[sel]
            xe = x[r]  # (n_e, d)
            h = F.silu(xe @ self.w_gate[e]) * (xe @ self.w_up[e])  # (n_e, d_ff)
            out.index_add_(0, r, (h @ self.w_down[e]) * flat_gate[sel].unsqueeze(1))
        load = torch.bincount(flat_expert, minlength=self.n_experts).float() / len(flat_expert)
        self.last_load = load.detach()
        self.aux_loss = self.n_experts * (load * probs.mean(0)).sum()
        return out.view(shape)


# -- models ----------------------------------------------------------------------------------------------------------


def tiny_llama_config(vocab_size: int, *, hidden: int, n_layers: int, d_ff: int, heads: int, max_len: int) -> Any:
    """A LlamaConfig for a tiny from-scratch LM (tied embeddings, MHA, head_dim = hidden / heads)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=d_ff,
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=hidden // heads,
        max_position_embeddings=max_len,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        rms_norm_eps=1e-5,
        initializer_range=0.02,
    )


def build_llama(config: Any, seed: int) -> Any:
    """A seeded `LlamaForCausalLM` from `config` (fp32, sdpa attention); the global RNG state is left untouched."""
    from transformers import LlamaForCausalLM

    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(state)
    return model


def _blocks(model: Any) -> Any:
    inner = getattr(model, "model", model)
    if not hasattr(inner, "layers"):
        raise ValueError(f"{type(model).__name__} has no decoder layers (model.model.layers) to put a memory in")
    return inner.layers


def _check_layers(layers: Sequence[int], n: int) -> list[int]:
    out = sorted(set(int(i) for i in layers))
    if not out or out[0] < 0 or out[-1] >= n:
        raise ValueError(f"memory layers must be indices in [0, {n - 1}], got {list(layers)}")
    return out


def add_memory_layers(
    model: Any, layers: Sequence[int], *, share_values: bool = True, seed: int | None = None, **memory_kwargs: Any
) -> list[ProductKeyMemory]:
    """Replace the FFN (``layer.mlp``) of the chosen decoder layers by `ProductKeyMemory` modules, in place.

    Args:
        model: a Hugging Face decoder (``model.model.layers[i].mlp``), e.g. a `LlamaForCausalLM`.
        layers: decoder-layer indices (official: "4,12,20" of 24 or 32).
        share_values (`bool`, defaults to True): one value table for all the memory layers (official).
        seed (`int`, *optional*): seeds the new modules' initialisation (global RNG state restored).
        memory_kwargs: `ProductKeyMemory` arguments (n_keys, heads, knn, k_dim, v_dim, swilu, ...).

    Returns:
        The new memory modules, in layer order.
    """
    blocks = _blocks(model)
    idx = _check_layers(layers, len(blocks))
    d = model.config.hidden_size
    state = torch.random.get_rng_state()
    try:
        if seed is not None:
            torch.manual_seed(seed)
        shared = None
        mems = []
        for i in idx:
            mem = ProductKeyMemory(d, d, values=shared, **memory_kwargs)
            if share_values:
                shared = mem.values
            blocks[i].mlp = mem
            mems.append(mem)
    finally:
        torch.random.set_rng_state(state)
    return mems


def add_moe_layers(
    model: Any, layers: Sequence[int], *, n_experts: int, d_ff: int, top_k: int = 1, seed: int | None = None
) -> list[SwitchMoE]:
    """Replace the FFN of the chosen decoder layers by `SwitchMoE` modules, in place."""
    blocks = _blocks(model)
    idx = _check_layers(layers, len(blocks))
    state = torch.random.get_rng_state()
    try:
        if seed is not None:
            torch.manual_seed(seed)
        moes = []
        for i in idx:
            moe = SwitchMoE(model.config.hidden_size, d_ff, n_experts, top_k)
            blocks[i].mlp = moe
            moes.append(moe)
    finally:
        torch.random.set_rng_state(state)
    return moes


def memory_modules(model: Any) -> list[ProductKeyMemory]:
    return [m for m in model.modules() if isinstance(m, ProductKeyMemory)]


def moe_aux_loss(model: Any) -> torch.Tensor:
    """Sum of the last forward's load-balancing losses over the model's `SwitchMoE` layers (0 without any)."""
    losses = [m.aux_loss for m in model.modules() if isinstance(m, SwitchMoE)]
    return torch.stack(losses).sum() if losses else torch.zeros(())


def memory_param_groups(model: Any, *, value_lr: float | None = None) -> list[dict[str, Any]]:
    """AdamW parameter groups for `pretrain_lm`: the value tables apart, with their own learning rate.

    Groups: weights (decayed), 1-D parameters (no decay), then the value tables (``lr`` = `value_lr` or, if None,
    the layers' own ``value_lr``; weight decay as the weights, as the official single-decay AdamW does; gradients
    clipped apart: ``clip_group="pk_values"``, official ``train.py``). Shared tables appear once.
    """
    values = {id(p): p for p in model.parameters() if getattr(p, "pk_value_param", False)}
    if value_lr is None:
        lrs = {m.value_lr for m in memory_modules(model)}
        value_lr = next(iter(lrs)) if len(lrs) == 1 else None
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in values]
    rest = list({id(p): p for p in rest}.values())
    groups: list[dict[str, Any]] = [
        {"params": [p for p in rest if p.ndim >= 2]},
        {"params": [p for p in rest if p.ndim < 2], "weight_decay": 0.0},
    ]
    if values:
        group: dict[str, Any] = {"params": list(values.values()), "clip_group": "pk_values"}
        if value_lr is not None:
            group["lr"] = value_lr
        groups.append(group)
    return groups


# -- analytic costs --------------------------------------------------------------------------------------------------


@dataclass
class BlockCost:
    """Per-token forward cost of one FFN-position block: multiply-accumulates, parameters, bytes of weights read."""

    macs: float
    params: int
    active_params: float
    bytes_read: float

    @property
    def flops(self) -> float:
        return 2.0 * self.macs


def ffn_cost(d: int, d_ff: int, bytes_per: int = 4) -> BlockCost:
    p = 3 * d * d_ff
    return BlockCost(p, p, p, p * bytes_per)


def memory_cost(mem: ProductKeyMemory, bytes_per: int = 4) -> BlockCost:
    """MACs per token of a memory layer: query projection, 2 x heads x n_keys sub-key scores of k_dim/2, the k^2
    candidate sums (counted as MACs), the weighted value sum, swilu and output projections; top-k's not counted.
    Bytes: the dense weights plus the heads * knn value rows gathered (the whole table is never read)."""
    d, h, k, kd, v = mem.input_dim, mem.heads, mem.knn, mem.k_dim, mem.v_dim
    macs = d * h * kd + 2 * h * mem.n_keys * (kd // 2) + h * k * k + h * k * v
    dense = d * h * kd + mem.keys.numel()
    if mem.swilu_projection is not None:
        macs += d * v
        dense += d * v
    if mem.value_proj is not None:
        macs += v * mem.output_dim
        dense += v * mem.output_dim
    if mem.gating is not None:
        macs += d
        dense += d
    params = sum(p.numel() for n, p in mem.named_parameters() if not n.startswith("values."))
    return BlockCost(macs, params + mem.values.weight.numel(), dense + h * k * v, (dense + h * k * v) * bytes_per)


def moe_cost(moe: SwitchMoE, bytes_per: int = 4) -> BlockCost:
    expert = 3 * moe.d * moe.d_ff
    macs = moe.d * moe.n_experts + moe.top_k * expert
    params = moe.n_experts * expert + moe.d * moe.n_experts
    return BlockCost(macs, params, macs, macs * bytes_per)


def model_costs(model: Any, seq_len: int) -> dict[str, float]:
    """Analytic forward cost per token of a llama-style model whose FFNs may be memories or MoEs.

    ``flops_per_token`` = 2 x (attention projections + FFN-position blocks + LM head MACs) + causal attention scores
    at the mean context length seq_len / 2 (2 x 2 x d x ctx per layer); ``params`` counts everything once
    (embeddings included); ``active_params`` the weights one token touches.
    """
    cfg = model.config
    d, n_layers = cfg.hidden_size, cfg.num_hidden_layers
    hd = getattr(cfg, "head_dim", None) or d // cfg.num_attention_heads
    attn_proj = d * cfg.num_attention_heads * hd * 2 + d * cfg.num_key_value_heads * hd * 2
    macs = n_layers * (attn_proj + 2 * hd * cfg.num_attention_heads * (seq_len / 2))
    active = float(n_layers * attn_proj)
    for block in _blocks(model):
        mlp = block.mlp
        if isinstance(mlp, ProductKeyMemory):
            c = memory_cost(mlp)
        elif isinstance(mlp, SwitchMoE):
            c = moe_cost(mlp)
        else:
            c = ffn_cost(d, mlp.gate_proj.out_features)
        macs += c.macs
        active += c.active_params
    head = cfg.vocab_size * d
    macs += head
    active += head
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    values = sum(
        p.numel() for p in {id(p): p for p in model.parameters() if getattr(p, "pk_value_param", False)}.values()
    )
    return {
        "flops_per_token": 2.0 * macs,
        "params": float(params),
        "non_embedding_params": float(params - cfg.vocab_size * d),
        "memory_value_params": float(values),
        "active_params": active,
    }


def solve_moe_experts(target_extra_params: float, d: int, d_ff: int) -> int:
    """Experts E so that E SwiGLU experts of width d_ff plus a router (E x d) hold about `target_extra_params`."""
    per = 3 * d * d_ff + d
    return max(2, int(round(target_extra_params / per)))


def parameters_changed(before: dict[str, torch.Tensor], model: Any) -> dict[str, bool]:
    """Which named parameters differ from a `state_dict` snapshot (for tests and diagnostics)."""
    now = dict(model.named_parameters())
    return {k: not torch.equal(v, now[k].detach()) for k, v in before.items() if k in now}


def changed_rows(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """Indices of the rows of a (N, v) table that changed."""
    return (before != after).any(dim=1).nonzero(as_tuple=True)[0]


def slots_read(model: Any, input_ids: torch.Tensor) -> list[torch.Tensor]:
    """The value slots each memory layer reads for `input_ids` (one (tokens, heads, knn) tensor per layer)."""
    out: list[torch.Tensor] = []
    handles = []

    def hook(mod: ProductKeyMemory, args: tuple, _: Any) -> None:
        with torch.no_grad():
            out.append(mod.lookup(args[0].reshape(-1, mod.input_dim))[1])

    for m in memory_modules(model):
        handles.append(m.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(input_ids=input_ids)
    finally:
        for h in handles:
            h.remove()
    return out


def unique_slots(tensors: Iterable[torch.Tensor]) -> int:
    return int(torch.unique(torch.cat([t.reshape(-1) for t in tensors])).numel()) if tensors else 0
