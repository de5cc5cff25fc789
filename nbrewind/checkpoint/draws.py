"""Which draws from the global ``random`` generator a cell run is answerable for.

The global generator is shared with the libraries living in the kernel: an
in-process distributed scheduler samples workers with ``random.sample``, the
client shuffles them, tornado jitters its timers, and ``dask.sizeof`` samples the items
of a list whose size distributed estimates. Those draws happen on their
own threads, whenever the event loop gets to them, so the state a cell starts
from moves between two identical runs. Keying the cell on that state would make
it run again for nothing; isolating those libraries in a private generator
would change the sequence the notebook sees. Neither is done.

Instead, while a cell runs, the module-level functions of ``random`` (bound
methods of its hidden instance) are replaced by pass-through wrappers that call
the very same method. A draw whose direct caller is one of those libraries is
*observed*: the state before it must be the state the previous observed draw
left (or the cell's starting state), and the state after it is remembered. If
every move of the state during the cell is such a chain of observed library
draws, the cell did not consume the state, and its starting state is not an
input. Anything else (a draw by the cell, a draw through a captured bound
method, a draw nobody observed, more draws than the bound of checks) leaves the
state an input, as before.
"""

from __future__ import annotations

import contextlib
import random
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["DrawWatch"]

BACKGROUND_CALLERS = frozenset({"distributed", "tornado"})
"""Top-level packages whose own draws (scheduling, jitter) never reach a result."""

_CHECKS = 1000
"""Observed library draws checked per cell (two ``getstate`` each, ~20 us); past it the
state is simply an input again."""

_NOT_DRAWS = frozenset({"seed", "getstate", "setstate"})

_watching: DrawWatch | None = None


class _Draw:
    """A pass-through for one function of ``random``; pickles as the function itself."""

    __slots__ = ("name", "method")

    def __init__(self, name: str, method: Callable[..., Any]) -> None:
        self.name = name
        self.method = method

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        watch = _watching
        if watch is None:
            return self.method(*args, **kwargs)
        if _background_caller(sys._getframe(1)):
            return watch._background(self.method, args, kwargs)
        watch.cell_drew = True
        return self.method(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_function, (self.name,))

    def __repr__(self) -> str:
        return repr(self.method)


ON_BEHALF = ("dask.sizeof", "dask.utils")
"""Modules that draw for whoever calls them (``sizeof`` samples a list's items, reached
through ``dask.utils.Dispatch``): the draw is a background one when their caller is a
`BACKGROUND_CALLERS` package, the cell's when the cell called them."""


def _background_caller(frame: Any) -> bool:
    module = frame.f_globals.get("__name__") or ""
    while frame is not None and module.startswith(ON_BEHALF):
        frame = frame.f_back
        module = (frame.f_globals.get("__name__") or "") if frame is not None else ""
    return module.partition(".")[0] in BACKGROUND_CALLERS


def _function(name: str) -> Any:
    """``random``'s function ``name`` itself, never a wrapper: what a pickled wrapper restores as."""
    value = getattr(random, name)
    return value.method if isinstance(value, _Draw) else value


class DrawWatch:
    """Follows the global ``random`` state through one cell run (see the module docstring)."""

    def __init__(self) -> None:
        self.cell_drew = False
        self._broken = False
        self._checks = _CHECKS
        self._expected: Any = None
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def watching(self) -> Iterator[DrawWatch]:
        """Wrap ``random``'s functions while the block runs; put the originals back after."""
        global _watching
        instance = random._inst
        originals = {
            name: value
            for name, value in vars(random).items()
            if getattr(value, "__self__", None) is instance and name not in _NOT_DRAWS
        }
        self.cell_drew, self._broken, self._checks = False, False, _CHECKS
        self._expected = instance.getstate()
        for name, method in originals.items():
            setattr(random, name, _Draw(name, method))
        _watching = self
        try:
            yield self
        finally:
            _watching = None
            for name, method in originals.items():
                if isinstance(vars(random).get(name), _Draw):
                    setattr(random, name, method)

    def explained(self) -> bool:
        """Whether every move of the state since the block began was an observed library draw."""
        if self.cell_drew or self._broken:
            return False
        with self._lock:
            return bool(random.getstate() == self._expected)

    def _background(self, method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with self._lock:
            if self._broken or self._checks <= 0:
                self._broken = True
                return method(*args, **kwargs)
            self._checks -= 1
            if random.getstate() != self._expected:
                self._broken = True  # someone moved it unobserved since the last check
                return method(*args, **kwargs)
            try:
                return method(*args, **kwargs)
            finally:
                self._expected = random.getstate()
