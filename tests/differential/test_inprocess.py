"""Differential fidelity tests on in-process IPython shells (no kernels, no ZMQ).

For each generated case: audit N, repeat N' on the same store (in a new, empty
working directory), and run N' on a plain shell. The repeat must show the same
outputs and execution counts cell by cell, leave the same namespace (values,
functions by code, every aliasing relation), and the same hidden state (files
in the working directory, global RNG states, environment variables). The audit
of N must itself look exactly like a plain run of N. Where minimal work is
knowable it is checked too: cells before the first real edit replay, and a
whitespace/comment-only edit replays everything.

Run one case with `pytest tests/differential -k seed_17`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from differential.generator import Case, make_case
from differential.inprocess import RunOutcome, run_cells
from differential.known_bugs import FIDELITY_BUGS, MINIMAL_WORK_BUGS, Bug, expected_failures

FAST_SEEDS = range(0, 120)
"""Seeds every CI run checks: the first half in the default run, the rest in the long step."""
LONG_FROM = 60
SLOW_SEEDS = range(120, 600)


@dataclass
class Runs:
    """The four runs of one case."""

    case: Case
    audit: RunOutcome
    repeat: RunOutcome
    fresh_edited: RunOutcome
    fresh_original: RunOutcome


@functools.lru_cache(maxsize=None)
def _runs(seed: int, root: Path) -> Runs:
    case = make_case(seed)
    store = root / "store"
    return Runs(
        case,
        audit=run_cells(case.cells, root / "audit", mode="audit", store=store),
        repeat=run_cells(case.edited, root / "repeat", mode="repeat", store=store, forecast=True),
        fresh_edited=run_cells(case.edited, root / "fresh-edited"),
        fresh_original=run_cells(case.cells, root / "fresh-original"),
    )


def runs_for(seed: int, factory: pytest.TempPathFactory) -> Runs:
    """The runs of case `seed`, made once per test session (the tests of a seed share them)."""
    return _runs(seed, _root(seed, factory))


@functools.lru_cache(maxsize=None)
def _root_cache(seed: int, base: Path) -> Path:
    path = base / f"seed_{seed}"
    path.mkdir()
    return path


def _root(seed: int, factory: pytest.TempPathFactory) -> Path:
    return _root_cache(seed, factory.getbasetemp())


def differences(got: RunOutcome, want: RunOutcome) -> list[str]:
    """Every observable difference between two runs of the same notebook, readable."""
    problems = []
    if len(got.cells) != len(want.cells):
        problems.append(f"{len(got.cells)} cells ran, expected {len(want.cells)}")
    for index, (g, w) in enumerate(zip(got.cells, want.cells)):
        if g.shown() != w.shown():
            problems.append(f"cell {index} ({g.decision}; {g.reason}): shows {g.shown()}, plain run shows {w.shown()}")
    mine: dict[str, Any] = dict(got.namespace)
    theirs: dict[str, Any] = dict(want.namespace)
    if set(mine) != set(theirs):
        problems.append(f"names differ: extra {sorted(set(mine) - set(theirs))}, missing {sorted(set(theirs) - set(mine))}")
    if got.namespace != want.namespace:
        for name in sorted(set(mine) & set(theirs)):
            if mine[name] != theirs[name]:
                problems.append(f"name {name}: {str(mine[name])[:300]} != {str(theirs[name])[:300]}")
        if set(mine) == set(theirs) and all(mine[n] == theirs[n] for n in mine):
            problems.append("namespace order/aliasing differs (same values, different sharing)")
    if got.files != want.files:
        problems.append(f"working-directory files differ: {got.files} != {want.files}")
    if got.env != want.env:
        problems.append(f"environment differs: {got.env} != {want.env}")
    for which in sorted(set(got.rng) | set(want.rng)):
        if got.rng.get(which) != want.rng.get(which):
            problems.append(f"final {which} RNG state differs")
    return problems


def _keep_determined_rngs(case: Case, *runs: RunOutcome) -> None:
    """Drop the final states of global RNGs the notebook never seeds: only seeded ones are determined."""
    seeded = set(case.global_seed_cells.values())
    for run in runs:
        for which in list(run.rng):
            if which not in seeded:
                del run.rng[which]


def _params(seeds: range, bugs: list[Bug], *marks: pytest.MarkDecorator) -> list[Any]:
    out = []
    for seed in seeds:
        case = make_case(seed)
        reasons = expected_failures(case, bugs, "inprocess")
        case_marks = list(marks)
        if reasons:
            case_marks.append(pytest.mark.xfail(strict=True, reason=" | ".join(reasons)))
        out.append(pytest.param(seed, marks=case_marks, id=case.id))
    return out


def _fast_params(bugs: list[Bug]) -> list[Any]:
    """The fast seeds: those from ``LONG_FROM`` on marked ``long`` (CI's own step)."""
    return _params(range(FAST_SEEDS.start, LONG_FROM), bugs) + _params(
        range(LONG_FROM, FAST_SEEDS.stop), bugs, pytest.mark.long
    )


def check_fidelity(seed: int, factory: pytest.TempPathFactory) -> None:
    runs = runs_for(seed, factory)
    _keep_determined_rngs(runs.case, runs.repeat, runs.fresh_edited)
    problems = differences(runs.repeat, runs.fresh_edited)
    problems += [f"NBRewind warned: {w}" for w in runs.audit.warnings + runs.repeat.warnings]
    assert not problems, runs.case.describe() + "\n\nrepeat of N' differs from a plain run of N':\n" + "\n".join(problems)


def check_audit_transparent(seed: int, factory: pytest.TempPathFactory) -> None:
    runs = runs_for(seed, factory)
    _keep_determined_rngs(runs.case, runs.audit, runs.fresh_original)
    problems = differences(runs.audit, runs.fresh_original)
    assert not problems, runs.case.describe() + "\n\naudit of N differs from a plain run of N:\n" + "\n".join(problems)
    assert all(c.decision == "executed" for c in runs.audit.cells)


def check_minimal_work(seed: int, factory: pytest.TempPathFactory) -> None:
    runs = runs_for(seed, factory)
    case = runs.case
    must_replay = range(min(case.first_edited, len(case.cells)))
    # By design a cell whose recorded run raised replays only for identical text: its
    # traceback shows the source lines, so a cosmetic edit of it must run.
    ran = [
        (i, runs.repeat.cells[i].reason)
        for i in must_replay
        if runs.repeat.cells[i].decision != "replayed" and "traceback shows the old source" not in runs.repeat.cells[i].reason
    ]
    what = "a whitespace/comment-only edit" if case.cosmetic_only else f"an edit of cell {case.first_edited}"
    assert not ran, case.describe() + f"\n\nafter {what}, these earlier cells did not replay: {ran}"
    for index in case.edit:
        if not case.cosmetic_only:
            assert runs.repeat.cells[index].decision == "executed", f"edited cell {index} was replayed"


@pytest.mark.parametrize("seed", _fast_params(FIDELITY_BUGS))
def test_fidelity(seed: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Repeat of N' after auditing N == a plain run of N' (outputs, namespace, hidden state)."""
    check_fidelity(seed, tmp_path_factory)


@pytest.mark.parametrize("seed", _fast_params([]))
def test_audit_is_transparent(seed: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Auditing N looks exactly like a plain run of N."""
    check_audit_transparent(seed, tmp_path_factory)


@pytest.mark.parametrize("seed", _fast_params(MINIMAL_WORK_BUGS))
def test_minimal_work(seed: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Cells before the first real edit replay; a cosmetic edit replays every cell."""
    check_minimal_work(seed, tmp_path_factory)


def forecast_errors(repeat: RunOutcome) -> list[str]:
    """Every cell whose forecast the repeat contradicted: a "replay" that ran, a "run"
    that replayed. A "depends" cell may do either."""
    assert repeat.forecast is not None and len(repeat.forecast) == len(repeat.cells)
    wrong = []
    for f, cell in zip(repeat.forecast, repeat.cells):
        if (f.decision, cell.decision) in (("replay", "executed"), ("run", "replayed")):
            wrong.append(f"cell {f.index}: foreseen {f.decision} ({f.reason}), but {cell.decision} ({cell.reason})")
    return wrong


def check_forecast(seed: int, factory: pytest.TempPathFactory) -> None:
    runs = runs_for(seed, factory)
    wrong = forecast_errors(runs.repeat)
    assert not wrong, runs.case.describe() + "\n\nthe forecast was wrong:\n" + "\n".join(wrong)


@pytest.mark.parametrize("seed", _fast_params([]))
def test_forecast(seed: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Asked before any cell of N' runs, the repeat kernel foresees what it then does."""
    check_forecast(seed, tmp_path_factory)


@pytest.mark.parametrize("seed", _params(SLOW_SEEDS, FIDELITY_BUGS, pytest.mark.slow))
def test_fidelity_more(seed: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    """test_fidelity on more seeds."""
    check_fidelity(seed, tmp_path_factory)


@pytest.mark.parametrize("seed", _params(SLOW_SEEDS, [], pytest.mark.slow))
def test_forecast_more(seed: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    """test_forecast on more seeds."""
    check_forecast(seed, tmp_path_factory)


@pytest.mark.parametrize("seed", _params(SLOW_SEEDS, MINIMAL_WORK_BUGS, pytest.mark.slow))
def test_minimal_work_more(seed: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    """test_minimal_work on more seeds."""
    check_minimal_work(seed, tmp_path_factory)


def test_generator_is_deterministic_and_covers_every_family() -> None:
    """Same seed, same case; the fast seeds cover every family and every edit kind."""
    from differential.generator import FAMILIES

    assert make_case(17) == make_case(17)
    cases = [make_case(s) for s in FAST_SEEDS]
    assert {f for c in cases for f in c.families} == set(FAMILIES)
    labels = {label for c in cases for label in c.labels}
    assert "cosmetic" in labels and "none" in labels
    assert sum(label.startswith(("cosmetic", "none")) for label in labels) == 2
    assert len(labels) >= 25, sorted(labels)
    cosmetic = [c for c in cases if c.labels == ("cosmetic",)]
    assert all(c.edited != c.cells for c in cosmetic)
