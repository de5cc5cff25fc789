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

import os
import re
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import zstandard

from nbrewind.errors import (
    CorruptObjectError,
    NotATreeError,
    ObjectNotFoundError,
    ReadOnlyStoreError,
)
from nbrewind.store import frame
from nbrewind.store.digest import digest_bytes, is_digest
from nbrewind.store.fsio import TEMP_PREFIX, atomic_write, durability_barrier, is_deferred_mode, note_suspect
from nbrewind.store.blob_reads import BlobReadsMixin
from nbrewind.store.object_refs import RefsMixin
from nbrewind.store.reads import read_threads_from_env
from nbrewind.store.staging import StagedBlob, StagingMixin, _Held
from nbrewind.store.trees import (
    BLOB_CHUNK_SIZE,
    REHASH_LIMIT,
    TREE_MAGIC,
    as_bytes_view,
    checked_header,
    content_matches,
    decode_tree,
    encode_tree,
)

__all__ = ["BLOB_CHUNK_SIZE", "STAGING_BUDGET", "TREE_MAGIC", "Buffer", "ObjectStore", "StagedBlob"]

Buffer = bytes | bytearray | memoryview

STAGING_BUDGET = 1 << 30
# Below this many new bytes in a cell, ``protect`` copies: a fork costs a few ms (bench_staging.py).
_SNAPSHOT_MIN_BYTES = 8 << 20
# Enough of a zstd payload to read its frame header (content size included).
_ZSTD_HEAD = 18
_FANOUT_RE = re.compile(r"[0-9a-f]{2}")


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class ObjectStore(StagingMixin, RefsMixin, BlobReadsMixin):
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
        # NBREWIND_SNAPSHOT=0 turns the forked writer off (always copy), for a process
        # where fork() is unwelcome (an MPI rank, a GPU context).
        self.snapshot_min_bytes = _SNAPSHOT_MIN_BYTES if os.environ.get("NBREWIND_SNAPSHOT", "1") != "0" else sys.maxsize
        """From this many new bytes on, ``protect`` forks a snapshot writer instead of copying."""
        self.read_threads = read_threads_from_env()
        """Threads that read the chunks of one ``get_blobs`` call (``NBREWIND_READ_THREADS``)."""
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

    def _corrupt(
        self, digest: str, problem: str, *, move: bool = True, seen: os.stat_result | None = None
    ) -> CorruptObjectError:
        """The error for a damaged object file, which is first moved aside to
        ``corrupt/`` (in a writable store) so that storing the same bytes again,
        e.g. by re-running the cell, repairs the store.

        ``seen`` is the ``fstat`` of the file that was read. Only that file is moved: a
        writer may have replaced it with sound bytes since it was opened (the cell that
        made it ran again), and moving those aside would lose the repair.
        """
        where = ""
        if move and not self.readonly:
            path = self.path_of(digest)
            aside = self.root / "corrupt" / digest
            try:
                if seen is None or _same_file(os.stat(path), seen):
                    aside.parent.mkdir(exist_ok=True)
                    os.replace(path, aside)
                    where = f"; the damaged file was moved to {aside}"
                    if seen is not None and not _same_file(os.stat(aside), seen):
                        # Replaced between the check and the move: the file moved is the repair.
                        os.replace(aside, path)
                        where = ""
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
        view = as_bytes_view(data)
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
        A file of at most ``REHASH_LIMIT`` bytes is re-hashed as well, since reading
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
            info = os.fstat(fd)
            stored = info.st_size
            raw = os.pread(fd, stored if stored <= REHASH_LIMIT else frame.HEADER_SIZE + _ZSTD_HEAD, 0)
            header = checked_header(raw, stored, size)
            if header is None:
                return None
            if len(raw) == stored and not content_matches(header, raw, name[-33:-31] + name[-30:]):
                return None
            if is_deferred_mode(info.st_mode):
                # Maybe a deferred task-result write: the put that finds it writes (and
                # fsyncs) nothing, so the next barrier must cover it.
                note_suspect(self.root)
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
        content = encode_tree(children, payload)
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

    def barrier(self) -> bool:
        """Make every deferred write into this store durable before a catalog row may
        name it (`nbrewind.store.fsio.durability_barrier`); return whether it synced."""
        return durability_barrier(self.root)

    # -- reading -------------------------------------------------------------

    def _open(self, digest: str, *, move_corrupt: bool = True) -> tuple[os.stat_result, frame.FrameHeader, BinaryIO]:
        """The object's file, open at its payload: its ``fstat`` (which file was read, its
        size) and its decoded header."""
        path = self.path_of(digest)
        try:
            handle = open(path, "rb")
        except FileNotFoundError:
            raise self._not_found(digest) from None
        header = frame.decode_header(handle.read(frame.HEADER_SIZE))
        seen = os.fstat(handle.fileno())
        if header is None:
            handle.close()
            raise self._corrupt(
                digest, "missing or unknown header, the file is truncated or foreign", move=move_corrupt, seen=seen
            )
        return seen, header, handle

    def _not_found(self, digest: str) -> ObjectNotFoundError:
        return ObjectNotFoundError(
            f"object {digest} is not in the store at {self.root}; running the notebook again on the "
            f"audit kernel stores it again"
        )

    def _read(self, digest: str, *, move_corrupt: bool = True) -> tuple[bytes, frame.FrameHeader]:
        seen, header, handle = self._open(digest, move_corrupt=move_corrupt)
        with handle:
            payload = handle.read()
        if header.codec == frame.CODEC_ZSTD:
            try:
                content = frame.decompress(payload)
            except zstandard.ZstdError as exc:
                raise self._corrupt(
                    digest, f"compressed data cannot be decoded: {exc}", move=move_corrupt, seen=seen
                ) from None
        else:
            content = payload
        if digest_bytes(content) != digest:
            raise self._corrupt(digest, f"its {len(content)} bytes do not hash to its name", move=move_corrupt, seen=seen)
        if header.kind == frame.KIND_TREE and decode_tree(content) is None:
            # put_tree only ever flags a well-formed tree: the header's kind byte is damaged.
            raise self._corrupt(digest, "its header says tree but it holds no tree", move=move_corrupt, seen=seen)
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

    def has_sound(self, digest: str) -> bool:
        """Whether the object is there and looks sound: its header decodes and its length
        agrees (a small object is re-hashed too); refreshes its mtime like ``put``."""
        return self._present_kind(self.path_of(digest)) is not None

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
        decoded = decode_tree(content)
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
            return decode_tree(content)
        seen, header, handle = self._open(digest, move_corrupt=move_corrupt)
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
                        digest, f"compressed data cannot be decoded: {exc}", move=move_corrupt, seen=seen
                    ) from None
        if start != TREE_MAGIC:
            return None
        content, _ = self._read(digest, move_corrupt=move_corrupt)
        return decode_tree(content)

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
        seen, header, handle = self._open(digest, move_corrupt=False)
        with handle:
            head = handle.read(32)
        return frame.content_size(header.codec, seen.st_size, head)

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
