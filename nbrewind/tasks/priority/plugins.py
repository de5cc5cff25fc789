"""The scheduler and worker halves of a priority bump, as distributed plugins.

This module is where the plugin classes live: ``PrioritySchedulerPlugin`` (the
logic of :class:`~nbrewind.tasks.priority.scheduler_side.SchedulerSide` on
distributed's ``SchedulerPlugin``) and ``PriorityWorkerPlugin`` (the logic of
:class:`~nbrewind.tasks.priority.worker_side.WorkerSide` on ``WorkerPlugin``).
A registered plugin is pickled by reference to its class, so the scheduler and
every worker process find it here, as
``nbrewind.tasks.priority.plugins.PrioritySchedulerPlugin`` and
``...PriorityWorkerPlugin``: those two names must not move.

The classes subclass distributed's plugin bases, so they are built on first use
(see :func:`__getattr__`) to keep importing this module free of any dask import.
What the halves share is in ``protocol``.
"""

from __future__ import annotations

from nbrewind.tasks.plugin_classes import lazy_plugin_classes
from nbrewind.tasks.priority.scheduler_side import SchedulerSide
from nbrewind.tasks.priority.worker_side import WorkerSide

__all__ = ["plugin_class"]

# Module attributes PrioritySchedulerPlugin and PriorityWorkerPlugin, built on first access.
__getattr__ = lazy_plugin_classes(__name__, ("PrioritySchedulerPlugin", SchedulerSide), ("PriorityWorkerPlugin", WorkerSide))


def plugin_class(name: str) -> type:
    """The plugin class ``name`` (``PrioritySchedulerPlugin`` or ``PriorityWorkerPlugin``)."""
    return __getattr__(name)
