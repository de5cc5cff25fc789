"""The on/off switch of automatic bumps: one dask config key, read at every wait.

The switch lives in ``dask.config`` so that every way of setting Dask options
works for it: ``dask.config.set({"nbrewind.auto-priority": False})`` in a cell
(or as a ``with`` block), a YAML file in ``~/.config/dask/``, or the environment
variable ``DASK_NBREWIND__AUTO_PRIORITY=False`` before the kernel starts. It
orders work and never changes a result, so the settings NBRewind records with
cells and folds into task fingerprints leave the ``nbrewind`` key out
(``nbrewind.identity.settings.DASK_CONFIG_EXCLUDED``): switching costs no cache hits.
"""

from __future__ import annotations

#: The dask config key; true (the default) means automatic bumps are on.
CONFIG_KEY = "nbrewind.auto-priority"

_FALSE_WORDS = frozenset({"false", "0", "no", "off", ""})


def auto_priority_enabled() -> bool:
    """Whether automatic bumps are on now (``nbrewind.auto-priority``, default true).

    Read at every wait, so a change takes effect at the next ``.result()``,
    ``gather``, ``wait`` or ``as_completed`` step. Strings from YAML or the
    environment count as false when they are "false", "0", "no" or "off".
    """
    import dask.config

    value = dask.config.get(CONFIG_KEY, True)
    if isinstance(value, str):
        return value.strip().lower() not in _FALSE_WORDS
    return bool(value)


def set_auto_priority(enabled: bool) -> None:
    """Switch automatic bumps on or off for this process, from now on.

    Sets ``nbrewind.auto-priority`` in the global dask config (not a ``with``
    block). Explicit :func:`~nbrewind.tasks.priority.prioritize` calls are not
    affected.
    """
    import dask.config

    dask.config.set({CONFIG_KEY: bool(enabled)})
