"""In-process session tests: a real IPython InteractiveShell and a real store, no ZMQ.

`Runner.run(cells)` drives cells the way the kernels do (begin, replay or run,
finish) and returns what happened to each cell.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from nbrewind.checkpoint.namespace import LazyNamespace
from nbrewind.session import Session

# The audit and repeat runs of these tests share one interpreter. Library settings are
# cell inputs, and a library one run imports first is "not loaded" for that run's early
# cells but loaded from the start of every later run, which no pair of kernel processes
# sees. Loading the libraries the tests use first keeps every run alike.
import dask.config  # noqa: E402,F401
import numpy  # noqa: E402,F401


@dataclass
class Outcome:
    decision: str
    reason: str
    success: bool
    result: Any = None
    error: str | None = None


@dataclass
class Runner:
    """Runs lists of cells on fresh shells that share one store and working folder."""

    store: Path
    workdir: Path
    shells: list[InteractiveShell] = field(default_factory=list)
    emitted: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    session: Session | None = None

    def new_kernel(self, mode: str) -> Session:
        config = Config()
        config.HistoryManager.enabled = False
        InteractiveShell.clear_instance()
        shell = InteractiveShell.instance(config=config, user_ns=LazyNamespace() if mode == "repeat" else None)
        self.shells.append(shell)
        if self.session is not None:
            self.session.close()
        self.session = Session(shell, mode=mode, emit=lambda t, c, m, b: self.emitted.append((t, c)), store_path=self.store)
        return self.session

    @property
    def ns(self) -> dict[str, Any]:
        assert self.session is not None
        return self.session.namespace

    def run(self, cells: list[str], mode: str = "audit", *, fresh: bool = True) -> list[Outcome]:
        if fresh or self.session is None:
            self.new_kernel(mode)
        assert self.session is not None
        outcomes = [self.cell(code) for code in cells]
        self.flush()
        return outcomes

    def flush(self) -> None:
        """Wait for the background writer: the catalog shows every cell run after this."""
        if self.session is not None:
            self.session.writer.flush()

    def cell(self, code: str) -> Outcome:
        session = self.session
        assert session is not None
        shell = session.shell
        plan = session.begin(code, msg_id=None)
        if plan.replay:
            reply = session.replay(plan)
            if reply is not None:
                return Outcome("replayed", plan.reason, reply["status"] == "ok", error=reply.get("ename"))
        result = shell.run_cell(code, store_history=True, silent=False)
        error = result.error_in_exec or result.error_before_exec
        reply: dict[str, Any] = {"status": "ok" if error is None else "error", "execution_count": shell.execution_count - 1}
        if error is not None:
            reply.update(ename=type(error).__name__, evalue=str(error), traceback=[])
        session.finish(plan, reply)
        return Outcome("executed", plan.reason, error is None, result.result, reply.get("ename"))


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[Runner]:
    work = tmp_path / "work"
    work.mkdir()
    old = os.getcwd()
    os.chdir(work)
    r = Runner(store=tmp_path / "store", workdir=work)
    try:
        yield r
    finally:
        if r.session is not None:
            r.session.close()
        os.chdir(old)
        InteractiveShell.clear_instance()
