"""The fingerprint scheme's constants and framing, its error, and the state an encoder keeps.

`EncoderState` holds two kinds of memo: cross-run caches (what cannot change while
the process lives: whether a module is library code and its version) and per-run
tables (functions, values, paths, the cycle stack, the files a digest covers),
which `_end_run` clears after every public call because a function's globals or
a value may change between cells. The encoders (`code`, `values`) and the graph
walk (`graph`) are layered on it, in that order.
"""

from __future__ import annotations

import struct
import sys
import types
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import xxhash

from nbrewind.errors import NbrewindError

SCHEME = b"nbrewind-fp/2;"
_TASK = SCHEME + b"T"
_DATA = SCHEME + b"D"
_VALUE = SCHEME + b"V"
_FUNC = SCHEME + b"F"

_digest = xxhash.xxh3_128_digest
_pack_d = struct.Struct("<d").pack
_pack_dd = struct.Struct("<dd").pack
_INF = sys.maxsize
_CLASS_SKIP = frozenset(
    {"__dict__", "__weakref__", "__module__", "__qualname__", "__doc__",
     "__firstlineno__", "__static_attributes__", "_abc_impl"}
)
_MISSING = object()
_BOUND_TYPES = (types.MethodType, types.BuiltinMethodType)
_PICKLE_NATIVE = frozenset({str, bytes, int, float, bool, type(None), tuple, list, dict})
_PICKLE_CONTAINERS = frozenset({tuple, list, dict})
_BUILTIN_CALLABLES = (
    types.BuiltinFunctionType, types.MethodWrapperType, types.MethodDescriptorType,
    types.WrapperDescriptorType, types.ClassMethodDescriptorType,
)

Key = Hashable
Files = dict[str, str]
"""Absolute path -> content digest (hex) of the local files a fingerprint covers."""


def _settings_salt(settings: Mapping[str, str]) -> bytes:
    """b"$" + a digest of the settings, placed right after a task's scheme tag.

    No value encoding starts with ``$``, so a salted task's bytes never equal an
    unsalted one's.
    """
    parts = [_name(str(k)) + _name(str(v)) for k, v in sorted(settings.items())]
    return b"$" + _digest(b"%d:" % len(parts) + b"".join(parts))


class UnfingerprintableError(NbrewindError):
    """A value, function or task has no stable fingerprint.

    Raised for objects that cannot be pickled or reduced (locks, open sockets,
    generators), for references to keys outside the graph, and for graph nodes
    of unknown types. The caller treats the task as uncacheable and runs it.
    """


def _name(s: str) -> bytes:
    b = s.encode("utf-8", "surrogatepass")
    return b"%d:" % len(b) + b


class EncoderState:
    """The memo tables and per-run context every encoder method reads (see the module docstring)."""

    def __init__(self) -> None:
        self._modver: dict[str, bytes | None] = {}
        self._fn_memo: dict[int, tuple[object, bytes, Files | None]] = {}
        self._val_memo: dict[int, tuple[object, bytes, Files | None]] = {}
        self._path_memo: dict[str, tuple[bytes, str]] = {}
        self._sub_memo: dict[tuple[Any, ...], tuple[object, bytes, Files | None]] = {}
        self._files: Files | None = None
        self._node_files: dict[Key, Files] = {}
        self._stack: dict[int, int] = {}
        self._low = _INF
        self._fps: dict[Key, bytes] = {}
        self._salt = b""
        self._ts: Any = None
        self._rngs: dict[int, str] | None = None
        self._rng_keep: object = None
        self._rng_modules: tuple[object, object] = (None, None)
        self.failures: dict[Key, str] = {}
        """Keys the last ``fingerprint_graph`` call could not fingerprint, with the reason."""
        self.file_inputs: dict[Key, Files] = {}
        """For the last ``fingerprint_graph`` call: the local files each key's fingerprint covers
        (its own and its dependencies'), absolute path -> content digest (hex); keys without any
        are absent."""

    def _end_run(self) -> None:
        self._fn_memo.clear()
        self._val_memo.clear()
        self._path_memo.clear()
        self._sub_memo.clear()
        self._stack.clear()
        self._low = _INF
        self._fps = {}
        self._files = None
        self._node_files = {}
        self._salt = b""


    def _load_dask(self) -> Any:
        if self._ts is None:
            import dask._task_spec

            self._ts = dask._task_spec
        return self._ts


    def _enter(self, obj: object, out: list[bytes]) -> bool:
        """Push ``obj`` on the cycle stack; on a revisit write a relative back-reference instead."""
        i = id(obj)
        d = self._stack.get(i)
        if d is not None:
            self._low = min(self._low, d)
            out.append(b"^%d;" % (len(self._stack) - 1 - d))
            return False
        self._stack[i] = len(self._stack)
        return True

    def _memo_value(self, obj: object, out: list[bytes], tag: bytes,
                    compute: Callable[[object], bytes],
                    memo: dict[int, tuple[object, bytes, Files | None]] | None = None) -> None:
        """Append tag + digest of ``obj``, computing it once per run per object (in ``memo``,
        the value memo by default). Cycle-safe: a result that refers to a caller still on the
        stack is only valid in this context and is not memoized. The files the digest covers
        are memoized with it, so a memo hit still notes them for the task at hand."""
        memo = self._val_memo if memo is None else memo
        i = id(obj)
        hit = memo.get(i)
        if hit is not None and hit[0] is obj:
            out.append(hit[1])
            if hit[2]:
                self._merge_files(hit[2])
            return
        if not self._enter(obj, out):
            return
        low = self._low
        self._low = _INF
        outer_files, self._files = self._files, None
        try:
            tok = tag + compute(obj)
        finally:
            d = self._stack.pop(i)
            inner_low, self._low = self._low, min(low, self._low)
            inner_files, self._files = self._files, outer_files
            if inner_files:
                self._merge_files(inner_files)
        if inner_low >= d:
            memo[i] = (obj, tok, inner_files)
        out.append(tok)

    def _merge_files(self, files: Files) -> None:
        if self._files is None:
            self._files = dict(files)
        else:
            self._files.update(files)


    # Implemented further up the stack (values, graph); declared for the layers below.

    def _enc(self, obj: object, out: list[bytes]) -> None:
        raise NotImplementedError

    def _handler(self, t: type) -> Callable[[Any, list[bytes]], None]:
        raise NotImplementedError

    def _dep(self, key: Key) -> bytes:
        raise NotImplementedError

    def _enc_str(self, obj: str, out: list[bytes]) -> None:
        raise NotImplementedError

    def _node_token(self, node: Any) -> bytes:
        raise NotImplementedError
