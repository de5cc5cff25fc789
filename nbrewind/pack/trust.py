"""``trust``: accept a store someone else made, as ``jupyter trust`` accepts a notebook.

Unpickling a checkpoint runs code, so the kernels load only stores whose current
content this user signed (see ``nbrewind.store.origin``). ``trust PATH`` signs
one: an unpacked backpack (its folder or its store), verified completely first,
or a plain store folder (copied from a colleague, written by another user on a
cluster, or made by an NBRewind that did not sign stores), whose catalog is
checked for damage and for SQL that would run on our writes, and whose ref
files are re-signed with this user's secret.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from nbrewind.errors import PackError
from nbrewind.pack.verify import catalog_problems, locate, verify
from nbrewind.store import ObjectStore
from nbrewind.store.origin import MANIFEST_NAME, is_trusted, sign_store, trust_db_path
from nbrewind.store.store import CATALOG_NAME, MARKER_NAME

__all__ = ["TrustResult", "is_trusted", "trust"]


@dataclass(frozen=True)
class TrustResult:
    """What ``trust`` recorded."""

    folder: str
    store: str
    manifest_sha256: str | None
    """The backpack's manifest digest, or None for a plain store folder."""
    newly_trusted: bool
    trust_db: str
    signature: str = ""
    refs_signed: int = 0
    """Ref files of a plain store that now carry this user's MAC."""


def trust(path: str | os.PathLike[str]) -> TrustResult:
    """Verify the unpacked backpack or store at ``path`` and sign its current content.

    ``path`` may be an unpacked backpack's folder, its store folder, a plain store
    folder, or a folder holding exactly one store. Raises PackError naming every
    problem when it does not verify; then nothing is trusted.
    """
    target = Path(path).absolute()
    if target.is_file():
        raise PackError(f"{target} is a file; unpack it first (`jupyter nbrewind unpack {target}`), then trust the folder")
    if not target.is_dir():
        raise PackError(f"{target} does not exist")
    store = _plain_store(target)
    if store is None:
        folder = locate(target)
        report = verify(target)
        if not report.ok or report.manifest_sha256 is None:
            raise PackError(f"{target} does not verify, so it was not trusted:\n  " + "\n  ".join(report.problems))
        root = folder.manifest_path.parent
        signature, newly = sign_store(root, source=str(target))
        return TrustResult(str(target), str(root), report.manifest_sha256, newly, str(trust_db_path()), signature)
    problems = _catalog_problems(store)
    if problems:
        raise PackError(f"{store} does not verify, so it was not trusted:\n  " + "\n  ".join(problems))
    refs_signed = _sign_refs(store)
    signature, newly = sign_store(store, source=str(target))
    return TrustResult(str(target), str(store), None, newly, str(trust_db_path()), signature, refs_signed)


def _plain_store(target: Path) -> Path | None:
    """The store folder ``target`` names when it is not an unpacked backpack."""
    if (target / MARKER_NAME).is_file():
        return None if (target / MANIFEST_NAME).is_file() else target
    if (target / "nbrewind" / MANIFEST_NAME).is_file() or any(target.glob(f"*.nbrewind/{MANIFEST_NAME}")):
        return None
    stores = sorted(p.parent for p in [*target.glob(f"*.nbrewind/{MARKER_NAME}"), *target.glob(f".nbrewind/{MARKER_NAME}")])
    if len(stores) == 1:
        return stores[0]
    if stores:
        raise PackError(f"{target} holds several stores; name one: {', '.join(str(s) for s in stores)}")
    raise PackError(f"{target} is neither an NBRewind store nor an unpacked backpack (nor a folder holding one)")


def _catalog_problems(store: Path) -> list[str]:
    """A catalog that is missing, damaged, or carries triggers or views; objects need no
    check here, every read verifies them."""
    catalog = store / CATALOG_NAME
    if not catalog.is_file():
        return [f"{catalog} is missing: there is nothing to trust"]
    return catalog_problems(catalog)


def _sign_refs(store: Path) -> int:
    """Re-write every ref file whose MAC is not this user's with this user's MAC."""
    objects = ObjectStore(store)
    signed = 0
    for namespace in objects.ref_namespaces():
        trusted = dict(objects.iter_refs(namespace, trusted_only=True))
        for name, digest in list(objects.iter_refs(namespace)):
            if trusted.get(name) != digest:
                objects.ref_set(namespace, name, digest)
                signed += 1
    return signed
