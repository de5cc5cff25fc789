"""The Dask task cache, client side: lookups, task specs and the task log.

A task result lives in the store as an *entry* (``results.py``: the pickle
stream, its large buffers as deduplicated blobs, and a small JSON record with
size, run time, worker, and the local files the task's fingerprint covered, so
a later hit can report what the result was made from). The ref
``tasks/<fingerprint>`` points at the newest entry; :class:`TaskCache` reads it
back to decide hits and to fill the task log.

What the rewritten graphs run on the workers (:func:`load_result`,
:func:`compute_and_store`) is in ``runner.py``; a worker that cannot see the
store reaches it through the kernel (``remote.py`` on the worker, ``relay.py``
in the kernel). Their names are importable from here too.
Nothing here imports dask at module level.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from nbrewind.errors import NbrewindError
from nbrewind.store import ObjectStore, Store, TaskLogEntry
from nbrewind.tasks.relay import StoreRelay
from nbrewind.tasks.remote import StoreLink
from nbrewind.tasks.results import (
    ENTRY_FORMAT,
    OOB_THRESHOLD,
    TaskCacheError,
    load_entry,
    read_entry,
    store_result,
)
from nbrewind.tasks.runner import (
    REF_NAMESPACE,
    TaskSpec,
    compute_and_store,
    load_result,
    object_store,
)

__all__ = [
    "ENTRY_FORMAT",
    "OOB_THRESHOLD",
    "REF_NAMESPACE",
    "TaskCache",
    "TaskCacheError",
    "TaskLogRow",
    "TaskSpec",
    "compute_and_store",
    "impure",
    "is_impure",
    "load_entry",
    "load_result",
    "object_store",
    "read_entry",
    "store_result",
]

_IMPURE_ATTR = "__nbrewind_impure__"
_KNOWN_LIMIT = 1_000_000

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


def impure(fn: F) -> F:
    """Mark ``fn`` as impure: Dask tasks calling it are never cached (nor their dependents)."""
    setattr(fn, _IMPURE_ATTR, True)
    return fn


def is_impure(fn: object) -> bool:
    """Whether ``fn`` (or the function a ``functools.partial`` wraps) was marked with :func:`impure`."""
    for _ in range(8):
        if getattr(fn, _IMPURE_ATTR, False) is True:
            return True
        inner = getattr(fn, "func", None)
        if inner is None or inner is fn:
            return False
        fn = inner
    return False


def _recorded_files(meta: Mapping[str, Any]) -> dict[str, str]:
    """The ``files`` of an entry's record and the files its task read while it ran
    (``reads``, `nbrewind.tasks.reads`), where well formed."""
    reads = meta.get("reads")
    read = _string_map(reads.get("files") if isinstance(reads, dict) else None)
    return {**{os.path.abspath(k): v for k, v in read.items()}, **_string_map(meta.get("files"))}


def _recorded_dirs(meta: Mapping[str, Any]) -> dict[str, str]:
    """The folders an entry's task listed while it ran, with their listing digests."""
    reads = meta.get("reads")
    dirs = _string_map(reads.get("dirs") if isinstance(reads, dict) else None)
    return {os.path.abspath(k): v for k, v in dirs.items()}


def _string_map(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


# -- client side --------------------------------------------------------------------------------


@dataclass
class _Pending:
    fingerprint: str
    key_prefix: str
    hit: bool
    entry: str | None
    files: Mapping[str, str] | None


@dataclass(frozen=True, kw_only=True)
class TaskLogRow(TaskLogEntry):
    """One drained task-log entry, as the catalog logs it, plus :attr:`file_inputs`, which
    is no column: the local files the task's result depends on, absolute path -> content
    digest.

    On a miss they are the files its fingerprint covered at submission (string and path
    arguments and string constants naming local files, its dependencies' included); on
    a hit also those recorded with the stored result when it was made.
    """

    file_inputs: Mapping[str, str] = field(default_factory=dict, compare=False)
    dir_inputs: Mapping[str, str] = field(default_factory=dict, compare=False)
    """The folders the task listed while it ran (when it was made), path -> listing digest."""


class TaskCache:
    """The client side of the task cache for one store: lookups, fingerprints and the task log.

    Thread-safe. ``drain_log`` returns the rows of every task rewritten since
    the previous drain, for the session to record with the cell run id.
    """

    def __init__(self, store_root: Path | str) -> None:
        self.root = Path(store_root).absolute()
        self._objects: ObjectStore | None = None
        self._fingerprinter: Any = None
        self.lock = threading.RLock()
        self._pending: list[_Pending] = []
        self._known: dict[Hashable, str] = {}
        self._known_files: dict[Hashable, Mapping[str, str]] = {}
        self.impure_tokens: set[str] = set()
        """Key tokens dask.delayed generated for calls made with ``pure=False``."""
        self.host = socket.gethostname()
        self.relay: StoreRelay | None = None
        """The relay serving workers that cannot see the store (made on first use)."""
        self._link_failed = False

    def __repr__(self) -> str:
        return f"TaskCache({str(self.root)!r})"

    @property
    def objects(self) -> ObjectStore:
        """The store's object area (the store is created on first use)."""
        if self._objects is None:
            Store.open(self.root, create=True).close()
            self._objects = object_store(str(self.root))
        return self._objects

    @property
    def fingerprinter(self) -> Any:
        """The Fingerprinter (use under ``lock``: it is not thread-safe)."""
        if self._fingerprinter is None:
            from nbrewind.tasks.fingerprint import Fingerprinter

            self._fingerprinter = Fingerprinter()
        return self._fingerprinter

    def spec(
        self, fingerprint: str, key_prefix: str, files: Mapping[str, str] | None = None, *, store: bool = True,
        link: StoreLink | None = None,
    ) -> TaskSpec:
        """The worker-side handle for one task (``files``: what its fingerprint covers;
        ``store``: whether this task writes its result; False for all but one of the tasks
        of a graph that share a fingerprint; ``link``: see :meth:`link_for`)."""
        return TaskSpec(
            str(self.root), fingerprint, key_prefix, tuple(sorted(files.items())) if files else (), store, self.host,
            link,
        )

    def link_for(self, client: Any) -> StoreLink | None:
        """The link the tasks of a graph ``client`` sends carry, so that workers which cannot
        see the store still store and load results through this kernel (`relay.py`).

        None when it cannot be set up (a read-only store): workers must then see the store
        to use it, as before; the first failure is logged.
        """
        with self.lock:
            try:
                if self.relay is None:
                    self.relay = StoreRelay(self.objects, REF_NAMESPACE)
                return self.relay.link(client)
            except Exception:  # workers that cannot see the store then just do not cache
                if not self._link_failed:
                    self._link_failed = True
                    logger.warning("NBRewind: workers that cannot see the store will not cache their tasks",
                                   exc_info=True)
                return None

    def close(self) -> None:
        """Write what workers without the store sent, and stop serving them."""
        relay = self.relay
        if relay is not None:
            relay.close()

    def lookup(self, fingerprint: str) -> str | None:
        """The entry digest cached for ``fingerprint``, if the ref and its entry object exist."""
        objects = self.objects
        try:
            entry = objects.ref_get(REF_NAMESPACE, fingerprint)
        except (NbrewindError, OSError):
            return None
        # Sound, not merely there: after a crash a deferred entry may be empty (and a hit
        # on an entry not yet made durable makes the next barrier sync, see `ObjectStore`).
        if entry is None or not objects.has_sound(entry):
            return None
        return entry

    def known_fingerprints(self) -> dict[Hashable, str]:
        """Fingerprints of keys submitted earlier (futures and persisted collections refer to them)."""
        return self._known

    def remember(self, fps: Mapping[Hashable, str], files: Mapping[Hashable, Mapping[str, str]] | None = None) -> None:
        """Remember the fingerprints of submitted output keys (and the files they cover)."""
        if len(self._known) + len(fps) > _KNOWN_LIMIT:
            self._known.clear()
            self._known_files.clear()
        self._known.update(fps)
        for k in fps:
            if files and k in files:
                self._known_files[k] = files[k]
            else:
                self._known_files.pop(k, None)

    def known_files(self, keys: Iterable[Hashable]) -> dict[Hashable, Mapping[str, str]]:
        """The files the remembered fingerprints of ``keys`` cover (keys without any are absent)."""
        known = self._known_files
        return {k: known[k] for k in keys if k in known}

    def note(
        self, fingerprint: str, key_prefix: str, *, hit: bool, entry: str | None = None,
        files: Mapping[str, str] | None = None,
    ) -> None:
        """Queue a task-log row (filled in from the store when drained); ``files``: what
        the fingerprint covered at submission."""
        with self.lock:
            self._pending.append(_Pending(fingerprint, key_prefix, hit, entry, files))

    def note_many(self, notes: Iterable[tuple[str, str, bool, str | None, Mapping[str, str] | None]]) -> None:
        """:meth:`note` for many tasks at once: (fingerprint, key_prefix, hit, entry, files) each."""
        pending = [_Pending(fp, prefix, hit, entry, files) for fp, prefix, hit, entry, files in notes]
        with self.lock:
            self._pending.extend(pending)

    def drain_log(self) -> list[TaskLogRow]:
        """Task-log rows (fingerprint, key_prefix, hit, duration, nbytes, worker, result_digest,
        and each row's :attr:`TaskLogRow.file_inputs`) gathered since the last drain. A miss
        still running (or whose result could not be stored) has no duration, size or digest."""
        relay = self.relay
        if relay is not None:
            relay.flush()  # results of workers without the store, received so far, are written
        with self.lock:
            pending, self._pending = self._pending, []
        rows = []
        # Equal tasks share one stored result: read each fingerprint's ref and entry once.
        seen: dict[tuple[str, bool, str | None], tuple[dict[str, Any], dict[str, str], dict[str, str]]] = {}
        for p in pending:
            once = seen.get((p.fingerprint, p.hit, p.entry))
            if once is None:
                once = seen[(p.fingerprint, p.hit, p.entry)] = self._details(p)
            details, recorded, dirs = once
            # What the result was made from, then what the fingerprint covered now (equal
            # wherever both name a file, since the fingerprint embeds the digests).
            files = {**recorded, **(p.files or {})}
            rows.append(TaskLogRow(
                fingerprint=p.fingerprint, key_prefix=p.key_prefix, hit=p.hit, file_inputs=files, dir_inputs=dirs, **details
            ))
        return rows

    def _details(self, p: _Pending) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
        """A drained row's columns read from the store, and the files and folders its stored
        result records."""
        details: dict[str, Any] = {"result_digest": p.entry}
        recorded: dict[str, str] = {}
        dirs: dict[str, str] = {}
        try:
            entry = p.entry if p.hit else self.objects.ref_get(REF_NAMESPACE, p.fingerprint)
            if entry is not None:
                _, meta = read_entry(self.objects, entry)
                details = {"result_digest": entry, "nbytes": meta.get("nbytes")}
                if not p.hit:
                    details.update(duration=meta.get("duration"), worker=meta.get("worker"))
                recorded = _recorded_files(meta)
                dirs = _recorded_dirs(meta)
        except (NbrewindError, OSError, ValueError):
            pass  # the row stays, without the details
        return details, recorded, dirs

    def file_inputs(self, rows: Iterable[TaskLogEntry]) -> dict[str, str]:
        """The local files the tasks of ``rows`` depend on: absolute path -> content digest
        (`nbrewind.identity.files.file_digest`'s), for a cell key's ``@file:`` inputs.

        Rows from :meth:`drain_log` carry them; for any other entry (one read back from
        the catalog) they are read from the stored result's record. When two rows disagree
        about a file (it changed between two submissions of one cell), the last row's
        digest is kept.
        """
        return self._recorded(rows, "file_inputs", _recorded_files)

    def dir_inputs(self, rows: Iterable[TaskLogEntry]) -> dict[str, str]:
        """The local folders the tasks of ``rows`` listed when they ran: absolute path ->
        listing digest (`nbrewind.identity.files.listing_digest`, that of a cell's ``@dir:``
        input), as `file_inputs` gives their files."""
        return self._recorded(rows, "dir_inputs", _recorded_dirs)

    def _recorded(
        self, rows: Iterable[TaskLogEntry], carried: str, from_record: Callable[[Mapping[str, Any]], dict[str, str]]
    ) -> dict[str, str]:
        out: dict[str, str] = {}
        for row in rows:
            found: Mapping[str, str] | None = getattr(row, carried) if isinstance(row, TaskLogRow) else None
            if found is None:
                found = {}
                if isinstance(row.result_digest, str):
                    try:
                        found = from_record(read_entry(self.objects, row.result_digest)[1])
                    except (NbrewindError, OSError, ValueError):
                        pass
            out.update(found)
        return out

    def stats(self, rows: Iterable[TaskLogEntry]) -> tuple[int, int]:
        """(hits, misses) among drained rows."""
        hits = misses = 0
        for row in rows:
            if row.hit:
                hits += 1
            else:
                misses += 1
        return hits, misses
