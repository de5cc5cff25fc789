"""The content-addressed object area of a store.

An object is an immutable byte string named by its digest and kept at
``objects/<first two hex digits>/<other thirty>``. Writes are atomic (see
``fsio``); every read re-hashes the decoded bytes and raises CorruptObjectError
instead of returning bytes that do not match their name.

Trees are objects that list other objects (``put_tree``); ``gc`` keeps the
children of a reachable tree alive. Large buffers go through ``put_blob``:
fixed 2 MiB chunks, each its own object, under one chunk-list tree, so an edit
to part of a large array stores only the chunks that changed and re-putting
identical data costs only hashing and existence checks.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import zstandard

from nbrewind.errors import (
    ChangedWhileStagedError,
    CorruptObjectError,
    NotATreeError,
    ObjectNotFoundError,
    ReadOnlyStoreError,
)
from nbrewind.store import frame, snapshot
from nbrewind.store.digest import DIGEST_LENGTH, digest_bytes, is_digest
from nbrewind.store.fsio import TEMP_PREFIX, atomic_write, fsync_dir
from nbrewind.store.signed_refs import encode_ref, read_ref, ref_digest

__all__ = ["BLOB_CHUNK_SIZE", "STAGING_BUDGET", "TREE_MAGIC", "Buffer", "ObjectStore", "StagedBlob"]

Buffer = bytes | bytearray | memoryview

BLOB_CHUNK_SIZE = 2 * 1024 * 1024
STAGING_BUDGET = 1 << 30
TREE_MAGIC = b"NBRTREE1\n"

_WRITE_THREADS = 2

# Below this many new bytes in a cell, ``protect`` copies: a fork costs a few ms (bench_staging.py).
_SNAPSHOT_MIN_BYTES = 8 << 20

# A put that finds its object present re-hashes a file up to this size (header
# included); larger ones (blob chunks) get the header and length check only.
_REHASH_LIMIT = 64 * 1024
# Enough of a zstd payload to read its frame header (content size included).
_ZSTD_HEAD = 18

_REF_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")
_FANOUT_RE = re.compile(r"[0-9a-f]{2}")


def _as_bytes_view(data: object) -> memoryview:
    """A flat byte view of any buffer; non-contiguous buffers are copied in C order."""
    view = memoryview(data)  # type: ignore[arg-type]  # any buffer-protocol object
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _encode_tree(children: Sequence[str], payload: bytes) -> bytes:
    for child in children:
        if not is_digest(child):
            raise ValueError(f"tree child {child!r} is not a digest")
    body = "".join(f"{child}\n" for child in children)
    return b"".join((TREE_MAGIC, b"%d\n" % len(children), body.encode("ascii"), payload))


def _decode_tree(content: bytes) -> tuple[list[str], bytes] | None:
    if not content.startswith(TREE_MAGIC):
        return None
    start = len(TREE_MAGIC)
    newline = content.find(b"\n", start)
    count_text = content[start:newline]
    if newline < 0 or not count_text.isdigit():
        return None
    count = int(count_text)
    pos = newline + 1
    end = pos + count * (DIGEST_LENGTH + 1)
    if len(content) < end:
        return None
    listing = content[pos:end].decode("ascii", errors="replace").split("\n")[:-1]
    if len(listing) != count or not all(is_digest(child) for child in listing):
        return None
    return listing, content[end:]


def _checked_header(head: bytes, stored: int, size: int | None) -> frame.FrameHeader | None:
    """The header of an object file when it decodes and agrees with the file's
    length ``stored`` and the expected content ``size``; else None."""
    header = frame.decode_header(head)
    if header is None:
        return None
    declared = frame.content_size(header.codec, stored, head[frame.HEADER_SIZE :])
    if declared is None or (size is not None and declared != size):
        return None
    if header.codec == frame.CODEC_ZSTD and not frame.plausible_size(declared, stored - frame.HEADER_SIZE):
        return None
    return header


def _content_matches(header: frame.FrameHeader, raw: bytes, digest: str) -> bool:
    """Whether the whole object file ``raw`` hashes to ``digest`` (and, flagged as a
    tree, holds one); a compressed one that would decode to more than
    ``_REHASH_LIMIT`` bytes is not decoded (True)."""
    content: bytes | memoryview = memoryview(raw)[frame.HEADER_SIZE :]
    if header.codec == frame.CODEC_ZSTD:
        if zstandard.frame_content_size(content) > _REHASH_LIMIT:
            return True  # cheap checks only, like any large object
        try:
            content = frame.decompress(bytes(content))
        except zstandard.ZstdError:
            return False
    if digest_bytes(content) != digest:
        return False
    return header.kind != frame.KIND_TREE or _decode_tree(bytes(content)) is not None


def _blob_payload(size: int) -> bytes:
    # Sorted, compact JSON: identical data must always give an identical tree digest.
    return json.dumps(
        {"blob": 1, "chunk_size": BLOB_CHUNK_SIZE, "size": size},
        sort_keys=True,
        separators=(",", ":"),
    ).encode("ascii")


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


class ObjectStore:
    """Digest-named objects under ``root/objects`` and digest refs under ``root/refs``.

    Safe to share between threads and between processes (including Dask workers on
    other machines over a shared filesystem): there is no mutable state besides
    the files, and every file appears atomically.
    """

    def __init__(
        self,
        root: Path,
        *,
        readonly: bool = False,
        compression_level: int = 1,
        staging_budget: int = STAGING_BUDGET,
    ) -> None:
        self.root = Path(root)
        self.objects_dir = self.root / "objects"
        self.refs_dir = self.root / "refs"
        self.readonly = readonly
        self.compression_level = compression_level
        self.staging_budget = staging_budget
        """At most this many bytes of staged chunks are held; past it ``stage_blob`` writes at once."""
        self.snapshot_min_bytes = _SNAPSHOT_MIN_BYTES
        """From this many new bytes on, ``protect`` forks a snapshot writer instead of copying."""
        self.bytes_written = 0
        """Bytes this object wrote to disk (headers included); deduplicated puts add nothing."""
        # Reentrant: a staged blob's finalizer (run by the garbage collector at any
        # allocation) takes it too.
        self._count_lock = threading.RLock()
        # Staging memory: chunks staged by this process and not yet written, shared by
        # every staged blob that names them (so a later blob never assumes an earlier
        # one's write succeeded: it holds the same bytes and writes them if they are absent).
        self._held: dict[str, _Held] = {}
        self._held_bytes = 0

    def _count(self, header: bytes, payload: bytes | memoryview) -> None:
        with self._count_lock:
            self.bytes_written += len(header) + memoryview(payload).nbytes

    def __repr__(self) -> str:
        return f"ObjectStore({str(self.root)!r}, readonly={self.readonly})"

    # -- paths ---------------------------------------------------------------

    def path_of(self, digest: str) -> Path:
        """The file that holds (or would hold) the object ``digest``."""
        if not is_digest(digest):
            raise ValueError(f"{digest!r} is not a digest (32 lowercase hex characters)")
        return self.objects_dir / digest[:2] / digest[2:]

    def _corrupt(self, digest: str, problem: str, *, move: bool = True) -> CorruptObjectError:
        """The error for a damaged object file, which is first moved aside to
        ``corrupt/`` (in a writable store) so that storing the same bytes again,
        e.g. by re-running the cell, repairs the store."""
        where = ""
        if move and not self.readonly:
            aside = self.root / "corrupt" / digest
            try:
                aside.parent.mkdir(exist_ok=True)
                os.replace(self.path_of(digest), aside)
                where = f"; the damaged file was moved to {aside}"
            except OSError:
                pass  # best effort: the error below matters more
        return CorruptObjectError(
            f"object {digest} is corrupt ({problem}){where}. Running the notebook again on the audit kernel "
            f"stores it again; `jupyter nbrewind verify` checks every object and names the cell runs affected"
        )

    def _check_writable(self) -> None:
        if self.readonly:
            raise ReadOnlyStoreError(f"the store at {self.root} was opened read-only")

    # -- writing -------------------------------------------------------------

    def put(self, data: Buffer, *, digest: str | None = None) -> str:
        """Store ``data`` under its digest and return the digest.

        When the object is already present nothing is written (its mtime is
        refreshed so a concurrent ``gc`` grace period sees it as fresh). A caller
        that already hashed the bytes may pass ``digest`` to skip hashing; a wrong
        one yields an object that fails its first read (CorruptObjectError), never
        wrong data.
        """
        self._check_writable()
        view = _as_bytes_view(data)
        if digest is None:
            digest = digest_bytes(view)
        path = self.path_of(digest)
        if self._touch_if_present(path, len(view)):
            return digest
        codec, payload = frame.encode(view, self.compression_level)
        header = frame.encode_header(codec, frame.KIND_LEAF)
        atomic_write(path, (header, payload))
        self._count(header, payload)
        return digest

    def _touch_if_present(self, path: Path, size: int | None = None) -> bool:
        """Whether a sound object file is at ``path``; if so its mtime is refreshed,
        so that a concurrent ``gc`` grace period sees it as fresh.

        A file that is there but damaged counts as absent, so the caller's write
        replaces it and storing the same bytes again (a re-audit) repairs the store.
        Sound means, cheaply: the header decodes and the file's length agrees with
        it (and with ``size``, the content length about to be stored, when given).
        A file of at most ``_REHASH_LIMIT`` bytes is re-hashed as well, since reading
        it costs little more than opening it.
        """
        return self._present_kind(path, size) is not None

    def _present_kind(self, path: Path, size: int | None = None) -> int | None:
        """The frame kind of the sound object file at ``path`` (see ``_touch_if_present``), or None."""
        name = os.fspath(path)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError:
            # There but unreadable to us (another user's store): we can neither
            # judge it nor replace it.
            return frame.KIND_LEAF if os.path.exists(name) else None
        try:
            stored = os.fstat(fd).st_size
            raw = os.pread(fd, stored if stored <= _REHASH_LIMIT else frame.HEADER_SIZE + _ZSTD_HEAD, 0)
            header = _checked_header(raw, stored, size)
            if header is None:
                return None
            if len(raw) == stored and not _content_matches(header, raw, name[-33:-31] + name[-30:]):
                return None
            try:
                os.utime(fd)
            except OSError:
                pass  # not ours to touch (a shared store): still a sound hit
            return header.kind
        except OSError:
            return None  # vanished or unreadable mid-check: write it again
        finally:
            os.close(fd)

    def put_tree(self, children: Sequence[str], payload: bytes = b"") -> str:
        """Store a tree: ``TREE_MAGIC``, the child count, one child digest per
        line, then ``payload``. Children should be stored first."""
        self._check_writable()
        content = _encode_tree(children, payload)
        digest = digest_bytes(content)
        path = self.path_of(digest)
        if self._present_kind(path, len(content)) == frame.KIND_TREE:
            return digest
        # Absent, damaged, or present as a plain object (the same bytes stored
        # earlier with put): (re)write it flagged as a tree so gc follows its children.
        codec, encoded = frame.encode(memoryview(content), self.compression_level)
        header = frame.encode_header(codec, frame.KIND_TREE)
        atomic_write(path, (header, encoded))
        self._count(header, encoded)
        return digest

    def put_blob(self, buf: object) -> str:
        """Store a bytes-like value of any size as 2 MiB chunks plus a chunk-list
        tree, and return the tree's digest. Only chunks not already present are
        written, so storing an edited copy of a large array costs the changed chunks.
        The caller must not change ``buf`` during the call (it is not copied)."""
        self._check_writable()
        view = _as_bytes_view(buf)
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
        return self.put_tree(chunks, _blob_payload(len(view)))

    @property
    def held_bytes(self) -> int:
        """Bytes of staged chunks not yet written: views waiting for ``protect``, copies,
        and chunks a snapshot writer is writing."""
        with self._count_lock:
            return self._held_bytes

    def stage_blob(self, buf: object) -> StagedBlob:
        """Hash ``buf`` as ``put_blob`` would and note the chunks the store lacks.

        Nothing is copied yet: the new chunks are views of ``buf`` until ``protect``
        (which the session calls before the kernel replies to the cell) snapshots or
        copies them, after which the caller may change ``buf`` at will (the next
        notebook cell editing an array in place). ``commit``, typically on a
        background thread, then writes them. A chunk another staged blob already
        holds is shared, and counted once. The bytes held are bounded by
        ``staging_budget``: a chunk that would exceed it is written and fsynced here
        instead. Immutable ``bytes`` need no protection.
        """
        self._check_writable()
        view = _as_bytes_view(buf)
        immutable = view.readonly and type(view.obj) is bytes
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
        tree = _encode_tree(chunks, _blob_payload(len(view)))
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
        """Bytes per second at which this store's disk takes chunk-sized writes, each
        with its fsyncs (file and folder), the best of `tries`: what the writer's first
        large job will see, known before it starts. Leaves nothing behind."""
        self._check_writable()
        self.objects_dir.mkdir(parents=True, exist_ok=True)
        data = os.urandom(1 << 16) * max(size >> 16, 1)
        best = float("inf")
        for _ in range(tries):
            path = self.objects_dir / f"{TEMP_PREFIX}probe-{os.getpid()}-{threading.get_ident()}"
            started = time.perf_counter()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_dir(self.objects_dir)
            best = min(best, time.perf_counter() - started)
            path.unlink()
        return len(data) / max(best, 1e-6)

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
        tree = _encode_tree(children, payload)
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
        children, payload = _decode_tree(staged.tree) or ([], b"")
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

    # -- reading -------------------------------------------------------------

    def _open(self, digest: str, *, move_corrupt: bool = True) -> tuple[int, frame.FrameHeader, BinaryIO]:
        path = self.path_of(digest)
        try:
            handle = open(path, "rb")
        except FileNotFoundError:
            raise ObjectNotFoundError(
                f"object {digest} is not in the store at {self.root}; running the notebook again on the "
                f"audit kernel stores it again"
            ) from None
        header = frame.decode_header(handle.read(frame.HEADER_SIZE))
        if header is None:
            handle.close()
            raise self._corrupt(
                digest, "missing or unknown header, the file is truncated or foreign", move=move_corrupt
            )
        return os.fstat(handle.fileno()).st_size, header, handle

    def _read(self, digest: str, *, move_corrupt: bool = True) -> tuple[bytes, frame.FrameHeader]:
        size, header, handle = self._open(digest, move_corrupt=move_corrupt)
        with handle:
            payload = handle.read()
        if header.codec == frame.CODEC_ZSTD:
            try:
                content = frame.decompress(payload)
            except zstandard.ZstdError as exc:
                raise self._corrupt(digest, f"compressed data cannot be decoded: {exc}", move=move_corrupt) from None
        else:
            content = payload
        if digest_bytes(content) != digest:
            raise self._corrupt(digest, f"its {len(content)} bytes do not hash to its name", move=move_corrupt)
        if header.kind == frame.KIND_TREE and _decode_tree(content) is None:
            # put_tree only ever flags a well-formed tree: the header's kind byte is damaged.
            raise self._corrupt(digest, "its header says tree but it holds no tree", move=move_corrupt)
        return content, header

    def get(self, digest: str, *, move_corrupt: bool = True) -> bytes:
        """Return the object's bytes after checking they hash to ``digest``.

        A damaged object raises CorruptObjectError and, in a writable store and
        unless ``move_corrupt`` is false, is first moved aside to ``corrupt/`` so
        that storing the same bytes again repairs the store.
        """
        return self._read(digest, move_corrupt=move_corrupt)[0]

    def has(self, digest: str) -> bool:
        """Whether an object file named ``digest`` exists (not verified)."""
        return self.path_of(digest).is_file()

    def verify(self, digest: str, *, move_corrupt: bool = True) -> None:
        """Re-read and re-hash the object; raise CorruptObjectError if it is damaged
        (moving it aside as ``get`` does)."""
        self._read(digest, move_corrupt=move_corrupt)

    def is_tree(self, digest: str) -> bool:
        """Whether the object was stored as a tree (reads only its header)."""
        _, header, handle = self._open(digest, move_corrupt=False)
        handle.close()
        return header.kind == frame.KIND_TREE

    def get_tree(self, digest: str, *, move_corrupt: bool = True) -> tuple[list[str], bytes]:
        """Return a verified tree's ``(children, payload)``."""
        content, _ = self._read(digest, move_corrupt=move_corrupt)
        decoded = _decode_tree(content)
        if decoded is None:
            raise NotATreeError(f"object {digest} is not a tree")
        return decoded

    def get_children(
        self, digest: str, *, verify: bool = False, move_corrupt: bool = False
    ) -> tuple[list[str], bytes] | None:
        """A tree's verified ``(children, payload)``, or None for a leaf.

        What counts is the content, not the header's kind byte (which no digest
        covers): a tree whose kind byte was flipped to "leaf" still has its children
        followed, so gc never drops them. With ``verify`` a leaf is read and
        re-hashed in full too; without, a leaf costs a look at its first bytes.
        """
        if verify:
            content, _ = self._read(digest, move_corrupt=move_corrupt)
            return _decode_tree(content)
        _, header, handle = self._open(digest, move_corrupt=move_corrupt)
        with handle:
            if header.kind == frame.KIND_TREE:
                start = TREE_MAGIC  # read it in full below
            elif header.codec == frame.CODEC_RAW:
                start = handle.read(len(TREE_MAGIC))
            else:
                try:
                    with zstandard.ZstdDecompressor().stream_reader(handle, closefd=False) as stream:
                        start = stream.read(len(TREE_MAGIC))
                except zstandard.ZstdError as exc:
                    raise self._corrupt(
                        digest, f"compressed data cannot be decoded: {exc}", move=move_corrupt
                    ) from None
        if start != TREE_MAGIC:
            return None
        content, _ = self._read(digest, move_corrupt=move_corrupt)
        return _decode_tree(content)

    def _blob_layout(self, digest: str) -> tuple[list[str], int]:
        children, payload = self.get_tree(digest)
        try:
            meta = json.loads(payload)
            size, chunk_size = int(meta["size"]), int(meta["chunk_size"])
        except (ValueError, KeyError, TypeError):
            raise NotATreeError(f"object {digest} is a tree but not a blob") from None
        if chunk_size != BLOB_CHUNK_SIZE or len(children) != -(-size // chunk_size):
            raise NotATreeError(f"blob chunk list {digest} does not match its recorded size")
        return children, size

    def blob_size(self, digest: str) -> int:
        """The byte length of the blob whose chunk-list tree is ``digest``."""
        return self._blob_layout(digest)[1]

    def get_blob(self, digest: str, allocate: Callable[[int], Any] | None = None) -> Any:
        """Reassemble a blob stored by ``put_blob``; every chunk is verified.

        The bytes land in a new ``bytearray``, or in ``allocate(size)``: any
        writable one-byte-per-item buffer, such as a numpy array the caller
        will turn into the restored array itself.
        """
        children, size = self._blob_layout(digest)
        out = bytearray(size) if allocate is None else allocate(size)
        view = memoryview(out).cast("B")
        for index, child in enumerate(children):
            start = index * BLOB_CHUNK_SIZE
            target = view[start : start + BLOB_CHUNK_SIZE]
            self._read_into(child, target)
        return out

    def _read_into(self, digest: str, target: memoryview) -> None:
        """Fill ``target`` with the object's bytes, verified; a raw object of the
        expected size is read straight into ``target`` without an intermediate copy."""
        stored, header, handle = self._open(digest)
        with handle:
            if header.codec == frame.CODEC_RAW and stored - frame.HEADER_SIZE == len(target):
                got = handle.readinto(target)  # type: ignore[attr-defined]
                if got == len(target) and digest_bytes(target) == digest:
                    return
        # Compressed, or the fast path failed: full read, which raises (and moves
        # the file aside) if the object itself is damaged.
        content, _ = self._read(digest)
        if len(content) != len(target):
            raise NotATreeError(
                f"blob chunk {digest} holds {len(content)} bytes where its chunk list expects "
                f"{len(target)}; the chunk list is inconsistent"
            )
        target[:] = content

    # -- listing and sizes ---------------------------------------------------

    def iter_digests(self) -> Iterator[str]:
        """Every object in the store (temporary files are skipped)."""
        try:
            with os.scandir(self.objects_dir) as listing:
                folders = sorted(listing, key=lambda e: e.name)
        except FileNotFoundError:
            return
        for folder in folders:
            if not _FANOUT_RE.fullmatch(folder.name) or not folder.is_dir():
                continue
            with os.scandir(folder.path) as entries:
                names = [entry.name for entry in entries]
            for name in names:
                digest = folder.name + name
                if not name.startswith(".") and is_digest(digest):
                    yield digest

    def stored_size(self, digest: str) -> int:
        """Bytes the object occupies on disk, header included."""
        try:
            return self.path_of(digest).stat().st_size
        except FileNotFoundError:
            raise ObjectNotFoundError(f"object {digest} is not in the store at {self.root}") from None

    def logical_size(self, digest: str) -> int | None:
        """The object's decoded size, from its header (None if it cannot be told)."""
        stored, header, handle = self._open(digest, move_corrupt=False)
        with handle:
            head = handle.read(32)
        return frame.content_size(header.codec, stored, head)

    def delete(self, digest: str) -> bool:
        """Remove an object; return whether it was there."""
        self._check_writable()
        try:
            self.path_of(digest).unlink()
        except FileNotFoundError:
            return False
        return True

    def iter_temp_files(self) -> Iterator[Path]:
        """Leftover temporary files (from writers that were killed mid-write, or
        writes in progress right now)."""
        for base in (self.objects_dir, self.refs_dir):
            for folder, _, files in os.walk(base):
                for name in files:
                    if name.startswith(TEMP_PREFIX):
                        yield Path(folder) / name

    # -- refs ----------------------------------------------------------------

    def _ref_path(self, namespace: str, name: str) -> Path:
        for label, value in (("namespace", namespace), ("name", name)):
            if not _REF_NAME_RE.fullmatch(value):
                raise ValueError(
                    f"ref {label} {value!r} must be 1-200 characters of letters, digits, '_', '.', '-'"
                )
        return self.refs_dir / namespace / name[:2] / name

    def ref_set(self, namespace: str, name: str, digest: str) -> None:
        """Point ``namespace/name`` at ``digest``, atomically (the last writer wins).

        The file carries this user's MAC of (namespace, name, digest): refs are not
        catalog rows, so the catalog's signature does not cover them."""
        self._check_writable()
        if not is_digest(digest):
            raise ValueError(f"{digest!r} is not a digest")
        atomic_write(self._ref_path(namespace, name), (encode_ref(namespace, name, digest),), mode=0o644)

    def ref_get(self, namespace: str, name: str) -> str | None:
        """The digest ``namespace/name`` points at, or None: also when its MAC is not
        this user's (a ref someone else wrote or forged is a miss, never loaded)."""
        path = self._ref_path(namespace, name)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        digest, trusted = read_ref(self.root, namespace, name, raw)
        if digest is None:
            raise CorruptObjectError(f"ref file {path} does not hold a digest; delete it")
        return digest if trusted else None

    def ref_delete(self, namespace: str, name: str) -> bool:
        """Remove a ref; return whether it existed."""
        self._check_writable()
        try:
            self._ref_path(namespace, name).unlink()
        except FileNotFoundError:
            return False
        return True

    def ref_namespaces(self) -> list[str]:
        """The namespaces that hold refs."""
        try:
            return sorted(e.name for e in os.scandir(self.refs_dir) if e.is_dir() and _REF_NAME_RE.fullmatch(e.name))
        except FileNotFoundError:
            return []

    def iter_refs(self, namespace: str, *, trusted_only: bool = False) -> Iterator[tuple[str, str]]:
        """``(name, digest)`` for every ref in ``namespace``; damaged ref files are
        skipped, and with ``trusted_only`` those ``ref_get`` would not return."""
        base = self.refs_dir / namespace
        self._ref_path(namespace, "x")  # validates the namespace
        for folder, _, files in os.walk(base):
            for name in sorted(files):
                if name.startswith(".") or not _REF_NAME_RE.fullmatch(name):
                    continue
                try:
                    raw = (Path(folder) / name).read_bytes()
                except FileNotFoundError:
                    continue  # deleted while we listed
                digest, trusted = read_ref(self.root, namespace, name, raw) if trusted_only else (ref_digest(raw), True)
                if digest is not None and trusted:
                    yield name, digest
