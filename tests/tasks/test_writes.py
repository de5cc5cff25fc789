"""What task results cost to write: one result per fingerprint, no fsync per object, and
one durability barrier before the catalog rows that name them (real store, real files)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

dask = pytest.importorskip("dask")
da = pytest.importorskip("dask.array")

from nbrewind.store import CellRun, ObjectStore, Store  # noqa: E402
from nbrewind.store import fsio  # noqa: E402
from nbrewind.store.secret import user_keys  # noqa: E402
from nbrewind.tasks.cache import REF_NAMESPACE, TaskCache, TaskSpec, compute_and_store  # noqa: E402
from nbrewind.tasks.intercept import intercepting  # noqa: E402


class Syncs:
    """Counts `os.fsync` calls and whole-filesystem syncs (the barrier's)."""

    def __init__(self) -> None:
        self.fsyncs = 0
        self.syncfs = 0


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Syncs]:
    counts = Syncs()
    real_fsync, real_syncfs = os.fsync, fsio._syncfs

    def fsync(fd: int) -> None:
        counts.fsyncs += 1
        real_fsync(fd)

    def syncfs(fd: int) -> None:
        counts.syncfs += 1
        real_syncfs(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(fsio, "_syncfs", syncfs)
    yield counts


def _ready(tmp_path: Path, syncs: Syncs) -> TaskCache:
    """A task cache whose store and user secret exist, with the sync counts zeroed."""
    cache = TaskCache(tmp_path / "store")
    cache.objects
    user_keys()
    syncs.fsyncs = syncs.syncfs = 0
    return cache


def _files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")]


def test_tasks_sharing_a_fingerprint_write_one_result_and_one_ref(tmp_path: Path, syncs: Syncs) -> None:
    cache = _ready(tmp_path, syncs)
    x = da.ones((400,), chunks=4) + 1  # 100 equal chunks: 100 tasks, one fingerprint
    objects_before = len(_files(tmp_path / "store" / "objects"))
    with intercepting(cache):
        assert float(x.sum().compute(scheduler="threads")) == 800.0
    rows = cache.drain_log()
    misses = [r for r in rows if not r.hit]
    assert len(misses) > 100 and len({r.fingerprint for r in misses}) < 10
    refs = _files(tmp_path / "store" / "refs" / REF_NAMESPACE)
    assert len(refs) == len({r.fingerprint for r in misses})
    # Each fingerprint: an entry tree and its pickle (equal pickles dedupe further).
    assert len(_files(tmp_path / "store" / "objects")) - objects_before <= 2 * len(refs)
    assert {r.result_digest for r in misses} and None not in {r.result_digest for r in misses}
    assert syncs.fsyncs == 0  # the client's own machine: no fsync per object
    assert cache.objects.barrier() and syncs.syncfs == 1
    assert not cache.objects.barrier() and syncs.syncfs == 1  # nothing new to sync


def test_a_worker_on_another_machine_fsyncs_each_write(tmp_path: Path, syncs: Syncs) -> None:
    cache = _ready(tmp_path, syncs)
    here = cache.spec("0" * 32, "t")
    assert here.host == socket.gethostname()
    compute_and_store(here, lambda: 1)
    assert syncs.fsyncs == 0
    elsewhere = TaskSpec(here.root, "1" * 32, "t", host="another-host")
    compute_and_store(elsewhere, lambda: 2)
    assert syncs.fsyncs >= 3  # the pickle, the entry and the ref, each with its fsync


def test_a_duplicate_stores_nothing(tmp_path: Path) -> None:
    cache = TaskCache(tmp_path / "store")
    spec = cache.spec("2" * 32, "t", store=False)
    assert compute_and_store(spec, lambda: 5) == 5
    assert cache.lookup("2" * 32) is None


def test_the_barrier_covers_an_object_a_durable_put_found_present(tmp_path: Path, syncs: Syncs) -> None:
    """The deduplication trap: a task writes an object without fsync; a checkpoint's put of the
    same bytes finds it present and writes nothing, so the barrier must still sync it, even
    when the writer's marker has not landed yet (it is written after the rename)."""
    objects = ObjectStore(tmp_path / "store")
    objects.put(b"durable")
    assert not objects.barrier()  # nothing deferred: nothing to sync
    real_note = fsio._note_deferred
    try:
        fsio._note_deferred = lambda root: None  # type: ignore[assignment]  # the marker lags
        with fsio.deferred_sync(objects.root):
            digest = objects.put(b"a task result")
    finally:
        fsio._note_deferred = real_note  # type: ignore[assignment]
    assert fsio.is_deferred_mode(objects.path_of(digest).stat().st_mode)
    assert not objects.barrier()  # without the put below, only the marker would tell
    before = syncs.fsyncs
    assert objects.put(b"a task result") == digest  # present: nothing written, nothing fsynced
    assert syncs.fsyncs == before
    assert objects.barrier() and syncs.syncfs == 1
    assert not objects.barrier()


def test_the_marker_tells_the_barrier_of_another_process_writes(tmp_path: Path, syncs: Syncs) -> None:
    import subprocess
    import sys

    objects = ObjectStore(tmp_path / "store")
    objects.put(b"x")
    assert not objects.barrier()
    code = (
        "import sys; from pathlib import Path; from nbrewind.store import ObjectStore, fsio\n"
        "o = ObjectStore(Path(sys.argv[1]))\n"
        "with fsio.deferred_sync(o.root):\n    o.put(b'written by a worker process')\n"
    )
    subprocess.run([sys.executable, "-c", code, str(objects.root)], check=True)
    assert objects.barrier() and syncs.syncfs == 1
    assert not objects.barrier()


def _deferred_put_in_another_process(root: Path, content: bytes, *, barrier: bool) -> None:
    import subprocess
    import sys

    code = (
        "import sys; from pathlib import Path; from nbrewind.store import ObjectStore, fsio\n"
        "o = ObjectStore(Path(sys.argv[1]))\n"
        "with fsio.deferred_sync(o.root):\n    o.put(sys.argv[2].encode())\n"
        "if sys.argv[3] == 'barrier':\n    assert o.barrier()\n"
    )
    subprocess.run([sys.executable, "-c", code, str(root), content.decode(), "barrier" if barrier else "-"], check=True)


def test_a_new_process_trusts_the_sync_another_process_noted(tmp_path: Path, syncs: Syncs) -> None:
    """The next kernel on a store does not sync again for task results an earlier kernel's
    barrier already made durable; a write after that barrier, or a copied store, syncs."""
    objects = ObjectStore(tmp_path / "store")
    _deferred_put_in_another_process(objects.root, b"result one", barrier=True)
    assert (objects.root / fsio.SYNCED_NOTE).is_file()
    assert not objects.barrier() and syncs.syncfs == 0
    _deferred_put_in_another_process(objects.root, b"result two", barrier=False)
    assert objects.barrier() and syncs.syncfs == 1  # written after the noted sync
    assert not objects.barrier() and syncs.syncfs == 1

    import shutil

    copy = ObjectStore(Path(shutil.copytree(objects.root, tmp_path / "copy")))
    assert (copy.root / fsio.SYNCED_NOTE).is_file()  # names the original marker's inode
    assert copy.barrier() and syncs.syncfs == 2  # the copy's writes were never synced


def test_a_damaged_sync_note_means_a_sync(tmp_path: Path, syncs: Syncs) -> None:
    objects = ObjectStore(tmp_path / "store")
    _deferred_put_in_another_process(objects.root, b"result", barrier=True)
    (objects.root / fsio.SYNCED_NOTE).write_text("not a state")
    assert objects.barrier() and syncs.syncfs == 1
    assert (objects.root / fsio.SYNCED_NOTE).read_text().split() == [
        str(v) for v in fsio._marker_state(objects.root) or ()
    ]


def test_a_lost_deferred_entry_is_a_miss_not_a_hit(tmp_path: Path) -> None:
    """Power lost before the barrier: a ref that survived may name an emptied entry."""
    cache = TaskCache(tmp_path / "store")
    x = da.ones((8,), chunks=4) + 1
    with intercepting(cache):
        x.sum().compute(scheduler="sync")
    rows = cache.drain_log()
    entry = next(r.result_digest for r in rows if r.result_digest)
    path = cache.objects.path_of(entry)
    os.chmod(path, 0o644)
    path.write_bytes(b"")
    fp = next(r.fingerprint for r in rows if r.result_digest == entry)
    assert cache.lookup(fp) is None


def test_the_committer_syncs_before_it_writes_the_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nbrewind.session.commit import Committer
    from nbrewind.session.writer import BackgroundWriter

    store = Store.open(tmp_path / "store", create=True)
    cache = TaskCache(tmp_path / "store")
    with intercepting(cache):
        (da.ones((40,), chunks=4) + 1).sum().compute(scheduler="threads")
    tasks = cache.drain_log()
    seen: list[tuple[int, bool]] = []
    real = ObjectStore.barrier

    def barrier(self: ObjectStore) -> bool:
        synced = real(self)
        seen.append((len(store.catalog.task_log()), synced))
        return synced

    monkeypatch.setattr(ObjectStore, "barrier", barrier)
    writer = BackgroundWriter()
    committer = Committer(writer)
    run: Any = CellRun(session="s", execution_count=1, code="x", code_digest="0" * 32)
    committer.submit(store, cache, run, {}, [], 0, tasks)
    writer.flush()
    assert seen == [(0, True)]  # synced, and no row yet
    assert len(store.catalog.task_log()) == len(tasks)
    store.close()
