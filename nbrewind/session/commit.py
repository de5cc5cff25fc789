"""Committing a cell run: its objects first, then its catalog rows, on the background writer.

Everything a catalog row points at is durable before the row exists, so a crash at
any moment leaves no row that trusts an unwritten object. The writer thread owns
the checkpoint chain (each checkpoint names its parent) and reports back which
names' objects did not reach the disk; the main thread takes that at the start
of the next cell (`take_lost`), so no state of the session is changed from the
writer thread.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from nbrewind.checkpoint.values import StagedGroup
from nbrewind.errors import ObjectNotFoundError
from nbrewind.session.pseudo import ABSENT
from nbrewind.session.writer import BackgroundWriter
from nbrewind.store import CellRun, Store, TaskLogEntry
from nbrewind.store.objects import StagedBlob
from nbrewind.tasks.cache import TaskCache

__all__ = ["Committer"]


class Committer:
    """Queues cell runs on a `BackgroundWriter` and keeps the checkpoint chain."""

    def __init__(self, writer: BackgroundWriter) -> None:
        self.writer = writer
        self._lock = threading.Lock()
        self._parent: int | None = None
        self._lost: set[str] = set()
        self._calibrated = False
        # Digests found on disk by an earlier commit whose checkpoint names them: the catalog
        # keeps them reachable, so gc leaves them, and they need no second look (writer thread).
        self._present: set[str] = set()

    def submit(
        self,
        store: Store,
        task_cache: TaskCache | None,
        run: CellRun,
        entries: dict[str, Any],
        staged: list[Any],
        nbytes: int,
        tasks: Sequence[TaskLogEntry],
    ) -> None:
        """Queue one cell run: ``entries`` (name -> (digest, meta)) is its full checkpoint;
        ``nbytes`` is what its staged objects hold until they are written.

        Called before the kernel replies: the staged chunks are snapshotted or copied
        here (``ObjectStore.protect``), so the next cell may change every value at once.
        """
        store.objects.protect(list(_blobs(staged)))
        if not self._calibrated:
            self._calibrated = True
            self.writer.calibrate(store.objects.probe_write_rate)
        job = functools.partial(self._commit, store, task_cache, run, entries, staged, tasks)
        self.writer.submit(job, nbytes, rows=len(tasks))

    def rebase(self, checkpoint_id: int | None) -> None:
        """Make ``checkpoint_id`` the parent of the next checkpoint (after `%nbrewind restore`)."""
        self.writer.flush()  # a queued commit must not chain onto the state being left
        with self._lock:
            self._parent = checkpoint_id

    def take_lost(self) -> set[str]:
        """Names whose objects the writer could not store since the last call: the next
        checkpoint must store them again (main thread)."""
        with self._lock:
            lost, self._lost = self._lost, set()
        return lost

    def _commit(
        self,
        store: Store,
        task_cache: TaskCache | None,
        run: CellRun,
        entries: dict[str, Any],
        staged: list[Any],
        tasks: Sequence[TaskLogEntry],
    ) -> None:
        objects = store.objects
        lost: set[str] = set()
        progress = self.writer.advance
        try:
            # Each blob reports progress, so the writer's backlog shrinks while a large cell is written.
            for blob in _blobs(staged):
                objects.commit(blob, progress=progress)
        finally:
            # Names whose objects are not on disk (this write failed, or an earlier one
            # this checkpoint builds on) must be stored again by the next cell.
            known = self._present
            lost = {n for n, (digest, _) in entries.items() if digest != ABSENT and digest not in known and not objects.has(digest)}
            if lost:
                with self._lock:
                    self._lost |= lost
        if lost:
            raise ObjectNotFoundError(f"objects of {', '.join(sorted(lost))} were not written")
        catalog = store.catalog
        with self._lock:
            parent = self._parent
        objects.barrier()  # task results (written without fsync) and objects a put found present
        with catalog.transaction():
            run_id = catalog.add_cell_run(run)
            checkpoint_id = catalog.add_checkpoint(run_id, parent, entries)
            catalog.set_cell_run_checkpoint(run_id, checkpoint_id)
            if tasks and task_cache is not None:
                catalog.log_tasks([dataclasses.replace(row, cell_run_id=run_id) for row in tasks])
        with self._lock:
            self._parent = checkpoint_id
        self._present.update(digest for digest, _ in entries.values() if digest != ABSENT)


def _blobs(staged: list[Any]) -> Iterator[StagedBlob]:
    """The staged blobs in commit order: a group is its blobs, then its tree (as StagedGroup.commit)."""
    for item in staged:
        if isinstance(item, StagedGroup):
            yield from item.blobs
            yield item.tree
        else:
            yield item
