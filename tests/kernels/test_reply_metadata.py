"""``metadata.nbrewind`` on execute replies, on real kernels (docs/reply-metadata.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import start_new_kernel

from kernels.test_kernels import _execute, _iopub_until_idle, _shell_reply

pytestmark = pytest.mark.kernel

CELLS = [
    "import time\nx = 41",
    "time.sleep(0.2)\ny = x + 1\ny",
    "import dask\nparts = [dask.delayed(lambda i: i * i)(i) for i in range(3)]\ntotal = dask.delayed(sum)(parts).compute(scheduler='sync')",
]


def _session(kernel: str, tmp_path: Path, cells: list[str]) -> list[dict[str, Any]]:
    km, kc = start_new_kernel(kernel_name=kernel, cwd=str(tmp_path))
    try:
        return [_execute(kc, code)[0] for code in cells]
    finally:
        kc.stop_channels()
        # Gracefully: records are written after the reply, and a repeat needs all of them.
        km.shutdown_kernel()


def test_each_reply_says_what_the_kernel_did(tmp_path: Path) -> None:
    audit = _session("nbrewind-audit", tmp_path, CELLS)
    for reply in audit:
        info = reply["metadata"]["nbrewind"]
        assert info["version"] == 1 and info["decision"] == "ran" and info["recorded"] is True
        assert info["reason"] and info["duration"] >= 0 and info["cell_run"] is None
    assert audit[1]["metadata"]["nbrewind"]["duration"] >= 0.2
    assert (audit[2]["metadata"]["nbrewind"]["task_misses"], audit[2]["metadata"]["nbrewind"]["task_hits"]) == (4, 0)

    edited = [*CELLS[:2], CELLS[2].replace("range(3)", "range(4)")]
    repeat = _session("nbrewind-repeat", tmp_path, edited)
    first, second, third = (r["metadata"]["nbrewind"] for r in repeat)
    assert first["decision"] == second["decision"] == "replayed"
    assert second["recorded_duration"] == audit[1]["metadata"]["nbrewind"]["duration"]
    assert second["saved"] == pytest.approx(second["recorded_duration"] - second["duration"], abs=1e-5)
    assert isinstance(second["cell_run"], int) and second["cell_run"] > first["cell_run"]
    assert third["decision"] == "ran" and "no record of this code" in third["reason"]
    # Three of the squares come from the task cache; the new square and the sum are computed.
    assert (third["task_hits"], third["task_misses"]) == (3, 2)
    # Everything else in the reply is ipykernel's own.
    assert {k for k in repeat[1]["metadata"] if k != "nbrewind"} == {k for k in audit[1]["metadata"] if k != "nbrewind"}


def test_requests_that_leave_no_record_say_so(tmp_path: Path) -> None:
    km, kc = start_new_kernel(kernel_name="nbrewind-audit", cwd=str(tmp_path))
    try:
        msg_id = kc.execute("z = 1", store_history=False)
        reply = _shell_reply(kc, msg_id)
        _iopub_until_idle(kc, msg_id)
        assert reply["metadata"]["nbrewind"]["decision"] == "not recorded"
        assert "store_history" in reply["metadata"]["nbrewind"]["reason"]
        msg_id = kc.execute("w = 2", silent=True)
        reply = _shell_reply(kc, msg_id)
        assert "nbrewind" not in reply["metadata"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_cell_that_ran_says_what_it_brought_back(tmp_path: Path) -> None:
    """Replays leave names pending; the edited cell that reads them pays for loading `x`
    and for rebuilding `lock` (which cannot be stored) by re-running its cell: the reply
    says so, and the replies of replayed cells bring back nothing."""
    cells = ["import threading\nlock = threading.Lock()", "x = list(range(5))", "with lock:\n    print(len(x))"]
    _session("nbrewind-audit", tmp_path, cells)
    repeat = _session("nbrewind-repeat", tmp_path, [*cells[:2], "with lock:\n    print(len(x), 'edited')"])
    first, second, third = (r["metadata"]["nbrewind"] for r in repeat)
    assert [d["decision"] for d in (first, second, third)] == ["replayed", "replayed", "ran"], [d["reason"] for d in (first, second, third)]
    for replayed in (first, second):
        assert replayed["brought_back"] == {"seconds": 0.0, "loaded": 0, "rebuilt": 0, "names": []}
    back = third["brought_back"]
    assert (back["rebuilt"], back["loaded"]) == (1, 1)
    assert back["names"] == ["lock", "x"]
    assert 0 < back["seconds"] <= third["duration"]
