"""Pseudo-variables: the names under which state outside the namespace sits in cell keys
and checkpoints, built and parsed in one place.

A cell run's ``inputs`` and a checkpoint's entries are keyed by name. Names of the
notebook's variables are identifiers; everything else a replay rests on is a
pseudo-variable, ``@<kind>`` or ``@<kind>:<argument>`` (an argument may hold any
character, paths included). The names are stored in catalogs, so their spelling is
a format: never change a prefix.

| kind | argument | as an input, the digest of | as an entry, it restores |
|---|---|---|---|
| ``RNG`` | ``random`` or ``numpy.random`` | the global generator's state | that state |
| ``FILE`` | a path (relative to the kernel's start folder when inside it) | the file's bytes | the file |
| ``ENV`` | a variable | its value | its value (or its absence) |
| ``CWD`` | | the working directory | the working directory |
| ``NAMES`` | | which user names exist (a cell reading ``globals()``) | |
| ``SETTING`` | a registered library setting | the setting | its snapshot |
| ``SOURCE`` | a local module | its source file | |
| ``MODULE_STATE`` | a local module | its data attributes | those attributes |
| ``LISTING`` | a directory | the names a listing returned | |
| ``STAT`` | a path | what a stat could tell | |
| ``KIND`` | a path | what an existence check could tell | |
| ``IMPURE`` | | why the cell can never be replayed (never matches) | |
| ``PATCHES`` | | what the library attributes cells patched hold | |
"""

from __future__ import annotations

import enum

__all__ = ["ABSENT", "Pseudo", "is_pseudo", "name", "parse"]

ABSENT = "absent"
"""The key of something that does not exist (a missing file, an unset variable)."""


class Pseudo(enum.Enum):
    """The kinds of pseudo-variable; the value is the name's prefix."""

    RNG = "@rng:"
    FILE = "@file:"
    ENV = "@env:"
    CWD = "@cwd"
    NAMES = "@names"
    SETTING = "@setting:"
    SOURCE = "@src:"
    MODULE_STATE = "@mstate:"
    LISTING = "@dir:"
    STAT = "@stat:"
    KIND = "@kind:"
    IMPURE = "@impure"
    PATCHES = "@patches"

    @property
    def takes_argument(self) -> bool:
        return self.value.endswith(":")


_WITH_ARGUMENT = tuple(k for k in Pseudo if k.takes_argument)
_BARE = {k.value: k for k in Pseudo if not k.takes_argument}


def name(kind: Pseudo, argument: str = "") -> str:
    """The pseudo-variable of `kind` for `argument` (none for a bare kind)."""
    if kind.takes_argument != bool(argument):
        raise ValueError(f"{kind.name} {'needs' if kind.takes_argument else 'takes no'} argument (got {argument!r})")
    return kind.value + argument


def parse(text: str) -> tuple[Pseudo, str] | None:
    """``(kind, argument)`` of a pseudo-variable, or None for a variable of the notebook."""
    if not text.startswith("@"):
        return None
    bare = _BARE.get(text)
    if bare is not None:
        return bare, ""
    for kind in _WITH_ARGUMENT:
        if text.startswith(kind.value):
            return kind, text[len(kind.value) :]
    return None


def is_pseudo(text: str) -> bool:
    """Whether `text` names state outside the namespace rather than a notebook variable."""
    return text.startswith("@")
