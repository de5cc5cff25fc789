"""Audit and repeat on real kernels, started through jupyter_client and nbclient."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client.manager import start_new_kernel
from nbformat.v4 import new_code_cell, new_notebook

from nbrewind.run import run_notebook
from nbrewind.store import Store, verify_store
from nbrewind.store.report import cell_log

pytestmark = pytest.mark.kernel

CELLS = [
    "import numpy as np, pandas as pd\nfrom IPython.display import display, HTML",
    "print('hello')\nimport sys; print('to stderr', file=sys.stderr)",
    "rng = np.random.default_rng(0)\ndf = pd.DataFrame({'x': rng.random(5), 'y': range(5)})\ndf",
    "display(HTML('<b>bold</b>'))\nK = 3",
    "total = float(df['x'].sum()) * K\ntotal",
    "raise RuntimeError('recorded failure')",
    "after = total + 1\nafter",
]


def write_notebook(path: Path, cells: list[str]) -> Path:
    nb = new_notebook(cells=[new_code_cell(c) for c in cells])
    nbformat.write(nb, str(path))
    return path


def outputs_of(path: Path) -> list[list[dict[str, Any]]]:
    """Each code cell's outputs, without what legitimately differs between runs."""
    nb = nbformat.read(str(path), as_version=4)
    cleaned = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outs = []
        for out in cell.outputs:
            out = dict(out)
            out.pop("metadata", None)
            if out.get("output_type") == "error":
                out["traceback"] = out["traceback"][-1:]  # file names of frames differ per process
            outs.append(out)
        cleaned.append(outs)
    return cleaned


def test_repeat_outputs_equal_a_fresh_python3_run(tmp_path: Path) -> None:
    nb = write_notebook(tmp_path / "nb.ipynb", CELLS)
    store = tmp_path / "nb.ipynb.nbrewind"
    run_notebook(nb, kernel="audit", store=store, allow_errors=True, output=tmp_path / "audit.ipynb")
    edited = [*CELLS[:3], CELLS[3].replace("K = 3", "K = 4"), *CELLS[4:]]
    write_notebook(nb, edited)
    run_notebook(nb, kernel="repeat", store=store, allow_errors=True, output=tmp_path / "repeat.ipynb")
    run_notebook(nb, kernel="python3", allow_errors=True, output=tmp_path / "fresh.ipynb")
    assert outputs_of(tmp_path / "repeat.ipynb") == outputs_of(tmp_path / "fresh.ipynb")
    with Store.open(store, create=False) as opened:
        rows = cell_log(opened, last_session=True)
        assert verify_store(opened).ok
    assert [r.decision[0] for r in rows] == ["r", "r", "r", "e", "e", "r", "e"]
    fresh = nbformat.read(str(tmp_path / "fresh.ipynb"), as_version=4)
    repeat = nbformat.read(str(tmp_path / "repeat.ipynb"), as_version=4)
    assert [c.execution_count for c in repeat.cells] == [c.execution_count for c in fresh.cells]


def test_stop_on_error_behaves_the_same_on_replay(tmp_path: Path) -> None:
    from nbclient.exceptions import CellExecutionError

    nb = write_notebook(tmp_path / "err.ipynb", ["x = 1", "raise ValueError('boom')", "y = 2"])
    store = tmp_path / "store"
    with pytest.raises(CellExecutionError, match="boom"):
        run_notebook(nb, kernel="audit", store=store)
    with pytest.raises(CellExecutionError, match="boom"):
        run_notebook(nb, kernel="repeat", store=store)
    with Store.open(store, create=False) as opened:
        rows = cell_log(opened, last_session=True)
    assert [r.decision for r in rows] == ["replayed", "replayed"]
    assert rows[1].status == "error"


#: Seconds to wait for a kernel's reply or its idle status. Generous: on a loaded
#: 2-core machine a cell that records a checkpoint can take many seconds.
REPLY_TIMEOUT = 120.0


def _shell_reply(kc: Any, msg_id: str, timeout: float = REPLY_TIMEOUT) -> dict[str, Any]:
    """The shell reply to `msg_id`; replies to other requests (a startup kernel_info_reply) are skipped."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no shell reply to {msg_id} within {timeout} s")
        try:
            reply: dict[str, Any] = kc.get_shell_msg(timeout=remaining)
        except queue.Empty:
            continue
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply


def _iopub_until_idle(kc: Any, msg_id: str, timeout: float = REPLY_TIMEOUT) -> list[dict[str, Any]]:
    """The IOPub messages `msg_id` caused, up to the kernel's idle status for it (others are skipped)."""
    deadline = time.monotonic() + timeout
    outputs: list[dict[str, Any]] = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no idle status for {msg_id} within {timeout} s")
        try:
            msg: dict[str, Any] = kc.get_iopub_msg(timeout=remaining)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return outputs
        outputs.append(msg)


def _execute(kc: Any, code: str, timeout: float = REPLY_TIMEOUT) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run `code`; return its shell reply and every IOPub message it caused before going idle."""
    msg_id = kc.execute(code)
    reply = _shell_reply(kc, msg_id, timeout)
    return reply, _iopub_until_idle(kc, msg_id, timeout)


def test_store_lands_beside_the_notebook_from_the_session_path_and_magics_render(tmp_path: Path) -> None:
    notebook = tmp_path / "analysis.ipynb"
    notebook.write_text("{}")
    env = {k: v for k, v in os.environ.items() if k != "NBREWIND_STORE"}
    env["JPY_SESSION_NAME"] = str(notebook)
    km, kc = start_new_kernel(kernel_name="nbrewind-audit", cwd=str(tmp_path), env=env)
    try:
        reply, _ = _execute(kc, "value = 41 + 1")
        assert reply["content"]["status"] == "ok"
        _, outputs = _execute(kc, "%nbrewind status")
        text = "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")
        assert str(tmp_path / "analysis.ipynb.nbrewind") in text and "cell runs:" in text
        _, outputs = _execute(kc, "%nbrewind why")
        text = "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")
        assert "executed" in text
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert (tmp_path / "analysis.ipynb.nbrewind" / "catalog.sqlite").is_file()


def test_interrupting_a_long_cell_keeps_the_store_consistent(tmp_path: Path) -> None:
    env = dict(os.environ, NBREWIND_STORE=str(tmp_path / "store"))
    km, kc = start_new_kernel(kernel_name="nbrewind-audit", cwd=str(tmp_path), env=env)
    try:
        _execute(kc, "import numpy as np\na = np.random.default_rng(0).random(2_000_000)")
        # stop_on_error=False: otherwise the kernel may abort the next request, which
        # would arrive inside its abort window right after the interrupted reply.
        msg_id = kc.execute("import time\nwhile True:\n    time.sleep(0.05)", stop_on_error=False)
        time.sleep(1.0)
        km.interrupt_kernel()
        reply = _shell_reply(kc, msg_id)
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        reply, _ = _execute(kc, "b = a[:10].sum()")
        assert reply["content"]["status"] == "ok"
    finally:
        kc.stop_channels()
        # Graceful, as JupyterLab and nbclient shut down: the kernel finishes its
        # background checkpoint writes first.
        km.shutdown_kernel()
    with Store.open(tmp_path / "store", create=False) as store:
        assert verify_store(store).ok
        runs = store.catalog.cell_runs()
        assert [r.status for r in runs] == ["ok", "aborted", "ok"]


def test_cli_demo_replays_and_runs(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nbrewind.cli", "demo", "--json", "--dir", str(tmp_path / "demo")],
        capture_output=True, text=True, timeout=300, check=True,
    )
    result = json.loads(out.stdout)
    decisions = [row["decision"] for row in result["rows"]]
    assert decisions.count("replayed") >= 4 and decisions.count("executed") >= 2
    assert decisions[0] == "replayed" and decisions[result["edited_cell"] - 1] == "executed"
    edited = result["rows"][result["edited_cell"] - 1]
    assert (edited["task_hits"] or 0, edited["task_misses"] or 0) == (0, 0)  # the parameter cell computes nothing
    # The parameter changed only the final reduction: the four partial results are task-cache hits.
    with_tasks = [(row["task_hits"], row["task_misses"]) for row in result["rows"] if row["task_hits"] or row["task_misses"]]
    assert with_tasks == [(4, 1)]


NEVER_STALE = [
    ("z = 10", None),
    ("def f(x):\n    return x + 1", "def f(x):\n    return x + 100"),  # edited function body
    ("r1 = f(1)", None),
    ("def h(x):\n    return x * 2", "def h(x):\n    return x * 3"),  # edited helper
    ("def g(x):\n    return h(x) + 1", None),
    ("r2 = g(1)", None),
    ("K = 3", "K = 4"),  # edited global constant
    ("def k(x):\n    return x * K", None),
    ("r3 = k(2)", None),
    ("def d(x, y=2):\n    return x * y", "def d(x, y=5):\n    return x * y"),  # changed default argument
    ("r4 = d(3)", None),
    ("def make(n):\n    return lambda x: x + n", None),
    ("N = 1", "N = 7"),  # changed closure value
    ("add = make(N)", None),
    ("r5 = add(1)", None),
    ("with open('input.txt') as fh:\n    text = fh.read()", None),  # input file changes between runs
    ("import random\nrandom.seed(1)", "import random\nrandom.seed(2)"),  # changed RNG seed
    ("r6 = random.random()", None),
    ("w = z + 1", None),
    ("print(r1, r2, r3, r4, r5, text, round(r6, 6), w)", None),
]
NEVER_STALE_EXPECTED = "REEEREEREEEREEEEEERE"  # per cell: R(eplayed) or E(xecuted)


def test_every_edit_that_matters_forces_a_run_on_real_kernels(tmp_path: Path) -> None:
    """Issue 4's never-stale list, through nbclient: each edit runs its cell and the cells that
    depend on it, everything else replays, and the outputs equal a fresh python3 run."""
    (tmp_path / "input.txt").write_text("first")
    nb = write_notebook(tmp_path / "stale.ipynb", [cell for cell, _ in NEVER_STALE])
    store = tmp_path / "stale.ipynb.nbrewind"
    run_notebook(nb, kernel="audit", store=store)
    (tmp_path / "input.txt").write_text("second")
    write_notebook(nb, [edit or cell for cell, edit in NEVER_STALE])
    run_notebook(nb, kernel="repeat", store=store, output=tmp_path / "repeat.ipynb")
    run_notebook(nb, kernel="python3", output=tmp_path / "fresh.ipynb")
    assert outputs_of(tmp_path / "repeat.ipynb") == outputs_of(tmp_path / "fresh.ipynb")
    with Store.open(store, create=False) as opened:
        rows = cell_log(opened, last_session=True)
    got = "".join(r.decision[0].upper() for r in rows)
    expected = NEVER_STALE_EXPECTED
    assert got == expected, [(i, r.decision, r.reason, r.code.splitlines()[0]) for i, r in enumerate(rows) if got[i] != expected[i]]


def test_replayed_names_complete_before_they_are_loaded(tmp_path: Path) -> None:
    nb = write_notebook(tmp_path / "c.ipynb", ["import numpy as np", "a_long_array_name = np.arange(10)"])
    store = tmp_path / "store"
    run_notebook(nb, kernel="audit", store=store)
    env = dict(os.environ, NBREWIND_STORE=str(store))
    km, kc = start_new_kernel(kernel_name="nbrewind-repeat", cwd=str(tmp_path), env=env)
    try:
        for code in ("import numpy as np", "a_long_array_name = np.arange(10)"):
            reply, _ = _execute(kc, code)
            assert reply["content"]["status"] == "ok"
        _, outputs = _execute(kc, "%nbrewind status")
        text = "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")
        assert "not loaded yet: 2" in text
        msg_id = kc.complete("a_long_ar", 9)
        reply = _shell_reply(kc, msg_id)
        assert "a_long_array_name" in reply["content"]["matches"]
        reply, outputs = _execute(kc, "print(a_long_array_name.sum())")
        assert "45" in "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_setting_of_a_library_the_running_cell_never_imports_waits_for_its_import(tmp_path: Path) -> None:
    """A replayed cell set a dask option: the next cell that runs without touching dask does
    not import dask to put it back; the first use of dask afterwards sees the option."""
    env = dict(os.environ, NBREWIND_STORE=str(tmp_path / "store"))
    setting = 'import dask\n_ = dask.config.set({"array.chunk-size": "7MiB"})'
    loaded = '__import__("sys").modules.get("dask") is not None'
    for kernel, cells in (("nbrewind-audit", [setting, "x = 1"]), ("nbrewind-repeat", [setting, "x = 2"])):
        km, kc = start_new_kernel(kernel_name=kernel, cwd=str(tmp_path), env=env)
        try:
            for code in cells:
                reply, _ = _execute(kc, code)
                assert reply["content"]["status"] == "ok", reply["content"]
            msg_id = kc.execute("", silent=True, user_expressions={"loaded": loaded})
            expressions = _shell_reply(kc, msg_id)["content"]["user_expressions"]
            if kernel == "nbrewind-repeat":
                assert expressions["loaded"]["data"]["text/plain"] == "False"  # the replay bound a pending module
                _, outputs = _execute(kc, 'print(dask.config.get("array.chunk-size"))')
                text = "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")
                assert text == "7MiB\n"
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=False)  # a graceful shutdown commits the last records
    with Store.open(tmp_path / "store", create=False) as opened:
        rows = cell_log(opened, last_session=True)
    assert [r.decision[0] for r in rows] == ["r", "e", "e"]


def test_the_kernels_own_objects_are_frozen_and_the_notebooks_garbage_is_still_collected(tmp_path: Path) -> None:
    """The kernel moves its startup objects out of the collector's way before the first
    cell (`NbrewindKernel._freeze_startup_objects`); a reference cycle the notebook makes
    and drops is still collected, as on a plain kernel."""
    cells = [
        "import gc, weakref\nclass Node:\n    pass\nnode = Node()\nnode.me = node\nalive = weakref.ref(node)\nfrozen = gc.get_freeze_count()",
        "del node",
        "found = gc.collect()\nprint(alive() is None, frozen > 1000)",
    ]
    for kernel in ("audit", "repeat", "python3"):
        nb = write_notebook(tmp_path / f"{kernel}.ipynb", cells)
        store = tmp_path / f"{kernel}.nbrewind" if kernel != "python3" else None
        run_notebook(nb, kernel=kernel, store=store, output=tmp_path / f"{kernel}.out.ipynb")
        printed = outputs_of(tmp_path / f"{kernel}.out.ipynb")[2][0]["text"]
        assert printed == ("True False\n" if kernel == "python3" else "True True\n"), kernel


def test_a_deleted_value_is_freed_inside_the_cell_as_on_a_plain_kernel(tmp_path: Path) -> None:
    """The kernel compares names with their last checkpointed objects by identity, holding
    those weakly where it can: `del a` frees the array at once, so a cell that replaces a
    large value does not hold both (it did: 400 MB arrays measured 835 MB against 443 MB)."""
    cells = [
        "import weakref\nimport numpy as np\nclass Box:\n    pass\na = np.ones(10)\nbox = Box()\nseen = (weakref.ref(a), weakref.ref(box))",
        "del a\nbox = None\nprint([r() is None for r in seen])",
    ]
    for kernel in ("python3", "audit", "repeat"):
        nb = write_notebook(tmp_path / f"{kernel}.ipynb", cells)
        store = tmp_path / "store" if kernel != "python3" else None  # repeat: over the audit's records
        run_notebook(nb, kernel=kernel, store=store, output=tmp_path / f"{kernel}.out.ipynb")
        printed = outputs_of(tmp_path / f"{kernel}.out.ipynb")[1][0]["text"]
        assert printed == "[True, True]\n", kernel
