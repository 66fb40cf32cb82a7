"""Autonomy-of-Experts (AoE): router-free MoE layers, the router-MoE baseline, a post-hoc split of a pretrained FFN.

    a_i = x W_down^i,  p = softmax_i ||a_i||_2,  S = top-k(p),  y = sum_{i in S} g_i (SiLU(a_i W_up^i) * x W_p^i) W_o^i

Paper: Lv et al., "Autonomy-of-Experts Models", ICML 2025, https://arxiv.org/abs/2501.13074 (official plain-PyTorch
reference: `moe.py` of https://github.com/trestad/Autonomy-of-Experts, commit 280e227; megablocks `AoE.py`).

Every expert is a SwiGLU FFN whose SiLU-side projection is factorised, W_g^i = W_down^i (d x d_low) W_up^i
(d_low x d_wide). All experts pre-compute a_i = x W_down^i (one fused matmul), are ranked by ||a_i||, and only the
top-k finish their forward pass, re-using the cached a_i; the others abort. Gate weights are the softmax of the norms
restricted to the top-k and renormalised (`moe.py`; megablocks `AoE.py` skips the renormalisation: `renormalize`).
The auxiliary load-balancing loss is Mixtral's E * sum_e f_e P_e on the softmax of the norms (`moe.py`'s
`load_balancing_loss_func`), and the router MoE baseline (`RouterMoE`) uses the same function on its router logits.
Both layers share one expert loop (`moe.py`'s per-expert `where` -> gather -> matmul -> `index_add_`), so only the
selection differs.

`MoEfiedFFN` is the post-hoc proxy on a pretrained model: it splits a Llama MLP's d_ff units into E groups and keeps
the top-k groups per token under a ranking rule (AoE low-rank norm from an SVD of each group's gate weights, the exact
intermediate norm, the full gate norm, a fitted linear router, or random).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

INIT_STD = 0.02  # `init_normal_(std=0.02)` for every weight in `moe.py`


def load_balancing_loss(logits: torch.Tensor, num_experts: int, top_k: int) -> torch.Tensor:
    """Mixtral/Switch auxiliary loss E * sum_e f_e P_e, exactly `moe.py`'s `load_balancing_loss_func`.

    Args:
        logits: (tokens, E) selection logits (router logits, or AoE's activation norms).
        num_experts: E.
        top_k: experts per token.

    Returns:
        A scalar: 1.0 for perfectly uniform loads and probabilities (f_e = k/E summed over the k slots), larger
        when the same experts get both the tokens and the probability mass.
    """
    probs = F.softmax(logits.float(), dim=-1)  # (T, E)
    _, selected = torch.topk(probs, top_k, dim=-1)  # (T, k)
    mask = F.one_hot(selected, num_experts).float()  # (T, k, E)
    tokens_per_expert = mask.mean(dim=0)  # (k, E)
    prob_per_expert = probs.mean(dim=0)  # (E,)
    return (tokens_per_expert * prob_per_expert.unsqueeze(0)).sum() * num_experts


def aoe_d_wide_for_params(d_model: int, n_experts: int, moe_d_ff: int, d_low: int) -> int:
    """AoE expert width d_wide whose total parameters match a router MoE with experts of width `moe_d_ff`.

    Router MoE per layer: d E (router) + E * 3 d d_ff. AoE per layer: E * (d d_low + d_wide (d_low + 2 d)). The paper
    enlarges d_wide to make up for the removed router and the factorised gate; the official README asks users to
    check this by hand. Returns the nearest integer (the residual mismatch is < E (d_low + 2 d) / 2 parameters).
    """
    target = d_model * n_experts + n_experts * 3 * d_model * moe_d_ff
    fixed = n_experts * d_model * d_low
    per_unit = n_experts * (d_low + 2 * d_model)
    return max(1, round((target - fixed) / per_unit))


@dataclass
class Selection:
    """What one MoE forward selected: enough for the balance and confidence statistics."""

    logits: torch.Tensor  # (T, E): router logits or AoE norms (detached)
    selected: torch.Tensor  # (T, k) expert ids
    weights: torch.Tensor  # (T, k) gate weights used


class _ExpertMoEBase(nn.Module):
    """Shared parts of `AoEMoE` and `RouterMoE`: the expert loop, gating, aux loss and bookkeeping.

    Weights are stored stacked per expert (E, in, out) in the x @ W convention of `moe.py`.
    After each forward, `aux_loss` holds the load-balancing loss of that call and `last` the `Selection` (when
    `record` is True).
    """

    def __init__(self, d_model: int, n_experts: int, top_k: int, *, renormalize: bool = True):
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be in [1, n_experts={n_experts}], got {top_k}")
        self.d_model, self.n_experts, self.top_k, self.renormalize = d_model, n_experts, top_k, renormalize
        self.aux_loss: torch.Tensor | None = None
        self.record = False
        self.last: Selection | None = None

    def _gate(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # `moe.py`: softmax in fp32 over all experts, top-k, renormalise over the k, cast back
        probs = F.softmax(logits, dim=-1, dtype=torch.float)  # (T, E)
        weights, selected = torch.topk(probs, self.top_k, dim=-1)  # (T, k)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, selected

    def _expert_out(self, e: int, tokens: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _mixture(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """sum over the selected experts of gate weight x expert output, one expert at a time (`moe.py`'s loop)."""
        weights, selected = self._gate(logits)
        weights = weights.to(x.dtype)
        out = torch.zeros_like(x)  # (T, d)
        mask = F.one_hot(selected, self.n_experts).permute(2, 1, 0)  # (E, k, T)
        for e in range(self.n_experts):
            slot, tokens = torch.where(mask[e])  # tokens that chose expert e, and in which of their k slots
            if tokens.numel() == 0:
                continue
            y = self._expert_out(e, tokens, x) * weights[tokens, slot, None]  # (n_e, d)
            out.index_add_(0, tokens, y.to(x.dtype))
        self.aux_loss = load_balancing_loss(logits, self.n_experts, self.top_k)
        if self.record:
            self.last = Selection(logits.detach(), selected.detach(), weights.detach())
        return out

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])  # (T, d)
        return self._mixture(x, self._logits(x)).reshape(shape)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class AoEMoE(_ExpertMoEBase):
    """Autonomy-of-Experts layer: experts rank themselves by ||x W_down^i||_2; the top-k finish with the cached a_i.

        a = x [W_down^1 ... W_down^E] -> (T, E, d_low);  logits = ||a||_2 over d_low;  gates = renorm(top-k softmax)
        y = sum_{i in top-k} g_i (SiLU(a_i W_up^i) * (x W_p^i)) W_o^i

    Args:
        d_model (`int`): model width d.
        n_experts (`int`): E (paper, small models: 8 [unverified]).
        top_k (`int`): experts per token (paper: 2 [unverified]).
        d_low (`int`): rank of the factorised gate (`moe.py`: `dim4route` = 128).
        d_wide (`int`): expert width (`moe.py`: `fuel_dim` = 4096); see `aoe_d_wide_for_params`.
        renormalize (`bool`, defaults to `True`): renormalise the top-k softmax weights (`moe.py`; megablocks no).
    """

    def __init__(self, d_model: int, n_experts: int, top_k: int, d_low: int, d_wide: int, *, renormalize: bool = True):
        super().__init__(d_model, n_experts, top_k, renormalize=renormalize)
        self.d_low, self.d_wide = d_low, d_wide
        # W_down of all experts fused into one (d, E * d_low) matrix (megablocks `AoE.py`: self.wg)
        self.w_down = nn.Parameter(torch.empty(d_model, n_experts * d_low))
        self.w_up = nn.Parameter(torch.empty(n_experts, d_low, d_wide))  # `dim4route_to_hidden_dim`
        self.w_p = nn.Parameter(torch.empty(n_experts, d_model, d_wide))  # `dim_to_hidden_dim` (linear side)
        self.w_o = nn.Parameter(torch.empty(n_experts, d_wide, d_model))  # `hidden_dim_to_dim`
        self._acts: torch.Tensor | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for w in (self.w_down, self.w_up, self.w_p, self.w_o):
            nn.init.normal_(w, std=INIT_STD)

    def low_rank_acts(self, x: torch.Tensor) -> torch.Tensor:
        """(T, E, d_low): every expert's low-rank pre-activation a_i = x W_down^i."""
        return (x @ self.w_down).view(x.shape[0], self.n_experts, self.d_low)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        self._acts = self.low_rank_acts(x)  # cached: the selected experts re-use it (no second x W_down)
        return torch.linalg.vector_norm(self._acts, dim=-1)  # (T, E)

    def _expert_out(self, e: int, tokens: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        a = self._acts[tokens, e]  # (n_e, d_low), the cached pre-activation
        h = F.silu(a @ self.w_up[e]) * (x[tokens] @ self.w_p[e])  # (n_e, d_wide)
        return h @ self.w_o[e]  # (n_e, d)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        try:
            return super().forward(hidden_states)
        finally:
            self._acts = None

    def expert_output(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e's full SwiGLU output on (T, d) inputs (for tests and the dense mixture)."""
        a = x @ self.w_down[:, e * self.d_low : (e + 1) * self.d_low]
        return (F.silu(a @ self.w_up[e]) * (x @ self.w_p[e])) @ self.w_o[e]


class RouterMoE(_ExpertMoEBase):
    """The traditional MoE baseline (`moe.py`'s `MoE`): a linear router, softmax -> top-k -> renormalise, SwiGLU
    experts of width `d_ff`, the same aux loss and the same expert loop as `AoEMoE`.

        logits = x W_r;  y = sum_{i in top-k} g_i (SiLU(x W_g^i) * (x W_p^i)) W_o^i
    """

    def __init__(self, d_model: int, n_experts: int, top_k: int, d_ff: int, *, renormalize: bool = True):
        super().__init__(d_model, n_experts, top_k, renormalize=renormalize)
        self.d_ff = d_ff
        self.router = nn.Parameter(torch.empty(d_model, n_experts))  # `nn.Linear(dim, E, bias=False)`
        self.w_g = nn.Parameter(torch.empty(n_experts, d_model, d_ff))
        self.w_p = nn.Parameter(torch.empty(n_experts, d_model, d_ff))
        self.w_o = nn.Parameter(torch.empty(n_experts, d_ff, d_model))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for w in (self.router, self.w_g, self.w_p, self.w_o):
            nn.init.normal_(w, std=INIT_STD)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.router  # (T, E)

    def _expert_out(self, e: int, tokens: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        xe = x[tokens]  # (n_e, d)
        return (F.silu(xe @ self.w_g[e]) * (xe @ self.w_p[e])) @ self.w_o[e]

    def expert_output(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return (F.silu(x @ self.w_g[e]) * (x @ self.w_p[e])) @ self.w_o[e]


class DenseFFN(nn.Module):
    """A dense SwiGLU FFN (the equal-active-parameter sanity baseline); `aux_loss` is always 0."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w_g = nn.Parameter(torch.empty(d_model, d_ff))
        self.w_p = nn.Parameter(torch.empty(d_model, d_ff))
        self.w_o = nn.Parameter(torch.empty(d_ff, d_model))
        for w in (self.w_g, self.w_p, self.w_o):
            nn.init.normal_(w, std=INIT_STD)
        self.aux_loss: torch.Tensor | None = None
        self.record = False
        self.last = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.aux_loss = x.new_zeros(())
        return (F.silu(x @ self.w_g) * (x @ self.w_p)) @ self.w_o


def dense_mixture(layer: _ExpertMoEBase, x: torch.Tensor) -> torch.Tensor:
    """sum_e softmax(logits)_e y_e over ALL experts: what an MoE layer computes with top_k = E (renormalised)."""
    probs = F.softmax(layer._logits(x), dim=-1, dtype=torch.float).to(x.dtype)  # (T, E)
    if isinstance(layer, AoEMoE):
        layer._acts = None
    return sum(probs[:, e : e + 1] * layer.expert_output(e, x) for e in range(layer.n_experts))


def ffn_flops_per_token(kind: str, d_model: int, n_experts: int, top_k: int, width: int, d_low: int = 0) -> dict:
    """Multiply-adds per token of one FFN layer: selection, active experts, and their sum (forward only)."""
    if kind == "aoe":
        select = d_model * n_experts * d_low  # x W_down for all experts (the ranking cost)
        experts = top_k * (d_low * width + 2 * d_model * width)  # W_up on the cached a_i, W_p, W_o
    elif kind == "router_moe":
        select = d_model * n_experts
        experts = top_k * 3 * d_model * width
    elif kind == "dense":
        select, experts = 0, 3 * d_model * width
    else:
        raise ValueError(f"kind must be 'aoe', 'router_moe' or 'dense', got {kind!r}")
    return {"selection_macs": select, "expert_macs": experts, "total_macs": select + experts}


def moe_layers(model: nn.Module) -> list[nn.Module]:
    """The FFN modules (`AoEMoE`, `RouterMoE`, `DenseFFN`) of a model, in order."""
    return [m for m in model.modules() if isinstance(m, _ExpertMoEBase | DenseFFN)]


def total_aux_loss(model: nn.Module) -> torch.Tensor:
    """Sum over layers of the load-balancing losses of the last forward."""
    losses = [m.aux_loss for m in moe_layers(model) if m.aux_loss is not None]
    if not losses:
        raise RuntimeError("no MoE layer has run a forward pass yet")
    return torch.stack(losses).sum()


def install_ffn(model: nn.Module, make: Callable[[int], nn.Module]) -> nn.Module:
    """Replace every decoder layer's `mlp` of a HF Llama-style model by `make(layer_index)`; returns the model."""
    for i, layer in enumerate(model.model.layers):
        layer.mlp = make(i)
    return model


# ----------------------------------------------------------------------------------------------------------------
# balance and confidence statistics
# ----------------------------------------------------------------------------------------------------------------


def load_fractions(selected: torch.Tensor, n_experts: int) -> torch.Tensor:
    """(E,) share of the T * k assignments that went to each expert (sums to 1)."""
    counts = torch.bincount(selected.reshape(-1), minlength=n_experts).float()
    return counts / counts.sum().clamp_min(1.0)


def balance_stats(selected: torch.Tensor, logits: torch.Tensor, n_experts: int) -> dict[str, float]:
    """Load balance and selection confidence of one layer over a set of tokens.

    Returns:
        ``load_cv`` (std/mean of the per-expert loads; 0 = perfectly balanced), ``max_load`` (largest load / the
        uniform load; 1 = balanced, E/k = one expert takes every token), ``load_entropy`` (entropy of the load
        distribution / log E; 1 = uniform), ``routing_entropy`` (mean per-token entropy of softmax(logits) in nats;
        lower = more confident selection).
    """
    f = load_fractions(selected, n_experts)
    cv = float(f.std(unbiased=False) / f.mean())
    nz = f[f > 0]
    load_entropy = float(-(nz * nz.log()).sum() / math.log(n_experts))
    p = F.softmax(logits.float(), dim=-1)
    routing_entropy = float(-(p * p.clamp_min(1e-12).log()).sum(-1).mean())
    return {
        "load_cv": cv,
        "max_load": float(f.max() * n_experts),
        "load_entropy": load_entropy,
        "routing_entropy": routing_entropy,
    }


# ----------------------------------------------------------------------------------------------------------------
# post-hoc: a pretrained FFN split into experts
# ----------------------------------------------------------------------------------------------------------------

RULES: tuple[str, ...] = ("dense", "oracle", "gate_norm", "aoe_lowrank", "router", "random")


def svd_low_rank_down(w_gate: torch.Tensor, d_low: int) -> torch.Tensor:
    """W_down (d, d_low) of the best rank-d_low factorisation W_g ~ W_down W_up of one expert's gate.

    `w_gate` is (d, width) in the x @ W convention. With W_g = U S V^T, W_down = U_r S_r and W_up = V_r^T: since V_r
    has orthonormal columns, ||x W_down|| = ||x W_down W_up||, the norm of the rank-d_low gate pre-activation.
    """
    u, s, _ = torch.linalg.svd(w_gate.float(), full_matrices=False)
    return (u[:, :d_low] * s[:d_low]).to(w_gate.dtype)


class MoEfiedFFN(nn.Module):
    """A pretrained Llama MLP split into `n_experts` contiguous groups of its d_ff units; per token only the top-k
    groups under `rule` contribute (the rest are zeroed: same output as computing only the selected groups).

    Selected groups are summed with weight 1, so that `top_k = n_experts` (or rule ``dense``) gives the unsplit FFN
    exactly; the post-hoc model has no gate weights to learn.

    Rules (scores per token and group e; the top-k scores are kept):
        ``oracle``: ||SiLU(x W_g^e) * x W_u^e|| (the exact intermediate norm; E times a group's cost);
        ``gate_norm``: ||x W_g^e||, the full gate pre-activation (the paper's "internal activation" of W_g);
        ``aoe_lowrank``: ||x W_down^e|| with W_down^e from a rank-`d_low` SVD of W_g^e (AoE's ranking);
        ``router``: x W_r, a fitted linear router (`fit_router`); ``random``: seeded uniform scores;
        ``dense``: no selection.
    """

    def __init__(self, mlp: nn.Module, n_experts: int, top_k: int, *, d_low: int = 32, seed: int = 0):
        super().__init__()
        d_ff = mlp.gate_proj.weight.shape[0]
        if d_ff % n_experts:
            raise ValueError(f"n_experts must divide the FFN width {d_ff}, got {n_experts}")
        width = d_ff // n_experts
        if not 1 <= d_low <= min(width, mlp.gate_proj.weight.shape[1]):
            raise ValueError(f"d_low must be in [1, {min(width, mlp.gate_proj.weight.shape[1])}], got {d_low}")
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be in [1, {n_experts}], got {top_k}")
        self.mlp, self.n_experts, self.top_k, self.width, self.d_low = mlp, n_experts, top_k, width, d_low
        w_g = mlp.gate_proj.weight.detach().T  # (d, d_ff)
        downs = [svd_low_rank_down(w_g[:, e * width : (e + 1) * width], d_low) for e in range(n_experts)]
        self.register_buffer("w_down", torch.cat(downs, dim=1), persistent=False)  # (d, E * d_low)
        self.register_buffer("router", torch.zeros(w_g.shape[0], n_experts), persistent=False)
        self.register_buffer("router_bias", torch.zeros(n_experts), persistent=False)
        self.rule = "dense"
        self.seed = seed
        self._generator = torch.Generator().manual_seed(seed)
        self.record = False
        self.reset_stats()

    def reset_random(self, seed: int | None = None) -> None:
        """Restart the random rule's generator (same seed, same draws)."""
        self._generator = torch.Generator().manual_seed(self.seed if seed is None else seed)

    def scores(self, x: torch.Tensor, rule: str, g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """(T, E) ranking scores of `rule`, given x (T, d), the gate pre-activation g and intermediate h (T, d_ff)."""
        t, e = x.shape[0], self.n_experts
        if rule == "oracle":
            return torch.linalg.vector_norm(h.view(t, e, self.width), dim=-1)
        if rule == "gate_norm":
            return torch.linalg.vector_norm(g.view(t, e, self.width), dim=-1)
        if rule == "aoe_lowrank":
            return torch.linalg.vector_norm((x @ self.w_down).view(t, e, self.d_low), dim=-1)
        if rule == "router":
            return x @ self.router + self.router_bias
        if rule == "random":
            return torch.rand(t, e, generator=self._generator).to(x.dtype)
        raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        mlp = self.mlp
        g = mlp.gate_proj(hidden_states)  # (..., d_ff)
        h = mlp.act_fn(g) * mlp.up_proj(hidden_states)
        if self.rule != "dense" and self.top_k < self.n_experts:
            shape = h.shape
            x2 = hidden_states.reshape(-1, hidden_states.shape[-1])  # (T, d)
            g2 = g.reshape(-1, shape[-1])  # (T, d_ff)
            h2 = h.reshape(-1, shape[-1])
            s = self.scores(x2, self.rule, g2, h2)  # (T, E)
            selected = torch.topk(s, self.top_k, dim=-1).indices  # (T, k)
            keep = torch.zeros_like(s).scatter_(1, selected, 1.0)  # (T, E)
            if self.record:  # before masking: the oracle's choice on the same input
                oracle = torch.topk(self.scores(x2, "oracle", g2, h2), self.top_k, dim=-1).indices  # (T, k)
                self.overlap_sum += float(keep.gather(1, oracle).sum()) / self.top_k
                self.n_tokens += s.shape[0]
                self.load_counts += torch.bincount(selected.reshape(-1), minlength=self.n_experts).double()
            h = (h2.view(-1, self.n_experts, self.width) * keep.unsqueeze(-1)).view(shape)
        return mlp.down_proj(h)

    def reset_stats(self) -> None:
        """Zero the accumulated selection statistics (filled while `record` is True)."""
        self.overlap_sum, self.n_tokens = 0.0, 0
        self.load_counts = torch.zeros(self.n_experts, dtype=torch.float64)

    @property
    def oracle_recall(self) -> float:
        """Mean share of the oracle's top-k groups that the rule also kept (1.0 for the oracle itself)."""
        return self.overlap_sum / self.n_tokens if self.n_tokens else float("nan")


def moefy(model: nn.Module, n_experts: int, top_k: int, *, d_low: int = 32, seed: int = 0) -> list[MoEfiedFFN]:
    """Wrap every decoder layer's MLP of a Llama-style HF model in `MoEfiedFFN` (in place); returns the wrappers."""
    wrappers = []
    for i, layer in enumerate(model.model.layers):
        mlp = layer.mlp.mlp if isinstance(layer.mlp, MoEfiedFFN) else layer.mlp
        layer.mlp = MoEfiedFFN(mlp, n_experts, top_k, d_low=d_low, seed=seed * 1000 + i)
        wrappers.append(layer.mlp)
    return wrappers


def unmoefy(model: nn.Module) -> None:
    """Undo `moefy`: put the original MLPs back."""
    for layer in model.model.layers:
        if isinstance(layer.mlp, MoEfiedFFN):
            layer.mlp = layer.mlp.mlp


def set_rule(wrappers: list[MoEfiedFFN], rule: str, *, top_k: int | None = None) -> None:
    """Switch every wrapper to `rule` (and optionally another k); resets the random generators."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
    for w in wrappers:
        w.rule = rule
        if top_k is not None:
            if not 1 <= top_k <= w.n_experts:
                raise ValueError(f"top_k must be in [1, {w.n_experts}], got {top_k}")
            w.top_k = top_k
        w.reset_random()


@torch.no_grad()
def fit_router(wrapper: MoEfiedFFN, x: torch.Tensor, *, ridge: float = 1e-2) -> float:
    """Fit the wrapper's linear router to the oracle scores on inputs x (T, d) by ridge regression (closed form).

    MoEfication-style: the router learns to predict each group's exact intermediate norm from the FFN input. Returns
    the share of tokens whose predicted top-k equals the oracle top-k set, on the fitting inputs.
    """
    mlp = wrapper.mlp
    g = mlp.gate_proj(x)
    h = mlp.act_fn(g) * mlp.up_proj(x)
    target = wrapper.scores(x, "oracle", g, h).double()  # (T, E)
    xd = x.double()
    mean_x, mean_t = xd.mean(0), target.mean(0)
    xc, tc = xd - mean_x, target - mean_t
    scale = xc.pow(2).sum(0).mean().clamp_min(1e-12) / xc.shape[0]
    a = xc.T @ xc + ridge * scale * xc.shape[0] * torch.eye(xc.shape[1], dtype=torch.float64)
    w = torch.linalg.solve(a, xc.T @ tc)  # (d, E)
    wrapper.router.copy_(w.to(wrapper.router.dtype))
    wrapper.router_bias.copy_((mean_t - mean_x @ w).to(wrapper.router.dtype))
    pred = wrapper.scores(x, "router", g, h)
    k = wrapper.top_k
    same = torch.topk(pred, k, dim=-1).indices.sort(-1).values == torch.topk(target, k, dim=-1).indices.sort(-1).values
    return float(same.all(-1).float().mean())


def selection_macs(rule: str, d_model: int, d_ff: int, n_experts: int, d_low: int) -> int:
    """Multiply-adds per token and layer spent on choosing the groups under `rule` (before any expert computes)."""
    return {
        "dense": 0,
        "oracle": 2 * d_model * d_ff,  # gate and up projections of every group: the whole FFN's first half
        "gate_norm": d_model * d_ff,
        "aoe_lowrank": d_model * n_experts * d_low,
        "router": d_model * n_experts,
        "random": 0,
    }[rule]
