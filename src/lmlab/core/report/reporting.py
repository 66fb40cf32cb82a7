"""Reports: one document model rendered to Markdown and to self-contained HTML.

A report is a list of blocks (headings, paragraphs, tables, images). `run_blocks` describes one method run;
`summary_blocks` the table of a `reproduce`. The HTML embeds images as base64 PNG and carries its CSS inline: no
external files, no scripts.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

VERDICT = {
    "supported": "holds",
    "not_supported": "does not hold",
    "inconclusive": "inconclusive",
    "error": "error",
}


@dataclass
class Heading:
    text: str
    level: int = 2
    anchor: str | None = None


@dataclass
class Para:
    text: str


@dataclass
class Table:
    header: list[str]
    rows: list[list[Any]]


@dataclass
class Image:
    name: str
    png: bytes | None = None
    path: str | None = None


@dataclass
class Bullets:
    items: list[str] = field(default_factory=list)


Block = Heading | Para | Table | Image | Bullets


def fmt(value: Any, digits: int = 4) -> str:
    """Numbers with `digits` significant digits; None as an empty cell."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10000 else str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.{digits - 1}e}"
        return f"{value:.{digits}g}"
    return str(value)


def fmt_ci(value: Any, lo: Any, hi: Any) -> str:
    if lo is None or hi is None or (lo == hi == value):
        return fmt(value)
    return f"{fmt(value)} [{fmt(lo)}, {fmt(hi)}]"


# ----------------------------------------------------------------------------------------------------------------
# Content


def run_blocks(result: Any, *, figure_paths: Mapping[str, str] | None = None, level: int = 1) -> list[Block]:
    """The report of one run (a `RunResult`)."""
    info = result.run_info
    model = ", ".join(m.get("spec") or "?" for m in result.meta_info.get("models", {}).values()) or "-"
    blocks: list[Block] = [
        Heading(f"{result.method}: {info.get('name', '')}", level, anchor=result.method),
        Para(
            f"Paper: {info.get('paper', '')} ({info.get('paper_url', '')}). Preset `{info.get('preset')}`, "
            f"seed {info.get('seed')}, model {model}, {fmt(info.get('total_time_s'))} s."
        ),
        Para(f"**Claim:** {result.claim_text}"),
        Para(f"**Verdict: {VERDICT.get(result.status, result.status)}** (computed from this run's numbers)."),
    ]
    if info.get("error"):
        blocks.append(Para(f"**Error:** `{info['error']}`"))
    checks = [c for c in result.claims if not getattr(c, "mechanism", False)]
    mechanisms = [c for c in result.claims if getattr(c, "mechanism", False)]
    for title, rows, intro in (
        ("Claim checks", checks, ""),
        (
            "Mechanism checks",
            mechanisms,
            "These hold by construction (a count the algorithm fixes, a guarantee of the method): they show the "
            "mechanism works and never gate the verdict.",
        ),
    ):
        if not rows:
            continue
        blocks.append(Heading(title, level + 1))
        if intro:
            blocks.append(Para(intro))
        blocks.append(
            Table(
                [
                    "check",
                    "method",
                    "baseline",
                    "effect [95% CI]",
                    "n",
                    "status",
                    "gates verdict",
                    "if method = baseline",
                ],
                [
                    [
                        c.text,
                        f"{c.method} = {fmt(c.method_value)}",
                        f"{c.baseline} = {fmt(c.baseline_value)}",
                        fmt_ci(c.observed_effect, c.ci[0], c.ci[1]),
                        _n_cell(c),
                        VERDICT.get(c.status, c.status),
                        "yes" if c.gate else "no",
                        VERDICT.get(c.null_status, c.null_status or "-"),
                    ]
                    for c in rows
                ],
            )
        )
    if result.metrics:
        blocks.append(Heading("Metrics", level + 1))
        blocks.extend(metric_tables(result.metrics))
    for name, rows in result.tables.items():
        if rows:
            blocks.append(Heading(name, level + 1))
            header = list(rows[0].keys())
            blocks.append(Table(header, [[fmt(r.get(h)) for h in header] for r in rows]))
    if result.flags:
        blocks.append(Heading("Flags", level + 1))
        blocks.append(Bullets([f"`{k}`: {v}" for k, v in result.flags.items()]))
    if result.notes:
        blocks.append(Heading("Notes", level + 1))
        blocks.append(Bullets(list(result.notes)))
    total = result.compute.get("per_model", {})
    if total:
        blocks.append(Heading("Compute", level + 1))
        blocks.append(
            Table(
                ["model", "forward calls", "prefill tokens", "decode tokens", "FLOPs (proxy)", "forward wall s"],
                [
                    [k, v["forward_calls"], v["prefill_tokens"], v["decode_tokens"], fmt(v["flops"]), fmt(v["wall_s"])]
                    for k, v in total.items()
                ],
            )
        )
    if result.figures:
        blocks.append(Heading("Plots", level + 1))
        for name, png in result.figures.items():
            path = (figure_paths or {}).get(name)
            blocks.append(Image(name, png=None if path else png, path=path))
    return blocks


def metric_tables(rows: Sequence[Any]) -> list[Block]:
    """Metric rows pivoted: one table row per system, one column per metric, "value [lo, hi]" cells."""
    metrics: list[str] = []
    systems: list[str] = []
    cells: dict[tuple[str, str], str] = {}
    ns: dict[str, int] = {}
    for r in rows:
        if r.metric not in metrics:
            metrics.append(r.metric)
        if r.system not in systems:
            systems.append(r.system)
        cells[(r.system, r.metric)] = fmt_ci(r.value, r.ci_low, r.ci_high)
        ns[r.system] = max(ns.get(r.system, 0), r.n)
    out: list[Block] = []
    for start in range(0, len(metrics), 5):  # at most 5 metric columns per table, for readable widths
        chunk = metrics[start : start + 5]
        out.append(
            Table(
                ["system", "n", *chunk],
                [
                    [s, ns[s], *[cells.get((s, m), "") for m in chunk]]
                    for s in systems
                    if any((s, m) in cells for m in chunk)
                ],
            )
        )
    return out


def summary_blocks(entries: Sequence[Mapping[str, Any]], *, title: str, intro: str = "") -> list[Block]:
    """The table of a `reproduce`: one row per method (`entries` are `summary_row` dicts)."""
    blocks: list[Block] = [Heading(title, 1)]
    if intro:
        blocks.append(Para(intro))
    blocks.append(
        Table(
            ["method", "area", "claim", "our numbers (method vs baseline)", "effect [95% CI]", "verdict", "time s"],
            [
                [
                    f"[{e['method']}](#{e['method']})",
                    e.get("area", ""),
                    e.get("claim", ""),
                    e.get("numbers", ""),
                    e.get("effect", ""),
                    VERDICT.get(e.get("status", ""), e.get("status", "")),
                    fmt(e.get("time_s")),
                ]
                for e in entries
            ],
        )
    )
    return blocks


def _n_cell(claim: Any) -> str:
    """``n`` of a claim check; with clusters, the units and the values behind them (``8 (of 256 values)``)."""
    n_values = getattr(claim, "n_values", None)
    return f"{claim.n} (of {n_values} values)" if n_values and n_values != claim.n else str(claim.n)


def summary_row(result: Any) -> dict[str, Any]:
    """One row of summary.json / summary.csv for a `RunResult`."""
    gating = [c for c in result.claims if c.gate]
    first = gating[0] if gating else None
    numbers = "; ".join(
        f"{c.metric}: {c.method} {fmt(c.method_value)} vs {c.baseline} {fmt(c.baseline_value)}" for c in gating
    )
    effect = "; ".join(fmt_ci(c.observed_effect, c.ci[0], c.ci[1]) for c in gating)
    return {
        "method": result.method,
        "area": result.run_info.get("area", ""),
        "claim": result.claim_text,
        "status": result.status,
        "numbers": numbers,
        "effect": effect,
        "observed_effect": first.observed_effect if first else None,
        "ci_low": first.ci[0] if first else None,
        "ci_high": first.ci[1] if first else None,
        "metric": first.metric if first else None,
        "time_s": result.run_info.get("total_time_s"),
        "preset": result.run_info.get("preset"),
        "error": result.run_info.get("error"),
    }


# ----------------------------------------------------------------------------------------------------------------
# Renderers


def to_markdown(blocks: Sequence[Block]) -> str:
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            out.append("#" * b.level + " " + b.text)
        elif isinstance(b, Para):
            out.append(b.text)
        elif isinstance(b, Bullets):
            out.append("\n".join(f"- {item}" for item in b.items))
        elif isinstance(b, Table):
            rows = [b.header, ["---"] * len(b.header), *[[_md_cell(c) for c in r] for r in b.rows]]
            out.append("\n".join("| " + " | ".join(map(str, r)) + " |" for r in rows))
        elif isinstance(b, Image):
            if b.path:
                out.append(f"![{b.name}]({b.path})")
            elif b.png:
                out.append(f"![{b.name}](data:image/png;base64,{base64.b64encode(b.png).decode()})")
    return "\n\n".join(out) + "\n"


def _md_cell(value: Any) -> str:
    return fmt(value).replace("|", "\\|").replace("\n", " ")


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;color:#222;
line-height:1.45;padding:0 1rem}
table{border-collapse:collapse;margin:0.6rem 0 1.2rem 0;font-size:0.88rem}
th,td{border:1px solid #ccc;padding:0.25rem 0.5rem;text-align:left;vertical-align:top}
th{background:#f3f3f3} code{background:#f5f5f5;padding:0 0.2rem} img{max-width:100%;margin:0.5rem 0}
h1{border-bottom:2px solid #333} h2{border-bottom:1px solid #aaa;margin-top:2.2rem}
"""


def _inline(text: str) -> str:
    """Escape, then the little Markdown our blocks use: **bold**, `code`, [text](#anchor)."""
    import re

    t = html.escape(text)
    t = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", t)
    t = re.sub(r"`(.+?)`", r"<code>\1</code>", t)
    t = re.sub(r"\[([^\]]+)\]\((#[^)]+)\)", r'<a href="\2">\1</a>', t)
    return t


def to_html(blocks: Sequence[Block], *, title: str) -> str:
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"]
    parts.append(f"<style>{_CSS}</style></head><body>")
    for b in blocks:
        if isinstance(b, Heading):
            anchor = f" id='{html.escape(b.anchor)}'" if b.anchor else ""
            parts.append(f"<h{b.level}{anchor}>{_inline(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            parts.append(f"<p>{_inline(b.text)}</p>")
        elif isinstance(b, Bullets):
            parts.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Table):
            head = "".join(f"<th>{_inline(str(h))}</th>" for h in b.header)
            body = "".join("<tr>" + "".join(f"<td>{_inline(fmt(c))}</td>" for c in r) + "</tr>" for r in b.rows)
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif isinstance(b, Image) and b.png:
            data = base64.b64encode(b.png).decode()
            parts.append(f"<figure><img alt='{html.escape(b.name)}' src='data:image/png;base64,{data}'/></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


def render_run_markdown(result: Any, *, figure_paths: Mapping[str, str] | None = None) -> str:
    return to_markdown(run_blocks(result, figure_paths=figure_paths))


def render_run_html(result: Any) -> str:
    return to_html(run_blocks(result), title=f"lmlab {result.method}")
