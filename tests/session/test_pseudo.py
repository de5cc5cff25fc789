"""Pseudo-variable names: built and parsed in one module, spelled as catalogs store them."""

from __future__ import annotations

import pytest

from nbrewind.session import pseudo
from nbrewind.session.pseudo import Pseudo


@pytest.mark.parametrize(
    ("kind", "arg", "spelled"),
    [
        (Pseudo.RNG, "numpy.random", "@rng:numpy.random"),
        (Pseudo.FILE, "data/in:1.txt", "@file:data/in:1.txt"),
        (Pseudo.ENV, "HOME", "@env:HOME"),
        (Pseudo.CWD, "", "@cwd"),
        (Pseudo.NAMES, "", "@names"),
        (Pseudo.SETTING, "pandas", "@setting:pandas"),
        (Pseudo.SOURCE, "helpers", "@src:helpers"),
        (Pseudo.MODULE_STATE, "helpers", "@mstate:helpers"),
        (Pseudo.LISTING, "data", "@dir:data"),
        (Pseudo.STAT, "/abs/x", "@stat:/abs/x"),
        (Pseudo.KIND, "x", "@kind:x"),
        (Pseudo.IMPURE, "", "@impure"),
    ],
)
def test_names_round_trip_and_keep_their_stored_spelling(kind: Pseudo, arg: str, spelled: str) -> None:
    assert pseudo.name(kind, arg) == spelled
    assert pseudo.parse(spelled) == (kind, arg)
    assert pseudo.is_pseudo(spelled)


def test_notebook_names_and_malformed_names_are_not_pseudo_variables() -> None:
    assert pseudo.parse("x") is None and not pseudo.is_pseudo("x")
    assert pseudo.parse("@unknown:thing") is None
    with pytest.raises(ValueError, match="needs"):
        pseudo.name(Pseudo.FILE)
    with pytest.raises(ValueError, match="takes no"):
        pseudo.name(Pseudo.CWD, "x")
