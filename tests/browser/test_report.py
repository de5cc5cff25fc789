"""`jupyter nbrewind report` renders in headless Chromium with nothing fetched (issue 15).

The store is the demo's (audit, a changed parameter, repeat), made by the real CLI. The
page is opened from disk with every non-file request aborted and recorded; its sections
and plots must be there and drawn. The screenshot goes to NBREWIND_REPORT_SCREENSHOTS when
set (docs/images refreshes the documentation), else to a temporary folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labserver import chromium_path

pytestmark = [pytest.mark.browser, pytest.mark.kernel, pytest.mark.timeout(300)]

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SECTIONS = ["summary", "timeline", "cells", "tasks", "reasons", "composition", "rerun-causes"]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "NBREWIND_STORE"}
    return subprocess.run([sys.executable, "-m", "nbrewind.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=240, check=True)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("report")
    cli("demo", "--dir", str(folder / "demo"), cwd=folder)
    cli("report", "demo/demo.ipynb", "-o", "report.html", cwd=folder)
    return folder / "report.html"


def test_the_report_is_one_file_with_no_external_assets(report: Path) -> None:
    text = report.read_text("utf-8")
    assert text.count("<svg") == 4  # timeline, tasks, reasons, composition
    for external in ("<script", "<link", "<img", "src=\"http", "href=\"http", "url(http", "@import"):
        assert external not in text


def test_the_report_renders_in_chromium(report: Path, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    screenshots = Path(os.environ.get("NBREWIND_REPORT_SCREENSHOTS") or tmp_path)
    screenshots.mkdir(parents=True, exist_ok=True)
    fetched: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 1400})

            def route(r: object) -> None:
                request = r.request  # type: ignore[attr-defined]
                if request.url.startswith("file:"):
                    r.continue_()  # type: ignore[attr-defined]
                else:
                    fetched.append(request.url)
                    r.abort()  # type: ignore[attr-defined]

            page.route("**/*", route)
            page.goto(report.as_uri())
            for section in SECTIONS:
                assert page.locator(f"#{section}").is_visible(), section
            for section in ("timeline", "tasks", "reasons", "composition"):
                box = page.locator(f"#{section} svg").bounding_box()
                assert box is not None and box["width"] > 400 and box["height"] > 80, (section, box)
            rows = page.locator("#cells table tr")
            assert rows.count() == 1 + 9  # header and the demo's nine code cells
            decisions = [rows.nth(i).locator("td").nth(1).inner_text() for i in range(1, 10)]
            assert decisions.count("replayed") == 5 and decisions.count("executed") == 4
            assert "input REDUCER changed" in page.locator("#rerun-causes").inner_text()
            assert "kernel sessions" in page.locator("#summary").inner_text()
            page.screenshot(path=str(screenshots / "report.png"), full_page=True)
        finally:
            browser.close()
    assert fetched == []
    assert (screenshots / "report.png").stat().st_size > 20_000
    data = json.loads(cli("report", str(report.parent / "demo" / "demo.ipynb"), "-o", str(tmp_path / "again.html"),
                          "--json", cwd=tmp_path).stdout)
    assert [len(t["cells"]) for t in data["timelines"]] == [9, 9]
