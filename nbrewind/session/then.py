"""The process as a checkpoint found it, for the length of a re-run.

A cell run again to make a value (a regeneration, a rebuild, a deferred cell) must
see what it saw the first time: the global RNG states, environment variables,
working directory and library settings of the checkpoint it started from.  `as_then`
sets them for the duration and puts the process back as it was.

A chain of deferred cells run again (a file handle opened, then written through) must
also find the files it writes as each of its cells found them, not as the replays after
it left them: `FilesThen` sets them before each re-run and puts back, afterwards, what
the replays left.  Files are rewritten in place, so a handle a re-run opened keeps
writing to the file the notebook sees.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from nbrewind.checkpoint import randomness
from nbrewind.checkpoint.values import load_group
from nbrewind.identity import settings as settings_registry
from nbrewind.identity.files import file_digest, quietly
from nbrewind.session import pseudo
from nbrewind.session.pseudo import ABSENT, Pseudo
from nbrewind.session.state import Entry
from nbrewind.store.digest import is_digest

if TYPE_CHECKING:
    from nbrewind.session.plan import Paths
    from nbrewind.store.objects import ObjectStore

__all__ = ["FilesThen", "as_then", "written_files"]


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


def written_files(before: Mapping[str, Any], after: Mapping[str, Any]) -> set[str]:
    """The `@file:` names whose recorded state differs between two checkpoints' entries."""
    return {name for name, item in after.items() if _is_file(name) and before.get(name) != item}


def _is_file(name: str) -> bool:
    parsed = pseudo.parse(name)
    return parsed is not None and parsed[0] is Pseudo.FILE


class FilesThen:
    """The files in `names` (`@file:` names) as each re-run found them; `put_back` restores
    what was on disk before the first change."""

    def __init__(self, names: Iterable[str], objects: ObjectStore, paths: Paths) -> None:
        self._names = sorted(names)
        self._objects = objects
        self._paths = paths
        self._saved: dict[str, bytes | None] = {}

    def set(self, entries: Mapping[str, Any], inputs: Mapping[str, str]) -> None:
        """Make each file what a checkpoint's `entries` say it was; a file no earlier cell
        wrote is removed if the re-run cell found it absent (its `inputs`), else left."""
        with quietly():
            self._set(entries, inputs)

    def _set(self, entries: Mapping[str, Any], inputs: Mapping[str, str]) -> None:
        for name in self._names:
            path = self._paths.abs(pseudo.parse(name)[1])  # type: ignore[index]
            if name in entries:
                entry = Entry.from_meta(*entries[name])
                if entry.extra.get("dir"):
                    continue  # a folder made or removed: never rewritten here
                if entry.extra.get("deleted"):
                    self._make(path, None)
                elif file_digest(path) != entry.key:
                    self._make(path, self._objects.get_blob(entry.digest))
            elif inputs.get(name) == ABSENT:
                self._make(path, None)

    def put_back(self) -> None:
        """Put back every file `set` changed as it was before the first change."""
        saved, self._saved = self._saved, {}
        with quietly():
            for path, data in saved.items():
                if data is None or not os.path.isfile(path) or _read(path) != data:
                    _write(path, data)

    def _make(self, path: str, data: bytes | None) -> None:
        if os.path.isdir(path):
            return
        if path not in self._saved:
            self._saved[path] = _read(path) if os.path.isfile(path) else None
        _write(path, data)


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _write(path: str, data: bytes | None) -> None:
    """Write `data` into the file at `path` in place (None: remove it), so handles open on
    it see the new content."""
    if data is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    elif os.path.isfile(path):
        with open(path, "r+b") as handle:
            handle.write(data)
            handle.truncate()
    else:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)
