"""`lmlab bench decode`: decode and prefill speed of lmlab's engines against transformers and llama.cpp.

Every candidate runs in one process on the same prompts, interleaved (round r runs the candidates in an order
rotated by r, each prompt in turn), after an untimed warm-up of at least 16 generated tokens each (calls of the
timed shape, so a static cache or a compiled graph is built before timing; the warm-up time is reported):

- ``lmlab-int4``: `decode(..., engine="fast-int4")` (the GGUF's own 4-bit blocks through torch's int4 kernel);
- ``lmlab-fp32``: `decode(..., engine="fast")` (the fp32 weights, exact);
- ``hf-fp32`` / ``hf-bf16``: transformers' ``model.generate`` (greedy, ``min_new_tokens`` so no early stop) with
  its default dynamic cache;
- ``hf-fp32-static``: ``generate(cache_implementation="static")``, transformers' pre-allocated cache;
- ``hf-fp32-compiled`` (only with ``compile=True`` / ``--compile``: compiling takes minutes on a small CPU): the
  static cache plus ``torch.compile`` of the decode forward (generate's `CompileConfig`, forced on CPU);
- ``llama.cpp``: `llama-cpp-python` on the same GGUF file, when installed (``make llamacpp`` builds it with every
  SIMD extension this CPU has except AMX; its ``llama_print_system_info`` line is recorded).

Per generated token a timestamp is taken (a step callback for lmlab, a logits processor for transformers, the
token iterator for llama.cpp): prefill time = start -> first token, decode step = the median gap between later
tokens. Reported per candidate: decode tokens/s, per-step ms (median and IQR over prompts x rounds), prefill
tokens/s; ratios to ``hf-fp32`` and ``llama.cpp`` as medians of per-(round, prompt) ratios (both runs of a pair saw
the same machine state); and the fraction of the bandwidth floor: weight bytes read per decode step divided by
the memory read bandwidth measured in the same run (``sum`` over a 256 MB buffer, between rounds), over the
measured step time. Ratios to ``best HF`` use the fastest transformers row of the run.

Contention: the load averages before and after, and the CPU time other processes used during the timed rounds
(``/proc/stat`` busy time minus this process's own CPU time, in cores), are recorded. A run is *contended* (and
``publishable`` false) when other processes used more than `CONTENDED_OTHER_CORES` cores on average, or when the
1-minute load before the start was `CONTENDED_LOAD_BEFORE` or more. (The load after the run is not a criterion:
it counts the bench's own threads. In a container whose ``/proc/stat`` shows the whole host, the host's other load
counts too: a conservative flag.) Publish figures only from uncontended runs.

An exactness section compares the fast engine with transformers: the fp32 engine's greedy tokens against
``generate``'s on the bench prompts, and int4 against fp32 teacher-forced on held-out corpus text (KL(fp32 || int4),
top-1 agreement, perplexities).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

DEFAULT_CANDIDATES = ("lmlab-int4", "lmlab-fp32", "hf-fp32", "hf-fp32-static", "hf-bf16", "llama.cpp")
ALL_CANDIDATES = (*DEFAULT_CANDIDATES, "hf-fp32-compiled")
HF_CANDIDATES = ("hf-fp32", "hf-fp32-static", "hf-fp32-compiled", "hf-bf16")
MIN_WARMUP_TOKENS = 16
# another process using a quarter of a core on average is already visible in 2-core step times
CONTENDED_OTHER_CORES = 0.25
CONTENDED_LOAD_BEFORE = 1.0


def check_out_dir(path: str | Path) -> Path:
    """The results folder `path`, checked before anything runs: an existing folder, or one that can be created.

    Raises `ValueError` (one line) for an existing non-folder, a parent that is not a folder, or a folder that is
    not writable.
    """
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out must be a folder (results.json is written inside), but {str(out)!r} is a file")
    probe = out
    while not probe.exists():  # the nearest existing ancestor must be a writable folder
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ValueError(f"--out {str(out)!r}: {str(probe)!r} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"--out {str(out)!r}: folder {str(probe)!r} is not writable")
    return out


def _cpu_busy_s() -> float | None:
    """Seconds of CPU time all processes have used since boot (``/proc/stat``), or None off Linux."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq, *rest = (int(x) for x in fields[1:])
    steal = rest[0] if rest else 0
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def read_bandwidth(mb: int = 256, repeats: int = 5) -> float:
    """Memory read bandwidth in bytes/s: the median over `repeats` of ``x.sum()`` over `mb` MB of fp32."""
    x = torch.ones(mb * (1 << 20) // 4)
    x.sum()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - t0)
    return x.numel() * 4 / statistics.median(times)


def _median_iqr(values: Sequence[float]) -> tuple[float, float, float]:
    v = sorted(values)
    if not v:
        return math.nan, math.nan, math.nan
    q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0], v[0], v[0]]
    return statistics.median(v), q[0], q[2]


def _timing(stamps: list[float], start: float, n_prompt: int) -> dict[str, float]:
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    prefill = stamps[0] - start
    return {
        "prefill_s": prefill,
        "prefill_tok_s": n_prompt / prefill if prefill > 0 else math.nan,
        "step_ms": 1e3 * statistics.median(gaps) if gaps else math.nan,
        "mean_step_ms": 1e3 * (stamps[-1] - stamps[0]) / max(len(gaps), 1),
    }


# ----------------------------------------------------------------------------------------------------------------
# Candidates: each returns (generated token ids, per-token timestamps, start time)


def _lmlab_runner(
    model: Any, tok: Any, engine: str
) -> Callable[[list[int], int], tuple[list[int], list[float], float]]:
    from lmlab.core.inference.generation import decode

    def run(prompt_ids: list[int], n: int) -> tuple[list[int], list[float], float]:
        stamps: list[float] = []
        start = time.perf_counter()
        out = decode(
            model,
            tok,
            prompt_ids,
            max_new_tokens=n,
            eos_token_id=[],
            step_callback=lambda s: stamps.append(time.perf_counter()),
            engine=engine,
        )
        return out.token_ids, stamps, start

    return run


def _hf_runner(
    model: Any, *, static: bool = False, compile_mode: str | None = None
) -> Callable[[list[int], int], tuple[list[int], list[float], float]]:
    """`model.generate`, greedy; `static`: ``cache_implementation="static"``; `compile_mode`: also
    ``torch.compile`` the decode forward (transformers only auto-compiles on GPUs, so the config is forced)."""
    from transformers import LogitsProcessorList

    extra: dict[str, Any] = {}
    if static or compile_mode:
        extra["cache_implementation"] = "static"
    if compile_mode:
        from transformers import CompileConfig

        cc = CompileConfig(fullgraph=False, dynamic=False, mode=compile_mode)
        cc._compile_all_devices = True  # generate's switch for compiling off GPU
        extra["compile_config"] = cc
    else:
        extra["disable_compile"] = True

    class Stamp:
        def __init__(self) -> None:
            self.stamps: list[float] = []

        def __call__(self, ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            self.stamps.append(time.perf_counter())
            return scores

    @torch.no_grad()
    def run(prompt_ids: list[int], n: int) -> tuple[list[int], list[float], float]:
        ids = torch.tensor([prompt_ids])
        stamp = Stamp()
        start = time.perf_counter()
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=n,
            min_new_tokens=n,
            logits_processor=LogitsProcessorList([stamp]),
            pad_token_id=model.generation_config.pad_token_id or 0,
            **extra,
        )
        return out[0, len(prompt_ids) :].tolist(), stamp.stamps, start

    return run


def _llamacpp_runner(gguf_path: str, threads: int, n_ctx: int) -> Callable | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(model_path=gguf_path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)
    try:  # which SIMD paths this llama.cpp build uses (AVX2 / AVX512 / VNNI / BF16 / AMX = 0|1)
        import llama_cpp

        info = llama_cpp.llama_print_system_info()
        system_info = (info.decode() if isinstance(info, bytes) else str(info)).strip()
    except Exception:  # noqa: BLE001 - only a note
        system_info = "unknown"

    def run(prompt_ids: list[int], n: int) -> tuple[list[int], list[float], float]:
        llm.reset()
        stamps: list[float] = []
        toks: list[int] = []
        start = time.perf_counter()
        for t in llm.generate(prompt_ids, top_k=1, temp=0.0, reset=True):
            stamps.append(time.perf_counter())
            toks.append(int(t))
            if len(toks) >= n:
                break
        return toks, stamps, start

    run.system_info = system_info  # type: ignore[attr-defined]
    return run


# ----------------------------------------------------------------------------------------------------------------
# Exactness


@torch.no_grad()
def int4_exactness(model: Any, tok: Any, *, n_passages: int = 4, max_tokens: int = 256, seed: int = 0) -> dict:
    """KL(fp32 || int4), top-1 agreement and perplexities of the int4 engine against the fp32 model, teacher-forced
    on held-out corpus passages (the corpus ``test`` split)."""
    from lmlab.core.inference.engine import get_engine
    from lmlab.data.corpus import generate as corpus

    e32, e4 = get_engine(model, "fp32"), get_engine(model, "int4")
    kls, agree, nll32, nll4, n_tok = [], [], 0.0, 0.0, 0
    for ex in corpus(n_passages, seed=seed, split="test"):
        ids = tok(ex.prompt, return_tensors="pt").input_ids[:, :max_tokens]
        if ids.shape[1] < 2:
            continue
        lp32 = F.log_softmax(e32.forward(ids, e32.new_cache(1, ids.shape[1]), all_logits=True)[0], -1)
        lp4 = F.log_softmax(e4.forward(ids, e4.new_cache(1, ids.shape[1]), all_logits=True)[0], -1)
        kl = (lp32.exp() * (lp32 - lp4)).sum(-1)[:-1]
        kls.extend(kl.tolist())
        agree.extend((lp32.argmax(-1) == lp4.argmax(-1))[:-1].float().tolist())
        target = ids[0, 1:]
        nll32 += float(-lp32[:-1].gather(-1, target[:, None]).sum())
        nll4 += float(-lp4[:-1].gather(-1, target[:, None]).sum())
        n_tok += len(target)
    ppl32, ppl4 = math.exp(nll32 / n_tok), math.exp(nll4 / n_tok)
    return {
        "tokens": n_tok,
        "kl_mean": statistics.fmean(kls),
        "kl_max": max(kls),
        "top1_agreement": statistics.fmean(agree),
        "ppl_fp32": ppl32,
        "ppl_int4": ppl4,
        "ppl_rel_diff": ppl4 / ppl32 - 1.0,
    }


# ----------------------------------------------------------------------------------------------------------------
# The benchmark


def bench_decode(
    model_spec: str = "smollm2-135m",
    *,
    candidates: Sequence[str] = DEFAULT_CANDIDATES,
    n_prompts: int = 3,
    prompt_tokens: int = 64,
    new_tokens: int = 32,
    rounds: int = 3,
    threads: int | None = None,
    exactness: bool = True,
    compile: bool = False,
    compile_mode: str = "default",
    warmup_tokens: int = MIN_WARMUP_TOKENS,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the interleaved benchmark and return the JSON-able report (see the module docstring).

    Args:
        candidates: which rows to run (some of `ALL_CANDIDATES`); `compile` adds ``hf-fp32-compiled``.
        compile_mode (`str`, defaults to ``"default"``): the ``torch.compile`` mode of ``hf-fp32-compiled``.
        warmup_tokens (`int`, defaults to 16): tokens each candidate generates before timing (at least 16), in
            calls of the timed shape (prompt_tokens -> new_tokens), so static caches and compiled graphs exist.
    """
    from lmlab.core.inference.engine import get_engine, gguf_source
    from lmlab.core.inference.models import flop_params, load_model
    from lmlab.data.corpus import generate as corpus

    unknown = [c for c in candidates if c not in ALL_CANDIDATES]
    if unknown:
        raise ValueError(f"unknown candidate(s) {unknown}; expected some of {', '.join(ALL_CANDIDATES)}")
    if warmup_tokens < MIN_WARMUP_TOKENS:
        raise ValueError(f"warmup_tokens must be >= {MIN_WARMUP_TOKENS}, got {warmup_tokens}")
    if new_tokens < 2:
        raise ValueError(f"new_tokens must be >= 2 (a decode step is the gap between two tokens), got {new_tokens}")
    candidates = list(dict.fromkeys(candidates))
    if compile and "hf-fp32-compiled" not in candidates:
        candidates.append("hf-fp32-compiled")
    if threads is not None:
        torch.set_num_threads(threads)
    threads = torch.get_num_threads()
    load_before = os.getloadavg()
    model, tok = load_model(model_spec)
    notes: list[str] = []
    runners: dict[str, Callable] = {}
    weight_bytes: dict[str, int] = {}
    build_s: dict[str, float] = {}
    fp32_bytes = flop_params(model) * 4
    if "lmlab-int4" in candidates:
        t0 = time.perf_counter()
        e4 = get_engine(model, "int4")
        build_s["lmlab-int4"] = time.perf_counter() - t0
        runners["lmlab-int4"] = _lmlab_runner(model, tok, "fast-int4")
        weight_bytes["lmlab-int4"] = e4.weight_bytes_per_token()
        notes.append(f"lmlab-int4 engine: {json.dumps(e4.describe()['projections'])}, "
                     f"{len(e4.gguf_used)} matrices from GGUF 4-bit blocks, {len(e4.quantized)} quantized from fp32 "
                     f"(group {e4.group}); built in {build_s['lmlab-int4']:.1f} s")  # fmt: skip
    if "lmlab-fp32" in candidates:
        get_engine(model, "fp32")
        runners["lmlab-fp32"] = _lmlab_runner(model, tok, "fast")
        weight_bytes["lmlab-fp32"] = fp32_bytes
    if "hf-fp32" in candidates:
        runners["hf-fp32"] = _hf_runner(model)
        weight_bytes["hf-fp32"] = fp32_bytes
    if "hf-fp32-static" in candidates:
        runners["hf-fp32-static"] = _hf_runner(model, static=True)
        weight_bytes["hf-fp32-static"] = fp32_bytes
    if "hf-fp32-compiled" in candidates:
        # generate keeps the compiled forward on the model (`_compiled_call`) but calls it only with a compile
        # config: the other hf rows pass disable_compile, so they stay eager on the same model
        runners["hf-fp32-compiled"] = _hf_runner(model, static=True, compile_mode=compile_mode)
        weight_bytes["hf-fp32-compiled"] = fp32_bytes
    if "hf-bf16" in candidates:
        bf16, _ = load_model(model_spec, dtype="bfloat16")
        runners["hf-bf16"] = _hf_runner(bf16)
        weight_bytes["hf-bf16"] = fp32_bytes // 2
    gguf_path = gguf_source(model)
    if "llama.cpp" in candidates:
        if gguf_path is None:
            notes.append("llama.cpp: no GGUF file for this model; skipped")
        else:
            runner = _llamacpp_runner(gguf_path, threads, prompt_tokens + new_tokens + 16)
            if runner is None:
                notes.append("llama.cpp: llama-cpp-python is not installed (make llamacpp); skipped")
            else:
                runners["llama.cpp"] = runner
                notes.append(f"llama.cpp build: {runner.system_info}")
                from lmlab.core.inference.engine.gguf_file import GGUFIndex

                idx = GGUFIndex(gguf_path)
                weight_bytes["llama.cpp"] = sum(t.nbytes for t in idx.tensors.values())
    names = [c for c in candidates if c in runners]

    passages = corpus(max(n_prompts, 1) * 3, seed=0, split="test")
    prompts: list[list[int]] = []
    for ex in passages:
        ids = tok(ex.prompt)["input_ids"][:prompt_tokens]
        if len(ids) == prompt_tokens:
            prompts.append(ids)
        if len(prompts) == n_prompts:
            break
    if len(prompts) < n_prompts:
        raise RuntimeError(f"only {len(prompts)} corpus passages have {prompt_tokens} tokens")

    log(f"bench decode: {model_spec}, {threads} thread(s), {len(prompts)} prompts x {prompt_tokens} tokens, "
        f"{new_tokens} new tokens, {rounds} rounds, candidates: {', '.join(names)}")  # fmt: skip
    # warm-up: >= warmup_tokens generated tokens per candidate, in calls of the timed shape (lazy init, allocator,
    # static caches, compiled graphs: a different shape would recompile during the timed rounds)
    warmup_calls = math.ceil(warmup_tokens / new_tokens)
    warmup: dict[str, dict[str, float]] = {}
    for name in names:
        t0 = time.perf_counter()
        made = 0
        for c in range(warmup_calls):
            made += len(runners[name](prompts[c % len(prompts)], new_tokens)[0])
        warmup[name] = {"tokens": made, "calls": warmup_calls, "seconds": time.perf_counter() - t0}
        if "compiled" in name:
            log(f"  {name}: warm-up (incl. torch.compile) {warmup[name]['seconds']:.1f} s")
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    tokens: dict[str, dict[int, list[int]]] = {n: {} for n in names}
    pairs: list[dict[str, dict[str, float]]] = []
    bandwidths = [read_bandwidth()]
    load_samples = [list(os.getloadavg())]
    busy0, own0, wall0 = _cpu_busy_s(), _own_cpu_s(), time.perf_counter()
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for p_i, prompt in enumerate(prompts):
            this: dict[str, dict[str, float]] = {}
            for name in order:
                toks, stamps, start = runners[name](prompt, new_tokens)
                t = _timing(stamps, start, len(prompt))
                runs[name].append(t)
                this[name] = t
                tokens[name].setdefault(p_i, toks)
            pairs.append(this)
        bandwidths.append(read_bandwidth())
        load_samples.append(list(os.getloadavg()))
        log(f"  round {r + 1}/{rounds}: " + ", ".join(f"{n} {runs[n][-1]['step_ms']:.1f} ms/step" for n in names))
    busy1, own1, wall1 = _cpu_busy_s(), _own_cpu_s(), time.perf_counter()
    other_cores = None
    if busy0 is not None and busy1 is not None and wall1 > wall0:
        other_cores = max(0.0, ((busy1 - busy0) - (own1 - own0)) / (wall1 - wall0))
    bw = statistics.median(bandwidths)
    load_after = os.getloadavg()

    results: dict[str, dict[str, Any]] = {}
    for name in names:
        step, q1, q3 = _median_iqr([t["step_ms"] for t in runs[name]])
        prefill = statistics.median([t["prefill_tok_s"] for t in runs[name]])
        floor_ms = 1e3 * weight_bytes[name] / bw
        results[name] = {
            "decode_tok_s": 1e3 / step,
            "step_ms": step,
            "step_ms_iqr": [q1, q3],
            "prefill_tok_s": prefill,
            "weight_bytes_per_token": weight_bytes[name],
            "bandwidth_floor_ms": floor_ms,
            "fraction_of_bandwidth_floor": floor_ms / step,
            "warmup": warmup[name],
        }

    def ratio(a: str, b: str | None) -> float | None:
        if a not in runs or b not in runs:
            return None
        return statistics.median([p[b]["step_ms"] / p[a]["step_ms"] for p in pairs])

    hf_rows = [n for n in names if n in HF_CANDIDATES]
    best_hf = min(hf_rows, key=lambda n: results[n]["step_ms"]) if hf_rows else None
    for name in names:
        results[name]["speedup_vs_hf_fp32"] = ratio(name, "hf-fp32")
        results[name]["speedup_vs_best_hf"] = ratio(name, best_hf)
        results[name]["fraction_of_llama_cpp"] = ratio(name, "llama.cpp")
        results[name]["prefill_speedup_vs_hf_fp32"] = (
            statistics.median(
                [p[name]["prefill_s"] and p["hf-fp32"]["prefill_s"] / p[name]["prefill_s"] for p in pairs]
            )
            if "hf-fp32" in runs
            else None
        )

    eos = tok.eos_token_id

    def upto_eos(ids: list[int]) -> list[int]:  # generate's min_new_tokens bans EOS; lmlab's run merely ignores it
        return ids[: ids.index(eos)] if eos in ids else ids

    exact: dict[str, Any] = {}
    if "lmlab-fp32" in tokens and "hf-fp32" in tokens:
        same = []
        for i in tokens["hf-fp32"]:
            a, b = upto_eos(tokens["lmlab-fp32"][i]), tokens["hf-fp32"][i]
            same.append(a == b[: len(a)])
        exact["fp32_greedy_equals_hf"] = all(same)
        exact["fp32_greedy_equal_prompts"] = f"{sum(same)}/{len(same)}"
    for name in ("hf-fp32-static", "hf-fp32-compiled"):  # the faster HF rows do the same work as hf-fp32
        if name in tokens and "hf-fp32" in tokens:
            same = sum(tokens[name][i] == tokens["hf-fp32"][i] for i in tokens["hf-fp32"])
            exact[f"{name}_greedy_equal_prompts"] = f"{same}/{len(tokens['hf-fp32'])}"
    if "lmlab-int4" in tokens and "lmlab-fp32" in tokens:
        agree = [
            sum(a == b for a, b in zip(tokens["lmlab-int4"][i], tokens["lmlab-fp32"][i])) / new_tokens
            for i in tokens["lmlab-fp32"]
        ]
        exact["int4_greedy_token_agreement"] = statistics.fmean(agree)
    if exactness and "lmlab-int4" in candidates:
        exact["int4_vs_fp32_heldout"] = int4_exactness(model, tok)

    reasons = []
    if other_cores is not None and other_cores > CONTENDED_OTHER_CORES:
        reasons.append(f"other processes used {other_cores:.2f} cores during the timed rounds "
                       f"(> {CONTENDED_OTHER_CORES})")  # fmt: skip
    if load_before[0] >= CONTENDED_LOAD_BEFORE:
        reasons.append(f"1-minute load {load_before[0]:.2f} before the start (>= {CONTENDED_LOAD_BEFORE})")
    report = {
        "model": model_spec,
        "threads": threads,
        "cpu_count": os.cpu_count(),
        "prompts": len(prompts),
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "rounds": rounds,
        "warmup_tokens": warmup_tokens,
        "read_bandwidth_gb_s": bw / 1e9,
        "bandwidth_samples_gb_s": [b / 1e9 for b in bandwidths],
        "loadavg_before": list(load_before),
        "loadavg_after": list(load_after),
        "loadavg_between_rounds": load_samples,
        "other_processes_cores": other_cores,
        "contended": bool(reasons),
        "contention_reasons": reasons,
        "publishable": not reasons,
        "best_hf": best_hf,
        "torch": torch.__version__,
        "results": results,
        "exactness": exact,
        "notes": notes,
        "targets": {
            "int4_vs_hf_fp32_generate": {
                "target": 2.0,
                "measured": results.get("lmlab-int4", {}).get("speedup_vs_hf_fp32"),
            },
            "int4_vs_best_hf": {
                "target": 1.0,
                "measured": results.get("lmlab-int4", {}).get("speedup_vs_best_hf"),
            },
            "int4_fraction_of_llama_cpp": {
                "target": 0.5,
                "measured": results.get("lmlab-int4", {}).get("fraction_of_llama_cpp"),
            },
        },
    }
    return report


def format_report(report: dict[str, Any]) -> str:
    """The human-readable table printed by ``lmlab bench decode``."""

    def f(v: Any, fmt: str) -> str:
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

    other = report.get("other_processes_cores")
    lines = [
        f"model {report['model']}, {report['threads']} thread(s) of {report.get('cpu_count')} CPUs, "
        f"{report['prompts']} prompts x {report['prompt_tokens']} tokens -> {report['new_tokens']} new, "
        f"{report['rounds']} interleaved rounds after a {report.get('warmup_tokens', '?')}-token warm-up; read "
        f"bandwidth {report['read_bandwidth_gb_s']:.1f} GB/s; load {report['loadavg_before'][0]:.2f} -> "
        f"{report['loadavg_after'][0]:.2f}; other processes {f(other, '.2f')} cores",
    ]
    if report["contended"]:
        lines.append("CONTENDED (" + "; ".join(report.get("contention_reasons", [])) + "): not for publication; "
                     "ratios are what to read; rerun on a quiet machine")  # fmt: skip
    lines += [
        "",
        f"{'candidate':<16} {'decode tok/s':>12} {'ms/step':>9} {'IQR':>13} {'prefill tok/s':>14} "
        f"{'x hf-fp32':>9} {'x best hf':>9} {'x llama.cpp':>11} {'MB/token':>9} {'% bw floor':>10}",
    ]
    for name, r in report["results"].items():
        iqr = r["step_ms_iqr"]
        lines.append(
            f"{name:<16} {f(r['decode_tok_s'], '.1f'):>12} {f(r['step_ms'], '.1f'):>9} "
            f"{f(iqr[0], '.1f') + '-' + f(iqr[1], '.1f'):>13} {f(r['prefill_tok_s'], '.0f'):>14} "
            f"{f(r['speedup_vs_hf_fp32'], '.2f'):>9} {f(r.get('speedup_vs_best_hf'), '.2f'):>9} "
            f"{f(r['fraction_of_llama_cpp'], '.2f'):>11} "
            f"{r['weight_bytes_per_token'] / 1e6:>9.1f} {f(100 * r['fraction_of_bandwidth_floor'], '.0f'):>10}"
        )
    if report.get("best_hf"):
        lines.append(f"(best hf = {report['best_hf']}, the fastest transformers row of this run)")
    compiled = report["results"].get("hf-fp32-compiled")
    if compiled:
        lines.append(f"hf-fp32-compiled warm-up incl. torch.compile: {compiled['warmup']['seconds']:.1f} s")
    ex = report.get("exactness", {})
    if ex:
        lines.append("")
        if "fp32_greedy_equals_hf" in ex:
            lines.append(
                f"fp32 engine greedy tokens == transformers generate: {ex['fp32_greedy_equal_prompts']} prompts"
            )
        for name in ("hf-fp32-static", "hf-fp32-compiled"):
            if f"{name}_greedy_equal_prompts" in ex:
                lines.append(f"{name} greedy tokens == hf-fp32's: {ex[f'{name}_greedy_equal_prompts']} prompts")
        if "int4_greedy_token_agreement" in ex:
            lines.append(f"int4 vs fp32 greedy token agreement (position by position): "
                         f"{ex['int4_greedy_token_agreement']:.2f}")  # fmt: skip
        h = ex.get("int4_vs_fp32_heldout")
        if h:
            lines.append(
                f"int4 vs fp32, held-out corpus ({h['tokens']} tokens, teacher-forced): KL mean {h['kl_mean']:.2e} "
                f"(max {h['kl_max']:.2e}), top-1 agreement {h['top1_agreement']:.3f}, perplexity "
                f"{h['ppl_fp32']:.2f} -> {h['ppl_int4']:.2f} ({100 * h['ppl_rel_diff']:+.2f}%)"
            )
    t = report["targets"]
    lines.append("")
    for key, label in (
        ("int4_vs_hf_fp32_generate", "x transformers generate"),
        ("int4_vs_best_hf", "x the best transformers row"),
        ("int4_fraction_of_llama_cpp", "of llama.cpp"),
    ):
        m = t[key]["measured"]
        verdict = "n/a" if m is None else ("MET" if m >= t[key]["target"] else "NOT MET")
        lines.append(f"target lmlab-int4 >= {t[key]['target']:g} {label}: measured {f(m, '.2f')} -> {verdict}")
    lines.extend(f"note: {n}" for n in report["notes"])
    return "\n".join(lines)


def write_report(report: dict[str, Any], out_dir: str | Path) -> Path:
    """Write ``results.json`` (and the table as ``report.txt``) into the folder `out_dir`, each atomically
    (a temporary file renamed over the old one). Returns the path of results.json."""
    from lmlab.results import atomic_write_text

    out = check_out_dir(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "report.txt", format_report(report) + "\n")
    atomic_write_text(out / "results.json", json.dumps(report, indent=2))
    return out / "results.json"
