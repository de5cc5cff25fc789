"""analyze_cell: reads, writes, deletes, mutations, call sites and dynamic constructs."""

from __future__ import annotations

import sys

import pytest

from nbrewind.analysis import CallSite, CellEffects, analyze_cell


def src(*lines: str) -> str:
    return "\n".join(lines) + "\n"


# -- writes: every binding form ----------------------------------------------

@pytest.mark.parametrize(
    ("source", "writes"),
    [
        ("a = 1", {"a"}),
        ("a = b = 1", {"a", "b"}),
        ("a, (b, *c) = t", {"a", "b", "c"}),
        ("[a, b] = t", {"a", "b"}),
        ("*a, b = t", {"a", "b"}),
        ("a += 1", {"a"}),
        ("a: int = 1", {"a"}),
        ("a: int", set()),
        ("(a := 1)", {"a"}),
        ("[y := v for v in data]", {"y"}),
        ("for i, (j, k) in pairs: pass", {"i", "j", "k"}),
        ("async def f():\n    async for i in r: pass", {"f"}),
        ("with cm() as c, other() as (d, e): pass", {"c", "d", "e"}),
        (src("try:", "    pass", "except E as err:", "    pass"), {"err"}),
        ("import os", {"os"}),
        ("import a.b.c", {"a"}),
        ("import a.b as ab", {"ab"}),
        ("from m import x, y as z", {"x", "z"}),
        ("from . import sibling", {"sibling"}),
        ("def f(): pass", {"f"}),
        ("async def g(): pass", {"g"}),
        ("@dec\nclass C: pass", {"C"}),
        (
            src(
                "match p:",
                "    case Point(x=a) | Point(y=a) as q: pass",
                "    case [first, *rest]: pass",
                "    case {'k': v, **others}: pass",
            ),
            {"a", "q", "first", "rest", "v", "others"},
        ),
    ],
)
def test_every_binding_form_is_a_write(source: str, writes: set[str]) -> None:
    fx = analyze_cell(source)
    assert not fx.syntax_error
    assert fx.writes == writes


@pytest.mark.skipif(sys.version_info < (3, 12), reason="type statement is 3.12 syntax")
def test_type_alias_statement_binds_its_name() -> None:
    fx = analyze_cell("type Vector = list[Scalar]")
    assert fx.writes == {"Vector"}
    assert "Scalar" in fx.deferred_reads


def test_except_as_name_is_unbound_after_the_handler() -> None:
    fx = analyze_cell(src("try:", "    f()", "except ValueError as err:", "    print(err)", "err"))
    assert "err" in fx.deletes
    assert "err" in fx.reads  # the final `err` reads whatever was there before


def test_global_assigned_inside_a_function_is_a_deferred_write() -> None:
    fx = analyze_cell(src("def bump():", "    global counter, total", "    counter = 1", "    return total"))
    assert fx.writes == {"bump"}
    assert fx.deferred_writes == {"counter"}
    assert fx.deferred_reads == {"total"}
    assert fx.reads == set()


def test_nested_function_global_write_is_found() -> None:
    fx = analyze_cell(src("def outer():", "    def inner():", "        global g", "        g = 2", "    return inner"))
    assert fx.deferred_writes == {"g"}


def test_del_of_a_name() -> None:
    fx = analyze_cell(src("x = 1", "del x", "del y, z"))
    assert fx.deletes == {"x", "y", "z"}
    assert fx.reads == {"y", "z"}  # del fails unless they exist


# -- reads: flow sensitivity and scoping ---------------------------------------

@pytest.mark.parametrize(
    ("source", "reads"),
    [
        ("x = 1\ny = x", set()),
        ("y = x\nx = 1", {"x"}),
        ("x = x + 1", {"x"}),
        ("print(a.b[c])", {"print", "a", "c"}),
        (src("if c:", "    x = 1", "print(x)"), {"c", "print", "x"}),
        (src("if c:", "    x = 1", "else:", "    x = 2", "x"), {"c"}),
        (src("for i in r:", "    x = i", "x, i"), {"r", "x", "i"}),
        (src("while c:", "    x = 1", "x"), {"c", "x"}),
        (src("try:", "    x = f()", "except E:", "    pass", "x"), {"f", "E", "x"}),
        (src("try:", "    x = f()", "except E:", "    x = 0", "x"), {"f", "E"}),
        (src("try:", "    pass", "finally:", "    x = 1", "x"), set()),
        (src("with cm():", "    x = 1", "x"), {"cm", "x"}),
        (src("match p:", "    case 1:", "        x = 1", "x"), {"p", "x"}),
        ("a and (b := 1)\nb", {"a", "b"}),
        ("(b := 1)\nb", set()),
        ("x = 1\ndel x\nx", {"x"}),
        ("[i * k for i in xs if i > lo]", {"xs", "k", "lo"}),
        ("[i for i in xs]\ni", {"xs", "i"}),
        ("{k: v for k, v in d.items()}", {"d"}),
        ("[c for row in grid for c in row]", {"grid"}),
        ("sum(v * w for v in vals)", {"sum", "vals", "w"}),
        ("sorted(xs, key=lambda v: v * w)", {"sorted", "xs", "w"}),
        ("x: Annot = 1", {"Annot"}),
        (src("class C:", "    a = 1", "    b = a + z"), {"z"}),
        (src("class C:", "    a = 1", "    b = [a for _ in range(2)]"), {"a", "range"}),
        (src("class C(Base, metaclass=Meta):", "    pass"), {"Base", "Meta"}),
        ("get_ipython().run_line_magic('matplotlib', 'inline')", set()),
    ],
)
def test_reads(source: str, reads: set[str]) -> None:
    assert analyze_cell(source, allowed_magics={"matplotlib"}).reads == reads


def test_function_body_reads_are_deferred_not_read() -> None:
    fx = analyze_cell(src("def f(a, *args, b=1, **kw):", "    return a + b + helper(args) + K"))
    assert fx.reads == set()
    assert fx.deferred_reads == {"helper", "K"}


def test_definition_time_expressions_are_read() -> None:
    fx = analyze_cell(src("@dec(a)", "def f(x: T = b, *, y=c) -> R:", "    return z"))
    assert {"dec", "a", "T", "b", "c", "R"} <= fx.reads
    assert fx.deferred_reads == {"z"}


def test_calling_a_function_defined_in_the_cell_reads_its_globals() -> None:
    assert analyze_cell(src("def f():", "    return K", "f()")).reads == {"K"}
    assert analyze_cell(src("def f():", "    return K", "K = 1", "f()")).reads == set()
    assert analyze_cell(src("def f():", "    return K")).reads == set()


def test_cell_functions_are_followed_through_each_other() -> None:
    fx = analyze_cell(src("def g():", "    return G", "def f():", "    return g()", "f()"))
    assert fx.reads == {"G"}


def test_using_a_cell_class_reads_its_method_globals() -> None:
    fx = analyze_cell(src("class M:", "    def predict(self):", "        return W", "M().predict()"))
    assert fx.reads == {"W"}
    assert fx.deferred_reads == {"W"}


def test_closures_and_locals_are_not_globals() -> None:
    fx = analyze_cell(
        src(
            "def outer(p):",
            "    v = 1",
            "    def inner():",
            "        return v + p + G",
            "    squares = [i * i for i in range(v)]",
            "    f = lambda q: q + v + H",
            "    return inner, squares, f",
        )
    )
    assert fx.deferred_reads == {"G", "range", "H"}


def test_nonlocal_is_not_a_global() -> None:
    fx = analyze_cell(src("def o():", "    x = 1", "    def i():", "        nonlocal x", "        x += 1", "    return i"))
    assert fx.deferred_reads == set()
    assert fx.deferred_writes == set()


def test_method_cannot_see_class_body_names() -> None:
    fx = analyze_cell(src("class C:", "    a = 1", "    def m(self):", "        return a"))
    assert fx.deferred_reads == {"a"}
    assert fx.writes == {"C"}


def test_lambda_in_a_comprehension_closes_over_the_loop_variable() -> None:
    fx = analyze_cell("fs = [lambda: i + k for i in range(3)]")
    assert fx.deferred_reads == {"k"}
    assert "i" not in fx.reads


# -- mutations -----------------------------------------------------------------

@pytest.mark.parametrize(
    ("source", "mutated"),
    [
        ("a.x = 1", {"a"}),
        ("a[0] = 1", {"a"}),
        ("a[i:j] = []", {"a"}),
        ("del a[0]", {"a"}),
        ("del a.x", {"a"}),
        ("a[0] += 1", {"a"}),
        ("a.n += 1", {"a"}),
        ("a.b.c[1] = 2", {"a"}),
        ("a.get()[0] = 1", {"a"}),
        ("a += [1]", {"a"}),
        ("a.x: int = 1", {"a"}),
        ("for a.i in r: pass", {"a"}),
        ("with cm() as a[0]: pass", {"a"}),
        ("[0 for a.x in r]", {"a"}),
        ("x, a[0] = 1, 2", {"a"}),
        ("b = 1\nb.x = 2", {"b"}),
        ("print(a)", set()),
        (src("class C:", "    d = {}", "    d['k'] = 1"), set()),
    ],
)
def test_mutations(source: str, mutated: set[str]) -> None:
    assert analyze_cell(source).mutated == mutated


def test_augmented_assignment_is_a_read_a_write_and_a_mutation() -> None:
    fx = analyze_cell("total += x")
    assert fx.reads == {"total", "x"}
    assert fx.writes == {"total"}
    assert fx.mutated == {"total"}


# -- call sites ------------------------------------------------------------------

def calls_of(source: str) -> tuple[CallSite, ...]:
    return analyze_cell(source).calls


def test_method_call_site() -> None:
    (call,) = calls_of("a.b.append(x.y[0], key=k)")
    assert call == CallSite("a.b.append", "a", "append", frozenset({"x", "k"}), False)


def test_function_call_site() -> None:
    (call,) = calls_of("len(x)")
    assert call == CallSite("len", None, None, frozenset({"x"}), False)


def test_inplace_keyword() -> None:
    (call,) = calls_of("df.drop(columns=cols, inplace=True)")
    assert call.inplace and call.receiver == "df" and call.method == "drop"
    (call,) = calls_of("df.drop(columns=cols, inplace=flag)")
    assert not call.inplace


@pytest.mark.parametrize(
    ("source", "args"),
    [
        ("f(*xs, **kw)", {"xs", "kw"}),
        ("f(x + 1)", set()),
        ("f([x, (y, {k: v})])", {"x", "y", "k", "v"}),
        ("f(x if c else y)", {"x", "y"}),
        ("f(a or b)", {"a", "b"}),
        ("f(1, 'text')", set()),
    ],
)
def test_call_arguments_are_base_names_of_references(source: str, args: set[str]) -> None:
    outer = [c for c in calls_of(source) if c.func == "f"]
    assert outer[0].args == args


def test_nested_calls_are_each_recorded() -> None:
    calls = calls_of("g()(z)\nf(np.asarray(x))")
    funcs = [c.func for c in calls]
    assert funcs.count("g") == 1 and "np.asarray" in funcs and "f" in funcs
    anonymous = next(c for c in calls if c.func is None)
    assert anonymous.args == {"z"}
    f_call = next(c for c in calls if c.func == "f")
    assert "x" in f_call.args  # np.asarray(x) may return x itself


def test_receiver_through_subscript_and_call() -> None:
    (call,) = calls_of("df.loc[0].update(other)")
    assert call.func is None and call.receiver == "df" and call.method == "update"


def test_comprehension_variable_maps_to_what_it_iterates() -> None:
    (call,) = calls_of("[row.append(0) for row in grid]")
    assert call.receiver == "grid" and call.func is None
    calls = calls_of("[setattr(c, 'x', 1) for row in grid for c in row]")
    assert next(c for c in calls if c.func == "setattr").args == {"grid"}


def test_calls_inside_function_bodies_are_not_recorded() -> None:
    assert calls_of("def f():\n    lst.append(1)") == ()


# -- dynamic constructs ---------------------------------------------------------

@pytest.mark.parametrize(
    "source",
    [
        "exec('x = 1')",
        "eval(s)",
        "globals()['x'] = 1",
        "locals()",
        "vars()",
        "g = globals",
        "from m import *",
        "__import__('os')",
        "setattr(__builtins__, 'x', 1)",
        "import __main__",
        "get_ipython().system('ls')",
        "files = get_ipython().getoutput('ls')",
        "get_ipython().run_line_magic('who', '')",
        "[eval(s) for s in exprs]",
        "class C:\n    exec(code)",
    ],
)
def test_dynamic_constructs(source: str) -> None:
    fx = analyze_cell(source)
    assert fx.dynamic and not fx.syntax_error


@pytest.mark.parametrize("source", ["vars(obj)", "x = 1", "def f():\n    return eval(s)"])
def test_not_dynamic(source: str) -> None:
    assert not analyze_cell(source).dynamic


def test_dynamic_code_inside_a_function_is_deferred_dynamic() -> None:
    fx = analyze_cell("def f():\n    return globals()")
    assert fx.deferred_dynamic and not fx.dynamic


def test_allowed_magic_is_not_dynamic_and_its_arguments_are_read() -> None:
    source = "get_ipython().run_line_magic('matplotlib', backend)"
    assert analyze_cell(source).dynamic
    fx = analyze_cell(source, allowed_magics={"matplotlib"})
    assert not fx.dynamic and fx.reads == {"backend"}


def test_code_magic_body_is_analysed_inline() -> None:
    fx = analyze_cell("get_ipython().run_cell_magic('time', '', 'x = y + 1\\n')\nz = x", code_magics={"time"})
    assert not fx.dynamic
    assert fx.reads == {"y"} and fx.writes == {"x", "z"}
    fx = analyze_cell("t = get_ipython().run_line_magic('time', 'f(a)')", code_magics={"time"})
    assert fx.reads == {"f", "a"} and fx.writes == {"t"}


def test_code_magic_with_unparsable_body_is_dynamic() -> None:
    fx = analyze_cell("get_ipython().run_line_magic('timeit', '-n 3 f(a)')", code_magics={"timeit"})
    assert fx.dynamic


# -- the rest --------------------------------------------------------------------

def test_imports() -> None:
    fx = analyze_cell(src("import os, a.b as c", "from x.y import z", "from .. import w", "from . import v"))
    assert fx.imports == {"os", "a.b", "x.y", "..", "."}


def test_syntax_error_gives_empty_effects() -> None:
    fx = analyze_cell("x = (\ny = 2")
    assert fx == CellEffects(syntax_error=True)
    assert fx.reads == frozenset() and fx.writes == frozenset()


def test_effects_are_frozen() -> None:
    fx = analyze_cell("x = 1")
    with pytest.raises(AttributeError):
        fx.reads = frozenset()  # type: ignore[misc]
    assert isinstance(fx.writes, frozenset)


def test_transformed_ipython_cell() -> None:
    # What IPython's transform_cell makes of "%matplotlib inline\ndf = load(path)\ndf.head()".
    source = "get_ipython().run_line_magic('matplotlib', 'inline')\ndf = load(path)\ndf.head()\n"
    fx = analyze_cell(source, allowed_magics={"matplotlib"})
    assert fx.reads == {"load", "path"}
    assert fx.writes == {"df"}
    assert not fx.dynamic


def test_calling_a_dynamic_cell_function_makes_the_cell_dynamic() -> None:
    assert analyze_cell("def f():\n    return globals()\nf()").dynamic
    assert not analyze_cell("def f():\n    return globals()").dynamic


def test_deeply_nested_source_never_raises() -> None:
    assert analyze_cell("x = " + " + ".join(["a"] * 500)).reads == {"a"}
    # Too deep for the parser or for the walk: flagged, never an exception.
    fx = analyze_cell("x = " + " + ".join(["a"] * 3000))
    assert fx.syntax_error or fx.dynamic
    assert analyze_cell("x = " + "(" * 5000 + "1" + ")" * 5000).syntax_error


def test_statement_in_a_class_body_that_declares_global() -> None:
    fx = analyze_cell("class C:\n    global g\n    g = 1\n    h = 2")
    assert fx.writes == {"C", "g"}
