"""Cells that patch a library module or class are found (`nbrewind.session.patches`),
and what only looks like one is not: attributes of instances, library settings set
through attribute access, subscripted stores, decorators that change nothing.

In-process, on throwaway modules built here (a module with no file counts as a
library's), except where pandas' own accessor registration is the point; whatever a
test attaches to a real library it takes off again."""

from __future__ import annotations

import sys
import textwrap
import types
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest

from nbrewind.session import patches


@pytest.fixture
def lib() -> Iterator[types.ModuleType]:
    module = types.ModuleType("nbr_fakelib")
    exec("class Thing:\n    size = 1\n\nVALUE = 1\n\ndef decorate(f):\n    return f\n", module.__dict__)
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def run(code: str, namespace: dict[str, Any]) -> list[str]:
    """Watch, run `code` in `namespace` as a cell, and say what it patched."""
    code = textwrap.dedent(code)
    namespace.setdefault("__name__", "__main__")
    reads = {name for name in namespace if name in code}
    seen = patches.watch(code, namespace, reads)
    exec(compile(code, "<cell>", "exec"), namespace)
    return patches.patched(seen, namespace)


def test_attribute_stores_on_a_library_module_or_class(lib: types.ModuleType) -> None:
    assert run("fl.VALUE = 2", {"fl": lib}) == ["patches nbr_fakelib, which a replay cannot do again"]
    assert run("fl.Thing.size = 3", {"fl": lib}) == ["patches nbr_fakelib.Thing, which a replay cannot do again"]
    assert run("setattr(Thing, 'extra', lambda self: 1)", {"Thing": lib.Thing}) == [
        "patches nbr_fakelib.Thing, which a replay cannot do again"
    ]
    assert run("del fl.VALUE", {"fl": lib}) == ["patches nbr_fakelib, which a replay cannot do again"]


def test_a_module_the_cell_imports_itself(lib: types.ModuleType) -> None:
    assert run("import nbr_fakelib as fl\nfl.NEW = 1", {}) == ["patches nbr_fakelib, which a replay cannot do again"]
    assert run("from nbr_fakelib import Thing\nThing.other = 2", {}) == ["patches nbr_fakelib.Thing, which a replay cannot do again"]


def test_what_only_looks_like_a_patch(lib: types.ModuleType) -> None:
    ns: dict[str, Any] = {"fl": lib, "pd": pd, "obj": types.SimpleNamespace(a=1), "env": {}}
    assert run("obj.a = 2\nenv['k'] = 'v'", ns) == []
    assert run("fl.VALUE = fl.VALUE", ns) == []  # rebound to the same object: nothing changed
    assert run("class Local:\n    pass\nLocal.x = 1", ns) == []
    assert run("import functools\n@functools.lru_cache\ndef f(x):\n    return x", ns) == []
    before = pd.get_option("display.max_rows")
    try:
        assert run("pd.options.display.max_rows = 7", ns) == []  # a setting, tracked as one
    finally:
        pd.set_option("display.max_rows", before)
    assert run("def g():\n    fl.VALUE = 5", ns) == []  # defined, not run
    # copyreg caches __slotnames__ on a class when one of its instances is first pickled
    assert run("import pickle\n@fl.decorate\ndef h():\n    pass\npickle.dumps(fl.Thing())\nfl.Thing.size = fl.Thing.size", ns) == []


def test_a_pandas_accessor_registered_by_a_decorator() -> None:
    code = """
        @pd.api.extensions.register_index_accessor("nbr_test_acc")
        class Acc:
            def __init__(self, index):
                self.index = index
    """
    try:
        assert run(code, {"pd": pd}) == ["patches pandas.Index, which a replay cannot do again"]
    finally:
        del pd.Index.nbr_test_acc
    try:
        # pandas imported by the cell itself: found by what the notebook left inside its classes
        assert run("import pandas as pd\n" + textwrap.dedent(code), {}) == [
            "patches pandas.Index, which a replay cannot do again"
        ]
    finally:
        del pd.Index.nbr_test_acc


def sites(code: str, namespace: dict[str, Any]) -> list[tuple[Any, str | None]]:
    """Run `code` as a cell and return the library attributes it patched."""
    code = textwrap.dedent(code)
    namespace.setdefault("__name__", "__main__")
    seen = patches.watch(code, namespace, {name for name in namespace if name in code})
    exec(compile(code, "<cell>", "exec"), namespace)
    patches.patched(seen, namespace)
    return [] if seen is None else list(seen.sites)


def test_the_attributes_a_patch_changed_are_its_sites(lib: types.ModuleType) -> None:
    assert sites("fl.VALUE = 2\nfl.NEW = 3", {"fl": lib}) == [(lib, "NEW"), (lib, "VALUE")]
    assert sites("setattr(fl.Thing, 'size', 4)", {"fl": lib}) == [(lib.Thing, "size")]
    assert sites("import nbr_fakelib as fl\nfl.OTHER = 1", {}) == [(lib, "OTHER")]
    assert sites("obj.a = 2", {"obj": types.SimpleNamespace(a=1)}) == []


def test_the_patched_state_is_keyed_by_content(lib: types.ModuleType) -> None:
    """Equal patches key alike (a lambda by its code, not its id); another value, another
    body, or the patch gone changes the key: the cells after it cannot replay."""
    ns: dict[str, Any] = {"fl": lib}
    where = sites("fl.Thing.twice = lambda self: 2", ns)
    first = patches.sites_key(where)
    sites("fl.Thing.twice = lambda self: 2", ns)
    assert patches.sites_key(where) == first
    sites("fl.Thing.twice = lambda self: 3", ns)
    assert patches.sites_key(where) != first
    k = 6
    sites(f"fl.Thing.twice = {k}", ns)
    six = patches.sites_key(where)
    sites("del fl.Thing.twice", ns)
    assert patches.sites_key(where) not in (six, first)
