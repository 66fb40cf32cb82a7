"""Model Swarms: v_i <- w_v v_i + w_p (p_i - x_i) + w_g (g - x_i) + w_w (x_i - g_w);  x_i <- x_i + λ v_i.

Feng, Wang, Wang, Ebrahimi, Palangi, Miculicich, Kulshrestha, Rauschmayr, Choi, Tsvetkov, Lee & Pfister, "Model
Swarms: Collaborative Search to Adapt LLM Experts via Swarm Intelligence" (ICML 2025,
https://arxiv.org/abs/2410.11163; official code https://github.com/BunsenFeng/model_swarm, ``search.py`` and
``merge.py`` at 63e6404, read for this implementation). Pure: no I/O, no printing.

A particle is a LoRA expert's state dict (every ``lora_A`` and ``lora_B`` tensor); checkpoint algebra is linear,
tensor by tensor, A and B separately (``merge.py``: ``Σ w_i · state_dict_i``), never on the product BA.

* Weights (``search.py`` ``particle_update``): r_v, r_p, r_g, r_w ~ U(0, 1) (``weight_randomess=1``; else 1),
  raw weights φ_v r_v, φ_p r_p, φ_g r_g, φ_w r_w (φ_w = 0 without the repel term), **normalised to sum to 1**.
* Velocity init: ``random`` (default) v_i = x_j - x_i for a random other particle j; ``zero``; ``best`` v_i = g - x_i.
* Each iteration: stop when the last `patience` entries of g's history are equal (history longer than patience);
  restart a particle whose best is at least ``restart_patience · patience`` evaluations old (x_i <- p_i, v_i <- 0,
  then the update); update every particle against the *previous* g and g_w; evaluate all; p_i on a strict
  improvement; g when the max beats it; g_w when the min falls below it; λ <- max(λ · decay, floor).
* Populate (optional): while the pool is smaller than `populate_to`, add ``w p_1 + (1 - w) p_2``, w ~ U(0, 2), for
  two distinct random parents (interpolation or extrapolation).

Baselines (same dev utility, reported on test): the best single expert, the uniform soup (mean of A and B), TIES and
DARE-linear with mergekit's definitions on the dense task vectors ΔW_i = s · B_i A_i, and random search over
mixing weights. Every searcher gets the same number of utility evaluations (`CountingUtility`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

StateDict = dict[str, torch.Tensor]
VELOCITY_INITS: tuple[str, ...] = ("random", "zero", "best")


# ---------------------------------------------------------------------------------------------------------------
# checkpoint algebra


def check_compatible(states: Sequence[StateDict]) -> None:
    """Raise ``ValueError`` unless every state dict has the same keys and shapes (same rank and target modules)."""
    if not states:
        raise ValueError("expected at least one LoRA state dict, got none")
    ref = states[0]
    if not ref:
        raise ValueError("state dict 0 is empty; expected the lora_A / lora_B tensors of an expert")
    for i, s in enumerate(states[1:], 1):
        if set(s) != set(ref):
            diff = sorted(set(s) ^ set(ref))[:2]
            raise ValueError(f"state dict {i} has other tensors than state dict 0 (e.g. {diff}); every expert needs "
                             "the same target modules")  # fmt: skip
        for k, t in s.items():
            if t.shape != ref[k].shape:
                raise ValueError(f"state dict {i}: {k} has shape {tuple(t.shape)}, state dict 0 has "
                                 f"{tuple(ref[k].shape)}; every expert needs the same LoRA rank")  # fmt: skip


def merge(weights: Sequence[float], states: Sequence[StateDict]) -> StateDict:
    """``Σ_i w_i · state_i``, tensor by tensor (``merge.py``'s ``lora_merge``): A and B separately."""
    if len(weights) != len(states):
        raise ValueError(f"weights has {len(weights)} entries, states has {len(states)}; expected one per state")
    check_compatible(states)
    out: StateDict = {}
    for k in states[0]:
        acc = torch.zeros_like(states[0][k], dtype=torch.float32)
        for w, s in zip(weights, states):
            acc = acc + float(w) * s[k].float()
        out[k] = acc
    return out


def _zeros(state: StateDict) -> StateDict:
    return {k: torch.zeros_like(t, dtype=torch.float32) for k, t in state.items()}


def _clone(state: StateDict) -> StateDict:
    return {k: t.detach().float().clone() for k, t in state.items()}


def normalized_weights(
    r: Sequence[float], phi: Sequence[float], *, repel: bool = True
) -> tuple[float, float, float, float]:
    """``(w_v, w_p, w_g, w_w)``: φ_k r_k normalised to sum to 1 (φ_w = 0 without the repel term); all zero when
    every raw weight is zero (the velocity then becomes 0)."""
    raw = [phi[0] * r[0], phi[1] * r[1], phi[2] * r[2], (phi[3] * r[3]) if repel else 0.0]
    total = sum(raw)
    if total <= 0:
        return 0.0, 0.0, 0.0, 0.0
    return tuple(w / total for w in raw)  # type: ignore[return-value]


def velocity_update(
    v: StateDict, x: StateDict, p: StateDict, g: StateDict, g_worst: StateDict, w: Sequence[float]
) -> StateDict:
    """``w_v v + w_p (p - x) + w_g (g - x) + w_w (x - g_worst)`` tensor by tensor."""
    return {k: w[0] * v[k] + w[1] * (p[k] - x[k]) + w[2] * (g[k] - x[k]) + w[3] * (x[k] - g_worst[k]) for k in x}


# ---------------------------------------------------------------------------------------------------------------
# budgeted utility


class BudgetExceeded(RuntimeError):
    """Raised by `CountingUtility` when a searcher asks for more evaluations than its budget."""


class CountingUtility:
    """Wraps ``utility(state) -> float`` and counts its calls (the evaluation budget); ``history`` keeps every value.

    Args:
        fn: the utility (higher is better).
        budget (`int`, *optional*): the most calls allowed; one more raises `BudgetExceeded`.
    """

    def __init__(self, fn: Callable[[Any], float], budget: int | None = None) -> None:
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise ValueError(f"budget must be None or an int >= 1 (utility evaluations), got {budget!r}")
        self.fn, self.budget = fn, budget
        self.calls = 0
        self.history: list[float] = []

    @property
    def left(self) -> int | None:
        return None if self.budget is None else self.budget - self.calls

    def __call__(self, state: Any) -> float:
        if self.budget is not None and self.calls >= self.budget:
            raise BudgetExceeded(f"utility budget of {self.budget} evaluations spent")
        value = float(self.fn(state))
        if not math.isfinite(value):
            raise ValueError(f"the utility returned {value!r}; expected a finite number")
        self.calls += 1
        self.history.append(value)
        return value


# ---------------------------------------------------------------------------------------------------------------
# the swarm


@dataclass
class SwarmConfig:
    """Hyperparameters of `ModelSwarm` (defaults: the official ``search.py``).

    Args:
        phi_v, phi_p, phi_g, phi_w (`float`): inertia, cognitive, social and repel coefficients (0.4, 0.3, 0.3, 0.3).
        step (`float`, defaults to 1.0): initial step length λ. step_decay (0.95), step_floor (0.1): λ's schedule.
        patience (`int`, defaults to 10): stop when g has not changed for `patience` iterations.
        max_iteration (`int`, defaults to 200): iteration cap.
        restart (`bool`, defaults to `True`): restart stray particles; restart_patience (`float`, 0.5 in
            ``search.py``, 0.67 in the run scripts): restart after ``restart_patience · patience`` stale evaluations.
        repel (`bool`, defaults to `True`): include the repel-the-worst term.
        weight_randomness (`bool`, defaults to `True`): draw r ~ U(0, 1) per term (else r = 1).
        velocity_init (`str`, defaults to ``"random"``): ``random``, ``zero`` or ``best``.
        populate_to (`int`, defaults to 0): grow the pool to this many particles first (0: off).
        seed (`int`, defaults to 42): the search's RNG (``search.py`` seeds python's random with 42).
    """

    phi_v: float = 0.4
    phi_p: float = 0.3
    phi_g: float = 0.3
    phi_w: float = 0.3
    step: float = 1.0
    step_decay: float = 0.95
    step_floor: float = 0.1
    patience: int = 10
    max_iteration: int = 200
    restart: bool = True
    restart_patience: float = 0.5
    repel: bool = True
    weight_randomness: bool = True
    velocity_init: str = "random"
    populate_to: int = 0
    seed: int = 42

    def __post_init__(self) -> None:
        for name in ("phi_v", "phi_p", "phi_g", "phi_w"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if self.phi_v + self.phi_p + self.phi_g + (self.phi_w if self.repel else 0) <= 0:
            raise ValueError("phi_v + phi_p + phi_g (+ phi_w) must be > 0: the weights are normalised by their sum")
        if not isinstance(self.step, int | float) or not self.step > 0:
            raise ValueError(f"step must be a number > 0 (the step length λ), got {self.step!r}")
        if not 0 < self.step_decay <= 1:
            raise ValueError(f"step_decay must be in (0, 1], got {self.step_decay!r}")
        if not 0 <= self.step_floor <= self.step:
            raise ValueError(f"step_floor must be in [0, step={self.step}], got {self.step_floor!r}")
        for name in ("patience", "max_iteration"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "patience" else 0):
                raise ValueError(f"{name} must be an int >= {1 if name == 'patience' else 0}, got {v!r}")
        if not self.restart_patience > 0:
            raise ValueError(f"restart_patience must be > 0, got {self.restart_patience!r}")
        if self.velocity_init not in VELOCITY_INITS:
            raise ValueError(f"velocity_init must be one of {', '.join(VELOCITY_INITS)}, got {self.velocity_init!r}")
        if isinstance(self.populate_to, bool) or not isinstance(self.populate_to, int) or self.populate_to < 0:
            raise ValueError(f"populate_to must be an int >= 0 (0: no populate step), got {self.populate_to!r}")


@dataclass
class SwarmResult:
    """The outcome of `ModelSwarm.search`.

    ``particle_history[i]`` is particle i's utility after every evaluation (the official ``utility_scratchpad``),
    ``g_history`` g's utility after the initial evaluation and every iteration (never decreasing), ``restarts`` the
    (iteration, particle) pairs restarted, ``evaluations`` the utility calls made.
    """

    global_best: StateDict
    global_best_utility: float
    global_best_particle: int
    personal_bests: list[StateDict]
    personal_best_utilities: list[float]
    g_history: list[float]
    g_worst_history: list[float]
    particle_history: list[list[float]]
    step_history: list[float]
    restarts: list[tuple[int, int]] = field(default_factory=list)
    populated: list[tuple[int, int, float]] = field(default_factory=list)
    evaluations: int = 0
    iterations: int = 0
    stopped: str = "max_iteration"
    final_positions: list[StateDict] = field(default_factory=list)


class ModelSwarm:
    """Particle-swarm search over LoRA experts (Feng et al., ICML 2025, Algorithm 1 / ``search.py``).

    Args:
        experts (`list[dict[str, Tensor]]`): the initial particles (same keys and shapes).
        utility: ``utility(state_dict) -> float``, higher is better (e.g. dev accuracy); wrap it in a
            `CountingUtility` with a budget to cap the evaluations.
        cfg (`SwarmConfig`): hyperparameters.
        max_evaluations (`int`, *optional*): stop before an iteration that would exceed this many evaluations.
        on_iteration: ``on_iteration(iteration, utilities)`` after each evaluated iteration (progress, logs).
    """

    def __init__(
        self,
        experts: Sequence[StateDict],
        utility: Callable[[StateDict], float],
        cfg: SwarmConfig | None = None,
        *,
        max_evaluations: int | None = None,
        on_iteration: Callable[[int, list[float]], None] | None = None,
    ) -> None:
        check_compatible(list(experts))
        self.experts = [_clone(e) for e in experts]
        self.utility, self.cfg = utility, cfg or SwarmConfig()
        if max_evaluations is not None and max_evaluations < 1:
            raise ValueError(f"max_evaluations must be None or >= 1, got {max_evaluations!r}")
        self.max_evaluations, self.on_iteration = max_evaluations, on_iteration

    def populate(self, rng: random.Random, pool: list[StateDict]) -> list[tuple[int, int, float]]:
        """Grow `pool` in place to ``cfg.populate_to`` with ``w p_1 + (1 - w) p_2``, w ~ U(0, 2)."""
        made = []
        if len(pool) < 2:
            return made
        while len(pool) < self.cfg.populate_to:
            a = rng.randrange(len(pool))
            b = rng.randrange(len(pool))
            while b == a:
                b = rng.randrange(len(pool))
            w = rng.random() * 2  # half interpolation, half extrapolation
            pool.append(merge([w, 1 - w], [pool[a], pool[b]]))
            made.append((a, b, w))
        return made

    def search(self) -> SwarmResult:
        cfg = self.cfg
        rng = random.Random(cfg.seed)
        x = [_clone(e) for e in self.experts]
        populated = self.populate(rng, x) if cfg.populate_to else []
        n = len(x)
        if self.max_evaluations is not None and self.max_evaluations < n:
            raise ValueError(f"max_evaluations={self.max_evaluations} is below the {n} evaluations of the initial "
                             "particles")  # fmt: skip
        evals = 0
        if cfg.velocity_init == "random" and n > 1:
            v = []
            for i in range(n):
                j = rng.randrange(n)
                while j == i:
                    j = rng.randrange(n)
                v.append(merge([-1.0, 1.0], [x[i], x[j]]))
        else:  # zero (and "best", filled in after the first evaluation; one particle has no other to move to)
            v = [_zeros(s) for s in x]
        u = []
        for s in x:
            u.append(self.utility(s))
            evals += 1
        p = [_clone(s) for s in x]
        pu = list(u)
        hist = [[val] for val in u]
        gi = u.index(max(u))
        g, gu = _clone(x[gi]), u[gi]
        wi = u.index(min(u))
        gw, gwu = _clone(x[wi]), u[wi]
        g_particle = gi
        if cfg.velocity_init == "best":
            v = [merge([-1.0, 1.0], [x[i], g]) for i in range(n)]
        g_hist, gw_hist, steps = [gu], [gwu], []
        step = float(cfg.step)
        restarts: list[tuple[int, int]] = []
        stopped, it = "max_iteration", 0
        phi = (cfg.phi_v, cfg.phi_p, cfg.phi_g, cfg.phi_w)
        while it < cfg.max_iteration:
            if len(g_hist) > cfg.patience and len(set(g_hist[-cfg.patience :])) == 1:
                stopped = "patience"
                break
            if self.max_evaluations is not None and evals + n > self.max_evaluations:
                stopped = "budget"
                break
            it += 1
            steps.append(step)
            for i in range(n):
                if cfg.restart and len(hist[i]) - hist[i].index(pu[i]) >= cfg.restart_patience * cfg.patience:
                    x[i], v[i] = _clone(p[i]), _zeros(p[i])
                    restarts.append((it, i))
                if cfg.weight_randomness:
                    r = (rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0, 1))
                else:
                    r = (1.0, 1.0, 1.0, 1.0)
                w = normalized_weights(r, phi, repel=cfg.repel)
                v[i] = velocity_update(v[i], x[i], p[i], g, gw, w)
                x[i] = {k: x[i][k] + step * v[i][k] for k in x[i]}
            u = []
            for s in x:
                u.append(self.utility(s))
                evals += 1
            for i in range(n):
                hist[i].append(u[i])
                if u[i] > pu[i]:
                    pu[i], p[i] = u[i], _clone(x[i])
            if max(u) > gu:
                gi = u.index(max(u))
                g, gu, g_particle = _clone(x[gi]), u[gi], gi
            g_hist.append(gu)
            if min(u) < gwu:
                wi = max(i for i in range(n) if u[i] == min(u))  # search.py copies each match: the last one wins
                gw, gwu = _clone(x[wi]), u[wi]
            gw_hist.append(gwu)
            if self.on_iteration is not None:
                self.on_iteration(it, list(u))
            step = max(step * cfg.step_decay, cfg.step_floor)
        return SwarmResult(global_best=g, global_best_utility=gu, global_best_particle=g_particle,
                           personal_bests=p, personal_best_utilities=pu, g_history=g_hist, g_worst_history=gw_hist,
                           particle_history=hist, step_history=steps, restarts=restarts, populated=populated,
                           evaluations=evals, iterations=it, stopped=stopped, final_positions=x)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# baselines


@dataclass
class SearchResult:
    """A baseline searcher's best candidate on the utility, its value, what it was and every value tried."""

    best: Any
    best_utility: float
    best_info: dict[str, Any]
    history: list[float]
    evaluations: int


def best_single(experts: Sequence[StateDict], utility: Callable[[StateDict], float]) -> SearchResult:
    """The expert with the highest utility (first on ties): one evaluation per expert."""
    vals = [utility(e) for e in experts]
    i = vals.index(max(vals))
    return SearchResult(experts[i], vals[i], {"expert": i}, vals, len(vals))


def uniform_soup(experts: Sequence[StateDict]) -> StateDict:
    """The mean of the experts' A and B tensors (a uniform model soup of the particles)."""
    return merge([1.0 / len(experts)] * len(experts), experts)


def random_search(
    experts: Sequence[StateDict],
    utility: Callable[[StateDict], float],
    budget: int,
    *,
    seed: int = 0,
    include_experts: bool = True,
    concentration: float = 1.0,
) -> SearchResult:
    """Random search over mixing weights with exactly `budget` utility evaluations.

    The first ``len(experts)`` candidates are the experts themselves (as the swarm's initial evaluation) when
    `include_experts`; the rest are ``merge(w, experts)`` with w ~ Dirichlet(`concentration`) (convex mixtures).
    """
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget must be an int >= 1 (utility evaluations), got {budget!r}")
    if not concentration > 0:
        raise ValueError(f"concentration must be > 0 (the Dirichlet parameter), got {concentration!r}")
    rng = np.random.default_rng(seed)
    best, best_u, best_info, hist = None, -math.inf, {}, []
    for t in range(budget):
        if include_experts and t < len(experts):
            cand, info = experts[t], {"expert": t}
        else:
            w = rng.dirichlet([float(concentration)] * len(experts))
            cand, info = merge(w.tolist(), experts), {"weights": [round(float(a), 4) for a in w]}
        val = utility(cand)
        hist.append(val)
        if val > best_u:
            best, best_u, best_info = cand, val, info
    return SearchResult(best, best_u, best_info, hist, budget)


# --- mergekit's generalized task arithmetic (mergekit a6e4028, merge_methods/generalized_task_arithmetic.py,
# sparsify.py), applied to dense task vectors


def magnitude_sparsify(t: torch.Tensor, density: float) -> torch.Tensor:
    """Keep the ``int(density · numel)`` largest-|t| entries (mergekit ``sparsify.magnitude``; density >= 1: all)."""
    if density >= 1:
        return t
    k = int(density * t.numel())
    if k <= 0:
        raise ValueError(f"density={density} keeps no entry of a tensor of {t.numel()} values")
    mask = torch.zeros_like(t)
    top = torch.argsort(t.abs().reshape(-1).float(), descending=True, stable=True)[:k]
    mask.view(-1)[top] = 1
    return t * mask


def bernoulli_sparsify(
    t: torch.Tensor, density: float, *, generator: torch.Generator | None = None, rescale: str | None = "l1"
) -> torch.Tensor:
    """DARE's random drop: keep each entry with probability `density` (mergekit ``sparsify.bernoulli``), rescaled to
    the original L1 norm (``"l1"``, mergekit's ``rescale=True``), by 1/density (``"density"``, the DARE paper and
    peft's ``dare_linear``) or not at all (None)."""
    if density >= 1:
        return t
    mask = torch.bernoulli(torch.full_like(t, density, dtype=torch.float32), generator=generator).to(t.dtype)
    out = t * mask
    if rescale == "density":
        return out / density
    if rescale == "l1":
        before, after = t.abs().sum(), out.abs().sum()
        if before < 1e-7 or after < 1e-7:
            return out
        return out * (before / after)
    if rescale is None:
        return out
    raise ValueError(f"rescale must be 'l1', 'density' or None, got {rescale!r}")


def sign_consensus_mask(weighted: torch.Tensor) -> torch.Tensor:
    """TIES's sign election on (n, ...) weighted deltas: the sign of their sum (>= 0 counts as +), and a mask of the
    entries that agree with it (mergekit ``get_mask(method="sum")``; zeros never agree)."""
    majority = (weighted.sum(dim=0) >= 0).to(weighted.dtype) * 2 - 1
    return weighted.sign() == majority


def task_arithmetic_merge(
    deltas: Sequence[torch.Tensor],
    weights: Sequence[float],
    *,
    sparsify: str | None = None,
    density: float = 1.0,
    consensus: bool = False,
    normalize: bool = False,
    lam: float = 1.0,
    generator: torch.Generator | None = None,
    rescale: str | None = "l1",
) -> torch.Tensor:
    """mergekit's ``GeneralizedTaskArithmeticMerge`` on one tensor's task vectors: sparsify each delta, weight,
    optionally keep the sign-consensus entries, sum, optionally divide by the summed (masked) weights, times λ."""
    if not deltas or len(deltas) != len(weights):
        raise ValueError(f"expected one weight per delta and at least one delta, got {len(deltas)} deltas and "
                         f"{len(weights)} weights")  # fmt: skip
    if not 0 < density <= 1:
        raise ValueError(f"density must be in (0, 1], got {density!r}")
    ds = []
    for d in deltas:
        d = d.float()
        if sparsify == "magnitude":
            d = magnitude_sparsify(d, density)
        elif sparsify == "random":
            d = bernoulli_sparsify(d, density, generator=generator, rescale=rescale)
        elif sparsify is not None:
            raise ValueError(f"sparsify must be 'magnitude', 'random' or None, got {sparsify!r}")
        ds.append(d)
    stack = torch.stack(ds, dim=0)  # (n, ...)
    w = torch.tensor([float(a) for a in weights], dtype=stack.dtype).reshape(-1, *([1] * (stack.dim() - 1)))
    weighted = stack * w
    if consensus:
        mask = sign_consensus_mask(weighted).to(stack.dtype)
        mixed = (weighted * mask).sum(dim=0)
        divisor = (w * mask).sum(dim=0)
        divisor[divisor == 0] = 1
    else:
        mixed = weighted.sum(dim=0)
        divisor = w.sum(dim=0).expand_as(mixed).clone()
        divisor[divisor.abs() < 1e-8] = 1
    if normalize:
        mixed = mixed / divisor
    return mixed * lam if lam != 1 else mixed


def ties_merge(
    deltas: Sequence[torch.Tensor], weights: Sequence[float], density: float, lam: float = 1.0
) -> torch.Tensor:
    """TIES (mergekit ``ties``): magnitude top-`density`, sign election by the weighted sum, disjoint mean."""
    return task_arithmetic_merge(deltas, weights, sparsify="magnitude", density=density, consensus=True,
                                 normalize=True, lam=lam)  # fmt: skip


def dare_linear_merge(
    deltas: Sequence[torch.Tensor],
    weights: Sequence[float],
    density: float,
    lam: float = 1.0,
    *,
    generator: torch.Generator | None = None,
    rescale: str | None = "l1",
) -> torch.Tensor:
    """DARE-linear (mergekit ``dare_linear``): random drop with rescale, weighted sum, no normalisation."""
    return task_arithmetic_merge(deltas, weights, sparsify="random", density=density, consensus=False,
                                 normalize=False, lam=lam, generator=generator, rescale=rescale)  # fmt: skip


def lora_task_vectors(state: StateDict, scaling: float) -> dict[str, torch.Tensor]:
    """The dense task vector ``ΔW = s · B A`` (out, in) of every LoRA module of a state dict keyed
    ``<module>.lora_A`` / ``<module>.lora_B`` (what a merged LoRA expert adds to its base weight)."""
    out = {}
    for k, a in state.items():
        if not k.endswith(".lora_A"):
            continue
        name = k[: -len(".lora_A")]
        b = state.get(f"{name}.lora_B")
        if b is None:
            raise ValueError(f"state has {k} but no {name}.lora_B")
        out[name] = float(scaling) * (b.float() @ a.float())
    if not out:
        raise ValueError("state has no '<module>.lora_A' tensors; expected a LoRA state dict")
    return out


def merge_task_vectors(
    method: str,
    vectors: Sequence[dict[str, torch.Tensor]],
    weights: Sequence[float],
    *,
    density: float,
    lam: float = 1.0,
    seed: int = 0,
    rescale: str | None = "l1",
) -> dict[str, torch.Tensor]:
    """``ties`` or ``dare_linear`` of several experts' dense task vectors, module by module (DARE's drops seeded)."""
    if method not in ("ties", "dare_linear"):
        raise ValueError(f"method must be 'ties' or 'dare_linear', got {method!r}")
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name in vectors[0]:
        ds = [v[name] for v in vectors]
        if method == "ties":
            out[name] = ties_merge(ds, weights, density, lam)
        else:
            out[name] = dare_linear_merge(ds, weights, density, lam, generator=gen, rescale=rescale)
    return out


def knob_search(
    build: Callable[[dict[str, float]], Any],
    utility: Callable[[Any], float],
    budget: int,
    *,
    first: dict[str, float],
    ranges: dict[str, tuple[float, float]],
    seed: int = 0,
) -> SearchResult:
    """Tune a merge's knobs on the utility with exactly `budget` evaluations: `first` (the method's default), then
    knobs drawn uniformly from `ranges` (a seeded random search, the same tuning budget as the swarm)."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget must be an int >= 1 (utility evaluations), got {budget!r}")
    rng = random.Random(seed)
    best, best_u, best_info, hist = None, -math.inf, {}, []
    for t in range(budget):
        knobs = dict(first) if t == 0 else {k: rng.uniform(lo, hi) for k, (lo, hi) in ranges.items()}
        knobs["draw"] = t
        cand = build(knobs)
        val = utility(cand)
        hist.append(val)
        if val > best_u:
            best, best_u, best_info = cand, val, {k: round(v, 4) if isinstance(v, float) else v
                                                  for k, v in knobs.items()}  # fmt: skip
    return SearchResult(best, best_u, best_info, hist, budget)


__all__ = [
    "VELOCITY_INITS",
    "BudgetExceeded",
    "CountingUtility",
    "ModelSwarm",
    "SearchResult",
    "SwarmConfig",
    "SwarmResult",
    "bernoulli_sparsify",
    "best_single",
    "check_compatible",
    "dare_linear_merge",
    "knob_search",
    "lora_task_vectors",
    "magnitude_sparsify",
    "merge",
    "merge_task_vectors",
    "normalized_weights",
    "random_search",
    "sign_consensus_mask",
    "task_arithmetic_merge",
    "ties_merge",
    "uniform_soup",
    "velocity_update",
]
