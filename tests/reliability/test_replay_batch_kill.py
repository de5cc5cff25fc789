"""A repeat kernel's replay records are batched (docs/reliability.md): killed or shut down
at any moment, the store stays consistent and every audited cell still replays.

Real kernels on a small notebook. A repeat kernel holds its replays' records in one
batch until it has been idle for `NBREWIND_REPLAY_BATCH_SECONDS`; here the batch is
held open (600 s) or committed (the default, a tenth of a second), then the kernel is
SIGKILLed or shut down as Jupyter clients do. Afterwards `jupyter nbrewind verify`
passes, the catalog holds the whole batch or none of it, and a fresh repeat kernel
replays every cell and shows what the audit showed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nbrewind.store import CellRun, Store
from reliability_tools import Kernel, canonical, nbrewind_lines

pytestmark = pytest.mark.kernel

CELLS = [
    "import numpy as np\na = np.arange(12)",
    "b = a * 2\nprint(int(b.sum()))",
    "c = b + 1\nc[:3]",
    "print(len(a), int(c[-1]))",
]
TIMEOUT = 60.0


def _verify(store: Path) -> subprocess.CompletedProcess[str]:
    cli = [sys.executable, "-c", "from nbrewind.cli import main; raise SystemExit(main())"]
    return subprocess.run([*cli, "verify", "--store", str(store)], capture_output=True, text=True, timeout=600)


def _sessions(store: Path) -> list[list[CellRun]]:
    """The durable cell runs, one list per kernel session, in the order they were recorded."""
    with Store.open(store, create=False, readonly=True) as opened:
        runs = opened.catalog.cell_runs()
        by_session: dict[str | None, list[CellRun]] = {}
        for run in runs:
            by_session.setdefault(run.session, []).append(run)
        for session in by_session.values():
            parents = [opened.catalog.get_checkpoint(r.checkpoint_id).parent_id for r in session if r.checkpoint_id]
            checkpoints = [r.checkpoint_id for r in session]
            assert parents == [None, *checkpoints[:-1]], "a session's checkpoints chain in order"
    return list(by_session.values())


def _repeat(folder: Path, env: dict[str, str], name: str) -> tuple[Kernel, list[list[tuple[str, str]]]]:
    """A repeat kernel that has replayed every cell (checked in each reply's metadata)."""
    kernel = Kernel("nbrewind-repeat", folder, env, folder / f"{name}.err").start()
    shown = []
    for code in CELLS:
        reply, outputs = kernel.execute(code)
        assert reply["content"]["status"] == "ok", reply["content"]
        assert reply["metadata"]["nbrewind"]["decision"] == "replayed", reply["metadata"]["nbrewind"]
        shown.append(canonical(outputs))
    return kernel, shown


def _kill(kernel: Kernel) -> None:
    os.kill(kernel.pid, signal.SIGKILL)
    deadline = time.monotonic() + TIMEOUT
    while kernel.km.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    kernel.close()


def test_a_repeat_kernel_killed_or_shut_down_around_its_replay_batch_leaves_a_consistent_store(
    tmp_path: Path, kernel_env: dict[str, str]
) -> None:
    store = Path(kernel_env["NBREWIND_STORE"])
    audit = Kernel("nbrewind-audit", tmp_path, kernel_env, tmp_path / "audit.err").start()
    try:
        expected = audit.run(CELLS)
    finally:
        audit.shutdown()
    assert [len(s) for s in _sessions(store)] == [len(CELLS)]
    held = dict(kernel_env, NBREWIND_REPLAY_BATCH_SECONDS="600")

    # Killed while its batch waits: the batch is lost whole, nothing else is.
    kernel, shown = _repeat(tmp_path, held, "held-killed")
    assert shown == expected
    _kill(kernel)
    assert _verify(store).returncode == 0, _verify(store).stdout
    assert [len(s) for s in _sessions(store)] == [len(CELLS)]

    # Killed after the batch was committed (the kernel was idle a moment): all of it stays.
    kernel, shown = _repeat(tmp_path, kernel_env, "committed-killed")
    assert shown == expected
    deadline = time.monotonic() + TIMEOUT
    while len(_sessions(store)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    _kill(kernel)
    assert _verify(store).returncode == 0, _verify(store).stdout
    sessions = _sessions(store)
    assert [len(s) for s in sessions] == [len(CELLS)] * 2
    assert [r.decision for r in sessions[1]] == ["replayed"] * len(CELLS)

    # Shut down as Jupyter clients do while its batch waits: the shutdown makes it durable.
    kernel, shown = _repeat(tmp_path, held, "held-shutdown")
    assert shown == expected
    kernel.shutdown()
    assert _verify(store).returncode == 0
    sessions = _sessions(store)
    assert [len(s) for s in sessions] == [len(CELLS)] * 3
    assert [r.code for r in sessions[2]] == CELLS
    assert not nbrewind_lines(kernel.stderr())

    # And every record made so far replays.
    kernel, shown = _repeat(tmp_path, kernel_env, "last")
    assert shown == expected
    kernel.shutdown()
