"""Calls and stores that change what a library keeps: `calendar.setfirstweekday(6)`,
`tqdm.pandas()`, `mimetypes.add_type(...)`, `copyreg.pickle(C, f)`,
`copyreg.dispatch_table[C] = f`, `sys.modules["m"] = m`, `del http.client.responses[200]`.

No name holds the change and no attribute store shows it (`patches` sees those), so a
replay would leave the library as it was, and a later cell would replay what the call's
old arguments made. A cell making such a call is impure (it always runs, and so makes the
call again), and every later cell is keyed on the calls made so far: their text and the
values of the names their arguments read.

Which calls: a statement that is a call of a dotted name rooted at a name the notebook
imported, whose value is thrown away (the cell's last line: it showed nothing, or the name
reads like a setter: `set_theme()`, `enable(...)`), of a library that is not in `_KNOWN`, the modules
whose process-wide state is a setting already (`identity.settings`), a file the cell wrote,
or nothing (`os.makedirs`, `time.sleep`, `display`, pyplot's per-cell figures). Which stores:
an assignment, augmented assignment or `del` of an item (or of an attribute below an item)
of such a library's object. And any call of a notebook function whose body makes such a call
or store (`Imports.effectful`, followed through the notebook functions it calls by name):
`def setup(d): calendar.setfirstweekday(d)`, then `setup(6)`.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from nbrewind.analysis import parse_source
from nbrewind.analysis.callsites import dotted_name
from nbrewind.identity.modules import is_local_module
from nbrewind.store.digest import digest_bytes

__all__ = ["LibraryCall", "Imports", "library_calls"]

# Dotted prefixes whose calls change nothing a replay misses: state that is a setting
# (numpy, pandas, matplotlib, dask.config, warnings, logging, locale, socket, sys limits,
# RNG seeds), files (recorded as the cell's writes), output, or nothing at all.
_KNOWN = (
    "builtins", "IPython.display", "IPython.core.display", "time", "os", "shutil", "pathlib", "glob", "json",
    "pickle", "csv", "math", "cmath", "statistics", "itertools", "functools", "operator", "collections",
    "numpy", "pandas", "matplotlib", "seaborn", "dask.config", "dask.compute", "dask.persist", "dask.visualize",
    "dask.array", "dask.dataframe", "dask.bag", "dask.delayed", "distributed", "dask.distributed",
    "warnings", "logging", "random", "locale", "decimal", "gc", "subprocess", "importlib", "pprint", "textwrap",
    "string", "re", "datetime", "zoneinfo", "uuid", "hashlib", "base64", "tempfile", "io", "gzip", "zipfile",
    "tarfile", "sqlite3", "urllib", "requests", "socket.setdefaulttimeout", "sys.setrecursionlimit",
    "sys.set_int_max_str_digits", "sys.stdout", "sys.stderr", "sys.path", "sys.exit", "nbrewind",
    # Writers whose files are recorded (pyarrow's in native code, too).
    "pyarrow", "joblib", "h5py", "zarr", "scipy", "imageio", "PIL", "tifffile", "torch.save",
)
_SETTER = re.compile(r"^(set|use|register|enable|disable|install|configure|seed|manual_seed|add_|init$|apply$|pandas$|extension$)")


@dataclass(frozen=True)
class LibraryCall:
    """One call statement found by `library_calls`."""

    text: str
    """The call's (or store's) source, as it is keyed."""
    target: str
    """The dotted name of what it calls or changes, imports resolved (``calendar.setfirstweekday``)."""
    reads: frozenset[str]
    """The names its arguments read, whose values are keyed with the text (for a notebook
    function, the function too)."""
    verb: str = "called"
    """How the reason says it: "called", "changed", "called the notebook function"."""


class Imports:
    """Which notebook names an import bound, to what (``plt`` -> ``matplotlib.pyplot``), and
    which notebook functions change what a library keeps when called."""

    def __init__(self) -> None:
        self.bound: dict[str, str] = {}
        self.effectful: set[str] = set()
        """Notebook functions whose body makes a library call or store `library_calls` finds."""

    def note(self, transformed: str, writes: Iterable[str]) -> None:
        """A cell (run or replayed) binds `writes`: those its imports bind map to the imported
        dotted name, as do names it assigns an imported name's attribute (`search = sys.path`);
        the others no longer name an import."""
        imported: dict[str, str] = {}
        defined: set[str] = set()
        tree = None
        if "import" in transformed or "def " in transformed or ("=" in transformed and any(root in transformed for root in self.bound)):
            try:
                tree = parse_source(transformed)
            except (SyntaxError, ValueError):
                tree = None
        if tree is not None and "import" in transformed:
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.asname:
                            imported[alias.asname] = alias.name
                        else:
                            top = alias.name.split(".")[0]
                            imported[top] = top
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    for alias in node.names:
                        if alias.name != "*":
                            imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        if tree is not None and "=" in transformed and (self.bound or imported):
            for node in _statements(tree.body):
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    resolved = _resolve(dotted_name(node.value), {**self.bound, **imported})
                    if resolved is not None:
                        imported[node.targets[0].id] = resolved
        for name in writes:
            if name not in imported:
                self.bound.pop(name, None)
        self.bound.update(imported)
        if tree is not None and "def " in transformed:
            for node in _statements(tree.body):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _body_changes_libraries(node, self):
                    defined.add(node.name)
        self.effectful.difference_update(writes)
        self.effectful |= defined


def _statements(body: list[ast.stmt]) -> Iterable[ast.stmt]:
    """The statements of a cell at module level, into compound statements (`with`, `for`,
    `match` cases...) but not into function or class bodies (those run when called)."""
    for node in body:
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                yield from _statements(inner)
        for handler in getattr(node, "handlers", ()) or ():
            yield from _statements(handler.body)
        for case in getattr(node, "cases", ()) or ():
            yield from _statements(case.body)


def _body_changes_libraries(function: ast.FunctionDef | ast.AsyncFunctionDef, imports: Imports) -> bool:
    """Whether a notebook function's body (not its nested functions) makes a call statement
    or an item store on a library, or calls a notebook function that does."""
    local = {a.arg for a in (*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs)}
    bound = {k: v for k, v in imports.bound.items() if k not in local}
    effectful = imports.effectful - local
    return any(True for node in _statements(function.body) for _ in _changes(node, bound, effectful))


_CALLED, _CHANGED, _CALLED_NOTEBOOK = "called", "changed", "called the notebook function"


def _changes(node: ast.stmt, imports: Mapping[str, str], effectful: set[str] | frozenset[str]) -> Iterable[tuple[str, str, ast.AST]]:
    """(verb, target, the node making it) for each change of what a library keeps that the
    statement `node` makes itself (not through a statement nested in it): an item store on a
    library's object, a call of a notebook function in `effectful`, a call statement on a library."""
    for stored in _store_targets(node):
        changed = _changed_library(stored, imports)
        if changed is not None:
            yield _CHANGED, changed, stored
    if effectful:
        for n in _own_nodes(node):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in effectful:
                yield _CALLED_NOTEBOOK, n.func.id, n
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        target = _resolve(dotted_name(node.value.func), imports)
        if target is not None and _library(target):
            yield _CALLED, target, node.value


def _resolve(name: str | None, imports: Mapping[str, str]) -> str | None:
    """`name` (``cal.setfirstweekday``) with its root import resolved, or None when its root
    names no import."""
    root, _, rest = (name or "").partition(".")
    if root not in imports:
        return None
    return imports[root] + ("." + rest if rest else "")


def _store_targets(node: ast.stmt) -> list[ast.expr]:
    """What an assignment, augmented assignment or `del` stores into or deletes."""
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    elif isinstance(node, ast.Delete):
        targets = list(node.targets)
    else:
        return []
    out: list[ast.expr] = []
    while targets:
        t = targets.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            targets.extend(t.elts)
        elif isinstance(t, ast.Starred):
            targets.append(t.value)
        elif isinstance(t, ast.Subscript) or (isinstance(t, ast.Attribute) and dotted_name(t) is None):
            out.append(t)  # an item, or an attribute below an item (attribute chains: `patches`)
    return out


def _changed_library(target: ast.expr, imports: Mapping[str, str]) -> str | None:
    """The library object an item store changes (`sys.modules`), imports resolved, or None."""
    node: ast.expr = target
    while isinstance(node, (ast.Subscript, ast.Attribute)) and (node is target or dotted_name(node) is None):
        node = node.value
    resolved = _resolve(dotted_name(node), imports)
    return resolved if resolved is not None and _library(resolved) else None


def _library(target: str) -> bool:
    if any(target == known or target.startswith(known + ".") for known in _KNOWN):
        return False
    top = target.split(".")[0]
    module = sys.modules.get(top)
    return module is not None and not is_local_module(module)


def library_calls(
    transformed: str, imports: Mapping[str, str], *, shown: bool, effectful: set[str] | frozenset[str] = frozenset()
) -> list[LibraryCall]:
    """The calls and stores of `transformed` that may change what a library keeps (module
    docstring); `shown`: the cell's last line showed a value (a call there computed something);
    `effectful`: the notebook functions whose calls do (`Imports.effectful`)."""
    if not imports and not effectful:
        return []
    if "(" not in transformed and "[" not in transformed:
        return []
    try:
        tree = parse_source(transformed)
    except (SyntaxError, ValueError):
        return []
    last = tree.body[-1] if tree.body else None
    out = []
    for top in tree.body:
        for node in _statements([top]):
            for verb, target, made in _changes(node, imports, effectful):
                if verb == _CALLED and node is last and shown and not _SETTER.match(target.rsplit(".", 1)[-1]):
                    continue  # a value shown: a computation, most likely
                if verb == _CALLED_NOTEBOOK or node is not top:
                    # Keyed on the whole statement: a loop or comprehension gives the call what
                    # need not outlive it (`[first(d) for d in days]`).
                    out.append(LibraryCall(ast.unparse(top), target, _names(top), verb))
                elif verb == _CHANGED:
                    out.append(LibraryCall(ast.unparse(node), target, _names(node) - {_root_name(made)}, verb))
                else:
                    assert isinstance(made, ast.Call)
                    out.append(LibraryCall(ast.unparse(made), target, _argument_names(made), verb))
    return out


def _names(node: ast.AST) -> frozenset[str]:
    return frozenset(n.id for n in ast.walk(node) if isinstance(n, ast.Name))


def _argument_names(call: ast.Call) -> frozenset[str]:
    return frozenset().union(*(_names(arg) for arg in (*call.args, *(k.value for k in call.keywords))))


def _root_name(target: ast.AST) -> str | None:
    node = target
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _own_nodes(statement: ast.stmt) -> Iterable[ast.AST]:
    """The nodes of one statement that are not in a nested statement (those `_statements`
    gives on their own) nor in a function, lambda or class body."""
    todo: list[ast.AST] = [statement]
    while todo:
        n = todo.pop()
        yield n
        for child in ast.iter_child_nodes(n):
            if isinstance(child, (ast.stmt, ast.Lambda)):
                continue
            todo.append(child)


def calls_key(calls: Mapping[str, str]) -> str:
    """One digest of the calls made so far (text -> its key)."""
    return digest_bytes("\n".join(f"{text}\0{key}" for text, key in sorted(calls.items())).encode())
