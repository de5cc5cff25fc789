"""Fingerprints of values: type-tagged, self-delimiting bytes for literals and
containers, arrays and pickled library objects through `nbrewind.identity.values`,
pandas objects column by column, paths and fsspec files by their content."""

from __future__ import annotations

import functools
import os
import pathlib
import stat
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

from nbrewind.identity.code import code_info
from nbrewind.identity.files import file_digest
from nbrewind.identity.values import array_digest
from nbrewind.tasks.fingerprint.code import CodeEncoding
from nbrewind.tasks.fingerprint.pickled import HashingPickler
from nbrewind.tasks.fingerprint.common import (
    _BUILTIN_CALLABLES,
    UnfingerprintableError,
    _digest,
    _name,
    _pack_d,
    _pack_dd,
)


class ValueEncoding(CodeEncoding):
    """The value encoders and the per-type dispatch table."""

    def __init__(self) -> None:
        super().__init__()
        self._dispatch: dict[type, Callable[[Any, list[bytes]], None]] = {
            type(None): self._enc_const, bool: self._enc_const, type(...): self._enc_const,
            int: self._enc_int, float: self._enc_float, complex: self._enc_complex,
            str: self._enc_str, bytes: self._enc_bytes, bytearray: self._enc_bytes,
            tuple: self._enc_tuple, list: self._enc_list, dict: self._enc_dict,
            set: self._enc_set, frozenset: self._enc_set,
            slice: self._enc_slice, range: self._enc_slice,
            types.FunctionType: self._enc_callable, types.MethodType: self._enc_callable,
            functools.partial: self._enc_callable, type: self._enc_callable,
            types.ModuleType: self._enc_module, types.CodeType: self._enc_code,
            staticmethod: self._enc_wrapper, classmethod: self._enc_wrapper,
            property: self._enc_property,
            types.MemberDescriptorType: self._enc_descriptor,
            types.GetSetDescriptorType: self._enc_descriptor,
        }

    # ------------------------------------------------------------------ values

    def _enc(self, obj: object, out: list[bytes]) -> None:
        handler = self._dispatch.get(type(obj))
        if handler is None:
            handler = self._handler(type(obj))
        handler(obj, out)

    def _handler(self, t: type) -> Callable[[Any, list[bytes]], None]:
        """The encoder for values of type ``t``, resolved once per type."""
        h = self._dispatch.get(t)
        if h is not None:
            return h
        h = self._resolve(t)
        self._dispatch[t] = h
        return h

    def _resolve(self, t: type) -> Callable[[Any, list[bytes]], None]:
        mods = sys.modules
        ts = mods.get("dask._task_spec")
        if ts is not None:
            self._load_dask()
            if issubclass(t, ts.GraphNode):
                return self._enc_graphnode
            if issubclass(t, ts.TaskRef):
                return self._enc_ref
        np = mods.get("numpy")
        if np is not None:
            if t is np.ndarray:
                return self._enc_ndarray
            if issubclass(t, np.generic):
                return self._enc_npscalar
            if issubclass(t, np.dtype):
                return self._enc_dtype
            if issubclass(t, np.ufunc):
                return self._enc_callable
        pd = mods.get("pandas")
        if pd is not None and t in (pd.DataFrame, pd.Series, pd.Index, pd.RangeIndex):
            return self._enc_pandas
        if issubclass(t, pathlib.PurePath):
            return self._enc_path
        fsspec_core = mods.get("fsspec.core")
        if fsspec_core is not None and issubclass(t, fsspec_core.OpenFile):
            return self._enc_openfile
        if issubclass(t, _BUILTIN_CALLABLES) or issubclass(t, type):
            return self._enc_callable
        if self._module_version(t.__module__) is None:
            return self._enc_instance
        return self._enc_pickled

    def _enc_const(self, obj: object, out: list[bytes]) -> None:
        out.append(b"N" if obj is None else b"T" if obj is True else b"F" if obj is False else b"E")

    def _enc_int(self, obj: int, out: list[bytes]) -> None:
        out.append(b"i%d;" % obj)

    def _enc_float(self, obj: float, out: list[bytes]) -> None:
        out.append(b"d" + _pack_d(obj))

    def _enc_complex(self, obj: complex, out: list[bytes]) -> None:
        out.append(b"j" + _pack_dd(obj.real, obj.imag))

    def _enc_str(self, obj: str, out: list[bytes]) -> None:
        out.append(b"s" + _name(obj))
        if ("/" in obj or "." in obj or os.sep in obj) and len(obj) < 4096:
            hit = self._path_memo.get(obj)
            if hit is None:
                fd = self._file_digest(obj)
                if fd:
                    self._path_memo[obj] = (fd, os.path.abspath(obj))
                else:
                    self._path_memo[obj] = (fd, "")
            else:
                fd = hit[0]
                if fd:
                    self._note_file(hit[1], fd)
            if fd:
                out.append(fd)

    def _file_digest(self, path: str) -> bytes:
        """b"" unless ``path`` names a regular local file, else a tag and its content digest.

        The digest is `nbrewind.identity.files.file_digest`'s, the one cell keys record.
        The file is noted as an input of the task being fingerprinted.
        """
        if "\0" in path or "\n" in path:
            return b""
        full = os.path.abspath(path)
        try:
            hexdigest = file_digest(full)
        except (OSError, ValueError) as e:
            try:
                regular = stat.S_ISREG(os.stat(full).st_mode)
            except (OSError, ValueError):
                return b""  # a string that only looks like a path (too long, a loop, no access)
            if not regular:
                return b""
            raise UnfingerprintableError(f"cannot read file {path!r}: {e}") from e
        if hexdigest is None:
            return b""
        fd = b"@F" + bytes.fromhex(hexdigest)
        self._note_file(full, fd)
        return fd

    def _note_file(self, path: str, fd: bytes) -> None:
        files = self._files
        if files is None:
            files = self._files = {}
        files[path] = fd[2:].hex()

    def _enc_bytes(self, obj: bytes | bytearray, out: list[bytes]) -> None:
        if len(obj) > 4096:
            out.append(b"B" + _digest(obj))
        else:
            out.append(b"b%d:" % len(obj))
            out.append(bytes(obj))

    def _enc_tuple(self, obj: tuple[Any, ...], out: list[bytes]) -> None:
        out.append(b"(")
        enc = self._enc
        for x in obj:
            enc(x, out)
        out.append(b")")

    def _enc_list(self, obj: list[Any], out: list[bytes]) -> None:
        if not self._enter(obj, out):
            return
        try:
            out.append(b"[")
            enc = self._enc
            for x in obj:
                enc(x, out)
            out.append(b"]")
        finally:
            del self._stack[id(obj)]

    def _enc_dict(self, obj: dict[Any, Any], out: list[bytes]) -> None:
        if not self._enter(obj, out):
            return
        try:
            out.append(b"{")
            enc = self._enc
            for k, v in obj.items():
                enc(k, out)
                enc(v, out)
            out.append(b"}")
        finally:
            del self._stack[id(obj)]

    def _enc_set(self, obj: set[Any] | frozenset[Any], out: list[bytes]) -> None:
        if not self._enter(obj, out):
            return
        try:
            self._enc_items_sorted(obj, b"<" if type(obj) is set else b"~<", out)
        finally:
            del self._stack[id(obj)]

    def _enc_items_sorted(self, items: Iterable[Any], tag: bytes, out: list[bytes]) -> None:
        encoded = []
        for x in items:
            sub: list[bytes] = []
            self._enc(x, sub)
            encoded.append(b"".join(sub))
        encoded.sort()
        out.append(tag)
        out.extend(encoded)
        out.append(b">")

    def _enc_slice(self, obj: slice | range, out: list[bytes]) -> None:
        out.append(b"S" if type(obj) is slice else b"R")
        self._enc_tuple((obj.start, obj.stop, obj.step), out)

    def _enc_graphnode(self, obj: Any, out: list[bytes]) -> None:
        if isinstance(obj, self._ts.DataNode):
            self._enc(obj.value, out)
        else:
            out.append(self._node_token(obj))

    def _enc_ref(self, obj: Any, out: list[bytes]) -> None:
        out.append(self._dep(obj.key))

    def _enc_module(self, obj: types.ModuleType, out: list[bytes]) -> None:
        out.append(b"M" + _name(obj.__name__) + (self._module_version(obj.__name__) or b"user"))

    def _enc_code(self, obj: types.CodeType, out: list[bytes]) -> None:
        out.append(b"C" + code_info(obj).token)

    def _enc_wrapper(self, obj: staticmethod[Any, Any] | classmethod[Any, Any, Any], out: list[bytes]) -> None:
        out.append(b"sm" if type(obj) is staticmethod else b"cm")
        self._enc(obj.__func__, out)

    def _enc_property(self, obj: property, out: list[bytes]) -> None:
        out.append(b"pr")
        self._enc_tuple((obj.fget, obj.fset, obj.fdel), out)

    def _enc_descriptor(self, obj: Any, out: list[bytes]) -> None:
        out.append(b"ds" + _name(obj.__name__))

    def _enc_ndarray(self, obj: Any, out: list[bytes]) -> None:
        if obj.dtype.hasobject:
            self._enc_pickled(obj, out)
        elif obj.nbytes <= 512:
            out.append(self._array_token(obj))
        else:
            self._memo_value(obj, out, b"", self._array_token)

    @staticmethod
    def _array_token(a: Any) -> bytes:
        token = array_digest(a)
        assert token is not None  # object arrays are pickled, never come here
        return b"A" + token

    def _enc_npscalar(self, obj: Any, out: list[bytes]) -> None:
        if obj.dtype.hasobject:
            self._enc_pickled(obj, out)
        else:
            raw = obj.tobytes()
            out.append(b"g" + _name(obj.dtype.str) + b"%d:" % len(raw) + raw)

    def _enc_dtype(self, obj: Any, out: list[bytes]) -> None:
        if obj.names is not None or obj.hasobject and obj.str != "|O":
            self._enc_pickled(obj, out)
        else:
            out.append(b"dt" + _name(obj.str))

    def _enc_pandas(self, obj: Any, out: list[bytes]) -> None:
        self._memo_value(obj, out, b"P", self._pandas_digest)

    def _pandas_digest(self, obj: Any) -> bytes:
        import pandas as pd

        sub: list[bytes] = []
        if isinstance(obj, pd.DataFrame):
            sub.append(b"DF")
            self._enc_index(obj.columns, sub)
            self._enc_index(obj.index, sub)
            iter_arrays = getattr(obj, "_iter_column_arrays", None)
            arrays = iter_arrays() if iter_arrays else (obj.iloc[:, i].array for i in range(obj.shape[1]))
            for arr in arrays:
                self._enc_array_like(arr, sub)
            if obj.attrs:
                self._enc(dict(obj.attrs), sub)
        elif isinstance(obj, pd.Series):
            sub.append(b"SR")
            self._enc(obj.name, sub)
            self._enc_index(obj.index, sub)
            self._enc_array_like(getattr(obj, "_values", obj.array), sub)
            if obj.attrs:
                self._enc(dict(obj.attrs), sub)
        else:
            self._enc_index(obj, sub)
        return _digest(b"".join(sub))

    def _enc_index(self, idx: Any, out: list[bytes]) -> None:
        import pandas as pd

        if type(idx) is pd.RangeIndex:
            out.append(b"RI")
            self._enc((idx.start, idx.stop, idx.step, idx.name), out)
        elif type(idx) is pd.Index:
            out.append(b"IX")
            self._enc(idx.name, out)
            self._enc_array_like(getattr(idx, "_values", idx.array), out)
        else:
            self._enc_pickled(idx, out)

    def _enc_array_like(self, arr: Any, out: list[bytes]) -> None:
        np = sys.modules.get("numpy")
        if np is not None and type(arr) is np.ndarray:
            self._enc_ndarray(arr, out)
        else:
            self._enc_pickled(arr, out)

    def _enc_path(self, obj: pathlib.PurePath, out: list[bytes]) -> None:
        s = str(obj)
        out.append(b"p" + _name(type(obj).__name__) + _name(s))
        if isinstance(obj, pathlib.Path):
            out.append(self._file_digest(s))

    def _enc_openfile(self, obj: Any, out: list[bytes]) -> None:
        fs, path = obj.fs, obj.path
        protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
        out.append(b"of")
        self._enc((protocols, path, obj.mode, obj.compression, obj.encoding), out)
        if "file" in protocols or "local" in protocols:
            out.append(self._file_digest(path))
        else:
            try:
                self._enc(fs.ukey(path), out)
            except Exception as e:  # any backend failure means we cannot vouch for the content
                raise UnfingerprintableError(f"cannot identify remote file {path!r}: {e}") from e

    def _enc_instance(self, obj: Any, out: list[bytes]) -> None:
        """A user-class instance: its class (by code) plus the state its reduction exposes."""
        self._memo_value(obj, out, b"O", self._instance_digest)

    def _instance_digest(self, obj: Any) -> bytes:
        try:
            rv = obj.__reduce_ex__(5)
        except Exception as e:  # whatever a user __reduce__ raises, the object is unpicklable
            raise UnfingerprintableError(f"cannot reduce {type(obj).__qualname__}: {e}") from e
        sub = [b"O"]
        self._enc(type(obj), sub)
        if isinstance(rv, str):
            sub.append(_name(rv))
        else:
            for i, part in enumerate(rv):
                if i in (3, 4) and part is not None:
                    part = list(part)
                self._enc(part, sub)
        return _digest(b"".join(sub))

    def _enc_pickled(self, obj: Any, out: list[bytes]) -> None:
        self._memo_value(obj, out, b"K", self._pickle_digest)

    def _pickle_digest(self, obj: Any) -> bytes:
        try:
            return HashingPickler(self, obj).digest(obj)
        except (UnfingerprintableError, RecursionError):
            raise
        except Exception as e:  # pickle raises many types (TypeError, PicklingError, AttributeError ...)
            raise UnfingerprintableError(f"cannot pickle {type(obj).__qualname__}: {e}") from e

