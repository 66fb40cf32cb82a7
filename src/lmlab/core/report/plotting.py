"""Standard figures (matplotlib, Agg backend), returned as PNG bytes.

One figure per experiment type: a bar chart with CIs (method versus baselines), a quality-versus-compute plot, a
line plot of a sweep, and a layer x head heatmap. Titles name the method id, model, seed and n.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

METHOD_COLOR = "#c0392b"
BASELINE_COLOR = "#7f8c8d"


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def title_for(method: str, model: str, seed: int | None, n: int | None, what: str) -> str:
    parts = [f"{method}: {what}", model]
    if seed is not None:
        parts.append(f"seed {seed}")
    if n is not None:
        parts.append(f"n={n}")
    return " | ".join(parts)


def bar_with_ci(
    rows: Sequence[Any],
    *,
    title: str,
    ylabel: str,
    highlight: Sequence[str] = (),
) -> bytes:
    """Bars of `rows` (objects with system, value, ci_low, ci_high), highlighted systems in the method colour."""
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(rows) + 1.5), 3.4))
    xs = range(len(rows))
    values = [r.value for r in rows]
    colors = [METHOD_COLOR if r.system in highlight else BASELINE_COLOR for r in rows]
    ax.bar(xs, values, color=colors)
    # The interval is drawn as is, not as +- errors around the bar: a percentile bootstrap CI of a non-smooth statistic
    # (a min over objectives, a ratio) need not contain its point estimate, and matplotlib refuses negative yerr.
    spans = [(x, r.ci_low, r.ci_high) for x, r in zip(xs, rows) if r.ci_low is not None and r.ci_high is not None]
    if spans:
        ax.vlines([x for x, _, _ in spans], [lo for _, lo, _ in spans], [hi for _, _, hi in spans], colors="black",
                  linewidth=1)  # fmt: skip
        for x, lo, hi in spans:
            ax.hlines([lo, hi], x - 0.08, x + 0.08, colors="black", linewidth=1)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([r.system for r in rows], rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.axhline(0, color="black", linewidth=0.5)
    return _png(fig)


def quality_vs_compute(
    points: Sequence[tuple[str, float, float]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    highlight: Sequence[str] = (),
    logx: bool = False,
) -> bytes:
    """Scatter of (name, compute, quality) points, labelled."""
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    for name, x, y in points:
        color = METHOD_COLOR if name in highlight else BASELINE_COLOR
        ax.scatter([x], [y], color=color, s=40)
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    return _png(fig)


def lines(
    x: Sequence[float],
    series: dict[str, Sequence[float]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    secondary: dict[str, Sequence[float]] | None = None,
    secondary_label: str = "",
    logy: bool = False,
) -> bytes:
    """Line plot of named series over `x` (e.g. a threshold sweep), with an optional second y axis."""
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    for name, ys in series.items():
        ax.plot(list(x), list(ys), marker="o", label=name)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    handles, labels = ax.get_legend_handles_labels()
    if secondary:
        ax2 = ax.twinx()
        for name, ys in secondary.items():
            ax2.plot(list(x), list(ys), marker="s", linestyle="--", label=name, color="#2c3e50")
        ax2.set_ylabel(secondary_label)
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, fontsize=8)
    ax.set_title(title, fontsize=9)
    return _png(fig)


def heatmap(
    values: Any,
    *,
    title: str,
    xlabel: str = "head",
    ylabel: str = "layer",
    cmap: str = "RdBu_r",
    center: bool = True,
) -> bytes:
    """A (rows, cols) heatmap, e.g. layer x head effects, centred at 0 by default."""
    import numpy as np

    arr = np.asarray(values, dtype=float)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.35 * arr.shape[1] + 2), max(3.0, 0.25 * arr.shape[0] + 1.5)))
    vmax = float(np.nanmax(np.abs(arr))) if center and arr.size else None
    im = ax.imshow(arr, aspect="auto", cmap=cmap, vmin=-vmax if vmax else None, vmax=vmax)
    fig.colorbar(im, ax=ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    return _png(fig)
