"""``verify``: re-check every hash of a backpack archive or unpacked folder and
report every problem found."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
from dataclasses import dataclass, field
from pathlib import Path

from nbrewind.errors import NbrewindError, PackError
from nbrewind.pack.manifest import Manifest, parse_manifest, working_path
from nbrewind.pack.reader import Progress, scan_archive
from nbrewind.store import Store, verify_store
from nbrewind.store.origin import MANIFEST_NAME, is_trusted
from nbrewind.store.store import CATALOG_NAME

__all__ = ["BackpackFolder", "VerifyResult", "check_store", "locate", "verify"]


@dataclass(frozen=True)
class VerifyResult:
    """Every problem found in a backpack (``ok`` when there is none)."""

    path: str
    kind: str
    ok: bool
    manifest_sha256: str | None
    checked: int
    bytes: int
    problems: list[str] = field(default_factory=list)
    trusted: bool | None = None


@dataclass(frozen=True)
class BackpackFolder:
    """An unpacked backpack: where its files are and how archive paths map onto them."""

    base: Path
    manifest_path: Path
    archive_layout: bool

    def file_path(self, archive_path: str, manifest: Manifest) -> Path:
        rel = archive_path if self.archive_layout else working_path(archive_path, manifest.notebook)
        return self.base / rel

    def store_root(self, manifest: Manifest) -> Path:
        return self.base / ("nbrewind" if self.archive_layout else manifest.store_dir)


def locate(folder: str | os.PathLike[str]) -> BackpackFolder:
    """Find the manifest of an unpacked backpack: the working folder made by
    ``unpack``, its store folder, or a plain ``tar`` extraction of the archive."""
    root = Path(folder).absolute()
    if (root / "nbrewind" / MANIFEST_NAME).is_file():
        return BackpackFolder(root, root / "nbrewind" / MANIFEST_NAME, True)
    if (root / MANIFEST_NAME).is_file() and root.name.endswith(".nbrewind"):
        return BackpackFolder(root.parent, root / MANIFEST_NAME, False)
    found = sorted(root.glob(f"*.nbrewind/{MANIFEST_NAME}"))
    if len(found) == 1:
        return BackpackFolder(root, found[0], False)
    if found:
        raise PackError(f"{root} holds several unpacked backpacks; name one store folder: {', '.join(str(p.parent) for p in found)}")
    raise PackError(f"{root} is not an unpacked backpack (no <notebook>.nbrewind/{MANIFEST_NAME} in it)")


def verify(path: str | os.PathLike[str], *, progress: Progress | None = None) -> VerifyResult:
    """Verify an archive (every entry against the manifest, nothing written) or
    an unpacked folder (every listed file, then the store's objects and catalog)."""
    target = Path(path).absolute()
    if target.is_file():
        scan = scan_archive(target, progress=progress)
        return VerifyResult(str(target), "archive", not scan.problems, scan.manifest_sha256, scan.checked, scan.bytes, scan.problems)
    if not target.is_dir():
        raise PackError(f"{target} does not exist")
    return _verify_folder(target, locate(target))


def _verify_folder(target: Path, folder: BackpackFolder) -> VerifyResult:
    data = folder.manifest_path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    try:
        manifest = parse_manifest(data)
    except PackError as exc:
        return VerifyResult(str(target), "folder", False, digest, 0, 0, [str(exc)])
    problems: list[str] = []
    checked = total = 0
    for entry in manifest.files:
        file = folder.file_path(entry.path, manifest)
        try:
            info = os.lstat(file)
        except FileNotFoundError:
            problems.append(f"{entry.path}: missing (expected at {file})")
            continue
        if not stat.S_ISREG(info.st_mode):
            problems.append(f"{entry.path}: {file} is not a regular file")
            continue
        checked += 1
        total += info.st_size
        if info.st_size != entry.size or _sha256(file) != entry.sha256:
            note = " (expected once a kernel has used the store)" if entry.path.endswith(CATALOG_NAME) else ""
            problems.append(f"{entry.path}: content differs from the manifest{note}")
    store_root = folder.store_root(manifest)
    problems.extend(check_store(store_root))
    return VerifyResult(str(target), "folder", not problems, digest, checked, total, problems, is_trusted(store_root))


def _sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            sha.update(chunk)
    return sha.hexdigest()


def catalog_problems(catalog: Path) -> list[str]:
    """A catalog that cannot be read, fails SQLite's integrity check, or carries triggers
    or views (SQL that would run on our writes)."""
    try:
        conn = sqlite3.connect(f"{catalog.resolve().as_uri()}?mode=ro", uri=True)
        try:
            check = conn.execute("PRAGMA integrity_check").fetchone()
            extra = conn.execute("SELECT type, name FROM sqlite_master WHERE type IN ('trigger', 'view')").fetchall()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return [f"catalog: cannot be read ({exc})"]
    problems = [] if check and check[0] == "ok" else [f"catalog: SQLite integrity check failed ({check[0] if check else 'no answer'})"]
    return problems + [f"catalog: unexpected {kind} {name!r}; NBRewind catalogs have none" for kind, name in extra]


def check_store(store_root: Path) -> list[str]:
    """Problems of a store that came from a backpack: a catalog that is damaged
    or carries triggers or views (SQL that would run on our writes), objects
    that are corrupt or referenced but missing, and the records (cell runs,
    rebuild records, task results) those break."""
    problems = catalog_problems(store_root / CATALOG_NAME)
    if any(p.startswith("catalog: cannot be read") for p in problems):
        return problems
    try:
        with Store.open(store_root, create=False, readonly=True) as store:
            report = verify_store(store)
    except NbrewindError as exc:
        problems.append(f"store: {exc}")
        return problems
    problems.extend(f"object {bad.digest}: {bad.problem}" for bad in report.corrupt)
    problems.extend(f"object {digest}: referenced but missing" for digest in report.missing)
    problems.extend(f"record: {broken.message}" for broken in report.broken)
    return problems
