"""KABB (Zhang et al., ICML 2025): knowledge-aware Bayesian bandits for dynamic expert coordination.

    θ_e ~ Beta(max(α_e · exp(-Dist(e, t)), 1e-3), β_e),   pick the top-k θ;   α_e += r_e, β_e += 1 - r_e;
    α, β <- γ · (α, β) every round                                              (arXiv 2502.07350)

    Dist(e, t) = [w1 · (1 - overlap(e, t)) + w2 · dep(e) + w3 · (1 - hist(e))] · log(1 + d(t))

with overlap = |capabilities(e) ∩ concepts(domain(t))| / |concepts(domain(t))| (0.5 when the domain lists no
concepts), dep = |knowledge dependencies(e)| / #experts, hist = α_e / (α_e + β_e), (w1, w2, w3) = (0.4, 0.3, 0.3),
and task difficulty d = clip(len / 100, 1, 10) / 10 · (d_max - d_min) + d_min with the domain's range [1, 5]. This
is the per-expert "3-D" distance of the official bandit code; the decay is per round (the code decays by wall-clock
seconds, non-deterministic offline). "Dual adaptation": the Beta update plus the knowledge update
(`update_capabilities`: add or drop a concept of an expert).

Baselines behind the same ``select`` / ``update`` / ``step`` interface: Beta-Bernoulli Thompson sampling (no
distance, no decay), UCB1 (top-k of mean + sqrt(2 ln t / n)), random-k, and all experts; the best fixed k-subset in
hindsight is the regret reference. The aggregator (the paper's is an LLM fusing the proposals) is a vote over the
chosen experts' extracted answers (`answer_key`: same key = same answer) weighted by their posterior means
α_e/(α_e + β_e) (ties: the highest θ); `AllExperts` votes every expert with the same weights, so the MoA reference
is an aggregate, not one model.

Pure numpy: rewards come from a table of per-query expert correctness (the response cache).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Expert:
    """An expert: its capability concepts, knowledge dependencies and Beta prior."""

    id: str
    capabilities: frozenset = frozenset()
    dependencies: tuple = ()
    alpha: float = 1.0
    beta: float = 1.0

    def __post_init__(self) -> None:
        if self.alpha <= 0 or self.beta <= 0:
            raise ValueError(f"expert {self.id!r}: alpha and beta must be > 0, got {self.alpha}, {self.beta}")


@dataclass(frozen=True)
class Domain:
    """A task domain: its concepts (the knowledge graph's nodes) and difficulty range."""

    name: str
    concepts: frozenset = frozenset()
    difficulty_range: tuple = (1.0, 5.0)


def task_difficulty(length: float, difficulty_range: Sequence[float] = (1.0, 5.0)) -> float:
    """d = clip(length / 100, 1, 10) / 10 x (max - min) + min (official ``utils``)."""
    lo, hi = float(difficulty_range[0]), float(difficulty_range[1])
    if hi < lo:
        raise ValueError(f"difficulty_range must be (min, max) with min <= max, got {difficulty_range}")
    return float(np.clip(length / 100.0, 1.0, 10.0) / 10.0 * (hi - lo) + lo)


def knowledge_distance(
    expert: Expert,
    domain: Domain,
    alpha: float,
    beta: float,
    n_experts: int,
    difficulty: float,
    weights: Sequence[float] = (0.4, 0.3, 0.3),
    use_hist: bool = True,
) -> float:
    """Dist(e, t) of the module docstring (the official 3-D knowledge distance)."""
    w1, w2, w3 = weights
    overlap = len(expert.capabilities & domain.concepts) / len(domain.concepts) if domain.concepts else 0.5
    dep = len(expert.dependencies) / max(1, n_experts)
    hist = alpha / (alpha + beta) if use_hist else 1.0
    return float((w1 * (1.0 - overlap) + w2 * dep + w3 * (1.0 - hist)) * math.log1p(difficulty))


class Bandit:
    """The shared interface: ``select(domain, difficulty) -> (expert indices, weights)``, ``update``, ``step``."""

    name = "bandit"

    def __init__(self, n_experts: int, top_k: int = 2, seed: int = 0) -> None:
        if n_experts < 1:
            raise ValueError(f"a bandit needs >= 1 expert, got {n_experts}")
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be in [1, {n_experts}] (the number of experts), got {top_k}")
        self.n, self.k = n_experts, top_k
        self.rng = np.random.default_rng(seed)

    def select(self, domain: Domain | None = None, difficulty: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def update(self, chosen: Sequence[int], rewards: Sequence[float]) -> None:
        pass

    def step(self) -> None:
        pass


def _check_rewards(chosen: Sequence[int], rewards: Sequence[float]) -> np.ndarray:
    r = np.asarray(rewards, float)
    if r.shape != (len(chosen),):
        raise ValueError(f"need one reward per chosen expert ({len(chosen)}), got shape {r.shape}")
    if not np.all(np.isfinite(r)):
        raise ValueError(f"rewards must be finite, got {r.tolist()}")
    return np.clip(r, 0.0, 1.0)  # official: clamped to [0, 1]


class KABB(Bandit):
    """Knowledge-aware Thompson sampling over `experts` (see the module docstring).

    Args:
        experts (`Sequence[Expert]`): the pool (capabilities, dependencies, priors).
        top_k (`int`, defaults to 2): experts per query.
        gamma (`float`, defaults to 0.99): per-round decay of α and β (1: no decay).
        weights (`tuple`, defaults to (0.4, 0.3, 0.3)): distance weights (w1, w2, w3).
        use_distance (`bool`): the knowledge factor exp(-Dist) (off: Thompson sampling with decay).
        use_hist (`bool`): the hist term of the distance (official: on; it double-counts the posterior).
        alpha_floor (`float`, defaults to 1e-3): clamp of α·exp(-Dist).
    """

    name = "kabb"

    def __init__(
        self,
        experts: Sequence[Expert],
        top_k: int = 2,
        gamma: float = 0.99,
        weights: Sequence[float] = (0.4, 0.3, 0.3),
        *,
        use_distance: bool = True,
        use_hist: bool = True,
        alpha_floor: float = 1e-3,
        seed: int = 0,
    ) -> None:
        super().__init__(len(experts), top_k, seed)
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}")
        if len(weights) != 3 or min(weights) < 0:
            raise ValueError(f"weights must be three values >= 0 (w1, w2, w3), got {weights}")
        self.experts = list(experts)
        self.gamma, self.weights = float(gamma), tuple(map(float, weights))
        self.use_distance, self.use_hist, self.alpha_floor = use_distance, use_hist, alpha_floor
        self.alpha = np.array([e.alpha for e in self.experts], float)
        self.beta = np.array([e.beta for e in self.experts], float)
        self._static: dict[Domain, np.ndarray] = {}

    def distances(self, domain: Domain | None, difficulty: float) -> np.ndarray:
        """Dist(e, t) of every expert (vectorised `knowledge_distance`; the static terms cached per domain)."""
        if domain is None or not self.use_distance:
            return np.zeros(self.n)
        static = self._static.get(domain)
        if static is None:
            w1, w2, _ = self.weights
            overlap = np.array([len(e.capabilities & domain.concepts) / len(domain.concepts) if domain.concepts
                                else 0.5 for e in self.experts])  # fmt: skip
            dep = np.array([len(e.dependencies) / max(1, self.n) for e in self.experts])
            static = self._static[domain] = w1 * (1.0 - overlap) + w2 * dep
        hist = self.alpha / (self.alpha + self.beta) if self.use_hist else 1.0
        return (static + self.weights[2] * (1.0 - hist)) * math.log1p(difficulty)

    def sample(self, domain: Domain | None = None, difficulty: float = 1.0) -> np.ndarray:
        a = np.maximum(self.alpha * np.exp(-self.distances(domain, difficulty)), self.alpha_floor)
        return self.rng.beta(a, np.maximum(self.beta, self.alpha_floor))

    def select(self, domain: Domain | None = None, difficulty: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        theta = self.sample(domain, difficulty)
        chosen = np.argsort(-theta, kind="stable")[: self.k]
        return chosen, self.alpha[chosen] / (self.alpha[chosen] + self.beta[chosen]) + 1e-9 * theta[chosen]

    def update(self, chosen: Sequence[int], rewards: Sequence[float]) -> None:
        r = _check_rewards(chosen, rewards)
        idx = np.asarray(chosen, int)
        self.alpha[idx] += r
        self.beta[idx] += 1.0 - r

    def step(self) -> None:
        """Advance one round: the step-based decay α, β <- γ·(α, β)."""
        if self.gamma < 1.0:
            self.alpha *= self.gamma
            self.beta *= self.gamma

    def update_capabilities(self, expert: int, add: Sequence[str] = (), remove: Sequence[str] = ()) -> None:
        """Knowledge updating (official ``update_expert_capabilities``): edit an expert's capability concepts."""
        e = self.experts[expert]
        caps = (set(e.capabilities) | set(add)) - set(remove)
        self.experts[expert] = Expert(e.id, frozenset(caps), e.dependencies, e.alpha, e.beta)
        self._static.clear()


class ThompsonSampling(KABB):
    """Vanilla Beta-Bernoulli Thompson sampling: no knowledge factor, no decay."""

    name = "thompson"

    def __init__(self, n_experts: int, top_k: int = 2, seed: int = 0) -> None:
        super().__init__([Expert(str(i)) for i in range(n_experts)], top_k, gamma=1.0, use_distance=False, seed=seed)


class UCB1(Bandit):
    """Top-k by mean + sqrt(2 ln t / n); every expert is tried once first."""

    name = "ucb1"

    def __init__(self, n_experts: int, top_k: int = 2, seed: int = 0) -> None:
        super().__init__(n_experts, top_k, seed)
        self.s = np.zeros(n_experts)
        self.c = np.zeros(n_experts)
        self.t = 0

    def select(self, domain: Domain | None = None, difficulty: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        mean = np.where(self.c > 0, self.s / np.maximum(self.c, 1), 0.0)
        bonus = np.where(self.c > 0, np.sqrt(2 * np.log(max(self.t, 1)) / np.maximum(self.c, 1)), np.inf)
        score = mean + bonus + 1e-9 * self.rng.random(self.n)
        chosen = np.argsort(-score, kind="stable")[: self.k]
        return chosen, mean[chosen] + 1e-9 * score[chosen].clip(-1e9, 1e9)

    def update(self, chosen: Sequence[int], rewards: Sequence[float]) -> None:
        r = _check_rewards(chosen, rewards)
        idx = np.asarray(chosen, int)
        self.s[idx] += r
        self.c[idx] += 1
        self.t += 1


class EpsilonGreedy(UCB1):
    """Top-k by empirical mean, a random k-subset with probability `epsilon` (untried experts count as mean 1)."""

    name = "eps_greedy"

    def __init__(self, n_experts: int, top_k: int = 2, epsilon: float = 0.1, seed: int = 0) -> None:
        super().__init__(n_experts, top_k, seed)
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
        self.epsilon = epsilon

    def select(self, domain: Domain | None = None, difficulty: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        mean = np.where(self.c > 0, self.s / np.maximum(self.c, 1), 1.0)
        if self.rng.random() < self.epsilon:
            chosen = self.rng.choice(self.n, size=self.k, replace=False)
        else:
            chosen = np.argsort(-(mean + 1e-9 * self.rng.random(self.n)), kind="stable")[: self.k]
        return chosen, mean[chosen] + 1e-9 * np.arange(self.k, 0, -1)


class RandomK(Bandit):
    """k experts uniformly at random, equal weights."""

    name = "random"

    def select(self, domain: Domain | None = None, difficulty: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        chosen = self.rng.choice(self.n, size=self.k, replace=False)
        return chosen, np.linspace(1.0, 0.999, self.k)  # ties: the first drawn


class AllExperts(KABB):
    """Every expert, aggregated (the MoA reference, maximal cost): a vote of all experts' answers weighted by each
    expert's posterior mean α_e/(α_e + β_e), the same aggregator and weights as KABB's team. Every expert answers
    every query, so every posterior is updated every round (and decays by `gamma`, as KABB's); ties of the vote go
    to the highest posterior mean (first round: a seeded random order). No distance: nothing is selected."""

    name = "all_experts"

    def __init__(self, n_experts: int, gamma: float = 1.0, seed: int = 0) -> None:
        super().__init__([Expert(str(i)) for i in range(n_experts)], n_experts, gamma, use_distance=False, seed=seed)
        self._tie = 1e-9 * self.rng.random(n_experts)  # [V] fixed tie-break of equal posterior means

    def select(self, domain: Domain | None = None, difficulty: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        return np.arange(self.n), self.alpha / (self.alpha + self.beta) + self._tie


def weighted_vote(codes: np.ndarray, correct: np.ndarray, weights: np.ndarray) -> float:
    """Correctness of the answer with the largest summed weight among the chosen experts' answers (`codes`: one
    answer id per chosen expert)."""
    best_w, best_c = -np.inf, 0.0
    for a in np.unique(codes):
        m = codes == a
        w = float(weights[m].sum())
        if w > best_w:
            best_w, best_c = w, float(correct[m].max())
    return best_c


@dataclass
class StreamResult:
    """One bandit run: per-round team correctness, chosen experts and cost."""

    team: np.ndarray  # [T] 0/1
    chosen: list[np.ndarray] = field(default_factory=list)
    calls: np.ndarray | None = None  # [T] experts called
    flops: np.ndarray | None = None  # [T]


def run_stream(
    bandit: Bandit,
    queries: np.ndarray,
    correct: np.ndarray,
    codes: np.ndarray,
    cost: np.ndarray,
    domains: Sequence[Domain],
    task: np.ndarray,
    difficulty: np.ndarray,
) -> StreamResult:
    """Play `bandit` on the stream `queries` (row indices of the [Q, V] tables): select, vote, update, decay."""
    t_len = len(queries)
    team = np.zeros(t_len)
    calls = np.zeros(t_len)
    flops = np.zeros(t_len)
    chosen_all = []
    for t, q in enumerate(queries):
        chosen, w = bandit.select(domains[task[q]], difficulty[q])
        team[t] = weighted_vote(codes[q, chosen], correct[q, chosen], np.asarray(w, float))
        bandit.update(chosen, correct[q, chosen])
        bandit.step()
        calls[t] = len(chosen)
        flops[t] = cost[q, chosen].sum()
        chosen_all.append(np.asarray(chosen))
    return StreamResult(team, chosen_all, calls, flops)


def best_fixed_subset(queries: np.ndarray, correct: np.ndarray, codes: np.ndarray, k: int) -> tuple[tuple, np.ndarray]:
    """The k-subset with the best team accuracy on the stream in hindsight (weights: each member's stream accuracy)
    and its per-round team correctness."""
    v = correct.shape[1]
    acc = correct[queries].mean(axis=0)
    best, best_team = None, None
    for sub in itertools.combinations(range(v), k):
        idx = np.asarray(sub)
        w = acc[idx] + 1e-9 * idx
        team = np.array([weighted_vote(codes[q, idx], correct[q, idx], w) for q in queries])
        if best_team is None or team.mean() > best_team.mean():
            best, best_team = sub, team
    return best, best_team


__all__ = [
    "AllExperts",
    "Bandit",
    "Domain",
    "EpsilonGreedy",
    "Expert",
    "KABB",
    "RandomK",
    "StreamResult",
    "ThompsonSampling",
    "UCB1",
    "best_fixed_subset",
    "knowledge_distance",
    "run_stream",
    "task_difficulty",
    "weighted_vote",
]
