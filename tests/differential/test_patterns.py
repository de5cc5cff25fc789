"""Named stale-replay patterns on in-process shells (see `patterns.py`).

`test_repeat_matches_plain[name]` is the property: audit N, repeat N' on the
same store in a new folder (with the pattern's files), and the result equals a
fresh plain run of N' (outputs, counts, namespace, files, env, seeded RNGs),
with no NBRewind warning in the audit or the repeat.
`test_plain_control[name]` (``-m slow``) shows the harness is sound for the pattern: two
fresh plain runs of N' agree, and the audit of N looks like a plain run of N.
A failure of the first with a passing second is an NBRewind bug.

Run one pattern with `pytest tests/differential/test_patterns.py -k sort_inplace`.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from differential import patterns
from differential.patterns import PatternRuns, run_pattern

# `patterns.PATTERNS`, not the list bound here: in process, this module's data is digested
# around every cell (see `differential.patterns.__getattr__`).
from differential.test_inprocess import differences, forecast_errors

NAMES = [p.name for p in patterns.PATTERNS if p.inprocess]


@functools.lru_cache(maxsize=None)
def _runs(name: str, base: Path, control: bool) -> PatternRuns:
    root = base / f"pattern_{name}{'_control' if control else ''}"
    root.mkdir()
    return run_pattern(patterns.BY_NAME[name], root, control=control)


def runs_for(name: str, factory: pytest.TempPathFactory, *, control: bool = False) -> PatternRuns:
    """The runs of pattern `name`, made once per test session (the tests of a pattern share
    them); the control runs only for `test_plain_control`, which runs with ``-m slow``."""
    return _runs(name, factory.getbasetemp(), control)


@pytest.mark.parametrize("name", NAMES)
def test_repeat_matches_plain(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Repeat of N' after auditing N == a plain run of N', and NBRewind never warned."""
    runs = runs_for(name, tmp_path_factory)
    problems = differences(runs.repeat, runs.fresh_edited)
    problems += [f"NBRewind warned in the audit: {w}" for w in runs.audit.warnings]
    problems += [f"NBRewind warned in the repeat: {w}" for w in runs.repeat.warnings]
    assert not problems, runs.pattern.describe() + "\n\nrepeat of N' differs from a plain run of N':\n" + "\n".join(problems)


def _raises_on_purpose(name: str) -> bool:
    """Stories whose plain run of N' raises by design: the file it removes is no longer made,
    a task's warning (an error under this test run's warning filters), `Out[N]` of a cell that
    an inserted cell left without a result."""
    return (
        name == "remove_of_a_file_no_longer_made"
        or name.startswith("task_warns_")
        or (name.startswith("history_") and name.endswith("_indexed_cell_inserted") and not name.startswith("history_values_"))
    )


@pytest.mark.parametrize("name", NAMES)
def test_plain_run_raises_only_by_design(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A story whose cells raise in every run compares errors and tests nothing: a plain run
    of N' raises only where the story means it to (a module left in a cache by an earlier
    story, a library that changed what it accepts, a warning turned into an error)."""
    runs = runs_for(name, tmp_path_factory)
    errors = [(i, event[1], event[2][:200]) for i, cell in enumerate(runs.fresh_edited.cells) for event in cell.shown()[2] if event[0] == "error"]
    if _raises_on_purpose(name):
        assert errors, f"{name} is meant to raise, but its plain run of N' raised nothing"
    else:
        assert not errors, runs.pattern.describe() + f"\n\nthe plain run of N' raised: {errors}"


@pytest.mark.parametrize("name", NAMES)
def test_forecast(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Asked before any cell of N' runs, the repeat kernel foresees what it then does."""
    runs = runs_for(name, tmp_path_factory)
    wrong = forecast_errors(runs.repeat)
    assert not wrong, runs.pattern.describe() + "\n\nthe forecast was wrong:\n" + "\n".join(wrong)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_plain_control(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The harness control: N' fresh twice gives the same picture; the audit of N looks like N run plainly.
    With ``-m slow``: its two extra plain runs per pattern are two fifths of the suite's runs."""
    runs = runs_for(name, tmp_path_factory, control=True)
    assert runs.fresh_edited_again is not None and runs.fresh_original is not None
    problems = differences(runs.fresh_edited_again, runs.fresh_edited)
    assert not problems, runs.pattern.describe() + "\n\ntwo plain runs of N' differ (a harness leak):\n" + "\n".join(problems)
    problems = differences(runs.audit, runs.fresh_original)
    assert not problems, runs.pattern.describe() + "\n\nthe audit of N differs from a plain run of N:\n" + "\n".join(problems)
    assert all(c.decision == "executed" for c in runs.audit.cells)


def test_patterns_are_well_formed() -> None:
    """Unique names, every kernel-tier name exists, every edit changes or extends N only where meant."""
    from differential.patterns import KERNEL_PATTERNS, SLOW_KERNEL_PATTERNS

    assert len(patterns.BY_NAME) == len(patterns.PATTERNS)
    assert set(KERNEL_PATTERNS) | set(SLOW_KERNEL_PATTERNS) <= set(patterns.BY_NAME)
    assert not set(KERNEL_PATTERNS) & set(SLOW_KERNEL_PATTERNS) and len(set(KERNEL_PATTERNS)) == len(KERNEL_PATTERNS)
    for p in patterns.PATTERNS:
        assert p.why and p.cells, p.name
        assert p.inprocess or p.name in KERNEL_PATTERNS or p.name in SLOW_KERNEL_PATTERNS, f"{p.name} runs on no tier"
        assert p.edited != p.cells or p.files_audit != p.files_repeat or p.setup_repeat is not None, f"{p.name}: nothing changes between runs"


HARNESS_MODULES = ("differential", "test_", "conftest")


@pytest.mark.parametrize("name", NAMES)
def test_unchanged_prefix_replays(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The pattern exercises replay: the cells before the first edit replay (DESIGN property 2), and no
    cell ran because of the test harness itself (its modules are "local modules" in-process)."""
    runs = runs_for(name, tmp_path_factory)
    harness = [(i, c.reason) for i, c in enumerate(runs.repeat.cells) if any(f":{m}" in c.reason for m in HARNESS_MODULES)]
    assert not harness, runs.pattern.describe() + f"\n\ncells ran because of the harness's own modules: {harness}"
    ran = [(i, runs.repeat.cells[i].reason) for i in runs.pattern.must_replay if runs.repeat.cells[i].decision != "replayed"]
    assert not ran, runs.pattern.describe() + f"\n\nthese cells before the first edit did not replay: {ran}"
