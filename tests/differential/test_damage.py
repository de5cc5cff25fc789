"""Differential fidelity with a damaged store: lost or corrupt objects are repaired, never shown.

For generated cases: audit N, then damage the store the way disks and people do
(delete some objects, flip a byte in others, chosen by a seeded RNG), then
repeat N' on it. The repeat must still show exactly what a fresh plain run of
N' shows: a value whose objects cannot be read is made again by re-running the
cell that wrote it (DESIGN.md, property 4), and the user's cells never see an
NBRewind exception. Replays may be lost (that is the price of the damage);
outputs, namespace and hidden state may not differ.

Run one case with `pytest tests/differential/test_damage.py -k seed_17`.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from differential.generator import make_case
from differential.inprocess import RunOutcome, run_cells
from differential.test_inprocess import _keep_determined_rngs, differences
from nbrewind.store import Store

SEEDS = range(0, 40)
SLOW_SEEDS = range(40, 200)
VARIANTS = range(3)


def damage(store_root: Path, seed: int, variant: int = 0) -> list[str]:
    """Delete or corrupt up to three objects of the store; say what was done."""
    rng = random.Random(f"damage|{seed}|{variant}")
    with Store.open(store_root) as store:
        digests = sorted(store.objects.iter_digests())
        paths = [store.objects.path_of(d) for d in rng.sample(digests, min(3, len(digests)))]
    done = []
    for path in paths:
        if rng.random() < 0.5:
            path.unlink()
            done.append(f"deleted {path.name}")
        else:
            data = bytearray(path.read_bytes())
            at = rng.randrange(len(data))
            data[at] ^= 1 << rng.randrange(8)
            os.chmod(path, 0o644)
            path.write_bytes(bytes(data))
            done.append(f"flipped a bit of {path.name} at byte {at} of {len(data)}")
    return done


@pytest.mark.parametrize("variant", VARIANTS, ids=[f"damage_{v}" for v in VARIANTS])
@pytest.mark.parametrize(
    "seed", [*SEEDS, *(pytest.param(s, marks=pytest.mark.slow) for s in SLOW_SEEDS)], ids=lambda s: f"seed_{s}"
)
def test_repeat_on_damaged_store_matches_plain(seed: int, variant: int, tmp_path: Path) -> None:
    """Audit N, damage the store, repeat N': the same as a plain run of N', with no NBRewind error shown."""
    case = make_case(seed)
    store = tmp_path / "store"
    run_cells(case.cells, tmp_path / "audit", mode="audit", store=store)
    done = damage(store, seed, variant)
    repeat: RunOutcome = run_cells(case.edited, tmp_path / "repeat", mode="repeat", store=store)
    fresh = run_cells(case.edited, tmp_path / "fresh")
    _keep_determined_rngs(case, repeat, fresh)
    problems = differences(repeat, fresh)
    shown = [str(c.shown()) for c in repeat.cells]
    problems += [f"cell {i} shows an NBRewind error: {s[:300]}" for i, s in enumerate(shown) if "NBRewind" in s]
    assert not problems, (
        case.describe() + "\n\ndamage: " + "; ".join(done) + "\n\nrepeat of N' on the damaged store differs from a plain run:\n"
        + "\n".join(problems)
    )


@pytest.mark.parametrize(
    "producer",
    [
        "x_0 += 1\nraise ValueError(f'bad value {x_0}')",
        "x_0 = x_0 * 2\nassert x_0 < 0, 'x_0 is positive'",
        "for i in range(3):\n    x_0 += i\n    if i == 2:\n        {}['missing']",
    ],
    ids=["raise", "assert", "loop"],
)
def test_value_bound_by_a_cell_that_then_raised_is_made_again(producer: str, tmp_path: Path) -> None:
    """A cell may bind a name and then raise; what it bound is state. When its object is lost,
    the cell is re-run (raising again, as recorded) to make it, and a later edited cell sees
    exactly what a plain run gives."""
    cells = ("x_0 = 30", producer, "y_0 = x_0 * 10\ny_0", "z_0 = 1")
    edited = (*cells[:3], "z_0 = 2\nx_0 + z_0")
    store = tmp_path / "store"
    run_cells(cells, tmp_path / "audit", mode="audit", store=store)
    with Store.open(store) as opened:
        runs = opened.catalog.cell_runs()
        failed = [r for r in runs if r.status == "error"]
        assert len(failed) == 1 and "x_0" in (failed[0].writes or ())
        digest = opened.catalog.checkpoint_entries(failed[0].checkpoint_id)["x_0"][0]
        path = opened.objects.path_of(digest)
    # Present but unreadable: the replay of the raising cell goes ahead, and the value is
    # found damaged only when a later cell loads it.
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))
    repeat = run_cells(edited, tmp_path / "repeat", mode="repeat", store=store)
    fresh = run_cells(edited, tmp_path / "fresh")
    for run in (repeat, fresh):
        run.rng.clear()  # never seeded: not determined
    assert not differences(repeat, fresh)
    assert not any("could not be brought back" in w for w in repeat.warnings), repeat.warnings
    assert repeat.cells[3].decision == "executed" and repeat.cells[2].decision == "replayed"
