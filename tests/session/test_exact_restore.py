"""Restore is exact at the session level: audit cells on one shell, repeat them on a
fresh shell (lazy namespace, same store), and the restored namespace behaves as the
live one did: a numpy view still writes through to its base, a notebook class keeps
its attribute order, a weak reference points at the restored object."""

from __future__ import annotations

import weakref
from typing import Any as Runner  # the fixture type lives in conftest.py

import cloudpickle
import numpy as np  # loaded before the audit, as in test_repeat.py: the settings it registers are then unchanged
import pytest


def decisions(outcomes: list) -> list[str]:
    return [o.decision[0].upper() for o in outcomes]  # R(eplayed) / E(xecuted)


@pytest.mark.parametrize(
    "cells",
    [
        ["import numpy as np", "a = np.arange(10)", "v = a[2:5]"],  # two cells
        ["import numpy as np", "a = np.arange(10); v = a[2:5]"],  # one cell
        ["import numpy as np", "a = np.arange(100_000.0).reshape(1000, 100)", "v = a[::-2, 3]"],  # out of band, strided
    ],
)
def test_a_replayed_view_still_writes_through_to_its_base(runner: Runner, cells: list[str]) -> None:
    runner.run(cells)
    live = runner.ns
    live_a = live["a"].copy()
    out = runner.run(cells, "repeat")
    assert set(decisions(out)) == {"R"}, [o.reason for o in out]
    runner.cell("v[0] = 5")
    ns = runner.ns
    assert (ns["a"] != live_a).sum() == 1 and 5 in ns["a"]
    assert np.shares_memory(ns["a"], ns["v"])


def test_a_replayed_class_keeps_its_attribute_order(runner: Runner, monkeypatch: pytest.MonkeyPatch) -> None:
    cells = [
        "class C:\n    zeta = 1\n    alpha = 2\n    def middle(self):\n        return self.zeta + self.alpha\n    beta = 3",
        "C.added = 4",
        "c = C()",
    ]
    runner.run(cells)
    original = runner.ns["C"]
    order = list(vars(original))
    assert order != sorted(order)
    # Another kernel process has never seen the class: make cloudpickle forget it
    # too, or it would hand back the live class object instead of rebuilding it.
    monkeypatch.setattr(cloudpickle.cloudpickle, "_DYNAMIC_CLASS_TRACKER_BY_ID", weakref.WeakValueDictionary())
    out = runner.run(cells, "repeat")
    assert decisions(out) == ["R", "R", "R"]
    restored = runner.ns["C"]
    # Pickling `c` made copyreg cache `C.__slotnames__` on the live class after C's
    # last checkpoint; a plain kernel never has it, so it is not compared.
    assert restored is not original
    assert [k for k in vars(restored) if k != "__slotnames__"] == [k for k in order if k != "__slotnames__"]
    runner.cell("total = c.middle() + C.added\nsame = type(c) is C")
    assert runner.ns["total"] == 7 and runner.ns["same"] is True


def test_a_replayed_weakref_points_at_the_restored_object(runner: Runner) -> None:
    cells = ["import weakref", "class Node:\n    pass", "obj = Node()", "r = weakref.ref(obj)", "gone = weakref.ref(Node())"]
    runner.run(cells)
    out = runner.run(cells, "repeat")
    assert decisions(out) == ["R"] * 5
    runner.cell("alive = r() is obj\ndead = gone() is None")
    assert runner.ns["alive"] is True and runner.ns["dead"] is True
