"""Issue 13, item 2: shutting a kernel down never loses a recorded cell.

jupyter_client asks a kernel to shut down, sends SIGTERM half-way through its
`shutdown_wait_time` (5 s by default, what plain nbclient and papermill use) and
SIGKILL at its end. The disk here is made slow on purpose (every fsync of the
kernel sleeps 0.15 s first, through a `sitecustomize`), so the last cell's 120 MB
(58 chunks, each with a file and a folder fsync, two at a time) take over 8 s:
longer than that whole window.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

from nbrewind.store import Store, verify_store
from reliability_tools import Kernel, nbrewind_lines, slow_disk

pytestmark = pytest.mark.kernel

CELLS = [
    "import numpy as np\nsmall = np.arange(10.0)",
    "total = float(small.sum())\nprint(total)",
    "big = np.random.default_rng(0).random(15_000_000)  # 120 MB",
]


@pytest.fixture
def slow_env(tmp_path: Path, kernel_env: dict[str, str]) -> dict[str, str]:
    env = dict(kernel_env)
    env["PYTHONPATH"] = os.pathsep.join((slow_disk(tmp_path / "slow", 0.15), env["PYTHONPATH"]))
    return env


def notebook(path: Path) -> Path:
    nb = new_notebook(cells=[new_code_cell(c) for c in CELLS])
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, str(path))
    return path


def plain_nbclient(path: Path, env: dict[str, str], stderr: Path) -> None:
    """nbclient as a user runs it: nothing configured, so a 5 s shutdown wait."""
    nb = nbformat.read(str(path), as_version=4)
    client = NotebookClient(nb, kernel_name="nbrewind-audit", resources={"metadata": {"path": str(path.parent)}})
    with open(stderr, "wb") as err:
        client.execute(env=env, stderr=err)


def recorded(store: Path) -> list[str]:
    with Store.open(store, create=False) as opened:
        assert verify_store(opened).ok
        return [r.code for r in opened.catalog.cell_runs()]


def test_premise_without_the_kernel_waiting_a_plain_nbclient_run_loses_its_last_cell(
    tmp_path: Path, slow_env: dict[str, str]
) -> None:
    """With the wait before the reply switched off, the client's SIGKILL comes while the
    last cell is still being written: it is not recorded, and everything before it is
    durable, verified and replayed."""
    env = dict(slow_env, NBREWIND_BACKLOG_SECONDS="1000")
    nb = notebook(tmp_path / "nb.ipynb")
    plain_nbclient(nb, env, tmp_path / "audit.err")
    store = Path(env["NBREWIND_STORE"])
    assert recorded(store) == CELLS[:2]

    # The same modules as the audit (a loaded `sitecustomize` is an input of every cell).
    repeat = Kernel("nbrewind-repeat", tmp_path, slow_env, tmp_path / "repeat.err", shutdown_wait=60).start()
    try:
        shown = repeat.run(CELLS)
        repeat.shutdown()
    finally:
        repeat.close()
    assert shown[1] == [("stdout", "45.0\n")]
    with Store.open(store, create=False) as opened:
        decisions = [r.decision for r in opened.catalog.cell_runs()[2:]]
    assert decisions == ["replayed", "replayed", "executed"]


def test_a_plain_nbclient_run_records_its_last_cell(tmp_path: Path, slow_env: dict[str, str]) -> None:
    """The kernel holds the last reply until what is left to write takes about 2 s, and
    holds off the client's SIGTERM while it finishes: the default 5 s window is enough."""
    nb = notebook(tmp_path / "nb.ipynb")
    plain_nbclient(nb, slow_env, tmp_path / "audit.err")
    assert recorded(Path(slow_env["NBREWIND_STORE"])) == CELLS
    assert nbrewind_lines((tmp_path / "audit.err").read_text()) == []


def test_jupyter_nbrewind_run_waits_for_the_writer(tmp_path: Path, kernel_env: dict[str, str]) -> None:
    """`jupyter nbrewind run` waits for the kernel's writer before it asks the kernel to shut
    down, so even with the wait before the reply switched off, and a disk so slow that the
    last cell takes longer than any shutdown wait (0.4 s per fsync: over 20 s), every cell is
    durable when the command returns."""
    env = dict(kernel_env)
    env["PYTHONPATH"] = os.pathsep.join((slow_disk(tmp_path / "slower", 0.4), env["PYTHONPATH"]))
    env["NBREWIND_BACKLOG_SECONDS"] = "1000"
    nb = notebook(tmp_path / "nb.ipynb")
    cli = [sys.executable, "-c", "from nbrewind.cli import main; raise SystemExit(main())"]
    done = subprocess.run([*cli, "run", str(nb), "--kernel", "audit", "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["store"] == env["NBREWIND_STORE"]
    assert recorded(Path(env["NBREWIND_STORE"])) == CELLS
