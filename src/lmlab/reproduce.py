"""`reproduce`: a grid of (method, seed, model) cells run through `lmlab.grid`, and the combined report.

Layering: this module sits above `lmlab.runner` (one run) and `lmlab.grid` (cells, executors, ``grid.json``); the
grid calls the runner for each cell, and neither imports this module.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lmlab.registry import MethodSpec, get_method, list_methods
from lmlab.results import MetricRow, RunResult, atomic_write_text, dumps, load_result
from lmlab.runner import progress_enabled

logger = logging.getLogger("lmlab")

# command-line overrides that only some methods' configs have: `reproduce` passes them to those methods alone
OPTIONAL_OVERRIDES = ("backend",)


def select_methods(ids: Sequence[str] = (), area: str | None = None) -> list[MethodSpec]:
    """Methods for `reproduce`: the given ids, an area, or all paper methods (``baseline``-tagged ones excluded)."""
    if ids:
        return [get_method(i) for i in ids]
    return [s for s in list_methods(area=area) if "baseline" not in s.tags]


def _latest_reproduce(root: Path) -> Path | None:
    candidates = sorted(p for p in root.glob("*/reproduce.json") if p.parent.name[:8].isdigit())
    return candidates[-1].parent if candidates else None


EXECUTORS = ("local", "ray")
REPORT_EVERY_S = 20.0  # the combined reports are rewritten after a cell at most this often (grid.json every cell)


def _check_grid_args(
    seeds: Sequence[int] | None, models: Sequence[str] | None, executor: str, jobs: int, overrides: Mapping[str, Any]
) -> None:
    from lmlab.config import BaseConfig, build_config, config_fields
    from lmlab.core.inference.models import resolve_model
    from lmlab.grid import DEFAULT_MODEL

    # the common run overrides (--threads, --limit, --batch-size, --model, ...) are checked once here: refused later,
    # they would fail every cell after the reproduce folder, its grid and its reports had been written
    base = {k: v for k, v in overrides.items() if k in config_fields(BaseConfig) and k != "model"}
    build_config(BaseConfig, base)
    if overrides.get("model") is not None:
        resolve_model(overrides["model"])
    if executor not in EXECUTORS:
        raise ValueError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    if seeds is not None:
        if not seeds:
            raise ValueError("--seeds needs at least one seed")
        bad = [s for s in seeds if not isinstance(s, int) or isinstance(s, bool) or s < 0]
        if bad:
            raise ValueError(f"--seeds must be non-negative integers, got {bad[0]!r}")
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"--seeds lists a seed twice: {list(seeds)}")
    if models:
        if overrides.get("model") is not None:
            raise ValueError("--model and --models cannot be combined; give every model to --models")
        if len(set(models)) != len(models):
            raise ValueError(f"--models lists a model twice: {','.join(models)}")
        for m in models:
            if m != DEFAULT_MODEL:
                resolve_model(m)  # an unknown model is a usage error before anything runs


def reproduce(
    ids: Sequence[str] = (),
    *,
    area: str | None = None,
    preset: str = "quick",
    out: str | Path | None = None,
    resume: bool = False,
    runs_root: str | Path = "runs",
    show_progress: bool | None = None,
    overrides: Mapping[str, Any] | None = None,
    seeds: Sequence[int] | None = None,
    models: Sequence[str] | None = None,
    executor: str = "local",
    address: str | None = None,
    jobs: int = 1,
) -> tuple[Path, list[dict[str, Any]]]:
    """Run a grid of (method, seed, model) cells and write ``grid.json``, ``report.html``/``report.md``/``summary.*``.

    Each cell is one run folder, written atomically (see `lmlab.grid`); ``grid.json`` is rewritten after every
    cell, the reports after a cell at most every `REPORT_EVERY_S` seconds and at the end, so an interruption
    (Ctrl-C or a kill) loses at most the cells that were running.

    Args:
        seeds: seeds of the grid (None: each method's config default seed).
        models: model aliases of the grid (None: each method's own default model, cell model ``"default"``).
            Methods that load no model run once per seed under their default; models a config refuses are
            skipped with the reason.
        resume (`bool`): continue `out` or the newest ``runs/<timestamp>`` holding a ``reproduce.json``: cells whose
            folder holds a finished result of the same preset are not run again; every other cell (missing,
            half-written, errored) is. Seeds and models default to the stored ones; other values are refused. With
            no ids or area, the stored methods are continued.
        executor (`str`): ``local`` (this machine; `jobs` > 1: a process pool) or ``ray`` (`address`: an existing
            cluster; None: a local one with `jobs` CPUs, shut down at the end).

    Returns:
        (the folder, the summary rows: one per run cell).
    """
    from lmlab import grid as G

    overrides = dict(overrides or {})
    _check_grid_args(seeds, models, executor, jobs, overrides)
    root_dir = Path(runs_root)
    folder: Path | None = Path(out) if out else None
    if resume and folder is None:
        folder = _latest_reproduce(root_dir)
        if folder is None:
            raise ValueError(f"--resume found no earlier reproduce run under {str(root_dir)!r}")
    if folder is None:
        folder = root_dir / time.strftime("%Y%m%d-%H%M%S")
        while folder.exists():
            folder = folder.with_name(folder.name + "x")
    from lmlab.results import check_output_root

    check_output_root(folder)
    state_path = folder / "reproduce.json"
    previous = json.loads(state_path.read_text()) if state_path.exists() else None
    if previous is not None:
        if previous.get("preset") != preset:
            raise ValueError(
                f"{folder} holds a reproduce with preset {previous.get('preset')!r}; resume it with the same preset "
                f"or choose another --out"
            )
        for name, given in (("seeds", seeds), ("models", models)):
            stored = previous.get(name)
            if given is not None and list(given or []) != list(stored or []):
                raise ValueError(
                    f"{folder} holds a reproduce with {name} {stored!r}, not {list(given)!r}; resume it with the same "
                    f"--{name} (or none) or choose another --out"
                )
        seeds, models = previous.get("seeds"), previous.get("models")
    specs = (
        [get_method(m) for m in previous.get("methods", [])]
        if resume and previous is not None and not ids and area is None
        else select_methods(ids, area)
    )
    models = list(models) if models else None
    seeds = list(seeds) if seeds is not None else None
    folder.mkdir(parents=True, exist_ok=True)
    state = {
        "preset": preset,
        "methods": [s.id for s in specs],
        "seeds": seeds,
        "models": models,
        "executor": executor,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    if previous is not None:
        state["methods"] = list(dict.fromkeys(previous.get("methods", []) + state["methods"]))
        state["started_at"] = previous.get("started_at", state["started_at"])
    atomic_write_text(state_path, json.dumps(state, indent=2))

    all_specs = [get_method(m) for m in state["methods"]]
    cells = G.plan_grid(all_specs, seeds=seeds, models=models, preset=preset)
    for p in G.remove_stale_temps(folder, cells):
        logger.info("removed the temporary folder of an interrupted cell: %s", p)
    selected = {s.id for s in specs}
    jobs_todo = []
    for cell in cells:
        if cell.skipped or cell.method not in selected:
            continue
        if G.cell_complete(folder / cell.path, preset) is not None:
            logger.info("%s: already done in %s, skipped", cell.path, folder)
            continue
        spec = get_method(cell.method)
        # a field only some methods have (the API `backend`) goes to those methods alone
        fields = {f.name for f in dataclasses.fields(spec.config_class())}
        method_overrides = {k: v for k, v in overrides.items() if k not in OPTIONAL_OVERRIDES or k in fields}
        jobs_todo.append(G.CellJob(cell.method, cell.model, cell.seed, str((folder / cell.path).resolve()), preset,
                                   method_overrides, show_progress))  # fmt: skip

    bar = None
    if progress_enabled(show_progress) and jobs_todo:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs_todo), desc="lmlab reproduce", unit="cell")
    last_report = [time.monotonic()]

    def on_done(job: Any, outcome: Mapping[str, Any]) -> None:
        logger.info("%s / %s / seed %d: %s %s", job.method, job.model, job.seed, outcome["status"], outcome["reason"])
        if bar is not None:
            bar.update(1)
        if time.monotonic() - last_report[0] >= REPORT_EVERY_S:
            write_reproduce_report(folder, state["methods"])
            last_report[0] = time.monotonic()
        else:
            G.write_grid(folder, G.grid_from_folder(folder))

    try:
        if executor == "ray":
            G.run_ray(jobs_todo, address=address, num_cpus=jobs if jobs > 1 else None, on_done=on_done)
        else:
            G.run_local(jobs_todo, n_jobs=jobs, on_done=on_done)
    finally:  # also on Ctrl-C: the grid and reports show what finished
        if bar is not None:
            bar.close()
        entries = write_reproduce_report(folder, state["methods"])
    return folder, entries


def _load_run(folder: Path) -> RunResult | None:
    """Rebuild a `RunResult` (without samples) from a written run folder, for the combined report."""
    from lmlab.results import ClaimResult

    data = load_result(folder)
    if data is None:
        return None
    figures = {p.stem: p.read_bytes() for p in sorted(folder.glob("*.png"))}
    claims = []
    for c in data.get("claims", []):
        c = dict(c)
        c["ci"] = tuple(c["ci"])
        claims.append(ClaimResult(**c))
    return RunResult(
        method=data["run_info"]["method"],
        run_info=data["run_info"],
        config=data["config"],
        metrics=[MetricRow(**m) for m in data["metrics"]],
        claims=claims,
        claim_text=data["claim"]["text"],
        figures=figures,
        notes=data.get("notes", []),
        flags=data.get("flags", {}),
        compute=data.get("compute", {}),
        meta_info=data.get("meta_info", {}),
        tables=data.get("tables", {}),
    )


def write_reproduce_report(folder: Path, method_ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """(Re)write grid.json, summary.json, summary.csv, report.md and report.html from the cell folders present.

    Returns the summary rows, one per cell that ran (a single-cell grid: one per method, as before; a grid adds
    ``model`` and ``seed`` columns).
    """
    from lmlab.core.report.reporting import run_blocks, summary_blocks, summary_row, to_markdown
    from lmlab.grid import RUN_STATUSES, grid_from_folder, single_cell, summary_line, write_grid

    folder = Path(folder)
    grid = grid_from_folder(folder)
    if method_ids is not None:  # the methods asked for, in their order
        keep = list(dict.fromkeys(method_ids))
        rank = {m: i for i, m in enumerate(keep)}
        grid["cells"] = sorted((c for c in grid["cells"] if c["method"] in rank), key=lambda c: rank[c["method"]])
        grid["methods"] = sorted((m for m in grid["methods"] if m["method"] in rank), key=lambda m: rank[m["method"]])
        from lmlab.grid import grid_counts

        grid["counts"] = grid_counts(grid["cells"], grid["methods"])
    write_grid(folder, grid)
    one = single_cell(grid["seeds"], grid["models"])
    results: list[tuple[dict[str, Any], RunResult]] = []
    for cell in grid["cells"]:
        if cell["status"] in RUN_STATUSES and cell["path"]:
            r = _load_run(folder / cell["path"])
            if r is not None:
                results.append((cell, r))
    entries = []
    for cell, r in results:
        row = summary_row(r)
        if not one:
            row = {"method": row["method"], "model": cell["model"], "seed": cell["seed"], **row}
        entries.append(row)
    verdicts = {m["method"]: m for m in grid["methods"]}
    pending = [m for m, v in verdicts.items() if v["verdict"] == "pending"]
    intro = (
        f"{summary_line(grid['counts'])}. "
        "Every verdict is computed from numbers measured in this run, with the baselines run in the same process."
    )
    if not one:
        intro += " A method's verdict over the grid: " + "; ".join(
            f"{m}: {v['verdict'].replace('_', ' ')} ({v['k_holds']} of {v['n_cells']} cells hold)"
            for m, v in verdicts.items()
        )
        intro += "."
    if pending:
        intro += f" Not yet run: {', '.join(pending)}."
    head = summary_blocks(entries, title="lmlab reproduction report", intro=intro)
    md_blocks = list(head)
    for cell, r in results:
        md_blocks += run_blocks(r, figure_paths={n: f"{cell['path']}/{n}.png" for n in r.figures}, level=2)
    atomic_write_text(folder / "report.md", to_markdown(md_blocks))
    from lmlab.report_html import write_report

    write_report(folder)
    atomic_write_text(folder / "summary.json", dumps(entries))
    buf = io.StringIO()
    if entries:
        writer = csv.DictWriter(buf, fieldnames=list(entries[0].keys()))
        writer.writeheader()
        writer.writerows(entries)
    atomic_write_text(folder / "summary.csv", buf.getvalue())
    return entries
