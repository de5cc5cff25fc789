"""The kernels in a real JupyterLab, driven through headless Chromium (issue 9).

One JupyterLab server and one page serve the whole module; the scenarios run in
order and build on each other (a scenario whose predecessor failed is skipped):

1. the launcher shows both kernels with their logos;
2. a notebook with a small Dask computation, a DataFrame and a figure runs on audit;
3. a late cell is edited and re-run out of order, a long cell is interrupted, the
   kernel is restarted: the store beside the notebook stays consistent;
4. after switching to repeat, Run All replays unchanged cells (rich outputs
   included) at once and runs the edited cell;
5. `%nbrewind why` and `%nbrewind status` render readable text.

Screenshots go to NBREWIND_LAB_SCREENSHOTS when set (docs/images refreshes the
documentation), else to a temporary folder.
"""

from __future__ import annotations

import importlib.util
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from labkernel import assert_consistent, wait_for_rows
from labserver import UI_TIMEOUT_MS, LabServer, browser_page, running_lab, screenshots_dir
from nbrewind.store.report import LogRow

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
NO_MATPLOTLIB = "matplotlib is not installed in this environment: the figure cell is left out"
RUN_TIMEOUT_S = 90.0

# (cell id, source). The late cell reads `factor`, which a later cell changes.
CELLS: list[tuple[str, str]] = [
    ("setup", "import time\nimport dask\nimport pandas as pd\nfactor = 1"),
    (
        "dask",
        "@dask.delayed\ndef square(x):\n    time.sleep(0.3)\n    return x * x\n\n"
        'total = dask.delayed(sum)([square(i) for i in range(5)]).compute(scheduler="synchronous")\n'
        'print("total of squares:", total)',
    ),
    ("frame", 'df = pd.DataFrame({"x": range(5), "square": [i * i for i in range(5)]})\ndf'),
    (
        "figure",
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots(figsize=(4, 2.5))\n"
        'ax.plot(df["x"], df["square"], marker="o")\n'
        'ax.set_title("squares")\n'
        "plt.show()",
    ),
    ("late", 'summary = total * factor\nprint("summary:", summary)'),
    ("why", "%nbrewind why"),
    ("later", "factor = 10"),
    ("status", "%nbrewind status"),
]
if not HAS_MATPLOTLIB:
    CELLS = [cell for cell in CELLS if cell[0] != "figure"]
CELL_IDS = [cid for cid, _ in CELLS]
EDITED_LATE = 'summary = total * factor + len(df)\nprint("summary:", summary)'
LONG_CELL = "for step in range(600):\n    time.sleep(0.1)"


def write_notebook(path: Path) -> None:
    """The scenario notebook, with no kernel chosen (JupyterLab will ask)."""
    cells = [
        {"cell_type": "code", "id": cid, "metadata": {}, "execution_count": None, "outputs": [], "source": source}
        for cid, source in CELLS
    ]
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": {"language_info": {"name": "python"}}, "cells": cells}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(notebook, indent=1))


@dataclass
class Journey:
    """The shared state of the scenarios: the server, the page, and what earlier steps saw."""

    server: LabServer
    page: Any
    notebook: Path
    screenshots: Path
    done: set[str] = field(default_factory=set)
    outputs: dict[str, dict[str, str]] = field(default_factory=dict)
    run_all_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def store_path(self) -> Path:
        return self.notebook.with_name(self.notebook.name + ".nbrewind")

    def require(self, *steps: str) -> None:
        """Skip this scenario when one it builds on did not complete."""
        missing = [s for s in steps if s not in self.done]
        if missing:
            pytest.skip(f"needs the earlier scenario(s) {', '.join(missing)}, which did not complete")

    # -- the UI -----------------------------------------------------------------

    def menu(self, top: str, command: str, label: str) -> None:
        """Open a main-menu entry: by its data-command, else by its label."""
        page = self.page
        page.get_by_role("menubar").get_by_role("menuitem", name=top, exact=True).click()
        menu = page.locator(".lm-Menu")
        item = menu.locator(f'.lm-Menu-item[data-command="{command}"]').or_(
            menu.get_by_role("menuitem", name=re.compile("^" + re.escape(label)))
        )
        item.first.click(timeout=UI_TIMEOUT_MS)

    def kernel(self) -> tuple[str | None, str | None]:
        """(kernel name, status) of the notebook's session, as the frontend sees it."""
        found = self.page.evaluate(
            """() => {
                const widget = window.jupyterapp && window.jupyterapp.shell.currentWidget;
                const kernel = widget && widget.sessionContext && widget.sessionContext.session
                    && widget.sessionContext.session.kernel;
                return kernel ? [kernel.name, kernel.status] : [null, null];
            }"""
        )
        return found[0], found[1]

    def wait_kernel(self, name: str, timeout: float = 60, after: float = 0.0) -> None:
        """Wait until the notebook's kernel is `name` and idle."""
        deadline = time.monotonic() + timeout
        time.sleep(after)
        seen: tuple[str | None, str | None] = (None, None)
        while time.monotonic() < deadline:
            seen = self.kernel()
            if seen == (name, "idle"):
                return
            time.sleep(0.2)
        raise AssertionError(f"kernel is {seen}, expected ({name!r}, 'idle'):\n{self.server.log_tail()}")

    def cells(self) -> Any:
        return self.page.locator(".jp-Notebook .jp-CodeCell")

    def prompts(self) -> list[str]:
        return [p.strip() for p in self.page.locator(".jp-Notebook .jp-CodeCell .jp-InputPrompt").all_inner_texts()]

    def wait_prompts(self, expected: list[str], timeout: float = RUN_TIMEOUT_S) -> float:
        """Wait until the input prompts read `expected`; return how long it took."""
        started = time.monotonic()
        seen: list[str] = []
        while time.monotonic() - started < timeout:
            seen = self.prompts()
            if seen == expected:
                return time.monotonic() - started
            time.sleep(0.1)
        raise AssertionError(f"prompts are {seen}, expected {expected}:\n{self.server.log_tail()}")

    def wait_prompt(self, index: int, expected: str, timeout: float = RUN_TIMEOUT_S) -> None:
        """Wait until cell `index`'s input prompt reads `expected` (the count comes with the
        execute reply, after the cell's outputs)."""
        deadline = time.monotonic() + timeout
        while self.prompts()[index] != expected and time.monotonic() < deadline:
            time.sleep(0.1)
        assert self.prompts()[index] == expected, self.server.log_tail()

    def output_text(self, index: int) -> str:
        texts = self.cells().nth(index).locator(".jp-OutputArea-output").all_inner_texts()
        return "\n".join(text.strip() for text in texts if text.strip())

    def collect_outputs(self) -> dict[str, str]:
        return {cid: self.output_text(i) for i, cid in enumerate(CELL_IDS)}

    def edit(self, index: int, source: str) -> None:
        """Replace a cell's source by typing into its editor, then leave edit mode."""
        editor = self.cells().nth(index).locator(".cm-content")
        editor.click()
        self.page.keyboard.press("Control+a")
        self.page.keyboard.insert_text(source)
        self.page.keyboard.press("Escape")

    def select(self, index: int) -> None:
        self.cells().nth(index).locator(".jp-InputPrompt").click()

    def accept_dialog(self, option: str | None = None) -> None:
        dialog = self.page.locator(".jp-Dialog")
        dialog.wait_for(timeout=UI_TIMEOUT_MS)
        if option is not None:
            dialog.locator("select").select_option(label=option)
        dialog.locator(".jp-mod-accept").click()
        dialog.wait_for(state="detached", timeout=UI_TIMEOUT_MS)

    def screenshot(self, name: str) -> Path:
        path = self.screenshots / name
        self.page.screenshot(path=str(path))
        return path


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    with running_lab(tmp_path_factory.mktemp("lab")) as server:
        yield server


@pytest.fixture(scope="module")
def journey(lab: LabServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Journey]:
    screenshots = screenshots_dir(tmp_path_factory)
    notebook = lab.root / "analysis" / "demo.ipynb"
    write_notebook(notebook)
    with browser_page(1200, 1500) as page:
        yield Journey(lab, page, notebook, screenshots)


def log_by_cell(rows: list[LogRow]) -> dict[str | None, LogRow]:
    return {row.cell_id: row for row in rows}


def test_launcher_shows_both_kernels_with_their_logos(journey: Journey) -> None:
    page = journey.page
    page.goto(journey.server.url("/lab"))
    for name, display in (("nbrewind-audit", "NBRewind (audit)"), ("nbrewind-repeat", "NBRewind (repeat)")):
        card = page.locator(f'.jp-LauncherCard[data-category="Notebook"][title="{display}"]')
        card.wait_for(timeout=60_000)
        logo = card.locator("img")
        assert f"/kernelspecs/{name}/" in (logo.get_attribute("src") or "")
        page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=logo.element_handle())
        response = page.request.get(journey.server.url(logo.get_attribute("src") or ""))
        assert response.ok and response.headers["content-type"].startswith("image/")
    journey.screenshot("lab-launcher.png")
    journey.done.add("launcher")


def test_audit_runs_the_notebook_and_shows_its_outputs(journey: Journey) -> None:
    page = journey.page
    page.goto(journey.server.url("/lab/tree/analysis/demo.ipynb"))
    journey.accept_dialog("NBRewind (audit)")  # a notebook without a kernel: JupyterLab asks
    journey.wait_kernel("nbrewind-audit")
    journey.menu("Run", "runmenu:run-all", "Run All Cells")
    journey.run_all_seconds["audit"] = journey.wait_prompts([f"[{i}]:" for i in range(1, len(CELLS) + 1)])
    page.get_by_text("NBRewind audit kernel").wait_for()
    outputs = journey.collect_outputs()
    journey.outputs["audit"] = outputs
    assert outputs["dask"] == "total of squares: 30"
    assert journey.cells().nth(CELL_IDS.index("frame")).locator("table.dataframe").count() == 1
    if HAS_MATPLOTLIB:
        assert journey.cells().nth(CELL_IDS.index("figure")).locator(".jp-RenderedImage img").count() == 1
    assert outputs["late"] == "summary: 30"
    # The store folder shows up in the file browser, beside the notebook.
    page.locator('.jp-FileBrowser [data-command="filebrowser:refresh"]').or_(
        page.locator(".jp-FileBrowser").get_by_title(re.compile("^Refresh"))
    ).first.click()
    page.locator(".jp-DirListing-itemText", has_text=journey.store_path.name).wait_for()
    journey.screenshot("lab-audit.png")
    rows = wait_for_rows(journey.store_path, len(CELLS))
    assert [(r.cell_id, r.kernel, r.decision, r.status) for r in rows] == [
        (cid, "audit", "executed", "ok") for cid in CELL_IDS
    ]
    journey.done.add("audit")


def test_out_of_order_run_interrupt_and_restart_keep_the_store_beside_the_notebook(journey: Journey) -> None:
    journey.require("audit")
    late = CELL_IDS.index("late")
    # Edit a late cell and re-run it alone, after `factor = 10` ran.
    journey.edit(late, EDITED_LATE)
    journey.select(late)
    journey.menu("Run", "notebook:run-cell", "Run Selected Cell and Do not Advance")
    count = len(CELLS) + 1
    journey.page.get_by_text("summary: 305").wait_for()
    journey.wait_prompt(late, f"[{count}]:")
    # A long cell, interrupted from the Kernel menu, then removed.
    journey.select(len(CELLS) - 1)
    journey.page.locator('.jp-NotebookPanel-toolbar [data-command="notebook:insert-cell-below"]').click()
    journey.edit(len(CELLS), LONG_CELL)
    journey.select(len(CELLS))
    journey.menu("Run", "notebook:run-cell", "Run Selected Cell and Do not Advance")
    deadline = time.monotonic() + 30
    while journey.kernel()[1] != "busy" and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    journey.menu("Kernel", "kernelmenu:interrupt", "Interrupt Kernel")
    journey.cells().nth(len(CELLS)).get_by_text("KeyboardInterrupt").first.wait_for()
    journey.wait_kernel("nbrewind-audit")
    long_cell_id = journey.page.evaluate(
        "() => window.jupyterapp.shell.currentWidget.content.activeCell.model.id"
    )
    journey.menu("Edit", "notebook:delete-cell", "Delete Cell")
    assert journey.cells().count() == len(CELLS)
    # Restart from the Kernel menu; the new process records into the same store.
    journey.menu("Kernel", "kernelmenu:restart", "Restart Kernel")
    journey.accept_dialog()
    journey.wait_kernel("nbrewind-audit", after=0.5)
    journey.select(0)
    journey.menu("Run", "notebook:run-cell", "Run Selected Cell and Do not Advance")
    journey.wait_prompt(0, "[1]:")

    rows = wait_for_rows(journey.store_path, len(CELLS) + 3)
    first, *_ = rows
    extra = [(r.cell_id, r.execution_count, r.status, r.session == first.session) for r in rows[len(CELLS):]]
    assert extra == [
        ("late", count, "ok", True),
        (long_cell_id, count + 1, "aborted", True),
        ("setup", 1, "ok", False),
    ]
    assert rows[len(CELLS)].code == EDITED_LATE
    assert_consistent(journey.store_path)
    assert not (journey.server.root / ".nbrewind").exists()
    assert not (journey.notebook.parent / ".nbrewind").exists()
    journey.done.add("audit-edits")


def test_repeat_replays_unchanged_cells_at_once_and_runs_the_edited_one(journey: Journey) -> None:
    journey.require("audit-edits")
    journey.menu("Kernel", "kernelmenu:change", "Change Kernel")
    journey.accept_dialog("NBRewind (repeat)")
    journey.wait_kernel("nbrewind-repeat")
    journey.menu("Edit", "editmenu:clear-all", "Clear Outputs of All Cells")
    assert journey.output_text(CELL_IDS.index("dask")) == ""
    journey.menu("Run", "runmenu:run-all", "Run All Cells")
    journey.run_all_seconds["repeat"] = journey.wait_prompts([f"[{i}]:" for i in range(1, len(CELLS) + 1)])
    journey.page.get_by_text("NBRewind repeat kernel").wait_for()
    outputs = journey.collect_outputs()
    journey.outputs["repeat"] = outputs
    journey.screenshot("lab-repeat.png")

    audit = journey.outputs["audit"]
    for cid in ("setup", "dask", "frame", "later"):
        assert outputs[cid] == audit[cid], cid
    assert journey.cells().nth(CELL_IDS.index("frame")).locator("table.dataframe").count() == 1
    # In order, the edited cell sees factor = 1, not the 10 its out-of-order run saw.
    assert outputs["late"] == "summary: 35"

    rows = wait_for_rows(journey.store_path, 2 * len(CELLS) + 3)
    repeat = log_by_cell([r for r in rows if r.kernel == "repeat"])
    decisions = {cid: repeat[cid].decision for cid in CELL_IDS}
    replayed = [cid for cid in CELL_IDS if cid not in ("late", "why", "status")]
    assert decisions == {cid: "replayed" if cid in replayed else "executed" for cid in CELL_IDS}
    assert "factor" in (repeat["late"].reason or "")
    assert "magics" in (repeat["why"].reason or "")
    # "At once": the Dask cell slept 1.5 s on audit; its replay takes milliseconds.
    audit_dask = next(r for r in rows if r.cell_id == "dask" and r.kernel == "audit")
    assert (audit_dask.duration or 0) >= 1.5
    assert all((repeat[cid].duration or 0) < 0.5 for cid in replayed), {c: repeat[c].duration for c in replayed}
    assert_consistent(journey.store_path)
    journey.done.add("repeat")


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason=NO_MATPLOTLIB)
def test_repeat_replays_the_recorded_figure(journey: Journey) -> None:
    journey.require("repeat")
    image = journey.cells().nth(CELL_IDS.index("figure")).locator(".jp-RenderedImage img")
    assert image.count() == 1
    assert journey.page.evaluate("img => img.complete && img.naturalWidth > 0", image.element_handle())
    rows = wait_for_rows(journey.store_path, 2 * len(CELLS) + 3)
    repeat = log_by_cell([r for r in rows if r.kernel == "repeat"])
    assert repeat["figure"].decision == "replayed"


def test_nbrewind_magics_render_readable_text(journey: Journey) -> None:
    journey.require("repeat")
    audit, repeat = journey.outputs["audit"], journey.outputs["repeat"]
    late = CELL_IDS.index("late") + 1
    assert audit["why"] == f"In [{late}]: executed: audit records every cell"
    assert repeat["why"] == f"In [{late}]: executed: input factor changed"
    for kernel, text in (("audit", audit["status"]), ("repeat", repeat["status"])):
        lines = text.splitlines()
        assert lines[0] == f"NBRewind {kernel} kernel; recording on"
        assert lines[1] == f"store: {journey.store_path.resolve()}"
        assert lines[2].startswith("cell runs: ")
        assert any(line.startswith("last cell In [") for line in lines)
    assert "replayed" in repeat["status"].splitlines()[2]
