"""lmlab: recent LLM research methods on small real models, offline on a CPU.

Importing lmlab is cheap: torch and transformers load only when a method runs.

    >>> import lmlab
    >>> [s.id for s in lmlab.list_methods()][:1]
    ['reflection_window']
"""

from __future__ import annotations

from typing import Any

from lmlab.version import __version__


def list_methods(area: str | None = None, tag: str | None = None) -> list[Any]:
    """The registered `MethodSpec`s (see `lmlab.registry.list_methods`)."""
    from lmlab.registry import list_methods as _list

    return _list(area=area, tag=tag)


def get_method(method_id: str) -> Any:
    """The `MethodSpec` of `method_id`; unknown ids raise with close-match suggestions."""
    from lmlab.registry import get_method as _get

    return _get(method_id)


def run(method_id: str, *, model: str | None = None, preset: str = "default", seed: int = 0, write: bool = False,
        **overrides: Any) -> Any:  # fmt: skip
    """Run a method's experiment and return its `RunResult` (`.status`, `.claims`, `.metrics`, `.to_json()`).

    Args:
        method_id: a registered id (`lmlab list`).
        model: alias, HF folder or GGUF file (default: the method's default).
        preset: ``smoke``, ``quick`` or ``default``.
        seed: seeds python, numpy, torch and the data.
        write: also write the run folder under ``runs/`` (the CLI always writes).
        overrides: config fields, e.g. ``sigma=1.0``.
    """
    from lmlab.runner import run_method

    if model is not None:
        overrides["model"] = model
    return run_method(method_id, preset=preset, seed=seed, write=write, **overrides)


__all__ = ["__version__", "get_method", "list_methods", "run"]
