"""Headless notebook runs through nbclient: the path scripts, CI jobs and our benchmarks use."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KERNELS = {"audit": "nbrewind-audit", "repeat": "nbrewind-repeat", "python3": "python3"}

#: Seconds the kernel gets to finish its writes after the shutdown request before it is
#: killed (jupyter_client's default is 5 s, with SIGTERM at half of it). The kernel keeps
#: its backlog under 2 s and holds off SIGTERM while it flushes, so this is margin. Not
#: more: a kernel whose notebook left a process LocalCluster open lingers ~30 s in
#: distributed's exit handlers, and a plain kernel is killed after 5 s too.
SHUTDOWN_WAIT_SECONDS = 10.0


@dataclass
class RunResult:
    """What one headless run did: wall time, per-cell timings and the written notebook."""

    notebook: str
    kernel: str
    store: str | None
    seconds: float
    cell_seconds: list[float] = field(default_factory=list)
    output: str | None = None
    error: str | None = None


def default_store(notebook: Path) -> Path:
    """`<notebook>.nbrewind` beside the notebook, as the kernels use in JupyterLab."""
    return notebook.with_name(notebook.name + ".nbrewind")


def run_notebook(
    notebook: str | os.PathLike[str],
    *,
    kernel: str = "audit",
    store: str | os.PathLike[str] | None = None,
    output: str | os.PathLike[str] | None = None,
    timeout: int = 600,
    allow_errors: bool = False,
    env: dict[str, str] | None = None,
    quiet: bool = False,
    shutdown_wait: float = SHUTDOWN_WAIT_SECONDS,
) -> RunResult:
    """Execute `notebook` on the audit, repeat or plain python3 kernel and write the outputs.

    The kernel starts in the notebook's folder. Unless `store` is given the
    NBRewind kernels use `<notebook>.nbrewind` beside it, so a later repeat run of
    the same notebook finds the audit's records. The kernel is shut down gracefully
    and given `shutdown_wait` seconds to make its last cells durable: every cell the
    run executed is recorded when this returns.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    from traitlets.config import Config

    path = Path(notebook).resolve()
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
    nb = nbformat.read(path, as_version=4)
    kernel_env = dict(os.environ if env is None else env)
    store_path = None
    if kernel != "python3":
        store_path = Path(store).resolve() if store is not None else default_store(path)
        kernel_env["NBREWIND_STORE"] = str(store_path)
    client = NotebookClient(
        nb,
        kernel_name=KERNELS[kernel],
        timeout=timeout,
        allow_errors=allow_errors,
        resources={"metadata": {"path": str(path.parent)}},
        record_timing=True,
        shutdown_kernel="graceful",
        config=Config({"KernelManager": {"shutdown_wait_time": float(shutdown_wait)}}),
    )
    started = time.perf_counter()
    error = None
    try:
        # quiet: the kernel's own log lines (e.g. ipykernel's transport notice) are dropped.
        client.execute(env=kernel_env, **({"stderr": subprocess.DEVNULL} if quiet else {}))
    except CellExecutionError as exc:
        error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if not allow_errors:
            raise
    seconds = time.perf_counter() - started
    result = RunResult(str(path), kernel, str(store_path) if store_path else None, seconds, _cell_seconds(nb), None, error)
    if output is not None:
        nbformat.write(nb, str(output))
        result.output = str(output)
    return result


def _cell_seconds(nb: Any) -> list[float]:
    """Per-code-cell execution time from nbclient's recorded timing metadata."""
    from datetime import datetime

    out = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        timing = cell.get("metadata", {}).get("execution", {})
        start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
        if start and end:
            fmt = "%Y-%m-%dT%H:%M:%S.%fZ"
            out.append((datetime.strptime(end, fmt) - datetime.strptime(start, fmt)).total_seconds())
        else:
            out.append(0.0)
    return out
