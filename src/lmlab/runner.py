"""Running one method: `run_method` (one method, one seed) and the `RunContext` its experiment works through.

A grid of methods x seeds x models with one report is `lmlab.reproduce` (above this module and `lmlab.grid`).

An experiment is ``run(cfg, ctx) -> RunResult``. It gets its data and models through the `RunContext`, records
per-example values for the method and every baseline with `ctx.record`, and ends with
``return ctx.finish(claims=[...])``: the claim checks are evaluated there, on the recorded values.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
import traceback
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lmlab.config import build_config, load_config_file, parse_sets
from lmlab.registry import MethodSpec, get_method
from lmlab.results import Claim, MetricRow, RunResult, evaluate_claim

logger = logging.getLogger("lmlab")


def progress_enabled(flag: bool | None = None) -> bool:
    if flag is not None:
        return flag
    if os.environ.get("LMLAB_NO_PROGRESS") == "1":
        return False
    import sys

    return sys.stderr.isatty()


class RunContext:
    """What an experiment uses to load models and data and to record what it measured.

    Attributes:
        spec (`MethodSpec`): the method being run.
        cfg: the resolved config dataclass.
        preset (`str`): ``smoke``, ``quick`` or ``default``.
        meter (`ComputeMeter`): shared compute counters; pass it to generation/scoring calls.
        budget (`BudgetGuard`): the preset's time budget; ``budget.check(what)`` raises when spent.
        log (`logging.Logger`): the method's logger.
    """

    def __init__(self, spec: MethodSpec, cfg: Any, *, preset: str = "default", show_progress: bool | None = None):
        from lmlab.core.inference.compute import ComputeMeter
        from lmlab.core.stats.timing import BudgetGuard

        self.spec = spec
        self.cfg = cfg
        self.preset = preset
        self.meter = ComputeMeter()
        self.budget = BudgetGuard(spec.budget(preset))
        self.log = logging.getLogger(f"lmlab.methods.{spec.id}")
        self.show_progress = progress_enabled(show_progress)
        self._values: dict[tuple[str, str], list[float]] = {}
        self._clusters: dict[tuple[str, str], list[Any]] = {}
        self.metrics: list[MetricRow] = []
        self.samples: list[dict[str, Any]] = []
        self.figures: dict[str, bytes] = {}
        self.notes: list[str] = []
        self.flags: dict[str, Any] = {}
        self.tables: dict[str, list[dict[str, Any]]] = {}
        self.models: dict[str, dict[str, Any]] = {}
        self.data_info: dict[str, Any] = {}

    # -- inputs ---------------------------------------------------------------------------------------------------

    def load_model(self, spec: str | None = None, **kwargs: Any) -> tuple[Any, Any]:
        """``(model, tokenizer)`` for `spec` (default ``cfg.model``) with the config's dtype and device."""
        from lmlab.core.inference.models import load_model, model_info

        name = spec or self.cfg.model
        model, tokenizer = load_model(name, dtype=self.cfg.dtype, device=self.cfg.device, **kwargs)
        self.models[name] = model_info(model)
        return model, tokenizer

    def data(self, suite: str, n: int | None, *, split: str = "test", **kwargs: Any) -> list[Any]:
        """Examples of `suite` seeded by ``cfg.seed``; ``cfg.limit`` caps `n`."""
        from lmlab import data

        if self.cfg.limit is not None:
            n = self.cfg.limit if n is None else min(n, self.cfg.limit)
        examples = data.load(suite, n, seed=self.cfg.seed, split=split, **kwargs)
        self.data_info[f"{suite}/{split}"] = {"n": len(examples), "seed": self.cfg.seed, "kwargs": kwargs}
        return examples

    def progress(self, iterable: Iterable[Any], desc: str, total: int | None = None) -> Iterable[Any]:
        """A tqdm bar on stderr (off when stderr is not a TTY, with --no-progress or LMLAB_NO_PROGRESS=1)."""
        if not self.show_progress:
            return iterable
        from tqdm import tqdm

        return tqdm(iterable, desc=f"{self.spec.id}: {desc}", total=total, leave=False)

    # -- outputs --------------------------------------------------------------------------------------------------

    def record(
        self,
        system: str,
        metric: str,
        values: Sequence[float],
        *,
        clusters: Sequence[Any] | None = None,
        unit: str = "",
        note: str = "",
    ) -> MetricRow:
        """Per-example `values` of `metric` for `system`: stored for claims, summarised as mean + bootstrap CI.

        `clusters`: the independent unit each value belongs to (a prompt id, a document, a seed, a client), one id
        per value, when several values come from one unit (decode steps of one prompt, positions of one window,
        windows of one seed). The CI is then a cluster bootstrap and the row's ``n`` counts clusters; claims on this
        metric resample the same clusters. Values of one system and metric are recorded once.
        """
        from lmlab.core.stats.seeding import derive_seed
        from lmlab.core.stats.uncertainty import cluster_codes, mean_ci

        vals = [float(v) for v in values]
        if not vals:
            raise ValueError(f"no values recorded for {system}/{metric}")
        if (system, metric) in self._values:
            raise ValueError(f"{system}/{metric} was already recorded")
        ids = None
        if clusters is not None:
            ids = [c.item() if hasattr(c, "item") else c for c in clusters]  # numpy scalars -> python, json-able
            cluster_codes(ids, len(vals), f"clusters of {system}/{metric}")
        self._values[(system, metric)] = vals
        if ids is not None:
            self._clusters[(system, metric)] = ids
        est = mean_ci(vals, seed=derive_seed(self.cfg.seed, system, metric), clusters=ids)
        row = MetricRow(system, metric, est.value, est.ci_low, est.ci_high, est.n, self.cfg.seed, unit, note)
        self.metrics.append(row)
        return row

    def record_value(self, system: str, metric: str, value: float, *, unit: str = "", note: str = "") -> MetricRow:
        """A single number without a CI (a setting, a total, a fitted constant)."""
        row = MetricRow(system, metric, float(value), None, None, 1, self.cfg.seed, unit, note)
        self.metrics.append(row)
        return row

    def values(self, system: str, metric: str) -> list[float]:
        try:
            return self._values[(system, metric)]
        except KeyError:
            raise KeyError(f"nothing recorded for system {system!r}, metric {metric!r}") from None

    def has(self, system: str, metric: str) -> bool:
        """Whether anything was recorded for `system` / `metric`."""
        return (system, metric) in self._values

    def clusters(self, system: str, metric: str) -> list[Any] | None:
        """The cluster ids recorded with `system` / `metric`, or None when each value is its own unit."""
        self.values(system, metric)
        return self._clusters.get((system, metric))

    def _claim_clusters(self, claim: Claim) -> tuple[list[Any] | None, list[Any] | None]:
        ca, cb = self.clusters(claim.method, claim.metric), self.clusters(claim.baseline, claim.metric)
        if claim.paired and ca != cb:
            if ca is None or cb is None:
                raise ValueError(
                    f"claim {claim.method} vs {claim.baseline} on {claim.metric!r}: only "
                    f"{claim.method if ca is not None else claim.baseline} was recorded with clusters; paired values "
                    "must share the same cluster ids"
                )
            raise ValueError(
                f"claim {claim.method} vs {claim.baseline} on {claim.metric!r}: the two systems were recorded with "
                "different cluster ids; paired values must share the same ids in the same order"
            )
        return ca, cb

    def add_samples(self, records: Iterable[Mapping[str, Any]]) -> None:
        self.samples.extend(dict(r) for r in records)

    def add_figure(self, name: str, png: bytes) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"figure name {name!r} must be a plain file stem")
        self.figures[name] = png

    def note(self, text: str) -> None:
        self.notes.append(text)

    def flag(self, key: str, value: Any) -> None:
        self.flags[key] = value

    def table(self, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        self.tables[name] = [dict(r) for r in rows]

    def finish(self, claims: Sequence[Claim], *, text: str | None = None) -> RunResult:
        """Evaluate `claims` on the recorded values and assemble the `RunResult`."""
        from lmlab.core.stats.seeding import derive_seed

        results = []
        for claim in claims:
            a = self.values(claim.method, claim.metric)
            b = self.values(claim.baseline, claim.metric)
            seed = derive_seed(self.cfg.seed, "claim", claim.method, claim.baseline, claim.metric)
            clusters, clusters_b = self._claim_clusters(claim)
            results.append(evaluate_claim(claim, a, b, seed=seed, clusters=clusters, clusters_b=clusters_b))
        return RunResult(
            method=self.spec.id,
            run_info={},
            config=asdict(self.cfg),
            metrics=list(self.metrics),
            claims=results,
            claim_text=text or self.spec.claim,
            samples=list(self.samples),
            figures=dict(self.figures),
            notes=list(self.notes),
            flags=dict(self.flags),
            tables=dict(self.tables),
        )


# ----------------------------------------------------------------------------------------------------------------


def resolve_config(
    spec: MethodSpec,
    *,
    preset: str = "default",
    config_file: str | Path | None = None,
    sets: Sequence[str] = (),
    overrides: Mapping[str, Any] | None = None,
) -> Any:
    """The method's config: defaults < preset < file < --set < overrides (see `lmlab.config`)."""
    if preset not in ("smoke", "quick", "default"):
        raise ValueError(f"preset must be one of smoke, quick, default, got {preset!r}")
    cls = spec.config_class()
    layers: list[Mapping[str, Any]] = [spec.presets.get(preset, {})]
    if config_file is not None:
        layers.append(load_config_file(config_file))
    layers.append(parse_sets(sets))
    layers.append({k: v for k, v in (overrides or {}).items() if v is not None})
    return build_config(cls, *layers)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(text).name if "/" in text else text).strip("-")[:40] or "model"


def run_method(
    method_id: str,
    *,
    preset: str = "default",
    config_file: str | Path | None = None,
    sets: Sequence[str] = (),
    out: str | Path | None = None,
    folder: str | Path | None = None,
    write: bool = True,
    plots: bool = True,
    show_progress: bool | None = None,
    raise_errors: bool = False,
    engine: str | None = None,
    **overrides: Any,
) -> RunResult:
    """Run one method once and (by default) write its folder.

    Args:
        method_id (`str`): a registered id (``lmlab list``).
        preset (`str`, defaults to ``"default"``): ``smoke``, ``quick`` or ``default``.
        config_file: YAML/JSON overrides; sets: ``key=value`` strings; overrides: field values (e.g. ``model=...``).
        out: root folder (default ``cfg.output_dir``); the run goes to ``<out>/<id>/<time>_<model>_s<seed>/``.
        folder: exact folder to write (used by `reproduce`); overrides `out`.
        write (`bool`): write files; plots (`bool`): include PNGs.
        raise_errors (`bool`): re-raise an exception from the experiment instead of recording it.
        engine (`str`, *optional*): decode engine for this run (``fast``, ``fast-int4``, ``hf``; see
            `lmlab.core.inference.generation`); None keeps the process default (``fast`` where the model supports it).
    """
    from lmlab.core.inference import engine as engines
    from lmlab.core.inference.models import parse_device
    from lmlab.core.inference.precision import compute
    from lmlab.core.report.envinfo import env_info
    from lmlab.core.stats.seeding import set_seed, set_threads
    from lmlab.version import __version__

    spec = get_method(method_id)
    missing = spec.missing_requirements()
    if missing:
        raise ImportError(f"method {spec.id} needs {', '.join(missing)}: pip install {' '.join(missing)}")
    cfg = resolve_config(spec, preset=preset, config_file=config_file, sets=sets, overrides=overrides)
    from lmlab.core.inference.models import resolve_model

    resolve_model(cfg.model)  # a bad --model is a usage error, reported before anything runs
    if write:  # an output root that can never be written is refused now, not after minutes of running
        from lmlab.results import check_output_root

        check_output_root(Path(folder).parent if folder is not None else Path(out or cfg.output_dir))
    set_seed(cfg.seed)
    if cfg.threads is not None:
        set_threads(cfg.threads)
    previous_engine = engines._DEFAULT[-1] if engines._DEFAULT else None
    if engine is not None:
        engines.set_default_engine(engine)
    engine_used = engines.default_engine()
    ctx = RunContext(spec, cfg, preset=preset, show_progress=show_progress)
    created = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    t0 = time.perf_counter()
    error = None
    try:
        with compute(cfg.compute_dtype, device_type=parse_device(cfg.device).split(":")[0]):
            result = spec.run_function()(cfg, ctx)
        if not isinstance(result, RunResult):
            raise TypeError(f"{spec.run} returned {type(result).__name__}, expected RunResult (use ctx.finish)")
    except Exception as e:  # a failed run is still a result: recorded, reported, never silently dropped
        if raise_errors:
            raise
        error = f"{type(e).__name__}: {e}"
        # the CLI's formatter shows the first line only, outside --debug
        logger.error("%s failed: %s\n%s", spec.id, error, traceback.format_exc())
        result = ctx.finish([])
    finally:
        if engine is not None:
            engines.set_default_engine(previous_engine)
    total = time.perf_counter() - t0
    budget = spec.budget(preset)
    result.run_info = {
        "method": spec.id,
        "name": spec.name,
        "area": spec.area,
        "paper": spec.paper,
        "paper_url": spec.paper_url,
        "created_at": created,
        "total_time_s": round(total, 2),
        "preset": preset,
        "seed": cfg.seed,
        "budget_s": budget,
        "within_budget": total <= budget,
        "status": "error" if error else "ok",
        "error": error,
        "lmlab_version": __version__,
        "engine": engine_used,
        "compute_dtype": cfg.compute_dtype,
    }
    result.compute = ctx.meter.to_dict()
    env = env_info()
    package_keys = ("lmlab", "torch", "transformers", "numpy", "scipy", "model_packages")
    result.meta_info = {
        "models": ctx.models,
        "data": ctx.data_info,
        "package_info": {k: env.get(k) for k in package_keys},
        "system_info": {k: v for k, v in env.items() if k not in package_keys},
        "git_hash": env.get("git_hash"),
    }
    if write:
        if folder is None:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            root = Path(out or cfg.output_dir)
            base = root / spec.id / f"{stamp}_{_slug(cfg.model)}_s{cfg.seed}"
            folder, k = base, 1
            while Path(folder).exists():
                folder, k = base.with_name(f"{base.name}-{k}"), k + 1
        result.run_info["folder"] = str(folder)
        result.write(folder, plots=plots)
    return result


# ----------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' progress bars and info logs during a run."""
    try:
        from transformers.utils import logging as hf_logging

        previous = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        yield
        return
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous)
