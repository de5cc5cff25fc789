"""The import contract of DESIGN.md ("The parts and which way they may import"), checked.

Allowed directions: ``kernels -> session -> {checkpoint, tasks, analysis} -> identity ->
store``; ``cli -> {pack, store, kernelspec}``; ``pack -> store``. Nothing imports
``kernels``; ``store`` and ``analysis`` import no other nbrewind package; ``checkpoint``
and ``tasks`` do not import each other; IPython/ipykernel only under ``kernels/`` (and
session typing); dask only under ``tasks/``, imported lazily. Importing any module has no
side effects.

Static part: every file under nbrewind/ is parsed and each import is resolved to the
module it loads (``from nbrewind import tasks`` and ``from .. import x`` to the submodule
when there is one) and classified by when it runs: at import time (module body, class
bodies, module-level ``try``/``if``/``with``), lazily (only inside a function body), or
never (the body of ``if TYPE_CHECKING:``). Every top-level module or package of nbrewind/
has a rule in ``RULES``; a new one fails the test until it is given one.

Runtime part: importing every module in a fresh interpreter leaves the import system,
audit hooks, trace hooks, the ``random`` state, the environment, threads and the rest of
``_probe`` as they were, and loads none of the heavy libraries.

Proof: seeded violations, fed through the same functions as the real files, are all
caught, and legal imports pass.
"""

from __future__ import annotations

import ast
import enum
import inspect
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent / "nbrewind"
PACKAGE = ROOT.name

# The unit name of the package root, nbrewind/__init__.py (as an import target: `nbrewind`).
ROOT_UNIT = "__init__"


class When(enum.Enum):
    """When an import statement runs; laziness rules depend on it."""

    IMPORT_TIME = "at import time"
    LAZY = "inside a function body"
    TYPING = "under TYPE_CHECKING"


ANY_TIME = frozenset(When)
NOT_AT_IMPORT = frozenset({When.LAZY, When.TYPING})
TYPING_ONLY = frozenset({When.TYPING})


@dataclass(frozen=True)
class Import:
    """One import in a file: its line, the absolute module it loads, and when it runs."""

    line: int
    module: str
    when: When


@dataclass(frozen=True)
class Rule:
    """Which other top-level units of nbrewind one unit may import (its own is always allowed).

    ``lazily`` lists units it may import only where the import does not run at import time.
    """

    may_import: frozenset[str]
    why: str
    lazily: frozenset[str] = frozenset()


@dataclass(frozen=True)
class External:
    """Where a third-party package may be imported: unit (or ``"*"`` for any) -> when."""

    allowed: Mapping[str, frozenset[When]]
    why: str


# Modules, not packages: DESIGN.md's "imports no other nbrewind package" leaves them to all.
COMMON = frozenset({"errors", "_version"})

# DESIGN.md's chain, top to bottom; a layer may import the layers below it.
CHAIN: tuple[frozenset[str], ...] = (
    frozenset({"kernels"}),
    frozenset({"session"}),
    frozenset({"checkpoint", "tasks", "analysis"}),
    frozenset({"identity"}),
    frozenset({"store"}),
)

RULES: dict[str, Rule] = {
    "store": Rule(COMMON, "bottom of the chain; store imports no other nbrewind package"),
    "analysis": Rule(COMMON, "analysis imports no other nbrewind package"),
    "identity": Rule(COMMON | {"store"}, "identity -> store"),
    "checkpoint": Rule(COMMON | {"identity", "store"}, "-> identity -> store; checkpoint and tasks don't import each other"),
    "tasks": Rule(COMMON | {"identity", "store"}, "-> identity -> store; checkpoint and tasks don't import each other"),
    "session": Rule(COMMON | {"checkpoint", "tasks", "analysis", "identity", "store"}, "session -> the layers below"),
    "kernels": Rule(
        COMMON | {"session", "checkpoint", "tasks", "analysis", "identity", "store"},
        "kernels -> session -> ...; nothing imports kernels",
    ),
    "pack": Rule(COMMON | {"store"}, "pack -> store"),
    "cli": Rule(COMMON | {"pack", "store", "kernelspec"}, "cli -> {pack, store, kernelspec}"),
    "kernelspec": Rule(COMMON, "not in DESIGN.md's chain: it writes kernel.json files and needs no other layer"),
    "run": Rule(COMMON, "not in DESIGN.md's chain: runs a notebook through nbclient, needs no other layer"),
    "demo": Rule(COMMON | {"run", "store"}, "not in DESIGN.md's chain: runs the bundled notebook and reads its log"),
    "errors": Rule(frozenset(), "every layer may import it, so it imports nothing from nbrewind"),
    "_version": Rule(frozenset(), "every layer may import it, so it imports nothing from nbrewind"),
    ROOT_UNIT: Rule(
        frozenset({"_version", "checkpoint"}),
        "the root is imported before any module, so task code can `import nbrewind` cheaply;"
        " the task API (nbrewind.checkpoint(), resume, prioritize) reaches tasks on first use",
        lazily=frozenset({"tasks"}),
    ),
}

# Files that are on the start-up path of every `import nbrewind...`: the only nbrewind
# modules they may import at import time (the root docstring: "loads only the (empty)
# checkpoint subpackage").
LIGHT_FILES: dict[str, frozenset[str]] = {
    "__init__.py": frozenset({f"{PACKAGE}._version", f"{PACKAGE}.checkpoint"}),
    "checkpoint/__init__.py": frozenset(),
    "_version.py": frozenset(),
}

# Imports the current code makes that a rule of DESIGN.md does not allow: (file, unit) -> why.
# Each entry must still be needed (test_every_known_deviation_is_still_needed); remove it
# when the code or DESIGN.md changes.
KNOWN_DEVIATIONS: dict[tuple[str, str], str] = {
    ("cli/kernel_commands.py", "run"): "`jupyter nbrewind run`; DESIGN.md's cli -> {pack, store, kernelspec} does not list run",
    ("cli/__init__.py", "run"): "main() exits 2 on run's RunInputError; DESIGN.md's cli -> {pack, store, kernelspec} does not list run",
    ("cli/kernel_commands.py", "demo"): "`jupyter nbrewind demo`; DESIGN.md's cli -> {pack, store, kernelspec} does not list demo",
}

_IPYTHON = External(
    {"kernels": ANY_TIME, "session": TYPING_ONLY},
    "IPython/ipykernel only under kernels/ (session: for typing)",
)
_DASK = External({"tasks": NOT_AT_IMPORT}, "dask only under tasks/, imported lazily")
_HEAVY = External({"*": NOT_AT_IMPORT}, "heavy: never imported at import time (workers and the kernel start fast)")
EXTERNAL: dict[str, External] = {
    "IPython": _IPYTHON,
    "ipykernel": _IPYTHON,
    "dask": _DASK,
    "distributed": _DASK,
    "numpy": _HEAVY,
    "pandas": _HEAVY,
    # DESIGN.md: `import nbformat` takes about 4 s; keep it out of the kernel's hot path.
    "nbformat": _HEAVY,
    "nbclient": _HEAVY,
}


# --- the checker ---------------------------------------------------------------------


def _module_name(path: Path) -> list[str]:
    """Dotted name of the module in `path` (under ROOT), as parts: nbrewind/a/b.py -> [nbrewind, a, b]."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return [PACKAGE, *parts]


def _package_of(path: Path) -> list[str]:
    """The package relative imports in `path` start from (the module itself for an __init__.py)."""
    name = _module_name(path)
    return name if path.name == "__init__.py" else name[:-1]


def _is_submodule(dotted: str) -> bool:
    """Whether `dotted` names a module or package file under nbrewind/ (not an attribute)."""
    parts = dotted.split(".")
    if parts[0] != PACKAGE:
        return False
    base = ROOT.joinpath(*parts[1:])
    return base.is_dir() or base.with_suffix(".py").is_file()


def unit_of_file(path: Path) -> str:
    """The top-level unit a file belongs to: nbrewind/run.py -> run, nbrewind/store/x.py -> store."""
    parts = path.relative_to(ROOT).parts
    return parts[0].removesuffix(".py") if len(parts) > 1 or parts[0] != "__init__.py" else ROOT_UNIT


def unit_of_module(module: str) -> str | None:
    """The top-level unit an absolute module name lands in, or None if it is not nbrewind's."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    return parts[1] if len(parts) > 1 else ROOT_UNIT


def _show(unit: str) -> str:
    """A unit's name in a report (the root's file name says little)."""
    return f"{PACKAGE} (the package root)" if unit == ROOT_UNIT else unit


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Collector(ast.NodeVisitor):
    """Collects every import of one file, resolved to absolute module names, with when it runs."""

    def __init__(self, package: list[str]) -> None:
        self.package = package
        self.when = When.IMPORT_TIME
        self.found: list[Import] = []
        self.problems: list[str] = []

    def _inside(self, nodes: list[Any], when: When) -> None:
        # TYPING beats LAZY beats IMPORT_TIME: a def under TYPE_CHECKING still never runs.
        order = [When.IMPORT_TIME, When.LAZY, When.TYPING]
        saved = self.when
        self.when = max(saved, when, key=order.index)
        for node in nodes:
            self.visit(node)
        self.when = saved

    def _add(self, line: int, module: str) -> None:
        self.found.append(Import(line, module, self.when))

    def _base(self, line: int, level: int, module: str | None) -> str | None:
        """Absolute name of `from <level dots><module> import ...`, or None (and a problem)."""
        if not level:
            return module
        keep = len(self.package) - (level - 1)
        if keep < 1:
            self.problems.append(f"line {line}: relative import goes above {PACKAGE}/")
            return None
        return ".".join(self.package[:keep] + ([module] if module else []))

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        # Decorators, defaults and annotations run when the def runs; only the body is lazy.
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.visit(node.args)
        if node.returns is not None:
            self.visit(node.returns)
        self._inside(node.body, When.LAZY)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.visit(node.args)
        self._inside([node.body], When.LAZY)

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self._inside(node.body, When.TYPING)
            for child in node.orelse:  # the else branch runs
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(node.lineno, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = self._base(node.lineno, node.level, node.module)
        if base is None:
            return
        for alias in node.names:
            candidate = f"{base}.{alias.name}"
            self._add(node.lineno, candidate if alias.name != "*" and _is_submodule(candidate) else base)

    def visit_Call(self, node: ast.Call) -> None:
        # importlib.import_module("literal") and __import__("literal") import as surely as a statement.
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in ("import_module", "__import__") and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                target = first.value
                level = len(target) - len(target.lstrip("."))
                base = self._base(node.lineno, level, target.lstrip(".") or None)
                if base is not None:
                    self._add(node.lineno, base)
        self.generic_visit(node)


def imports_of(path: Path, source: str | None = None) -> tuple[list[Import], list[str]]:
    """Every import in `path` (read from disk unless `source` is given), and resolution problems."""
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    collector = _Collector(_package_of(path))
    collector.visit(tree)
    return collector.found, collector.problems


def violations(path: Path, source: str | None = None) -> list[str]:
    """Every breach of RULES, LIGHT_FILES and EXTERNAL in `path` (or in `source` attributed to it)."""
    rel = path.relative_to(ROOT).as_posix()
    unit = unit_of_file(path)
    found, problems = imports_of(path, source)
    rule = RULES.get(unit)
    if rule is None:
        problems.append(f"{unit!r} is a top-level module of {PACKAGE}/ with no rule in RULES")
    light = LIGHT_FILES.get(rel)
    for imp in found:
        at = f"line {imp.line}: {imp.module} {imp.when.value}"
        target = unit_of_module(imp.module)
        if target is not None:
            if light is not None and imp.when is When.IMPORT_TIME and imp.module not in light:
                problems.append(f"{at}: {rel} is loaded by every `import {PACKAGE}`, it may load only {sorted(light)}")
            if rule is None or target == unit:
                continue
            if target not in RULES:
                problems.append(f"{at}: no top-level module {target!r} with a rule")
            elif target in rule.may_import or (rel, target) in KNOWN_DEVIATIONS:
                continue
            elif target in rule.lazily:
                if imp.when is When.IMPORT_TIME:
                    problems.append(f"{at}: {_show(unit)} may import {target} only inside a function body")
            else:
                problems.append(f"{at}: {_show(unit)} may not import {_show(target)} ({rule.why})")
            continue
        external = EXTERNAL.get(imp.module.split(".")[0])
        if external is None:
            continue
        allowed = external.allowed.get(unit, external.allowed.get("*"))
        if allowed is None:
            problems.append(f"{at}: not allowed in {unit} ({external.why})")
        elif imp.when not in allowed:
            problems.append(f"{at}: in {unit} only {', '.join(sorted(w.value for w in allowed))} ({external.why})")
    return problems


def _files() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def _units_on_disk() -> set[str]:
    """Top-level modules and packages of nbrewind/ (a directory counts if it holds Python)."""
    return {unit_of_file(p) for p in _files()}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# --- the real tree -------------------------------------------------------------------


@pytest.mark.parametrize("path", _files(), ids=_rel)
def test_imports_follow_the_rules(path: Path) -> None:
    problems = violations(path)
    assert not problems, f"{_rel(path)}:\n" + "\n".join(problems)


def test_every_top_level_module_has_a_rule() -> None:
    """A new top-level module needs a rule before it can import or be imported; a removed one loses it."""
    on_disk = _units_on_disk()
    assert not on_disk - RULES.keys(), f"give these a rule in RULES (see DESIGN.md): {sorted(on_disk - RULES.keys())}"
    assert not RULES.keys() - on_disk, f"rules for modules that no longer exist: {sorted(RULES.keys() - on_disk)}"
    for unit, rule in RULES.items():
        unknown = (rule.may_import | rule.lazily) - RULES.keys()
        assert not unknown, f"{unit}'s rule names units that have no rule: {sorted(unknown)}"


def test_every_known_deviation_is_still_needed() -> None:
    """An allow-list entry whose import is gone must be removed (like a strict xfail)."""
    for (rel, target), why in KNOWN_DEVIATIONS.items():
        path = ROOT / rel
        assert path.is_file(), f"KNOWN_DEVIATIONS names {rel}, which does not exist"
        rule = RULES[unit_of_file(path)]
        assert target not in rule.may_import | rule.lazily, f"{rel} -> {target} is allowed by RULES anyway"
        found, _ = imports_of(path)
        assert any(unit_of_module(i.module) == target for i in found), f"{rel} no longer imports {target}: {why}"


def test_the_rules_say_what_the_design_says() -> None:
    """RULES cannot drift looser than DESIGN.md's statements without this test failing."""
    packages = RULES.keys() - COMMON - {ROOT_UNIT}

    def deviations(unit: str) -> set[str]:
        return {target for (rel, target) in KNOWN_DEVIATIONS if unit_of_file(ROOT / rel) == unit}

    def nbrewind_imports(unit: str) -> frozenset[str]:
        rule = RULES[unit]
        return (rule.may_import | rule.lazily | deviations(unit)) - COMMON

    for depth, layer in enumerate(CHAIN):
        below = frozenset().union(*CHAIN[depth + 1 :])
        for unit in layer:
            assert nbrewind_imports(unit) <= below, f"{unit} may import something not below it in the chain"
    for unit in ("store", "analysis"):
        assert not nbrewind_imports(unit) & packages, f"{unit} imports no other nbrewind package"
    assert not any("kernels" in nbrewind_imports(u) for u in RULES if u != "kernels"), "nothing imports kernels"
    assert "tasks" not in nbrewind_imports("checkpoint") and "checkpoint" not in nbrewind_imports("tasks")
    assert nbrewind_imports("pack") <= {"store"}
    assert nbrewind_imports("cli") - deviations("cli") <= {"pack", "store", "kernelspec"}
    assert all(not RULES[unit].may_import for unit in COMMON), "errors and _version import nothing from nbrewind"
    assert EXTERNAL["dask"].allowed == EXTERNAL["distributed"].allowed == {"tasks": NOT_AT_IMPORT}
    assert set(EXTERNAL["IPython"].allowed) == set(EXTERNAL["ipykernel"].allowed) == {"kernels", "session"}
    assert EXTERNAL["IPython"].allowed["session"] == TYPING_ONLY
    assert EXTERNAL["numpy"].allowed == {"*": NOT_AT_IMPORT}


# --- proof that the checker catches what it should -----------------------------------

# (fake file under nbrewind/, source, a fragment the report must contain)
SEEDED_VIOLATIONS: list[tuple[str, str, str]] = [
    ("store/seeded.py", "from nbrewind import tasks", "nbrewind.tasks"),
    ("store/seeded.py", "from .. import session", "nbrewind.session"),
    ("store/seeded.py", "from ... import session", "above nbrewind/"),
    ("store/seeded.py", "import nbrewind", "store may not import nbrewind (the package root)"),
    ("store/seeded.py", "from nbrewind.ghost import thing", "no top-level module 'ghost'"),
    ("store/seeded.py", "import importlib\nimportlib.import_module('nbrewind.session.core')", "nbrewind.session.core"),
    ("analysis/seeded.py", "from ..identity import values", "analysis may not import identity"),
    ("identity/seeded.py", "import nbrewind.analysis.effects", "identity may not import analysis"),
    ("checkpoint/seeded.py", "from nbrewind.tasks.cache import TaskCache", "checkpoint may not import tasks"),
    ("tasks/seeded.py", "from ..checkpoint.values import stage_group", "tasks may not import checkpoint"),
    ("tasks/fingerprint/seeded.py", "from ... import analysis", "tasks may not import analysis"),
    ("session/seeded.py", "from nbrewind.kernels.base import NbrewindKernel", "session may not import kernels"),
    ("pack/seeded.py", "from nbrewind.identity import code", "pack may not import identity"),
    ("cli/seeded.py", "from nbrewind.session import Session", "cli may not import session"),
    ("run.py", "def main():\n    from nbrewind import pack", "run may not import pack"),
    ("demo.py", "from nbrewind.kernels import audit", "demo may not import kernels"),
    ("errors.py", "from nbrewind.store import Store", "errors may not import store"),
    ("newlayer.py", "import os", "'newlayer' is a top-level module of nbrewind/ with no rule"),
    ("__init__.py", "from nbrewind.store import Store", "loaded by every `import nbrewind`"),
    ("__init__.py", "from nbrewind.tasks.resume import checkpoint", "root) may import tasks only inside a function body"),
    ("checkpoint/__init__.py", "from nbrewind.checkpoint.values import stage_group", "loaded by every `import nbrewind`"),
    ("tasks/seeded.py", "import dask", "dask at import time"),
    ("tasks/seeded.py", "try:\n    import dask\nexcept ImportError:\n    dask = None", "dask at import time"),
    ("tasks/seeded.py", "import sys\nif sys.version_info >= (3, 11):\n    from distributed import Client", "distributed at import time"),
    ("tasks/seeded.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\nelse:\n    import dask", "dask at import time"),
    ("tasks/seeded.py", "class C:\n    import distributed.client", "distributed.client at import time"),
    ("tasks/seeded.py", "def f(m=__import__('dask')):\n    return m", "dask at import time"),
    ("checkpoint/seeded.py", "def f():\n    import dask.array", "not allowed in checkpoint"),
    ("identity/seeded.py", "import numpy as np", "numpy at import time"),
    ("store/seeded.py", "with open('x') as f:\n    import pandas", "pandas at import time"),
    ("run.py", "import nbformat", "nbformat at import time"),
    ("checkpoint/seeded.py", "import IPython", "not allowed in checkpoint"),
    ("session/seeded.py", "def f():\n    from ipykernel.ipkernel import IPythonKernel", "body: in session only under"),
    ("session/seeded.py", "from IPython.core.interactiveshell import InteractiveShell", "in session only under TYPE_CHECKING"),
]

# (fake file under nbrewind/, source): imports the rules allow
LEGAL_IMPORTS: list[tuple[str, str]] = [
    ("store/seeded.py", "from nbrewind.errors import StoreError\nfrom . import frame\nfrom .objects import ObjectStore"),
    ("store/seeded.py", "from nbrewind._version import __version__\nimport os, json"),
    ("checkpoint/seeded.py", "from ..identity import values\nfrom nbrewind.store import ObjectStore"),
    ("tasks/fingerprint/seeded.py", "from .. import cache\nfrom ...identity.code import code_info"),
    ("tasks/seeded.py", "def f():\n    import dask\n    from distributed import Client"),
    ("tasks/seeded.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from distributed import Client"),
    ("session/seeded.py", "import typing\nif typing.TYPE_CHECKING:\n    from IPython import InteractiveShell"),
    ("session/seeded.py", "from nbrewind import analysis, checkpoint, identity, store, tasks"),
    ("kernels/seeded.py", "from ipykernel.ipkernel import IPythonKernel\nfrom nbrewind.session import Session"),
    ("identity/seeded.py", "def digest(x):\n    import numpy\n    return numpy.asarray(x)"),
    ("pack/seeded.py", "from nbrewind.store.origin import record_trust"),
    ("cli/seeded.py", "def main():\n    from nbrewind.pack import pack\n    from nbrewind import kernelspec"),
    ("__init__.py", "from nbrewind import checkpoint\ndef f():\n    from nbrewind.tasks.resume import checkpoint"),
    ("demo.py", "from nbrewind.run import run_notebook\ndef f():\n    import nbformat"),
]


def test_the_checker_catches_every_seeded_violation() -> None:
    """Each seeded breach of the rules is reported, with the right reason; none slips through."""
    assert len(SEEDED_VIOLATIONS) >= 10
    missed = []
    for rel, source, fragment in SEEDED_VIOLATIONS:
        problems = violations(ROOT / rel, source)
        if not any(fragment in problem for problem in problems):
            missed.append(f"{rel}: {source!r} -> {problems}")
    assert not missed, f"{len(missed)} of {len(SEEDED_VIOLATIONS)} seeded violations missed:\n" + "\n".join(missed)


@pytest.mark.parametrize(("rel", "source"), LEGAL_IMPORTS, ids=[f"{r}-{i}" for i, (r, _) in enumerate(LEGAL_IMPORTS)])
def test_the_checker_passes_legal_imports(rel: str, source: str) -> None:
    assert violations(ROOT / rel, source) == []


@pytest.mark.parametrize(
    ("rel", "source", "expected"),
    [
        ("store/objects.py", "from nbrewind import tasks", f"{PACKAGE}.tasks"),
        ("store/objects.py", "from nbrewind.store import Store", f"{PACKAGE}.store"),
        ("store/objects.py", "from nbrewind.store import frame", f"{PACKAGE}.store.frame"),
        ("store/objects.py", "from . import frame", f"{PACKAGE}.store.frame"),
        ("store/__init__.py", "from . import frame", f"{PACKAGE}.store.frame"),
        ("store/objects.py", "from .. import session", f"{PACKAGE}.session"),
        ("store/objects.py", "from .. import __version__", PACKAGE),
        ("tasks/fingerprint/graph.py", "from ...checkpoint.values import x", f"{PACKAGE}.checkpoint.values"),
        ("tasks/fingerprint/__init__.py", "from .. import cache", f"{PACKAGE}.tasks.cache"),
        ("cli.py", "from . import pack", f"{PACKAGE}.pack"),
        ("cli.py", "import importlib\nimportlib.import_module('.run', __package__)", f"{PACKAGE}.run"),
    ],
)
def test_imports_resolve_to_the_module_they_load(rel: str, source: str, expected: str) -> None:
    found, problems = imports_of(ROOT / rel, source)
    assert not problems
    assert [i.module for i in found if i.module.startswith(PACKAGE)] == [expected]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import a", When.IMPORT_TIME),
        ("try:\n    import a\nexcept ImportError:\n    pass", When.IMPORT_TIME),
        ("if X:\n    import a", When.IMPORT_TIME),
        ("class C:\n    import a", When.IMPORT_TIME),
        ("for _ in ():\n    import a", When.IMPORT_TIME),
        ("@__import__('a').deco\ndef f():\n    pass", When.IMPORT_TIME),
        ("def f():\n    import a", When.LAZY),
        ("class C:\n    def m(self):\n        if X:\n            import a", When.LAZY),
        ("async def f():\n    import a", When.LAZY),
        ("f = lambda: __import__('a')", When.LAZY),
        ("if TYPE_CHECKING:\n    import a", When.TYPING),
        ("if typing.TYPE_CHECKING:\n    def f():\n        import a", When.TYPING),
        ("if TYPE_CHECKING:\n    pass\nelse:\n    import a", When.IMPORT_TIME),
    ],
)
def test_only_function_bodies_are_lazy(source: str, expected: When) -> None:
    found, _ = imports_of(ROOT / "store" / "seeded.py", source)
    assert [(i.module, i.when) for i in found] == [("a", expected)]


# --- importing has no side effects ---------------------------------------------------

HEAVY = ("dask", "distributed", "numpy", "pandas", "nbformat", "nbclient", "matplotlib")

# Audit events (prefixes) that are side effects when they happen during an import.
SIDE_EFFECT_EVENTS = (
    *("sys.addaudithook", "sys.settrace", "sys.setprofile", "_thread.start_new_thread"),
    *("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.kill"),
    *("os.putenv", "os.unsetenv", "os.chdir", "os.mkdir", "os.remove", "os.rename", "os.rmdir", "os.symlink"),
    *("os.link", "os.truncate", "os.chmod", "os.chown", "os.utime", "shutil.", "tempfile.mkstemp", "tempfile.mkdtemp"),
    *("socket.connect", "socket.bind", "socket.sendto", "sqlite3.connect", "urllib.Request", "http.client.connect"),
    *("webbrowser.open", "signal.pthread_kill"),
)


def _probe(
    modules: list[str], dependencies: list[str], heavy: list[str], side_effect_events: list[str]
) -> dict[str, Any]:
    """Run in a fresh interpreter: import `modules` one by one and report what each changed.

    Self-contained (the subprocess gets only this function's source). An audit hook is
    installed before anything else, so `sys.addaudithook` calls (and other side-effecting
    audit events) made while importing are seen even though hooks cannot be listed.
    The third-party and standard modules nbrewind imports at import time are imported
    first, outside the comparison: what IPython does when it is imported (it adds a
    warnings filter and atexit callbacks) is not a side effect of nbrewind's code.
    """
    import os  # both already loaded by the interpreter's start-up
    import sys

    importing = ["(start-up)"]
    events: list[str] = []
    watched = tuple(side_effect_events)
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            mode, flags = args[1], args[2]
            if not (any(c in mode for c in "wax+") if isinstance(mode, str) else flags & write_flags):
                return
        elif not event.startswith(watched):
            return
        events.append(f"{importing[-1]}: {event} {repr(args)[:200]}")

    sys.addaudithook(hook)

    import asyncio
    import atexit
    import builtins
    import contextvars
    import copyreg
    import decimal
    import faulthandler
    import gc
    import importlib
    import io
    import locale
    import logging
    import pathlib
    import pickle
    import random
    import shutil
    import signal
    import socket
    import sqlite3
    import subprocess
    import tempfile
    import threading
    import time
    import types
    import warnings

    watched_modules = [
        *(builtins, os, io, pickle, copyreg, subprocess, socket, threading, time, random, importlib, shutil),
        *(logging, warnings, signal, pathlib, types, contextvars, sqlite3, asyncio, tempfile, decimal, gc, atexit),
    ]

    def umask() -> int:
        mask = os.umask(0)
        os.umask(mask)
        return mask

    def signals() -> dict[str, Any]:
        handlers = {}
        for number in signal.valid_signals():
            try:
                handlers[str(number)] = signal.getsignal(number)
            except (OSError, ValueError):
                pass
        return handlers

    def snapshot() -> dict[str, tuple[str, Any]]:
        """name -> ("is" | "==", value): what must be the same object, or equal, after an import."""
        state: dict[str, tuple[str, Any]] = {
            "sys.meta_path": ("is", list(sys.meta_path)),
            "sys.path_hooks": ("is", list(sys.path_hooks)),
            "sys.path": ("==", list(sys.path)),
            "sys hooks": ("is", [sys.excepthook, sys.displayhook, sys.breakpointhook, sys.unraisablehook]),
            "trace/profile": ("is", [sys.gettrace(), sys.getprofile(), threading.gettrace(), threading.getprofile()]),
            "threading.excepthook": ("is", [threading.excepthook]),
            "std streams": ("is", [sys.stdin, sys.stdout, sys.stderr]),
            "sys limits": ("==", [sys.getrecursionlimit(), sys.getswitchinterval(), sys.get_int_max_str_digits()]),
            "sys async hooks": ("is", [*sys.get_asyncgen_hooks(), sys.get_coroutine_origin_tracking_depth()]),
            "asyncio policy": ("is", [getattr(asyncio.events, "_event_loop_policy", None)]),
            "random state": ("==", random.getstate()),
            "os.environ": ("==", dict(os.environ)),
            "cwd": ("==", os.getcwd()),
            "umask": ("==", umask()),
            "signal handlers": ("==", signals()),
            "threads": ("==", set(threading.enumerate())),
            "gc": ("==", [list(gc.callbacks), gc.isenabled(), gc.get_threshold()]),
            "atexit callbacks": ("==", atexit._ncallbacks()),
            "copyreg tables": ("==", [dict(copyreg.dispatch_table), dict(getattr(copyreg, "_extension_registry", {}))]),
            "logging": (
                "==",
                [
                    *(list(logging.root.handlers), logging.root.level, logging.root.manager.disable),
                    *(logging.getLoggerClass(), logging.getLogRecordFactory()),
                ],
            ),
            "warnings.filters": ("==", list(warnings.filters)),
            "faulthandler": ("==", faulthandler.is_enabled()),
            "socket timeout": ("==", socket.getdefaulttimeout()),
            "locale": ("==", locale.setlocale(locale.LC_ALL)),
            "decimal context": ("==", repr(decimal.getcontext())),
            "heavy modules loaded": ("==", sorted(name for name in heavy if name in sys.modules)),
        }
        for module in watched_modules:  # a patched function or class of the standard library
            state[f"attributes of {module.__name__}"] = ("is", dict(vars(module)))
        return state

    def same(how: str, before: Any, after: Any) -> bool:
        if how == "==":
            return bool(before == after)
        if isinstance(before, dict):
            # New attributes (a submodule bound on import) are fine; replaced ones are not.
            return all(key in after and after[key] is value for key, value in before.items())
        return len(before) == len(after) and all(a is b for a, b in zip(before, after))

    def changed(before: dict[str, tuple[str, Any]], after: dict[str, tuple[str, Any]]) -> list[str]:
        out = []
        for name, (how, old) in before.items():
            new = after[name][1]
            if not same(how, old, new):
                if isinstance(old, dict):
                    if how == "==":
                        keys = [k for k in old.keys() | new.keys() if k not in old or k not in new or old[k] != new[k]]
                    else:
                        keys = [k for k in old if k not in new or new[k] is not old[k]]
                    out.append(f"{name} changed: {sorted(map(str, keys))[:10]}")
                else:
                    out.append(f"{name} changed: {repr(old)[:300]} -> {repr(new)[:300]}")
        return out

    importing.append("(dependencies)")
    for name in dependencies:
        try:
            importlib.import_module(name)
        except ImportError:  # optional, or a name under `if __name__ == "__main__"` that needs more
            pass
    events.clear()

    problems: list[str] = []
    root_loads: list[str] = []
    before = snapshot()
    for name in modules:
        importing.append(name)
        importlib.import_module(name)
        after = snapshot()
        problems += [f"importing {name}: {change}" for change in changed(before, after)]
        before = after
        if name == modules[0]:  # the root: what every `import nbrewind...` pays for
            root_loads = sorted(m for m in sys.modules if m.split(".")[0] == name)
    return {
        "problems": problems,
        "events": events,
        "root_loads": root_loads,
        "root_file": sys.modules[modules[0]].__file__,
        "heavy_loaded": sorted(name for name in heavy if name in sys.modules),
    }


def _module_names() -> list[str]:
    """Every importable module of nbrewind/, the root first."""
    names = [".".join(_module_name(p)) for p in _files()]
    return sorted((n for n in names if not n.endswith(".__main__")), key=lambda n: (n != PACKAGE, n))


def _import_time_dependencies() -> list[str]:
    """Every module outside nbrewind that some nbrewind module imports at import time."""
    found = {
        imp.module
        for path in _files()
        for imp in imports_of(path)[0]
        if imp.when is When.IMPORT_TIME and unit_of_module(imp.module) is None and imp.module != "__future__"
    }
    return sorted(found)


def _run_probe(
    tmp_path: Path, modules: list[str], dependencies: list[str], heavy: list[str], path: Path
) -> dict[str, Any]:
    """Run `_probe` in a fresh interpreter with `path` first on sys.path and an empty cwd, HOME
    and TMPDIR; the report gains "files", what was written into those three directories."""
    dirs = {name: tmp_path / name for name in ("cwd", "home", "tmp")}
    for directory in dirs.values():
        directory.mkdir()
    env = dict(os.environ, HOME=str(dirs["home"]), TMPDIR=str(dirs["tmp"]))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), env.get("PYTHONPATH")]))
    code = (
        "from __future__ import annotations\nfrom typing import Any\nimport json, sys\n"
        + inspect.getsource(_probe)
        + "\nprint(json.dumps(_probe(*json.loads(sys.argv[1]))))\n"
    )
    argument = json.dumps([modules, dependencies, heavy, list(SIDE_EFFECT_EVENTS)])
    # -B: no .pyc writes, so any file opened for writing during an import is a finding.
    command = [sys.executable, "-B", "-c", code, argument]
    out = subprocess.run(command, cwd=dirs["cwd"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    report["files"] = {name: sorted(os.listdir(d)) for name, d in dirs.items() if os.listdir(d)}
    return report


def test_importing_every_module_changes_nothing(tmp_path: Path) -> None:
    """Import all modules in a fresh interpreter: no import hook, audit hook, RNG draw, patch, thread, file..."""
    report = _run_probe(tmp_path, _module_names(), _import_time_dependencies(), list(HEAVY), ROOT.parent)
    assert Path(report["root_file"]) == ROOT / "__init__.py", "the subprocess imported another copy of nbrewind"
    assert not report["events"], "side-effecting audit events while importing:\n" + "\n".join(report["events"])
    assert not report["problems"], "\n".join(report["problems"])
    assert not report["heavy_loaded"], f"importing nbrewind loaded {report['heavy_loaded']}"
    assert report["root_loads"] == sorted({PACKAGE, *LIGHT_FILES["__init__.py"]}), report["root_loads"]
    assert not report["files"], f"importing wrote files: {report['files']}"


# module of a fake package -> the side effect its import has; the probe must name every one
SEEDED_SIDE_EFFECTS: dict[str, str] = {
    "audit_hook": "import sys\nsys.addaudithook(lambda event, args: None)",
    "meta_path": (
        "import sys\nclass Finder:\n    def find_spec(self, *args):\n        return None\n"
        "sys.meta_path.append(Finder())"
    ),
    "path_hook": "import sys\nsys.path_hooks.append(lambda path: None)",
    "rng_draw": "import random\nrandom.random()",
    "rng_seed": "import random\nrandom.seed(0)",
    "environ": "import os\nos.environ['NBREWIND_SEEDED'] = '1'",
    "thread": "import threading, time\nthreading.Thread(target=time.sleep, args=(30,), daemon=True).start()",
    "patch": "import pickle\npickle.dumps = lambda *args, **kwargs: b''",
    "builtin_patch": "import builtins\nbuiltins.input = lambda *args: ''",
    "excepthook": "import sys\nsys.excepthook = lambda *args: None",
    "writes_file": "open('written.txt', 'w').close()",
    "warnings": "import warnings\nwarnings.simplefilter('ignore')",
    "signals": "import signal\nsignal.signal(signal.SIGUSR1, lambda *args: None)",
    "atexit": "import atexit\natexit.register(int)",
    "copyreg": "import copyreg\ncopyreg.pickle(complex, lambda c: (complex, (c.real, c.imag)))",
    "heavy": "import xml.dom.minidom",
    "recursion": "import sys\nsys.setrecursionlimit(sys.getrecursionlimit() + 1)",
}


def test_the_probe_sees_seeded_side_effects(tmp_path: Path) -> None:
    """Guard against a probe that sees nothing: each seeded side effect is reported, a quiet module is not."""
    package = tmp_path / "src" / "seededpkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "quiet.py").write_text("import json\nimport logging\nlog = logging.getLogger(__name__)\n")
    for name, source in SEEDED_SIDE_EFFECTS.items():
        (package / f"{name}.py").write_text(source + "\n")
    modules = ["seededpkg", "seededpkg.quiet", *(f"seededpkg.{name}" for name in SEEDED_SIDE_EFFECTS)]
    report = _run_probe(tmp_path, modules, ["json", "logging"], ["xml.dom.minidom"], package.parent)
    findings = report["problems"] + report["events"]
    missed = [name for name in SEEDED_SIDE_EFFECTS if not any(f"seededpkg.{name}:" in line for line in findings)]
    assert not missed, f"side effects not seen: {missed}\n" + "\n".join(findings)
    assert not any("seededpkg.quiet:" in line or "seededpkg:" in line for line in findings), findings
    assert report["heavy_loaded"] == ["xml.dom.minidom"]
    assert report["files"] == {"cwd": ["written.txt"]}
