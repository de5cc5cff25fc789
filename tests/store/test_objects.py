"""The object area: naming, framing, verification, trees, blobs, refs and faults."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from nbrewind.errors import (
    CorruptObjectError,
    NotATreeError,
    ObjectNotFoundError,
    ReadOnlyStoreError,
    StoreFullError,
)
from nbrewind.store import BLOB_CHUNK_SIZE, ObjectStore, Store, digest_bytes
from nbrewind.store import fsio, frame

MiB = 1024 * 1024


def _codec_on_disk(objects: ObjectStore, digest: str) -> int:
    return objects.path_of(digest).read_bytes()[5]


def _all_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _damage(path: Path, offset: int) -> None:
    os.chmod(path, 0o644)
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))


def test_put_get_roundtrip_and_layout(store: Store) -> None:
    data = b"some bytes " * 100
    digest = store.objects.put(data)
    assert digest == digest_bytes(data)
    assert store.objects.path_of(digest) == store.root / "objects" / digest[:2] / digest[2:]
    assert store.objects.has(digest)
    assert store.objects.get(digest) == data
    assert list(store.objects.iter_digests()) == [digest]


def test_put_existing_writes_nothing(store: Store) -> None:
    digest = store.objects.put(b"x" * 1000)
    path = store.objects.path_of(digest)
    inode = path.stat().st_ino
    assert store.objects.put(bytearray(b"x" * 1000)) == digest
    assert path.stat().st_ino == inode  # not rewritten


def test_random_floats_stored_raw_zeros_compressed(store: Store) -> None:
    noise = np.random.default_rng(0).random(100_000).tobytes()
    zeros = bytes(800_000)
    d_noise, d_zeros = store.objects.put(noise), store.objects.put(zeros)
    assert _codec_on_disk(store.objects, d_noise) == frame.CODEC_RAW
    assert _codec_on_disk(store.objects, d_zeros) == frame.CODEC_ZSTD
    assert store.objects.stored_size(d_zeros) < 1000
    assert store.objects.get(d_zeros) == zeros
    assert store.objects.logical_size(d_zeros) == len(zeros)
    assert store.objects.logical_size(d_noise) == len(noise)


def test_sample_spans_the_whole_object(store: Store) -> None:
    # Compressible start, random bulk: judged by the bulk, so stored raw.
    data = bytes(16 * 1024) + np.random.default_rng(1).bytes(MiB)
    digest = store.objects.put(data)
    assert _codec_on_disk(store.objects, digest) == frame.CODEC_RAW
    assert store.objects.get(digest) == data


def test_missing_object(store: Store) -> None:
    with pytest.raises(ObjectNotFoundError, match="not in the store"):
        store.objects.get(digest_bytes(b"never stored"))
    with pytest.raises(ValueError, match="not a digest"):
        store.objects.get("../../etc/passwd")


@pytest.mark.parametrize("payload", [b"abc" * 50_000, np.random.default_rng(2).bytes(50_000)])
def test_flipped_bit_is_detected(store: Store, payload: bytes) -> None:
    digest = store.objects.put(payload)
    _damage(store.objects.path_of(digest), offset=frame.HEADER_SIZE + 20)
    with pytest.raises(CorruptObjectError, match=f"{digest}.*audit kernel stores it again.*nbrewind verify"):
        store.objects.get(digest)
    # Moved aside, so storing the same bytes again (re-running the cell) repairs it.
    assert (store.root / "corrupt" / digest).is_file()
    assert not store.objects.has(digest)
    store.objects.put(payload)
    assert store.objects.get(digest) == payload


# Small enough that the put path re-hashes the file and so rewrites the damaged one.
@pytest.mark.parametrize("payload", [b"abc" * 5_000, np.random.default_rng(2).bytes(50_000)])
def test_a_repair_that_lands_while_the_damaged_file_is_read_is_not_moved_aside(
    store: Store, payload: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader found the file damaged; meanwhile the cell that made it ran again and its
    writer stored the same bytes under the same name. Quarantining moves only the file
    the reader judged, never the repair. The interleaving is forced (the repair is made
    from inside the reader's hash check); the store, its files and renames are real."""
    from nbrewind.store import objects as objects_module

    digest = store.objects.put(payload)
    _damage(store.objects.path_of(digest), offset=frame.HEADER_SIZE + 20)
    real_digest, real_decompress = objects_module.digest_bytes, frame.decompress
    repaired: list[str] = []

    def repair() -> None:
        if not repaired:
            repaired.append("")
            monkeypatch.undo()  # the writer's own put hashes for real
            repaired[0] = store.objects.put(payload)  # the damaged file counts as absent: rewritten

    def repair_then_hash(data: bytes | memoryview) -> str:
        repair()
        return real_digest(data)

    def repair_then_decompress(data: bytes) -> bytes:
        repair()
        return real_decompress(data)

    # The reader has the damaged bytes in hand and is about to judge them.
    monkeypatch.setattr(objects_module, "digest_bytes", repair_then_hash)
    monkeypatch.setattr(frame, "decompress", repair_then_decompress)
    with pytest.raises(CorruptObjectError, match=digest) as raised:
        store.objects.get(digest)
    monkeypatch.undo()
    assert repaired == [digest]
    assert "moved to" not in str(raised.value)
    assert store.objects.get(digest) == payload
    assert not (store.root / "corrupt" / digest).exists()


def test_corrupt_object_in_readonly_store_stays_put(store: Store) -> None:
    digest = store.objects.put(b"q" * 5000)
    _damage(store.objects.path_of(digest), offset=frame.HEADER_SIZE + 1)
    with pytest.raises(CorruptObjectError, match=digest):
        ObjectStore(store.root, readonly=True).verify(digest)
    assert store.objects.has(digest) and not (store.root / "corrupt").exists()


@pytest.mark.parametrize("keep", [0, 5, frame.HEADER_SIZE + 3, -1])
@pytest.mark.parametrize("payload", [b"abc" * 50_000, np.random.default_rng(3).bytes(50_000)])
def test_truncated_object_is_detected(store: Store, payload: bytes, keep: int) -> None:
    digest = store.objects.put(payload)
    path = store.objects.path_of(digest)
    os.chmod(path, 0o644)
    os.truncate(path, keep if keep >= 0 else path.stat().st_size + keep)
    with pytest.raises(CorruptObjectError, match=digest):
        store.objects.get(digest)


def test_trees(store: Store) -> None:
    a, b = store.objects.put(b"a" * 10), store.objects.put(b"b" * 10)
    tree = store.objects.put_tree([a, b], b'{"kind":"pair"}')
    assert store.objects.get_tree(tree) == ([a, b], b'{"kind":"pair"}')
    assert store.objects.is_tree(tree)
    assert not store.objects.is_tree(a)
    with pytest.raises(NotATreeError):
        store.objects.get_tree(a)
    with pytest.raises(ValueError, match="not a digest"):
        store.objects.put_tree(["nope"])


def test_put_tree_upgrades_same_bytes_stored_as_plain_object(store: Store) -> None:
    child = store.objects.put(b"child")
    content = b"NBRTREE1\n1\n" + child.encode() + b"\n"
    plain = store.objects.put(content)
    assert not store.objects.is_tree(plain)
    assert store.objects.put_tree([child]) == plain
    assert store.objects.is_tree(plain)


@pytest.mark.parametrize("size", [0, 1, BLOB_CHUNK_SIZE, 2 * BLOB_CHUNK_SIZE + 12345])
def test_blob_roundtrip(store: Store, size: int) -> None:
    data = np.random.default_rng(size).bytes(size)
    digest = store.objects.put_blob(data)
    assert store.objects.blob_size(digest) == size
    out = store.objects.get_blob(digest)
    assert isinstance(out, bytearray) and out == data
    assert len(store.objects.get_tree(digest)[0]) == -(-size // BLOB_CHUNK_SIZE)


def test_blob_accepts_arrays_including_non_contiguous(store: Store) -> None:
    array = np.arange(600_000, dtype=np.float64).reshape(1000, 600)
    assert store.objects.get_blob(store.objects.put_blob(array)) == array.tobytes()
    column = array[:, 3]
    assert store.objects.get_blob(store.objects.put_blob(column)) == column.tobytes()


def test_blob_in_place_edit_stores_only_changed_chunk(store: Store) -> None:
    array = np.random.default_rng(4).random(5 * BLOB_CHUNK_SIZE // 8)
    first = store.objects.put_blob(array)
    before = set(store.objects.iter_digests())
    array[BLOB_CHUNK_SIZE // 8 * 2 + 7] = -1.0  # one value inside chunk 2
    second = store.objects.put_blob(array)
    added = set(store.objects.iter_digests()) - before
    assert second != first
    assert len(added) == 2  # the changed chunk and the new chunk list
    assert store.objects.get_blob(second) == array.tobytes()
    assert store.objects.put_blob(array) == second  # identical re-put


def test_blob_with_corrupt_chunk_raises(store: Store) -> None:
    data = np.random.default_rng(5).bytes(3 * BLOB_CHUNK_SIZE)
    digest = store.objects.put_blob(data)
    chunk = store.objects.get_tree(digest)[0][1]
    _damage(store.objects.path_of(chunk), offset=frame.HEADER_SIZE + 1000)
    with pytest.raises(CorruptObjectError, match=chunk):
        store.objects.get_blob(digest)


def test_refs(store: Store) -> None:
    digest = store.objects.put(b"result")
    assert store.objects.ref_get("tasks", "abc123") is None
    store.objects.ref_set("tasks", "abc123", digest)
    assert store.objects.ref_get("tasks", "abc123") == digest
    assert (store.root / "refs" / "tasks" / "ab" / "abc123").is_file()
    assert list(store.objects.iter_refs("tasks")) == [("abc123", digest)]
    assert store.objects.ref_namespaces() == ["tasks"]
    assert store.objects.ref_delete("tasks", "abc123")
    assert store.objects.ref_get("tasks", "abc123") is None
    with pytest.raises(ValueError):
        store.objects.ref_set("tasks", "../escape", digest)
    with pytest.raises(ValueError):
        store.objects.ref_set("tasks", "ok", "not-a-digest")


def test_readonly_object_store_refuses_writes(store: Store) -> None:
    digest = store.objects.put(b"kept")
    readonly = ObjectStore(store.root, readonly=True)
    assert readonly.get(digest) == b"kept"
    for write in (
        lambda: readonly.put(b"new"),
        lambda: readonly.put_blob(b"new"),
        lambda: readonly.put_tree([digest]),
        lambda: readonly.delete(digest),
        lambda: readonly.ref_set("t", "n", digest),
    ):
        with pytest.raises(ReadOnlyStoreError):
            write()
    assert store.objects.has(digest)


def test_full_disk_leaves_nothing_behind(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    # Fault injection: a real ENOSPC needs a full filesystem. The fake writes
    # half of what it is given, then fails the way write(2) does on a full disk.
    def half_then_enospc(fd: int, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        os.write(fd, view[: len(view) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fsio, "_write_all", half_then_enospc)
    data = np.random.default_rng(6).bytes(3 * BLOB_CHUNK_SIZE)
    with pytest.raises(StoreFullError, match="no space left"):
        store.objects.put(data)
    with pytest.raises(StoreFullError):
        store.objects.put_blob(data)
    assert list(store.objects.iter_digests()) == []
    assert _all_files(store.root / "objects") == []  # no object, no temp file


def test_read_only_filesystem_is_reported(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    # Fault injection of EROFS for machines where a read-only mount is not
    # available; test_processes.py also runs this against a real read-only bind mount.
    real_open = os.open

    def erofs_on_create(path: str | os.PathLike[str], flags: int, *args: int, **kwargs: int) -> int:
        if flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(fsio.os, "open", erofs_on_create)
    with pytest.raises(ReadOnlyStoreError, match="read-only"):
        store.objects.put(b"cannot land")
    monkeypatch.undo()
    assert _all_files(store.root / "objects") == []


def test_interrupt_mid_write_removes_temp(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    # Fault injection: a KeyboardInterrupt arriving while bytes are written.
    def interrupted(fd: int, data: bytes | bytearray | memoryview) -> None:
        os.write(fd, memoryview(data).cast("B")[:10])
        raise KeyboardInterrupt

    monkeypatch.setattr(fsio, "_write_all", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.objects.put(b"y" * 5000)
    assert _all_files(store.root / "objects") == []


def test_bytes_written_counts_only_new_objects(store: Store) -> None:
    """The counter the checkpoint cost report relies on: a re-put adds nothing."""
    objects = store.objects
    before = objects.bytes_written
    data = bytes(range(256)) * 20_000
    objects.put_blob(data)
    first = objects.bytes_written - before
    assert first > 0
    objects.put_blob(data)
    objects.put(b"small")
    assert objects.bytes_written - before - first >= len(b"small")
    again = objects.bytes_written
    objects.put(b"small")
    objects.put_blob(data)
    assert objects.bytes_written == again


def test_staged_blob_changed_before_commit_writes_nothing(store: Store) -> None:
    """Staging keeps a view of live memory; a change before commit is refused, never stored under the old digest."""
    from nbrewind.errors import ChangedWhileStagedError

    data = bytearray(os.urandom(3 * BLOB_CHUNK_SIZE))
    staged = store.objects.stage_blob(data)
    assert staged.new_bytes == len(data)
    data[5] ^= 0xFF  # the first chunk changes after staging
    with pytest.raises(ChangedWhileStagedError):
        store.objects.commit(staged)
    assert not store.objects.has(staged.digest)
    assert all(store.objects.verify(d) is None for d in store.objects.iter_digests())
    again = store.objects.stage_blob(data)
    store.objects.commit(again)
    assert bytes(store.objects.get_blob(again.digest)) == bytes(data)


def test_staged_blob_round_trip_and_dedup(store: Store) -> None:
    data = os.urandom(BLOB_CHUNK_SIZE + 100)
    first = store.objects.stage_blob(data)
    store.objects.commit(first)
    second = store.objects.stage_blob(data)
    assert second.digest == first.digest and second.new_bytes == 0
    assert bytes(store.objects.get_blob(first.digest)) == data


def test_nbrewind_snapshot_0_turns_the_forked_writer_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With NBREWIND_SNAPSHOT=0 protect() copies whatever the size, and the blob still lands."""
    monkeypatch.setenv("NBREWIND_SNAPSHOT", "0")
    store = ObjectStore(tmp_path)
    data = np.arange(3_000_000, dtype=np.float64)  # 24 MB: above the size that would fork
    staged = store.stage_blob(data)
    assert store.protect([staged]) == "copy"
    data[::2] += 1  # the next cell edits it in place: what was staged is still written
    store.commit(staged)
    assert bytes(store.get_blob(staged.digest)) == np.arange(3_000_000, dtype=np.float64).tobytes()
