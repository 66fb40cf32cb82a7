"""`lmlab bench serve` end to end on the tiny model: real server processes, request ids checked."""

from __future__ import annotations

import json

import pytest

from lmlab.cli import main
from lmlab.serve.bench import run_level

pytestmark = [pytest.mark.loopback]


@pytest.mark.slow
def test_bench_serve_on_the_tiny_model_answers_every_request_once(tmp_path, capsys):
    out = tmp_path / "bench"
    rc = main(["bench", "serve", "--model", "tiny-llama", "--engine", "fast", "--concurrency", "1", "3",
               "--requests", "6", "--max-tokens", "4", "--no-llamacpp", "--out", str(out)])  # fmt: skip
    report = json.loads((out / "results.json").read_text())
    assert rc == 0 and report["problems"] == []
    (levels,) = report["servers"].values()
    assert [r["concurrency"] for r in levels] == [1, 3]
    for r in levels:
        assert r["requests"] == 6 and r["completion_tokens"] > 0
        assert r["latency_p50_s"] <= r["latency_p99_s"]
    assert "| lmlab-fast | 3 |" in (out / "report.md").read_text()


def test_bad_bench_arguments_are_refused_before_anything_runs(tmp_path, capsys):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    assert main(["bench", "serve", "--out", str(a_file)]) == 2
    assert "must be a folder" in capsys.readouterr().err
    assert main(["bench", "serve", "--concurrency", "0"]) == 2
    assert "--concurrency must be >= 1, got 0" in capsys.readouterr().err


def test_a_server_that_answers_twice_or_loses_a_request_is_caught(monkeypatch):
    """run_level's integrity check, against a stand-in client whose server echoes the wrong ids."""
    import types

    class FakeRaw:
        def __init__(self, rid):
            self.headers = {"x-request-id": rid}

        def parse(self):
            return types.SimpleNamespace(id="cmpl-same", usage=types.SimpleNamespace(completion_tokens=3))

    class FakeCompletions:
        def __init__(self):
            self.with_raw_response = self

        def create(self, **kw):
            return FakeRaw("dup")  # every answer claims the same id

    class FakeClient:
        def __init__(self, **kw):
            self.completions = FakeCompletions()

    import openai

    monkeypatch.setattr(openai, "OpenAI", FakeClient)
    row = run_level("http://127.0.0.1:1/v1", "m", ["a", "b", "c"], concurrency=2, max_tokens=3, max_seconds=10,
                    tag="t")  # fmt: skip
    assert any("lost or answered twice" in p for p in row["problems"])
    assert any("same completion id" in p for p in row["problems"])


def test_request_ids_are_uuids_that_llama_cpp_server_accepts(monkeypatch):
    """llama_cpp.server (starlette-context's RequestIdPlugin) answers a non-UUID X-Request-Id with an empty 400."""
    import types
    import uuid

    seen: list[str] = []

    class FakeRaw:
        def __init__(self, rid):
            self.headers = {"x-request-id": rid}

        def parse(self):
            return types.SimpleNamespace(id=f"cmpl-{len(seen)}", usage=types.SimpleNamespace(completion_tokens=1))

    class FakeClient:
        def __init__(self, **kw):
            self.completions = self
            self.with_raw_response = self

        def create(self, **kw):
            rid = kw["extra_headers"]["X-Request-Id"]
            uuid.UUID(rid)  # raises on anything but a UUID, as the plugin does
            seen.append(rid)
            return FakeRaw(rid)

    import openai

    monkeypatch.setattr(openai, "OpenAI", FakeClient)
    row = run_level("http://127.0.0.1:1/v1", "m", ["a", "b", "c"], concurrency=1, max_tokens=1, max_seconds=10,
                    tag="t")  # fmt: skip
    assert row["problems"] == [] and len(set(seen)) == 3
    again = run_level("http://127.0.0.1:1/v1", "m", ["a", "b", "c"], concurrency=1, max_tokens=1, max_seconds=10,
                      tag="t2")  # fmt: skip
    assert again["problems"] == [] and not set(seen[:3]) & set(seen[3:])  # another tag, other ids
