"""The NBRewind JupyterLab extension in a real JupyterLab, driven through headless Chromium.

One server, one page and one four-cell notebook serve the module; the scenarios run
in order and build on each other (a scenario whose predecessor failed is skipped):

1. the extension is installed (from the wheel's share/jupyter/labextensions) and active;
2. on the audit kernel every executed cell gets a badge saying it ran;
3. on the repeat kernel the same notebook's cells say "replayed · saved ...";
4. after an edit, "Which cells will run?" marks exactly the cells that Run All then runs;
5. the NBRewind panel lists the store's sessions, and "Restore to here" brings back an
   earlier value of a name;
6. on a Python 3 kernel the extension shows nothing.

Scenarios 4 and 5 talk to the kernel over the `nbrewind` comm (plan, log requests).
Screenshots go to NBREWIND_LAB_SCREENSHOTS when set (docs/images refreshes the
documentation: lab-ext-badges.png, lab-ext-plan.png, lab-ext-panel.png), else to a
temporary folder.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from labserver import UI_TIMEOUT_MS, LabServer, browser_page, running_lab, screenshots_dir

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

EXTENSION = "nbrewind-labextension"
PLUGIN = "nbrewind-labextension:plugin"
RUN_TIMEOUT_S = 120.0

# (cell id, source). "slow" is the one edited; "uses" reads what it makes; "apart" reads
# nothing. A cell after one that runs and calls a library is at best "may run" (the plan
# takes what such a cell may change widely), so the cells that surely replay come first.
CELLS: list[tuple[str, str]] = [
    ("base", "x = 1\nprint('x is', x)"),
    ("apart", "w = 5\nprint('w is', w)"),
    ("slow", "import time\ntime.sleep(1.0)\ny = x * 10\nprint('y is', y)"),
    ("uses", "z = y + 1\nprint('z is', z)"),
]
CELL_IDS = [cid for cid, _ in CELLS]
EDITED_SLOW = "import time\ntime.sleep(1.0)\ny = x * 100\nprint('y is', y)"

# Runs `code` in the notebook's kernel outside any cell and returns what it printed.
KERNEL_OUTPUT_JS = """async (code) => {
    const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
    const future = kernel.requestExecute({code, silent: false, store_history: false});
    let text = '';
    future.onIOPub = msg => {
        if (msg.header.msg_type === 'stream') { text += msg.content.text; }
        if (msg.header.msg_type === 'error') { text += msg.content.ename + ': ' + msg.content.evalue; }
    };
    await future.done;
    return text;
}"""


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
class Badge:
    decision: str | None
    text: str
    title: str


@dataclass
class Session:
    """The shared state of the scenarios: the server, the page, what earlier steps saw."""

    server: LabServer
    page: Any
    notebook: Path
    screenshots: Path
    done: set[str] = field(default_factory=set)

    def require(self, *steps: str) -> None:
        missing = [s for s in steps if s not in self.done]
        if missing:
            pytest.skip(f"needs the earlier scenario(s) {', '.join(missing)}, which did not complete")

    def menu(self, top: str, command: str, label: str) -> None:
        """Open a main-menu entry: by its data-command, else by its label."""
        page = self.page
        page.get_by_role("menubar").get_by_role("menuitem", name=top, exact=True).click()
        menu = page.locator(".lm-Menu")
        item = menu.locator(f'.lm-Menu-item[data-command="{command}"]').or_(
            menu.get_by_role("menuitem", name=re.compile("^" + re.escape(label)))
        )
        item.first.click(timeout=UI_TIMEOUT_MS)

    def accept_dialog(self, option: str | None = None) -> None:
        dialog = self.page.locator(".jp-Dialog")
        dialog.wait_for(timeout=UI_TIMEOUT_MS)
        if option is not None:
            dialog.locator("select").select_option(label=option)
        dialog.locator(".jp-mod-accept").click()
        dialog.wait_for(state="detached", timeout=UI_TIMEOUT_MS)

    def kernel(self) -> tuple[str | None, str | None]:
        found = self.page.evaluate(
            """() => {
                const widget = window.jupyterapp && window.jupyterapp.shell.currentWidget;
                const kernel = widget && widget.sessionContext && widget.sessionContext.session
                    && widget.sessionContext.session.kernel;
                return kernel ? [kernel.name, kernel.status] : [null, null];
            }"""
        )
        return found[0], found[1]

    def wait_kernel(self, name: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
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

    def run_all(self, kernel: str, first: int = 1) -> None:
        """Run All, then wait for the prompts [first]..[first + n - 1] and the kernel to be idle."""
        self.menu("Run", "runmenu:run-all", "Run All Cells")
        expected = [f"[{i}]:" for i in range(first, first + len(CELLS))]
        deadline = time.monotonic() + RUN_TIMEOUT_S
        seen: list[str] = []
        while time.monotonic() < deadline:
            seen = self.prompts()
            if seen == expected:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"prompts are {seen}, expected {expected}:\n{self.server.log_tail()}")
        self.wait_kernel(kernel)

    def badges(self, timeout: float = 30) -> list[Badge | None]:
        """Each code cell's decision badge, once every cell has one (None where one never came)."""
        deadline = time.monotonic() + timeout
        found: list[Badge | None] = []
        while True:
            found = []
            for i in range(self.cells().count()):
                badge = self.cells().nth(i).locator(".nbrewind-row .nbrewind-decision")
                if badge.count() == 0:
                    found.append(None)
                    continue
                found.append(
                    Badge(badge.get_attribute("data-nbrewind-decision"), badge.inner_text().strip(), badge.get_attribute("title") or "")
                )
            if all(b is not None for b in found) or time.monotonic() > deadline:
                return found
            time.sleep(0.2)

    def plan_marks(self) -> dict[str, str | None]:
        return {cid: self.cells().nth(i).get_attribute("data-nbrewind-plan") for i, cid in enumerate(CELL_IDS)}

    def plan_text(self, index: int) -> str:
        marker = self.cells().nth(index).locator(".nbrewind-row .nbrewind-plan")
        return marker.inner_text().strip() if marker.count() else ""

    def edit(self, index: int, source: str) -> None:
        editor = self.cells().nth(index).locator(".cm-content")
        editor.click()
        self.page.keyboard.press("Control+a")
        self.page.keyboard.insert_text(source)
        self.page.keyboard.press("Escape")

    def kernel_output(self, code: str) -> str:
        text: str = self.page.evaluate(KERNEL_OUTPUT_JS, code)
        return text

    def screenshot(self, name: str) -> Path:
        path = self.screenshots / name
        self.page.screenshot(path=str(path))
        return path


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    with running_lab(tmp_path_factory.mktemp("lab-ext")) as server:
        yield server


@pytest.fixture(scope="module")
def session(lab: LabServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    screenshots = screenshots_dir(tmp_path_factory)
    notebook = lab.root / "study" / "rewind.ipynb"
    write_notebook(notebook)
    with browser_page(1280, 860) as page:
        yield Session(lab, page, notebook, screenshots)


def test_the_extension_is_installed_and_active(session: Session) -> None:
    page = session.page
    page.goto(session.server.url("/lab/tree/study/rewind.ipynb"))
    session.accept_dialog("NBRewind (audit)")  # a notebook without a kernel: JupyterLab asks
    session.wait_kernel("nbrewind-audit")
    config = json.loads(page.locator("#jupyter-config-data").text_content() or "{}")
    assert EXTENSION in [ext["name"] for ext in config.get("federated_extensions", [])]
    assert page.evaluate("id => window.jupyterapp.isPluginActivated(id)", PLUGIN)
    # "Which cells will run?" is a command (palette, context menu), available on this kernel.
    assert page.evaluate("() => window.jupyterapp.commands.isVisible('nbrewind:plan')")
    assert page.evaluate("() => window.jupyterapp.commands.label('nbrewind:plan')") == "Which cells will run?"
    # Its side panel and its toolbar button (shown on NBRewind kernels only).
    assert page.locator('.jp-SideBar .lm-TabBar-tab[title="NBRewind"]').count() == 1
    page.locator(".jp-NotebookPanel-toolbar .nbrewind-plan-button").wait_for(state="visible")
    session.done.add("loaded")


def test_audit_badges_say_every_cell_ran(session: Session) -> None:
    session.require("loaded")
    session.run_all("nbrewind-audit")
    badges = session.badges()
    assert all(b is not None for b in badges), badges
    assert [b.decision for b in badges if b] == ["ran"] * len(CELLS)
    for badge in badges:
        assert badge is not None
        assert badge.text == "ran · audit records every cell", badge
        assert "audit records every cell" in badge.title
    session.done.add("audit")


def test_repeat_badges_say_replayed_and_what_it_saved(session: Session) -> None:
    session.require("audit")
    session.menu("Kernel", "kernelmenu:change", "Change Kernel")
    session.accept_dialog("NBRewind (repeat)")
    session.wait_kernel("nbrewind-repeat")
    session.menu("Edit", "editmenu:clear-all", "Clear Outputs of All Cells")
    session.run_all("nbrewind-repeat")
    badges = session.badges()
    assert [b.decision if b else None for b in badges] == ["replayed"] * len(CELLS), badges
    for badge in badges:
        assert badge is not None
        assert re.fullmatch(r"replayed · saved (<1 ms|\d+(\.\d)? (ms|s))", badge.text), badge
        assert "replayed cell run #" in badge.title, badge
    slow = badges[CELL_IDS.index("slow")]
    assert slow is not None and re.fullmatch(r"replayed · saved \d\.\d s", slow.text), slow  # it slept 1 s on audit
    # The replayed outputs came back.
    assert "y is 10" in session.cells().nth(CELL_IDS.index("slow")).locator(".jp-OutputArea-output").inner_text()
    session.done.add("repeat")


def test_the_plan_marks_exactly_the_cells_run_all_then_runs(session: Session) -> None:
    session.require("repeat")
    slow = CELL_IDS.index("slow")
    session.edit(slow, EDITED_SLOW)
    session.page.locator(".jp-NotebookPanel-toolbar .nbrewind-plan-button").click()
    deadline = time.monotonic() + 60
    marks = session.plan_marks()
    while any(mark is None for mark in marks.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
        marks = session.plan_marks()
    assert marks == {"base": "replay", "slow": "run", "uses": "depends", "apart": "replay"}, marks
    assert session.plan_text(slow) == "will run · code changed"
    assert session.plan_text(CELL_IDS.index("uses")) == "may run · depends on In [3]"
    assert re.fullmatch(r"will replay · saves (<1 ms|\d+(\.\d)? (ms|s))", session.plan_text(0))
    session.screenshot("lab-ext-plan.png")

    session.run_all("nbrewind-repeat", first=len(CELLS) + 1)
    badges = session.badges()
    decisions = {cid: b.decision if b else None for cid, b in zip(CELL_IDS, badges)}
    ran = {cid for cid, d in decisions.items() if d == "ran"}
    will_run = {cid for cid, m in marks.items() if m == "run"}
    may_run = {cid for cid, m in marks.items() if m == "depends"}
    assert will_run <= ran <= will_run | may_run, (marks, decisions)
    assert {cid for cid, d in decisions.items() if d == "replayed"} == {cid for cid, m in marks.items() if m == "replay"}
    assert ran == {"slow", "uses"}, decisions  # `uses` reads the y that the edit changed
    assert "y is 100" in session.cells().nth(slow).locator(".jp-OutputArea-output").inner_text()
    # Executing a cell clears its marker.
    assert session.plan_marks() == {cid: None for cid in CELL_IDS}
    session.screenshot("lab-ext-badges.png")
    session.done.add("plan")


def test_the_panel_lists_the_sessions_and_restores_an_earlier_state(session: Session) -> None:
    session.require("plan")
    page = session.page
    page.locator('.jp-SideBar .lm-TabBar-tab[title="NBRewind"]').click()
    panel = page.locator("#nbrewind-panel")
    panel.wait_for(state="visible")
    sessions = panel.locator(".nbrewind-session")
    sessions.nth(1).wait_for(timeout=60_000)  # the audit session, then this repeat kernel's
    kernels = [text.strip() for text in panel.locator(".nbrewind-session-head .nbrewind-session-kernel").all_inner_texts()]
    assert kernels == ["repeat", "audit"], kernels
    current = sessions.nth(0)
    assert "nbrewind-mod-current" in (current.get_attribute("class") or "")
    # This kernel ran the notebook twice: 8 cell runs, the last 4 after the edit.
    current.locator(".nbrewind-run").nth(7).wait_for(timeout=60_000)
    decisions = [d.strip() for d in current.locator(".nbrewind-run .nbrewind-decision").all_inner_texts()]
    assert decisions == ["replayed"] * 4 + ["replayed", "replayed", "ran", "ran"], decisions
    codes = [c.strip() for c in current.locator(".nbrewind-run-code").all_inner_texts()]
    assert codes == ["x = 1", "w = 5", "import time", "z = y + 1"] * 2, codes  # first lines

    # Back to the state after the audit's run of the unedited cell: y was 10 then, is 100 now.
    assert session.kernel_output("print(y)").strip() == "100"
    audit_run = sessions.nth(1).locator('.nbrewind-run[data-cell-id="slow"]')
    run_id = audit_run.get_attribute("data-cell-run")
    audit_run.get_by_role("button", name="Restore to here").click()
    output = panel.locator('.nbrewind-panel-output[data-done="true"]')
    output.wait_for(timeout=60_000)
    text = output.inner_text()
    assert f"%nbrewind restore #{run_id}" in text
    assert f"restored the state after cell run #{run_id}" in text, text
    assert session.kernel_output("print(y)").strip() == "10"
    # The panel marks the run it restored to (until a cell runs).
    panel.locator(f'.nbrewind-run.nbrewind-mod-restored[data-cell-run="{run_id}"]').wait_for()
    page.mouse.move(5, 5)  # no hover highlight in the screenshot
    session.screenshot("lab-ext-panel.png")


def test_nothing_shows_on_another_kernel(session: Session) -> None:
    session.require("loaded")
    session.menu("Kernel", "kernelmenu:change", "Change Kernel")
    session.accept_dialog("Python 3 (ipykernel)")
    session.wait_kernel("python3")
    session.run_all("python3")
    assert session.page.locator(".jp-Notebook .nbrewind-row").count() == 0
    assert session.plan_marks() == {cid: None for cid in CELL_IDS}
    assert session.page.locator(".jp-NotebookPanel-toolbar .nbrewind-plan-button").is_hidden()
