"""What a module is: a local one by the digest of its source file, an installed one by
its distribution and version, a standard-library one by the Python version.

A notebook that imports `helpers.py` from its folder depends on that file's
bytes: editing it must change the key of every cell that uses it, although the
module's name stays the same. Modules under the interpreter's library roots are
keyed by what is installed, which is what a backpack's environment pins.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
import types
from collections.abc import Iterable, Mapping

from nbrewind.identity.files import file_digest


__all__ = ["distribution_version", "is_local_module", "library_kind", "library_label", "module_source_path", "source_digest"]


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(installed-package directories, standard-library directories), real paths ending in a separator.

    Both the interpreter's own scheme and its base installation's (a venv's base
    Python), plus ``site``'s directories and the user site.
    """
    import site

    sites: set[str] = set()
    stdlib: set[str] = set()
    for scheme_vars in ({}, {"base": sys.base_prefix, "platbase": sys.base_prefix}):
        paths = sysconfig.get_paths(vars=scheme_vars)
        sites.update(paths[k] for k in ("purelib", "platlib") if paths.get(k))
        stdlib.update(paths[k] for k in ("stdlib", "platstdlib") if paths.get(k))
    sites.update(site.getsitepackages())
    user_site = site.getusersitepackages()
    if isinstance(user_site, str):
        sites.add(user_site)

    def norm(ps: Iterable[str]) -> tuple[str, ...]:
        return tuple(sorted({os.path.join(os.path.realpath(p), "") for p in ps if p}))

    return norm(sites), norm(stdlib)


def library_kind(path: str) -> str | None:
    """``"installed"`` for a file of an installed distribution, ``"stdlib"`` for the standard
    library, None for anything else (the user's own code).

    Installed-package directories are checked first: they usually sit inside the
    standard library's directory. Any ``site-packages`` or ``dist-packages``
    directory counts as installed, also one outside this interpreter's roots.
    """
    real = _realpath(path)
    sites, stdlib = _library_roots()
    parts = real.split(os.sep)
    if real.startswith(sites) or "site-packages" in parts or "dist-packages" in parts:
        return "installed"
    if real.startswith(stdlib):
        return "stdlib"
    return None


def _realpath(path: str) -> str:
    # A module's directory is shared by its siblings: resolving it once (and the file
    # itself only when it is a link) costs one lstat per module instead of one per part.
    head, tail = os.path.split(os.path.abspath(path))
    if not tail or os.path.islink(path):
        return os.path.realpath(path)
    return os.path.join(_real_directory(head), tail)


@functools.lru_cache(maxsize=4096)
def _real_directory(path: str) -> str:
    return os.path.realpath(path)


@functools.lru_cache(maxsize=16384)
def _under_library(path: str) -> bool:
    # Cached: every cell asks this for every loaded module, and realpath costs syscalls.
    return library_kind(path) is not None


def module_source_path(module: types.ModuleType) -> str | None:
    """The source file of `module`, or None for builtin, frozen and extension-only modules."""
    path = getattr(module, "__file__", None)
    if not isinstance(path, str):
        return None
    if path.endswith((".pyc", ".pyo")):
        source = importlib.util.source_from_cache(path) if "__pycache__" in path else path[:-1]
        return source if os.path.exists(source) else path
    return path


def source_digest(path: str) -> str | None:
    """The digest of the file a module at ``path`` was loaded from: the source file itself,
    or, for a module inside an archive on ``sys.path`` (``lib.zip/pkg/mod.py``), the whole
    archive's; None where neither is a regular file."""
    digest = file_digest(path)
    if digest is not None:
        return digest
    head = os.path.abspath(path)
    while True:
        parent = os.path.dirname(head)
        if parent == head or os.path.isdir(parent):
            return None
        head = parent
        digest = file_digest(head)
        if digest is not None:
            return "archive|" + digest


def is_local_module(module: types.ModuleType) -> bool:
    """A module of the user's own: a .py file, or an extension module built in place (a
    ``.so`` or ``.pyd`` from Cython's ``build_ext --inplace``), outside the interpreter's
    library trees.

    An editable install (``pip install -e``) is the user's own too: a distribution
    provides it, but its files are the ones being edited, and its version does not
    change when they do. NBRewind's own modules are not: they are the tool, not
    the notebook's code."""
    name = module.__name__
    if name == "__main__":
        return False
    raw = getattr(module, "__file__", None)
    if not isinstance(raw, str):
        return False
    return _is_local(name, raw)


@functools.lru_cache(maxsize=16384)
def _is_local(name: str, raw_path: str) -> bool:
    path = raw_path
    if path.endswith((".pyc", ".pyo")):
        source = importlib.util.source_from_cache(path) if "__pycache__" in path else path[:-1]
        path = source if os.path.exists(source) else path
    if not path.endswith((".py", *importlib.machinery.EXTENSION_SUFFIXES)) or _under_library(path):
        return False
    return name.split(".", 1)[0] != "nbrewind"


def local_modules(modules: Iterable[types.ModuleType] | None = None) -> dict[str, types.ModuleType]:
    """The loaded local modules, by name (every cell asks: the answer is reused while
    sys.modules holds the same names)."""
    global _last_scan
    if modules is None:
        names = tuple(sys.modules)
        if _last_scan is not None and _last_scan[0] == names:
            return {n: m for n, m in _last_scan[1].items() if sys.modules.get(n) is m}
    found = {}
    for module in list(sys.modules.values()) if modules is None else modules:
        if isinstance(module, types.ModuleType) and is_local_module(module):
            found[module.__name__] = module
    if modules is None:
        _last_scan = (names, dict(found))
    return found


_last_scan: tuple[tuple[str, ...], dict[str, types.ModuleType]] | None = None


def library_label(module: types.ModuleType) -> str | None:
    """What a library module is, as a stable label: ``<distribution>==<version>`` for an
    installed one, ``python==<x.y.z>`` for the standard library and builtins; None for the
    user's own code (the notebook, a local module), which callers key by content."""
    python = "python==" + ".".join(map(str, sys.version_info[:3]))
    name = module.__name__
    if name == "__main__":
        return None
    if name.partition(".")[0] == "nbrewind":
        # NBRewind's own functions (`publish` in a task) are library code wherever it is
        # installed from: keyed by content they read its globals (a ContextVar) and are refused.
        return f"nbrewind=={distribution_version('nbrewind')}"
    file = getattr(module, "__file__", None)
    if not isinstance(file, str):
        spec = getattr(module, "__spec__", None)
        if name in sys.builtin_module_names or getattr(spec, "origin", None) in ("built-in", "frozen"):
            return python
        return None
    kind = library_kind(file)
    if kind == "installed":
        top = name.partition(".")[0]
        return f"{top}=={distribution_version(top)}"
    return python if kind == "stdlib" else None


@functools.lru_cache(maxsize=1)
def _packages_distributions() -> Mapping[str, list[str]]:
    import importlib.metadata

    return importlib.metadata.packages_distributions()


@functools.lru_cache(maxsize=512)
def _distribution(top: str) -> tuple[str, str] | None:
    """(distribution name, version) of the distribution that provides import package ``top``."""
    import importlib.metadata as md

    def version_of(dist: str) -> str | None:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    # The import name usually is the distribution name; the full map costs ~0.4 s to build.
    version = version_of(top)
    if version is not None:
        return top, version
    for dist in _packages_distributions().get(top, []):
        version = version_of(dist)
        if version is not None:
            return dist, version
    return None


def distribution_version(top: str) -> str:
    """The installed version of import package ``top``: its distribution's, else its
    ``__version__``, else ``""``."""
    dist = _distribution(top)
    if dist is not None:
        return dist[1]
    return str(getattr(sys.modules.get(top), "__version__", ""))
