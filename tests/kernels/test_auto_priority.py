"""Automatic priority bumps on real NBRewind kernels, for every way a notebook waits.

Each kernel is started through jupyter_client with a real ``LocalCluster`` of one
worker with one thread, created by the notebook's own cells (so the client is one
the kernel saw being made). The tasks wait at a gate and record the order they
finish in; a thread in the kernel opens the gate once the scheduler shows the
bump (or after a deadline, so a missing bump fails on the order, not by hanging).
With one thread the finishing order is the order the worker chose: a bump that
did nothing leaves the requested task at its submission place (150 of 200), a
bump that worked puts it behind at most the two tasks the worker had already
been sent when the gate closed.

The gate and the tasks live in a small module written next to the store and
imported by the kernel: distributed pickles functions defined in a cell by value,
so tasks defined there would record into a copy of the notebook's globals.
"""

from __future__ import annotations

import json
import os
import queue
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("distributed")

from jupyter_client.manager import start_new_kernel  # noqa: E402

pytestmark = [pytest.mark.kernel, pytest.mark.cluster]

REPLY_TIMEOUT = 180.0
N_TASKS = 200
TARGET = 150
#: The task the worker is running at the gate, the one more it may hold, then the request.
FIRST_PLACES = 3

GATE_MODULE = '''
"""Gated tasks for the automatic-priority kernel tests."""
import threading
import time

opened = threading.Event()
_lock = threading.Lock()
finished = []
#: Tasks of an earlier cell that were cancelled but had already started record
#: under their own generation, so they do not count in this cell's order.
generation = 0


def reset():
    global generation
    opened.clear()
    with _lock:
        finished.clear()
        generation += 1


def gated(i, gen):
    if not opened.wait(120):
        raise TimeoutError("the gate never opened")
    with _lock:
        if gen == generation:
            finished.append(i)
    return i


def gated_block(block, salt, gen, block_id=(-1,)):
    gated(block_id[0], gen)
    return block + 1


def place(i):
    with _lock:
        return finished.index(i)


def bumped(scheduler, key):
    ts = scheduler.tasks.get(key)
    return ts is not None and ts.priority is not None and ts.priority[0] == float("-inf")


def open_when(condition, timeout=30.0):
    """Open the gate from a thread once condition() holds, or after timeout seconds."""
    def run():
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if condition():
                    break
            except RuntimeError:  # the scheduler's dict changed size while read
                pass
            time.sleep(0.005)
        opened.set()
    threading.Thread(target=run, daemon=True).start()


def open_when_bumped(scheduler, keys, timeout=30.0):
    open_when(lambda: all(bumped(scheduler, k) for k in keys), timeout)
'''

SETUP = """
import json, sys
sys.path.insert(0, {folder!r})
import numpy as np
import dask, dask.array as da
from distributed import Client, LocalCluster, wait, as_completed
import prio_gate
cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=':0')
client = Client(cluster)
META = np.empty((0,), dtype=float)
"""


class Kernel:
    """A started kernel and a way to run a cell in it and read what it printed."""

    def __init__(self, km: Any, kc: Any) -> None:
        self.km, self.kc = km, kc
        self.cells = 0

    def run(self, code: str) -> str:
        """Run ``code``; return its stdout; fail the test with the traceback if it raised.

        Every cell gets a line of its own, so that the repeat kernel never replays a
        cell that an earlier test already ran in this session.
        """
        self.cells += 1
        msg_id = self.kc.execute(f"{textwrap.dedent(code).strip()}\n_cell_number = {self.cells}\n")
        deadline = time.monotonic() + REPLY_TIMEOUT
        out: list[str] = []
        error: dict[str, Any] | None = None
        while True:  # IOPub until this request's idle status; other requests' messages are skipped
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no idle status for {msg_id}")
            try:
                msg = self.kc.get_iopub_msg(timeout=remaining)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream" and content["name"] == "stdout":
                out.append(content["text"])
            elif kind == "error":
                error = content
            elif kind == "status" and content["execution_state"] == "idle":
                break
        while True:
            reply = self.kc.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        if error is not None or reply["content"]["status"] != "ok":
            trace = "\n".join((error or {}).get("traceback", []))
            raise AssertionError(f"cell failed:\n{code}\n{trace}")
        return "".join(out)

    def json(self, code: str) -> Any:
        """Run ``code``, whose last printed line is JSON, and return it decoded."""
        return json.loads(self.run(code).strip().splitlines()[-1])


@pytest.fixture(scope="module", params=["nbrewind-audit", "nbrewind-repeat"])
def kernel(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    folder = tmp_path_factory.mktemp("auto-priority")
    (folder / "prio_gate.py").write_text(GATE_MODULE)
    env = dict(os.environ, NBREWIND_STORE=str(folder / "store.nbrewind"))
    km, kc = start_new_kernel(kernel_name=request.param, cwd=str(folder), env=env)
    started = Kernel(km, kc)
    try:
        started.run(SETUP.format(folder=str(folder)))
        yield started
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _map_then(wait_code: str, keys_code: str) -> str:
    """Cell: 200 gated tasks, a gate opened once ``keys_code`` shows a bump, then ``wait_code``."""
    return f"""
    prio_gate.reset()
    futs = client.map(prio_gate.gated, range({N_TASKS}), gen=prio_gate.generation, pure=False)
    prio_gate.open_when_bumped(cluster.scheduler, [f.key for f in {keys_code}])
    {wait_code}
    print(json.dumps({{"places": [prio_gate.place(f.result()) for f in {keys_code}]}}))
    client.cancel(futs)
    """


def test_result_bumps_the_future_it_waits_for(kernel: Kernel) -> None:
    got = kernel.json(_map_then(f"futs[{TARGET}].result()", f"[futs[{TARGET}]]"))
    assert got["places"][0] < FIRST_PLACES, got


def test_gather_bumps_the_futures_it_gathers(kernel: Kernel) -> None:
    got = kernel.json(_map_then("client.gather([futs[150], futs[170]])", "[futs[150], futs[170]]"))
    assert max(got["places"]) < FIRST_PLACES + 1, got


def test_wait_bumps_the_futures_it_waits_for(kernel: Kernel) -> None:
    got = kernel.json(_map_then("wait([futs[150], futs[170]])", "[futs[150], futs[170]]"))
    assert max(got["places"]) < FIRST_PLACES + 1, got


def test_as_completed_bumps_what_the_loop_waits_on(kernel: Kernel) -> None:
    """The first step that would block bumps the iterator's pending futures, all five at once."""
    got = kernel.json(_map_then("done = sorted(f.result() for f in as_completed(futs[150:155]))", "futs[150:155]"))
    assert max(got["places"]) < FIRST_PLACES + 4, got


def test_computing_a_slice_of_a_persisted_array_bumps_the_chunk_it_needs(kernel: Kernel) -> None:
    got = kernel.json(f"""
    prio_gate.reset()
    x = da.zeros({N_TASKS}, chunks=1).map_blocks(prio_gate.gated_block, "slice", prio_gate.generation, meta=META).persist()
    prio_gate.open_when_bumped(cluster.scheduler, [x.__dask_keys__()[{TARGET}]])
    value = x[{TARGET}].compute()
    print(json.dumps({{"value": float(value), "place": prio_gate.place({TARGET})}}))
    client.cancel(x)
    del x
    """)
    assert got["value"] == 1.0
    assert got["place"] < FIRST_PLACES, got


def test_computing_a_whole_persisted_array_changes_no_priority(kernel: Kernel) -> None:
    """Waiting for all of it: the scheduler receives the bump and leaves every priority alone."""
    got = kernel.json("""
    prio_gate.reset()
    y = da.zeros(50, chunks=1).map_blocks(prio_gate.gated_block, "whole", prio_gate.generation, meta=META).persist()
    plugin = cluster.scheduler.plugins["nbrewind-priority"]
    before = (plugin.auto_requests, plugin.auto_noops)
    prio_gate.open_when(lambda: plugin.auto_noops > before[1])
    total = float(y.sum().compute())
    keys = [k for k in y.__dask_keys__()]
    print(json.dumps({
        "total": total,
        "requests": plugin.auto_requests - before[0],
        "noops": plugin.auto_noops - before[1],
        "bumped": sum(prio_gate.bumped(cluster.scheduler, k) for k in keys),
    }))
    del y
    """)
    assert got["total"] == 50.0
    assert got["requests"] == 1 and got["noops"] == 1, got
    assert got["bumped"] == 0, got


def test_the_config_key_switches_bumps_off_and_on_at_the_next_wait(kernel: Kernel) -> None:
    """Off: the request waits its turn (control). Back on with set_auto_priority: it jumps."""
    off = f"""
    prio_gate.reset()
    futs = client.map(prio_gate.gated, range({N_TASKS}), gen=prio_gate.generation, pure=False)
    prio_gate.opened.set()
    print(json.dumps({{"place": prio_gate.place(futs[{TARGET}].result())}}))
    client.cancel(futs)
    """
    kernel.run("dask.config.set({'nbrewind.auto-priority': False})")
    assert kernel.json(off)["place"] > 100
    kernel.run("from nbrewind.tasks.priority import set_auto_priority, auto_priority_enabled\nset_auto_priority(False)")
    assert kernel.json(off)["place"] > 100
    kernel.run("set_auto_priority(True)\nassert auto_priority_enabled()")
    got = kernel.json(_map_then(f"futs[{TARGET}].result()", f"[futs[{TARGET}]]"))
    assert got["places"][0] < FIRST_PLACES, got


def test_await_in_an_async_cell_bumps(kernel: Kernel) -> None:
    """An asynchronous client made in a cell: ``await future`` and ``await client.gather``."""
    kernel.run("""
    acluster = await LocalCluster(n_workers=1, threads_per_worker=1, processes=False, asynchronous=True, dashboard_address=':0')
    aclient = await Client(acluster, asynchronous=True)
    """)
    try:
        for wait_code, keys_code in [
            (f"await afuts[{TARGET}]", f"[afuts[{TARGET}]]"),
            ("await aclient.gather([afuts[150], afuts[170]])", "[afuts[150], afuts[170]]"),
        ]:
            got = kernel.json(f"""
            prio_gate.reset()
            afuts = aclient.map(prio_gate.gated, range({N_TASKS}), gen=prio_gate.generation, pure=False)
            prio_gate.open_when_bumped(acluster.scheduler, [f.key for f in {keys_code}])
            {wait_code}
            print(json.dumps({{"places": [prio_gate.place(await f) for f in {keys_code}]}}))
            await aclient.cancel(afuts)
            """)
            assert max(got["places"]) < FIRST_PLACES + 1, (wait_code, got)
    finally:
        kernel.run("await aclient.close()\nawait acluster.close()")
