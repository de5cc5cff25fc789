"""Where a store came from, and whether this machine trusts it.

Loading a checkpoint unpickles it, and unpickling runs code. A store created
(or packed) on this machine is trusted. A store unpacked from a backpack holds
the backpack's ``manifest.json`` at its root; it is trusted only once the
SHA-256 of that manifest has been recorded in the local trust database, the
way Jupyter trusts notebooks by signature (``jupyter nbrewind trust DIR``).

The trust database is SQLite at ``NBREWIND_TRUST_DB`` if set, else
``<jupyter data dir>/nbrewind/trust.db``. This module lives in the store layer
so that the session can ask before it opens a store; ``nbrewind.pack`` builds
on it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import re
import sqlite3
import time
from pathlib import Path

from nbrewind.errors import UntrustedStoreError

__all__ = [
    "BACKPACK_DIR",
    "MANIFEST_NAME",
    "check_store_origin",
    "environment_differences",
    "is_trusted",
    "manifest_digest",
    "record_trust",
    "trust_db_path",
]

MANIFEST_NAME = "manifest.json"
BACKPACK_DIR = "backpack"
REQUIREMENTS_PATH = f"{BACKPACK_DIR}/software/requirements.txt"

_REQUIREMENT_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")
_PYTHON_RE = re.compile(r"^#\s*python\s*[:=]?\s*(\d+\.\d+)")


def trust_db_path() -> Path:
    """The trust database: ``NBREWIND_TRUST_DB``, else under the Jupyter data dir."""
    explicit = os.environ.get("NBREWIND_TRUST_DB")
    if explicit:
        return Path(explicit).expanduser()
    from jupyter_core.paths import jupyter_data_dir

    return Path(jupyter_data_dir()) / "nbrewind" / "trust.db"


def manifest_digest(store_root: str | os.PathLike[str]) -> str | None:
    """SHA-256 hex of the backpack manifest at the store's root, or None for a
    store that did not come from a backpack."""
    path = Path(store_root) / MANIFEST_NAME
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return hashlib.sha256(data).hexdigest()


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 10000")
    conn.execute("CREATE TABLE IF NOT EXISTS trusted (digest TEXT PRIMARY KEY, source TEXT, added REAL NOT NULL)")
    return conn


def _digest_trusted(digest: str) -> bool:
    path = trust_db_path()
    if not path.is_file():
        return False
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            row = conn.execute("SELECT 1 FROM trusted WHERE digest = ?", (digest,)).fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return False  # an unreadable database trusts nothing
    return row is not None


def record_trust(digest: str, source: str = "") -> bool:
    """Record a manifest digest as trusted; return False if it already was."""
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise ValueError(f"{digest!r} is not a SHA-256 hex digest")
    path = trust_db_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = _connect(path)
    try:
        cursor = conn.execute(
            "INSERT OR IGNORE INTO trusted (digest, source, added) VALUES (?, ?, ?)", (digest, source, time.time())
        )
        return cursor.rowcount > 0
    finally:
        conn.close()


def is_trusted(store_root: str | os.PathLike[str]) -> bool:
    """True for a store made here (no backpack manifest) or a backpack whose
    manifest digest is in the trust database."""
    digest = manifest_digest(store_root)
    return digest is None or _digest_trusted(digest)


def check_store_origin(store_root: str | os.PathLike[str]) -> str | None:
    """Raise UntrustedStoreError for an untrusted backpack store (saying how to
    trust it); for a trusted backpack return a notice listing environment
    differences, if any; None otherwise. Reads nothing that could run code."""
    root = Path(store_root)
    digest = manifest_digest(root)
    if digest is None:
        return None
    if not _digest_trusted(digest):
        folder = root.parent if root.name.endswith(".nbrewind") else root
        raise UntrustedStoreError(
            f"the store at {root} was unpacked from a backpack (manifest sha256 {digest[:16]}...) that this "
            f"machine has not trusted, so nothing in it is unpickled and cells run normally without recording. "
            f"If you trust its author, run `jupyter nbrewind trust {folder}` and restart the kernel"
        )
    try:
        text = (root / REQUIREMENTS_PATH).read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    differences = environment_differences(text)
    if not differences:
        return None
    shown = "; ".join(differences[:8]) + (f"; and {len(differences) - 8} more" if len(differences) > 8 else "")
    return (
        f"NBRewind: this backpack was recorded with other package versions ({shown}). Cells still replay "
        f"from their checkpoints; cells that run may behave differently. See {root / REQUIREMENTS_PATH}"
    )


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_versions() -> dict[str, str]:
    """Normalized distribution name -> version, for everything importable here."""
    versions: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] if dist.metadata else None
        if name:
            versions.setdefault(_normalize(str(name)), str(dist.version))
    return versions


def environment_differences(requirements_text: str, installed: dict[str, str] | None = None) -> list[str]:
    """What differs between a backpack's requirements.txt and this environment:
    the Python minor version, and each distribution missing here or at another
    version. Extra distributions installed here are not differences."""
    here = installed_versions() if installed is None else {_normalize(k): v for k, v in installed.items()}
    out: list[str] = []
    for raw in requirements_text.splitlines():
        line = raw.strip()
        python = _PYTHON_RE.match(line)
        if python:
            mine = ".".join(platform.python_version_tuple()[:2])
            if python.group(1) != mine:
                out.append(f"python: backpack {python.group(1)}, here {mine}")
            continue
        match = _REQUIREMENT_RE.match(line)
        if not match:
            continue
        name, version = match.groups()
        current = here.get(_normalize(name))
        if current is None:
            out.append(f"{name}: backpack {version}, not installed here")
        elif current != version:
            out.append(f"{name}: backpack {version}, here {current}")
    return out
