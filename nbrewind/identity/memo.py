"""File digests remembered across kernels, keyed by everything `stat` says of the file.

A new kernel process starts with an empty in-process digest cache, so every input
file a cell key or a replay names is read and hashed again: 100 data files cost a
repeat more than replaying every cell of the notebook. `DigestMemo` keeps the
digests in a small SQLite file per user (``$XDG_CACHE_HOME/nbrewind/file-digests.sqlite``,
else ``~/.cache/...``; ``NBREWIND_DIGEST_MEMO`` names another file, or ``off``).

A remembered digest is used only if the file's host, device, inode, size, mtime and
ctime are all what they were when it was hashed. Every write changes the ctime, and
nothing but the clock can set it, so an equal ctime means no write since. The one
gap is a write in the same clock tick as the one hashed (kernels stamp ctimes with a
coarse clock, several ms; network filesystems with seconds): a digest is remembered
only for a file whose ctime is at least `SETTLED_NS` older than the hash, as git does
with its "racily clean" entries. A file written just before its cell ended is hashed
again by the next kernel, then remembered.

Only files on filesystems that keep ctimes as POSIX says (`CTIME_KEPT`: the usual
local ones, NFS, Lustre, GPFS, CephFS, BeeGFS) are remembered; FUSE, FAT, NTFS and
SMB mounts may report a ctime a copy can reproduce, so their files are always hashed.

It is a cache: rows carry a checksum, any SQLite error turns it off for the process,
and nothing is lost by deleting the file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sqlite3
import threading
import time
from pathlib import Path

import xxhash

from nbrewind.store.fstype import Mount, find_mount, parse_mountinfo

__all__ = ["CTIME_KEPT", "SETTLED_NS", "DigestMemo", "default_memo_path"]

logger = logging.getLogger(__name__)

SETTLED_NS = 3_000_000_000
"""How much older than the hash a file's ctime must be for its digest to be remembered."""

CTIME_KEPT = frozenset({
    "ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "jfs", "bcachefs", "nilfs2", "reiserfs", "tmpfs",
    "overlay", "nfs", "nfs4", "lustre", "gpfs", "ceph", "beegfs",
})
"""Filesystem types (as mountinfo names them) whose ctime every write moves and nothing sets."""

_VARIABLE = "NBREWIND_DIGEST_MEMO"
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS digests (path TEXT PRIMARY KEY, host TEXT NOT NULL, dev INTEGER NOT NULL, "
    "ino INTEGER NOT NULL, size INTEGER NOT NULL, mtime INTEGER NOT NULL, ctime INTEGER NOT NULL, "
    "digest TEXT NOT NULL, check_ TEXT NOT NULL)"
)


def default_memo_path() -> Path | None:
    """Where this user's memo is, or None when ``NBREWIND_DIGEST_MEMO=off``."""
    chosen = os.environ.get(_VARIABLE, "")
    if chosen.lower() in ("off", "0", "no", "false"):
        return None
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nbrewind" / "file-digests.sqlite"


def _check(path: str, host: str, sig: tuple[int, ...], digest: str) -> str:
    return xxhash.xxh3_64_hexdigest("|".join([path, host, *map(str, sig), digest]).encode())


class DigestMemo:
    """Digests of files, by path and full stat signature, shared by this user's kernels."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # A cache: no journal file and no fsync (a torn row fails its checksum; a torn
        # file fails to open and is started again).
        self._conn = sqlite3.connect(str(path), timeout=0.5, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA synchronous=OFF")
        self._conn.execute("PRAGMA journal_mode=MEMORY")
        self._conn.execute(_SCHEMA)
        self._host = socket.gethostname()
        try:
            self._mounts: list[Mount] = parse_mountinfo(Path("/proc/self/mountinfo").read_text("utf-8", errors="surrogateescape"))
        except OSError:
            self._mounts = []  # no mount table: nothing is remembered
        self._kept_by_folder: dict[str, bool] = {}
        self._lock = threading.Lock()
        self._broken = False
        self.hits = 0
        self.path = path

    @classmethod
    def open_default(cls) -> DigestMemo | None:
        """This user's memo, or None if it is turned off or cannot be opened (a broken
        file is removed and made again once)."""
        path = default_memo_path()
        if path is None:
            return None
        for attempt in range(2):
            try:
                return cls(path)
            except (sqlite3.Error, OSError) as exc:
                logger.debug("NBRewind: the file digest memo %s cannot be used: %s", path, exc)
                if attempt == 0:
                    with contextlib.suppress(OSError):
                        path.unlink()
        return None

    def keeps_ctime(self, path: str) -> bool:
        """Whether the file at `path` is on a filesystem in `CTIME_KEPT` (looked up once per folder)."""
        folder = os.path.dirname(path)
        kept = self._kept_by_folder.get(folder)
        if kept is None:
            mount = find_mount(os.path.realpath(folder), self._mounts)
            kept = self._kept_by_folder[folder] = mount is not None and mount.fstype in CTIME_KEPT
        return kept

    @staticmethod
    def settled(info: os.stat_result) -> bool:
        """Whether a file with stat `info` was last written long enough ago to be remembered."""
        return info.st_ctime_ns > 0 and time.time_ns() - info.st_ctime_ns >= SETTLED_NS

    def get(self, path: str, info: os.stat_result) -> str | None:
        """The remembered digest of the file at `path` if it is unchanged (`info` is its stat now)."""
        if self._broken or not self.keeps_ctime(path):
            return None
        sig = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        try:
            with self._lock:
                row = self._conn.execute(
                    "SELECT host, dev, ino, size, mtime, ctime, digest, check_ FROM digests WHERE path = ?", (path,)
                ).fetchone()
        except sqlite3.Error as exc:
            self._give_up(exc)
            return None
        if row is None or row[0] != self._host or tuple(row[1:6]) != sig:
            return None
        if row[7] != _check(path, self._host, sig, row[6]):
            return None
        self.hits += 1
        return str(row[6])

    def put(self, path: str, info: os.stat_result, digest: str) -> None:
        """Remember the digest of the file at `path`, hashed with stat `info` before and
        after the read, unless its last write is too recent to be told apart (`SETTLED_NS`)."""
        if self._broken or not self.settled(info) or not self.keeps_ctime(path):
            return
        sig = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        try:
            with self._lock:
                self._conn.execute(
                    "INSERT OR REPLACE INTO digests VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (path, self._host, *sig, digest, _check(path, self._host, sig, digest)),
                )
        except sqlite3.OperationalError:
            return  # busy (another kernel is writing): it is only a cache
        except sqlite3.Error as exc:
            self._give_up(exc)

    def _give_up(self, exc: Exception) -> None:
        self._broken = True
        logger.debug("NBRewind: the file digest memo %s is turned off for this process: %s", self.path, exc)
        if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
            with contextlib.suppress(OSError):
                self.path.unlink()  # damaged: the next kernel starts a new one

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error), self._lock:
            self._conn.close()
