"""Helpers for the reliability tests: real kernels on notebooks large enough to make the background writer lag.

`Kernel` starts an NBRewind (or python3) kernel with jupyter_client, sends cells one
at a time, matches every reply and IOPub message to its request by msg_id, and keeps
the kernel's own stderr (where NBRewind notices go) in a file. `inplace_cells` is a
numpy/pandas notebook whose cells edit arrays and DataFrames in place right after
they were checkpointed.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager

REPLY_TIMEOUT = 300.0


def inplace_cells(mb: int) -> list[str]:
    """About `mb` MB of numpy and pandas state; most cells edit what the previous one stored."""
    n_a = mb * 1_000_000 // 2 // 8  # a: half of it
    n_b = mb * 1_000_000 // 5 // 8  # b: a fifth
    n_df = mb * 1_000_000 // 4 // 24  # df: a quarter, three 8-byte columns
    return [
        "import numpy as np, pandas as pd\nrng = np.random.default_rng(1)",
        f"a = rng.random({n_a})",
        "a[::2] += 1\nprint(round(float(a[:1000].sum()), 6))",
        f"df = pd.DataFrame({{'x': rng.random({n_df}), 'y': rng.random({n_df}), 'k': rng.integers(0, 10, {n_df})}})",
        "df['x'] *= 2\ndf.loc[::3, 'y'] = 0.0\nprint(round(float(df['x'].sum()), 3))",
        f"b = rng.random({n_b})\na[1::2] -= 0.5",
        "b *= 3\ndf['k'] += 1\nprint(round(float(b.sum()), 3))",
        "a[:] = a[::-1]\nprint(round(float(a[:5].sum()), 6))",
        "df.iloc[:1000, 0] = -1\nb[::7] = 0",
        "print(round(float(a.sum()), 3), round(float(b.sum()), 3), int(df['k'].sum()), round(float(df['y'].sum()), 3))",
    ]


def canonical(outputs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """What a cell showed, without what differs between kernels and runs (metadata, counts,
    and how a stream's text was split into messages, which depends on timing)."""
    shown: list[tuple[str, str]] = []
    for msg in outputs:
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            if shown and shown[-1][0] == content["name"]:
                shown[-1] = (content["name"], shown[-1][1] + content["text"])
            else:
                shown.append((content["name"], content["text"]))
        elif kind in ("execute_result", "display_data"):
            shown.append((kind, content["data"].get("text/plain", "")))
        elif kind == "error":
            shown.append(("error", f"{content['ename']}: {content['evalue']}"))
    return shown


@dataclass
class Kernel:
    """One real kernel process; every message is matched to its request by msg_id."""

    name: str
    cwd: Path
    env: dict[str, str]
    stderr_path: Path
    shutdown_wait: float = 5.0  # jupyter_client's default: what plain nbclient and papermill get
    km: Any = None
    kc: Any = None
    replies: list[dict[str, Any]] = field(default_factory=list)
    _stderr: Any = None

    def start(self) -> Kernel:
        self._stderr = open(self.stderr_path, "ab")  # noqa: SIM115 - closed in close()
        self.km = KernelManager(kernel_name=self.name, shutdown_wait_time=self.shutdown_wait)
        self.km.start_kernel(cwd=str(self.cwd), env=self.env, stderr=self._stderr)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)
        return self

    @property
    def pid(self) -> int:
        pid: int = self.km.provisioner.process.pid
        return pid

    def execute(self, code: str, timeout: float = REPLY_TIMEOUT) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Run one cell: its shell reply and the IOPub messages it caused, up to its idle status."""
        msg_id = self.kc.execute(code, stop_on_error=False)
        deadline = time.monotonic() + timeout
        reply = None
        while reply is None:
            try:
                msg = self.kc.get_shell_msg(timeout=min(max(deadline - time.monotonic(), 0.01), 0.5))
            except queue.Empty:
                if time.monotonic() > deadline or not self.km.is_alive():
                    raise TimeoutError(f"no reply to {msg_id}") from None
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                reply = msg
        outputs: list[dict[str, Any]] = []
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=min(max(deadline - time.monotonic(), 0.01), 0.5))
            except queue.Empty:
                if time.monotonic() > deadline or not self.km.is_alive():
                    raise TimeoutError(f"no idle status for {msg_id}") from None
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
            outputs.append(msg)
        self.replies.append(reply)
        return reply, outputs

    def run(self, cells: list[str]) -> list[list[tuple[str, str]]]:
        """Every cell in order; what each showed (see `canonical`)."""
        shown = []
        for code in cells:
            reply, outputs = self.execute(code)
            assert reply["content"]["status"] == "ok", reply["content"]
            shown.append(canonical(outputs))
        return shown

    def shutdown(self) -> None:
        """As JupyterLab, nbclient and papermill do: a shutdown request, then SIGKILL after the wait."""
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)
        self._stderr.close()

    def close(self) -> None:
        """Whatever state the kernel is in (killed, say): release everything."""
        if self.kc is not None:
            self.kc.stop_channels()
        if self.km is not None:
            if self.km.has_kernel and self.km.is_alive():
                self.km.shutdown_kernel(now=True)
            self.km.cleanup_resources()
        if self._stderr is not None and not self._stderr.closed:
            self._stderr.close()

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


def nbrewind_lines(text: str) -> list[str]:
    """The NBRewind notices a kernel wrote to its stderr."""
    return [line for line in text.splitlines() if "NBRewind" in line]


def slow_disk(folder: Path, seconds_per_fsync: float) -> str:
    """A `sitecustomize` that makes every `os.fsync` of the kernel (file or folder) take
    `seconds_per_fsync` longer: a slow disk for the kernel started with the returned
    folder first on PYTHONPATH (SQLite syncs in C and is not slowed)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "import os, time\n"
        "_fsync = os.fsync\n"
        "def _slow(fd):\n"
        f"    time.sleep({seconds_per_fsync!r})\n"
        "    return _fsync(fd)\n"
        "os.fsync = _slow\n"
    )
    return str(folder)
