"""The Dask task cache: results stored by fingerprint, where the tasks run.

A task result lives in the store as an *entry*: a tree object whose first child
is the pickle stream (cloudpickle, protocol 5), whose other children are the
large out-of-band buffers (``put_blob``: chunked, deduplicated by content), and
whose payload is a small JSON record (size, run time, worker, and the local
files the task's fingerprint covered, path -> digest, so a later hit can report
what the result was made from). The ref
``tasks/<fingerprint>`` points at the newest entry; the client reads it back to
decide hits and to fill the task log.

The functions a rewritten graph calls (:func:`load_result`,
:func:`compute_and_store`) run on Dask workers: they open the store by absolute
path (once per process) and never let a cache problem fail the user's task.

Writes are cheap: of the tasks of a graph that share a fingerprint only one
stores (``TaskSpec.store``), and a worker on the client's machine writes without
fsync (``nbrewind.store.fsio.deferred_sync``). That is safe because nothing
replayable names a result until the committer's durability barrier
(``ObjectStore.barrier``, one ``syncfs``) has run: a ref written before a crash
can name a lost entry, and :meth:`TaskCache.lookup` then sees it unsound and
misses. A worker on another machine fsyncs each write as before.
Nothing here imports dask at module level.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import socket
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from nbrewind.errors import NbrewindError
from nbrewind.store import BLOB_CHUNK_SIZE, ObjectStore, Store, TaskLogEntry
from nbrewind.store.fsio import deferred_sync

__all__ = [
    "REF_NAMESPACE",
    "TaskCache",
    "TaskCacheError",
    "TaskLogRow",
    "TaskSpec",
    "compute_and_store",
    "impure",
    "is_impure",
    "load_result",
]

REF_NAMESPACE = "tasks"
ENTRY_FORMAT = "nbrewind-task-result/1"
#: Buffers at least this large leave the pickle stream and are stored (deduplicated) on their own.
OOB_THRESHOLD = 64 * 1024
_IMPURE_ATTR = "__nbrewind_impure__"
_KNOWN_LIMIT = 1_000_000

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


class TaskCacheError(NbrewindError):
    """A cached task result could not be loaded and there was no way to recompute it."""


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


@dataclass(frozen=True)
class TaskSpec:
    """What a worker needs to load or store one task's result (small, pickled with the task)."""

    root: str
    fingerprint: str
    key_prefix: str
    files: tuple[tuple[str, str], ...] = ()
    """The local files the fingerprint covers, (absolute path, digest), recorded with the result."""
    store: bool = True
    """False for a task whose fingerprint another task of its graph stores: it only runs."""
    host: str = ""
    """The client's host: a worker there defers its fsyncs to the client's durability barrier
    (`nbrewind.store.fsio`); a worker elsewhere, whose page cache that barrier cannot reach, does not."""


# -- worker side --------------------------------------------------------------------------------

_stores: dict[str, ObjectStore] = {}


def object_store(root: str) -> ObjectStore:
    """The object area of the store at ``root``, opened once per process."""
    objects = _stores.get(root)
    if objects is None:
        objects = _stores[root] = ObjectStore(Path(root))
    return objects


def _where() -> str:
    """This process's Dask worker address, else ``host:pid``."""
    if "distributed" in sys.modules:
        try:
            from distributed import get_worker

            return str(get_worker().address)
        except ValueError:
            pass
    return f"{socket.gethostname()}:{os.getpid()}"


def store_result(objects: ObjectStore, value: object, record: Mapping[str, Any]) -> tuple[str, int]:
    """Pickle ``value`` into the store as an entry; return (entry digest, nbytes).

    Raises whatever pickling or writing raises; callers decide what that means.
    """
    import cloudpickle

    buffers: list[memoryview] = []

    def keep_in_band(pb: pickle.PickleBuffer) -> bool:
        view = pb.raw() if memoryview(pb).contiguous else memoryview(memoryview(pb).tobytes())
        if view.nbytes < OOB_THRESHOLD:
            return True
        buffers.append(view)
        return False

    payload = cloudpickle.dumps(value, protocol=5, buffer_callback=keep_in_band)
    if len(payload) <= BLOB_CHUNK_SIZE:
        kind, first = "object", objects.put(payload)
    else:
        kind, first = "blob", objects.put_blob(payload)
    children = [first, *(objects.put_blob(b) for b in buffers)]
    nbytes = len(payload) + sum(b.nbytes for b in buffers)
    meta = {"format": ENTRY_FORMAT, "payload": kind, "nbytes": nbytes, **record}
    entry = objects.put_tree(children, json.dumps(meta, sort_keys=True).encode())
    return entry, nbytes


def read_entry(objects: ObjectStore, entry: str) -> tuple[list[str], dict[str, Any]]:
    """An entry's children and its JSON record (verified)."""
    children, payload = objects.get_tree(entry)
    meta = json.loads(payload)
    if not isinstance(meta, dict) or meta.get("format") != ENTRY_FORMAT or not children:
        raise TaskCacheError(f"object {entry} is not a task result entry")
    return children, meta


def load_entry(objects: ObjectStore, entry: str) -> Any:
    """The value stored in ``entry``; every object is verified against its digest first."""
    children, meta = read_entry(objects, entry)
    payload = objects.get(children[0]) if meta["payload"] == "object" else objects.get_blob(children[0])
    buffers = [objects.get_blob(d) for d in children[1:]]
    return pickle.loads(payload, buffers=buffers)


def load_result(spec: TaskSpec, entry: str, fallback: tuple[dict[Hashable, Any], Hashable] | None) -> Any:
    """Graph task for a cache hit: the stored result, or on any failure the recomputed one.

    ``fallback`` holds the original task and the upstream work the rewrite culled
    (or None when that was too large to ship); it runs only if loading fails.
    """
    objects = object_store(spec.root)
    try:
        return load_entry(objects, entry)
    except Exception as exc:  # a damaged or vanished object must not fail the user's task
        problem = f"{type(exc).__name__}: {exc}"
    if fallback is None:
        raise TaskCacheError(
            f"the cached result of task {spec.key_prefix!r} ({spec.fingerprint}) cannot be loaded ({problem}); "
            "run the cell again to recompute it"
        )
    logger.warning("NBRewind: recomputing task %r: its cached result cannot be loaded (%s)", spec.key_prefix, problem)
    from dask._task_spec import execute_graph

    dsk, key = fallback
    started = time.perf_counter()
    graph: Any = dsk
    value = execute_graph(graph, keys=[key])[key]  # type: ignore[list-item,index]
    _try_store(spec, value, time.perf_counter() - started)
    return value


def compute_and_store(spec: TaskSpec, func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Graph task for a cache miss: run the task, then store its result by fingerprint."""
    started = time.perf_counter()
    value = func(*args, **kwargs)
    _try_store(spec, value, time.perf_counter() - started)
    return value


def _try_store(spec: TaskSpec, value: object, duration: float) -> None:
    if not spec.store:
        return
    record: dict[str, Any] = {
        "duration": duration, "worker": _where(), "host": socket.gethostname(), "key_prefix": spec.key_prefix,
    }
    if spec.files:
        record["files"] = dict(spec.files)
    try:
        objects = object_store(spec.root)
        with deferred_sync(objects.root) if spec.host == record["host"] else contextlib.nullcontext():
            entry, _ = store_result(objects, value, record)
            objects.ref_set(REF_NAMESPACE, spec.fingerprint, entry)
    except Exception:  # unpicklable result, full disk, read-only store: the task still succeeds
        return


def _recorded_files(meta: Mapping[str, Any]) -> dict[str, str]:
    """The ``files`` of an entry's record, if well formed."""
    files = meta.get("files")
    if not isinstance(files, dict):
        return {}
    return {str(k): str(v) for k, v in files.items() if isinstance(k, str) and isinstance(v, str)}


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
        self, fingerprint: str, key_prefix: str, files: Mapping[str, str] | None = None, *, store: bool = True
    ) -> TaskSpec:
        """The worker-side handle for one task (``files``: what its fingerprint covers;
        ``store``: whether this task writes its result; False for all but one of the tasks
        of a graph that share a fingerprint)."""
        return TaskSpec(
            str(self.root), fingerprint, key_prefix, tuple(sorted(files.items())) if files else (), store, self.host
        )

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
        with self.lock:
            pending, self._pending = self._pending, []
        rows = []
        # Equal tasks share one stored result: read each fingerprint's ref and entry once.
        seen: dict[tuple[str, bool, str | None], tuple[dict[str, Any], dict[str, str]]] = {}
        for p in pending:
            once = seen.get((p.fingerprint, p.hit, p.entry))
            if once is None:
                once = seen[(p.fingerprint, p.hit, p.entry)] = self._details(p)
            details, recorded = once
            # What the result was made from, then what the fingerprint covered now (equal
            # wherever both name a file, since the fingerprint embeds the digests).
            files = {**recorded, **(p.files or {})}
            rows.append(TaskLogRow(fingerprint=p.fingerprint, key_prefix=p.key_prefix, hit=p.hit, file_inputs=files, **details))
        return rows

    def _details(self, p: _Pending) -> tuple[dict[str, Any], dict[str, str]]:
        """A drained row's columns read from the store, and the files its stored result records."""
        details: dict[str, Any] = {"result_digest": p.entry}
        recorded: dict[str, str] = {}
        try:
            entry = p.entry if p.hit else self.objects.ref_get(REF_NAMESPACE, p.fingerprint)
            if entry is not None:
                _, meta = read_entry(self.objects, entry)
                details = {"result_digest": entry, "nbytes": meta.get("nbytes")}
                if not p.hit:
                    details.update(duration=meta.get("duration"), worker=meta.get("worker"))
                recorded = _recorded_files(meta)
        except (NbrewindError, OSError, ValueError):
            pass  # the row stays, without the details
        return details, recorded

    def file_inputs(self, rows: Iterable[TaskLogEntry]) -> dict[str, str]:
        """The local files the tasks of ``rows`` depend on: absolute path -> content digest
        (`nbrewind.identity.files.file_digest`'s), for a cell key's ``@file:`` inputs.

        Rows from :meth:`drain_log` carry them; for any other entry (one read back from
        the catalog) they are read from the stored result's record. When two rows disagree
        about a file (it changed between two submissions of one cell), the last row's
        digest is kept.
        """
        out: dict[str, str] = {}
        for row in rows:
            files = row.file_inputs if isinstance(row, TaskLogRow) else None
            if files is None:
                digest = row.result_digest
                files = {}
                if isinstance(digest, str):
                    try:
                        files = _recorded_files(read_entry(self.objects, digest)[1])
                    except (NbrewindError, OSError, ValueError):
                        pass
            out.update(files)
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
