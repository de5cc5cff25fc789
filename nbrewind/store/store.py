"""The store facade: one directory with an object area, refs and a catalog.

``Store.open`` recognizes a store by its marker file and refuses to adopt a
folder that holds anything else, so pointing NBREWIND_STORE at the wrong place
cannot scatter objects through a user's files. ``resolve_store_path`` decides
where a notebook's store lives.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Mapping
from pathlib import Path

from nbrewind.errors import NotAStoreError, ReadOnlyStoreError, SchemaTooNewError, StoreError
from nbrewind.store.catalog import Catalog
from nbrewind.store.fsio import TEMP_PREFIX, atomic_write, store_error_from_os
from nbrewind.store.objects import ObjectStore

__all__ = ["CATALOG_NAME", "MARKER_NAME", "STORE_FORMAT_VERSION", "Store", "damaged_catalog_message", "resolve_store_path"]

MARKER_NAME = "nbrewind-store.json"
CATALOG_NAME = "catalog.sqlite"
STORE_FORMAT = "nbrewind-store"
STORE_FORMAT_VERSION = 1


def damaged_catalog_message(path: Path, problem: object) -> str:
    """What to tell the user about a catalog SQLite cannot read: which file, and what
    to do (the objects beside it are unaffected and are reused by a new history)."""
    return (
        f"the catalog {path} is damaged ({problem}): restore it from a backup or a backpack, or move it "
        f"aside and run the notebook on the audit kernel to record a new history (the stored objects are "
        f"reused); `jupyter nbrewind verify` checks the objects"
    )


def resolve_store_path(
    environ: Mapping[str, str] | None = None,
    notebook_path: str | os.PathLike[str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Path:
    """Where the store for this kernel lives.

    ``NBREWIND_STORE`` wins; else ``<notebook path>.nbrewind`` beside the notebook
    (``notebook_path`` as given by the kernel, else ``JPY_SESSION_NAME`` when it
    names an ``.ipynb`` file); else ``<cwd>/.nbrewind``. Relative paths are taken
    against ``cwd`` (default: the current directory). Nothing is created.
    """
    env = os.environ if environ is None else environ
    base = Path(cwd) if cwd is not None else Path.cwd()
    explicit = env.get("NBREWIND_STORE")
    if explicit:
        return base / Path(explicit).expanduser()
    if notebook_path is None:
        session_name = env.get("JPY_SESSION_NAME", "")
        if session_name.endswith(".ipynb"):
            notebook_path = session_name
    if notebook_path is not None and str(notebook_path):
        notebook = base / Path(notebook_path).expanduser()
        return notebook.with_name(notebook.name + ".nbrewind")
    return base / ".nbrewind"


class Store:
    """An open store: ``.root``, ``.objects`` (ObjectStore) and ``.catalog`` (Catalog).

    Close it (or use it as a context manager) to release the catalog connection.
    """

    def __init__(
        self, root: Path, objects: ObjectStore, catalog: Catalog, *, readonly: bool, catalog_recreated: bool = False
    ) -> None:
        self.root = root
        self.objects = objects
        self.catalog = catalog
        self.readonly = readonly
        self.catalog_recreated = catalog_recreated
        """The catalog was missing or empty although objects were stored: its history is lost
        (the objects are reused). Opening made a new one; callers say so."""

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r}, readonly={self.readonly})"

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        readonly: bool = False,
        compression_level: int = 1,
    ) -> Store:
        """Open the store at ``path``, creating it when ``create`` and it does not
        exist or is an empty folder.

        Raises NotAStoreError for a file or a non-empty folder without the marker
        (or a missing folder when not creating), SchemaTooNewError for a store or
        catalog from a newer NBRewind, ReadOnlyStoreError when ``readonly`` is
        false but the folder cannot be written.
        """
        root = Path(path).absolute()
        marker = root / MARKER_NAME
        if not marker.is_file():
            if not create or readonly:
                raise NotAStoreError(f"{root} is not an NBRewind store (no {MARKER_NAME})")
            cls._initialize(root)
        cls._check_marker(marker)
        if not readonly and not os.access(root, os.W_OK):
            raise ReadOnlyStoreError(
                f"the store at {root} cannot be written; open it read-only or point NBREWIND_STORE elsewhere"
            )
        objects = ObjectStore(root, readonly=readonly, compression_level=compression_level)
        catalog_path = root / CATALOG_NAME
        recreated = not readonly and _empty_file(catalog_path) and _holds_objects(root)
        try:
            catalog = Catalog(catalog_path, readonly=readonly)
        except sqlite3.Error as exc:
            # The catalog translates what it expects; a damaged file can fail anywhere.
            raise StoreError(damaged_catalog_message(root / CATALOG_NAME, exc)) from exc
        return cls(root, objects, catalog, readonly=readonly, catalog_recreated=recreated)

    @staticmethod
    def _initialize(root: Path) -> None:
        if root.exists() and not root.is_dir():
            raise NotAStoreError(f"{root} is a file, not an NBRewind store")
        if root.is_dir():
            # Another process creating the same store at this instant leaves only
            # its marker's temporary file; that does not make the folder foreign.
            foreign = [e for e in os.listdir(root) if not e.startswith(TEMP_PREFIX) and e != MARKER_NAME]
            if foreign:
                raise NotAStoreError(
                    f"{root} is not empty and is not an NBRewind store (no {MARKER_NAME}); "
                    f"choose an empty or new folder"
                )
        text = json.dumps({"format": STORE_FORMAT, "version": STORE_FORMAT_VERSION}) + "\n"
        try:
            root.mkdir(parents=True, exist_ok=True)
            # The marker goes first: a concurrent creator then never sees a
            # half-built folder without it. (Writers create object folders lazily.)
            atomic_write(root / MARKER_NAME, (text.encode("ascii"),), mode=0o644)
            (root / "objects").mkdir(exist_ok=True)
            (root / "refs").mkdir(exist_ok=True)
            # All 256 fan-out folders up front: the first large put then spends
            # its time writing, not creating folders.
            for index in range(256):
                (root / "objects" / f"{index:02x}").mkdir(exist_ok=True)
        except OSError as exc:
            mapped = store_error_from_os(exc, root)
            if mapped is None:
                raise
            raise mapped from exc

    @staticmethod
    def _check_marker(marker: Path) -> None:
        try:
            info = json.loads(marker.read_text("utf-8"))
            fmt, version = info["format"], int(info["version"])
        except (ValueError, KeyError, TypeError):
            raise NotAStoreError(f"{marker} is not a valid NBRewind store marker") from None
        if fmt != STORE_FORMAT:
            raise NotAStoreError(f"{marker} is not an NBRewind store marker (format {fmt!r})")
        if version > STORE_FORMAT_VERSION:
            raise SchemaTooNewError(
                f"the store at {marker.parent} has format version {version}; this NBRewind reads up to "
                f"{STORE_FORMAT_VERSION}. Upgrade nbrewind to use it"
            )

    def close(self) -> None:
        """Release the catalog connection."""
        self.catalog.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _empty_file(path: Path) -> bool:
    try:
        return path.stat().st_size == 0
    except FileNotFoundError:
        return True


def _holds_objects(root: Path) -> bool:
    """Whether any object was ever stored (only asked when the catalog is missing)."""
    objects = root / "objects"
    try:
        folders = list(os.scandir(objects))
    except OSError:
        return False
    for folder in folders:
        if folder.is_dir():
            with os.scandir(folder.path) as entries:
                if any(not e.name.startswith(TEMP_PREFIX) for e in entries):
                    return True
    return False
