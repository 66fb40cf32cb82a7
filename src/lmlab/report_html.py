"""The reproduction report a person reads in a browser: one self-contained HTML file per reproduce folder.

A reader wants the answer at a glance (how many claims hold, which are fragile), then the evidence (every gated
claim's effect and CI against its threshold), then the details of one method. So the page is, top to bottom: the
counts line and verdict badges, a forest plot per area, a sortable and filterable method table, the per-seed x
per-model verdict matrix (grids only), and one section per method with its cells' claims and figures.

Self-contained on purpose: the report is mailed, archived and opened offline, so CSS and JS are inline and every
plot is a base64 PNG data URI; nothing is fetched (no CDN, no web font, and no ``http`` link in a ``src``/``href``:
paper URLs are shown as text). Every string that comes from results is HTML-escaped (claim texts contain ``<``).

Input is ``grid.json`` (see `lmlab.grid`), or for a folder without it the same dict rebuilt by
`lmlab.grid.grid_from_folder`; figures are the ``*.png`` files of each cell folder.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lmlab.core.report.reporting import _CSS, VERDICT, fmt, fmt_ci
from lmlab.errors import LmlabError, UsageError
from lmlab.results import atomic_write_text, load_result

__all__ = ["forest_png", "render_report", "verdict_label", "write_report"]

# one colour per verdict, shared by the badges and the forest plot; cell / claim statuses map onto the verdicts
_COLORS = {
    "holds": "#1e8449",
    "does_not_hold": "#c0392b",
    "fragile": "#d68910",
    "inconclusive": "#7f8c8d",
    "error": "#6c3483",
    "skipped": "#b3b6b7",
    "pending": "#2e86c1",
}
_STATUS_TO_VERDICT = {"supported": "holds", "not_supported": "does_not_hold"}
_VERDICT_ORDER = ("holds", "does_not_hold", "fragile", "inconclusive", "error", "skipped", "pending")
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _verdict_key(status: str) -> str:
    """A cell / claim status ("supported") or a method verdict ("holds") as its verdict key ("holds")."""
    return _STATUS_TO_VERDICT.get(status, status)


def verdict_label(status: str) -> str:
    """The words a reader sees for a status or verdict, from `lmlab.core.report.reporting.VERDICT` where it has
    them."""
    return VERDICT.get(status) or str(status).replace("_", " ")


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _badge(status: str) -> str:
    key = _verdict_key(status)
    cls = key if key in _COLORS else "unknown"
    return f"<span class='badge v-{cls}'>{_e(verdict_label(key))}</span>"


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# ----------------------------------------------------------------------------------------------------------------
# Entry points


def write_report(folder: str | Path) -> Path:
    """Write ``<folder>/report.html`` (atomically) from the folder's grid.json, or its cell folders, and return it.

    Raises:
        UsageError: `folder` is not a directory.
        LmlabError: grid.json exists but is not valid JSON (a hand-edited or truncated file).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"report folder {str(folder)!r} is not a directory; expected a reproduce or run folder")
    grid_path = folder / "grid.json"
    if grid_path.exists():
        try:
            grid = json.loads(grid_path.read_text())
        except ValueError as e:
            raise LmlabError(f"{grid_path} is not valid JSON ({e}); expected lmlab.grid's grid.json") from None
    else:
        from lmlab.grid import grid_from_folder

        grid = grid_from_folder(folder)
    if not isinstance(grid, dict) or not isinstance(grid.get("cells"), list):
        raise LmlabError(f"{grid_path} has no 'cells' list; expected lmlab.grid's grid.json")
    out = folder / "report.html"
    atomic_write_text(out, render_report(grid, folder))
    return out


def render_report(grid: Mapping[str, Any], folder: str | Path) -> str:
    """The HTML of the report of `grid` (the grid.json dict); cell figures are read from `folder`."""
    folder = Path(folder)
    cells: list[Mapping[str, Any]] = list(grid.get("cells") or [])
    methods: list[Mapping[str, Any]] = list(grid.get("methods") or [])
    if not methods and cells:
        from lmlab.grid import method_summaries

        methods = method_summaries(cells, {})
    counts = dict(grid.get("counts") or {})
    if not counts:
        from lmlab.grid import grid_counts

        counts = grid_counts(cells, methods)
    by_method: dict[str, list[Mapping[str, Any]]] = {}
    for c in cells:
        by_method.setdefault(c["method"], []).append(c)
    models = list(dict.fromkeys(c.get("model") for c in cells))
    seeds = list(dict.fromkeys(c.get("seed") for c in cells))
    is_grid = len(models) > 1 or len(seeds) > 1

    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        "<title>lmlab reproduction report</title>",
        f"<style>{_CSS}{_EXTRA_CSS}</style></head><body>",
        "<h1>lmlab reproduction report</h1>",
        _header(grid, counts, methods),
    ]
    forest = _forest_section(methods, by_method)
    if forest:
        parts.append(forest)
    parts.append(_method_table(methods, by_method, is_grid))
    if is_grid:
        parts.append(_matrix_section(methods, by_method, models, seeds))
    parts.append("<h2 id='methods'>Methods</h2>")
    for m in methods:
        parts.append(_method_section(m, by_method.get(m["method"], []), folder, is_grid))
    parts.append(f"<script>{_JS}</script></body></html>")
    return "\n".join(parts)


# ----------------------------------------------------------------------------------------------------------------
# Header


def _counts_line(counts: Mapping[str, Any]) -> str:
    """The terminal summary's last line (`lmlab.grid.summary_line`), plus the skipped cells."""
    from lmlab.grid import summary_line

    full = {k: int(counts.get(k) or 0) for k in ("cells", "holds", "does_not_hold", "fragile", "inconclusive",
                                                   "errors", "skipped")}  # fmt: skip
    return f"{summary_line(full)} / skipped {full['skipped']}"


def _header(grid: Mapping[str, Any], counts: Mapping[str, Any], methods: Sequence[Mapping[str, Any]]) -> str:
    seeds = grid.get("seeds") or []
    models = grid.get("models") or ["each method's default model"]
    verdicts = [m.get("verdict", "") for m in methods]
    badges = " ".join(
        f"{_badge(v)}&nbsp;<strong>{verdicts.count(v)}</strong>" for v in _VERDICT_ORDER if verdicts.count(v)
    )
    return (
        f"<p class='counts' id='counts'>{_e(_counts_line(counts))}</p>"
        f"<p>Preset <code>{_e(grid.get('preset'))}</code>; seeds {_e(', '.join(map(str, seeds)) or '-')}; models "
        f"{_e(', '.join(map(str, models)))}. {len(methods)} methods: {badges}</p>"
        "<p class='note'>Every verdict is computed from numbers measured in this run, with the baselines run in the "
        "same process. Over a grid a claim that holds on some cells and not on others is <em>fragile</em>.</p>"
    )


# ----------------------------------------------------------------------------------------------------------------
# Forest plot


def _forest_panels(method: str, verdict: str, cells: Sequence[Mapping[str, Any]], many: bool) -> list[tuple]:
    """The method's forest panels, one per gated metric (rows of one panel share units, so one x scale).

    A row is one gated claim of one run cell; errored cells get a row without a value in the first panel, so an
    error is visible in the plot and not silently dropped. Returns ``(title, verdict, rows)`` triples.
    """
    by_metric: dict[str, list[dict[str, Any]]] = {}
    errors = []
    for c in cells:
        where = f"{c.get('model')} s{c.get('seed')} " if many else ""
        if c.get("status") == "error":
            errors.append({"label": f"{where}error", "status": "error", "effect": None})
            continue
        for cl in c.get("claims") or []:
            if not cl.get("gate"):
                continue
            ci = cl.get("ci") or [None, None]
            min_effect = cl.get("min_effect") or 0.0
            threshold = -min_effect if cl.get("direction") == "<" else min_effect
            label = f"{where}{cl.get('method')} vs {cl.get('baseline')}"
            by_metric.setdefault(str(cl.get("metric")), []).append({
                "label": label if len(label) <= 52 else label[:51] + "~", "status": cl.get("status") or "inconclusive",
                "effect": cl.get("observed_effect"), "lo": ci[0], "hi": ci[1], "threshold": threshold,
            })  # fmt: skip
    if not by_metric and not errors:
        return []
    panels = [(f"{method} ({verdict_label(verdict)}): {metric}", verdict, rows) for metric, rows in by_metric.items()]
    if not panels:
        return [(f"{method} ({verdict_label(verdict)})", verdict, errors)]
    title, v, rows = panels[0]
    panels[0] = (title, v, rows + errors)
    return panels


def forest_png(panels: Sequence[tuple[str, str, list[dict[str, Any]]]]) -> bytes:
    """A forest plot, one panel per (method, metric): each its own x scale, since effects are in different units.

    Args:
        panels: ``(title, method verdict, rows)``; a row is ``{"label", "status", "effect", "lo", "hi",
            "threshold"}``: a point and its 95% CI, with the claim's threshold drawn as a dashed tick on its row.
    """
    from lmlab.core.report.plotting import _png, plt

    heights = [max(1, len(rows)) for _, _, rows in panels]
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(8.5, 0.24 * sum(heights) + 0.55 * len(panels) + 0.35),
        gridspec_kw={"height_ratios": [h + 1.2 for h in heights]}, squeeze=False,
    )  # fmt: skip
    for ax, (title, verdict, rows) in zip(axes[:, 0], panels, strict=True):
        for y, r in enumerate(reversed(rows)):
            color = _COLORS.get(_verdict_key(r["status"]), "#000000")
            if "threshold" in r and _finite(r["threshold"]):
                ax.vlines(r["threshold"], y - 0.42, y + 0.42, colors="#333333", linestyles="dashed", linewidth=1)
            if _finite(r.get("effect")):
                lo = r["lo"] if _finite(r.get("lo")) else r["effect"]
                hi = r["hi"] if _finite(r.get("hi")) else r["effect"]
                # the CI as is (a bootstrap CI of a min or a ratio need not contain the point: no negative xerr)
                ax.hlines(y, lo, hi, colors=color, linewidth=1.2)
                ax.vlines([lo, hi], y - 0.15, y + 0.15, colors=color, linewidth=1.2)
                ax.plot([r["effect"]], [y], "o", color=color, markersize=4)
            else:
                ax.text(0.01, y, "no value", transform=ax.get_yaxis_transform(), va="center", fontsize=7,
                        color=color)  # fmt: skip
        ax.axvline(0, color="#bbbbbb", linewidth=0.6, zorder=0)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([r["label"] for r in reversed(rows)], fontsize=7)
        ax.set_ylim(-0.6, max(len(rows), 1) - 0.4)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title(title, fontsize=8, loc="left", color=_COLORS.get(verdict, "#000000"))
    axes[-1, 0].set_xlabel("effect (method - baseline) with 95% CI; dashed: the claim's threshold", fontsize=8)
    fig.tight_layout(h_pad=0.4)
    return _png(fig)


def _forest_section(methods: Sequence[Mapping[str, Any]], by_method: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """One forest plot per area (bounded image height), methods without a run cell left out."""
    many = len({(c.get("model"), c.get("seed")) for cs in by_method.values() for c in cs}) > 1
    areas: dict[str, list[tuple[str, str, list[dict[str, Any]]]]] = {}
    for m in methods:
        panels = _forest_panels(m["method"], m.get("verdict", ""), by_method.get(m["method"], []), many)
        if panels:
            areas.setdefault(m.get("area") or "other", []).extend(panels)
    if not areas:
        return ""
    parts = [
        "<h2 id='forest'>Forest plot</h2><p>Every gated claim"
        + (" of every cell" if many else "")
        + ": its observed effect (method minus baseline) and 95% CI, against the claim's threshold (dashed; "
        "<code>min_effect</code>, negated for a lower-is-better claim). Colour: the claim's status (legend: "
        + " ".join(_badge(v) for v in ("holds", "does_not_hold", "inconclusive", "error"))
        + ").</p>"
    ]
    for area, panels in areas.items():
        png = forest_png(panels)
        parts.append(
            f"<figure><img class='forest' alt='forest plot: {_e(area)}' src='{_data_uri(png)}'/>"
            f"<figcaption>{_e(area)}</figcaption></figure>"
        )
    return "\n".join(parts)


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


# ----------------------------------------------------------------------------------------------------------------
# Method table


def _effect_summary(cells: Sequence[Mapping[str, Any]]) -> tuple[str, float | None]:
    """The first gated claim's effect: "value [lo, hi]" for one cell, "min .. max (k cells)" over a grid."""
    firsts = []
    for c in cells:
        gated = [cl for cl in c.get("claims") or [] if cl.get("gate")]
        if gated and c.get("status") not in ("error", "skipped", "pending"):
            firsts.append(gated[0])
    values = [f["observed_effect"] for f in firsts if _finite(f.get("observed_effect"))]
    if not values:
        return "", None
    if len(firsts) == 1:
        ci = firsts[0].get("ci") or [None, None]
        return f"{firsts[0].get('metric')}: {fmt_ci(values[0], ci[0], ci[1])}", values[0]
    return f"{firsts[0].get('metric')}: {fmt(min(values))} .. {fmt(max(values))} ({len(values)} cells)", min(values)


def _method_table(
    methods: Sequence[Mapping[str, Any]], by_method: Mapping[str, Sequence[Mapping[str, Any]]], is_grid: bool
) -> str:
    areas = sorted({m.get("area") or "" for m in methods})
    present = [v for v in _VERDICT_ORDER if any(m.get("verdict") == v for m in methods)]
    area_opts = "".join(f"<option value='{_e(a)}'>{_e(a)}</option>" for a in areas)
    verdict_opts = "".join(f"<option value='{_e(v)}'>{_e(verdict_label(v))}</option>" for v in present)
    head = ["method", "area", "claim", "verdict", "cells hold", "errors", "first gated effect", "time s"]
    rows = []
    for m in methods:
        cells = by_method.get(m["method"], [])
        effect, effect_key = _effect_summary(cells)
        times = [c.get("time_s") for c in cells if _finite(c.get("time_s"))]
        time_s = sum(times) if times else None
        n_cells, k = m.get("n_cells") or 0, m.get("k_holds") or 0
        verdict = m.get("verdict", "")
        tds = [
            (m["method"], f"<a href='#m-{_e(m['method'])}'>{_e(m['method'])}</a>"),
            (m.get("area") or "", _e(m.get("area"))),
            (m.get("claim") or "", _e(m.get("claim"))),
            (str(_VERDICT_ORDER.index(verdict)) if verdict in _VERDICT_ORDER else verdict, _badge(verdict)),
            (f"{k / n_cells:.6f}" if n_cells else "-1", f"{k} of {n_cells}"),
            (str(m.get("n_errors") or 0), _e(m.get("n_errors") or 0)),
            ("" if effect_key is None else repr(effect_key), _e(effect)),
            ("" if time_s is None else repr(time_s), _e(fmt(time_s))),
        ]
        cells_html = "".join(f"<td data-sort='{_e(key)}'>{text}</td>" for key, text in tds)
        rows.append(
            f"<tr data-area='{_e(m.get('area') or '')}' data-verdict='{_e(verdict)}' "
            f"data-method='{_e(m['method'])}'>{cells_html}</tr>"
        )
    ths = "".join(f"<th data-col='{i}' tabindex='0' title='click to sort'>{_e(h)}</th>" for i, h in enumerate(head))
    return (
        "<h2 id='table'>Methods at a glance</h2>"
        "<div class='filters'><label>area <select id='f-area'><option value=''>all</option>"
        f"{area_opts}</select></label> <label>verdict <select id='f-verdict'><option value=''>all</option>"
        f"{verdict_opts}</select></label> <label>search <input id='f-text' type='search' "
        "placeholder='method, claim, ...'></label> <span id='f-shown'></span></div>"
        f"<table id='methods-table' class='sortable'><thead><tr>{ths}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
        + ("<p class='note'>cells hold: run cells whose claim holds, errored cells excluded.</p>" if is_grid else "")
    )


# ----------------------------------------------------------------------------------------------------------------
# Verdict matrix


def _matrix_section(
    methods: Sequence[Mapping[str, Any]],
    by_method: Mapping[str, Sequence[Mapping[str, Any]]],
    models: Sequence[Any],
    seeds: Sequence[Any],
) -> str:
    """All methods x (model, seed) cells, each cell's status as a badge (a method's row is its own matrix)."""
    top = "".join(f"<th colspan='{len(seeds)}'>{_e(mo)}</th>" for mo in models)
    sub = "".join(f"<th>seed {_e(s)}</th>" for _ in models for s in seeds)
    rows = []
    for m in methods:
        index = {(c.get("model"), c.get("seed")): c for c in by_method.get(m["method"], [])}
        tds = []
        for mo in models:
            for s in seeds:
                c = index.get((mo, s))
                tds.append(f"<td title='{_e(c.get('reason'))}'>{_badge(c['status'])}</td>" if c else "<td>-</td>")
        rows.append(
            f"<tr><th><a href='#m-{_e(m['method'])}'>{_e(m['method'])}</a></th><td>{_badge(m.get('verdict', ''))}"
            f"</td>{''.join(tds)}</tr>"
        )
    return (
        "<h2 id='matrix'>Verdict matrix (per model x per seed)</h2>"
        f"<table class='matrix'><thead><tr><th rowspan='2'>method</th><th rowspan='2'>over the grid</th>{top}</tr>"
        f"<tr>{sub}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _method_matrix(cells: Sequence[Mapping[str, Any]]) -> str:
    models = list(dict.fromkeys(c.get("model") for c in cells))
    seeds = list(dict.fromkeys(c.get("seed") for c in cells))
    index = {(c.get("model"), c.get("seed")): c for c in cells}
    head = "".join(f"<th>seed {_e(s)}</th>" for s in seeds)
    body = "".join(
        f"<tr><th>{_e(mo)}</th>"
        + "".join(f"<td>{_badge(index[(mo, s)]['status'])}</td>" if (mo, s) in index else "<td>-</td>" for s in seeds)
        + "</tr>"
        for mo in models
    )
    return f"<table class='matrix'><thead><tr><th>model</th>{head}</tr></thead><tbody>{body}</tbody></table>"


# ----------------------------------------------------------------------------------------------------------------
# Method sections


def _cell_figures(folder: Path, cell: Mapping[str, Any]) -> list[tuple[str, bytes]]:
    """The cell folder's ``*.png`` files that decode (a truncated PNG would show as a broken image)."""
    if not cell.get("path"):
        return []
    cell_dir = folder / cell["path"]
    if not cell_dir.is_dir():
        return []
    from PIL import Image

    out = []
    for p in sorted(cell_dir.glob("*.png")):
        data = p.read_bytes()
        if not data.startswith(_PNG_MAGIC):
            continue
        try:
            with Image.open(io.BytesIO(data)) as im:
                im.verify()
        except Exception:  # PIL raises several types for a bad file; the figure is left out, the report still renders
            continue
        out.append((p.stem, data))
    return out


def _method_info(folder: Path, cells: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    for c in cells:
        if c.get("path"):
            data = load_result(folder / c["path"])
            if isinstance(data, dict):
                return data.get("run_info") or {}
    return {}


def _method_section(m: Mapping[str, Any], cells: Sequence[Mapping[str, Any]], folder: Path, is_grid: bool) -> str:
    method = m["method"]
    info = _method_info(folder, cells)
    title = f"{method}: {info['name']}" if info.get("name") else method
    parts = [f"<section class='method' id='m-{_e(method)}'><h3>{_e(title)} {_badge(m.get('verdict', ''))}</h3>"]
    if info.get("paper"):
        parts.append(f"<p>Paper: {_e(info['paper'])} <code>{_e(info.get('paper_url') or '')}</code></p>")
    parts.append(f"<p><strong>Claim:</strong> {_e(m.get('claim'))}</p>")
    parts.append(
        f"<p><strong>Verdict:</strong> {_badge(m.get('verdict', ''))} holds in {_e(m.get('k_holds', 0))} of "
        f"{_e(m.get('n_cells', 0))} cells; {_e(m.get('n_errors', 0))} errored; area {_e(m.get('area'))}.</p>"
    )
    if is_grid and len(cells) > 1:
        parts.append(_method_matrix(cells))
    head = ["model", "seed", "cell", "claim check", "effect [95% CI]", "threshold", "claim status", "time s / reason"]
    rows = []
    for c in cells:
        gated = [cl for cl in c.get("claims") or [] if cl.get("gate")]
        lead = f"<td>{_e(c.get('model'))}</td><td>{_e(c.get('seed'))}</td><td>{_badge(c.get('status', ''))}</td>"
        tail = f"<td>{_e(c.get('reason'))}</td>" if c.get("reason") else f"<td>{_e(fmt(c.get('time_s')))}</td>"
        if not gated:
            rows.append(f"<tr>{lead}<td colspan='4'>no gated claim (cell {_e(verdict_label(c.get('status', '')))})"
                        f"</td>{tail}</tr>")  # fmt: skip
            continue
        for cl in gated:
            ci = cl.get("ci") or [None, None]
            thr = f"{_e(cl.get('direction'))} {_e(fmt(cl.get('min_effect')))}"
            rows.append(
                f"<tr>{lead}<td>{_e(cl.get('text'))}<br><code>{_e(cl.get('metric'))}: {_e(cl.get('method'))} vs "
                f"{_e(cl.get('baseline'))}</code></td><td>{_e(fmt_ci(cl.get('observed_effect'), ci[0], ci[1]))}</td>"
                f"<td>{thr}</td><td>{_badge(cl.get('status', ''))}</td>{tail}</tr>"
            )
    parts.append(
        "<table class='cells'><thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr></thead><tbody>"
        + "".join(rows) + "</tbody></table>"
    )  # fmt: skip
    for i, c in enumerate(cells):
        figs = _cell_figures(folder, c)
        if not figs:
            continue
        imgs = "".join(
            f"<figure><img alt='{_e(name)}' src='{_data_uri(png)}'/><figcaption>{_e(name)}</figcaption></figure>"
            for name, png in figs
        )
        if is_grid:
            where = f"{c.get('model')}, seed {c.get('seed')}"
            opened = " open" if i == 0 else ""
            parts.append(
                f"<details{opened}><summary>figures: {_e(where)} ({len(figs)})</summary>"
                f"<div class='figs'>{imgs}</div></details>"
            )
        else:
            parts.append(f"<div class='figs'>{imgs}</div>")
    parts.append("<p class='top'><a href='#table'>back to the table</a></p></section>")
    return "\n".join(parts)


# ----------------------------------------------------------------------------------------------------------------
# Inline CSS and JS

_EXTRA_CSS = (
    ".badge{display:inline-block;padding:0 0.45rem;border-radius:0.7rem;color:#fff;font-size:0.8rem;"
    "white-space:nowrap;line-height:1.45}"
    + "".join(f".v-{k}{{background:{c}}}" for k, c in _COLORS.items())
    + ".v-unknown{background:#34495e}.counts{font-size:1.1rem;font-weight:600}.note{color:#555;font-size:0.88rem}"
    "table.sortable th{cursor:pointer;user-select:none}"
    "table.sortable th[aria-sort=ascending]::after{content:' \\25B2'}"
    "table.sortable th[aria-sort=descending]::after{content:' \\25BC'}.filters{margin:0.6rem 0}"
    ".filters label{margin-right:0.8rem}figure{margin:0.4rem 0}figcaption{font-size:0.8rem;color:#555}"
    "img.forest{border:1px solid #ddd}section.method{border-top:1px solid #ddd;margin-top:1.4rem}"
    "details{margin:0.4rem 0}summary{cursor:pointer}.matrix td,.matrix th{text-align:center}"
    ".figs{display:flex;flex-wrap:wrap;gap:0.6rem;align-items:flex-start}.figs figure{max-width:49%}"
)

# sorting: a header click orders the rows by each cell's data-sort (numbers when both parse, else text), toggling
# the direction; filtering: area and verdict selects and a text box, combined with AND
_JS = r"""
(function () {
  var table = document.getElementById('methods-table');
  if (!table) return;
  var tbody = table.tBodies[0];
  function key(row, col) { return row.cells[col].getAttribute('data-sort') || ''; }
  function cmp(a, b) {
    var x = parseFloat(a), y = parseFloat(b);
    if (a !== '' && b !== '' && isFinite(x) && isFinite(y)) return x - y;
    if (a === '' && b !== '') return 1;
    if (b === '' && a !== '') return -1;
    return a.localeCompare(b);
  }
  Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th) {
    th.addEventListener('click', function () {
      var col = parseInt(th.getAttribute('data-col'), 10);
      var asc = th.getAttribute('aria-sort') !== 'ascending';
      Array.prototype.forEach.call(table.tHead.rows[0].cells, function (o) { o.removeAttribute('aria-sort'); });
      th.setAttribute('aria-sort', asc ? 'ascending' : 'descending');
      var rows = Array.prototype.slice.call(tbody.rows);
      rows.sort(function (r1, r2) { var c = cmp(key(r1, col), key(r2, col)); return asc ? c : -c; });
      rows.forEach(function (r) { tbody.appendChild(r); });
    });
    th.addEventListener('keydown', function (ev) {
      if (ev.key === 'Enter' || ev.key === ' ') { ev.preventDefault(); th.click(); }
    });
  });
  var area = document.getElementById('f-area'), verdict = document.getElementById('f-verdict');
  var text = document.getElementById('f-text'), shown = document.getElementById('f-shown');
  function apply() {
    var a = area.value, v = verdict.value, t = text.value.trim().toLowerCase(), n = 0;
    Array.prototype.forEach.call(tbody.rows, function (r) {
      var ok = (!a || r.getAttribute('data-area') === a) && (!v || r.getAttribute('data-verdict') === v) &&
               (!t || r.textContent.toLowerCase().indexOf(t) >= 0);
      r.hidden = !ok;
      if (ok) n += 1;
    });
    shown.textContent = n + ' of ' + tbody.rows.length + ' methods shown';
  }
  area.addEventListener('change', apply);
  verdict.addEventListener('change', apply);
  text.addEventListener('input', apply);
  apply();
})();
"""
