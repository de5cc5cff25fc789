"""The named edit scenarios the domain-notebook harness applies (`python -m benchmarks.run`).

Each scenario is a list of exact snippet replacements in the code cells of one of the
notebooks written by `notebooks/make_notebooks.py` (each snippet must occur exactly
once in the notebook, so a drifting notebook fails loudly instead of silently
benchmarking nothing). Kinds:

- ``late parameter``: a parameter of a cell near the end changes;
- ``new inputs``: more input files (the generation cell writes the old files again,
  byte for byte, plus the new ones);
- ``early function``: the code of a function every task calls changes.

``expected_misses(scale)``, when given, is the exact number of Dask tasks the repeat
kernel must recompute: a different count is a failure, not a footnote.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Scenario:
    """One named edit of a notebook."""

    name: str
    kind: str
    description: str
    edits: tuple[tuple[str, str], ...]
    expected_misses: Callable[[float], int] | None = None


@dataclass(frozen=True)
class NotebookSpec:
    """A domain notebook, the scales the harness runs it at, and its edit scenarios."""

    name: str
    title: str
    scenarios: tuple[Scenario, ...]
    full_scale: float = 1.0
    quick_scale: float = 0.05
    notes: dict[str, Any] = field(default_factory=dict)


def _files(scale: float) -> int:
    return max(2, round(8 * scale)) + max(2, round(6 * scale)) + max(1, round(4 * scale))


def _books(scale: float) -> int:
    return max(4, round(24 * scale))


def _stations(scale: float) -> int:
    return max(10, round(100 * scale))


def _tiles(scale: float) -> tuple[int, int]:
    return max(2, round(6 * scale)), max(2, round(6 * scale))


NOTEBOOKS: tuple[NotebookSpec, ...] = (
    NotebookSpec(
        "mapreduce",
        "MapReduce",
        (
            Scenario("top-3", "late parameter", "report the top 3 categories and users instead of 5", (("TOP = 5", "TOP = 3"),)),
            Scenario(
                "more-files",
                "new inputs",
                "4 more CSV files",
                (("N_FILES = max(8, round(20 * SCALE))", "N_FILES = max(8, round(20 * SCALE)) + 4"),),
            ),
            Scenario(
                "clip-values",
                "early function",
                "file_stats clips values to [0, 20]",
                (('    v = df["value"]\n', '    v = df["value"] = df["value"].clip(0, 20)\n'),),
            ),
        ),
    ),
    NotebookSpec(
        "dconv",
        "DConv",
        (
            Scenario("clip-98", "late parameter", "clip the output at the 98th percentile", (("CLIP_PERCENTILE = 99.5", "CLIP_PERCENTILE = 98.0"),)),
            Scenario(
                "taller-image",
                "new inputs",
                "one more band of tiles (the old last band's halo changes too)",
                (("BANDS = max(2, round(6 * SCALE))", "BANDS = max(2, round(6 * SCALE)) + 1"),),
                expected_misses=lambda s: 2 * _tiles(s)[1],
            ),
            Scenario(
                "clamp-passes",
                "early function",
                "convolve3x3 clamps every pass to [-10, 10]",
                (("        out = acc\n", "        out = np.clip(acc, -10, 10)\n"),),
                expected_misses=lambda s: _tiles(s)[0] * _tiles(s)[1],
            ),
        ),
    ),
    NotebookSpec(
        "rag",
        "RAG-lite",
        (
            Scenario("top-5", "late parameter", "retrieve the top 5 chunks per query", (("K = 3", "K = 5"),), expected_misses=_books),
            Scenario(
                "more-books",
                "new inputs",
                "4 more books (new chunks, a new index, so every book is scored again)",
                (("N_BOOKS = max(4, round(24 * SCALE))", "N_BOOKS = max(4, round(24 * SCALE)) + 4"),),
                expected_misses=lambda s: 4 + 4 + 1 + _books(s) + 4,
            ),
            Scenario(
                "short-words",
                "early function",
                "tokenize drops words of one or two letters",
                (('return re.findall(r"[a-z]+", text.lower())', 'return [w for w in re.findall(r"[a-z]+", text.lower()) if len(w) > 2]'),),
                expected_misses=lambda s: 3 * _books(s) + 1,
            ),
        ),
    ),
    NotebookSpec(
        "ctrend",
        "CTrend",
        (
            Scenario("threshold-0.3", "late parameter", "warming threshold 0.3 C/decade", (("WARMING = 0.2", "WARMING = 0.3"),), expected_misses=lambda s: 0),
            Scenario(
                "add-10-stations",
                "new inputs",
                "10 new stations: only their 3 tasks each plus the aggregation run",
                (("N_STATIONS = max(10, round(100 * SCALE))", "N_STATIONS = max(10, round(100 * SCALE)) + 10"),),
                expected_misses=lambda s: 10 * 3 + 1,
            ),
            Scenario(
                "despike-5",
                "early function",
                "clean despikes at 5 instead of 6 running MADs",
                (("6 * spread", "5 * spread"),),
                expected_misses=lambda s: 3 * _stations(s) + 1,
            ),
        ),
    ),
    NotebookSpec(
        "hep",
        "HEP",
        (
            Scenario("window", "late parameter", "a narrower signal window", (("WINDOW = (900.0, 1100.0)", "WINDOW = (950.0, 1050.0)"),), expected_misses=lambda s: 0),
            Scenario(
                "more-signal",
                "new inputs",
                "2 more Z' signal files",
                (('"zprime": max(1, round(4 * SCALE))', '"zprime": max(1, round(4 * SCALE)) + 2'),),
                expected_misses=lambda s: 2 + 1,
            ),
            Scenario(
                "pt-40",
                "early function",
                "select raises the jet pt cut to 40 GeV",
                (("(pt > 30.0)", "(pt > 40.0)"),),
                expected_misses=lambda s: _files(s) + 3,
            ),
        ),
    ),
)


def spec(name: str) -> NotebookSpec:
    """The notebook spec called `name`."""
    for item in NOTEBOOKS:
        if item.name == name:
            return item
    raise KeyError(f"no notebook {name!r}; choose one of {', '.join(n.name for n in NOTEBOOKS)}")


def apply_edits(cells: list[str], edits: tuple[tuple[str, str], ...]) -> list[str]:
    """The code cells with every (old, new) replacement applied; each `old` must occur exactly once."""
    out = list(cells)
    for old, new in edits:
        where = [i for i, code in enumerate(out) if old in code]
        count = sum(code.count(old) for code in out)
        if count != 1:
            raise ValueError(f"edit snippet {old!r} occurs {count} times in the notebook, expected exactly once")
        out[where[0]] = out[where[0]].replace(old, new)
    return out
