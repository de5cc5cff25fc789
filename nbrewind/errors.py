"""The exception hierarchy shared by every layer.

This module imports nothing from nbrewind, so every layer may import it.
Each error says what went wrong and what to do about it.
"""

from __future__ import annotations


class NbrewindError(Exception):
    """Root of every error NBRewind raises on purpose."""


class StoreError(NbrewindError):
    """A problem with a store directory, its objects or its catalog."""


class NotAStoreError(StoreError):
    """The directory exists but was not created by NBRewind."""


class SchemaTooNewError(StoreError):
    """The catalog was written by a newer NBRewind than this one."""


class ObjectNotFoundError(StoreError, KeyError):
    """No object with this digest is in the store."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "object not found"


class CorruptObjectError(StoreError):
    """An object's bytes do not hash to its name (bit rot, truncation, tampering)."""


class ReadOnlyStoreError(StoreError):
    """The store cannot be written (permissions or a read-only filesystem)."""


class ChangedWhileStagedError(StoreError):
    """A staged buffer changed before the background writer copied it; it was not written."""


class StoreFullError(StoreError):
    """The filesystem holding the store ran out of space during a write."""


class UntrustedStoreError(NbrewindError):
    """The store came from elsewhere and has not been trusted; nothing in it is unpickled."""


class PackError(NbrewindError):
    """A backpack could not be built, read or verified."""


class NotATreeError(StoreError):
    """An object was read as a tree (a list of child digests) but is a plain object."""
