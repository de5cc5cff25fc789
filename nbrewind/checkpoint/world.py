"""Reads of the outside world that are not file contents: directory listings, file
metadata, databases opened by C code, environment variables, and the things a
replay can never reproduce (subprocesses, network connections).

`WorldTracker.tracking()` records them while a cell runs. A listing is recorded
with the names it returned, a stat with the facts it could reveal (missing, a
directory, or a regular file's size and content digest), an environment
variable by name (the session keys it on the value before the cell). Running a
subprocess or opening a connection makes the cell impure: it always runs.

Two sources feed it. Python's audit events (``os.listdir``, ``os.scandir``,
``glob.glob``, ``sqlite3.connect``, ``subprocess.Popen``, ``socket.connect``, ...)
come through one process-wide hook, installed once (audit hooks cannot be
removed) and idle unless a tracker is active. ``os.stat`` / ``os.lstat`` and
``os.environ``'s lookups raise no audit event, so they are wrapped while a cell
runs and put back afterwards.

What a library does for itself is not the cell's input: events whose nearest
caller outside the standard library's plumbing is Jupyter, Dask's scheduler
machinery, the import system or NBRewind are ignored. Everything else, including
a library acting for the cell (``pd.read_csv`` checking a path, fsspec listing a
glob), counts.
"""

from __future__ import annotations

import contextlib
import os
import stat as stat_module
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from nbrewind.identity.files import file_digest, listing_digest, quiet_reads
from nbrewind.identity.modules import is_local_module

__all__ = ["WorldTracker", "listing_key", "stat_key"]

# Modules that act on behalf of their caller: look past them to find who asked.
_PLUMBING = frozenset({
    "os", "posixpath", "genericpath", "ntpath", "pathlib", "glob", "fnmatch", "shutil", "subprocess", "socket",
    "sqlite3", "tempfile", "contextlib", "functools", "io", "codecs", "urllib", "http", "ssl", "threading",
    "concurrent", "asyncio", "selectors", "queue", "fsspec", "_collections_abc", "collections", "abc", "typing",
})
# Callers whose reads are their own business, never the cell's.
_OWN_BUSINESS = frozenset({
    "distributed", "tornado", "zmq", "ipykernel", "jupyter_client", "jupyter_core", "IPython", "nbrewind",
    "traitlets", "importlib", "zipimport", "pkgutil", "linecache", "inspect", "pkg_resources", "setuptools",
    "platformdirs", "psutil", "comm", "debugpy", "matplotlib_inline", "site", "sysconfig",
    "encodings", "warnings", "traceback", "tokenize", "logging", "weakref", "_pytest", "pytest", "pluggy",
    "jedi", "parso", "pygments", "prompt_toolkit", "stack_data", "executing", "nest_asyncio", "cloudpickle",
})
_IMPURE_EVENTS = {
    "subprocess.Popen": "starts a subprocess",
    "os.system": "starts a subprocess",
    "os.posix_spawn": "starts a subprocess",
    "os.spawn": "starts a subprocess",
    "os.exec": "replaces the process",
    "os.fork": "forks the process",
    "socket.connect": "opens a network connection",
    "socket.sendto": "sends over the network",
    "socket.sendmsg": "sends over the network",
    "urllib.Request": "makes a network request",
    "http.client.connect": "makes a network request",
}
_LISTING_EVENTS = frozenset({"os.listdir", "os.scandir"})

_active: tuple[WorldTracker, ...] = ()
_lock = threading.Lock()
_hook_installed = False
_busy = threading.local()  # set while the tracker itself lists or stats


def _asked_by_library(depth: int) -> bool:
    """Whether a request (a listing, a stat, a subprocess) is some library's own business.

    The stack is searched from the innermost frame out for the first frame that decides:
    the notebook's code (module ``__main__``, or a local module) makes it the cell's;
    Jupyter, distributed, the import system or NBRewind make it theirs. Other libraries
    in between (pandas, fsspec, dask's readers) act for whoever called them and are
    looked past. A stack with neither (a library's own thread) is the library's.
    """
    frame: Any = sys._getframe(depth)
    while frame is not None:
        module = frame.f_globals.get("__name__") or ""
        if module == "__main__" or _is_user_module(module):
            if _DEBUG:
                _who.append(_stack_names(depth + 1))
            return False
        if module.startswith("importlib._bootstrap") or module.split(".", 1)[0] in _OWN_BUSINESS:
            return True
        frame = frame.f_back
    return True


def _is_user_module(name: str) -> bool:
    known = _user_modules.get(name)
    if known is None:
        module = sys.modules.get(name)
        if module is None:
            return False
        _busy.on = True  # deciding may stat and read metadata: not the cell's reads
        try:
            known = _user_modules[name] = is_local_module(module)
        finally:
            _busy.on = False
    return known


_user_modules: dict[str, bool] = {}


_DEBUG = bool(os.environ.get("NBREWIND_DEBUG_WORLD"))
_who: list[str] = []


def _stack_names(depth: int) -> str:
    names: list[str] = []
    frame: Any = sys._getframe(depth)
    while frame is not None and len(names) < 12:
        names.append(f"{frame.f_globals.get('__name__')}:{frame.f_code.co_name}")
        frame = frame.f_back
    return " < ".join(names)


def listing_key(path: str) -> str:
    """Digest of the sorted names in a directory (`identity.files.listing_digest`), not
    recorded as the cell's listing."""
    _busy.on = True
    try:
        return listing_digest(path)
    finally:
        _busy.on = False


def stat_key(path: str, *, kind_only: bool = False) -> str:
    """What a stat of `path` can tell a deterministic cell: missing, a directory, or a file's size and content.

    Times, inode numbers and permissions are left out on purpose: they differ for the
    same data on another machine or after a copy, and a notebook whose output
    depends on them is not deterministic. With ``kind_only``, what an existence
    check (``os.path.exists``, ``isfile``, ``isdir``, ``Path.exists``) can tell:
    missing, a directory, a file or something else.
    """
    _busy.on = True
    try:
        try:
            info = _real_stat(path)
        except OSError:
            return "absent"
        if stat_module.S_ISDIR(info.st_mode):
            return "dir"
        if stat_module.S_ISREG(info.st_mode):
            return "file" if kind_only else f"file|{info.st_size}|{file_digest(path)}"
        return f"other|{stat_module.S_IFMT(info.st_mode)}"
    finally:
        _busy.on = False


# Callers of os.stat / os.lstat that return only whether a path exists and of what kind.
_KIND_CHECKS = frozenset({
    ("genericpath", "exists"), ("genericpath", "isfile"), ("genericpath", "isdir"), ("genericpath", "islink"),
    ("posixpath", "lexists"), ("posixpath", "islink"), ("ntpath", "lexists"), ("ntpath", "isdir"),
    ("pathlib", "exists"), ("pathlib", "is_file"), ("pathlib", "is_dir"), ("pathlib", "is_symlink"),
})
_PATH_MODULES = frozenset({"genericpath", "posixpath", "ntpath", "pathlib"})


def _asked_kind_only(depth: int) -> bool:
    """Whether the stat being made answers only an existence check (see `_KIND_CHECKS`)."""
    frame: Any = sys._getframe(depth)
    while frame is not None:
        module = frame.f_globals.get("__name__") or ""
        if module not in _PATH_MODULES:
            return False
        if (module, frame.f_code.co_name) in _KIND_CHECKS:
            return True
        frame = frame.f_back  # pathlib's exists() calls its own stat(), which calls os.stat
    return False


_BEFORE_OVERWRITE = frozenset({("PIL.Image", "save")})
"""Library functions that check whether the file they are about to write exists, only to
clean up after a failed write (PIL's `Image.save`, under matplotlib's `savefig`): the file's
prior kind is no input of the cell, which writes it either way."""


def _checked_before_overwrite(depth: int) -> bool:
    """Whether the existence check being made is one of `_BEFORE_OVERWRITE`'s."""
    frame: Any = sys._getframe(depth)
    while frame is not None:
        module = frame.f_globals.get("__name__") or ""
        if module not in _PATH_MODULES:
            return (module, frame.f_code.co_name) in _BEFORE_OVERWRITE
        frame = frame.f_back
    return False


_real_stat = os.stat
_real_lstat = os.lstat


class WorldTracker:
    """What one cell run read of the world besides file contents, and whether it did something impure.

    `excluded(path)` says which absolute paths are never inputs (the store, the
    interpreter's trees); `written(path)` whether the cell itself wrote a path
    already (its own output is not an input).
    """

    def __init__(self, excluded: Callable[[str], bool], written: Callable[[str], bool] | None = None) -> None:
        self._excluded = excluded
        self._written = written or (lambda path: False)
        self.listings: dict[str, str] = {}
        self.stats: dict[str, str] = {}
        self.kinds: dict[str, str] = {}
        """Paths only checked for existence, with what that check could tell (`stat_key(kind_only=True)`)."""
        self.env_reads: set[str] = set()
        self.env_listed = False
        self.impure: list[str] = []
        self.databases: dict[str, str | None] = {}
        """Database files opened by sqlite, with their digest when opened."""
        self._mutex = threading.Lock()

    def clear(self) -> None:
        """Forget what was recorded, for the next cell run."""
        with self._mutex:
            self.listings, self.stats, self.kinds, self.env_reads = {}, {}, {}, set()
            self.env_listed, self.impure, self.databases = False, [], {}

    @contextlib.contextmanager
    def tracking(self) -> Iterator[WorldTracker]:
        """Record while the block runs; os.stat, os.lstat and os.environ lookups are wrapped until it ends."""
        global _active
        _ensure_hook()
        with _lock:
            _active = (*_active, self)
        undo = _wrap_stat_and_environ()
        try:
            yield self
        finally:
            undo()
            with _lock:
                _active = tuple(t for t in _active if t is not self)

    # -- recording (called from any thread) --------------------------------------------

    def _path(self, raw: Any) -> str | None:
        if isinstance(raw, int) or raw is None:
            return None
        try:
            absolute = os.path.abspath(os.fsdecode(raw if raw != "" else "."))
        except (TypeError, ValueError):
            return None
        return None if self._excluded(absolute) else absolute

    def note_listing(self, raw: Any) -> None:
        path = self._path(raw)
        if path is not None and path not in self.listings:
            key = listing_key(path)
            with self._mutex:
                self.listings.setdefault(path, key)

    def note_stat(self, raw: Any, *, kind_only: bool = False) -> None:
        path = self._path(raw)
        if path is None or path in self.stats or self._written(path):
            return
        if kind_only:
            if path not in self.kinds:
                key = stat_key(path, kind_only=True)
                with self._mutex:
                    self.kinds.setdefault(path, key)
            return
        key = stat_key(path)
        with self._mutex:
            self.stats.setdefault(path, key)

    def note_database(self, raw: Any) -> None:
        path = self._path(raw)
        if path is not None and os.path.basename(path) != ":memory:" and path not in self.databases:
            digest = file_digest(path)
            with self._mutex:
                self.databases.setdefault(path, digest)

    def note_impure(self, why: str) -> None:
        with self._mutex:
            if why not in self.impure:
                self.impure.append(why)


def _audit_hook(event: str, args: tuple[Any, ...]) -> None:
    if not _active or getattr(_busy, "on", False) or getattr(quiet_reads, "on", False):
        return
    try:
        if event in _LISTING_EVENTS:
            if not _asked_by_library(2):
                for tracker in _active:
                    tracker.note_listing(args[0] if args else ".")
        elif event == "sqlite3.connect":
            if not _asked_by_library(2):
                for tracker in _active:
                    tracker.note_database(args[0])
        else:
            why = _IMPURE_EVENTS.get(event)
            if why is not None and not _asked_by_library(2):
                for tracker in _active:
                    tracker.note_impure(why)
    except Exception:  # noqa: BLE001 - an exception here would fail the user's call
        return


def _ensure_hook() -> None:
    global _hook_installed
    with _lock:
        if not _hook_installed:
            sys.addaudithook(_audit_hook)
            _hook_installed = True


def _wrap_stat_and_environ() -> Callable[[], None]:
    """Wrap os.stat, os.lstat and os._Environ's lookups; return the function that undoes it."""
    environ_type = type(os.environ)
    original_getitem = environ_type.__getitem__
    original_iter = environ_type.__iter__

    def observing(original: Callable[..., Any]) -> Callable[..., Any]:
        def stat(path: Any, *args: Any, **kwargs: Any) -> Any:
            if _active and not getattr(_busy, "on", False) and not getattr(quiet_reads, "on", False) and not kwargs.get("dir_fd"):
                try:
                    if not _asked_by_library(2):
                        kind_only = _asked_kind_only(2)
                        if kind_only and _checked_before_overwrite(2):
                            return original(path, *args, **kwargs)
                        for tracker in _active:
                            tracker.note_stat(path, kind_only=kind_only)
                except Exception:  # noqa: BLE001 - never fail the user's stat
                    pass
            return original(path, *args, **kwargs)

        stat.__wrapped__ = original  # type: ignore[attr-defined]
        return stat

    def getitem(self: Any, key: str) -> Any:
        if _active and self is os.environ and isinstance(key, str) and not getattr(_busy, "on", False):
            with contextlib.suppress(Exception):
                if not _asked_by_library(2):
                    for tracker in _active:
                        with tracker._mutex:
                            tracker.env_reads.add(key)
        return original_getitem(self, key)

    def iterate(self: Any) -> Any:
        if _active and self is os.environ and not getattr(_busy, "on", False):
            with contextlib.suppress(Exception):
                if not _asked_by_library(2):
                    for tracker in _active:
                        tracker.env_listed = True
        return original_iter(self)

    os.stat = observing(_real_stat)
    os.lstat = observing(_real_lstat)
    environ_type.__getitem__ = getitem  # type: ignore[method-assign]
    environ_type.__iter__ = iterate  # type: ignore[method-assign]

    def undo() -> None:
        os.stat = _real_stat
        os.lstat = _real_lstat
        environ_type.__getitem__ = original_getitem  # type: ignore[method-assign]
        environ_type.__iter__ = original_iter  # type: ignore[method-assign]

    return undo
