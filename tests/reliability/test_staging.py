"""Issue 13, item 1: what a checkpoint staged is what gets written, whatever the next cell does.

Store level: real files, real threads. Kernel level: a real audit kernel on a numpy and
pandas notebook that edits its arrays and DataFrames in place right after each
checkpoint; every cell is recorded, no NBRewind warning is printed, and a repeat
shows what a plain python3 kernel shows.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
from pathlib import Path

import numpy as np
import pytest

from nbrewind.errors import ChangedWhileStagedError, ObjectNotFoundError
from nbrewind.store import Store, verify_store
from nbrewind.store.objects import BLOB_CHUNK_SIZE, ObjectStore
from nbrewind.store.snapshot import SnapshotError
from reliability_tools import Kernel, inplace_cells, nbrewind_lines

CHUNK = BLOB_CHUNK_SIZE


@pytest.fixture
def objects(tmp_path: Path) -> ObjectStore:
    return ObjectStore(tmp_path / "store")


def chunk_files(objects: ObjectStore) -> set[str]:
    return set(objects.iter_digests())


@pytest.mark.parametrize(("chunks", "how"), [(3, "copy"), (6, "snapshot")])
def test_every_edit_after_protection_leaves_the_staged_bytes_to_be_written(objects: ObjectStore, chunks: int, how: str) -> None:
    """In place, reversed, dropped: once protected (below 8 MiB by a copy, above by a
    forked snapshot), the commit writes the content as it was staged."""
    original = np.random.default_rng(0).random(chunks * CHUNK // 8)
    a = original.copy()
    staged = objects.stage_blob(a)
    assert objects.held_bytes == a.nbytes  # every chunk was new
    assert objects.protect([staged]) == how
    a[::2] += 1.0
    a[:] = a[::-1]
    del a
    gc.collect()
    objects.commit(staged)
    assert np.array_equal(np.frombuffer(objects.get_blob(staged.digest), dtype=np.float64), original)
    assert objects.held_bytes == 0


def test_an_unprotected_view_that_changed_is_refused(objects: ObjectStore) -> None:
    """Without `protect` the chunks are still the caller's memory: a change is caught by the
    commit's re-hash and nothing is stored under the old name."""
    data = bytearray(os.urandom(2 * CHUNK))
    staged = objects.stage_blob(data)
    data[7] ^= 0xFF
    with pytest.raises(ChangedWhileStagedError):
        objects.commit(staged)
    assert not objects.has(staged.digest)
    assert objects.held_bytes == 0


def test_only_missing_chunks_are_held(objects: ObjectStore) -> None:
    a = np.random.default_rng(1).random(4 * CHUNK // 8)
    objects.commit(objects.stage_blob(a))
    a[:10] = -1.0  # one chunk changes
    staged = objects.stage_blob(a)
    assert staged.new_bytes == CHUNK and objects.held_bytes == CHUNK
    assert objects.protect([staged]) == "copy"
    objects.commit(staged)
    assert objects.held_bytes == 0


def test_a_chunk_staged_twice_is_held_once_and_written_by_whichever_commit_comes(objects: ObjectStore) -> None:
    """The later blob never assumes the earlier one's write: dropped without a commit, the
    earlier blob leaves the later one to write the shared chunk itself."""
    a = np.random.default_rng(2).random(2 * CHUNK // 8)
    b = a.copy()
    first = objects.stage_blob(a)
    second = objects.stage_blob(b)  # same content: shares the held chunks
    assert second.digest == first.digest and objects.held_bytes == a.nbytes
    objects.protect([first, second])
    del first
    gc.collect()
    assert objects.held_bytes == a.nbytes  # still claimed by the second
    assert chunk_files(objects) == set()
    b[:] = 0.0
    objects.commit(second)
    assert np.array_equal(np.frombuffer(objects.get_blob(second.digest)), a)
    assert objects.held_bytes == 0


def test_an_uncommitted_staging_gives_its_claims_back(objects: ObjectStore) -> None:
    staged = objects.stage_blob(np.ones(3 * CHUNK // 8) * 7)
    objects.protect([staged])
    assert objects.held_bytes > 0
    del staged
    gc.collect()
    assert objects.held_bytes == 0


def test_the_budget_bounds_what_is_held_by_writing_at_once(tmp_path: Path) -> None:
    """Past the staging budget a chunk is written (and fsynced) during staging instead of held."""
    objects = ObjectStore(tmp_path / "store", staging_budget=2 * CHUNK)
    data = np.random.default_rng(3).random(5 * CHUNK // 8)
    staged = objects.stage_blob(data)
    assert objects.held_bytes == 2 * CHUNK
    assert len(chunk_files(objects)) == 3  # the three that did not fit are already on disk
    assert staged.new_bytes == data.nbytes
    objects.protect([staged])
    data[:] = 0.0
    objects.commit(staged)
    assert objects.held_bytes == 0
    restored = np.frombuffer(objects.get_blob(staged.digest))
    assert np.array_equal(restored, np.random.default_rng(3).random(5 * CHUNK // 8))


def test_immutable_bytes_need_no_protection(objects: ObjectStore) -> None:
    data = os.urandom(CHUNK + 100)
    staged = objects.stage_blob(data)
    assert objects.protect([staged]) is None
    objects.commit(staged)
    assert objects.get_blob(staged.digest) == data


def test_a_tree_waits_for_chunks_an_earlier_failed_write_did_not_store(objects: ObjectStore) -> None:
    """Chunks in flight are never assumed written: when the writer that held them
    failed, a tree naming them is refused, not written over nothing."""
    a = np.random.default_rng(4).random(2 * CHUNK // 8)
    first = objects.stage_blob(a)
    tree = objects.stage_tree([first.digest])
    del first  # its writer failed: the chunks and the blob tree never reached the disk
    gc.collect()
    with pytest.raises(ObjectNotFoundError):
        objects.commit(tree)
    assert not objects.has(tree.digest)


def test_staging_on_one_thread_while_another_commits(objects: ObjectStore) -> None:
    """The kernel's shape: the main thread stages and protects cell after cell (each editing
    the last one's array) while the writer thread commits them in order."""
    import queue

    jobs: queue.Queue[object] = queue.Queue()
    errors: list[BaseException] = []

    def writer() -> None:
        while (staged := jobs.get()) is not None:
            try:
                objects.commit(staged)  # type: ignore[arg-type]
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    a = np.random.default_rng(5).random(6 * CHUNK // 8)
    expected = {}
    for step in range(8):
        staged = objects.stage_blob(a)
        objects.protect([staged])
        expected[staged.digest] = a.copy()
        jobs.put(staged)
        a[step::3] += 1.0  # the next cell, while the write may still be going on
    jobs.put(None)
    thread.join()
    assert errors == []
    for digest, value in expected.items():
        assert np.array_equal(np.frombuffer(objects.get_blob(digest)), value)
    assert objects.held_bytes == 0


def test_the_disk_probe_measures_and_leaves_nothing_behind(objects: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's figure follows the disk: with every fsync 50 ms slower, 2 MiB writes
    (a file and a folder fsync each) cannot go faster than 2 MiB per 0.1 s."""
    fast = objects.probe_write_rate()
    assert fast > 0
    real = os.fsync

    def slow(fd: int) -> None:
        import time

        time.sleep(0.05)
        real(fd)

    monkeypatch.setattr(os, "fsync", slow)
    assert objects.probe_write_rate() <= CHUNK / 0.1
    assert list(objects.iter_temp_files()) == [] and list(objects.iter_digests()) == []


# -- the snapshot writer: a forked child ------------------------------------------------------


def children_of(pid: int) -> set[int]:
    """Live child processes of `pid`, from /proc."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.add(int(entry.name))
    return found


@pytest.fixture
def slow_writes(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Chunk writes wait for this event (a forked child inherits the patch, not the event's
    later state: it waits its full timeout, 1 s a chunk)."""
    gate = threading.Event()
    original = ObjectStore._write_chunk

    def slow(self: ObjectStore, digest: str, piece: object, verify: bool = False) -> int:
        gate.wait(1.0)
        return original(self, digest, piece, verify)  # type: ignore[arg-type]

    monkeypatch.setattr(ObjectStore, "_write_chunk", slow)
    return gate


def test_a_killed_snapshot_writer_fails_the_commit_and_stores_nothing_wrong(
    objects: ObjectStore, slow_writes: threading.Event
) -> None:
    value = np.random.default_rng(6).random(8 * CHUNK // 8)
    before = children_of(os.getpid())
    staged = objects.stage_blob(value)
    assert objects.protect([staged]) == "snapshot"
    (child,) = children_of(os.getpid()) - before
    os.kill(child, signal.SIGKILL)
    with pytest.raises(SnapshotError, match="died|ended"):
        objects.commit(staged)
    assert not objects.has(staged.digest)
    assert verify_store_objects(objects)
    assert objects.held_bytes == 0
    # Staging the same value again (the next cell re-stores what was lost) works.
    slow_writes.set()  # before the fork: this child writes at full speed
    again = objects.stage_blob(value)
    objects.protect([again])
    objects.commit(again)
    assert np.array_equal(np.frombuffer(objects.get_blob(again.digest)), value)


def test_the_snapshot_writer_ignores_interrupts(objects: ObjectStore, slow_writes: threading.Event) -> None:
    """jupyter_client interrupts and terminates the kernel's whole process group: the
    snapshot writer finishes its checkpoint all the same."""
    value = np.random.default_rng(7).random(5 * CHUNK // 8)
    before = children_of(os.getpid())
    staged = objects.stage_blob(value)
    assert objects.protect([staged]) == "snapshot"
    (child,) = children_of(os.getpid()) - before
    os.kill(child, signal.SIGINT)
    os.kill(child, signal.SIGTERM)
    objects.commit(staged)
    assert np.array_equal(np.frombuffer(objects.get_blob(staged.digest)), value)


def test_the_snapshot_writer_dies_with_its_parent(tmp_path: Path) -> None:
    """A kernel killed with SIGKILL leaves no writer behind (PR_SET_PDEATHSIG)."""
    import subprocess
    import sys
    import time

    script = f"""
import os, sys, time, numpy as np
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from nbrewind.store.objects import ObjectStore
original = ObjectStore._write_chunk
def slow(self, *args, **kwargs):
    time.sleep(5)
    return original(self, *args, **kwargs)
ObjectStore._write_chunk = slow
objects = ObjectStore({str(tmp_path / "store")!r})
staged = objects.stage_blob(np.random.default_rng(8).random({6 * CHUNK // 8}))
print(objects.protect([staged]), flush=True)
time.sleep(600)
"""
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "snapshot"
        children = children_of(parent.pid)
        assert len(children) == 1
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
    (child,) = children
    deadline = time.monotonic() + 60
    while Path(f"/proc/{child}").exists() and "Z" not in _state(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists() or "Z" in _state(child), "the snapshot writer outlived its parent"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def verify_store_objects(objects: ObjectStore) -> bool:
    """Every object file in the store hashes to its name."""
    for digest in objects.iter_digests():
        objects.verify(digest)
    return True


# -- a real audit kernel -----------------------------------------------------------------


@pytest.mark.kernel
def test_an_audit_with_in_place_edits_records_every_cell_without_a_warning(
    tmp_path: Path, kernel_env: dict[str, str]
) -> None:
    """The issue's notebook shape: before the fix this recorded 2 of these 10 cells and
    printed a warning per lost one."""
    cells = inplace_cells(120)
    store = Path(kernel_env["NBREWIND_STORE"])
    audit = Kernel("nbrewind-audit", tmp_path, kernel_env, tmp_path / "audit.err", shutdown_wait=60).start()
    try:
        audited = audit.run(cells)
        audit.shutdown()
    finally:
        audit.close()
    assert nbrewind_lines(audit.stderr()) == []
    with Store.open(store, create=False) as opened:
        runs = opened.catalog.cell_runs()
        assert verify_store(opened).ok
    assert [r.code for r in runs] == cells
    assert all(r.checkpoint_id is not None for r in runs)

    plain_env = {k: v for k, v in kernel_env.items() if k != "NBREWIND_STORE"}
    plain = Kernel("python3", tmp_path, plain_env, tmp_path / "plain.err").start()
    try:
        expected = plain.run(cells)
    finally:
        plain.close()
    assert audited == expected
    # A repeat of the notebook with its last cell edited: nine replays, whose values the
    # edited cell then reads from the store, and the same output as python3.
    edited = [*cells[:-1], cells[-1] + "\nprint(round(float(a[::3].sum()), 3))"]
    plain = Kernel("python3", tmp_path, plain_env, tmp_path / "plain.err").start()
    try:
        expected = plain.run(edited)
    finally:
        plain.close()
    repeat = Kernel("nbrewind-repeat", tmp_path, kernel_env, tmp_path / "repeat.err", shutdown_wait=60).start()
    try:
        repeated = repeat.run(edited)
        repeat.shutdown()
    finally:
        repeat.close()
    assert repeated == expected
    assert nbrewind_lines(repeat.stderr()) == []
    with Store.open(store, create=False) as opened:
        newest = opened.catalog.cell_runs()[len(cells) :]
    assert [r.decision for r in newest] == ["replayed"] * (len(cells) - 1) + ["executed"]
