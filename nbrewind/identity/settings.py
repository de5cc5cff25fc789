"""Library settings as state: a registry that digests, captures and applies them.

A cell's output can depend on configuration that lives outside its variables:
``pd.set_option("display.precision", 2)`` changes how every later DataFrame
prints, ``np.seterr`` whether a division warns, ``dask.config.set`` which
scheduler a compute uses. Each registered `Setting` says how to read such state
(as a plain, picklable snapshot), how to put a snapshot back, and which module
must be loaded for it to exist. The session keys every cell on the digests of
the loaded settings and checkpoints a snapshot whenever a cell changes one, so
a replayed `pd.set_option` cell leaves the option set, as a fresh run would.

To track another library, append a `Setting` to `REGISTRY` (see the entries
below: a getter returning builtins, lists, dicts, tuples and scalars, and a
setter taking that snapshot back).

Nothing here imports a library: a setting whose module is not in
``sys.modules`` is simply absent from `settings_digests`.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import pickle
import struct
import sys
import types
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import xxhash

from nbrewind.identity import interpreter
from nbrewind.identity.code import closure_values, code_digest, code_info
from nbrewind.identity.modules import is_local_module
from nbrewind.identity.values import is_notebook_code

__all__ = ["DASK_CONFIG_EXCLUDED", "REGISTRY", "Setting", "apply_settings", "canonical_bytes", "capture_settings", "content_bytes", "encode", "notebook_code_names", "settings_digests"]


@dataclass(frozen=True)
class Setting:
    """One piece of library configuration.

    `module` must be in ``sys.modules`` for the setting to exist; `get` returns a
    picklable snapshot of plain values; `put` makes the live state equal to a
    snapshot `get` returned (in this process or another).
    """

    name: str
    module: str
    get: Callable[[], Any]
    put: Callable[[Any], None]
    view: Callable[[], Any] | None = None
    """What the digest covers, read without copying (default: `get`)."""


def canonical_bytes(value: Any) -> bytes:
    """Bytes that depend on a snapshot's content only: dict order, set order and object ids never count."""
    out: list[bytes] = []
    _encode(value, out)
    return b"".join(out)


def _encode(value: Any, out: list[bytes]) -> None:
    kind = type(value)
    if kind is dict:
        items = sorted(((canonical_bytes(k), v) for k, v in value.items()), key=lambda kv: kv[0])
        out.append(b"d%d:" % len(items))
        for key, item in items:
            out.append(key)
            _encode(item, out)
    elif kind in (list, tuple):
        out.append(b"%s%d:" % (b"l" if kind is list else b"t", len(value)))
        for item in value:
            _encode(item, out)
    elif kind in (set, frozenset):
        parts = sorted(canonical_bytes(v) for v in value)
        out.append(b"s%d:" % len(parts) + b"".join(parts))
    elif kind in (str, int, float, bool, complex, bytes, type(None)):
        raw = pickle.dumps(value, protocol=5)
        out.append(b"p%d:" % len(raw) + raw)
    elif callable(value) and not isinstance(value, type):
        _encode_callable(value, out, set())
    elif isinstance(value, type):
        _encode_type(value, out, set())
    else:
        label = f"{kind.__module__}.{kind.__qualname__}"
        try:
            raw = pickle.dumps(value, protocol=5)
        except Exception:  # noqa: BLE001 - an unpicklable setting value is keyed by its repr
            raw = repr(value).encode()
        out.append(b"o" + label.encode() + b"%d:" % len(raw) + raw)


def _encode_callable(value: Any, out: list[bytes], seen: set[int]) -> None:
    """A formatter, a scheduler function, a hook: by what it does, never by id().

    A name alone would not do: ``'{:.2f}'.format`` and ``'{:.4f}'.format`` are both
    ``str.format``, and every lambda is ``__main__.<lambda>``. So a bound method
    carries what it is bound to, a partial its arguments, and a function the
    notebook defined its code, defaults, closure and the globals its code names.
    """
    if id(value) in seen:
        out.append(b"r;")  # a function reaching itself (recursion through a global)
        return
    seen.add(id(value))
    if isinstance(value, types.FunctionType) and not _library_function(value):
        out.append(b"f" + code_digest(value).encode() + b";")
        for part in (value.__defaults__, value.__kwdefaults__):
            _encode_part(part, out, seen)
        for cell in value.__closure__ or ():
            try:
                _encode_part(cell.cell_contents, out, seen)
            except ValueError:  # an empty cell
                out.append(b"e;")
        names = value.__globals__
        for name in code_info(value.__code__).global_names:
            if name in names:
                out.append(b"g" + name.encode() + b"=")
                _encode_part(names[name], out, seen)
        return
    if isinstance(value, functools.partial):
        out.append(b"P")
        _encode_part(value.func, out, seen)
        _encode_part(value.args, out, seen)
        _encode_part(value.keywords, out, seen)
        return
    bound = getattr(value, "__self__", None)
    if isinstance(value, (types.MethodType, types.BuiltinMethodType, types.MethodWrapperType)) and bound is not None and not isinstance(bound, types.ModuleType):
        out.append(b"m" + getattr(value, "__name__", "?").encode() + b";")
        _encode_part(getattr(value, "__func__", None), out, seen)
        _encode_part(bound, out, seen)
        return
    label = f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', type(value).__qualname__)}"
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
        out.append(b"c" + label.encode() + b";")  # a library's function: where it is defined
        return
    # A callable instance: its state, as any other value's.
    out.append(b"i" + label.encode() + b";")
    try:
        raw = pickle.dumps(value, protocol=5)
    except Exception:  # noqa: BLE001 - an unpicklable callable is keyed by its repr
        raw = repr(value).encode()
    out.append(b"%d:" % len(raw) + raw)


def _encode_type(cls: type, out: list[bytes], seen: set[int]) -> None:
    """A library's class by where it is defined; one the notebook defined also by what its
    methods do (a class edited and run again keeps its name)."""
    out.append(b"c" + f"{getattr(cls, '__module__', '?')}.{cls.__qualname__};".encode())
    if id(cls) in seen or not is_notebook_code(cls):
        return
    seen.add(id(cls))
    for name, item in sorted(vars(cls).items()):
        if isinstance(item, (types.FunctionType, staticmethod, classmethod, property)) or isinstance(item, type):
            out.append(b"a" + name.encode() + b"=")
            _encode_part(getattr(item, "__func__", getattr(item, "fget", item)), out, seen)


def _encode_part(value: Any, out: list[bytes], seen: set[int]) -> None:
    if isinstance(value, type):
        _encode_type(value, out, seen)
    elif callable(value):
        _encode_callable(value, out, seen)
    elif isinstance(value, types.ModuleType):
        out.append(b"M" + value.__name__.encode() + b";")
    elif hasattr(value, "__dict__") and any(is_notebook_code(v) for v in list(vars(value).values())):
        # A library object holding the notebook's code (a registered accessor).
        out.append(b"h" + f"{type(value).__module__}.{type(value).__qualname__}".encode() + b";")
        for name, item in sorted(vars(value).items()):
            out.append(b"a" + name.encode() + b"=")
            _encode_part(item, out, seen)
    else:
        out.append(canonical_bytes(value))


def content_bytes(value: Any) -> bytes:
    """`canonical_bytes`, with the notebook's own code inside `value` by what it does: for a
    value a library holds (a patched attribute) rather than a setting's snapshot."""
    out: list[bytes] = []
    _encode_part(value, out, set())
    return b"".join(out)


def notebook_code_names(value: Any) -> set[str]:
    """Globals the notebook's functions inside `value` (a setting's snapshot, a patched-in
    value) read when a library calls them: a formatter reading ``P``. They run inside other
    cells' code, so those names must be in the namespace whenever a cell runs."""
    names: set[str] = set()
    pending, seen = [value], set()
    while pending:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if type(item) is dict:
            pending.extend(item.keys())
            pending.extend(item.values())
        elif type(item) in (list, tuple, set, frozenset):
            pending.extend(item)
        elif isinstance(item, functools.partial):
            pending.extend((item.func, *item.args, *item.keywords.values()))
        elif isinstance(item, types.MethodType):
            pending.append(item.__func__)
        elif isinstance(item, types.FunctionType) and is_notebook_code(item):
            names.update(code_info(item.__code__).global_names)
            pending.extend(closure_values(item).values())
        elif isinstance(item, type) and is_notebook_code(item):
            pending.extend(vars(item).values())
        elif isinstance(item, (staticmethod, classmethod)):
            pending.append(item.__func__)
        elif hasattr(item, "__dict__") and not isinstance(item, (type, types.ModuleType)):
            held = [v for v in list(vars(item).values()) if is_notebook_code(v)]
            pending.extend(held)
    return names


def _library_function(func: types.FunctionType) -> bool:
    """A function of an installed library: where it is defined says what it does."""
    module = sys.modules.get(func.__module__ or "")
    return module is not None and module.__name__ != "__main__" and not is_local_module(module)


def settings_digests(registry: Iterable[Setting] | None = None, *, tag: bytes = b"nbrewind.setting.v1|") -> dict[str, str] | None:
    """Digest of every registered setting whose library is loaded, by setting name.

    None when one cannot be read (even after a retry: another thread may have been
    changing it): nothing keyed on the settings can be vouched for then.
    """
    out = {}
    for setting in REGISTRY if registry is None else registry:
        if setting.module not in sys.modules:
            continue
        read = setting.view or setting.get
        for attempt in range(2):
            try:
                raw = _fast_bytes(read())
                break
            except Exception:  # noqa: BLE001 - mutated while read, or a library we cannot read
                if attempt:
                    return None
        out[setting.name] = xxhash.xxh3_128_hexdigest(tag + raw)
    return out


def _fast_bytes(value: Any) -> bytes:
    """`encode`'s job at C speed where it can: JSON with sorted keys (every cell pays this
    twice, so it matters), `encode` for snapshots with non-string keys."""
    try:
        return b"j" + json.dumps(value, sort_keys=True, separators=(",", ":"), default=_json_default).encode()
    except (TypeError, ValueError):
        parts: list[bytes] = [b"e"]
        encode(value, parts)
        return b"".join(parts)


def _json_default(value: Any) -> str:
    return "\0" + canonical_bytes(value).hex()


_pack_d = struct.Struct("<d").pack


def encode(value: Any, out: list[bytes]) -> None:
    """Type-tagged, order-free bytes of a settings snapshot (dict order never counts).

    A fast path for the plain values settings hold (3-4x faster than pickling every
    scalar); anything else is `canonical_bytes`'s encoding, under its own tag.
    """
    t = type(value)
    if t is str:
        raw = value.encode("utf-8", "surrogatepass")
        out.append(b"s%d:" % len(raw))
        out.append(raw)
    elif value is None or t is bool:
        out.append(b"N" if value is None else b"T" if value else b"F")
    elif t is int:
        out.append(b"i%d;" % value)
    elif t is float:
        out.append(b"d" + _pack_d(value))
    elif t is dict:
        items = []
        for k, v in list(value.items()):
            sub: list[bytes] = []
            encode(k, sub)
            encode(v, sub)
            items.append(b"".join(sub))
        items.sort()
        out.append(b"{%d:" % len(items))
        out.extend(items)
    elif t is list or t is tuple:
        out.append((b"[%d:" if t is list else b"(%d:") % len(value))
        for x in value:
            encode(x, out)
    else:
        raw = canonical_bytes(value)
        out.append(b"o%d:" % len(raw))
        out.append(raw)


def capture_settings(names: Iterable[str]) -> dict[str, Any]:
    """Snapshots of the named settings (only those whose library is loaded)."""
    wanted = set(names)
    return {s.name: s.get() for s in REGISTRY if s.name in wanted and s.module in sys.modules}


def apply_settings(snapshots: dict[str, Any]) -> None:
    """Put snapshots from `capture_settings` back, importing a setting's library if needed."""
    import importlib

    for setting in REGISTRY:
        if setting.name in snapshots:
            importlib.import_module(setting.module)
            setting.put(snapshots[setting.name])


# -- the registered settings ----------------------------------------------------------


def _numpy_get() -> Any:
    np = sys.modules["numpy"]
    return {"print": dict(np.get_printoptions()), "err": dict(np.geterr())}


def _numpy_put(snapshot: Any) -> None:
    np = sys.modules["numpy"]
    np.set_printoptions(**snapshot["print"])
    np.seterr(**snapshot["err"])


def _pandas_config() -> Any:
    return sys.modules["pandas._config.config"]


def _pandas_get() -> Any:
    # The option tree itself: reading it through get_option would warn for deprecated keys.
    return copy.deepcopy(_pandas_config()._global_config)


def _pandas_view() -> Any:
    return _pandas_config()._global_config


def _pandas_put(snapshot: Any) -> None:
    config = _pandas_config()
    current = config._global_config

    def walk(prefix: str, want: dict[str, Any], have: dict[str, Any]) -> None:
        for key, value in want.items():
            if isinstance(value, dict) and isinstance(have.get(key), dict):
                walk(f"{prefix}{key}.", value, have[key])
            elif have.get(key, _MISSING) != value:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    config.set_option(prefix + key, value)

    walk("", snapshot, current)


def _matplotlib_get() -> Any:
    rc = sys.modules["matplotlib"].rcParams
    # dict.items reads without the deprecation checks of RcParams.__getitem__. The backend
    # is chosen by the frontend (inline in a kernel), not by the notebook's computation.
    return {k: copy.deepcopy(v) for k, v in dict.items(rc) if k not in _MPL_SKIP}


def _matplotlib_view() -> Any:
    rc = sys.modules["matplotlib"].rcParams
    return {k: v for k, v in list(dict.items(rc)) if k not in _MPL_SKIP}


def _matplotlib_put(snapshot: Any) -> None:
    rc = sys.modules["matplotlib"].rcParams
    for key, value in snapshot.items():
        if dict.get(rc, key, _MISSING) != value:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                rc[key] = value


_MPL_SKIP = frozenset({"backend", "backend_fallback"})


DASK_CONFIG_EXCLUDED = frozenset({"scheduler", "get", "pool", "distributed", "temporary-directory", "nbrewind"})
"""Top-level dask.config keys that are not notebook configuration: which scheduler runs
(``scheduler``/``get``/``pool``: a live Client sets and unsets them; results must not
depend on them), the ``distributed`` tree (cluster, comm and dashboard tuning, added
whole by ``import distributed``; its HTTP routes grow by one entry per scheduler started),
and ``temporary-directory``, the machine's scratch space (``DASK_TEMPORARY_DIRECTORY``
often differs per job or per run; a replay must not point a kernel at another run's
scratch). Measured: two identical runs differ in exactly these. Also ``nbrewind``
(``nbrewind.auto-priority``, the switch of automatic priority bumps): it changes the
order work runs in, never a result, so switching it must not miss the task cache."""


def _dask_excluded(key: str) -> bool:
    # dask.config treats "-" and "_" alike; a key from DASK_* variables keeps the "_".
    return key.replace("_", "-") in DASK_CONFIG_EXCLUDED


def _dask_view() -> Any:
    config = sys.modules["dask.config"].config
    return {k: v for k, v in list(config.items()) if not _dask_excluded(k)}


def _dask_get() -> Any:
    return copy.deepcopy(_dask_view())


def _dask_put(snapshot: Any) -> None:
    config = sys.modules["dask.config"].config
    for key in [k for k in config if not _dask_excluded(k) and k not in snapshot]:
        del config[key]
    config.update(copy.deepcopy({k: v for k, v in snapshot.items() if not _dask_excluded(k)}))


_SYS_PATH_AT_START: list[str] | None = None


def note_baselines() -> None:
    """Remember this interpreter's sys.path and process settings, so only a notebook's own
    changes to them are state (`nbrewind.identity.interpreter`)."""
    global _SYS_PATH_AT_START
    if _SYS_PATH_AT_START is None:
        _SYS_PATH_AT_START = list(sys.path)
    interpreter.note_baseline()


def _dask_work_dirs() -> set[str]:
    """The work directories of the distributed servers living in this process.

    Every in-process scheduler and worker puts its fresh, randomly named directory at the
    front of sys.path (for ``Client.upload_file``): that follows the cluster, not the notebook.
    """
    found = set()
    for module_name, class_name in (
        ("distributed.worker", "Worker"), ("distributed.scheduler", "Scheduler"), ("distributed.nanny", "Nanny")
    ):
        cls = getattr(sys.modules.get(module_name), class_name, None)
        for server in list(getattr(cls, "_instances", ())):
            directory = getattr(server, "local_directory", None)
            if isinstance(directory, str):
                found.add(directory)
    return found


def _sys_path_get() -> Any:
    # The interpreter's own entries differ between machines; what cells added or removed does not.
    # Entries after the interpreter's first one were appended (`sys.path.append`): they stay
    # at the end, where they are looked up last.
    base = set(_SYS_PATH_AT_START if _SYS_PATH_AT_START is not None else ())
    skip = _dask_work_dirs() | {p for p in sys.path if "dask-scratch-space" in p or "dask-worker-space" in p}
    first = next((i for i, p in enumerate(sys.path) if p in base), len(sys.path))
    own = [(i, p) for i, p in enumerate(sys.path) if p not in base and p not in skip]
    snapshot: dict[str, Any] = {
        "added": [p for i, p in own if i < first],
        "removed": [p for p in _SYS_PATH_AT_START or () if p not in sys.path],
    }
    appended = [p for i, p in own if i > first]
    if appended:
        snapshot["appended"] = appended
    return snapshot


def _sys_path_put(snapshot: Any) -> None:
    base = _SYS_PATH_AT_START if _SYS_PATH_AT_START is not None else []
    kept = [p for p in sys.path if p not in snapshot["removed"] and (p in base or p in _dask_work_dirs())]
    added, appended = snapshot["added"], snapshot.get("appended", [])
    sys.path[:] = [*added, *[p for p in kept if p not in added and p not in appended], *appended]


def _warnings_get() -> Any:
    out = []
    for action, message, category, module, lineno in warnings.filters:
        out.append(
            (
                action,
                getattr(message, "pattern", message),
                f"{getattr(category, '__module__', '')}.{getattr(category, '__qualname__', category)}",
                getattr(module, "pattern", module),
                lineno,
            )
        )
    return {"filters": out, "objects": list(warnings.filters)}


def _warnings_put(snapshot: Any) -> None:
    warnings.filters[:] = snapshot["objects"]  # type: ignore[index]
    with contextlib.suppress(AttributeError):
        warnings._filters_mutated()  # type: ignore[attr-defined]


def _decimal_get() -> Any:
    ctx = sys.modules["decimal"].getcontext()
    return {
        "prec": ctx.prec, "rounding": ctx.rounding, "Emin": ctx.Emin, "Emax": ctx.Emax,
        "capitals": ctx.capitals, "clamp": ctx.clamp,
        "traps": sorted(t.__name__ for t, on in ctx.traps.items() if on),
    }


def _decimal_put(snapshot: Any) -> None:
    decimal = sys.modules["decimal"]
    ctx = decimal.getcontext()
    for field in ("prec", "rounding", "Emin", "Emax", "capitals", "clamp"):
        setattr(ctx, field, snapshot[field])
    for trap in ctx.traps:
        ctx.traps[trap] = trap.__name__ in snapshot["traps"]


_MISSING = object()

REGISTRY: list[Setting] = [
    Setting("numpy", "numpy", _numpy_get, _numpy_put),
    Setting("pandas", "pandas._config.config", _pandas_get, _pandas_put, _pandas_view),
    Setting("matplotlib", "matplotlib", _matplotlib_get, _matplotlib_put, _matplotlib_view),
    Setting("dask.config", "dask.config", _dask_get, _dask_put, _dask_view),
    Setting("sys.path", "sys", _sys_path_get, _sys_path_put),
    Setting("warnings", "warnings", _warnings_get, _warnings_put, lambda: _warnings_get()["filters"]),
    Setting("decimal", "decimal", _decimal_get, _decimal_put),
    Setting("interpreter", "sys", interpreter.interpreter_get, interpreter.interpreter_put),
    Setting("time zone", "time", interpreter.time_zone_get, interpreter.time_zone_put),
    Setting("logging", "logging", interpreter.logging_get, interpreter.logging_put),
    Setting("logging.loggers", "logging", interpreter.loggers_get, interpreter.loggers_put),
    Setting("socket", "socket", interpreter.socket_get, interpreter.socket_put),
    Setting("locale", "locale", interpreter.locale_get, interpreter.locale_put),
    Setting("IPython display", "IPython", interpreter.display_get, interpreter.display_put),
]
