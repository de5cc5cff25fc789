"""Headless notebook runs through nbclient: the path scripts, CI jobs and our benchmarks use.

`run_notebook` is a drop-in for the papermill workflow: parameters are injected after
the cell tagged ``parameters`` by papermill itself (so the injected cell, its tag and
the notebook's ``papermill`` metadata are what papermill writes), the output notebook
is written whatever happens (success, a cell error, Ctrl-C), and the result says which
cells raised. It knows nothing about stores beyond where the kernel should put one:
what the kernels decided is read from the store by the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbrewind.errors import NbrewindError

KERNELS = {"audit": "nbrewind-audit", "repeat": "nbrewind-repeat", "python3": "python3"}

#: Seconds the kernel gets to finish its writes after the shutdown request before it is
#: killed (jupyter_client's default is 5 s, with SIGTERM at half of it). The kernel keeps
#: its backlog under 2 s and holds off SIGTERM while it flushes, so this is margin. Not
#: more: a kernel whose notebook left a process LocalCluster open lingers ~30 s in
#: distributed's exit handlers, and a plain kernel is killed after 5 s too.
SHUTDOWN_WAIT_SECONDS = 10.0


class RunInputError(NbrewindError):
    """The notebook, kernel or parameters given to a run cannot be used (nothing ran)."""


@dataclass
class CellError:
    """An error a cell raised: which code cell (1-based), its execution count, and the exception."""

    cell: int
    execution_count: int | None
    ename: str
    evalue: str

    def __str__(self) -> str:
        count = f" (In [{self.execution_count}])" if self.execution_count is not None else ""
        return f"cell {self.cell}{count}: {self.ename}" + (f": {self.evalue}" if self.evalue else "")


@dataclass
class CellResult:
    """One code cell as the run left it: its execution count, time and first error."""

    cell: int
    execution_count: int | None
    seconds: float | None
    source: str
    error: str | None = None
    nbrewind: dict[str, Any] | None = None
    """What an NBRewind kernel said it did (the reply's ``metadata.nbrewind``, docs/reply-metadata.md)."""


@dataclass
class RunResult:
    """What one headless run did: wall time, per-cell timings, errors and the written notebook."""

    notebook: str
    kernel: str
    store: str | None
    seconds: float
    cell_seconds: list[float] = field(default_factory=list)
    output: str | None = None
    error: str | None = None
    """The error that stopped the run (one line), or with allow_errors the first error; None when none."""
    errors: list[CellError] = field(default_factory=list)
    cells: list[CellResult] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)
    cwd: str | None = None
    failed: bool = False
    """The run stopped at a cell error (without allow_errors)."""
    interrupted: bool = False


def kernel_short_name(kernel: str) -> str:
    """``audit``, ``repeat`` or ``python3`` for a short name or a kernelspec name."""
    for short, spec in KERNELS.items():
        if kernel in (short, spec):
            return short
    raise RunInputError(f"unknown kernel {kernel!r}; choose one of {', '.join([*KERNELS, *KERNELS.values()][:-1])}")


def default_store(notebook: Path, environ: Mapping[str, str] | None = None) -> Path:
    """Where a run's kernel keeps its store: ``NBREWIND_STORE`` when set, else
    ``<notebook>.nbrewind`` beside the notebook, as the kernels use in JupyterLab."""
    explicit = (os.environ if environ is None else environ).get("NBREWIND_STORE")
    if explicit:
        return Path(explicit).expanduser().absolute()
    return notebook.with_name(notebook.name + ".nbrewind")


def read_notebook(path: Path) -> Any:
    """The notebook at ``path``; RunInputError with one line when it is missing or not a notebook."""
    import nbformat

    if not path.exists():
        raise RunInputError(f"{path} does not exist")
    if path.is_dir():
        raise RunInputError(f"{path} is a folder, not a notebook (.ipynb)")
    if path.suffix != ".ipynb":
        raise RunInputError(f"{path} is not a notebook: expected an .ipynb file")
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:  # nbformat raises JSON, validation and reader errors of many kinds
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RunInputError(f"{path} is not a Jupyter notebook ({detail[:160]})") from None
    if not isinstance(nb.get("cells"), list):
        raise RunInputError(f"{path} is not a Jupyter notebook (no cells)")
    return nb


def parse_parameters(
    values: list[tuple[str, str]] | None = None,
    raw: list[tuple[str, str]] | None = None,
    files: list[str] | None = None,
    yaml_texts: list[str] | None = None,
) -> dict[str, Any]:
    """Parameters as papermill's command line reads them: YAML files, then YAML strings,
    then ``-p NAME VALUE`` (typed like papermill: int, float, bool, None, else str),
    then ``-r NAME RAW`` (always str). Later ones win."""
    import yaml
    from papermill.cli import _resolve_type  # papermill's own -p typing, so values match papermill's

    merged: dict[str, Any] = {}
    for file in files or []:
        try:
            with open(file, encoding="utf-8") as handle:
                loaded = yaml.safe_load(handle)
        except OSError as exc:
            raise RunInputError(f"cannot read the parameters file {file}: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise RunInputError(f"{file} is not valid YAML: {str(exc).splitlines()[0]}") from None
        merged.update(_mapping(loaded, file))
    for text in yaml_texts or []:
        try:
            merged.update(_mapping(yaml.safe_load(text), "the -y string"))
        except yaml.YAMLError as exc:
            raise RunInputError(f"the -y string is not valid YAML: {str(exc).splitlines()[0]}") from None
    for name, value in values or []:
        merged[_name(name)] = _resolve_type(value)
    for name, value in raw or []:
        merged[_name(name)] = value
    return merged


def _mapping(loaded: Any, where: str) -> dict[str, Any]:
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise RunInputError(f"{where} must hold a mapping of parameter names to values, not a {type(loaded).__name__}")
    return {_name(str(k)): v for k, v in loaded.items()}


def _name(name: str) -> str:
    if not name.isidentifier():
        raise RunInputError(f"parameter name {name!r} is not a Python identifier")
    return name


def inject_parameters(nb: Any, parameters: Mapping[str, Any], kernel_name: str) -> Any:
    """Papermill's injection: a cell tagged ``injected-parameters`` after the cell tagged
    ``parameters`` (or replacing an earlier injected cell, or at the top)."""
    import nbformat
    from papermill.parameterize import parameterize_notebook

    language = (nb.metadata.get("kernelspec") or {}).get("language") or (nb.metadata.get("language_info") or {}).get("name")
    nb.metadata.setdefault("papermill", nbformat.NotebookNode())
    for cell in nb.cells:  # papermill's loader gives every cell these; its injection relies on them
        cell.metadata.setdefault("tags", [])
    return parameterize_notebook(nb, dict(parameters), kernel_name=kernel_name, language=language or "python")


class _Stop(Exception):
    """Raised in nbclient's cell-start hook after Ctrl-C, so no further cell starts."""


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
    parameters: Mapping[str, Any] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    on_cell: Callable[[CellResult, int], None] | None = None,
    raise_on_error: bool = True,
) -> RunResult:
    """Execute `notebook` on the audit, repeat or plain python3 kernel and write the outputs.

    The kernel starts in `cwd` (default: the notebook's folder). Unless `store` is given
    the NBRewind kernels use `<notebook>.nbrewind` beside the notebook (whatever
    ``NBREWIND_STORE`` says: `jupyter nbrewind run` resolves that and passes `store`), so
    a later repeat run of the same notebook finds the audit's records. The
    kernel is shut down gracefully and given `shutdown_wait` seconds to make its last
    cells durable: every cell the run executed is recorded when this returns.

    `output` is written whatever happens. A cell error stops the run (unless
    `allow_errors`) and is re-raised as nbclient's CellExecutionError when
    `raise_on_error`; otherwise the result says ``failed``. The first Ctrl-C interrupts
    the running cell and stops the run (``interrupted``); a second one aborts at once.
    `on_cell` is called after each code cell with its result and the number of code cells.
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, DeadKernelError
    from traitlets.config import Config

    path = Path(notebook).absolute()
    short = kernel_short_name(kernel)
    nb = read_notebook(path)
    if parameters:
        nb = inject_parameters(nb, parameters, KERNELS[short])
    workdir = Path(cwd).absolute() if cwd is not None else path.parent
    if not workdir.is_dir():
        raise RunInputError(f"--cwd {workdir} is not a folder")
    kernel_env = dict(os.environ if env is None else env)
    store_path = None
    if short != "python3":
        store_path = Path(store).absolute() if store is not None else path.with_name(path.name + ".nbrewind")
        kernel_env["NBREWIND_STORE"] = str(store_path)
    manager: dict[str, Any] = {"shutdown_wait_time": float(shutdown_wait)}
    sockets = None
    if sys.platform.startswith("linux"):
        # Unix sockets instead of TCP on localhost: nothing listens on the network, and
        # ipykernel has no reason to warn about unencrypted TCP. Their path is set here:
        # jupyter_client's default is relative, so they would appear in the kernel's cwd.
        sockets = tempfile.mkdtemp(prefix="nbrewind-ipc-")
        manager.update(transport="ipc", ip=os.path.join(sockets, "kernel"))
    client = NotebookClient(
        nb,
        kernel_name=KERNELS[short],
        timeout=timeout,
        allow_errors=allow_errors,
        resources={"metadata": {"path": str(workdir)}},
        record_timing=True,
        shutdown_kernel="graceful",
        config=Config({"KernelManager": manager}),
    )
    code_cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    number = {index: n for n, index in enumerate(code_cells, start=1)}
    stop = threading.Event()
    said: dict[int, dict[str, Any]] = {}

    def on_start(cell: Any, cell_index: int) -> None:
        if stop.is_set():
            raise _Stop

    def on_executed(cell: Any, cell_index: int, execute_reply: Any) -> None:
        info = (execute_reply or {}).get("metadata", {}).get("nbrewind")
        if info is not None:
            said[cell_index] = info
        if on_cell is not None and cell_index in number:
            on_cell(_cell_result(cell, number[cell_index], info), len(code_cells))

    def interrupt() -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        client.force_raise_errors = True
        process = getattr(getattr(client.km, "provisioner", None), "process", None)
        if process is not None:
            process.send_signal(signal.SIGINT)  # interrupt_mode "signal": the running cell raises KeyboardInterrupt

    def on_notebook_start(notebook: Any) -> None:
        # nbclient's own SIGINT handler shuts the kernel down at once, losing the cell's
        # reply and the kernel's last records; this one interrupts the cell instead.
        with contextlib.suppress(RuntimeError, NotImplementedError, ValueError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGINT, interrupt)

    client.on_notebook_start = on_notebook_start
    client.on_cell_start = on_start
    client.on_cell_executed = on_executed
    if store_path is not None:
        client._async_cleanup_kernel = _draining_first(client)  # type: ignore[method-assign]
    started = time.perf_counter()
    failure: CellExecutionError | None = None
    result = RunResult(str(path), short, str(store_path) if store_path else None, 0.0,
                       parameters=dict(parameters or {}), cwd=str(workdir))
    try:
        # quiet: the kernel's own log lines are dropped.
        client.execute(env=kernel_env, **({"stderr": subprocess.DEVNULL} if quiet else {}))
    except CellExecutionError as exc:
        failure = exc
        result.failed = not stop.is_set()
    except _Stop:
        pass
    except DeadKernelError:
        if not stop.is_set():
            raise
    finally:
        if sockets is not None:
            shutil.rmtree(sockets, ignore_errors=True)
        result.interrupted = stop.is_set()
        result.failed = result.failed and not result.interrupted
        result.seconds = time.perf_counter() - started
        result.cells = [_cell_result(nb.cells[i], n, said.get(i)) for i, n in number.items()]
        result.cell_seconds = [c.seconds or 0.0 for c in result.cells]
        result.errors = _errors(nb, number)
        if result.errors:
            result.error = str(result.errors[-1] if result.failed else result.errors[0])
        if output is not None:
            import nbformat

            nbformat.write(nb, str(output))
            result.output = str(output)
    if failure is not None and raise_on_error and not result.interrupted:
        raise failure
    return result


_DRAIN = "get_ipython().kernel.nbrewind.writer.flush()"
"""Run silently (not recorded) before the kernel is asked to shut down: returns once every
recorded cell is durable, however slow the disk, so no shutdown wait can cut it short."""


def _draining_first(client: Any) -> Callable[[], Any]:
    """nbclient's kernel clean-up, preceded by waiting for the kernel's background writer."""
    cleanup = client._async_cleanup_kernel

    async def drain_then_clean_up() -> None:
        kc = client.kc
        if kc is not None and client.km is not None and await _alive(client.km):
            with contextlib.suppress(Exception):  # a dead or stuck kernel: the shutdown wait still applies
                await client.async_wait_for_reply(kc.execute(_DRAIN, silent=True, store_history=False))
        await cleanup()

    return drain_then_clean_up


async def _alive(km: Any) -> bool:
    result = km.is_alive()
    return bool(await result) if asyncio.iscoroutine(result) else bool(result)


def _errors(nb: Any, number: Mapping[int, int]) -> list[CellError]:
    found = []
    for index, n in number.items():
        cell = nb.cells[index]
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                found.append(CellError(n, cell.get("execution_count"), out.get("ename", ""), out.get("evalue", "")))
                break
    return found


def _cell_result(cell: Any, n: int, said: dict[str, Any] | None = None) -> CellResult:
    error = next((f"{o.get('ename')}: {o.get('evalue')}".removesuffix(": ") for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)
    first = (cell.source.strip().splitlines() or [""])[0]
    return CellResult(n, cell.get("execution_count"), _seconds(cell), first, error, said)


def _seconds(cell: Any) -> float | None:
    """A cell's execution time from nbclient's recorded timing metadata."""
    from datetime import datetime

    timing = cell.get("metadata", {}).get("execution", {})
    start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not (start and end):
        return None
    fmt = "%Y-%m-%dT%H:%M:%S.%fZ"
    return (datetime.strptime(end, fmt) - datetime.strptime(start, fmt)).total_seconds()
