"""The shared response cache: per-query results of a zoo of model variants on exact-graded suites.

Four methods (cascade_routing, kabb, pmf_predict, cv_winrate) consume only a table of per-query results for a set
of "models"; building that table is the one costly step (selection.md, Shared ground). One `ResponseCache` holds
the rows of several variants on one suite and seed; each row is one (variant, query) result:

    variant, query_id, task, tags, answer, answer_key, correct, answer_logprob, option_probs, n_prompt_tokens,
    n_gen_tokens, cost_flops, wall_s

`answer_key` is the answer the output commits to, extracted without the gold (`lmlab.zoo.answers.answer_key`: the
suite's own extraction, normalised): two rows with the same key gave the same answer, so votes and agreement compare
keys, not raw text (raw texts of the same answer almost never match). None where nothing was extracted, and in rows
of schema-1 caches (built before the key was stored).

`correct` is 0/1 for exact graders (or a score in [0, 1]); `cost_flops` is the deterministic estimate
2 x active params x tokens processed (prompt + generated, times samples for self-consistency); `wall_s` is noisy and
informational only. A variant that failed to build is recorded in `failed` (variant -> one-line reason), not fatal.

Storage: one JSON-lines file per (suite, seed), gzip-compressed, first line a header
``{"schema": SCHEMA_VERSION, "suite": ..., "seed": ..., "variants": {...}, "failed": {...}}``, then one row per line.
Written atomically (temp file + rename). This module holds the schema, the table and its views; the queries of the
cache's suites live in `lmlab.data.respsuite`, the zoo and the builder (`lmlab cache build`) in `lmlab.zoo` (above
the methods; `lmlab.zoo.build`).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA_VERSION = 2
# Schema 1 (no answer_key column) still loads: its rows get answer_key None.
READABLE_SCHEMAS: tuple[int, ...] = (1, 2)

# The numeric columns `ResponseCache.matrix` can return.
NUMERIC_COLUMNS: tuple[str, ...] = (
    "correct",
    "answer_logprob",
    "n_prompt_tokens",
    "n_gen_tokens",
    "cost_flops",
    "wall_s",
)


@dataclass(frozen=True)
class ResponseRow:
    """One variant's result on one query (see the module docstring for the columns)."""

    variant: str
    query_id: str
    task: str
    correct: float
    cost_flops: float
    answer: str = ""
    answer_key: str | None = None
    answer_logprob: float = float("nan")
    option_probs: tuple[float, ...] | None = None
    n_prompt_tokens: int = 0
    n_gen_tokens: int = 0
    wall_s: float = 0.0
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.variant or not self.query_id:
            raise ValueError(f"a response row needs a variant and a query_id, got {self.variant!r}, {self.query_id!r}")
        if not (0.0 <= float(self.correct) <= 1.0):
            raise ValueError(f"correct must be in [0, 1], got {self.correct!r} for {self.variant}/{self.query_id}")
        if not (float(self.cost_flops) >= 0.0):
            raise ValueError(f"cost_flops must be >= 0, got {self.cost_flops!r} for {self.variant}/{self.query_id}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["answer_logprob"] = None if math.isnan(self.answer_logprob) else self.answer_logprob
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ResponseRow:
        kw = dict(d)
        if kw.get("answer_logprob") is None:
            kw["answer_logprob"] = float("nan")
        if kw.get("option_probs") is not None:
            kw["option_probs"] = tuple(float(p) for p in kw["option_probs"])
        kw["tags"] = tuple(kw.get("tags") or ())
        return cls(**kw)


@dataclass
class ResponseCache:
    """The rows of several variants on one (suite, seed), with matrix views.

    Args:
        suite (`str`): the suite name (e.g. ``"mixed"``).
        seed (`int`): the data seed the queries were drawn with.
        rows (`list[ResponseRow]`): one per (variant, query); a (variant, query) pair appears at most once.
        variants (`dict[str, dict]`): variant id -> its description (construction, params, model, ...), in pool order.
        failed (`dict[str, str]`): variant id -> why it could not be built (recorded, not fatal).
        meta (`dict`, *optional*): build facts (tasks, MC option order, generation settings); saved in the header.
    """

    suite: str
    seed: int
    rows: list[ResponseRow] = field(default_factory=list)
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        seen: set[tuple[str, str]] = set()
        for r in self.rows:
            key = (r.variant, r.query_id)
            if key in seen:
                raise ValueError(f"duplicate response row for variant {r.variant!r}, query {r.query_id!r}")
            seen.add(key)
            self.variants.setdefault(r.variant, {})

    @classmethod
    def from_records(
        cls,
        records: Iterable[Mapping[str, Any] | ResponseRow],
        *,
        suite: str = "custom",
        seed: int = 0,
        variants: Mapping[str, Mapping[str, Any]] | None = None,
        failed: Mapping[str, str] | None = None,
    ) -> ResponseCache:
        """A cache from dict rows (the columns above) or `ResponseRow`s; how tests build synthetic tables."""
        rows = [r if isinstance(r, ResponseRow) else ResponseRow.from_dict(r) for r in records]
        return cls(
            suite=suite,
            seed=seed,
            rows=rows,
            variants={k: dict(v) for k, v in (variants or {}).items()},
            failed=dict(failed or {}),
        )

    # ----------------------------------------------------------------------------------------------- views
    @property
    def variant_ids(self) -> list[str]:
        """Variants that have rows, in pool order (the order of `variants`)."""
        have = {r.variant for r in self.rows}
        return [v for v in self.variants if v in have]

    @property
    def query_ids(self) -> list[str]:
        """Query ids in first-seen order."""
        return list(dict.fromkeys(r.query_id for r in self.rows))

    def tasks(self) -> dict[str, str]:
        """query_id -> task."""
        return {r.query_id: r.task for r in self.rows}

    def select(self, *, variants: Sequence[str] | None = None, tasks: Sequence[str] | None = None) -> ResponseCache:
        """A sub-cache restricted to some variants and / or tasks (unknown names raise)."""
        if variants is not None:
            unknown = [v for v in variants if v not in self.variants]
            if unknown:
                raise ValueError(f"unknown variant(s) {unknown}; this cache has {list(self.variants)}")
        if tasks is not None:
            have_tasks = set(self.tasks().values())
            unknown = [t for t in tasks if t not in have_tasks]
            if unknown:
                raise ValueError(f"unknown task(s) {unknown}; this cache has {sorted(have_tasks)}")
        keep_v = set(variants) if variants is not None else None
        keep_t = set(tasks) if tasks is not None else None
        rows = [
            r for r in self.rows if (keep_v is None or r.variant in keep_v) and (keep_t is None or r.task in keep_t)
        ]
        order = list(variants) if variants is not None else list(self.variants)
        return ResponseCache(
            suite=self.suite,
            seed=self.seed,
            rows=rows,
            variants={v: dict(self.variants.get(v, {})) for v in order},
            failed=dict(self.failed),
            meta=dict(self.meta),
        )

    def matrix(
        self, column: str = "correct", *, variants: Sequence[str] | None = None, complete: bool = True
    ) -> tuple[list[str], list[str], np.ndarray]:
        """``(variant_ids, query_ids, M)`` with ``M[v, q]`` the `column` value, shape [V, Q] float64.

        With `complete` (default) only queries every listed variant answered are kept, so `M` has no holes;
        otherwise missing cells are NaN.
        """
        if column not in NUMERIC_COLUMNS:
            raise ValueError(f"column must be one of {NUMERIC_COLUMNS}, got {column!r}")
        vids = list(variants) if variants is not None else self.variant_ids
        unknown = [v for v in vids if v not in self.variants]
        if unknown:
            raise ValueError(f"unknown variant(s) {unknown}; this cache has {list(self.variants)}")
        qids = self.query_ids
        vi = {v: i for i, v in enumerate(vids)}
        qi = {q: j for j, q in enumerate(qids)}
        m = np.full((len(vids), len(qids)), np.nan)
        for r in self.rows:
            if r.variant in vi:
                m[vi[r.variant], qi[r.query_id]] = float(getattr(r, column))
        if complete:
            keep = ~np.isnan(m).any(axis=0)
            qids = [q for q, k in zip(qids, keep) if k]
            m = m[:, keep]
        if m.size == 0:
            raise ValueError(f"no query answered by every variant of {vids} in cache {self.suite}/seed {self.seed}")
        return vids, qids, m

    def accuracy_table(self) -> dict[str, dict[str, float]]:
        """variant -> task -> mean `correct` (and ``"all"``); what `lmlab cache show` prints."""
        out: dict[str, dict[str, float]] = {}
        for v in self.variant_ids:
            by_task: dict[str, list[float]] = {}
            for r in self.rows:
                if r.variant == v:
                    by_task.setdefault(r.task, []).append(r.correct)
                    by_task.setdefault("all", []).append(r.correct)
            out[v] = {t: float(np.mean(xs)) for t, xs in sorted(by_task.items())}
        return out

    # ----------------------------------------------------------------------------------------------- storage
    def header(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "suite": self.suite,
            "seed": self.seed,
            "variants": self.variants,
            "failed": self.failed,
            "meta": self.meta,
            # the header is written with sorted keys; this list keeps the pool order of `variants`
            "variant_order": list(self.variants),
        }

    def save(self, path: str | Path) -> Path:
        """Write gzip JSON lines atomically (a crash leaves the old file or none, never half a file)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        try:
            # mtime=0: the same cache gives the same bytes (committable, diffable by hash)
            with open(tmp, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as fh:
                fh.write((json.dumps(self.header(), sort_keys=True) + "\n").encode())
                for r in self.rows:
                    fh.write((json.dumps(r.to_dict(), sort_keys=True) + "\n").encode())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return path

    @classmethod
    def load(cls, path: str | Path) -> ResponseCache:
        """Read a file written by `save`; a wrong schema version or a truncated file is a one-line error."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"response cache {path} does not exist (build it with `lmlab cache build`)")
        try:
            with gzip.open(path, "rt") as fh:
                lines = fh.read().splitlines()
            header = json.loads(lines[0])
            rows = [ResponseRow.from_dict(json.loads(line)) for line in lines[1:] if line.strip()]
        except (OSError, EOFError, json.JSONDecodeError, IndexError, TypeError) as e:
            raise ValueError(f"response cache {path} is corrupt or truncated ({type(e).__name__}: {e})") from None
        if header.get("schema") not in READABLE_SCHEMAS:
            raise ValueError(
                f"response cache {path} has schema {header.get('schema')!r}, expected one of "
                f"{', '.join(map(str, READABLE_SCHEMAS))}; rebuild it"
            )
        return cls(
            suite=header["suite"],
            seed=int(header["seed"]),
            rows=rows,
            variants=_in_order(header.get("variants") or {}, header.get("variant_order") or []),
            failed=dict(header.get("failed") or {}),
            meta=dict(header.get("meta") or {}),
        )


def _in_order(variants: Mapping[str, Any], order: Sequence[str]) -> dict[str, Any]:
    """`variants` re-keyed in `order` (then any others in their stored order)."""
    keys = [v for v in order if v in variants] + [v for v in variants if v not in set(order)]
    return {v: variants[v] for v in keys}


def flop_cost(active_params: float, n_prompt_tokens: int, n_gen_tokens: int, n_samples: int = 1) -> float:
    """The deterministic cost estimate: 2 x active params x tokens processed (x samples)."""
    if active_params <= 0 or n_prompt_tokens < 0 or n_gen_tokens < 0 or n_samples < 1:
        raise ValueError(
            f"flop_cost needs params > 0, token counts >= 0 and samples >= 1, got "
            f"{active_params}, {n_prompt_tokens}, {n_gen_tokens}, {n_samples}"
        )
    return 2.0 * float(active_params) * float(n_prompt_tokens + n_gen_tokens) * n_samples


# ------------------------------------------------------------------------------------------------------- locations
def packaged_dir() -> Path:
    """The committed caches shipped with lmlab (built by lmlab's own code; CI reads them without loading a model)."""
    return Path(__file__).with_name("responses")


def user_dir() -> Path:
    """Caches a user rebuilt: ``$LMLAB_CACHE/responses`` (preferred over the packaged ones)."""
    from lmlab.core.inference.models import cache_root

    return cache_root() / "responses"


def cache_filename(suite: str, seed: int) -> str:
    return f"{suite}-s{int(seed)}.jsonl.gz"


def load_cache(suite: str = "mixed", seed: int = 0, *, path: str | Path | None = None) -> ResponseCache:
    """The response cache of (`suite`, `seed`): `path` if given, else the user's rebuilt copy, else the packaged one.

    A missing cache is a one-line error telling how to build it.
    """
    if path is not None:
        return ResponseCache.load(path)
    name = cache_filename(suite, seed)
    for folder in (user_dir(), packaged_dir()):
        if (folder / name).is_file():
            return ResponseCache.load(folder / name)
    raise FileNotFoundError(
        f"no response cache for suite {suite!r} seed {seed} (looked for {name} in {user_dir()} and {packaged_dir()});"
        f" build it with `lmlab cache build --suite {suite} --seed {seed}`"
    )


def load_caches(suite: str = "mixed", seeds: Sequence[int] = (0, 1, 2)) -> list[ResponseCache]:
    """One cache per cache seed (`load_cache` each): a cache seed draws other queries, shots and samples, so the
    seeds are the independent replicates a method's CI can resample (never splits of one cache).

    Raises a one-line error for an empty or repeated seed list, or a seed whose cache is missing.
    """
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds is empty; expected at least one cache seed, e.g. [0, 1, 2]")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0:
            raise ValueError(f"cache seeds must be ints >= 0, got {s!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"cache seeds must be distinct, got {seeds}")
    return [load_cache(suite, int(s)) for s in seeds]


def synthetic_cache(
    n_variants: int = 6, n_queries: int = 120, *, n_tasks: int = 3, seed: int = 0, suite: str = "synthetic"
) -> ResponseCache:
    """A planted table for tests and smoke presets: variant v has a per-task skill p[v, t] (Bernoulli correctness)
    and a cost rising with its mean skill, so the pool has a real quality-cost trade-off and task heterogeneity.
    `answer_logprob` is a noisy logit of the correctness probability (a usable, imperfect quality signal)."""
    if n_variants < 1 or n_queries < 1 or n_tasks < 1:
        raise ValueError(
            f"synthetic_cache needs >= 1 variant, query and task, got {n_variants}, {n_queries}, {n_tasks}"
        )
    rng = np.random.default_rng(seed)
    key_rng = np.random.default_rng([seed, 1])  # its own stream: the planted skills and costs stay as they were
    skill = rng.beta(2.0, 2.0, size=(n_variants, n_tasks))  # [V, T]
    order = np.argsort(skill.mean(axis=1))  # cost rises with mean skill
    cost = np.empty(n_variants)
    cost[order] = 1e9 * np.geomspace(1.0, 30.0, n_variants)
    tasks = [f"task{t}" for t in range(n_tasks)]
    rows = []
    for q in range(n_queries):
        t = q % n_tasks
        for v in range(n_variants):
            p = float(skill[v, t])
            c = float(rng.random() < p)
            z = np.log(p / (1 - p)) + rng.normal(0.0, 1.0)
            # the right answer has one key per query; a wrong one is one of 3 plausible wrong answers, so votes tie
            # and split as real ones do
            key = f"q{q}-right" if c else f"q{q}-wrong{int(key_rng.integers(3))}"
            rows.append(
                ResponseRow(
                    variant=f"v{v}",
                    query_id=f"q{q:04d}",
                    task=tasks[t],
                    correct=c,
                    cost_flops=float(cost[v] * (1.0 + 0.1 * rng.random())),
                    answer_logprob=float(-np.log1p(np.exp(-z))),
                    answer=key,
                    answer_key=key,
                    n_prompt_tokens=20,
                    n_gen_tokens=4,
                )
            )
    variants = {f"v{v}": {"construction": "synthetic", "skill": skill[v].round(4).tolist()} for v in range(n_variants)}
    return ResponseCache(suite=suite, seed=seed, rows=rows, variants=variants)
