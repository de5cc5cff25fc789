"""Task fingerprints: content-based Merkle hashes of Dask tasks.

A fingerprint names *what a task computes*, so a result stored under it can be
reused by any later run, in any process or machine, that would compute the same
thing. It covers the task's function (by code for notebook and user-module
functions, by module, qualified name and distribution version for library ones),
its literal arguments (by content), the content of local files that its string
or path arguments name, and the fingerprints of the tasks it depends on. It
never covers a key name, ``hash()`` or ``id()`` (ids only key per-run memo
tables), so it does not depend on the process, on how Dask named the keys, or on
whether Dask fused the tasks.

Every value is written as self-delimiting, type-tagged bytes and each task's
bytes are hashed once with xxh3-128. Changing that encoding invalidates every
cache: bump ``SCHEME`` and the golden tests together when that is intended.

Decisions worth knowing:

- Not part of a function's identity: its name, file, line numbers, comments,
  whitespace and docstring (``co_consts[0]`` when no instruction loads it: the
  compiler keeps that slot for the docstring, or None). Renaming a notebook function or editing its docstring keeps its
  cached results; code reading ``__doc__`` is not tracked.
- A function's globals are the names its code (and its nested code) loads as
  globals (LOAD_GLOBAL, LOAD_NAME and the global stores): an attribute name such
  as ``path`` in ``os.path.basename`` is not mistaken for the notebook's global
  ``path``.
- Strings are checked for naming a local file only when they contain a ``/``,
  ``os.sep`` or ``.`` (a bare ``"data"`` is not stat'ed), and only when they
  pass through this encoder: strings inside objects that are pickled (library
  class instances) are not checked. Directories are not digested.
- File digests are memoized on (path, size, mtime_ns, ctime_ns, inode): a file
  rewritten with the same size within one timestamp tick is not noticed.
- Fusion: a task built by ``Task.fuse`` (blockwise fusion, linear fusion)
  fingerprints as its inner output task would unfused, and an ``Alias`` as its
  target, so output keys keep their fingerprint whether or not the graph was
  optimized. Rewrites that change the computation (e.g. dask.array's slice
  fusion ``x[a][b] -> x[c]``) change the fingerprint.

A ``Fingerprinter`` is not thread-safe; use one per thread.
"""

from __future__ import annotations

import functools
import io
import os
import pathlib
import pickle
import stat
import struct
import sys
import types
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

import xxhash

from nbrewind.errors import NbrewindError
from nbrewind.identity.code import Chain, code_info
from nbrewind.identity.files import file_digest
from nbrewind.identity.modules import library_label
from nbrewind.identity.values import MemoNeeded, array_digest, pickle_digest

__all__ = ["SCHEME", "Fingerprinter", "UnfingerprintableError"]

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


class _HashingPickler:
    """Pickle protocol 5 whose sub-objects with a native encoding are replaced by their digest.

    Functions, classes, sets, arrays and user-class instances inside a pickled
    library object are encoded by the Fingerprinter (by code, sorted, by
    buffer), so pickle's by-value function pickling (which embeds line numbers
    and file names) and set iteration order never reach the digest. The stream
    and its out-of-band buffers are hashed by `nbrewind.identity.values`, the
    same way cell keys hash a pickled value: in place and memo-less, so a string
    shared before a checkpoint round trip and two equal strings after it agree.
    """

    def __init__(self, owner: Fingerprinter, root: object) -> None:
        self.owner = owner
        self.root = root

    def _make(self, stream: io.BytesIO, collect: Callable[[pickle.PickleBuffer], None]) -> pickle.Pickler:
        import cloudpickle

        owner_, root_ = self.owner, self.root
        met: dict[int, object] = {}

        class _Pickler(cloudpickle.Pickler):
            def persistent_id(self, obj: object) -> object:
                t = type(obj)
                if t in _PICKLE_NATIVE or obj is root_:
                    if t in _PICKLE_CONTAINERS or obj is root_:
                        _meet(self, obj)
                    return None
                handler = owner_._handler(t)
                if handler == owner_._enc_pickled:
                    _meet(self, obj)
                    return None
                sub: list[bytes] = []
                handler(obj, sub)
                return _digest(b"".join(sub))

        def _meet(pickler: pickle.Pickler, obj: object) -> None:
            # Memo-less, a second meeting is a cycle (reductions build fresh tuples, which
            # hide it from the pickler) or a shared object: pickle with the memo instead.
            if pickler.fast:
                if id(obj) in met:
                    raise MemoNeeded
                met[id(obj)] = obj

        return _Pickler(stream, protocol=5, buffer_callback=collect)

    def digest(self, obj: object) -> bytes:
        return pickle_digest(obj, self._make, _VALUE)


class Fingerprinter:
    """Computes task fingerprints, keeping memo tables between and within runs.

    Cross-run caches hold what cannot change while the process lives (code
    objects' own content, whether a module is library code and its version,
    file digests keyed by stat data). Per-run caches (functions, large values,
    path checks) are cleared after every public call, because a function's
    globals or a value may change between cells.
    """

    def __init__(self) -> None:
        self._modver: dict[str, bytes | None] = {}
        self._fn_memo: dict[int, tuple[object, bytes, Files | None]] = {}
        self._val_memo: dict[int, tuple[object, bytes, Files | None]] = {}
        self._path_memo: dict[str, tuple[bytes, str]] = {}
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

    # ------------------------------------------------------------------ public API

    def fingerprint_graph(
        self,
        dsk: Mapping[Key, Any],
        keys_subset: Iterable[Key] | None = None,
        *,
        external: Mapping[Key, str] | None = None,
        external_files: Mapping[Key, Mapping[str, str]] | None = None,
        settings: Mapping[str, str] | None = None,
    ) -> dict[Key, str]:
        """Fingerprint every task of ``dsk`` (or ``keys_subset`` and what it depends on).

        Tasks are visited in dependency order, each one's bytes embedding its
        dependencies' fingerprints. Legacy tuple tasks are converted on the fly.
        ``external`` gives fingerprints for keys the graph refers to but does
        not hold (persisted futures), ``external_files`` the files those
        fingerprints cover. ``settings`` (setting name -> digest, e.g. the
        library settings at submission) is folded into every task's
        fingerprint; without it, or when empty, nothing is (the encoding is
        then that of tasks before settings existed). Keys that cannot be
        fingerprinted, and everything depending on them, are left out of the
        result and listed with the reason in ``self.failures``: the caller runs
        them uncached. ``self.file_inputs`` tells which files each key covers.
        """
        self._load_dask()
        self._refresh_rngs()
        if not isinstance(dsk, dict):
            dsk = dict(dsk)
        roots = list(dsk) if keys_subset is None else list(keys_subset)
        fps: dict[Key, bytes] = {}
        ext = {k: b"@" + bytes.fromhex(v) for k, v in (external or {}).items()}
        failed: dict[Key, str] = {}
        self._fps = fps
        self._salt = _settings_salt(settings) if settings else b""
        node_files: dict[Key, Files] = {}
        if external_files:
            node_files.update((k, dict(v)) for k, v in external_files.items() if v and k in ext)
        self._node_files = node_files
        try:
            self._traverse(dsk, roots, failed, ext)
        finally:
            self._end_run()
        self.failures = failed
        self.file_inputs = {k: v for k, v in node_files.items() if k in dsk and k in fps}
        return {k: v[1:].hex() for k, v in fps.items() if k in dsk}

    def fingerprint_value(self, obj: object) -> str:
        """Content fingerprint of one value, as it would count as a task argument."""
        self._refresh_rngs()
        try:
            out = [_VALUE]
            self._enc(obj, out)
            return _digest(b"".join(out)).hex()
        finally:
            self._end_run()

    def fingerprint_function(self, fn: Callable[..., Any]) -> str:
        """Fingerprint of a callable: by code for user functions, by name and version for library ones.

        Raises UnfingerprintableError for one that draws from a global RNG.
        """
        self._refresh_rngs()
        try:
            out = [_FUNC]
            self._enc(fn, out)
            return _digest(b"".join(out)).hex()
        finally:
            self._end_run()

    def _end_run(self) -> None:
        self._fn_memo.clear()
        self._val_memo.clear()
        self._path_memo.clear()
        self._stack.clear()
        self._low = _INF
        self._fps = {}
        self._files = None
        self._node_files = {}
        self._salt = b""

    # ------------------------------------------------------------------ graph walk

    def _load_dask(self) -> Any:
        if self._ts is None:
            import dask._task_spec

            self._ts = dask._task_spec
        return self._ts

    def _traverse(self, dsk: Mapping[Key, Any], roots: Iterable[Key], failed: dict[Key, str],
                  external: Mapping[Key, bytes]) -> None:
        GraphNode = self._load_dask().GraphNode
        fps = self._fps
        converted: dict[Key, Any] = {}
        for root in roots:
            if root in fps or root in failed:
                continue
            if root not in dsk:
                raise KeyError(root)
            stack = [root]
            expanded: set[Key] = set()
            while stack:
                k = stack[-1]
                if k in fps or k in failed:
                    stack.pop()
                    continue
                node = dsk[k]
                if not isinstance(node, GraphNode):
                    node = converted.get(k)
                    if node is None:
                        node = converted[k] = self._convert_legacy(k, dsk)
                    if node is None:
                        failed[k] = "key whose value is its own name"
                        stack.pop()
                        continue
                blocked = None
                pending = []
                for d in node.dependencies:
                    if d in fps:
                        continue
                    if d in failed:
                        blocked = d
                        break
                    if d not in dsk:
                        if d in external:
                            fps[d] = external[d]
                            continue
                        failed[d] = "key outside the graph without a known fingerprint"
                        blocked = d
                        break
                    pending.append(d)
                if blocked is not None:
                    failed[k] = f"depends on {blocked!r}: {failed[blocked]}"
                elif pending:
                    if k in expanded:
                        failed[k] = "dependency cycle"
                    else:
                        expanded.add(k)
                        stack.extend(pending)
                        continue
                else:
                    outer_files, self._files = self._files, None
                    try:
                        fps[k] = self._node_token(node)
                    except (UnfingerprintableError, RecursionError) as e:
                        failed[k] = f"{type(e).__name__}: {e}"
                        self._stack.clear()
                        self._low = _INF
                    else:
                        self._node_files_of(k, node)
                    finally:
                        self._files = outer_files
                stack.pop()

    def _node_files_of(self, k: Key, node: Any) -> None:
        """Record the files ``k``'s fingerprint covers: those noted while encoding it, and its
        dependencies' (a Merkle fingerprint covers what its dependencies' cover)."""
        files = self._files
        node_files = self._node_files
        if node_files:
            for d in node.dependencies:
                more = node_files.get(d)
                if more:
                    files = {**files, **more} if files else more
        if files:
            node_files[k] = files

    def _convert_legacy(self, k: Key, dsk: Mapping[Key, Any]) -> Any:
        """A legacy tuple task or literal as a GraphNode; None for a key mapped to itself."""
        ts = self._ts
        node = ts.convert_legacy_task(k, dsk[k], dsk)
        if isinstance(node, ts.Alias) and node.target == k:
            return None
        return node if isinstance(node, ts.GraphNode) else ts.DataNode(k, node)

    def _node_token(self, node: Any) -> bytes:
        """b"@" + the node's fingerprint (an Alias has its target's), as embedded in dependents."""
        ts = self._ts
        if isinstance(node, ts.Alias):
            return self._dep(node.target)
        if isinstance(node, ts.DataNode):
            out = [_DATA]
            self._enc(node.value, out)
            return b"@" + _digest(b"".join(out))
        if not isinstance(node, ts.Task):
            raise UnfingerprintableError(f"unknown graph node type {type(node).__qualname__}")
        func = node.func
        self._check_rng(func)
        if func is ts._execute_subgraph:
            return self._subgraph_digest(node)
        out = [_TASK, self._salt]
        if isinstance(node, ts.NestedContainer):
            self._enc_container(node.klass, node.args, out)
        elif func is ts._identity_cast and node.kwargs.get("typ") in (list, tuple, set, frozenset):
            self._enc_container(node.kwargs["typ"], node.args, out)
        else:
            if type(node) is not ts.Task:
                self._enc(type(node), out)
            self._enc(func, out)
            out.append(b"(")
            for a in node.args:
                self._enc(a, out)
            kwargs = node.kwargs
            if kwargs:
                out.append(b"k")
                for name in sorted(kwargs):
                    out.append(_name(name))
                    self._enc(kwargs[name], out)
            out.append(b")")
        return b"@" + _digest(b"".join(out))

    def _enc_container(self, klass: type, items: tuple[Any, ...], out: list[bytes]) -> None:
        """A List/Tuple/Set/Dict node, encoded like the literal container it builds."""
        if klass is dict:
            out.append(b"{")
            for x in items:
                self._enc(x, out)
            out.append(b"}")
        elif klass is set or klass is frozenset:
            self._enc_items_sorted(items, b"<" if klass is set else b"~<", out)
        else:
            out.append(b"[" if klass is list else b"(")
            for x in items:
                self._enc(x, out)
            out.append(b"]" if klass is list else b")")

    def _subgraph_digest(self, node: Any) -> bytes:
        """A fused task: the token its inner output task would have in the unfused graph.

        Each inner input key is bound to what the outer argument contributes: an
        upstream task's token, or a literal's (DataNode's) inline encoding, exactly
        as the unfused task would have embedded that argument.
        """
        inner, outkey, inkeys, *refs = node.args
        if not (isinstance(inner, dict) and isinstance(inkeys, tuple) and len(refs) == len(inkeys)):
            raise UnfingerprintableError("fused task of an unknown layout")
        local: dict[Key, bytes] = {}
        for k, r in zip(inkeys, refs):
            sub: list[bytes] = []
            self._enc(r, sub)
            local[k] = b"".join(sub)
        outer, outer_files = self._fps, self._node_files
        failed: dict[Key, str] = {}
        self._fps, self._node_files = local, {}
        try:
            self._traverse(inner, [outkey], failed, {})
            inner_files = self._node_files.get(outkey)
        finally:
            self._fps, self._node_files = outer, outer_files
        if inner_files:
            self._merge_files(inner_files)
        token = local.get(outkey, b"")
        if not token.startswith(b"@") or outkey in inkeys:
            raise UnfingerprintableError(f"fused task: {failed.get(outkey, 'output is not a task')}")
        return token

    def _dep(self, key: Key) -> bytes:
        try:
            return self._fps[key]
        except (KeyError, TypeError):
            raise UnfingerprintableError("refers to a key without a fingerprint") from None

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

    def _merge_files(self, files: Files) -> None:
        if self._files is None:
            self._files = dict(files)
        else:
            self._files.update(files)

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
            return _HashingPickler(self, obj).digest(obj)
        except (UnfingerprintableError, RecursionError):
            raise
        except Exception as e:  # pickle raises many types (TypeError, PicklingError, AttributeError ...)
            raise UnfingerprintableError(f"cannot pickle {type(obj).__qualname__}: {e}") from e

    # ------------------------------------------------------------------ functions

    def _enc_callable(self, obj: Any, out: list[bytes]) -> None:
        self._memo_value(obj, out, b"f", self._callable_digest, self._fn_memo)

    def _callable_digest(self, obj: object) -> bytes:
        sub: list[bytes] = []
        self._callable_parts(obj, sub)
        return _digest(b"".join(sub))

    def _callable_parts(self, fn: Any, out: list[bytes]) -> None:
        t = type(fn)
        if t is types.FunctionType:
            ver = self._module_version(fn.__module__)
            if ver is None:
                self._user_function(fn, out)
                return
            out.append(b"L" + _name(fn.__module__) + _name(fn.__qualname__) + ver)
            if fn.__closure__ or "<locals>" in fn.__qualname__:
                self._enc((fn.__defaults__, fn.__kwdefaults__), out)
                self._enc_closure(fn, out)
        elif t is types.MethodType:
            self._check_rng(fn.__self__)
            out.append(b"BM")
            self._enc(fn.__func__, out)
            self._enc(fn.__self__, out)
        elif t is functools.partial:
            out.append(b"PA")
            self._enc(fn.func, out)
            self._enc(fn.args, out)
            self._enc(sorted(fn.keywords.items()), out)
        elif isinstance(fn, type):
            self._class_parts(fn, out)
        else:
            owner = getattr(fn, "__self__", None)
            self._check_rng(fn)
            if owner is not None:
                self._check_rng(owner)
            mod = getattr(fn, "__module__", None)
            if not isinstance(mod, str):
                mod = getattr(getattr(fn, "__objclass__", None) or type(owner), "__module__", "builtins")
            qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "")
            out.append(b"L" + _name(str(mod)) + _name(str(qual)) + (self._module_version(mod) or b"?"))
            if owner is not None and type(owner) is not types.ModuleType:
                self._enc(owner, out)

    def _check_chains(self, fn: types.FunctionType, chains: Iterable[Chain]) -> None:
        """Raise if a dotted reference of ``fn``'s code reaches the global RNG through modules.

        ``np.random.normal`` is resolved as the global ``np``, then attribute by attribute
        while the value is a module; whatever it stops at is checked (a module attribute
        is never looked up on anything but a module, so no user code runs).
        """
        g = fn.__globals__
        free = fn.__code__.co_freevars
        for kind, root, attrs in chains:
            if kind == "g":
                value = g.get(root, _MISSING)
            elif kind == "i":
                value = sys.modules.get(root, _MISSING)
            elif root in free and fn.__closure__:
                try:
                    value = fn.__closure__[free.index(root)].cell_contents
                except ValueError:
                    continue
            else:
                continue
            for attr in attrs:
                if type(value) is not types.ModuleType:
                    break
                value = value.__dict__.get(attr, _MISSING)
            self._check_rng(value)

    def _check_rng(self, value: object) -> None:
        """Raise UnfingerprintableError if ``value`` is, or draws from, a global random number generator.

        A task that draws from ``random``'s or ``numpy.random``'s global state depends on
        the seed (and on every earlier draw) and advances that state as a side effect: a
        cached result would be wrong after a reseed and would skip the side effect. Such
        tasks (and their dependents) run uncached, like ``pure=False`` ones. Generator
        objects passed as values (``np.random.default_rng(0)``) are fingerprinted by content.
        """
        rngs = self._rngs
        if rngs is None:
            rngs = self._load_rngs()
        label = rngs.get(id(value))
        if label is None and type(value) in _BOUND_TYPES:
            label = rngs.get(id(getattr(value, "__self__", None)))
        if label is not None:
            raise UnfingerprintableError(f"draws from the global random number generator ({label}): impure, runs uncached")

    def _refresh_rngs(self) -> None:
        """Forget the RNG table if ``random`` or ``numpy.random`` was (re)loaded since it was made."""
        if self._rng_modules != (sys.modules.get("random"), sys.modules.get("numpy.random.mtrand")):
            self._rngs = None

    def _load_rngs(self) -> dict[int, str]:
        """id -> label of the global RNG objects of the loaded ``random`` and ``numpy.random``."""
        found: dict[int, str] = {}
        keep: list[object] = []
        rnd = sys.modules.get("random")
        mtrand = sys.modules.get("numpy.random.mtrand")
        for module, state_name in ((rnd, "_inst"), (mtrand, "_rand")):
            if module is None:
                continue
            state = getattr(module, state_name, None)
            for name, value in list(vars(module).items()):
                if callable(value) and not isinstance(value, type) and (
                    module is mtrand or getattr(value, "__self__", None) is state
                ):
                    found[id(value)] = f"{module.__name__}.{name}"
                    keep.append(value)
            found[id(module)] = module.__name__
            if state is not None:
                found[id(state)] = f"{module.__name__}.{state_name}"
                keep.append(state)
        np_random = sys.modules.get("numpy.random")
        if np_random is not None:
            found[id(np_random)] = "numpy.random"
        self._rngs, self._rng_keep = found, (keep, rnd, mtrand, np_random)
        self._rng_modules = (rnd, mtrand)
        return found

    def _enc_closure(self, fn: types.FunctionType, out: list[bytes]) -> None:
        for cell in fn.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:
                out.append(b"~")
                continue
            self._enc(value, out)

    def _user_function(self, fn: types.FunctionType, out: list[bytes]) -> None:
        info = code_info(fn.__code__)
        gnames, strs, anames = info.global_names, info.strings, info.names
        out.append(b"U" + info.token)
        self._enc((fn.__defaults__, fn.__kwdefaults__), out)
        self._enc_closure(fn, out)
        g = fn.__globals__
        self._check_chains(fn, info.chains)
        for name in gnames:
            try:
                value = g[name]
            except KeyError:
                continue
            out.append(b"g" + _name(name))
            if type(value) is types.ModuleType and self._module_version(value.__name__) is None:
                # A user module: what this code reads from it, by the names it uses.
                out.append(b"um" + _name(value.__name__))
                attrs = value.__dict__
                for attr in anames:
                    if attr in attrs:
                        out.append(_name(attr))
                        self._enc(attrs[attr], out)
            else:
                self._enc(value, out)
        for s in strs:
            self._enc_str(s, out)

    def _class_parts(self, cls: type, out: list[bytes]) -> None:
        ver = self._module_version(cls.__module__)
        if ver is not None:
            out.append(b"L" + _name(cls.__module__) + _name(cls.__qualname__) + ver)
            return
        out.append(b"UK")
        if type(cls) is not type:
            self._enc(type(cls), out)
        self._enc(cls.__bases__, out)
        d = cls.__dict__
        for name in sorted(d):
            if name not in _CLASS_SKIP:
                out.append(_name(name))
                self._enc(d[name], out)

    # ------------------------------------------------------------------ library detection

    def _module_version(self, modname: str | None) -> bytes | None:
        """A version label for library modules (site-packages, stdlib, builtin); None for user code."""
        if modname is None:
            modname = "builtins"
        try:
            return self._modver[modname]
        except KeyError:
            pass
        if modname == "__main__":
            return None
        mod = sys.modules.get(modname)
        if mod is None:
            return None  # not imported: treat as user code, and do not cache
        text = library_label(mod)
        label = None if text is None else text.encode()
        self._modver[modname] = label
        return label
