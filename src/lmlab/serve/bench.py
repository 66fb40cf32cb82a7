"""`lmlab bench serve`: requests/s, tokens/s and latency of `lmlab serve` at 1, 4 and 8 concurrent clients.

Each server runs as its own process on loopback (``python -m lmlab serve``; ``python -m llama_cpp.server`` on the
same GGUF file when `llama-cpp-python` with its server extra is installed), and the clients are threads of this
process speaking the official `openai` client. Per concurrency level ``c``: ``c`` clients share a list of
`requests` completions (one prompt each from the seeded corpus, greedy, `max_tokens` tokens, no early stop is
forced: a completion that ends at EOS counts the tokens it produced), bounded by `max_seconds` (no new request
starts after it). Reported per server and level: requests/s and completion tokens/s over the level's wall time,
latency p50 / p99 per request, and the speed-up of tokens/s over ``c = 1`` of the same server (its ceiling is
``c``: decode is memory-bound, so c rows cost little more than one).

Integrity: every request carries its own id (``X-Request-Id``), which the server must echo; the bench fails a
level whose answered ids are not exactly the sent ones (a lost or doubly answered request), and checks that usage
counts are present. Contention: the 1-minute load average before the start is recorded; a run that began on a
busy machine is flagged ``publishable: false``.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lmlab.serve.testing import wait_ready

__all__ = ["bench_serve", "format_report", "write_report"]

CONTENDED_LOAD_BEFORE = 1.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """A server in a child process on 127.0.0.1, stopped (terminate, then kill) on exit."""

    def __init__(self, argv: Sequence[str], port: int, *, ready_path: str, timeout: float = 600, log: Path) -> None:
        self.argv, self.port, self.ready_path, self.timeout, self.log = list(argv), port, ready_path, timeout, log

    def __enter__(self) -> ServerProcess:
        self._log = open(self.log, "w")  # noqa: SIM115 - closed in __exit__
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{self.port}{self.ready_path}"
            wait_ready(url, self.timeout, failure=lambda: self._exited(url))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._log.close()

    def _exited(self, url: str) -> str | None:
        if self.proc.poll() is None:
            return None
        return f"the server exited with code {self.proc.returncode} before answering {url}"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def _prompts(n: int, seed: int, words: int) -> list[str]:
    from lmlab.data.corpus import generate as corpus

    out = []
    for ex in corpus(n, seed=seed, split="test"):
        text = ex.prompt
        out.append(" ".join(text.split()[:words]))
    return out


def run_level(
    base_url: str, model_name: str, prompts: Sequence[str], *, concurrency: int, max_tokens: int, max_seconds: float,
    tag: str,
) -> dict[str, Any]:  # fmt: skip
    """`concurrency` client threads complete `prompts` (one request each) against an OpenAI-compatible server."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="EMPTY", max_retries=0, timeout=600)
    # request ids are UUIDs (derived from the tag, so reruns send the same ones): llama_cpp.server validates the
    # header with starlette-context's RequestIdPlugin and answers any other X-Request-Id with an empty 400
    sent = [str(uuid.uuid5(uuid.NAMESPACE_URL, f"lmlab-bench/{tag}/{i}")) for i in range(len(prompts))]
    lock = threading.Lock()
    results: list[dict[str, Any]] = []
    deadline = time.perf_counter() + max_seconds

    def one(i: int) -> None:
        if time.perf_counter() > deadline:
            return
        t0 = time.perf_counter()
        raw = client.completions.with_raw_response.create(
            model=model_name, prompt=prompts[i], max_tokens=max_tokens, temperature=0.0,
            extra_headers={"X-Request-Id": sent[i]},
        )  # fmt: skip
        latency = time.perf_counter() - t0
        body = raw.parse()
        usage = body.usage
        with lock:
            results.append(
                {
                    "sent": sent[i],
                    "echoed": raw.headers.get("x-request-id"),
                    "latency_s": latency,
                    "completion_tokens": usage.completion_tokens if usage else None,
                    "id": body.id,
                }
            )

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(len(prompts))))
    wall = time.perf_counter() - start
    issued = [r["sent"] for r in results]
    echoed = [r["echoed"] for r in results]
    problems = []
    if sorted(echoed) != sorted(issued):
        problems.append("answered ids differ from the sent ones (a request was lost or answered twice)")
    if len(set(r["id"] for r in results)) != len(results):
        problems.append("two responses carry the same completion id")
    if any(r["completion_tokens"] is None for r in results):
        problems.append("a response has no usage counts")
    lat = sorted(r["latency_s"] for r in results)
    tokens = sum(r["completion_tokens"] or 0 for r in results)
    q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) >= 2 else lat * 99
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "requests_planned": len(prompts),
        "wall_s": wall,
        "requests_per_s": len(results) / wall if wall > 0 else None,
        "tokens_per_s": tokens / wall if wall > 0 else None,
        "completion_tokens": tokens,
        "latency_p50_s": statistics.median(lat) if lat else None,
        "latency_p99_s": q[98] if lat else None,
        "problems": problems,
    }


def _gguf_for(model_spec: str) -> str | None:
    from lmlab.core.inference.models import assemble_gemma3_gguf, canonical_alias, resolve_model, smollm2_gguf

    alias = canonical_alias(model_spec)
    try:
        if alias == "smollm2-135m":
            return str(smollm2_gguf())
        if alias == "gemma3-270m":
            return str(assemble_gemma3_gguf())
        r = resolve_model(model_spec)
        if r.kind == "gguf" and r.path is not None:
            return str(r.path / r.gguf_file) if r.gguf_file else str(r.path)
    except Exception:  # noqa: BLE001 - no GGUF: no llama.cpp row
        return None
    return None


def llamacpp_server_available() -> bool:
    """llama.cpp's server and the packages its app imports (``llama-cpp-python[server]``): a bare llama-cpp-python
    has ``llama_cpp.server`` but the server exits at start without them."""
    import importlib.util

    try:
        needed = ("llama_cpp.server", "starlette_context", "pydantic_settings", "sse_starlette")
        return all(importlib.util.find_spec(m) is not None for m in needed)
    except ModuleNotFoundError:
        return False


def bench_serve(
    model_spec: str = "smollm2-135m",
    *,
    engine: str = "fast-int4",
    concurrency: Sequence[int] = (1, 4, 8),
    requests: int = 16,
    max_tokens: int = 32,
    max_seconds: float = 120.0,
    prompt_words: int = 48,
    threads: int | None = None,
    llamacpp: bool = True,
    workdir: Path,
    seed: int = 0,
    log: Callable[[str], None] = lambda m: None,
) -> dict[str, Any]:
    """Run the levels against each server in turn (see the module docstring); the report as a dict."""
    if requests < 1 or max_tokens < 1 or max_seconds <= 0:
        raise ValueError(f"requests, max_tokens and max_seconds must be positive, got {requests}, {max_tokens}, "
                         f"{max_seconds}")  # fmt: skip
    bad = [c for c in concurrency if c < 1]
    if bad:
        raise ValueError(f"concurrency levels must be >= 1, got {bad[0]}")
    load_before = os.getloadavg()
    prompts = _prompts(requests, seed, prompt_words)
    env_threads = [] if threads is None else ["--threads", str(threads)]
    servers: list[tuple[str, list[str], str, str]] = []
    port = free_port()
    servers.append((
        f"lmlab-{engine}",
        [sys.executable, "-m", "lmlab", "serve", "--model", model_spec, "--engine", engine, "--port", str(port),
         "--max-batch", str(max(concurrency)), *env_threads],
        "/health",
        str(port),
    ))  # fmt: skip
    notes = []
    gguf = _gguf_for(model_spec) if llamacpp else None
    llama_threads = None
    if llamacpp and gguf and llamacpp_server_available():
        import torch

        llama_threads = threads or torch.get_num_threads()
        p2 = free_port()
        servers.append((
            "llama.cpp-server",
            [sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--host", "127.0.0.1", "--port", str(p2),
             # llama-cpp-python defaults to cpu_count // 2 threads (1 on 2 cores) while torch takes every core:
             # give both servers the same count
             "--n_threads", str(llama_threads), "--n_threads_batch", str(llama_threads)],
            "/v1/models",
            str(p2),
        ))  # fmt: skip
    elif llamacpp:
        notes.append("llama.cpp row skipped: " + ("no GGUF for this model" if not gguf else
                     "llama_cpp.server is not installed (pip install 'llama-cpp-python[server]')"))  # fmt: skip
    rows: dict[str, list[dict[str, Any]]] = {}
    for name, argv, ready, p in servers:
        log(f"starting {name}: {' '.join(argv)}")
        with ServerProcess(argv, int(p), ready_path=ready, log=workdir / f"{name}.log") as srv:
            served = "default" if name.startswith("lmlab") else gguf
            # warm-up (untimed): two requests, so the first timed one does not pay for lazy set-up
            run_level(srv.base_url, served, prompts[:2], concurrency=1, max_tokens=max_tokens, max_seconds=600,
                      tag=f"{name}-warmup")  # fmt: skip
            rows[name] = []
            for c in concurrency:
                row = run_level(srv.base_url, served, prompts, concurrency=c, max_tokens=max_tokens,
                                max_seconds=max_seconds, tag=f"{name}-c{c}")  # fmt: skip
                log(f"{name} c={c}: {row['tokens_per_s']:.1f} tok/s, p50 {row['latency_p50_s']:.2f} s")
                rows[name].append(row)
    for levels in rows.values():
        base = next((r for r in levels if r["concurrency"] == 1), None)
        for r in levels:
            r["speedup_vs_c1"] = (r["tokens_per_s"] / base["tokens_per_s"]) if base and base["tokens_per_s"] else None
    reasons = []
    if load_before[0] >= CONTENDED_LOAD_BEFORE:
        reasons.append(f"1-minute load {load_before[0]:.2f} >= {CONTENDED_LOAD_BEFORE} before the start")
    problems = [f"{n} c={r['concurrency']}: {p}" for n, lv in rows.items() for r in lv for p in r["problems"]]
    return {
        "model": model_spec,
        "engine": engine,
        "requests_per_level": requests,
        "max_tokens": max_tokens,
        "max_seconds": max_seconds,
        "prompt_words": prompt_words,
        "threads": {"lmlab": threads or "torch default", "llama.cpp": llama_threads},
        "servers": rows,
        "loadavg_before": list(load_before),
        "publishable": not reasons and not problems,
        "contention_reasons": reasons,
        "problems": problems,
        "notes": notes,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"# lmlab bench serve: {report['model']} ({report['engine']}), {report['requests_per_level']} requests x "
        f"{report['max_tokens']} tokens per level; load before {report['loadavg_before'][0]:.2f}",
        "",
        "| server | clients | requests | req/s | tokens/s | speed-up vs 1 client (ceiling: clients) | p50 s | p99 s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, levels in report["servers"].items():
        for r in levels:
            sp = f"{r['speedup_vs_c1']:.2f}x" if r.get("speedup_vs_c1") else "-"
            lines.append(f"| {name} | {r['concurrency']} | {r['requests']}/{r['requests_planned']} | "
                         f"{r['requests_per_s']:.2f} | {r['tokens_per_s']:.1f} | {sp} | {r['latency_p50_s']:.2f} | "
                         f"{r['latency_p99_s']:.2f} |")  # fmt: skip
    if not report["publishable"]:
        lines += ["", "NOT PUBLISHABLE: " + "; ".join(report["contention_reasons"] + report["problems"])]
    lines += [f"note: {n}" for n in report["notes"]]
    return "\n".join(lines)


def write_report(report: dict[str, Any], out_dir: Path) -> Path:
    """results.json (atomically) and report.md inside `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "results.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2))
    os.replace(tmp, path)
    (out_dir / "report.md").write_text(format_report(report) + "\n")
    return path
