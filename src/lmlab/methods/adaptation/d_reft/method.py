"""D-ReFT: distribution-wise (stochastic) representation interventions, and pointwise LoReFT as the baseline.

Paper: Deng, Chang, Chen, "Learning Distribution-Wise Control in Representation Space for Language Models", ICML 2025,
https://arxiv.org/abs/2506.06686 (official code: https://github.com/chili-lab/D-Intervention, commit a3d355c).

Pointwise LoReFT (Wu et al. 2024) edits the residual stream ("block_output") of layer ℓ at a few prompt positions:

    Φ(h) = h + Rᵀ(W h + b − R h),          R ∈ R^{r×d} with orthonormal rows

D-LoReFT replaces the deterministic node ``W h + b`` by a sample (the released ``VIBreftIntervention``):

    μ = W_μ h + b_μ,   log σ² = W_σ h + b_σ,   σ = clamp(exp(½ clamp(log σ², −14, −3.2)), 0.001, 0.2)
    z = μ + σ ⊙ ε,     ε ~ N(0, I)                                         (reparameterisation)
    Φ(h) = h + Rᵀ(z − R h)

with an optional ``β · KL(N(μ, σ²) ‖ N(0, I))`` term (the code's ``--use_compression``, off by default). The released
classes sample at evaluation too (no train/eval switch): ``sample_at_eval=True`` is that behaviour, ``False`` uses the
mean μ at evaluation. With σ ≡ 0 (``sigma_clamp=(0, 0)``, or the mean at evaluation) D-LoReFT *is* LoReFT with
W = W_μ, b = b_μ, bit for bit: both compute ``(W − R) h + b`` as one product.

Positions (pyreft's grammar): ``"fK+lK"`` = the first K and the last K prompt tokens, each capped at ``n // 2`` for a
prompt of n tokens (pyreft's ``get_intervention_locations``); with ``share_weights`` one intervention serves both
groups, otherwise the first group gets intervention 0 and the last group intervention 1. Positions are computed per
example from the attention mask, so left and right padding give the same tokens.

Hooks are lmlab's native forward hooks (`lmlab.core.inference.hooks`, point ``blocks.{ℓ}.hook_resid_post`` = pyvene's
``block_output`` of layer ℓ); no pyreft or pyvene dependency. The hook edits only a forward whose sequence length is
the prompt's (the prompt pass): later decoding steps with a KV cache are left alone, as pyreft does.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lmlab.core.inference.hooks import HookPoint, hooks
from lmlab.core.inference.interventions import LoReFTIntervention

__all__ = [
    "COMPONENTS",
    "DLoreftIntervention",
    "InterventionHandle",
    "LoreftIntervention",
    "ReftConfig",
    "TrainStats",
    "attach_interventions",
    "make_intervention",
    "option_logprobs",
    "parse_positions",
    "positions_from_mask",
    "train_intervention",
]

# pyreft's name for the pointwise baseline; the class lives in lmlab.core.inference.interventions (shared with other
# methods)
LoreftIntervention = LoReFTIntervention

COMPONENTS: dict[str, str] = {"block_output": "blocks.{layer}.hook_resid_post"}
_POS_RE = re.compile(r"^(?:f(\d+))?\+?(?:l(\d+))?$")


class DLoreftIntervention(LoReFTIntervention):
    """Distribution-wise LoReFT: ``Φ(h) = h + Rᵀ(z − R h)``, ``z = μ + σ ⊙ ε``, ``μ = W_μ h + b_μ``,
    ``log σ² = W_σ h + b_σ`` (the official ``VIBreftIntervention``; https://arxiv.org/abs/2506.06686).

    A subclass of the pointwise `LoReFTIntervention`: ``learned_source`` is the mean network (alias
    ``mean_network``, the official name), ``logvar_network`` is new (one more r × d matrix and r biases).

    Args:
        d (`int`): hidden size.
        rank (`int`): subspace dimension r.
        logvar_clamp (`tuple[float, float]`, defaults to ``(-14.0, -3.2)``): clamp of log σ² (official values).
        sigma_clamp (`tuple[float, float]`, defaults to ``(0.001, 0.2)``): clamp of σ (official values); ``(0, 0)``
            makes the intervention deterministic (= LoReFT).
        sample_at_eval (`bool`, defaults to `True`): sample z in eval mode too (the released code always samples);
            False uses μ in eval mode. Training mode always samples.
        kl_beta (`float`, defaults to 0): weight of the KL term returned by `kl_loss` (0: off, the code's default).
        dropout, act_fn, dtype: as `LoReFTIntervention`.

    Attributes:
        generator (`torch.Generator`, *optional*): the source of ε (None: torch's global RNG).
        noise_scale (`float`): multiplies ε (1 = the method; 0 = the mean; the σ sweep of the experiment).
        last_std (`torch.Tensor`, *optional*): σ (N, r) of the last forward, detached (for σ statistics).
        sigma_log (`list`, *optional*): when a list, σ (N, r) of every forward is appended to it.
    """

    def __init__(
        self,
        d: int,
        rank: int,
        *,
        logvar_clamp: tuple[float, float] = (-14.0, -3.2),
        sigma_clamp: tuple[float, float] = (0.001, 0.2),
        sample_at_eval: bool = True,
        kl_beta: float = 0.0,
        dropout: float = 0.0,
        act_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(d, rank, dropout=dropout, act_fn=act_fn, dtype=dtype)
        lv, sc = tuple(map(float, logvar_clamp)), tuple(map(float, sigma_clamp))
        if len(lv) != 2 or lv[0] > lv[1]:
            raise ValueError(f"logvar_clamp must be (low, high) with low <= high, got {logvar_clamp!r}")
        if len(sc) != 2 or not 0.0 <= sc[0] <= sc[1] or not math.isfinite(sc[1]):
            raise ValueError(f"sigma_clamp must be (low, high) with 0 <= low <= high < inf, got {sigma_clamp!r}")
        if not math.isfinite(kl_beta) or kl_beta < 0:
            raise ValueError(f"kl_beta must be >= 0, got {kl_beta!r}")
        self.logvar_clamp, self.sigma_clamp = lv, sc
        self.sample_at_eval, self.kl_beta = bool(sample_at_eval), float(kl_beta)
        self.logvar_network = nn.Linear(d, rank, dtype=dtype)
        self.generator: torch.Generator | None = None
        self.noise_scale = 1.0
        self.last_std: torch.Tensor | None = None
        self.sigma_log: list[torch.Tensor] | None = None  # set to a list to collect σ of every forward
        self._kl_terms: list[torch.Tensor] = []

    @property
    def mean_network(self) -> nn.Linear:
        """The mean network μ = W_μ h + b_μ (the official name; the same module as ``learned_source``)."""
        return self.learned_source

    @property
    def sampling(self) -> bool:
        """Whether the next forward samples z (training mode, or eval mode with `sample_at_eval`)."""
        return self.training or self.sample_at_eval

    def sigma(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(σ, log σ²)`` of h: (..., d) -> (..., r) each; σ with both of the official clamps, log σ² raw."""
        logvar = self.logvar_network(h)  # (..., r)
        std = torch.exp(0.5 * logvar.clamp(*self.logvar_clamp)).clamp(*self.sigma_clamp)
        return std, logvar

    def forward(self, h: torch.Tensor, eps: torch.Tensor | None = None) -> torch.Tensor:
        """Apply the stochastic edit to h: (..., d) -> (..., d); `eps` (..., r) overrides the sampled ε."""
        r = self.R.to(h.dtype)  # (rank, d)
        w, b = self.learned_source.weight, self.learned_source.bias
        if self.act_fn is None:
            diff = nn.functional.linear(h, w - r, b)  # (..., rank) = μ − R h, one product as in LoReFT
        else:
            diff = self.act_fn(self.learned_source(h)) - self.rotate_layer(h)
        std, logvar = self.sigma(h)
        self.last_std = std.detach()
        if self.sigma_log is not None:
            self.sigma_log.append(self.last_std.reshape(-1, std.shape[-1]))
        if self.kl_beta > 0 and torch.is_grad_enabled():
            mu = nn.functional.linear(h, w, b) if self.act_fn is None else self.act_fn(self.learned_source(h))
            # the official KL uses the unclamped log σ²: −½ Σ (1 + log σ² − μ² − σ²), mean over positions
            self._kl_terms.append((-0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(-1)).mean())
        if self.sampling and self.noise_scale != 0.0:
            if eps is None:
                eps = torch.randn(std.shape, generator=self.generator, dtype=std.dtype, device=std.device)
            diff = diff + (self.noise_scale * std) * eps
        return self.dropout(h + torch.matmul(diff, r))

    def kl_loss(self) -> torch.Tensor:
        """``β · mean KL`` over the forwards since the last call (0 when β = 0); clears the stored terms."""
        terms, self._kl_terms = self._kl_terms, []
        if self.kl_beta == 0 or not terms:
            return self.learned_source.bias.new_zeros(())
        return self.kl_beta * torch.stack(terms).mean()


def make_intervention(kind: str, d: int, rank: int, **kwargs: Any) -> LoReFTIntervention:
    """``"loreft"`` -> `LoreftIntervention`, ``"d_loreft"`` -> `DLoreftIntervention` (kwargs go to the latter)."""
    if kind == "loreft":
        return LoreftIntervention(d, rank)
    if kind == "d_loreft":
        return DLoreftIntervention(d, rank, **kwargs)
    raise ValueError(f"kind must be 'loreft' or 'd_loreft', got {kind!r}")


# ---------------------------------------------------------------------------------------------------------------
# positions and configuration


def parse_positions(positions: str) -> tuple[int, int]:
    """pyreft's position grammar: ``"f3+l3"`` -> (3, 3); ``"f1"`` -> (1, 0); ``"l5"`` -> (0, 5)."""
    m = _POS_RE.match(positions.strip()) if isinstance(positions, str) else None
    if m is None or (m.group(1) is None and m.group(2) is None):
        raise ValueError(f"positions must look like 'f3+l3', 'f1' or 'l5' (first / last K prompt tokens), got "
                         f"{positions!r}")  # fmt: skip
    first, last = int(m.group(1) or 0), int(m.group(2) or 0)
    if first + last == 0:
        raise ValueError(f"positions must select at least one token, got {positions!r}")
    return first, last


@dataclass(frozen=True)
class ReftConfig:
    """Where an intervention sits (pyreft's ``ReftConfig`` for one representation).

    Args:
        layer (`int`): decoder layer ℓ (0-based).
        rank (`int`, defaults to 4): r (paper: 8).
        positions (`str`, defaults to ``"f3+l3"``): first / last K prompt tokens (README: f7+l7; train.py: f1+l1).
        share_weights (`bool`, defaults to `True`): one intervention for the f and l positions (the README's flag).
        component (`str`, defaults to ``"block_output"``): the residual stream after layer ℓ (the only one here).
    """

    layer: int
    rank: int = 4
    positions: str = "f3+l3"
    share_weights: bool = True
    component: str = "block_output"

    def __post_init__(self) -> None:
        if isinstance(self.layer, bool) or not isinstance(self.layer, int) or self.layer < 0:
            raise ValueError(f"layer must be an int >= 0, got {self.layer!r}")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"rank must be an int >= 1, got {self.rank!r}")
        parse_positions(self.positions)
        if self.component not in COMPONENTS:
            raise ValueError(f"component must be one of {', '.join(COMPONENTS)}, got {self.component!r}")

    @property
    def hook_name(self) -> str:
        return COMPONENTS[self.component].format(layer=self.layer)

    @property
    def n_interventions(self) -> int:
        """Interventions this config needs: 1 when shared (or one group is empty), else 2 (f, l)."""
        first, last = parse_positions(self.positions)
        return 1 if self.share_weights or first == 0 or last == 0 else 2


def positions_from_mask(
    positions: str, attention_mask: torch.Tensor, prompt_lengths: Sequence[int] | torch.Tensor | None = None
) -> torch.Tensor:
    """Per-example intervention locations, (batch, f + l) long, −1 in unused slots.

    The prompt of row b is its first ``prompt_lengths[b]`` real tokens (``attention_mask == 1``; default: all of
    them), whatever the padding side. Slots ``[0, f)`` hold the first ``min(f, n // 2)`` prompt tokens, slots
    ``[f, f + l)`` the last ``min(l, n // 2)`` (pyreft's ``get_intervention_locations``, so the groups never
    overlap), as absolute indices into the padded sequence.
    """
    first, last = parse_positions(positions)
    if attention_mask.ndim != 2:
        raise ValueError(f"attention_mask must be (batch, seq), got shape {tuple(attention_mask.shape)}")
    b = attention_mask.shape[0]
    if prompt_lengths is not None and len(prompt_lengths) != b:
        raise ValueError(f"prompt_lengths has {len(prompt_lengths)} entries, expected one per row ({b})")
    out = torch.full((b, first + last), -1, dtype=torch.long)
    for i in range(b):
        real = torch.nonzero(attention_mask[i].bool(), as_tuple=False).flatten().cpu()  # absolute indices
        n = len(real) if prompt_lengths is None else int(prompt_lengths[i])
        if not 0 < n <= len(real):
            raise ValueError(f"row {i}: prompt length must be in [1, {len(real)}] (its real tokens), got {n}")
        f, l_ = min(first, n // 2), min(last, n // 2)
        out[i, :f] = real[:f]
        out[i, first : first + l_] = real[n - l_ : n]
    return out.to(attention_mask.device)


# ---------------------------------------------------------------------------------------------------------------
# attaching


@dataclass
class InterventionHandle:
    """Interventions attached at a hook point; `remove` (or leaving a ``with`` block) detaches them.

    Set the locations of the next batch with `set_locations` (from `positions_from_mask`). The hook edits a forward
    only when ``enabled``, locations are set and the forward's sequence length equals the one they were computed
    for (the prompt pass; KV-cached decoding steps are left alone). `input_noise` (α) adds Gaussian noise of
    per-coordinate std ``α · RMS(h)`` (that token's RMS) to the representation at the intervened positions before
    the intervention reads it (the experiment's robustness probe), drawn from `noise_generator`.
    """

    model: nn.Module
    config: ReftConfig
    interventions: list[nn.Module]
    enabled: bool = True
    input_noise: float = 0.0
    noise_generator: torch.Generator | None = None
    locations: torch.Tensor | None = None
    seq_len: int | None = None
    _stack: contextlib.ExitStack | None = field(default=None, repr=False)

    def set_locations(self, locations: torch.Tensor | None, seq_len: int | None = None) -> InterventionHandle:
        """Locations (batch, f + l) for the next forward calls, with the sequence length they index."""
        if locations is not None and locations.ndim != 2:
            raise ValueError(f"locations must be (batch, f + l), got shape {tuple(locations.shape)}")
        self.locations = locations
        self.seq_len = seq_len
        return self

    def remove(self) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    def __enter__(self) -> InterventionHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def parameters(self) -> list[nn.Parameter]:
        return [p for iv in self.interventions for p in iv.parameters()]

    def _groups(self) -> list[tuple[nn.Module, slice]]:
        first, last = parse_positions(self.config.positions)
        if len(self.interventions) == 1:
            return [(self.interventions[0], slice(0, first + last))]
        return [(self.interventions[0], slice(0, first)), (self.interventions[1], slice(first, first + last))]

    def hook_fn(self, tensor: torch.Tensor, *, hook: HookPoint) -> torch.Tensor | None:
        """The forward hook: (batch, seq, d) -> the same with the intervened positions replaced."""
        if not self.enabled or self.locations is None:
            return None
        if self.seq_len is not None and tensor.shape[1] != self.seq_len:
            return None
        if tensor.shape[0] != self.locations.shape[0]:
            raise ValueError(f"the forward has batch {tensor.shape[0]}, the locations were set for "
                             f"{self.locations.shape[0]} rows")  # fmt: skip
        out = tensor.clone()
        locs = self.locations.to(tensor.device)
        for iv, slots in self._groups():
            loc = locs[:, slots]  # (batch, P)
            rows, cols = torch.nonzero(loc >= 0, as_tuple=True)
            if rows.numel() == 0:
                continue
            t_idx = loc[rows, cols]
            h = tensor[rows, t_idx]  # (N, d)
            if self.input_noise > 0:
                rms = h.detach().pow(2).mean(-1, keepdim=True).sqrt()  # (N, 1)
                noise = torch.randn(h.shape, generator=self.noise_generator, dtype=h.dtype, device=h.device)
                h = h + self.input_noise * rms * noise
            out[rows, t_idx] = iv(h).to(tensor.dtype)
        return out


def attach_interventions(
    model: nn.Module, config: ReftConfig, interventions: nn.Module | Sequence[nn.Module]
) -> InterventionHandle:
    """Attach `interventions` at ``config``'s layer and component with a native forward hook.

    Args:
        model: a Hugging Face llama-family or gemma3 causal LM (see `lmlab.core.inference.hooks`).
        config: the `ReftConfig`.
        interventions: one module (shared by the f and l positions), or ``config.n_interventions`` modules.

    Returns:
        An `InterventionHandle`; call ``handle.set_locations(positions_from_mask(...), seq_len)`` before each batch
        and ``handle.remove()`` (or use it in a ``with`` block) to detach.
    """
    ivs = [interventions] if isinstance(interventions, nn.Module) else list(interventions)
    n_layers = len(model.model.layers) if hasattr(model, "model") and hasattr(model.model, "layers") else None
    if n_layers is not None and config.layer >= n_layers:
        raise ValueError(f"layer must be in [0, {n_layers - 1}] (the model has {n_layers} blocks), got {config.layer}")
    if len(ivs) != config.n_interventions and not (len(ivs) == 1 and config.n_interventions == 2):
        raise ValueError(f"config {config.positions!r} (share_weights={config.share_weights}) needs "
                         f"{config.n_interventions} interventions, got {len(ivs)}")  # fmt: skip
    handle = InterventionHandle(model, config, ivs)
    stack = contextlib.ExitStack()
    stack.enter_context(hooks(model, fwd=[(config.hook_name, handle.hook_fn)]))
    handle._stack = stack
    return handle


# ---------------------------------------------------------------------------------------------------------------
# training and scoring on token ids


def _left_pad(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.as_tensor(list(r), dtype=torch.long)
        mask[i, width - len(r) :] = 1
    return ids.to(device), mask.to(device)


@dataclass
class TrainStats:
    """What `train_intervention` measured: the loss per step, the steps, the final learning rate."""

    losses: list[float]
    steps: int
    kl: list[float] = field(default_factory=list)


def _check_pairs(pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> None:
    if not pairs:
        raise ValueError("train_intervention needs at least one (prompt_ids, answer_ids) pair, got none")
    for i, (p, a) in enumerate(pairs):
        if len(p) == 0 or len(a) == 0:
            raise ValueError(f"pair {i} has an empty prompt or answer (got {len(p)} and {len(a)} tokens)")


def train_intervention(
    model: nn.Module,
    handle: InterventionHandle,
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    steps: int,
    batch_size: int = 16,
    lr: float = 3e-3,
    warmup_ratio: float = 0.1,
    weight_decay: float = 0.0,
    pad_id: int = 0,
    generator: torch.Generator | None = None,
    callback: Callable[[int, float], None] | None = None,
) -> TrainStats:
    """Train the handle's interventions by teacher forcing on (prompt, answer) token pairs; the model stays frozen.

    Loss: mean cross-entropy over the answer tokens (pyreft's supervised loss, prompt tokens masked) plus any
    intervention's `kl_loss`. AdamW over the interventions' parameters only (``backward(inputs=...)``: no gradient
    is computed for, or written to, the model's weights), a linear schedule with `warmup_ratio` warm-up (the
    README's ``--warmup_ratio 0.1``, ``lr_scheduler_type="linear"``). Batches are drawn with replacement of
    epochs: a seeded permutation of the pairs, concatenated as often as needed.

    Args:
        model: the frozen causal LM the handle is attached to.
        handle: from `attach_interventions`.
        pairs: ``(prompt_ids, answer_ids)``; the interventions act on the prompt's positions.
        steps, batch_size, lr, warmup_ratio, weight_decay: the optimisation.
        pad_id: padding token id (left padding).
        generator: the data order (None: torch's global RNG).
        callback: ``callback(step, loss)`` after each step.
    """
    _check_pairs(pairs)
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps} and {batch_size}")
    if not 0.0 <= warmup_ratio < 1.0:
        raise ValueError(f"warmup_ratio must be in [0, 1), got {warmup_ratio}")
    params = handle.parameters()
    if not params:
        raise ValueError("the handle's interventions have no parameters to train")
    device = next(model.parameters()).device
    for iv in handle.interventions:
        iv.train()
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    warm = int(math.ceil(warmup_ratio * steps))

    def lr_at(step: int) -> float:  # transformers' get_linear_schedule_with_warmup
        if step < warm:
            return float(step + 1) / float(max(1, warm))
        return max(0.0, float(steps - step) / float(max(1, steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s))
    order: list[int] = []
    losses, kls = [], []
    for step in range(steps):
        while len(order) < batch_size:
            order += torch.randperm(len(pairs), generator=generator).tolist()
        idx, order = order[:batch_size], order[batch_size:]
        rows = [list(pairs[i][0]) + list(pairs[i][1]) for i in idx]
        ids, mask = _left_pad(rows, pad_id, device)
        pos = (mask.cumsum(-1) - 1).clamp_min(0)
        plens = [len(pairs[i][0]) for i in idx]
        handle.set_locations(positions_from_mask(handle.config.positions, mask, plens), ids.shape[1])
        keep = max(len(pairs[i][1]) for i in idx) + 1
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                       logits_to_keep=keep).logits  # (batch, keep, vocab)  # fmt: skip
        lp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # position j predicts token T-keep+1+j
        targets = ids[:, -keep + 1 :]  # (batch, keep - 1)
        tmask = torch.zeros_like(targets, dtype=torch.bool)
        for r, i in enumerate(idx):
            tmask[r, keep - 1 - len(pairs[i][1]) :] = True
        tok_lp = lp.gather(-1, targets[..., None]).squeeze(-1)
        loss = -(tok_lp * tmask).sum() / tmask.sum()
        kl = sum((iv.kl_loss() for iv in handle.interventions if hasattr(iv, "kl_loss")), loss.new_zeros(()))
        total = loss + kl
        opt.zero_grad(set_to_none=True)
        total.backward(inputs=params)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        kls.append(float(kl.detach()))
        if callback is not None:
            callback(step, losses[-1])
    handle.set_locations(None)
    for iv in handle.interventions:
        iv.eval()
    return TrainStats(losses, steps, kls)


@torch.no_grad()
def option_logprobs(
    model: nn.Module,
    handle: InterventionHandle | None,
    prompts: Sequence[Sequence[int]],
    options: Sequence[Sequence[Sequence[int]]],
    *,
    batch_size: int = 16,
    pad_id: int = 0,
    positions: str | None = None,
) -> list[list[float]]:
    """``log p(option | prompt)`` (summed over the option's tokens) of every option of every prompt.

    One prompt pass per batch (left padded, with the interventions at the prompt positions and a KV cache; its last
    logits score every option's first token), then one pass over the later tokens of the options of 2+ tokens (one
    row per such option on its prompt's cache, right padded, the interventions off): the prompt is encoded once per
    item, so a stochastic intervention draws one ε per item, shared by its options.
    Equal to scoring each ``prompt + option`` sequence on its own when the intervention is deterministic (tested).

    Args:
        model: the causal LM.
        handle: attached interventions (None: the bare model).
        prompts: token ids per item (non-empty).
        options: per item, the same number K of options, each a non-empty token list.
        batch_size: items per prompt pass (K times as many rows in the option pass).
        pad_id: padding token id.
        positions: the position grammar (default: the handle's config).
    """
    if len(prompts) != len(options):
        raise ValueError(f"got {len(prompts)} prompts but {len(options)} option lists")
    if not prompts:
        return []
    k = len(options[0])
    for i, (p, opts) in enumerate(zip(prompts, options)):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty")
        if len(opts) != k or any(len(o) == 0 for o in opts):
            raise ValueError(f"item {i}: expected {k} non-empty options, got {[len(o) for o in opts]} tokens")
    device = next(model.parameters()).device
    spec = positions or (handle.config.positions if handle is not None else "f1")
    out: list[list[float]] = []
    for start in range(0, len(prompts), batch_size):
        batch_p = [list(p) for p in prompts[start : start + batch_size]]
        batch_o = [[list(o) for o in opts] for opts in options[start : start + batch_size]]
        ids, mask = _left_pad(batch_p, pad_id, device)
        pos = (mask.cumsum(-1) - 1).clamp_min(0)
        if handle is not None:
            handle.set_locations(positions_from_mask(spec, mask), ids.shape[1])
        try:
            first = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        finally:
            if handle is not None:
                handle.set_locations(None)
        lp0 = torch.log_softmax(first.logits[:, -1].float(), dim=-1)  # (B, vocab): predicts each option's token 0
        scores = [[float(lp0[b, o[0]]) for o in opts] for b, opts in enumerate(batch_o)]
        # the option pass: only options of 2+ tokens, one row each, on the prompt's cache selected per row
        need = [(b, j) for b, opts in enumerate(batch_o) for j, o in enumerate(opts) if len(o) > 1]
        if need:
            cache = getattr(first, "cache", None) or first.past_key_values
            sel = torch.as_tensor([b for b, _ in need], device=device)
            cache.batch_select_indices(sel)
            width = max(len(batch_o[b][j]) for b, j in need) - 1
            oid = torch.full((len(need), width), pad_id, dtype=torch.long)
            omask = torch.zeros((len(need), width), dtype=torch.long)
            for r, (b, j) in enumerate(need):
                row = batch_o[b][j][:-1]  # the tokens that predict tokens 1..c-1
                oid[r, : len(row)] = torch.as_tensor(row)
                omask[r, : len(row)] = 1
            oid, omask = oid.to(device), omask.to(device)
            full_mask = torch.cat([mask[sel], omask], dim=1)
            opos = mask[sel].sum(-1)[:, None] + torch.arange(width, device=device)[None]
            # transformers >= 5.2x names the argument `cache` (older: `past_key_values`)
            ckw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
            logits = model(input_ids=oid, attention_mask=full_mask, position_ids=opos, use_cache=True,
                           **{ckw: cache}).logits  # (rows, width, vocab)  # fmt: skip
            lps = torch.log_softmax(logits.float(), dim=-1)
            for r, (b, j) in enumerate(need):
                o = batch_o[b][j]
                tgt = torch.as_tensor(o[1:], device=device)
                scores[b][j] += float(lps[r, : len(o) - 1].gather(-1, tgt[:, None]).sum())
        out.extend(scores)
    return out
