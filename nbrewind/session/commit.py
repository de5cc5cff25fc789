"""Committing a cell run: its objects first, then its catalog rows, on the background writer.

Everything a catalog row points at is durable before the row exists, so a crash at
any moment leaves no row that trusts an unwritten object. The writer thread owns
the checkpoint chain (each checkpoint names its parent) and reports back which
names' objects did not reach the disk; the main thread takes that at the start
of the next cell (`take_lost`), so no state of the session is changed from the
writer thread.

A replayed cell's record (it stages nothing and logs no task) is batched: consecutive
replays share one lazy writer job (`BackgroundWriter.submit(lazy=True)`) that commits
their records in one transaction once the kernel is idle, before the next cell that
runs is committed, or when anyone flushes (shutdown, `jupyter nbrewind run`, the
magics, a forecast). A kill before then loses only those records, never a replayable
run: a replay's record is a second record of a run the catalog already holds, and the
batch is one transaction, so the catalog holds all of it or none.
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


@dataclasses.dataclass
class _Record:
    """A replay's record waiting in a batch: the run and its full checkpoint."""

    run: CellRun
    entries: dict[str, Any]


@dataclasses.dataclass
class _Batch:
    """Replay records that one lazy writer job commits together, in order."""

    store: Store
    records: list[_Record]


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
        # The batch of replay records still open to more (main thread, under the lock): closed
        # by the writer job taking it, or by an eager commit queued behind it.
        self._batch: _Batch | None = None

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
        if not staged and not tasks and run.decision == "replayed":
            self._submit_replay(store, _Record(run, entries))
            return
        store.objects.protect(list(_blobs(staged)))
        if nbytes and not self._calibrated:
            # Measured before the first job that writes (a replay writes nothing to measure).
            self._calibrated = True
            self.writer.calibrate(store.objects.probe_write_rate)
        job = functools.partial(self._commit, store, task_cache, run, entries, staged, tasks)
        with self._lock:
            self._batch = None  # replays after this commit go in a batch of their own, after it
        # Not under the lock: a submit may wait for the writer, which takes the lock.
        self.writer.submit(job, nbytes, rows=len(tasks))

    def _submit_replay(self, store: Store, record: _Record) -> None:
        """Add a replay's record to the open batch, or open one with a lazy writer job."""
        with self._lock:
            batch = self._batch
            if batch is not None and batch.store is store:
                batch.records.append(record)
                batch = None
            else:
                batch = self._batch = _Batch(store, [record])
        if batch is None:
            self.writer.touch()
        else:
            self.writer.submit(functools.partial(self._commit_batch, batch), lazy=True)

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

    def _commit_batch(self, batch: _Batch) -> None:
        """Commit a batch of replay records in one transaction, each checkpoint the parent
        of the next (writer thread). A record whose objects are not on disk is left out
        (its names are stored again by the next cell that runs, as for any commit)."""
        with self._lock:
            if self._batch is batch:
                self._batch = None  # closed: later replays open a new batch
            records = list(batch.records)
            parent = self._parent
        store = batch.store
        objects, catalog = store.objects, store.catalog
        known = self._present
        seen: set[str] = set()
        lost: set[str] = set()
        kept: list[_Record] = []
        for record in records:
            missing = set()
            for name, (digest, _) in record.entries.items():
                if digest == ABSENT or digest in known or digest in seen:
                    continue
                if objects.has(digest):
                    seen.add(digest)
                else:
                    missing.add(name)
            if missing:
                lost |= missing
            else:
                kept.append(record)
        if lost:
            with self._lock:
                self._lost |= lost
        if kept:
            objects.barrier()  # objects a put found present, as before any catalog row
            with catalog.transaction():
                for record in kept:
                    run_id = catalog.add_cell_run(record.run)
                    parent = catalog.add_checkpoint(run_id, parent, record.entries)
                    catalog.set_cell_run_checkpoint(run_id, parent)
            with self._lock:
                self._parent = parent
            known |= seen
        if lost:
            raise ObjectNotFoundError(f"objects of {', '.join(sorted(lost))} were not written")


def _blobs(staged: list[Any]) -> Iterator[StagedBlob]:
    """The staged blobs in commit order: a group is its blobs, then its tree (as StagedGroup.commit)."""
    for item in staged:
        if isinstance(item, StagedGroup):
            yield from item.blobs
            yield item.tree
        else:
            yield item
