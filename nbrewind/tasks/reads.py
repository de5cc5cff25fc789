"""What a task read from the local disk while it ran, so its cached result is used only while
that is unchanged.

A task's fingerprint covers the files named in its arguments and code. A task that builds
its paths while it runs (``open(f"data/part{i}.csv")``, ``glob.glob(folder + "/*.csv")``,
``os.listdir(folder)``) reads files no fingerprint names: after one of them changed, its
cached result was served again. So while a cache miss runs, the files it opens for reading
and the folders it lists are noted, through the interpreter's audit events, on the task's own
thread, and stored with its result (`digest_reads`): ``{"files": {path: digest}, "dirs":
{path: listing digest}}``, paths relative to the working folder where under it, else absolute. Such a result also gets a ref in
:data:`READS_REFS`, so a lookup knows which fingerprints to check without reading every entry.
A task that read only files its fingerprint names, with the digests the fingerprint embeds
(`clean(path)`, the common case: `covered_by`), gets neither: an edit of those files already
changes its fingerprint.
Before a graph is rewritten, `changed_reads` names the fingerprints whose recorded reads no
longer hold; those tasks and every task downstream of them run uncached.

Not seen: files opened in native code (pyarrow's C++ readers on a worker process), by threads
the task starts, or by another process; reads of library and store files are not the task's,
nor those under ``/proc``, ``/sys`` and ``/dev`` (the kernel's own file tracker leaves them out
too): they describe the running system, not data, and a garbage collection during the task
runs distributed's callback that reads the worker's ``/proc/<pid>/statm`` on the task's thread.
The audit hook, once added, stays for the life of the process (the interpreter cannot remove
one); outside a recording task it returns at once.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from nbrewind.identity.files import SYSTEM_ROOTS, file_digest, listing_digest, quiet_reads, quietly
from nbrewind.identity.modules import library_kind
from nbrewind.store.objects import ObjectStore
from nbrewind.tasks.results import read_entry

__all__ = ["READS_REFS", "changed_reads", "covered_by", "digest_reads", "recording_reads", "reads_hold"]

READS_REFS = "task-reads"
"""Ref namespace: fingerprint -> result entry, for results whose record holds ``reads``."""

ABSENT = "absent"

_local = threading.local()
_hook_added = False
_hook_lock = threading.Lock()
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_SYSTEM_PREFIXES = tuple(root + "/" for root in SYSTEM_ROOTS)


def _system(path: str) -> bool:
    """Whether an absolute ``path`` lies under ``/proc``, ``/sys`` or ``/dev``."""
    return path.startswith(_SYSTEM_PREFIXES) or path in SYSTEM_ROOTS


class _Reads:
    def __init__(self, skip: tuple[str, ...]) -> None:
        self.files: dict[str, None] = {}
        self.written: set[str] = set()
        self.dirs: dict[str, None] = {}
        self.skip = skip


def _hook(event: str, args: tuple[Any, ...]) -> None:
    reads = getattr(_local, "reads", None)
    if reads is None or getattr(quiet_reads, "on", False):
        return
    if event == "open":
        path, mode, flags = args
        if isinstance(path, int) or path is None:
            return
        write = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & _WRITE_FLAGS)
        where = _absolute(path)
        if where is None or where.startswith(reads.skip) or _system(where):
            return
        if write:
            reads.written.add(where)
        else:
            reads.files[where] = None
    elif event in ("os.listdir", "os.scandir"):
        if sys._getframe(1).f_code.co_filename.startswith("<frozen importlib"):
            return  # the import system filling its cache of a sys.path folder: which module an import finds is read as its file
        where = _absolute(args[0] if args and args[0] is not None else ".")
        if where is not None and not where.startswith(reads.skip) and not _system(where):
            reads.dirs[where] = None


def _absolute(path: Any) -> str | None:
    try:
        text = os.fsdecode(path)
    except TypeError:
        return None
    return os.path.abspath(text)


def _ensure_hook() -> None:
    global _hook_added
    if _hook_added:
        return
    with _hook_lock:
        if not _hook_added:
            sys.addaudithook(_hook)
            _hook_added = True


@contextmanager
def recording_reads(skip: Iterable[str] = ()) -> Iterator[_Reads]:
    """Note what this thread opens for reading and lists within the block (paths under
    ``skip`` folders, such as the store, are left out); see `digest_reads`."""
    _ensure_hook()
    outer = getattr(_local, "reads", None)
    reads = _Reads(tuple(os.path.join(os.path.abspath(s), "") for s in skip))
    _local.reads = reads
    try:
        yield reads
    finally:
        _local.reads = outer
        if outer is not None:  # a task run inside another (a nested compute): its reads are the outer one's too
            outer.files.update(reads.files)
            outer.written |= reads.written
            outer.dirs.update(reads.dirs)


def _file_key(path: str) -> str:
    return file_digest(path) or ABSENT


def digest_reads(reads: _Reads) -> dict[str, dict[str, str]] | None:
    """What `recording_reads` noted, as it is now: the content digest of each file read
    (not one the task also wrote: that is its output) and of each folder listed; None when
    the task read nothing that counts. Files of installed libraries are left out."""
    with quietly():
        return _digest_reads(reads)


def _digest_reads(reads: _Reads) -> dict[str, dict[str, str]] | None:
    here = os.path.join(os.getcwd(), "")
    files: dict[str, str] = {}
    for path in reads.files:
        path = _source_of(path)
        if path in reads.written or os.path.isdir(path) or library_kind(path) is not None:
            continue
        files[_portable(path, here)] = _file_key(path)
    dirs = {
        _portable(path, here): listing_digest(path)
        for path in reads.dirs
        if library_kind(os.path.join(path, "")) is None and os.path.basename(path) != "__pycache__"
    }
    if not files and not dirs:
        return None
    return {"files": files, "dirs": dirs}


def covered_by(recorded: Mapping[str, Any], files: Iterable[tuple[str, str]]) -> bool:
    """Whether a task's fingerprint already embeds everything ``recorded`` (`digest_reads`)
    holds: it listed no folder, and each file it read is one of the fingerprint's ``files``
    (absolute path, digest) with the same digest now. Such a record would only repeat the
    fingerprint's own check at the next lookup; a file that changed between submission and
    the read keeps it."""
    if recorded.get("dirs"):
        return False
    known = dict(files)
    return all(known.get(os.path.abspath(path)) == digest for path, digest in recorded.get("files", {}).items())


def _source_of(path: str) -> str:
    """The ``.py`` an import compiled ``__pycache__/m.cpython-311.pyc`` from, for that read.

    The cache file says nothing a task can rely on: it is rewritten only when the module is
    next imported, after the check that would have to see the edit, and another folder or
    machine has its own (or none). A ``.pyc`` without its source stays itself."""
    if not path.endswith(".pyc") or os.path.basename(os.path.dirname(path)) != "__pycache__":
        return path
    try:
        source = importlib.util.source_from_cache(path)
    except (ValueError, NotImplementedError):
        return path
    return source if os.path.exists(source) else path


def _portable(path: str, here: str) -> str:
    # Under the working folder: relative to it, as a repeat in another folder (or on
    # another machine) finds the notebook's files; anything else stays absolute.
    return path[len(here):] if path.startswith(here) else path


def reads_hold(recorded: Any) -> bool:
    """Whether every file and folder in a result's recorded ``reads`` is as it was (relative
    paths are resolved against this process's working folder)."""
    if not isinstance(recorded, Mapping):
        return False
    files, dirs = recorded.get("files", {}), recorded.get("dirs", {})
    if not isinstance(files, Mapping) or not isinstance(dirs, Mapping):
        return False
    with quietly():
        return all(_file_key(str(p)) == d for p, d in files.items()) and all(listing_digest(str(p)) == d for p, d in dirs.items())


def changed_reads(objects: ObjectStore, fingerprints: Iterable[str]) -> set[str]:
    """The fingerprints among ``fingerprints`` whose cached result recorded reads that no
    longer hold (or cannot be checked). One listing of :data:`READS_REFS`, then one entry
    read per fingerprint that has reads."""
    wanted = set(fingerprints)
    having = _names_in(os.path.join(objects.refs_dir, READS_REFS))
    out = set()
    for fp in wanted & having:
        try:
            entry = objects.ref_get(READS_REFS, fp)
            if entry is None:
                continue
            _, meta = read_entry(objects, entry)
            if not reads_hold(meta.get("reads")):
                out.add(fp)
        except Exception:  # an unreadable record cannot vouch for the result
            out.add(fp)
    return out


def _names_in(folder: str) -> set[str]:
    names: set[str] = set()
    try:
        fans = os.scandir(folder)
    except OSError:
        return names
    with fans:
        for fan in fans:
            if not fan.is_dir():
                continue
            try:
                names.update(e.name for e in os.scandir(fan.path) if not e.name.startswith("."))
            except OSError:
                continue
    return names
