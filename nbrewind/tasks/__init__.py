"""Dask integration: task interception, fingerprints, the task cache and log,
priority bumps for requested work, and checkpoints inside long-running tasks."""

from nbrewind.tasks.cache import impure

__all__ = ["impure"]
