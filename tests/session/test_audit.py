"""Audit: what a cell run records, incremental checkpoints, co-variables, hidden state, faults."""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pytest

from nbrewind.session.state import HIDDEN, UNSERIALIZABLE, VALUE
from nbrewind.store import Store, verify_store
from nbrewind.store.objects import ObjectStore

from typing import Any as Runner  # the fixture type lives in conftest.py


def _entries(runner: Runner) -> dict:
    assert runner.session is not None
    return runner.session.state.entries


def test_cell_run_records_code_reads_writes_and_a_checkpoint(runner: Runner) -> None:
    runner.run(["x = 2", "y = x * 21", "del x"])
    with Store.open(runner.store) as store:
        runs = store.catalog.cell_runs()
        assert [r.code for r in runs] == ["x = 2", "y = x * 21", "del x"]
        assert [r.execution_count for r in runs] == [1, 2, 3]
        assert "x" in runs[1].reads and runs[1].writes == ["y"]
        assert runs[2].deletes == ["x"]
        last = store.catalog.checkpoint_entries(runs[-1].checkpoint_id)
        assert set(last) == {"y"}
        first = store.catalog.checkpoint_entries(runs[0].checkpoint_id)
        assert set(first) == {"x"}


def test_ipython_names_are_not_user_state(runner: Runner) -> None:
    runner.run(["1 + 1", "_", "z = _ + Out[1]"])
    assert set(_entries(runner)) == {"z"}


def test_unchanged_big_array_is_not_written_again(runner: Runner) -> None:
    runner.run(["import numpy as np", "a = np.random.default_rng(0).random(3_000_000)", "s = float(a.sum())", "t = a.mean()"])
    with Store.open(runner.store) as store:
        runs = store.catalog.cell_runs()
    assert runs[1].bytes_written >= 24_000_000
    assert runs[2].bytes_written < 10_000 and runs[3].bytes_written < 10_000


def test_aliases_share_one_entry_and_mutation_through_the_alias_is_seen(runner: Runner) -> None:
    runner.run(["import numpy as np", "a = np.zeros(200_000)", "b = a"])
    entries = _entries(runner)
    assert entries["a"].digest == entries["b"].digest and entries["a"].group == ("a", "b")
    before = entries["a"].key
    runner.cell("b[:10] += 1.0")
    after = _entries(runner)
    assert after["a"].key != before and after["a"].digest == after["b"].digest


def test_in_place_edit_of_a_large_array_stores_only_changed_chunks(runner: Runner) -> None:
    runner.run(["import numpy as np", "a = np.random.default_rng(0).random(5_000_000)"])
    runner.cell("a[:1000] *= 0.0")
    runner.flush()
    with Store.open(runner.store) as store:
        edit = store.catalog.cell_runs()[-1]
    assert 0 < edit.bytes_written < 5 * 2**20  # one 2 MiB chunk (plus small objects), not 40 MB


def test_list_inside_a_dict_is_one_group(runner: Runner) -> None:
    runner.run(["lst = [1, 2]", "d = {'x': lst}", "lst.append(3)"])
    entries = _entries(runner)
    assert entries["d"].group == ("d", "lst")
    keys = {n: entries[n].key for n in ("d", "lst")}
    runner.cell("d['x'].append(4)")
    entries = _entries(runner)
    assert entries["d"].key != keys["d"] and entries["lst"].key != keys["lst"]


def test_a_mutating_method_call_is_recorded(runner: Runner) -> None:
    runner.run(["config = {'items': [1, 2, 3]}"])
    before = _entries(runner)["config"].key
    runner.cell("config['items'].append(4)")
    assert _entries(runner)["config"].key != before


def test_a_function_mutating_a_global_is_recorded(runner: Runner) -> None:
    runner.run(["seen = []", "def note(v):\n    seen.append(v)"])
    before = _entries(runner)["seen"].key
    runner.cell("note(5)")
    assert _entries(runner)["seen"].key != before


@pytest.mark.parametrize(
    "code",
    [
        "import threading; v = threading.Lock()",
        "v = (i for i in range(3))",
        "import socket; v = socket.socket()",
        "v = open(__file__ if '__file__' in dir() else 'f.txt', 'w')",
    ],
)
def test_unserializable_values_never_fail_the_cell(runner: Runner, code: str) -> None:
    outcomes = runner.run([code, "w = 1"])
    assert all(o.success for o in outcomes)
    entries = _entries(runner)
    value = runner.ns["v"]
    if hasattr(value, "close"):
        value.close()
    assert entries["v"].kind == UNSERIALIZABLE and entries["w"].kind == VALUE


def test_rng_files_env_and_cwd_are_recorded(runner: Runner) -> None:
    outcomes = runner.run(
        [
            "import random, os",
            "random.seed(3)",
            "x = random.random()",
            "with open('out.txt', 'w') as fh:\n    fh.write('hello')",
            "with open('out.txt') as fh:\n    text = fh.read()",
            "os.environ['NBREWIND_TEST_VAR'] = '1'",
        ]
    )
    assert all(o.success for o in outcomes)
    entries = _entries(runner)
    assert entries["@rng:random"].kind == HIDDEN
    assert entries["@file:out.txt"].kind == HIDDEN
    assert entries["@env:NBREWIND_TEST_VAR"].extra["value"] == "1"
    with Store.open(runner.store) as store:
        runs = store.catalog.cell_runs()
    assert "@rng:random" in runs[2].inputs
    assert "@file:out.txt" in runs[4].inputs and runs[4].inputs["@file:out.txt"] != "absent" and "@cwd" in runs[4].inputs


_SCHEDULER_LIKE = (
    "import random, threading\n"
    "def _pick():\n"
    "    random.sample(range(100), 3)\n"
    "def background():\n"
    "    t = threading.Thread(target=_pick)\n"
    "    t.start()\n"
    "    t.join()\n"
)


def test_a_state_only_distributed_moved_is_not_an_input(runner: Runner) -> None:
    """Stand-in for the in-process scheduler's draws, which cannot be triggered on demand:
    real draws from real `random`, by code compiled as module `distributed.scheduler_like`."""
    scheduler: dict = {"__name__": "distributed.scheduler_like"}
    exec(compile(_SCHEDULER_LIKE, "<distributed.scheduler_like>", "exec"), scheduler)
    runner.new_kernel("audit")
    runner.ns["background"] = scheduler["background"]
    outcomes = [runner.cell(code) for code in ["import random", "background()\ny = 1", "background()\nz = random.random()"]]
    runner.flush()
    assert all(o.success for o in outcomes)
    with Store.open(runner.store) as store:
        runs = store.catalog.cell_runs()
    assert "@rng:random" not in runs[1].inputs  # only the scheduler's thread drew
    assert "@rng:random" not in (runs[1].writes or [])  # nor is that move the cell's to restore
    assert "@rng:random" in runs[2].inputs  # the cell drew too


def test_full_disk_is_one_warning_and_the_kernel_keeps_working(
    runner: Runner, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Fault injection: a real full disk cannot be made here, so chunk writes raise ENOSPC.

    Checkpoints are written in the background, so the failure is reported once,
    at the next cell; the failed cell run never becomes a replay candidate."""
    runner.run(["import numpy as np", "a = np.ones(10)"])
    assert runner.session is not None

    def full(self: ObjectStore, digest: str, piece: memoryview, verify: bool = False) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(ObjectStore, "_write_chunk", full)
        outcome = runner.cell("b = np.random.default_rng(0).random(100_000)")
        runner.session.writer.flush()
    assert outcome.success and runner.ns["b"].shape == (100_000,)
    assert runner.cell("c = 3").success
    err = capfd.readouterr().err
    assert err.count("NBRewind warning") == 1 and "No space left" in err
    assert "c" in _entries(runner)
    runner.session.writer.flush()
    with Store.open(runner.store) as store:
        codes = [r.code for r in store.catalog.cell_runs()]
        # The failed cell run was never written: no catalog row trusts its missing
        # objects. The next cell stored the lost value `b` again with its own checkpoint.
        assert codes == ["import numpy as np", "a = np.ones(10)", "c = 3"]
        assert "b" in store.catalog.cell_runs()[-1].writes
        assert verify_store(store).ok


def test_a_full_disk_is_said_once_until_space_is_back(
    runner: Runner, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Fault injection as above (a real full disk cannot be made here). Five cells on a full
    disk print one NBRewind line in all; once writes succeed again, the next full disk is
    said again."""
    runner.run(["import numpy as np"])
    assert runner.session is not None

    def full(self: ObjectStore, digest: str, piece: memoryview, verify: bool = False) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(ObjectStore, "_write_chunk", full)
        for i in range(5):
            assert runner.cell(f"b{i} = np.full(50_000, {i}.0)").success
            runner.flush()
        assert runner.cell("c = 1").success
    err = capfd.readouterr().err
    assert err.count("NBRewind warning") == 1 and "disk is full" in err and "gc" not in err
    runner.flush()
    assert runner.cell("d = 2").success  # written: space is back
    runner.flush()
    assert runner.cell("e = 3").success
    runner.flush()
    with monkeypatch.context() as patch:
        patch.setattr(ObjectStore, "_write_chunk", full)
        runner.cell("f = np.full(50_000, 9.0)")
        runner.flush()
        runner.cell("g = 4")
    assert capfd.readouterr().err.count("disk is full") == 1
    with Store.open(runner.store) as store:
        assert verify_store(store).ok


def test_a_checkpoint_built_on_a_failed_write_is_refused(
    runner: Runner, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Fault injection as above, but the next cell is staged before the failure is known:
    its checkpoint refers to the lost objects, so it is refused too, and the cell after
    that stores the value again."""
    import threading

    runner.run(["import numpy as np"])
    assert runner.session is not None
    gate = threading.Event()

    def full(self: ObjectStore, digest: str, piece: memoryview, verify: bool = False) -> None:
        gate.wait(10)
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(ObjectStore, "_write_chunk", full)
        runner.cell("b = np.random.default_rng(0).random(100_000)")
        runner.cell("c = 3")  # staged while b's write is still failing
        gate.set()
        runner.flush()
    runner.cell("d = 4")
    runner.flush()
    # One line per cell: the full disk; the refused checkpoint built on it has the same cause.
    assert capfd.readouterr().err.count("NBRewind warning") == 1
    with Store.open(runner.store) as store:
        runs = store.catalog.cell_runs()
        assert [r.code for r in runs] == ["import numpy as np", "d = 4"]
        assert "b" in runs[-1].writes
        assert {"b", "c", "d"} <= set(store.catalog.checkpoint_entries(runs[-1].checkpoint_id))
        assert verify_store(store).ok


def test_paused_recording_records_nothing(runner: Runner) -> None:
    runner.run(["x = 1"])
    assert runner.session is not None
    runner.session.enabled = False
    runner.cell("y = 2")
    runner.session.enabled = True
    runner.cell("z = 3")
    runner.flush()
    with Store.open(runner.store) as store:
        assert [r.code for r in store.catalog.cell_runs()] == ["x = 1", "z = 3"]


def test_checkpoint_of_a_cell_that_reads_a_big_array_is_cheap(runner: Runner) -> None:
    runner.run(["import numpy as np", "a = np.random.default_rng(1).random(5_000_000)"])
    assert runner.session is not None
    runner.cell("m = float(a.mean())")
    last = runner.session.last
    assert last is not None and last.bytes_written < 2_000
    assert last.checkpoint_seconds < 0.05
    np.testing.assert_allclose(runner.ns["m"], runner.ns["a"].mean())


def test_mutating_a_value_while_its_checkpoint_is_written_never_stores_a_wrong_value(
    runner: Runner, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Staging copies the new chunks before the cell's reply. Hold the writer (a real
    write, delayed) while the next cell mutates the array in place: both checkpoints are
    kept, without a warning, and each restores exactly what its cell left."""
    import threading

    runner.run(["import numpy as np"])
    assert runner.session is not None
    gate = threading.Event()
    original = ObjectStore._write_chunk

    def delayed(self: ObjectStore, digest: str, piece: memoryview, verify: bool = False) -> None:
        gate.wait(10)
        original(self, digest, piece, verify)

    with monkeypatch.context() as patch:
        patch.setattr(ObjectStore, "_write_chunk", delayed)
        runner.cell("a = np.random.default_rng(0).random(1_000_000)")
        first = runner.ns["a"].copy()
        runner.cell("a[:10] = -1.0")
        gate.set()
        runner.flush()
    runner.cell("z = float(a[0])")
    runner.flush()
    assert "NBRewind" not in capfd.readouterr().err
    expected = runner.ns["a"].copy()
    with Store.open(runner.store) as store:
        assert verify_store(store).ok
        runs = store.catalog.cell_runs()
    assert [r.code for r in runs][1:] == ["a = np.random.default_rng(0).random(1_000_000)", "a[:10] = -1.0", "z = float(a[0])"]
    for run, value in ((runs[1], first), (runs[-1], expected)):
        runner.new_kernel("repeat")
        runner.session.restore(str(run.execution_count))
        np.testing.assert_array_equal(runner.ns["a"], value)


def test_keyboard_interrupt_during_checkpointing_leaves_the_store_consistent(
    runner: Runner, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Fault injection: Ctrl-C cannot be timed into the checkpoint here, so staging raises it."""
    from nbrewind.session import state as state_module

    runner.run(["import numpy as np", "a = np.ones(10)"])

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(state_module, "stage_group", interrupted)
        outcome = runner.cell("b = np.arange(100_000.0)")
    assert outcome.success
    assert "interrupted" in capfd.readouterr().err
    runner.cell("c = 1")
    runner.flush()
    with Store.open(runner.store) as store:
        assert verify_store(store).ok
        runs = store.catalog.cell_runs()
        assert [r.code for r in runs][-1] == "c = 1"
        assert "b" in store.catalog.checkpoint_entries(runs[-1].checkpoint_id)


def test_the_audit_never_changes_what_threads_draw_from_the_global_rng(runner: Runner) -> None:
    """User threads draw from the global generator exactly as on a plain kernel: the audit
    routes no draw elsewhere (it used to give threads a private generator)."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    cell = (
        "import random\nfrom concurrent.futures import ThreadPoolExecutor\nrandom.seed(1)\n"
        "with ThreadPoolExecutor(1) as pool:\n    drawn = list(pool.map(lambda _: random.random(), range(3)))"
    )
    runner.run([cell])
    random.seed(1)
    with ThreadPoolExecutor(1) as pool:
        plain = list(pool.map(lambda _: random.random(), range(3)))
    assert runner.ns["drawn"] == plain


def test_reads_the_static_analysis_cannot_see_are_re_digested(runner: Runner) -> None:
    """In-place changes through methods, out= arguments, **kwargs, stored bound methods and
    defaultdict reads change the recorded digest of the value (keys are content)."""
    cells = [
        "import numpy as np, collections",
        "lst = [3, 1, 2]\na = np.ones(4)\nd = collections.defaultdict(list)\nbox = []\npush = box.append",
        "lst.sort()",
        "np.exp(a, out=a)",
        "d['k']",
        "push(2)",
    ]
    runner.run(cells[:2])
    before = dict(_entries(runner))
    runner.run(cells[2:], fresh=False)
    after = _entries(runner)
    for name in ("lst", "a", "d", "box"):
        assert after[name].key != before[name].key, name


def test_a_read_only_use_of_a_big_array_is_not_re_digested(runner: Runner) -> None:
    """Proven pure uses (a reduction method, len(), an attribute) cost no re-digest."""
    runner.run(["import numpy as np", "a = np.ones(1000)"])
    assert runner.session is not None
    seen: list[str] = []
    real = runner.session.state.checkpoint

    def spy(ns, user, candidates, **kw):  # type: ignore[no-untyped-def]
        seen.extend(candidates)
        return real(ns, user, candidates, **kw)

    runner.session.state.checkpoint = spy  # type: ignore[method-assign]
    runner.run(["total = a.sum() + len(a) + a.shape[0]"], fresh=False)
    assert "a" not in seen and "total" in seen
    runner.run(["a.sort()"], fresh=False)
    assert "a" in seen


def test_the_store_lands_beside_the_notebook_vs_code_names(runner: Runner, monkeypatch: pytest.MonkeyPatch) -> None:
    # VS Code's Jupyter extension sets __vsc_ipynb_file__ in the namespace; it sets neither
    # JPY_SESSION_NAME nor __session__.
    from nbrewind.session import Session

    monkeypatch.delenv("NBREWIND_STORE", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    runner.new_kernel("audit")
    assert runner.session is not None
    shell = runner.session.shell
    notebook = runner.workdir / "analysis.ipynb"
    shell.user_ns["__vsc_ipynb_file__"] = str(notebook)
    session = Session(shell, mode="audit", emit=lambda *args: None)
    try:
        assert session.store_location() == notebook.with_name("analysis.ipynb.nbrewind")
    finally:
        session.close()
