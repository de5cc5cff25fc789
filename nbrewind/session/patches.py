"""Cells that patch a library: what a replay could not do again.

``math.tau = 6``, ``json.dumps = my_dumps``, ``collections.Counter.total = f``,
``setattr(np, "flag", 1)`` and a pandas accessor registered by a decorator change a
module or class that is not the notebook's. No variable holds the change, so a replay
would leave the library as it was and a later cell that runs would see it unpatched.
Such a cell is impure: it always runs.

`watch` notes, before a cell runs, which library modules and classes it may change:
the objects its attribute stores and ``setattr``/``delattr`` calls name (``a.b.c = v``
names ``a.b``), followed from the namespace through modules and classes only (never an
instance, whose properties could run code), and, for a cell with a decorator or a call
handing over what the cell defines, the classes of the library modules it reads. `patched`
says afterwards which of them changed. A name the cell itself imports has nothing to
compare with: a store on a library module or class it names is taken as a patch.
"""

from __future__ import annotations

import ast
import inspect
import sys
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import xxhash

from nbrewind.analysis import dotted_name
from nbrewind.identity.modules import is_local_module
from nbrewind.identity.settings import content_bytes

__all__ = ["PatchWatch", "patched", "sites_key", "watch"]

_SETTERS = frozenset({"setattr", "delattr"})


@dataclass
class PatchWatch:
    """What `watch` saw before the cell ran."""

    bindings: dict[str, tuple[int, dict[str, int]]] = field(default_factory=dict)
    """Dotted name -> (id of the object, id of each attribute's value)."""
    unresolved: set[str] = field(default_factory=set)
    """Dotted names the cell stores on that named nothing before it ran."""
    sizes: dict[int, tuple[str, int]] = field(default_factory=dict)
    """id of a library class -> (its name, how many attributes it had)."""
    keep: list[Any] = field(default_factory=list)
    """The classes `sizes` counted, held so their ids stay theirs while the cell runs."""
    imported: set[str] = field(default_factory=set)
    """Names the cell imports that were unbound before it ran (handing over only)."""
    attributes: dict[str, set[str | None]] = field(default_factory=dict)
    """Dotted name -> the attributes the cell stores on it (None: a name not written out)."""
    sites: list[tuple[Any, str | None]] = field(default_factory=list)
    """After `patched`: each library object the cell changed, and the attribute (None: any
    attribute the notebook made)."""


def _made_by_notebook(value: Any) -> bool:
    """A function or class of the notebook, or an object holding one as an attribute
    (a pandas accessor descriptor holds the accessor class)."""
    for item in (value, *(vars(value).values() if hasattr(value, "__dict__") and not isinstance(value, type) else ())):
        if isinstance(item, (types.FunctionType, type)) and getattr(item, "__module__", None) == "__main__":
            return True
    return False


def _stored_on(tree: ast.AST) -> tuple[dict[str, set[str | None]], bool, set[str]]:
    """Dotted names of the objects the code stores attributes on (with the attributes),
    whether it hands something it defines to a library (a decorator, or a call with a
    name it defines), and the names its imports bind (one walk of the tree)."""
    targets: dict[str, set[str | None]] = {}
    decorated = False
    defined: set[str] = set()
    handed: set[str] = set()
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
            decorated = decorated or any(isinstance(d, (ast.Attribute, ast.Call)) for d in node.decorator_list)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            for target in node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                        name = dotted_name(sub.value)
                        if name is not None:
                            targets.setdefault(name, set()).add(sub.attr)
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id in _SETTERS and node.args:
                name = dotted_name(node.args[0])
                if name is not None:
                    attr = node.args[1] if len(node.args) > 1 else None
                    spelled = attr.value if isinstance(attr, ast.Constant) and isinstance(attr.value, str) else None
                    targets.setdefault(name, set()).add(spelled)
            elif isinstance(node.func, ast.Attribute):
                handed.update(a.id for a in node.args if isinstance(a, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            imported.update((alias.asname or alias.name).partition(".")[0] for alias in node.names)
    return targets, decorated or bool(handed & defined), imported


def _library(obj: Any) -> bool:
    """A module or class that neither the notebook nor one of the user's own modules made."""
    if isinstance(obj, types.ModuleType):
        return obj.__name__ != "__main__" and not is_local_module(obj)
    if isinstance(obj, type):
        module = getattr(obj, "__module__", None)
        if module == "__main__" or not isinstance(module, str):
            return False
        loaded = sys.modules.get(module)
        return not (isinstance(loaded, types.ModuleType) and is_local_module(loaded))
    return False


def _resolve(dotted: str, namespace: Mapping[str, Any]) -> Any:
    """The object `dotted` names, followed through modules and classes only, without
    running a descriptor; None if it names nothing or passes through anything else."""
    head, *rest = dotted.split(".")
    value = dict.get(namespace, head) if isinstance(namespace, dict) else namespace.get(head)
    for attr in rest:
        if not isinstance(value, (types.ModuleType, type)):
            return None
        try:
            value = inspect.getattr_static(value, attr)
        except AttributeError:
            return None
    return value if isinstance(value, (types.ModuleType, type)) else None


def _named(obj: Any) -> str:
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    return f"{obj.__module__}.{obj.__qualname__}"


# Set by copyreg on a class the first time one of its instances is pickled (NBRewind's own
# checkpoint does): a cache, not a patch.
_CACHES = frozenset({"__slotnames__"})


def _binding(obj: Any) -> tuple[int, dict[str, int]]:
    return id(obj), {k: id(v) for k, v in list(vars(obj).items()) if k not in _CACHES}


def _size(cls: type) -> int:
    names = vars(cls)
    return len(names) - sum(1 for k in _CACHES if k in names)


def watch(code: str, namespace: Mapping[str, Any], reads: set[str]) -> PatchWatch | None:
    """What the cell may patch, as it is before the cell runs (None: nothing to watch)."""
    if "." not in code and "setattr" not in code and "delattr" not in code:
        return None
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    targets, hands_over, imported = _stored_on(tree)
    if not targets and not hands_over:
        return None
    seen = PatchWatch(attributes=targets)
    for dotted in sorted(targets):
        obj = _resolve(dotted, namespace)
        if obj is None:
            seen.unresolved.add(dotted)
        elif _library(obj):
            seen.bindings[dotted] = _binding(obj)
    if hands_over:
        seen.imported = {n for n in imported if n not in namespace}
        for name in reads:
            module = dict.get(namespace, name) if isinstance(namespace, dict) else None
            if isinstance(module, types.ModuleType) and _library(module):
                for value in list(vars(module).values()):
                    if isinstance(value, type) and id(value) not in seen.sizes:
                        seen.sizes[id(value)] = (_named(value), _size(value))
                        seen.keep.append(value)
    return seen


def patched(seen: PatchWatch | None, namespace: Mapping[str, Any]) -> list[str]:
    """Why the cell that `seen` watched cannot be replayed: the library modules and
    classes it changed (empty when it changed none)."""
    if seen is None:
        return []
    out = []
    sites = seen.sites
    sites.clear()
    for dotted, (was_id, was) in seen.bindings.items():
        obj = _resolve(dotted, namespace)
        if obj is None:
            out.append(dotted)
            continue
        now = _binding(obj)[1]
        if id(obj) != was_id or now != was:
            out.append(_named(obj))
            moved = {k for k in {*was, *now} if was.get(k) != now.get(k)} if id(obj) == was_id else seen.attributes[dotted]
            sites.extend((obj, attr) for attr in sorted(moved, key=str))
    for dotted in sorted(seen.unresolved):
        obj = _resolve(dotted, namespace)
        if obj is not None and _library(obj):
            out.append(_named(obj))
            sites.extend((obj, attr) for attr in sorted(seen.attributes.get(dotted, {None}), key=str))
    for value in seen.keep:
        name, size = seen.sizes[id(value)]
        if _size(value) != size:
            out.append(name)
            sites.append((value, None))
    for imported in seen.imported:
        # Imported by the cell itself: nothing to compare with, so look for what the
        # notebook made inside the module's classes.
        module = dict.get(namespace, imported) if isinstance(namespace, dict) else namespace.get(imported)
        if isinstance(module, types.ModuleType) and _library(module):
            for value in list(vars(module).values()):
                if isinstance(value, type) and _library(value) and any(_made_by_notebook(v) for v in list(vars(value).values())):
                    out.append(_named(value))
                    sites.append((value, None))
    return [f"patches {name}, which a replay cannot do again" for name in sorted(set(out))]


_ABSENT = object()


def sites_key(sites: Iterable[tuple[Any, str | None]]) -> str:
    """Digest of what the patched `sites` hold now: every later cell's input once a cell
    patched a library. A patching cell always runs, so an edit of it (or of a value it
    patches in) changes this, and a later cell reading the library runs instead of
    replaying what the old patch printed."""
    parts = []
    for obj, attr in sites:
        if attr is not None:
            value = inspect.getattr_static(obj, attr, _ABSENT)
            held = b"-" if value is _ABSENT else content_bytes(value)
        else:
            made = {k: v for k, v in list(vars(obj).items()) if _made_by_notebook(v)}
            held = b"".join(k.encode() + b"=" + content_bytes(v) for k, v in sorted(made.items()))
        parts.append(f"{_named(obj)}|{attr}|".encode() + held)
    return xxhash.xxh3_128_hexdigest(b"nbrewind.patches.v1|" + b"\0".join(sorted(parts)))
