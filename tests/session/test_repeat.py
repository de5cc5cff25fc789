"""Repeat: verified-trace replay, never a stale replay, dataflow-selective re-execution,
lazy restore and time travel. Each test audits cells on one shell, then repeats
(possibly edited) cells on a fresh shell with a lazy namespace and the same store."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any as Runner  # the fixture type lives in conftest.py

import numpy as np
import pytest

from nbrewind.checkpoint.namespace import LazyNamespace
from nbrewind.store import Store


def decisions(outcomes: list) -> list[str]:
    return [o.decision[0].upper() for o in outcomes]  # R(eplayed) / E(xecuted)


BASE = [
    "SCALE = 3",
    "def helper(x):\n    return x + 1",
    "def scaled(x, k=2):\n    return helper(x) * SCALE * k",
    "result = scaled(5)",
    "final = result + 1",
]


def test_an_unchanged_notebook_replays_every_cell_and_matches(runner: Runner) -> None:
    runner.run(BASE)
    fresh = dict(runner.ns)
    out = runner.run(BASE, "repeat")
    assert decisions(out) == ["R"] * 5
    assert runner.ns["final"] == fresh["final"] == 37
    assert runner.ns["scaled"](1) == fresh["scaled"](1)


@pytest.mark.parametrize(
    ("index", "edit", "expect", "final"),
    [
        (2, "def scaled(x, k=2):\n    return helper(x) * SCALE * k * 10", "RREEE", 361),  # edited function body
        (1, "def helper(x):\n    return x + 2", "REREE", 43),  # edited helper the function calls
        (0, "SCALE = 4", "ERREE", 49),  # edited global constant it reads
        (2, "def scaled(x, k=3):\n    return helper(x) * SCALE * k", "RREEE", 55),  # changed default argument
        (2, "def scaled(x, k=2):  # doubled\n\n    return helper(x)*SCALE*k", "RRRRR", 37),  # comments/whitespace only
    ],
)
def test_edits_force_exactly_the_dependent_cells_to_run(runner: Runner, index: int, edit: str, expect: str, final: int) -> None:
    runner.run(BASE)
    edited = list(BASE)
    edited[index] = edit
    out = runner.run(edited, "repeat")
    assert "".join(decisions(out)) == expect
    assert runner.ns["final"] == final


def test_a_changed_closure_value_forces_a_run(runner: Runner) -> None:
    cells = ["def make(n):\n    def add(x):\n        return x + n\n    return add", "N = 1", "add = make(N)", "y = add(10)"]
    runner.run(cells)
    edited = cells[:1] + ["N = 5"] + cells[2:]
    out = runner.run(edited, "repeat")
    assert decisions(out) == ["R", "E", "E", "E"] and runner.ns["y"] == 15


def test_changed_input_file_contents_force_a_run(runner: Runner) -> None:
    Path("data.txt").write_text("1 2 3")
    cells = ["with open('data.txt') as f:\n    nums = [int(t) for t in f.read().split()]", "total = sum(nums)"]
    runner.run(cells)
    Path("data.txt").write_text("1 2 3 4")
    out = runner.run(cells, "repeat")
    assert decisions(out) == ["E", "E"] and runner.ns["total"] == 10
    out = runner.run(cells, "repeat")
    assert decisions(out) == ["R", "R"], [o.reason for o in out]
    assert runner.ns["total"] == 10


def test_a_changed_rng_seed_forces_a_run_and_the_draws_follow(runner: Runner) -> None:
    cells = ["import random", "random.seed(1)", "x = random.random()", "y = random.random()"]
    runner.run(cells)
    edited = ["import random", "random.seed(2)", "x = random.random()", "y = random.random()"]
    out = runner.run(edited, "repeat")
    assert decisions(out) == ["R", "E", "E", "E"]
    import random

    random.seed(2)
    assert (runner.ns["x"], runner.ns["y"]) == (random.random(), random.random())


def test_replayed_rng_state_is_restored_for_the_next_draw(runner: Runner) -> None:
    cells = ["import random", "random.seed(7)", "x = random.random()", "y = random.random()"]
    runner.run(cells)
    expected = runner.ns["y"]
    edited = cells[:3] + ["y = random.random() + 0"]
    out = runner.run(edited, "repeat")
    assert decisions(out) == ["R", "R", "R", "E"] and runner.ns["y"] == expected


def test_a_generator_held_in_a_variable_keeps_its_state(runner: Runner) -> None:
    cells = ["import numpy as np", "g = np.random.default_rng(3)", "a = g.random(4)", "b = g.random(4)"]
    runner.run(cells)
    expected = runner.ns["b"].copy()
    edited = cells[:3] + ["b = g.random(4) * 1"]
    out = runner.run(edited, "repeat")
    assert decisions(out) == ["R", "R", "R", "E"]
    np.testing.assert_array_equal(runner.ns["b"], expected)


def test_dataflow_selective_reexecution(runner: Runner) -> None:
    cells = ["a = 1", "b = 2", "c = a + 10", "d = b + 20", "e = c + d"]
    runner.run(cells)
    edited = ["a = 5", *cells[1:]]
    out = runner.run(edited, "repeat")
    assert decisions(out) == ["E", "R", "E", "R", "E"]
    assert runner.ns["e"] == 37


def test_a_recorded_error_is_replayed_as_that_error(runner: Runner) -> None:
    cells = ["x = 1", "raise ValueError('boom')", "y = x + 1"]
    runner.run(cells)
    out = runner.run(cells, "repeat")
    assert decisions(out) == ["R", "R", "R"]
    assert out[1].success is False and out[1].error == "ValueError"


def test_replayed_values_load_lazily_and_keep_identity(runner: Runner) -> None:
    cells = ["import numpy as np", "a = np.arange(300_000.0)", "b = a", "lst = [1]", "d = {'k': lst}"]
    runner.run(cells)
    runner.run(cells, "repeat")
    ns = runner.ns
    assert isinstance(ns, LazyNamespace)
    assert ns.is_pending("a") and ns.is_pending("b")
    assert {"a", "b", "d", "lst", "np"} <= set(ns.keys())  # dir(), %who and completion see them
    assert "a" in ns
    runner.cell("same = b is a")
    assert ns["same"] is True
    runner.cell("d['k'].append(2)")
    assert ns["lst"] == [1, 2]


def test_restore_goes_back_to_any_recorded_cell(runner: Runner) -> None:
    runner.run(["x = 1", "x = 2\ny = 5", "del y\nx = 3"])
    assert runner.session is not None
    message = runner.session.restore("2")
    assert "restored" in message
    assert runner.ns["x"] == 2 and runner.ns["y"] == 5
    runner.new_kernel("repeat")
    runner.session.restore("1")
    assert runner.ns["x"] == 1 and "y" not in runner.ns


def test_draws_between_cells_do_not_change_the_next_cells_key(runner: Runner) -> None:
    """Between cells only the kernel's own threads run (an in-process scheduler draws from
    `random` whenever its event loop gets to it); here the test itself draws between cells."""
    import random

    cells = ["import random\nrandom.seed(4)", "y = 1", "z = random.random()"]
    for mode, moves in (("audit", 3), ("repeat", 7)):
        runner.new_kernel(mode)
        outcomes = []
        for code in cells:
            outcomes.append(runner.cell(code))
            for _ in range(moves):
                random.random()  # a background draw, between cells
        runner.flush()
    assert decisions(outcomes) == ["R", "R", "R"]
    runner.new_kernel("repeat")
    outcomes = [runner.cell(cells[0]), runner.cell("random.seed(5)"), runner.cell(cells[2])]
    assert decisions(outcomes) == ["R", "E", "E"]  # a cell that moves the state changes the key


def test_the_checkpoint_after_a_restore_continues_from_the_restored_one(runner: Runner) -> None:
    runner.run(["x = 1", "x = 2", "x = 3"])
    assert runner.session is not None
    runner.session.restore("1")
    runner.cell("w = x + 10")
    runner.flush()
    with Store.open(runner.store) as store:
        runs = store.catalog.cell_runs()
        first, last = runs[0], runs[-1]
        assert first.checkpoint_id is not None and last.checkpoint_id is not None
        parent = store.catalog.get_checkpoint(last.checkpoint_id).parent_id
    assert parent == first.checkpoint_id  # not the checkpoint of "x = 3", written before
    assert runner.ns["w"] == 11


def test_unstorable_values_are_rebuilt_from_their_recorded_life_only_when_used(runner: Runner) -> None:
    """A cell that uses a lock still pending replays (its use is deferred); a cell that runs
    and needs the lock makes it again from its recorded life: the cell that made it, from
    the state it started from (n == 2, not today's 5), then the replayed cell that used it."""
    cells = ["import threading", "n = 2", "lock = threading.Semaphore(n)", "n = 5", "z = 1", "ok = lock.acquire(blocking=False)"]
    probe = "ok2 = lock.acquire(blocking=False) and not lock.acquire(blocking=False)"
    runner.run(cells)
    out = runner.run(cells, "repeat")
    assert decisions(out) == ["R"] * 6
    assert runner.ns.is_pending("lock") and runner.ns["ok"] is True
    assert runner.cell(probe).decision == "executed"
    # One of the two permits was taken by the replayed cell, as in a fresh run.
    assert runner.ns["ok2"] is True and runner.ns["n"] == 5
    assert runner.session is not None and any("re-running 2 replayed cells" in line for line in runner.session.infos)
    # Without the cell that used it, the lock comes back with both permits.
    runner.run(cells[:5], "repeat")
    assert runner.ns.is_pending("lock")
    runner.cell(probe)
    assert runner.ns["ok2"] is False


def test_with_open_cells_replay(runner: Runner) -> None:
    Path("data.txt").write_text("1 2 3")
    cells = ["with open('data.txt') as f:\n    nums = [int(t) for t in f.read().split()]", "total = sum(nums)"]
    runner.run(cells)
    out = runner.run(cells, "repeat")
    assert decisions(out) == ["R", "R"] and runner.ns["total"] == 6


def test_history_reads_always_run(runner: Runner) -> None:
    cells = ["1 + 1", "v = _ * 2"]
    runner.run(cells)
    out = runner.run(cells, "repeat")
    assert decisions(out) == ["R", "E"]
    assert runner.ns["v"] == 4  # the replayed cell's result is in `_`, as a run leaves it


def test_replayed_results_enter_the_output_history_only_when_read(runner: Runner) -> None:
    """A result shown by name is not stored again, and is not loaded by its replay: only a
    cell that reads the history brings it back, as the very object the name holds."""
    cells = ["import numpy as np\na = np.arange(300_000.0)", "a", "a[0] = 7.0", "2 + 3", "n = 1"]
    runner.run(cells)
    out = runner.run(cells, "repeat")
    assert decisions(out) == ["R"] * 5
    ns = runner.ns
    assert isinstance(ns, LazyNamespace) and ns.is_pending("a")
    assert "_2" not in ns and "_4" not in ns
    runner.cell("same = Out[2] is a and _2[0] == 7.0 and _ == 5 and __ is a")
    assert ns["same"] is True


def test_an_unstorable_result_read_later_is_reported(runner: Runner) -> None:
    """A shown value that cannot be pickled is not in the history a replay leaves: the cell
    reading it runs without it, and the notice says which result and why."""
    held = "import threading\nclass Held:\n    def __init__(self):\n        self.lock = threading.Lock()"
    runner.run([held, "Held()", "seen = repr(_)"])
    out = runner.run([held, "Held()", "seen = repr(_) + '!'"], "repeat")
    assert decisions(out) == ["R", "R", "E"] and out[2].success
    assert runner.session is not None
    said = [n for n in runner.session.notices if "Out[2]" in n]
    assert len(said) == 1 and "lock" in said[0], runner.session.notices


def test_drawing_before_reseeding_keeps_the_rng_an_input(runner: Runner) -> None:
    cells = ["import random", "random.seed(0)", "x = random.random()\nrandom.seed(1)", "y = random.random()"]
    runner.run(cells)
    edited = ["import random", "random.seed(5)", *cells[2:]]
    out = runner.run(edited, "repeat")
    assert decisions(out) == ["R", "E", "E", "R"]
    import random

    random.seed(5)
    assert runner.ns["x"] == random.random()


def test_cells_with_magics_always_run(runner: Runner) -> None:
    cells = ["%config Completer.use_jedi = False", "x = 1"]
    runner.run(cells)
    out = runner.run(cells, "repeat")
    assert decisions(out) == ["E", "R"] and "magics" in out[0].reason


@pytest.mark.cluster
def test_a_replayed_dask_client_is_back_before_the_next_cell_runs(runner: Runner) -> None:
    """A cell that makes a cluster and its client replays; the next executed cell finds the
    default client again (so `.compute()` goes to the cluster), and cluster and client come
    from one re-run of their cell."""
    cells = [
        "from distributed import Client, LocalCluster",
        "cluster = LocalCluster(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=':0')\nclient = Client(cluster)",
        "x = 1",
    ]
    runner.run(cells)
    runner.ns["client"].close()
    runner.ns["cluster"].close()
    out = runner.run(cells, "repeat")
    assert decisions(out) == ["R", "R", "R"]
    assert runner.ns.is_pending("client") and runner.ns.is_pending("cluster")
    try:
        outcome = runner.cell("import distributed\nsame = distributed.default_client() is client and client.cluster is cluster")
        assert outcome.decision == "executed" and runner.ns["same"] is True
    finally:
        for name in ("client", "cluster"):
            value = dict.get(runner.ns, name)
            if value is not None:
                value.close()


def test_rebuilding_an_unstorable_value_leaves_the_global_rng_as_a_fresh_run_would(runner: Runner) -> None:
    """The cell that made a lock also drew from `random`; re-running it to rebuild the lock
    must not advance the global state the next draw sees."""
    cells = ["import random, threading", "random.seed(5)", "lock = threading.Lock()\nx = random.random()", "y = random.random()"]
    probe = "held = lock.locked()\nv = random.random()"
    runner.run([*cells, probe])
    fresh_v = runner.ns["v"]
    out = runner.run([*cells, probe + "\nedited = 1"], "repeat")
    assert [o.decision for o in out][:4] == ["replayed"] * 4 and out[4].decision == "executed"
    assert runner.ns["v"] == fresh_v and runner.ns["held"] is False


def test_a_deleted_catalog_is_reported_and_recording_starts_again(runner: Runner) -> None:
    """Deleting the catalog loses which cells were recorded: the next kernel says so once
    (it would otherwise silently run everything again), records again, and reuses the
    objects already stored."""
    runner.run(BASE)
    runner.flush()
    with Store.open(runner.store) as store:
        objects_before = set(store.objects.iter_digests())
        assert not store.catalog_recreated
    (runner.store / "catalog.sqlite").unlink()
    out = runner.run(BASE, "repeat")
    assert decisions(out) == ["E"] * 5
    assert runner.session is not None
    said = [n for n in runner.session.notices if "catalog" in n]
    assert len(said) == 1 and "missing or empty" in said[0]
    runner.flush()
    with Store.open(runner.store) as store:
        assert not store.catalog_recreated
        assert len(store.catalog.cell_runs()) == 5
        assert objects_before <= set(store.objects.iter_digests())
    assert decisions(runner.run(BASE, "repeat")) == ["R"] * 5


@pytest.mark.cluster
def test_a_cluster_nobody_needs_is_never_started_and_one_needed_comes_back_as_its_cells_left_it(runner: Runner) -> None:
    """Cells that use a client and its futures while they are still only records replay,
    the closing cell too: an unchanged repeat starts no cluster. An edited cell that needs
    the futures gets them from the cluster cell and the cell that submitted them, re-run in
    order on one cluster, and the closing cell, which now reads a live client, runs."""
    import distributed

    cells = [
        "from distributed import Client, LocalCluster",
        "cluster = LocalCluster(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=':0')\nclient = Client(cluster)",
        "def inc(v):\n    return v + 1",
        "futs = client.map(inc, range(5))",
        "total = sum(client.gather(futs))\nprint(total)",
        "client.close()\ncluster.close()",
    ]
    runner.run(cells)
    assert runner.ns["total"] == 15
    before = {id(c) for c in distributed.Client._instances}
    out = runner.run(cells, "repeat")
    assert decisions(out) == ["R"] * 6
    assert all(runner.ns.is_pending(n) for n in ("cluster", "client", "futs"))
    assert {id(c) for c in distributed.Client._instances} <= before  # no client was made
    edited = [*cells[:4], "total = sum(client.gather(futs)) * 10\nprint(total)", cells[5]]
    try:
        out = runner.run(edited, "repeat")
        assert decisions(out) == ["R"] * 4 + ["E", "E"]
        assert runner.ns["total"] == 150
        assert dict.__getitem__(runner.ns, "futs")[0].client is dict.__getitem__(runner.ns, "client")  # one cluster
        assert runner.ns["client"].status == "closed"
    finally:
        for name in ("client", "cluster"):
            value = dict.get(runner.ns, name)
            if value is not None:
                value.close()


@pytest.mark.cluster
def test_a_cell_that_cannot_reach_dask_runs_without_starting_the_cluster(runner: Runner) -> None:
    """An edited cell that reads only numbers, a list of numbers and standard-library
    modules runs with the client still pending; one that reads a list holding a Dask
    collection, or uses dask, brings the client back first, as a fresh run has it."""
    cells = [
        "import math\nimport dask\nfrom distributed import Client, LocalCluster",
        "cluster = LocalCluster(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=':0')\nclient = Client(cluster)",
        "x = 2\nnums = [1, 2]\nlazy = [dask.delayed(math.sqrt)(9)]",
        "y = math.sqrt(x)",
        "s = sum(nums)",
        "r = [v * 2 for v in lazy]",
        "z = dask.delayed(math.sqrt)(16).compute()",
    ]
    runner.run(cells)
    runner.ns["client"].close()
    runner.ns["cluster"].close()
    edited = [*cells[:3], "y = math.sqrt(x) + 1", "s = sum(nums) + 1", "r = [v * 3 for v in lazy]", "z = dask.delayed(math.sqrt)(25).compute()"]
    try:
        runner.run(edited[:5], "repeat")
        assert runner.ns["y"] == math.sqrt(2) + 1 and runner.ns["s"] == 4 and runner.ns.is_pending("client")
        runner.cell(edited[5])
        assert not runner.ns.is_pending("client")
        runner.ns["client"].close()
        runner.ns["cluster"].close()
        runner.run(edited[:5], "repeat")
        runner.cell(edited[6])
        assert runner.ns["z"] == 5.0 and not runner.ns.is_pending("client")
    finally:
        for name in ("client", "cluster"):
            value = dict.get(runner.ns, name)
            if value is not None:
                value.close()


def test_keying_a_cell_that_calls_a_stored_function_does_not_load_it(runner: Runner) -> None:
    """What a stored function reads is recorded beside it: a replayed cell that calls it
    is keyed on those globals without unpickling the function (which may import heavy
    libraries), and an edit of such a global still makes the cell run."""
    cells = ["K = 3", "def helper(v):\n    return v * K", "def f(v):\n    return helper(v) + 1", "y = f(2)"]
    runner.run(cells)
    out = runner.run(cells, "repeat")
    assert decisions(out) == ["R"] * 4
    assert runner.ns.is_pending("f") and runner.ns.is_pending("helper")
    out = runner.run(["K = 4", *cells[1:]], "repeat")
    assert decisions(out) == ["E", "R", "R", "E"] and runner.ns["y"] == 9


@pytest.mark.parametrize("how", ["no-history", "recording-off"])
def test_an_unrecorded_request_runs_after_the_state_replayed_cells_left(runner: Runner, how: str) -> None:
    """A cell without history, or one while recording is off, is not recorded, but it runs
    as in a fresh run: after the global RNG state the replayed cells left."""
    cells = ["import random\nrandom.seed(7)", "x = random.random()"]
    runner.run(cells)
    fresh_next = random.Random(7)
    fresh_next.random()
    expected = fresh_next.random()
    random.seed(12345)  # a new process's state: the repeat kernel shares this interpreter with the audit
    out = runner.run(cells, mode="repeat")
    assert [o.decision for o in out] == ["replayed", "replayed"]
    session = runner.session
    assert session is not None
    code = "y = random.random()"
    if how == "recording-off":
        session.enabled = False
    plan = session.begin(code, store_history=how != "no-history", msg_id="m")
    assert not plan.record
    session.shell.run_cell(code, store_history=how != "no-history")
    assert runner.ns["y"] == expected


def test_a_big_file_rewritten_by_the_next_cell_is_stored_as_each_cell_wrote_it(runner: Runner) -> None:
    """The first cell's 6 MB file is captured into memory of its own before the reply, so
    the next cell rewriting it in place while the writer stores it changes nothing stored."""
    cells = [
        "import xxhash\nwith open('big.bin', 'wb') as h:\n    h.write(bytes(range(256)) * (6 << 12))",
        "with open('big.bin', 'rb') as h:\n    seen = xxhash.xxh3_64_hexdigest(h.read())\nwith open('big.bin', 'wb') as h:\n    h.write(b'B' * (6 << 20))",
    ]
    runner.run(cells)
    first = runner.ns["seen"]
    Path("big.bin").unlink()
    edited = [cells[0], cells[1].replace("seen =", "seen = again =")]
    out = runner.run(edited, "repeat")
    assert decisions(out) == ["R", "E"]
    assert runner.ns["again"] == first
    assert Path("big.bin").read_bytes() == b"B" * (6 << 20)
