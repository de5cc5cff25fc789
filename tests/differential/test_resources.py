"""Differential tests for values that cannot be stored (resources) and their recorded life.

For each generated case (differential.resources): audit N, repeat N' (which ends with
a probe cell printing every resource's state) on the same store, and run N' fresh on a
plain shell. The repeat must show what the fresh run shows, cell by cell, and leave the
same namespace. Cells before the first real edit must replay, including those that use
a resource that is still only a record: that is what keeps a repeat from starting a
cluster only to close it.

Run one case with `pytest tests/differential/test_resources.py -k resources_7`.
"""

from __future__ import annotations

import pytest

from differential.inprocess import run_cells
from differential.resources import RESOURCE_FAMILIES, make_resource_case
from differential.test_inprocess import differences, forecast_errors

FAST = range(0, 36)
"""Every CI run: seeds below ``LONG_FROM`` in the default run, the rest in the long step."""
LONG_FROM = 18
SLOW = range(36, 240)


def check(seed: int, factory: pytest.TempPathFactory) -> None:
    case = make_resource_case(seed)
    root = factory.mktemp(case.id)
    store = root / "store"
    audit = run_cells(case.cells, root / "audit", mode="audit", store=store)
    assert not audit.warnings, audit.warnings
    repeat = run_cells(case.edited, root / "repeat", mode="repeat", store=store, forecast=True)
    fresh = run_cells(case.edited, root / "fresh")
    for run in (repeat, fresh):
        run.rng.clear()  # no case seeds a global RNG: their final states are not determined
    problems = differences(repeat, fresh) + [f"NBRewind warned: {w}" for w in repeat.warnings]
    assert not problems, case.describe() + "\n\nrepeat of N' differs from a plain run of N':\n" + "\n".join(problems)
    ran = [(i, repeat.cells[i].reason) for i in range(case.first_edited) if repeat.cells[i].decision != "replayed"]
    assert not ran, case.describe() + f"\n\ncells before the first edit did not replay: {ran}"
    assert repeat.cells[-1].decision == "executed"  # the probe: it must see the resources live
    wrong = forecast_errors(repeat)
    assert not wrong, case.describe() + "\n\nthe forecast was wrong:\n" + "\n".join(wrong)


@pytest.mark.parametrize(
    "seed",
    [pytest.param(s, id=f"resources_{s}", marks=[pytest.mark.long] if s >= LONG_FROM else []) for s in FAST],
)
def test_resource_life(seed: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    check(seed, tmp_path_factory)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SLOW, ids=[f"resources_{s}" for s in SLOW])
def test_resource_life_more_seeds(seed: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    check(seed, tmp_path_factory)


def test_the_fast_seeds_cover_every_family_and_edit_kind() -> None:
    cases = [make_resource_case(s) for s in FAST]
    assert {label.split(":")[0] for c in cases for label in c.labels if ":" in label} == set(RESOURCE_FAMILIES)
    assert any("none" in c.labels for c in cases) and any("cosmetic" in c.labels for c in cases)
    assert make_resource_case(3) == make_resource_case(3)
