"""Independence tests for language models: p̂ = (1 + #{t : φ(π_t(θ1), θ2) ≥ φ(θ1, θ2)}) / (T + 1).

Zhu, Ahmed, Kuditipudi & Liang, "Independence Tests for Language Models" (ICML 2025, https://arxiv.org/abs/2502.12292;
official code https://github.com/ahmeda14960/model-tracing, mirror salzhu/model-tracing, read at 9ff5378).
H0: θ1 ⊥ θ2 (independent random initialisations; the training data may be anything). Pure: no I/O, no printing.

Constrained setting (same architecture; the init distribution is invariant under a group Π of hidden-unit
permutations and training is permutation-equivariant):

* PERMTEST (`permtest`, paper Algorithm 1; code ``tracing/statistics/perm_mc_l2.py``). Draw π_1..π_T uniformly from
  Π = (one permutation σ of the d residual dimensions) x (one permutation τ_l of the h MLP units of every block l),
  apply π_t to θ1 consistently (`permute_model`), and return p̂ above: exact for any statistic φ, floor 1/(T + 1).
  φ_L2 = −mean_W ||W1 − W2||_F over the parameter tensors (code ``tracing/statistics/l2.py``: the mean of per-tensor
  Frobenius distances, smaller = closer; negated here so that larger = more similar); φ_cos = mean_W cos(vec W1,
  vec W2) (lmlab's second weight statistic).
* CSW (`csw_test`, the Hungarian-matching variant; code ``tracing/statistics/csu.py``): per block, C = cos(rows of
  W_up^(1), rows of W_up^(2)) (h x h, float64), π = LAP(C, maximize) (`scipy.optimize.linear_sum_assignment`),
  p_l = Spearman(π, identity) two-sided (``scipy.stats.spearmanr``); FISHER: χ² = −2 Σ_l log p_l, df = 2L,
  p = chi2.sf (``combine_pvalues(method="fisher")``). Under H0 the units of θ1 are exchangeable, so π is a uniform
  random permutation relative to the identity.
* CSH (`csh_from_activations`; code ``tracing/statistics/csh.py``): the same on the *activations* of ``up_proj``
  (rows = units, columns = tokens).

Unconstrained setting (the adversary may permute units, rotate the residual stream, change the architecture):

* MATCH (`match_test`; code ``tracing/statistics/match.py``, ``tracing/utils/llama/matching.py:match_wmats``): run the
  same inputs through both models, take the outputs of ``gate_proj`` and ``up_proj`` of block i (rows = units,
  columns = tokens); π_gate = LAP(squared Euclidean distances of gate rows), π_up = LAP(... of up rows);
  p_i = Spearman(π_gate, π_up). In a GLU, gate and up share the unit index, so a derived model has π_gate ≈ π_up
  even after permuting units and rotating the residual stream (each model computes its activations in its own
  basis, so a rotation never reaches them). Not exact; "behaves like a p-value" on independent pairs.
* Localized testing (`localized_match`; code ``match.py:statistic_all``): MATCH on block pairs (i, j); i is matched
  to the first unmatched j with p < 1e-6.
* Generalized robust test (`generalized_match`, paper Algorithm 5; code ``experiments/generalized_match.py``):
  distil each model's block-i MLP into a fresh GLU on X ~ N(0, I_d) (MSE, Adam), then MATCH the distilled gate/up.

Attacks and derived models (`permute_model`, `rotate_residual`, `retrain_mlp_block`, `keep_layers`) keep every tensor
that shares a hidden index consistent, so outputs are unchanged (or, for a retrained block, approximately so).
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

RESID = "resid"
# a p-value of 0 (e.g. Spearman of two identical permutations of 1536 units) is clipped here for logs and Fisher
P_FLOOR = 1e-300

# -- which hidden index each dimension of a parameter carries (llama / gemma3 naming) ------------------------------
# "M" marks the block's MLP units; None an index no permutation touches (vocabulary, heads, head dimensions).
_M = "M"
_BLOCK_PLAN: dict[str, tuple[str | None, ...]] = {
    "self_attn.q_proj.weight": (None, RESID),
    "self_attn.k_proj.weight": (None, RESID),
    "self_attn.v_proj.weight": (None, RESID),
    "self_attn.q_proj.bias": (None,),
    "self_attn.k_proj.bias": (None,),
    "self_attn.v_proj.bias": (None,),
    "self_attn.o_proj.weight": (RESID, None),
    "self_attn.o_proj.bias": (RESID,),
    "self_attn.q_norm.weight": (None,),  # gemma3 / qwen3: per head dimension, after the projection
    "self_attn.k_norm.weight": (None,),
    "mlp.gate_proj.weight": (_M, RESID),
    "mlp.up_proj.weight": (_M, RESID),
    "mlp.down_proj.weight": (RESID, _M),
    "mlp.gate_proj.bias": (_M,),
    "mlp.up_proj.bias": (_M,),
    "mlp.down_proj.bias": (RESID,),
    "input_layernorm.weight": (RESID,),
    "post_attention_layernorm.weight": (RESID,),
    "pre_feedforward_layernorm.weight": (RESID,),  # gemma3 sandwich norms
    "post_feedforward_layernorm.weight": (RESID,),
}
_TOP_PLAN: dict[str, tuple[str | None, ...]] = {
    "model.embed_tokens.weight": (None, RESID),
    "lm_head.weight": (None, RESID),
    "model.norm.weight": (RESID,),
}
_BLOCK_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
ROTATABLE = ("llama", "mistral", "qwen2", "qwen3")  # RMSNorm(x) = w * x / rms(x): the scale folds into the next linear


def index_plan(model: nn.Module) -> dict[str, tuple[Any, ...]]:
    """Per parameter name, the hidden index of each dimension: ``"resid"``, ``("mlp", l)`` or None.

    Tied tensors appear once (``named_parameters`` deduplicates them), so a tied LM head is permuted once. An unknown
    parameter raises: permuting only some of the tensors that share an index gives a model that is not
    output-equivalent, and the null of the test would be misstated.
    """
    plan: dict[str, tuple[Any, ...]] = {}
    for name, p in model.named_parameters():
        m = _BLOCK_RE.match(name)
        dims = _BLOCK_PLAN.get(m.group(2)) if m else _TOP_PLAN.get(name)
        if dims is None or len(dims) != p.dim():
            raise ValueError(
                f"parameter {name!r} (shape {tuple(p.shape)}) is not one lmlab knows how to permute; expected a "
                "llama/gemma3-style causal LM (model.layers.<i>.self_attn/mlp.{gate,up,down}_proj, embed_tokens, "
                "lm_head)"
            )
        plan[name] = tuple(("mlp", int(m.group(1))) if d == _M else d for d in dims)
    return plan


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    from lmlab.core.pruning import decoder_blocks

    return decoder_blocks(model)


def n_blocks(model: nn.Module) -> int:
    return len(_decoder_layers(model))


def mlp_width(model: nn.Module, block: int = 0) -> int:
    return int(_glu(model, block).up_proj.weight.shape[0])


def hidden_size(model: nn.Module) -> int:
    return int(model.get_input_embeddings().weight.shape[1])


def _glu(model: nn.Module, block: int) -> nn.Module:
    layers = _decoder_layers(model)
    if not 0 <= block < len(layers):
        raise ValueError(f"block must be in [0, {len(layers) - 1}] for this {len(layers)}-block model, got {block}")
    mlp = getattr(layers[block], "mlp", None)
    if mlp is None or not all(isinstance(getattr(mlp, n, None), nn.Linear) for n in ("gate_proj", "up_proj")):
        raise ValueError(
            f"block {block} of {type(model).__name__} has no GLU MLP (mlp.gate_proj and mlp.up_proj nn.Linear): "
            "MATCH needs a gated MLP; use `generalized_match` on other MLPs"
        )
    return mlp


def evenly_spaced(n_total: int, k: int) -> list[int]:
    """`k` block indices spread over ``[0, n_total)``, first and last included (all blocks when k >= n_total)."""
    if n_total < 1 or k < 1:
        raise ValueError(f"need n_total >= 1 and k >= 1, got {n_total}, {k}")
    if k >= n_total:
        return list(range(n_total))
    return sorted({int(round(x)) for x in np.linspace(0, n_total - 1, k)})


def relative_blocks(blocks: Sequence[int], n_a: int, n_b: int) -> list[int]:
    """Blocks of a model with `n_b` blocks at the same relative depth as `blocks` of one with `n_a`."""
    if n_a == n_b:
        return list(blocks)
    return [int(round(b * (n_b - 1) / max(1, n_a - 1))) for b in blocks]


# ----------------------------------------------------------------------------------------------------------------
# Transforms: permutation, rotation, retraining one MLP, dropping layers


def random_permutations(model: nn.Module, generator: torch.Generator) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One uniform draw from Π: a permutation of the MLP units of every block and one of the residual dimensions."""
    mlp = [torch.randperm(mlp_width(model, i), generator=generator) for i in range(n_blocks(model))]
    return mlp, torch.randperm(hidden_size(model), generator=generator)


def _perm_for(dim_kind: Any, mlp_perms: Sequence[torch.Tensor], emb_perm: torch.Tensor) -> torch.Tensor | None:
    if dim_kind == RESID:
        return emb_perm
    if isinstance(dim_kind, tuple):
        return mlp_perms[dim_kind[1]]
    return None


def _permuted(t: torch.Tensor, dims: tuple[Any, ...], mlp_perms: Sequence[torch.Tensor], emb_perm: torch.Tensor):
    for d, kind in enumerate(dims):
        perm = _perm_for(kind, mlp_perms, emb_perm)
        if perm is not None:
            t = t.index_select(d, perm)
    return t


@torch.no_grad()
def permute_model(
    model: nn.Module, mlp_perms: Sequence[torch.Tensor], emb_perm: torch.Tensor, *, inplace: bool = False
) -> nn.Module:
    """π(θ): new W[i, j] = W[σ(i), τ(j)] on every tensor sharing an index; the outputs are unchanged.

    The residual permutation `emb_perm` (d,) applies to embedding and LM-head columns, q/k/v columns, o_proj and
    down_proj rows, gate/up columns and every RMSNorm scale; `mlp_perms[l]` (h,) to the rows of gate/up and the
    columns of down_proj of block l (code: ``tracing/perm/permute.py``, which uses one MLP permutation for all blocks).

    Args:
        model: a llama / gemma3-style causal LM.
        mlp_perms (`list[torch.Tensor]`): one (h,) permutation per block.
        emb_perm (`torch.Tensor`): (d,) permutation of the residual dimensions.
        inplace (`bool`): modify `model` instead of a deep copy.
    """
    plan = index_plan(model)
    if len(mlp_perms) != n_blocks(model):
        raise ValueError(f"mlp_perms must hold one permutation per block ({n_blocks(model)}), got {len(mlp_perms)}")
    out = model if inplace else copy.deepcopy(model)
    for name, p in out.named_parameters():
        p.data = _permuted(p.data, plan[name], mlp_perms, emb_perm).contiguous()
    return out


def haar_rotation(d: int, seed: int = 0) -> torch.Tensor:
    """A Haar-random (d, d) orthogonal matrix, float64 (``scipy.stats.ortho_group``, as the code's `rotate_model`)."""
    from scipy.stats import ortho_group

    return torch.from_numpy(ortho_group.rvs(dim=d, random_state=np.random.default_rng(seed)))


@torch.no_grad()
def rotate_residual(model: nn.Module, rotation: torch.Tensor | None = None, *, seed: int = 0, inplace: bool = False):
    """h' = h Q: fold every RMSNorm scale into the next linear, then rotate the residual stream; outputs unchanged.

    W_{q,k,v,gate,up} <- W diag(g) Q (g the preceding norm's scale, then set to 1); W_{o,down} <- Qᵀ W (and their
    biases b <- b Q); E <- E Q; LM head <- L diag(g_final) Q (the head is untied from the embedding first). Because
    rms(h Q) = rms(h), every normalised input is rotated too (code: ``tracing/utils/llama/model.py:rotate_model``).
    Llama-family RMSNorm only (w * x / rms(x)); gemma's (1 + w) norms after the attention output do not fold.

    Args:
        model: llama / mistral / qwen2 causal LM.
        rotation (`torch.Tensor`, *optional*): (d, d) orthogonal matrix; default `haar_rotation(d, seed)`.
        inplace (`bool`): modify `model` instead of a deep copy.
    """
    kind = getattr(getattr(model, "config", None), "model_type", None)
    if kind not in ROTATABLE:
        raise ValueError(f"rotate_residual supports {', '.join(ROTATABLE)} models, got model_type {kind!r}")
    d = hidden_size(model)
    q = haar_rotation(d, seed) if rotation is None else rotation.to(torch.float64)
    if q.shape != (d, d) or not torch.allclose(q.T @ q, torch.eye(d, dtype=torch.float64), atol=1e-8):
        raise ValueError(f"rotation must be an orthogonal ({d}, {d}) matrix, got shape {tuple(q.shape)}")
    out = model if inplace else copy.deepcopy(model)
    emb = out.get_input_embeddings()
    head = out.get_output_embeddings()
    if head is not None and head.weight is emb.weight:  # tied: E Q and L diag(g) Q differ, so untie
        head.weight = nn.Parameter(head.weight.detach().clone())
        out.config.tie_word_embeddings = False
        if hasattr(out.config, "get_text_config"):
            out.config.get_text_config().tie_word_embeddings = False

    def fold_in(lin: nn.Linear, g: torch.Tensor) -> None:  # (out, d) -> W diag(g) Q
        w = lin.weight.data.double() * g.double()[None, :]
        lin.weight.data = (w @ q).to(lin.weight.dtype)

    def rotate_out(lin: nn.Linear) -> None:  # (d, in) -> Qᵀ W
        lin.weight.data = (q.T @ lin.weight.data.double()).to(lin.weight.dtype)
        if lin.bias is not None:
            lin.bias.data = (lin.bias.data.double() @ q).to(lin.bias.dtype)

    for layer in _decoder_layers(out):
        att, mlp = layer.self_attn, layer.mlp
        g1, g2 = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        for lin in (att.q_proj, att.k_proj, att.v_proj):
            fold_in(lin, g1)
        rotate_out(att.o_proj)
        for lin in (mlp.gate_proj, mlp.up_proj):
            fold_in(lin, g2)
        rotate_out(mlp.down_proj)
        g1.data.fill_(1.0)
        g2.data.fill_(1.0)
    emb.weight.data = (emb.weight.data.double() @ q).to(emb.weight.dtype)
    norm = out.model.norm.weight
    if head is not None:
        fold_in(head, norm)
    norm.data.fill_(1.0)
    return out


@torch.no_grad()
def keep_layers(model: nn.Module, keep: Sequence[int]) -> nn.Module:
    """A deep copy with only the decoder blocks `keep` (in order): the structured pruning of localized testing."""
    layers = _decoder_layers(model)
    if not keep or any(not 0 <= k < len(layers) for k in keep) or list(keep) != sorted(set(keep)):
        raise ValueError(f"keep must be increasing block indices in [0, {len(layers) - 1}], got {list(keep)}")
    out = copy.deepcopy(model)
    kept = nn.ModuleList([_decoder_layers(out)[k] for k in keep])
    for new, blk in enumerate(kept):
        if hasattr(blk.self_attn, "layer_idx"):
            blk.self_attn.layer_idx = new  # the KV-cache slot
    out.model.layers = kept
    out.config.num_hidden_layers = len(keep)
    if getattr(out.config, "layer_types", None):
        out.config.layer_types = [out.config.layer_types[k] for k in keep]
    return out


def retrain_mlp_block(
    model: nn.Module,
    block: int,
    inputs: torch.Tensor,
    *,
    steps: int,
    batch_size: int = 256,
    lr: float = 1e-3,
    seed: int = 0,
    init_std: float | None = None,
) -> list[float]:
    """Re-initialise block `block`'s MLP and retrain it by distillation: min ||MLP'(x) − MLP(x)||² over `inputs`.

    The attack of the paper's Sec. 3.2 ("robust to retraining individual layers"): the block gets fresh units with no
    tie to the original initialisation. `inputs` (n, d) are the block's real MLP inputs (after its norm). Adam,
    minibatches drawn with a seeded generator. Modifies `model` in place; returns the loss of every step.
    """
    mlp = _glu(model, block)
    if inputs.dim() != 2 or inputs.shape[1] != hidden_size(model):
        raise ValueError(f"inputs must be (n, {hidden_size(model)}) MLP inputs, got {tuple(inputs.shape)}")
    x_all = inputs.detach().float()
    with torch.no_grad():
        target = mlp(x_all)  # (n, d) outputs of the original block
    std = init_std if init_std is not None else float(getattr(model.config, "initializer_range", 0.02))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for lin in (m for m in mlp.modules() if isinstance(m, nn.Linear)):
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen) * std)
            if lin.bias is not None:
                lin.bias.zero_()
    return _fit(mlp, lambda idx: (x_all[idx], target[idx]), len(x_all), steps, batch_size, lr, gen)


def _fit(module: nn.Module, batch_fn: Any, n: int, steps: int, batch_size: int, lr: float, gen: torch.Generator):
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    params = [p for p in module.parameters()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.Adam(params, lr=lr)
    losses = []
    for _ in range(steps):
        idx = torch.randint(0, n, (min(batch_size, n),), generator=gen) if n > 0 else None
        x, y = batch_fn(idx)
        loss = torch.nn.functional.mse_loss(module(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    for p in params:
        p.grad = None
    return losses


# ----------------------------------------------------------------------------------------------------------------
# p-values: LAP matching, Spearman, Fisher


def spearman_p(x: Sequence[float], y: Sequence[float]) -> float:
    """Two-sided p-value of Spearman's ρ (``scipy.stats.spearmanr``); NaN for a constant input (code: skipped)."""
    from scipy.stats import spearmanr

    x, y = np.asarray(x), np.asarray(y)
    if x.size < 3 or np.all(x == x[0]) or np.all(y == y[0]):
        return float("nan")
    return float(spearmanr(x, y).pvalue)


def fisher_combine(pvalues: Sequence[float]) -> float:
    """FISHER: χ² = −2 Σ log p_l, df = 2L (``scipy.stats.combine_pvalues``); NaNs skipped as in ``csu.py``.

    Assumes independent p-values across blocks (approximately true; the paper states the same).
    """
    from scipy.stats import combine_pvalues

    ps = [max(float(p), P_FLOOR) for p in pvalues if not math.isnan(float(p))]
    if not ps:
        return float("nan")
    return float(combine_pvalues(ps, method="fisher").pvalue)


def neg_log10(p: float) -> float:
    """−log10 p, with p clipped at 1e-300 (a Spearman p of exactly 0 reads as 300)."""
    return float("nan") if math.isnan(p) else -math.log10(max(p, P_FLOOR))


def _cosine(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(n, m) cosine similarities of the rows of x (n, k) and y (m, k), float64."""
    x, y = x.detach().double(), y.detach().double()
    xn = x / x.norm(dim=1, keepdim=True).clamp_min(1e-300)
    yn = y / y.norm(dim=1, keepdim=True).clamp_min(1e-300)
    return xn @ yn.T


def _sq_dists(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(n, m) squared Euclidean distances of rows (code ``tracing/utils/utils.py:pdists``), float64."""
    x, y = x.detach().double(), y.detach().double()
    return (x * x).sum(1)[:, None] + (y * y).sum(1)[None, :] - 2.0 * (x @ y.T)


def match_units(x_a: torch.Tensor, x_b: torch.Tensor, cost: str = "sqeuclidean") -> np.ndarray:
    """Hungarian matching of the rows (units) of x_a (h_a, k) to those of x_b (h_b, k), h_a <= h_b.

    ``cost="sqeuclidean"``: LAP minimising squared distances (``match_wmats``, used by MATCH); ``"cosine"``: LAP
    maximising cosine similarity (``csu.py`` / ``csh.py``; the paper's Algorithm 2). Float64 costs (the code casts).
    Returns the (h_a,) matched row of x_b for every row of x_a. Argmax instead of the LAP is not a permutation (the
    code notes it "does not work as well").
    """
    from scipy.optimize import linear_sum_assignment

    if x_a.dim() != 2 or x_b.dim() != 2 or x_a.shape[1] != x_b.shape[1]:
        raise ValueError(
            f"match_units needs (h_a, k) and (h_b, k) matrices, got {tuple(x_a.shape)}, {tuple(x_b.shape)}"
        )
    if x_a.shape[0] > x_b.shape[0]:
        raise ValueError(f"match_units needs h_a <= h_b, got {x_a.shape[0]} > {x_b.shape[0]}; swap the models")
    if cost == "sqeuclidean":
        rows, cols = linear_sum_assignment(_sq_dists(x_a, x_b).numpy())
    elif cost == "cosine":
        rows, cols = linear_sum_assignment(_cosine(x_a, x_b).numpy(), maximize=True)
    else:
        raise ValueError(f"cost must be 'sqeuclidean' or 'cosine', got {cost!r}")
    out = np.empty(x_a.shape[0], dtype=np.int64)
    out[rows] = cols
    return out


def identity_test(x_a: torch.Tensor, x_b: torch.Tensor, cost: str = "cosine") -> tuple[float, np.ndarray]:
    """SPEARMAN(MATCH(x_a, x_b), identity): the constrained tests (CSW on weights, CSH on activations)."""
    if x_a.shape[0] != x_b.shape[0]:
        raise ValueError(f"the constrained tests need equal widths, got {x_a.shape[0]} and {x_b.shape[0]} units")
    pi = match_units(x_a, x_b, cost)
    return spearman_p(pi, np.arange(len(pi))), pi


def match_pvalue(
    gate_a: torch.Tensor, up_a: torch.Tensor, gate_b: torch.Tensor, up_b: torch.Tensor, cost: str = "sqeuclidean"
) -> float:
    """MATCH of one block pair: Spearman(π_gate, π_up) with π = LAP on unit activations (units, columns).

    With unequal widths the narrower model is the row side (a rectangular LAP matches min(h_a, h_b) units) and the
    rank correlation uses the matched pairs only.
    """
    if gate_a.shape[0] > gate_b.shape[0]:
        gate_a, up_a, gate_b, up_b = gate_b, up_b, gate_a, up_a
    pi_gate = match_units(gate_a, gate_b, cost)
    pi_up = match_units(up_a, up_b, cost)
    return spearman_p(pi_gate, pi_up)


# ----------------------------------------------------------------------------------------------------------------
# Constrained weight tests: PERMTEST and CSW


@dataclass
class PermTestResult:
    """PERMTEST output: exact p-values (floor 1/(T+1)) and the observed and null statistics (larger = more similar)."""

    p: dict[str, float]
    observed: dict[str, float]
    null: dict[str, list[float]]
    n_perm: int
    tensors: list[str] = field(default_factory=list)

    @property
    def floor(self) -> float:
        return 1.0 / (self.n_perm + 1)


STATISTICS = ("l2", "cos")


def _same_architecture(model_a: nn.Module, model_b: nn.Module, what: str) -> dict[str, tuple[Any, ...]]:
    plan = index_plan(model_a)
    shapes_b = {n: tuple(p.shape) for n, p in model_b.named_parameters()}
    for name, p in model_a.named_parameters():
        if shapes_b.get(name) != tuple(p.shape):
            raise ValueError(
                f"{what} needs two models of the same architecture: model_b's {name!r} has shape "
                f"{shapes_b.get(name)}, expected {tuple(p.shape)} (use MATCH for different architectures)"
            )
    return plan


def _select(plan: dict[str, tuple[Any, ...]], tensors: str, blocks: Sequence[int] | None) -> list[str]:
    if tensors not in ("all", "blocks"):
        raise ValueError(f"tensors must be 'all' or 'blocks', got {tensors!r}")
    names = []
    for name in plan:
        m = _BLOCK_RE.match(name)
        if tensors == "blocks" and m is None:
            continue
        if m is not None and blocks is not None and int(m.group(1)) not in blocks:
            continue
        names.append(name)
    return names


@torch.no_grad()
def permtest(
    model_a: nn.Module,
    model_b: nn.Module,
    *,
    n_perm: int = 99,
    seed: int = 0,
    blocks: Sequence[int] | None = None,
    tensors: str = "all",
) -> PermTestResult:
    """PERMTEST (Algorithm 1): p̂ = (1 + #{t : φ(π_t θ_a, θ_b) ≥ φ(θ_a, θ_b)}) / (T + 1) for φ_L2 and φ_cos.

    The statistics read the tensors chosen by `tensors` (``"all"``: every parameter, as ``l2.py``; ``"blocks"``: the
    decoder blocks only) restricted to `blocks` (default all). Any function of the model is a valid statistic, so a
    subset keeps the p-value exact; it only changes the power. π_t = `random_permutations` (seeded).

    Args:
        model_a, model_b: two models of the same architecture (same parameter names and shapes).
        n_perm (`int`, defaults to 99): T (code ``main.py --num_perm 99``); the p-value floor is 1/(T + 1).
        seed (`int`): seeds the permutation draws.
        blocks (`list[int]`, *optional*): blocks whose tensors enter the statistic.
        tensors (`str`, defaults to ``"all"``): ``"all"`` or ``"blocks"``.

    Returns:
        `PermTestResult` with ``p["l2"]``, ``p["cos"]`` and the null statistics.
    """
    if n_perm < 1:
        raise ValueError(f"n_perm must be >= 1, got {n_perm}")
    plan = _same_architecture(model_a, model_b, "PERMTEST")
    names = _select(plan, tensors, blocks)
    if not names:
        raise ValueError(f"no tensors selected (tensors={tensors!r}, blocks={list(blocks or [])})")
    pa = dict(model_a.named_parameters())
    pb = dict(model_b.named_parameters())
    w_a = {n: pa[n].detach().float().contiguous() for n in names}
    w_b = {n: pb[n].detach().float().reshape(-1) for n in names}
    # permutation-invariant squared norms (float64): ||π(W_a) − W_b||² = ||W_a||² + ||W_b||² − 2<π(W_a), W_b>, so one
    # gather and one dot product per tensor and draw (the cost of a draw is a pass over the selected tensors)
    sq_a = {n: float(w_a[n].double().square().sum()) for n in names}
    sq_b = {n: float(w_b[n].double().square().sum()) for n in names}

    def stats(mlp_perms: Sequence[torch.Tensor] | None, emb_perm: torch.Tensor | None) -> dict[str, float]:
        l2, cos = [], []
        for n in names:
            wa = w_a[n] if emb_perm is None else _permuted(w_a[n], plan[n], mlp_perms, emb_perm)
            dot = float(torch.dot(wa.reshape(-1), w_b[n]))
            l2.append(math.sqrt(max(sq_a[n] + sq_b[n] - 2.0 * dot, 0.0)))
            cos.append(dot / max(math.sqrt(sq_a[n] * sq_b[n]), P_FLOOR))
        return {"l2": -float(np.mean(l2)), "cos": float(np.mean(cos))}

    observed = stats(None, None)
    gen = torch.Generator().manual_seed(seed)
    null: dict[str, list[float]] = {s: [] for s in STATISTICS}
    for _ in range(n_perm):
        mlp_perms, emb_perm = random_permutations(model_a, gen)
        for s, v in stats(mlp_perms, emb_perm).items():
            null[s].append(v)
    p = {s: (1 + sum(v >= observed[s] for v in null[s])) / (n_perm + 1) for s in STATISTICS}
    return PermTestResult(p=p, observed=observed, null=null, n_perm=n_perm, tensors=names)


@dataclass
class BlockTest:
    """Per-block p-values of a test and their Fisher aggregate."""

    blocks: list[tuple[int, int]]  # (block of model a, block of model b)
    p: list[float]

    @property
    def aggregate(self) -> float:
        return fisher_combine(self.p)


@torch.no_grad()
def csw_test(model_a: nn.Module, model_b: nn.Module, blocks: Sequence[int] | None = None) -> BlockTest:
    """CSW (``csu.py``): per block, Spearman(LAP_max(cos(rows of W_up^a, rows of W_up^b)), identity); Fisher.

    Args:
        model_a, model_b: two models of the same architecture.
        blocks (`list[int]`, *optional*): blocks tested (default all).
    """
    _same_architecture(model_a, model_b, "CSW")
    blocks = list(range(n_blocks(model_a))) if blocks is None else list(blocks)
    ps = [identity_test(_glu(model_a, i).up_proj.weight, _glu(model_b, i).up_proj.weight, "cosine")[0] for i in blocks]
    return BlockTest(blocks=[(i, i) for i in blocks], p=ps)


# ----------------------------------------------------------------------------------------------------------------
# Activations: MATCH, CSH, localized testing, generalized test


@dataclass
class MLPActivations:
    """Per block, per input sequence: gate/up outputs (n_tokens, h) and, optionally, the MLP inputs (n_tokens, d)."""

    gate: dict[int, list[torch.Tensor]]
    up: dict[int, list[torch.Tensor]]
    inputs: dict[int, list[torch.Tensor]]

    def units(self, block: int, kind: str, pools: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        """(h, n_columns) unit activations of `kind` (``gate``, ``up``, ``inputs``: (d, n)), columns pooled if given.

        `pools[i]` (n_cols_i, n_tokens_i) averages sequence i's tokens into shared columns (words) when two models
        tokenize the same text differently; gate/up outputs are linear in the input, so pooling commutes with them.
        """
        seqs = getattr(self, kind)[block]
        if pools is not None:
            if len(pools) != len(seqs):
                raise ValueError(f"got {len(pools)} pooling matrices for {len(seqs)} sequences")
            seqs = [pool @ s for pool, s in zip(pools, seqs)]
        return torch.cat(seqs, dim=0).T.contiguous()


@torch.no_grad()
def mlp_activations(
    model: nn.Module, input_ids: Sequence[torch.Tensor], blocks: Sequence[int], *, capture_inputs: bool = False
) -> MLPActivations:
    """Outputs of ``gate_proj`` and ``up_proj`` (and the MLP inputs) of `blocks`, one forward per sequence.

    `input_ids`: (1, n) or (n,) token ids per sequence (batch 1: no padding enters the activations; code: batch 1).
    The decoder runs without its LM head (Gemma's 262k-row head would dominate the cost).
    """
    acts = MLPActivations({b: [] for b in blocks}, {b: [] for b in blocks}, {b: [] for b in blocks})
    handles = []
    for b in blocks:
        mlp = _glu(model, b)
        handles.append(mlp.gate_proj.register_forward_hook(lambda m, i, o, b=b: acts.gate[b].append(o[0].float())))
        handles.append(mlp.up_proj.register_forward_hook(lambda m, i, o, b=b: acts.up[b].append(o[0].float())))
        if capture_inputs:
            handles.append(mlp.register_forward_pre_hook(lambda m, a, b=b: acts.inputs[b].append(a[0][0].float())))
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    try:
        for ids in input_ids:
            ids = ids.view(1, -1).to(next(model.parameters()).device)
            decoder(input_ids=ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return acts


def match_from_activations(
    acts_a: MLPActivations,
    acts_b: MLPActivations,
    block_pairs: Sequence[tuple[int, int]],
    *,
    pools_a: Sequence[torch.Tensor] | None = None,
    pools_b: Sequence[torch.Tensor] | None = None,
    cost: str = "sqeuclidean",
) -> BlockTest:
    """MATCH p-value of every (block of a, block of b) pair from captured activations."""
    ps = []
    for i, j in block_pairs:
        ps.append(
            match_pvalue(
                acts_a.units(i, "gate", pools_a),
                acts_a.units(i, "up", pools_a),
                acts_b.units(j, "gate", pools_b),
                acts_b.units(j, "up", pools_b),
                cost,
            )
        )
    return BlockTest(blocks=list(block_pairs), p=ps)


def csh_from_activations(
    acts_a: MLPActivations,
    acts_b: MLPActivations,
    block_pairs: Sequence[tuple[int, int]],
    *,
    pools_a: Sequence[torch.Tensor] | None = None,
    pools_b: Sequence[torch.Tensor] | None = None,
) -> BlockTest:
    """CSH (``csh.py``): Spearman(LAP_max(cos of up_proj activation rows), identity) per block; Fisher."""
    ps = [
        identity_test(acts_a.units(i, "up", pools_a), acts_b.units(j, "up", pools_b), "cosine")[0]
        for i, j in block_pairs
    ]
    return BlockTest(blocks=list(block_pairs), p=ps)


@dataclass
class PairedInputs:
    """The same texts encoded for two models: ids per sequence and, when the tokenizers differ, word pools."""

    ids_a: list[torch.Tensor]
    ids_b: list[torch.Tensor]
    pools_a: list[torch.Tensor] | None
    pools_b: list[torch.Tensor] | None
    columns: str  # "tokens" (shared ids) or "words"

    @property
    def n_columns(self) -> int:
        if self.pools_a is None:
            return sum(int(x.numel()) for x in self.ids_a)
        return sum(int(p.shape[0]) for p in self.pools_a)


def _word_pool(offsets: Sequence[tuple[int, int]], words: Sequence[tuple[int, int]]) -> torch.Tensor:
    """(n_words, n_tokens) averaging matrix: row w averages the tokens whose character span overlaps word w."""
    pool = torch.zeros(len(words), len(offsets))
    for w, (ws, we) in enumerate(words):
        hits = [t for t, (s, e) in enumerate(offsets) if e > s and s < we and e > ws]
        pool[w, hits] = 1.0 / len(hits)
    return pool


def encode_pair(
    texts: Sequence[str], tokenizer_a: Any, tokenizer_b: Any, *, max_tokens: int = 128, columns: str = "auto"
) -> PairedInputs:
    """Encode `texts` for two models so that their activation columns correspond.

    ``columns="tokens"``: both tokenizers must give identical ids (the official setting: Llama derivatives share a
    tokenizer). ``"words"``: each model's tokens are averaged within whitespace-delimited words of the text both
    models cover (SmolLM2 vs Gemma tokenize differently; words are the shared unit). ``"auto"``: tokens when the ids
    agree, else words.
    """
    if columns not in ("auto", "tokens", "words"):
        raise ValueError(f"columns must be 'auto', 'tokens' or 'words', got {columns!r}")
    texts = [t for t in texts if t and t.strip()]
    if not texts:
        raise ValueError("encode_pair needs at least one non-empty text")

    def enc(tok: Any, text: str, offsets: bool) -> dict[str, Any]:
        return tok(text, truncation=True, max_length=max_tokens, return_offsets_mapping=offsets)

    if columns in ("auto", "tokens"):
        ids_a = [enc(tokenizer_a, t, False)["input_ids"] for t in texts]
        ids_b = ids_a if tokenizer_b is tokenizer_a else [enc(tokenizer_b, t, False)["input_ids"] for t in texts]
        if ids_a == ids_b:
            as_t = [torch.tensor(x, dtype=torch.long) for x in ids_a]
            return PairedInputs(as_t, as_t, None, None, "tokens")
        if columns == "tokens":
            raise ValueError("columns='tokens' needs tokenizers that give identical ids; use columns='words'")
    ids_a, ids_b, pools_a, pools_b = [], [], [], []
    for text in texts:
        ea, eb = enc(tokenizer_a, text, True), enc(tokenizer_b, text, True)
        off_a = [tuple(o) for o in ea["offset_mapping"]]
        off_b = [tuple(o) for o in eb["offset_mapping"]]
        covered = min(max((e for _, e in off_a), default=0), max((e for _, e in off_b), default=0))
        words = [(m.start(), m.end()) for m in re.finditer(r"\S+", text) if m.end() <= covered]
        both = [w for w in words if _word_pool(off_a, [w]).sum() > 0 and _word_pool(off_b, [w]).sum() > 0]
        if not both:
            continue
        ids_a.append(torch.tensor(ea["input_ids"], dtype=torch.long))
        ids_b.append(torch.tensor(eb["input_ids"], dtype=torch.long))
        pools_a.append(_word_pool(off_a, both))
        pools_b.append(_word_pool(off_b, both))
    if not ids_a:
        raise ValueError("no word of the texts is covered by both tokenizers' tokens")
    return PairedInputs(ids_a, ids_b, pools_a, pools_b, "words")


def match_test(
    model_a: nn.Module,
    model_b: nn.Module,
    inputs: PairedInputs | Sequence[torch.Tensor],
    *,
    blocks: Sequence[int] | None = None,
    blocks_b: Sequence[int] | None = None,
    cost: str = "sqeuclidean",
) -> BlockTest:
    """MATCH on block pairs (blocks[k] of a, blocks_b[k] of b) for shared inputs; ``.aggregate`` is Fisher's p.

    Args:
        model_a, model_b: GLU causal LMs (any widths, depths and residual bases).
        inputs: `encode_pair(texts, tok_a, tok_b)` or a list of token-id tensors both models share.
        blocks (`list[int]`, *optional*): blocks of a (default: all, or `evenly_spaced` to the shallower depth).
        blocks_b (`list[int]`, *optional*): blocks of b (default: the same relative depth, `relative_blocks`).
        cost (`str`): LAP cost, ``"sqeuclidean"`` (code) or ``"cosine"``.
    """
    if not isinstance(inputs, PairedInputs):
        ids = [torch.as_tensor(x, dtype=torch.long).view(-1) for x in inputs]
        inputs = PairedInputs(ids, ids, None, None, "tokens")
    la, lb = n_blocks(model_a), n_blocks(model_b)
    blocks = evenly_spaced(la, min(la, lb)) if blocks is None else list(blocks)
    blocks_b = relative_blocks(blocks, la, lb) if blocks_b is None else list(blocks_b)
    if len(blocks_b) != len(blocks):
        raise ValueError(f"blocks and blocks_b must have the same length, got {len(blocks)} and {len(blocks_b)}")
    acts_a = mlp_activations(model_a, inputs.ids_a, sorted(set(blocks)))
    acts_b = mlp_activations(model_b, inputs.ids_b, sorted(set(blocks_b)))
    return match_from_activations(
        acts_a, acts_b, list(zip(blocks, blocks_b)), pools_a=inputs.pools_a, pools_b=inputs.pools_b, cost=cost
    )


@dataclass
class LocalizedMatch:
    """Block x block MATCH p-values (NaN where the official greedy loop skipped the pair) and the matched map."""

    blocks_a: list[int]
    blocks_b: list[int]
    p: np.ndarray  # (len(blocks_a), len(blocks_b))
    layer_map: dict[int, int]


def localized_from_activations(
    acts_a: MLPActivations,
    acts_b: MLPActivations,
    blocks_a: Sequence[int],
    blocks_b: Sequence[int],
    *,
    threshold: float = 1e-6,
    pools_a: Sequence[torch.Tensor] | None = None,
    pools_b: Sequence[torch.Tensor] | None = None,
    cost: str = "sqeuclidean",
) -> LocalizedMatch:
    """``match.py:statistic_all``: for i in blocks_a, for j in blocks_b not yet matched: MATCH(i, j); the first
    j with p < `threshold` is i's match (both are then marked)."""
    p = np.full((len(blocks_a), len(blocks_b)), np.nan)
    used: set[int] = set()
    layer_map: dict[int, int] = {}
    for ii, i in enumerate(blocks_a):
        for jj, j in enumerate(blocks_b):
            if j in used:
                continue
            p[ii, jj] = match_from_activations(
                acts_a, acts_b, [(i, j)], pools_a=pools_a, pools_b=pools_b, cost=cost
            ).p[0]
            if p[ii, jj] < threshold:
                layer_map[i] = j
                used.add(j)
                break
    return LocalizedMatch(list(blocks_a), list(blocks_b), p, layer_map)


def localized_match(
    model_a: nn.Module,
    model_b: nn.Module,
    inputs: PairedInputs | Sequence[torch.Tensor],
    *,
    blocks_a: Sequence[int] | None = None,
    blocks_b: Sequence[int] | None = None,
    threshold: float = 1e-6,
    cost: str = "sqeuclidean",
) -> LocalizedMatch:
    """Localized testing: which blocks of b derive from which blocks of a (p < `threshold`, paper: 1e-6)."""
    if not isinstance(inputs, PairedInputs):
        ids = [torch.as_tensor(x, dtype=torch.long).view(-1) for x in inputs]
        inputs = PairedInputs(ids, ids, None, None, "tokens")
    blocks_a = list(range(n_blocks(model_a))) if blocks_a is None else list(blocks_a)
    blocks_b = list(range(n_blocks(model_b))) if blocks_b is None else list(blocks_b)
    acts_a = mlp_activations(model_a, inputs.ids_a, blocks_a)
    acts_b = mlp_activations(model_b, inputs.ids_b, blocks_b)
    return localized_from_activations(
        acts_a, acts_b, blocks_a, blocks_b, threshold=threshold, pools_a=inputs.pools_a, pools_b=inputs.pools_b,
        cost=cost,
    )  # fmt: skip


class GLU(nn.Module):
    """down(act(gate(x)) * up(x)): the fresh MLP of the generalized test (code ``CustomLlamaMLP``)."""

    def __init__(self, d: int, h: int, act: str = "silu") -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d, h, bias=False)
        self.up_proj = nn.Linear(d, h, bias=False)
        self.down_proj = nn.Linear(h, d, bias=False)
        self.act = {"silu": nn.SiLU(), "gelu": nn.GELU(approximate="tanh")}[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


def distill_glu(
    mlp: nn.Module, d: int, h: int, *, steps: int, batch_size: int, lr: float, seed: int
) -> tuple[GLU, list[float]]:
    """A fresh GLU fitted to `mlp` by MSE on X ~ N(0, I_d) (code: batch 5000, 10000 steps, Adam lr 1e-3)."""
    gen = torch.Generator().manual_seed(seed)
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        glu = GLU(d, h)
    finally:
        torch.random.set_rng_state(state)

    def batch(_: Any) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(batch_size, d, generator=gen)
        with torch.no_grad():
            return x, mlp(x)

    return glu, _fit(glu, batch, 0, steps, batch_size, lr, gen)


def generalized_match(
    mlp_a: nn.Module,
    mlp_b: nn.Module,
    inputs_a: torch.Tensor,
    inputs_b: torch.Tensor,
    *,
    steps: int = 10000,
    batch_size: int = 5000,
    lr: float = 1e-3,
    seed: int = 0,
    width: int | None = None,
) -> tuple[float, dict[str, list[float]]]:
    """Algorithm 5: distil both MLPs into fresh GLUs (`distill_glu`), then MATCH their gate/up outputs.

    `inputs_a` (n, d_a) and `inputs_b` (n, d_b) are the two models' MLP inputs at the tested blocks on the same n
    columns (tokens, or words pooled; the distilled projections are linear, so pooled inputs give pooled outputs).
    `width` defaults to each MLP's own width (code: ``width_fac = 1``). Returns (p, {"a": losses, "b": losses}).
    """
    if inputs_a.shape[0] != inputs_b.shape[0]:
        raise ValueError(
            f"inputs_a and inputs_b must cover the same columns, got {inputs_a.shape[0]} and {inputs_b.shape[0]}"
        )
    fitted = {}
    for name, mlp, x in (("a", mlp_a, inputs_a), ("b", mlp_b, inputs_b)):
        d = x.shape[1]
        h = width or int(getattr(mlp, "up_proj", getattr(mlp, "gate_proj", None)).weight.shape[0])
        fitted[name] = distill_glu(mlp, d, h, steps=steps, batch_size=batch_size, lr=lr, seed=seed + (name == "b"))
    with torch.no_grad():
        (ga, la), (gb, lb) = fitted["a"], fitted["b"]
        xa, xb = inputs_a.float(), inputs_b.float()
        p = match_pvalue(ga.gate_proj(xa).T, ga.up_proj(xa).T, gb.gate_proj(xb).T, gb.up_proj(xb).T)
    return p, {"a": la, "b": lb}


__all__ = [
    "GLU",
    "BlockTest",
    "LocalizedMatch",
    "MLPActivations",
    "PairedInputs",
    "PermTestResult",
    "csh_from_activations",
    "csw_test",
    "distill_glu",
    "encode_pair",
    "evenly_spaced",
    "fisher_combine",
    "generalized_match",
    "haar_rotation",
    "identity_test",
    "index_plan",
    "keep_layers",
    "localized_from_activations",
    "localized_match",
    "match_from_activations",
    "match_pvalue",
    "match_test",
    "match_units",
    "mlp_activations",
    "neg_log10",
    "permtest",
    "permute_model",
    "random_permutations",
    "relative_blocks",
    "retrain_mlp_block",
    "rotate_residual",
    "spearman_p",
]
