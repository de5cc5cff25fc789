"""Content digests: xxh3-128 over the exact bytes, as 32 lowercase hex characters.

Every persisted name in a store is one of these. They depend only on the bytes
(never on the process, the machine or Python's randomized ``hash()``), which is
what lets a store written on one machine be read and verified on another.
Golden values are pinned in ``tests/store/test_digest.py``.
"""

from __future__ import annotations

import re
from typing import Protocol

import xxhash

__all__ = ["DIGEST_LENGTH", "Hasher", "digest_bytes", "digest_releasing_gil", "is_digest", "new_hasher"]

DIGEST_LENGTH = 32

_DIGEST_RE = re.compile(r"[0-9a-f]{32}")


class Hasher(Protocol):
    """The incremental hashing interface returned by :func:`new_hasher`."""

    def update(self, data: bytes | bytearray | memoryview, /) -> None: ...

    def hexdigest(self) -> str: ...


def digest_bytes(data: bytes | bytearray | memoryview) -> str:
    """Return the xxh3-128 hex digest of ``data`` (any C-contiguous buffer).

    The buffer is hashed in place, without a copy, so large arrays cost only the
    hashing itself.
    """
    return xxhash.xxh3_128_hexdigest(data)


def digest_releasing_gil(data: bytes | bytearray | memoryview) -> str:
    """:func:`digest_bytes` of ``data``, computed so that other threads run meanwhile.

    xxhash's one-shot functions hold the GIL before xxhash 4.0 (from 4.0 on they
    release it above 64 KiB), while a hasher's ``update`` releases it for large
    inputs in every version this package accepts: so chunks read on several
    threads are hashed in parallel whatever xxhash is installed.
    """
    hasher = xxhash.xxh3_128()
    hasher.update(data)
    return hasher.hexdigest()


def new_hasher() -> Hasher:
    """Return an incremental xxh3-128 hasher; feeding it pieces gives the same
    digest as :func:`digest_bytes` on their concatenation."""
    hasher: Hasher = xxhash.xxh3_128()
    return hasher


def is_digest(value: str) -> bool:
    """Tell whether ``value`` is a well-formed digest (32 lowercase hex characters).

    Used to validate names before they become file paths, so a stray ``../`` can
    never reach the filesystem.
    """
    return isinstance(value, str) and _DIGEST_RE.fullmatch(value) is not None
