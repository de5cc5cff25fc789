"""What a module is: a local one by the digest of its source file, an installed one by
its distribution and version, a standard-library one by the Python version.

A notebook that imports `helpers.py` from its folder depends on that file's
bytes: editing it must change the key of every cell that uses it, although the
module's name stays the same. Modules under the interpreter's library roots are
keyed by what is installed, which is what a backpack's environment pins.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import sysconfig
import types
from collections.abc import Iterable

from nbrewind.identity.files import file_digest

__all__ = ["is_local_module", "module_identity", "module_source_path"]


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    import site

    roots = set()
    for scheme_vars in ({}, {"base": sys.base_prefix, "platbase": sys.base_prefix}):
        paths = sysconfig.get_paths(vars=scheme_vars)
        roots.update(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k))
    roots.update(site.getsitepackages())
    user_site = site.getusersitepackages()
    if isinstance(user_site, str):
        roots.add(user_site)
    return tuple(sorted({os.path.join(os.path.realpath(r), "") for r in roots}))


def _under_library(path: str) -> bool:
    real = os.path.realpath(path)
    return any(real.startswith(root) for root in _library_roots())


def module_source_path(module: types.ModuleType) -> str | None:
    """The source file of `module`, or None for builtin, frozen and extension-only modules."""
    path = getattr(module, "__file__", None)
    if not isinstance(path, str):
        return None
    if path.endswith((".pyc", ".pyo")):
        source = importlib.util.source_from_cache(path) if "__pycache__" in path else path[:-1]
        return source if os.path.exists(source) else path
    return path


def is_local_module(module: types.ModuleType) -> bool:
    """A module of the user's own (a .py file outside the interpreter's library trees)."""
    if module.__name__ == "__main__":
        return False
    path = module_source_path(module)
    return path is not None and path.endswith(".py") and not _under_library(path)


def local_modules(modules: Iterable[types.ModuleType] | None = None) -> dict[str, types.ModuleType]:
    """The loaded local modules, by name."""
    found = {}
    for module in list(sys.modules.values()) if modules is None else modules:
        if isinstance(module, types.ModuleType) and is_local_module(module):
            found[module.__name__] = module
    return found


def module_identity(module: types.ModuleType) -> str:
    """A stable label of what `module` is: ``src|<digest>``, ``dist|<name>|<version>`` or ``std|<py>|<name>``."""
    if is_local_module(module):
        path = module_source_path(module)
        assert path is not None
        return f"src|{file_digest(path) or 'missing'}"
    top = module.__name__.split(".", 1)[0]
    dist = _distribution(top)
    if dist is not None:
        return f"dist|{dist[0]}|{dist[1]}|{module.__name__}"
    return f"std|{sys.version_info[0]}.{sys.version_info[1]}|{module.__name__}"


@functools.lru_cache(maxsize=512)
def _distribution(top: str) -> tuple[str, str] | None:
    import importlib.metadata

    names = importlib.metadata.packages_distributions().get(top)
    if not names:
        return None
    try:
        return names[0], importlib.metadata.version(names[0])
    except importlib.metadata.PackageNotFoundError:
        return None
