"""``unpack``: verify a backpack completely, then make it a working folder in
one rename.

Everything is extracted into a temporary folder beside the destination; only
when every entry matched the manifest and the store verified is it renamed to
the destination. Any failure removes the temporary folder, so nothing partial
is ever visible and nothing is written outside the destination's parent.

A backpack holds one store, its own, at ``nbrewind/``. One that carries anything
store-like elsewhere (a store marker or catalog file, or a ``.nbrewind`` /
``*.nbrewind`` folder, say under ``data/``) is refused before anything is
written: a kernel pointed at that folder would otherwise take it for a store.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from nbrewind.errors import PackError
from nbrewind.pack.manifest import FileEntry, Manifest, working_path
from nbrewind.pack.reader import Progress, scan_archive
from nbrewind.pack.verify import check_store
from nbrewind.store.origin import MANIFEST_NAME, REQUIREMENTS_PATH, environment_differences, is_trusted
from nbrewind.store.store import CATALOG_NAME, MARKER_NAME

__all__ = ["UnpackResult", "default_destination", "unpack"]

_SUFFIXES = (".tar.zst", ".tzst")
_STORE_FILES = frozenset({MARKER_NAME, CATALOG_NAME, *(CATALOG_NAME + s for s in ("-wal", "-shm", "-journal"))})
_OWN_STORE_FILES = frozenset({f"nbrewind/{MARKER_NAME}", f"nbrewind/{CATALOG_NAME}"})


@dataclass(frozen=True)
class UnpackResult:
    """The working folder ``unpack`` made and what the user should know about it."""

    folder: str
    notebook: str
    store: str
    manifest_sha256: str
    files: int
    bytes: int
    trusted: bool
    data_included: bool
    environment: list[str] = field(default_factory=list)


def default_destination(archive: Path) -> Path:
    """``./<archive name without .tar.zst and .backpack>``."""
    name = archive.name
    for suffix in _SUFFIXES:
        name = name.removesuffix(suffix)
    return Path.cwd() / (name.removesuffix(".backpack") or "backpack")


def unpack(
    archive: str | os.PathLike[str], dest: str | os.PathLike[str] | None = None, *, progress: Progress | None = None
) -> UnpackResult:
    """Verify ``archive`` and unpack it into ``dest`` (which must not exist or be
    an empty folder, and whose parent must exist). Raises PackError listing
    every problem when anything does not verify; then nothing is left behind."""
    source = Path(archive).absolute()
    target = Path(dest).absolute() if dest is not None else default_destination(source)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise PackError(f"{target} already exists and is not an empty folder; choose another destination")
    if not target.parent.is_dir():
        raise PackError(f"the folder {target.parent} does not exist; create it first")
    staging = Path(tempfile.mkdtemp(prefix=".nbrewind-unpack-", dir=target.parent))
    try:
        result = _unpack_into(source, staging, target, progress)
        with contextlib.suppress(FileNotFoundError):
            target.rmdir()  # an empty destination folder is replaced
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return result


def smuggled_stores(manifest: Manifest) -> list[str]:
    """Archive paths that are, or lie in, a store other than the backpack's own:
    store marker and catalog files anywhere but at ``nbrewind/``, and anything in a
    ``.nbrewind`` or ``*.nbrewind`` folder other than the unpacked store itself."""
    found = []
    for entry in manifest.files:
        if entry.path in _OWN_STORE_FILES:
            continue
        parts = working_path(entry.path, manifest.notebook).split("/")
        folders = parts[1:-1] if parts[0] == manifest.store_dir else parts[:-1]
        if parts[-1] in _STORE_FILES or any(f == ".nbrewind" or f.endswith(".nbrewind") for f in folders):
            found.append(entry.path)
    return found


def _unpack_into(source: Path, staging: Path, target: Path, progress: Progress | None) -> UnpackResult:
    seen: list[Manifest] = []

    def on_manifest(manifest: Manifest) -> None:
        smuggled = smuggled_stores(manifest)
        if smuggled:
            shown = ", ".join(smuggled[:5]) + (f" and {len(smuggled) - 5} more" if len(smuggled) > 5 else "")
            raise PackError(
                f"{source} carries a store besides its own ({shown}); a backpack's only store is nbrewind/, and a "
                f"kernel pointed at a second one would load it. Nothing was unpacked; ask its author to pack again "
                f"without it"
            )
        free = shutil.disk_usage(staging).free
        if manifest.total_size > free:
            raise PackError(f"the backpack needs {manifest.total_size:,} bytes and only {free:,} are free")
        seen.append(manifest)

    def sink(entry: FileEntry) -> BinaryIO:
        path = staging / working_path(entry.path, seen[0].notebook)
        path.parent.mkdir(parents=True, exist_ok=True)
        return open(path, "xb")

    scan = scan_archive(source, sink, on_manifest=on_manifest, progress=progress)
    if scan.problems or scan.manifest is None or scan.manifest_sha256 is None:
        raise PackError(f"{source} does not verify, nothing was unpacked:\n  " + "\n  ".join(scan.problems))
    manifest = scan.manifest
    store = staging / manifest.store_dir
    # The manifest at the store's root is part of what a store signature covers
    # (nbrewind.store.signing): the store is trusted once it is signed with it.
    (store / MANIFEST_NAME).write_bytes(scan.manifest_bytes)
    problems = check_store(store)
    if problems:
        raise PackError(f"{source} holds a damaged store, nothing was unpacked:\n  " + "\n  ".join(problems))
    objects = store / "objects"
    for folder, _, files in os.walk(objects):
        for name in files:
            os.chmod(os.path.join(folder, name), 0o444)
    try:
        requirements = (store / REQUIREMENTS_PATH).read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        requirements = ""
    return UnpackResult(
        folder=str(target),
        notebook=str(target / manifest.notebook),
        store=str(target / manifest.store_dir),
        manifest_sha256=scan.manifest_sha256,
        files=scan.checked + 1,
        bytes=scan.bytes,
        trusted=is_trusted(store),
        data_included=manifest.include_data,
        environment=environment_differences(requirements),
    )
