"""Results: metric rows, claim checks computed from them, and the files a run writes.

A run's numbers live in one place: per-example values recorded by the experiment with `RunContext.record` (see
`lmlab.runner`). Metric rows (mean with a bootstrap CI) and claim checks are both computed from those values, so a
claim's status can only come from numbers this run measured. Paper numbers never enter a check.

`RunResult.write(folder)` writes, atomically (a temporary folder renamed into place):

- ``result.json``: ``schema_version``, ``run_info``, ``config``, ``metrics``, ``claim`` (headline), ``claims`` (all
  checks), ``compute``, ``flags``, ``notes``, ``meta_info``;
- ``metrics.csv``: long format ``method_or_baseline, metric, value, ci_low, ci_high, n, seed``;
- ``samples.jsonl``: per-example inputs, outputs and scores;
- ``config.yaml``: re-runnable with ``lmlab run ID --config config.yaml``;
- the plots (PNG), ``report.md`` and ``report.html``.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
STATUSES = ("supported", "not_supported", "inconclusive")


@dataclass
class MetricRow:
    """One number: `system` (the method or a baseline) x `metric`, with its CI over `n` examples."""

    system: str
    metric: str
    value: float
    ci_low: float | None = None
    ci_high: float | None = None
    n: int = 1
    seed: int | None = None
    unit: str = ""
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Claim:
    """ "`method` beats `baseline` on `metric`" in `direction` (``">"`` higher, ``"<"`` lower) by > `min_effect`.

    Evaluated with `lmlab.core.stats.uncertainty.compare` on the per-example values both systems recorded for `metric`
    (paired by example when `paired`; by cluster when the values were recorded with ``clusters=``). `gate=False`
    marks a check that is reported but does not decide the verdict. `mechanism=True` marks a check that holds by
    construction (a count the algorithm fixes, a guarantee of the method): it shows that the mechanism works, is
    reported under "mechanism checks", and never gates (``gate`` is forced to False).
    """

    metric: str
    method: str
    baseline: str
    direction: str = ">"
    min_effect: float = 0.0
    paired: bool = True
    text: str = ""
    gate: bool = True
    mechanism: bool = False

    def __post_init__(self) -> None:
        if self.direction not in (">", "<"):
            raise ValueError(f"Claim.direction must be '>' or '<', got {self.direction!r}")
        if self.mechanism:
            object.__setattr__(self, "gate", False)


@dataclass
class ClaimResult:
    """A `Claim` checked against measured values."""

    text: str
    metric: str
    method: str
    baseline: str
    direction: str
    min_effect: float
    method_value: float
    baseline_value: float
    observed_effect: float
    ci: tuple[float, float]
    p_value: float | None
    n: int
    status: str
    reason: str
    gate: bool = True
    mechanism: bool = False
    n_values: int | None = None  # values behind `n` when clustered (n counts the independent units)
    null_status: str | None = None  # the status this check gets with the method's values replaced by the baseline's

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ci"] = list(self.ci)
        return d

    @property
    def falsifiable(self) -> bool:
        """Whether the check fails when the method is replaced by its baseline (a rigged check does not)."""
        return self.null_status != "supported"


def evaluate_claim(
    claim: Claim,
    a: Sequence[float],
    b: Sequence[float],
    *,
    seed: int = 0,
    clusters: Sequence[Any] | None = None,
    clusters_b: Sequence[Any] | None = None,
) -> ClaimResult:
    """Check `claim` on the per-example values `a` (method) and `b` (baseline).

    `clusters` (and, unpaired, `clusters_b`) name the independent unit of each value (see
    `lmlab.core.stats.uncertainty`).
    The result also carries `null_status`: the status of the same check with the method's values replaced by the
    baseline's (decided with ``min_n=1``, so small samples do not hide it). A gated check whose `null_status` is
    "supported" holds by construction and cannot fail: the registry battery rejects it.
    """
    from lmlab.core.stats.uncertainty import compare

    a_vals, b_vals = list(map(float, a)), list(map(float, b))
    kw: dict[str, Any] = dict(direction=claim.direction, min_effect=claim.min_effect, paired=claim.paired, seed=seed)
    cmp = compare(a_vals, b_vals, clusters=clusters, clusters_b=None if claim.paired else clusters_b, **kw)
    # the baseline in place of the method: paired, the very values and clusters; unpaired, b against itself
    null_clusters = clusters if claim.paired else clusters_b
    null = compare(b_vals, b_vals, clusters=null_clusters, clusters_b=None if claim.paired else clusters_b, min_n=1,
                   **kw)  # fmt: skip
    n_values = None if clusters is None and clusters_b is None else len(a_vals) + (0 if claim.paired else len(b_vals))
    return claim_result(claim, cmp, null.status, n_values=n_values)


def claim_result(
    claim: Claim, cmp: Any, null_status: str, *, n_values: int | None = None, reason: str | None = None
) -> ClaimResult:
    """The `ClaimResult` of `claim` from its `Comparison` `cmp` (`compare`, or `compare_statistic` for a statistic
    that is not a mean of per-example values) and the status the same check gets with the baseline in the method's
    place. A p-value the comparison does not give (NaN) is None; `reason` replaces ``cmp.reason``."""
    p = cmp.p_value
    return ClaimResult(
        text=claim.text or f"{claim.method} {claim.direction} {claim.baseline} on {claim.metric}",
        metric=claim.metric,
        method=claim.method,
        baseline=claim.baseline,
        direction=claim.direction,
        min_effect=claim.min_effect,
        method_value=cmp.mean_a,
        baseline_value=cmp.mean_b,
        observed_effect=cmp.effect,
        ci=(cmp.ci_low, cmp.ci_high),
        p_value=None if p is None or p != p else p,
        n=cmp.n,
        status=cmp.status,
        reason=cmp.reason if reason is None else reason,
        gate=claim.gate,
        mechanism=claim.mechanism,
        n_values=n_values,
        null_status=null_status,
    )


def combine_statuses(statuses: Sequence[str]) -> str:
    """All supported -> supported; any not_supported -> not_supported; otherwise inconclusive."""
    if not statuses:
        return "inconclusive"
    if all(s == "supported" for s in statuses):
        return "supported"
    if any(s == "not_supported" for s in statuses):
        return "not_supported"
    return "inconclusive"


@dataclass
class RunResult:
    """Everything one run of one method produced."""

    method: str
    run_info: dict[str, Any]
    config: dict[str, Any]
    metrics: list[MetricRow] = field(default_factory=list)
    claims: list[ClaimResult] = field(default_factory=list)
    claim_text: str = ""
    samples: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, bytes] = field(default_factory=dict)  # name -> PNG bytes
    notes: list[str] = field(default_factory=list)
    flags: dict[str, Any] = field(default_factory=dict)
    compute: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def status(self) -> str:
        """The verdict: combined status of the gating claims (``error`` if the run failed)."""
        if self.run_info.get("status") == "error":
            return "error"
        return combine_statuses([c.status for c in self.claims if c.gate])

    @property
    def null_status(self) -> str:
        """The verdict the gating claims would give with every method replaced by its baseline.

        It must not be "supported": a verdict that holds when the method is its own baseline is rigged.
        """
        return combine_statuses([c.null_status or "inconclusive" for c in self.claims if c.gate])

    def metric(self, system: str, metric: str) -> MetricRow:
        for row in self.metrics:
            if row.system == system and row.metric == metric:
                return row
        raise KeyError(f"no metric {metric!r} for {system!r}")

    def headline(self) -> dict[str, Any]:
        """The ``claim`` block of result.json: text, status, and the first gating check's numbers."""
        gating = [c for c in self.claims if c.gate]
        first = gating[0] if gating else None
        return {
            "text": self.claim_text,
            "status": self.status,
            "metric": first.metric if first else None,
            "direction": first.direction if first else None,
            "observed_effect": first.observed_effect if first else None,
            "ci": list(first.ci) if first else None,
            "checks": len(gating),
            "mechanism_checks": sum(1 for c in self.claims if c.mechanism),
            "null_status": self.null_status if gating else None,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "run_info": self.run_info,
            "config": self.config,
            "metrics": [m.to_dict() for m in self.metrics],
            "claim": self.headline(),
            "claims": [c.to_dict() for c in self.claims],
            "compute": self.compute,
            "flags": self.flags,
            "notes": self.notes,
            "tables": self.tables,
            "meta_info": self.meta_info,
        }

    def to_dataframe(self) -> Any:
        """Metric rows as a pandas DataFrame (pandas is optional)."""
        try:
            import pandas as pd
        except ImportError as e:
            raise ImportError("to_dataframe needs pandas: pip install pandas") from e
        return pd.DataFrame([m.to_dict() for m in self.metrics])

    def metrics_csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(["method_or_baseline", "metric", "value", "ci_low", "ci_high", "n", "seed"])
        for m in self.metrics:
            writer.writerow([m.system, m.metric, _num(m.value), _num(m.ci_low), _num(m.ci_high), m.n, m.seed])
        return buf.getvalue()

    def write(self, folder: str | Path, *, plots: bool = True) -> Path:
        """Write all files into `folder` atomically (never overwriting an existing folder); returns it."""
        from lmlab.config import to_yaml_dict
        from lmlab.core.report.reporting import render_run_html, render_run_markdown

        folder = Path(folder)
        if folder.exists():
            raise FileExistsError(f"output folder {str(folder)!r} already exists; runs are never overwritten")
        tmp = folder.with_name(f".{folder.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            tmp.mkdir()
            (tmp / "result.json").write_text(dumps(self.to_json()))
            (tmp / "metrics.csv").write_text(self.metrics_csv())
            (tmp / "samples.jsonl").write_text("".join(json.dumps(_jsonable(s)) + "\n" for s in self.samples))
            (tmp / "config.yaml").write_text(to_yaml_dict(self.config))
            names = {}
            if plots:
                for name, png in self.figures.items():
                    (tmp / f"{name}.png").write_bytes(png)
                    names[name] = f"{name}.png"
            (tmp / "report.md").write_text(render_run_markdown(self, figure_paths=names))
            (tmp / "report.html").write_text(render_run_html(self if plots else _without_figures(self)))
            os.replace(tmp, folder)
        except OSError as e:
            raise write_error(folder, e) from None
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return folder


def write_error(path: str | Path, e: OSError) -> OSError:
    """The one-line `OutputError` for a failed write of `path` (disk full, a parent that is a file, read-only).

    Writes go to a temporary name renamed into place, so the message can promise that earlier results are intact.
    """
    from lmlab.errors import OutputError

    if isinstance(e, OutputError):
        return e
    reason = e.strerror or str(e) or type(e).__name__
    return OutputError(
        f"could not write {str(path)!r}: {reason}; expected a writable folder with free space "
        "(nothing was half-written; earlier results are intact)"
    )


def _without_figures(result: RunResult) -> RunResult:
    from dataclasses import replace

    return replace(result, figures={})


def _num(x: float | None) -> str:
    if x is None:
        return ""
    return repr(float(x))


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else (1e308 if value > 0 else -1e308)
    if hasattr(value, "item") and callable(value.item):
        try:
            return _jsonable(value.item())
        except (ValueError, TypeError):
            pass
    if hasattr(value, "tolist"):
        return _jsonable(value.tolist())
    if isinstance(value, Path):
        return str(value)
    return value


def dumps(obj: Any) -> str:
    return json.dumps(_jsonable(obj), indent=2, sort_keys=False)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to a temporary sibling and rename it over `path`: readers see the old or the new file, never half.

    A failed write (disk full, no permission) removes the temporary file and raises `OutputError` in one line.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise write_error(path, e) from None


def load_result(folder: str | Path) -> dict[str, Any] | None:
    """The parsed result.json of a run folder, or None if absent or unreadable."""
    path = Path(folder) / "result.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def check_output_root(path: str | Path, flag: str = "--out") -> Path:
    """Refuse, before a run starts, an output root that can never be written: a file, or a folder under a file.

    Returns the path. The first existing ancestor must be a folder we may write to; running for minutes and then
    failing to save would waste the run. (Running as root, permission bits do not stop a write; a file in the way
    does.)
    """
    from lmlab.errors import UsageError

    path = Path(path)
    try:
        if path.exists() and not path.is_dir():
            raise UsageError(f"{flag} {str(path)!r} is a file; expected a folder (existing or to be created)")
        ancestor = path
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
    except OSError as e:  # a name too long for the file system
        shown = str(path) if len(str(path)) <= 120 else f"{str(path)[:120]}... ({len(str(path))} characters)"
        raise UsageError(f"{flag} {shown!r} cannot be used ({e.strerror}); expected a folder path") from None
    if ancestor.exists() and not ancestor.is_dir():
        raise UsageError(f"{flag} {str(path)!r} lies under the file {str(ancestor)!r}; expected a folder path")
    if ancestor.exists() and not os.access(ancestor, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {str(path)!r}: {str(ancestor)!r} is not writable; expected a writable folder")
    return path
