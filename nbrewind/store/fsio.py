"""Crash-safe file writes and the mapping of OS errors to store errors.

A file becomes visible under its final name only complete and fsynced: it is
written to a temporary name in the same folder (so the rename never crosses a
filesystem), fsynced, then renamed with ``os.replace``, which is atomic on POSIX.
The temporary file is removed on any ``BaseException``, including
``KeyboardInterrupt``. A process killed with SIGKILL can leave a temporary file
behind, never a partial final file; temporaries start with ``TEMP_PREFIX`` so
every listing skips them and ``gc`` can remove stale ones.
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

from nbrewind.errors import ReadOnlyStoreError, StoreError, StoreFullError

__all__ = ["TEMP_PREFIX", "atomic_write", "fsync_dir", "store_error_from_os"]

TEMP_PREFIX = ".tmp-"

_FULL = {errno.ENOSPC, errno.EDQUOT}
_READONLY = {errno.EROFS, errno.EACCES, errno.EPERM}


def store_error_from_os(exc: OSError, path: Path) -> StoreError | None:
    """Translate a full-disk or read-only OSError into the matching store error
    (None for any other error, which callers re-raise unchanged)."""
    if exc.errno in _FULL:
        return StoreFullError(
            f"no space left while writing {path}: free space on that filesystem "
            f"(`jupyter nbrewind du` shows what the store holds) and run the cell again"
        )
    if exc.errno in _READONLY:
        return ReadOnlyStoreError(
            f"cannot write {path} ({os.strerror(exc.errno or 0)}): the store is read-only; "
            f"point NBREWIND_STORE at a writable folder"
        )
    return None


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write every byte of ``data`` to ``fd`` (os.write may write fewer)."""
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


def atomic_write(
    path: Path,
    pieces: Iterable[bytes | bytearray | memoryview],
    *,
    mode: int = 0o444,
    sync_dir: bool = True,
) -> None:
    """Make ``path`` hold the concatenation of ``pieces``, all or nothing.

    ``sync_dir=False`` skips the fsync of the parent folder; a caller writing
    many files into few folders then syncs each folder once with :func:`fsync_dir`.
    Full-disk and read-only failures raise StoreFullError / ReadOnlyStoreError.
    """
    folder = path.parent
    tmp = folder / f"{TEMP_PREFIX}{path.name}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        except FileNotFoundError:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        try:
            for piece in pieces:
                _write_all(fd, piece)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            tmp.unlink()
        except OSError:
            pass  # never created (missing folder, read-only filesystem) or already gone
        if isinstance(exc, OSError):
            mapped = store_error_from_os(exc, path)
            if mapped is not None:
                raise mapped from exc
        raise
    if sync_dir:
        fsync_dir(folder)


def fsync_dir(folder: Path) -> None:
    """fsync a folder so renames into it survive a power loss."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
