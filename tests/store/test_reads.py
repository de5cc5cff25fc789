"""Reading blobs: chunks read in place on several threads, each verified, errors as before."""

from __future__ import annotations

import io
import os
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard

from nbrewind.errors import CorruptObjectError, NotATreeError, ObjectNotFoundError
from nbrewind.store import BLOB_CHUNK_SIZE, ObjectStore, Store, digest_bytes, frame, reads
from nbrewind.store.digest import digest_releasing_gil

CHUNKS = 9  # 18 MiB: above reads.PARALLEL_MIN_BYTES, so helpers join in


def _flip(path: Path, offset: int = frame.HEADER_SIZE + 1000) -> None:
    os.chmod(path, 0o644)
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))


def _big_blob(objects: ObjectStore, seed: int = 0) -> tuple[str, bytes, list[str]]:
    data = np.random.default_rng(seed).bytes(CHUNKS * BLOB_CHUNK_SIZE - 777)
    digest = objects.put_blob(data)
    return digest, data, objects.get_tree(digest)[0]


@pytest.fixture(params=[1, 2, 4])
def objects(request: pytest.FixtureRequest, store: Store) -> ObjectStore:
    """The store's objects, reading with 1, 2 and 4 threads."""
    store.objects.read_threads = request.param
    return store.objects


def test_a_big_blob_reads_back_exactly_on_any_thread_count(objects: ObjectStore) -> None:
    assert CHUNKS * BLOB_CHUNK_SIZE >= reads.PARALLEL_MIN_BYTES
    digest, data, _ = _big_blob(objects)
    out = objects.get_blob(digest, lambda size: np.empty(size, dtype=np.uint8))
    assert isinstance(out, np.ndarray) and out.tobytes() == data


@pytest.mark.parametrize("which", [0, CHUNKS // 2, CHUNKS - 1])
def test_a_flipped_byte_in_any_chunk_raises_and_moves_that_chunk_aside(objects: ObjectStore, which: int) -> None:
    digest, _, chunks = _big_blob(objects, seed=which)
    _flip(objects.path_of(chunks[which]))
    with pytest.raises(CorruptObjectError, match=chunks[which]):
        objects.get_blob(digest)
    assert (objects.root / "corrupt" / chunks[which]).is_file()
    assert not objects.path_of(chunks[which]).exists()


def test_every_damaged_chunk_is_moved_aside_and_the_first_one_raised(objects: ObjectStore) -> None:
    digest, data, chunks = _big_blob(objects, seed=1)
    for which in (2, 6):
        _flip(objects.path_of(chunks[which]))
    with pytest.raises(CorruptObjectError, match=chunks[2]):
        objects.get_blob(digest)
    assert sorted(p.name for p in (objects.root / "corrupt").iterdir()) == sorted((chunks[2], chunks[6]))
    # Storing the same bytes again (what re-running the cell does) repairs both at once.
    assert objects.put_blob(data) == digest
    assert objects.get_blob(digest) == data


def test_a_missing_chunk_raises_not_found_before_a_later_damaged_one(objects: ObjectStore) -> None:
    digest, _, chunks = _big_blob(objects, seed=2)
    objects.path_of(chunks[3]).unlink()
    _flip(objects.path_of(chunks[7]))
    with pytest.raises(ObjectNotFoundError, match=chunks[3]):
        objects.get_blob(digest)
    assert (objects.root / "corrupt" / chunks[7]).is_file()


def test_a_chunk_of_the_wrong_size_is_an_inconsistent_chunk_list(objects: ObjectStore) -> None:
    small = objects.put(b"x" * 1000)
    tree = objects.put_tree([small] * CHUNKS, b'{"blob":1,"chunk_size":%d,"size":%d}' % (BLOB_CHUNK_SIZE, CHUNKS * BLOB_CHUNK_SIZE))
    with pytest.raises(NotATreeError, match="inconsistent"):
        objects.get_blob(tree)


def test_compressed_chunks_decode_in_place_and_a_damaged_one_raises(objects: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    data = np.arange(CHUNKS * BLOB_CHUNK_SIZE // 8, dtype=np.int64) % 1000
    digest = objects.put_blob(data)
    chunks = objects.get_tree(digest)[0]
    assert objects.path_of(chunks[0]).read_bytes()[5] == frame.CODEC_ZSTD
    slow = ObjectStore._read

    def only_trees(self: ObjectStore, digest: str, **kwargs: Any) -> Any:
        # A sound chunk never takes the slow path (read whole, decoded to new bytes, copied).
        assert digest not in chunks, "a sound chunk was read the slow way"
        return slow(self, digest, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(ObjectStore, "_read", only_trees)
        assert objects.get_blob(digest) == data.tobytes()
    _flip(objects.path_of(chunks[4]), offset=frame.HEADER_SIZE + 200)
    with pytest.raises(CorruptObjectError, match=chunks[4]):
        objects.get_blob(digest)


def test_get_blobs_joins_segments_into_one_buffer(objects: ObjectStore) -> None:
    parts = [np.random.default_rng(i).bytes(size) for i, size in enumerate((3 * BLOB_CHUNK_SIZE + 5, 100_000, 2 * BLOB_CHUNK_SIZE))]
    digests = [objects.put_blob(part) for part in parts]
    sizes: list[int] = []

    def allocate(size: int) -> Any:
        sizes.append(size)
        return np.empty(size, dtype=np.uint8)

    joined, alone = objects.get_blobs([digests, digests[1:2]], allocate)
    assert sizes == [sum(map(len, parts)), len(parts[1])]
    assert joined.tobytes() == b"".join(parts) and alone.tobytes() == parts[1]
    assert joined.flags.owndata
    _flip(objects.path_of(objects.get_tree(digests[2])[0][1]))
    with pytest.raises(CorruptObjectError):
        objects.get_blobs([digests])


def test_helpers_read_at_the_same_time() -> None:
    both = threading.Barrier(2, timeout=20)
    threads: set[int] = set()

    def read(digest: str, target: memoryview) -> None:
        threads.add(threading.get_ident())
        if digest in ("a", "b"):
            both.wait()  # one thread alone would wait here forever (BrokenBarrierError)
        target[:] = digest.encode() * len(target)

    buffer = bytearray(2 * reads.PARALLEL_MIN_BYTES)
    view = memoryview(buffer)
    half = reads.PARALLEL_MIN_BYTES
    reads.read_chunks([("a", view[:half]), ("b", view[half:])], read, threads=2)
    assert len(threads) == 2 and buffer[0] == ord("a") and buffer[-1] == ord("b")


def test_the_first_error_in_job_order_is_raised_after_every_job_ran() -> None:
    done: list[str] = []

    def read(digest: str, target: memoryview) -> None:
        done.append(digest)
        if digest in ("2", "5"):
            raise CorruptObjectError(digest)

    view = memoryview(bytearray(8 * reads.PARALLEL_MIN_BYTES))
    jobs = [(str(i), view[i * reads.PARALLEL_MIN_BYTES : (i + 1) * reads.PARALLEL_MIN_BYTES]) for i in range(8)]
    with pytest.raises(CorruptObjectError, match="^2$"):
        reads.read_chunks(jobs, read, threads=4)
    assert sorted(done) == [str(i) for i in range(8)]


def test_small_batches_stay_on_the_calling_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: set[int] = set()
    view = memoryview(bytearray(reads.PARALLEL_MIN_BYTES - 1))
    reads.read_chunks([(str(i), view[i : i + 1]) for i in range(20)], lambda d, t: seen.add(threading.get_ident()), threads=4)
    assert seen == {threading.get_ident()}


def test_a_forked_child_reads_with_its_own_helpers(store: Store) -> None:
    store.objects.read_threads = 2
    digest, data, _ = _big_blob(store.objects, seed=3)
    assert store.objects.get_blob(digest) == data  # the parent's helpers exist now
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads running
        pid = os.fork()
    if pid == 0:
        try:
            ok = store.objects.get_blob(digest) == data
        finally:
            os._exit(0 if ok else 1)  # noqa: F821 - ok is bound unless get_blob raised
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_read_threads_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NBREWIND_READ_THREADS", "3")
    assert ObjectStore(tmp_path).read_threads == 3
    for bad in ("0", "-1", "many", ""):
        monkeypatch.setenv("NBREWIND_READ_THREADS", bad)
        assert ObjectStore(tmp_path).read_threads == reads.DEFAULT_READ_THREADS


@pytest.mark.parametrize("size", [0, 1, 65536, 65537, 3 * 1024 * 1024 + 1])
def test_digest_releasing_gil_is_digest_bytes(size: int) -> None:
    data = np.random.default_rng(size).bytes(size)
    assert digest_releasing_gil(memoryview(data)) == digest_bytes(data)


def test_decompress_into_fills_exactly_or_says_no() -> None:
    data = (np.arange(300_000, dtype=np.int64) % 77).tobytes()
    payload = zstandard.ZstdCompressor(level=1, write_content_size=True).compress(data)
    target = memoryview(bytearray(len(data)))
    assert frame.decompress_into(payload, target) and target == data
    assert not frame.decompress_into(payload[:-50], memoryview(bytearray(len(data))))
    assert not frame.decompress_into(payload, memoryview(bytearray(len(data) - 1)))
    assert not frame.decompress_into(payload, memoryview(bytearray(len(data) + 1)))
    assert not frame.decompress_into(b"not zstd at all", memoryview(bytearray(len(data))))
    no_size = zstandard.ZstdCompressor(level=1, write_content_size=False).compress(data)
    assert not frame.decompress_into(no_size, memoryview(bytearray(len(data))))


def test_an_interrupt_in_a_helper_stops_the_batch_and_reaches_the_caller() -> None:
    def read(digest: str, target: memoryview) -> None:
        if digest == "1":
            raise KeyboardInterrupt

    view = memoryview(bytearray(4 * reads.PARALLEL_MIN_BYTES))
    jobs = [(str(i), view[i * reads.PARALLEL_MIN_BYTES : (i + 1) * reads.PARALLEL_MIN_BYTES]) for i in range(4)]
    with pytest.raises(KeyboardInterrupt):
        reads.read_chunks(jobs, read, threads=2)


def test_copy_releasing_gil_copies_exactly() -> None:
    source = memoryview(bytearray(np.random.default_rng(0).bytes(3 * 1024 * 1024 + 5)))
    target = np.zeros(len(source) + 10, dtype=np.uint8)
    reads.copy_releasing_gil(memoryview(target)[5:-5], source)
    assert target[5:-5].tobytes() == source and not target[:5].any() and not target[-5:].any()
    reads.copy_releasing_gil(memoryview(bytearray()), memoryview(bytearray()))
    with pytest.raises(ValueError):
        reads.copy_releasing_gil(memoryview(bytearray(3)), memoryview(bytearray(4)))


class _Changing(io.FileIO):
    """A real file, read at most 1 MiB at a time, that changes size after the first
    read: appended to, or cut short."""

    def __init__(self, path: Path, change: str) -> None:
        super().__init__(path, "rb")
        self._path, self._change = path, change

    def readinto(self, buffer: Any) -> int:
        got = super().readinto(memoryview(buffer)[: 1 << 20])
        if self._change == "grow":
            with open(self._path, "ab") as handle:
                handle.write(b"more")
        elif self._change == "shrink":
            os.truncate(self._path, 1000)
        self._change = ""
        return got


def test_a_big_file_is_read_into_memory_the_caller_owns(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    data = np.random.default_rng(3).bytes(reads.WHOLE_READ_MIN + 12345)
    path.write_bytes(data)
    with open(path, "rb", buffering=0) as handle:
        got = reads.read_whole(handle)
    assert bytes(got) == data
    path.write_bytes(b"x" * len(data))  # rewritten in place afterwards: the buffer is a copy
    assert bytes(got) == data


def test_a_small_file_is_read_as_bytes(tmp_path: Path) -> None:
    path = tmp_path / "small.bin"
    path.write_bytes(b"abc" * 1000)
    with open(path, "rb", buffering=0) as handle:
        got = reads.read_whole(handle)
    assert type(got) is bytes and got == b"abc" * 1000


@pytest.mark.parametrize("change", ["grow", "shrink"])
def test_a_file_that_changes_size_while_read_is_read_again_whole(tmp_path: Path, change: str) -> None:
    path = tmp_path / "moving.bin"
    path.write_bytes(np.random.default_rng(4).bytes(reads.WHOLE_READ_MIN + 1))
    with _Changing(path, change) as handle:
        got = reads.read_whole(handle)
    assert bytes(got) == path.read_bytes()
    assert len(got) == (reads.WHOLE_READ_MIN + 5 if change == "grow" else 1000)
