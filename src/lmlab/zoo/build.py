"""The response-cache builder (`lmlab cache build`) and the accuracy matrix of `lmlab cache show`.

Build: `build_cache` runs the variants one after another; each variant's rows go to their own part file
(``<out>/<suite>-s<seed>.parts/<variant>.jsonl.gz``, atomic), so a killed build resumes at the next variant; the
final cache (every valid part in pool order) is saved atomically as ``<out>/<suite>-s<seed>.jsonl.gz``, where
`lmlab.data.respcache.load_cache` finds it (default ``out``: `lmlab.data.respcache.user_dir`). A variant that fails
is recorded in ``failed`` with a one-line reason, never fatal.

Concurrent builds of the same (suite, seed) (two ``lmlab cache build`` runs, a grid of them) take an exclusive lock
(``<out>/<suite>-s<seed>.lock``) around each variant's check-build-save and around the final merge: a variant one
process built is reused by the other (which waited), and the merge always sees every finished part, so no process
overwrites the cache with a merge that lacks the other's variants. Temporary files found under the lock belong to a
writer that was killed and are removed.

Build time of the committed caches (mixed, 480 queries, the 11-variant default pool, 2 cores, measured 2026-12-07/08):
seed 1 2378 s and seed 2 2281 s (the sum of the variants' ``build_s``, each cache's header; a nice'd test suite ran
beside part of both), seed 0 41 min of wall time (contended by tests for its first 25 minutes). smol-sc5 (5 samples)
takes ~23% of it, gemma-fewshot and smol-fewshot ~11% each.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmlab.core.inference.models import file_lock
from lmlab.data.respcache import ResponseCache, ResponseRow, cache_filename, user_dir
from lmlab.data.respsuite import MC_OPTIONS, _task_defs, suite_queries
from lmlab.zoo.run import BuildOptions, run_variant
from lmlab.zoo.variants import VARIANTS, VariantSpec, resolve_variants

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------------------------
# The builder


def parts_dir(out: str | Path, suite: str, seed: int) -> Path:
    return Path(out) / f"{suite}-s{int(seed)}.parts"


def lock_path(out: str | Path, suite: str, seed: int) -> Path:
    """The lock concurrent builders of (suite, seed) in `out` take around each variant and the merge."""
    return Path(out) / f"{suite}-s{int(seed)}.lock"


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}".strip()[:300]


def _valid_part(path: Path, suite: str, seed: int, qids: list[str]) -> ResponseCache | None:
    try:
        part = ResponseCache.load(path)
    except (ValueError, FileNotFoundError) as e:
        logger.warning("ignoring part %s: %s", path, e)
        return None
    if part.suite != suite or part.seed != seed or part.query_ids != qids:
        return None
    return part


def build_cache(
    suite: str = "mixed",
    seed: int = 0,
    n: int = 480,
    *,
    variants: Sequence[str | VariantSpec] | str | None = None,
    out: str | Path | None = None,
    resume: bool = True,
    progress: bool = True,
    batch_size: int = 16,
    max_new_tokens: int = 16,
    option_probs: bool = True,
) -> ResponseCache:
    """Build (or resume) the response cache of `suite` / `seed` with `n` queries for `variants`.

    Args:
        suite (`str`, defaults to ``"mixed"``): a zoo suite (`ZOO_SUITES`).
        seed (`int`): the data seed (queries, shots, samples, calibration and LoRA order).
        n (`int`, defaults to 480): queries, split evenly over the suite's tasks (60 per task of `mixed`).
        variants: ids of `VARIANTS`, `VariantSpec`s, a comma-separated string, or None (the default zoo).
        out (`str`, *optional*): folder of the cache (default `lmlab.data.respcache.user_dir`).
        resume (`bool`, defaults to `True`): reuse part files of earlier (possibly killed) builds whose suite, seed and
            query ids match; `False` rebuilds every requested variant (except one a concurrent build of the same
            cache finished since this one started).
        progress (`bool`): tqdm bars on stderr (off with ``LMLAB_NO_PROGRESS=1`` or when stderr is not a TTY).
        batch_size, max_new_tokens: the batched greedy pass (short answers).
        option_probs (`bool`): score the MC options of the continent task where cheap.

    Returns:
        `ResponseCache`: every valid part in `out` for this suite and seed (requested variants first, in order),
        with ``failed`` for the variants that raised; also saved atomically at ``<out>/<suite>-s<seed>.jsonl.gz``.
    """
    from lmlab.runner import progress_enabled

    specs = resolve_variants(variants)
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"batch_size and max_new_tokens must be >= 1, got {batch_size}, {max_new_tokens}")
    queries = suite_queries(suite, n, seed)
    qids = [q.id for q in queries]
    out = Path(out) if out is not None else user_dir()
    parts = parts_dir(out, suite, seed)
    parts.mkdir(parents=True, exist_ok=True)
    show = progress_enabled(progress if progress is False else None)
    opts = BuildOptions(
        seed=seed, batch_size=batch_size, max_new_tokens=max_new_tokens, option_probs=option_probs, progress=show
    )
    failed: dict[str, str] = {}
    done: dict[str, ResponseCache] = {}
    bar = specs
    if show:
        from tqdm import tqdm

        bar = tqdm(specs, desc=f"lmlab cache build {suite}/s{seed}", unit="variant")
    lock = lock_path(out, suite, seed)
    started = time.time()
    for spec in bar:
        path = parts / f"{spec.id}.jsonl.gz"
        with file_lock(lock):  # a concurrent builder of this variant finishes first; then its part is reused
            # without `resume`, a part a concurrent build wrote since this one started is fresh too
            if path.is_file() and (resume or path.stat().st_mtime >= started):
                part = _valid_part(path, suite, seed, qids)
                if part is not None:
                    logger.info("variant %s: reusing %s", spec.id, path)
                    done[spec.id] = part
                    continue
            try:
                rows, desc = run_variant(spec, queries, opts)
            except Exception as e:  # noqa: BLE001 - a failing variant is recorded, never fatal
                logger.warning("variant %s failed: %s", spec.id, _one_line(e))
                failed[spec.id] = _one_line(e)
                continue
            part = ResponseCache(suite=suite, seed=seed, rows=rows, variants={spec.id: desc})
            part.save(path)
            done[spec.id] = part
    with file_lock(lock):  # the merge reads every finished part and writes the cache while no one else writes
        return _merge(out, suite, seed, n, specs, qids, done, failed, max_new_tokens)


def _merge(
    out: Path,
    suite: str,
    seed: int,
    n: int,
    specs: list[VariantSpec],
    qids: list[str],
    done: dict[str, ResponseCache],
    failed: dict[str, str],
    max_new_tokens: int,
) -> ResponseCache:
    """The cache of every valid part of (suite, seed) in `out`, saved; called under the builders' lock."""
    parts = parts_dir(out, suite, seed)
    final = out / cache_filename(suite, seed)
    # every writer holds the lock, so temporary files seen now were left by one that was killed
    for stale in [*parts.glob(".*.tmp"), *out.glob(f".{final.name}.*.tmp")]:
        logger.warning("removing %s, left by a response cache build that was interrupted", stale)
        stale.unlink(missing_ok=True)
    # other variants built earlier into the same folder (e.g. a slice rebuilt with --variants) stay in the cache;
    # rows follow the zoo's own order, whichever slice was rebuilt last
    order = list(VARIANTS) + [s.id for s in specs]
    order += sorted(p.name[: -len(".jsonl.gz")] for p in parts.glob("*.jsonl.gz"))
    for vid in dict.fromkeys(order):
        if vid in done or vid in failed:
            continue
        path = parts / f"{vid}.jsonl.gz"
        if path.is_file():
            part = _valid_part(path, suite, seed, qids)
            if part is not None:
                done[vid] = part
    if final.is_file():  # failures of variants not rebuilt this time stay on record
        try:
            old = ResponseCache.load(final)
        except ValueError:
            old = None
        if old is not None and old.query_ids == qids:
            for vid, why in old.failed.items():
                if vid not in done and vid not in failed and vid not in {s.id for s in specs}:
                    failed[vid] = why
    rows: list[ResponseRow] = []
    descs: dict[str, dict[str, Any]] = {}
    for vid in dict.fromkeys(order):
        if vid in done:
            rows += done[vid].rows
            descs[vid] = done[vid].variants.get(vid, {})
    meta = {
        "n": n,
        "tasks": [d.name for d in _task_defs(suite)],
        "task_suites": {d.name: {"suite": d.suite, **d.kwargs} for d in _task_defs(suite)},
        "options": {k: list(v) for k, v in MC_OPTIONS.items()},
        "max_new_tokens": max_new_tokens,
        "cost": "2 x flop_params x (prompt + generated tokens), summed over samples",
    }
    cache = ResponseCache(suite=suite, seed=seed, rows=rows, variants=descs, failed=failed, meta=meta)
    cache.save(final)
    return cache


# ----------------------------------------------------------------------------------------------------------------
# `lmlab cache show`


def format_matrix(cache: ResponseCache) -> str:
    """The accuracy matrix variant x task (+ overall, mean cost in GFLOPs per query) and the failed variants."""
    import numpy as np

    table = cache.accuracy_table()
    tasks = list(dict.fromkeys(cache.tasks().values()))
    cost: dict[str, float] = {}
    for v in cache.variant_ids:
        cost[v] = float(np.mean([r.cost_flops for r in cache.rows if r.variant == v])) / 1e9
    cols = ["variant", *tasks, "all", "GFLOP/q"]
    lines_rows = []
    for v in cache.variant_ids:
        row = {"variant": v, **{t: f"{table[v].get(t, float('nan')):.2f}" for t in [*tasks, "all"]}}
        row["GFLOP/q"] = f"{cost[v]:.3g}"
        lines_rows.append(row)
    widths = {c: max(len(c), *(len(r[c]) for r in lines_rows)) if lines_rows else len(c) for c in cols}
    n_q = len(cache.query_ids)
    out = [f"response cache {cache.suite}/seed {cache.seed}: {len(cache.variant_ids)} variants x {n_q} queries"]
    out.append("  ".join(c.ljust(widths[c]) for c in cols))
    out.append("  ".join("-" * widths[c] for c in cols))
    out += ["  ".join(r[c].ljust(widths[c]) for c in cols) for r in lines_rows]
    if cache.failed:
        out.append("failed variants:")
        out += [f"  {v}: {why}" for v, why in cache.failed.items()]
    return "\n".join(out)


__all__ = ["build_cache", "format_matrix", "lock_path", "parts_dir"]
