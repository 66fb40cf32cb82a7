"""NZ-LoRA / Init[AB]: A0, B0 ~ U(-sqrt(β/n_in), +sqrt(β/n_in)); optionally W0 <- W0 - s·B0A0, s = α/r.

Li, Luo, Tang, Wang, Chen, Luo, Li, He & Li, "Beyond Zero Initialization: Investigating the Impact of Non-Zero
Initialization on LoRA Fine-Tuning Dynamics" (ICML 2025, https://arxiv.org/abs/2505.23194; official code
https://github.com/Leopold1423/non_zero_lora-icml25, a modified peft, not reviewed here). Pure: no I/O, no printing.

A LoRA layer computes ``h = W0 x + s · B A x`` with ``A ∈ R^{r×n_in}``, ``B ∈ R^{n_out×r}``, ``s = α/r`` (peft's
``scaling``; α/√r with rsLoRA: whatever peft holds is used).

* Init[A] (peft's default, ``init_lora_weights=True``, the baseline): ``A ~ kaiming_uniform(a=√5) = U(±1/√n_in)``,
  ``B = 0``, so ``B A = 0`` at step 0 and ∂L/∂A = s·Bᵀ(∂L/∂h)xᵀ = 0: only B moves on the first step.
* Init[AB] (NZ-LoRA): ``A ~ U(±√(β_A/n_in))`` and ``B ~ U(±√(β_B/n_in))``. β = 1 is peft's bound for A. The bound
  of B also uses ``n_in`` (a third-party re-implementation of the official code does this [3rd-party code];
  ``b_fan="out"`` uses ``n_out`` instead [verify]; the two agree on square projections).
* ``reset_weight``: ``W0 <- W0 - s · B0 A0`` once, in float32, so ``(W0 - s B0 A0) x + s B0 A0 x = W0 x``: the model
  starts at the pretrained function although both factors are non-zero (exact up to float32 rounding).
* Infinite-width reading (the paper's analysis [verify]): with B0 = 0 the early update of the product ``ΔW = s(ΔB A0
  + B0 ΔA + ΔB ΔA)`` has a single first-order path, ``ΔB A0``, so a too-small η learns slowly; with both factors of
  order n^{-1/2} the cross term ``B0 ΔA`` adds a second path of the same order, which keeps the update of order one
  when η is below its optimum: robustness to small learning rates.

`init_nonzero_lora` walks every peft ``lora.Linear`` layer of any peft model (``PeftModel``, ``LoraModel``, or a
module with injected LoRA layers), whatever its `LoraConfig` (targets, r, α, rsLoRA, ``fan_in_fan_out``).
peft's ``init_lora_weights=False`` is *not* this method: it leaves ``nn.Linear``'s default init, so B gets the bound
1/√r (far above √(β/n_in)), and peft 0.21.2's ``reset_lora_parameters`` does nothing for ``False``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

# moved to lmlab.core.training.lora (shared with model_swarms); the names stay importable from here
from lmlab.core.training.lora import adamw as _adamw  # noqa: F401
from lmlab.core.training.lora import train_steps

INIT_MODES: tuple[str, ...] = ("zero", "nz", "nz_reset")
B_FANS: tuple[str, ...] = ("in", "out")


def nonzero_bound(fan: int, beta: float) -> float:
    """The uniform bound ``sqrt(beta / fan)`` of Init[AB] (β = 1 equals peft's kaiming-uniform bound 1/√fan)."""
    if isinstance(fan, bool) or not isinstance(fan, int) or fan < 1:
        raise ValueError(f"fan must be an int >= 1 (the layer's input features), got {fan!r}")
    _check_beta("beta", beta)
    return math.sqrt(beta / fan)


def _check_beta(name: str, beta: float) -> float:
    if isinstance(beta, bool) or not isinstance(beta, int | float) or not math.isfinite(beta) or beta <= 0:
        raise ValueError(f"{name} must be a finite number > 0 (the init scale β of U(±√(β/n_in))), got {beta!r}")
    return float(beta)


@dataclass(frozen=True)
class LayerInit:
    """What Init[AB] did to one LoRA layer: its shapes, scaling s and the bounds used for A and B."""

    name: str
    in_features: int
    out_features: int
    r: int
    scaling: float
    bound_a: float
    bound_b: float


@dataclass
class NonZeroInit:
    """The record of an `init_nonzero_lora` call.

    ``factors`` holds float32 CPU copies of every layer's (A0, B0) when ``keep_factors`` (the default): with them
    `restore_base_weight` undoes a reset, and saving them (or the seed and β) is what lets a reset base be rebuilt
    (see the README's "Saving a reset model").
    """

    adapter: str
    beta_a: float
    beta_b: float
    b_fan: str
    reset_weight: bool
    layers: list[LayerInit] = field(default_factory=list)
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def lora_layers(model: Any, adapter: str = "default") -> Iterator[tuple[str, Any]]:
    """``(name, layer)`` of every peft LoRA layer of `model` that holds `adapter`.

    Raises:
        `ValueError`: when there is none (not a peft LoRA model, or no such adapter), or when a layer holding the
        adapter is not a linear LoRA layer (embedding / convolution LoRA: the paper's bound is for linear maps).
    """
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    found = False
    adapters: set[str] = set()
    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        adapters.update(module.lora_A.keys())
        if adapter not in module.lora_A:
            if adapter in getattr(module, "lora_embedding_A", {}):
                raise ValueError(f"layer {name!r} is an embedding LoRA ({type(module).__name__}); nonzero_lora "
                                 "expects linear LoRA layers (peft lora.Linear): no embeddings")  # fmt: skip
            continue
        if not isinstance(module, LoraLinear):
            raise ValueError(f"layer {name!r} is a {type(module).__name__}; nonzero_lora expects linear LoRA layers "
                             "(peft lora.Linear, e.g. target_modules=['q_proj', 'v_proj'])")  # fmt: skip
        found = True
        yield name, module
    if not found:
        have = f"; the model's LoRA adapters are {sorted(adapters)}" if adapters else ""
        raise ValueError(f"no peft LoRA layer holds adapter {adapter!r}: expected a peft model built with a "
                         f"LoraConfig (get_peft_model / LoraModel){have}")  # fmt: skip


def _check_layer(name: str, module: Any, adapter: str) -> None:
    if getattr(module, "merged", False):
        raise ValueError(f"layer {name!r} has merged adapters; unmerge them (model.unmerge_adapter()) before "
                         "re-initialising")  # fmt: skip
    if getattr(module, "use_dora", {}).get(adapter, False):
        raise ValueError(f"layer {name!r} uses DoRA for adapter {adapter!r}; Init[AB] is defined for plain LoRA "
                         "(use_dora=False)")  # fmt: skip


def _compute_dtype(module: Any) -> torch.dtype:
    """float32, or the base weight's dtype when it is wider (float64): never below float32."""
    return torch.promote_types(module.get_base_layer().weight.dtype, torch.float32)


def _delta_fp32(module: Any, adapter: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``s · B A`` in (at least) float32 in the base weight's layout (transposed for ``fan_in_fan_out``)."""
    dt = _compute_dtype(module)
    delta = (b.to(dt) @ a.to(dt)) * float(module.scaling[adapter])  # (out, in)
    return delta.T if module.fan_in_fan_out else delta


@torch.no_grad()
def _add_to_base(module: Any, delta: torch.Tensor) -> None:
    w = module.get_base_layer().weight
    dt = _compute_dtype(module)
    w.data.copy_((w.data.to(dt) + delta.to(w.device, dt)).to(w.dtype))


@torch.no_grad()
def init_nonzero_lora(
    model: Any,
    *,
    beta_a: float = 1.0,
    beta_b: float = 1.0,
    reset_weight: bool = False,
    adapter: str = "default",
    generator: torch.Generator | None = None,
    b_fan: str = "in",
    keep_factors: bool = True,
) -> NonZeroInit:
    """Re-initialise `adapter` of every LoRA layer of `model` to Init[AB], in place.

    Args:
        model: any peft model with LoRA layers (``PeftModel``, ``LoraModel`` or a module with injected layers).
        beta_a (`float`, defaults to 1.0): init scale of A, ``A ~ U(±√(β_A/n_in))`` (1.0 = peft's bound).
        beta_b (`float`, defaults to 1.0): init scale of B, ``B ~ U(±√(β_B/n_in))`` (``n_out`` with ``b_fan="out"``).
        reset_weight (`bool`, defaults to `False`): subtract ``s · B0 A0`` from the base weight (float32), so the
            model's outputs are unchanged at step 0.
        adapter (`str`, defaults to ``"default"``): the adapter to re-initialise.
        generator (`torch.Generator`, *optional*): CPU generator of the draws (default: torch's global RNG). Draws
            happen on the CPU in float32, layer by layer in module order, A then B, so a seed gives the same init on
            every device and dtype.
        b_fan (`str`, defaults to ``"in"``): the dimension in B's bound, ``"in"`` [3rd-party code] or ``"out"``.
        keep_factors (`bool`, defaults to `True`): keep CPU copies of (A0, B0) in the returned record.

    Returns:
        `NonZeroInit`: the layers touched, their bounds and (optionally) the initial factors.
    """
    beta_a, beta_b = _check_beta("beta_a", beta_a), _check_beta("beta_b", beta_b)
    if b_fan not in B_FANS:
        raise ValueError(f"b_fan must be one of {', '.join(B_FANS)}, got {b_fan!r}")
    if not isinstance(reset_weight, bool):
        raise ValueError(f"reset_weight must be a bool, got {reset_weight!r}")
    layers = list(lora_layers(model, adapter))
    for name, module in layers:
        _check_layer(name, module, adapter)
    record = NonZeroInit(adapter, beta_a, beta_b, b_fan, reset_weight)
    for name, module in layers:
        a_w, b_w = module.lora_A[adapter].weight, module.lora_B[adapter].weight  # (r, in), (out, r)
        r, n_in = a_w.shape
        n_out = b_w.shape[0]
        bound_a = nonzero_bound(n_in, beta_a)
        bound_b = nonzero_bound(n_in if b_fan == "in" else n_out, beta_b)
        a0 = torch.empty(a_w.shape, dtype=torch.float32).uniform_(-bound_a, bound_a, generator=generator)
        b0 = torch.empty(b_w.shape, dtype=torch.float32).uniform_(-bound_b, bound_b, generator=generator)
        a_w.data.copy_(a0.to(a_w.device, a_w.dtype))
        b_w.data.copy_(b0.to(b_w.device, b_w.dtype))
        if reset_weight:  # the stored (possibly low-precision) factors are what the forward pass uses
            _add_to_base(module, -_delta_fp32(module, adapter, a_w.data, b_w.data))
        record.layers.append(LayerInit(name, n_in, n_out, r, float(module.scaling[adapter]), bound_a, bound_b))
        if keep_factors:
            record.factors[name] = (a_w.detach().float().cpu().clone(), b_w.detach().float().cpu().clone())
    return record


def apply_nonzero_lora_init(
    peft_model: Any,
    beta_a: float = 1.0,
    beta_b: float = 1.0,
    reset_weight: bool = False,
    adapter: str = "default",
    generator: torch.Generator | None = None,
    *,
    b_fan: str = "in",
) -> Any:
    """`init_nonzero_lora` on `peft_model` (in place); returns the model, for chaining after ``get_peft_model``."""
    init_nonzero_lora(peft_model, beta_a=beta_a, beta_b=beta_b, reset_weight=reset_weight, adapter=adapter,
                      generator=generator, b_fan=b_fan, keep_factors=False)  # fmt: skip
    return peft_model


@torch.no_grad()
def reset_base_weight(model: Any, adapter: str = "default") -> list[str]:
    """``W0 <- W0 - s · B A`` with the adapter's *current* factors, in float32 (the reset of Init[AB] on its own).

    Rebuilds a reset base from a saved initial adapter: load the base model, load the adapter saved right after
    the init (``save_pretrained`` before training), call this, then load the trained adapter weights. Returns the
    names of the layers changed.
    """
    layers = list(lora_layers(model, adapter))
    for name, module in layers:
        _check_layer(name, module, adapter)
    names = []
    for name, module in layers:
        a, b = module.lora_A[adapter].weight, module.lora_B[adapter].weight
        _add_to_base(module, -_delta_fp32(module, adapter, a, b))
        names.append(name)
    return names


@torch.no_grad()
def restore_base_weight(model: Any, init: NonZeroInit) -> list[str]:
    """Undo a reset: ``W0 <- W0 + s · B0 A0`` with the initial factors kept in `init` (``keep_factors=True``)."""
    if not init.reset_weight:
        raise ValueError("init.reset_weight is False: the base weights were not changed, nothing to restore")
    if not init.factors:
        raise ValueError("init holds no factors (it was made with keep_factors=False); cannot restore the base")
    layers = dict(lora_layers(model, init.adapter))
    missing = sorted(set(init.factors) - set(layers))
    if missing:
        raise ValueError(f"the model has no LoRA layer {missing[0]!r} of the record ({len(missing)} missing)")
    for name, (a0, b0) in init.factors.items():
        _add_to_base(layers[name], _delta_fp32(layers[name], init.adapter, a0, b0))
    return list(init.factors)


def init_lora(
    model: Any,
    mode: str,
    *,
    beta: float = 1.0,
    adapter: str = "default",
    generator: torch.Generator | None = None,
    b_fan: str = "in",
) -> NonZeroInit | None:
    """One of the reproduction's init modes on a freshly built peft LoRA model: ``"zero"`` (peft's Init[A], left as
    built: checks that B is zero), ``"nz"`` (Init[AB] with β_A = β_B = `beta`) or ``"nz_reset"`` (the same plus the
    base-weight reset)."""
    if mode not in INIT_MODES:
        raise ValueError(f"mode must be one of {', '.join(INIT_MODES)}, got {mode!r}")
    if mode == "zero":
        for name, module in lora_layers(model, adapter):
            if bool(module.lora_B[adapter].weight.detach().abs().max() > 0):
                raise ValueError(f"mode 'zero' expects peft's default init (B = 0), but layer {name!r} has B != 0; "
                                 "build the model with init_lora_weights=True")  # fmt: skip
        return None
    return init_nonzero_lora(model, beta_a=beta, beta_b=beta, reset_weight=mode == "nz_reset", adapter=adapter,
                             generator=generator, b_fan=b_fan, keep_factors=False)  # fmt: skip


def lora_factor_stats(model: Any, adapter: str = "default") -> dict[str, dict[str, float]]:
    """Per layer: max |A|, max |B|, std of A and B, and ‖s·B A‖_F (the product's size at the current step)."""
    out = {}
    for name, module in lora_layers(model, adapter):
        a = module.lora_A[adapter].weight.detach().float()
        b = module.lora_B[adapter].weight.detach().float()
        out[name] = {"max_abs_a": float(a.abs().max()), "max_abs_b": float(b.abs().max()),
                     "std_a": float(a.std()), "std_b": float(b.std()),
                     "product_fro": float(_delta_fp32(module, adapter, a, b).norm())}  # fmt: skip
    return out


# ---------------------------------------------------------------------------------------------------------------
# the learning-rate sweep: init modes x learning rates x seeds, equal steps, constant lr


@dataclass
class SweepRun:
    """One training run of `lr_sweep`: its init mode, lr and seed, the loss of every step and the per-example
    evaluation metrics after training (``eval``) and before it (``eval0``, when asked for)."""

    mode: str
    lr: float
    seed: int
    beta: float
    losses: list[float]
    eval: dict[str, list[float]]
    eval0: dict[str, list[float]] | None = None


def lr_sweep(
    build_model: Any,
    loss_fn: Any,
    eval_fn: Any,
    batches: Any,
    *,
    lrs: Any,
    modes: Any = INIT_MODES,
    seeds: Any = (0,),
    beta: float = 1.0,
    b_fan: str = "in",
    adapter: str = "default",
    max_grad_norm: float | None = 1.0,
    optimizer_fn: Any = None,
    eval_step0: bool = False,
    on_run: Any = None,
) -> list[SweepRun]:
    """Init modes x learning rates x seeds, each run from a fresh model, equal steps and the same batches.

    Args:
        build_model: ``build_model() -> model``: a fresh peft LoRA model with peft's default init (called after
            ``torch.manual_seed(seed)``, so Init[A]'s A is seeded too), e.g.
            ``lambda: get_peft_model(copy.deepcopy(base), LoraConfig(...))``.
        loss_fn: ``loss_fn(model, batch) -> scalar tensor`` (teacher-forced answer NLL, say).
        eval_fn: ``eval_fn(model) -> dict[str, list[float]]`` of per-example held-out metrics (e.g. ``{"nll": ...}``).
        batches: the training batches, or ``batches(seed) -> batches``: the same for every mode and lr of a seed.
        lrs, modes, seeds: the grid (`modes` among `INIT_MODES`).
        beta (`float`): β_A = β_B of the non-zero modes; b_fan: see `init_nonzero_lora`.
        eval_step0 (`bool`): also evaluate right after the init (the reset leaves the model unchanged).
        on_run: ``on_run(run)`` after each run (progress, logging).

    Returns:
        `list[SweepRun]` in (seed, mode, lr) order.
    """
    lrs, modes, seeds = list(lrs), list(modes), list(seeds)
    if not lrs or not modes or not seeds:
        raise ValueError(f"lrs, modes and seeds must be non-empty, got {len(lrs)}, {len(modes)}, {len(seeds)} entries")
    for m in modes:
        if m not in INIT_MODES:
            raise ValueError(f"modes entries must be among {', '.join(INIT_MODES)}, got {m!r}")
    runs = []
    for seed in seeds:
        data = batches(seed) if callable(batches) else batches
        data = list(data)
        if not data:
            raise ValueError("batches is empty: lr_sweep needs at least one training batch")
        for mode in modes:
            for lr in lrs:
                torch.manual_seed(seed)
                model = build_model()
                init_lora(model, mode, beta=beta, adapter=adapter, b_fan=b_fan,
                          generator=torch.Generator().manual_seed(seed))  # fmt: skip
                ev0 = _evaluate(eval_fn, model) if eval_step0 else None
                losses = train_steps(model, loss_fn, data, lr, max_grad_norm=max_grad_norm, optimizer_fn=optimizer_fn)
                run = SweepRun(mode, float(lr), seed, float(beta), losses, _evaluate(eval_fn, model), ev0)
                runs.append(run)
                if on_run is not None:
                    on_run(run)
                del model
    return runs


def _evaluate(eval_fn: Any, model: Any) -> dict[str, list[float]]:
    model.eval()
    with torch.no_grad():
        out = eval_fn(model)
    return {k: [float(v) for v in vals] for k, vals in out.items()}


def sweep_table(runs: Any, metric: str = "nll") -> list[dict[str, Any]]:
    """Mean of `metric` per (mode, lr) over seeds and examples: the rows of an NLL-vs-lr table or plot."""
    cells: dict[tuple[str, float], list[float]] = {}
    for r in runs:
        cells.setdefault((r.mode, r.lr), []).extend(r.eval[metric])
    return [{"mode": m, "lr": lr, metric: sum(v) / len(v), "n": len(v)} for (m, lr), v in sorted(cells.items())]
