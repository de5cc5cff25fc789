"""Reading blobs back: a chunk list's layout, and its chunks into one fresh buffer.

A blob (``put_blob``) is a chunk-list tree over 2 MiB chunk objects.  Reading one
allocates the whole buffer first, then fills every chunk's slice in place and
verifies it there (`nbrewind.store.reads` does the filling, on a few threads), so a
200 MB array is read with one copy and one hash pass over its memory.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbrewind.errors import NotATreeError, ObjectNotFoundError
from nbrewind.store import frame
from nbrewind.store.digest import digest_releasing_gil
from nbrewind.store.reads import fill_from_chunk_file, read_chunks
from nbrewind.store.trees import BLOB_CHUNK_SIZE

__all__ = ["BlobReadsMixin"]


class BlobReadsMixin:
    """Blob reads; mixed into `ObjectStore`, whose state it shares."""

    if TYPE_CHECKING:  # provided by ObjectStore
        read_threads: int

        def path_of(self, digest: str) -> Path: ...
        def get_tree(self, digest: str, *, move_corrupt: bool = True) -> tuple[list[str], bytes]: ...
        def _not_found(self, digest: str) -> ObjectNotFoundError: ...
        def _read(self, digest: str, *, move_corrupt: bool = True) -> tuple[bytes, frame.FrameHeader]: ...

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
        return self.get_blobs([[digest]], allocate)[0]

    def get_blobs(
        self, groups: Sequence[Sequence[str]], allocate: Callable[[int], Any] | None = None
    ) -> list[Any]:
        """For each sequence of blob digests in ``groups``, one new buffer holding
        those blobs back to back (made as ``get_blob`` makes one).

        Every chunk is put in its place and verified there right after it is read,
        on up to ``read_threads`` threads (see `nbrewind.store.reads`); a buffer
        stored as several blobs (the columns of a pandas block) is assembled in
        place like one, not read blob by blob and joined. A missing or damaged chunk raises what ``get`` would
        (ObjectNotFoundError, CorruptObjectError: the first in chunk order, after
        every damaged chunk was moved aside), and a chunk of the wrong size
        NotATreeError.
        """
        buffers: list[Any] = []
        jobs: list[tuple[str, memoryview]] = []
        for digests in groups:
            layouts = [self._blob_layout(digest) for digest in digests]
            total = sum(size for _, size in layouts)
            out = bytearray(total) if allocate is None else allocate(total)
            view = memoryview(out).cast("B")
            offset = 0
            for children, size in layouts:
                for index, child in enumerate(children):
                    start = offset + index * BLOB_CHUNK_SIZE
                    jobs.append((child, view[start : min(start + BLOB_CHUNK_SIZE, offset + size)]))
                offset += size
            buffers.append(out)
        try:
            read_chunks(jobs, self._read_into, self.read_threads)
        finally:
            jobs.clear()  # the chunk views go now, not with the last helper's reference
        return buffers

    def _read_into(self, digest: str, target: memoryview) -> None:
        """Fill ``target`` with the object's bytes, verified: a sound object is read whole
        into this thread's read buffer, copied (raw) or decoded (compressed) into
        ``target``, and ``target`` is hashed while it is still in the CPU cache."""
        try:
            handle = open(self.path_of(digest), "rb", buffering=0)
        except FileNotFoundError:
            raise self._not_found(digest) from None
        with handle:
            if fill_from_chunk_file(handle, target) and digest_releasing_gil(target) == digest:
                return
        # Damaged, or not the expected size: the full read raises (moving the file aside)
        # if the object itself is damaged.
        content, _ = self._read(digest)
        if len(content) != len(target):
            raise NotATreeError(
                f"blob chunk {digest} holds {len(content)} bytes where its chunk list expects "
                f"{len(target)}; the chunk list is inconsistent"
            )
        target[:] = content
