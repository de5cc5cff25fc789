"""Task-result refs as files that carry this user's MAC.

Refs are files, not catalog rows, so the catalog's signature does not cover them:
each carries HMAC(secret, namespace, name, digest) after the digest, and a ref
whose MAC fails is a miss (the task runs again), unless it is byte for byte a ref
file a backpack manifest the user trusted lists. This module imports no other
nbrewind package except ``nbrewind.errors``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path

from nbrewind.store.digest import is_digest
from nbrewind.store.secret import Keys, user_keys
from nbrewind.store.signing import MANIFEST_NAME, ref_mac
from nbrewind.store.trustdb import signature_db

__all__ = ["encode_ref", "read_ref", "ref_digest"]


# What `secret_path` (through jupyter_core's data dir) depends on. Finding the secret costs
# about 0.2 ms, more than writing a ref without fsync: look it up again only when these change.
_SECRET_ENV = ("NBREWIND_TRUST_DB", "JUPYTER_DATA_DIR", "JUPYTER_PLATFORM_DIRS", "XDG_DATA_HOME", "HOME", "APPDATA")
_keys_memo: tuple[tuple[str | None, ...], Keys] | None = None


def _keys() -> Keys:
    global _keys_memo
    env = tuple(os.environ.get(name) for name in _SECRET_ENV)
    memo = _keys_memo
    if memo is not None and memo[0] == env:
        return memo[1]
    keys = user_keys()
    _keys_memo = (env, keys)
    return keys


def encode_ref(namespace: str, name: str, digest: str) -> bytes:
    """A ref file's content: the digest, then this user's MAC of it under its name."""
    return f"{digest} {ref_mac(_keys(), namespace, name, digest)}\n".encode("ascii")


def ref_digest(raw: bytes) -> str | None:
    """The digest a ref file names (trusted or not), or None for a damaged file."""
    parts = raw.decode("ascii", errors="replace").split()
    return parts[0] if parts and len(parts) <= 2 and is_digest(parts[0]) else None


def read_ref(store_root: Path, namespace: str, name: str, raw: bytes) -> tuple[str | None, bool]:
    """``(digest, trusted)`` of a ref file: trusted when its MAC is this user's, or
    when it is byte for byte a ref file listed in a backpack manifest the user
    trusted (refs packed elsewhere carry their packer's MAC). ``digest`` is None for
    a damaged file."""
    digest = ref_digest(raw)
    if digest is None:
        return None, False
    parts = raw.decode("ascii", errors="ignore").split()  # a damaged MAC is a mismatch, not a crash
    if len(parts) == 2 and hmac.compare_digest(parts[1], ref_mac(_keys(), namespace, name, digest)):
        return digest, True
    listed = _trusted_manifest_refs(store_root)
    expected = listed.get(f"nbrewind/refs/{namespace}/{name[:2]}/{name}") if listed else None
    return digest, expected is not None and hmac.compare_digest(expected, hashlib.sha256(raw).hexdigest())


_manifest_refs: dict[str, tuple[tuple[int, int], dict[str, str] | None]] = {}


def _trusted_manifest_refs(store_root: Path) -> dict[str, str] | None:
    """Archive path -> SHA-256 of the ref files listed in the store's backpack
    manifest, if the user trusted that manifest (cached while the file is unchanged)."""
    path = Path(store_root) / MANIFEST_NAME
    try:
        info = path.stat()
    except OSError:
        return None
    stamp = (info.st_mtime_ns, info.st_size)
    cached = _manifest_refs.get(str(path))
    if cached is not None and cached[0] == stamp:
        return cached[1]
    listed: dict[str, str] | None = None
    try:
        data = path.read_bytes()
        if signature_db().has_manifest(hashlib.sha256(data).hexdigest()):
            files = json.loads(data.decode("utf-8")).get("files", [])
            listed = {
                str(f["path"]): str(f["sha256"])
                for f in files
                if isinstance(f, dict) and str(f.get("path", "")).startswith("nbrewind/refs/")
            }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        listed = None
    _manifest_refs[str(path)] = (stamp, listed)
    return listed
