"""The ``nbrewind`` comm on real kernels: a forecast of the notebook, the store's log, and
restoring a cell run by id (docs/reply-metadata.md, "Asking the kernel")."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import start_new_kernel

from kernels.test_kernels import _iopub_until_idle, _shell_reply

pytestmark = pytest.mark.kernel

CELLS = [
    "import time\nbase = 10",
    "scale = 3",
    "scaled = base * scale\nscaled",
    "label = f'{scaled} units'\nprint(label)",
    "other = 7\nother",
]


def _ask(kc: BlockingKernelClient, comm_id: str, request: dict[str, Any], *, open_comm: bool = False) -> dict[str, Any]:
    """Send one request on the comm and return the kernel's reply to it (matched by id)."""
    rid = uuid.uuid4().hex
    data = {**request, "id": rid}
    if open_comm:
        msg = kc.session.msg("comm_open", {"comm_id": comm_id, "target_name": "nbrewind", "data": data})
    else:
        msg = kc.session.msg("comm_msg", {"comm_id": comm_id, "data": data})
    kc.shell_channel.send(msg)
    while True:
        got = kc.get_iopub_msg(timeout=60)
        if got["msg_type"] == "comm_msg" and got["content"].get("comm_id") == comm_id and got["content"]["data"].get("id") == rid:
            reply: dict[str, Any] = got["content"]["data"]
            return reply


def _execute(kc: BlockingKernelClient, code: str, *, cell_id: str | None = None, store_history: bool = True) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run `code` as a frontend does (with the cell's id in the request's metadata)."""
    content = {"code": code, "silent": False, "store_history": store_history, "user_expressions": {}, "allow_stdin": False}
    msg = kc.session.msg("execute_request", content, metadata={"cellId": cell_id} if cell_id else {})
    kc.shell_channel.send(msg)
    msg_id = msg["header"]["msg_id"]
    return _shell_reply(kc, msg_id), _iopub_until_idle(kc, msg_id)


def _plan(kc: BlockingKernelClient, comm_id: str, cells: list[str], *, open_comm: bool = False) -> dict[str, Any]:
    return _ask(kc, comm_id, {"request": "plan", "cells": [{"cell_id": f"c{i}", "code": c} for i, c in enumerate(cells)]},
                open_comm=open_comm)


def _run(kernel: str, tmp_path: Path, cells: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """Ask for the plan, run the cells (asking again for the rest after three), ask for the log."""
    km, kc = start_new_kernel(kernel_name=kernel, cwd=str(tmp_path))
    comm_id = uuid.uuid4().hex
    try:
        plan = _plan(kc, comm_id, cells, open_comm=True)
        replies = []
        later: dict[str, Any] = {}
        for i, code in enumerate(cells):
            if i == 3:
                later = _plan(kc, comm_id, cells[3:])
            replies.append(_execute(kc, code, cell_id=f"c{i}")[0]["metadata"]["nbrewind"])
        log = _ask(kc, comm_id, {"request": "log"})
        return plan, replies, later, log
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_the_plan_says_what_then_happens(tmp_path: Path) -> None:
    plan, replies, _, log = _run("nbrewind-audit", tmp_path, CELLS)
    assert plan["reply"] == "plan" and plan["kernel"] == "audit" and plan["version"] == 1
    assert [c["decision"] for c in plan["cells"]] == ["run"] * len(CELLS)
    assert [r["decision"] for r in replies] == ["ran"] * len(CELLS)
    assert log["sessions"][0]["current"] and log["sessions"][0]["kernel"] == "audit"
    assert [c["code"] for c in log["sessions"][0]["cells"]] == [c.splitlines()[0] for c in CELLS]

    edited = list(CELLS)
    edited[1] = "scale = 4"
    plan, replies, later, log = _run("nbrewind-repeat", tmp_path, edited)
    foreseen = [c["decision"] for c in plan["cells"]]
    # Cell 1 is new code: run; it only binds a literal, so its value is known and cell 2,
    # which reads it, will run. Cell 3 reads what cell 2 computes: it replays only if cell 2
    # reproduces the recorded value. Cell 4 reads neither.
    assert foreseen == ["replay", "run", "run", "depends", "replay"], plan["cells"]
    assert plan["cells"][3]["after"] == [2]
    assert plan["cells"][0]["cell_run"] == log["sessions"][1]["cells"][0]["cell_run"]
    assert plan["cells"][1]["reason"] == "code changed" and plan["cells"][2]["reason"] == "input scale changed"
    # Asked again once the edited cells ran, the kernel knows: scaled changed, other did not.
    assert [c["decision"] for c in later["cells"]] == ["run", "replay"], later["cells"]
    assert later["cells"][0]["reason"] == "input scaled changed"
    happened = [r["decision"] for r in replies]
    assert happened == ["replayed", "ran", "ran", "ran", "replayed"]
    for said, did in zip(foreseen, happened):
        assert (said, did) not in (("replay", "ran"), ("run", "replayed"))
    assert [s["kernel"] for s in log["sessions"]] == ["repeat", "audit"]
    assert [c["decision"] for c in log["sessions"][0]["cells"]] == happened


def test_restore_by_cell_run_and_bad_requests(tmp_path: Path) -> None:
    km, kc = start_new_kernel(kernel_name="nbrewind-audit", cwd=str(tmp_path))
    comm_id = uuid.uuid4().hex
    try:
        _execute(kc, "v = 1")
        _execute(kc, "v = 2")
        bad = _ask(kc, comm_id, {"request": "fly"}, open_comm=True)
        assert bad["reply"] == "error" and "unknown request 'fly'" in bad["message"]
        bad = _ask(kc, comm_id, {"request": "plan", "cells": "v = 1"})
        assert bad["reply"] == "error" and "'cells' must be a list" in bad["message"]
        first = _ask(kc, comm_id, {"request": "log"})["sessions"][0]["cells"][0]["cell_run"]
        reply, outputs = _execute(kc, f"%nbrewind restore #{first}", store_history=False)
        assert reply["content"]["status"] == "ok"
        assert any(f"cell run #{first}" in o["content"].get("text", "") for o in outputs), outputs
        _, outputs = _execute(kc, "print(v)")
        assert [o["content"]["text"] for o in outputs if o["msg_type"] == "stream"] == ["1\n"]
        notebook = tmp_path / "nb.ipynb"
        notebook.write_text(json.dumps({"cells": [
            {"cell_type": "markdown", "source": ["# notes"]},
            {"cell_type": "code", "id": "x1", "source": ["v = 1"]},
            {"cell_type": "code", "id": "x2", "source": ["w = v + 1\n", "w"]},
        ]}))
        _, outputs = _execute(kc, f"%nbrewind plan {notebook}")
        lines = "".join(o["content"].get("text", "") for o in outputs if o["msg_type"] == "stream").splitlines()
        assert [line.split()[:3] for line in lines] == [["cell", "1", "run"], ["cell", "2", "run"]], lines
        reply, _ = _execute(kc, "%nbrewind plan missing.ipynb")
        assert reply["content"]["status"] == "error" and "cannot read notebook" in reply["content"]["evalue"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
