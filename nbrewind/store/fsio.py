"""Crash-safe file writes and the mapping of OS errors to store errors.

A file becomes visible under its final name only complete and fsynced: it is
written to a temporary name in the same folder (so the rename never crosses a
filesystem), fsynced, then renamed with ``os.replace``, which is atomic on POSIX.
The temporary file is removed on any ``BaseException``, including
``KeyboardInterrupt``. A process killed with SIGKILL can leave a temporary file
behind, never a partial final file; temporaries start with ``TEMP_PREFIX`` so
every listing skips them and ``gc`` can remove stale ones.

Deferred durability. Inside :func:`deferred_sync` (a thread's task-result writes)
files are renamed into place without their fsyncs: still atomic, but a power loss
may leave one empty or missing. Such writes append a byte to ``UNSYNCED_MARKER`` in the store
after their rename and carry ``DEFERRED_MODE_BIT`` in their file mode.
:func:`durability_barrier` makes them durable with one ``syncfs`` of the store's
filesystem, and must run before any catalog row that could point at them is
committed. It syncs when the marker changed since this process last synced, or when
:func:`note_suspect` reported that a put found a deferred file present: the
deduplication trap, where a checkpoint ``put`` that finds a task-written object
writes nothing, so its own fsync never covers it. Neither test reads a clock.

A barrier that synced leaves the marker's state it covered in ``SYNCED_NOTE``, so a
later process (the next kernel on the store) does not sync again for writes an earlier
one already made durable. The note is written after the sync returned: if it survives a
crash, so did every write it counts.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from nbrewind.errors import ReadOnlyStoreError, StoreError, StoreFullError

__all__ = [
    "DEFERRED_MODE_BIT", "TEMP_PREFIX", "UNSYNCED_MARKER", "atomic_write", "deferred_sync", "durability_barrier",
    "fsync_dir", "is_deferred_mode", "note_suspect", "probe_write_rate", "store_error_from_os", "sync_is_deferred",
]

TEMP_PREFIX = ".tmp-"
UNSYNCED_MARKER = ".unsynced"
"""File in a store's root that grows by one byte with every deferred (unsynced) write."""
DEFERRED_MODE_BIT = stat.S_IXUSR
"""Set in the mode of a file a deferred write made: a put that finds it present cannot
tell whether a barrier has covered it yet, so it makes the next barrier sync."""
SYNCED_NOTE = ".unsynced.synced"
"""File beside ``UNSYNCED_MARKER``: the marker's state (inode, size, ctime) a barrier covered."""
_MARKER_LIMIT = 1 << 20
_NEVER = (-1, -1, -1)

_local = threading.local()
_barrier_lock = threading.Lock()
# Per store root: the marker's (inode, size, ctime) when this process last synced, and
# whether a put since then met a deferred object.
_synced_marker: dict[str, tuple[int, int, int] | None] = {}
_suspect: set[str] = set()

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
    Inside :func:`deferred_sync` neither fsync happens (see the module docstring).
    Full-disk and read-only failures raise StoreFullError / ReadOnlyStoreError.
    """
    deferred: Path | None = getattr(_local, "root", None)
    if deferred is not None:
        mode |= DEFERRED_MODE_BIT
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
            if deferred is None:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if deferred is not None:
            _note_deferred(deferred)
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
    """fsync a folder so renames into it survive a power loss (skipped inside :func:`deferred_sync`)."""
    if getattr(_local, "root", None) is not None:
        return
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- deferred durability ----------------------------------------------------------------------------


@contextlib.contextmanager
def deferred_sync(root: Path) -> Iterator[None]:
    """Within the block, this thread's writes into the store at ``root`` skip their
    fsyncs; :func:`durability_barrier` later makes them durable all at once."""
    before = getattr(_local, "root", None)
    _local.root = Path(root)
    try:
        yield
    finally:
        _local.root = before


def sync_is_deferred() -> bool:
    """Whether this thread is inside :func:`deferred_sync`."""
    return getattr(_local, "root", None) is not None


def is_deferred_mode(mode: int) -> bool:
    """Whether a file with this ``st_mode`` was written by a deferred write (and may
    not be durable yet)."""
    return bool(mode & DEFERRED_MODE_BIT)


def _note_deferred(root: Path) -> None:
    # One byte per deferred write: the marker's (inode, size) changes with every one of
    # them, which no coarse or skewed clock can hide from the barrier.
    # Mode 0o666 less the umask, as for every file of the store: on a group store (umask 002)
    # another member's worker must append to it too.
    try:
        fd = os.open(root / UNSYNCED_MARKER, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except FileNotFoundError:
        return  # no store there: the write itself failed already
    try:
        os.write(fd, b".")
    finally:
        os.close(fd)


def note_suspect(root: Path) -> None:
    """Report that an object of the store at ``root`` was found present but may not be
    durable: the next :func:`durability_barrier` syncs."""
    _suspect.add(_key(root))


def _key(root: Path) -> str:
    return os.path.abspath(root)


def _syncfs(fd: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syncfs(fd) == 0:
            return
    except (OSError, AttributeError):
        pass  # no syncfs (not Linux): sync everything
    os.sync()


def _marker_state(root: Path) -> tuple[int, int, int] | None:
    # The ctime makes a marker recreated on a reused inode number another state.
    try:
        info = os.stat(Path(root) / UNSYNCED_MARKER)
    except FileNotFoundError:
        return None
    return info.st_ino, info.st_size, info.st_ctime_ns


def _noted_state(root: Path) -> tuple[int, int, int] | None:
    """The marker state some process's barrier last covered (``SYNCED_NOTE``), if readable."""
    try:
        fields = (Path(root) / SYNCED_NOTE).read_text(encoding="ascii").split()
        ino, size, ctime = (int(f) for f in fields)
    except (OSError, ValueError):
        return None
    return ino, size, ctime


def _note_synced(root: Path, state: tuple[int, int, int]) -> None:
    # Atomic (a reader sees the old note or the new one) but not fsynced: a note lost in a
    # crash only costs the next process one more sync.
    path = Path(root) / SYNCED_NOTE
    tmp = path.with_name(f"{TEMP_PREFIX}{SYNCED_NOTE}-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        tmp.write_text("%d %d %d\n" % state, encoding="ascii")
        os.replace(tmp, path)
    except OSError:  # another user's store, a full disk: the note is only a saving
        try:
            tmp.unlink()
        except OSError:
            pass


def durability_barrier(root: Path) -> bool:
    """Make every deferred write into the store at ``root`` durable (one ``syncfs``), if
    any may be pending; return whether it synced.

    Call it before committing catalog rows that may name task results or objects a
    put found present. It syncs when a deferred write (of any process on this
    machine) landed since this process last synced, or when a put or lookup of this
    process found a deferred object present. A write on another machine (a shared
    filesystem) is not covered: writers there do not defer (`nbrewind.tasks.cache`).
    """
    key = _key(root)
    with _barrier_lock:
        state = _marker_state(root)
        if state is None or state == _synced_marker.get(key, _NEVER):
            if key not in _suspect:
                return False
        elif key not in _suspect and state == _noted_state(root):
            _synced_marker[key] = state  # another process's barrier covered every write counted
            return False
        _suspect.discard(key)
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _syncfs(fd)
        finally:
            os.close(fd)
        # Observed before the sync, so every deferred write it counts is covered.
        _synced_marker[key] = state
        if state is not None and state[1] > _MARKER_LIMIT:
            try:
                os.unlink(Path(root) / UNSYNCED_MARKER)
            except OSError:
                pass
            else:
                # A writer may have appended to the old file after the sync: sync once more next time.
                _suspect.add(key)
        elif state is not None:
            _note_synced(root, state)
        return True


def probe_write_rate(folder: Path, size: int, tries: int = 2) -> float:
    """Bytes per second at which the disk under `folder` takes writes of `size` bytes,
    each with its fsyncs (file and folder), the best of `tries`. Leaves nothing behind."""
    folder.mkdir(parents=True, exist_ok=True)
    data = os.urandom(1 << 16) * max(size >> 16, 1)
    best = float("inf")
    for _ in range(tries):
        path = folder / f"{TEMP_PREFIX}probe-{os.getpid()}-{threading.get_ident()}"
        started = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(folder)
        best = min(best, time.perf_counter() - started)
        path.unlink()
    return len(data) / max(best, 1e-6)
