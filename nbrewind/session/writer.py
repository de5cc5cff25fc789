"""One background thread that makes checkpoints durable while the next cell runs.

A cell's checkpoint is decided, hashed and protected (snapshotted or copied,
see ``ObjectStore.protect``) before the kernel replies, so the next cell cannot
change what it records; writing the objects, fsyncing them and marking the cell
run durable happens here. Jobs run in submission
order. A cell run becomes a replay candidate only once its job has finished,
so a crash mid-write leaves a store whose catalog trusts nothing unwritten.

The writer also estimates how long its backlog will take, from the write rate
it measures, so the kernel can keep that backlog short: Jupyter clients kill a
kernel a few seconds after asking it to shut down, and whatever is still queued
then is lost (see `wait_for_backlog` and docs/reliability.md).

A *lazy* job (``submit(..., lazy=True)``) is one that may wait: the writer starts it
only once it has been idle for `lazy_idle` seconds (no submit and no `touch`), once a
job that is not lazy is queued behind it, once `flush` or `close` asks, or at the latest
`lazy_max` seconds after it was queued (``NBREWIND_REPLAY_BATCH_SECONDS`` sets the idle
time; 0 starts lazy jobs at once). The committer queues a replay's record this
way and adds the records of the replays that follow to the same job, so a run of
replays costs one catalog transaction, written while the kernel is idle rather than
in the middle of the next replays (where it competed for the GIL, the catalog's lock
and the second core).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable

from nbrewind.identity.files import quiet_reads

Job = Callable[[], None]

#: Until a job has been measured: a conservative write-plus-fsync rate (DESIGN.md measured about 300 MB/s).
DEFAULT_WRITE_RATE = 200e6
#: Until measured: the fixed cost of one job (a catalog transaction, a few fsyncs).
DEFAULT_JOB_SECONDS = 0.01
#: Until measured: one task-log row in the catalog (100k rows took about 2 s here).
DEFAULT_ROW_SECONDS = 25e-6

_BIG_JOB = 8 << 20  # bytes: enough for a job to measure the write rate
_PROBE_BYTES = 2 << 20  # what ObjectStore.probe_write_rate writes at a time
_SMALL_FILES_PER_JOB = 3
_SMALL_JOB = 1 << 20  # bytes: little enough for a job to measure the fixed cost
_MANY_ROWS = 1000  # rows: enough for a job to measure the cost of a row

#: Seconds without a submit (or `touch`) after which a lazy job starts (NBREWIND_REPLAY_BATCH_SECONDS).
LAZY_IDLE = 0.1
#: Seconds a lazy job waits at most, however busy the kernel is (at least ten idle times).
LAZY_MAX = 1.0


def _lazy_idle() -> float:
    try:
        return max(0.0, float(os.environ.get("NBREWIND_REPLAY_BATCH_SECONDS", LAZY_IDLE)))
    except ValueError:
        return LAZY_IDLE


def _blend(old: float, sample: float) -> float:
    """A moving estimate that follows the machine (and its load) within a few jobs."""
    return 0.5 * old + 0.5 * sample


class BackgroundWriter:
    """A FIFO of write jobs on one daemon thread, with a cap on bytes in flight."""

    def __init__(self, max_pending_bytes: int = 1 << 30) -> None:
        self.max_pending_bytes = max_pending_bytes
        self._queue: queue.Queue[tuple[Job, int, int, float | None] | None] = queue.Queue()
        self._lock = threading.Condition()
        self._pending_jobs = 0
        self._pending_bytes = 0
        self._pending_rows = 0
        self._running_bytes = 0  # what the running job announced
        self._advanced = 0  # of which it reported written (see `advance`)
        self._running_since = 0.0
        self.write_rate = DEFAULT_WRITE_RATE
        """Bytes per second, measured on jobs that wrote enough to tell."""
        self.job_seconds = DEFAULT_JOB_SECONDS
        self.row_seconds = DEFAULT_ROW_SECONDS
        self._calibrating = False
        self._eager_queued = 0  # jobs queued that are not lazy: a lazy job ahead of them starts at once
        self._eager_pending = 0  # jobs not lazy, queued or running
        self._hurry = 0  # callers of flush waiting: a lazy job starts at once
        self._last_submit = 0.0  # perf_counter of the last submit or touch: a lazy job waits for idleness
        self.lazy_idle = _lazy_idle()
        """Seconds of idleness (no submit, no `touch`) a lazy job waits for."""
        self.lazy_max = max(LAZY_MAX, 10 * self.lazy_idle)
        """Seconds a lazy job waits at most after it was queued."""
        self.failures: list[str] = []
        self._thread: threading.Thread | None = None

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="nbrewind-writer", daemon=True)
            self._thread.start()

    def submit(self, job: Job, nbytes: int = 0, rows: int = 0, *, lazy: bool = False) -> None:
        """Queue `job`, which will write `nbytes` (held by staging until it does) and
        `rows` task-log rows; waits first while more than the cap is already in flight.

        A `lazy` job may wait until the writer is idle (see the module's docstring); jobs
        still run in submission order."""
        with self._lock:
            while self._pending_bytes and self._pending_bytes + nbytes > self.max_pending_bytes:
                self._lock.wait()
            self._pending_jobs += 1
            self._pending_bytes += nbytes
            self._pending_rows += rows
            now = time.perf_counter()
            self._last_submit = now
            if not lazy:
                self._eager_queued += 1
                self._eager_pending += 1
                self._lock.notify_all()  # a lazy job waiting ahead of this one starts now
            self._ensure_thread()  # under the lock: submitters racing must start one thread
            # Put under the lock: the writer counts an eager job queued only once it is in the queue.
            self._queue.put((job, nbytes, rows, now if lazy else None))

    def touch(self) -> None:
        """Note activity that a queued lazy job should wait out (the committer added a
        record to it): it starts `lazy_idle` seconds from now at the earliest."""
        with self._lock:
            self._last_submit = time.perf_counter()

    def advance(self, nbytes: int) -> None:
        """Called by the running job as its bytes reach the disk, so the backlog (and
        the cap) shrink while a large job is still writing."""
        with self._lock:
            step = min(nbytes, self._running_bytes - self._advanced)  # never more than the job announced
            if step > 0:
                self._advanced += step
                self._pending_bytes -= step
                self._lock.notify_all()

    def _run(self) -> None:
        # Everything this thread opens, renames or stats is the store's, never the cell's:
        # the file trackers' audit hook returns at once instead of looking at each path.
        quiet_reads.on = True
        while True:
            item = self._queue.get()
            if item is None:
                return
            job, nbytes, rows, lazy_since = item
            del item
            if lazy_since is None:
                with self._lock:
                    self._eager_queued -= 1
            else:
                self._wait_to_start_lazy(lazy_since)
            started = time.perf_counter()
            with self._lock:
                self._running_bytes, self._advanced, self._running_since = nbytes, 0, started
            failed = False
            try:
                job()
            except Exception as exc:  # reported, and the cell run stays non-durable (never replayed)
                failed = True
                with self._lock:
                    self.failures.append(f"{type(exc).__name__}: {exc}")
            finally:
                # The job holds the cell's staged copies: drop them before waiting for the next.
                del job
                seconds = time.perf_counter() - started
                with self._lock:
                    if not failed and lazy_since is None:  # a batch of many records is not a job's cost
                        self._learn(nbytes, rows, seconds)
                    self._pending_jobs -= 1
                    if lazy_since is None:
                        self._eager_pending -= 1
                    self._pending_bytes -= nbytes - self._advanced
                    self._pending_rows -= rows
                    self._running_bytes = self._advanced = 0
                    self._lock.notify_all()

    def _wait_to_start_lazy(self, since: float) -> None:
        """Hold a lazy job (queued at `since`) until the writer has been idle `lazy_idle`
        seconds, an eager job is queued behind it, a flush asks, or `lazy_max` has passed."""
        with self._lock:
            while not self._eager_queued and not self._hurry:
                wait = min(self._last_submit + self.lazy_idle, since + self.lazy_max) - time.perf_counter()
                if wait <= 0:
                    return
                self._lock.wait(wait)

    def calibrate(self, probe: Callable[[], float]) -> None:
        """Queue a measurement of the disk (`probe()` returns bytes per second) ahead of the
        jobs that follow: the first large checkpoint is then priced at the disk's speed,
        not at the default (on a slow disk the default would let too much pile up)."""

        def measure() -> None:
            try:
                rate = probe()
            except Exception:  # noqa: BLE001 - a store that cannot be written says so in its commits
                rate = None
            with self._lock:
                self._calibrating = False
                if rate is not None:
                    self.write_rate = rate
                    # A job writes a few small files (trees, the catalog), each about a probe write.
                    self.job_seconds = max(self.job_seconds, _SMALL_FILES_PER_JOB * _PROBE_BYTES / rate)

        with self._lock:
            self._calibrating = True
        self.submit(measure)

    def _learn(self, nbytes: int, rows: int, seconds: float) -> None:
        """Refine the cost model from one finished job (under the lock)."""
        if rows < _MANY_ROWS // 10:
            if nbytes <= _SMALL_JOB:
                self.job_seconds = _blend(self.job_seconds, seconds)
            elif nbytes >= _BIG_JOB:
                self.write_rate = _blend(self.write_rate, nbytes / max(seconds - self.job_seconds, 1e-3))
        elif rows >= _MANY_ROWS:
            rest = seconds - self.job_seconds - nbytes / self.write_rate
            self.row_seconds = _blend(self.row_seconds, max(rest, 0.0) / rows)

    def backlog_seconds(self) -> float:
        """About how long the writer needs to finish everything queued, at the rates it measured."""
        with self._lock:
            return self._backlog()

    def _backlog(self) -> float:
        rate = self.write_rate
        elapsed = time.perf_counter() - self._running_since
        if self._advanced >= _BIG_JOB and elapsed >= 0.25:
            # A large job under way tells how slow the disk is right now (never faster
            # than measured: a burst into the page cache is not a rate).
            rate = min(rate, self._advanced / elapsed)
        return self._pending_jobs * self.job_seconds + self._pending_bytes / rate + self._pending_rows * self.row_seconds

    def wait_for_backlog(self, seconds: float) -> float:
        """Wait until the backlog would take at most `seconds` to write; return the time waited.

        The kernel calls this before it replies to a cell, so that a shutdown (which
        Jupyter clients follow with SIGKILL after a few seconds) finds little left to
        write. While the disk is still being measured (`calibrate`) and the backlog is
        a sizeable part of the bound even at the default rate, it waits for the
        measurement first. An interrupt (KeyboardInterrupt) ends the wait; the writes go on.
        """
        started = time.perf_counter()
        try:
            with self._lock:
                while self._pending_jobs and (
                    self._backlog() > seconds or (self._calibrating and self._backlog() > seconds / 4)
                ):
                    self._lock.wait(0.5)
        except KeyboardInterrupt:
            pass
        return time.perf_counter() - started

    def take_failures(self) -> list[str]:
        """Failures since the last call (the session reports them in the next cell)."""
        with self._lock:
            failures, self.failures = self.failures, []
        return failures

    def pending(self) -> tuple[int, int]:
        """(jobs, bytes) not yet durable."""
        with self._lock:
            return self._pending_jobs, self._pending_bytes

    def flush(self, *, lazy: bool = True) -> None:
        """Wait until every submitted job has finished (a lazy job starts at once).

        With ``lazy=False``, wait only for the jobs that are not lazy (and so for the
        lazy jobs queued before them): what a reader of objects this kernel staged needs.
        A lazy job waiting with nothing behind it (a replay batch, which writes catalog rows
        and no object) is left to wait for idleness.
        """
        with self._lock:
            if not (self._pending_jobs if lazy else self._eager_pending):
                return
            if lazy:
                self._hurry += 1
                self._lock.notify_all()
            try:
                while self._pending_jobs if lazy else self._eager_pending:
                    self._lock.wait()
            finally:
                if lazy:
                    self._hurry -= 1

    def close(self) -> None:
        """Finish all jobs and stop the thread."""
        self.flush()
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
