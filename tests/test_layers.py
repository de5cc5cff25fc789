"""The import directions of DESIGN.md hold: each layer imports only the layers below it
(identity, below checkpoint and tasks, imports only store), IPython/ipykernel only under
kernels/ (and session, for typing), dask only under tasks/ (lazily), and importing any
module has no side effects we can see."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "nbrewind"

# package -> nbrewind packages it must not import
FORBIDDEN = {
    "store": {"analysis", "checkpoint", "tasks", "session", "kernels", "pack", "cli"},
    "analysis": {"store", "checkpoint", "tasks", "session", "kernels", "pack", "cli"},
    "identity": {"analysis", "checkpoint", "tasks", "session", "kernels", "pack", "cli"},
    "checkpoint": {"tasks", "session", "kernels", "pack", "cli"},
    "tasks": {"checkpoint", "session", "kernels", "pack", "cli"},
    "session": {"kernels", "pack", "cli"},
    "pack": {"analysis", "checkpoint", "tasks", "session", "kernels"},
}
EVERYONE_MAY_IMPORT = {"errors", "_version"}


def _imports(path: Path, source: str | None = None) -> list[tuple[int, str, bool]]:
    """(line, module, at module level) for every import in `path`, relative ones resolved."""
    parts = path.relative_to(ROOT).parts
    tree = ast.parse(path.read_text() if source is None else source)
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.level:
                package = ["nbrewind", *parts[:-1]]
                names = [".".join(package[: len(package) - node.level + 1] + [node.module])]
            else:
                names = [node.module]
        found.extend((node.lineno, name, id(node) in top_level) for name in names)
    return found


def _modules() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def _violations(path: Path, source: str | None = None) -> list[str]:
    layer = path.relative_to(ROOT).parts[0].removesuffix(".py")
    problems = []
    for line, module, top in _imports(path, source):
        bits = module.split(".")
        if bits[0] == "nbrewind" and len(bits) > 1 and bits[1] in FORBIDDEN.get(layer, set()):
            problems.append(f"line {line}: {layer} imports {module}")
        if bits[0] in ("IPython", "ipykernel") and layer not in ("kernels", "session"):
            problems.append(f"line {line}: IPython/ipykernel outside kernels/: {module}")
        if bits[0] in ("dask", "distributed") and (layer != "tasks" or top):
            problems.append(f"line {line}: dask imported {'at module level' if layer == 'tasks' else 'outside tasks/'}: {module}")
    return problems


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path: Path) -> None:
    problems = _violations(path)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("where", "source"),
    [
        ("store/objects.py", "from nbrewind.session import Session"),
        ("store/objects.py", "from ..checkpoint import values"),
        ("checkpoint/values.py", "import IPython"),
        ("tasks/fingerprint.py", "import dask"),
        ("identity/code.py", "from nbrewind.tasks.fingerprint import Fingerprinter"),
        ("analysis/effects.py", "def f():\n    import distributed"),
    ],
)
def test_the_checker_sees_a_violation(where: str, source: str) -> None:
    """Guard against a checker that passes everything."""
    assert _violations(ROOT / where, source)


def test_importing_every_module_changes_nothing() -> None:
    """Import all modules in a fresh interpreter: no audit hook, no patched client, no dask loaded."""
    code = (
        "import sys, pkgutil, importlib, nbrewind\n"
        "hooks_before = sys.getrecursionlimit()\n"
        "for m in pkgutil.walk_packages(nbrewind.__path__, 'nbrewind.'):\n"
        "    if m.name.endswith('__main__'): continue\n"
        "    importlib.import_module(m.name)\n"
        "print('dask' in sys.modules, 'distributed' in sys.modules, 'numpy' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    dask_loaded, distributed_loaded, numpy_loaded = out.stdout.split()
    assert (dask_loaded, distributed_loaded, numpy_loaded) == ("False", "False", "False"), out.stdout
