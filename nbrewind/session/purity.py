"""When a value a cell used can be proven unchanged without re-digesting it.

The default is to re-digest every value an executed cell could have reached.
This module is the only place allowed to skip that, and it may skip only on
proof: the value is immutable, or every use the cell made of it
(`analysis.uses`) is known not to mutate a value of exactly this type. The
tables are keyed by the exact type, never by a method name alone: ``sort`` is
pure on a DataFrame (it returns a copy) and mutates a list or an ndarray;
reading ``d[k]`` is pure on a dict and inserts on a defaultdict. A subclass is
not its base: it may override anything.

To prove more, add a type and its pure methods, attributes and uses to the
tables below.
"""

from __future__ import annotations

import builtins
import sys
import types
from collections.abc import Mapping
from typing import Any

from nbrewind.analysis.uses import Use

_IMMUTABLE = (int, float, complex, bool, str, bytes, type(None), range, type(Ellipsis))

_NP_REDUCTIONS = {
    "sum", "mean", "std", "var", "min", "max", "argmax", "argmin", "any", "all", "prod", "cumsum", "cumprod",
    "ptp", "round", "clip", "trace", "dot", "nonzero", "searchsorted", "take", "repeat", "diagonal", "conj",
}
_NP_METHODS = _NP_REDUCTIONS | {
    "copy", "astype", "reshape", "ravel", "flatten", "transpose", "swapaxes", "squeeze", "tolist", "item",
    "tobytes", "view", "__array__", "__len__",
}
_PD_COMMON = {
    "head", "tail", "describe", "groupby", "agg", "aggregate", "astype", "copy", "to_numpy", "to_dict", "to_string",
    "to_list", "tolist", "sum", "mean", "std", "var", "min", "max", "median", "quantile", "count", "nunique",
    "value_counts", "isna", "notna", "isnull", "notnull", "sort_values", "sort_index", "reset_index", "set_index",
    "query", "filter", "drop", "rename", "assign", "pivot", "pivot_table", "melt", "merge", "join", "dropna",
    "fillna", "isin", "between", "clip", "nlargest", "nsmallest", "idxmax", "idxmin", "corr", "cov", "round",
    "equals", "select_dtypes", "memory_usage", "duplicated", "drop_duplicates", "cumsum", "cumprod", "diff",
    "shift", "pct_change", "abs", "prod", "any", "all", "unique", "sample", "rolling", "resample", "expanding",
    "iterrows", "itertuples", "items", "keys", "to_csv", "to_parquet", "to_json", "to_frame", "reindex",
    "replace", "where", "mask", "explode", "stack", "unstack", "transpose", "get", "first", "last", "nth",
}
_DASK_METHODS = {
    "compute", "persist", "sum", "mean", "std", "var", "min", "max", "map_blocks", "map_partitions", "rechunk",
    "reshape", "astype", "groupby", "agg", "head", "tail", "count", "value_counts", "dask_graph", "__dask_graph__",
    "__dask_keys__", "to_delayed", "repartition", "visualize", "nunique", "drop_duplicates", "dropna", "fillna",
}

PURE_METHODS: dict[str, frozenset[str]] = {
    "builtins.list": frozenset({"index", "count", "copy", "__len__"}),
    "builtins.tuple": frozenset({"index", "count"}),
    "builtins.dict": frozenset({"get", "keys", "values", "items", "copy", "__len__", "__contains__"}),
    "collections.OrderedDict": frozenset({"get", "keys", "values", "items", "copy"}),
    "collections.defaultdict": frozenset({"get", "keys", "values", "items", "copy"}),
    "builtins.set": frozenset({"copy", "union", "intersection", "difference", "symmetric_difference",
                               "issubset", "issuperset", "isdisjoint"}),
    "builtins.frozenset": frozenset({"copy", "union", "intersection", "difference", "symmetric_difference",
                                     "issubset", "issuperset", "isdisjoint"}),
    "builtins.str": frozenset(dir(str)),
    "builtins.bytes": frozenset(dir(bytes)),
    "numpy.ndarray": frozenset(_NP_METHODS),
    "pandas.DataFrame": frozenset(_PD_COMMON),
    "pandas.Series": frozenset(_PD_COMMON),
    "pandas.Index": frozenset(_PD_COMMON),
    "dask.array.Array": frozenset(_DASK_METHODS),
    "dask.dataframe.DataFrame": frozenset(_DASK_METHODS),
    "dask.dataframe.Series": frozenset(_DASK_METHODS),
    "dask.bag.Bag": frozenset(_DASK_METHODS | {"map", "filter", "pluck", "frequencies", "take", "flatten"}),
    "dask.delayed.Delayed": frozenset({"compute", "persist", "visualize", "__dask_graph__", "dask"}),
}
PURE_ATTRS: dict[str, frozenset[str]] = {
    "numpy.ndarray": frozenset({"shape", "dtype", "ndim", "size", "nbytes", "itemsize", "strides", "T", "flags"}),
    "pandas.DataFrame": frozenset({"shape", "columns", "index", "dtypes", "size", "ndim", "empty", "T", "values",
                                   "loc", "iloc", "at", "iat", "str", "dt"}),
    "pandas.Series": frozenset({"shape", "dtype", "name", "index", "size", "values", "empty", "ndim", "loc",
                                "iloc", "at", "iat", "str", "dt"}),
    "pandas.Index": frozenset({"shape", "dtype", "name", "size", "values", "empty", "ndim"}),
    "dask.array.Array": frozenset({"shape", "dtype", "ndim", "chunks", "npartitions", "numblocks", "size", "nbytes"}),
    "dask.dataframe.DataFrame": frozenset({"columns", "dtypes", "npartitions", "divisions", "index", "loc"}),
    "dask.dataframe.Series": frozenset({"dtype", "name", "npartitions", "divisions", "index", "loc"}),
    "dask.bag.Bag": frozenset({"npartitions"}),
}
# Attributes whose value shares no mutable memory with the object: safe to pass on.
_PLAIN_ATTRS = frozenset({"shape", "dtype", "ndim", "size", "nbytes", "itemsize", "strides", "columns", "index",
                          "dtypes", "name", "empty", "npartitions", "divisions", "chunks", "numblocks"})
# Types whose item reads, iteration and use as operands never change them.
READ_PURE_TYPES = frozenset(
    {"builtins.list", "builtins.tuple", "builtins.dict", "builtins.set", "builtins.frozenset", "builtins.str",
     "builtins.bytes", "collections.OrderedDict", "numpy.ndarray", "pandas.DataFrame", "pandas.Series",
     "pandas.Index", "dask.array.Array", "dask.dataframe.DataFrame", "dask.dataframe.Series", "dask.bag.Bag",
     "dask.delayed.Delayed"}
)
# The types `value[k]` can return, for types whose item methods can be judged.
ITEM_TYPES: dict[str, tuple[str, ...]] = {
    "pandas.DataFrame": ("pandas.DataFrame", "pandas.Series"),
    "pandas.Series": ("pandas.Series",),
    "numpy.ndarray": ("numpy.ndarray",),
}
# Functions that never change their arguments, by module and name; checked by identity
# (`callee is getattr(sys.modules[module], name)`), so a user's own `sum` is not one of them.
PURE_CALLEES: dict[str, frozenset[str]] = {
    "builtins": frozenset({
        "len", "print", "repr", "str", "int", "float", "bool", "complex", "bytes", "type", "isinstance", "issubclass",
        "id", "hash", "abs", "round", "min", "max", "sum", "sorted", "list", "tuple", "set", "frozenset", "dict",
        "enumerate", "zip", "any", "all", "format", "divmod", "pow", "callable", "hasattr", "reversed", "range",
        "ascii", "bin", "hex", "oct", "ord", "chr", "dir", "display",
    }),
    "numpy": frozenset(_NP_REDUCTIONS | {
        "median", "percentile", "quantile", "nanmean", "nansum", "nanmax", "nanmin", "nanstd", "concatenate",
        "stack", "vstack", "hstack", "where", "unique", "histogram", "allclose", "isclose", "array_equal",
        "argsort", "sort", "count_nonzero", "array", "asarray", "shape", "ravel", "reshape", "transpose",
        "zeros_like", "ones_like", "empty_like", "full_like", "linspace", "arange", "around", "flatnonzero",
        "average", "cov", "corrcoef", "isfinite", "array2string", "array_repr", "asarray", "atleast_1d", "atleast_2d",
    }),
    "pandas": frozenset({"concat", "merge", "DataFrame", "Series", "Index", "isna", "notna", "isnull", "notnull",
                         "to_datetime", "to_numeric", "cut", "qcut", "pivot_table", "get_dummies", "unique", "crosstab"}),
    "copy": frozenset({"copy", "deepcopy"}),
    "json": frozenset({"dumps"}),
    "pickle": frozenset({"dumps"}),
    "math": frozenset(n for n in dir(__import__("math")) if not n.startswith("_")),
    "statistics": frozenset({"mean", "median", "stdev", "variance", "mode", "fmean"}),
    "dask": frozenset({"compute", "persist", "delayed", "visualize"}),
    "dask.array": frozenset({"from_array", "sum", "mean", "std", "min", "max", "stack", "concatenate"}),
    "dask.dataframe": frozenset({"from_pandas", "concat"}),
    "dask.bag": frozenset({"from_sequence"}),
}
_DISPLAY_CALLEES = frozenset({"display"})


def type_label(value: Any) -> str:
    """The exact type's public label (``pandas.DataFrame``, not its defining submodule)."""
    kind = type(value)
    module = kind.__module__ or ""
    top = module.split(".", 1)[0]
    if top in ("pandas", "dask") and kind.__name__ in ("DataFrame", "Series", "Index", "Array", "Bag", "Delayed"):
        # pandas.core.frame.DataFrame and dask's collection classes, by their public names
        public = {"pandas": "pandas", "dask": _dask_public(module, kind.__name__)}[top]
        if public and getattr(sys.modules.get(public), kind.__name__, None) is kind:
            return f"{public}.{kind.__name__}"
    return f"{module}.{kind.__qualname__}"


def _dask_public(module: str, name: str) -> str:
    if name == "Array":
        return "dask.array"
    if name == "Bag":
        return "dask.bag"
    if name == "Delayed":
        return "dask.delayed"
    return "dask.dataframe"


def is_immutable(value: Any, depth: int = 0) -> bool:
    """Values that cannot change in place: scalars, strings, and tuples/frozensets of them."""
    if isinstance(value, _IMMUTABLE) and type(value) in _IMMUTABLE:
        return True
    if type(value) in (tuple, frozenset) and depth < 3:
        return all(is_immutable(v, depth + 1) for v in value)
    module = type(value).__module__
    if module == "numpy" and type(value).__name__ not in ("ndarray", "memmap", "recarray", "matrix"):
        return hasattr(value, "dtype") and getattr(value, "ndim", 1) == 0  # a numpy scalar
    return False


def proven_unchanged(value: Any, uses: list[Use] | None, namespace: Mapping[str, Any]) -> bool:
    """True only when nothing the cell did with `value` (through `uses`) can have changed it."""
    if is_immutable(value):
        return True
    if not uses or isinstance(value, (types.FunctionType, types.MethodType, type, types.ModuleType)):
        return False
    label = type_label(value)
    for use in uses:
        if not _pure_use(label, use, namespace):
            return False
    return True


def _pure_use(label: str, use: Use, namespace: Mapping[str, Any]) -> bool:
    if use.kind == "method":
        return not use.unsafe_keywords and use.detail in PURE_METHODS.get(label, ())
    if use.kind == "attr":
        return use.detail in PURE_ATTRS.get(label, ()) and (use.nargs == 0 or use.detail in _PLAIN_ATTRS)
    if use.kind in ("item", "iter", "operand"):
        return label in READ_PURE_TYPES
    if use.kind in ("arg", "item_arg"):
        return label in READ_PURE_TYPES and not use.unsafe_keywords and _pure_callee(use, namespace)
    if use.kind == "item_method":
        # What `n[k]` returns is known for these types only: a column, a frame, a sub-array.
        returns = ITEM_TYPES.get(label)
        return returns is not None and not use.unsafe_keywords and all(use.detail in PURE_METHODS[t] for t in returns)
    return False


def _pure_callee(use: Use, namespace: Mapping[str, Any]) -> bool:
    callee = _resolve(use.detail, namespace)
    if callee is None:
        return False
    numpy = sys.modules.get("numpy")
    if numpy is not None and type(callee) is getattr(numpy, "ufunc", None):
        # np.exp(a, a) writes its second positional argument: that is `out`.
        return bool(use.nargs <= callee.nin)
    for module, names in PURE_CALLEES.items():
        owner = sys.modules.get(module)
        if owner is None:
            continue
        name = getattr(callee, "__name__", None)
        if name in names and getattr(owner, name, None) is callee:
            return True
    return False


def _resolve(dotted: str, namespace: Mapping[str, Any]) -> Any:
    """The object a dotted callee name denotes now, following only modules (no user getattr runs)."""
    if not dotted:
        return None
    head, *rest = dotted.split(".")
    obj: Any
    if isinstance(namespace, dict) and dict.__contains__(namespace, head):
        obj = dict.__getitem__(namespace, head)
    elif not rest and hasattr(builtins, head):
        obj = getattr(builtins, head)
    elif head in _DISPLAY_CALLEES:
        return None
    else:
        return None
    for part in rest:
        if not isinstance(obj, types.ModuleType):
            return None
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj
