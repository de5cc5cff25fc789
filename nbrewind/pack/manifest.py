"""The backpack manifest and the two layouts: inside the archive, and unpacked.

Archive layout (a superset of the Floability backpack)::

    workflow/<notebook>.ipynb      the notebook, plus the local modules it imports
    software/requirements.txt      every installed distribution==version
    software/environment.yml       the same as a conda environment, with Python
    data/data.yml                  input files the audit saw (path, size, sha256)
    data/<path>                    those files, with --include-data
    compute/compute.yml            workers, cores and memory
    nbrewind/manifest.json         this manifest (always the archive's first entry)
    nbrewind/...                   the store: marker, catalog.sqlite, objects/, refs/

Unpacked (a working folder): ``workflow/`` and ``data/`` files land at their
paths relative to the notebook, the store lands beside the notebook as
``<notebook>.nbrewind/`` with the manifest at its root, and ``software/``,
``compute/`` and ``data/data.yml`` go under ``<notebook>.nbrewind/backpack/``.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nbrewind.errors import PackError
from nbrewind.store.origin import BACKPACK_DIR, MANIFEST_NAME

FORMAT = "nbrewind-backpack"
FORMAT_VERSION = 1
MANIFEST_PATH = f"nbrewind/{MANIFEST_NAME}"
MANIFEST_MAX_BYTES = 32 * 1024 * 1024
TOP_DIRS = ("workflow", "software", "data", "compute", "nbrewind")
DATA_INDEX = "data/data.yml"
_SHA256_RE = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class FileEntry:
    """One file of the backpack: archive path, byte size and SHA-256 hex."""

    path: str
    size: int
    sha256: str


@dataclass
class Manifest:
    """What ``nbrewind/manifest.json`` holds."""

    notebook: str
    nbrewind_version: str
    history: str
    include_data: bool
    files: list[FileEntry]
    cell_runs: list[dict[str, Any]] = field(default_factory=list)
    format: str = FORMAT
    version: int = FORMAT_VERSION

    @property
    def store_dir(self) -> str:
        """The store folder's name in an unpacked backpack."""
        return self.notebook + ".nbrewind"

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def body(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "version": self.version,
            "nbrewind_version": self.nbrewind_version,
            "notebook": self.notebook,
            "history": self.history,
            "include_data": self.include_data,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.files],
            "cell_runs": self.cell_runs,
        }

    def to_bytes(self) -> bytes:
        """Canonical JSON with a ``checksum`` over everything else, so an edit
        to the manifest alone is caught."""
        body = self.body()
        body["checksum"] = "sha256:" + _checksum(body)
        return (json.dumps(body, indent=1, sort_keys=True, ensure_ascii=True) + "\n").encode("ascii")


def _checksum(body: dict[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def safe_member_path(name: str) -> str | None:
    """Why an archive path is unacceptable, or None when it is a plain relative
    path under one of the layout's top folders."""
    if not name or "\x00" in name or "\\" in name:
        return "empty or contains a NUL or backslash"
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return "absolute path"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "contains '..', '.' or an empty component"
    if posixpath.normpath(name) != name:
        return "not a normalized path"
    if parts[0] not in TOP_DIRS or len(parts) < 2:
        return f"outside the layout's folders ({', '.join(TOP_DIRS)})"
    return None


def working_path(archive_path: str, notebook: str) -> str:
    """Where an archive path lands in an unpacked backpack (relative, POSIX)."""
    store = notebook + ".nbrewind"
    top, rest = archive_path.split("/", 1)
    if top == "workflow":
        return rest
    if top == "data":
        return f"{store}/{BACKPACK_DIR}/{archive_path}" if archive_path == DATA_INDEX else rest
    if top == "nbrewind":
        return f"{store}/{rest}"
    return f"{store}/{BACKPACK_DIR}/{archive_path}"


def parse_manifest(data: bytes) -> Manifest:
    """Parse and check a manifest: format, version, checksum, every path and
    hash well formed, and the unpacked layout free of collisions."""
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise PackError(f"manifest.json is not valid JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise PackError(f"this is not an NBRewind backpack (manifest format is not {FORMAT!r})")
    version = raw.get("version")
    if version != FORMAT_VERSION:
        newer = isinstance(version, int) and version > FORMAT_VERSION
        raise PackError(
            f"backpack format version {version!r} is not supported; this NBRewind reads version {FORMAT_VERSION}"
            + ("; upgrade nbrewind to open it" if newer else "")
        )
    claimed = raw.pop("checksum", None)
    if not isinstance(claimed, str) or claimed != "sha256:" + _checksum(raw):
        raise PackError("manifest.json was edited after packing: its checksum does not match its content")
    try:
        files = [FileEntry(str(f["path"]), int(f["size"]), str(f["sha256"])) for f in raw["files"]]
        manifest = Manifest(
            notebook=str(raw["notebook"]),
            nbrewind_version=str(raw["nbrewind_version"]),
            history=str(raw["history"]),
            include_data=bool(raw["include_data"]),
            files=files,
            cell_runs=list(raw.get("cell_runs", [])),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise PackError(f"manifest.json is malformed ({type(exc).__name__}: {exc})") from None
    problems = layout_problems(manifest)
    if problems:
        raise PackError("manifest.json describes an unsafe layout: " + "; ".join(problems))
    return manifest


def layout_problems(manifest: Manifest) -> list[str]:
    """Unsafe names, bad sizes or hashes, duplicates and collisions in the unpacked layout."""
    problems: list[str] = []
    nb = manifest.notebook
    if "/" in nb or "\\" in nb or nb in (".", "..") or not nb.endswith(".ipynb") or nb.startswith("."):
        problems.append(f"notebook name {nb!r} is not a plain .ipynb file name")
        return problems
    targets: dict[str, str] = {}
    for entry in manifest.files:
        why = safe_member_path(entry.path)
        if why:
            problems.append(f"{entry.path!r}: {why}")
            continue
        if entry.size < 0 or not _SHA256_RE.fullmatch(entry.sha256):
            problems.append(f"{entry.path}: bad size or sha256")
        target = working_path(entry.path, nb)
        top = entry.path.split("/", 1)[0]
        if top in ("workflow", "data") and entry.path != DATA_INDEX and target.split("/", 1)[0] == manifest.store_dir:
            problems.append(f"{entry.path}: would land inside the store folder")
        if target in targets:
            problems.append(f"{entry.path} and {targets[target]} both unpack to {target}")
        targets[target] = entry.path
    if f"workflow/{nb}" not in {f.path for f in manifest.files}:
        problems.append(f"the notebook workflow/{nb} is not listed")
    return problems


def yaml_scalar(value: object) -> str:
    """A YAML scalar: numbers and booleans bare, everything else double-quoted JSON
    (valid YAML), so no value can change the document's structure."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if value is None:
        return "null"
    return json.dumps(str(value), ensure_ascii=True)


def yaml_records(key: str, records: Iterable[Mapping[str, object]]) -> list[str]:
    """``key:`` followed by a block list of flat mappings."""
    lines = [f"{key}:"]
    empty = True
    for record in records:
        empty = False
        first = True
        for name, value in record.items():
            lines.append(f"  {'- ' if first else '  '}{name}: {yaml_scalar(value)}")
            first = False
    if empty:
        lines[-1] = f"{key}: []"
    return lines
