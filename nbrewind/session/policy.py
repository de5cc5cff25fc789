"""Small, pure rules the session applies to every cell: what is user state, what a
call may mutate, and how cell code is normalized before it is digested."""

from __future__ import annotations

import ast
import re
import types
from collections.abc import Mapping
from typing import Any

from nbrewind.analysis import CellEffects
from nbrewind.store.digest import digest_bytes

IPYTHON_NAMES = frozenset(
    {"_", "__", "___", "_i", "_ii", "_iii", "_oh", "_ih", "_dh", "In", "Out", "exit", "quit", "get_ipython"}
)
MODULE_DUNDERS = frozenset(
    {"__name__", "__doc__", "__package__", "__loader__", "__spec__", "__builtins__", "__builtin__", "__file__"}
)
_HISTORY_NAME = re.compile(r"^_(i)?\d+$")

# Reading IPython's output history ties a cell to the previous cells' displayed
# results, which a replay does not reproduce: such a cell always runs.
HISTORY_READS = frozenset({"_", "__", "___", "_i", "_ii", "_iii", "_oh", "_ih", "Out", "In"})

# Builtins that never mutate their arguments.
PURE_FUNCTIONS = frozenset(
    {
        "len", "print", "repr", "str", "int", "float", "bool", "complex", "bytes", "type", "isinstance",
        "issubclass", "id", "hash", "abs", "round", "min", "max", "sum", "sorted", "list", "tuple", "set",
        "frozenset", "dict", "range", "enumerate", "zip", "any", "all", "format", "divmod", "pow", "ord",
        "chr", "hex", "oct", "bin", "callable", "getattr", "hasattr", "dir", "vars", "reversed", "map", "filter",
        "display",
    }
)
# Final attribute names of library functions that never mutate their arguments.
PURE_LIBRARY_FUNCTIONS = frozenset(
    {
        "mean", "sum", "std", "var", "min", "max", "median", "percentile", "quantile", "nanmean", "nansum",
        "dot", "matmul", "concatenate", "stack", "vstack", "hstack", "where", "sqrt", "exp", "log", "abs",
        "array", "asarray", "zeros_like", "ones_like", "empty_like", "full_like", "unique", "histogram",
        "allclose", "isclose", "array_equal", "argmax", "argmin", "cumsum", "diff", "sort", "argsort",
        "concat", "merge", "DataFrame", "Series", "read_csv", "isnan", "count_nonzero", "linspace", "arange",
        "shape", "ravel", "reshape", "transpose", "copy", "deepcopy", "dumps", "compute", "persist",
        "delayed", "from_array", "from_pandas", "from_delayed", "from_sequence", "tokenize", "join",
        "exists", "isfile", "isdir", "basename", "dirname", "abspath",
    }
)
# Methods that do not mutate their receiver (on the common scientific types).
PURE_METHODS = PURE_LIBRARY_FUNCTIONS | frozenset(
    {
        "head", "tail", "describe", "groupby", "agg", "aggregate", "apply", "astype", "items", "keys",
        "values", "get", "count", "index", "startswith", "endswith", "format", "split", "strip", "lower",
        "upper", "replace", "value_counts", "nunique", "isna", "notna", "any", "all", "prod", "cumprod",
        "round", "to_numpy", "to_dict", "to_list", "tolist", "item", "nbytes", "plot", "corr", "cov",
        "rolling", "resample", "sample", "query", "filter", "drop", "rename", "assign", "pivot", "pivot_table",
        "melt", "merge", "join", "sort_values", "sort_index", "reset_index", "set_index", "loc", "iloc",
        "dropna", "fillna", "isin", "between", "clip", "map", "nlargest", "nsmallest", "idxmax", "idxmin",
        "result", "done", "visualize", "dask_graph", "to_string", "hexdigest", "digest", "encode", "decode",
    }
)


def is_user_name(name: str, value: Any, hidden: Mapping[str, Any]) -> bool:
    """Whether `name` is the user's own state rather than IPython's or the module's bookkeeping."""
    if name in IPYTHON_NAMES or name in MODULE_DUNDERS or _HISTORY_NAME.match(name):
        return False
    if name in hidden and hidden[name] is value:
        return False
    return True


def code_digest(transformed: str) -> str:
    """Digest of the cell's code with comments, blank lines and layout removed."""
    try:
        normal = ast.dump(ast.parse(transformed), annotate_fields=True, include_attributes=False)
    except (SyntaxError, ValueError):
        normal = "\0raw\0" + transformed
    return digest_bytes(normal.encode())


def possibly_mutated(effects: CellEffects, namespace: Mapping[str, Any]) -> set[str]:
    """Names whose objects the cell may have changed in place without rebinding them."""
    names = set(effects.mutated)
    for call in effects.calls:
        inplace = call.inplace
        if call.receiver is not None:
            receiver = call.receiver
            method = call.method or ""
            value = namespace.get(receiver) if dict.__contains__(namespace, receiver) else None
            if isinstance(value, types.ModuleType):
                # `np.random.shuffle(a)`: a library function; its receiver is a module.
                if inplace or (method not in PURE_LIBRARY_FUNCTIONS):
                    names.update(call.args)
                continue
            if inplace or method not in PURE_METHODS:
                names.add(receiver)
                names.update(call.args)
            continue
        func = call.func or ""
        last = func.rsplit(".", 1)[-1]
        if inplace or not (func in PURE_FUNCTIONS or last in PURE_LIBRARY_FUNCTIONS):
            names.update(call.args)
    return names
