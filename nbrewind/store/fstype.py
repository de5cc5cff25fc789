"""Which filesystem holds a store, and which SQLite journal its catalog may use there.

SQLite's WAL mode keeps its index in shared memory (the mmapped ``-shm`` file),
which only processes of one machine can share: on a filesystem that several
machines mount (NFS, Lustre, GPFS, CephFS, SMB...) two kernels on two nodes would
each see their own copy and corrupt the catalog. A rollback journal needs only
POSIX ``fcntl`` byte-range locks, which these filesystems forward to their server.
So the catalog of a store on a network filesystem uses a rollback journal
(TRUNCATE: the journal file is kept between transactions, so no file is created
and unlinked per commit on the server, and its presence tells a kernel on a local
mount of the same folder that the catalog is shared), and WAL everywhere else.

The filesystem is found in ``/proc/self/mountinfo`` (the mount with the longest
mount point that contains the resolved path; the last one when several share it),
else from ``statfs``'s magic number, else it is unknown and taken as local.
``NBREWIND_CATALOG_JOURNAL`` decides for filesystems that cannot be recognized.
This module imports no other nbrewind package except ``nbrewind.errors``.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nbrewind.errors import StoreError

__all__ = [
    "JOURNAL_ENV",
    "NETWORK_FS_TYPES",
    "Filesystem",
    "JournalChoice",
    "Mount",
    "choose_journal",
    "filesystem_of",
    "find_mount",
    "parse_mountinfo",
    "rollback_marker",
]

JOURNAL_ENV = "NBREWIND_CATALOG_JOURNAL"

NETWORK_FS_TYPES = frozenset({
    "nfs", "nfs4", "lustre", "gpfs", "ceph", "cifs", "smb3", "smbfs", "9p", "afs", "beegfs", "glusterfs",
    "ocfs2", "gfs2", "panfs", "orangefs", "pvfs2", "wekafs", "davfs", "ncpfs", "coda", "vboxsf", "vmhgfs",
})
"""Filesystem types whose files other machines can open at the same time (as mountinfo names them)."""

_NETWORK_FUSE = frozenset({
    "sshfs", "glusterfs", "ceph-fuse", "beegfs", "s3fs", "rclone", "gcsfuse", "goofys", "blobfuse",
    "blobfuse2", "juicefs", "quobyte", "mfs", "moosefs", "lizardfs", "cvmfs", "davfs",
})
"""FUSE subtypes (``fuse.<subtype>``) that are network filesystems."""

_FUSE_LOCAL_LOCKS = frozenset({"sshfs", "s3fs", "rclone", "gcsfuse", "goofys", "blobfuse", "blobfuse2", "davfs"})
"""FUSE subtypes that leave POSIX locks to the local kernel: other machines never see them."""

_STATFS_MAGIC = {
    0x6969: "nfs", 0xFF534D42: "cifs", 0xFE534D42: "smb3", 0x517B: "smbfs", 0x0BD00BD0: "lustre",
    0x47504653: "gpfs", 0x00C36400: "ceph", 0x19830326: "beegfs", 0x5346414F: "afs", 0x6B414653: "afs",
    0x01021997: "9p", 0x7461636F: "ocfs2", 0x01161970: "gfs2", 0xAAD7AAEA: "panfs", 0x73757245: "coda",
}
"""``statfs`` f_type values of network filesystems (linux/magic.h and the vendors' headers)."""

@dataclass(frozen=True)
class Mount:
    """One line of ``/proc/self/mountinfo``."""

    mount_point: str
    fstype: str
    source: str
    options: frozenset[str]
    """Mount options and superblock options together (``rw``, ``vers=4.2``, ``localflock``...)."""


@dataclass(frozen=True)
class Filesystem:
    """The filesystem a path lives on, as far as this machine can tell."""

    path: str
    """The path that was looked up, with symlinks resolved."""
    mount_point: str
    """Where that filesystem is mounted ('' when unknown)."""
    fstype: str
    """Its type as the kernel names it (``nfs4``, ``fuse.sshfs``, ``ext4``), '' when unknown."""
    source: str = ""
    options: frozenset[str] = frozenset()

    @property
    def network(self) -> bool:
        """Whether other machines may open the same files: a rollback journal is needed."""
        fstype = self.fstype.lower()
        if fstype.startswith("fuse."):
            return fstype[5:] in _NETWORK_FUSE
        return fstype in NETWORK_FS_TYPES

    @property
    def lock_caveat(self) -> str | None:
        """Why POSIX locks here may not reach other machines (None when they should), so
        two kernels on two machines must not write this store at the same time."""
        fstype, options = self.fstype.lower(), self.options
        if fstype in ("nfs", "nfs4"):
            local = "nolock" in options or "local_lock=posix" in options or "local_lock=all" in options
            return "it is mounted with nolock or local_lock, so its locks stay on this machine" if local else None
        if fstype == "lustre":
            if "flock" in options:
                return None
            return "it is mounted without the flock option, so its locks are local to each client or missing"
        if fstype == "beegfs":
            return "BeeGFS keeps fcntl locks on each client unless tuneUseGlobalFileLocks is set in beegfs-client.conf"
        if fstype.startswith("fuse.") and fstype[5:] in _FUSE_LOCAL_LOCKS:
            return f"{fstype[5:]} does not forward locks, so they stay on this machine"
        return None


@dataclass(frozen=True)
class JournalChoice:
    """The journal mode the catalog uses, and why."""

    mode: str
    """``wal``, ``truncate`` or ``delete`` (SQLite's journal_mode names)."""
    reason: str
    filesystem: Filesystem

    @property
    def rollback(self) -> bool:
        """Whether this is a rollback journal (any mode but WAL)."""
        return self.mode != "wal"

    def notice(self) -> str | None:
        """What a user of this store must know about the choice (None: nothing)."""
        fs = self.filesystem
        where = f"the store at {Path(fs.path).parent} is on {fs.fstype} ({fs.mount_point})"
        if fs.network and not self.rollback:
            return (
                f"NBRewind warning: {where}, a network filesystem, but {JOURNAL_ENV}=wal keeps its catalog in WAL "
                f"mode: that is safe only while every kernel and command using this store runs on this machine"
            )
        caveat = fs.lock_caveat if fs.network else None
        if caveat:
            return (
                f"NBRewind warning: {where} and {caveat}: kernels on two machines must not record into this store "
                f"at the same time (Dask workers elsewhere are fine: they never write the catalog)"
            )
        return None


def _unescape(field: str) -> str:
    r"""mountinfo writes space, tab, newline and backslash as ``\040``, ``\011``, ``\012``, ``\134``."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        code = field[i + 1 : i + 4]
        if field[i] == "\\" and len(code) == 3 and all(c in "01234567" for c in code):
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts a ``/proc/<pid>/mountinfo`` text lists, in its order (malformed lines skipped)."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        head, tail = left.split(), right.split()
        if len(head) < 6 or not tail:
            continue
        options = set(head[5].split(","))
        if len(tail) > 2:
            options.update(tail[2].split(","))
        mounts.append(Mount(_unescape(head[4]), _unescape(tail[0]), _unescape(tail[1]) if len(tail) > 1 else "", frozenset(options)))
    return mounts


def find_mount(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount holding the absolute, resolved ``path``: the longest mount point that
    contains it, and of equal ones the last mounted (it hides the others)."""
    best: Mount | None = None
    for mount in mounts:
        point = mount.mount_point.rstrip("/") or "/"
        holds = point == "/" or path == point or path.startswith(point + "/")
        if holds and (best is None or len(point) >= len(best.mount_point.rstrip("/") or "/")):
            best = mount
    return best


def _resolve(path: Path) -> str:
    """``path`` made absolute with symlinks resolved, through its nearest existing folder
    (a store that is about to be created lives where its parent lives)."""
    return os.path.realpath(os.path.abspath(path))


def _statfs_type(path: str) -> str:
    """The network filesystem type ``statfs`` reports for ``path`` ('' if none or unknown)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        buffer = ctypes.create_string_buffer(256)  # larger than struct statfs on every Linux ABI
        existing = path
        while not os.path.exists(existing) and os.path.dirname(existing) != existing:
            existing = os.path.dirname(existing)
        if libc.statfs(os.fsencode(existing), buffer) != 0:
            return ""
    except (OSError, AttributeError):
        return ""
    magic = ctypes.c_ulong.from_buffer(buffer).value & 0xFFFFFFFF
    return _STATFS_MAGIC.get(magic, "")


def filesystem_of(path: str | os.PathLike[str], *, mountinfo: str | None = None) -> Filesystem:
    """The filesystem that holds (or would hold) ``path``.

    ``mountinfo`` is the text of a mountinfo file (default: this process's); without
    one, ``statfs`` names network filesystems by their magic number.
    """
    resolved = _resolve(Path(path))
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text("utf-8", errors="surrogateescape")
        except OSError:
            mountinfo = ""
    mount = find_mount(resolved, parse_mountinfo(mountinfo)) if mountinfo else None
    if mount is not None:
        return Filesystem(resolved, mount.mount_point, mount.fstype, mount.source, mount.options)
    return Filesystem(resolved, "", _statfs_type(resolved))


def rollback_marker(db_path: Path) -> bool:
    """Whether the catalog at ``db_path`` is in rollback-journal mode and keeps its
    journal file: a kernel using it over a network filesystem made it so, and a kernel
    on the machine that exports that folder must not switch it to WAL under it."""
    journal = db_path.with_name(db_path.name + "-journal")
    try:
        with open(db_path, "rb") as file:
            header = file.read(20)
    except OSError:
        return False
    return len(header) == 20 and header[18:20] == b"\x01\x01" and journal.exists()


_MODES = {"wal": "wal", "rollback": "truncate", "truncate": "truncate", "delete": "delete"}


def choose_journal(
    db_path: Path, *, environ: Mapping[str, str] | None = None, mountinfo: str | None = None
) -> JournalChoice:
    """The journal mode for a writable catalog at ``db_path``.

    ``NBREWIND_CATALOG_JOURNAL`` (``wal``, ``rollback`` = ``truncate``, ``delete``)
    wins; else a rollback journal on a network filesystem, or where a rollback
    journal is already in use (`rollback_marker`), and WAL everywhere else.
    """
    env = os.environ if environ is None else environ
    filesystem = filesystem_of(db_path, mountinfo=mountinfo)
    wanted = env.get(JOURNAL_ENV, "").strip().lower()
    if wanted and wanted != "auto":
        mode = _MODES.get(wanted)
        if mode is None:
            raise StoreError(
                f"{JOURNAL_ENV}={wanted!r} is not a journal mode NBRewind knows: set it to auto, wal (every process "
                f"using the store runs on one machine) or rollback (the store is shared between machines), or unset it"
            )
        return JournalChoice(mode, f"{JOURNAL_ENV}={wanted}", filesystem)
    if filesystem.network:
        return JournalChoice(
            "truncate", f"the store is on {filesystem.fstype} at {filesystem.mount_point}, a network filesystem", filesystem
        )
    if rollback_marker(db_path):
        return JournalChoice(
            "truncate", "the catalog keeps a rollback journal, as kernels reaching it over a network filesystem left it",
            filesystem,
        )
    return JournalChoice("wal", f"the store is on {filesystem.fstype or 'a local filesystem'}", filesystem)
