"""Run a callback right after a module is first imported, without importing it.

NBRewind acts on libraries the notebook may never load: patching distributed's client
for priority bumps, or putting back a library setting a replayed cell made. Importing
the library to do that would cost every notebook its import time (dask and
distributed: 0.3-0.5 s); instead :func:`after_import` waits for the notebook's own
import and acts as that module's code finishes, before the importer gets it back.

The hook is a finder at the front of ``sys.meta_path`` that asks the finders after
it for the module's spec (so other import hooks keep working) and wraps its loader's
``exec_module``. It fires once, and :meth:`AfterImport.remove` takes it out of
``sys.meta_path`` again.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["AfterImport", "after_import"]


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` once, right after the module ``name`` is first executed."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.then = then
        self.active = True
        self._busy = threading.local()

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname != self.name or not self.active or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.on = False
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module
        hook = self

        def exec_module(module: ModuleType) -> None:
            original(module)
            if hook.active:
                hook.remove()
                hook.then(module)

        loader.exec_module = exec_module  # this loader object serves only this module
        return spec

    def remove(self) -> None:
        """Never fire (again), and leave ``sys.meta_path``."""
        self.active = False
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)


def after_import(name: str, then: Callable[[ModuleType], None]) -> AfterImport | None:
    """Call ``then(module)`` once the module ``name`` is imported: now if it already is
    (and return None), else right after its first import (and return the hook, whose
    ``remove()`` cancels it)."""
    module = sys.modules.get(name)
    if module is not None:
        then(module)
        return None
    hook = AfterImport(name, then)
    sys.meta_path.insert(0, hook)
    return hook
