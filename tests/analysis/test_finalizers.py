"""Which values' death a notebook can see (`nbrewind.identity.finalizers`), and the alias
walk's flag for them: a repeat brings such a value back before a cell drops it."""

from __future__ import annotations

import io
import tempfile
import weakref
from pathlib import Path
from typing import Any, Iterator

from nbrewind.analysis import reach
from nbrewind.identity.finalizers import DeathWatch, finalized_referents, finalizes_object, finalizes_type


class _Noisy:
    def __del__(self) -> None:
        pass


class _Plain:
    pass


def _suspended_in_try() -> Iterator[int]:
    try:
        yield 1
    finally:
        pass


def _suspended_plain() -> Iterator[int]:
    yield 1


def test_types_whose_instances_finalize_visibly(tmp_path: Path) -> None:
    assert finalizes_type(_Noisy)
    assert not finalizes_type(_Plain)
    with open(tmp_path / "f.txt", "w") as fh:
        assert finalizes_type(type(fh)) and finalizes_type(type(fh.buffer))
    assert not finalizes_type(io.StringIO) and not finalizes_type(io.BytesIO)  # close nothing outside themselves
    # A Dask client's finalizer releases what only the process sees: never brought back to drop.
    quiet = type("Client", (), {"__del__": lambda self: None, "__module__": "distributed.client"})
    assert not finalizes_type(quiet)


def test_generators_finalize_only_suspended_inside_a_try_in_notebook_code() -> None:
    ns: dict[str, Any] = {"__name__": "__main__"}
    exec(
        "def g():\n    try:\n        yield 1\n    finally:\n        pass\n"
        "def h():\n    yield 1\n"
        "started = g(); next(started)\nfresh = g()\nplain = h(); next(plain)\n",
        ns,
    )
    assert finalizes_object(ns["started"])
    assert not finalizes_object(ns["fresh"])  # not started: closing it runs nothing
    assert not finalizes_object(ns["plain"])  # no try or with to leave
    library = _suspended_in_try()  # this module is not the notebook's
    next(library)
    assert not finalizes_object(library)
    assert not finalizes_object(_suspended_plain())


def test_referents_of_weakref_finalize_callbacks() -> None:
    x = _Plain()
    assert id(x) not in finalized_referents()
    f = weakref.finalize(x, lambda: None)
    assert id(x) in finalized_referents()
    f.detach()
    assert id(x) not in finalized_referents()


def _finalizes(value: object) -> bool:
    return reach(value, watch=DeathWatch())[2]


def test_the_alias_walk_flags_a_value_holding_a_finalizing_object(tmp_path: Path) -> None:
    assert _finalizes([1, _Plain()]) is False
    assert _finalizes([1, {"k": _Noisy()}]) is True
    assert reach([1, {"k": _Noisy()}])[2] is False  # only asked with a watch
    with open(tmp_path / "f.txt", "w") as fh:
        assert _finalizes({"log": fh}) is True
    assert _finalizes({"log": fh}) is False  # closed by the `with`: dropping it does nothing
    tmp = tempfile.TemporaryDirectory(dir=tmp_path)  # its folder goes with it (weakref.finalize)
    try:
        assert _finalizes(tmp) is True
    finally:
        tmp.cleanup()
    waited_on = _Plain()
    finalizer = weakref.finalize(waited_on, lambda: None)
    ids, _, finalizes = reach(finalizer, watch=DeathWatch())
    assert id(waited_on) in ids and finalizes  # a finalizer groups with the object it waits on
    finalizer.detach()
