"""Hidden state a cell run depends on or changes besides its variables.

A faithful repeat must also carry the global RNG states, the files a cell
reads and writes, the environment variables it sets and the working
directory.  Each piece here is small: a digest or snapshot function, and a
:class:`FileTracker` that records file opens through an audit hook.
"""

from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from nbrewind.checkpoint.world import listing_key, stat_key
from nbrewind.identity.files import SYSTEM_ROOTS, file_digest, quiet_reads

__all__ = [
    "FileTracker",
    "cwd",
    "default_exclusions",
    "env_diff",
    "env_snapshot",
    "file_digest",
    "in_temp_folder",
]

# File tracking
#
# sys.addaudithook cannot be undone, so one process-wide hook is installed the
# first time any FileTracker starts tracking, and it returns after two cheap
# checks unless a tracker is active.  The active set is an immutable tuple
# swapped under a lock, so the hook reads it without locking.

_active: tuple[FileTracker, ...] = ()
_active_lock = threading.Lock()
_hook_installed = False
_quiet = quiet_reads  # set while NBRewind itself reads files, so they are not recorded


def _audit_hook(event: str, args: tuple[Any, ...]) -> None:
    if not _active or getattr(_quiet, "on", False):
        return
    if event != "open":
        if event in _CHANGE_EVENTS:
            _changed(event, args)
        return
    try:
        path, mode, flags = args
        if isinstance(path, int):  # open(fd): no path to track
            return
        if isinstance(flags, int) and flags & getattr(os, "O_DIRECTORY", 0):
            return  # a directory (O_TMPFILE makes an unnamed file in it): no file content to track
        absolute = os.path.abspath(os.fsdecode(path))
        reads, writes = _access(mode, flags)
        if writes and os.path.isdir(absolute):
            return  # io.open(dir, "w+", opener=...) as tempfile does for O_TMPFILE
        thread = threading.get_ident()
        for tracker in _active:
            tracker._record(absolute, reads, writes, thread)
    except Exception:  # noqa: BLE001 - an exception here would fail the user's open()
        return


# Events that change a path without opening it: (event -> positions of (path, dir_fd)
# argument pairs among the event's arguments). A removed, renamed or truncated file is
# written as far as a replay goes: the recorder finds it gone (or changed) after the cell.
_CHANGE_EVENTS: dict[str, tuple[tuple[int, int | None], ...]] = {
    "os.remove": ((0, 1),),
    "os.mkdir": ((0, 2),),
    "os.rmdir": ((0, 1),),
    "os.truncate": ((0, None),),
    "os.rename": ((0, 2), (1, 3)),
    "os.link": ((1, 3),),
    "os.symlink": ((1, 2),),
    "shutil.rmtree": ((0, 1),),
}


def _event_path(path: object, dir_fd: object) -> str | None:
    """The absolute path an event names (relative to `dir_fd` when it has one), or None."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        return None  # a file descriptor: no path to track
    text = os.fsdecode(os.fspath(path))
    if isinstance(dir_fd, int) and dir_fd >= 0 and not os.path.isabs(text):  # -1: no dir_fd
        try:
            text = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), text)
        except OSError:
            return None
    return os.path.abspath(text)


def _below(root: str) -> list[str]:
    """Every path under the directory `root` (not following links)."""
    found: list[str] = []
    for folder, dirs, files in os.walk(root):
        found += [os.path.join(folder, name) for name in (*dirs, *files)]
    return found


def _changed(event: str, args: tuple[Any, ...]) -> None:
    """Record the paths a removal, rename, link or truncation changes, before it happens,
    and what its outcome depends on (`FileTracker.found`).

    A directory that is removed or renamed is recorded with everything under it (as it
    is now): a replay removes the tree, and files moved with it are written where they go.
    """
    # NBRewind's own look at the paths is no listing or stat of the cell's.
    quiet_before = getattr(_quiet, "on", False)
    _quiet.on = True
    try:
        thread = threading.get_ident()
        paths = [_event_path(args[p], args[d] if d is not None and d < len(args) else None) for p, d in _CHANGE_EVENTS[event]]
        facts = _depends_on(event, args, paths)
        first = paths[0]
        if first is not None and _is_tree(first) and event in ("os.rename", "shutil.rmtree"):
            below = _below(first)
            paths += below
            if event == "os.rename" and paths[1] is not None:
                paths += [paths[1] + p[len(first):] for p in below]
                facts += [("listing" if _is_tree(p) else "stat", p) for p in [first, *below]]
        found = {(how, path): _fact(how, path) for how, path in facts if path is not None}
        for tracker in _active:
            tracker._note_found(found, thread)
        for path in paths:
            if path is None:
                continue
            is_dir = _is_tree(path)
            for tracker in _active:
                tracker._record(path, False, True, thread, is_dir=is_dir, made_dir=event == "os.mkdir")
    except Exception:  # noqa: BLE001 - an exception here would fail the user's call
        return
    finally:
        _quiet.on = quiet_before


def _is_tree(path: str) -> bool:
    return os.path.isdir(path) and not os.path.islink(path)


def _depends_on(event: str, args: tuple[Any, ...], paths: list[str | None]) -> list[tuple[str, str | None]]:
    """What the outcome of a change event depends on besides the cell: whether its target
    exists (and is a file or a folder: "kind"), the content a file moved, linked or
    truncated had ("stat"); a renamed folder adds its listings and files (see `_changed`)."""
    if event in ("os.remove", "os.rmdir", "shutil.rmtree"):
        return [("kind", paths[0])]
    if event == "os.mkdir":
        # Making a folder fails if the path exists, unless the caller asked to tolerate that.
        return [] if _tolerates_existing() else [("kind", paths[0])]
    if event == "os.truncate":
        return [("stat", paths[0])]
    if event == "os.rename":
        return [("stat", paths[0]), ("kind", paths[1])]
    # os.link(src, dst, ...) and os.symlink(src, dst, ...): the new name shows src's content
    dst = paths[0]
    src = _event_path(args[0], args[2] if event == "os.link" and len(args) > 2 else None)
    if event == "os.symlink" and src is not None and dst is not None and not os.path.isabs(os.fsdecode(args[0])):
        src = os.path.abspath(os.path.join(os.path.dirname(dst), os.fsdecode(args[0])))
    return [("stat", src), ("kind", dst)]


def _tolerates_existing() -> bool:
    """Whether the `os.mkdir` being made is `os.makedirs(..., exist_ok=True)`'s or
    `Path.mkdir(..., exist_ok=True)`'s: its outcome is the same whether the folder existed."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return False
    import pathlib

    if frame.f_code not in (os.makedirs.__code__, pathlib.Path.mkdir.__code__):
        return False
    return bool(frame.f_locals.get("exist_ok"))


def _fact(how: str, path: str) -> str:
    """The key of one thing a change depends on, as `Pseudo.KIND`, `STAT` or `LISTING` inputs key it."""
    if how == "listing":
        return listing_key(path)
    return stat_key(path, kind_only=how == "kind")


def _ensure_hook() -> None:
    global _hook_installed
    with _active_lock:
        if not _hook_installed:
            sys.addaudithook(_audit_hook)
            _hook_installed = True


def _access(mode: object, flags: object) -> tuple[bool, bool]:
    """(reads, writes) for an ``open`` audit event.

    builtins.open passes a str mode; os.open passes mode None and int flags.
    Appending counts as a read too: the file's final content depends on what
    was there before.  Truncating read-write opens only write.
    """
    if isinstance(mode, str) and mode:
        if "r" in mode:
            return True, "+" in mode
        if "a" in mode:
            return True, True
        return False, True  # "w" and "x" create or truncate
    if not isinstance(flags, int):
        return True, False
    access = flags & os.O_ACCMODE
    if access == os.O_RDONLY:
        return True, False
    if flags & os.O_APPEND:
        return True, True
    if access == os.O_WRONLY or flags & os.O_TRUNC:
        return False, True
    return True, True


def default_exclusions() -> list[str]:
    """Roots whose opens are never a cell's data: the interpreter and system trees."""
    roots = set(SYSTEM_ROOTS)
    for scheme_vars in ({}, {"base": sys.base_prefix, "platbase": sys.base_prefix}):
        paths = sysconfig.get_paths(vars=scheme_vars)
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):
            if paths.get(key):
                roots.add(paths[key])
    return sorted(roots)


_CLUSTER_SCRATCH = ("dask-scratch-space", "dask-worker-space")


class FileTracker:
    """Records which files are opened for reading and writing during a cell run.

    ``exclude`` adds roots (the store directory, say) to
    :func:`default_exclusions`.  With ``all_threads`` (the default) opens from
    every thread count while tracking, because Dask's threaded tasks read files
    on behalf of the cell; otherwise only the thread that entered
    :meth:`tracking`.
    """

    def __init__(self, exclude: Iterable[str | os.PathLike[str]] = (), *, all_threads: bool = True) -> None:
        roots = [*default_exclusions(), *(os.fspath(root) for root in exclude)]
        self._roots = tuple(sorted({_as_root(root) for root in roots}))
        self.all_threads = all_threads
        self.reads: set[str] = set()
        self.writes: set[str] = set()
        self.read_digests: dict[str, str | None] = {}
        """Digest of each read file when the cell first opened it (None: missing)."""
        self.created: set[str] = set()
        """Written files that did not exist when the cell first opened them: one it also
        removed again (a scratch file, `tempfile`'s probe of the temp dir) left nothing."""
        self.found: dict[tuple[str, str], str] = {}
        """What removals, renames, links and truncations depended on, found before the cell
        changed it: ("kind" | "stat" | "listing", path) -> key, for paths the cell had not
        opened or changed before (`Pseudo.KIND`, `STAT` and `LISTING` inputs of the cell)."""
        self.made_dirs: set[str] = set()
        """Folders the cell made (`os.mkdir`, `os.makedirs`, `Path.mkdir`; in `writes` too):
        one that is there after the cell is made again by a replay."""
        self.dirs: set[str] = set()
        """Written paths that were directories when the cell removed or renamed them (they
        are in `writes` too): one that is gone after the cell is removed, tree and all, by a replay."""
        self._owner: int | None = None
        self._lock = threading.Lock()

    def excluded(self, path: str) -> bool:
        """Whether an absolute ``path`` lies under one of the exclusion roots, or in the
        scratch space of a Dask cluster (its lock files and worker directories, wherever
        ``temporary-directory`` puts them): that follows the cluster, not the notebook."""
        if any(path == root or path.startswith(root + os.sep) for root in self._roots):
            return True
        return any(f"{os.sep}{part}{os.sep}" in path or path.endswith(os.sep + part) for part in _CLUSTER_SCRATCH)

    def clear(self) -> None:
        """Forget what was recorded, to reuse the tracker for another cell run."""
        with self._lock:
            self.reads = set()
            self.writes = set()
            self.read_digests = {}
            self.created = set()
            self.dirs = set()
            self.made_dirs = set()
            self.found = {}

    @contextlib.contextmanager
    def tracking(self) -> Iterator[FileTracker]:
        """Record opens while the block runs; yields the tracker itself."""
        global _active
        _ensure_hook()
        self._owner = threading.get_ident()
        with _active_lock:
            _active = (*_active, self)
        try:
            yield self
        finally:
            with _active_lock:
                _active = tuple(tracker for tracker in _active if tracker is not self)
            self._owner = None

    def _note_found(self, found: dict[tuple[str, str], str], thread: int) -> None:
        if not self.all_threads and thread != self._owner:
            return
        with self._lock:
            for (how, path), key in found.items():
                if path in self.reads or path in self.writes or self.excluded(path):
                    continue  # the cell made it, or its read already keys the content
                self.found.setdefault((how, path), key)

    def _record(self, path: str, reads: bool, writes: bool, thread: int, *, is_dir: bool = False, made_dir: bool = False) -> None:
        if not self.all_threads and thread != self._owner:
            return
        if self.excluded(path):
            return
        if is_dir or made_dir:
            with self._lock:
                (self.dirs if is_dir else self.made_dirs).add(path)
        with self._lock:
            first_read = reads and path not in self.reads and path not in self.writes
            first_touch = writes and path not in self.reads and path not in self.writes
        if first_touch and not os.path.lexists(path):
            with self._lock:
                self.created.add(path)
        if first_read:
            # The audit event comes before the open: this is the content the cell
            # found (an append depends on it), unless the cell itself wrote it first.
            self.read_digests[path] = file_digest(path)
        with self._lock:
            if reads:
                self.reads.add(path)
            if writes:
                self.writes.add(path)


def _as_root(root: str) -> str:
    # "" stands for the filesystem root, so "root + os.sep" is a prefix of everything under it
    return os.path.abspath(root).rstrip(os.sep)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def in_temp_folder(path: str, notebook_dir: str | os.PathLike[str]) -> bool:
    """Whether the absolute, resolved `path` lies in the temp folder (`tempfile.gettempdir()`)
    rather than among the notebook's own files (those under `notebook_dir`, the kernel's
    start folder).

    A replay writes back a temp file a cell left only when user code runs again (no later
    cell may ever read it). A notebook whose own folder is the temp folder or inside it (a
    scratch checkout in a CI job) owns the files in that folder: they are its output.
    """
    temp = _as_root(os.path.realpath(tempfile.gettempdir()))
    own = _as_root(os.path.realpath(notebook_dir))
    path = _as_root(path)
    return _within(path, temp) and not (_within(path, own) and _within(own, temp))


# Environment and working directory


def env_snapshot() -> dict[str, str]:
    """A copy of the process environment."""
    return dict(os.environ)


def env_diff(before: dict[str, str], after: dict[str, str]) -> dict[str, str | None]:
    """Variables set or changed (new value) and removed (None) between two snapshots."""
    diff: dict[str, str | None] = {name: value for name, value in after.items() if before.get(name) != value}
    diff.update({name: None for name in before if name not in after})
    return diff


def cwd() -> str:
    """The current working directory, which a cell can change with os.chdir."""
    return os.getcwd()
