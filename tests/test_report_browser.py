"""The browser report opened in headless Chromium (Debian's package) under a file:// URL.

Checks what only a browser can: the inline script runs without console errors, every image decodes
(``naturalWidth > 0``), a header click sorts the method table, the verdict filter hides rows. A screenshot is kept
as ``report.png`` in ``$LMLAB_TEST_ARTIFACTS`` (default ``tests/artifacts/``) for a person to look at.

Driven by playwright's Python package with the system Chromium (``executable_path``), not playwright's own
downloaded browser: the test set-up installs Debian's chromium and nothing is fetched. Playwright talks to the
browser over a pipe, so the network guard of conftest stays on.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

from lmlab.report_html import write_report

_spec = importlib.util.spec_from_file_location("report_grid", Path(__file__).parent / "fixtures" / "report_grid.py")
report_grid = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report_grid)

TIMEOUT_MS = 20_000  # per browser action; the whole test stays well under 60 s


def _chromium() -> str | None:
    """``$LMLAB_CHROMIUM`` when set (and only it), else Debian's binary or one on PATH."""
    if os.environ.get("LMLAB_CHROMIUM"):
        return shutil.which(os.environ["LMLAB_CHROMIUM"])
    for name in ("/usr/bin/chromium", "chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _artifacts() -> Path:
    folder = Path(os.environ.get("LMLAB_TEST_ARTIFACTS") or Path(__file__).parent / "artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.mark.timeout(60)
def test_report_in_headless_chromium(tmp_path):
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
    )
    exe = _chromium()
    if exe is None:
        where = os.environ.get("LMLAB_CHROMIUM") or "/usr/bin/chromium or chromium on PATH"
        pytest.skip(f"no chromium binary ({where}): apt-get install chromium")
    folder, _ = report_grid.make_report_folder(tmp_path / "rep")
    url = write_report(folder).resolve().as_uri()
    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=["--no-sandbox"], timeout=TIMEOUT_MS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.set_default_timeout(TIMEOUT_MS)
            page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
            requests: list[str] = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto(url, wait_until="load")
            page.wait_for_function("Array.from(document.images).every(i => i.complete)")

            n_img, broken = page.evaluate(
                "[document.images.length, Array.from(document.images).filter(i => !(i.naturalWidth > 0))"
                ".map(i => i.alt)]"
            )
            assert n_img == len(set(report_grid.AREAS.values())) + report_grid.N_RUN_PNGS
            assert broken == []
            remote = [u for u in requests if not u.startswith(("file:", "data:"))]
            assert remote == []

            def order() -> list[str]:
                return page.eval_on_selector_all("#methods-table tbody tr", "rs => rs.map(r => r.dataset.method)")

            assert order() == ["beta", "gamma", "alpha"]  # grid order
            page.click("#methods-table th[data-col='0']")  # method: ascending
            assert order() == ["alpha", "beta", "gamma"]
            page.click("#methods-table th[data-col='0']")  # again: descending
            assert order() == ["gamma", "beta", "alpha"]
            page.click("#methods-table th[data-col='7']")  # time s, numeric: 1+1, 2*4, 3*4 -> gamma, alpha, beta
            assert order() == ["gamma", "alpha", "beta"]
            page.focus("#methods-table th[data-col='7']")
            page.keyboard.press("Enter")  # the keyboard sorts too: descending
            assert order() == ["beta", "alpha", "gamma"]

            def shown() -> list[str]:
                return page.eval_on_selector_all(
                    "#methods-table tbody tr",
                    "rs => rs.filter(r => !r.hidden && r.offsetParent).map(r => r.dataset.method)",
                )

            page.select_option("#f-verdict", "fragile")
            assert shown() == ["beta"]
            assert page.text_content("#f-shown") == "1 of 3 methods shown"
            page.select_option("#f-verdict", "")
            page.select_option("#f-area", "decoding")
            assert shown() == ["alpha"]
            page.select_option("#f-area", "")
            page.fill("#f-text", "routes cheaper")
            assert shown() == ["gamma"]
            page.fill("#f-text", "")
            assert sorted(shown()) == ["alpha", "beta", "gamma"]

            page.screenshot(path=str(_artifacts() / "report.png"), full_page=True)
        finally:
            browser.close()
    assert errors == []
    assert (_artifacts() / "report.png").stat().st_size > 0
