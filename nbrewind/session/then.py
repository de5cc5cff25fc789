"""The process as a checkpoint found it, for the length of a re-run.

A cell run again to make a value (a regeneration, a rebuild, a deferred cell) must
see what it saw the first time: the global RNG states, environment variables,
working directory and library settings of the checkpoint it started from.  `as_then`
sets them for the duration and puts the process back as it was.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from nbrewind.checkpoint import randomness
from nbrewind.checkpoint.values import load_group
from nbrewind.identity import settings as settings_registry
from nbrewind.session import pseudo
from nbrewind.session.pseudo import Pseudo
from nbrewind.session.state import Entry
from nbrewind.store.digest import is_digest

if TYPE_CHECKING:
    from nbrewind.session.plan import Paths
    from nbrewind.store.objects import ObjectStore

__all__ = ["as_then"]


@contextlib.contextmanager
def as_then(
    entries: Mapping[str, Any], objects: ObjectStore, paths: Paths, initial_settings: Mapping[str, Any]
) -> Iterator[dict[str, Entry]]:
    """The global RNG states, environment, working directory and library settings of a
    checkpoint's `entries` (name -> (digest, meta)), for the duration; yields its names'
    entries. The process is left as it was found."""
    names: dict[str, Entry] = {}
    rng_states: dict[str, Any] = {}
    env: dict[str, str | None] = {}
    cwd: str | None = None
    settings: dict[str, str] = {}
    for member, (digest, meta) in entries.items():
        parsed = pseudo.parse(member)
        if parsed is None:
            names[member] = Entry.from_meta(digest, meta)
        elif parsed[0] is Pseudo.SETTING and "setting" in meta and is_digest(digest):
            settings[meta["setting"]] = digest
        elif parsed[0] is Pseudo.RNG:
            rng_states[parsed[1]] = digest
        elif parsed[0] is Pseudo.ENV and "var" in meta:
            env[meta["var"]] = meta.get("value")
        elif parsed[0] is Pseudo.CWD and "path" in meta:
            cwd = meta["path"]
    # A fresh run of the notebook never ran this cell a second time: its draws from the
    # global RNGs must not count, and it draws what the original run drew; it sees the
    # environment variables, working directory and library settings (warning filters,
    # pandas options) the notebook had set by then.
    saved = randomness.capture_rng()
    saved_env = {var: os.environ.get(var) for var in env}
    saved_cwd = os.getcwd()
    then = {name: snapshot for name, snapshot in initial_settings.items() if name not in settings}
    saved_settings = settings_registry.capture_settings([*settings, *then])
    try:
        randomness.restore_rng({which: load_group(objects, d)["state"] for which, d in rng_states.items()})
        then.update({name: load_group(objects, d)["snapshot"] for name, d in settings.items()})
        settings_registry.apply_settings(then)
        _set_env(env)
        if cwd is not None:
            os.chdir(paths.abs(cwd))
        yield names
    finally:
        os.chdir(saved_cwd)
        _set_env(saved_env)
        settings_registry.apply_settings(saved_settings)
        randomness.restore_rng(saved)


def _set_env(values: Mapping[str, str | None]) -> None:
    for var, value in values.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
