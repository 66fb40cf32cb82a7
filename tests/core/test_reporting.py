"""Reports: Markdown and self-contained HTML from the same blocks; numbers formatted; run reports complete."""

from __future__ import annotations

import re

from lmlab.core.report.plotting import bar_with_ci
from lmlab.core.report.reporting import Heading, Image, Para, Table, fmt, fmt_ci, to_html, to_markdown
from lmlab.results import ClaimResult, MetricRow, RunResult


def _result():
    rows = [MetricRow("method", "acc", 0.7, 0.6, 0.8, 10), MetricRow("base", "acc", 0.5, 0.4, 0.6, 10)]
    claim = ClaimResult("method beats base", "acc", "method", "base", ">", 0.0, 0.7, 0.5, 0.2, (0.1, 0.3), 0.01, 10,
                        "supported", "CI above 0")  # fmt: skip
    png = bar_with_ci(rows, title="t", ylabel="acc", highlight=["method"])
    return RunResult("demo", {"status": "ok", "preset": "quick", "seed": 0}, {}, rows, [claim], "a claim",
                     figures={"acc": png})  # fmt: skip


def test_markdown_and_html_carry_the_same_content():
    blocks = [Heading("Title", 1), Para("**bold** and `code`"), Table(["a", "b"], [[1, 0.123456]])]
    md = to_markdown(blocks)
    assert "# Title" in md and "| a | b |" in md and "0.1235" in md
    html = to_html(blocks, title="t")
    assert "<h1>Title</h1>" in html and "<strong>bold</strong>" in html and "<code>code</code>" in html


def test_html_escapes_and_embeds_images():
    html = to_html([Para("<script>alert(1)</script>"), Image("p", png=b"\x89PNG")], title="x")
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "data:image/png;base64," in html


def test_run_report_lists_the_verdict_and_numbers(tmp_path):
    folder = _result().write(tmp_path / "run")
    md = (folder / "report.md").read_text()
    assert "Verdict: holds" in md and "0.2 [0.1, 0.3]" in md and "![acc](acc.png)" in md
    html = (folder / "report.html").read_text()
    assert not re.search(r"(src|href)=['\"]https?://", html)
    assert (folder / "acc.png").read_bytes().startswith(b"\x89PNG")
    assert (folder / "metrics.csv").read_text().splitlines()[
        0
    ] == "method_or_baseline,metric,value,ci_low,ci_high,n,seed"


def test_number_formatting():
    assert fmt(None) == "" and fmt(3) == "3" and fmt(123456) == "123,456"
    assert fmt(0.000012345) == "1.234e-05" and fmt(1.23456) == "1.235"
    assert fmt_ci(1.0, 0.5, 1.5) == "1 [0.5, 1.5]" and fmt_ci(2.0, None, None) == "2"


def test_bar_with_ci_draws_an_interval_that_excludes_its_point():
    """A percentile bootstrap CI of a min over objectives can lie wholly below the point (mpo's worst-objective
    reward): the plot draws it as is instead of failing on negative error bars (it did, and failed the run)."""
    rows = [
        MetricRow("mpo", "worst_reward", 0.40, 0.31, 0.38, 20),
        MetricRow("uniform", "worst_reward", 0.35, 0.36, 0.5, 20),
    ]
    png = bar_with_ci(rows, title="t", ylabel="W", highlight=["mpo"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
