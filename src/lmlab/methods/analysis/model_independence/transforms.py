"""Model layout and derived models: which hidden index each parameter dimension carries, and the attacks.

`index_plan` maps every parameter of a llama / gemma3-style causal LM to the hidden index of each of its dimensions
(``"resid"``, ``("mlp", l)`` or None), so that the transforms keep every tensor that shares an index consistent:

* `permute_model`: π(θ), new W[i, j] = W[σ(i), τ(j)] (σ on the d residual dimensions, τ_l on the h units of block l);
  `random_permutations` draws π uniformly from Π (the null distribution of PERMTEST). Outputs unchanged.
* `rotate_residual`: h' = h Q (RMSNorm scales folded into the next linear, head untied); outputs unchanged.
* `keep_layers`, `keep_mlp_units`: drop decoder blocks and MLP units (structured pruning: depth and width, the
  derived model of localized testing); `deep_block_keep` is the kept-block pattern, `glu_unit_importance` the
  per-unit score that picks the kept units.
* `retrain_mlp_block`: re-initialise one MLP and distil it on its real inputs (outputs approximately unchanged).

Block helpers (`n_blocks`, `mlp_width`, `hidden_size`, `evenly_spaced`, `relative_blocks`) serve the tests too;
`relative_weight_change` measures how far a derived model moved. Pure.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

RESID = "resid"

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


def deep_block_keep(n_total: int, keep: int, tail: int = 2) -> list[int]:
    """Blocks kept when a contiguous run of deep blocks is dropped: the first ``keep - tail`` and the last `tail`.

    The layer-pruning pattern of Gromov et al. (2024, "The Unreasonable Ineffectiveness of the Deeper Layers") and
    ShortGPT: the deep blocks before the last ones are the most redundant. `tail` shrinks to ``keep // 2`` for small
    `keep`. E.g. (30, 20) -> [0..17, 28, 29].
    """
    if not 1 <= keep < n_total:
        raise ValueError(f"keep must be in [1, {n_total - 1}] for a {n_total}-block model, got {keep}")
    tail = min(tail, keep // 2)
    return list(range(keep - tail)) + list(range(n_total - tail, n_total))


@torch.no_grad()
def glu_unit_importance(mlp: nn.Module, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """(h,) importance of each MLP unit: mean_t |act(gate_u(t)) up_u(t)| x ||W_down[:, u]||.

    `gate`, `up`: (h, n_tokens) outputs of ``gate_proj`` / ``up_proj`` on calibration tokens (`MLPActivations.units`).
    The activation-times-output-norm score of width pruning (Minitron ranks MLP units by their mean activation; the
    down_proj column norm makes it the unit's contribution to the residual stream).
    """
    act = getattr(mlp, "act_fn", torch.nn.functional.silu)
    contrib = (act(gate.float()) * up.float()).abs().mean(dim=1)  # (h,)
    return contrib * mlp.down_proj.weight.detach().float().norm(dim=0)


@torch.no_grad()
def keep_mlp_units(model: nn.Module, keep: Sequence[torch.Tensor], *, inplace: bool = False) -> nn.Module:
    """Width pruning: block l keeps the MLP units `keep[l]` (rows of gate/up, columns of down_proj), in index order.

    Every block must keep the same number of units (``config.intermediate_size`` is one number). The kept units keep
    their weights, so the pruned model is derived from `model` unit by unit; MATCH then needs the rectangular LAP.
    """
    layers = _decoder_layers(model)
    if len(keep) != len(layers):
        raise ValueError(f"keep must hold one index set per block ({len(layers)}), got {len(keep)}")
    widths = {int(k.numel()) for k in keep}
    if len(widths) != 1:
        raise ValueError(f"every block must keep the same number of units, got {sorted(widths)}")
    out = model if inplace else copy.deepcopy(model)
    for block, idx in enumerate(keep):
        mlp = _glu(out, block)
        h = mlp.up_proj.weight.shape[0]
        idx = torch.as_tensor(idx, dtype=torch.long).sort().values
        if idx.numel() < 1 or idx[0] < 0 or idx[-1] >= h or idx.unique().numel() != idx.numel():
            raise ValueError(f"keep[{block}] must be distinct unit indices in [0, {h - 1}]")
        for name, dim in (("gate_proj", 0), ("up_proj", 0), ("down_proj", 1)):
            old = getattr(mlp, name)
            new = nn.Linear(
                old.in_features if dim == 0 else idx.numel(),
                idx.numel() if dim == 0 else old.out_features,
                bias=old.bias is not None,
                dtype=old.weight.dtype,
            )
            new.weight.copy_(old.weight.index_select(dim, idx))
            if old.bias is not None:
                new.bias.copy_(old.bias.index_select(0, idx) if dim == 0 else old.bias)
            setattr(mlp, name, new)
        if hasattr(mlp, "intermediate_size"):
            mlp.intermediate_size = int(idx.numel())
    out.config.intermediate_size = widths.pop()
    return out


@torch.no_grad()
def relative_weight_change(model_a: nn.Module, model_b: nn.Module, blocks: Sequence[int]) -> list[float]:
    """Per block, ||W_b − W_a||_F / ||W_a||_F over the block's matrices (same architecture): how far b moved."""
    pa, pb = dict(model_a.named_parameters()), dict(model_b.named_parameters())
    out = []
    for block in blocks:
        prefix = f"model.layers.{block}."
        names = [n for n, p in pa.items() if n.startswith(prefix) and p.dim() == 2]
        if not names or any(n not in pb or pb[n].shape != pa[n].shape for n in names):
            raise ValueError(f"relative_weight_change needs block {block} in both models with the same shapes")
        num = sum(float((pb[n].double() - pa[n].double()).square().sum()) for n in names)
        den = sum(float(pa[n].double().square().sum()) for n in names)
        out.append((num / max(den, 1e-300)) ** 0.5)
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


__all__ = [
    "deep_block_keep",
    "evenly_spaced",
    "glu_unit_importance",
    "haar_rotation",
    "index_plan",
    "keep_layers",
    "keep_mlp_units",
    "permute_model",
    "random_permutations",
    "relative_blocks",
    "relative_weight_change",
    "retrain_mlp_block",
    "rotate_residual",
]
