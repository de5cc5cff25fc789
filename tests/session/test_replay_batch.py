"""Replayed cells' records are committed in batches (nbrewind.session.commit).

A replay's record (its cell run and checkpoint) waits in a lazy writer job that the
replays after it join; the batch is one catalog transaction, committed once the
kernel is idle, before the next cell that runs is committed, or when anyone flushes
(shutdown, `jupyter nbrewind run`, the magics). These tests hold the batch open (a
long idle time) where they need to see it pending, and check the order of the
records and of the checkpoint chain a batch leaves, in process on a real store.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any as Runner  # the fixture type lives in conftest.py

import pytest

from nbrewind.session import Session
from nbrewind.store import CellRun, Store

CELLS = ["x = 1", "y = x + 1\nprint(y)", "z = y * 2\nz", "w = x + 5\nw"]
#: Seconds the writer waits for idleness here: long enough that only a flush or a
#: cell that runs can start a batch while a test looks.
HELD = 600.0
TIMEOUT = 30.0


def _hold_batches(session: Session) -> None:
    session.writer.lazy_idle = session.writer.lazy_max = HELD


def _session_runs(store: Path, session: Session) -> list[CellRun]:
    """The cell runs `session` has made durable, read through another connection."""
    with Store.open(store, create=False, readonly=True) as opened:
        return [r for r in opened.catalog.cell_runs() if r.session == session.session_id]


def _parents(store: Path, runs: list[CellRun]) -> list[int | None]:
    with Store.open(store, create=False, readonly=True) as opened:
        return [opened.catalog.get_checkpoint(r.checkpoint_id).parent_id for r in runs if r.checkpoint_id is not None]


@contextlib.contextmanager
def _counting_transactions(session: Session) -> Iterator[list[int]]:
    """Counts the catalog transactions the session's store begins (outermost ones)."""
    catalog = session.store.catalog
    original = catalog.transaction
    count = [0]

    @contextlib.contextmanager
    def counted() -> Iterator[None]:
        if not catalog._depth:
            count[0] += 1
        with original():
            yield

    catalog.transaction = counted  # type: ignore[method-assign]
    try:
        yield count
    finally:
        del catalog.transaction


def test_consecutive_replays_wait_in_one_batch_that_a_flush_commits_in_one_transaction(runner: Runner) -> None:
    runner.run(CELLS, "audit")
    session = runner.new_kernel("repeat")
    _hold_batches(session)
    with _counting_transactions(session) as transactions:
        outcomes = [runner.cell(code) for code in CELLS]
        assert [o.decision for o in outcomes] == ["replayed"] * len(CELLS)
        assert _session_runs(runner.store, session) == []  # nothing durable yet: one job waits
        assert session.writer.pending() == (1, 0)
        assert transactions == [0]
        session.writer.flush()
        assert transactions == [1]
    runs = _session_runs(runner.store, session)
    assert [r.code for r in runs] == CELLS
    assert [r.decision for r in runs] == ["replayed"] * len(CELLS)
    assert [r.execution_count for r in runs] == [1, 2, 3, 4]
    checkpoints = [r.checkpoint_id for r in runs]
    assert _parents(runner.store, runs) == [None, *checkpoints[:-1]]
    # The batch kept the catalog signed: a new kernel trusts the store and replays all of it.
    assert [o.decision for o in runner.run(CELLS, "repeat")] == ["replayed"] * len(CELLS)


def test_a_cell_that_runs_is_committed_after_the_replays_before_it_and_chains_onto_them(runner: Runner) -> None:
    runner.run(CELLS, "audit")
    edited = [CELLS[0], CELLS[1], "z = y * 3\nz", CELLS[3]]
    session = runner.new_kernel("repeat")
    _hold_batches(session)
    with _counting_transactions(session) as transactions:
        outcomes = [runner.cell(code) for code in edited]
        assert [o.decision for o in outcomes] == ["replayed", "replayed", "executed", "replayed"]
        # The cell that ran started the batch ahead of it; the replay after it waits in a new one.
        deadline = time.monotonic() + TIMEOUT
        while len(_session_runs(runner.store, session)) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [r.code for r in _session_runs(runner.store, session)] == edited[:3]
        assert session.writer.pending() == (1, 0)
        session.writer.flush()
        assert transactions == [3]  # the first two replays, the cell that ran, the last replay
    runs = _session_runs(runner.store, session)
    assert [r.code for r in runs] == edited
    assert [r.decision for r in runs] == ["replayed", "replayed", "executed", "replayed"]
    checkpoints = [r.checkpoint_id for r in runs]
    assert _parents(runner.store, runs) == [None, *checkpoints[:-1]]
    assert runner.ns["z"] == 6 and runner.ns["w"] == 6


def test_closing_the_session_makes_a_waiting_batch_durable(runner: Runner) -> None:
    runner.run(CELLS, "audit")
    session = runner.new_kernel("repeat")
    _hold_batches(session)
    assert [runner.cell(code).decision for code in CELLS] == ["replayed"] * len(CELLS)
    started = time.monotonic()
    session.close()
    assert time.monotonic() - started < TIMEOUT
    assert [r.code for r in _session_runs(runner.store, session)] == CELLS


def test_a_batch_is_committed_once_the_kernel_has_been_idle_for_a_moment(runner: Runner) -> None:
    runner.run(CELLS, "audit")
    session = runner.new_kernel("repeat")
    session.writer.lazy_idle = 0.05
    assert [runner.cell(code).decision for code in CELLS] == ["replayed"] * len(CELLS)
    deadline = time.monotonic() + TIMEOUT
    while len(_session_runs(runner.store, session)) < len(CELLS) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [r.code for r in _session_runs(runner.store, session)] == CELLS
    assert session.writer.pending() == (0, 0)


@pytest.mark.parametrize("seconds", ["0", "0.25"])
def test_the_batch_idle_time_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, runner: Runner, seconds: str) -> None:
    monkeypatch.setenv("NBREWIND_REPLAY_BATCH_SECONDS", seconds)
    session = runner.new_kernel("repeat")
    assert session.writer.lazy_idle == float(seconds)
    assert session.writer.lazy_max >= 10 * float(seconds)


def test_a_kernel_that_only_replays_never_probes_the_disk(monkeypatch: pytest.MonkeyPatch, runner: Runner) -> None:
    """The write-rate probe (a 2 MiB write and fsync) prices checkpoints that write bytes;
    replays write none, so a repeat that only replays does not pay for it."""
    from nbrewind.store.objects import ObjectStore

    runner.run(CELLS, "audit")
    probes: list[int] = []
    real = ObjectStore.probe_write_rate

    def counted(self: ObjectStore, *args: object, **kwargs: object) -> float:
        probes.append(1)
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ObjectStore, "probe_write_rate", counted)
    assert [o.decision for o in runner.run(CELLS, "repeat")] == ["replayed"] * len(CELLS)
    assert probes == []
    assert [o.decision for o in runner.run(["import numpy as np\nbig = np.ones(300_000)"], "audit")] == ["executed"]
    assert probes == [1]  # the first checkpoint that writes bytes still gets its measurement
