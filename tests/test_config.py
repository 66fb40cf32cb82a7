"""Config resolution: defaults < preset < file < --set < overrides, with one-line errors naming the field."""

from __future__ import annotations

import pytest

from lmlab.config import build_config, load_config_file, parse_sets, parse_value
from lmlab.registry import get_method
from lmlab.runner import resolve_config


def test_resolution_order(tmp_path):
    spec = get_method("reflection_window")
    path = tmp_path / "cfg.yaml"
    path.write_text("sigma: 0.7\nwindow: 3\n")
    cfg = resolve_config(spec, preset="quick", config_file=path, sets=["window=5"], overrides={"seed": 3})
    assert cfg.sigma == 0.7  # file over default
    assert cfg.window == 5  # --set over file
    assert cfg.seed == 3
    assert cfg.n_capitals == spec.presets["quick"]["n_capitals"]  # preset over default


def test_set_values_are_literals():
    assert parse_sets(["a=1", "b=0.5", "c=[1, 2]", "d=true", "e=None", "f=hello"]) == {
        "a": 1, "b": 0.5, "c": [1, 2], "d": True, "e": None, "f": "hello"
    }  # fmt: skip
    assert parse_sets(["x.y=2"]) == {"x": {"y": 2}}
    assert parse_value("'quoted'") == "quoted"
    # bare lists of words, as the READMEs write them (--set groups=[S3,S5]), are lists, items parsed alike
    assert parse_value("[plain,parity_cur]") == ["plain", "parity_cur"]
    assert parse_value("[S3, 0.5, true]") == ["S3", 0.5, True] and parse_value("[]") == []
    with pytest.raises(ValueError, match="key=value"):
        parse_sets(["novalue"])


@pytest.mark.parametrize(
    "override, message",
    [
        ({"sigma": -1.0}, "sigma must be in"),
        ({"window": 0}, "window must be in"),
        ({"rule": "sometimes"}, "rule must be one of"),
        ({"sigmaa": 0.1}, "unknown config key 'sigmaa'.*did you mean 'sigma'"),
        ({"window": "four"}, "window must be of type int"),
        ({"calibrate_sigma": 1}, "calibrate_sigma must be true or false"),
        ({"batch_size": 0}, "batch_size must be in"),
    ],
)
def test_bad_values_name_the_field(override, message):
    cls = get_method("reflection_window").config_class()
    with pytest.raises(ValueError, match=message) as err:
        build_config(cls, override)
    assert "\n" not in str(err.value)


def test_int_is_accepted_for_float_fields():
    cls = get_method("reflection_window").config_class()
    assert build_config(cls, {"sigma": 1}).sigma == 1.0


def test_config_file_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_config_file(tmp_path / "missing.yaml")
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="mapping"):
        load_config_file(bad)
