"""global_names_of and transitive_reads over functions defined "in the notebook".

Code is exec'd in a namespace whose __name__ is "__main__", as in a kernel, so
functions and classes get __module__ == "__main__".
"""

from __future__ import annotations

import functools
import json
import textwrap

from nbrewind.analysis import global_names_of, is_notebook_object, transitive_reads, value_reads


def notebook(code: str, ns: dict[str, object] | None = None) -> dict[str, object]:
    ns = {"__name__": "__main__"} if ns is None else ns
    exec(textwrap.dedent(code), ns)
    return ns


def test_function_globals_exclude_locals_params_and_attributes() -> None:
    ns = notebook(
        """
        def f(x):
            y = helper(x) + K
            return np.zeros(y)
        """
    )
    assert global_names_of(ns["f"]) == {"helper", "K", "np"}


def test_nested_code_objects_are_included() -> None:
    ns = notebook(
        """
        def f():
            def g():
                return A
            return [B for _ in range(2)], (lambda: C)
        """
    )
    assert global_names_of(ns["f"]) == {"A", "B", "C", "range"}


def test_class_methods_properties_static_and_class_methods() -> None:
    ns = notebook(
        """
        class C:
            def m(self):
                return A
            @property
            def p(self):
                return B
            @staticmethod
            def s():
                return D
            @classmethod
            def c(cls):
                return E
        obj = C()
        """
    )
    names = global_names_of(ns["C"])
    assert {"A", "B", "D", "E"} <= names
    assert global_names_of(ns["obj"].m) == {"A"}  # type: ignore[attr-defined]


def test_lambda_and_builtins() -> None:
    ns = notebook("f = lambda x: x * SCALE")
    assert global_names_of(ns["f"]) == {"SCALE"}
    assert global_names_of(len) == frozenset()
    assert global_names_of(42) == frozenset()


def test_is_notebook_object() -> None:
    ns = notebook("def f(): pass\nclass C: pass\nc = C()")
    assert is_notebook_object(ns["f"]) and is_notebook_object(ns["C"])
    assert not is_notebook_object(ns["c"])  # an instance is data, not code
    assert not is_notebook_object(json.dumps)


def test_global_constant_read_by_a_helper() -> None:
    ns = notebook(
        """
        SCALE = 3
        def helper(x):
            return x * SCALE
        def f(x):
            return helper(x)
        """
    )
    assert transitive_reads({"f", "data"}, ns) == {"f", "data", "helper", "SCALE"}


def test_edited_helper_changes_the_reads() -> None:
    ns = notebook("def helper(x):\n    return x * SCALE\ndef f(x):\n    return helper(x)")
    assert "SCALE" in transitive_reads({"f"}, ns)
    notebook("def helper(x):\n    return x + OFFSET", ns)  # the user edits and re-runs the helper cell
    reads = transitive_reads({"f"}, ns)
    assert "OFFSET" in reads and "SCALE" not in reads


def test_functions_calling_each_other_terminate() -> None:
    ns = notebook(
        """
        def ping(n):
            return pong(n - 1) if n else P
        def pong(n):
            return ping(n - 1) if n else Q
        """
    )
    assert transitive_reads({"ping"}, ns) == {"ping", "pong", "P", "Q"}


def test_closure_holding_a_notebook_function() -> None:
    ns = notebook(
        """
        def deco(fn):
            def wrapper():
                return fn()
            return wrapper
        def base():
            return SECRET
        w = deco(base)
        """
    )
    assert "base" not in global_names_of(ns["w"])  # fn is a closure variable
    assert "SECRET" in transitive_reads({"w"}, ns)


def test_closure_from_a_factory() -> None:
    ns = notebook("def make():\n    def inner():\n        return HIDDEN\n    return inner\nh = make()")
    assert "HIDDEN" in transitive_reads({"h"}, ns)


def test_default_argument_and_wrapped_functions() -> None:
    ns = notebook(
        """
        import functools
        def base():
            return SECRET
        def f(cb=base):
            return cb()
        cached = functools.lru_cache(base)
        part = functools.partial(f)
        """
    )
    assert "SECRET" in transitive_reads({"f"}, ns)
    assert "SECRET" in transitive_reads({"cached"}, ns)
    assert "SECRET" in transitive_reads({"part"}, ns)


def test_instance_of_a_notebook_class_and_base_classes() -> None:
    ns = notebook(
        """
        class Base:
            def score(self):
                return METRIC
        class Model(Base):
            def predict(self):
                return WEIGHTS
        m = Model()
        """
    )
    assert {"METRIC", "WEIGHTS"} <= transitive_reads({"m"}, ns)


def test_library_functions_and_data_are_not_followed() -> None:
    ns = {"dump": json.dumps, "part": functools.partial(json.dumps, indent=2), "data": [1, 2]}
    assert transitive_reads({"dump", "part", "data"}, ns) == {"dump", "part", "data"}


def test_custom_predicate_and_missing_names() -> None:
    ns = notebook("def f():\n    return K")
    assert transitive_reads({"f"}, ns, is_user_function=lambda obj: False) == {"f"}
    assert transitive_reads({"nope"}, ns) == {"nope"}


def test_objects_that_make_up_attributes_are_not_taken_for_generators() -> None:
    """A dask Delayed answers any attribute with another Delayed, whose truth raises: the walk
    must ask for a generator's frame only of a generator (a cell holding delayed objects was
    left unrecorded)."""
    import dask

    ns: dict[str, object] = {"__name__": "__main__"}
    exec("STEP = 3\ndef gen(n):\n    for i in range(n):\n        yield i * STEP\ng = gen(4)\nnext(g)", ns)
    ns["lazy"] = dask.delayed(sum)([1, 2])
    assert value_reads(ns["lazy"]) == frozenset()
    assert "STEP" in value_reads(ns["g"])
    assert "STEP" in transitive_reads({"g", "lazy"}, ns)


def test_globals_a_function_assigns_or_deletes_count_as_read() -> None:
    """`global k; k = 3` leaves k as it was when the assignment does not run (or stores the
    value k had): the call depends on k before it."""
    ns: dict[str, object] = {"__name__": "__main__"}
    exec("def reset(flag):\n    global k, gone\n    if flag:\n        k = 3\n    del gone", ns)
    assert {"k", "gone"} <= global_names_of(ns["reset"])
