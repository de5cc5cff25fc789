"""Setup for the JupyterLab suite: the `browser` marker, and skipping it when the
browser tooling is missing.

The Playwright tests (marked `browser`) need the Python packages `playwright` and
`jupyterlab` and a Chromium binary (Debian's `chromium`; `.ci/install-browser`
installs all three). Without them those tests are skipped with the reason, unless
NBREWIND_REQUIRE_BROWSER=1 is set (CI sets it), which turns the skip into a failure
so a broken install cannot pass unnoticed.
"""

from __future__ import annotations

import os

import pytest

from labserver import missing_browser_tools

def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip (or, when required, fail) browser tests whose tools are missing."""
    browser_items = [item for item in items if item.get_closest_marker("browser") is not None]
    if not browser_items:
        return
    missing = missing_browser_tools()
    if not missing:
        return
    reason = "JupyterLab browser suite needs " + ", ".join(missing) + "; run .ci/install-browser"
    if os.environ.get("NBREWIND_REQUIRE_BROWSER") == "1":
        raise pytest.UsageError(reason + " (NBREWIND_REQUIRE_BROWSER=1)")
    for item in browser_items:
        item.add_marker(pytest.mark.skip(reason=reason))
