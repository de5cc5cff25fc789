"""Fingerprints are a function of content only: not of which sub-objects are shared, of a
pickling round trip, or of the process that computed them.

Every graph here carries a library object (a ``SimpleNamespace`` of lists, which
Dask does not unpack into graph nodes as it does a dict) as a task argument. Whether its two lists are one object or two equal ones is not content, but
a pickle's memo sees the difference: hashing the memo's bytes (which the code before
this test pickled with as soon as an object was met twice) gave a restored or
rebuilt collection other fingerprints than the original.
"""

from __future__ import annotations

import collections
import json
import pickle
import subprocess
import sys
import types
from typing import Any

import pytest

dask = pytest.importorskip("dask")
cloudpickle = pytest.importorskip("cloudpickle")

from nbrewind.tasks.fingerprint import Fingerprinter  # noqa: E402

BUILD = r'''
import types, numpy as np, pandas as pd
import dask.array as da, dask.bag as db, dask.dataframe as dd

ns = {"__name__": "__main__"}
exec("def scale(block, cfg):\n    return block * cfg.a[0] + cfg.b[1]\n", ns)
scale = ns["scale"]


def config(shared):
    a = [2.0, 3.0]
    return types.SimpleNamespace(a=a, b=a if shared else list(a))


def build(kind, shared):
    cfg = config(shared)
    if kind == "dataframe":
        frame = dd.from_pandas(pd.DataFrame({"x": np.arange(40.0)}), npartitions=4)
        return frame.x.map_partitions(scale, cfg, meta=("x", "f8")).sum()
    if kind == "bag":
        return db.from_sequence(range(40), npartitions=4).map(scale, cfg).sum()
    array = {
        "ones": lambda: da.ones((40,), chunks=10),
        "zeros": lambda: da.zeros((40,), chunks=10),
        "full": lambda: da.full((40,), 7.0, chunks=10),
        "from_array": lambda: da.from_array(np.arange(40.0), chunks=10),
    }[kind]()
    return array.map_blocks(scale, cfg, dtype=float).sum()


def fingerprints(collection):
    from dask._expr import FinalizeCompute
    from dask._task_spec import convert_legacy_graph
    from dask.base import collections_to_expr
    from nbrewind.tasks.fingerprint import Fingerprinter

    expr = FinalizeCompute(collections_to_expr([collection], True)).optimize()
    dsk = convert_legacy_graph(dict(expr.__dask_graph__()))
    # Finalize keys carry a random token; every other task is fingerprinted.
    keys = [k for k in dsk if not str(k).startswith("finalize")]
    fp = Fingerprinter()
    fps = fp.fingerprint_graph(dsk, keys)
    assert not fp.failures, fp.failures
    return sorted(fps[k] for k in keys)
'''

KINDS = ["ones", "zeros", "full", "from_array", "dataframe", "bag"]


def _here() -> dict[str, Any]:
    ns: dict[str, Any] = {}
    # Not inheriting this module's `from __future__ import annotations`, which sets a code
    # flag the subprocesses' functions lack (the flag is part of a function's code).
    exec(compile(BUILD, "<build>", "exec", dont_inherit=True), ns)
    return ns


def test_shared_and_unshared_sub_objects_fingerprint_alike() -> None:
    fv = Fingerprinter().fingerprint_value
    lst = [1, "two", 3.0]
    assert fv(collections.OrderedDict(a=lst, b=lst)) == fv(collections.OrderedDict(a=lst, b=list(lst)))
    assert fv(types.SimpleNamespace(a=lst, b=lst)) == fv(types.SimpleNamespace(a=lst, b=list(lst)))
    d = {"k": [1]}
    assert fv(collections.OrderedDict(x=d, y=d)) == fv(collections.OrderedDict(x=d, y={"k": [1]}))
    # Content still counts.
    assert fv(collections.OrderedDict(a=lst, b=lst)) != fv(collections.OrderedDict(a=lst, b=[1, "two", 4.0]))
    # A cycle through library objects is content too (a back-reference by depth, not a memo entry).
    one, two, again_one, again_two = (types.SimpleNamespace() for _ in range(4))
    one.other, two.other, again_one.other, again_two.other = two, one, again_two, again_one
    assert fv(one) == fv(again_one)
    again_two.extra = 1
    assert fv(one) != fv(again_one)


@pytest.mark.parametrize("kind", KINDS)
def test_a_graph_fingerprints_alike_shared_unshared_and_after_a_cloudpickle_round_trip(kind: str) -> None:
    ns = _here()
    fresh = ns["fingerprints"](ns["build"](kind, True))
    unshared = ns["fingerprints"](ns["build"](kind, False))
    restored = ns["fingerprints"](pickle.loads(cloudpickle.dumps(ns["build"](kind, False))))
    assert len(fresh) >= 5 and unshared == fresh and restored == fresh


@pytest.mark.parametrize("kind", KINDS)
def test_a_graph_fingerprints_alike_in_another_process(kind: str) -> None:
    """The other process builds the graph with equal but unshared lists, pickles it,
    and a third process restores it: all three agree with this one."""
    ns = _here()
    here = ns["fingerprints"](ns["build"](kind, True))
    script = BUILD + (
        "import sys, json, pickle, cloudpickle\n"
        "kind, mode = sys.argv[1], sys.argv[2]\n"
        "if mode == 'dump':\n"
        "    c = build(kind, False)\n"
        "    sys.stdout.buffer.write(cloudpickle.dumps(c))\n"
        "else:\n"
        "    c = pickle.loads(sys.stdin.buffer.read())\n"
        "    print(json.dumps(fingerprints(c)))\n"
    )
    dumped = subprocess.run([sys.executable, "-c", script, kind, "dump"], capture_output=True, check=True).stdout
    loaded = subprocess.run([sys.executable, "-c", script, kind, "load"], input=dumped, capture_output=True, check=True)
    assert json.loads(loaded.stdout) == here
