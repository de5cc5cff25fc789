"""Refs: names that point at an object digest (``refs/<namespace>/<xx>/<name>``), each
file carrying this user's MAC (`signed_refs`); the half of `ObjectStore` that keeps them."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from nbrewind.errors import (
    CorruptObjectError,
)
from nbrewind.store.digest import is_digest
from nbrewind.store.fsio import atomic_write
from nbrewind.store.signed_refs import encode_ref, read_ref, ref_digest

__all__ = ["RefsMixin"]

_REF_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")


class RefsMixin:
    """Digest refs under ``root/refs``; mixed into `ObjectStore`."""

    if TYPE_CHECKING:  # provided by ObjectStore
        root: Path
        refs_dir: Path

        def _check_writable(self) -> None: ...

    def _ref_path(self, namespace: str, name: str) -> Path:
        for label, value in (("namespace", namespace), ("name", name)):
            if not _REF_NAME_RE.fullmatch(value):
                raise ValueError(
                    f"ref {label} {value!r} must be 1-200 characters of letters, digits, '_', '.', '-'"
                )
        return self.refs_dir / namespace / name[:2] / name

    def ref_set(self, namespace: str, name: str, digest: str) -> None:
        """Point ``namespace/name`` at ``digest``, atomically (the last writer wins).

        The file carries this user's MAC of (namespace, name, digest): refs are not
        catalog rows, so the catalog's signature does not cover them."""
        self._check_writable()
        if not is_digest(digest):
            raise ValueError(f"{digest!r} is not a digest")
        atomic_write(self._ref_path(namespace, name), (encode_ref(namespace, name, digest),), mode=0o644)

    def ref_get(self, namespace: str, name: str) -> str | None:
        """The digest ``namespace/name`` points at, or None: also when its MAC is not
        this user's (a ref someone else wrote or forged is a miss, never loaded)."""
        for value in (namespace, name):
            if not _REF_NAME_RE.fullmatch(value):
                self._ref_path(namespace, name)  # raises the ValueError that explains it
        # Strings, not Paths: a graph's cache lookups call this once per distinct task.
        where = os.path.join(self.refs_dir, namespace, name[:2], name)
        try:
            fd = os.open(where, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            raw = os.read(fd, 4096)
        finally:
            os.close(fd)
        digest, trusted = read_ref(self.root, namespace, name, raw)
        if digest is None:
            raise CorruptObjectError(f"ref file {where} does not hold a digest; delete it")
        return digest if trusted else None

    def ref_delete(self, namespace: str, name: str) -> bool:
        """Remove a ref; return whether it existed."""
        self._check_writable()
        try:
            self._ref_path(namespace, name).unlink()
        except FileNotFoundError:
            return False
        return True

    def ref_namespaces(self) -> list[str]:
        """The namespaces that hold refs."""
        try:
            return sorted(e.name for e in os.scandir(self.refs_dir) if e.is_dir() and _REF_NAME_RE.fullmatch(e.name))
        except FileNotFoundError:
            return []

    def iter_refs(self, namespace: str, *, trusted_only: bool = False) -> Iterator[tuple[str, str]]:
        """``(name, digest)`` for every ref in ``namespace``; damaged ref files are
        skipped, and with ``trusted_only`` those ``ref_get`` would not return."""
        base = self.refs_dir / namespace
        self._ref_path(namespace, "x")  # validates the namespace
        for folder, _, files in os.walk(base):
            for name in sorted(files):
                if name.startswith(".") or not _REF_NAME_RE.fullmatch(name):
                    continue
                try:
                    raw = (Path(folder) / name).read_bytes()
                except FileNotFoundError:
                    continue  # deleted while we listed
                digest, trusted = read_ref(self.root, namespace, name, raw) if trusted_only else (ref_digest(raw), True)
                if digest is not None and trusted:
                    yield name, digest
