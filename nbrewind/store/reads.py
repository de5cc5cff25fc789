"""Reading many blob chunks into their places, on a few threads at once.

A restored 200 MB array is about a hundred 2 MiB chunk files. Each file is read
whole into a page-aligned buffer the thread keeps (it stays in the CPU cache),
copied into its slice of the array's fresh memory, and that slice is hashed
right after, while it is still in the cache: one pass over the memory, every
byte that will be unpickled verified. The kernel's page-cache copy runs at
full speed only between equally aligned addresses, and a chunk's bytes start 8
bytes into its file: that copy alone runs 2-3 times slower when they are read
straight into the array, and loading the state-heavy notebook's state took
twice as long that way (``benchmarks/bench_load.py``, docs/benchmarks.md).

File reads, page faults, zstd decoding, that copy and xxh3 all run with the
GIL released, so a small pool of helper threads shares the work with the
calling thread (``NBREWIND_READ_THREADS``; bench_load.py measures 1, 2 and 4).

Errors keep their meaning: every chunk is still read and verified when one
fails (so every damaged file of the blob is moved aside at once, and storing
the blob again repairs all of them), then the error of the first failing chunk,
in chunk order, is raised, as a plain loop over the chunks would have raised it.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

from nbrewind.store import frame
from nbrewind.store.trees import BLOB_CHUNK_SIZE

__all__ = [
    "fill_from_chunk_file",
    "DEFAULT_READ_THREADS",
    "PARALLEL_MIN_BYTES",
    "READ_BUFFER_SIZE",
    "copy_releasing_gil",
    "read_buffer",
    "read_chunks",
    "read_threads_from_env",
    "read_whole",
]

DEFAULT_READ_THREADS = min(2, os.cpu_count() or 1)
"""Threads that read one batch of chunks, the caller's included."""

PARALLEL_MIN_BYTES = 8 << 20
"""Batches smaller than this are read by the calling thread alone: they take a few
milliseconds, and waking helpers is not worth it."""

READ_BUFFER_SIZE = BLOB_CHUNK_SIZE + mmap.PAGESIZE
"""A raw 2 MiB chunk file with its header fits, with room to tell a longer file."""

_local = threading.local()

# The helpers of this process: (pid, helper count, pool). After a fork the child
# sees another pid and makes its own pool: the parent's threads do not exist there.
_POOL: tuple[int, int, ThreadPoolExecutor] | None = None


def read_threads_from_env() -> int:
    """``NBREWIND_READ_THREADS`` when it is a positive integer, else ``DEFAULT_READ_THREADS``."""
    text = os.environ.get("NBREWIND_READ_THREADS", "")
    return int(text) if text.isdigit() and int(text) > 0 else DEFAULT_READ_THREADS


def read_buffer() -> memoryview:
    """This thread's page-aligned ``READ_BUFFER_SIZE`` buffer, reused for every chunk it reads
    (so it stays in the CPU cache and its pages stay mapped)."""
    buffer: memoryview | None = getattr(_local, "buffer", None)
    if buffer is None:
        buffer = _local.buffer = memoryview(mmap.mmap(-1, READ_BUFFER_SIZE))
    return buffer


WHOLE_READ_MIN = 4 << 20
"""Files at least this large are read into memory whose pages are mapped before the read."""


def read_whole(handle: BinaryIO) -> bytes | mmap.mmap:
    """Everything in the file open (unbuffered, at its start) as ``handle``, as one buffer
    the caller owns: nothing else holds or changes it.

    A file of ``WHOLE_READ_MIN`` bytes or more lands in fresh anonymous memory mapped
    with ``MAP_POPULATE``: the kernel maps all its pages in one go instead of taking a
    fault per 4 KiB page during the copy, and the faults were a large part of reading a
    file into ``bytes`` (six 36 MB files: 106 ms into ``bytes``, 86 ms this way, on this
    machine; docs/benchmarks.md). Where the flag does not exist, or the file changed size
    while it was read, this is ``handle.read()``.
    """
    size = os.fstat(handle.fileno()).st_size
    populate = getattr(mmap, "MAP_POPULATE", None)
    if size < WHOLE_READ_MIN or populate is None:
        return handle.read()
    buffer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)
    view = memoryview(buffer)
    try:
        filled = 0
        while filled < size and (got := handle.readinto(view[filled:])):  # type: ignore[attr-defined]
            filled += got
    finally:
        view.release()
    if filled == size and not handle.read(1):
        return buffer
    buffer.close()  # it changed size while read: start again the plain way
    handle.seek(0)
    return handle.read()


def copy_releasing_gil(target: memoryview, source: memoryview) -> None:
    """``target[:] = source`` for two writable byte views of one length, with the GIL
    released during the copy (a memoryview assignment holds it), so that threads
    reading chunks copy them at the same time."""
    if len(target) != len(source):
        raise ValueError(f"cannot copy {len(source)} bytes into {len(target)}")
    if target:
        kind = ctypes.c_char * len(target)
        ctypes.memmove(kind.from_buffer(target), kind.from_buffer(source), len(target))


def _helpers(count: int) -> ThreadPoolExecutor:
    global _POOL
    pool = _POOL
    if pool is None or pool[0] != os.getpid() or pool[1] < count:
        pool = _POOL = (os.getpid(), count, ThreadPoolExecutor(count, thread_name_prefix="nbrewind-read"))
    return pool[2]


class _Batch:
    """The chunk reads of one call, taken one at a time by every thread that helps."""

    def __init__(self, jobs: Sequence[tuple[str, memoryview]], read: Callable[[str, memoryview], None]) -> None:
        self.jobs = jobs
        self.read = read
        self.lock = threading.Lock()
        self.taken = 0
        self.finished = 0
        self.done = threading.Event()
        self.stopped = False
        self.errors: dict[int, BaseException] = {}

    def drain(self) -> None:
        while not self.stopped:
            with self.lock:
                index = self.taken
                if index >= len(self.jobs):
                    return
                self.taken += 1
            digest, target = self.jobs[index]
            try:
                self.read(digest, target)
            except BaseException as exc:
                self.errors[index] = exc  # the caller raises the first one in job order
                if not isinstance(exc, Exception):
                    self.stopped = True  # KeyboardInterrupt and the like: the others stop too
                    raise
            finally:
                with self.lock:
                    self.finished += 1
                    if self.finished == len(self.jobs) or self.stopped:
                        self.done.set()


def read_chunks(
    jobs: Sequence[tuple[str, memoryview]], read: Callable[[str, memoryview], None], threads: int
) -> None:
    """Run ``read(digest, target)`` for every job, on up to ``threads`` threads (the
    caller's among them), and return once all are done.

    ``read`` fills ``target`` with the verified bytes of the chunk ``digest`` or
    raises. If any raised, the exception of the first such job in ``jobs`` order is
    raised here, after every job ran.
    """
    if not jobs:
        return
    batch = _Batch(jobs, read)
    nbytes = sum(target.nbytes for _, target in jobs)
    helpers = min(threads, len(jobs)) - 1 if nbytes >= PARALLEL_MIN_BYTES else 0
    if helpers > 0:
        try:
            pool = _helpers(helpers)
            for _ in range(helpers):
                pool.submit(batch.drain)
        except RuntimeError:
            pass  # the interpreter is shutting down: no new threads, read on this one
    try:
        batch.drain()
        batch.done.wait()
    except BaseException:
        batch.stopped = True  # interrupted: the helpers stop after their current chunk
        raise
    if batch.errors:
        raise batch.errors[min(batch.errors)]


def fill_from_chunk_file(handle: BinaryIO, target: memoryview) -> bool:
    """Whether the object file open in ``handle`` (unbuffered, at its start) decoded
    into exactly ``target``; nothing is verified here.

    The file is read whole, header included, into the thread's page-aligned read
    buffer (`read_buffer`) rather than from offset 8 straight
    into ``target``: the kernel copies page cache to memory 2-3 times slower when the
    two are misaligned by the header's 8 bytes, and a copy out of a buffer that is
    still in the CPU cache costs less than the difference (see the module docstring).
    """
    buffer = read_buffer()
    stored = 0
    while stored < len(buffer):
        got = handle.readinto(buffer[stored:])  # type: ignore[attr-defined]
        if not got:
            break
        stored += got
    if stored == len(buffer) or stored < frame.HEADER_SIZE:
        return False  # larger than any chunk file, or no header: the slow path says what it is
    header = frame.decode_header(bytes(buffer[: frame.HEADER_SIZE]))
    if header is None:
        return False
    payload = buffer[frame.HEADER_SIZE : stored]
    if header.codec == frame.CODEC_ZSTD:
        return frame.decompress_into(payload, target)
    if len(payload) != len(target):
        return False
    copy_releasing_gil(target, payload)
    return True
