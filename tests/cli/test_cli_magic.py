"""`%nbrewind` line magics on a real repeat kernel: why N, errors, log --tasks, priority."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cli_tools import cli_env, write_notebook
from jupyter_client.manager import start_new_kernel

from nbrewind.run import run_notebook

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(300)]


def execute(kc: Any, code: str) -> tuple[dict[str, Any], str, list[dict[str, Any]]]:
    """Run `code`; the reply content, the stdout text and the error outputs."""
    msg_id = kc.execute(code)
    text, errors = "", []
    while True:
        msg = kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            text += msg["content"]["text"]
        elif msg["msg_type"] == "error":
            errors.append(msg["content"])
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    while True:  # wait_for_ready may have left extra kernel_info replies queued
        reply = kc.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"], text, errors


def test_why_n_errors_log_tasks_and_priority(tmp_path: Path) -> None:
    notebook = write_notebook(tmp_path / "nb.ipynb", [
        "x = 20",
        "import dask\ny = dask.delayed(sum)([x, 1]).compute(scheduler='sync')\nprint(y)",
    ])
    store = tmp_path / "nb.ipynb.nbrewind"
    run_notebook(notebook, kernel="audit", store=store, quiet=True)
    env = cli_env(store=str(store))
    km, kc = start_new_kernel(kernel_name="nbrewind-repeat", cwd=str(tmp_path), env=env)
    try:
        assert execute(kc, "x = 20")[0]["status"] == "ok"
        execute(kc, "import dask\ny = dask.delayed(sum)([x, 2]).compute(scheduler='sync')\nprint(y)")

        reply, text, _ = execute(kc, "%nbrewind why 1")
        assert reply["status"] == "ok"
        lines = text.splitlines()
        assert lines[0].startswith("In [1]: replayed: code and all ") and lines[0].endswith("recorded inputs unchanged (cell run #1)")
        assert lines[1].startswith("  the recorded run took ")

        _, text, _ = execute(kc, "%nbrewind why 2")
        assert text.startswith("In [2]: executed: ")

        reply, text, errors = execute(kc, "%nbrewind bogus")
        assert reply["status"] == "error" and reply["ename"] == "UsageError", (reply, text, errors)
        assert "unknown subcommand 'bogus'" in reply["evalue"]
        reply, _, _ = execute(kc, "%nbrewind why 99")
        assert reply["status"] == "error" and "no cell In [99] was recorded in this kernel" in reply["evalue"]

        _, text, _ = execute(kc, "%nbrewind log --tasks")
        task_lines = text.split("\n\n", 1)[1].splitlines()
        assert task_lines[0].split() == ["run", "task", "key", "hit", "time", "saved", "bytes", "worker"]
        runs = {line.split()[0] for line in task_lines[2:]}
        assert runs and "2" not in runs  # this kernel's tasks only, not the audit's (cell run #2)

        _, text, _ = execute(kc, "%nbrewind priority off")
        assert text.strip() == "automatic priority bumps are off (explicit nbrewind.prioritize calls still work)"
        _, text, _ = execute(kc, "import dask\nprint(dask.config.get('nbrewind.auto-priority'))")
        assert text == "False\n"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
