"""What a rewritten graph runs on the workers: a missed task that stores its result,
a cached task that loads it.

Both open the store by absolute path (once per process) and never let a cache
problem fail the user's task. A graph sent to a distributed scheduler carries a
:class:`~nbrewind.tasks.remote.StoreLink` in each :class:`TaskSpec`; a worker
that finds it cannot see the store (``remote.py``, once per process) hands its
results to the kernel and asks the kernel for cached ones instead.

Writes are cheap: of the tasks of a graph that share a fingerprint only one
stores (``TaskSpec.store``), and a worker on the client's machine writes without
fsync (``nbrewind.store.fsio.deferred_sync``). That is safe because nothing
replayable names a result until the committer's durability barrier
(``ObjectStore.barrier``, one ``syncfs``) has run: a ref written before a crash
can name a lost entry, and ``TaskCache.lookup`` then sees it unsound and
misses. A worker on another machine fsyncs each write as before.
Nothing here imports dask at module level.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbrewind.store import ObjectStore
from nbrewind.store.fsio import deferred_sync
from nbrewind.tasks.remote import (
    Abandoned,
    StoreLink,
    hidden_roots,
    request_entry,
    sees_store,
    stash_result,
)
from nbrewind.tasks.reads import READS_REFS, covered_by, digest_reads, recording_reads
from nbrewind.tasks.results import TaskCacheError, load_entry, store_result

__all__ = ["REF_NAMESPACE", "TaskSpec", "compute_and_store", "load_result", "object_store"]

REF_NAMESPACE = "tasks"

logger = logging.getLogger(__name__)


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
    link: StoreLink | None = None
    """Set in graphs sent to a distributed scheduler: how a worker that cannot see the
    store reaches it through the kernel (``remote.py``)."""


_stores: dict[str, ObjectStore] = {}


def object_store(root: str) -> ObjectStore:
    """The object area of the store at ``root``, opened once per process.

    Raises TaskCacheError where ``root`` was found to be no view of the kernel's
    store (`remote.sees_store`): nothing may be read or written there.
    """
    if root in hidden_roots:
        raise TaskCacheError(f"the store {root} is not visible from this worker")
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


def load_result(spec: TaskSpec, entry: str, fallback: tuple[dict[Hashable, Any], Hashable] | None) -> Any:
    """Graph task for a cache hit: the stored result, or on any failure the recomputed one.

    ``fallback`` holds the original task and the upstream work the rewrite culled
    (or None when that was too large to ship); it runs only if loading fails.
    """
    try:
        link = spec.link
        if link is not None and not sees_store(spec.root, link):
            return request_entry(link, entry)
        return load_entry(object_store(spec.root), entry)
    except Abandoned:
        raise  # cancelled while waiting for the kernel: nobody wants a recomputed value
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
    with recording_reads(skip=(spec.root,)) as reads:
        value = execute_graph(graph, keys=[key])[key]  # type: ignore[list-item,index]
    _try_store(spec, value, time.perf_counter() - started, reads)
    return value


def compute_and_store(spec: TaskSpec, func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Graph task for a cache miss: run the task, then store its result by fingerprint,
    with what it read from the local disk (`nbrewind.tasks.reads`)."""
    sees_store(spec.root, spec.link)  # before the task runs: checkpoints inside it need to know
    started = time.perf_counter()
    if not spec.store:
        return func(*args, **kwargs)
    with recording_reads(skip=(spec.root,)) as reads:
        value = func(*args, **kwargs)
    _try_store(spec, value, time.perf_counter() - started, reads)
    return value


def _try_store(spec: TaskSpec, value: object, duration: float, reads: Any = None) -> None:
    if not spec.store:
        return
    if reads is not None and reads.written:
        # It wrote files: a hit would return its value and leave them unwritten.
        return
    record: dict[str, Any] = {
        "duration": duration, "worker": _where(), "host": socket.gethostname(), "key_prefix": spec.key_prefix,
    }
    if spec.files:
        record["files"] = dict(spec.files)
    read = digest_reads(reads) if reads is not None else None
    if read is not None and covered_by(read, spec.files):
        read = None  # it read only files its fingerprint names (`clean(path)`): nothing more to check
    if read is not None:
        record["reads"] = read
    try:
        link = spec.link
        if link is not None and not sees_store(spec.root, link):
            stash_result(link, spec.fingerprint, value, record)
            return
        objects = object_store(spec.root)
        with deferred_sync(objects.root) if spec.host == record["host"] else contextlib.nullcontext():
            entry, _ = store_result(objects, value, record)
            if read is not None:  # before the result's own ref: a lookup that finds it checks the reads
                objects.ref_set(READS_REFS, spec.fingerprint, entry)
            objects.ref_set(REF_NAMESPACE, spec.fingerprint, entry)
    except Exception:  # unpicklable result, full disk, read-only store: the task still succeeds
        return
