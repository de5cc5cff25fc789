"""The library settings a task fingerprint covers, digested once per graph submission.

The settings are those of `nbrewind.identity.settings.REGISTRY` (the ones cell
keys and checkpoints track), read through a task's view of them (below) and
digested with a fast type-tagged encoding of their own.

A task's result can depend on configuration outside its code and arguments:
``np.seterr(all="raise")`` turns a warning into an exception, a pandas option
(``mode.copy_on_write``, ``future.infer_string``) changes what an operation
returns, ``decimal.getcontext().prec`` how a Decimal rounds, a dask setting what
a task does when it runs. `task_settings` digests them once per graph; the graph
rewrite folds the result into every task's fingerprint, so a changed setting
misses the cache.

Included, conservatively, although they are "display" settings: numpy's print
options, pandas' ``display.*`` and matplotlib's rcParams. A task that returns
``repr(df)``, ``str(arr)`` or a rendered figure depends on them, and a notebook
changes them rarely, so keeping them costs few hits.

Left out, each because it cannot change what a task computes and because it
differs between runs that compute the same thing (measured: ``Client(LocalCluster(
n_workers=1, processes=False))`` sets ``scheduler`` and, on ``import distributed``,
adds the whole ``distributed`` tree, whose ``distributed.scheduler.http.routes``
grows by one entry every time a scheduler starts; two identical runs would never hit):

- dask.config ``scheduler`` / ``get`` (which scheduler runs a task, not what it
  computes: the cache is meant to serve results across schedulers), ``pool``
  (an executor object, keyed only by its repr and id) and ``distributed``
  (cluster, comm, memory-manager and dashboard tuning);
- warnings filters after the last ``"error"`` filter: filters only change a
  task's outcome when they make a warning raise, and only the filters up to the
  last ``"error"`` one decide that (without an ``"error"`` filter, none count).
  Libraries add filters when they are imported, so the whole list would differ
  between a run that imported a library before a compute and one that did not;
- ``sys.path`` entries that are the work directories of distributed servers
  running in this process: every scheduler and worker inserts its fresh, randomly
  named directory (for ``Client.upload_file``) at the front, so a
  ``LocalCluster(processes=False)`` made again would change ``sys.path``;
- matplotlib's backend (already left out by the identity registry).

Not seen at all: state a task reads on a worker in another process (its own
dask.config, environment, settings) and thread-local state a worker thread does
not inherit (numpy's error state and decimal's context are per thread or
context: the digest covers the submitting thread's, which tasks run on the
synchronous scheduler see).
"""

from __future__ import annotations

import struct
import sys
import warnings
from collections.abc import Iterable
from typing import Any

import xxhash

from nbrewind.identity.settings import REGISTRY, Setting, canonical_bytes

__all__ = ["DASK_CONFIG_EXCLUDED", "TASK_REGISTRY", "task_settings"]

#: Top-level dask.config keys that are not part of a task's fingerprint (see the module docstring).
DASK_CONFIG_EXCLUDED = frozenset({"scheduler", "get", "pool", "distributed"})

_pack_d = struct.Struct("<d").pack


def _dask_get() -> Any:
    config = sys.modules["dask.config"].config
    return {k: v for k, v in list(config.items()) if k not in DASK_CONFIG_EXCLUDED}


def _warnings_get() -> Any:
    filters = list(warnings.filters)
    last_error = max((i for i, f in enumerate(filters) if f[0] == "error"), default=-1)
    out = []
    for action, message, category, module, lineno in filters[: last_error + 1]:
        out.append((
            action,
            getattr(message, "pattern", message),
            f"{getattr(category, '__module__', '')}.{getattr(category, '__qualname__', category)}",
            getattr(module, "pattern", module),
            lineno,
        ))
    return out


def _pandas_get() -> Any:
    # The live option tree: digested, never kept, so no copy is needed.
    return sys.modules["pandas._config.config"]._global_config


def _matplotlib_get() -> Any:
    rc = sys.modules["matplotlib"].rcParams
    return {k: v for k, v in list(dict.items(rc)) if k not in ("backend", "backend_fallback")}


def _dask_work_dirs() -> set[str]:
    """The work directories of the distributed servers living in this process."""
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


_IDENTITY_SYS_PATH = next(s.get for s in REGISTRY if s.name == "sys.path")


def _sys_path_get() -> Any:
    snapshot = _IDENTITY_SYS_PATH()
    work_dirs = _dask_work_dirs()
    if not work_dirs:
        return snapshot
    return {k: [p for p in v if p not in work_dirs] for k, v in snapshot.items()}


def _no_put(snapshot: Any) -> None:
    raise NotImplementedError("task settings are digested, not restored")


_OWN = {
    "dask.config": _dask_get,
    "warnings": _warnings_get,
    "pandas": _pandas_get,
    "matplotlib": _matplotlib_get,
    "sys.path": _sys_path_get,
}

TASK_REGISTRY: list[Setting] = [
    Setting(s.name, s.module, _OWN[s.name], _no_put) if s.name in _OWN else s for s in REGISTRY
]
"""The identity registry as a task sees it: the same names, with the getters above where they differ."""


def task_settings(registry: Iterable[Setting] | None = None) -> dict[str, str] | None:
    """{setting name: digest} of the loaded libraries' settings, or None if one cannot be read.

    None means the settings cannot vouch for a result: the caller must not serve
    or store cached results for this graph (a constant "unreadable" digest would
    let two different settings look equal). A setting read while another thread
    changes it is retried once before giving up.
    """
    out = {}
    for setting in TASK_REGISTRY if registry is None else registry:
        if setting.module not in sys.modules:
            continue
        for attempt in range(2):
            try:
                parts: list[bytes] = [b"nbrewind.task-setting.v1|"]
                _encode(setting.get(), parts)
                break
            except Exception:  # noqa: BLE001 - mutated while read, or a library we cannot read
                if attempt:
                    return None
        out[setting.name] = xxhash.xxh3_128_hexdigest(b"".join(parts))
    return out


def _encode(value: Any, out: list[bytes]) -> None:
    """Type-tagged, order-free bytes of a settings snapshot (dict order never counts).

    A fast path for the plain values settings hold (3-4x faster than pickling
    every scalar, which matters once per graph submission); anything else is
    `nbrewind.identity.settings.canonical_bytes`'s encoding, under its own tag.
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
            _encode(k, sub)
            _encode(v, sub)
            items.append(b"".join(sub))
        items.sort()
        out.append(b"{%d:" % len(items))
        out.extend(items)
    elif t is list or t is tuple:
        out.append((b"[%d:" if t is list else b"(%d:") % len(value))
        for x in value:
            _encode(x, out)
    else:
        raw = canonical_bytes(value)
        out.append(b"o%d:" % len(raw))
        out.append(raw)
