"""Files that pyarrow opens from C++, reported as the interpreter's own opens.

The file tracker (`hidden.FileTracker`) and the world tracker see a cell's files through
the interpreter's audit events: ``open`` (raised by `open()`, `io.open` and `os.open`) and
``os.scandir``/``os.listdir``. pyarrow opens and lists files in C++, so
``pd.read_parquet``, ``pq.write_table``, ``pyarrow.csv.read_csv`` and ``pyarrow.dataset``
were invisible: a changed Parquet input replayed stale output, and a Parquet file a
replayed cell wrote was not put back.

While :func:`reporting_native_io` is installed, pyarrow's entry points that take a local
path raise the same ``open`` event (``sys.audit``) for each file they will read or have
written, before the C++ code runs (after it, for a folder a dataset write fills), and list
a folder they read, so that a file added to a dataset folder is a changed input too.
Paths on other filesystems (``s3://``, a non-local ``filesystem=``) are not files of this
machine and are left alone. pyarrow is never imported here: the entry points are wrapped
right after the notebook's own import, and put back when the context exits.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from nbrewind.identity.files import quietly
from nbrewind.identity.imports import after_import

__all__ = ["reporting_native_io"]

READ, WRITE = "rb", "wb"

# module -> (attribute, the path argument's position and keyword, READ or WRITE). A
# position counts `self` for methods (`Class.__init__`).
_ENTRY_POINTS: dict[str, tuple[tuple[str, int, str, str], ...]] = {
    "pyarrow": (
        ("memory_map", 0, "path", READ),
        ("create_memory_map", 0, "path", WRITE),
        ("input_stream", 0, "source", READ),
        ("output_stream", 0, "source", WRITE),
    ),
    "pyarrow.parquet": (
        ("read_table", 0, "source", READ),
        ("read_schema", 0, "where", READ),
        ("read_metadata", 0, "where", READ),
        ("ParquetFile.__init__", 1, "source", READ),
        ("ParquetDataset.__init__", 1, "path_or_paths", READ),
        ("write_table", 1, "where", WRITE),
        ("write_metadata", 1, "where", WRITE),
        ("ParquetWriter.__init__", 1, "where", WRITE),
        ("write_to_dataset", 1, "root_path", WRITE),
    ),
    "pyarrow.csv": (
        ("read_csv", 0, "input_file", READ),
        ("open_csv", 0, "input_file", READ),
        ("write_csv", 1, "output_file", WRITE),
    ),
    "pyarrow.json": (("read_json", 0, "input_file", READ),),
    "pyarrow.orc": (
        ("read_table", 0, "source", READ),
        ("ORCFile.__init__", 1, "source", READ),
        ("write_table", 1, "where", WRITE),
    ),
    "pyarrow.dataset": (
        ("dataset", 0, "source", READ),
        ("write_dataset", 1, "base_dir", WRITE),
    ),
}


@contextlib.contextmanager
def reporting_native_io() -> Iterator[None]:
    """Wrap pyarrow's path-taking entry points (now if it is loaded, else right after its
    first import) so that the files they read and write raise ``open`` audit events."""
    with contextlib.ExitStack() as stack:
        for name, points in _ENTRY_POINTS.items():
            hook = after_import(name, functools.partial(_wrap_module, stack, points))
            if hook is not None:
                stack.callback(hook.remove)
        yield


def _wrap_module(stack: contextlib.ExitStack, points: tuple[tuple[str, int, str, str], ...], module: ModuleType) -> None:
    if module.__name__ == "pyarrow":
        _wrap_os_file(stack, module)
    for attribute, position, keyword, mode in points:
        owner: Any = module
        *classes, name = attribute.split(".")
        for part in classes:
            owner = getattr(owner, part, None)
        original = getattr(owner, name, None) if owner is not None else None
        if original is None or getattr(original, "__nbrewind_reports__", False):
            continue  # another pyarrow version: that entry point is not there
        wrapper = _reporting(original, position, keyword, mode)
        try:
            setattr(owner, name, wrapper)
        except (AttributeError, TypeError):  # an extension type: its methods are not ours to set
            continue
        stack.callback(setattr, owner, name, original)


def _wrap_os_file(stack: contextlib.ExitStack, module: ModuleType) -> None:
    """``pa.OSFile(path, mode)`` (what pandas' ``to_parquet`` writes through) opens in its
    C constructor, which cannot be wrapped; a subclass that reports first takes its name
    in the module for as long as the context lasts (its instances are OSFiles still)."""
    original: Any = getattr(module, "OSFile", None)
    if not isinstance(original, type) or getattr(original, "__nbrewind_reports__", False):
        return
    make: Any = original.__new__

    def __new__(cls: type, path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        return _reported(_local_paths(path, None), READ if "r" in mode else WRITE, lambda: make(cls, path, mode, *args, **kwargs))

    try:
        reporting = type("OSFile", (original,), {"__new__": __new__, "__module__": original.__module__,
                                                  "__doc__": original.__doc__, "__nbrewind_reports__": True})
    except TypeError:  # a final type in another pyarrow version
        return
    setattr(module, "OSFile", reporting)
    stack.callback(setattr, module, "OSFile", original)


def _reporting(original: Callable[..., Any], position: int, keyword: str, mode: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        source = kwargs.get(keyword) if keyword in kwargs else args[position] if len(args) > position else None
        return _reported(_local_paths(source, kwargs.get("filesystem")), mode, lambda: original(*args, **kwargs))

    wrapper.__nbrewind_reports__ = True  # type: ignore[attr-defined]
    return wrapper


def _reported(paths: list[str], mode: str, call: Callable[[], Any]) -> Any:
    """`call()`, with the opens of `paths` it reads (before it) or writes (a file before it,
    what it made in a folder after it) raised as audit events."""
    if mode == READ:
        for path in paths:
            _report_read(path)
        return call()
    before = {path: _files_under(path) for path in paths}
    for path in paths:
        if not os.path.isdir(path):
            sys.audit("open", path, WRITE, None)
    try:
        return call()
    finally:
        for path, found in before.items():
            _report_written_under(path, found)


def _local_paths(source: Any, filesystem: Any) -> list[str]:
    """The local paths `source` names (a path, a file:// URI, or a list of them), else []."""
    if filesystem is not None and "Local" not in type(filesystem).__name__:
        return []
    items = source if isinstance(source, (list, tuple)) else [source]
    paths = []
    for item in items:
        if isinstance(item, os.PathLike):
            item = os.fspath(item)
        if isinstance(item, bytes):
            item = os.fsdecode(item)
        if not isinstance(item, str):
            continue  # a file object (already seen when it was opened), a buffer, a NativeFile
        if "://" in item:
            if not item.startswith("file://"):
                continue  # another filesystem
            item = item.removeprefix("file://")
        paths.append(os.path.abspath(item))
    return paths


def _report_read(path: str) -> None:
    """A read of `path`: the file, or every file in the folder tree, whose listings the
    walk itself reports (``os.scandir`` events)."""
    if not os.path.isdir(path):
        sys.audit("open", path, READ, None)
        return
    for folder, _dirs, files in os.walk(path):
        for name in sorted(files):
            sys.audit("open", os.path.join(folder, name), READ, None)


def _files_under(path: str) -> dict[str, tuple[int, int, int]]:
    """Each file at or under `path` with its size, mtime and inode (none if it is absent)."""
    with quietly():  # looking, not reading: no listing of the cell's
        if not os.path.isdir(path):
            return {}
        found = {}
        for folder, _dirs, files in os.walk(path):
            for name in files:
                full = os.path.join(folder, name)
                with contextlib.suppress(OSError):
                    info = os.stat(full)
                    found[full] = (info.st_size, info.st_mtime_ns, info.st_ino)
        return found


def _report_written_under(path: str, before: dict[str, tuple[int, int, int]]) -> None:
    """After a write into the folder `path`: a write event for each file made or changed."""
    for full, signature in _files_under(path).items():
        if before.get(full) != signature:
            sys.audit("open", full, WRITE, None)
