"""The Session: what the kernels ask before and after every execute_request.

Audit: every cell runs; afterwards its outputs, the names it read (with their
digests) and a checkpoint are recorded. Repeat: a cell whose normalized code and
every recorded input still match an earlier run is replayed (outputs re-sent,
writes bound lazily from the store); any other cell runs and is recorded.

Any failure in here is reported once on stderr and the cell runs as it would on
a plain kernel.

The Session is the coordinator: it owns the store and the Dask interception, and
hands each step to a collaborator with one job: `Keys` (keys.py) plans a request,
`Recorder` (recorder.py) records a cell that runs, `Replayer` (replay.py) replays a
matched run, `Restorer` and `Rebuilder` (restore.py, rebuild.py) bind recorded state,
`Committer` (commit.py) writes records, and `Notices` (notices.py) tells the user.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nbrewind.checkpoint.namespace import LazyNamespace
from nbrewind.checkpoint.outputs import OutputCapture
from nbrewind.errors import NbrewindError
from nbrewind.session.cells import Cells
from nbrewind.session.commit import Committer
from nbrewind.session.forecast import Forecast, forecast
from nbrewind.session.notices import Notices
from nbrewind.session.parts import Parts, StoreHandle, store_location
from nbrewind.session.plan import CellPlan, Emit, LastCell, Paths, RngLedger
from nbrewind.session.restore import complete_pending
from nbrewind.session.state import LiveState, finalizes_on_drop
from nbrewind.session.writer import BackgroundWriter
from nbrewind.store import Store


class Session:
    """Per-kernel NBRewind state: the store, the live checkpoint and the decisions."""

    @staticmethod
    def make_namespace(mode: str) -> LazyNamespace | None:
        """The user namespace the kernel should start with (lazy on repeat)."""
        if mode == "repeat" and os.environ.get("NBREWIND_LAZY", "1") != "0":
            return LazyNamespace()
        return None

    @classmethod
    def for_shell(cls, shell: Any, *, mode: str, emit: Emit, log: Callable[[str], None] | None = None) -> Session:
        """A session for an IPython shell, storing where DESIGN.md says; `log` writes one
        line to the kernel's log (see `notice`)."""
        return cls(shell, mode=mode, emit=emit, log=log)

    def __init__(
        self,
        shell: Any,
        *,
        mode: str,
        emit: Emit,
        store_path: Path | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        if mode not in ("audit", "repeat"):
            raise ValueError(f"mode must be 'audit' or 'repeat', not {mode!r}")
        self.shell = shell
        self.mode = mode
        self.emit = emit
        self.session_id = uuid.uuid4().hex
        self.enabled = True
        self.capture = OutputCapture()
        self.channel = Notices(log)
        # The notice channel as the kernels, magic.py and tests know it (`Notices`).
        self.notices, self.infos = self.channel.notices, self.channel.infos
        self.notice, self.info, self._warn = self.channel.notice, self.channel.info, self.channel.warn
        self.unrecordable: list[str] = []
        """Why the current cell must not be recorded (a value NBRewind could not bring back, a lost output)."""
        self.start_dir = Path(os.getcwd()).resolve()
        self._paths = Paths(self.start_dir)
        self._rng = RngLedger()
        self._store_path = store_path
        self.writer = BackgroundWriter()
        self.committer = Committer(self.writer)
        self._handle = StoreHandle(self.store_location, self._build_parts, self.channel)
        self.cells = Cells(
            self._handle, ready=self._ready, namespace=lambda: self.namespace, capture=self.capture, channel=self.channel,
            committer=self.committer, writer=self.writer, unrecordable=self.unrecordable,
        )
        ns = shell.user_ns
        if isinstance(ns, LazyNamespace):
            ns.set_loader(self._load_pending)
            ns.set_before_drop(self._before_drop)

    # -- plumbing ---------------------------------------------------------------

    @property
    def namespace(self) -> dict[str, Any]:
        ns: dict[str, Any] = self.shell.user_ns
        return ns

    def observe_sends(self, session: Any) -> contextlib.AbstractContextManager[None]:
        """Wrap the kernel's message session so cell outputs are captured."""
        return self.capture.observing(session)

    def store_location(self) -> Path:
        """Where this kernel's store is (see `parts.store_location`)."""
        return store_location(self._store_path, self.namespace, self.start_dir)

    @property
    def store(self) -> Store:
        return self._handle.store

    def _build_parts(self, store: Store) -> Parts:
        return Parts.build(
            store, self.shell, mode=self.mode, session_id=self.session_id, emit=self.emit, capture=self.capture,
            writer=self.writer, committer=self.committer, notices=self.channel, rng=self._rng, paths=self._paths,
            unrecordable=self.unrecordable,
        )

    def _opened(self) -> Parts:
        return self._handle.parts()

    @property
    def state(self) -> LiveState:
        return self._opened().state

    def _ready(self) -> bool:
        return self.enabled and self._handle.usable()

    # -- each execute request (`Cells`) ---------------------------------------------

    def begin(
        self, code: str, *, silent: bool = False, store_history: bool = True, cell_id: str | None = None, msg_id: str | None = None
    ) -> CellPlan:
        """Analyse the request and decide: replay it, or run and record it."""
        return self.cells.begin(code, silent=silent, store_history=store_history, cell_id=cell_id, msg_id=msg_id)

    def finish(self, plan: CellPlan, reply: Mapping[str, Any]) -> None:
        """Record the cell run and its checkpoint."""
        self.cells.finish(plan, reply)

    def replay(self, plan: CellPlan) -> dict[str, Any] | None:
        """Replay a matched run and return its reply; None when the cell must run instead."""
        return self.cells.replay(plan)

    def reply_metadata(self, msg_id: str | None) -> dict[str, Any] | None:
        """``metadata.nbrewind`` for the reply to request `msg_id` (see `outcome`)."""
        return self.cells.reply_metadata(msg_id)

    @property
    def last(self) -> LastCell | None:
        """What the last recorded or replayed cell of this kernel did (`%nbrewind status`)."""
        return self.cells.last

    # -- the rest of the kernel's requests ------------------------------------------

    def _load_pending(self, name: str, token: Any) -> dict[str, Any]:
        """LazyNamespace loader: see `Restorer.load_pending`."""
        __tracebackhide__ = True  # noqa: F841 (IPython hides this frame in tracebacks)
        return self._opened().restorer.load_pending(name, token)

    def _before_drop(self, name: str, token: Any) -> None:
        """LazyNamespace hook: see `Restorer.load_to_drop`. A failure is a warning: the
        notebook's `del` still happens."""
        __tracebackhide__ = True  # noqa: F841
        if not finalizes_on_drop(token) or not self._ready():
            return
        try:
            self._opened().restorer.load_to_drop(name, token)
        except KeyError:
            raise  # the loader gave up on it (and said why): the name is not defined
        except Exception as exc:
            self.channel.warn(f"could not bring back {name!r} before the cell dropped it (its finalizer does not run)", exc)

    def restore(self, target: str) -> str:
        """Make the namespace what it was after a recorded cell run (by execution count or cell id)."""
        return self._opened().restorer.restore(target)

    def complete_pending(self, code: str, cursor_pos: int | None, reply: dict[str, Any]) -> dict[str, Any]:
        """Add pending (replayed, not yet loaded) names to a completion reply."""
        return complete_pending(self.namespace, code, cursor_pos, reply)

    def forecast(self, cells: Sequence[tuple[str | None, str]]) -> list[Forecast]:
        """What this kernel would do with `cells` ((cell id, code), in order) sent now, one
        after another: replay, run, or depends on a cell that runs (`session.forecast`).
        Nothing runs and nothing changes; an unusable store raises NbrewindError."""
        if not self._ready():
            raise NbrewindError("recording is off for this kernel, so every cell would run as on a plain kernel")
        self.writer.flush()  # the runs this kernel just recorded are matches too
        parts = self._opened()
        return forecast(cells, mode=self.mode, keys=parts.keys, state=self.state, catalog=self.store.catalog, shell=self.shell)

    def answer(self, request: Any) -> dict[str, Any]:
        """A frontend's comm request answered (`session.frontend`)."""
        from nbrewind.session.frontend import answer

        return answer(self, request)

    def magic(self, line: str) -> None:
        """`%nbrewind status|why|log|off|on|restore N`."""
        from nbrewind.session.magic import run_magic

        run_magic(self, line)

    def close(self) -> None:
        """Finish pending writes, undo the Dask interception, close the store."""
        if isinstance(self.shell.user_ns, LazyNamespace):
            self.shell.user_ns.set_before_drop(None)  # names dropped from here on (a shutdown) stay in the store
        self.writer.close()
        self._handle.close()
