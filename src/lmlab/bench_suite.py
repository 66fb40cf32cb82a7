"""`lmlab bench suite`: one registry-driven benchmark suite (core rows, plus rows methods declare beside their code).

A *benchmark* (`Benchmark`) is a method callable and, usually, a baseline callable run on the same state. The suite
runs them interleaved in one process (round r runs the pair in the order rotated by r, so neither side always runs
first on a warm or a cold cache), after one untimed warm-up call each, and reports per side the median wall time
(and the median of every number the callables return), and per pair of calls the ratio baseline / method: the
reported ``speedup`` is the *median of the per-pair ratios* (both calls of a pair saw the same machine state), not
the ratio of the medians. Every figure in the output was measured in the same run; nothing is carried over from
elsewhere.

Rows:

- core rows, always present: ``core.matmul`` (square GEMM fp32 vs bf16, GFLOP/s), ``core.model_load``
  (transformers dequantizing the GGUF file vs `lmlab.core.inference.models.load_model` from the verified cache;
  skipped for a model without a GGUF file), ``core.decode`` (lmlab vs transformers vs llama.cpp: a small
  `lmlab.bench_decode.bench_decode`), ``core.prefill`` (prefill tokens/s beside the compute roofline: the fp32 GEMM
  FLOP/s measured in this run over 2 * `flop_params` FLOPs per token), ``core.prefill_bf16`` (prefill under
  `lmlab.core.inference.precision.compute` fp32 vs bf16, with `check_cost`'s KL / top-1 agreement on held-out
  corpus text), ``core.train_step_bf16`` (one AdamW step of the top blocks over a cached frozen trunk, fp32 vs bf16);
- method rows: every registered method whose package has a ``bench`` module exposing ``BENCHMARKS`` (a list of
  `Benchmark`); their ids are ``<method id>.<name>``. A package without one has no rows.

Contention follows `lmlab.bench_decode`'s rule (its constants): a row is contended when other processes used more
than `CONTENDED_OTHER_CORES` cores during it (``/proc/stat`` minus this process's CPU time) or when the 1-minute
load before it was `CONTENDED_LOAD_BEFORE` or more. The load averages before / after each row are recorded.
Publish only rows whose ``contended`` is false.

Output: ``<out>/results.json`` and ``report.md`` (each written atomically); the default folder is
``runs/bench/<time>/``.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lmlab.bench_decode import (
    CONTENDED_LOAD_BEFORE,
    CONTENDED_OTHER_CORES,
    _cpu_busy_s,
    _own_cpu_s,
    check_out_dir,
    read_bandwidth,
)
from lmlab.errors import UsageError
from lmlab.results import atomic_write_text, dumps

__all__ = [
    "Benchmark",
    "Skip",
    "SuiteContext",
    "CORE_BENCHMARKS",
    "contention_reasons",
    "discover",
    "format_report",
    "paired_ratio",
    "run_benchmark",
    "run_suite",
    "select",
    "write_reports",
]


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One row of the suite.

    Args:
        name (`str`): the row's name; a method row's id is ``<method id>.<name>``.
        fn (`Callable`): the timed method call, ``fn(state) -> dict | None``; a returned dict of numbers (FLOPs,
            accuracy, tokens) is reported per side as medians and, where the baseline returns the same key, as the
            median of per-pair ratios method / baseline. With ``custom=True``: ``fn(ctx) -> dict``, the whole row
            (for benches with their own interleaving, e.g. `bench_decode`), not timed by the suite.
        baseline (`Callable`, *optional*): the timed baseline call, ``baseline(state) -> dict | None``.
        setup (`Callable`, *optional*): ``setup(ctx) -> state``, untimed (model loads, pruning, prompts); raise
            `Skip` when the row does not apply.
        check (`Callable`, *optional*): ``check(state) -> dict``, run once after the timed rounds, untimed (an
            accuracy check of the method against the baseline on the same state); recorded as the row's ``check``.
        rounds (`int`, defaults to 5): timed rounds (each one call of each side), unless the suite sets its own.
        description (`str`): what the row compares, shown in the report.
        method_name / baseline_name (`str`): labels of the two sides.
        ceiling (`str`): what the method's ceiling is (e.g. "compute roofline"), when its numbers report one.
    """

    name: str
    fn: Callable[[Any], dict[str, Any] | None]
    baseline: Callable[[Any], dict[str, Any] | None] | None = None
    setup: Callable[[SuiteContext], Any] | None = None
    check: Callable[[Any], dict[str, Any]] | None = None
    rounds: int = 5
    description: str = ""
    method_name: str = "method"
    baseline_name: str = "baseline"
    ceiling: str = ""
    custom: bool = False


@dataclasses.dataclass
class SuiteContext:
    """What a benchmark's setup sees: the suite's model, its --rounds, and numbers measured earlier this run.

    ``measured`` holds e.g. ``gemm_gflops_fp32`` once ``core.matmul`` has run, so a later row (prefill, a method's
    ceiling) divides by the machine's own figure of the same run.
    """

    model: str = "smollm2-135m"
    rounds: int | None = None
    measured: dict[str, float] = dataclasses.field(default_factory=dict)
    log: Callable[[str], None] = print


class Skip(Exception):
    """Raised by a setup when the row does not apply here (no GGUF, no optional package): recorded, not an error."""


# ----------------------------------------------------------------------------------------------------------------
# statistics and contention


def _loadavg() -> tuple[float, float, float]:
    """The 1 / 5 / 15-minute load averages (its own function so tests can stand in for the machine)."""
    return os.getloadavg()


def paired_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """Median over pairs i of ``numerators[i] / denominators[i]`` (both sides of a pair ran back to back)."""
    if len(numerators) != len(denominators):
        raise ValueError(f"paired_ratio needs as many numerators as denominators, got {len(numerators)} and "
                         f"{len(denominators)}")  # fmt: skip
    ratios = [a / b for a, b in zip(numerators, denominators) if b and not math.isnan(a) and not math.isnan(b)]
    return statistics.median(ratios) if ratios else math.nan


def contention_reasons(load_before: Sequence[float], other_cores: float | None) -> list[str]:
    """`lmlab.bench_decode`'s contention rule: why a timed stretch is contended (empty: it is not)."""
    reasons = []
    if other_cores is not None and other_cores > CONTENDED_OTHER_CORES:
        reasons.append(f"other processes used {other_cores:.2f} cores during the row (> {CONTENDED_OTHER_CORES})")
    if load_before[0] >= CONTENDED_LOAD_BEFORE:
        reasons.append(f"1-minute load {load_before[0]:.2f} before the row (>= {CONTENDED_LOAD_BEFORE})")
    return reasons


def _numbers(d: dict[str, Any] | None) -> dict[str, float]:
    return {k: float(v) for k, v in (d or {}).items() if isinstance(v, int | float) and not isinstance(v, bool)}


def run_benchmark(bench: Benchmark, ctx: SuiteContext, *, row_id: str | None = None) -> dict[str, Any]:
    """Run one row (see the module docstring) and return its JSON-able record."""
    row_id = row_id or bench.name
    load_before = _loadavg()
    busy0, own0, wall0 = _cpu_busy_s(), _own_cpu_s(), time.perf_counter()
    row: dict[str, Any] = {"id": row_id, "description": bench.description, "ceiling": bench.ceiling or None}
    if bench.custom:
        row.update(bench.fn(ctx) or {})
    else:
        state = bench.setup(ctx) if bench.setup is not None else None
        sides: list[tuple[str, Callable]] = [(bench.method_name, bench.fn)]
        if bench.baseline is not None:
            sides.insert(0, (bench.baseline_name, bench.baseline))
        for _, call in sides:  # untimed warm-up: lazy init, allocator, caches
            call(state)
        rounds = ctx.rounds or bench.rounds
        walls: dict[str, list[float]] = {n: [] for n, _ in sides}
        extras: dict[str, list[dict[str, float]]] = {n: [] for n, _ in sides}
        orders = []
        for r in range(rounds):
            order = sides[r % len(sides) :] + sides[: r % len(sides)]
            orders.append([n for n, _ in order])
            for name, call in order:
                t0 = time.perf_counter()
                out = call(state)
                walls[name].append(time.perf_counter() - t0)
                extras[name].append(_numbers(out))
        row["rounds"] = rounds
        row["orders"] = orders
        row["sides"] = {}
        for name, _ in sides:
            keys = sorted({k for e in extras[name] for k in e})
            row["sides"][name] = {
                "wall_s": walls[name],
                "median_wall_s": statistics.median(walls[name]),
                "medians": {k: statistics.median([e[k] for e in extras[name] if k in e]) for k in keys},
            }
        if bench.baseline is not None:
            m, b = bench.method_name, bench.baseline_name
            row["speedup"] = paired_ratio(walls[b], walls[m])  # baseline wall / method wall, per pair
            shared = sorted(set.intersection(*[set(e) for e in extras[m] + extras[b]]))
            row["ratios"] = {  # method / baseline, per pair
                k: paired_ratio([e[k] for e in extras[m]], [e[k] for e in extras[b]]) for k in shared
            }
        if bench.check is not None:
            row["check"] = bench.check(state)
    busy1, own1, wall1 = _cpu_busy_s(), _own_cpu_s(), time.perf_counter()
    other = None
    if busy0 is not None and busy1 is not None and wall1 > wall0:
        other = max(0.0, ((busy1 - busy0) - (own1 - own0)) / (wall1 - wall0))
    reasons = contention_reasons(load_before, other) + list(row.get("contention_reasons") or [])
    row.update({
        "loadavg_before": list(load_before),
        "loadavg_after": list(_loadavg()),
        "other_processes_cores": other,
        "contended": bool(reasons) or bool(row.get("contended")),
        "contention_reasons": reasons,
        "seconds": wall1 - wall0,
    })  # fmt: skip
    return row


# ----------------------------------------------------------------------------------------------------------------
# core rows

GEMM_N = 1024
GEMM_REPEATS = 5
PREFILL_TOKENS = 256
TRAIN_K, TRAIN_BATCH, TRAIN_SEQ = 4, 8, 128


def _matmul_setup(ctx: SuiteContext) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    a32, b32 = torch.randn(GEMM_N, GEMM_N, generator=g), torch.randn(GEMM_N, GEMM_N, generator=g)
    return {"n": GEMM_N, "fp32": (a32, b32), "bf16": (a32.bfloat16(), b32.bfloat16())}


def _gemm(dtype: str) -> Callable[[dict[str, Any]], dict[str, float]]:
    def call(state: dict[str, Any]) -> dict[str, float]:
        a, b = state[dtype]
        t0 = time.perf_counter()
        for _ in range(GEMM_REPEATS):
            a @ b
        dt = (time.perf_counter() - t0) / GEMM_REPEATS
        return {"gflops": 2 * state["n"] ** 3 / dt / 1e9}

    return call


def _gemm_gflops_fp32() -> float:
    """The fp32 GEMM rate, measured now (for a row that needs it when ``core.matmul`` did not run first)."""
    state, call = _matmul_setup(SuiteContext()), _gemm("fp32")
    call(state)  # warm-up
    return statistics.median(call(state)["gflops"] for _ in range(3))


def _load_setup(ctx: SuiteContext) -> dict[str, Any]:
    from lmlab.core.inference.engine import gguf_source
    from lmlab.core.inference.models import cached_folder, load_model

    model, _ = load_model(ctx.model)
    gguf = gguf_source(model)
    if gguf is None:
        raise Skip(f"{ctx.model} has no GGUF file (nothing to compare the cache with)")
    cached_folder(ctx.model)  # built once, outside the timing
    return {"gguf": Path(gguf), "spec": ctx.model}


def _load_gguf(state: dict[str, Any]) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    gguf = state["gguf"]
    AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)


def _load_cache(state: dict[str, Any]) -> None:
    from lmlab.core.inference.models import load_model

    load_model(state["spec"], fresh=True)


def _decode_row(ctx: SuiteContext) -> dict[str, Any]:
    from lmlab.bench_decode import bench_decode
    from lmlab.runner import quiet_transformers

    cands = ("lmlab-int4", "lmlab-fp32", "hf-fp32", "llama.cpp")
    with quiet_transformers():
        rep = bench_decode(ctx.model, candidates=cands, n_prompts=2, prompt_tokens=32, new_tokens=16,
                           rounds=ctx.rounds or 3, exactness=False, log=ctx.log)  # fmt: skip
    keep = ("decode_tok_s", "step_ms", "prefill_tok_s", "speedup_vs_hf_fp32", "fraction_of_llama_cpp",
            "fraction_of_bandwidth_floor")  # fmt: skip
    return {
        "candidates": {n: {k: r.get(k) for k in keep} for n, r in rep["results"].items()},
        "read_bandwidth_gb_s": rep["read_bandwidth_gb_s"],
        "contended": rep["contended"],
        "contention_reasons": rep["contention_reasons"],
        "notes": rep["notes"],
    }


def _prefill_ids(model: Any, n: int) -> Any:
    import torch

    n = min(n, getattr(model.config, "max_position_embeddings", n))
    return torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(0))


def _prefill_setup(ctx: SuiteContext) -> dict[str, Any]:
    from lmlab.core.inference.models import flop_params, load_model

    model, _ = load_model(ctx.model)
    if "gemm_gflops_fp32" not in ctx.measured:  # e.g. --only core.prefill: measure the GEMM rate here
        ctx.measured["gemm_gflops_fp32"] = _gemm_gflops_fp32()
    return {"model": model, "ids": _prefill_ids(model, PREFILL_TOKENS), "flops_per_token": 2 * flop_params(model),
            "gflops": ctx.measured["gemm_gflops_fp32"]}  # fmt: skip


def _prefill(state: dict[str, Any]) -> dict[str, float]:
    import torch

    n = state["ids"].shape[1]
    with torch.inference_mode():
        t0 = time.perf_counter()
        state["model"](input_ids=state["ids"], use_cache=False)
        dt = time.perf_counter() - t0
    roofline = state["gflops"] * 1e9 / state["flops_per_token"]  # tokens/s if every FLOP ran at GEMM speed
    return {"prefill_tok_s": n / dt, "roofline_tok_s": roofline, "fraction_of_roofline": n / dt / roofline}


def _precision_prefill_setup(ctx: SuiteContext) -> dict[str, Any]:
    from lmlab.core.inference.models import load_model

    model, tok = load_model(ctx.model)
    return {"model": model, "tokenizer": tok, "ids": _prefill_ids(model, PREFILL_TOKENS)}


def _precision_prefill(dtype: str) -> Callable[[dict[str, Any]], dict[str, float]]:
    def call(state: dict[str, Any]) -> dict[str, float]:
        import torch

        from lmlab.core.inference.precision import compute

        n = state["ids"].shape[1]
        t0 = time.perf_counter()
        with torch.inference_mode(), compute(dtype):
            state["model"](input_ids=state["ids"], use_cache=False, logits_to_keep=1)
        return {"prefill_tok_s": n / (time.perf_counter() - t0)}

    return call


def _precision_prefill_check(state: dict[str, Any]) -> dict[str, Any]:
    """`check_cost` on held-out corpus passages (the corpus ``test`` split), two 128-token windows."""
    from lmlab.core.inference.precision import check_cost
    from lmlab.core.training.pretrain import encode_documents
    from lmlab.data.corpus import generate as corpus

    ids = encode_documents(state["tokenizer"], [ex.prompt for ex in corpus(4, seed=0, split="test")])
    seq_len = min(128, state["ids"].shape[1], len(ids) // 2)
    return check_cost(state["model"], ids, seq_len=seq_len, n_windows=2)


def _train_setup(ctx: SuiteContext) -> dict[str, Any]:
    import torch

    from lmlab.core.inference.models import load_model
    from lmlab.core.training.partial import FrozenTrunk

    model, _ = load_model(ctx.model)
    n = min(TRAIN_SEQ, getattr(model.config, "max_position_embeddings", TRAIN_SEQ))
    ids = torch.randint(0, model.config.vocab_size, (TRAIN_BATCH, n), generator=torch.Generator().manual_seed(0))
    trunk = FrozenTrunk(model, k=min(TRAIN_K, model.config.num_hidden_layers))
    state: dict[str, Any] = {"cache": trunk(ids), "tokens": TRAIN_BATCH * n}
    for dtype in ("float32", "bfloat16"):  # one trainable copy and optimizer per side
        policy = trunk.top_k()
        state[dtype] = (policy, torch.optim.AdamW(list(policy.trainable_parameters()), lr=1e-5))
    return state


def _train_step(dtype: str) -> Callable[[dict[str, Any]], dict[str, float]]:
    def call(state: dict[str, Any]) -> dict[str, float]:
        from lmlab.core.inference.precision import compute
        from lmlab.core.training.partial import token_logps_from_cache

        policy, opt = state[dtype]
        t0 = time.perf_counter()
        with compute(dtype):
            loss = -token_logps_from_cache(policy, state["cache"]).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
        opt.step()
        return {"train_tok_s": state["tokens"] / (time.perf_counter() - t0), "loss": float(loss.detach())}

    return call


CORE_BENCHMARKS: list[Benchmark] = [
    Benchmark("core.matmul", _gemm("bf16"), baseline=_gemm("fp32"), setup=_matmul_setup, rounds=3,
              method_name="bf16", baseline_name="fp32",
              description=f"square {GEMM_N}^3 GEMM GFLOP/s, bf16 vs fp32"),
    Benchmark("core.model_load", _load_cache, baseline=_load_gguf, setup=_load_setup, rounds=3,
              method_name="verified cache", baseline_name="GGUF",
              description="load the model: transformers dequantizing the GGUF vs load_model from the verified cache"),
    Benchmark("core.decode", _decode_row, custom=True,
              description="decode lmlab vs transformers vs llama.cpp (bench_decode, small setting)"),
    Benchmark("core.prefill", _prefill, setup=_prefill_setup, rounds=3, method_name="prefill",
              ceiling="compute roofline: fp32 GEMM FLOP/s measured this run / (2 * flop_params) FLOPs per token",
              description=f"one {PREFILL_TOKENS}-token prefill forward, tokens/s beside the compute roofline"),
    Benchmark("core.prefill_bf16", _precision_prefill("bfloat16"), baseline=_precision_prefill("float32"),
              setup=_precision_prefill_setup, check=_precision_prefill_check, rounds=3,
              method_name="bf16", baseline_name="fp32",
              description=f"one {PREFILL_TOKENS}-token prefill forward, compute_dtype bfloat16 (autocast) vs float32; "
                          "check: KL(fp32 || bf16) and top-1 agreement on held-out corpus text"),
    Benchmark("core.train_step_bf16", _train_step("bfloat16"), baseline=_train_step("float32"), setup=_train_setup,
              rounds=3, method_name="bf16", baseline_name="fp32",
              description=f"one AdamW step of the top {TRAIN_K} blocks over a cached frozen trunk "
                          f"({TRAIN_BATCH}x{TRAIN_SEQ} tokens), compute_dtype bfloat16 vs float32"),
]  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# registry


def discover() -> dict[str, Benchmark]:
    """Every row: the core rows, then ``<spec.module>.bench.BENCHMARKS`` of every registered method (id-prefixed)."""
    from lmlab.registry import list_methods

    rows = {b.name: b for b in CORE_BENCHMARKS}
    for spec in list_methods():
        try:
            mod = importlib.import_module(f"{spec.module}.bench")
        except ModuleNotFoundError as e:
            if e.name != f"{spec.module}.bench":
                raise  # the bench exists but imports something missing: a bug, not "no benches"
            continue
        for b in getattr(mod, "BENCHMARKS", ()):
            rows[f"{spec.id}.{b.name}"] = b
    return rows


def select(rows: dict[str, Benchmark], only: Sequence[str] | None) -> list[str]:
    """The row ids `only` names: an exact id, or a prefix up to a dot (``core``, ``wanda``). Unknown -> UsageError."""
    if not only:
        return list(rows)
    chosen: list[str] = []
    for want in only:
        hit = [i for i in rows if i == want or i.startswith(want + ".")]
        if not hit:
            raise UsageError(f"--only: unknown benchmark {want!r}; known: {', '.join(rows)}")
        chosen.extend(h for h in hit if h not in chosen)
    return chosen


def default_out_dir() -> Path:
    return Path("runs") / "bench" / time.strftime("%Y%m%d-%H%M%S")


def run_suite(
    only: Sequence[str] | None = None,
    *,
    rounds: int | None = None,
    out: str | Path | None = None,
    model: str = "smollm2-135m",
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the selected rows (all by default) and write results.json and report.md into `out`.

    Args:
        only: row ids or prefixes (see `select`); rounds: timed rounds of every row (default: each row's own).
        out: the results folder (default ``runs/bench/<time>/``), checked before anything runs.
        model: the model of the model rows.

    Returns the JSON-able report. A row whose setup raises `Skip` is recorded as skipped; one that fails records
    its error (one line) and the suite goes on.
    """
    import torch

    if rounds is not None and rounds < 1:
        raise UsageError(f"--rounds must be >= 1, got {rounds}")
    rows = discover()
    ids = select(rows, only)
    try:
        folder = check_out_dir(out if out is not None else default_out_dir())
    except ValueError as e:
        raise UsageError(str(e)) from None
    ctx = SuiteContext(model=model, rounds=rounds, log=log)
    started = time.time()
    bandwidth = [read_bandwidth(repeats=3) / 1e9]
    records = []
    for row_id in ids:
        log(f"bench {row_id} ...")
        try:
            rec = run_benchmark(rows[row_id], ctx, row_id=row_id)
        except Skip as e:
            rec = {"id": row_id, "skipped": str(e)}
        except Exception as e:  # noqa: BLE001 - one failed row must not lose the others' numbers
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            rec = {"id": row_id, "error": f"{type(e).__name__}: {first}"}
        if row_id == "core.matmul" and "sides" in rec:
            ctx.measured["gemm_gflops_fp32"] = rec["sides"]["fp32"]["medians"]["gflops"]
            ctx.measured["gemm_gflops_bf16"] = rec["sides"]["bf16"]["medians"]["gflops"]
        records.append(rec)
        log(f"  {_summary(rec)}")
    bandwidth.append(read_bandwidth(repeats=3) / 1e9)
    report = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "total_s": time.time() - started,
        "model": model,
        "rounds": rounds,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "read_bandwidth_gb_s_samples": bandwidth,  # before the first row and after the last
        "measured": ctx.measured,
        "contended": any(r.get("contended") for r in records),
        "rows": records,
    }
    write_reports(report, folder)
    report["folder"] = str(folder)
    return report


# ----------------------------------------------------------------------------------------------------------------
# reports


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:.4g}"
    return str(x)


def _summary(rec: dict[str, Any]) -> str:
    if "skipped" in rec:
        return f"skipped: {rec['skipped']}"
    if "error" in rec:
        return f"error: {rec['error']}"
    parts = []
    for name, side in rec.get("sides", {}).items():
        nums = ", ".join(f"{k} {_fmt(v)}" for k, v in side["medians"].items())
        parts.append(f"{name} {1e3 * side['median_wall_s']:.1f} ms" + (f" ({nums})" if nums else ""))
    if "speedup" in rec:
        parts.append(f"speedup {_fmt(rec['speedup'])}x")
    parts += [f"{k} ratio {_fmt(v)}" for k, v in rec.get("ratios", {}).items()]
    parts += [f"{k} {_fmt(v)}" for k, v in (rec.get("check") or {}).items() if isinstance(v, float)]
    for name, c in rec.get("candidates", {}).items():
        parts.append(f"{name} {_fmt(c.get('decode_tok_s'))} tok/s")
    return "; ".join(parts) + ("  [CONTENDED]" if rec.get("contended") else "")


def format_report(report: dict[str, Any]) -> str:
    """The report as a markdown table: one line per row, then the contention reasons."""
    lines = [f"# lmlab bench suite ({report['created']})", "",
             f"model {report['model']}, {report['threads']} thread(s) of {report['cpu_count']} CPUs, torch "
             f"{report['torch']}; read bandwidth {', '.join(_fmt(b) for b in report['read_bandwidth_gb_s_samples'])}"
             f" GB/s (before, after); contended: {report['contended']}", "",
             "| row | result | contended | load before -> after |", "|---|---|---|---|"]  # fmt: skip
    for r in report["rows"]:
        load = f"{_fmt(r['loadavg_before'][0])} -> {_fmt(r['loadavg_after'][0])}" if "loadavg_before" in r else ""
        lines.append(f"| {r['id']} | {_summary(r).replace('|', '/')} | {r.get('contended', '')} | {load} |")
    for r in report["rows"]:
        if r.get("contention_reasons"):
            lines.append(f"\n{r['id']} contended: {'; '.join(r['contention_reasons'])}")
    return "\n".join(lines) + "\n"


def write_reports(report: dict[str, Any], folder: str | Path) -> Path:
    """results.json and report.md into `folder` (each written atomically); returns results.json's path."""
    folder = Path(folder)
    atomic_write_text(folder / "results.json", dumps(report))
    atomic_write_text(folder / "report.md", format_report(report))
    return folder / "results.json"
