"""Run a notebook's cells on an in-process IPython shell, plain or with an NBRewind session.

No ZMQ and no kernel: the cell flow is the one `nbrewind.kernels.base` follows
(`begin`, then `replay` or run-and-`finish`). What ipykernel would send on IOPub
is recorded here as events (stdout/stderr text, the execute_result's text/plain,
the error's name and value) and, for an audit or repeat run, fed to the
session's output capture as the messages ipykernel would have sent, so the
session stores them and a replay emits them back: replayed outputs are then
compared exactly like executed ones.

Process-wide state a kernel would own is isolated per run: the working
directory (a fresh folder), the global RNG states (seeded per run, so they
differ between runs as they do between kernel processes) and the environment
variables (restored afterwards).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import random
import sys
import warnings as pywarnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from IPython.core.displayhook import DisplayHook
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from nbrewind.checkpoint.namespace import LazyNamespace
from nbrewind.session import Session

from differential.canon import canonical_namespace

# In-process runs share one interpreter. A library that one run imports first would be
# "not loaded" for that run's earlier cells and loaded from the start of every later run,
# which no pair of kernel processes sees (library settings are cell inputs). Loading the
# libraries the generated notebooks use before any run keeps every run alike.
import dask.config  # noqa: E402,F401
import numpy  # noqa: E402,F401
import IPython.core.completer  # noqa: E402,F401  (adds a warning filter when first imported)

_BASELINE_FILTERS = list(pywarnings.filters)

Event = tuple[str, ...]
"""("stream", name, text) | ("result", text/plain) | ("error", ename, evalue)."""


@dataclass
class CellOutcome:
    """What one cell did, as a frontend would see it."""

    execution_count: int
    status: str
    events: list[Event]
    decision: str = "ran"
    reason: str = ""

    def shown(self) -> tuple[int, str, tuple[Event, ...]]:
        """The part a user sees: compared between runs."""
        return (self.execution_count, self.status, tuple(self.events))


@dataclass
class RunOutcome:
    """A whole run: per-cell outcomes, the final namespace picture and hidden state."""

    cells: list[CellOutcome]
    namespace: tuple[Any, ...]
    files: dict[str, bytes]
    rng: dict[str, Any]
    env: dict[str, str]
    warnings: list[str] = field(default_factory=list)
    forecast: list[Any] | None = None
    """With `run_cells(..., forecast=True)`: what the session foresaw for each cell before any ran."""

    @property
    def decisions(self) -> list[str]:
        return [c.decision for c in self.cells]


class _Sink:
    """Where the shell's outputs go while a cell runs; adjacent stream text is merged."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def stream(self, name: str, text: str) -> None:
        if not text:
            return
        if self.events and self.events[-1][:2] == ("stream", name):
            self.events[-1] = ("stream", name, self.events[-1][2] + text)
        else:
            self.events.append(("stream", name, text))


class _StreamWriter(io.TextIOBase):
    """A text stream that forwards writes to the current sink."""

    def __init__(self, shell: RecordingShell, name: str) -> None:
        self._shell = shell
        self._name = name

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._shell.sink.stream(self._name, text)
        return len(text)


class RecordingDisplayHook(DisplayHook):
    """Records the execute_result's text/plain instead of printing `Out[n]:`."""

    def write_output_prompt(self) -> None:
        """No prompt: the result is recorded, not printed."""

    def write_format_data(self, format_dict: dict[str, Any], md_dict: dict[str, Any] | None = None) -> None:
        shell: RecordingShell = self.shell
        shell.sink.events.append(("result", format_dict.get("text/plain", "")))

    def finish_displayhook(self) -> None:
        self._is_active = False


class RecordingShell(InteractiveShell):
    """An InteractiveShell whose results and tracebacks land in `self.sink`."""

    sink: _Sink

    def _showtraceback(self, etype: type[BaseException], evalue: BaseException, stb: list[str]) -> None:
        self.sink.events.append(("error", etype.__name__, str(evalue)))


def _config() -> Config:
    # Made per shell, not module data: traitlets fills a Config in as a shell reads it, and
    # in process this module is a local module whose data every cell is keyed on.
    config = Config()
    config.HistoryManager.enabled = False
    config.HistoryManager.hist_file = ":memory:"
    return config


@contextlib.contextmanager
def _shell(namespace: dict[str, Any]) -> Iterator[RecordingShell]:
    """A new recording shell over `namespace`, torn down (atexit hook, sys state) afterwards."""
    shell = RecordingShell(config=_config(), user_ns=namespace, displayhook_class=RecordingDisplayHook)
    shell.sink = _Sink()
    # As in a kernel, `IPython.get_ipython()` is the shell running the cells.
    was = InteractiveShell._instance
    InteractiveShell._instance = shell
    try:
        yield shell
    finally:
        InteractiveShell._instance = was
        atexit.unregister(shell.atexit_operations)
        shell.restore_sys_module_state()


def _run_code(shell: RecordingShell, code: str) -> tuple[CellOutcome, dict[str, Any]]:
    """Run one cell; return its outcome and the execute_reply ipykernel would send."""
    shell.sink = _Sink()
    count = shell.execution_count
    with contextlib.redirect_stdout(_StreamWriter(shell, "stdout")), contextlib.redirect_stderr(_StreamWriter(shell, "stderr")):
        result = shell.run_cell(code, store_history=True)
    error = result.error_before_exec or result.error_in_exec
    reply: dict[str, Any] = {"status": "ok", "execution_count": count, "user_expressions": {}, "payload": []}
    if error is not None:
        reply = {
            "status": "error",
            "execution_count": count,
            "ename": type(error).__name__,
            "evalue": str(error),
            "traceback": [],
        }
    return CellOutcome(count, reply["status"], list(shell.sink.events)), reply


def _messages(events: list[Event], msg_id: str, count: int) -> list[dict[str, Any]]:
    """The IOPub messages ipykernel would send for `events`, as the capture sees them."""
    out = []
    for event in events:
        if event[0] == "stream":
            msg_type, content = "stream", {"name": event[1], "text": event[2]}
        elif event[0] == "result":
            msg_type, content = "execute_result", {"execution_count": count, "data": {"text/plain": event[1]}, "metadata": {}}
        else:
            msg_type, content = "error", {"ename": event[1], "evalue": event[2], "traceback": []}
        out.append({"msg_type": msg_type, "parent_header": {"msg_id": msg_id}, "content": content, "metadata": {}})
    return out


def _events_from_emitted(emitted: list[tuple[str, dict[str, Any]]]) -> list[Event]:
    """Turn replayed IOPub messages back into events (merging adjacent stream text)."""
    sink = _Sink()
    for msg_type, content in emitted:
        if msg_type == "stream":
            sink.stream(content["name"], content["text"])
        elif msg_type == "execute_result":
            sink.events.append(("result", content["data"].get("text/plain", "")))
        elif msg_type == "error":
            sink.events.append(("error", content["ename"], content["evalue"]))
        else:
            sink.events.append((msg_type, repr(content)))
    return sink.events


@contextlib.contextmanager
def isolated_process_state(workdir: Path, rng_seed: str) -> Iterator[None]:
    """chdir into `workdir`, seed the global RNGs with `rng_seed`, start from the warning
    filters this module was imported with (cases save and compare them, and what earlier
    tests left there must not change what a case stores), restore cwd, env and filters after."""
    old_cwd = os.getcwd()
    old_env = dict(os.environ)
    old_filters = list(pywarnings.filters)
    pywarnings.filters[:] = _BASELINE_FILTERS
    pywarnings._filters_mutated()  # type: ignore[attr-defined]
    workdir.mkdir(parents=True, exist_ok=True)
    os.chdir(workdir)
    random.seed(rng_seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(random.randrange(2**32))
    try:
        yield
    finally:
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)
        pywarnings.filters[:] = old_filters
        pywarnings._filters_mutated()  # type: ignore[attr-defined]


def _files(workdir: Path) -> dict[str, bytes]:
    return {p.relative_to(workdir).as_posix(): p.read_bytes() for p in sorted(workdir.rglob("*")) if p.is_file()}


def _hidden_rng() -> dict[str, Any]:
    state: dict[str, Any] = {"random": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        name, keys, pos, has_gauss, gauss = numpy.random.get_state(legacy=True)
        state["numpy.random"] = (name, keys.tobytes(), int(pos), int(has_gauss), float(gauss))
    return state


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("NBR_DIFF_")}


def run_cells(
    cells: tuple[str, ...] | list[str], workdir: Path, *, mode: str = "plain", store: Path | None = None, forecast: bool = False
) -> RunOutcome:
    """Run `cells` in order in a new shell in `workdir`.

    mode "plain" is a plain shell; "audit" and "repeat" attach a Session on
    `store` and follow the kernel's flow. Every cell runs to the end even if
    earlier ones raised (allow_errors). With `forecast`, the session is first asked
    what it will do with every cell (`Session.forecast`), as JupyterLab's plan button does.
    """
    namespace: dict[str, Any] = LazyNamespace() if mode == "repeat" else {}
    warnings: list[str] = []
    with isolated_process_state(workdir, f"{mode}|{workdir}"), _shell(namespace) as shell:
        session = None
        emitted: list[tuple[str, dict[str, Any]]] = []
        if mode != "plain":
            assert store is not None
            session = Session(shell, mode=mode, emit=lambda t, c, m, b: emitted.append((t, c)), store_path=store)
        def step(index: int, code: str) -> CellOutcome:
            """One execute_request, as nbrewind.kernels.base handles it."""
            if session is None:
                return _run_code(shell, code)[0]
            msg_id = f"cell-{index}"
            noise = io.StringIO()
            with contextlib.redirect_stderr(noise):
                plan = session.begin(code, msg_id=msg_id)
                reply = None
                if plan.replay:
                    emitted.clear()
                    reply = session.replay(plan)
            if reply is not None:
                outcome = CellOutcome(int(reply["execution_count"]), reply["status"], _events_from_emitted(emitted), "replayed", plan.reason)
            else:
                outcome, reply = _run_code(shell, code)
                outcome.decision, outcome.reason = "executed", plan.reason
                for message in _messages(outcome.events, msg_id, outcome.execution_count):
                    session.capture.observe(message, None)
                with contextlib.redirect_stderr(noise):
                    session.finish(plan, reply)
            warnings.extend(line for line in noise.getvalue().splitlines() if line.strip())
            # NBRewind's notices go to the kernel's log, not the cell's stderr.
            warnings.extend(session.notices)
            session.notices.clear()
            return outcome

        foreseen = session.forecast([(None, code) for code in cells]) if forecast and session is not None else None
        outcomes = [step(index, code) for index, code in enumerate(cells)]
        # Hidden state is observed from inside a new cell, as a user would: a session
        # may restore it lazily, before the next cell that runs. The probe names the run's
        # folder ("audit", "repeat"), so it runs in a repeat, and not its temporary parent,
        # so two audits of a case store the same objects (a seeded damage picks the same).
        step(len(cells), f"_nbr_probe = {workdir.name!r}")
        picture = canonical_namespace(shell.user_ns)
        hidden = _hidden_rng()
        env = _env()
        if session is not None:
            session.close()
    return RunOutcome(outcomes, picture, _files(workdir), hidden, env, warnings, foreseen)
