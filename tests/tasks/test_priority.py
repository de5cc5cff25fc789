"""Tests for nbrewind.tasks.priority: bumps on the scheduler, on workers, and automatic ones.

Cluster tests use a real ``LocalCluster`` with one worker and one thread.
``processes=False`` keeps start-up near 0.1 s; it does not weaken them, because
the scheduler, the worker state machine and the batched streams between them
are the same objects and messages as with worker processes (only the transport
is in-memory).

They assert orders, not durations, so that they hold on a loaded machine: the
tasks record the order they finish in, and where a bump must be in effect
before anything runs, they wait at a :class:`Gate` that the test opens once the
scheduler (and the worker, if it holds the task) shows the bump. With one
thread that order is the order the worker chose, so a bump that did nothing
leaves the requested task at its submission position (150 of 200).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")

from distributed import Client, Future, LocalCluster  # noqa: E402
from distributed.collections import HeapSet  # noqa: E402

np = pytest.importorskip("numpy")

from nbrewind.tasks import priority  # noqa: E402
from nbrewind.tasks.priority import (  # noqa: E402
    CONFIG_KEY,
    auto_priority_enabled,
    auto_priority_for_new_clients,
    bump_head,
    bump_waited,
    enable_auto_priority,
    install,
    prioritize,
    reheap,
    set_auto_priority,
    strip_bump,
)

#: Duration of one task (D) where tasks must take time (noise next to a chain).
D = 0.02
N_TASKS = 200
TARGET = 150
#: A bumped request finishes at most this many places into the completion order:
#: the task the worker is running when the bump lands, the one more task the
#: scheduler may already have sent it (worker-saturation 1.1 on one thread), then
#: the request. Without a bump it finishes at place TARGET.
FIRST_PLACES = 3
#: Seconds a gated task waits for its gate before failing (only reached if a test
#: hangs: the cluster's teardown opens the gate).
GATE_TIMEOUT = 120.0
#: Seconds to wait for a bump to show on the scheduler or the worker.
BUMP_TIMEOUT = 60.0
DEFAULT_SATURATION = 1.1
SATURATIONS = [
    pytest.param(DEFAULT_SATURATION, id="queued-on-scheduler"),
    pytest.param(float("inf"), id="all-on-worker"),
]


class Gate:
    """Holds gated tasks at their start until opened; records the order tasks finish in.

    The cluster runs in this process (``processes=False``), so the tasks on the
    worker's thread and the test share this object.
    """

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.entered = threading.Event()
        self._lock = threading.Lock()
        self._finished: list[Hashable] = []

    def open(self) -> None:
        self.opened.set()

    def wait_entered(self) -> None:
        """Wait until a gated task is running (so its whole graph is on the scheduler)."""
        if not self.entered.wait(GATE_TIMEOUT):
            raise AssertionError("no gated task started")

    def finished(self, label: Hashable) -> None:
        with self._lock:
            self._finished.append(label)

    def order(self) -> list[Hashable]:
        """Labels in the order their tasks finished."""
        with self._lock:
            return list(self._finished)

    def place(self, label: Hashable) -> int:
        """Where `label`'s task finished (0 = first)."""
        return self.order().index(label)


GATE = Gate()


def gated(i: int) -> int:
    """Wait for the gate, then record finishing as `i`."""
    GATE.entered.set()
    if not GATE.opened.wait(GATE_TIMEOUT):
        raise TimeoutError("the test never opened the gate")
    GATE.finished(i)
    return i


def noise(i: int) -> int:
    """Sleep one task duration, then record finishing as ("noise", i)."""
    time.sleep(D)
    GATE.finished(("noise", i))
    return i


def link(x: int, label: Hashable) -> int:
    """One link of a chain: sleep one task duration, record finishing as `label`."""
    time.sleep(D)
    GATE.finished(label)
    return x + 1


def sleep_inc(x: float) -> float:
    time.sleep(D)
    return x + 1


def _worker_task_count(dask_worker: Any) -> int:
    return len(dask_worker.state.tasks)


@contextlib.contextmanager
def one_thread_cluster(saturation: float = DEFAULT_SATURATION) -> Iterator[Client]:
    """A 1 worker x 1 thread cluster (with a new, closed gate) whose leftover work is
    cancelled before it closes."""
    global GATE
    GATE = Gate()
    # dashboard ":0": another cluster may hold 8787, and distributed leaks a socket
    # (a ResourceWarning, an error here) when it retries on a taken port.
    with dask.config.set({"distributed.scheduler.worker-saturation": saturation}):
        with (
            LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster,
            Client(cluster) as client,
        ):
            install(client)  # as the kernels do at start
            try:
                yield client
            finally:
                GATE.open()  # a failed test must not leave the worker's thread waiting
                client.cancel([Future(key, client) for key in list(client.futures)])
                # A task cut off by the worker closing logs a warning: let it end first.
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline and any(client.run(_worker_task_count).values()):
                    time.sleep(0.01)


def scheduler_priorities(client: Client, keys: list[Any]) -> list[tuple[float, ...]]:
    def read(dask_scheduler: Any) -> list[tuple[float, ...]]:
        return [tuple(dask_scheduler.tasks[k].priority) for k in keys]

    return client.run_on_scheduler(read)


def _bump_shows(client: Client, key: Hashable, *, held: bool = False) -> bool:
    """Whether `key` carries a bump on the scheduler and, if the worker holds it, there too
    (with `held`, only once the worker holds it)."""

    def on_worker(dask_worker: Any) -> bool:
        ts = dask_worker.state.tasks.get(key)
        if ts is None or ts.priority is None:
            return not held
        return bool(ts.priority[0] == float("-inf"))

    def on_scheduler(dask_scheduler: Any) -> bool:
        ts = dask_scheduler.tasks.get(key)
        return ts is not None and ts.priority is not None and ts.priority[0] == float("-inf")

    return bool(client.run_on_scheduler(on_scheduler)) and all(client.run(on_worker).values())


def wait_for_bump(client: Client, keys: list[Hashable], *, held: bool = False) -> None:
    """Return once every key shows its bump where it is queued (with `held`: on the worker,
    where a bumped task queued on the scheduler is handed at once).

    The scheduler applies a bump before ``prioritize`` returns, but tells the
    worker on its batched stream, and an automatic bump happens in whichever
    thread blocks: polling the state is the one way to see either land.
    """
    deadline = time.monotonic() + BUMP_TIMEOUT
    while not all(_bump_shows(client, key, held=held) for key in keys):
        if time.monotonic() > deadline:
            raise AssertionError(f"no bump on {keys} within {BUMP_TIMEOUT} s")
        time.sleep(0.01)


def open_when_bumped(client: Client, keys: list[Hashable], wait: Callable[[], Any]) -> Any:
    """Run `wait` (which blocks on gated work and should bump it) in a thread; open the
    gate once `keys` show the bump; return what `wait` returned."""
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(wait)
        try:
            wait_for_bump(client, keys)
        finally:
            GATE.open()
        return waiting.result(timeout=GATE_TIMEOUT)


# -- pure helpers --------------------------------------------------------------


def test_bumped_priorities_sort_first_and_later_bumps_win() -> None:
    ordinary = [(0, 1, 5), (-(10**9), 0, 0), (3, 7, 1), (0.0, 2.0)]
    first = [bump_head(1) + p for p in ordinary]
    second = [bump_head(2) + p for p in ordinary]
    assert max(second) < min(first)
    assert max(first) < min(ordinary)
    # within one bump the original order is kept
    assert sorted(first) == [bump_head(1) + p for p in sorted(ordinary)]


def test_strip_bump_recovers_the_original_priority() -> None:
    original = (0, 3, 17)
    assert strip_bump(bump_head(4) + original) == original
    assert strip_bump(bump_head(5) + strip_bump(bump_head(4) + original)) == original
    assert strip_bump(original) == original


class _Item:
    def __init__(self, name: str, priority: tuple[float, ...]) -> None:
        self.name = name
        self.priority = priority


def test_reheap_makes_a_heapset_follow_changed_priorities() -> None:
    heap: HeapSet[_Item] = HeapSet(key=lambda item: item.priority)
    items = [_Item(str(i), (0, i)) for i in range(10)]
    for item in items:
        heap.add(item)
    items[7].priority = bump_head(1) + items[7].priority
    assert heap.peek() is items[0]  # the stale order a plain HeapSet keeps
    reheap(heap)
    order = [heap.pop().name for _ in range(len(items))]
    assert order == ["7", "0", "1", "2", "3", "4", "5", "6", "8", "9"]


def test_importing_the_module_imports_no_dask() -> None:
    code = "import sys, nbrewind.tasks.priority; print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- bumps on a real cluster -----------------------------------------------------

needs_cluster = pytest.mark.cluster


@needs_cluster
def test_prioritize_rejects_plain_values() -> None:
    with one_thread_cluster() as client, pytest.raises(TypeError, match="cannot prioritize int"):
        prioritize([client.submit(sleep_inc, 1), 3], client)


@needs_cluster
@pytest.mark.parametrize("saturation", SATURATIONS)
def test_requested_task_jumps_the_queue(saturation: float) -> None:
    """A bumped task runs right after what the worker already started, not at its place 150.

    The bump comes once the worker runs the first task, so it re-sorts the
    scheduler's queue or the worker's ready heap (not a bump applied on arrival).
    """
    with one_thread_cluster(saturation) as client:
        futures = client.map(gated, range(N_TASKS))
        GATE.wait_entered()
        assert prioritize(futures[TARGET]) == 1
        wait_for_bump(client, [futures[TARGET].key])
        GATE.open()
        assert futures[TARGET].result() == TARGET
        assert GATE.place(TARGET) < FIRST_PLACES, GATE.order()[:10]


def _worker_keys(dask_worker: Any) -> list[Hashable]:
    return list(dask_worker.state.tasks)


def _saturation(dask_scheduler: Any) -> float:
    return float(dask_scheduler.WORKER_SATURATION)


@needs_cluster
def test_a_bumped_queued_task_is_handed_to_the_worker_at_once() -> None:
    """With queuing on, the worker already holds the next task it will run; the bumped
    task is sent to it too, sorts first, and finishes right after the running one."""
    with one_thread_cluster() as client:
        futures = client.map(gated, range(N_TASKS))
        GATE.wait_entered()
        assert prioritize(futures[TARGET]) == 1
        key = futures[TARGET].key
        deadline = time.monotonic() + BUMP_TIMEOUT
        while not all(key in keys for keys in client.run(_worker_keys).values()):
            assert time.monotonic() < deadline, "the bumped task never reached the worker"
            time.sleep(0.01)
        GATE.open()
        assert futures[TARGET].result() == TARGET
        assert GATE.place(TARGET) == 1, GATE.order()[:10]
        assert client.run_on_scheduler(_saturation) == DEFAULT_SATURATION  # raised only while sending


@needs_cluster
@pytest.mark.parametrize("saturation", SATURATIONS)
def test_without_a_bump_the_request_waits_its_turn(saturation: float) -> None:
    """The control: unbumped, the requested task finishes after the 100 submitted before it."""
    with one_thread_cluster(saturation) as client:
        futures = client.map(gated, range(N_TASKS))
        GATE.open()
        assert futures[TARGET].result() == TARGET
        assert GATE.place(TARGET) > 100, GATE.order()[:10]


@needs_cluster
def test_a_later_bump_wins_over_an_earlier_one() -> None:
    """Bump 50 then 150: 150 finishes first, both ahead of the unbumped tasks between them."""
    with one_thread_cluster() as client:
        futures = client.map(gated, range(N_TASKS))
        assert prioritize(futures[50]) == 1
        assert prioritize(futures[150]) == 1
        p50, p150, p10 = scheduler_priorities(client, [futures[i].key for i in (50, 150, 10)])
        assert p150 < p50 < p10
        # Both on the worker before it picks its next task: on a loaded machine the hand-off of
        # 150 can still be on its way when 50's has landed, and the worker would run 50 first.
        wait_for_bump(client, [futures[50].key, futures[150].key], held=True)
        GATE.open()
        assert futures[50].result() == 50 and futures[20].result() == 20
        order = GATE.order()
        assert order.index(150) < order.index(50) < order.index(20), order[:10]
        assert order.index(50) < FIRST_PLACES + 1, order[:10]


@needs_cluster
def test_bumping_a_key_bumps_the_chain_it_waits_on() -> None:
    """A bumped chain's links run ahead of the noise though only its first link was ready.

    Every task is sent to the worker at once, so the chain's first link sits in
    the worker's ready heap behind N_TASKS noise tasks and the rest wait on the
    scheduler. While a finished link's successor travels from the scheduler the
    freed thread runs noise (one task or so on a quiet machine, more on a loaded
    one), so the assertion is that the chain ends while at least half the noise
    is still waiting: unbumped (priority -1) it would end after all of it.
    """
    with one_thread_cluster(float("inf")) as client:
        noise_futures = client.map(noise, range(N_TASKS))  # noqa: F841 - keeps the worker busy

        def chain(name: str, length: int) -> list[Future]:
            links = [client.submit(link, 0, (name, 0), priority=-1, pure=False)]
            for i in range(1, length):
                links.append(client.submit(link, links[-1], (name, i), priority=-1, pure=False))
            return links

        bumped, control = chain("bumped", 5), chain("control", 5)
        assert prioritize(bumped[-1]) == 5
        assert bumped[-1].result() == 5
        assert all(p[0] == float("-inf") for p in scheduler_priorities(client, [f.key for f in bumped]))
        order = GATE.order()
        done: list[Any] = order[: order.index(("bumped", 4)) + 1]  # (kind, index) labels
        assert [label for label in done if label[0] == "bumped"] == [("bumped", i) for i in range(5)]
        assert not any(label[0] == "control" for label in done)
        noise_before = sum(label[0] == "noise" for label in done)
        assert noise_before < N_TASKS // 2, f"{noise_before} noise tasks finished before the bumped chain"
        assert not control[0].done()


@needs_cluster
def test_bumping_a_slice_of_a_persisted_collection_bumps_only_what_it_needs() -> None:
    """Bumping one chunk of a persisted array makes that chunk, and only it, jump the queue."""
    da = pytest.importorskip("dask.array")
    with one_thread_cluster() as client:
        persisted = da.zeros(N_TASKS, chunks=1).map_blocks(_gated_block, meta=_META).persist()
        piece = persisted[TARGET : TARGET + 1]
        GATE.wait_entered()  # the chunks are queued: the bump re-sorts the queue
        assert prioritize(piece) == 1
        wait_for_bump(client, [persisted.__dask_keys__()[TARGET]])
        GATE.open()
        assert piece.compute().tolist() == [1.0]
        assert GATE.place(TARGET) < FIRST_PLACES, GATE.order()[:10]


@pytest.fixture
def no_plugin_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Fail if a plugin hook raised: distributed logs that at INFO level and goes on."""
    with caplog.at_level("INFO", logger="distributed"):
        yield
    failed = [r.getMessage() for r in caplog.records if "failed with exception" in r.getMessage()]
    assert not failed, failed


def _set_hold_timeout(client: Client, seconds: float) -> None:
    """Set the worker plugin's hold timeout: long in ordering tests, so that a slow round
    trip on a loaded machine cannot end a hold before the next link arrives."""

    def set_it(dask_worker: Any) -> None:
        dask_worker.plugins[priority.PLUGIN_NAME].hold_timeout = seconds

    client.run(set_it)


def _holds(client: Client) -> dict[str, Any]:
    """The worker plugin's hold counters and the worker's thread count, once the loop is idle."""

    def read(dask_worker: Any) -> dict[str, Any]:
        plugin = dask_worker.plugins[priority.PLUGIN_NAME]
        return {
            "met": plugin.holds_met,
            "timed_out": plugin.holds_timed_out,
            "held": len(plugin.hold_seconds),
            "nthreads": dask_worker.state.nthreads,
            "pending": len(plugin._links) + len(plugin._armed) + len(plugin._held),
        }

    (stats,) = client.run(read).values()
    return stats


def _chain_on(client: Client, first: Future, length: int) -> list[Future]:
    """Links ("chain", 1..length) of D each, the first depending on ``first``."""
    links = [first]
    for i in range(1, length + 1):
        links.append(client.submit(link, links[-1], ("chain", i), pure=False))
    return links[1:]


def _bumped_chain_behind_the_gate(client: Client) -> tuple[list[Future], list[Future]]:
    """Map the gated tasks, chain two links on the target and bump the chain while the
    gate holds the worker's one thread; the futures and the chain."""
    _set_hold_timeout(client, BUMP_TIMEOUT)
    futures = client.map(gated, range(N_TASKS))
    chain = _chain_on(client, futures[TARGET], 2)
    GATE.wait_entered()
    assert prioritize(chain[-1]) == 3
    wait_for_bump(client, [futures[TARGET].key])
    return futures, chain


@needs_cluster
@pytest.mark.usefixtures("no_plugin_errors")
def test_a_bumped_chain_runs_ahead_of_the_task_the_worker_holds() -> None:
    """Each later link of a bumped chain starts on the thread its predecessor freed.

    With queuing on (worker-saturation 1.1) the worker holds one unbumped task beyond
    the one it runs. The chain is a queued task, then two links that wait on it on
    the scheduler: each is sent only once its predecessor is done. Without holding the
    freed thread, the held task starts while the next link travels and finishes
    between every two links.
    """
    with one_thread_cluster() as client:
        futures, chain = _bumped_chain_behind_the_gate(client)
        GATE.open()
        assert chain[-1].result() == TARGET + 2
        order = GATE.order()
        start = order.index(TARGET)
        assert order[start : start + 3] == [TARGET, ("chain", 1), ("chain", 2)], order[:10]
        assert start < FIRST_PLACES, order[:10]
        stats = _holds(client)
        assert stats["met"] == 2 and stats["timed_out"] == 0, stats
        assert stats["nthreads"] == 1 and stats["pending"] == 0, stats
        assert not _hooks_installed(client)  # the chain is done: no transition hook left


def _hooks_installed(client: Client) -> list[str]:
    """Where the plugins follow transitions now (they do only while a chain is outstanding)."""

    def on_scheduler(dask_scheduler: Any) -> bool:
        return "transition" in vars(dask_scheduler.plugins[priority.PLUGIN_NAME])

    def on_worker(dask_worker: Any) -> bool:
        return "transition" in vars(dask_worker.plugins[priority.PLUGIN_NAME])

    found = ["scheduler"] if client.run_on_scheduler(on_scheduler) else []
    return found + [address for address, yes in client.run(on_worker).items() if yes]


@needs_cluster
@pytest.mark.usefixtures("no_plugin_errors")
def test_a_bumped_slice_of_a_persisted_array_runs_as_one_chain() -> None:
    """The issue's case: a slice of a persisted array, computed with automatic bumps,
    runs its chunk, the task that slices and sums it and dask's finalize back to back:
    no unbumped chunk finishes between the requested chunk and the result."""
    da = pytest.importorskip("dask.array")
    with one_thread_cluster() as client, enable_auto_priority(client):
        _set_hold_timeout(client, BUMP_TIMEOUT)
        persisted = da.zeros(N_TASKS, chunks=1).map_blocks(_gated_block, meta=_META).persist()
        GATE.wait_entered()
        piece = persisted[TARGET : TARGET + 1].map_blocks(_recorded_sum, meta=_META).sum()
        got = open_when_bumped(client, [persisted.__dask_keys__()[TARGET]], piece.compute)
        assert got == 1.0
        order = GATE.order()
        start = order.index(TARGET)
        assert order[start : start + 2] == [TARGET, "sum"], order[:10]
        assert start < FIRST_PLACES, order[:10]
        assert _holds(client)["nthreads"] == 1


def _recorded_sum(block: Any) -> Any:
    """A map_blocks function on the slice: record finishing as "sum"."""
    GATE.finished("sum")
    return block


@needs_cluster
@pytest.mark.usefixtures("no_plugin_errors")
def test_a_bumped_chain_on_the_worker_runs_without_noise_between_links() -> None:
    """All work on the worker (worker-saturation inf): a bumped chain's links still
    reach it one by one, and each takes the thread its predecessor freed."""
    with one_thread_cluster(float("inf")) as client:
        _set_hold_timeout(client, BUMP_TIMEOUT)
        noise_futures = client.map(noise, range(N_TASKS))  # noqa: F841 - keeps the worker busy
        first = client.submit(link, 0, ("chain", 0), priority=-1, pure=False)
        chain = _chain_on(client, first, 3)
        assert prioritize(chain[-1]) == 4
        assert chain[-1].result() == 4
        order = GATE.order()
        start = order.index(("chain", 0))
        assert order[start : start + 4] == [("chain", i) for i in range(4)], order[start : start + 8]
        assert _holds(client)["nthreads"] == 1


@needs_cluster
@pytest.mark.usefixtures("no_plugin_errors")
def test_a_hold_nothing_comes_for_ends_at_its_timeout() -> None:
    """A link whose dependent never arrives keeps its thread only until the timeout;
    the worker then runs what it holds, and its thread count is back."""
    with one_thread_cluster() as client:
        _set_hold_timeout(client, 0.2)
        futures = client.map(gated, range(5), pure=False)
        GATE.wait_entered()
        key = futures[0].key  # running now; marked as a link whose follower never comes

        def mark(dask_worker: Any) -> None:
            dask_worker.plugins[priority.PLUGIN_NAME].handle_prioritize([], [], links=[key])

        client.run(mark)
        GATE.open()
        assert client.gather(futures) == list(range(5))
        stats = _holds(client)
        assert stats["timed_out"] == 1 and stats["met"] == 0, stats
        assert stats["nthreads"] == 1 and stats["pending"] == 0, stats


@needs_cluster
@pytest.mark.usefixtures("no_plugin_errors")
def test_cancelling_the_rest_of_a_chain_releases_its_link() -> None:
    """When the chain's later links are cancelled, the scheduler tells the worker: its
    first link holds no thread (the timeout is long enough to tell)."""
    with one_thread_cluster() as client:
        futures, chain = _bumped_chain_behind_the_gate(client)
        # The worker must have the link before the cancel: a mark still on its way when the
        # loop below finds nothing pending would come after the gate opens, and the release
        # that follows it after the link has finished and taken its hold.
        wait_for_bump(client, [futures[TARGET].key], held=True)
        deadline = time.monotonic() + BUMP_TIMEOUT
        while not _holds(client)["pending"]:
            assert time.monotonic() < deadline, "the worker never marked its link"
            time.sleep(0.01)
        client.cancel(chain)
        while _holds(client)["pending"]:
            assert time.monotonic() < deadline, "the worker kept its link"
            time.sleep(0.01)
        GATE.open()
        assert futures[TARGET].result() == TARGET
        assert client.gather(futures[TARGET + 1 :]) == list(range(TARGET + 1, N_TASKS))
        stats = _holds(client)
        assert stats["held"] == 0 and stats["nthreads"] == 1, stats


def _task_modules_loaded() -> bool:
    from nbrewind.tasks.priority.worker_side import TASK_MODULES

    return all(name in sys.modules for name in TASK_MODULES)


def _task_modules_loaded_soon() -> bool:
    for _ in range(600):
        if _task_modules_loaded():
            return True
        time.sleep(0.1)
    return False


@needs_cluster
def test_a_worker_process_imports_the_task_modules_before_its_first_task() -> None:
    """The worker half of the plugin loads what a rewritten graph's first task imports, in
    the background, so that task does not pay for it (a real worker process)."""
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        assert list(client.run(_task_modules_loaded).values()) == [False]
        install(client)
        assert list(client.run(_task_modules_loaded_soon).values()) == [True]
        assert list(client.run(lambda: "nbrewind.tasks.resume" in sys.modules).values()) == [True]


@needs_cluster
@pytest.mark.usefixtures("no_plugin_errors")
def test_tearing_the_worker_plugin_down_gives_the_threads_back() -> None:
    with one_thread_cluster() as client:

        def hold(dask_worker: Any) -> int:
            plugin = dask_worker.plugins[priority.PLUGIN_NAME]
            plugin.hold_timeout = BUMP_TIMEOUT
            plugin._hold("nothing-will-come")
            return int(dask_worker.state.nthreads)

        assert list(client.run(hold).values()) == [0]
        client.unregister_worker_plugin(priority.PLUGIN_NAME)
        assert list(client.run(lambda dask_worker: dask_worker.state.nthreads).values()) == [1]
        install_again = priority.client._installed
        install_again.pop(client, None)
        install(client)  # so that the fixture's teardown finds it as the tests expect
        assert client.submit(sleep_inc, 1).result() == 2


@needs_cluster
@pytest.mark.usefixtures("no_plugin_errors")
def test_bumps_without_a_chain_hold_nothing() -> None:
    """Bumping independent tasks (a future's result) marks no link and holds no thread."""
    with one_thread_cluster() as client, enable_auto_priority(client):
        futures = client.map(gated, range(N_TASKS))
        assert open_when_bumped(client, [futures[TARGET].key], futures[TARGET].result) == TARGET
        GATE.open()
        client.gather(futures)
        stats = _holds(client)
        assert stats == {"met": 0, "timed_out": 0, "held": 0, "nthreads": 1, "pending": 0}, stats

        def scheduler_links(dask_scheduler: Any) -> int:
            plugin = dask_scheduler.plugins[priority.PLUGIN_NAME]
            return len(plugin._links) + len(plugin._followers)

        assert client.run_on_scheduler(scheduler_links) == 0
        assert not _hooks_installed(client)


@needs_cluster
@pytest.mark.usefixtures("no_plugin_errors")
def test_a_chain_on_two_threads_finishes_with_every_thread_back() -> None:
    """Two threads: while a link runs, the other thread goes on with the noise (its
    slot is refilled when the link's reservation left it idle); the chain still runs
    link after link, and both threads are free at the end."""
    global GATE
    GATE = Gate()
    GATE.open()
    with (
        LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        install(client)
        _set_hold_timeout(client, BUMP_TIMEOUT)
        noise_futures = client.map(noise, range(N_TASKS))
        first = client.submit(link, 0, ("chain", 0), pure=False)
        chain = _chain_on(client, first, 3)
        assert prioritize(chain[-1]) == 4
        assert chain[-1].result() == 4
        client.gather(noise_futures)
        order = GATE.order()
        assert sum(label[0] == "noise" for label in order[: order.index(("chain", 3))]) < N_TASKS // 2, order
        assert _holds(client)["nthreads"] == 2


@needs_cluster
@pytest.mark.usefixtures("no_plugin_errors")
def test_a_running_link_leaves_another_idle_thread_free_for_new_work() -> None:
    """Two threads, one running a link (at the gate), the other idle: a task that
    arrives meanwhile starts on the idle thread, not after the link."""
    global GATE
    GATE = Gate()
    with (
        LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        install(client)
        _set_hold_timeout(client, BUMP_TIMEOUT)
        try:
            first = client.submit(gated, 0, pure=False)
            chain = _chain_on(client, first, 1)
            GATE.wait_entered()
            assert prioritize(chain[-1]) == 2

            def armed(dask_worker: Any) -> int:
                return len(dask_worker.plugins[priority.PLUGIN_NAME]._armed)

            deadline = time.monotonic() + BUMP_TIMEOUT
            while list(client.run(armed).values()) != [1]:
                assert time.monotonic() < deadline, "the running link was never marked"
                time.sleep(0.01)
            newcomer = client.submit(noise, 1, pure=False)
            assert newcomer.result(timeout=BUMP_TIMEOUT) == 1  # while the link still waits at the gate
            assert GATE.order() == [("noise", 1)]
            GATE.open()
            assert chain[-1].result() == 1
            assert _holds(client)["nthreads"] == 2
        finally:
            GATE.open()


#: map_blocks's meta, given so that dask does not call the gated function to infer it.
_META = np.empty((0,), dtype=float)


def _gated_block(block: Any, block_id: tuple[int, ...] = (-1,)) -> Any:
    """A map_blocks function: wait for the gate, record finishing as the block's index."""
    gated(block_id[0])
    return block + 1


@needs_cluster
def test_prioritizing_finished_work_changes_nothing() -> None:
    with one_thread_cluster() as client:
        future = client.submit(sleep_inc, 1)
        future.result()
        assert prioritize(future) == 0


# -- automatic bumps -------------------------------------------------------------


@needs_cluster
@pytest.mark.parametrize("saturation", SATURATIONS)
def test_auto_priority_bumps_a_future_on_result(saturation: float) -> None:
    """Inside enable_auto_priority, blocking on result() bumps the future: it jumps the queue."""
    with one_thread_cluster(saturation) as client, enable_auto_priority(client):
        futures = client.map(gated, range(N_TASKS))
        assert open_when_bumped(client, [futures[TARGET].key], futures[TARGET].result) == TARGET
        assert GATE.place(TARGET) < FIRST_PLACES, GATE.order()[:10]


@needs_cluster
def test_auto_priority_bumps_a_computed_slice_of_a_persisted_collection() -> None:
    """Computing a slice of a persisted array bumps the chunk it gathers."""
    da = pytest.importorskip("dask.array")
    with one_thread_cluster(float("inf")) as client, enable_auto_priority(client):
        persisted = da.zeros(N_TASKS, chunks=1).map_blocks(_gated_block, meta=_META).persist()
        piece = persisted[TARGET : TARGET + 1]
        got = open_when_bumped(client, [persisted.__dask_keys__()[TARGET]], piece.compute)
        assert got.tolist() == [1.0]
        assert GATE.place(TARGET) < FIRST_PLACES, GATE.order()[:10]


@needs_cluster
def test_auto_priority_restores_what_it_patched() -> None:
    original_result, original_gather = Future.result, Client.gather
    with one_thread_cluster() as client:
        with enable_auto_priority(client):
            with enable_auto_priority(client):
                assert Future.result is not original_result
            assert Future.result is not original_result  # the outer block is still active
            assert client.submit(sleep_inc, 1).result() == 2
        assert Future.result is original_result
        assert Client.gather is original_gather
        with pytest.raises(RuntimeError, match="boom"), enable_auto_priority(client):
            raise RuntimeError("boom")
        assert Future.result is original_result
        assert Client.gather is original_gather
        assert "result" not in vars(Future) or vars(Future)["result"] is original_result
        assert not priority.auto._explicit


# -- the switch, enrolment and restoring -----------------------------------------


def test_the_switch_is_a_dask_config_key_read_at_every_check() -> None:
    with dask.config.set({CONFIG_KEY: True}):  # restores whatever the test sets inside
        assert auto_priority_enabled()
        set_auto_priority(False)
        assert not auto_priority_enabled()
        assert dask.config.get(CONFIG_KEY) is False
        set_auto_priority(True)
        assert auto_priority_enabled()
        for text, expected in [("false", False), ("Off", False), ("0", False), ("no", False), ("true", True), ("1", True)]:
            with dask.config.set({CONFIG_KEY: text}):
                assert auto_priority_enabled() is expected, text
        with dask.config.set({"nbrewind.auto_priority": False}):  # dask treats - and _ alike
            assert not auto_priority_enabled()


def test_switching_costs_no_task_cache_hits() -> None:
    """The switch orders work, it never changes a result: task fingerprints do not see it."""
    from nbrewind.tasks.settings import task_settings

    with dask.config.set({CONFIG_KEY: True}):
        before = task_settings()
        set_auto_priority(False)
        assert task_settings() == before


def _patched_attributes() -> dict[str, Any]:
    from distributed.client import as_completed

    return {f"{cls.__name__}.{name}": value for cls in (Client, Future, as_completed) for name, value in vars(cls).items()}


def test_every_patch_is_undone_exactly_on_exit_even_after_an_error() -> None:
    before = _patched_attributes()
    meta_path = list(sys.meta_path)
    with auto_priority_for_new_clients():
        during = _patched_attributes()
        changed = {name for name in during if before.get(name) is not during[name]}
        assert changed == {
            "Client.__init__", "Client.gather", "Client.sync", "Future.result",
            "as_completed.update", "as_completed.__next__", "as_completed.next", "as_completed.__anext__",
        }
        with pytest.raises(RuntimeError, match="boom"), auto_priority_for_new_clients():
            raise RuntimeError("boom")
        assert _patched_attributes() == during  # the outer block still holds them
    after = _patched_attributes()
    assert after.keys() == before.keys()
    assert all(after[name] is before[name] for name in before)
    assert sys.meta_path == meta_path
    assert not priority.auto._enrollers and not priority.auto._explicit


def test_entering_before_distributed_is_imported_patches_it_when_it_is() -> None:
    """The kernels enter the context at start: it must import nothing, and still catch distributed."""
    code = """
import sys
from nbrewind.tasks.priority import auto_priority_for_new_clients
with auto_priority_for_new_clients():
    assert not [m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')]
    import distributed
    patched = distributed.Client.__init__
    assert getattr(patched, '__wrapped__', None) is not None
    assert 'sync' in vars(distributed.Client)
assert distributed.Client.__init__ is patched.__wrapped__
assert 'sync' not in vars(distributed.Client)
assert not [f for f in sys.meta_path if type(f).__module__.startswith('nbrewind')]
print('ok')
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


@needs_cluster
def test_clients_created_inside_are_enabled_for_their_lifetime_and_only_they() -> None:
    with one_thread_cluster() as before:
        with auto_priority_for_new_clients():
            with Client(before.cluster) as inside:
                assert inside in priority.auto._enrolled
                assert before not in priority.auto._enrolled

                def plugins(dask_scheduler: Any) -> list[str]:
                    return list(dask_scheduler.plugins)

                # Registered from the client's loop, without holding up Client().
                priority.auto.registration(inside).result(timeout=120)
                assert priority.PLUGIN_NAME in inside.run_on_scheduler(plugins)
                # Held in names: a future dropped at once is released by the client's loop,
                # and one left alone is all its client holds (nothing to overtake, no bump).
                mine, theirs = inside.map(gated, range(3), pure=False), before.map(gated, range(3), pure=False)
                assert bump_waited(mine[:1]) == 1
                assert bump_waited(theirs[:1]) == 0
                GATE.open()
            assert inside in priority.auto._enrolled  # for its lifetime, closed or not
        assert not priority.auto._enrolled


@needs_cluster
def test_a_wait_for_everything_the_client_holds_sends_no_bump() -> None:
    with one_thread_cluster() as client, enable_auto_priority(client):
        futures = client.map(gated, range(10), pure=False)
        assert bump_waited(futures) == 0  # nothing of the client's own left to overtake
        assert bump_waited(futures[:3]) == 1
        with dask.config.set({CONFIG_KEY: False}):
            assert bump_waited(futures[:3]) == 0
        GATE.open()
        client.gather(futures)
        assert bump_waited(futures[:3]) == 0  # finished: nothing to bump


@needs_cluster
def test_a_failed_bump_never_fails_the_wait_and_warns_once(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    with one_thread_cluster() as client, enable_auto_priority(client):
        monkeypatch.setattr(priority.auto, "is_installed", lambda client: False)

        async def broken(client: Any) -> None:
            raise OSError("no plugins today")

        monkeypatch.setattr(priority.auto, "install_async", broken)
        futures = client.map(gated, range(5), pure=False)
        GATE.open()
        with caplog.at_level("WARNING", logger="nbrewind.tasks.priority.auto"):
            assert futures[3].result() == 3
            assert client.gather(futures[:2]) == [0, 1]
        warnings = [r for r in caplog.records if r.name == "nbrewind.tasks.priority.auto"]
        assert len(warnings) == 1 and "waiting without a priority bump" in warnings[0].getMessage()


@needs_cluster
def test_a_bump_right_after_client_creation_waits_for_the_plugins_registration() -> None:
    """Client() no longer waits for the plugins; a wait at once still bumps, after them."""
    with one_thread_cluster() as before, auto_priority_for_new_clients(), Client(before.cluster) as client:
        futures = client.map(gated, range(N_TASKS), pure=False)
        assert open_when_bumped(client, [futures[150].key], futures[150].result) == 150
        assert priority.auto.is_installed(client)
        assert not priority.auto._registering  # nothing left in flight or held


@needs_cluster
def test_as_completed_bumps_futures_added_after_its_first_bump() -> None:
    """The loop's first blocking step bumps its futures; one added later is bumped at the next."""
    from distributed import as_completed

    with one_thread_cluster() as client, enable_auto_priority(client):
        futures = client.map(gated, range(N_TASKS))
        iterator = as_completed([futures[150]])
        late = futures[180]
        assert open_when_bumped(client, [futures[150].key], lambda: next(iterator)) is futures[150]
        GATE.opened.clear()
        iterator.add(late)
        assert open_when_bumped(client, [late.key], lambda: next(iterator)) is late
        client.gather(futures)
        order = GATE.order()
        # Unbumped, 180 would finish after 100; only tasks run while the gate was
        # open between the two steps (a handful) come before it.
        assert order.index(180) < order.index(100), order[:20]


@needs_cluster
def test_an_as_completed_that_never_blocks_holds_no_finished_futures() -> None:
    """Futures added to an iterator are remembered until its next blocking step; one that is
    only read when ready must not keep every finished future (and its data) alive."""
    from distributed import as_completed

    with one_thread_cluster() as client, enable_auto_priority(client):
        iterator = as_completed()
        for i in range(100):
            future = client.submit(sleep_inc, i, pure=False)
            future.result()
            iterator.add(future)
            deadline = time.monotonic() + 30
            while iterator.futures and time.monotonic() < deadline:  # until it is tracked as done
                time.sleep(0.001)
        assert iterator.count() == 100
        assert len(priority.auto._unbumped.get(iterator, [])) <= 17
