"""Reproduction as a grid: (method, seed, model) cells, their verdicts aggregated, and the executors that run them.

One verdict from one seed can be luck. `lmlab reproduce --seeds 0 1 2 --models a,b` runs every method on every
(seed, model) cell, each cell one ordinary run folder (what `lmlab.runner.run_method` writes), and aggregates the
cells' verdicts honestly: a claim that holds on some cells and not on others is "fragile", not "holds".

Layout of a reproduce folder (the contract with `lmlab.report_html`):

- ``reproduce.json``: the state ``--resume`` continues (preset, methods, seeds, models, executor, started_at);
- a single-cell grid (one seed, each method's default model) keeps the old layout ``<folder>/<method>/``;
  otherwise ``<folder>/<method>/<model_slug>/seed<k>/`` (``default`` = the method's own default model);
- ``grid.json``: every cell (run, skipped or pending) with its claims, one verdict per method, and the counts.

A cell folder is written atomically: the run goes into ``<parent>/.<name>.<uuid>.tmp/run`` and is renamed into
place when finished, so a folder under its final name is always whole. A cell is complete when its result.json
loads, its run succeeded and its preset matches; `--resume` reruns every other cell (missing, half-written,
errored). Completeness is read from the folders alone, so a grid started on one executor resumes on another.

Executors: ``local`` (one cell at a time in this process, or a pool of `jobs` processes, one process per cell) and
``ray`` (each cell a Ray task on a local or existing cluster; the folder must be on a filesystem every worker sees).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmlab.registry import MethodSpec, get_method
from lmlab.results import atomic_write_text, load_result

logger = logging.getLogger("lmlab")

DEFAULT_MODEL = "default"  # the cell model meaning "the method's own default model"
RUN_STATUSES = ("supported", "not_supported", "inconclusive", "error")
CELL_STATUSES = (*RUN_STATUSES, "skipped", "pending")
VERDICTS = ("holds", "does_not_hold", "fragile", "inconclusive", "error", "skipped", "pending")
# the one-cell mapping of a run's status to a method verdict
_ONE_CELL = {"supported": "holds", "not_supported": "does_not_hold", "inconclusive": "inconclusive", "error": "error"}
_TMP_SUFFIX = ".tmp"


# ----------------------------------------------------------------------------------------------------------------
# Verdicts


def aggregate_verdict(statuses: Iterable[str]) -> str:
    """The verdict of one method over its grid cells, from the cells' statuses.

    Skipped and pending cells do not vote; errored cells do not vote when at least one cell ran. Over the cells
    that ran: all "supported" -> "holds"; all "not_supported" -> "does_not_hold"; some "supported" and some not ->
    "fragile" (a claim that holds on one seed and not on the others does not hold robustly); no "supported" ->
    "does_not_hold" when a strict majority is "not_supported", else "inconclusive". Every cell errored -> "error";
    nothing ran -> "pending" if a cell is still to run, else "skipped".
    """
    statuses = list(statuses)
    bad = [s for s in statuses if s not in CELL_STATUSES]
    if bad:
        raise ValueError(f"cell status must be one of {', '.join(CELL_STATUSES)}, got {bad[0]!r}")
    ran = [s for s in statuses if s in RUN_STATUSES]
    if not ran:
        return "pending" if "pending" in statuses else "skipped"
    voting = [s for s in ran if s != "error"]
    if not voting:
        return "error"
    if len(voting) == 1:
        return _ONE_CELL[voting[0]]
    n_sup = voting.count("supported")
    n_not = voting.count("not_supported")
    if n_sup == len(voting):
        return "holds"
    if n_not == len(voting):
        return "does_not_hold"
    if n_sup:
        return "fragile"
    return "does_not_hold" if n_not * 2 > len(voting) else "inconclusive"


# ----------------------------------------------------------------------------------------------------------------
# Planning


@dataclass(frozen=True)
class Cell:
    """One (method, model, seed) of a grid.

    Attributes:
        method, area: the method's id and area.
        model (`str`): an alias, or ``"default"`` (the method's own default model: no ``model`` override).
        seed (`int`): the run's seed.
        path (`str`, *optional*): the cell folder relative to the reproduce folder; None when skipped.
        reason (`str`): why the cell is skipped (empty when it runs).
    """

    method: str
    area: str
    model: str
    seed: int
    path: str | None
    reason: str = ""

    @property
    def skipped(self) -> bool:
        return self.path is None

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.method, self.model, self.seed)


def model_slug(model: str) -> str:
    """The folder name of a cell model (``"default"``, ``"smollm2-135m"``, a local path's last part)."""
    from lmlab.runner import _slug

    return DEFAULT_MODEL if model == DEFAULT_MODEL else _slug(model)


def default_seed(spec: MethodSpec) -> int:
    """The seed the method's config uses when none is given."""
    fields = {f.name: f for f in dataclasses.fields(spec.config_class())}
    return int(fields["seed"].default)


def uses_model(spec: MethodSpec) -> bool:
    """Whether the method loads the model its config names, decided from the registry (no per-method list).

    A method uses no model when every data suite it declares is the response cache (``respcache:...``: fixed,
    pre-computed inputs) or when its config marks the `model` field unused (help text starting with "unused").
    Such a method gives the same numbers under every model, so it runs once per seed under its default model and
    the other models' cells are skipped.
    """
    if spec.suites and all(s.startswith("respcache:") for s in spec.suites):
        return False
    model_field = {f.name: f for f in dataclasses.fields(spec.config_class())}.get("model")
    if model_field is None:
        return False
    return not str(model_field.metadata.get("help", "")).lower().startswith("unused")


def _no_model_reason(spec: MethodSpec) -> str:
    if spec.suites and all(s.startswith("respcache:") for s in spec.suites):
        return "config has no model field in use: the method runs on fixed inputs (the response cache)"
    return "config has no model field in use: its config marks `model` unused (models built from scratch)"


def model_refusal(spec: MethodSpec, model: str, preset: str) -> str:
    """Why `spec`'s config refuses `model` (its ``__post_init__`` raised), or "" when it accepts it."""
    from lmlab.runner import resolve_config

    try:
        resolve_config(spec, preset=preset, overrides={"model": model})
    except (ValueError, TypeError) as e:
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"config refuses model {model!r}: {text}"
    return ""


def single_cell(seeds: Sequence[int] | None, models: Sequence[str] | None) -> bool:
    """One seed and each method's default model: the old ``<folder>/<method>/`` layout."""
    return (seeds is None or len(seeds) == 1) and not models


def plan_grid(
    specs: Sequence[MethodSpec], *, seeds: Sequence[int] | None, models: Sequence[str] | None, preset: str
) -> list[Cell]:
    """Every cell of the grid, in (method, model, seed) order, skipped cells included with their reason.

    `seeds` None: each method's config default seed. `models` None or empty: each method's default model (cell
    model ``"default"``). A method that loads no model (see `uses_model`) runs under ``"default"`` per seed and
    its cells for the given models are skipped; a model that a method's config refuses is skipped with the
    config's error.
    """
    one = single_cell(seeds, models)
    cells: list[Cell] = []
    for spec in specs:
        method_seeds = list(seeds) if seeds is not None else [default_seed(spec)]
        if not models:
            for seed in method_seeds:
                path = spec.id if one else f"{spec.id}/{DEFAULT_MODEL}/seed{seed}"
                cells.append(Cell(spec.id, spec.area, DEFAULT_MODEL, seed, path))
            continue
        if not uses_model(spec):
            reason = _no_model_reason(spec)
            for seed in method_seeds:
                cells.append(Cell(spec.id, spec.area, DEFAULT_MODEL, seed, f"{spec.id}/{DEFAULT_MODEL}/seed{seed}"))
            for model in (m for m in models if m != DEFAULT_MODEL):
                for seed in method_seeds:
                    cells.append(Cell(spec.id, spec.area, model, seed, None, reason))
            continue
        for model in models:
            refusal = "" if model == DEFAULT_MODEL else model_refusal(spec, model, preset)
            for seed in method_seeds:
                path = None if refusal else f"{spec.id}/{model_slug(model)}/seed{seed}"
                cells.append(Cell(spec.id, spec.area, model, seed, path, refusal))
    return cells


# ----------------------------------------------------------------------------------------------------------------
# Cells on disk


def cell_complete(folder: Path, preset: str) -> dict[str, Any] | None:
    """The result.json of a finished cell folder, or None (absent, unreadable, errored, or another preset)."""
    data = load_result(folder)
    if not isinstance(data, dict):
        return None
    info = data.get("run_info") or {}
    if info.get("status") != "ok" or info.get("preset") != preset:
        return None
    return data


def remove_stale_temps(folder: Path, cells: Sequence[Cell]) -> list[Path]:
    """Remove the temporary folders an interrupted cell left (``.<name>.<uuid>.tmp`` beside its final folder)."""
    removed = []
    parents = {(folder / c.path).parent for c in cells if c.path is not None}
    for parent in sorted(parents):
        if not parent.is_dir():
            continue
        for p in parent.iterdir():
            if p.name.startswith(".") and p.name.endswith(_TMP_SUFFIX) and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    return removed


@dataclass
class CellJob:
    """What a worker needs to run one cell (picklable: plain values only)."""

    method: str
    model: str
    seed: int
    folder: str  # the cell's final folder, absolute
    preset: str
    overrides: dict[str, Any] = field(default_factory=dict)
    show_progress: bool | None = False
    num_threads: int | None = None  # torch threads in a worker process (None: leave the process default)


def run_cell(job: CellJob) -> dict[str, Any]:
    """Run one cell into a temporary folder beside its final one and rename it into place when finished.

    Returns ``{"status": "ok"|"error", "reason": str, "time_s": float}``. An exception outside the experiment
    (a missing package, a refused config) becomes an error cell: a result.json with ``run_info.status`` "error",
    so it is reported, never dropped, and rerun on `--resume`.
    """
    from lmlab import runner  # looked up at call time: tests patch runner.run_method

    final = Path(job.folder)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.{uuid.uuid4().hex[:8]}{_TMP_SUFFIX}"
    tmp.mkdir()
    (tmp / "cell.json").write_text(json.dumps(dataclasses.asdict(job)))
    overrides = dict(job.overrides)
    if job.model != DEFAULT_MODEL:
        overrides["model"] = job.model
    if job.num_threads and overrides.get("threads") is None:
        import torch

        torch.set_num_threads(job.num_threads)
    t0 = time.perf_counter()
    try:
        try:
            result = runner.run_method(
                job.method, preset=job.preset, folder=tmp / "run", show_progress=job.show_progress,
                seed=job.seed, **overrides,
            )  # fmt: skip
            status, reason = result.run_info.get("status", "ok"), result.run_info.get("error") or ""
        except Exception as e:  # recorded as an error cell, like an experiment error
            status, reason = "error", _one_line(e)
            if (tmp / "run").exists():
                shutil.rmtree(tmp / "run")
            write_error_cell(tmp / "run", job, reason, time.perf_counter() - t0)
        if final.exists():  # an errored or half-finished earlier attempt is replaced
            shutil.rmtree(final)
        os.replace(tmp / "run", final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"status": status, "reason": reason, "time_s": round(time.perf_counter() - t0, 2)}


def write_error_cell(folder: Path, job: CellJob, reason: str, time_s: float = 0.0) -> Path:
    """A result folder for a cell that could not run (an exception before the experiment, a dead worker)."""
    from lmlab.results import RunResult

    spec = get_method(job.method)
    run_info = {
        "method": spec.id, "name": spec.name, "area": spec.area, "paper": spec.paper, "paper_url": spec.paper_url,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "total_time_s": round(time_s, 2), "preset": job.preset,
        "seed": job.seed, "status": "error", "error": reason, "model": job.model,
    }  # fmt: skip
    result = RunResult(method=spec.id, run_info=run_info, config={}, claim_text=spec.claim)
    return result.write(folder)


def write_error_cell_atomic(final: Path, job: CellJob, reason: str) -> None:
    """`write_error_cell` into a temporary folder renamed into place (the driver records a dead worker's cell)."""
    tmp = final.parent / f".{final.name}.{uuid.uuid4().hex[:8]}{_TMP_SUFFIX}"
    try:
        write_error_cell(tmp, job, reason)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _one_line(e: BaseException) -> str:
    text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


# ----------------------------------------------------------------------------------------------------------------
# grid.json

_CLAIM_KEYS = ("text", "metric", "method", "baseline", "direction", "min_effect", "observed_effect", "ci", "gate",
               "mechanism", "status")  # fmt: skip


def cell_record(cell: Cell, data: Mapping[str, Any] | None, *, pending: bool = False) -> dict[str, Any]:
    """The grid.json entry of `cell` from its result.json `data` (None: skipped, or pending when `pending`)."""
    rec: dict[str, Any] = {"method": cell.method, "area": cell.area, "model": cell.model, "seed": cell.seed,
                           "path": cell.path, "status": "skipped", "reason": cell.reason, "time_s": None,
                           "claims": []}  # fmt: skip
    if cell.skipped:
        return rec
    if data is None:
        rec["status"] = "pending" if pending else "error"
        rec["reason"] = "" if pending else "no readable result.json"
        return rec
    info = data.get("run_info") or {}
    rec["time_s"] = info.get("total_time_s")
    if info.get("status") == "error":
        rec["status"], rec["reason"] = "error", info.get("error") or "error"
    else:
        rec["status"] = (data.get("claim") or {}).get("status") or "inconclusive"
    rec["claims"] = [{k: c.get(k) for k in _CLAIM_KEYS} for c in data.get("claims", [])]
    return rec


def method_summaries(cells: Sequence[Mapping[str, Any]], claims: Mapping[str, str]) -> list[dict[str, Any]]:
    """One entry per method (in cell order): its verdict over the grid, k of n, and each cell's gated effects."""
    order: dict[str, list[Mapping[str, Any]]] = {}
    for c in cells:
        order.setdefault(c["method"], []).append(c)
    out = []
    for method, group in order.items():
        statuses = [c["status"] for c in group]
        ran = [s for s in statuses if s in RUN_STATUSES]
        voting = [s for s in ran if s != "error"]
        effects = [
            {"model": c["model"], "seed": c["seed"], "metric": cl["metric"], "observed_effect": cl["observed_effect"],
             "ci": cl["ci"], "status": cl["status"]}
            for c in group if c["status"] in RUN_STATUSES for cl in c["claims"] if cl.get("gate")
        ]  # fmt: skip
        out.append({
            "method": method,
            "area": group[0]["area"],
            "claim": claims.get(method, ""),
            "verdict": aggregate_verdict(statuses),
            "k_holds": voting.count("supported"),
            "n_cells": len(voting) if voting else len(ran),
            "n_errors": ran.count("error"),
            "effects": effects,
        })  # fmt: skip
    return out


def grid_counts(cells: Sequence[Mapping[str, Any]], methods: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """``cells``: cells run (errors included); holds / does_not_hold / fragile / inconclusive: methods with that
    verdict; ``errors``: errored cells (each one visible, never dropped); ``skipped``: skipped cells."""
    verdicts = [m["verdict"] for m in methods]
    return {
        "cells": sum(c["status"] in RUN_STATUSES for c in cells),
        "holds": verdicts.count("holds"),
        "does_not_hold": verdicts.count("does_not_hold"),
        "fragile": verdicts.count("fragile"),
        "inconclusive": verdicts.count("inconclusive"),
        "errors": sum(c["status"] == "error" for c in cells),
        "skipped": sum(c["status"] == "skipped" for c in cells),
    }


def summary_line(counts: Mapping[str, int]) -> str:
    """The last line of the terminal summary."""
    return (
        f"cells run {counts['cells']}: holds {counts['holds']} / does not hold {counts['does_not_hold']} / "
        f"fragile {counts['fragile']} / inconclusive {counts['inconclusive']} / errors {counts['errors']}"
    )


def build_grid(
    folder: Path,
    cells: Sequence[Cell],
    *,
    preset: str,
    seeds: Sequence[int] | None,
    models: Sequence[str] | None,
    pending: bool = True,
) -> dict[str, Any]:
    """The grid.json dict of `cells`, read from their folders (a cell without a result is pending or an error)."""
    records = []
    claims: dict[str, str] = {}
    for cell in cells:
        data = None if cell.skipped else load_result(folder / cell.path)
        if data is not None and data.get("run_info", {}).get("preset") not in (preset, None):
            data = None  # another preset's folder: not this grid's result
        records.append(cell_record(cell, data, pending=pending))
        if cell.method not in claims:
            text = (data or {}).get("claim", {}).get("text") if data else None
            claims[cell.method] = text or _spec_claim(cell.method)
    methods = method_summaries(records, claims)
    all_seeds = list(seeds) if seeds is not None else sorted({c.seed for c in cells})
    return {
        "preset": preset,
        "seeds": all_seeds,
        "models": list(models) if models else None,
        "cells": records,
        "methods": methods,
        "counts": grid_counts(records, methods),
    }


def _spec_claim(method: str) -> str:
    try:
        return get_method(method).claim
    except KeyError:
        return ""


def write_grid(folder: Path, grid: Mapping[str, Any]) -> Path:
    """Write ``grid.json`` atomically."""
    from lmlab.results import dumps

    path = Path(folder) / "grid.json"
    atomic_write_text(path, dumps(grid))
    return path


def grid_from_folder(folder: str | Path) -> dict[str, Any]:
    """The grid.json dict of a reproduce folder, rebuilt from its cell folders (for folders without grid.json).

    With ``reproduce.json`` the grid is planned from it (skipped and not-yet-run cells included); without it, each
    ``<folder>/<method>/result.json`` (single-cell layout) or ``<folder>/<method>/<model>/seed<k>/result.json`` is a
    cell. Errored cells count as errors; folders without a readable result.json are left out.
    """
    folder = Path(folder)
    state_path = folder / "reproduce.json"
    if state_path.exists():
        state = json.loads(state_path.read_text())
        specs = []
        for m in state.get("methods", []):
            try:
                specs.append(get_method(m))
            except KeyError:
                logger.warning("grid_from_folder: %s is no longer registered; left out", m)
        seeds, models = state.get("seeds"), state.get("models")
        cells = plan_grid(specs, seeds=seeds, models=models, preset=state.get("preset", "quick"))
        return build_grid(folder, cells, preset=state.get("preset", "quick"), seeds=seeds, models=models)
    cells, presets = [], []
    for method_dir in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        found = [method_dir] if (method_dir / "result.json").exists() else sorted(method_dir.glob("*/seed*"))
        for cell_dir in found:
            data = load_result(cell_dir)
            if data is None:
                continue
            info = data.get("run_info", {})
            model = DEFAULT_MODEL if cell_dir == method_dir else cell_dir.parent.name
            rel = cell_dir.relative_to(folder).as_posix()
            cells.append(Cell(info.get("method", method_dir.name), info.get("area", ""), model,
                              int(info.get("seed") or 0), rel))  # fmt: skip
            presets.append(info.get("preset"))
    preset = presets[0] if presets else "quick"
    models = sorted({c.model for c in cells} - {DEFAULT_MODEL}) or None
    return build_grid(folder, cells, preset=preset, seeds=None, models=models)


# ----------------------------------------------------------------------------------------------------------------
# Executors

OnDone = Callable[[CellJob, dict[str, Any]], None]


def cell_resources(spec: MethodSpec, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A cell's Ray resource request: its threads as CPUs (1 by default) and its memory when the spec gives one.

    `MethodSpec` has no CPU or memory field today; a ``num_cpus`` / ``memory_mb`` attribute is honoured when present.
    """
    threads = (overrides or {}).get("threads")
    res: dict[str, Any] = {"num_cpus": int(threads or getattr(spec, "num_cpus", 1) or 1)}
    memory_mb = getattr(spec, "memory_mb", None)
    if memory_mb:
        res["memory"] = int(memory_mb) * 1024 * 1024
    return res


def run_local(jobs: Sequence[CellJob], *, n_jobs: int = 1, on_done: OnDone | None = None) -> None:
    """Run the cells here: one at a time in this process (``n_jobs=1``), or a spawn pool of `n_jobs` processes.

    With a pool each cell runs in a fresh process (``max_tasks_per_child=1`` on Python >= 3.11), so one cell's
    memory or a crash does not leak into the next; a process that dies records an error cell.
    """
    if n_jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {n_jobs}")
    if n_jobs == 1:
        for job in jobs:
            outcome = run_cell(job)
            if on_done:
                on_done(job, outcome)
        return
    import multiprocessing as mp
    import sys
    from concurrent.futures import ProcessPoolExecutor, as_completed

    threads = max(1, (os.cpu_count() or 1) // n_jobs)
    kwargs: dict[str, Any] = {"max_workers": n_jobs, "mp_context": mp.get_context("spawn")}
    if sys.version_info >= (3, 11):
        kwargs["max_tasks_per_child"] = 1
    pool = ProcessPoolExecutor(**kwargs)
    try:
        futures = {pool.submit(run_cell, dataclasses.replace(j, num_threads=j.num_threads or threads)): j
                   for j in jobs}  # fmt: skip
        for fut in as_completed(futures):
            job = futures[fut]
            try:
                outcome = fut.result()
            except Exception as e:  # the worker process died (BrokenProcessPool) or could not pickle
                reason = f"worker failed: {_one_line(e)}"
                write_error_cell_atomic(Path(job.folder), job, reason)
                outcome = {"status": "error", "reason": reason, "time_s": 0.0}
            if on_done:
                on_done(job, outcome)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


RAY_MISSING = "--executor ray needs ray: pip install 'lmlab[ray]'"


def _ray_env() -> dict[str, str]:
    keys = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM", "LMLAB_NO_PROGRESS", "LMLAB_CACHE")
    env = {k: os.environ[k] for k in keys if k in os.environ}
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("LMLAB_NO_PROGRESS", "1")
    return env


def run_ray(
    jobs: Sequence[CellJob],
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    on_done: OnDone | None = None,
) -> None:
    """Run each cell as a Ray task (`run_cell` in the worker, writing into the same folder layout).

    `address` connects to an existing cluster (``ray start --head`` gives it); None starts a local one with
    `num_cpus` CPUs. Only a cluster started here is shut down here; the connection is always closed. A task whose
    worker dies is retried once (``max_retries=1``); after that the cell is recorded as an error cell with Ray's
    reason. The reproduce folder must be on a filesystem that every worker sees.
    """
    try:
        import ray
    except ImportError:
        raise ImportError(RAY_MISSING) from None
    from ray.exceptions import RayError

    if not jobs:  # nothing left to run (a resumed, finished grid): no cluster to start or join
        return
    init_kw: dict[str, Any] = {"runtime_env": {"env_vars": _ray_env()}, "log_to_driver": False,
                               "logging_level": logging.WARNING}  # fmt: skip
    if address:
        init_kw["address"] = address
    else:
        init_kw.update(num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False)
    ray.init(**init_kw)
    refs: dict[Any, CellJob] = {}
    try:
        remote = ray.remote(max_retries=1)(run_cell)
        for job in jobs:
            res = cell_resources(get_method(job.method), job.overrides)
            job = dataclasses.replace(job, num_threads=job.num_threads or res["num_cpus"])
            refs[remote.options(**res).remote(job)] = job
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            ref = ready[0]
            job = refs[ref]
            try:
                outcome = ray.get(ref)
            except RayError as e:  # the worker died twice, or the task failed outside run_cell's own handling
                reason = f"ray task failed after 1 retry: {_one_line(e)}"
                write_error_cell_atomic(Path(job.folder), job, reason)
                outcome = {"status": "error", "reason": reason, "time_s": 0.0}
            if on_done:
                on_done(job, outcome)
    except BaseException:  # an interrupt: stop the cells still running; their temp folders are removed on resume
        for ref in refs:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        raise
    finally:
        ray.shutdown()
