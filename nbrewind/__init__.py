"""NBRewind: Jupyter kernels that checkpoint every cell and cache every Dask task.

The package root stays light: importing it loads nothing else, so task code on
Dask workers can `import nbrewind` cheaply. Task-side helpers are looked up on
first use.
"""

from __future__ import annotations

from typing import Any

from nbrewind._version import __version__

__all__ = ["__version__", "prioritize"]


def __getattr__(name: str) -> Any:
    if name == "prioritize":
        from nbrewind.tasks.priority import prioritize

        return prioritize
    raise AttributeError(f"module 'nbrewind' has no attribute {name!r}")
