"""IBCircuit: information-bottleneck keep-rates per attention head, and the node-level baselines it is compared with.

``z = λ·a + (1 − λ)·μ + (1 − λ)·σ·ε,  λ = sigmoid(ω),  loss = α·KL(p_clean ‖ p_z) + β·KL(N(z) ‖ N(μ, σ²))``
(Bian et al., ICML 2025, https://arxiv.org/abs/2602.22581; official code https://github.com/ivanniu/IBCircuit,
``models/gpt2_IB.py``). ``a`` is one head's output (the slice of ``o_proj``'s input, lmlab's
``blocks.{l}.attn.hook_z``), μ and σ its mean and standard deviation over the batch at each (position, dim).

Everything here works on any Hugging Face llama-family / gemma3 causal LM through `lmlab.core.inference.hooks` (no
model
surgery). Pure: no I/O, no printing. Shapes: B batch, S sequence, L layers, H query heads, D head dim, V vocab.

Baselines, all read off the same `CircuitBatch` and scored by the same `evaluate_circuit` (position-wise mean
ablation of every head outside the circuit):

- `eap_node_scores`: attribution patching at node level, ``|E_b Σ_{s,d} (a_clean − a_corrupt)·∂m/∂a|``.
- `hap_scores`: head-importance pruning (Michel et al. 2019), ``E_b |∂CE/∂ξ_h|`` at ξ = 1 for a head gate ξ.
- `random_scores`: random head ranking.
- `patching_scores`: exact one-head-at-a-time mean-ablation patching (L·H forwards: the "reference" ranking).

Evaluation (`evaluate_circuit`, `CircuitEval`): the raw metric m(C) of the circuit (the paper's logit-difference
axis), the normalised faithfulness ``(m(C) − m(∅)) / (m̄(M) − m̄(∅))`` (∅: every head ablated, M: the full model;
can exceed 1) and ``KL(p_M ‖ p_C)`` at the answer position; over a curve of sizes, `faithfulness_distance`
``mean_k |F(C_k) − 1|`` (lower is better: it counts an overshoot past the full model as a deviation, not a win).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from lmlab.core.inference.hooks import _arch, _text_model, hooks, run_with_cache

__all__ = [
    "CircuitBatch",
    "CircuitEval",
    "IBCircuit",
    "answer_logits",
    "auroc",
    "bottleneck_hook",
    "check_model",
    "eap_node_scores",
    "evaluate_circuit",
    "faithfulness_curve",
    "faithfulness_distance",
    "hap_scores",
    "head_means",
    "masked_head_hook",
    "metric_values",
    "patching_scores",
    "random_scores",
    "top_k_heads",
]

METRICS = ("logit_diff", "prob_diff")
Z_NAME = "attn.hook_z"


# ---------------------------------------------------------------------------------------------------------------
# data container and the task metric


@dataclass
class CircuitBatch:
    """A batch of prompts with aligned token positions (needed: μ, σ and mean ablation are per position).

    Args:
        task (`str`): a label (``"ioi"``, ``"greater_than"``, ``"induction"``, or a user's).
        input_ids (`torch.LongTensor`): (B, S) clean prompts, no padding.
        answer_pos (`torch.LongTensor`): (B,) the position whose next-token distribution is read.
        good, bad (`torch.BoolTensor`): (B, V) token sets of the metric (IOI: {IO} vs {S}; greater-than: digits
            above vs at-or-below the start's tens digit; induction: the copied token vs every other token).
        metric (`str`): ``"logit_diff"`` (mean logit over `good` − mean over `bad`) or ``"prob_diff"`` (Σ p over
            `good` − Σ p over `bad`, the greater-than PD).
        target (`torch.LongTensor`, *optional*): (B,) token of the CE losses (None: the clean model's argmax).
        corrupt_ids (`torch.LongTensor`, *optional*): (B, S) counterfactual prompts (EAP only).
        ids (`list[str]`): one id per prompt (the independent unit of every CI).
        prompts (`list[str]`): the prompts as text (for samples), optional.
    """

    task: str
    input_ids: torch.Tensor
    answer_pos: torch.Tensor
    good: torch.Tensor
    bad: torch.Tensor
    metric: str = "logit_diff"
    target: torch.Tensor | None = None
    corrupt_ids: torch.Tensor | None = None
    ids: list[str] = field(default_factory=list)
    prompts: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.input_ids.dim() != 2 or self.input_ids.shape[0] == 0 or self.input_ids.shape[1] == 0:
            raise ValueError(
                f"input_ids must be a non-empty (batch, seq) tensor, got shape {tuple(self.input_ids.shape)}"
            )
        b, s = self.input_ids.shape
        if self.answer_pos.shape != (b,):
            raise ValueError(f"answer_pos must have shape ({b},), got {tuple(self.answer_pos.shape)}")
        if int(self.answer_pos.min()) < 0 or int(self.answer_pos.max()) >= s:
            raise ValueError(f"answer_pos must lie in [0, {s - 1}], got {self.answer_pos.tolist()}")
        if self.good.shape != self.bad.shape or self.good.shape[0] != b:
            raise ValueError(
                f"good and bad must both be (batch={b}, vocab) masks, got {tuple(self.good.shape)} "
                f"and {tuple(self.bad.shape)}"
            )
        if not bool(self.good.any(1).all()) or not bool(self.bad.any(1).all()):
            raise ValueError("every prompt needs at least one good and one bad token in its metric")
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {self.metric!r}")
        if self.corrupt_ids is not None and self.corrupt_ids.shape != self.input_ids.shape:
            raise ValueError(
                f"corrupt_ids must have the shape of input_ids {(b, s)}, got {tuple(self.corrupt_ids.shape)}"
            )
        if not self.ids:
            self.ids = [f"{self.task}/{i}" for i in range(b)]
        if len(self.ids) != b:
            raise ValueError(f"ids must have one entry per prompt ({b}), got {len(self.ids)}")

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def subset(self, idx: Sequence[int]) -> CircuitBatch:
        """The prompts at `idx` (a new batch)."""
        ix = torch.as_tensor(list(idx), dtype=torch.long)
        pick = lambda t: None if t is None else t[ix]  # noqa: E731
        return replace(
            self,
            input_ids=self.input_ids[ix],
            answer_pos=self.answer_pos[ix],
            good=self.good[ix],
            bad=self.bad[ix],
            target=pick(self.target),
            corrupt_ids=pick(self.corrupt_ids),
            ids=[self.ids[i] for i in ix.tolist()],
            prompts=[self.prompts[i] for i in ix.tolist()] if self.prompts else [],
        )


def metric_values(logits: torch.Tensor, batch: CircuitBatch) -> torch.Tensor:
    """The task metric per prompt from answer-position logits (B, V): (B,)."""
    good, bad = batch.good.to(logits.device), batch.bad.to(logits.device)
    if batch.metric == "prob_diff":
        p = logits.float().softmax(-1)
        return (p * good).sum(-1) - (p * bad).sum(-1)
    lg = logits.float()
    return (lg * good).sum(-1) / good.sum(-1) - (lg * bad).sum(-1) / bad.sum(-1)


# ---------------------------------------------------------------------------------------------------------------
# model plumbing


def check_model(model: nn.Module) -> tuple[int, int, int]:
    """``(n_layers, n_heads, head_dim)`` of a supported model; a one-line error otherwise."""
    try:
        arch = _arch(model)
    except (TypeError, AttributeError) as e:
        raise ValueError(
            f"model {type(model).__name__} is not a supported decoder-only LM (llama / gemma3 "
            f"layout with per-head o_proj inputs): {e}"
        ) from None
    return arch.n_layers, arch.n_heads, arch.head_dim


def answer_logits(model: nn.Module, input_ids: torch.Tensor, answer_pos: torch.Tensor) -> torch.Tensor:
    """Next-token logits at `answer_pos` only: (B, V). The lm_head runs on one position per prompt (~20% cheaper)."""
    device = next(model.parameters()).device
    ids = input_ids.to(device)
    hidden = _text_model(model)(input_ids=ids, use_cache=False).last_hidden_state  # (B, S, d_model)
    h = hidden[torch.arange(ids.shape[0], device=device), answer_pos.to(device)]  # (B, d_model)
    logits = model.get_output_embeddings()(h)
    cap = getattr(getattr(model, "config", None), "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits.float()


def _z_hooks(fn: Callable[[torch.Tensor, int], torch.Tensor]) -> list[tuple[Any, Any]]:
    """One hook over every layer's per-head outputs; `fn(z, layer)` returns the replacement z (B, S, H, D)."""

    def hook_fn(z: torch.Tensor, *, hook: Any) -> torch.Tensor:
        return fn(z, hook.layer)

    return [(lambda n: n.endswith(Z_NAME), hook_fn)]


@torch.no_grad()
def head_means(model: nn.Module, batch: CircuitBatch) -> torch.Tensor:
    """Position-wise mean of every head's output over the batch: (L, S, H, D), the mean-ablation reference."""
    _, cache = run_with_cache(model, batch.input_ids, lambda n: n.endswith(Z_NAME))
    return cache.stack(Z_NAME).float().mean(1)  # (L, B, S, H, D) -> (L, S, H, D)


def masked_head_hook(keep: torch.Tensor, reference: torch.Tensor | None) -> list[tuple[Any, Any]]:
    """Hooks setting ``z_h ← m_h·z_h + (1 − m_h)·ref_h`` for every head (mean ablation; zero ablation when
    `reference` is None). `keep`: (L, H) or per prompt (B, L, H), values in [0, 1] (1 keeps the head exactly)."""

    def fn(z: torch.Tensor, layer: int) -> torch.Tensor:
        m = keep[layer] if keep.dim() == 2 else keep[:, layer]  # (H,) or (B, H)
        m = m.to(z.dtype).view(*([1] if m.dim() == 1 else [m.shape[0]]), 1, -1, 1)  # (1|B, 1, H, 1)
        ref = 0.0 if reference is None else reference[layer].to(z.dtype).unsqueeze(0)  # (1, S, H, D)
        return m * z + (1 - m) * ref

    return _z_hooks(fn)


# ---------------------------------------------------------------------------------------------------------------
# IBCircuit


def bottleneck_hook(
    lam: torch.Tensor, noise: torch.Generator | None, kl_out: list[torch.Tensor], eps: float = 1e-7
) -> list[tuple[Any, Any]]:
    """Hooks injecting the Gaussian bottleneck on every head (official ``IB_GPT2Attention.forward``).

    `lam`: keep-rates (B, L, H) or (L, H). μ, σ are ``torch.std_mean`` over the batch (unbiased σ, as the official
    code; its backward gives 0, not NaN, where σ = 0, e.g. at a first token shared by the batch); ε has the shape
    of μ (one draw per position and dim, shared by the batch, as the official code). Each layer appends its mean
    compression KL to `kl_out`. With ``lam == 1`` the output is the clean output exactly.
    """

    def fn(a: torch.Tensor, layer: int) -> torch.Tensor:
        l_ = lam[layer] if lam.dim() == 2 else lam[:, layer]
        l_ = l_.to(a.dtype).view(*([1] if l_.dim() == 1 else [l_.shape[0]]), 1, -1, 1)  # (1|B, 1, H, 1)
        std, mean = torch.std_mean(a, dim=0)  # (S, H, D) each
        noise_mean = l_ * a + (1 - l_) * mean
        noise_std = (1 - l_) * std
        eps_draw = torch.randn(mean.shape, generator=noise, dtype=a.dtype) if noise is not None else None
        z = noise_mean if eps_draw is None else noise_mean + noise_std * eps_draw.to(a.device)
        kl = 0.5 * (
            (noise_std / (std + eps)) ** 2
            + ((noise_mean - mean) / (std + eps)) ** 2
            + torch.log((std / (noise_std + eps) + eps) ** 2)
        )
        kl_out.append(kl.mean())
        return z

    return _z_hooks(fn)


def _frozen(model: nn.Module) -> list[tuple[nn.Parameter, bool]]:
    state = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in state:
        p.requires_grad_(False)
    return state


def _restore(state: list[tuple[nn.Parameter, bool]]) -> None:
    for p, flag in state:
        p.requires_grad_(flag)


class IBCircuit:
    """``min_ω α·KL(p_clean ‖ p_z) + β·mean KL(N(z) ‖ N(μ, σ²)),  z = λa + (1−λ)μ + (1−λ)σε,  λ = sigmoid(ω)``.

    Paper: https://arxiv.org/abs/2602.22581 (node level, as the released code).

    Args:
        model: A frozen HF llama-family / gemma3 causal LM (its weights are never changed).
        per_example (`bool`, defaults to `True`): one ω per prompt and head, shape (B, L, H), as the official code;
            False learns one ω per head.
        alpha, beta (`float`, default 1, 1): weights of the faithfulness and compression terms.
        lr (`float`, defaults to 0.1): Adam learning rate (official 0.05 over 1300 epochs).
        steps (`int`, defaults to 60): full-batch Adam steps (official 1300).
        init_mean, init_std (`float`, defaults to 5.0, 0.01): ω ~ N(init_mean, init_std).
        loss (`str`, defaults to ``"kl"``): faithfulness term ``"kl"`` (KL to the clean next-token distribution)
            or ``"ce"`` (|CE_noisy − CE_clean| on the batch's target, else the clean argmax).
        seed (`int`, defaults to 42): seeds ω's initialisation and the noise ε.
        eps (`float`, defaults to 1e-7): the official guards of the compression KL.

    Example:
        >>> ib = IBCircuit(model, steps=60)
        >>> lam = ib.fit(batch)          # (L, H) keep-rates averaged over the batch
        >>> heads = ib.circuit(top_k=20)  # [(layer, head), ...]
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        per_example: bool = True,
        alpha: float = 1.0,
        beta: float = 1.0,
        lr: float = 0.1,
        steps: int = 60,
        init_mean: float = 5.0,
        init_std: float = 0.01,
        loss: str = "kl",
        seed: int = 42,
        eps: float = 1e-7,
    ) -> None:
        self.n_layers, self.n_heads, _ = check_model(model)
        for name, val in (("alpha", alpha), ("beta", beta)):
            if not (isinstance(val, (int, float)) and val >= 0 and math.isfinite(val)):
                raise ValueError(f"{name} must be a finite number >= 0, got {val!r}")
        if alpha == 0 and beta == 0:
            raise ValueError("alpha and beta cannot both be 0 (nothing to optimise)")
        if not (isinstance(lr, (int, float)) and lr > 0):
            raise ValueError(f"lr must be > 0, got {lr!r}")
        if not (isinstance(steps, int) and steps >= 0):
            raise ValueError(f"steps must be an int >= 0, got {steps!r}")
        if loss not in ("kl", "ce"):
            raise ValueError(f"loss must be 'kl' or 'ce', got {loss!r}")
        if not init_std >= 0:
            raise ValueError(f"init_std must be >= 0, got {init_std!r}")
        self.model, self.per_example, self.alpha, self.beta = model, per_example, float(alpha), float(beta)
        self.lr, self.steps, self.init_mean, self.init_std = float(lr), steps, float(init_mean), float(init_std)
        self.loss, self.seed, self.eps = loss, seed, float(eps)
        self.omega: torch.Tensor | None = None
        self.history: list[dict[str, float]] = []

    # -- fitting ---------------------------------------------------------------------------------------------

    def _init_omega(self, batch_size: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed)
        shape = (batch_size, self.n_layers, self.n_heads) if self.per_example else (self.n_layers, self.n_heads)
        return (self.init_mean + self.init_std * torch.randn(shape, generator=g)).requires_grad_(True)

    def fit(
        self, batch: CircuitBatch, callback: Callable[[int, dict[str, float]], None] | None = None
    ) -> torch.Tensor:
        """Optimise ω on `batch` (full batch, `steps` Adam steps); returns the (L, H) keep-rates λ̄ (batch mean).

        `callback(step, {"loss", "faith", "compress", "mean_lambda"})` is called after every step.
        """
        if batch.size < 2:
            raise ValueError(f"IBCircuit needs a batch of >= 2 prompts (μ, σ are batch statistics), got {batch.size}")
        model = self.model
        with torch.no_grad():
            clean = answer_logits(model, batch.input_ids, batch.answer_pos)  # (B, V)
        logp_clean = clean.log_softmax(-1)
        target = batch.target if batch.target is not None else clean.argmax(-1)
        target = target.to(clean.device)
        omega = self._init_omega(batch.size)
        opt = torch.optim.Adam([omega], lr=self.lr)
        noise = torch.Generator().manual_seed(self.seed + 1)
        state = _frozen(model)
        self.history = []
        try:
            for step in range(self.steps):
                lam = torch.sigmoid(omega).to(next(model.parameters()).device)
                kls: list[torch.Tensor] = []
                with hooks(model, bottleneck_hook(lam, noise, kls, self.eps)):
                    logits = answer_logits(model, batch.input_ids, batch.answer_pos)
                logp = logits.log_softmax(-1)
                if self.loss == "kl":  # KL(p_clean || p_noisy), mean over prompts
                    faith = (logp_clean.exp() * (logp_clean - logp)).sum(-1).mean()
                else:
                    ce = lambda lp: -lp.gather(1, target[:, None]).squeeze(1).mean()  # noqa: E731
                    faith = (ce(logp) - ce(logp_clean)).abs()
                compress = torch.stack(kls).mean()  # official: layer means averaged over layers
                total = self.alpha * faith + self.beta * compress
                opt.zero_grad()
                total.backward()
                opt.step()
                rec = {
                    "loss": float(total.detach()),
                    "faith": float(faith.detach()),
                    "compress": float(compress.detach()),
                    "mean_lambda": float(lam.detach().mean()),
                }
                self.history.append(rec)
                if callback is not None:
                    callback(step, rec)
        finally:
            _restore(state)
        self.omega = omega.detach()
        return self.lambdas

    # -- readout ---------------------------------------------------------------------------------------------

    @property
    def keep_rates(self) -> torch.Tensor:
        """λ per prompt and head (B, L, H), or (L, H) when not `per_example`."""
        if self.omega is None:
            raise RuntimeError("call fit(batch) first")
        return torch.sigmoid(self.omega)

    @property
    def lambdas(self) -> torch.Tensor:
        """The (L, H) score matrix: λ averaged over the batch (the official readout)."""
        lam = self.keep_rates
        return lam.mean(0) if lam.dim() == 3 else lam

    def circuit(self, threshold: float | None = None, top_k: int | None = None) -> list[tuple[int, int]]:
        """Heads with λ̄ > `threshold` (official thresholds 0.8, 0.6, 0.4, 0.2), or the `top_k` heads by λ̄."""
        if (threshold is None) == (top_k is None):
            raise ValueError("give exactly one of threshold= or top_k=")
        lam = self.lambdas
        if threshold is not None:
            if not 0.0 <= threshold <= 1.0:
                raise ValueError(f"threshold must be in [0, 1], got {threshold!r}")
            return [(int(a), int(b)) for a, b in (lam > threshold).nonzero().tolist()]
        return top_k_heads(lam, int(top_k))

    def lambda_histogram(self, bins: int = 10) -> tuple[list[int], list[float]]:
        """Counts of λ̄ in `bins` equal bins over [0, 1], and the bin edges."""
        lam = self.lambdas.flatten()
        counts = torch.histc(lam, bins=bins, min=0.0, max=1.0)
        return [int(c) for c in counts], torch.linspace(0, 1, bins + 1).tolist()


# ---------------------------------------------------------------------------------------------------------------
# baselines


def eap_node_scores(model: nn.Module, batch: CircuitBatch) -> torch.Tensor:
    """Attribution patching per head: ``|E_b Σ_{s,d} (a_clean − a_corrupt) · ∂m/∂a|`` (L, H).

    One corrupted forward, one clean forward and one backward of the batch-mean metric m at the clean activations.
    """
    if batch.corrupt_ids is None:
        raise ValueError("eap_node_scores needs batch.corrupt_ids (counterfactual prompts of the same shape)")
    check_model(model)
    _, cache = run_with_cache(model, batch.corrupt_ids, lambda n: n.endswith(Z_NAME))
    corrupt = cache.stack(Z_NAME)  # (L, B, S, H, D)
    leaves: dict[int, torch.Tensor] = {}

    def fn(z: torch.Tensor, layer: int) -> torch.Tensor:
        # keep the graph between layers (a head's total effect includes the paths through later heads): the first
        # layer's z becomes a leaf, later ones keep their history and retain their gradient
        if not z.requires_grad:
            z = z.detach().requires_grad_(True)
        else:
            z = z.clone()  # a new tensor, so that it (not the hook's view) is what o_proj reads
            z.retain_grad()
        leaves[layer] = z
        return z

    state = _frozen(model)
    try:
        with hooks(model, _z_hooks(fn)):
            logits = answer_logits(model, batch.input_ids, batch.answer_pos)
        metric_values(logits, batch).sum().backward()  # sum: each prompt's own gradient
    finally:
        _restore(state)
    out = []
    for layer in range(len(leaves)):
        leaf = leaves[layer]
        attr = ((leaf.detach() - corrupt[layer].to(leaf.dtype)) * leaf.grad).sum((1, 3))  # (B, H)
        out.append(attr.mean(0).abs())
    return torch.stack(out).float().cpu()  # (L, H)


def hap_scores(model: nn.Module, batch: CircuitBatch, reference: torch.Tensor | None = None) -> torch.Tensor:
    """Head importance (Michel et al. 2019): ``E_b |∂CE_b/∂ξ_h|`` at ξ = 1 (L, H).

    The gate ξ interpolates each head toward `reference` (``z ← ξz + (1 − ξ)·ref``): the position-wise mean of
    `head_means`, so the gradient scores the same ablation the evaluation uses; None is Michel's zero gate ξ·z.
    CE is on ``batch.target`` (else the clean argmax). Per-prompt gates give per-prompt gradients in one backward.
    """
    n_layers, n_heads, _ = check_model(model)
    device = next(model.parameters()).device
    if batch.target is None:
        with torch.no_grad():
            target = answer_logits(model, batch.input_ids, batch.answer_pos).argmax(-1)
    else:
        target = batch.target
    xi = torch.ones(batch.size, n_layers, n_heads, device=device, requires_grad=True)
    state = _frozen(model)
    try:
        with hooks(model, masked_head_hook(xi, reference)):
            logits = answer_logits(model, batch.input_ids, batch.answer_pos)
        ce = nn.functional.cross_entropy(logits, target.to(device), reduction="sum")  # sum: per-prompt grads
        ce.backward()
    finally:
        _restore(state)
    return xi.grad.abs().mean(0).float().cpu()  # (L, H)


def random_scores(n_layers: int, n_heads: int, seed: int) -> torch.Tensor:
    """A random ranking (L, H), seeded."""
    return torch.rand(n_layers, n_heads, generator=torch.Generator().manual_seed(int(seed)))


@torch.no_grad()
def patching_scores(model: nn.Module, batch: CircuitBatch, reference: torch.Tensor) -> torch.Tensor:
    """Exact per-head mean-ablation patching: ``|E_b m(clean) − E_b m(head h mean-ablated)|`` (L, H); L·H forwards."""
    n_layers, n_heads, _ = check_model(model)
    base = metric_values(answer_logits(model, batch.input_ids, batch.answer_pos), batch).mean()
    out = torch.zeros(n_layers, n_heads)
    for layer in range(n_layers):
        for head in range(n_heads):
            keep = torch.ones(n_layers, n_heads)
            keep[layer, head] = 0.0
            with hooks(model, masked_head_hook(keep, reference)):
                m = metric_values(answer_logits(model, batch.input_ids, batch.answer_pos), batch).mean()
            out[layer, head] = (base - m).abs()
    return out


# ---------------------------------------------------------------------------------------------------------------
# evaluation: the same mean ablation for every method


@dataclass
class CircuitEval:
    """Per-prompt faithfulness of one circuit C (heads kept, every other head ablated).

    ``metric``: m(C), the task metric under ablation (B,); ``full``: m(M), the full model (B,); ``ablated``: m(∅),
    every head ablated by the same ablation (B,); ``kl``: KL(p_full ‖ p_circuit) at the answer position (B,).

    Three readouts of m(C), each a positive affine map of it with constants shared by every circuit on the same
    prompts (so they rank circuits alike whenever m̄(M) > m̄(∅) and m̄(M) > 0):

    - ``metric`` itself: the raw logit difference (or PD) the paper plots against circuit size;
    - `faithfulness`: ``(m(C) − m(∅)) / (m̄(M) − m̄(∅))``, the normalised faithfulness of the circuit-discovery
      literature (0 = no better than ablating every head, 1 = the full model); its prompt mean is the
      ratio of means;
    - `recovery`: ``m(C) / m̄(M)`` (Wang et al.'s F(C)/F(M)), which is not 0 for the empty circuit.

    Both normalised readouts can exceed 1: ablating heads that work against the answer (IOI's negative name movers)
    gives a circuit a larger logit difference than the full model. That is not more faithful: `faithfulness_distance`
    (``|F − 1|``, mean over the sizes of a curve) counts it as a deviation, and KL catches it too.
    """

    heads: list[tuple[int, int]]
    metric: torch.Tensor
    full: torch.Tensor
    kl: torch.Tensor
    ablated: torch.Tensor

    @property
    def gap(self) -> float:
        """``m̄(M) − m̄(∅)``: how much of the metric the heads carry (<= 0: the model does not do the task)."""
        return float(self.full.mean() - self.ablated.mean())

    @property
    def faithfulness(self) -> torch.Tensor:
        """``(m(C) − m(∅)) / (m̄(M) − m̄(∅))`` per prompt (B,); its mean is the normalised faithfulness."""
        gap = self.gap
        return (self.metric - self.ablated) / (gap if abs(gap) > 1e-12 else math.copysign(1e-12, gap))

    @property
    def recovery(self) -> torch.Tensor:
        """``m(C) / m̄(M)`` per prompt (B,): the recovered fraction without the all-ablated baseline."""
        denom = float(self.full.mean())
        return self.metric / (denom if abs(denom) > 1e-12 else 1e-12)


def top_k_heads(scores: torch.Tensor, k: int) -> list[tuple[int, int]]:
    """The `k` highest-scoring heads of an (L, H) matrix (ties broken by index, deterministic)."""
    n_layers, n_heads = scores.shape
    if not 0 <= k <= n_layers * n_heads:
        raise ValueError(f"top_k must be in [0, {n_layers * n_heads}], got {k!r}")
    flat = scores.flatten().double()
    order = sorted(range(flat.numel()), key=lambda i: (-float(flat[i]), i))[:k]
    return [(i // n_heads, i % n_heads) for i in order]


@torch.no_grad()
def evaluate_circuit(
    model: nn.Module,
    heads: Sequence[tuple[int, int]],
    batch: CircuitBatch,
    *,
    ablation: str = "mean",
    reference: torch.Tensor | None = None,
    full_logits: torch.Tensor | None = None,
    ablated_metric: torch.Tensor | None = None,
) -> CircuitEval:
    """Keep `heads`, ablate all other heads (``"mean"``: position-wise mean of `reference` = `head_means`, computed
    on `batch` when None; ``"zero"``), and measure the metric and the KL to the full model per prompt.

    `ablated_metric` (B,): m(∅) under the same ablation, if already known (else one more forward computes it).
    """
    n_layers, n_heads, _ = check_model(model)
    if ablation not in ("mean", "zero"):
        raise ValueError(f"ablation must be 'mean' or 'zero', got {ablation!r}")
    keep = torch.zeros(n_layers, n_heads)
    for layer, head in heads:
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise ValueError(f"head ({layer}, {head}) is outside the model's {n_layers} layers x {n_heads} heads")
        keep[layer, head] = 1.0
    if ablation == "mean" and reference is None:
        reference = head_means(model, batch)
    if full_logits is None:
        full_logits = answer_logits(model, batch.input_ids, batch.answer_pos)
    ref = reference if ablation == "mean" else None
    with hooks(model, masked_head_hook(keep, ref)):
        logits = answer_logits(model, batch.input_ids, batch.answer_pos)
    lp_full, lp = full_logits.log_softmax(-1), logits.log_softmax(-1)
    kl = (lp_full.exp() * (lp_full - lp)).sum(-1).clamp_min(0.0)
    metric = metric_values(logits, batch).cpu()
    if ablated_metric is None:
        if not heads:
            ablated_metric = metric
        else:
            with hooks(model, masked_head_hook(torch.zeros(n_layers, n_heads), ref)):
                ablated_metric = metric_values(answer_logits(model, batch.input_ids, batch.answer_pos), batch)
    ablated_metric = ablated_metric.detach().float().cpu()
    if ablated_metric.shape != metric.shape:
        raise ValueError(f"ablated_metric must have shape {tuple(metric.shape)}, got {tuple(ablated_metric.shape)}")
    return CircuitEval(list(heads), metric, metric_values(full_logits, batch).cpu(), kl.cpu(), ablated_metric)


def faithfulness_curve(
    model: nn.Module,
    scores: torch.Tensor,
    batch: CircuitBatch,
    ks: Sequence[int],
    *,
    reference: torch.Tensor | None = None,
    ablation: str = "mean",
) -> dict[int, CircuitEval]:
    """`evaluate_circuit` of the top-k heads of `scores` for every k in `ks` (the faithfulness vs size curve)."""
    if reference is None and ablation == "mean":
        reference = head_means(model, batch)
    with torch.no_grad():
        full = answer_logits(model, batch.input_ids, batch.answer_pos)
    kw: dict[str, Any] = dict(ablation=ablation, reference=reference, full_logits=full)
    empty = evaluate_circuit(model, [], batch, **kw).metric  # m(∅): once, shared by every k
    return {
        int(k): evaluate_circuit(model, top_k_heads(scores, int(k)), batch, ablated_metric=empty, **kw) for k in ks
    }


def faithfulness_distance(metric: Any, full: Any, ablated: Any) -> float:
    """``mean_k |F(C_k) − 1|``: how far a faithfulness curve stays from the full model, overshoot and undershoot alike.

    ``F(C_k) = (m̄(C_k) − m̄(∅)) / (m̄(M) − m̄(∅))`` is `CircuitEval.faithfulness` averaged over the prompts (the ratio
    of means), so ``|F(C_k) − 1| = |m̄(C_k) − m̄(M)| / (m̄(M) − m̄(∅))``: 0 when the circuit keeps the full model's
    metric, and a circuit that keeps a *larger* metric than the model (F > 1: it dropped heads that work against the
    answer, such as IOI's negative name movers) is as far from it as one that keeps as much too little. This is the
    area between the faithfulness curve and 1 (the circuit–model distance of MIB, Mueller et al. 2025), taken as the
    mean over the circuit sizes k.

    Args:
        metric: m(C_k) per prompt and circuit size, (B, K) (torch or numpy).
        full, ablated: m(M) and m(∅) per prompt, (B,).

    Divides by |m̄(M) − m̄(∅)| (floored at 1e-12), which is `CircuitEval.faithfulness`'s F for any gap; but at a gap
    <= 0 the model does not do the task and F means nothing: check `CircuitEval.gap` first.
    """
    gap = float(full.mean() - ablated.mean())
    deviation = abs(metric.mean(0) - full.mean())  # (K,) |m̄(C_k) − m̄(M)|
    return float(deviation.mean()) / max(abs(gap), 1e-12)


def auroc(scores: torch.Tensor, truth: torch.Tensor) -> float:
    """AUROC of `scores` against boolean `truth` (same shape): P(score of a true head > a false head), ties 1/2."""
    s, t = scores.flatten().double(), truth.flatten().bool()
    pos, neg = s[t], s[~t]
    if pos.numel() == 0 or neg.numel() == 0:
        raise ValueError("auroc needs at least one true and one false head")
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).double() + 0.5 * (diff == 0).double()).mean())
