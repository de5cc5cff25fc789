"""What JupyterLab sends, below the browser: cell ids, the session path, out-of-order
runs, interrupts, restarts and a kernel change within one notebook session.

These need no browser, only real kernels, so they run wherever the kernel tests
run; they pin down the behaviour the browser suite (test_lab.py) relies on.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from labkernel import LabKernel, assert_consistent, wait_for_rows

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(120)]

SETUP = "factor = 1\nvalues = [1, 2, 3]"
LATE = "summary = sum(values) * factor\nprint('summary:', summary)"
EDITED = "summary = sum(values) * factor + 1\nprint('summary:', summary)"
LATER = "factor = 10"


@pytest.fixture
def notebook(tmp_path: Path) -> Path:
    """A notebook path in a sub-folder, as a JupyterLab session would name it."""
    folder = tmp_path / "project" / "analysis"
    folder.mkdir(parents=True)
    path = folder / "study.ipynb"
    path.write_text("{}")
    return path


def test_cell_ids_and_the_session_path_are_recorded(notebook: Path) -> None:
    store_path = notebook.with_name("study.ipynb.nbrewind")
    with LabKernel(notebook, "nbrewind-audit") as kernel:
        assert kernel.run(SETUP, "cell-a").reply["status"] == "ok"
        assert kernel.run(LATE, "cell-b").text == "summary: 6\n"
    rows = wait_for_rows(store_path, 2)
    assert [(r.cell_id, r.decision, r.status) for r in rows] == [("cell-a", "executed", "ok"), ("cell-b", "executed", "ok")]
    assert not (notebook.parent / ".nbrewind").exists()
    assert_consistent(store_path)


def test_an_edited_cell_rerun_out_of_order_runs_again_on_repeat(notebook: Path) -> None:
    """The out-of-order run saw factor = 10; a run-all in order sees factor = 1 at that cell."""
    store_path = notebook.with_name("study.ipynb.nbrewind")
    with LabKernel(notebook, "nbrewind-audit") as audit:
        audit.run(SETUP, "cell-a")
        audit.run(LATE, "cell-b")
        audit.run(LATER, "cell-c")
        assert audit.run(EDITED, "cell-b").text == "summary: 61\n"
    wait_for_rows(store_path, 4)
    with LabKernel(notebook, "nbrewind-repeat") as repeat:
        texts = [repeat.run(code, cid).text for code, cid in [(SETUP, "cell-a"), (EDITED, "cell-b"), (LATER, "cell-c")]]
    assert texts == ["", "summary: 7\n", ""]
    rows = [r for r in wait_for_rows(store_path, 7) if r.kernel == "repeat"]
    assert [(r.cell_id, r.decision) for r in rows] == [("cell-a", "replayed"), ("cell-b", "executed"), ("cell-c", "replayed")]
    assert "factor" in (rows[1].reason or "")
    assert_consistent(store_path)


def test_interrupt_then_restart_keeps_one_consistent_store(notebook: Path) -> None:
    store_path = notebook.with_name("study.ipynb.nbrewind")
    kernel = LabKernel(notebook, "nbrewind-audit").start()
    try:
        kernel.run(SETUP + "\nimport time", "cell-a")
        msg_id = kernel.send("for step in range(600):\n    time.sleep(0.1)", "cell-long")
        time.sleep(1.0)
        kernel.interrupt()
        interrupted = kernel.collect(msg_id, timeout=30)
        assert interrupted.reply["status"] == "error" and interrupted.reply["ename"] == "KeyboardInterrupt"
        assert kernel.run(LATE, "cell-b").text == "summary: 6\n"  # the kernel is still usable
        kernel.restart()
        after = kernel.run(LATE, "cell-b")
        assert after.reply["status"] == "error" and after.reply["ename"] == "NameError"
        assert kernel.run(SETUP, "cell-a").reply["status"] == "ok"
    finally:
        kernel.shutdown()
    rows = wait_for_rows(store_path, 5)
    assert [(r.cell_id, r.status) for r in rows] == [
        ("cell-a", "ok"),
        ("cell-long", "aborted"),
        ("cell-b", "ok"),
        ("cell-b", "error"),
        ("cell-a", "ok"),
    ]
    assert len({r.session for r in rows[:3]}) == 1 and rows[3].session == rows[4].session != rows[0].session
    assert [r.execution_count for r in rows] == [1, 2, 3, 1, 2]
    assert_consistent(store_path)


def test_repeat_after_a_restart_replays_and_restores_by_cell_id(notebook: Path) -> None:
    """Changing the kernel keeps the session path, so repeat finds the audit's store."""
    store_path = notebook.with_name("study.ipynb.nbrewind")
    with LabKernel(notebook, "nbrewind-audit") as audit:
        audit.run(SETUP, "cell-a")
        audit.run(LATE, "cell-b")
        audit.restart()
        audit.run(SETUP, "cell-a")
    wait_for_rows(store_path, 3)
    with LabKernel(notebook, "nbrewind-repeat") as repeat:
        assert repeat.run(SETUP, "cell-a").text == ""
        assert repeat.run(LATE, "cell-b").text == "summary: 6\n"
        why = repeat.run("%nbrewind why", "cell-why").text
        restored = repeat.run("summary = None\n", "cell-x")
        assert restored.reply["status"] == "ok"
        message = repeat.run("%nbrewind restore cell-b", "cell-restore").text
        assert repeat.run("print(summary)", "cell-y").text == "6\n"
    assert why.startswith("In [2]: replayed: code and") and "match cell run #2" in why
    assert message.startswith("restored the state after cell run #")
    assert_consistent(store_path)


def test_contextual_help_and_completion_see_replayed_names(notebook: Path) -> None:
    """JupyterLab's Shift+Tab (inspect_request) and Tab (complete_request) on a replayed name."""
    with LabKernel(notebook, "nbrewind-audit") as audit:
        audit.run("def scaled(x):\n    '''Scale x by three.'''\n    return 3 * x", "cell-f")
    wait_for_rows(notebook.with_name("study.ipynb.nbrewind"), 1)
    with LabKernel(notebook, "nbrewind-repeat") as repeat:
        repeat.run("def scaled(x):\n    '''Scale x by three.'''\n    return 3 * x", "cell-f")
        completion = repeat.request("complete_request", {"code": "scal", "cursor_pos": 4})
        inspection = repeat.request("inspect_request", {"code": "scaled", "cursor_pos": 6, "detail_level": 0})
    assert "scaled" in completion["matches"]
    assert inspection["found"] and "Scale x by three." in inspection["data"]["text/plain"]
