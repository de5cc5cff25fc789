"""One background thread that makes checkpoints durable while the next cell runs.

A cell's checkpoint is decided, hashed and copied before the kernel replies
(so the next cell cannot change what it records); writing the objects, fsyncing
them and marking the cell run durable happens here. Jobs run in submission
order. A cell run becomes a replay candidate only once its job has finished,
so a crash mid-write leaves a store whose catalog trusts nothing unwritten.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

Job = Callable[[], None]


class BackgroundWriter:
    """A FIFO of write jobs on one daemon thread, with a cap on bytes in flight."""

    def __init__(self, max_pending_bytes: int = 1 << 30) -> None:
        self.max_pending_bytes = max_pending_bytes
        self._queue: queue.Queue[tuple[Job, int] | None] = queue.Queue()
        self._lock = threading.Condition()
        self._pending_jobs = 0
        self._pending_bytes = 0
        self.failures: list[str] = []
        self._thread: threading.Thread | None = None

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="nbrewind-writer", daemon=True)
            self._thread.start()

    def submit(self, job: Job, nbytes: int = 0) -> None:
        """Queue `job`; waits first while more than the cap is already in flight."""
        with self._lock:
            while self._pending_bytes and self._pending_bytes + nbytes > self.max_pending_bytes:
                self._lock.wait()
            self._pending_jobs += 1
            self._pending_bytes += nbytes
            self._ensure_thread()  # under the lock: submitters racing must start one thread
        self._queue.put((job, nbytes))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            job, nbytes = item
            try:
                job()
            except Exception as exc:  # reported, and the cell run stays non-durable (never replayed)
                with self._lock:
                    self.failures.append(f"{type(exc).__name__}: {exc}")
            finally:
                with self._lock:
                    self._pending_jobs -= 1
                    self._pending_bytes -= nbytes
                    self._lock.notify_all()

    def take_failures(self) -> list[str]:
        """Failures since the last call (the session reports them in the next cell)."""
        with self._lock:
            failures, self.failures = self.failures, []
        return failures

    def pending(self) -> tuple[int, int]:
        """(jobs, bytes) not yet durable."""
        with self._lock:
            return self._pending_jobs, self._pending_bytes

    def flush(self) -> None:
        """Wait until every submitted job has finished."""
        with self._lock:
            while self._pending_jobs:
                self._lock.wait()

    def close(self) -> None:
        """Finish all jobs and stop the thread."""
        self.flush()
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
