"""The hashing pickler: a library object's fingerprint from its pickle stream, with
every sub-object that has a native encoding replaced by that encoding's digest, and
never the pickle memo (see `HashingPickler`)."""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from typing import TYPE_CHECKING

from nbrewind.identity.values import pickle_digest
from nbrewind.tasks.fingerprint.common import _PICKLE_NATIVE, _VALUE, UnfingerprintableError, _digest

if TYPE_CHECKING:
    from nbrewind.tasks.fingerprint.values import ValueEncoding

__all__ = ["HashingPickler"]


class HashingPickler:
    """Pickle protocol 5, memo-less, whose sub-objects with a native encoding are replaced by their digest.

    Functions, classes, sets, arrays and user-class instances inside a pickled
    library object are encoded by the Fingerprinter (by code, sorted, by
    buffer), so pickle's by-value function pickling (which embeds line numbers
    and file names) and set iteration order never reach the digest. So is every
    library object nested inside the one being pickled: each is its own Merkle
    node, digested once per run, and a cycle through library objects is a
    back-reference by depth (the Fingerprinter's cycle stack), not a memo entry.

    The stream and its out-of-band buffers are hashed by `nbrewind.identity.values`,
    always without the memo: the memo writes a back-reference for an object met
    twice, so a string or list shared before a round trip and two equal ones after
    it would pickle differently. Plain containers met twice are simply written
    twice. A value that cannot be pickled memo-less (a cycle of plain containers, a
    stream past the bound) is unfingerprintable: its task runs uncached.
    """

    def __init__(self, owner: ValueEncoding, root: object) -> None:
        self.owner = owner
        self.root = root

    def _make(self, stream: io.BytesIO, collect: Callable[[pickle.PickleBuffer], None]) -> pickle.Pickler:
        return _pickler_class()(self.owner, self.root, stream, collect)

    def digest(self, obj: object) -> bytes:
        return pickle_digest(obj, self._make, _VALUE)


_PICKLER: Callable[..., pickle.Pickler] | None = None


def _pickler_class() -> Callable[..., pickle.Pickler]:
    """The hashing pickler class (made once: cloudpickle is imported on first use)."""
    global _PICKLER
    if _PICKLER is not None:
        return _PICKLER
    import cloudpickle

    class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle has no annotations
        def __init__(self, owner: ValueEncoding, root: object, stream: io.BytesIO,
                     collect: Callable[[pickle.PickleBuffer], None]) -> None:
            super().__init__(stream, protocol=5, buffer_callback=collect)
            self._owner = owner
            self._root: object = root
            self._root_seen = False

        def dump(self, obj: object) -> None:
            if not self.fast:
                # `pickle_digest` retries with the memo when memo-less pickling failed; memo
                # bytes depend on sharing, not content, so that value has no fingerprint.
                raise UnfingerprintableError(f"{type(obj).__qualname__} cannot be pickled canonically (a cycle?)")
            super().dump(obj)

        def persistent_id(self, obj: object) -> object:
            t = type(obj)
            if t in _PICKLE_NATIVE:
                return None
            if obj is self._root and not self._root_seen:
                self._root_seen = True
                return None
            sub: list[bytes] = []
            self._owner._handler(t)(obj, sub)
            return _digest(b"".join(sub))

    _PICKLER = _Pickler
    return _Pickler
