"""Task fingerprints: stability, sensitivity to what matters, blindness to what does not."""

from __future__ import annotations

import functools
import importlib
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import threading
from typing import Any

import numpy as np
import pandas as pd
import pytest
import xxhash
from dask._task_spec import Alias, DataNode, List, Task, TaskRef

from nbrewind.errors import NbrewindError
from nbrewind.tasks.fingerprint import Fingerprinter, UnfingerprintableError

REPO = pathlib.Path(__file__).resolve().parents[2]


def notebook(src: str, *, offset: int = 0, **names: Any) -> dict[str, Any]:
    """Run ``src`` as a notebook cell would: in a namespace whose ``__name__`` is ``__main__``."""
    ns: dict[str, Any] = {"__name__": "__main__", **names}
    exec(compile("\n" * offset + textwrap.dedent(src), "<cell>", "exec"), ns)
    return ns


def fn_fp(fn: Any) -> str:
    return Fingerprinter().fingerprint_function(fn)


def task_fp(func: Any, *args: Any, **kwargs: Any) -> str:
    return Fingerprinter().fingerprint_graph({"t": Task("t", func, *args, **kwargs)})["t"]


# ---------------------------------------------------------------- golden values

def test_golden_fingerprints_are_pinned() -> None:
    # These do not involve functions, whose fingerprints carry Python and library
    # versions by design. A change here invalidates every user's task cache.
    fp = Fingerprinter()
    dsk = {
        "a": DataNode("a", 1),
        "b": DataNode("b", ("x", 2.5, None, True, b"\x00")),
        "c": List(TaskRef("a"), TaskRef("b"), 3),
        "d": Alias("d", "c"),
    }
    assert fp.fingerprint_graph(dsk) == {
        "a": "5296db4cb9239657122e54be58e4490c",
        "b": "8f8ba37a8dfa3dc7fb3000d48ecef81f",
        "c": "6215ccfd27468332a03cbae293a7d2f6",
        "d": "6215ccfd27468332a03cbae293a7d2f6",
    }
    assert fp.fingerprint_value({"k": [1, 2], "s": {3, 1}}) == "582860f8ff8429e0a3167b0bebbb88cd"
    assert fp.fingerprint_value(np.arange(6, dtype="<i8").reshape(2, 3)) == "fce5bc90d587520664072f9fce0a7bca"
    # The scheme, re-derived by hand for the simplest case: scheme, DataNode tag, int 1.
    assert xxhash.xxh3_128_hexdigest(b"nbrewind-fp/2;D" + b"i1;") == "5296db4cb9239657122e54be58e4490c"


# ---------------------------------------------------------------- process independence

_SUBPROCESS = r"""
import json, sys, textwrap
from dask._task_spec import DataNode, Task, TaskRef
from nbrewind.tasks.fingerprint import Fingerprinter
ns = {"__name__": "__main__"}
exec(textwrap.dedent('''
    TABLE = {"alpha": 1, "beta": 2}
    TAGS = {"red", "green", "blue", "cyan"}
    def score(row, key):
        return TABLE[key] * len(TAGS) + row
'''), ns)
dsk = {
    "row": DataNode("row", frozenset({"u", "v", "w", "x", "y"})),
    "s": Task("s", ns["score"], 3, "alpha"),
    "t": Task("t", ns["score"], TaskRef("s"), key="beta"),
}
print(json.dumps(Fingerprinter().fingerprint_graph(dsk)))
"""


def _run_fresh(seed: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", _SUBPROCESS], env=env, cwd=REPO,
                          capture_output=True, text=True, check=True, timeout=120)
    result: dict[str, str] = json.loads(done.stdout)
    return result


def test_same_fingerprints_in_fresh_processes_with_different_hash_seeds() -> None:
    first, second = _run_fresh("1"), _run_fresh("12345")
    assert first == second
    assert len(set(first.values())) == 3


# ---------------------------------------------------------------- function code

BASE = """
    SCALE = 3
    def helper(x):
        return x * SCALE
    def work(x, y=1):
        return helper(x) + y
"""


def test_edited_function_body_changes_fingerprint() -> None:
    a = notebook(BASE)["work"]
    b = notebook(BASE.replace("helper(x) + y", "helper(x) - y"))["work"]
    assert fn_fp(a) != fn_fp(b)


def test_edited_helper_changes_caller_fingerprint() -> None:
    a = notebook(BASE)["work"]
    b = notebook(BASE.replace("x * SCALE", "x ** SCALE"))["work"]
    assert fn_fp(a) != fn_fp(b)


def test_edited_global_constant_changes_fingerprint() -> None:
    ns = notebook(BASE)
    before = fn_fp(ns["work"])
    ns["SCALE"] = 4
    assert fn_fp(ns["work"]) != before
    ns["SCALE"] = 3
    assert fn_fp(ns["work"]) == before


def test_environment_variables_a_function_reads_change_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    """`os.environ["K"]` and `os.getenv(KEY)` with KEY a string global: the variable's value
    is part of the fingerprint; other variables are not."""
    ns = notebook("""
        import os
        KEY = "NBR_FP_B"
        def work(x):
            return x * int(os.environ["NBR_FP_A"]) + int(os.getenv(KEY, "0"))
        def plain(x):
            return x + 1
    """)
    for name in ("NBR_FP_A", "NBR_FP_B"):
        monkeypatch.setenv(name, "1")
    before, plain = fn_fp(ns["work"]), fn_fp(ns["plain"])
    for name in ("NBR_FP_A", "NBR_FP_B"):
        monkeypatch.setenv(name, "2")
        assert fn_fp(ns["work"]) != before, name
        monkeypatch.setenv(name, "1")
    assert fn_fp(ns["work"]) == before
    monkeypatch.setenv("NBR_FP_OTHER", "9")
    assert fn_fp(ns["work"]) == before and fn_fp(ns["plain"]) == plain


def test_default_argument_and_closure_value_change_fingerprint() -> None:
    assert fn_fp(notebook(BASE)["work"]) != fn_fp(notebook(BASE.replace("y=1", "y=2"))["work"])
    make = notebook("""
        def make(n):
            def add(x):
                return x + n
            return add
    """)["make"]
    assert fn_fp(make(1)) != fn_fp(make(2))
    assert fn_fp(make(1)) == fn_fp(make(1))


def test_whitespace_comments_line_numbers_and_docstrings_do_not_matter() -> None:
    plain = notebook(BASE)["work"]
    moved = notebook(BASE, offset=40)["work"]
    noisy = notebook("""
        # a comment before everything
        SCALE = 3


        def helper(x):   # trailing comment
            '''Scale x.'''

            return x * SCALE      # why: spec says so
        def work(x, y=1):
            \"\"\"Docstrings are documentation, not computation.\"\"\"
            # comment inside
            return helper(x) + y
    """, offset=7)["work"]
    assert fn_fp(plain) == fn_fp(moved) == fn_fp(noisy)


def test_string_constants_are_not_mistaken_for_docstrings() -> None:
    a = notebook("f = lambda: 'abc'")["f"]
    b = notebook("f = lambda: 'xyz'")["f"]
    c = notebook("def f():\n    return 'abc'")["f"]
    d = notebook("def f():\n    return 'xyz'")["f"]
    assert fn_fp(a) != fn_fp(b)
    assert fn_fp(c) != fn_fp(d)


def test_mutually_recursive_functions_are_cycle_safe_and_order_independent() -> None:
    src = """
        def even(n):
            return True if n == 0 else odd(n - 1)
        def odd(n):
            return False if n == 0 else even(n - 1)
    """
    ns = notebook(src)
    fp1 = Fingerprinter()
    e1, o1 = fp1.fingerprint_function(ns["even"]), fp1.fingerprint_function(ns["odd"])
    # Opposite order, and both inside one run where one is reached through the other.
    g = Fingerprinter().fingerprint_graph({
        "o": Task("o", ns["odd"], 3), "e": Task("e", ns["even"], 3),
        "ve": DataNode("ve", ns["even"]), "vo": DataNode("vo", ns["odd"]),
    })
    g2 = Fingerprinter().fingerprint_graph({"vo": DataNode("vo", ns["odd"]), "ve": DataNode("ve", ns["even"])})
    assert e1 != o1
    assert g["ve"] == g2["ve"] and g["vo"] == g2["vo"]
    changed = notebook(src.replace("n - 1)\n        def odd", "n - 2)\n        def odd"))
    assert fn_fp(changed["odd"]) != o1


def test_user_module_function_is_identified_by_code(tmp_path: pathlib.Path) -> None:
    mod_name = "nbrewind_fp_helper_mod"
    (tmp_path / f"{mod_name}.py").write_text("K = 2\ndef f(x):\n    return x * K\n")
    sys.path.insert(0, str(tmp_path))
    try:
        mod = importlib.import_module(mod_name)
        user = notebook(f"import {mod_name} as h\ndef g(x):\n    return h.f(x) + 1\n")["g"]
        before, before_g = fn_fp(mod.f), fn_fp(user)
        mod.K = 5
        assert fn_fp(mod.f) != before
        assert fn_fp(user) != before_g
        (tmp_path / f"{mod_name}.py").write_text("K = 2\ndef f(x):\n    return x + K\n")
        importlib.reload(mod)
        assert fn_fp(mod.f) != before
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(mod_name, None)


def test_library_functions_by_name_and_version() -> None:
    assert fn_fp(np.add) == fn_fp(np.add)
    assert fn_fp(np.add) != fn_fp(np.subtract)
    assert fn_fp(pd.concat) != fn_fp(pd.merge)
    assert fn_fp(len) != fn_fp(sum)


def test_partial_bound_method_and_callable_instance() -> None:
    ns = notebook("""
        def power(x, p):
            return x ** p
        class Scaler:
            def __init__(self, k):
                self.k = k
            def __call__(self, x):
                return x * self.k
            def apply(self, x):
                return x * self.k
    """)
    power, scaler = ns["power"], ns["Scaler"]
    assert fn_fp(functools.partial(power, p=2)) != fn_fp(functools.partial(power, p=3))
    assert fn_fp(scaler(2)) == fn_fp(scaler(2))
    assert fn_fp(scaler(2)) != fn_fp(scaler(3))
    assert fn_fp(scaler(2).apply) != fn_fp(scaler(3).apply)
    edited = notebook(textwrap.dedent("""
        class Scaler:
            def __init__(self, k):
                self.k = k
            def __call__(self, x):
                return x * self.k + 1
    """))["Scaler"]
    assert fn_fp(scaler(2)) != fn_fp(edited(2))


# ---------------------------------------------------------------- arguments

def test_numpy_and_pandas_arguments_by_content() -> None:
    a = np.arange(1000.0)
    assert task_fp(np.sum, a) == task_fp(np.sum, a.copy())
    b = a.copy()
    b[500] += 1
    assert task_fp(np.sum, a) != task_fp(np.sum, b)
    assert task_fp(np.sum, a) != task_fp(np.sum, a.astype("float32"))
    assert task_fp(np.sum, a[::2]) == task_fp(np.sum, np.ascontiguousarray(a[::2]))

    df = pd.DataFrame({"x": np.arange(50), "y": np.arange(50.0), "s": [f"v{i}" for i in range(50)]})
    assert task_fp(len, df) == task_fp(len, df.copy())
    changed = df.copy()
    changed.loc[3, "s"] = "other"
    assert task_fp(len, df) != task_fp(len, changed)
    assert task_fp(len, df) != task_fp(len, df.rename(columns={"x": "z"}))
    assert task_fp(len, df["y"]) != task_fp(len, df["y"].set_axis(np.arange(50) + 1))


def test_sets_and_literals_are_tagged_and_order_free() -> None:
    fp = Fingerprinter()
    words = [f"w{i}" for i in range(40)]
    assert fp.fingerprint_value(set(words)) == fp.fingerprint_value(set(reversed(words)))
    values = [1, 1.0, True, "1", b"1", (1,), [1], None, 0, False, -0.0, 0.0]
    assert len({fp.fingerprint_value(v) for v in values}) == len(values)


def test_file_argument_includes_content(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "data.csv"
    path.write_text("a,b\n1,2\n")
    before_str, before_path = task_fp(len, str(path)), task_fp(len, path)
    path.write_text("a,b\n1,3\n")
    assert task_fp(len, str(path)) != before_str
    assert task_fp(len, path) != before_path
    assert task_fp(len, str(tmp_path / "missing.csv")) == task_fp(len, str(tmp_path / "missing.csv"))


def test_file_named_in_function_constant_is_tracked(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "table.txt"
    path.write_text("one")
    ns = notebook(f"def load():\n    return open({str(path)!r}).read()\n")
    before = fn_fp(ns["load"])
    path.write_text("two")
    assert fn_fp(ns["load"]) != before


def test_unfingerprintable_argument_marks_task_and_dependents() -> None:
    lock = threading.Lock()
    with pytest.raises(UnfingerprintableError):
        Fingerprinter().fingerprint_value(lock)
    assert issubclass(UnfingerprintableError, NbrewindError)
    fp = Fingerprinter()
    result = fp.fingerprint_graph({
        "bad": Task("bad", id, lock),
        "after": Task("after", str, TaskRef("bad")),
        "fine": Task("fine", str, 1),
    })
    assert set(result) == {"fine"}
    assert set(fp.failures) == {"bad", "after"}


# ---------------------------------------------------------------- graphs

def _chain(names: dict[str, str], inc: Any, start: int = 1) -> dict[Any, Any]:
    return {
        names["a"]: DataNode(names["a"], start),
        names["b"]: Task(names["b"], inc, TaskRef(names["a"])),
        names["c"]: Task(names["c"], inc, TaskRef(names["b"])),
        names["s"]: Task(names["s"], inc, 100),
    }


def test_key_names_do_not_matter_and_changes_propagate_only_downstream() -> None:
    inc = notebook("def inc(x):\n    return x + 1\n")["inc"]
    plain = Fingerprinter().fingerprint_graph(_chain(dict(a="a", b="b", c="c", s="s"), inc))
    renamed_keys = dict(a=("x-1", 0), b=("x-2", 5), c="zzz", s=("q", 1, 2))
    renamed = Fingerprinter().fingerprint_graph(_chain(renamed_keys, inc))
    assert [plain[k] for k in "abcs"] == [renamed[renamed_keys[k]] for k in "abcs"]
    changed = Fingerprinter().fingerprint_graph(_chain(dict(a="a", b="b", c="c", s="s"), inc, start=2))
    assert changed["a"] != plain["a"] and changed["b"] != plain["b"] and changed["c"] != plain["c"]
    assert changed["s"] == plain["s"]


def test_keys_subset_and_external_keys() -> None:
    inc = notebook("def inc(x):\n    return x + 1\n")["inc"]
    fp = Fingerprinter()
    full = fp.fingerprint_graph(_chain(dict(a="a", b="b", c="c", s="s"), inc))
    part = fp.fingerprint_graph(_chain(dict(a="a", b="b", c="c", s="s"), inc), keys_subset=["b"])
    assert part == {"a": full["a"], "b": full["b"]}
    dsk = {"c": Task("c", inc, TaskRef("b"))}
    assert fp.fingerprint_graph(dsk) == {} and "b" in fp.failures
    assert fp.fingerprint_graph(dsk, external={"b": full["b"]}) == {"c": full["c"]}


def test_legacy_tuple_graph_matches_task_spec_graph() -> None:
    inc = notebook("def inc(x):\n    return x + 1\n")["inc"]
    legacy = {"a": 1, "b": (inc, "a"), "c": (sum, ["a", "b"])}
    modern = {"a": DataNode("a", 1), "b": Task("b", inc, TaskRef("a")),
              "c": Task("c", sum, List(TaskRef("a"), TaskRef("b")))}
    assert Fingerprinter().fingerprint_graph(legacy) == Fingerprinter().fingerprint_graph(modern)


def test_array_chain_output_fingerprint_independent_of_optimization() -> None:
    import dask
    import dask.array as da

    y = ((da.ones((40, 40), chunks=(10, 10)) + 1) * 2).sum()
    (optimized,) = dask.optimize(y)
    key = y.__dask_keys__()[0]
    raw = Fingerprinter().fingerprint_graph(dict(y.__dask_graph__()))
    opt_graph = dict(optimized.__dask_graph__())
    assert any(isinstance(t, Task) and t.has_subgraph() for t in opt_graph.values())
    assert Fingerprinter().fingerprint_graph(opt_graph)[key] == raw[key]
    changed = ((da.ones((40, 40), chunks=(10, 10)) + 2) * 2).sum()
    assert Fingerprinter().fingerprint_graph(dict(changed.__dask_graph__()))[changed.__dask_keys__()[0]] != raw[key]


def test_delayed_chain_output_fingerprint_independent_of_fusion() -> None:
    import dask
    from dask import delayed

    ns = notebook("def inc(x):\n    return x + 1\ndef dbl(x):\n    return 2 * x\n")
    out = delayed(ns["inc"])(delayed(ns["dbl"])(delayed(ns["inc"])(1)))
    with dask.config.set({"optimization.fuse.delayed": True}):
        (fused,) = dask.optimize(out)
    fused_graph = dict(fused.__dask_graph__())
    assert len(fused_graph) < len(dict(out.__dask_graph__()))
    assert (Fingerprinter().fingerprint_graph(fused_graph)[fused.key]
            == Fingerprinter().fingerprint_graph(dict(out.__dask_graph__()))[out.key])


def test_fused_tasks_sharing_one_inner_graph_are_told_apart_by_their_inputs() -> None:
    """Blockwise fusion shares one inner graph between chunks; the per-run memo of fused
    tokens keys on what each input is bound to, so different inputs give different
    fingerprints and equal ones the fingerprint an unshared copy has."""
    from dask._task_spec import _execute_subgraph

    inner = {"out": Task("out", max, TaskRef("a"), TaskRef("b"))}

    def fused(key: str, a: Any, b: Any, graph: dict[str, Any] = inner) -> Task:
        return Task(key, _execute_subgraph, graph, "out", ("a", "b"), a, b)

    graph = {
        "x1": Task("x1", int, 1), "x2": Task("x2", int, 2),
        "f1": fused("f1", DataNode(None, 1), DataNode(None, 2)),
        "f2": fused("f2", DataNode(None, 1), DataNode(None, 3)),
        "f3": fused("f3", DataNode(None, 2), DataNode(None, 1)),
        "f4": fused("f4", TaskRef("x1"), DataNode(None, 2)),
        "f5": fused("f5", TaskRef("x2"), DataNode(None, 2)),
        "f6": fused("f6", DataNode(None, 1), DataNode(None, 2)),
        "f7": fused("f7", DataNode(None, 1), DataNode(None, 2), {"out": Task("out", max, TaskRef("a"), TaskRef("b"))}),
    }
    fps = Fingerprinter().fingerprint_graph(graph)
    assert len({fps[k] for k in ("f1", "f2", "f3", "f4", "f5")}) == 5
    assert fps["f1"] == fps["f6"] == fps["f7"]
    alone = {k: Fingerprinter().fingerprint_graph({k: graph[k], "x1": graph["x1"], "x2": graph["x2"]})[k]
             for k in ("f1", "f2", "f3", "f4", "f5")}
    assert alone == {k: fps[k] for k in alone}


def test_an_attribute_name_is_not_mistaken_for_a_global() -> None:
    """`os.path.basename` uses the attribute name `path`; the notebook's global `path` is no input."""
    source = "import os\npath = 'a'\ndef base(p):\n    return os.path.basename(p)\n"
    first = notebook(source)["base"]
    second = notebook(source.replace("path = 'a'", "path = 'b'"))["base"]
    assert fn_fp(first) == fn_fp(second)
    reads_global = "path = 'a'\ndef base(p):\n    return path + p\n"
    assert fn_fp(notebook(reads_global)["base"]) != fn_fp(notebook(reads_global.replace("'a'", "'b'"))["base"])


# ---------------------------------------------------------------- round trips


def test_a_collection_fingerprints_the_same_after_a_pickle_round_trip() -> None:
    # da.ones carries a toolz.curry whose pickle shares a string before the round trip and
    # not after; hashing pickles with their memo gave 9 of 61 keys the same fingerprint.
    import pickle

    import dask.array as da

    x = (da.ones((400, 400), chunks=100) + np.arange(400.0)).sum(axis=0)
    y = pickle.loads(pickle.dumps(x, protocol=5))
    before = Fingerprinter().fingerprint_graph(dict(x.__dask_graph__()))
    after = Fingerprinter().fingerprint_graph(dict(y.__dask_graph__()))
    assert len(before) == 61 and after == before


def test_nbrewind_functions_called_by_a_task_are_library_code_however_it_is_installed() -> None:
    """`publish` imported by name from its module was keyed by content in an editable install,
    reading its module's ContextVar, and the task was refused: now it is `nbrewind==<version>`."""
    import nbrewind
    from nbrewind.identity.modules import distribution_version, library_label
    from nbrewind.tasks import resume

    assert library_label(resume) == f"nbrewind=={distribution_version('nbrewind')}"
    by_name = notebook("def f(x):\n    publish('p', x)\n    return x + 1", publish=resume.publish)["f"]
    by_attribute = notebook("def f(x):\n    nbrewind.publish('p', x)\n    return x + 1", nbrewind=nbrewind)["f"]
    assert fn_fp(by_name) != fn_fp(by_attribute)  # both fingerprint, and differ by the code that calls
