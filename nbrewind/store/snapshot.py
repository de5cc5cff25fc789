"""Copy-on-write snapshots: a forked child writes staged chunks while the caller goes on.

A checkpoint must keep the bytes it hashed until they are on disk, while the next
notebook cell may already edit the same arrays in place. Copying them first costs
about 1 ms per MB of fresh memory on this project's machines (page faults), so a
200 MB array costs a fifth of a second before the kernel can reply. ``fork()``
costs a few milliseconds whatever the size: the child sees the memory exactly as
it was, and the kernel pays a page copy only for the pages it writes while the
child is still writing (benchmarks/bench_staging.py measures both).

The child runs a small, lock-free job (the caller's ``work``), reports each chunk
it wrote on a pipe (``w <bytes> <file bytes>``, then ``ok`` or ``error <text>``)
and exits with ``os._exit``: it never returns into the caller's code, flushes no
inherited buffers and runs no atexit handler. It ignores SIGINT and SIGTERM (an
interrupt or shutdown of the kernel's process group must not cut a checkpoint
short) and dies with its parent (PR_SET_PDEATHSIG), so a kernel killed with
SIGKILL leaves no writer behind. Linux only; elsewhere callers copy instead.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from nbrewind.errors import ChangedWhileStagedError, ReadOnlyStoreError, StoreError, StoreFullError

__all__ = ["SUPPORTED", "Snapshot", "SnapshotError", "fork_writer"]

SUPPORTED = sys.platform.startswith("linux") and hasattr(os, "fork")

_PR_SET_PDEATHSIG = 1
_SECONDS_FLOOR = 120.0  # a child that reports nothing for this long (plus size at 2 MB/s) is killed
_MIN_RATE = 2e6

_libc: Any = None
_children: list[Snapshot] = []  # not yet reaped, so abandoned ones do not stay zombies
_children_lock = threading.Lock()

Report = Callable[[str], None]


class SnapshotError(StoreError):
    """The snapshot writer failed (killed, ...): its chunks may be missing."""


# Errors the child reports by name that the parent raises as themselves (a full disk
# must read as a full disk to whoever reports it).
_KNOWN: dict[str, type[StoreError]] = {
    cls.__name__: cls for cls in (StoreFullError, ReadOnlyStoreError, ChangedWhileStagedError)
}


class Snapshot:
    """A forked writer: `wait` returns once it finished, and raises if it failed."""

    def __init__(self, pid: int, fd: int, nbytes: int) -> None:
        self.pid = pid
        self.nbytes = nbytes
        self._fd = fd
        self._lock = threading.Lock()
        self._buffer = b""
        self._progress: list[tuple[int, int]] = []  # reported by the child, not yet passed on
        self._error: str | None = None
        self._done = False
        self._reaped = False
        self._deadline = time.monotonic() + _SECONDS_FLOOR + nbytes / _MIN_RATE

    def wait(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Wait for the child; `progress(bytes, file_bytes)` per chunk it wrote. Raises SnapshotError."""
        with self._lock:
            while not self._done:
                readable, _, _ = select.select([self._fd], [], [], 0.5)
                if readable:
                    if self._read():
                        self._deliver(progress)
                        continue
                    self._finish("the snapshot writer ended without finishing")
                elif self._exited():
                    self._drain()
                    self._finish("the snapshot writer died")
                elif time.monotonic() > self._deadline:
                    self._kill()
                    self._finish("the snapshot writer stopped making progress and was killed")
            self._deliver(progress)
            self._reap()
        if self._error is not None:
            name, _, text = self._error.partition(": ")
            raise _KNOWN.get(name, SnapshotError)(text if name in _KNOWN else self._error)

    def poll_reap(self) -> bool:
        """If the child has exited, take its report and reap it (a snapshot nobody waits
        for must not stay a zombie); whether it is gone. Never blocks."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if not self._reaped and self._exited():
                self._drain()
                self._finish("the snapshot writer died")
                self._reap()
            return self._reaped
        finally:
            self._lock.release()

    def _read(self) -> bool:
        data = os.read(self._fd, 1 << 16)
        if not data:
            return False
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        for line in lines:
            if line.startswith(b"w "):
                self._deadline = time.monotonic() + _SECONDS_FLOOR + self.nbytes / _MIN_RATE
                size, stored = (int(x) for x in line[2:].split())
                self._progress.append((size, stored))
            elif line == b"ok":
                self._done = True
            elif line.startswith(b"error "):
                self._finish(line[6:].decode(errors="replace"))
        return True

    def _drain(self) -> None:
        while not self._done and self._fd >= 0 and select.select([self._fd], [], [], 0)[0]:
            if not self._read():
                return

    def _deliver(self, progress: Callable[[int, int], None] | None) -> None:
        reported, self._progress = self._progress, []
        if progress is not None:
            for size, stored in reported:
                progress(size, stored)

    def _finish(self, error: str) -> None:
        if not self._done:
            self._done, self._error = True, error

    def _exited(self) -> bool:
        try:
            pid, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped by someone else (SIGCHLD ignored, os.wait() in user code)
            self._reaped = True
            return True
        if pid:
            self._reaped = True
        return bool(pid)

    def _kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _reap(self) -> None:
        if not self._reaped:
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self._reaped = True
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def fork_writer(work: Callable[[Report], None], nbytes: int) -> Snapshot | None:
    """Run ``work(report)`` in a forked child that sees this process's memory as it is
    now; ``report(line)`` sends one progress line. None when this platform cannot fork
    (callers then copy what they staged)."""
    global _libc
    if not SUPPORTED:
        return None
    with _children_lock:
        _children[:] = [c for c in _children if not c.poll_reap()]
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            return None
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    # Held back from fork until the child ignores them: an interrupt of the process group
    # arriving in between would otherwise kill the child before its first line.
    held = {signal.SIGINT, signal.SIGTERM}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        with warnings.catch_warnings():
            # Python 3.12+ warns about fork() in a threaded process: the child below
            # takes no lock another thread could hold and runs no code but `work`.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(read_fd)
        os.close(write_fd)
        return None
    if pid != 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if pid == 0:
        _child(work, read_fd, write_fd, parent)  # never returns
    os.close(write_fd)
    snap = Snapshot(pid, read_fd, nbytes)
    with _children_lock:
        _children.append(snap)
    return snap


def _child(work: Callable[[Report], None], read_fd: int, write_fd: int, parent: int) -> None:
    code = 1

    def report(line: str) -> None:
        data = (line + "\n").encode()
        while data:
            data = data[os.write(write_fd, data) :]

    try:
        os.close(read_fd)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})  # held since fork
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above took effect
            os._exit(1)
        work(report)
        report("ok")
        code = 0
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, then exit
        try:
            report(f"error {type(exc).__name__}: {exc}".replace("\n", " "))
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(code)
