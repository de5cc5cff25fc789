"""Which task functions do something besides returning a value (`nbrewind.tasks.effects`):
those a cache hit would leave undone. Real functions, compiled as a notebook's cell."""

from __future__ import annotations

import types
from typing import Any

import pytest

from nbrewind.tasks.effects import mutated_parameters, side_effect

CELL = '''
import logging, random, warnings
import numpy as np
seen, acc, G = [], {}, {"a": {"b": 1}}
class K:
    n = 0
logger = logging.getLogger("nbtask")

def prints(x): print(x); return x
def appends(x): seen.append(x); return x
def sets_item(x): acc[x] = 1; return x
def sets_nested(x): G["a"]["b"] = x
def counts(x):
    K.n += 1
    return x
def adds_to_item(x): acc[x] += 1
def draws(x): return random.random()
def draws_numpy(x): return np.random.rand()
def logs(x): logger.info("x"); return x
def warns(x): warnings.warn("w"); return x
def sets_global(x):
    global total
    total = x
def helper(x): print(x)
def calls_a_printing_helper(x): helper(x); return x

def builds_locally(x):
    out = {}
    out[x] = G["a"]["b"]
    out.setdefault("k", []).append(1)
    return out
def own_generator(x): return np.random.default_rng(0).random() + random.Random(1).random() + x
def copies_first(df):
    df2 = df.copy()
    df2["y"] = 1
    return df2
def comprehension(x): return [v * 2 for v in x]
def edits_argument(d, k):
    d[k] = 1
    return len(d)
def appends_to_argument(items):
    items.append(1)
def quiet_division(a, b):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(a) / b
def named_logger(x):
    return logging.getLogger("nbtask").name
def global_filter(x):
    warnings.simplefilter("ignore")
    return x
'''


@pytest.fixture(scope="module")
def ns() -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(CELL, "<cell>", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("name", [
    "prints", "appends", "sets_item", "sets_nested", "counts", "adds_to_item", "draws", "draws_numpy", "logs",
    "warns", "sets_global", "calls_a_printing_helper", "global_filter",
])
def test_effects_are_found(ns: dict[str, Any], name: str) -> None:
    assert side_effect(ns[name]) is not None


@pytest.mark.parametrize("name", ["builds_locally", "own_generator", "copies_first", "comprehension", "edits_argument", "quiet_division", "named_logger"])
def test_a_function_returning_values_only_has_none(ns: dict[str, Any], name: str) -> None:
    assert side_effect(ns[name]) is None


def test_changed_parameters_are_named(ns: dict[str, Any]) -> None:
    assert mutated_parameters(ns["edits_argument"]) == {"d"}
    assert mutated_parameters(ns["appends_to_argument"]) == {"items"}
    assert mutated_parameters(ns["copies_first"]) == set()


def test_library_functions_are_taken_as_returning_values() -> None:
    import json

    assert side_effect(print) is None and side_effect(json.dumps) is None
    assert side_effect(types.SimpleNamespace) is None


def test_a_local_modules_function_is_read_too(tmp_path, monkeypatch) -> None:
    (tmp_path / "nbr_effects_helpers.py").write_text("def report(x):\n    print('report', x)\n\ndef double(x):\n    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ns: dict[str, Any] = {"__name__": "__main__"}
    exec(compile("import nbr_effects_helpers as h\ndef f(x):\n    h.report(x)\n    return x\ndef g(x):\n    return h.double(x)\n",
                 "<cell>", "exec"), ns)
    try:
        assert side_effect(ns["f"]) == "report calls print()"
        assert side_effect(ns["g"]) is None
    finally:
        import sys

        sys.modules.pop("nbr_effects_helpers", None)

