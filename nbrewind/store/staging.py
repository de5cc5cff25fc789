"""Staging: the half of `ObjectStore` that hashes a checkpoint's blobs before the
kernel replies and writes them afterwards.

``stage_blob`` holds the new chunks (views, shared and counted once, bounded by the
staging budget); ``protect``, before the reply, makes them the store's (a forked
copy-on-write snapshot for large checkpoints, a copy for small ones); ``commit``
writes them, chunks first, a tree only once every child is on disk.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nbrewind.errors import ChangedWhileStagedError, ObjectNotFoundError
from nbrewind.store import frame, snapshot
from nbrewind.store.digest import digest_bytes
from nbrewind.store.fsio import atomic_write, fsync_dir, probe_write_rate
from nbrewind.store.trees import (
    BLOB_CHUNK_SIZE,
    as_bytes_view,
    blob_payload,
    decode_tree,
    encode_tree,
)

__all__ = ["StagedBlob", "StagingMixin"]

_WRITE_THREADS = 2


@dataclass(frozen=True, eq=False)
class StagedBlob:
    """A blob or tree whose digest is known now and which ``ObjectStore.commit`` writes later.

    Its new chunks are held by the store: views of the caller's buffer until
    ``ObjectStore.protect`` snapshots or copies them, after which the caller may
    change or drop its buffer.
    """

    digest: str
    tree: bytes
    chunks: tuple[str, ...] = ()
    """New chunks the store holds for this blob, in the order ``commit`` writes them."""
    new_bytes: int = 0
    """Bytes of chunks the store did not have when this was staged (held, or written at once)."""
    owned: set[str] = field(default_factory=set, repr=False)
    """The chunks of ``chunks`` this blob still holds a claim on (emptied by ``commit``)."""


@dataclass(eq=False)
class _Held:
    """One staged chunk not yet written, and how many staged blobs still need it."""

    data: bytes | memoryview | None
    """A view of the caller's memory (``live``), a private copy, or None once a snapshot writer has it."""
    size: int
    live: bool = False
    snapshot: snapshot.Snapshot | None = None
    refs: int = 1


class StagingMixin:
    """Staging and committing blobs; mixed into `ObjectStore`, whose state it shares."""

    if TYPE_CHECKING:  # provided by ObjectStore
        objects_dir: Path
        compression_level: int
        staging_budget: int
        snapshot_min_bytes: int
        bytes_written: int
        _count_lock: threading.RLock
        _held: dict[str, _Held]
        _held_bytes: int

        def path_of(self, digest: str) -> Path: ...
        def has(self, digest: str) -> bool: ...
        def put_tree(self, children: Sequence[str], payload: bytes = b"") -> str: ...
        def _check_writable(self) -> None: ...
        def _count(self, header: bytes, payload: bytes | memoryview) -> None: ...
        def _touch_if_present(self, path: Path, size: int | None = None) -> bool: ...

    def put_blob(self, buf: object) -> str:
        """Store a bytes-like value of any size as 2 MiB chunks plus a chunk-list
        tree, and return the tree's digest. Only chunks not already present are
        written, so storing an edited copy of a large array costs the changed chunks.
        The caller must not change ``buf`` during the call (it is not copied)."""
        self._check_writable()
        view = as_bytes_view(buf)
        chunks: list[str] = []
        pieces: dict[str, memoryview] = {}
        for start in range(0, len(view), BLOB_CHUNK_SIZE):
            piece = view[start : start + BLOB_CHUNK_SIZE]
            digest = digest_bytes(piece)
            chunks.append(digest)
            # Staged elsewhere in this process counts for nothing: this call is durable
            # when it returns, so it writes every chunk that is not on disk now.
            if digest not in pieces and not self._touch_if_present(self.path_of(digest), piece.nbytes):
                pieces[digest] = piece
        # Per-chunk fsyncs serialize on the disk's flush latency; two writers keep it
        # busy (zstd and os.write release the GIL). Measured in benchmarks/bench_store.py.
        self._write_pieces(list(pieces.items()), _WRITE_THREADS, verify=False)
        for folder in {self.path_of(d).parent for d in pieces}:
            fsync_dir(folder)
        return self.put_tree(chunks, blob_payload(len(view)))

    @property
    def held_bytes(self) -> int:
        """Bytes of staged chunks not yet written: views waiting for ``protect``, copies,
        and chunks a snapshot writer is writing."""
        with self._count_lock:
            return self._held_bytes

    def stage_blob(self, buf: object, *, owned: bool = False) -> StagedBlob:
        """Hash ``buf`` as ``put_blob`` would and note the chunks the store lacks.

        Nothing is copied yet: the new chunks are views of ``buf`` until ``protect``
        (which the session calls before the kernel replies to the cell) snapshots or
        copies them, after which the caller may change ``buf`` at will (the next
        notebook cell editing an array in place). ``commit``, typically on a
        background thread, then writes them. A chunk another staged blob already
        holds is shared, and counted once. The bytes held are bounded by
        ``staging_budget``: a chunk that would exceed it is written and fsynced here
        instead. Immutable ``bytes`` need no protection, nor does a buffer the caller
        hands over (``owned``: nothing else holds or changes it, such as a file read by
        `nbrewind.store.reads.read_whole`).
        """
        self._check_writable()
        view = as_bytes_view(buf)
        immutable = owned or (view.readonly and type(view.obj) is bytes)
        chunks: list[str] = []
        held: list[str] = []
        new_bytes = 0
        written: set[Path] = set()
        seen: set[str] = set()
        for start in range(0, len(view), BLOB_CHUNK_SIZE):
            piece = view[start : start + BLOB_CHUNK_SIZE]
            digest = digest_bytes(piece)
            chunks.append(digest)
            if digest in seen:
                continue
            seen.add(digest)
            if self._claim(digest, piece):
                held.append(digest)
                continue
            path = self.path_of(digest)
            if self._touch_if_present(path, piece.nbytes):
                continue
            new_bytes += piece.nbytes
            if self._hold(digest, piece, live=not immutable):
                held.append(digest)
            else:
                self._write_chunk(digest, piece)
                written.add(path.parent)
        for folder in written:
            fsync_dir(folder)
        tree = encode_tree(chunks, blob_payload(len(view)))
        staged = StagedBlob(digest_bytes(tree), tree, tuple(held), new_bytes, set(held))
        if held:
            # A staged blob dropped without a commit (its cell failed later) gives its claims back.
            weakref.finalize(staged, self._release, staged.owned)
        return staged

    def _claim(self, digest: str, piece: memoryview) -> bool:
        """Share a chunk already held for another staged blob (whichever commit comes first writes it)."""
        with self._count_lock:
            entry = self._held.get(digest)
            if entry is None:
                return False
            entry.refs += 1
            if entry.live:
                # Not protected yet: `piece` was hashed just now, an older view may have changed since.
                entry.data = piece
            return True

    def _hold(self, digest: str, piece: memoryview, *, live: bool) -> bool:
        """Hold ``piece`` for a later commit if the budget has room; False when it has not."""
        with self._count_lock:
            if self._held_bytes + piece.nbytes > self.staging_budget:
                return False
            self._held_bytes += piece.nbytes
            self._held[digest] = _Held(piece, piece.nbytes, live=live)
        return True

    def protect(self, staged: Sequence[StagedBlob]) -> str | None:
        """Make the chunks these blobs hold independent of the caller's memory, now;
        return how: "snapshot", "copy", or None when nothing needed it.

        After this the caller may change or free the buffers it staged. Large
        amounts are snapshotted: a forked child (``snapshot.fork_writer``) writes
        them from the memory as it is at this instant, for a few milliseconds here
        whatever the size; small ones, or any where fork is not available, are
        copied (about 1 ms per MB of fresh memory; benchmarks/bench_staging.py).
        """
        live: dict[str, _Held] = {}
        with self._count_lock:
            for blob in staged:
                for digest in blob.chunks:
                    entry = self._held.get(digest)
                    if entry is not None and entry.live:
                        live[digest] = entry
        if not live:
            return None
        total = sum(entry.size for entry in live.values())
        snap = None
        if total >= self.snapshot_min_bytes:
            pieces = [(digest, entry.data) for digest, entry in live.items()]
            snap = snapshot.fork_writer(functools.partial(self._write_in_child, pieces), total)
        copies = {} if snap is not None else {d: bytes(e.data or b"") for d, e in live.items()}
        with self._count_lock:
            for digest, entry in live.items():
                entry.live = False
                if snap is not None:
                    entry.data, entry.snapshot = None, snap  # the caller's memory is no longer ours to read
                else:
                    entry.data = copies[digest]
        return "copy" if snap is None else "snapshot"

    def _write_in_child(self, pieces: list[tuple[str, bytes | memoryview | None]], report: Callable[[str], None]) -> None:
        """The snapshot child's work: write every chunk from the memory as it was at
        fork time (verified against its digest), two folders at a time. Each folder
        is synced right after its chunks, and only then are they reported, so the
        progress the parent sees is durable progress."""
        # A lock another thread held at fork time stays held forever in this process.
        self._count_lock = threading.RLock()
        lock = threading.Lock()
        folders: dict[Path, list[tuple[str, bytes | memoryview]]] = {}
        for digest, piece in pieces:
            if piece is not None:
                folders.setdefault(self.path_of(digest).parent, []).append((digest, piece))
        todo = list(folders.items())
        failures: list[BaseException] = []

        def writer() -> None:
            while True:
                with lock:
                    if not todo or failures:
                        return
                    folder, group = todo.pop()
                try:
                    done = []
                    for digest, piece in group:
                        if not self._touch_if_present(self.path_of(digest), memoryview(piece).nbytes):
                            done.append((memoryview(piece).nbytes, self._write_chunk(digest, piece, verify=True)))
                    fsync_dir(folder)
                    with lock:
                        for size, stored in done:
                            report(f"w {size} {stored}")
                except BaseException as exc:  # noqa: BLE001 - re-raised below
                    with lock:
                        failures.append(exc)

        threads = [threading.Thread(target=writer) for _ in range(_WRITE_THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise failures[0]

    def probe_write_rate(self, size: int = BLOB_CHUNK_SIZE, tries: int = 2) -> float:
        """Bytes per second at which this store's disk takes chunk-sized writes, each with
        its fsyncs (`fsio.probe_write_rate`): what the writer's first large job will see."""
        self._check_writable()
        return probe_write_rate(self.objects_dir, size, tries)

    def _release(self, owned: set[str], digests: Sequence[str] | None = None) -> None:
        """Give back this blob's claim on ``digests`` (default: all it still owns); a
        chunk no staged blob needs any more leaves staging memory."""
        with self._count_lock:
            for digest in list(owned) if digests is None else digests:
                if digest not in owned:
                    continue
                owned.discard(digest)
                entry = self._held.get(digest)
                if entry is None:
                    continue
                entry.refs -= 1
                if entry.refs <= 0:
                    del self._held[digest]
                    self._held_bytes -= entry.size

    def stage_tree(self, children: Sequence[str], payload: bytes = b"") -> StagedBlob:
        """A tree whose digest is known now and which ``commit`` writes later."""
        tree = encode_tree(children, payload)
        return StagedBlob(digest_bytes(tree), tree)

    def commit(
        self,
        staged: StagedBlob,
        *,
        writers: int = 1,
        verify: bool = True,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        """Write what ``stage_blob``/``stage_tree`` prepared: chunks first, then the tree.

        Copied chunks are written here (re-hashed first with ``verify``); snapshotted
        ones are waited for; a chunk still a view of the caller's memory (``protect``
        was not called) is copied now and refused (ChangedWhileStagedError) if it no
        longer hashes to its name, never stored under the wrong one. The tree is
        written only when every child is on disk and its folder synced, so a failed
        earlier commit can never leave a tree pointing at nothing. The background
        writer uses one writer so the user's next cell keeps the other core; it
        passes ``progress``, called with each chunk's size once that chunk is written.
        """
        owned = staged.owned
        synced: set[Path] = set()
        try:
            pieces: list[tuple[str, bytes | memoryview]] = []
            waits: dict[int, tuple[snapshot.Snapshot, list[str]]] = {}
            for digest in staged.chunks:
                if digest not in owned:
                    continue
                path = self.path_of(digest)
                with self._count_lock:
                    entry = self._held.get(digest)
                    snap = None if entry is None else entry.snapshot
                    data = None if entry is None else entry.data
                if snap is not None:
                    waits.setdefault(id(snap), (snap, []))[1].append(digest)
                elif self._touch_if_present(path, None if entry is None else entry.size):
                    # Written meanwhile (by the blob that staged it first): its folder
                    # is synced below too, whoever wrote it.
                    synced.add(path.parent)
                    self._release(owned, (digest,))
                elif data is not None:
                    pieces.append((digest, bytes(data) if entry is not None and entry.live else data))
            for snap, digests in waits.values():
                snap.wait(functools.partial(self._snapshot_progress, progress))
                self._release(owned, digests)  # the child synced their folders
            self._write_pieces(pieces, writers, verify, release=owned, progress=progress)
            synced.update(self.path_of(d).parent for d, _ in pieces)
            # The chunks' renames must be durable before a tree naming them is.
            for folder in synced:
                fsync_dir(folder)
        finally:
            self._release(owned)
        children, payload = decode_tree(staged.tree) or ([], b"")
        absent = [c for c in children if not self.has(c)]
        if absent:
            raise ObjectNotFoundError(
                f"cannot write tree {staged.digest}: {len(absent)} of its chunks are missing (first {absent[0]})"
            )
        self.put_tree(children, payload)

    def _snapshot_progress(self, progress: Callable[[int], None] | None, size: int, stored: int) -> None:
        with self._count_lock:
            self.bytes_written += stored
        if progress is not None:
            progress(size)

    def _write_pieces(
        self,
        pieces: Sequence[tuple[str, bytes | memoryview]],
        writers: int,
        verify: bool,
        release: set[str] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        """Write chunk files (folders not synced); with ``release``, each chunk's
        staging claim is given back as soon as it is written."""

        def write(digest: str, piece: bytes | memoryview) -> None:
            self._write_chunk(digest, piece, verify)
            if release is not None:
                self._release(release, (digest,))
            if progress is not None:
                progress(memoryview(piece).nbytes)

        if writers > 1 and len(pieces) > 1:
            pool = ThreadPoolExecutor(writers, thread_name_prefix="nbrewind-put")
            try:
                for future in [pool.submit(write, d, p) for d, p in pieces]:
                    future.result()
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
        else:
            for digest, piece in pieces:
                write(digest, piece)

    def _write_chunk(self, digest: str, piece: bytes | memoryview, verify: bool = False) -> int:
        """Write one chunk file (its folder not synced); return the bytes it takes on disk."""
        if verify and digest_bytes(piece) != digest:
            raise ChangedWhileStagedError(
                f"a value changed while its checkpoint was being taken (chunk {digest}); nothing was written for it"
            )
        codec, payload = frame.encode(memoryview(piece), self.compression_level)
        header = frame.encode_header(codec, frame.KIND_LEAF)
        atomic_write(self.path_of(digest), (header, payload), sync_dir=False)
        self._count(header, payload)
        return len(header) + memoryview(payload).nbytes
