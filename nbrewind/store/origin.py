"""Where a store came from, and whether this user trusts it.

Loading a checkpoint unpickles it, and unpickling runs code. As Jupyter does
with notebooks, a store is trusted only when the trust database holds this
user's signature of what the store holds now (see ``nbrewind.store.signing``):
our kernels and CLI sign every commit, and ``jupyter nbrewind trust`` signs a
store someone else made. A store copied from another user, unpacked from a
backpack packed elsewhere, edited outside NBRewind, or made by an NBRewind that
did not sign stores is untrusted until the user trusts it; no file's presence
or absence changes that.

The trust database is SQLite at ``NBREWIND_TRUST_DB`` if set, else
``<jupyter data dir>/nbrewind/trust.db``; the secret sits beside it. This
module lives in the store layer so that the session can ask before it opens a
store; ``nbrewind.pack`` builds on it.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

from nbrewind.errors import StoreError, UntrustedStoreError
from nbrewind.store.catalog import Catalog
from nbrewind.store.signing import MANIFEST_NAME, manifest_digest, signature_db, trust_db_path
from nbrewind.store.store import CATALOG_NAME, MARKER_NAME

__all__ = [
    "BACKPACK_DIR",
    "MANIFEST_NAME",
    "StoreTrust",
    "check_store_origin",
    "environment_differences",
    "is_trusted",
    "manifest_digest",
    "sign_catalog",
    "sign_store",
    "store_trust",
    "trust_db_path",
    "trust_target",
    "untrusted_message",
]

BACKPACK_DIR = "backpack"
REQUIREMENTS_PATH = f"{BACKPACK_DIR}/software/requirements.txt"

_REQUIREMENT_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")
_PYTHON_RE = re.compile(r"^#\s*python\s*[:=]?\s*(\d+\.\d+)")


@dataclass(frozen=True)
class StoreTrust:
    """Whether this user trusts the store at ``root``, and why."""

    root: str
    trusted: bool
    signature: str | None
    """This user's signature of the store's current content (None when it has no catalog)."""
    manifest_sha256: str | None
    reason: str


def store_trust(store_root: str | os.PathLike[str]) -> StoreTrust:
    """Check the store at ``store_root`` against the trust database. Reads every
    catalog row once and unpickles nothing.

    A folder that is not a store yet, or a store without a catalog, holds nothing
    that could be loaded (refs need a valid MAC) and counts as trusted: whatever is
    recorded there from now on is signed as it is written."""
    root = Path(store_root).absolute()
    manifest = manifest_digest(root)
    if not (root / MARKER_NAME).is_file() or not (root / CATALOG_NAME).is_file():
        return StoreTrust(str(root), True, None, manifest, "nothing recorded yet")
    with Catalog(root / CATALOG_NAME, readonly=True) as catalog:
        signature = catalog.signature()
    if signature_db().has(signature):
        return StoreTrust(str(root), True, signature, manifest, "signed by this user")
    if manifest is not None:
        reason = (
            f"it was unpacked from a backpack (manifest sha256 {manifest[:16]}...) that this machine has not trusted, "
            f"or changed since"
        )
    else:
        reason = (
            "it was written by another user or on another machine, copied from elsewhere, changed outside "
            "NBRewind, or made by an NBRewind that did not sign its stores"
        )
    return StoreTrust(str(root), False, signature, manifest, reason)


def is_trusted(store_root: str | os.PathLike[str]) -> bool:
    """True when this user signed (or trusted) the store's current content."""
    try:
        return store_trust(store_root).trusted
    except StoreError:
        return False  # a damaged catalog trusts nothing


def trust_target(store_root: str | os.PathLike[str]) -> Path:
    """What to name in `jupyter nbrewind trust ...` for this store: the unpacked
    backpack's folder, or the store itself."""
    root = Path(store_root).absolute()
    if (root / MANIFEST_NAME).is_file() and root.name.endswith(".nbrewind"):
        return root.parent
    return root


def untrusted_message(verdict: StoreTrust) -> str:
    """What to tell the user about an untrusted store, naming the command that trusts it."""
    return (
        f"NBRewind: the store at {verdict.root} is not signed by you: {verdict.reason}. Nothing is loaded from it "
        f"and nothing is recorded in it; every cell runs as on a plain kernel. If you trust where it came from, "
        f"run `jupyter nbrewind trust {trust_target(verdict.root)}` and restart the kernel"
    )


def check_store_origin(store_root: str | os.PathLike[str]) -> str | None:
    """Raise UntrustedStoreError for a store this user has not signed (saying how to
    trust it); for a trusted backpack return a notice listing environment
    differences, if any; None otherwise. Reads nothing that could run code."""
    root = Path(store_root)
    verdict = store_trust(root)
    if not verdict.trusted:
        raise UntrustedStoreError(untrusted_message(verdict))
    if verdict.manifest_sha256 is None:
        return None
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


def sign_store(store_root: str | os.PathLike[str], source: str = "") -> tuple[str, bool]:
    """Trust the store's current content: record this user's signature of it (and,
    for an unpacked backpack, accept the ref files its manifest lists). Returns the
    signature and whether it is new. Callers verify the content first."""
    root = Path(store_root).absolute()
    if not (root / CATALOG_NAME).is_file():
        raise StoreError(f"{root} has no catalog ({CATALOG_NAME}), so there is nothing to trust")
    with Catalog(root / CATALOG_NAME, readonly=True) as catalog:
        signature = catalog.signature()
    db = signature_db()
    newly = db.add(signature, str(root))
    manifest = manifest_digest(root)
    if manifest is not None:
        db.add_manifest(manifest, source or str(root))
    return signature, newly


def sign_catalog(catalog_path: str | os.PathLike[str], manifest_sha256: str, store_label: str) -> str:
    """Sign a catalog as it will be found beside the backpack manifest with this
    SHA-256 (what ``pack`` does for a backpack of a trusted store, so unpacking it
    here needs no ``trust``), and accept the ref files that manifest lists."""
    with Catalog(Path(catalog_path), readonly=True) as catalog:
        signature = catalog.signature_with(manifest_sha256)
    db = signature_db()
    db.add(signature, store_label)
    db.add_manifest(manifest_sha256, store_label)
    return signature


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
