"""Configs: standard-library dataclasses, resolved from defaults, a preset, a YAML file and ``--set`` overrides.

Every field has a default and ``metadata={"help": ..., "paper": ...}`` (the paper's value, shown by `lmlab info`
beside lmlab's default). `BaseConfig` holds the fields every method shares; a method's config subclasses it and adds
only its own hyperparameters, validated in ``__post_init__`` with errors that name the field.

Resolution order (later wins): dataclass defaults, the preset's overrides (``spec.presets[preset]``), a YAML/JSON
file, ``--set key=value`` pairs (values parsed with `ast.literal_eval`, falling back to the raw string), then
keyword overrides from the Python API.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


def param(
    default: Any,
    help: str,
    *,
    paper: str | None = None,
    choices: Sequence[Any] | None = None,
    lo: float | None = None,
    hi: float | None = None,
    open_lo: bool = False,
    allow_inf: bool = False,
    nonempty: bool = False,
) -> Any:
    """A config field with its help text, the paper's value (``"0.5 (Sec. 4)"``) and what values it accepts.

    Declaring the accepted values here (rather than only in a ``__post_init__``) lets `BaseConfig` check every
    field the same way, whichever way the config was built (``--set``, a YAML file, the Python API), and name the
    field in the error.

    Args:
        choices: the only values allowed. lo, hi, open_lo: numeric range ``[lo, hi]`` (``(lo, hi]`` with open_lo),
            also applied to each number of a list value. allow_inf: accept ``inf`` (refused by default: a config
            number is finite unless its default is infinite). nonempty: refuse an empty string or list.
    """
    meta: dict[str, Any] = {"help": help}
    if paper is not None:
        meta["paper"] = paper
    if choices is not None:
        meta["choices"] = tuple(choices)
    if lo is not None or hi is not None:
        meta["range"] = (lo, hi, open_lo)
    if allow_inf:
        meta["allow_inf"] = True
    if nonempty:
        meta["nonempty"] = True
    if isinstance(default, list | dict | set):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_distinct_seeds(name: str, value: object) -> None:
    """Raise ``ValueError`` naming `name` unless `value` is a non-empty list (or tuple) of distinct ints >= 0."""
    if (
        not isinstance(value, (list, tuple))
        or not value
        or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in value)
        or len(set(value)) != len(value)
    ):
        raise ValueError(f"{name} must be a non-empty list of distinct ints >= 0, got {value!r}")


def check_range(name: str, value: float, lo: float | None = None, hi: float | None = None, *, open_lo: bool = False):
    """Raise ``ValueError`` naming `name` unless lo <= value <= hi (lo < value with `open_lo`); NaN is refused."""
    if value is None:
        return
    lo_s = "-inf" if lo is None else f"{lo}"
    hi_s = "inf" if hi is None else f"{hi}"
    bracket = "(" if open_lo else "["
    if not _is_number(value) and not (hasattr(value, "__float__") and not isinstance(value, str | bool)):
        raise ValueError(f"{name} must be a number in {bracket}{lo_s}, {hi_s}], got {value!r}")
    if value != value:  # NaN compares false with everything, so it would pass every bound below
        raise ValueError(f"{name} must be a number in {bracket}{lo_s}, {hi_s}], got nan")
    bad = (lo is not None and (value <= lo if open_lo else value < lo)) or (hi is not None and value > hi)
    if bad:
        raise ValueError(f"{name} must be in {bracket}{lo_s}, {hi_s}], got {value!r}")


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def _check_number(name: str, value: Any, default: Any, meta: Mapping[str, Any]) -> None:
    """NaN is never a setting; inf only where the field says so or its default is infinite; ints fit in int64."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
        raise ValueError(f"{name} must be an integer of magnitude below 2**63 (torch's int64), got {value!r}")
    if not isinstance(value, float):
        return
    if math.isnan(value):
        raise ValueError(f"{name} must be a finite number, got nan")
    if math.isinf(value) and not meta.get("allow_inf") and not (isinstance(default, float) and math.isinf(default)):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def check_field(f: dataclasses.Field, value: Any) -> None:
    """Validate one field's value against what its `param(...)` declares (choices, range, finiteness, emptiness).

    A list value is checked number by number (a sweep of thresholds: each must be finite and in range).
    """
    meta = f.metadata
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise ValueError(f"{f.name} must be one of {', '.join(map(str, choices))}, got {value!r}")
    if isinstance(value, list | tuple):
        checks = [(f"{f.name}[{i}]", item, None) for i, item in enumerate(value) if _is_number(item)]
    else:
        checks = [(f.name, value, _field_default(f))] if value is not None else []
    for label, item, default in checks:
        _check_number(label, item, default, meta)
        if "range" in meta:
            lo, hi, open_lo = meta["range"]
            check_range(label, item, lo, hi, open_lo=open_lo)
    if meta.get("nonempty") and isinstance(value, str | list | tuple | dict):
        if not (value.strip() if isinstance(value, str) else value):
            raise ValueError(f"{f.name} must not be empty, got {value!r}")


def _check_elements(f: dataclasses.Field, value: Any) -> Any:
    """A list value whose default is a list of one kind (all numbers, or all strings) must hold that kind too.

    Most list fields are annotated as a bare ``list``, so the default is the only record of what they hold;
    ``--set thresholds="['a']"`` would otherwise reach the experiment and fail there with a traceback.
    """
    default = _field_default(f)
    if not isinstance(value, list | tuple) or not isinstance(default, list | tuple) or not default:
        return value
    if all(_is_number(d) for d in default):
        kind, ok = "number", _is_number
    elif all(isinstance(d, str) for d in default):
        kind, ok = "string", lambda v: isinstance(v, str)
    else:
        return value
    for i, item in enumerate(value):
        if not ok(item):
            raise ValueError(f"{f.name}[{i}] must be a {kind} (like {default[0]!r}), got {item!r}")
    if all(isinstance(d, float) for d in default):  # [1, 2] for a float sweep: convert, as for a float field
        value = type(value)(float(v) for v in value)
    return value


@dataclass
class BaseConfig:
    """Fields shared by every method.

    Args:
        model (`str`, defaults to ``"smollm2-135m"``): model alias, HF folder, or GGUF file (see `lmlab models`).
        seed (`int`, defaults to 0): seeds python, numpy, torch and the data suites.
        device (`str`, defaults to ``"cpu"``): ``cpu``, ``cuda``, ``mps`` or ``auto``.
        dtype (`str`, defaults to ``"float32"``): ``float32`` or ``bfloat16``.
        compute_dtype (`str`, defaults to ``"float32"``): ``float32`` or ``bfloat16``: the whole run under bf16
            autocast on its device (fp32 weights, gradients and optimizer state; `lmlab.core.inference.precision`).
        threads (`int`, *optional*): torch threads (default: leave torch's setting).
        limit (`int`, *optional*): use only the first `limit` examples of each data split.
        batch_size (`int`, defaults to 8): batch size for scoring and batched generation.
        max_new_tokens (`int`, defaults to 32): generation budget per prompt.
        output_dir (`str`, defaults to ``"runs"``): where `lmlab run` writes its folder.
    """

    model: str = param("smollm2-135m", "model alias, local HF folder, or GGUF file")
    seed: int = param(0, "seed for python, numpy, torch and data generation")
    device: str = param("cpu", "device", choices=("cpu", "cuda", "mps", "auto"))
    dtype: str = param("float32", "model dtype", choices=("float32", "bfloat16"))
    compute_dtype: str = param(
        "float32", "matmul precision of the run (bfloat16: autocast, fp32 weights)", choices=("float32", "bfloat16")
    )
    threads: int | None = param(None, "torch threads (None: leave torch's default)")
    limit: int | None = param(None, "use only the first LIMIT examples of each split")
    batch_size: int = param(8, "batch size for scoring and batched generation")
    max_new_tokens: int = param(32, "generation budget per prompt")
    output_dir: str = param("runs", "output folder of `lmlab run`")

    def __post_init__(self) -> None:
        for f in fields(self):
            check_field(f, getattr(self, f.name))
        check_range("seed", self.seed, 0, 2**32 - 1)  # numpy's seed range
        check_range("batch_size", self.batch_size, 1)
        check_range("max_new_tokens", self.max_new_tokens, 1)
        check_range("threads", self.threads, 1, 4096)
        check_range("limit", self.limit, 1)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def config_fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in fields(cls)}


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(cls: type, name: str, value: Any, hint: Any) -> Any:
    """Check `value` against the annotation `hint` of field `name`, converting int -> float where needed."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(cls, name, value, option)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(errors[0] if errors else f"{name}: bad value {value!r}")
    expected = origin or hint
    if expected is Any:
        return value
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is tuple and isinstance(value, list):
        return tuple(value)
    if expected in (list, tuple) and isinstance(value, list | tuple):
        return expected(value)
    if expected is bool and not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    if expected is int and isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if isinstance(expected, type) and not isinstance(value, expected):
        raise ValueError(f"{name} must be of type {expected.__name__}, got {value!r} ({type(value).__name__})")
    return value


def parse_value(text: str) -> Any:
    """``--set`` values: Python literals (``0.5``, ``[1, 2]``, ``None``, ``True``), YAML-style booleans, bare lists
    of words (``[plain, parity_cur]``: each item parsed the same way), else text."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "none", "~"):
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        pass
    stripped = text.strip()
    if stripped.startswith("[") and stripped.endswith("]"):  # a bare list, YAML-style: [plain, parity_cur]
        inner = stripped[1:-1].strip()
        return [parse_value(item.strip()) for item in inner.split(",")] if inner else []
    return text


def parse_sets(pairs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"--set expects key=value, got {pair!r}")
        key, _, text = pair.partition("=")
        _assign_dotted(out, key.strip(), parse_value(text))
    return out


def _assign_dotted(target: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    for part in parts[:-1]:
        target = target.setdefault(part, {})
    target[parts[-1]] = value


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON config file into a dict (a saved ``config.yaml`` round-trips)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file {str(path)!r} does not exist")
    text = path.read_text()
    if path.suffix == ".json":
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {str(path)!r} must hold a mapping of field: value, got {type(data).__name__}")
    return data


def build_config(cls: type, *layers: Mapping[str, Any]) -> Any:
    """Instantiate `cls` from its defaults and `layers` of overrides (later wins), validating keys and types."""
    known = config_fields(cls)
    hints = _field_types(cls)
    merged: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if key not in known:
                import difflib

                close = difflib.get_close_matches(key, list(known), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(
                    f"unknown config key {key!r} for {cls.__name__}{hint}; valid keys: {', '.join(known)}"
                )
            current = merged.get(key)
            if isinstance(value, Mapping) and isinstance(current, Mapping):
                value = {**current, **value}
            merged[key] = _check_elements(known[key], _coerce(cls, key, value, hints[key]))
    try:
        return cls(**merged)
    except (TypeError, ArithmeticError, AttributeError) as e:
        # a __post_init__ that did arithmetic on a value before checking it: still one line naming the values
        given = ", ".join(f"{k}={v!r}" for k, v in merged.items())
        raise ValueError(f"{cls.__name__} refused {given or 'its defaults'}: {type(e).__name__}: {e}") from None


def to_yaml(cfg: Any) -> str:
    return to_yaml_dict(dataclasses.asdict(cfg))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def describe_fields(cls: type) -> list[dict[str, Any]]:
    """Per field: name, type, default, paper value, help (what `lmlab info` prints)."""
    rows = []
    for f in fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        rows.append(
            {
                "name": f.name,
                "type": str(f.type),
                "default": default,
                "paper": f.metadata.get("paper", ""),
                "help": f.metadata.get("help", ""),
                "base": f.name in config_fields(BaseConfig),
            }
        )
    return rows


def to_yaml_dict(data: Mapping[str, Any]) -> str:
    """A resolved config dict as YAML (what run folders save as ``config.yaml``)."""
    import yaml

    return yaml.safe_dump(_plain(dict(data)), sort_keys=False)
