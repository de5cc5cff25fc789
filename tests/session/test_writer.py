"""Tests for nbrewind.session.writer: the background thread that makes checkpoints durable.

Real threads and a real store in ``tmp_path``: jobs write objects and catalog
rows (SQLite) from the writer's thread, as the session's commits do, and the
tests read them back from another connection. Where a test must show that a
call is still waiting, it gives the call a bounded moment (``join(timeout)``) to
return early and then checks it did not: that can only miss a bug, never fail a
correct writer. Everything else is synchronized with events and joins.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nbrewind.session.writer import BackgroundWriter
from nbrewind.store import CellRun, Store

#: Seconds to wait for something that must happen (only reached when it does not).
TIMEOUT = 30.0
#: Seconds a call gets to return early when the test checks that it is still waiting.
EARLY = 0.2


@pytest.fixture
def writer() -> Iterator[BackgroundWriter]:
    w = BackgroundWriter()
    yield w
    w.close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "store", create=True) as s:
        yield s


def blocked_job(started: threading.Event, release: threading.Event, done: list[str], name: str) -> Callable[[], None]:
    """A job that signals it started, waits to be released, then records `name`."""

    def job() -> None:
        started.set()
        if not release.wait(TIMEOUT):
            raise TimeoutError("the test never released the job")
        done.append(name)

    return job


def in_thread(target: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_jobs_run_in_submission_order_on_one_background_daemon_thread(writer: BackgroundWriter) -> None:
    """FIFO on a single daemon thread that is not the submitter's."""
    ran: list[tuple[int, threading.Thread]] = []

    def record(i: int) -> None:
        ran.append((i, threading.current_thread()))

    for i in range(200):
        writer.submit(functools.partial(record, i))
    writer.flush()
    assert [i for i, _ in ran] == list(range(200))
    threads = {t for _, t in ran}
    assert len(threads) == 1
    (thread,) = threads
    assert thread is not threading.current_thread() and thread.daemon


def test_store_writes_land_in_submission_order(writer: BackgroundWriter, store: Store, tmp_path: Path) -> None:
    """Jobs writing objects and then a catalog row naming them leave, after flush, every row
    in submission order and every object, visible to another connection to the store."""
    digests: list[str] = []

    def commit(i: int) -> None:
        digest = store.objects.put(f"checkpoint {i}".encode())
        digests.append(digest)
        store.catalog.add_cell_run(CellRun(code=f"step {i}", outputs=digest))

    for i in range(30):
        writer.submit(functools.partial(commit, i))
    writer.flush()
    with Store.open(tmp_path / "store", create=False, readonly=True) as reader:
        assert [(r.code, r.outputs) for r in reader.catalog.cell_runs()] == [(f"step {i}", d) for i, d in enumerate(digests)]
        assert [reader.objects.get(d) for d in digests] == [f"checkpoint {i}".encode() for i in range(30)]


def test_submit_returns_at_once_and_pending_counts_jobs_and_bytes(writer: BackgroundWriter) -> None:
    """A job that has not finished counts as pending, with its bytes, until it has."""
    started, release = threading.Event(), threading.Event()
    done: list[str] = []
    writer.submit(blocked_job(started, release, done, "first"), nbytes=100)
    writer.submit(lambda: done.append("second"), nbytes=50)
    assert started.wait(TIMEOUT)
    assert writer.pending() == (2, 150)
    release.set()
    writer.flush()
    assert writer.pending() == (0, 0)
    assert done == ["first", "second"]


def test_flush_waits_for_the_job_in_flight_and_the_queued_ones(writer: BackgroundWriter) -> None:
    """flush returns only after every job submitted before it has finished."""
    started, release = threading.Event(), threading.Event()
    events: list[str] = []
    writer.submit(blocked_job(started, release, events, "job 1"))
    writer.submit(lambda: events.append("job 2"))
    assert started.wait(TIMEOUT)

    def flush_then_note() -> None:
        writer.flush()
        events.append("flushed")

    flusher = in_thread(flush_then_note)
    flusher.join(EARLY)
    assert flusher.is_alive(), "flush returned while a job was still running"
    release.set()
    flusher.join(TIMEOUT)
    assert not flusher.is_alive()
    assert events == ["job 1", "job 2", "flushed"]


def test_flush_with_nothing_submitted_returns(writer: BackgroundWriter) -> None:
    """A writer that never got a job flushes at once (and starts no thread to do it)."""
    flusher = in_thread(writer.flush)
    flusher.join(TIMEOUT)
    assert not flusher.is_alive()
    assert writer.pending() == (0, 0)


def test_a_failing_job_is_reported_once_and_the_next_jobs_still_run(writer: BackgroundWriter, tmp_path: Path) -> None:
    """A job's exception is kept as "Type: message" for the next cell's notice, taken once; the
    jobs after it run, and nothing stays pending."""
    ran: list[str] = []

    def disk_full() -> None:
        raise OSError(28, "No space left on device")

    with Store.open(tmp_path / "store", create=True) as writable:
        digest = writable.objects.put(b"a checkpoint")
    readonly = Store.open(tmp_path / "store", create=False, readonly=True)
    try:
        writer.submit(lambda: ran.append("before"))
        writer.submit(lambda: readonly.catalog.add_cell_run(CellRun(code="x", outputs=digest)), nbytes=10)
        writer.submit(disk_full)
        writer.submit(lambda: ran.append("after"))
        writer.flush()
    finally:
        readonly.close()
    failures = writer.take_failures()
    assert len(failures) == 2
    assert failures[0].startswith("ReadOnlyStoreError: "), failures[0]  # the store refusing the write
    assert failures[1] == "OSError: [Errno 28] No space left on device"
    assert writer.take_failures() == []
    assert ran == ["before", "after"]
    assert writer.pending() == (0, 0)


def test_the_byte_cap_holds_a_submit_back_until_the_bytes_in_flight_are_written() -> None:
    """With the cap reached, submit waits for room; the held job is queued after the one in flight."""
    writer = BackgroundWriter(max_pending_bytes=100)
    try:
        started, release = threading.Event(), threading.Event()
        done: list[str] = []
        writer.submit(blocked_job(started, release, done, "first"), nbytes=80)
        assert started.wait(TIMEOUT)
        submitter = in_thread(functools.partial(writer.submit, functools.partial(done.append, "second"), nbytes=50))
        submitter.join(EARLY)
        assert submitter.is_alive(), "submit went past the byte cap"
        assert writer.pending() == (1, 80)
        release.set()
        submitter.join(TIMEOUT)
        assert not submitter.is_alive()
        writer.flush()
        assert done == ["first", "second"]
    finally:
        writer.close()


def test_a_job_larger_than_the_cap_is_taken_when_nothing_is_in_flight() -> None:
    """The cap bounds memory; it never refuses a single large checkpoint (no deadlock)."""
    writer = BackgroundWriter(max_pending_bytes=10)
    ran: list[int] = []
    try:
        submitter = in_thread(lambda: writer.submit(lambda: ran.append(1), nbytes=10_000))
        submitter.join(TIMEOUT)
        assert not submitter.is_alive()
        writer.flush()
        assert ran == [1]
    finally:
        writer.close()


def test_close_finishes_every_queued_job_then_stops_the_thread() -> None:
    """close drains the queue (nothing submitted is lost) and the writer thread ends."""
    writer = BackgroundWriter()
    started, release = threading.Event(), threading.Event()
    done: list[str] = []
    threads: list[threading.Thread] = []
    writer.submit(lambda: threads.append(threading.current_thread()))
    writer.submit(blocked_job(started, release, done, "slow"))
    for i in range(20):
        writer.submit(functools.partial(done.append, f"queued {i}"))
    assert started.wait(TIMEOUT)
    closer = in_thread(writer.close)
    closer.join(EARLY)
    assert closer.is_alive(), "close returned before the queued jobs ran"
    release.set()
    closer.join(TIMEOUT)
    assert not closer.is_alive()
    assert done == ["slow", *(f"queued {i}" for i in range(20))]
    assert not threads[0].is_alive()
    assert writer.pending() == (0, 0)


def test_a_job_submitted_after_close_still_runs_and_close_again_stops_it() -> None:
    """After close the writer is not dead: a late job (a shutdown racing a cell) starts a new
    thread and runs, and a second close stops that thread."""
    writer = BackgroundWriter()
    threads: list[threading.Thread] = []
    writer.submit(lambda: threads.append(threading.current_thread()))
    writer.close()
    writer.submit(lambda: threads.append(threading.current_thread()))
    writer.flush()
    assert len(threads) == 2 and threads[0] is not threads[1]
    writer.close()
    assert not any(t.is_alive() for t in threads)


def test_close_is_idempotent_and_needs_no_thread() -> None:
    """Closing a writer that never ran a job, and closing twice, return at once."""
    writer = BackgroundWriter()

    def close_twice() -> None:
        writer.close()
        writer.close()

    closer = in_thread(close_twice)
    closer.join(TIMEOUT)
    assert not closer.is_alive()


TRIALS = 50
SUBMITTERS = 8


def test_submitters_on_several_threads_share_one_writer_thread(tmp_path: Path) -> None:
    """However many threads submit at once, one writer thread runs every job (FIFO needs it)."""
    with Store.open(tmp_path / "store", create=True) as store:
        for trial in range(TRIALS):
            writer = BackgroundWriter()
            ran_on: set[threading.Thread] = set()
            lock = threading.Lock()

            def job(i: int) -> None:
                store.objects.put(f"{trial}:{i}".encode())  # real work, long enough to overlap
                with lock:
                    ran_on.add(threading.current_thread())

            barrier = threading.Barrier(SUBMITTERS)

            def submit_three(n: int) -> None:
                barrier.wait()
                for i in range(3):
                    writer.submit(functools.partial(job, 3 * n + i))

            submitters = [in_thread(functools.partial(submit_three, n)) for n in range(SUBMITTERS)]
            for s in submitters:
                s.join(TIMEOUT)
            writer.flush()
            # Internal access, only to stop every thread the bug may have started (one
            # sentinel each; each submit starts at most one), so that close() cannot hang
            # and no thread outlives the test.
            for _ in range(3 * SUBMITTERS):
                writer._queue.put(None)
            writer.close()
            assert len(ran_on) == 1, f"trial {trial}: {len(ran_on)} writer threads ran jobs"


# -- the backlog bound (issue 13: a shutdown must find little left to write) -------------------


def test_the_backlog_estimate_counts_jobs_bytes_and_task_rows() -> None:
    """Queued work is priced at the writer's rates: a fixed cost per job, bytes at the write
    rate, task-log rows at the row rate."""
    writer = BackgroundWriter()
    writer.write_rate, writer.job_seconds, writer.row_seconds = 100e6, 0.01, 1e-5
    started, release = threading.Event(), threading.Event()
    try:
        writer.submit(blocked_job(started, release, [], "big"), nbytes=300_000_000)
        writer.submit(lambda: None, rows=100_000)
        assert started.wait(TIMEOUT)
        assert writer.backlog_seconds() == pytest.approx(2 * 0.01 + 3.0 + 1.0)
    finally:
        release.set()
        writer.close()
    assert writer.backlog_seconds() == 0.0


def test_waiting_for_the_backlog_returns_once_the_job_under_way_has_written_enough() -> None:
    """A large job reports its bytes as they reach the disk (`advance`): the wait before the
    reply ends when what is left fits the bound, not when the whole job is done."""
    writer = BackgroundWriter()
    writer.write_rate, writer.job_seconds = 1e9, 0.0
    steps = [threading.Event() for _ in range(4)]
    advanced = [threading.Event() for _ in range(4)]
    events: list[str] = []

    def job() -> None:
        for step, done in zip(steps, advanced):
            if not step.wait(TIMEOUT):
                raise TimeoutError("the test never released the job")
            events.append("advanced")
            writer.advance(1_000_000_000)
            done.set()
        events.append("job done")

    def wait_then_note() -> None:
        writer.wait_for_backlog(2.5)  # what is left must take at most 2.5 s
        events.append("reply")

    try:
        writer.submit(job, nbytes=4_000_000_000)  # 4 s at 1 GB/s
        waiter = in_thread(wait_then_note)
        steps[0].set()
        assert advanced[0].wait(TIMEOUT)
        waiter.join(EARLY)
        assert waiter.is_alive(), "the wait ended with 3 s left to write"
        steps[1].set()  # 2 s left
        waiter.join(TIMEOUT)
        assert not waiter.is_alive()
        assert events == ["advanced", "advanced", "reply"]
        assert writer.pending() == (1, 2_000_000_000)
        steps[2].set()
        steps[3].set()
        writer.flush()
        assert events[-1] == "job done" and writer.pending() == (0, 0)
    finally:
        for step in steps:
            step.set()
        writer.close()


def test_advance_never_takes_more_than_the_job_announced(writer: BackgroundWriter) -> None:
    """A job that writes more than it announced (a chunk another job held) cannot push the
    pending bytes below the next job's."""
    started, release = threading.Event(), threading.Event()

    def job() -> None:
        writer.advance(500)
        started.set()
        release.wait(TIMEOUT)

    writer.submit(job, nbytes=100)
    writer.submit(lambda: None, nbytes=70)
    assert started.wait(TIMEOUT)
    assert writer.pending() == (2, 70)
    release.set()
    writer.flush()
    assert writer.pending() == (0, 0)


def test_the_writer_measures_its_write_rate_from_large_jobs(writer: BackgroundWriter) -> None:
    """After a large job the rate is the job's own, blended with the prior: a machine slower
    than the default (200 MB/s) is priced slower."""
    gate = threading.Event()
    writer.submit(lambda: gate.wait(0.5), nbytes=20_000_000)  # 20 MB in >= 0.5 s: <= 40 MB/s
    writer.flush()
    assert writer.write_rate < 121e6  # (200 + at most 40.8) / 2 MB/s


def test_a_finished_job_is_released_before_the_writer_waits_for_the_next(writer: BackgroundWriter) -> None:
    """A job holds its cell's staged copies: once it ran, the writer keeps no reference to it."""
    import gc
    import weakref

    class Copies:
        pass

    copies = Copies()
    ref = weakref.ref(copies)
    writer.submit(functools.partial(lambda held: None, copies), nbytes=10)
    del copies
    writer.flush()
    gc.collect()
    assert ref() is None


def test_staged_chunks_are_counted_until_the_committer_has_written_them(tmp_path: Path) -> None:
    """The writer's cap counts what staging holds: a cell's new chunks are held by the store
    from staging until its commit, protected (here copied) when the run is submitted, so the
    next cell may change the value at once."""
    import numpy as np

    from nbrewind.session.commit import Committer
    from nbrewind.store.objects import BLOB_CHUNK_SIZE

    writer = BackgroundWriter()
    committer = Committer(writer)
    with Store.open(tmp_path / "store", create=True) as store:
        value = np.random.default_rng(0).random(3 * BLOB_CHUNK_SIZE // 8)
        staged = store.objects.stage_blob(value)
        assert store.objects.held_bytes == staged.new_bytes == value.nbytes
        started, release = threading.Event(), threading.Event()
        writer.submit(blocked_job(started, release, [], "earlier cell"))
        assert started.wait(TIMEOUT)
        run = CellRun(
            session="s", kernel="audit", execution_count=1, code="v = ...", code_digest="0" * 32,
            decision="executed", reason="test", started=0.0, duration=0.0,
        )
        committer.submit(store, None, run, {"v": (staged.digest, {})}, [staged], staged.new_bytes, [])
        value[:] = 0.0  # the next cell, while the commit waits its turn
        assert writer.pending()[1] == staged.new_bytes
        assert store.objects.held_bytes == value.nbytes
        release.set()
        writer.flush()
        assert writer.take_failures() == []
        assert store.objects.held_bytes == 0 and writer.pending() == (0, 0)
        restored = np.frombuffer(store.objects.get_blob(staged.digest))
        assert np.array_equal(restored, np.random.default_rng(0).random(3 * BLOB_CHUNK_SIZE // 8))
        assert [r.code for r in store.catalog.cell_runs()] == ["v = ..."]
    writer.close()


def test_the_first_large_checkpoint_waits_for_the_disk_measurement() -> None:
    """Until `calibrate`'s probe has measured the disk, a backlog that is a sizeable part of
    the bound even at the default rate waits for it; then it is priced at the measured rate."""
    writer = BackgroundWriter()
    probing, measured, release = threading.Event(), threading.Event(), threading.Event()
    events: list[str] = []

    def probe() -> float:
        probing.set()
        if not measured.wait(TIMEOUT):
            raise TimeoutError("the test never finished the probe")
        events.append("measured")
        return 10e6  # a slow disk: 10 MB/s

    def big() -> None:
        release.wait(TIMEOUT)
        events.append("written")

    def wait_then_note() -> None:
        writer.wait_for_backlog(2.0)
        events.append("reply")

    try:
        writer.calibrate(probe)
        writer.submit(big, nbytes=100_000_000)  # 0.5 s at the default rate, 10 s at the measured one
        assert probing.wait(TIMEOUT)
        waiter = in_thread(wait_then_note)
        waiter.join(EARLY)
        assert waiter.is_alive(), "the reply went out before the disk was measured"
        measured.set()
        waiter.join(EARLY)
        assert waiter.is_alive(), "10 s of writing left, and the reply went out"
        assert writer.write_rate == 10e6
        release.set()
        waiter.join(TIMEOUT)
        assert events == ["measured", "written", "reply"]
    finally:
        measured.set()
        release.set()
        writer.close()


def test_a_probe_that_fails_leaves_the_default_rate_and_reports_nothing() -> None:
    writer = BackgroundWriter()

    def probe() -> float:
        raise OSError(30, "Read-only file system")

    try:
        writer.calibrate(probe)
        writer.flush()
        assert writer.take_failures() == []
        assert writer.write_rate == 200e6
        assert writer.wait_for_backlog(0.0) >= 0.0  # nothing pending, not calibrating: returns
    finally:
        writer.close()


# -- lazy jobs (a replay's record waits for the replays after it) --------------------------


def _held_writer(idle: float = 600.0, most: float = 600.0) -> BackgroundWriter:
    writer = BackgroundWriter()
    writer.lazy_idle, writer.lazy_max = idle, most
    return writer


def test_a_lazy_job_waits_while_the_writer_is_busy_and_a_flush_starts_it() -> None:
    writer = _held_writer()
    ran = threading.Event()
    try:
        writer.submit(ran.set, lazy=True)
        assert not ran.wait(EARLY), "a lazy job started before the writer was idle"
        assert writer.pending() == (1, 0)
        flusher = in_thread(writer.flush)
        flusher.join(TIMEOUT)
        assert not flusher.is_alive() and ran.is_set()
        assert writer.pending() == (0, 0)
    finally:
        writer.close()


def test_a_lazy_job_starts_at_once_when_a_job_that_is_not_lazy_is_queued_behind_it() -> None:
    writer = _held_writer()
    done: list[str] = []
    eager_done = threading.Event()
    try:
        writer.submit(functools.partial(done.append, "lazy"), lazy=True)
        assert not eager_done.wait(EARLY)
        writer.submit(lambda: (done.append("eager"), eager_done.set()))
        assert eager_done.wait(TIMEOUT)
        assert done == ["lazy", "eager"]  # still in submission order
    finally:
        writer.close()


def test_a_lazy_job_starts_once_the_writer_has_been_idle_and_touch_postpones_it() -> None:
    writer = _held_writer(idle=0.3)
    ran = threading.Event()
    try:
        writer.submit(ran.set, lazy=True)
        for _ in range(5):  # activity every 0.1 s keeps it waiting...
            time.sleep(0.1)
            writer.touch()
            assert not ran.is_set()
        assert ran.wait(TIMEOUT)  # ...and once it stops, the job starts by itself
    finally:
        writer.close()


def test_a_lazy_job_waits_no_longer_than_its_bound_however_busy_the_kernel_is() -> None:
    writer = _held_writer(idle=600.0, most=0.3)
    ran = threading.Event()
    try:
        writer.submit(ran.set, lazy=True)
        started = time.monotonic()
        while not ran.is_set() and time.monotonic() - started < TIMEOUT:
            writer.touch()
            time.sleep(0.02)
        assert ran.is_set()
    finally:
        writer.close()


def test_close_runs_a_waiting_lazy_job() -> None:
    writer = _held_writer()
    ran = threading.Event()
    writer.submit(ran.set, lazy=True)
    closer = in_thread(writer.close)
    closer.join(TIMEOUT)
    assert not closer.is_alive() and ran.is_set()


def test_a_flush_for_written_objects_waits_for_jobs_that_are_not_lazy_only() -> None:
    writer = _held_writer()
    release = threading.Event()
    done: list[str] = []
    try:
        writer.submit(functools.partial(done.append, "batch"), lazy=True)
        flusher = in_thread(functools.partial(writer.flush, lazy=False))
        flusher.join(TIMEOUT)
        assert not flusher.is_alive() and done == []  # a batch alone: nothing to wait for
        writer.submit(lambda: (release.wait(TIMEOUT), done.append("objects")))
        flusher = in_thread(functools.partial(writer.flush, lazy=False))
        flusher.join(EARLY)
        assert flusher.is_alive(), "returned before the objects were written"
        release.set()
        flusher.join(TIMEOUT)
        assert not flusher.is_alive() and done == ["batch", "objects"]
    finally:
        release.set()
        writer.close()


def test_what_the_writer_thread_opens_is_never_a_cells_file(writer: BackgroundWriter, tmp_path: Path) -> None:
    """A file tracker records every thread's opens (a cell's own threads write files too),
    but the writer's files are the store's: a job that writes, renames and reads a file
    outside any exclusion leaves nothing in the tracker, and finds itself quiet."""
    from nbrewind.checkpoint.hidden import FileTracker
    from nbrewind.identity.files import quiet_reads, read_file

    seen: list[bool] = []

    def job() -> None:
        seen.append(getattr(quiet_reads, "on", False))
        (tmp_path / "tmp.bin").write_bytes(b"abc")
        (tmp_path / "tmp.bin").replace(tmp_path / "object.bin")
        read_file(tmp_path / "object.bin")
        seen.append(getattr(quiet_reads, "on", False))  # read_file gave the flag back as it found it

    tracker = FileTracker()
    assert tracker.all_threads
    with tracker.tracking():
        writer.submit(job)
        writer.flush()
    assert seen == [True, True]
    assert not writer.failures
    assert not (tracker.reads | tracker.writes), (tracker.reads, tracker.writes)
    assert not getattr(quiet_reads, "on", False), "the test's own thread stays tracked"
