"""Dask plugin classes built on first use, found by pickle under a module's name.

A plugin shipped to the scheduler and to worker processes is pickled by reference,
so its class must be a module attribute; subclassing distributed's plugin bases at
import time would import distributed with the module. `lazy_plugin_classes` gives a
module a ``__getattr__`` that builds each class when it is first asked for.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["lazy_plugin_classes"]


def lazy_plugin_classes(module: str, scheduler: tuple[str, type], worker: tuple[str, type]) -> Callable[[str], type]:
    """A module ``__getattr__`` for ``module`` that makes ``scheduler[0]`` (``scheduler[1]``
    on distributed's SchedulerPlugin) and ``worker[0]`` (``worker[1]`` on WorkerPlugin)."""
    built: dict[str, type] = {}

    def get(name: str) -> type:
        if name not in (scheduler[0], worker[0]):
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        cls = built.get(name)
        if cls is None:
            from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

            logic, base = (scheduler[1], SchedulerPlugin) if name == scheduler[0] else (worker[1], WorkerPlugin)
            namespace = {"__module__": module, "__qualname__": name, "__doc__": logic.__doc__}
            cls = built[name] = type(name, (logic, base), namespace)
        return cls

    return get
