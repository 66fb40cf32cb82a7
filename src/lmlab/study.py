"""The reproduction study: the finished cells of `lmlab reproduce` runs, kept small and committed under
``results/study``, and read back as a grid.

A reproduce folder holds whole run folders (samples, plots, a few MB per cell) and is not committed. `export_cells`
keeps one small JSON per cell, ``<study_root>/<method>/<model>/seed<k>.json`` (a few KB): the claim checks, the
cell's status and verdict, the preset, a hash of the config, the git commit the run recorded (and whether its tree
was dirty), the seconds it took, the machine (CPU model, AVX-512, cores, load average) and the lmlab version.
`load_study` reads them back in the shape of `lmlab.grid.grid_from_folder` (verdicts and counts from the grid's own
aggregation), so `lmlab.report_html` renders them and ``lmlab reproduce --from results/study`` reports them without
running anything. `stale_cells` tells which cells were measured on code that has changed since (``git log``).

A cell of a method's default model (cell model ``default``) is stored under the model alias the run used.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lmlab.grid import DEFAULT_MODEL, RUN_STATUSES, aggregate_verdict, grid_counts, grid_from_folder, method_summaries
from lmlab.results import atomic_write_text, dumps, load_result

logger = logging.getLogger("lmlab")

STUDY_ROOT = "results/study"
SCHEMA = "lmlab.study.cell/1"
CLAIM_KEYS = ("text", "metric", "method", "baseline", "direction", "min_effect", "observed_effect", "ci", "n",
              "status", "gate", "mechanism")  # fmt: skip
GIT_TIMEOUT_S = 10.0
_SEED_FILE = re.compile(r"^seed(\d+)\.json$")

__all__ = ["STUDY_ROOT", "config_hash", "export_cells", "load_study", "stale_cells", "study_cell"]


def config_hash(config: Mapping[str, Any]) -> str:
    """The first 12 hex digits of the sha256 of the canonical JSON of `config` (sorted keys, no spaces)."""
    text = json.dumps(json.loads(dumps(config)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _registry_default_model(method: str) -> str | None:
    from lmlab.registry import get_method

    try:
        fields = {f.name: f for f in dataclasses.fields(get_method(method).config_class())}
    except (KeyError, TypeError):
        return None
    field = fields.get("model")
    return str(field.default) if field is not None and isinstance(field.default, str) else None


def _model_alias(cell: Mapping[str, Any], data: Mapping[str, Any]) -> str:
    """The model alias the cell ran: its grid model, or for ``default`` the model its config names."""
    if cell["model"] != DEFAULT_MODEL:
        return str(cell["model"])
    for candidate in ((data.get("config") or {}).get("model"), (data.get("run_info") or {}).get("model")):
        if isinstance(candidate, str) and candidate and candidate != DEFAULT_MODEL:
            return Path(candidate).name if "/" in candidate else candidate
    return _registry_default_model(cell["method"]) or DEFAULT_MODEL


def study_cell(cell: Mapping[str, Any], data: Mapping[str, Any], *, source: str = "") -> dict[str, Any]:
    """The study record of one grid cell (a `lmlab.grid.cell_record` dict) and its parsed result.json `data`."""
    info = data.get("run_info") or {}
    meta = data.get("meta_info") or {}
    system = meta.get("system_info") or {}
    packages = meta.get("package_info") or {}
    return {
        "schema": SCHEMA,
        "method": cell["method"],
        "area": cell.get("area") or info.get("area", ""),
        "model": _model_alias(cell, data),
        "seed": int(cell["seed"]),
        "preset": info.get("preset"),
        "status": cell["status"],
        "verdict": aggregate_verdict([cell["status"]]),
        "reason": cell.get("reason") or "",
        "claim": (data.get("claim") or {}).get("text", ""),
        "claims": [{k: c.get(k) for k in CLAIM_KEYS} for c in data.get("claims", [])],
        "config_hash": config_hash(data.get("config") or {}),
        "git_commit": meta.get("git_hash") or system.get("git_hash"),
        "git_dirty": system.get("git_dirty"),
        "seconds": info.get("total_time_s"),
        "created_at": info.get("created_at"),
        "machine": {
            "cpu_model": system.get("cpu_model"),
            "avx512": system.get("cpu_avx512"),
            "cpu_count": system.get("cpu_count"),
            "cpu_available": system.get("cpu_available"),
        },
        "loadavg": system.get("loadavg"),
        "lmlab_version": info.get("lmlab_version") or packages.get("lmlab"),
        "source": source,
    }


def export_cells(reproduce_folder: str | Path, study_root: str | Path = STUDY_ROOT) -> list[Path]:
    """Write one small JSON per finished cell (a run that ended, errors included) of a reproduce folder.

    Each goes to ``<study_root>/<method>/<model>/seed<k>.json`` (atomically), replacing an earlier export of the
    same cell; skipped and not-yet-run cells are left out. Returns the files written, in grid order.
    """
    folder = Path(reproduce_folder)
    if not folder.is_dir():
        from lmlab.errors import UsageError

        raise UsageError(f"{str(folder)!r} is not a directory; expected a `lmlab reproduce` folder")
    grid = grid_from_folder(folder)
    root = Path(study_root)
    written: list[Path] = []
    for cell in grid["cells"]:
        if cell["status"] not in RUN_STATUSES or not cell.get("path"):
            continue
        data = load_result(folder / cell["path"])
        if not isinstance(data, dict):
            continue
        record = study_cell(cell, data, source=folder.name)
        path = root / record["method"] / record["model"] / f"seed{record['seed']}.json"
        if path in written:  # e.g. the "default" cell and the same model named in --models: one run is kept
            logger.warning("%s: cell %s is the same cell as one already exported; left out", path, cell["path"])
            continue
        atomic_write_text(path, dumps(record) + "\n")
        written.append(path)
    return written


def _method_rank() -> dict[str, int]:
    from lmlab.registry import list_methods

    return {s.id: i for i, s in enumerate(list_methods())}


def _read_cells(root: Path) -> list[dict[str, Any]]:
    records = []
    if not root.is_dir():
        return records
    for path in sorted(root.glob("*/*/seed*.json")):
        if not _SEED_FILE.match(path.name):
            continue
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            logger.warning("%s: not a readable study cell (%s); left out", path, e)
            continue
        if not isinstance(rec, dict) or rec.get("status") not in RUN_STATUSES:
            logger.warning("%s: not a study cell (no run status); left out", path)
            continue
        rec["_path"] = path.relative_to(root).as_posix()
        records.append(rec)
    return records


def load_study(study_root: str | Path = STUDY_ROOT) -> dict[str, Any]:
    """The study's cells as a grid.json dict (the shape of `lmlab.grid.grid_from_folder`); empty when absent.

    Verdicts and counts come from `lmlab.grid.method_summaries` and `lmlab.grid.grid_counts`. Methods are in
    registry order (unregistered ones after, by name); extra keys: ``presets`` (every preset present) and
    ``study`` (the cells' own records: commit, dirty flag, config hash, machine, ...), keyed by cell path.
    """
    root = Path(study_root)
    records = _read_cells(root)
    rank = _method_rank()
    records.sort(key=lambda r: (rank.get(r["method"], len(rank)), r["method"], r["model"], int(r["seed"])))
    cells, claims, extra = [], {}, {}
    for r in records:
        cells.append({"method": r["method"], "area": r.get("area", ""), "model": r["model"], "seed": int(r["seed"]),
                      "path": r["_path"], "status": r["status"], "reason": r.get("reason", ""),
                      "time_s": r.get("seconds"), "claims": r.get("claims") or []})  # fmt: skip
        claims.setdefault(r["method"], r.get("claim") or "")
        extra[r["_path"]] = {k: v for k, v in r.items() if k not in ("claims", "_path")}
    methods = method_summaries(cells, claims)
    presets = sorted({str(r.get("preset")) for r in records if r.get("preset")})
    return {
        "preset": ", ".join(presets) or "-",
        "presets": presets,
        "seeds": sorted({c["seed"] for c in cells}),
        "models": sorted({c["model"] for c in cells}) or None,
        "cells": cells,
        "methods": methods,
        "counts": grid_counts(cells, methods),
        "study": extra,
    }


# ----------------------------------------------------------------------------------------------------------------
# Staleness


def _changed_since(repo_root: Path, commit: str, pathspec: str) -> bool | str:
    try:
        out = subprocess.run(
            # a README (or other .md) commit re-words a verdict, it changes no number: only code makes a cell stale
            ["git", "log", "--format=%H", f"{commit}..HEAD", "--", pathspec, f":(exclude){pathspec}*.md"],
            cwd=repo_root, capture_output=True, text=True, timeout=GIT_TIMEOUT_S, stdin=subprocess.DEVNULL,
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"},
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if out.returncode != 0:  # not a repository, or a commit this clone does not have
        return "unknown"
    return bool(out.stdout.strip())


def stale_cells(study: Mapping[str, Any], repo_root: str | Path = ".") -> dict[str, bool | str]:
    """Per cell path of `study` (a `load_study` dict): True when its method's folder
    (``src/lmlab/methods/<area>/<method>/``, Markdown files aside: a README written from the cell's run does not
    outdate it) has commits after the cell's commit, False when not, ``"unknown"``
    when git, the repository or the commit is unavailable. Never raises."""
    root = Path(repo_root)
    extra = study.get("study") or {}
    memo: dict[tuple[str, str], bool | str] = {}
    out: dict[str, bool | str] = {}
    for cell in study.get("cells") or []:
        path = cell.get("path") or ""
        commit = (extra.get(path) or {}).get("git_commit")
        if not commit or not re.fullmatch(r"[0-9a-fA-F]{7,64}", str(commit)):
            out[path] = "unknown"
            continue
        pathspec = f"src/lmlab/methods/{cell.get('area')}/{cell['method']}/"
        key = (str(commit), pathspec)
        if key not in memo:
            memo[key] = _changed_since(root, str(commit), pathspec)
        out[path] = memo[key]
    return out


def method_staleness(study: Mapping[str, Any], stale: Mapping[str, bool | str]) -> dict[str, bool | str]:
    """Per method: True when any of its cells is stale, else ``"unknown"`` when any is unknown, else False."""
    by_method: dict[str, list[bool | str]] = {}
    for cell in study.get("cells") or []:
        by_method.setdefault(cell["method"], []).append(stale.get(cell.get("path") or "", "unknown"))
    return {m: True if True in v else "unknown" if "unknown" in v else False for m, v in by_method.items()}


# ----------------------------------------------------------------------------------------------------------------
# Reports without running


def is_reproduce_folder(folder: str | Path) -> bool:
    """Whether `folder` holds a reproduce run (reproduce.json, grid.json or run folders), not study cells."""
    folder = Path(folder)
    if (folder / "reproduce.json").exists() or (folder / "grid.json").exists():
        return True
    return any(folder.glob("*/result.json")) or any(folder.glob("*/*/seed*/result.json"))


def report_from(source: str | Path, out: str | Path) -> tuple[Path, dict[str, Any]]:
    """Write ``grid.json`` and ``report.html`` into `out` from study cells or a reproduce folder; nothing runs.

    Returns (the report.html path, the grid dict).
    """
    from lmlab.errors import UsageError
    from lmlab.grid import write_grid
    from lmlab.report_html import render_report

    source, out = Path(source), Path(out)
    if not source.is_dir():
        raise UsageError(f"--from {str(source)!r} is not a directory; expected results/study or a reproduce folder")
    grid = grid_from_folder(source) if is_reproduce_folder(source) else load_study(source)
    if not grid["cells"]:
        raise UsageError(f"--from {str(source)!r} holds no cells (results/study/<method>/<model>/seed<k>.json)")
    out.mkdir(parents=True, exist_ok=True)
    write_grid(out, {k: v for k, v in grid.items() if k != "study"})
    path = out / "report.html"
    atomic_write_text(path, render_report(grid, source))
    return path, grid
