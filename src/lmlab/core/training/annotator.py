"""A simulated human annotator that alone holds the ground truth, counts every query, and keeps test labels apart;
plus simulated AI labellers whose errors are systematic, not uniform.

Methods that ask a human for preference labels (RLTHF's targeted correction, PLE's principle-guided labels, M_AP's
explicit reward) are simulated honestly only if the learner can reach the truth through one door that charges for
it. `GroundTruthAnnotator` is that door:

- it owns the pairs and the hidden utility ``U`` (or a pairwise truth ``dU(a, b)``) and answers
  ``label(pair_ids) -> labels`` (1: the first response of the pair is preferred, 0: the second);
- it counts *unique* pairs labelled and refuses, atomically, any call that would go past ``budget``
  (`BudgetExceeded`); re-asking a labelled pair is free and returns the same label, and every request is logged
  with its iteration (`QueryRecord`), so a result can report "% of the data sent to the oracle"
  (`fraction_queried`, RLTHF's x-axis);
- optional human noise: a Bradley-Terry draw ``P(a > b) = sigmoid(dU / T)``, made once per pair from a seed and
  the pair id, so it does not depend on query order (HH-RLHF-style annotators disagree on ~25% of hard pairs);
- `held_out(ids)` turns pairs into test items: their labels come from the same ``U``, are never charged, and the
  training door refuses them from then on (and refuses to declare as test a pair it has already labelled).

`SimulatedJudge` is the AI labeller: cheap, uncounted and systematically wrong. It perceives the margin

    dJ(a, b) = dU(a, b) - [B(a) - B(b)] + lambda * [len(a) - len(b)]

and prefers ``a`` with probability ``sigmoid(dJ / T_judge)``: a **blind spot** (it ignores the part ``B`` of the
utility, e.g. factual correctness), a **length bias** (lambda utility units per word) and an error rate that
**rises as |dU| shrinks** (near-ties are coin flips, clear pairs are right). RLTHF's premise is exactly this:
LLM labellers fail on hard samples in correlated ways; uniform flips would make error finding trivially easy.
A real small-LLM judge (scoring "A" vs "B" in both orders) lives with the methods that use one.

The core knows no task: items are whatever the caller's ``utility`` takes.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


class BudgetExceeded(RuntimeError):
    """A labelling request would take the annotator past its budget of unique queries."""


@dataclass(frozen=True)
class QueryRecord:
    """One requested label: the pair id, the caller's iteration, and whether it was charged (first time asked)."""

    pair_id: Hashable
    iteration: int
    charged: bool


def _stable_int(key: Hashable) -> int:
    """A process-independent integer of a pair id (Python's ``hash`` of a str is salted per process)."""
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little")


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def bt_prob(delta_u: float, temperature: float) -> float:
    """Bradley-Terry probability that the first response wins: ``sigmoid(dU / T)``."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return _sigmoid(delta_u / temperature)


def bt_flip_prob(delta_u: float, temperature: float) -> float:
    """Probability that a Bradley-Terry annotator contradicts the truth on a pair: ``sigmoid(-|dU| / T)``."""
    return bt_prob(-abs(delta_u), temperature)


def _default_length(x: Any) -> float:
    return float(len(str(x).split()))


class _Truth:
    """dU(a, b) from a pointwise utility or a pairwise margin function (exactly one)."""

    def __init__(self, utility: Callable[[Any], float] | None, margin: Callable[[Any, Any], float] | None) -> None:
        if (utility is None) == (margin is None):
            raise ValueError("pass exactly one of utility=U(item) or margin=dU(a, b)")
        self.utility, self.margin = utility, margin

    def delta(self, a: Any, b: Any) -> float:
        d = self.margin(a, b) if self.margin is not None else self.utility(a) - self.utility(b)  # type: ignore[misc]
        d = float(d)
        if not math.isfinite(d):
            raise ValueError(f"the truth function returned a non-finite margin {d}")
        return d


def _ids(pair_ids: Iterable[Hashable]) -> list[Hashable]:
    if isinstance(pair_ids, (str, bytes)) or not isinstance(pair_ids, Iterable):
        raise ValueError(f"pair_ids must be a sequence of ids, got {type(pair_ids).__name__} {pair_ids!r}")
    return list(pair_ids)


def _check_pairs(pairs: Mapping[Hashable, Sequence[Any]]) -> dict[Hashable, tuple[Any, Any]]:
    if not isinstance(pairs, Mapping) or not pairs:
        raise ValueError("pairs must be a non-empty mapping {pair_id: (response_a, response_b)}")
    out = {}
    for pid, pair in pairs.items():
        if len(pair) != 2:
            raise ValueError(f"pair {pid!r} must be (response_a, response_b), got {len(pair)} items")
        out[pid] = (pair[0], pair[1])
    return out


class GroundTruthAnnotator:
    """The simulated human: the only holder of the truth, behind a query budget.

    Args:
        pairs (`Mapping[id, (a, b)]`): every pair the annotator can be asked about (training and test).
        budget (`int`): maximum number of unique pairs it will label for training.
        utility (`Callable[[item], float]`, *optional*): the hidden utility U; ``dU = U(a) - U(b)``.
        margin (`Callable[[a, b], float]`, *optional*): a pairwise truth dU(a, b) instead of U.
        noise_temperature (`float`, *optional*): T of the Bradley-Terry human noise; None = clean oracle.
        seed (`int`, *optional*, defaults to `0`): seeds the per-pair noise draws (and tie breaks).

    Example:
        >>> ann = GroundTruthAnnotator(pairs, budget=50, utility=U, noise_temperature=0.5)
        >>> test = ann.held_out(test_ids)                 # uncounted; refused to the training door from now on
        >>> labels = ann.label(ids_to_correct, iteration=1)
        >>> ann.fraction_queried(len(train_ids))          # share of the training pool sent to the oracle
    """

    def __init__(
        self,
        pairs: Mapping[Hashable, Sequence[Any]],
        *,
        budget: int,
        utility: Callable[[Any], float] | None = None,
        margin: Callable[[Any, Any], float] | None = None,
        noise_temperature: float | None = None,
        seed: int = 0,
    ) -> None:
        if not isinstance(budget, int) or budget < 0:
            raise ValueError(f"budget must be an int >= 0 (unique pairs), got {budget!r}")
        if noise_temperature is not None and not noise_temperature > 0:
            raise ValueError(f"noise_temperature must be > 0 or None (clean oracle), got {noise_temperature}")
        self._pairs = _check_pairs(pairs)
        self._truth = _Truth(utility, margin)
        self.budget = budget
        self.noise_temperature = noise_temperature
        self.seed = seed
        self._labels: dict[Hashable, int] = {}  # charged training labels
        self._held_out: set[Hashable] = set()
        self._log: list[QueryRecord] = []
        self._calls = 0

    # --- the truth, private ---------------------------------------------------------------------------------
    def _draw(self, pid: Hashable, noisy: bool) -> int:
        a, b = self._pairs[pid]
        d = self._truth.delta(a, b)
        u = np.random.default_rng([self.seed, _stable_int(pid)]).random()  # one fixed draw per pair
        if noisy and self.noise_temperature is not None:
            return int(u < bt_prob(d, self.noise_temperature))
        if d == 0:
            return int(u < 0.5)  # a tie: a fair, fixed coin
        return int(d > 0)

    def _known(self, pid: Hashable) -> None:
        if pid not in self._pairs:
            raise ValueError(f"unknown pair id {pid!r}: not among the {len(self._pairs)} pairs the annotator holds")

    # --- the training door ----------------------------------------------------------------------------------
    def label(self, pair_ids: Iterable[Hashable], *, iteration: int | None = None) -> list[int]:
        """Labels (1 = first response preferred) of `pair_ids`, charging each pair the first time it is asked.

        Refuses the whole call, labelling nothing, if it would take the unique count past the budget.
        """
        ids = _ids(pair_ids)
        it = self._calls if iteration is None else int(iteration)
        for pid in ids:
            self._known(pid)
            if pid in self._held_out:
                raise ValueError(f"pair id {pid!r} is held out for evaluation; the training annotator cannot label it")
        new = list(dict.fromkeys(p for p in ids if p not in self._labels))
        if len(self._labels) + len(new) > self.budget:
            raise BudgetExceeded(
                f"annotator budget of {self.budget} unique queries exceeded: {len(self._labels)} used, this call "
                f"asks {len(new)} new"
            )
        self._calls += 1
        out = []
        for pid in ids:
            charged = pid not in self._labels
            if charged:
                self._labels[pid] = self._draw(pid, noisy=True)
            self._log.append(QueryRecord(pid, it, charged))
            out.append(self._labels[pid])
        return out

    @property
    def n_queried(self) -> int:
        """Unique pairs labelled (and charged) so far."""
        return len(self._labels)

    @property
    def remaining(self) -> int:
        return self.budget - len(self._labels)

    @property
    def queried_ids(self) -> list[Hashable]:
        """Charged pair ids, in the order first asked."""
        return list(self._labels)

    @property
    def log(self) -> list[QueryRecord]:
        """Every requested label, re-asks included."""
        return list(self._log)

    def fraction_queried(self, n_total: int | None = None) -> float:
        """Unique pairs labelled / `n_total` (default: every pair not held out): the "% sent to the oracle"."""
        n = len(self._pairs) - len(self._held_out) if n_total is None else int(n_total)
        if n <= 0:
            raise ValueError(f"n_total must be > 0, got {n}")
        return len(self._labels) / n

    # --- the evaluation door --------------------------------------------------------------------------------
    def held_out(self, pair_ids: Iterable[Hashable], *, noisy: bool = False) -> HeldOutLabels:
        """Declare `pair_ids` test pairs and return their labels from the same truth, uncounted.

        From then on the training door refuses them. A pair already labelled for training cannot become a test
        pair (its label has been seen). ``noisy=True`` gives the noisy human's labels instead of the clean truth.
        """
        ids = list(dict.fromkeys(_ids(pair_ids)))
        if not ids:
            raise ValueError("held_out needs at least one pair id")
        for pid in ids:
            self._known(pid)
            if pid in self._labels:
                raise ValueError(f"pair id {pid!r} was already labelled for training; it cannot be a test pair")
        self._held_out.update(ids)
        return HeldOutLabels({pid: self._draw(pid, noisy=noisy) for pid in ids})

    @property
    def held_out_ids(self) -> set[Hashable]:
        return set(self._held_out)

    def agreement(self, pair_ids: Iterable[Hashable], labels: Sequence[int]) -> float:
        """Share of `labels` (e.g. an AI labeller's) that match the clean truth on `pair_ids`: for the report's
        "AI labeller accuracy vs U" line only. It is not charged; never feed it into selection or tuning."""
        ids = _ids(pair_ids)
        if len(ids) != len(labels) or not ids:
            raise ValueError(f"got {len(ids)} pair ids and {len(labels)} labels; need equal, non-zero counts")
        for pid in ids:
            self._known(pid)
        return float(np.mean([int(lab) == self._draw(pid, noisy=False) for pid, lab in zip(ids, labels, strict=True)]))


class HeldOutLabels:
    """Test labels (1 = first response preferred) of held-out pairs, from the annotator's truth, never charged."""

    def __init__(self, labels: dict[Hashable, int]) -> None:
        self._labels = dict(labels)

    @property
    def ids(self) -> list[Hashable]:
        return list(self._labels)

    def __getitem__(self, pid: Hashable) -> int:
        return self._labels[pid]

    def __len__(self) -> int:
        return len(self._labels)

    def labels(self, pair_ids: Iterable[Hashable] | None = None) -> list[int]:
        ids = self.ids if pair_ids is None else _ids(pair_ids)
        missing = [p for p in ids if p not in self._labels]
        if missing:
            raise ValueError(f"pair ids {missing[:3]!r} are not held-out test pairs")
        return [self._labels[p] for p in ids]

    def accuracy(self, predicted: Mapping[Hashable, int] | Sequence[int]) -> float:
        """Share of held-out pairs where `predicted` (dict by id, or a list in `ids` order) matches the label."""
        if isinstance(predicted, Mapping):
            preds = [int(predicted[p]) for p in self._labels]
        else:
            if len(predicted) != len(self._labels):
                raise ValueError(f"got {len(predicted)} predictions for {len(self._labels)} held-out pairs")
            preds = [int(p) for p in predicted]
        return float(np.mean([p == lab for p, lab in zip(preds, self._labels.values(), strict=True)]))


class SimulatedJudge:
    """An AI preference labeller with a documented, systematic error model (module docstring).

    ``P(judge prefers a) = sigmoid(dJ / T)``, ``dJ = dU - [B(a) - B(b)] + length_bias * [len(a) - len(b)]``.

    Args:
        pairs (`Mapping[id, (a, b)]`): the pairs it can label (typically the whole training pool; uncounted).
        utility / margin: the same truth as the annotator's (the judge is a distortion of it).
        blind_spot (`Callable[[item], float]`, *optional*): the part B of U the judge does not see.
        length (`Callable[[item], float]`, *optional*): response length, defaults to the number of words.
        length_bias (`float`, *optional*, defaults to `0.0`): utility units the judge credits per unit of length.
        temperature (`float`, *optional*, defaults to `1.0`): > 0; its errors concentrate where |dJ| < T.
        seed (`int`, *optional*, defaults to `0`): one fixed draw per pair, independent of query order.
    """

    def __init__(
        self,
        pairs: Mapping[Hashable, Sequence[Any]],
        *,
        utility: Callable[[Any], float] | None = None,
        margin: Callable[[Any, Any], float] | None = None,
        blind_spot: Callable[[Any], float] | None = None,
        length: Callable[[Any], float] = _default_length,
        length_bias: float = 0.0,
        temperature: float = 1.0,
        seed: int = 0,
    ) -> None:
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self._pairs = _check_pairs(pairs)
        self._truth = _Truth(utility, margin)
        self.blind_spot, self.length, self.length_bias = blind_spot, length, float(length_bias)
        self.temperature, self.seed = float(temperature), seed
        self.calls = 0

    def perceived_margin(self, pid: Hashable) -> float:
        """The judge's dJ for a pair."""
        if pid not in self._pairs:
            raise ValueError(f"unknown pair id {pid!r}: not among the {len(self._pairs)} pairs the judge holds")
        a, b = self._pairs[pid]
        d = self._truth.delta(a, b)
        if self.blind_spot is not None:
            d -= float(self.blind_spot(a)) - float(self.blind_spot(b))
        return d + self.length_bias * (float(self.length(a)) - float(self.length(b)))

    def prob_first(self, pair_ids: Iterable[Hashable]) -> list[float]:
        """The judge's P(first response preferred) per pair (its confidence)."""
        return [_sigmoid(self.perceived_margin(pid) / self.temperature) for pid in _ids(pair_ids)]

    def label(self, pair_ids: Iterable[Hashable]) -> list[int]:
        """Judge labels (1 = first preferred), one fixed draw per pair."""
        ids = _ids(pair_ids)
        self.calls += 1
        probs = self.prob_first(ids)
        # a different stream from the annotator's (offset key) so judge and human errors are not coupled
        return [
            int(np.random.default_rng([self.seed, _stable_int(pid), 1]).random() < p)
            for pid, p in zip(ids, probs, strict=True)
        ]


class FlipJudge:
    """An AI labeller with *uniform* noise: the truth flipped with probability `flip_prob` on every pair, whatever
    the pair (one fixed draw per pair). The contrast case to `SimulatedJudge`: its errors carry no structure a
    reward model could learn, which makes error finding from the reward distribution easy (RLTHF's spec asks for
    both noise models, and says this one overstates the method).

    Args:
        pairs (`Mapping[id, (a, b)]`): the pairs it can label (uncounted).
        utility / margin: the truth it distorts (a tie is a fixed fair coin, as the annotator's).
        flip_prob (`float`, defaults to `0.2`): in [0, 1].
        seed (`int`, *optional*, defaults to `0`): one fixed draw per pair, independent of query order.
    """

    def __init__(
        self,
        pairs: Mapping[Hashable, Sequence[Any]],
        *,
        utility: Callable[[Any], float] | None = None,
        margin: Callable[[Any, Any], float] | None = None,
        flip_prob: float = 0.2,
        seed: int = 0,
    ) -> None:
        if not 0.0 <= flip_prob <= 1.0:
            raise ValueError(f"flip_prob must be in [0, 1], got {flip_prob}")
        self._pairs = _check_pairs(pairs)
        self._truth = _Truth(utility, margin)
        self.flip_prob, self.seed = float(flip_prob), seed
        self.calls = 0

    def _truth_label(self, pid: Hashable) -> int:
        if pid not in self._pairs:
            raise ValueError(f"unknown pair id {pid!r}: not among the {len(self._pairs)} pairs the judge holds")
        a, b = self._pairs[pid]
        d = self._truth.delta(a, b)
        if d == 0:
            return int(np.random.default_rng([self.seed, _stable_int(pid), 3]).random() < 0.5)
        return int(d > 0)

    def label(self, pair_ids: Iterable[Hashable]) -> list[int]:
        """Judge labels (1 = first preferred): the truth, flipped on a fixed `flip_prob` share of draws."""
        ids = _ids(pair_ids)
        self.calls += 1
        out = []
        for pid in ids:
            t = self._truth_label(pid)
            flip = np.random.default_rng([self.seed, _stable_int(pid), 2]).random() < self.flip_prob
            out.append(1 - t if flip else t)
        return out
