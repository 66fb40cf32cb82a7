"""The browser report (`lmlab.report_html`) read as HTML: self-contained, images that decode, counts, escaping."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image

from lmlab.errors import LmlabError, UsageError
from lmlab.report_html import render_report, write_report

_spec = importlib.util.spec_from_file_location("report_grid", Path(__file__).parent / "fixtures" / "report_grid.py")
report_grid = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report_grid)


class _Tags(HTMLParser):
    """Every start tag with its attributes, and the text inside <script> elements."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts.append(data)


def _parse(text: str) -> _Tags:
    p = _Tags()
    p.feed(text)
    return p


@pytest.fixture
def report(tmp_path):
    folder, grid = report_grid.make_report_folder(tmp_path / "rep")
    path = write_report(folder)
    return path, path.read_text(), grid


def test_write_report_writes_report_html(report):
    path, text, _ = report
    assert path.name == "report.html" and path.exists()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert not list(path.parent.glob(".report.html.*"))  # the atomic write left no temporary file


def test_self_contained_no_network_reference(report):
    _, text, _ = report
    tags = _parse(text).tags
    refs = [(t, k, v) for t, a in tags for k, v in a.items() if k in ("src", "href", "srcset", "data", "action")]
    assert refs, "the report has no src/href at all: the parser saw nothing"
    remote = [r for r in refs if re.match(r"\s*(https?:)?//", r[2] or "", re.I)]
    assert not remote, remote
    assert not [a for t, a in tags if t == "link"]  # no external stylesheet / font
    assert not [a for t, a in tags if t == "script" and "src" in a]
    assert "@import" not in text and "url(http" not in text


def test_every_image_is_a_png_data_uri_that_decodes(report):
    _, text, _ = report
    imgs = [a for t, a in _parse(text).tags if t == "img"]
    n_areas = len(set(report_grid.AREAS.values()))
    assert len(imgs) == n_areas + report_grid.N_RUN_PNGS  # the forest plots, every good cell PNG, not broken.png
    for a in imgs:
        src = a["src"]
        assert src.startswith("data:image/png;base64,"), src[:40]
        data = base64.b64decode(src.split(",", 1)[1], validate=True)
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            assert im.format == "PNG" and im.width > 0 and im.height > 0
    assert "forest plot: pruning" in text


def test_counts_line(report):
    _, text, grid = report
    assert grid["counts"] == {"cells": 10, "holds": 1, "does_not_hold": 1, "fragile": 1, "inconclusive": 0,
                              "errors": 1, "skipped": 4}  # fmt: skip
    line = "cells run 10: holds 1 / does not hold 1 / fragile 1 / inconclusive 0 / errors 1 / skipped 4"
    assert f"<p class='counts' id='counts'>{line}</p>" in text


def test_strings_from_results_are_escaped(report):
    _, text, _ = report
    assert report_grid.EVIL not in text
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in text
    assert "Alpha &lt;Method&gt;" in text  # the method name from result.json
    assert "RuntimeError: boom &lt;in cell&gt;" in text  # an error cell's reason
    parsed = _parse(text)
    assert len([t for t, _ in parsed.tags if t == "script"]) == 1  # only the report's own script
    assert not [t for t, _ in parsed.tags if t == "b"]


def test_method_table_verdicts_and_matrix(report):
    _, text, _ = report
    rows = {m: v for v, m in re.findall(r"data-verdict='([^']*)' data-method='([^']*)'", text)}
    assert rows == {"beta": "fragile", "gamma": "does_not_hold", "alpha": "holds"}
    assert "2 of 3" in text  # beta holds in 2 of its 3 voting cells (the errored one excluded)
    assert "id='matrix'" in text
    for m in rows:
        assert f"id='m-{m}'" in text
    matrix = text[text.index("id='matrix'") : text.index("id='methods'")]
    assert matrix.count("v-skipped") == 4 and matrix.count("v-error") == 1
    assert "<select id='f-verdict'>" in text and "<option value='fragile'>fragile</option>" in text


def test_single_cell_folder_without_grid_json(tmp_path):
    """The old layout (<folder>/<method>/result.json, no grid.json): the grid is rebuilt from the folders."""
    for i, (method, status) in enumerate((("wanda", "supported"), ("kabb", "not_supported"))):
        d = tmp_path / method
        d.mkdir()
        claim = {"text": f"{method} < claim", "metric": "acc", "method": method, "baseline": "b", "direction": ">",
                 "min_effect": 0.0, "observed_effect": 0.1 - 0.2 * i, "ci": [0.05 - 0.2 * i, 0.15 - 0.2 * i],
                 "gate": True, "mechanism": False, "status": status}  # fmt: skip
        info = {"method": method, "area": "pruning", "seed": 0, "preset": "smoke", "status": "ok", "total_time_s": 1.0}
        result = {"run_info": info, "claim": {"text": claim["text"], "status": status}, "claims": [claim]}
        (d / "result.json").write_text(json.dumps(result))
        (d / "plot.png").write_bytes(report_grid.tiny_png())
    text = write_report(tmp_path).read_text()
    assert "cells run 2: holds 1 / does not hold 1 / fragile 0 / inconclusive 0 / errors 0 / skipped 0" in text
    assert "id='matrix'" not in text  # one seed, one model: no verdict matrix
    assert "wanda &lt; claim" in text and "id='m-kabb'" in text
    assert len([a for t, a in _parse(text).tags if t == "img"]) == 1 + 2  # one area's forest plot + two figures


def test_render_report_on_an_empty_grid(tmp_path):
    text = render_report({"cells": [], "methods": [], "counts": {}}, tmp_path)
    assert "cells run 0:" in text and "<img" not in text


def test_bad_input_gives_one_line_errors(tmp_path):
    with pytest.raises(UsageError, match="not a directory"):
        write_report(tmp_path / "missing")
    (tmp_path / "grid.json").write_text("{truncated")
    with pytest.raises(LmlabError, match="grid.json is not valid JSON"):
        write_report(tmp_path)
    (tmp_path / "grid.json").write_text("[]")
    with pytest.raises(LmlabError, match="no 'cells' list"):
        write_report(tmp_path)


def test_report_of_a_real_smoke_run(tmp_path):
    """A real run folder (wanda, smoke preset, tiny model) reads into the report: the result.json keys match."""
    from lmlab.runner import run_method

    run_method("wanda", preset="smoke", folder=tmp_path / "wanda", model="tiny-llama", show_progress=False)
    text = write_report(tmp_path).read_text()
    assert "id='m-wanda'" in text and "cells run 1:" in text
    imgs = [a for t, a in _parse(text).tags if t == "img"]
    assert len(imgs) >= 1 + len(list((tmp_path / "wanda").glob("*.png")))


def test_forest_plot_draws_an_interval_that_excludes_its_effect():
    from lmlab.report_html import forest_png

    rows = [{"effect": 0.05, "lo": -0.29, "hi": 0.01, "threshold": 0.0, "status": "inconclusive", "label": "W"},
            {"effect": 0.2, "lo": 0.1, "hi": 0.3, "threshold": 0.0, "status": "supported", "label": "m"}]  # fmt: skip
    png = forest_png([("mpo", "inconclusive", rows)])
    Image.open(io.BytesIO(png)).verify()
