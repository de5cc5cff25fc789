"""Which call statements count as changing what a library keeps (`session.libcalls`)."""

from __future__ import annotations

import calendar  # noqa: F401 - loaded, as a notebook that imports it has it
import mimetypes  # noqa: F401

import pytest

from nbrewind.session.libcalls import Imports, library_calls


def _targets(cells: list[str], *, shown: bool = False) -> list[list[str]]:
    imports = Imports()
    out = []
    for code in cells:
        imports.note(code, [n for n in ("cal", "calendar", "first", "np") if f"{n} =" in code])
        out.append([c.target for c in library_calls(code, imports.bound, shown=shown)])
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
