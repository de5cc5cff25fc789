"""Finding and opening a session's store, and the collaborators that work on it, made together.

The session opens its store lazily (at the first recorded cell, or when `%nbrewind`
asks), so everything that needs the store's objects, catalog or live state is made
then, here, from explicit arguments: the session itself only coordinates them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbrewind.checkpoint import hidden
from nbrewind.checkpoint.native_io import reporting_native_io
from nbrewind.checkpoint.world import WorldTracker
from nbrewind.session.keys import Keys
from nbrewind.session.outside import Outside
from nbrewind.session.rebuild import Rebuilder
from nbrewind.session.recorder import Recorder
from nbrewind.session.replay import Replayer
from nbrewind.session.restore import Restorer
from nbrewind.session.state import LiveState
from nbrewind.errors import NbrewindError, UntrustedStoreError
from nbrewind.identity.files import remembering
from nbrewind.identity.memo import DigestMemo
from nbrewind.store import Store, resolve_store_path
from nbrewind.store.origin import check_store_origin
from nbrewind.tasks.cache import TaskCache
from nbrewind.tasks.intercept import intercepting

if TYPE_CHECKING:
    from nbrewind.checkpoint.outputs import OutputCapture
    from nbrewind.session.commit import Committer
    from nbrewind.session.notices import Notices
    from nbrewind.session.plan import Emit, Paths, RngLedger
    from nbrewind.session.writer import BackgroundWriter

__all__ = ["Parts", "StoreHandle", "open_store", "store_location"]


def store_location(store_path: Path | None, namespace: dict[str, Any], start_dir: Path) -> Path:
    """`store_path` if given, else where `resolve_store_path` puts the store of the notebook
    named by Jupyter's ``JPY_SESSION_NAME``, IPython's ``__session__`` or VS Code's
    ``__vsc_ipynb_file__`` (which it sets in the namespace before the first cell)."""
    if store_path is not None:
        return store_path
    ns = namespace
    candidates = (os.environ.get("JPY_SESSION_NAME"), dict.get(ns, "__session__"), dict.get(ns, "__vsc_ipynb_file__"))
    notebook = next((str(c) for c in candidates if c and str(c).endswith(".ipynb")), None)
    return resolve_store_path(notebook_path=notebook, cwd=start_dir)


def open_store(location: Path, notice: Callable[[str], None]) -> Store:
    """Open (or create) the store at `location`, saying what the user must know about it.

    A store this user has not signed raises UntrustedStoreError here, before it is
    opened: nothing in it is read, let alone unpickled.
    """
    said = check_store_origin(location)
    if said:
        notice(said)
    store = Store.open(location, create=True)
    if store.catalog_recreated:
        notice(
            f"NBRewind warning: the catalog of the store at {store.root} was missing or empty although "
            "the store holds objects: which cells were recorded is lost, so every cell runs and is recorded "
            "again (the stored objects are reused)."
        )
    shared = store.catalog.shared_fs_notice()
    if shared:
        notice(shared)
    return store


@dataclass(frozen=True)
class Parts:
    """The live state of an open store and the collaborators that work on it."""

    state: LiveState
    outside: Outside
    keys: Keys
    recorder: Recorder
    restorer: Restorer
    replayer: Replayer

    @classmethod
    def build(
        cls,
        store: Store,
        shell: Any,
        *,
        mode: str,
        session_id: str,
        emit: Emit,
        capture: OutputCapture,
        writer: BackgroundWriter,
        committer: Committer,
        notices: Notices,
        rng: RngLedger,
        paths: Paths,
        unrecordable: list[str],
    ) -> Parts:
        """Make the parts for `store`; `unrecordable` is the session's list, cleared per request."""
        state = LiveState(store.objects, shell.user_ns)
        files = hidden.FileTracker(exclude=[str(store.root), *hidden.default_exclusions()])
        world = WorldTracker(files.excluded, lambda path: path in files.writes)
        outside = Outside(store.objects, state.entries, paths.rel, paths.abs, notices.warn, namespace=lambda: shell.user_ns)
        state.imports = outside.imports.bound
        keys = Keys(shell, mode=mode, state=state, outside=outside, rng=rng, paths=paths, catalog=store.catalog)
        recorder = Recorder(
            shell, mode=mode, session_id=session_id, state=state, objects=store.objects, files=files, world=world,
            outside=outside, rng=rng, paths=paths, capture=capture,
        )
        rebuilder = Rebuilder(shell, state=state, catalog=store.catalog, writer=writer, paths=paths, notices=notices)
        restorer = Restorer(
            shell, session_id=session_id, state=state, catalog=store.catalog, outside=outside, writer=writer,
            committer=committer, rng=rng, paths=paths, notices=notices, rebuilder=rebuilder, unrecordable=unrecordable,
        )
        replayer = Replayer(
            shell, emit=emit, catalog=store.catalog, objects=store.objects, restorer=restorer, recorder=recorder, rng=rng
        )
        return cls(state, outside, keys, recorder, restorer, replayer)


class StoreHandle:
    """The session's store, opened at first need together with its `Parts` and the Dask
    task interception, and closed with them. A store that cannot be used is reported once
    (`usable`), and recording stays off for the kernel."""

    def __init__(self, location: Callable[[], Path], build: Callable[[Store], Parts], notices: Notices) -> None:
        self._location = location
        self._build = build
        self._notices = notices
        self._store: Store | None = None
        self._parts: Parts | None = None
        self._failed = False
        self.task_cache: TaskCache | None = None
        """The cache every Dask task of this kernel goes through, once the store is open."""
        self._interception = contextlib.ExitStack()

    @property
    def store(self) -> Store:
        """The open store (opened now if need be; raises if it cannot be used)."""
        if self._store is None:
            # An untrusted store raises here: no task interception starts, so no task
            # result is loaded from it either.
            self._store = store = open_store(self._location(), self._notices.notice)
            self._parts = self._build(store)
            # What the task layer logs is a notice too: the root logger's fallback would
            # write it to sys.stderr, which in a kernel is the cell's output.
            self._interception.enter_context(self._notices.routed_logs())
            # File digests this user's earlier kernels took of unchanged files are not taken again.
            self._interception.enter_context(remembering(DigestMemo.open_default()))
            # Files pyarrow opens in C++ are reported as opens, so cells that use them are keyed on them.
            self._interception.enter_context(reporting_native_io())
            # Every Dask task run from now until close() is cached in this store.
            self.task_cache = self._interception.enter_context(intercepting(TaskCache(store.root)))
        return self._store

    def parts(self) -> Parts:
        """The collaborators that work on the store, opening it if need be."""
        self.store
        assert self._parts is not None
        return self._parts

    def opened(self) -> Parts | None:
        """The collaborators if the store is already open, else None (nothing is opened)."""
        return self._parts

    def usable(self) -> bool:
        """Whether the store is open or opens now; the first failure says why, once."""
        if self._failed:
            return False
        try:
            self.store
        except UntrustedStoreError as exc:
            self._failed = True
            self._notices.notice(str(exc))  # already says what happens and which command trusts the store
            return False
        except (NbrewindError, OSError) as exc:
            self._failed = True
            self._notices.warn(f"recording is off for this kernel: the store at {self._location()} cannot be used", exc)
            return False
        return True

    def close(self) -> None:
        """Undo the Dask interception and close the store (after the writer has finished)."""
        with contextlib.suppress(Exception):
            self._interception.close()
        if self._parts is not None:
            self._parts.outside.close()
        if self._store is not None:
            with contextlib.suppress(Exception):
                self._store.close()
