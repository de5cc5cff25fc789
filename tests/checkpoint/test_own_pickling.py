"""Instances of the notebook's own classes that pickle themselves their own way
(``__getstate__``, ``__reduce__``, slots, subclasses of list/dict/set), and numpy object
arrays: a checkpoint stores what the notebook had, not what the class's hooks keep,
and its digest changes with every part of it. Real ObjectStore, real pickles; classes
are made by code run under ``__name__ == "__main__"``, as a kernel's cells are."""

from __future__ import annotations

import fractions
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from nbrewind.checkpoint.digests import digest_value
from nbrewind.checkpoint.own_state import own_state_base
from nbrewind.checkpoint.serialize import Unserializable, pickle_value, restoring_into
from nbrewind.checkpoint.values import StagedGroup, load_group, stage_group
from nbrewind.identity.values import is_notebook_code
from nbrewind.store.objects import ObjectStore

CLASSES = textwrap.dedent(
    """
    import threading

    class Dropper:
        setstate_calls = 0
        def __init__(self):
            self.n = 1
            self.cache = None
        def __getstate__(self):
            return {"n": self.n, "cache": None}
        def __setstate__(self, state):
            type(self).setstate_calls += 1
            self.__dict__.update(state)

    class Rebuilt:
        def __init__(self, a):
            self.a = a
            self.b = a * 2
        def __reduce__(self):
            return (Rebuilt, (self.a,))

    class Slotted:
        __slots__ = ("a", "__b")
        def __init__(self):
            self.a = 1
            self.__b = 2
        def b(self):
            return self.__b
        def __getstate__(self):
            return (None, {"a": self.a})

    class Tagged(list):
        def __init__(self, *args):
            super().__init__(*args)
            self.tag = 0
        def __getstate__(self):
            return {}

    class Empty(dict):
        def __reduce__(self):
            return (Empty, ())

    class Marked(set):
        def __getstate__(self):
            return {}

    class Locked:
        def __init__(self):
            self.lock = threading.Lock()
            self.v = 1
        def __getstate__(self):
            return {"v": self.v}
    """
)


def store_and_load(tmp_path: Path, group: dict[str, Any]) -> dict[str, object]:
    """Stage, commit and load ``group`` back, as the session does."""
    objects = ObjectStore(tmp_path / "store")
    staged = stage_group(objects, group)
    assert isinstance(staged, StagedGroup), staged
    staged.commit(objects)
    with restoring_into({"__name__": "__main__"}):
        return load_group(objects, staged.digest)


def notebook_classes() -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(CLASSES, "<cell>", "exec"), namespace)
    return namespace


def test_the_whole_state_comes_back_without_the_hooks(tmp_path: Path) -> None:
    ns = notebook_classes()
    dropper = ns["Dropper"]()
    dropper.cache = [5]
    rebuilt = ns["Rebuilt"](3)
    rebuilt.b = 100
    slotted = ns["Slotted"]()
    tagged = ns["Tagged"]([1, 2])
    tagged.tag = 3
    empty = ns["Empty"](a=1)
    marked = ns["Marked"]({4})
    marked.tag = 7
    group = {"d": dropper, "r": rebuilt, "s": slotted, "t": tagged, "e": empty, "m": marked, "c": dropper.cache}

    restored = store_and_load(tmp_path, group)

    d = restored["d"]
    assert type(d).__name__ == "Dropper" and d.cache == [5] and d.cache is restored["c"]
    assert type(d).setstate_calls == 0, "the class's __setstate__ ran on restore"
    assert (restored["r"].a, restored["r"].b) == (3, 100)
    s = restored["s"]
    assert (s.a, s.b()) == (1, 2)
    t = restored["t"]
    assert list(t) == [1, 2] and t.tag == 3 and type(t).__name__ == "Tagged"
    assert dict(restored["e"]) == {"a": 1}
    m = restored["m"]
    assert set(m) == {4} and m.tag == 7


def test_the_digest_sees_what_the_hooks_leave_out() -> None:
    ns = notebook_classes()
    one, two = ns["Dropper"](), ns["Dropper"]()
    one.cache, two.cache = 1, 2
    assert digest_value(one) != digest_value(two)
    two.cache = 1
    assert digest_value(one) == digest_value(two)
    t1, t2 = ns["Tagged"]([1]), ns["Tagged"]([1])
    t2.tag = 9
    assert digest_value(t1) != digest_value(t2)
    e1, e2 = ns["Empty"](a=1), ns["Empty"](a=2)
    assert digest_value(e1) != digest_value(e2)


def test_a_member_the_hook_hid_that_cannot_be_stored_makes_the_value_unstorable() -> None:
    ns = notebook_classes()
    assert isinstance(pickle_value(ns["Locked"]()), Unserializable)


def test_library_classes_keep_their_own_pickling() -> None:
    ns = notebook_classes()
    assert own_state_base(fractions.Fraction, is_notebook_code) is None
    assert own_state_base(np.ndarray, is_notebook_code) is None
    assert own_state_base(dict, is_notebook_code) is None
    assert own_state_base(ns["Dropper"], is_notebook_code) is object
    assert own_state_base(ns["Tagged"], is_notebook_code) is list


def test_an_object_array_keeps_its_elements_identity(tmp_path: Path) -> None:
    shared = [1, 2]
    array = np.empty(2, dtype=object)
    array[0] = shared
    array[1] = "tail"
    restored = store_and_load(tmp_path, {"a": array, "l": shared})
    assert restored["a"][0] is restored["l"]
    assert restored["a"][1] == "tail"
