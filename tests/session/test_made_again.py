"""Unstorable values made again are held until a cell is about to drop one; then only
while something else holds it (`nbrewind.session.rebuild._MadeAgain`)."""

from __future__ import annotations

import gc

from nbrewind.session.rebuild import _MadeAgain


class _Resource:
    pass


def test_held_strongly_until_told_then_weakly() -> None:
    made = _MadeAgain()
    made["d1"] = _Resource()
    gc.collect()
    assert "d1" in made and isinstance(made["d1"], _Resource)  # nothing else holds it: still here
    kept = made["d1"]
    made.hold_weakly("d1")
    assert "d1" in made and made["d1"] is kept  # alive: every re-run still finds the same object
    del kept
    gc.collect()
    assert "d1" not in made


def test_one_that_takes_no_weak_reference_is_let_go() -> None:
    made = _MadeAgain()
    made["d2"] = {"log": _Resource()}
    made.hold_weakly("d2")
    assert "d2" not in made
    made.hold_weakly("absent")  # nothing to do
    assert "absent" not in made
