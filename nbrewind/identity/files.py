"""What a file is: the xxh3-128 digest of its bytes, memoized on its stat.

Cell keys (files a cell read), task fingerprints (files a task names) and
module identities (the source of a local module) all ask this one function, so
they agree on what "the same file" means.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING

import xxhash

if TYPE_CHECKING:
    from nbrewind.identity.memo import DigestMemo

__all__ = ["SYSTEM_ROOTS", "file_digest", "listing_digest", "quiet_reads", "quietly", "read_file", "remembering"]

SYSTEM_ROOTS = ("/dev", "/proc", "/sys")
"""Folders whose files describe the running system, not a notebook's data: neither a cell's
reads and writes (`nbrewind.checkpoint.hidden`) nor a task's (`nbrewind.tasks.reads`)."""

# Bound at import: a cell may run with os.stat wrapped (file metadata tracking), and
# NBRewind's own stats must not be recorded as the cell's.
_stat = os.stat

quiet_reads = threading.local()
"""``quiet_reads.on`` is True while NBRewind itself reads a file, so trackers do not record it."""


@contextlib.contextmanager
def quietly() -> Iterator[None]:
    """NBRewind's own file work: no cell's reads, writes or stats. Nests: the flag is given
    back as it was found (the background writer's thread is quiet for good)."""
    quiet, quiet_reads.on = getattr(quiet_reads, "on", False), True
    try:
        yield
    finally:
        quiet_reads.on = quiet

def listing_digest(path: str | os.PathLike[str]) -> str:
    """xxh3-128 hex of the sorted names in a folder, or ``absent`` when it is missing or not
    one: what a cell's ``@dir:`` input and a task's recorded listing both compare."""
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return "absent"
    return xxhash.xxh3_128_hexdigest("\0".join(names).encode("utf-8", "surrogateescape"))


_CACHE_SIZE = 4096
_CHUNK = 1 << 20
_digest_cache: OrderedDict[tuple[str, int, int, int, int], str] = OrderedDict()
_digest_lock = threading.Lock()
_memo: DigestMemo | None = None
_remembered: set[tuple[str, int, int, int, int]] = set()
"""Keys of `_digest_cache` the memo already holds (or was offered and refused as unsettled: not again)."""


@contextlib.contextmanager
def remembering(memo: DigestMemo | None) -> Iterator[None]:
    """Digests also come from and go to `memo` (kept across processes, see `memo.py`)
    for the duration; on exit, what this process hashed and the memo still lacks is
    offered to it (files have settled by then), and the memo is closed."""
    global _memo
    previous, _memo = _memo, memo
    try:
        yield
    finally:
        _memo = previous
        if memo is not None:
            with _digest_lock:
                keys = [k for k in _digest_cache if k not in _remembered]
            for key in keys:
                _offer(memo, key, _digest_cache.get(key))
            memo.close()


def _offer(memo: DigestMemo, key: tuple[str, int, int, int, int], digest: str | None) -> None:
    """Give `memo` a digest of the in-process cache if its file is still what was hashed."""
    if digest is None:
        return
    try:
        info = _stat(key[0])
    except OSError:
        return
    if _key(key[0], info) == key:
        memo.put(key[0], info, digest)


def _key(path: str, info: os.stat_result) -> tuple[str, int, int, int, int]:
    return (path, info.st_size, info.st_mtime_ns, info.st_ino, info.st_ctime_ns)


def _still(path: str, key: tuple[str, int, int, int, int]) -> bool:
    """Whether the file at `path` has the stat `key` was taken from (it did not change while hashed)."""
    try:
        return _key(path, _stat(path)) == key
    except OSError:
        return False


def _keep(key: tuple[str, int, int, int, int], info: os.stat_result, digest: str, *, offer: bool = True) -> None:
    """Cache `digest` for `key` and, with `offer`, give it to the memo (which keeps only
    settled files: a fresh one is offered again on a later hit)."""
    memo = _memo
    if memo is not None and offer:
        memo.put(key[0], info, digest)
    with _digest_lock:
        _digest_cache[key] = digest
        _digest_cache.move_to_end(key)
        if memo is not None and memo.settled(info):
            _remembered.add(key)
        if len(_digest_cache) > _CACHE_SIZE:
            _remembered.discard(next(iter(_digest_cache)))
            _digest_cache.popitem(last=False)


def file_digest(path: str | os.PathLike[str]) -> str | None:
    """xxh3-128 hex of a file's bytes, or None if it is missing or not a regular file.

    Memoized on (path, size, mtime_ns, inode, ctime_ns) so unchanged inputs are
    not re-read for every cell key.  A rewrite of the same size within one
    timestamp tick can still be missed; that is the usual make-style trade-off.
    The digest is the one a raw store object of the file would have.
    """
    absolute = os.path.abspath(os.fspath(path))
    try:
        info = _stat(absolute)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    key = _key(absolute, info)
    memo = _memo
    with _digest_lock:
        cached = _digest_cache.get(key)
        if cached is not None:
            _digest_cache.move_to_end(key)
            if memo is None or key in _remembered:
                return cached
    if cached is not None:
        _keep(key, info, cached)  # hashed while it was too fresh to remember; maybe settled now
        return cached
    digest = memo.get(absolute, info) if memo is not None else None
    if digest is not None:
        _keep(key, info, digest, offer=False)
        return digest
    try:
        digest = _hash_file(absolute)
    except (FileNotFoundError, IsADirectoryError):
        return None
    _keep(key, info, digest, offer=memo is not None and _still(absolute, key))
    return digest


def read_file(path: str | os.PathLike[str]) -> tuple[bytes | mmap.mmap, str]:
    """A regular file's bytes and their `file_digest`, from one read, in a buffer the
    caller owns (`nbrewind.store.reads.read_whole`).

    The digest is remembered for the file's stat only if the stat is the same before and
    after the read (the file did not change while it was read), so a later
    `file_digest` of it costs no second read.
    """
    absolute = os.path.abspath(os.fspath(path))
    before = _stat(absolute)
    from nbrewind.store.reads import read_whole  # here: workers hash files without the store's readers

    with quietly(), open(absolute, "rb", buffering=0) as handle:
        data = read_whole(handle)
    digest = xxhash.xxh3_128_hexdigest(data)
    after = _stat(absolute)
    if stat.S_ISREG(after.st_mode) and _key(absolute, after) == _key(absolute, before):
        _keep(_key(absolute, after), after, digest)
    return data, digest


def _hash_file(path: str) -> str:
    hasher = xxhash.xxh3_128()
    chunk = bytearray(_CHUNK)
    view = memoryview(chunk)
    with quietly(), open(path, "rb", buffering=0) as handle:
        while count := handle.readinto(view):
            hasher.update(view[:count])
    return hasher.hexdigest()


