"""The registry and the method folders stay in step; every spec resolves; configs round-trip."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lmlab import registry
from lmlab.config import BaseConfig, build_config, to_yaml
from lmlab.registry import AREAS, METHOD_INDEX, MethodSpec, get_method, list_methods, register_method

METHODS_DIR = Path(registry.__file__).parent / "methods"
REQUIRED_FILES = ("__init__.py", "config.py", "method.py", "experiment.py", "README.md")
README_HEADINGS = ("## Paper", "## Method", "## Reproduction", "## Deviations", "## Checklist")


def method_folders() -> set[str]:
    return {
        f"{p.parent.name}/{p.name}"
        for p in METHODS_DIR.glob("*/*")
        if p.is_dir() and p.name != "__pycache__" and (p / "__init__.py").exists()
    }


def test_index_equals_folders():
    assert set(METHOD_INDEX) == method_folders()
    assert len(METHOD_INDEX) == len(set(METHOD_INDEX))


def test_every_indexed_method_registers_its_own_id_and_area():
    ids = [s.id for s in list_methods()]
    assert ids == [e.split("/")[1] for e in METHOD_INDEX]
    for entry in METHOD_INDEX:
        area, method_id = entry.split("/")
        spec = get_method(method_id)
        assert spec.area == area and spec.area in AREAS


@pytest.mark.parametrize("entry", METHOD_INDEX)
def test_method_folder_shape(entry):
    folder = METHODS_DIR / entry
    for name in REQUIRED_FILES:
        assert (folder / name).is_file(), f"{entry} lacks {name}"
    readme = (folder / "README.md").read_text()
    for heading in README_HEADINGS:
        assert heading in readme, f"{entry}/README.md lacks a '{heading}' section"
    method_id = entry.split("/")[1]
    assert (Path(__file__).parent / "methods" / f"test_{method_id}.py").is_file()


@pytest.mark.parametrize("entry", METHOD_INDEX)
def test_spec_strings_resolve_and_presets_are_valid(entry):
    spec = get_method(entry.split("/")[1])
    cls = spec.config_class()
    assert dataclasses.is_dataclass(cls) and issubclass(cls, BaseConfig)
    assert callable(spec.run_function())
    for preset, overrides in spec.presets.items():
        cfg = build_config(cls, overrides)
        assert isinstance(cfg, cls), preset
    for f in dataclasses.fields(cls):
        assert f.metadata.get("help"), f"{spec.id}.{f.name} has no help text"
    assert spec.claim and spec.paper_url.startswith("http")


@pytest.mark.parametrize("entry", METHOD_INDEX)
def test_config_round_trips_through_yaml(entry, tmp_path):
    import yaml

    spec = get_method(entry.split("/")[1])
    cls = spec.config_class()
    cfg = build_config(cls, spec.presets.get("quick", {}))
    again = build_config(cls, yaml.safe_load(to_yaml(cfg)))
    assert again == cfg


def test_register_rejects_bad_ids_and_duplicates():
    base = dict(name="x", area="decoding", paper="p", paper_url="https://x", config="a:b", run="a:c", claim="c")
    with pytest.raises(ValueError, match="snake_case"):
        register_method(MethodSpec(id="Bad-Id", **base))
    with pytest.raises(ValueError, match="area"):
        register_method(MethodSpec(id="ok_id", **{**base, "area": "nowhere"}))
    with pytest.raises(ValueError, match="already a method called 'reflection_window'"):
        register_method(MethodSpec(id="reflection_window", **base, module="somewhere.else"))
    # a second folder with the same id: its package is read from its config path
    with pytest.raises(ValueError, match="already a method called 'rsd'"):
        register_method(MethodSpec(id="rsd", **{**base, "config": "lmlab.methods.decoding.other.config:C"}))
    assert get_method("rsd").module == "lmlab.methods.decoding.rsd"


def test_unknown_id_suggests_close_matches():
    with pytest.raises(registry.UnknownMethodError) as err:
        get_method("reflection_windw")
    assert "did you mean reflection_window" in str(err.value)
    assert "\n" not in str(err.value)


def test_listing_methods_does_not_import_torch():
    code = "import sys, lmlab.registry as r; r.list_methods(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_paper_values_are_cited_in_configs():
    # every method documents, for at least one hyperparameter, the paper's value
    for spec in list_methods():
        fields = dataclasses.fields(spec.config_class())
        own = [f for f in fields if f.name not in {g.name for g in dataclasses.fields(BaseConfig)}]
        assert any(f.metadata.get("paper") for f in own), spec.id


def test_readme_paper_links_match_specs():
    for spec in list_methods():
        text = spec.readme.read_text()
        assert re.search(re.escape(spec.paper_url.split("//")[1]), text), f"{spec.id} README lacks its paper link"


def test_lazy_exports_load_on_first_use_and_reject_double_exports():
    getattr_, names = registry.lazy_exports("lmlab.core.stats", uncertainty=("bootstrap_ci",), timing=("Timer",))
    assert names == ("bootstrap_ci", "Timer")
    from lmlab.core.stats import uncertainty

    assert getattr_("bootstrap_ci") is uncertainty.bootstrap_ci
    with pytest.raises(AttributeError, match="no_such_name"):
        getattr_("no_such_name")
    with pytest.raises(ValueError, match="'x' exported by both"):
        registry.lazy_exports("pkg", a=("x",), b=("x",))


def test_lazy_exports_can_take_a_submodules_own_all_without_importing_it(tmp_path, monkeypatch):
    pkg = tmp_path / "lazy_pkg_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "sub.py").write_text('__all__ = ["b", "a"]\nraise RuntimeError("imported")\n')
    (pkg / "plain.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    getattr_, names = registry.lazy_exports("lazy_pkg_probe", sub="__all__")
    assert names == ("b", "a")  # read from the source: importing sub would have raised
    with pytest.raises(RuntimeError, match="imported"):
        getattr_("a")  # first use imports it
    with pytest.raises(ValueError, match="defines no literal __all__"):
        registry.lazy_exports("lazy_pkg_probe", plain="__all__")
    with pytest.raises(ValueError, match="no submodule 'nope'"):
        registry.lazy_exports("lazy_pkg_probe", nope="__all__")


def test_every_exported_name_of_every_method_resolves():
    import importlib

    for spec in list_methods():
        package = importlib.import_module(spec.module)
        for name in package.__all__:
            assert getattr(package, name) is not None, f"{spec.module}.{name}"
