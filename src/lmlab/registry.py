"""The method registry: one `MethodSpec` per method, found through `METHOD_INDEX`.

A method folder's `__init__.py` builds its `MethodSpec` and calls `register_method`; it imports no torch, so
`lmlab list` stays fast. The `config` and `run` fields are lazy ``"module:attr"`` strings, resolved only when a
method is run or inspected (lm-evaluation-harness and vLLM do the same).

Adding a method: its folder under ``methods/<area>/<id>/`` and one line in `METHOD_INDEX`. A test keeps the index
and the folders in step.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

AREAS: tuple[str, ...] = (
    "decoding",
    "efficiency",
    "compression",
    "selection",
    "evaluation",
    "alignment",
    "adaptation",
    "analysis",
)

PRESETS: tuple[str, ...] = ("smoke", "quick", "default")

DEFAULT_BUDGET_S: Mapping[str, float] = {"smoke": 10.0, "quick": 60.0, "default": 300.0}

# One line per method, "area/id", in catalogue order. `tests/test_registry.py` checks it equals the folders.
METHOD_INDEX: tuple[str, ...] = (
    "decoding/reflection_window",
    "decoding/spec_search",
    "decoding/rsd",
    "decoding/farma",
    "decoding/ralu",
    "compression/wanda",
    "compression/sparsegpt",
    "compression/lora_gen",
    "compression/atp",
    "compression/maiht",
    "efficiency/mminference",
    "efficiency/memory_layers",
    "efficiency/aoe",
    "efficiency/fp_quant_scaling",
    "efficiency/shadowkv",
    "analysis/fractal_text",
    "analysis/model_independence",
    "alignment/graphfilter",
    "alignment/implicit_prm",
    "alignment/alignment_potential",
    "alignment/mpo",
    "alignment/rlthf",
    "alignment/ple",
    "alignment/swiftcode",
    "analysis/state_tracking",
    "analysis/ibcircuit",
    "analysis/wikibigedit",
    "adaptation/nonzero_lora",
    "adaptation/d_reft",
    "adaptation/ferret",
    "adaptation/model_swarms",
    "adaptation/fedicu",
    "adaptation/awl",
    "adaptation/cross_modal_merge",
    "selection/lensllm",
    "selection/cascade_routing",
    "selection/kabb",
    "evaluation/pmf_predict",
    "evaluation/cv_winrate",
    "evaluation/potemkin",
)

_ID_RE = re.compile(r"^[a-z][a-z0-9_]*[a-z0-9]$")


class UnknownMethodError(KeyError):
    """Raised for a method id that is not registered; the message suggests close matches."""

    def __str__(self) -> str:  # KeyError quotes its message; a user wants the plain sentence
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class MethodSpec:
    """Metadata of one method: what `lmlab list` and `lmlab info` show, and where its code lives.

    Args:
        id (`str`): lower snake_case id, unique across areas (``"rsd"``).
        name (`str`): human name (``"Reward-Guided Speculative Decoding"``).
        area (`str`): one of `AREAS`.
        paper (`str`): paper title.
        paper_url (`str`): arXiv / OpenReview / PMLR link.
        config (`str`): lazy ``"module:Class"`` of the config dataclass.
        run (`str`): lazy ``"module:function"`` of the experiment, ``run(cfg, ctx) -> RunResult``.
        claim (`str`): the paper's headline claim in one sentence, as lmlab checks it.
        code_url (`str`, *optional*): official repository, if any.
        baselines (`tuple[str, ...]`): ids of registered methods or names of core functions.
        default_model (`str`): model alias used when `--model` is not given.
        suites (`tuple[str, ...]`): data suites the experiment uses.
        presets (`Mapping[str, Mapping[str, Any]]`): config overrides per preset (``smoke``, ``quick``).
        budget_s (`Mapping[str, float]`): time budget per preset on 2 cores with cached models.
        requires (`tuple[str, ...]`): optional Python packages (import names) the method needs.
        tags (`tuple[str, ...]`): free tags, e.g. ``"baseline"`` for a full-algorithm baseline.
        bibtex (`str`, *optional*): citation.
        module (`str`): the method's package (filled in by `register_method`).
    """

    id: str
    name: str
    area: str
    paper: str
    paper_url: str
    config: str
    run: str
    claim: str
    code_url: str | None = None
    baselines: tuple[str, ...] = ()
    default_model: str = "smollm2-135m"
    suites: tuple[str, ...] = ()
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    budget_s: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_BUDGET_S))
    requires: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    bibtex: str | None = None
    module: str = ""

    @property
    def folder(self) -> Path:
        return Path(__file__).parent / "methods" / self.area / self.id

    @property
    def readme(self) -> Path:
        return self.folder / "README.md"

    def missing_requirements(self) -> list[str]:
        """Import names in `requires` that are not installed (checked without importing them)."""
        import importlib.util

        return [name for name in self.requires if importlib.util.find_spec(name) is None]

    @property
    def available(self) -> bool:
        return not self.missing_requirements()

    def config_class(self) -> type:
        return load_attr(self.config)

    def run_function(self) -> Any:
        return load_attr(self.run)

    def budget(self, preset: str) -> float:
        return float(self.budget_s.get(preset, DEFAULT_BUDGET_S.get(preset, 300.0)))


_REGISTRY: dict[str, MethodSpec] = {}
_LOADED = False


def register_method(spec: MethodSpec) -> MethodSpec:
    """Validate and register `spec`; called from a method folder's `__init__.py`."""
    if not _ID_RE.match(spec.id) or "__" in spec.id:
        raise ValueError(f"method id {spec.id!r} is not lower snake_case (expected e.g. 'reflection_window')")
    if spec.area not in AREAS:
        raise ValueError(f"method {spec.id!r} has area {spec.area!r}; expected one of {', '.join(AREAS)}")
    if not spec.module:  # the package holding the config module: "lmlab.methods.decoding.rsd.config:X" -> "...rsd"
        spec = dataclasses.replace(spec, module=spec.config.partition(":")[0].rpartition(".")[0])
    existing = _REGISTRY.get(spec.id)
    if existing is not None and existing.module != spec.module:
        raise ValueError(f"There is already a method called {spec.id!r} (in {existing.module})")
    for preset in spec.presets:
        if preset not in PRESETS:
            raise ValueError(f"method {spec.id!r} has preset {preset!r}; expected one of {', '.join(PRESETS)}")
    for part in (spec.config, spec.run):
        if ":" not in part:
            raise ValueError(f"method {spec.id!r}: {part!r} is not a lazy 'module:attr' string")
    _REGISTRY[spec.id] = spec
    return spec


def _load_index() -> None:
    global _LOADED
    if _LOADED:
        return
    for entry in METHOD_INDEX:
        area, method_id = entry.split("/")
        importlib.import_module(f"lmlab.methods.{area}.{method_id}")
    _LOADED = True


def list_methods(area: str | None = None, tag: str | None = None) -> list[MethodSpec]:
    """Registered methods in `METHOD_INDEX` order, optionally filtered by area or tag."""
    _load_index()
    if area is not None and area not in AREAS:
        raise ValueError(f"unknown area {area!r}; expected one of {', '.join(AREAS)}")
    order = {entry.split("/")[1]: i for i, entry in enumerate(METHOD_INDEX)}
    specs = sorted(_REGISTRY.values(), key=lambda s: order.get(s.id, len(order)))
    return [s for s in specs if (area is None or s.area == area) and (tag is None or tag in s.tags)]


def get_method(method_id: str) -> MethodSpec:
    """The spec of `method_id`; an unknown id raises `UnknownMethodError` with close matches."""
    _load_index()
    try:
        return _REGISTRY[method_id]
    except KeyError:
        close = difflib.get_close_matches(method_id, list(_REGISTRY), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else "; run `lmlab list` to see them"
        raise UnknownMethodError(f"unknown method {method_id!r}{hint}") from None


def load_attr(path: str) -> Any:
    """Resolve a lazy ``"package.module:attr"`` string."""
    module_name, _, attr = path.partition(":")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ImportError(f"{module_name} has no attribute {attr!r} (from {path!r})") from None


def _static_all(package: str, submodule: str) -> tuple[str, ...]:
    """The ``__all__`` of `package.submodule`, read from its source without importing it (no torch at list time)."""
    import ast

    spec = importlib.util.find_spec(f"{package}.{submodule}")
    if spec is None or not spec.origin:
        raise ValueError(f"{package}: no submodule {submodule!r} to read __all__ from")
    for node in ast.parse(Path(spec.origin).read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise ValueError(f"{package}.{submodule} defines no literal __all__; list its exports in lazy_exports instead")


def lazy_exports(package: str, **modules: tuple[str, ...] | str) -> tuple[Callable[[str], Any], tuple[str, ...]]:
    """A module-level `__getattr__` for a method package that loads its submodules on first use.

    A method's `__init__.py` must import no torch (so that `lmlab list` stays fast), yet users expect
    ``from lmlab.methods.compression.wanda import wanda_prune``. Each keyword names a submodule of `package` and
    the names it exports::

        __getattr__, _LAZY = lazy_exports(__name__, method=("wanda_prune",), experiment=("helper",))
        __all__ = ["SPEC", *_LAZY]

    ``method="__all__"`` exports the submodule's own ``__all__``, read from its source (not imported), so the list
    is written once, in the module that defines the names.

    Returns:
        (`__getattr__`, the exported names in the order given).
    """
    where: dict[str, str] = {}
    for submodule, names in modules.items():
        if names == "__all__":
            names = _static_all(package, submodule)
        for name in names:
            if name in where:
                raise ValueError(f"{package}: {name!r} exported by both {where[name]!r} and {submodule!r}")
            where[name] = submodule

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{where[name]}"), name)

    return __getattr__, tuple(where)
