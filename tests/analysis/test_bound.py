"""`bound_for_sure`: the names a cell binds whenever it runs to the end."""

from __future__ import annotations

import pytest

from nbrewind.analysis.bound import bound_for_sure


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("x = 1\ny, (z, *w) = 1, (2, 3)", {"x", "y", "z", "w"}),
        ("import os.path, numpy as np\nfrom pathlib import Path as P, PurePath", {"os", "np", "P", "PurePath"}),
        ("def f():\n    g = 1\nclass C:\n    h = 2\nasync def a():\n    pass", {"f", "C", "a"}),
        ("n: int = 3\nm: int\nk += 1", {"n", "k"}),
        ("with open('f') as fh, open('g') as (a, b):\n    inner = 1", {"fh", "a", "b"}),
        ("t = 1\ndel t\nu = 2", {"u"}),
        ("obj.attr = 1\nd['k'] = 2", set()),
        ("if flag:\n    maybe = 1\nfor i in range(3):\n    loop = i\ntry:\n    tried = 1\nexcept Exception:\n    handled = 1", set()),
        ("from os import *", set()),
        ("def broken(:", set()),
    ],
)
def test_only_top_level_bindings_that_always_run_count(source: str, expected: set[str]) -> None:
    assert bound_for_sure(source) == frozenset(expected)
