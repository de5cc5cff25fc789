"""Tasks that update their place in the graph while they run (distributed only).

A long-running Dask task calls :func:`update_task` to tell the scheduler what
changed: pieces it published (now in memory on its worker, and stored durably),
keys it now depends on, keys it no longer needs, and a replacement task that
takes its place if it has to run again. A shuffle-like task can so drop each
input as soon as it has consumed it and still survive the loss of its worker: the
scheduler reschedules the replacement, which resumes from the published pieces.

Inputs that a task consumes one by one are passed to it by name, as handles
(:func:`handle`), so the worker does not gather them all before the task starts;
the task reads each with :func:`fetch`, and the scheduler holds them for it until
it releases them.

The package: ``plugins`` (the scheduler and worker halves), ``task`` (the task and
client side). Register the plugins once with :func:`install`.
"""

from __future__ import annotations

from nbrewind.tasks.update.plugins import PLUGIN_NAME, StaleUpdate, UpdateError, hold_name
from nbrewind.tasks.update.task import (
    KeyHandle,
    fetch,
    handle,
    handles,
    install,
    key_of,
    load_piece,
    ref,
    update_task,
)

__all__ = [
    "PLUGIN_NAME",
    "KeyHandle",
    "StaleUpdate",
    "UpdateError",
    "fetch",
    "handle",
    "handles",
    "hold_name",
    "install",
    "key_of",
    "load_piece",
    "ref",
    "update_task",
]
