"""LazyNamespace: pending names load on first use, are listed everywhere, and survive
the copies IPython makes without loading."""

from __future__ import annotations

import builtins
import gc
from typing import Any

import pytest

from nbrewind.checkpoint.namespace import LazyNamespace


def make(loads: list[str]) -> LazyNamespace:
    ns = LazyNamespace(__builtins__=builtins, __name__="__main__")

    def loader(name: str, token: Any) -> dict[str, Any]:
        loads.append(name)
        return {name: token * 2}

    ns.set_loader(loader)
    return ns


def test_pending_values_load_on_first_use_from_cells_and_functions() -> None:
    loads: list[str] = []
    ns = make(loads)
    ns.set_pending("a", 21)
    ns.set_pending("b", 5)
    exec("def f():\n    return a + len([1])", ns)
    assert loads == []
    assert ns["f"]() == 43 and loads == ["a"]
    exec("c = b + 1", ns)
    assert ns["c"] == 11 and loads == ["a", "b"]
    assert not ns.pending()


def test_pending_names_are_listed_without_loading() -> None:
    loads: list[str] = []
    ns = make(loads)
    ns.set_pending("x", 1)
    exec("names = dir()", ns)
    assert "x" in ns["names"] and "x" in ns and "x" in list(ns) and len(ns) == len(list(ns))
    assert loads == []


def test_copy_and_update_keep_names_pending() -> None:
    """IPython's var_expand copies the namespace and merges frame locals for every line magic."""
    loads: list[str] = []
    ns = make(loads)
    ns["plain"] = 3
    ns.set_pending("big", 50)
    copied = ns.copy()
    copied.update(ns)
    assert loads == [] and isinstance(copied, LazyNamespace) and copied.is_pending("big")
    assert copied["big"] == 100 and loads == ["big"]
    assert ns.is_pending("big")  # the original is untouched


def test_delete_pop_assign_and_clear() -> None:
    loads: list[str] = []
    ns = make(loads)
    ns.set_pending("gone", 1)
    del ns["gone"]
    assert "gone" not in ns and loads == []
    with pytest.raises(KeyError):
        del ns["gone"]
    ns.set_pending("p", 4)
    assert ns.pop("p") == 8
    ns.set_pending("q", 1)
    ns["q"] = "new"
    assert ns["q"] == "new" and ns.get("q") == "new"
    ns.set_pending("r", 1)
    ns.clear()
    assert len(ns) == 0 and not ns.pending()


def test_missing_hook_is_only_installed_while_something_is_pending() -> None:
    from nbrewind.checkpoint import namespace

    gc.collect()  # namespaces of earlier tests' shells
    others = [r() for r in list(namespace._live.values())]
    if any(o is not None and o._pending for o in others):
        pytest.skip("another live namespace in this process still has pending names")
    ns = make([])
    assert "__missing__" not in LazyNamespace.__dict__
    ns.set_pending("v", 1)
    assert "__missing__" in LazyNamespace.__dict__
    assert namespace._note_collection in gc.callbacks
    ns.materialize("v")
    assert "__missing__" not in LazyNamespace.__dict__
    assert namespace._note_collection not in gc.callbacks
    with pytest.raises(NameError):
        exec("undefined_name", ns)


class _Node:
    pass


def _cycle_group() -> LazyNamespace:
    """`x` an object in a reference cycle and `alive` a weak reference to it, one group:
    loading either makes both."""
    import weakref

    ns = LazyNamespace(__builtins__=builtins, __name__="__main__")

    def loader(name: str, token: Any) -> dict[str, Any]:
        x = _Node()
        x.me = x  # type: ignore[attr-defined]
        return {"x": x, "alive": weakref.ref(x)}

    ns.set_loader(loader)
    ns.set_pending("x", "group")
    ns.set_pending("alive", "group")
    return ns


@pytest.mark.parametrize("drop", ["del x", "x = None", "exec('del x')"])
def test_a_dropped_cycle_loaded_with_its_group_is_collected_if_a_full_collection_ran_since(drop: str) -> None:
    """A plain kernel's `x` was freed by the `gc.collect()` after the drop; the copy the group's
    load makes must be gone too, not alive until some later collection."""
    ns = _cycle_group()
    exec(f"{drop}\nimport gc\ngc.collect()\nfreed = alive() is None", ns)
    assert ns["freed"] is True


@pytest.mark.parametrize("drop", ["del x", "x = None"])
def test_a_dropped_cycle_lives_until_the_next_full_collection(drop: str) -> None:
    """No full collection since the drop: a plain kernel's `x` is still alive (only the cyclic
    collector frees it). (Whether a young collection frees it depends on its generation, which
    differs between kernels: not compared.)"""
    ns = _cycle_group()
    gen2 = gc.get_stats()[2]["collections"]
    exec(f"{drop}\nkept = alive() is not None", ns)
    if gc.get_stats()[2]["collections"] != gen2:
        pytest.skip("an automatic full collection ran during the test")
    assert ns["kept"] is True
    gc.collect()
    assert ns["alive"]() is None


def test_ipython_transforming_a_one_line_cell_loads_nothing_while_peeking() -> None:
    """IPython's macro and autocall checkers `get` a one-line cell's first name (`df` in
    `df = df + 1`) while the cell is transformed; peeking, that answers absent instead of
    loading the value."""
    from IPython.core.interactiveshell import InteractiveShell

    loads: list[str] = []
    ns = make(loads)
    ns.set_pending("df", 21)
    shell = InteractiveShell.instance()
    saved = shell.user_ns
    shell.user_ns = ns
    try:
        with ns.peeking():
            assert shell.transform_cell("df = df + 1") == "df = df + 1\n"
            assert ns.get("df", "absent") == "absent"
        assert loads == [] and ns.is_pending("df")
        shell.transform_cell("df = df + 1")
        assert loads == ["df"]  # without peeking the checkers load it
    finally:
        shell.user_ns = saved
        InteractiveShell.clear_instance()


def test_a_pending_name_dropped_by_del_or_pop_goes_through_the_before_drop_hook() -> None:
    """The session loads a value whose finalizer the notebook sees before `del` drops it
    (also inside `exec`, which the cell's analysis cannot see)."""
    loads: list[str] = []
    ns = make(loads)
    seen: list[tuple[str, Any]] = []

    def hook(name: str, token: Any) -> None:
        seen.append((name, token))
        ns.materialize(name)

    ns.set_before_drop(hook)
    ns.set_pending("a", 1)
    ns.set_pending("b", 2)
    ns["c"] = 3
    exec("exec('del a')\ndel c", ns)
    assert seen == [("a", 1)] and loads == ["a"] and "a" not in ns and "c" not in ns
    assert ns.pop("b") == 4 and seen == [("a", 1), ("b", 2)]
