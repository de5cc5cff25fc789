"""Which call statements count as changing what a library keeps (`session.libcalls`)."""

from __future__ import annotations

import calendar  # noqa: F401 - loaded, as a notebook that imports it has it
import copyreg  # noqa: F401
import http.client  # noqa: F401
import mimetypes  # noqa: F401

import pytest

from nbrewind.session.libcalls import Imports, library_calls
from nbrewind.session.state import library_object


def _targets(cells: list[str], *, shown: bool = False) -> list[list[str]]:
    imports = Imports()
    out = []
    for code in cells:
        writes = [n for n in ("cal", "calendar", "first", "np") if f"{n} =" in code]
        writes += [line.split()[1].split("(")[0] for line in code.splitlines() if line.startswith("def ")]
        imports.note(code, writes)
        out.append([c.target for c in library_calls(code, imports.bound, shown=shown, effectful=imports.effectful)])
    return out


def test_calls_for_effect_on_imported_libraries_are_found_through_aliases() -> None:
    cells = [
        "import calendar as cal\nfrom calendar import setfirstweekday as first\nimport mimetypes",
        "cal.setfirstweekday(6)\nx = 1",
        "first(3)",
        "for t in ('a', 'b'):\n    mimetypes.add_type('text/x-' + t, '.' + t)",
        "cal.c.setfirstweekday(2)",
    ]
    assert _targets(cells) == [
        [], ["calendar.setfirstweekday"], ["calendar.setfirstweekday"], ["mimetypes.add_type"], ["calendar.c.setfirstweekday"],
    ]


@pytest.mark.parametrize(
    "code",
    [
        "import numpy as np\nnp.random.seed(0)",  # a setting (RNG state)
        "import os\nos.makedirs('out', exist_ok=True)",  # files are recorded
        "import time\ntime.sleep(0)",
        "import calendar\ndef setup():\n    calendar.setfirstweekday(6)",  # inside a function: not this cell's call
        "import os\nos.environ['NBR_X'] = '1'",  # environment variables are settings
        "import copyreg\nd = {}\nd[1] = copyreg",  # an item of the notebook's own dict
        "import http.client\nx = http.client.responses[200]",  # read, not stored
        "import calendar\ndays = calendar.weekheader(2)",  # a value kept, not thrown away
        "calendar = object()\ncalendar.setfirstweekday(6)",  # not an import
    ],
)
def test_known_libraries_functions_and_kept_values_are_not_calls_for_effect(code: str) -> None:
    assert _targets([code]) == [[]]


def test_a_shown_last_line_counts_only_when_it_reads_like_a_setter() -> None:
    assert _targets(["import calendar\ncalendar.weekheader(2)"], shown=True) == [[]]
    assert _targets(["import calendar\ncalendar.weekheader(2)"], shown=False) == [["calendar.weekheader"]]
    assert _targets(["import calendar\ncalendar.setfirstweekday(1)"], shown=True) == [["calendar.setfirstweekday"]]


def test_a_name_bound_anew_is_no_longer_an_import() -> None:
    imports = Imports()
    imports.note("import calendar", ["calendar"])
    imports.note("calendar = 5", ["calendar"])
    assert library_calls("calendar.setfirstweekday(1)", imports.bound, shown=False) == []


def test_item_stores_and_deletes_on_library_objects_are_found() -> None:
    cells = [
        "import copyreg, sys\nfrom http.client import responses as codes\nimport http.client",
        "copyreg.dispatch_table[int] = f",
        "sys.modules['fake'] = m\ndel http.client.responses[200]",
        "codes[299] = 'x'\ncodes[299] += '!'",
        "for k in (1, 2):\n    http.client.responses[k].note = k",
    ]
    assert _targets(cells) == [
        [], ["copyreg.dispatch_table"], ["sys.modules", "http.client.responses"],
        ["http.client.responses", "http.client.responses"], ["http.client.responses"],
    ]
    imports = Imports()
    imports.note(cells[0], ["copyreg", "sys", "codes", "http"])
    (store,) = library_calls("codes[key] = value", imports.bound, shown=False)
    assert store.reads == {"key", "value"} and store.verb == "changed"


def test_calls_of_notebook_functions_that_change_a_library_are_found() -> None:
    cells = [
        "import calendar",
        "def setup(d):\n    calendar.setfirstweekday(d)\ndef plain(d):\n    return calendar.weekheader(d)",
        "def outer():\n    if True:\n        setup(1)",
        "setup(6)\nplain(2)\nx = [outer() for _ in range(2)]",
        "def setup(d):\n    return d",  # defined anew, without the call
        "setup(6)",
        "def calendar_arg(calendar):\n    calendar.setfirstweekday(1)",  # a parameter, not the import
        "calendar_arg(c)",
    ]
    assert _targets(cells) == [[], [], [], ["setup", "outer"], [], [], [], []]
    imports = Imports()
    for code, writes in ((cells[0], ["calendar"]), (cells[1], ["setup", "plain"])):
        imports.note(code, writes)
    (call,) = library_calls("setup(day)", imports.bound, shown=True, effectful=imports.effectful)
    assert call.reads == {"setup", "day"} and call.verb == "called the notebook function"
    # Keyed on the whole statement: the comprehension's values are nobody's name afterwards.
    (call,) = library_calls("days = [setup(d) for d in (2, 6)]", imports.bound, shown=False, effectful=imports.effectful)
    assert call.text == "days = [setup(d) for d in (2, 6)]" and call.reads == {"days", "setup", "d"}
    (call,) = library_calls("for d in (2, 6):\n    calendar.setfirstweekday(d)", imports.bound, shown=False)
    assert call.text.startswith("for d in (2, 6):") and call.target == "calendar.setfirstweekday"


def test_a_library_s_own_mutable_object_is_found_by_the_name_an_import_gave_it() -> None:
    import os
    import sys

    assert library_object("http.client.responses", http.client.responses) == ("http.client", "responses")
    assert library_object("os.environ", os.environ) == ("os", "environ")
    assert library_object("sys.path", sys.path) == ("sys", "path")
    assert library_object("http.client.responses", dict(http.client.responses)) is None  # a copy
    assert library_object("http.client.HTTPConnection", http.client.HTTPConnection) is None  # a class: pickled by name
    assert library_object("http.client.HTTP_PORT", http.client.HTTP_PORT) is None  # immutable
    assert library_object("os.path", os.path) is None  # a module: kept by name already
    assert library_object("nbr_not_loaded.thing", []) is None


def test_a_name_assigned_an_imported_name_s_attribute_names_that_object() -> None:
    imports = Imports()
    imports.note("import sys\nimport http.client as hc", ["sys", "hc"])
    imports.note("search = sys.path\ncodes = hc.responses\nn = len(sys.path)", ["search", "codes", "n"])
    assert imports.bound["search"] == "sys.path" and imports.bound["codes"] == "http.client.responses" and "n" not in imports.bound
    (store,) = library_calls("codes[299] = 'x'", imports.bound, shown=False)
    assert store.target == "http.client.responses"
    imports.note("codes = {}", ["codes"])
    assert "codes" not in imports.bound
