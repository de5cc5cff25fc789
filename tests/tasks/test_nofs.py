"""The task cache on a cluster whose workers cannot see the store.

Two real worker processes (``dask worker``) run in their own mount namespace
(``unshare -m``) with an empty tmpfs mounted over the folder that holds the
stores, so the store's path does not exist for them; one of them also holds a
*decoy* store at that very path, which must not be taken for the kernel's. The
scheduler runs in this process (a ``LocalCluster`` without workers of its own).
The same notebook runs with a store the workers can see, on the same cluster,
for the shared-filesystem figures to compare with. Calls are counted by files
the task functions write into a folder outside the hidden one (see test_cache.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")

from distributed import Client, LocalCluster  # noqa: E402
from test_cache import Calls, chain, expected_total, notebook  # noqa: E402

import nbrewind.tasks.remote as remote  # noqa: E402
from nbrewind.tasks.cache import REF_NAMESPACE, TaskCache  # noqa: E402
from nbrewind.tasks.intercept import intercepting  # noqa: E402

pytestmark = pytest.mark.cluster

#: Helpers run on the workers by ``Client.run``; exec'd as ``__main__`` so cloudpickle ships them by value.
WORKER_HELPERS = '''
def make_decoy(path):
    from nbrewind.store import Store
    Store.open(path).close()
    import os
    return sorted(os.listdir(path))
'''


def _helpers() -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(WORKER_HELPERS, "<helpers>", "exec"), ns)
    return ns


def _unshare_works() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def hidden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the workers cannot see (stores of the no-shared-filesystem mode go there)."""
    path = tmp_path_factory.mktemp("nofs") / "hidden"
    path.mkdir()
    return path


@pytest.fixture(scope="module")
def client(hidden: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    if not _unshare_works():
        pytest.skip("needs root and `unshare -m` to hide the store from the workers")
    logs = tmp_path_factory.mktemp("worker-logs")
    dask_cli = Path(sys.executable).with_name("dask")
    with LocalCluster(n_workers=0, processes=True, dashboard_address=":0") as cluster, Client(cluster) as c:
        address = cluster.scheduler_address
        procs = []
        try:
            for i in range(2):
                script = (
                    f"mount -t tmpfs nbrewind-nofs-test '{hidden}' && "
                    f"exec '{dask_cli}' worker {address} --nthreads 1 --no-nanny --no-dashboard --name nofs-{i}"
                )
                log = open(logs / f"worker-{i}.log", "wb")  # noqa: SIM115 - closed with the process
                procs.append((subprocess.Popen(["unshare", "-m", "sh", "-c", script], stdout=log, stderr=log), log))
            c.wait_for_workers(2, timeout=60)
            yield c
        finally:
            for proc, log in procs:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                log.close()


@pytest.fixture
def workers(client: Client) -> list[str]:
    return sorted(client.scheduler_info()["workers"])


@pytest.fixture
def store_path(hidden: Path, request: pytest.FixtureRequest, client: Client, workers: list[str]) -> Path:
    """A store path the workers cannot see; the first worker holds a decoy store there."""
    path = hidden / f"{request.node.name.replace('[', '-').replace(']', '')}.nbrewind"
    listing = client.run(_helpers()["make_decoy"], str(path), workers=workers[:1])
    assert "nbrewind-store.json" in listing[workers[0]]  # the decoy is a real store, just not ours
    assert not path.exists()  # and it is not here
    return path


def run_notebook(
    client: Client, cache: TaskCache, calls: Calls, edit: str | None, n: int = 6
) -> list[tuple[Any, dict[str, int], tuple[int, int]]]:
    """Audit the chain, then repeat it unchanged and after ``edit``: (value, calls, (hits, misses)) each."""
    out = []
    with intercepting(cache):
        for step in (None, None, edit):
            value = client.compute(chain(notebook(calls.folder, step), n)).result()
            out.append((value, dict(calls.take()), cache.stats(cache.drain_log())))
    return out


@pytest.mark.parametrize("edit", ["body", "constant"])
def test_audit_then_repeat_without_the_store_matches_the_shared_mode(
    client: Client, calls: Calls, store_path: Path, tmp_path: Path, edit: str
) -> None:
    n = 6
    hidden_cache = TaskCache(store_path)
    nofs = run_notebook(client, hidden_cache, calls, edit, n)
    shared = run_notebook(client, TaskCache(tmp_path / "shared.nbrewind"), calls, edit, n)
    assert nofs == shared
    audit, repeat, edited = nofs
    assert audit == (expected_total(n), {"load": n, "work": n, "total": 1}, (0, 2 * n + 1))
    assert repeat == (expected_total(n), {}, (1, 0))  # unchanged: the output is a hit, the rest culled
    assert edited[1] == {"work": n, "total": 1}  # exactly the changed tasks
    assert edited[0] == {"body": expected_total(n, plus=2), "constant": expected_total(n, scale=3)}[edit]
    relay = hidden_cache.relay
    assert relay is not None
    assert relay.stats.stored == 2 * n + 1 + n + 1 and relay.stats.failed == 0
    assert relay.stats.served == 1 + n  # the hits (the repeat's output, the edit's loads), read by the kernel
    assert not any(client.run(os.path.exists, str(store_path / "refs" / REF_NAMESPACE)).values())


def test_results_are_stored_and_logged_when_the_computation_returns(
    client: Client, calls: Calls, store_path: Path, workers: list[str]
) -> None:
    cache = TaskCache(store_path)
    ns = notebook(calls.folder)
    with intercepting(cache):
        parts = [client.submit(ns["work"], i, workers=[w]) for i, w in enumerate(workers * 3)]
        total = client.submit(ns["total"], parts).result()
        rows = cache.drain_log()  # right away: results that reached the kernel are written by now
        assert total == expected_total(6)
        assert len(rows) == 7 and not any(r.hit for r in rows)
        assert all(r.result_digest is not None and r.duration is not None for r in rows)
        assert {r.worker for r in rows} == set(workers)  # recorded where they ran
        # Intermediate results never fetched to the kernel are stored too: the repeat (new keys,
        # same fingerprints) needs none of them.
        again = [client.submit(ns["work"], i, workers=[w], key=f"again-{i}") for i, w in enumerate(workers * 3)]
        assert client.gather(again) == [i * 2 + 1 for i in range(6)]
        assert calls.take() == {"work": 6, "total": 1}
        assert cache.stats(cache.drain_log()) == (6, 0)


def test_detection_happens_once_per_worker(client: Client, calls: Calls, store_path: Path, workers: list[str]) -> None:
    before = client.run(getattr, remote, "probes")
    cache = TaskCache(store_path)
    ns = notebook(calls.folder)
    with intercepting(cache):
        for rnd in range(3):
            futures = [client.submit(ns["work"], 100 * rnd + i, workers=[w]) for i, w in enumerate(workers * 4)]
            client.gather(futures)
        # The first round's results again (new keys, same fingerprints): loaded, not computed.
        client.gather([client.submit(ns["work"], 100 + i, workers=[w], key=f"again-{i}")
                       for i, w in enumerate(workers * 4)])
    after = client.run(getattr, remote, "probes")
    assert calls.take() == {"work": 24}
    assert {w: after[w] - before[w] for w in workers} == {w: 1 for w in workers}
    hidden_here = client.run(getattr, remote, "hidden_roots")
    assert all(str(store_path) in roots for roots in hidden_here.values())


def test_large_results_round_trip(client: Client, store_path: Path, workers: list[str]) -> None:
    np = pytest.importorskip("numpy")
    cache = TaskCache(store_path)
    exec_ns: dict[str, Any] = {"__name__": "__main__"}
    exec("import numpy as np\ndef make(seed):\n    return np.random.default_rng(seed).random(1_000_000)\n", exec_ns)
    with intercepting(cache):
        first = client.gather([client.submit(exec_ns["make"], s, workers=[w]) for s, w in enumerate(workers)])
        assert cache.stats(cache.drain_log()) == (0, 2)
        # Each loaded on the other worker.
        again = client.gather([client.submit(exec_ns["make"], s, workers=[w], key=f"again-{s}")
                               for s, w in enumerate(workers[::-1])])
        assert cache.stats(cache.drain_log()) == (2, 0)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert cache.relay is not None and cache.relay.stats.served == 2


def test_a_damaged_entry_is_recomputed_on_the_worker(client: Client, calls: Calls, store_path: Path) -> None:
    cache = TaskCache(store_path)
    ns = notebook(calls.folder)
    with intercepting(cache):
        assert client.compute(chain(ns, 2)).result() == expected_total(2)
        calls.take()
        fingerprint = next(r.fingerprint for r in cache.drain_log() if r.key_prefix == "total")
        entry = cache.objects.ref_get(REF_NAMESPACE, fingerprint)
        assert entry is not None
        path = cache.objects.path_of(cache.objects.get_tree(entry)[0][0])
        os.chmod(path, 0o644)
        path.write_bytes(path.read_bytes()[:-1] + b"!")
        assert client.compute(chain(ns, 2)).result() == expected_total(2)
        assert calls.take() == {"load": 2, "work": 2, "total": 1}  # the kernel could not read it: recomputed
        assert client.compute(chain(ns, 2)).result() == expected_total(2)
        assert calls.take() == {}  # and the recomputed result was stored through the kernel


def test_a_cancelled_load_frees_its_worker_thread_at_once(
    client: Client, calls: Calls, store_path: Path, workers: list[str]
) -> None:
    cache = TaskCache(store_path)
    ns = notebook(calls.folder)
    one = workers[:1]
    with intercepting(cache):
        assert client.submit(ns["work"], 1, workers=one).result() == 3
        cache.drain_log()
        assert cache.relay is not None
        client.unsubscribe_topic(cache.relay.topic)  # the kernel stops answering its workers
        stuck = client.submit(ns["work"], 1, workers=one, key="load-that-waits")
        deadline = time.monotonic() + 10
        while not any(stuck.key in keys for keys in client.processing(one).values()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)  # the load task has asked the kernel and waits
        stuck.cancel()
    started = time.monotonic()
    # The only thread of that worker must be free long before the load's own timeout.
    assert client.submit(sum, [1, 2], workers=one, pure=False).result(timeout=10) == 3
    assert time.monotonic() - started < 5
    assert calls.take() == {"work": 1}  # cancelled: not recomputed either


def test_a_cluster_mixing_both_kinds_of_workers(client: Client, calls: Calls, store_path: Path, workers: list[str]) -> None:
    dask_cli = Path(sys.executable).with_name("dask")
    address = client.scheduler.address
    seeing = subprocess.Popen([str(dask_cli), "worker", address, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                               "--name", "sees-the-store"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client.wait_for_workers(3, timeout=60)
        everyone = sorted(client.scheduler_info()["workers"])
        (visible,) = set(everyone) - set(workers)
        cache = TaskCache(store_path)
        ns = notebook(calls.folder)
        with intercepting(cache):
            parts = [client.submit(ns["work"], i, workers=[w]) for i, w in enumerate(everyone * 2)]
            assert client.submit(ns["total"], parts).result() == expected_total(6)
            rows = cache.drain_log()
            assert cache.stats(rows) == (0, 7) and all(r.result_digest for r in rows)
            assert cache.relay is not None
            assert 4 <= cache.relay.stats.stored <= 5  # the hidden workers' results (and maybe the total)
            del parts
            # Each result loaded by another worker than the one that made it.
            again = [client.submit(ns["work"], i, workers=[w], key=f"again-{i}") for i, w in enumerate(everyone[::-1] * 2)]
            assert client.gather(again) == [i * 2 + 1 for i in range(6)]
            assert cache.stats(cache.drain_log()) == (6, 0)
        assert calls.take() == {"work": 6, "total": 1}
        assert client.run(getattr, remote, "hidden_roots", workers=[visible])[visible] == set()
    finally:
        seeing.terminate()
        try:
            seeing.wait(15)
        except subprocess.TimeoutExpired:
            seeing.kill()
            seeing.wait()
        deadline = time.monotonic() + 30
        while len(client.scheduler_info()["workers"]) > 2 and time.monotonic() < deadline:
            time.sleep(0.1)


def test_workers_told_to_relay_match_the_shared_mode(calls: Calls, tmp_path: Path) -> None:
    """``NBREWIND_WORKER_STORE=relay`` in the workers' environment: workers that see the store
    still leave every read and write to the kernel, with the shared mode's hits, misses and
    values (how the domain-notebook benchmark runs this mode: `python -m benchmarks.run --relay`)."""
    n = 5
    env = {remote.RELAY_VARIABLE: "relay"}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", env=env) as cluster, Client(cluster) as c:
        told = TaskCache(tmp_path / "told.nbrewind")
        relayed = run_notebook(c, told, calls, "body", n)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, Client(cluster) as c:
        shared_cache = TaskCache(tmp_path / "shared.nbrewind")
        shared = run_notebook(c, shared_cache, calls, "body", n)
    assert relayed == shared
    assert relayed[0][2] == (0, 2 * n + 1)
    assert told.relay is not None and told.relay.stats.stored == 2 * n + 1 + n + 1 and told.relay.stats.failed == 0
    assert told.relay.stats.served == 1 + n
    assert shared_cache.relay is None or shared_cache.relay.stats.stored == 0


def test_in_task_checkpoints_go_through_the_kernel(client: Client, store_path: Path, tmp_path: Path) -> None:
    """`nbrewind.checkpoint` and `resume` on workers that cannot see the store: the first attempt
    fails at step 25 after its checkpoint at 20, the re-run gets that checkpoint from the
    kernel, and success drops it; nothing is written at the store's path on the workers."""
    from test_resume import CHECKPOINT_NAMESPACE, CRASH_AT, EXPECTED, K, N, steps
    from test_resume import notebook as resume_notebook

    folder = tmp_path / "work"
    folder.mkdir()
    long_sum = resume_notebook()["long_sum"]
    cache = TaskCache(store_path)
    with intercepting(cache):
        with pytest.raises(RuntimeError, match="crash on the first attempt"):
            client.compute(dask.delayed(long_sum)(N, K, str(folder), CRASH_AT, "raise")).result()
        assert cache.relay is not None and cache.relay.flush(30)
        fingerprint = cache.drain_log()[0].fingerprint
        assert cache.objects.ref_get(CHECKPOINT_NAMESPACE, fingerprint) is not None  # kept for the next attempt
        assert client.compute(dask.delayed(long_sum)(N, K, str(folder), CRASH_AT, "raise")).result() == EXPECTED
        assert cache.relay.flush(30)
    assert steps(folder)[CRASH_AT:] == list(range(20, N))  # resumed at the checkpoint of step 20
    assert cache.objects.ref_get(CHECKPOINT_NAMESPACE, fingerprint) is None  # dropped once the task succeeded
    assert cache.objects.ref_get(REF_NAMESPACE, fingerprint) is not None
    # checkpoints 10 and 20, then 30 and 40, and the result; one checkpoint sent back (the first resume found none)
    assert (cache.relay.stats.stored, cache.relay.stats.served, cache.relay.stats.failed) == (5, 1, 0)
    for namespace in (CHECKPOINT_NAMESPACE, REF_NAMESPACE):
        assert not any(client.run(os.path.exists, str(store_path / "refs" / namespace)).values())


def test_the_relay_serves_only_checkpoint_refs_by_name() -> None:
    """Anyone on the scheduler can log an event: a ref request must name a checkpoint ref."""
    from nbrewind.tasks.relay import _well_formed

    base = {"op": "get", "id": "1-0", "worker": "tcp://w:1"}
    assert _well_formed({**base, "ref": "task-checkpoints/0123abcd"})
    assert _well_formed({**base, "entry": "0123abcd"})
    for ref in ("tasks/0123abcd", "task-checkpoints/../x", "task-checkpoints/", "task-published/ab", 7):
        assert not _well_formed({**base, "ref": ref}), ref
