"""Restore is exact: numpy views, class attribute order and weak references come back
as the notebook had them. Each test stages a group to a real ObjectStore, commits it
and loads it back (the path the session takes), after checking that the names are
co-variables (one group) in the first place."""

from __future__ import annotations

import collections
import gc
import itertools
import operator
import os
import subprocess
import sys
import types
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pandas as pd
import pytest

from nbrewind.analysis import reachable_ids
from nbrewind.checkpoint.digests import digest_value
from nbrewind.checkpoint.serialize import OOB_THRESHOLD, Unserializable, restoring_into
from nbrewind.checkpoint.values import StagedGroup, load_group, stage_group
from nbrewind.store.objects import ObjectStore

REPO = Path(__file__).resolve().parents[2]


def store_and_load(
    tmp_path: Path, group: dict[str, Any], before_load: Callable[[], None] = lambda: None
) -> tuple[dict[str, object], StagedGroup]:
    objects = ObjectStore(tmp_path / "store")
    staged = stage_group(objects, group)
    assert isinstance(staged, StagedGroup), staged
    staged.commit(objects)
    before_load()
    namespace: dict[str, Any] = {"__name__": "__main__"}
    with restoring_into(namespace):  # as the session does: notebook functions see this namespace
        restored = load_group(objects, staged.digest)
    namespace.update(restored)
    return restored, staged


def one_group(namespace: dict[str, Any]) -> None:
    """Every value reaches another's objects (in any order), so a checkpoint stores them together."""
    names = list(namespace)
    reach = {n: reachable_ids(namespace[n]) for n in names}
    joined, pending = {names[0]}, set(names[1:])
    while pending:
        grown = {n for n in pending if any(reach[n] & reach[m] for m in joined)}
        assert grown, f"{sorted(pending)} share nothing with {sorted(joined)}"
        joined |= grown
        pending -= grown


# -- numpy views -----------------------------------------------------------------------

VIEWS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "slice": lambda a: a[2:5],
    "step": lambda a: a[1::3],
    "reversed": lambda a: a[::-1],
    "reversed_step": lambda a: a[-2:1:-2],
    "view_of_view": lambda a: a[2:][1:][::2],
    "reinterpreted": lambda a: a.view(np.uint8)[3:40],
    "zero_size": lambda a: a[5:5],
}


@pytest.mark.parametrize("size", [10, OOB_THRESHOLD])  # in band and out of band
@pytest.mark.parametrize("kind", sorted(VIEWS))
def test_a_view_is_a_view_of_the_restored_base(tmp_path: Path, kind: str, size: int) -> None:
    a = np.arange(size, dtype=np.float64)
    v = VIEWS[kind](a)
    assert id(a) in reachable_ids(v)
    one_group({"a": a, "v": v})
    restored, staged = store_and_load(tmp_path, {"a": a, "v": v})
    ra, rv = restored["a"], restored["v"]
    assert isinstance(ra, np.ndarray) and isinstance(rv, np.ndarray)
    np.testing.assert_array_equal(ra, a)
    np.testing.assert_array_equal(rv, v)
    assert rv.dtype == v.dtype and rv.strides == v.strides
    if v.size:
        assert np.shares_memory(rv, ra)
        rv[0] = 5
        v[0] = 5
        np.testing.assert_array_equal(ra, a)  # the write went through to the base, as live
    if size >= OOB_THRESHOLD:
        assert len(staged.blobs) == 1  # the base is stored once; the view costs no bytes


def test_views_of_a_reshaped_array_share_its_hidden_root(tmp_path: Path) -> None:
    """`a` is itself a view (of the arange reshape made); `v` is a strided, non-contiguous
    view of `a`; `t` is F-ordered. All three share one buffer after the load, as live."""
    a = np.arange(24.0).reshape(4, 6)
    v, t = a[1:, ::2], a.T
    assert a.base is not None and not v.flags.c_contiguous and not v.flags.f_contiguous
    one_group({"a": a, "v": v, "t": t})
    restored, _ = store_and_load(tmp_path, {"a": a, "v": v, "t": t})
    ra, rv, rt = (restored[n] for n in "avt")
    assert isinstance(ra, np.ndarray) and isinstance(rv, np.ndarray) and isinstance(rt, np.ndarray)
    np.testing.assert_array_equal(rv, v)
    assert rt.flags.f_contiguous and rt.strides == t.strides
    rv[0, 0] = -1
    assert ra[1, 0] == -1 and rt[0, 1] == -1


def test_views_in_one_cell_or_two_and_a_readonly_view(tmp_path: Path) -> None:
    a = np.zeros(100)
    frozen = a[10:20]
    frozen.flags.writeable = False
    restored, _ = store_and_load(tmp_path, {"a": a, "frozen": frozen, "holder": {"v": a[:3]}})
    ra, rf, holder = restored["a"], restored["frozen"], restored["holder"]
    assert isinstance(ra, np.ndarray) and isinstance(rf, np.ndarray) and isinstance(holder, dict)
    assert not rf.flags.writeable and ra.flags.writeable
    holder["v"][2] = 7
    ra[10] = 3
    assert ra[2] == 7 and rf[0] == 3


def test_a_view_whose_base_is_not_stored_is_a_copy(tmp_path: Path) -> None:
    """Documented limit: storing all of `big` to keep two small views sharing it could cost
    far more than the views, so views of a base the group does not hold are copies."""
    big = np.arange(1000.0)
    x, y = big[10:20], big[15:25]
    one_group({"x": x, "y": y})  # they share `big`, so they are still one group
    restored, staged = store_and_load(tmp_path, {"x": x, "y": y})
    rx, ry = restored["x"], restored["y"]
    assert isinstance(rx, np.ndarray) and isinstance(ry, np.ndarray)
    np.testing.assert_array_equal(rx, x)
    np.testing.assert_array_equal(ry, y)
    assert not np.shares_memory(rx, ry)
    assert staged.new_bytes < big.nbytes


def test_object_arrays_and_pandas_still_roundtrip(tmp_path: Path) -> None:
    objects = np.array([[1], "a", None, 2.5], dtype=object)
    base = np.arange(300_000.0)
    frame = pd.DataFrame({"x": base[:1000], "y": np.ones(1000)})
    group = {"objects": objects, "part": objects[1:3], "base": base, "frame": frame, "col": base[:1000]}
    restored, _ = store_and_load(tmp_path, group)
    np.testing.assert_array_equal(restored["part"], objects[1:3])  # type: ignore[arg-type]
    pd.testing.assert_frame_equal(restored["frame"], frame)  # type: ignore[arg-type]
    rbase, rcol = restored["base"], restored["col"]
    assert isinstance(rbase, np.ndarray) and isinstance(rcol, np.ndarray)
    assert np.shares_memory(rbase, rcol)


def test_a_block_stored_in_segments_is_read_into_one_owned_buffer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    frame = pd.DataFrame({"x": rng.random(600_000), "y": rng.random(600_000), "k": np.arange(600_000)})
    seen: list[list[str]] = []
    get_blobs = ObjectStore.get_blobs

    def one_call(self: ObjectStore, groups: Any, allocate: Any = None) -> list[Any]:
        seen.extend(list(g) for g in groups)
        return get_blobs(self, groups, allocate)

    monkeypatch.setattr(ObjectStore, "get_blobs", one_call)
    # Segments used to be read one by one into bytearrays and then copied together.
    monkeypatch.setattr(ObjectStore, "get_blob", lambda *a, **k: pytest.fail("a segment was read on its own"))
    restored, _ = store_and_load(tmp_path, {"frame": frame})
    loaded = restored["frame"]
    assert isinstance(loaded, pd.DataFrame)
    pd.testing.assert_frame_equal(loaded, frame)
    assert any(len(group) == 2 for group in seen)  # the float block, two columns: one buffer
    x, y = loaded["x"].to_numpy(), loaded["y"].to_numpy()
    assert np.shares_memory(x, y) == np.shares_memory(frame["x"].to_numpy(), frame["y"].to_numpy())


def test_a_group_with_views_digests_the_same_every_time() -> None:
    def make() -> dict[str, object]:
        a = np.arange(OOB_THRESHOLD, dtype=np.int32)
        return {"a": a, "v": a[::-3], "w": a.reshape(-1, 4)[:, 1]}

    first, second = digest_value(make()), digest_value(make())
    assert isinstance(first, str) and first == second
    copied = make()
    copied["v"] = np.array(copied["v"])  # same content, no longer a view: restores differently
    assert digest_value(copied) != first


# -- class attribute order -------------------------------------------------------------

CLASSES = '''
import abc, dataclasses

class Base:
    def shared(self):
        return "base"

class Point:
    """A point."""
    zeta = 1
    alpha = 2
    def norm(self):
        return abs(self.zeta) + self.alpha
    def __eq__(self, other):
        return isinstance(other, Point)
    middle = 3

class Child(Point, Base):
    later = 1
    shared = Base.shared
    early = 2
    def norm(self):
        return super().norm() * 10

class Slotted:
    __slots__ = ("y", "x")
    def __init__(self):
        self.y, self.x = 1, 2

class Abstract(abc.ABC):
    @abc.abstractmethod
    def run(self): ...
    b = 1

@dataclasses.dataclass
class Record:
    z: int = 1
    a: int = 2

Point.added_after = "yes"
'''

CLASS_NAMES = ("Point", "Child", "Slotted", "Abstract", "Record")


def notebook_classes(source: str = CLASSES) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(source, "<cell 1>", "exec"), namespace)
    return {name: namespace[name] for name in CLASS_NAMES}


@pytest.fixture
def forget_classes(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Forget the classes this process pickled, as another kernel process would: otherwise
    cloudpickle hands back the live class object and nothing would be rebuilt."""

    def forget() -> None:
        monkeypatch.setattr(cloudpickle.cloudpickle, "_DYNAMIC_CLASS_TRACKER_BY_ID", weakref.WeakValueDictionary())

    return forget


def test_classes_keep_their_attribute_order(tmp_path: Path, forget_classes: Callable[[], None]) -> None:
    classes = notebook_classes()
    orders = {name: list(vars(cls)) for name, cls in classes.items()}
    assert orders["Point"] != sorted(orders["Point"])
    restored, _ = store_and_load(tmp_path, classes, forget_classes)
    for name, cls in classes.items():
        again = restored[name]
        assert isinstance(again, type) and again is not cls
        assert list(vars(again)) == orders[name], name
    point, child, slotted, record = (restored[n] for n in ("Point", "Child", "Slotted", "Record"))
    assert point().norm() == 3 and point() == point() and point.__hash__ is None  # type: ignore[operator]
    assert child().norm() == 30 and child().shared() == "base"  # type: ignore[operator]
    assert point.added_after == "yes"  # type: ignore[attr-defined]
    instance = slotted()  # type: ignore[operator]
    assert (instance.y, instance.x) == (1, 2) and not hasattr(instance, "__dict__")
    assert [f.name for f in __import__("dataclasses").fields(record)] == ["z", "a"]
    with pytest.raises(TypeError):
        restored["Abstract"]()  # type: ignore[operator]


def test_class_digest_follows_definition_order() -> None:
    first, again = notebook_classes(), notebook_classes()
    swapped = notebook_classes(CLASSES.replace("zeta = 1\n    alpha = 2", "alpha = 2\n    zeta = 1"))
    for name in CLASS_NAMES:
        assert digest_value(first[name]) == digest_value(again[name]), name
    assert digest_value(first["Point"]) != digest_value(swapped["Point"])


def test_class_digest_is_equal_in_another_process() -> None:
    code = (
        "import sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from test_restore_exact import CLASS_NAMES, notebook_classes\n"
        "from nbrewind.checkpoint.digests import digest_value\n"
        "classes = notebook_classes()\n"
        "print(' '.join(str(digest_value(classes[n])) for n in CLASS_NAMES))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "12345"}
    result = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parent)],
        capture_output=True, check=True, timeout=120, env=env, text=True,
    )
    classes = notebook_classes()
    assert result.stdout.split() == [str(digest_value(classes[n])) for n in CLASS_NAMES]


# -- weak references -------------------------------------------------------------------


class Target:
    def __init__(self, n: int = 0) -> None:
        self.n = n


def test_a_weakref_points_at_its_restored_referent(tmp_path: Path) -> None:
    obj = Target(3)
    r = weakref.ref(obj)
    assert id(obj) in reachable_ids(r)
    one_group({"obj": obj, "r": r})
    restored, _ = store_and_load(tmp_path, {"obj": obj, "r": r, "again": r})
    robj, rr = restored["obj"], restored["r"]
    assert isinstance(rr, weakref.ref) and isinstance(robj, Target) and robj is not obj
    assert rr() is robj and restored["again"] is rr and robj.n == 3


def test_a_dead_weakref_restores_dead_and_callbacks_are_dropped(tmp_path: Path) -> None:
    gone = Target()
    dead = weakref.ref(gone)
    del gone
    gc.collect()
    assert dead() is None and reachable_ids(dead) == {id(dead)}
    obj = Target()
    called = weakref.ref(obj, lambda ref: None)
    restored, _ = store_and_load(tmp_path, {"dead": dead, "obj": obj, "called": called})
    rdead, rcalled = restored["dead"], restored["called"]
    assert isinstance(rdead, weakref.ref) and rdead() is None
    assert isinstance(rcalled, weakref.ref) and rcalled() is restored["obj"]
    assert rcalled.__callback__ is None  # documented: callbacks are not stored


def test_weak_containers_point_at_restored_objects(tmp_path: Path) -> None:
    a, b = Target(1), Target(2)
    values = weakref.WeakValueDictionary({"a": a, "b": b})
    keys = weakref.WeakKeyDictionary({a: "first"})
    members = weakref.WeakSet([b])
    namespace = {"a": a, "b": b, "values": values, "keys": keys, "members": members}
    one_group(namespace)
    restored, _ = store_and_load(tmp_path, namespace)
    ra, rb = restored["a"], restored["b"]
    rvalues, rkeys, rmembers = restored["values"], restored["keys"], restored["members"]
    assert isinstance(rvalues, weakref.WeakValueDictionary) and isinstance(rkeys, weakref.WeakKeyDictionary)
    assert isinstance(rmembers, weakref.WeakSet)
    assert rvalues["a"] is ra and rvalues["b"] is rb and rkeys[ra] == "first" and set(rmembers) == {rb}
    del restored, ra, rvalues
    gc.collect()
    assert len(rkeys) == 0  # still weak: the key died with its last strong reference


def test_weak_kinds_that_cannot_be_faithful_are_unserializable(tmp_path: Path) -> None:
    obj, function = Target(), lambda: 1
    gone = Target()
    dead = weakref.proxy(gone)
    del gone
    objects = ObjectStore(tmp_path / "store")
    for value in (weakref.proxy(obj), weakref.proxy(function), dead, weakref.WeakMethod(obj.__init__)):
        result = stage_group(objects, {"obj": obj, "w": value})
        assert isinstance(result, Unserializable) and result.members == ("w",), result
        assert isinstance(digest_value(value), Unserializable)


# -- views and iterators over a container ------------------------------------------------


def _holders(d: dict[str, int], s: set[int], lst: list[int]) -> dict[str, Any]:
    """Every kind of standard-library object that sees into a container, each half consumed
    where it is an iterator."""
    od = collections.OrderedDict(d)
    made: dict[str, Any] = {
        "d": d, "s": s, "lst": lst, "od": od,
        "keys": d.keys(), "values": d.values(), "items": d.items(), "od_keys": od.keys(),
        "proxy": types.MappingProxyType(d),
        "d_iter": iter(d), "d_values_iter": iter(d.values()), "d_items_iter": iter(d.items()),
        "d_reversed": reversed(d), "d_reversed_items": reversed(d.items()), "s_iter": iter(s),
        "l_iter": iter(lst), "l_reversed": reversed(lst), "counted": enumerate(lst), "zipped": zip(lst, lst),
        "chained": itertools.chain(lst, [0]), "caller": operator.methodcaller("count", lst),
        "bundle": [d, s, lst, od],  # one group, as one cell's names would be
    }
    for name in ("d_iter", "d_values_iter", "d_items_iter", "d_reversed", "d_reversed_items", "s_iter", "l_iter", "counted"):
        next(made[name])
    return made


def test_views_and_iterators_see_the_restored_container(tmp_path: Path) -> None:
    """`ks = d.keys()`, `iter(lst)`, `enumerate(lst)`, `MappingProxyType(d)`... restored with
    their container are views of it again: a change to the container after the load shows
    through them, and a half-consumed iterator goes on where it stopped, as its own type."""
    namespace = _holders({"a": 1, "b": 2, "c": 3}, {10, 20, 30}, [1, 2, 3])
    one_group(namespace)
    expected = _holders({"a": 1, "b": 2, "c": 3}, {10, 20, 30}, [1, 2, 3])  # never stored
    restored, _ = store_and_load(tmp_path, namespace)
    for ns in (restored, expected):
        ns["d"]["z"] = 9
        ns["od"]["z"] = 9
        ns["lst"].append(4)
    for name, want in expected.items():
        got = restored[name]
        assert type(got) is type(want), name
        if name in ("d", "s", "lst", "od", "bundle"):
            continue
        if name == "caller":
            assert got([[1, 2, 3, 4]]) == want([[1, 2, 3, 4]]) == 1, name
        elif name in ("keys", "values", "items", "od_keys", "proxy"):
            assert list(got) == list(want), name
        elif name not in ("d_iter", "d_values_iter", "d_items_iter", "d_reversed", "d_reversed_items", "s_iter"):
            assert list(got) == list(want), name  # list iterators follow the list as it grows


def test_dict_and_set_iterators_resume_where_they_stopped(tmp_path: Path) -> None:
    d = {"a": 1, "b": 2, "c": 3}
    s = {10, 20, 30}
    namespace = {"d": d, "s": s, "keys": iter(d), "items": iter(d.items()), "back": reversed(d), "members": iter(s), "done": iter(d)}
    next(namespace["keys"]), next(namespace["items"]), next(namespace["back"]), next(namespace["members"])
    list(namespace["done"])
    restored, _ = store_and_load(tmp_path, namespace)
    for name in ("keys", "items", "back", "members", "done"):
        assert type(restored[name]) is type(namespace[name]), name  # still live over the container
    assert list(restored["keys"]) == ["b", "c"]
    assert list(restored["items"]) == [("b", 2), ("c", 3)]
    assert list(restored["back"]) == ["b", "a"]
    assert sorted(restored["members"]) == sorted(s - {next(iter(s))})
    assert list(restored["done"]) == []


def test_a_view_changes_its_key_when_its_dict_changes() -> None:
    d = {"a": 1}
    before = digest_value(d.keys())
    d["b"] = 2
    assert digest_value(d.keys()) != before
