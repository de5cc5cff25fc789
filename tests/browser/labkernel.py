"""Drive an NBRewind kernel the way JupyterLab 4 does, without a browser.

JupyterLab sends every execute_request with ``metadata.cellId`` (the nbformat
cell id) and ``metadata.deletedCells``; jupyter_server starts the kernel with
``JPY_SESSION_NAME`` set to the notebook's absolute path and the notebook's
folder as working directory, restarts it with the same environment, and starts
a new kernel in the same session when the user changes the kernel.
"""

from __future__ import annotations

import os
import queue
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

from nbrewind.store import Store, verify_store
from nbrewind.store.report import LogRow, cell_log


@dataclass
class CellResult:
    """What one execute_request produced: its reply and its IOPub output messages."""

    reply: dict[str, Any]
    outputs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def text(self) -> str:
        """Stream text, plain-text data and error lines, joined."""
        parts: list[str] = []
        for msg in self.outputs:
            content = msg["content"]
            if msg["msg_type"] == "stream":
                parts.append(content["text"])
            elif msg["msg_type"] in ("execute_result", "display_data"):
                parts.append(content["data"].get("text/plain", ""))
            elif msg["msg_type"] == "error":
                parts.append(f"{content['ename']}: {content['evalue']}")
        return "".join(parts)

    def has_mime(self, mime: str) -> bool:
        """True when some rich output carries `mime`."""
        return any(mime in (m["content"].get("data") or {}) for m in self.outputs)


def lab_environment(notebook: Path) -> dict[str, str]:
    """The kernel environment jupyter_server builds for a notebook session."""
    env = {k: v for k, v in os.environ.items() if k != "NBREWIND_STORE"}
    env["JPY_SESSION_NAME"] = str(notebook.resolve())
    return env


class LabKernel:
    """One kernel of a notebook session, started and restarted as jupyter_server does."""

    def __init__(self, notebook: Path, kernel_name: str) -> None:
        self.notebook = notebook.resolve()
        self.kernel_name = kernel_name
        self.manager = KernelManager(kernel_name=kernel_name)
        self.client: BlockingKernelClient | None = None

    def start(self) -> LabKernel:
        """Start the kernel in the notebook's folder with the session path set."""
        self.manager.start_kernel(cwd=str(self.notebook.parent), env=lab_environment(self.notebook))
        self._connect()
        return self

    def _connect(self) -> None:
        client = self.manager.client()
        assert isinstance(client, BlockingKernelClient)
        client.start_channels()
        client.wait_for_ready(timeout=60)
        self.client = client

    def restart(self) -> None:
        """The UI's "Restart Kernel": a shutdown_request with restart=True, then a fresh process."""
        if self.client is not None:
            self.client.stop_channels()
        self.manager.restart_kernel(now=False)
        self._connect()

    def interrupt(self) -> None:
        """The UI's "Interrupt Kernel" (SIGINT, as interrupt_mode is "signal")."""
        self.manager.interrupt_kernel()

    def shutdown(self) -> None:
        """Stop channels and shut the kernel down, waiting for its pending writes."""
        if self.client is not None:
            self.client.stop_channels()
            self.client = None
        if self.manager.has_kernel:
            self.manager.shutdown_kernel(now=False)

    def __enter__(self) -> LabKernel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def send(self, code: str, cell_id: str | None) -> str:
        """Send an execute_request as JupyterLab does; return its msg_id."""
        client = self.client
        assert client is not None
        content = {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        }
        metadata: dict[str, Any] = {"deletedCells": [], "recordTiming": False}
        if cell_id is not None:
            metadata["cellId"] = cell_id
        msg = client.session.msg("execute_request", content, metadata=metadata)
        client.shell_channel.send(msg)
        msg_id: str = msg["header"]["msg_id"]
        return msg_id

    def collect(self, msg_id: str, timeout: float = 60) -> CellResult:
        """The reply to `msg_id` and the outputs sent before the kernel went idle."""
        client = self.client
        assert client is not None
        deadline = time.monotonic() + timeout
        outputs: list[dict[str, Any]] = []
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no idle status for {msg_id} within {timeout} s")
            try:
                msg = client.get_iopub_msg(timeout=remaining)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind = msg["msg_type"]
            if kind in ("stream", "display_data", "execute_result", "error"):
                outputs.append(msg)
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                break
        while True:
            reply = client.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg_id:
                return CellResult(reply["content"], outputs)

    def run(self, code: str, cell_id: str | None, timeout: float = 60) -> CellResult:
        """Execute one cell and wait for it."""
        return self.collect(self.send(code, cell_id), timeout)

    def request(self, msg_type: str, content: dict[str, Any], timeout: float = 30) -> dict[str, Any]:
        """Send any other shell request (complete, inspect) and return its reply content."""
        client = self.client
        assert client is not None
        msg = client.session.msg(msg_type, content)
        client.shell_channel.send(msg)
        deadline = time.monotonic() + timeout
        while True:
            reply = client.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                content_out: dict[str, Any] = reply["content"]
                return content_out


def wait_for_rows(store_path: Path, count: int, timeout: float = 30) -> list[LogRow]:
    """The store's cell log once it holds at least `count` rows (they are written in the background)."""
    deadline = time.monotonic() + timeout
    rows: list[LogRow] = []
    while time.monotonic() < deadline:
        if store_path.exists():
            try:
                with Store.open(store_path, create=False) as store:
                    rows = cell_log(store)
            except Exception:  # the kernel may be creating the store right now
                rows = []
            if len(rows) >= count:
                return rows
        time.sleep(0.1)
    raise AssertionError(f"the store at {store_path} has {len(rows)} cell runs, expected {count}")


def assert_consistent(store_path: Path) -> None:
    """Every object re-hashes to its name and nothing the catalog points at is missing."""
    with Store.open(store_path, create=False) as store:
        report = verify_store(store)
    assert report.ok, report
