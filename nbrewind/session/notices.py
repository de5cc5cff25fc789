"""The one channel through which NBRewind tells the user about itself.

A notice is one line in the kernel's log (its own stderr), never in the cell's outputs,
which must be what a plain kernel shows. At most one line is written per request, so a
failing store cannot flood the log; every notice is kept all the same, for `%nbrewind
why` and for tests. Warnings of the ``nbrewind`` loggers (the task layer's) are routed
here too while the store is open.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from nbrewind.errors import StoreFullError

if TYPE_CHECKING:
    from nbrewind.session.writer import BackgroundWriter

__all__ = ["Notices", "stderr_line"]


class Notices:
    """The notice channel of one session: `notice`, `info` and `warn`, and what was said."""

    def __init__(self, log: Callable[[str], None] | None = None) -> None:
        self.notices: list[str] = []
        self.infos: list[str] = []
        self._log = log or stderr_line
        self._cell_lines = 0
        """NBRewind lines already written for the current request: at most one is."""
        self._disk_full = False

    def new_request(self) -> None:
        """A new request starts: it may write its one line."""
        self._cell_lines = 0

    def notice(self, text: str) -> None:
        """Tell the user something about NBRewind itself (see the module's docstring)."""
        self.notices.append(text)
        if self._cell_lines:
            return
        self._cell_lines += 1
        self._log(" ".join(text.split()))

    def info(self, text: str) -> None:
        """Something worth knowing but nothing to act on: the kernel's log, with NBREWIND_DEBUG."""
        self.infos.append(text)
        if os.environ.get("NBREWIND_DEBUG"):
            self._log(text)

    def warn(self, what: str, exc: BaseException | None = None) -> None:
        """A failure inside NBRewind: said once, and the cell runs as on a plain kernel."""
        detail = f": {type(exc).__name__}: {exc}" if exc is not None else ""
        self.notice(f"NBRewind warning: {what}{detail}. The cell ran as on a plain kernel.")
        if os.environ.get("NBREWIND_DEBUG") and exc is not None:
            self._log("".join(traceback.format_exception(exc)))

    def report_write_failures(self, writer: BackgroundWriter) -> None:
        """Say which earlier checkpoints could not be written. A full disk is said once, until
        a checkpoint is written again: every cell until then fails the same way."""
        failures = writer.take_failures()
        if not failures:
            if self._disk_full and writer.pending() == (0, 0):
                self._disk_full = False  # everything queued since was written: space is back
            return
        full = [f for f in failures if f.startswith(StoreFullError.__name__) or "No space left" in f]
        if full and not self._disk_full:
            self._disk_full = True
            self.notice(
                f"NBRewind warning: the store's disk is full ({full[0]}); checkpoints are not written until space "
                "is freed, and the cells run as on a plain kernel. This is not repeated."
            )
        if self._disk_full:
            return  # what else failed meanwhile (checkpoints naming the lost objects) is the same cause
        for failure in failures:
            self.notice(
                f"NBRewind warning: an earlier cell's checkpoint could not be written ({failure}); "
                "that cell will run again on repeat."
            )

    @contextlib.contextmanager
    def routed_logs(self) -> Iterator[None]:
        """Route warnings of the ``nbrewind`` loggers to `notice` (and nowhere else) while open."""
        logger = logging.getLogger("nbrewind")
        handler = _NoticeHandler(self.notice)
        propagate = logger.propagate
        logger.addHandler(handler)
        logger.propagate = False
        try:
            yield
        finally:
            logger.removeHandler(handler)
            logger.propagate = propagate


def stderr_line(text: str) -> None:
    """The log of a session without a kernel: the process's own stderr. (In a kernel, fd 2
    is a pipe into the cell's outputs; the kernel passes its logger instead.)"""
    stream = sys.__stderr__
    if stream is not None:
        print(text, file=stream, flush=True)


class _NoticeHandler(logging.Handler):
    """Hands the ``nbrewind`` loggers' records to the session's one notice channel."""

    def __init__(self, notice: Callable[[str], None]) -> None:
        super().__init__(logging.WARNING)
        self._notice = notice

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._notice(record.getMessage())
        except Exception:
            self.handleError(record)
