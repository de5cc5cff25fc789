"""The library settings a task fingerprint covers, digested once per graph submission.

The settings are those of `nbrewind.identity.settings.REGISTRY`, the ones cell
keys and checkpoints track, with the same exclusions (dask.config's scheduler
keys and ``distributed`` tree, distributed's work directories on sys.path);
only the warnings filters are seen differently by a task (below).

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

import warnings
from collections.abc import Iterable
from typing import Any

from nbrewind.identity.settings import DASK_CONFIG_EXCLUDED, REGISTRY, Setting, settings_digests

__all__ = ["DASK_CONFIG_EXCLUDED", "TASK_REGISTRY", "task_settings"]


def _warnings_view() -> Any:
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


TASK_REGISTRY: list[Setting] = [
    Setting(s.name, s.module, s.get, s.put, _warnings_view) if s.name == "warnings" else s for s in REGISTRY
]
"""The identity registry as a task sees it: the same settings, warnings filters up to the last "error"."""


def task_settings(registry: Iterable[Setting] | None = None) -> dict[str, str] | None:
    """{setting name: digest} of the loaded libraries' settings, or None if one cannot be read.

    None means the settings cannot vouch for a result: the caller must not serve
    or store cached results for this graph.
    """
    return settings_digests(TASK_REGISTRY if registry is None else registry, tag=b"nbrewind.task-setting.v1|")
