"""lmlab's fast decode engine: llama / gemma3 in plain torch over a static KV cache, fp32 or int4 weights.

`lmlab.core.inference.generation.decode(..., engine="fast")` runs on it (the default where the model supports it);
``engine="fast-int4"`` uses the int4 weights; ``engine="hf"`` the transformers forward. See `model.py` for the
design and `lmlab.bench_decode` (`lmlab bench decode`) for the measured speed.
"""

from lmlab.core.inference.engine.model import (
    ARCHS,
    EngineUnsupported,
    FastEngine,
    KVCache,
    get_engine,
    gguf_source,
    unsupported_reason,
)
from lmlab.core.inference.engine.quant import Int4Codes, Int4Linear, codes_from_gguf, int4_available, quantize

ENGINES = ("fast", "fast-int4", "hf")
_ALIASES = {"fast": "fast", "fast-fp32": "fast", "fp32": "fast", "fast-int4": "fast-int4", "int4": "fast-int4",
            "hf": "hf", "transformers": "hf"}  # fmt: skip
_DEFAULT: list[str] = []


def parse_engine(name: str) -> str:
    """Canonical engine name: ``fast`` (fp32, exact), ``fast-int4`` or ``hf``; one-line error otherwise."""
    key = str(name).strip().lower()
    if key not in _ALIASES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {name!r}")
    return _ALIASES[key]


def default_engine() -> str:
    """The engine `decode` uses when none is given: `set_default_engine`, else $LMLAB_ENGINE, else ``fast``."""
    import os

    if _DEFAULT:
        return _DEFAULT[-1]
    return parse_engine(os.environ.get("LMLAB_ENGINE", "fast"))


def set_default_engine(name: str | None) -> None:
    """Set (or with None, clear) the process-wide default engine (what ``lmlab run --engine`` does)."""
    _DEFAULT.clear()
    if name is not None:
        _DEFAULT.append(parse_engine(name))


__all__ = [
    "ARCHS",
    "ENGINES",
    "EngineUnsupported",
    "FastEngine",
    "Int4Codes",
    "Int4Linear",
    "KVCache",
    "codes_from_gguf",
    "default_engine",
    "get_engine",
    "gguf_source",
    "int4_available",
    "parse_engine",
    "quantize",
    "set_default_engine",
    "unsupported_reason",
]
