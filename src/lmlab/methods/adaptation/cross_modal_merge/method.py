"""Cross-modal merging: θ_merged = α θ_vlm + (1 − α) θ_reason  (= θ_base + α τ_vlm + (1 − α) τ_reason).

Chen, Zhang, Zhu, Liu, Gao, Xiong, Li & He, "Bring Reason to Vision: Understanding Perception and Reasoning through
Model Merging" (ICML 2025, https://arxiv.org/abs/2505.05464; official code https://github.com/shiqichen17/VLM_Merging,
``merge.py`` at a42fa38, read for this implementation). Pure: no I/O, no printing.

A VLM's language tower and a reasoning LLM fine-tuned from the same base θ_base are merged tensor by tensor:

* ``base`` (linear, the paper's default, α = 0.9): θ = α θ_vlm + (1 − α) θ_reason on every tensor but the excluded
  keys (``model.embed_tokens.weight``, ``lm_head.weight``: the VLM's vocabulary has image tokens), which keep the VLM's
  values. `linear_merge` also takes a per-layer ``alpha_schedule``.
* ``layerswap``: layers with index ≤ ``base_layer_num`` keep the VLM's weights, later tensors are merged linearly
  (``merge.py``; 5 and α = 0.9 in the run script). Tensors outside the decoder layers (the final norm) are merged.
* ``ties`` / ``darelinear``: task vectors τ = θ − θ_base through ``peft.utils.merge_utils.ties`` / ``dare_linear``
  with weights (α, α2) (TIES: density 0.2, (1.6, 0.2) in the run script); θ = θ_base + merged τ.
  peft 0.21.2's ``random_pruning`` assigns its 1/density rescale (the official repo's copy does not: a no-op).

Layer attribution (the paper's analysis; its exact protocol is [verify]): `layer_knockout` resets the tensors of a
set of layers to θ_base (never to zero), so the change in a probe's score measures what that block's task vector
contributes. Layer indices are parsed as ``layers.(\\d+)`` (`layer_index`), not as the first integer of the key
(``merge.py``'s ``extract_layer_number``, which breaks on keys with other digits).
`task_vector_norms` gives the global ‖τ_vlm‖ / ‖τ_reason‖ and the share of each in the merged delta at each α, which
tells "τ_reason is small" from "(1 − α) keeps it out".

Every merge here is affine in the state dicts with weights summing to 1 (linear, layerswap) or is defined on task
vectors (TIES, DARE), so the same functions applied to task vectors τ give the merged task vector: callers may work
in τ space (``θ_base`` = zeros), which is what the experiment does.

The proxy's "vision encoder": `GlyphProjector` maps a 5x5 bitmap (25 pixels) to ``n_tokens`` soft tokens of the
model's width, fed as ``inputs_embeds`` (LLaVA's MLP projector, here on raw pixels).
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

StateDict = dict[str, torch.Tensor]
DEFAULT_EXCLUDE: tuple[str, ...] = ("model.embed_tokens.weight", "lm_head.weight")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def layer_index(key: str) -> int | None:
    """The decoder-layer index of a state-dict key (``"model.layers.12.mlp.up_proj.weight"`` -> 12), parsed as
    ``layers.(\\d+).``; None for tensors outside the layers (embeddings, final norm, lm_head)."""
    m = _LAYER.search(key)
    return int(m.group(1)) if m else None


def _check_alpha(name: str, alpha: object) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha):
        raise ValueError(f"{name} must be a finite number (the weight of the VLM), got {alpha!r}")
    return float(alpha)


def check_same_base(theta_a: Mapping[str, torch.Tensor], theta_b: Mapping[str, torch.Tensor],
                    exclude: Iterable[str] = ()) -> list[str]:  # fmt: skip
    """The keys merged: those of `theta_a` not in `exclude`; ``ValueError`` when `theta_b` lacks one or its shape
    differs (models that do not share a base cannot be merged tensor by tensor)."""
    if not theta_a:
        raise ValueError("theta_a is empty; expected the state dict of the VLM's language model")
    skip = set(exclude)
    keys = [k for k in theta_a if k not in skip]
    for k in keys:
        if k not in theta_b:
            raise ValueError(f"theta_b has no tensor {k!r}; both models must share the base architecture "
                             "(or list the key in exclude)")  # fmt: skip
        if tuple(theta_a[k].shape) != tuple(theta_b[k].shape):
            raise ValueError(f"{k}: shape {tuple(theta_a[k].shape)} vs {tuple(theta_b[k].shape)}; the models must "
                             "share a base (exclude mismatched vocabularies: embed_tokens / lm_head)")  # fmt: skip
    return keys


def task_vector(theta: Mapping[str, torch.Tensor], theta_base: Mapping[str, torch.Tensor],
                exclude: Iterable[str] = ()) -> StateDict:  # fmt: skip
    """τ = θ − θ_base for every key of `theta` not in `exclude` (float32)."""
    keys = check_same_base(theta, theta_base, exclude)
    return {k: theta[k].float() - theta_base[k].float() for k in keys}


def linear_merge(
    theta_a: Mapping[str, torch.Tensor],
    theta_b: Mapping[str, torch.Tensor],
    alpha: float = 0.9,
    *,
    exclude: Iterable[str] = DEFAULT_EXCLUDE,
    alpha_schedule: Mapping[int, float] | Callable[[int], float] | None = None,
) -> StateDict:
    """``α θ_a + (1 − α) θ_b`` per tensor (``merge.py --mode base``); excluded keys keep `theta_a`'s values.

    Args:
        theta_a: the VLM's language-model state dict (θ_vlm). theta_b: the reasoning LLM's (θ_reason).
        alpha (`float`, defaults to 0.9): the weight of `theta_a` (the paper's value for every pair).
        exclude: keys copied from `theta_a` unmerged (embeddings / lm_head: vocabularies differ; with tied
            embeddings one tensor).
        alpha_schedule: layer index -> α (a dict or a function) for per-layer schedules; layers it does not name,
            and tensors outside the layers, use `alpha`.
    """
    alpha = _check_alpha("alpha", alpha)
    excluded = set(exclude)
    keys = check_same_base(theta_a, theta_b, excluded)
    out: StateDict = {k: theta_a[k].clone() for k in theta_a if k in excluded}
    for k in keys:
        layer = layer_index(k)
        a = alpha
        if alpha_schedule is not None and layer is not None:
            if callable(alpha_schedule):
                a = _check_alpha(f"alpha_schedule({layer})", alpha_schedule(layer))
            elif layer in alpha_schedule:
                a = _check_alpha(f"alpha_schedule[{layer}]", alpha_schedule[layer])
        out[k] = a * theta_a[k].float() + (1.0 - a) * theta_b[k].float()
    return out


def layerswap_merge(
    theta_a: Mapping[str, torch.Tensor],
    theta_b: Mapping[str, torch.Tensor],
    alpha: float = 0.9,
    base_layer_num: int = 5,
    *,
    exclude: Iterable[str] = DEFAULT_EXCLUDE,
) -> StateDict:
    """``merge.py --mode layerswap``: layers with index ≤ `base_layer_num` keep `theta_a` (the VLM), every other
    merged tensor (later layers, the final norm) is ``α θ_a + (1 − α) θ_b``."""
    if isinstance(base_layer_num, bool) or not isinstance(base_layer_num, int) or base_layer_num < -1:
        raise ValueError(f"base_layer_num must be an int >= -1 (-1: no layer kept), got {base_layer_num!r}")
    return linear_merge(theta_a, theta_b, alpha, exclude=exclude,
                        alpha_schedule=lambda layer: 1.0 if layer <= base_layer_num else alpha)  # fmt: skip


def _peft_merge(
    how: str,
    theta_a: Mapping[str, torch.Tensor],
    theta_b: Mapping[str, torch.Tensor],
    theta_base: Mapping[str, torch.Tensor],
    weights: Sequence[float],
    density: float,
    exclude: Iterable[str],
    seed: int,
) -> StateDict:
    from peft.utils import merge_utils

    if len(weights) != 2:
        raise ValueError(f"weights must be (alpha, alpha2) for the two models, got {list(weights)!r}")
    for i, w in enumerate(weights):
        _check_alpha(f"weights[{i}]", w)
    if isinstance(density, bool) or not isinstance(density, int | float) or not 0 < density <= 1:
        raise ValueError(f"density must be in (0, 1] (the fraction of each task vector kept), got {density!r}")
    excluded = set(exclude)
    keys = check_same_base(theta_a, theta_b, excluded)
    check_same_base({k: theta_a[k] for k in keys}, theta_base)
    w = torch.tensor([float(x) for x in weights], dtype=torch.float32)
    out: StateDict = {k: theta_a[k].clone() for k in theta_a if k in excluded}
    fn = merge_utils.ties if how == "ties" else merge_utils.dare_linear
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # peft's random_pruning draws from the global generator
        for k in keys:
            base = theta_base[k].float()
            taus = [theta_a[k].float() - base, theta_b[k].float() - base]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # peft warns that density >= 1 prunes nothing
                mixed = fn(taus, w, float(density))
            out[k] = base + mixed
    return out


def ties_merge(
    theta_a: Mapping[str, torch.Tensor],
    theta_b: Mapping[str, torch.Tensor],
    theta_base: Mapping[str, torch.Tensor],
    weights: Sequence[float] = (1.6, 0.2),
    density: float = 0.2,
    *,
    exclude: Iterable[str] = DEFAULT_EXCLUDE,
) -> StateDict:
    """``merge.py --mode ties``: θ_base + ``peft.utils.merge_utils.ties([τ_a, τ_b], (α, α2), density)`` (magnitude
    top-`density`, sign elected by the sum, disjoint mean over the agreeing tensors) per tensor."""
    return _peft_merge("ties", theta_a, theta_b, theta_base, weights, density, exclude, 0)


def dare_merge(
    theta_a: Mapping[str, torch.Tensor],
    theta_b: Mapping[str, torch.Tensor],
    theta_base: Mapping[str, torch.Tensor],
    weights: Sequence[float] = (0.9, 0.1),
    density: float = 0.2,
    *,
    exclude: Iterable[str] = DEFAULT_EXCLUDE,
    seed: int = 0,
) -> StateDict:
    """``merge.py --mode darelinear``: θ_base + ``peft.utils.merge_utils.dare_linear`` (random drop at `density`,
    rescaled by 1/density, weighted sum) per tensor; the drops are seeded by `seed`."""
    return _peft_merge("dare_linear", theta_a, theta_b, theta_base, weights, density, exclude, seed)


def layer_knockout(
    theta: Mapping[str, torch.Tensor], theta_base: Mapping[str, torch.Tensor], layers: Iterable[int]
) -> StateDict:
    """A copy of `theta` whose tensors in `layers` are reset to `theta_base` (knocks out their task vector; the
    other tensors are shared, not copied). `theta_base` needs only the keys of those layers."""
    chosen = set(layers)
    if not chosen:
        raise ValueError("layers is empty; expected at least one layer index to knock out")
    out: StateDict = dict(theta)
    hit = False
    for k in theta:
        if layer_index(k) in chosen:
            if k not in theta_base:
                raise ValueError(f"theta_base has no tensor {k!r}; it is needed to knock out layer {layer_index(k)}")
            out[k] = theta_base[k].clone()
            hit = True
    if not hit:
        raise ValueError(f"no tensor of theta lies in layers {sorted(chosen)}; expected keys like "
                         "'model.layers.<i>....'")  # fmt: skip
    return out


def layer_blocks(n_layers: int, block_size: int) -> list[list[int]]:
    """Consecutive blocks of `block_size` layers (the last one may be shorter): 30 layers, 3 -> 10 blocks."""
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"n_layers must be an int >= 1, got {n_layers!r}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an int >= 1 (layers per knockout block), got {block_size!r}")
    return [list(range(s, min(n_layers, s + block_size))) for s in range(0, n_layers, block_size)]


def layer_norms(tau: Mapping[str, torch.Tensor], n_layers: int) -> list[float]:
    """||τ_ℓ||_2 over all tensors of each layer ℓ (0 for a layer without tensors)."""
    sq = [0.0] * n_layers
    for k, t in tau.items():
        layer = layer_index(k)
        if layer is not None and layer < n_layers:
            sq[layer] += float(t.float().pow(2).sum())
    return [math.sqrt(s) for s in sq]


def task_vector_norms(
    tau_a: Mapping[str, torch.Tensor], tau_b: Mapping[str, torch.Tensor], alphas: Iterable[float] = ()
) -> dict[str, Any]:
    """How large two task vectors are, and how much of each a linear merge carries (the dose of each).

    Over every tensor of either τ (a key missing from one counts as no change there), in float64:

        ‖τ‖ = sqrt(Σ_k ‖τ_k‖_F²),   cos = <τ_a, τ_b> / (‖τ_a‖ ‖τ_b‖),
        ‖τ_α‖ = ‖α τ_a + (1 − α) τ_b‖ = sqrt(α² ‖τ_a‖² + 2 α (1 − α) <τ_a, τ_b> + (1 − α)² ‖τ_b‖²),

    and per α the parts ``α ‖τ_a‖`` and ``(1 − α) ‖τ_b‖``, the share of `tau_b` in the merged delta
    ``share_b = (1 − α) ‖τ_b‖ / ‖τ_α‖`` (≈ (1 − α) ‖τ_b‖ / (α ‖τ_a‖) when that is small and cos ≈ 0; above 1 is
    possible when the two point apart) and ``b_to_a = (1 − α) ‖τ_b‖ / (α ‖τ_a‖)``.

    With τ_a = τ_vlm and τ_b = τ_reason: ``ratio = ‖τ_a‖ / ‖τ_b‖`` large says τ_reason is small by itself; a small
    `share_b` at a ratio near 1 says the merge weight (1 − α) is what keeps it out.

    Returns:
        ``{"norm_a", "norm_b", "ratio" (inf when ‖τ_b‖ = 0), "cosine" (nan when either is 0), "by_alpha": [{"alpha",
        "merged_norm", "part_a", "part_b", "share_a", "share_b", "b_to_a"}, ...]}`` (nan where a norm is 0).
    """
    if not tau_a and not tau_b:
        raise ValueError("both task vectors are empty; expected dicts of tensors (τ = θ − θ_base)")
    sq_a = sq_b = dot = 0.0
    for k in sorted(set(tau_a) | set(tau_b)):  # a fixed order: a set's varies between processes (str hashing)
        a, b = tau_a.get(k), tau_b.get(k)
        if a is not None and b is not None and tuple(a.shape) != tuple(b.shape):
            raise ValueError(f"{k}: shape {tuple(a.shape)} vs {tuple(b.shape)}; the task vectors must share a base")
        if a is not None:
            sq_a += float(a.double().pow(2).sum())
        if b is not None:
            sq_b += float(b.double().pow(2).sum())
        if a is not None and b is not None:
            dot += float((a.double() * b.double()).sum())
    norm_a, norm_b = math.sqrt(sq_a), math.sqrt(sq_b)
    nan = float("nan")

    def div(x: float, y: float) -> float:
        return x / y if y > 0 else nan

    rows = []
    for alpha in alphas:
        al = _check_alpha("alphas entries", alpha)
        merged = math.sqrt(max(0.0, al * al * sq_a + 2 * al * (1 - al) * dot + (1 - al) ** 2 * sq_b))
        part_a, part_b = abs(al) * norm_a, abs(1 - al) * norm_b
        rows.append({"alpha": al, "merged_norm": merged, "part_a": part_a, "part_b": part_b,
                     "share_a": div(part_a, merged), "share_b": div(part_b, merged),
                     "b_to_a": div(part_b, part_a)})  # fmt: skip
    return {"norm_a": norm_a, "norm_b": norm_b, "ratio": norm_a / norm_b if norm_b > 0 else math.inf,
            "cosine": div(dot, norm_a * norm_b), "by_alpha": rows}  # fmt: skip


def effective_blocks(drops: Sequence[float]) -> float:
    """How many blocks a sensitivity profile is spread over: (Σ d)² / Σ d² of the positive drops (1: one block
    carries it all; n: uniform over n blocks); 0 when no block matters."""
    pos = [max(0.0, float(d)) for d in drops]
    s2 = sum(d * d for d in pos)
    return 0.0 if s2 <= 0 else sum(pos) ** 2 / s2


class GlyphProjector(torch.nn.Module):
    """``soft = W_2 GELU(W_1 x + b_1) + b_2`` reshaped to (n_tokens, d_model): a 5x5 bitmap -> soft tokens (LLaVA's
    two-layer MLP projector, applied to raw pixels instead of a vision encoder's features).

    Args:
        in_dim (`int`, defaults to 25): pixels per image. d_model (`int`, defaults to 576): the LM's width.
        n_tokens (`int`, defaults to 2): soft tokens per image. hidden (`int`, defaults to 256): MLP width.
        init_scale (`float`, defaults to 0.02): std of the output layer's initial weights (soft tokens start small,
            near the scale of token embeddings).
    """

    def __init__(self, in_dim: int = 25, d_model: int = 576, n_tokens: int = 2, hidden: int = 256,
                 init_scale: float = 0.02) -> None:  # fmt: skip
        super().__init__()
        for name, v in (("in_dim", in_dim), ("d_model", d_model), ("n_tokens", n_tokens), ("hidden", hidden)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        self.in_dim, self.d_model, self.n_tokens = in_dim, d_model, n_tokens
        self.fc1 = torch.nn.Linear(in_dim, hidden)
        self.fc2 = torch.nn.Linear(hidden, n_tokens * d_model)
        torch.nn.init.normal_(self.fc2.weight, std=init_scale)
        torch.nn.init.zeros_(self.fc2.bias)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """(n, in_dim) pixels in {0, 1} -> (n, n_tokens, d_model) soft tokens."""
        if pixels.dim() != 2 or pixels.shape[1] != self.in_dim:
            raise ValueError(f"pixels must have shape (n, {self.in_dim}), got {tuple(pixels.shape)}")
        h = torch.nn.functional.gelu(self.fc1(pixels.float() * 2 - 1))  # (n, hidden), pixels centred to ±1
        return self.fc2(h).view(-1, self.n_tokens, self.d_model)  # (n, n_tokens, d_model)


__all__ = [
    "DEFAULT_EXCLUDE",
    "GlyphProjector",
    "check_same_base",
    "dare_merge",
    "effective_blocks",
    "layer_blocks",
    "layer_index",
    "layer_knockout",
    "layer_norms",
    "layerswap_merge",
    "linear_merge",
    "task_vector",
    "task_vector_norms",
    "ties_merge",
]
