"""reachable_ids: what a value reaches, which decides the co-variable groups a checkpoint
stores together (session/state.py groups names whose reaches overlap)."""

from __future__ import annotations

import collections
import functools
import json
import textwrap

import numpy as np
import pandas as pd

from nbrewind.analysis import reachable_ids


def notebook(code: str) -> dict[str, object]:
    ns: dict[str, object] = {"__name__": "__main__"}
    exec(textwrap.dedent(code), ns)
    del ns["__builtins__"]
    del ns["__name__"]
    return ns


def covariable_groups(ns: dict[str, object], names: list[str] | dict[str, object]) -> list[frozenset[str]]:
    """Names whose reaches overlap, as the checkpoint groups them; absent names stand alone."""
    groups: list[tuple[set[str], set[int]]] = []
    for name in names:
        reach = reachable_ids(ns[name]) if name in ns else set()
        merged = ({name}, set(reach))
        for group in [g for g in groups if g[1] & reach]:
            groups.remove(group)
            merged[0].update(group[0])
            merged[1].update(group[1])
        groups.append(merged)
    return sorted((frozenset(members) for members, _ in groups), key=min)


def groups_of(ns: dict[str, object]) -> set[frozenset[str]]:
    return set(covariable_groups(ns, ns))


def test_plain_alias() -> None:
    ns = notebook("a = [1, 2]\nb = a\nc = [1, 2]")
    assert groups_of(ns) == {frozenset({"a", "b"}), frozenset({"c"})}


def test_container_holding_another_variable() -> None:
    ns = notebook("lst = [1]\nd = {'x': lst}\nother = {'x': [1]}")
    assert groups_of(ns) == {frozenset({"d", "lst"}), frozenset({"other"})}


def test_dict_keys_tuples_sets_and_deques_are_walked() -> None:
    ns: dict[str, object] = {}
    key = ("k", object())
    ns.update(key=key, d={key: 1}, s={key}, q=collections.deque([[key]]), alone=[3])
    assert groups_of(ns) == {frozenset({"key", "d", "s", "q"}), frozenset({"alone"})}


def test_views_and_iterators_group_with_their_container() -> None:
    ns = notebook(
        """
        import itertools, operator, types
        d = {"a": [1]}
        lst = [1, 2]
        other = [3]
        ks, proxy, d_iter = d.keys(), types.MappingProxyType(d), iter(d.items())
        it, pairs, chained, caller = iter(lst), zip(lst, "xy"), itertools.chain(lst), operator.methodcaller("count", lst)
        gen = (x for x in other)
        """
    )
    del ns["itertools"], ns["operator"], ns["types"]
    assert groups_of(ns) == {
        frozenset({"d", "ks", "proxy", "d_iter"}),
        frozenset({"lst", "it", "pairs", "chained", "caller"}),
        frozenset({"other"}),
        frozenset({"gen"}),  # a generator is stored as itself or not at all, never walked
    }


def test_pandas_and_numpy_objects_over_a_frame_or_generator_group_with_it() -> None:
    """A groupby, a rolling window, `df.loc` and a column's `to_numpy()` (a view of the frame's
    block) see later changes to the frame; a bit generator advances with its Generator."""
    ns = notebook(
        """
        import numpy as np
        import pandas as pd
        df = pd.DataFrame({"k": [1, 1, 2], "v": [1.0, 2.0, 3.0]})
        g, loc, r, arr = df.groupby("k"), df.loc, df["v"].rolling(2), df["v"].to_numpy()
        idx, meta = df.index, df.attrs
        base = np.arange(3)
        window = np.lib.stride_tricks.sliding_window_view(base, 2)
        other = pd.DataFrame({"k": [1], "v": [1.0]})
        rng = np.random.default_rng(0)
        bg = rng.bit_generator
        a = np.arange(4)
        f = a.flat
        """
    )
    del ns["np"], ns["pd"]
    assert groups_of(ns) == {
        frozenset({"df", "g", "loc", "r", "arr", "idx", "meta"}),
        frozenset({"base", "window"}),
        frozenset({"other"}),
        frozenset({"rng", "bg"}),
        frozenset({"a", "f"}),
    }


def test_module_and_array_made_with_it_stay_apart() -> None:
    ns = notebook("import numpy as np\nimport pandas as pd\na = np.zeros(3)\ndf = pd.DataFrame({'x': a})")
    assert groups_of(ns) == {frozenset({"np"}), frozenset({"pd"}), frozenset({"a"}), frozenset({"df"})}


def test_array_view_groups_with_its_base() -> None:
    ns: dict[str, object] = {}
    a = np.arange(100)
    ns.update(a=a, v=a[:10], w=a[:10][2:], t=a.T, other=np.arange(100))
    assert groups_of(ns) == {frozenset({"a", "v", "w", "t"}), frozenset({"other"})}


def test_array_inside_a_container_groups_with_the_array() -> None:
    a = np.ones(4)
    ns: dict[str, object] = {"a": a, "cfg": {"weights": a[1:]}}
    assert groups_of(ns) == {frozenset({"a", "cfg"})}


def test_object_array_groups_with_what_its_elements_are() -> None:
    shared = [1]
    grid = np.empty((2, 2), dtype=object)
    grid[0, 0], grid[1, 1] = shared, "x"
    words = np.array(["a", "b" * 2000, 3, None], dtype=object)
    ns: dict[str, object] = {"grid": grid, "l": shared, "words": words, "b": words[1], "alone": [1]}
    assert groups_of(ns) == {frozenset({"grid", "l"}), frozenset({"words"}), frozenset({"b"}), frozenset({"alone"})}


def test_a_large_object_array_reaches_the_list_it_holds_not_its_strings() -> None:
    big = np.array([f"k{i}" for i in range(200_000)] + [[1]], dtype=object)
    reach = reachable_ids(big)
    assert id(big[-1]) in reach and len(reach) == 2


def test_shared_small_values_and_singletons_do_not_glue() -> None:
    ns = notebook("a = [1, 'x', None, True, 2.5, ()]\nb = [1, 'x', None, True, 2.5, ()]\nn = 1\ns = 'x'")
    assert len(groups_of(ns)) == 4


def test_dtypes_library_functions_and_classes_do_not_glue() -> None:
    x, y = np.zeros(2), np.zeros(3)
    ns: dict[str, object] = {
        "dx": x.dtype,
        "holder": [y.dtype, json.dumps, int, np.sqrt, len, np.float64],
        "f": json.dumps,
        "t": int,
        "sq": np.sqrt,
    }
    assert len(groups_of(ns)) == 5


def test_large_strings_and_bytes_group_small_ones_do_not() -> None:
    big, blob = "x" * 5000, b"y" * 5000
    ns: dict[str, object] = {"s": big, "t": [big], "b": blob, "c": {"k": blob}}
    assert groups_of(ns) == {frozenset({"s", "t"}), frozenset({"b", "c"})}


def test_mutable_buffers_and_memoryviews() -> None:
    buf = bytearray(b"abc")
    ns: dict[str, object] = {"buf": buf, "view": memoryview(buf), "held": [buf]}
    assert groups_of(ns) == {frozenset({"buf", "view", "held"})}


def test_object_attributes_and_slots() -> None:
    ns = notebook(
        """
        class Holder:
            def __init__(self, data):
                self.data = data
        class Slotted:
            __slots__ = ("item", "__secret", "unset")
            def __init__(self, item, secret):
                self.item = item
                self.__secret = secret
        lst = [1]
        hidden = [2]
        h = Holder(lst)
        s = Slotted(h, hidden)
        loner = Holder([3])
        """
    )
    groups = groups_of(ns)
    # Attributes and slots reach their values; an instance reaches its notebook class, so
    # instances of one class come back with that class (and see later changes to it).
    assert frozenset({"lst", "h", "s", "hidden", "loner", "Holder", "Slotted"}) in groups


def test_instances_of_library_classes_do_not_reach_their_class() -> None:
    ns = notebook(
        """
        import fractions
        a = fractions.Fraction(1, 2)
        b = fractions.Fraction(1, 3)
        """
    )
    groups = groups_of(ns)
    assert frozenset({"a"}) in groups and frozenset({"b"}) in groups


def test_functions_closures_methods_and_partials() -> None:
    ns = notebook(
        """
        import functools
        lst = []
        def make():
            def inner():
                return lst2
            lst2 = [1]
            return inner, lst2
        inner, lst2 = make()
        app = lst.append
        class C:
            registry = []
            def meth(self):
                return 1
        obj = C()
        m = obj.meth
        reg = C.registry
        p = functools.partial(print, lst2)
        """
    )
    groups = groups_of(ns)
    assert frozenset({"lst", "app"}) in groups
    assert frozenset({"inner", "lst2", "p"}) in groups
    assert frozenset({"C", "reg", "obj", "m"}) in groups  # m reaches obj and C.meth, which C holds
    assert frozenset({"functools"}) in groups


def test_names_missing_from_the_namespace_are_singletons() -> None:
    assert covariable_groups({"a": [1]}, ["a", "ghost"]) == [frozenset({"a"}), frozenset({"ghost"})]


def test_cycles_terminate() -> None:
    a: list[object] = []
    a.append(a)
    d: dict[str, object] = {}
    d["self"] = d
    assert reachable_ids(a) == {id(a)}
    assert groups_of({"a": a, "d": d}) == {frozenset({"a"}), frozenset({"d"})}


def test_bounds_stop_the_walk() -> None:
    deep: list[object] = []
    cursor = deep
    for _ in range(200):
        nxt: list[object] = []
        cursor.append(nxt)
        cursor = nxt
    assert len(reachable_ids(deep, max_depth=5)) == 6
    wide = [[i] for i in range(1000)]
    assert len(reachable_ids(wide, max_objects=10)) == 10


def test_reachable_ids_leaves() -> None:
    a = np.zeros(10)
    df = pd.DataFrame({"x": a})
    assert reachable_ids(a) == {id(a)}
    # A frame is not walked: it is indexed with what other names can share with it, its
    # block arrays (and their roots), its index and columns, and its attrs dict.
    blocks = df._mgr.arrays
    shared = {id(df), *(id(b) for b in blocks), id(df.index), id(df.columns), id(df.attrs)}
    assert reachable_ids(df) == shared | {id(b.base) for b in blocks if b.base is not None}
    assert reachable_ids(np) == set()
    assert reachable_ids(functools.partial) == set()


def test_large_arrays_and_frames_are_leaves_of_the_walk() -> None:
    ns: dict[str, object] = {f"v{i}": {"i": i, "items": [i, str(i)]} for i in range(98)}
    ns["big"] = np.zeros(25_000_000)  # 200 MB
    ns["frame"] = pd.DataFrame({"a": np.arange(1_000_000), "b": np.arange(1_000_000) * 0.5})
    assert len(covariable_groups(ns, ns)) == 100
    assert reachable_ids(ns["big"]) == {id(ns["big"])}  # never walked element by element


def test_enum_members_patterns_and_other_immutable_values_do_not_glue() -> None:
    ns = notebook(
        """
        import re, enum, datetime, pathlib
        class Color(enum.Enum):
            RED = 1
        a = [re.I, Color.RED, re.compile("x"), datetime.date(2024, 1, 1), pathlib.Path("p"), range(3)]
        b = {"flags": re.I, "c": Color.RED, "pat": re.compile("x"), "r": a[5], "p": a[4]}
        """
    )
    groups = groups_of(ns)
    assert frozenset({"a"}) in groups and frozenset({"b"}) in groups


def test_the_walk_imports_nothing() -> None:
    """numpy loads `numpy.random` (seeding its global RNG) on first attribute access; the
    walk must not be what loads it, or a checkpoint would change the RNG state it records."""
    import subprocess
    import sys

    for setup in ("import numpy", "import numpy, pandas"):
        code = (
            f"import sys\n{setup}\n"
            "from nbrewind.analysis import reachable_ids\n"
            "values = {'a': numpy.arange(3), 'f': numpy.arange(2).flat}\n"
            "if 'pandas' in sys.modules:\n"
            "    values['df'] = sys.modules['pandas'].DataFrame({'v': [1]})\n"
            "    values['g'] = values['df'].groupby('v')\n"
            "loaded = set(sys.modules)\n"
            "reachable_ids(values)\n"
            "print(sorted(set(sys.modules) - loaded))\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
        assert out.stdout.strip() == "[]", (setup, out.stdout)
