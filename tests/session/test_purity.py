"""The purity proof: a use of a value is pure only for exactly the types the tables name.

Each case is a cell and the live value of `x`; `proven_unchanged` must say True only
where the cell cannot have changed `x`. The impure half is the list of stale replays
found in notebooks nobody here wrote.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import pandas as pd
import pytest

from nbrewind.analysis.uses import name_uses
from nbrewind.session.purity import proven_unchanged


class Box:
    def __init__(self) -> None:
        self.items: list[int] = []

    def apply(self) -> None:
        self.items.append(1)


def _values() -> dict[str, Any]:
    return {
        "list": [3, 1, 2],
        "array": np.arange(5.0),
        "frame": pd.DataFrame({"a": [1.0, None], "c": ["x", "y"]}),
        "defaultdict": collections.defaultdict(list),
        "dict": {"k": [1]},
        "box": Box(),
    }


PURE = [
    ("array", "x.sum() + len(x) + x.shape[0]"),
    ("array", "print(x.mean(), x[0], x.dtype)"),
    ("array", "y = float(x[0])"),
    ("array", "y = np.sum(x) + np.exp(x)[0]"),
    ("frame", "x.head()"),
    ("frame", "x.sort_values('a')"),
    ("frame", "x['c'].value_counts()"),
    ("frame", "x.fillna(0)"),
    ("dict", "x.get('k'), x['k'], len(x)"),
    ("list", "for v in x:\n    pass\nx.index(1)"),
]
IMPURE = [
    ("list", "x.sort()"),
    ("list", "x.reverse()"),
    ("array", "x.sort()"),
    ("array", "np.exp(x, out=x)"),
    ("array", "np.exp(x, x)"),
    ("array", "x.clip(0, 1, out=x)"),
    ("frame", "x.fillna(0, inplace=True)"),
    ("frame", "x.fillna(0, **kw)"),
    ("frame", "x['a'].fillna(0, inplace=True)"),
    ("defaultdict", "x['missing']"),
    ("dict", "x['k'].append(2)"),
    ("list", "push = x.append"),
    ("list", "list(map(x.append, range(3)))"),
    ("list", "helper(x)"),
    ("box", "x.apply()"),
    ("box", "print(x)"),
    ("array", "def f():\n    x.sort()\nf()"),
]


@pytest.mark.parametrize(("kind", "cell"), PURE)
def test_pure_uses_are_proven(kind: str, cell: str) -> None:
    uses = name_uses(cell)
    assert uses is not None
    assert proven_unchanged(_values()[kind], uses.get("x"), {"np": np, "pd": pd, "kw": {}})


@pytest.mark.parametrize(("kind", "cell"), IMPURE)
def test_uses_that_may_mutate_are_not(kind: str, cell: str) -> None:
    uses = name_uses(cell)
    assert uses is not None
    assert not proven_unchanged(_values()[kind], uses.get("x"), {"np": np, "pd": pd, "kw": {}, "helper": lambda v: v.append(1)})


def test_a_users_own_sum_is_not_the_builtin() -> None:
    """Pure callees are checked by identity: a notebook function named `sum` proves nothing."""
    uses = name_uses("sum(x)")
    assert uses is not None
    assert proven_unchanged([1], uses["x"], {})
    assert not proven_unchanged([1], uses["x"], {"sum": lambda v: v.append(1)})
