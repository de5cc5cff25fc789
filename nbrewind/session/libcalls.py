"""Calls that change what a library keeps: `calendar.setfirstweekday(6)`, `tqdm.pandas()`,
`mimetypes.add_type(...)`, `copyreg.pickle(C, f)`, `sklearn.set_config(...)`.

No name holds the change and no attribute store shows it (`patches` sees those), so a
replay would leave the library as it was, and a later cell would replay what the call's
old arguments made. A cell making such a call is impure (it always runs, and so makes the
call again), and every later cell is keyed on the calls made so far: their text and the
values of the names their arguments read.

Which calls: a statement that is a call of a dotted name rooted at a name the notebook
imported, whose value is thrown away (the cell's last line: it showed nothing, or the name
reads like a setter: `set_theme()`, `enable(...)`), of a library that is not in `_KNOWN`, the modules
whose process-wide state is a setting already (`identity.settings`), a file the cell wrote,
or nothing (`os.makedirs`, `time.sleep`, `display`, pyplot's per-cell figures).
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
    """The call's source, as it is keyed."""
    target: str
    """The dotted name of what it calls, imports resolved (``calendar.setfirstweekday``)."""
    reads: frozenset[str]
    """The names its arguments read, whose values are keyed with the text."""


class Imports:
    """Which notebook names an import bound, to what (``plt`` -> ``matplotlib.pyplot``)."""

    def __init__(self) -> None:
        self.bound: dict[str, str] = {}

    def note(self, transformed: str, writes: Iterable[str]) -> None:
        """A cell (run or replayed) binds `writes`: those its imports bind map to the imported
        dotted name, the others no longer name an import."""
        imported: dict[str, str] = {}
        if "import" in transformed:
            try:
                tree = parse_source(transformed)
            except (SyntaxError, ValueError):
                tree = None
            for node in ast.walk(tree) if tree is not None else ():
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
        for name in writes:
            if name not in imported:
                self.bound.pop(name, None)
        self.bound.update(imported)


def _statements(body: list[ast.stmt]) -> Iterable[ast.stmt]:
    """The statements of a cell at module level, into compound statements but not into
    function or class bodies (those run when called, `patches` and purity judge the call)."""
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


def _library(target: str) -> bool:
    if any(target == known or target.startswith(known + ".") for known in _KNOWN):
        return False
    top = target.split(".")[0]
    module = sys.modules.get(top)
    return module is not None and not is_local_module(module)


def library_calls(transformed: str, imports: Mapping[str, str], *, shown: bool) -> list[LibraryCall]:
    """The calls of `transformed` that may change what a library keeps (module docstring);
    `shown`: the cell's last line showed a value (a call there computed something)."""
    if "(" not in transformed or not imports:
        return []
    try:
        tree = parse_source(transformed)
    except (SyntaxError, ValueError):
        return []
    last = tree.body[-1] if tree.body else None
    out = []
    for node in _statements(tree.body):
        if not isinstance(node, ast.Expr) or not isinstance(node.value, ast.Call):
            continue
        call = node.value
        name = dotted_name(call.func)
        if name is None:
            continue
        root, _, rest = name.partition(".")
        if root not in imports:
            continue
        target = imports[root] + ("." + rest if rest else "")
        if node is last and shown and not _SETTER.match(target.rsplit(".", 1)[-1]):
            continue  # a value shown: a computation, most likely
        if not _library(target):
            continue
        reads = frozenset(n.id for arg in (*call.args, *(k.value for k in call.keywords)) for n in ast.walk(arg) if isinstance(n, ast.Name))
        out.append(LibraryCall(ast.unparse(call), target, reads))
    return out


def calls_key(calls: Mapping[str, str]) -> str:
    """One digest of the calls made so far (text -> its key)."""
    return digest_bytes("\n".join(f"{text}\0{key}" for text, key in sorted(calls.items())).encode())
