"""What a code object is: a digest of its normalized content, plus what it refers to.

Task fingerprints (and, later, cell keys) must agree on when two functions are
"the same code". The answer here: the same bytecode, flags and argument
counts, constants (type-tagged, never ``str(const)``), names, variable names,
exception table and nested code, recursively. Not part of it, so that editing
them keeps cached results: the function's name, file, line numbers, comments,
whitespace and its docstring (``co_consts[0]`` when no instruction loads it:
the compiler keeps that slot for the docstring, or None). Code reading
``__doc__`` is not tracked.

A code object's digest says nothing about the *values* it refers to. `code_info`
also lists what a caller must key separately: the names the code loads or binds
as globals (LOAD_GLOBAL, LOAD_NAME and the global stores, not attribute names,
so ``path`` in ``os.path.basename`` is not mistaken for a global ``path``), its
string constants (which may name files), every name it uses (attributes
included: what it may read from a user module), and its *reference chains*:
``np.random.normal`` as (global ``np``, attributes ``random``, ``normal``), so a
caller can resolve what a dotted reference reaches through modules (the task
fingerprinter uses this to find code that draws from the global RNG).

The encoding is pinned by the task fingerprint golden tests: changing it
invalidates every task cache.
"""

from __future__ import annotations

import dis
import struct
import types
from dataclasses import dataclass
from typing import Any

import xxhash

__all__ = ["Chain", "CodeInfo", "closure_values", "code_digest", "code_info", "line_digest"]

_digest = xxhash.xxh3_128_digest
_pack_d = struct.Struct("<d").pack
_pack_dd = struct.Struct("<dd").pack
_HASCONST = frozenset(dis.hasconst)
_EXTENDED_ARG = dis.opmap["EXTENDED_ARG"]
_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL", "STORE_NAME", "DELETE_NAME"})
_ATTR_OPS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
_STORE_OPS = frozenset({"STORE_FAST", "STORE_NAME", "STORE_GLOBAL", "STORE_DEREF"})
_CACHE_LIMIT = 20_000

Chain = tuple[str, str, tuple[str, ...]]
"""(root kind, root, attributes): kind ``g`` is a global name, ``d`` a free
variable (closure cell), ``i`` a module imported by dotted path in the code itself."""


@dataclass(frozen=True)
class CodeInfo:
    """A code object's normalized digest and what it refers to (nested code included)."""

    token: bytes
    """xxh3-128 digest (16 bytes) of the normalized content."""
    global_names: tuple[str, ...]
    """Names loaded or bound as globals, in first-use order."""
    strings: tuple[str, ...]
    """String constants (docstring excluded), in first-use order."""
    names: tuple[str, ...]
    """Every name the code uses (``co_names``: globals and attributes)."""
    chains: tuple[Chain, ...]
    """Dotted references from a global, free variable or import, attributes in order."""


_cache: dict[int, tuple[types.CodeType, CodeInfo]] = {}


def code_digest(code_or_function: types.CodeType | types.FunctionType | types.MethodType) -> str:
    """Hex digest of a code object's normalized content (a function's or method's ``__code__``).

    Defaults, closure values and the values of referenced globals are not part
    of it: key them with `code_info`'s ``global_names`` as the caller sees fit.
    """
    code: Any = code_or_function
    if isinstance(code, types.MethodType):
        code = code.__func__
    if isinstance(code, types.FunctionType):
        code = code.__code__
    if not isinstance(code, types.CodeType):
        raise TypeError(f"code_digest() needs code, a function or a method, not {type(code_or_function).__qualname__}")
    return code_info(code).token.hex()


def closure_values(func: types.FunctionType) -> dict[str, Any]:
    """A function's free variables that have a value, by name (an empty cell is left out)."""
    out = {}
    for name, cell in zip(func.__code__.co_freevars, func.__closure__ or ()):
        try:
            out[name] = cell.cell_contents
        except ValueError:  # an empty cell
            continue
    return out


def code_info(code: types.CodeType) -> CodeInfo:
    """The `CodeInfo` of ``code``, memoized for the process (code objects are immutable).

    The memo is keyed by ``id`` and holds the code object, so an id is never
    reused while its entry lives; it is cleared when it grows past a bound.
    Safe to call from several threads (at worst a digest is computed twice).
    """
    hit = _cache.get(id(code))
    if hit is not None and hit[0] is code:
        return hit[1]
    info = _compute(code)
    if len(_cache) >= _CACHE_LIMIT:
        _cache.clear()
    _cache[id(code)] = (code, info)
    return info


def line_digest(code: types.CodeType) -> str:
    """Hex digest of where ``code``'s lines sit relative to its first line (nested code
    included): not part of what the code computes, but of what a traceback shows.

    A cell key adds it to a notebook function's `code_digest`, because a replayed
    traceback from inside the function must show the lines a fresh run shows; a
    task fingerprint leaves it out, so a comment edit keeps cached task results.
    """
    hasher = xxhash.xxh3_128(b"nbrewind.code.lines.v1")
    stack = [code]
    while stack:
        current = stack.pop()
        hasher.update(len(current.co_linetable).to_bytes(8, "little"))
        hasher.update(current.co_linetable)
        stack.extend(c for c in reversed(current.co_consts) if isinstance(c, types.CodeType))
    return hasher.hexdigest()


def _name(s: str) -> bytes:
    b = s.encode("utf-8", "surrogatepass")
    return b"%d:" % len(b) + b


def _compute(code: types.CodeType) -> CodeInfo:
    out = [b"%d,%d,%d,%d;" % (code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags)]
    out.append(b"%d:" % len(code.co_code) + code.co_code)
    consts = code.co_consts
    # Slot 0 holds the docstring, or None when there is none; unless code reads it, it is no computation.
    docstring = bool(consts) and (consts[0] is None or type(consts[0]) is str) and not _loads_const_zero(code)
    instructions = list(dis.get_instructions(code))
    names = list(dict.fromkeys(str(i.argval) for i in instructions if i.opname in _GLOBAL_OPS))
    chains, imported = _chains(instructions)
    used = list(code.co_names)
    strs: list[str] = []
    for i, c in enumerate(consts):
        if i == 0 and docstring:
            out.append(b"doc")
        elif type(c) is types.CodeType:
            inner = code_info(c)
            out.append(b"C" + inner.token)
            names.extend(inner.global_names)
            strs.extend(inner.strings)
            used.extend(inner.names)
            for kind, root, attrs in inner.chains:
                # A nested function's free variable bound by an import in this code is that module.
                if kind == "d" and root in imported:
                    kind, root, pre = imported[root]
                    attrs = pre + attrs
                chains.append((kind, root, attrs))
        else:
            _const(c, out)
            if type(c) is str:
                strs.append(c)
    for seq in (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars):
        out.append(b"%d:" % len(seq) + b"".join(_name(s) for s in seq))
    table = getattr(code, "co_exceptiontable", b"")
    out.append(b"%d:" % len(table) + table)
    return CodeInfo(
        token=_digest(b"".join(out)),
        global_names=tuple(dict.fromkeys(names)),
        strings=tuple(dict.fromkeys(strs)),
        names=tuple(dict.fromkeys(used)),
        chains=tuple(dict.fromkeys(chains)),
    )


def _chains(instructions: list[dis.Instruction]) -> tuple[list[Chain], dict[str, Chain]]:
    """Reference chains of one code object (not its nested code), and its names bound by imports.

    ``import numpy as np`` inside the code binds ``np`` to (``i``, ``numpy``, ());
    ``from random import gauss`` binds ``gauss`` to (``i``, ``random``, (``gauss``,)). A load of a global, a free variable or an import-bound
    name starts a chain that the attribute loads right after it extend. Loads of
    other locals start none: their values are not known statically.
    """
    chains: list[Chain] = []
    imported: dict[str, Chain] = {}
    consts: list[Any] = [None, None]  # the last two LOAD_CONST values: an import's level and fromlist
    module: Chain | None = None  # what IMPORT_NAME left on the stack
    value: Chain | None = None  # what the next store binds: the module, or what IMPORT_FROM read from it
    kind = root = ""
    attrs: list[str] | None = None

    for ins in instructions:
        op = ins.opname
        if attrs is not None:
            if op in _ATTR_OPS:
                attrs.append(str(ins.argval))
                continue
            chains.append((kind, root, tuple(attrs)))
            attrs = None
        if op == "LOAD_CONST":
            consts = [consts[-1], ins.argval]
        elif op == "IMPORT_NAME":
            name, (level, fromlist) = str(ins.argval), consts
            if level == 0:
                # ``import a.b`` leaves the top package on the stack, ``from a.b import c`` leaves a.b.
                module = value = ("i", name if fromlist else name.partition(".")[0], ())
            else:
                module = value = None  # relative: the package is not known statically
        elif op == "IMPORT_FROM":
            # Not a chain by itself: a use of the name it binds is.
            if module is not None:
                value = (module[0], module[1], (*module[2], str(ins.argval)))
        elif op in _STORE_OPS:
            if value is not None:
                imported[str(ins.argval)] = value
            else:
                imported.pop(str(ins.argval), None)
            value = None
        elif op in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_FAST"):
            name = str(ins.argval)
            if name in imported:
                kind, root, pre = imported[name]
                attrs = list(pre)
            elif op != "LOAD_FAST":
                kind, root, attrs = ("d" if op == "LOAD_DEREF" else "g"), name, []
        if op not in ("IMPORT_NAME", "IMPORT_FROM", "LOAD_CONST"):
            if op not in _STORE_OPS:
                value = None
            if op == "POP_TOP":
                module = None
    if attrs is not None:
        chains.append((kind, root, tuple(attrs)))
    return chains, imported


def _loads_const_zero(code: types.CodeType) -> bool:
    """Whether any instruction of ``code`` reads ``co_consts[0]`` (so it is no mere docstring)."""
    co = code.co_code
    ext = 0
    for i in range(0, len(co), 2):
        op, arg = co[i], co[i + 1] | ext
        if op == _EXTENDED_ARG:
            ext = arg << 8
            continue
        ext = 0
        if arg == 0 and op in _HASCONST:
            return True
    return False


def _const(c: object, out: list[bytes]) -> None:
    """Encode a code constant, exactly as the task fingerprint encodes the same literal value."""
    t = type(c)
    if t is str:
        out.append(b"s" + _name(c))  # type: ignore[arg-type]
    elif t is tuple or t is frozenset:
        items: list[bytes] = []
        for x in c:  # type: ignore[attr-defined]
            sub: list[bytes] = []
            _const(x, sub)
            items.append(b"".join(sub))
        if t is frozenset:
            items.sort()
        out.append((b"(" if t is tuple else b"~<") + b"".join(items) + (b")" if t is tuple else b">"))
    elif c is None:
        out.append(b"N")
    elif c is True:
        out.append(b"T")
    elif c is False:
        out.append(b"F")
    elif c is ...:
        out.append(b"E")
    elif t is int:
        out.append(b"i%d;" % c)  # type: ignore[str-format]
    elif t is float:
        out.append(b"d" + _pack_d(c))
    elif t is complex:
        out.append(b"j" + _pack_dd(c.real, c.imag))  # type: ignore[attr-defined]
    elif t is bytes:
        raw: bytes = c  # type: ignore[assignment]
        out.append(b"B" + _digest(raw) if len(raw) > 4096 else b"b%d:" % len(raw) + raw)
    elif t is types.CodeType:
        out.append(b"C" + code_info(c).token)  # type: ignore[arg-type]
    else:
        # No compiler makes other constants; hand-built code may. Type-tagged, never bare str().
        label = f"{t.__module__}.{t.__qualname__}"
        out.append(b"o" + _name(label) + _name(repr(c)))
