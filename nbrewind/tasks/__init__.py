"""Dask integration: task interception, fingerprints, the task cache and log,
priority bumps for requested work, and checkpoints inside long-running tasks.

Importing this package imports nothing: Dask workers unpickle plugins and task
wrappers from its submodules, and each worker process should load only those
(``impure`` is looked up on first use)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nbrewind.tasks.cache import impure

__all__ = ["impure"]


def __getattr__(name: str) -> Any:
    if name == "impure":
        from nbrewind.tasks.cache import impure

        return impure
    raise AttributeError(f"module 'nbrewind.tasks' has no attribute {name!r}")
