"""Tasks that update their place in the graph: nbrewind.update_task on real Nanny workers.

The task under test is a shuffle-like aggregation: it receives N inputs as handles,
fetches them one by one, adds each to an accumulator, and after each one publishes
the accumulator as a piece, releases the input (and the previous piece), and names
a replacement that resumes from that piece with the inputs left. Every input it
consumes is appended to ``consumed.log`` and every input computed to
``computed.log`` in a folder passed as an argument, so counts include work done in
worker processes that were killed. Workers are killed by the task itself
(``os._exit`` at a chosen input, once per marker file) or by the test, from the
scheduler (which runs in the test process), around the moment an update arrives.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")

from distributed import Client, Event, LocalCluster, wait  # noqa: E402

import nbrewind  # noqa: E402
from nbrewind.tasks import update as up  # noqa: E402
from nbrewind.tasks.update.plugins import SCHEDULER_OP  # noqa: E402

N = 8
SIZE = 1000
EXPECTED = float(SIZE * sum(range(N)))

TASKS = '''
import os
import numpy as np
import nbrewind
from distributed import Event, get_worker
from nbrewind.identity.files import quietly
from nbrewind.tasks.update import fetch, handle, ref

def log(folder, name, line):
    with quietly(), open(os.path.join(folder, name), "a") as f:  # the test's record, not the task's effect
        f.write(f"{line}\\n")

def make_input(i, size, folder):
    log(folder, "computed.log", i)
    return np.full(size, float(i))

def aggregate(inputs, folder, consumed=0, acc=None, kill_at=()):
    key = get_worker().get_current_task()
    for pos, h in enumerate(inputs):
        part = fetch(h)
        acc = part.copy() if acc is None else acc + part
        del part
        consumed += 1
        log(folder, "consumed.log", h.key)
        marker = os.path.join(folder, f"killed-{consumed}")
        if consumed in kill_at and not os.path.exists(marker):
            with quietly():
                open(marker, "w").close()
            os._exit(1)
        piece = f"{key}-acc-{consumed}"
        previous = [f"{key}-acc-{consumed - 1}"] if consumed > 1 else []
        nbrewind.update_task(publish={piece: acc}, release=[h, *previous],
                             replacement=(aggregate, inputs[pos + 1:], folder, consumed, ref(piece), kill_at))
    return float(acc.sum())

def use(x, gate):
    return float(x.sum())

def wait_for(name):
    Event(name).wait(60)
    return 0

def hold_then_use(x_key, gate, folder):
    nbrewind.update_task(depends_on=[x_key], replacement=(from_handle, handle(x_key), folder))
    log(folder, "held.log", "original")
    Event(gate).wait(60)
    return float(fetch(x_key).sum())

def from_handle(h, folder):
    log(folder, "held.log", "replacement")
    return float(h.fetch().sum())

def publish_once(name, n):
    nbrewind.update_task(publish={name: np.arange(n)}, depends_on=[])
    return name

def misuse(x, x_key, other_key):
    """Bad updates, each answered by a clear error; returns them."""
    errors = {}
    def attempt(name, **kwargs):
        try:
            nbrewind.update_task(**kwargs)
        except Exception as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
    attempt("unknown", depends_on=["no-such-key"])
    attempt("unpicklable", replacement=(use, (i for i in range(3)), 0))
    attempt("still-needed", release=[x_key])
    attempt("not-mine", release=[other_key])
    attempt("ref-unknown", replacement=(use, ref("no-such-key"), 0))
    attempt("publish-existing", publish={x_key: 1})
    return errors
'''


def _namespace() -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "__main__"}  # functions travel to the workers by value
    exec(compile(TASKS, "<update-tasks>", "exec"), ns)
    return ns


NS = _namespace()


#: How long a result may take: each worker loss restarts a worker process (imports of
#: dask, distributed and numpy), which on a loaded 2-core machine took over 40 s; a hang
#: still fails, within the module's per-test timeout.
WAIT = 240
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cl:
        yield cl


@pytest.fixture
def client(cluster: LocalCluster, tmp_path: Path) -> Iterator[Client]:
    with Client(cluster) as c:
        c.wait_for_workers(2, timeout=WAIT)
        up.install(c, store=str(tmp_path / "store"))
        yield c


def _lines(folder: Path, name: str) -> list[str]:
    path = folder / name
    return path.read_text().split() if path.exists() else []


def _submit(client: Client, folder: Path, key: str, **kwargs: Any) -> tuple[Any, list[str]]:
    inputs = client.map(NS["make_input"], range(N), size=SIZE, folder=str(folder), key=[f"{key}-in-{i}" for i in range(N)])
    wait(inputs)
    keys = [f.key for f in inputs]
    agg = client.submit(NS["aggregate"], up.handles(inputs), str(folder), key=key, **kwargs)
    del inputs  # from here on, the task's hold is all that keeps them
    return agg, keys


def _settled(cluster: LocalCluster, gone: list[str], timeout: float = 10.0) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    tasks = cluster.scheduler.tasks
    while time.monotonic() < deadline and any(k in tasks for k in gone):
        time.sleep(0.05)
    return {str(k): ts.state for k, ts in tasks.items()}


def test_consumed_inputs_are_released_and_the_result_is_right(client: Client, cluster: LocalCluster,
                                                             tmp_path: Path) -> None:
    agg, keys = _submit(client, tmp_path, "agg-plain")
    assert agg.result(timeout=WAIT) == EXPECTED
    assert _lines(tmp_path, "consumed.log") == keys
    assert sorted(map(int, _lines(tmp_path, "computed.log"))) == list(range(N))
    states = _settled(cluster, keys)
    assert not any(k in states for k in keys), states
    # Earlier pieces are gone; the last is a released dependency of the result (reloadable).
    assert {k: v for k, v in states.items() if k.startswith("agg-plain")} == {
        "agg-plain": "memory", f"agg-plain-acc-{N}": "released"}
    assert up.hold_name("agg-plain") not in cluster.scheduler.clients
    del agg


def test_worker_lost_before_the_first_update_starts_over(client: Client, tmp_path: Path) -> None:
    agg, keys = _submit(client, tmp_path, "agg-before", kill_at=(1,))
    assert agg.result(timeout=WAIT) == EXPECTED
    consumed = _lines(tmp_path, "consumed.log")
    assert consumed == [keys[0], *keys], consumed
    # Inputs held for the task that were lost with the worker were recomputed, once.
    assert set(Counter(_lines(tmp_path, "computed.log")).values()) <= {1, 2}


def test_worker_lost_between_updates_resumes_from_the_last_piece(client: Client, tmp_path: Path) -> None:
    agg, keys = _submit(client, tmp_path, "agg-after", kill_at=(5,))
    assert agg.result(timeout=WAIT) == EXPECTED
    consumed = _lines(tmp_path, "consumed.log")
    # Input 5 (index 4) was consumed when its worker died, before its update: redone once.
    assert consumed == [*keys[:5], *keys[4:]], consumed
    computed = Counter(_lines(tmp_path, "computed.log"))
    # Inputs released by applied updates are never recomputed; others may be, if lost.
    assert all(computed[str(i)] == 1 for i in range(4)), computed


def test_the_replacement_itself_lost_resumes_again(client: Client, tmp_path: Path) -> None:
    agg, keys = _submit(client, tmp_path, "agg-twice", kill_at=(3, 6))
    assert agg.result(timeout=WAIT) == EXPECTED
    consumed = _lines(tmp_path, "consumed.log")
    assert consumed == [*keys[:3], *keys[2:6], *keys[5:]], consumed
    assert len(consumed) == N + 2


def _wrap_handler(cluster: LocalCluster, client: Client, key: str, at: int, apply_first: bool) -> Any:
    """Kill the sending worker when update number ``at`` of ``key`` reaches the scheduler.

    ``apply_first``: apply the update, then kill before the reply; else kill, wait
    until the scheduler has removed the worker, then let the (now stale) update in.
    """
    scheduler = cluster.scheduler
    original = scheduler.handlers[SCHEDULER_OP]
    pids = client.run(os.getpid)
    seen = {"n": 0, "replies": []}

    async def handler(**msg: Any) -> dict[str, Any]:
        if msg["key"] != key:
            return original(**msg)
        seen["n"] += 1
        if seen["n"] != at:
            return original(**msg)
        worker = msg["worker"]
        if apply_first:
            reply = original(**msg)
            os.kill(pids[worker], signal.SIGKILL)
        else:
            os.kill(pids[worker], signal.SIGKILL)
            deadline = time.monotonic() + 30
            while worker in scheduler.workers and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            reply = original(**msg)
        seen["replies"].append(reply)
        return reply

    scheduler.handlers[SCHEDULER_OP] = handler
    return original, seen


def test_worker_lost_while_its_update_is_in_flight_is_ignored(client: Client, cluster: LocalCluster,
                                                              tmp_path: Path) -> None:
    original, seen = _wrap_handler(cluster, client, "agg-inflight", at=4, apply_first=False)
    try:
        agg, keys = _submit(client, tmp_path, "agg-inflight")
        assert agg.result(timeout=WAIT) == EXPECTED
    finally:
        cluster.scheduler.handlers[SCHEDULER_OP] = original
    assert [r["status"] for r in seen["replies"]] == ["stale"]
    consumed = _lines(tmp_path, "consumed.log")
    # Update 4 never applied: the replacement of update 3 redoes input 4.
    assert consumed == [*keys[:4], *keys[3:]], consumed


def test_worker_lost_after_the_scheduler_applied_its_update_loses_nothing(client: Client, cluster: LocalCluster,
                                                                       tmp_path: Path) -> None:
    original, seen = _wrap_handler(cluster, client, "agg-applied", at=4, apply_first=True)
    try:
        agg, keys = _submit(client, tmp_path, "agg-applied")
        assert agg.result(timeout=WAIT) == EXPECTED
    finally:
        cluster.scheduler.handlers[SCHEDULER_OP] = original
    assert [r["status"] for r in seen["replies"]] == ["OK"]
    # The piece died with the worker and was read back from the store: nothing redone.
    assert _lines(tmp_path, "consumed.log") == keys


def test_released_keys_that_others_still_need_are_kept(client: Client, cluster: LocalCluster,
                                                       tmp_path: Path) -> None:
    folder = str(tmp_path)
    inputs = client.map(NS["make_input"], range(N), size=SIZE, folder=folder, key=[f"kept-in-{i}" for i in range(N)])
    wait(inputs)
    keys = [f.key for f in inputs]
    kept_by_client = inputs[2]
    gate = client.submit(NS["wait_for"], "kept-gate", key="kept-gate")
    waiting = client.submit(NS["use"], inputs[5], gate, key="kept-use")  # another task still needs input 5
    agg = client.submit(NS["aggregate"], up.handles(inputs), folder, key="kept-agg")
    del inputs
    assert agg.result(timeout=WAIT) == EXPECTED
    states = _settled(cluster, [k for i, k in enumerate(keys) if i not in (2, 5)])
    assert states[keys[2]] == "memory" and states[keys[5]] == "memory", states
    assert not any(k in states for i, k in enumerate(keys) if i not in (2, 5)), states
    Event("kept-gate", client=client).set()
    assert waiting.result(timeout=WAIT) == 5.0 * SIZE
    assert kept_by_client.result(timeout=10).sum() == 2.0 * SIZE
    # Nothing was released early and recomputed.
    assert Counter(_lines(tmp_path, "computed.log")) == Counter(str(i) for i in range(N))


def _wait_for_file(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_depends_on_holds_a_key_for_the_task_and_its_replacement(client: Client, cluster: LocalCluster,
                                                                tmp_path: Path) -> None:
    x = client.submit(NS["make_input"], 3, size=SIZE, folder=str(tmp_path), key="held-x")
    wait(x)
    task = client.submit(NS["hold_then_use"], x.key, "held-gate", str(tmp_path), key="held-task")
    _wait_for_file(tmp_path / "held.log")
    del x  # the client lets go; the task said it depends on the key
    time.sleep(0.3)
    scheduler = cluster.scheduler
    assert scheduler.tasks["held-x"].state == "memory"
    # Lose the task's worker: the replacement runs and fetches the held key (recomputed if it was lost too).
    pids = client.run(os.getpid)
    os.kill(pids[scheduler.tasks["held-task"].processing_on.address], signal.SIGKILL)
    assert task.result(timeout=WAIT) == 3.0 * SIZE
    assert _lines(tmp_path, "held.log") == ["original", "replacement"]
    # The replacement fetches it if it runs again, so the key lives as long as the result...
    assert scheduler.tasks["held-x"].state == "memory"
    del task
    # ... and not longer.
    states = _settled(cluster, ["held-x", "held-task"])
    assert "held-x" not in states and "held-task" not in states, states
    assert up.hold_name("held-task") not in scheduler.clients


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8))
def test_killed_at_a_random_moment_redoes_at_most_one_input(client: Client, cluster: LocalCluster,
                                                           tmp_path: Path, seed: int) -> None:
    import random

    rng = random.Random(seed)
    key = f"agg-random-{seed}"
    agg, keys = _submit(client, tmp_path, key)
    pids = client.run(os.getpid)
    # Wait until a random number of inputs were consumed, then a random extra moment.
    target = rng.randrange(1, N - 1)
    deadline = time.monotonic() + 30
    while len(_lines(tmp_path, "consumed.log")) < target and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(rng.random() * 0.02)
    ts = cluster.scheduler.tasks[key]
    assert ts.state == "processing", "the task finished before the kill: slow it down"
    os.kill(pids[ts.processing_on.address], signal.SIGKILL)
    assert agg.result(timeout=WAIT) == EXPECTED
    consumed = _lines(tmp_path, "consumed.log")
    assert set(consumed) == set(keys)
    assert len(consumed) <= N + 1, consumed


def test_bad_updates_get_clear_errors(client: Client, tmp_path: Path) -> None:
    x = client.submit(NS["make_input"], 7, size=10, folder=str(tmp_path), key="misuse-x")
    other = client.submit(NS["make_input"], 8, size=10, folder=str(tmp_path), key="misuse-other")
    errors = client.submit(NS["misuse"], x, x.key, other.key, key="misuse").result(timeout=WAIT)
    assert "unknown key 'no-such-key'" in errors["unknown"]
    assert errors["unpicklable"].startswith("TypeError: the replacement cannot be pickled")
    assert "would need them if it ran again" in errors["still-needed"]
    assert "cannot release 'misuse-other': it is neither a dependency" in errors["not-mine"]
    assert "references 'no-such-key', which task 'misuse' neither depends on nor holds" in errors["ref-unknown"]
    assert "already has a key of that name" in errors["publish-existing"]
    assert set(errors) == {"unknown", "unpicklable", "still-needed", "not-mine", "ref-unknown", "publish-existing"}
    # A refused update changes nothing: both keys are still there.
    assert x.result(timeout=10).sum() == 70.0 and other.result(timeout=10).sum() == 80.0


def test_under_the_task_cache(client: Client, tmp_path: Path) -> None:
    from nbrewind.tasks.cache import TaskCache
    from nbrewind.tasks.intercept import intercepting

    store = tmp_path / "cache.nbrewind"
    with intercepting(TaskCache(store)):
        # A task taking handles is not cached (a handle has no fingerprint): its pieces go
        # to the store given to install(), and it resumes as anywhere else.
        agg, keys = _submit(client, tmp_path, "agg-cached", kill_at=(4,))
        assert agg.result(timeout=WAIT) == EXPECTED
        assert len(_lines(tmp_path, "consumed.log")) == N + 1
        assert any((tmp_path / "store").rglob("*"))
        # A cached task publishes into the cache's own store.
        before = set((store / "objects").rglob("*"))
        plugin_store = set((tmp_path / "store").rglob("*"))
        piece = client.submit(NS["publish_once"], "cached-piece", 5, key="cached-publisher")
        assert piece.result(timeout=WAIT) == "cached-piece"
    assert set((store / "objects").rglob("*")) - before
    assert set((tmp_path / "store").rglob("*")) == plugin_store


def test_handles_are_found_in_task_arguments() -> None:
    from dask._task_spec import Task, parse_input

    from nbrewind.tasks.update.plugins import scan_handles

    task = Task("t", max, parse_input([up.handle("a"), {"b": up.handle(("b", 1))}]), up.ref("c"), "d")
    assert scan_handles(task) == {"a", ("b", 1)}
    assert task.dependencies == {"c"}  # a handle is not a dependency; a ref is
    assert up.key_of(up.handle("x")) == "x" and up.key_of(up.ref("y")) == "y"
    import pickle

    assert pickle.loads(pickle.dumps(up.handle("k"))) == up.handle("k")


def test_publish_without_a_store_says_where_to_get_one(client: Client) -> None:
    up.install(client)  # no store, and the task does not run under the task cache
    with pytest.raises(up.UpdateError, match="publish needs a store every worker can read"):
        client.submit(NS["publish_once"], "storeless-piece", 3, key="storeless").result(timeout=WAIT)


def test_without_the_plugins_the_error_says_to_install_them() -> None:
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as bare, \
            Client(bare) as c:
        with pytest.raises(up.UpdateError, match=r"call nbrewind.tasks.update.install\(client\)"):
            c.submit(NS["publish_once"], "bare-piece", 3, key="bare").result(timeout=30)


def test_misuse_outside_a_task(cluster: LocalCluster, tmp_path: Path) -> None:
    with pytest.raises(up.UpdateError, match="inside a Dask task running on a distributed worker"):
        nbrewind.update_task(release=["x"])
    with pytest.raises(up.UpdateError, match="inside a Dask task"):
        up.fetch("x")
    with pytest.raises(TypeError, match="not a Dask key"):
        up.handle(object())
