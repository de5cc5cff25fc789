"""Fingerprints of callables: notebook and user-module functions by code (through
`nbrewind.identity.code`), library ones by module, qualified name and distribution
version; classes by their bases and members; and the check that refuses code
drawing from a global RNG."""

from __future__ import annotations

import functools
import os
import re
import sys
import types
from collections.abc import Iterable
from typing import Any

from nbrewind.identity.code import Chain, code_info
from nbrewind.identity.modules import library_label, source_digest
from nbrewind.tasks.fingerprint.common import (
    _BOUND_TYPES,
    _CLASS_SKIP,
    _MISSING,
    EncoderState,
    UnfingerprintableError,
    _digest,
    _name,
)


_ENVIRONMENT_READS = frozenset({"environ", "environb", "getenv", "getenvb"})
"""Names through which code reads environment variables (attributes of `os`, or imported from it)."""
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class CodeEncoding(EncoderState):
    """Encoders for functions, methods, partials and classes, and library detection."""

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
            out.append(b"L" + _name(str(mod)) + _name(str(qual)) + (self._module_version(mod) or self._own_binary(str(mod))))
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
        if _ENVIRONMENT_READS.intersection(anames):
            # `os.environ["K"]`, `os.getenv(KEY)`: the variables it can name, with their values
            # now (each string constant of the code, and each string global it reads).
            candidates = {*strs, *(v for n in gnames if isinstance(v := g.get(n), str))}
            out.append(b"env")
            for key in sorted(k for k in candidates if _ENV_NAME.fullmatch(k)):
                self._enc((key, os.environ.get(key)), out)

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

    def _own_binary(self, modname: str) -> bytes:
        """What a compiled function of the notebook's own extension module (a ``.so`` built in
        place) is: the digest of that file, which a rebuild changes; ``?`` if it has none."""
        file = getattr(sys.modules.get(modname), "__file__", None)
        digest = source_digest(file) if isinstance(file, str) else None
        return b"?" if digest is None else b"S" + digest.encode()

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

