"""NBRewind: Jupyter kernels that checkpoint every cell and cache every Dask task.

The package root stays light: importing it loads only the (empty) ``checkpoint``
subpackage, so task code on Dask workers can `import nbrewind` cheaply. Task-side
helpers are looked up on first use.

``nbrewind.checkpoint`` is two things at once. It is the subpackage of cell
checkpoints (``nbrewind.checkpoint.values`` ...), and, called, it is the task
checkpoint of ``nbrewind.tasks.resume``: ``nbrewind.checkpoint(state)``. A plain
function attribute would not survive: importing any ``nbrewind.checkpoint.x``
sets the attribute ``checkpoint`` of this package to the subpackage. So the
subpackage's module object is given a ``ModuleType`` subclass whose ``__call__``
imports the task API on first call. It is done here, at the root, because the
checkpoint layer must not import ``nbrewind.tasks`` at all, and because the root is
imported before any subpackage, so the module object is callable however and
whenever it is imported.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from nbrewind import checkpoint as _checkpoint_package
from nbrewind._version import __version__

__all__ = ["__version__", "checkpoint", "impure", "prioritize", "publish", "published", "resume", "update_task"]


class _CallableCheckpointPackage(ModuleType):
    """The ``nbrewind.checkpoint`` subpackage, also callable as the task checkpoint."""

    def __call__(self, state: Any, *, min_interval: float = 0.0) -> bool:
        """Persist ``state`` as the running Dask task's checkpoint (see ``nbrewind.tasks.resume.checkpoint``).

        Outside a task run under NBRewind's task cache this does nothing and returns False.
        """
        from nbrewind.tasks.resume import checkpoint as task_checkpoint

        return task_checkpoint(state, min_interval=min_interval)

    def __reduce__(self) -> tuple[Any, ...]:
        # A module subclass escapes the picklers' (and the task fingerprinter's) exact-type
        # handling of modules: say how to get it back, by name, as for any module.
        import importlib

        return (importlib.import_module, (self.__name__,))


_checkpoint_package.__class__ = _CallableCheckpointPackage
checkpoint = _checkpoint_package

_LAZY = {
    "impure": "nbrewind.tasks.cache",
    "prioritize": "nbrewind.tasks.priority",
    "resume": "nbrewind.tasks.resume",
    "publish": "nbrewind.tasks.resume",
    "published": "nbrewind.tasks.resume",
    "update_task": "nbrewind.tasks.update",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nbrewind' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
