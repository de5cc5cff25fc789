"""The worker side of a cluster whose workers cannot see the store.

Graphs sent to a distributed scheduler carry a :class:`StoreLink` in every task's
spec: the name of a *probe* file that the kernel wrote into its store's
``probes/`` folder when it first submitted work (random, new for each kernel,
removed when the kernel closes; not an object, so ``gc`` neither keeps nor
reports it), and the name of an event topic the kernel's client listens on
(``relay.py``).

The first time a process runs a wrapped or load task it looks for the probe
file under the store's path (:func:`sees_store`, one ``stat``, remembered for
the life of the process). Finding it means this is the kernel's store and the
worker reads and writes it directly, as before. Not finding it means there is no
store at that path, or a different one (another machine's store at the same path,
a stale copy): then nothing is read from or written to that path, and

- a missed task pickles its result, keeps the frames in this process
  (:func:`stash_result`) and tells the kernel with a small event; the kernel takes
  them with ``Client.run`` (:func:`take_results`) and writes the entry and ref;
  the task itself returns at once, so results that never reach the client are
  still stored;
- a load task asks the kernel for the entry with an event (:func:`request_entry`)
  and waits; the kernel reads it (verified) and hands the frames over with
  ``Client.run`` (:func:`deliver`), a large entry scattered to this worker first;
- an in-task checkpoint goes the way of a result, under its own ref, and waits until
  the kernel took it; ``resume`` asks for the ref's value the way a load task asks for
  an entry (:func:`request_ref`); a finished task's checkpoint ref is dropped by a last
  hand-over (:func:`drop_ref`).

Both directions go through the scheduler's existing connections, so this needs
nothing beyond what Dask itself needs (no shared path, no port on the kernel).
Nothing here imports dask or distributed at module level.
"""

from __future__ import annotations

import itertools
import os
import pickle
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nbrewind.tasks.results import TaskCacheError, load_frames, pickle_frames

__all__ = [
    "STASH_LIMIT",
    "Abandoned",
    "NotTaken",
    "OutOfBand",
    "PROBES",
    "RELAYED_REFS",
    "RELAY_VARIABLE",
    "StoreLink",
    "deliver",
    "drop_ref",
    "hidden_roots",
    "probe_path",
    "request_entry",
    "request_ref",
    "sees_store",
    "stash_result",
    "take_results",
    "write_probe",
]


def _env_number(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


#: Bytes of pickled results a worker holds for the kernel at most; beyond it a result is not cached.
STASH_LIMIT = int(_env_number("NBREWIND_STASH_BYTES", 2 << 30))
#: Seconds a stashed result waits for the kernel before it is dropped (the kernel is gone).
STASH_MAX_AGE = 900.0
#: Seconds a load task waits for the kernel's answer before it recomputes instead.
LOAD_TIMEOUT = _env_number("NBREWIND_LOAD_TIMEOUT", 120.0)


def _as_is(buffer: Any) -> Any:
    return buffer


class OutOfBand:
    """A buffer that travels through Dask's comms as a frame of its own (pickle protocol 5
    out-of-band), not copied into a pickle stream; it arrives as a plain buffer."""

    __slots__ = ("data",)

    def __init__(self, data: Any) -> None:
        self.data = data

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        if isinstance(protocol, int) and protocol >= 5:
            return _as_is, (pickle.PickleBuffer(self.data),)
        return _as_is, (bytes(self.data),)


@dataclass(frozen=True)
class StoreLink:
    """How a task reaches the kernel's store: small, one per kernel, shared by every spec."""

    topic: str
    """The event topic the kernel's client subscribed to."""
    probe: str
    """Digest of an object only the kernel's store holds (random content, new per kernel)."""


_lock = threading.Lock()
_seen: dict[tuple[str, str], bool] = {}
hidden_roots: set[str] = set()
"""Store paths this process found to be no view of the kernel's store (no direct I/O there)."""
probes = 0
"""How many times this process looked for a probe object (once per store and kernel)."""


PROBES = "probes"
"""The store's folder of probe files, one per kernel whose tasks carry a :class:`StoreLink`."""


def probe_path(root: str, name: str) -> str:
    """Where the probe file ``name`` of the store at ``root`` is."""
    if not name.isalnum():
        raise ValueError(f"not a probe name: {name!r}")
    return os.path.join(root, PROBES, name)


def write_probe(root: str, name: str, data: bytes) -> None:
    """Write the probe file ``name`` into the store at ``root`` (atomically: a worker never
    sees it half-written)."""
    folder = os.path.join(root, PROBES)
    os.makedirs(folder, exist_ok=True)
    temp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    with open(temp, "wb") as handle:
        handle.write(data)
    os.replace(temp, probe_path(root, name))


RELAY_VARIABLE = "NBREWIND_WORKER_STORE"
"""Set to ``relay`` in a worker's environment, it sends results to and takes entries from
the kernel even where it sees the store (a shared filesystem slower than the network, or
checking this mode on a cluster that has one)."""


def sees_store(root: str, link: StoreLink | None) -> bool:
    """Whether the store at ``root`` here is the kernel's store; looked up once per process.

    Without a link (a local scheduler: the kernel's own machine) the answer is yes; with
    ``NBREWIND_WORKER_STORE=relay`` (`RELAY_VARIABLE`) it is no.
    """
    if link is None:
        return True
    if os.environ.get(RELAY_VARIABLE) == "relay":
        hidden_roots.add(root)
        return False
    key = (root, link.probe)
    seen = _seen.get(key)
    if seen is None:
        global probes
        with _lock:
            seen = _seen.get(key)
            if seen is None:
                try:
                    seen = os.path.isfile(probe_path(root, link.probe))
                except (OSError, ValueError):
                    seen = False
                probes += 1
                _seen[key] = seen
                (hidden_roots.discard if seen else hidden_roots.add)(root)
    return seen


def _worker() -> Any:
    """This process's Dask worker (raises ValueError outside one)."""
    from distributed import get_worker

    return get_worker()


# -- results of missed tasks ---------------------------------------------------------------------------


@dataclass
class _Stashed:
    record: dict[str, Any]
    frames: list[bytes]
    nbytes: int
    at: float = field(default_factory=time.monotonic)
    taken: threading.Event = field(default_factory=threading.Event)


RELAYED_REFS = frozenset({"task-checkpoints"})
"""Ref namespaces, besides the task results', that workers write and read through the kernel
(`nbrewind.tasks.resume`'s checkpoints). A record's ``ref`` names one; ``drop`` deletes the ref."""


_stash: dict[str, _Stashed] = {}
_stash_bytes = 0
_ids = itertools.count()


def stash_result(
    link: StoreLink, fingerprint: str, value: object, record: Mapping[str, Any], *, ref: str | None = None, wait: float = 0.0
) -> bool:
    """Pickle ``value`` and hold it until the kernel takes it; True if it was handed over.

    The buffers are copied: a later task that changes the value in place must not
    change what is stored. Raises what pickling raises. The kernel stores it under the
    task results' ref, or under ``ref`` (one of `RELAYED_REFS`). With ``wait``, returns
    only once the kernel took it (raises TaskCacheError after ``wait`` seconds): a
    checkpoint must outlive this worker.
    """
    payload, buffers = pickle_frames(value)
    frames = [payload, *(bytes(b) for b in buffers)]
    return _hand_over(link, {**record, "fingerprint": fingerprint, **({"ref": ref} if ref else {})}, frames, wait)


def drop_ref(link: StoreLink, ref: str, fingerprint: str) -> bool:
    """Ask the kernel to delete the ref ``ref/<fingerprint>`` (a finished task's checkpoint),
    in order after everything this process handed over before."""
    return _hand_over(link, {"fingerprint": fingerprint, "ref": ref, "drop": True}, [], 0.0)


def _hand_over(link: StoreLink, record: dict[str, Any], frames: list[bytes], wait: float) -> bool:
    global _stash_bytes
    worker = _worker()
    nbytes = sum(len(f) for f in frames)
    sid = f"{os.getpid()}-{next(_ids)}"
    now = time.monotonic()
    with _lock:
        while _stash:  # oldest first: the kernel is gone if these were never taken
            oldest = next(iter(_stash))
            if now - _stash[oldest].at <= STASH_MAX_AGE:
                break
            _stash_bytes -= _stash.pop(oldest).nbytes
        if _stash_bytes + nbytes > STASH_LIMIT:
            return False
        stashed = _stash[sid] = _Stashed(record, frames, nbytes)
        _stash_bytes += nbytes
    try:
        worker.log_event(link.topic, {"op": "put", "worker": worker.address, "id": sid, "nbytes": nbytes})
    except Exception:
        _take([sid])
        raise
    if wait > 0 and not stashed.taken.wait(wait):
        if _take([sid]):  # still here: the kernel never came for it
            raise NotTaken(f"the kernel did not take the data within {wait:g} s")
    return True


def _take(ids: Sequence[str]) -> dict[str, tuple[dict[str, Any], list[bytes]]]:
    global _stash_bytes
    out = {}
    with _lock:
        for sid in ids:
            stashed = _stash.pop(sid, None)
            if stashed is not None:
                _stash_bytes -= stashed.nbytes
                out[sid] = (stashed.record, stashed.frames)
                stashed.taken.set()
    return out


def take_results(ids: Sequence[str]) -> dict[str, tuple[dict[str, Any], list[bytes]]]:
    """Run by the kernel (``Client.run``): the stashed results ``ids`` as (record, frames), removed here."""
    return _take(ids)


# -- loads of cached results ---------------------------------------------------------------------------


class NotTaken(TaskCacheError):
    """The kernel did not come for what this worker handed over (it is gone, or stuck)."""


class Abandoned(Exception):
    """The load task waiting for the kernel was cancelled meanwhile: there is nothing to recompute."""


@dataclass
class _Waiting:
    done: threading.Event = field(default_factory=threading.Event)
    frames: list[Any] | None = None
    error: str | None = None


_inbox: dict[str, _Waiting] = {}


def request_entry(link: StoreLink, entry: str, timeout: float | None = None) -> Any:
    """The value stored in ``entry``, read by the kernel and sent here.

    Raises TaskCacheError when the kernel could not read it or did not answer in time,
    and :class:`Abandoned` as soon as the task is cancelled (its client let it go).
    """
    frames = _request(link, {"entry": entry}, f"entry {entry}", timeout)
    if frames is None:
        raise TaskCacheError(f"the kernel could not read entry {entry}")
    return load_frames(frames)


def request_ref(link: StoreLink, ref: str, fingerprint: str, default: Any = None, timeout: float | None = None) -> Any:
    """The value stored under the ref ``ref/<fingerprint>`` (one of `RELAYED_REFS`), read by
    the kernel and sent here; ``default`` when there is no such ref. Raises as `request_entry`."""
    frames = _request(link, {"ref": f"{ref}/{fingerprint}"}, f"ref {ref}/{fingerprint}", timeout)
    return default if frames is None else load_frames(frames)


def _request(link: StoreLink, what: dict[str, str], label: str, timeout: float | None) -> list[Any] | None:
    """Frames the kernel sends for a request; None for a ref it does not hold."""
    worker = _worker()
    key = worker.active_threads.get(threading.get_ident())
    rid = f"{os.getpid()}-{next(_ids)}"
    waiting = _inbox[rid] = _Waiting()
    limit = LOAD_TIMEOUT if timeout is None else timeout
    deadline = time.monotonic() + limit
    try:
        worker.log_event(link.topic, {"op": "get", "worker": worker.address, "id": rid, **what})
        while not waiting.done.wait(0.2):
            if time.monotonic() > deadline:
                raise TaskCacheError(f"the kernel did not send {label} within {limit:g} s")
            if key is not None and _cancelled(worker, key):
                raise Abandoned(key)
    finally:
        _inbox.pop(rid, None)
    if waiting.error is not None:
        raise TaskCacheError(waiting.error)
    return waiting.frames


def _cancelled(worker: Any, key: Any) -> bool:
    """Whether the worker no longer wants ``key``'s result (read without a lock: a stale
    answer only means waiting one more round)."""
    try:
        ts = worker.state.tasks.get(key)
    except Exception:  # another distributed: keep waiting, the deadline still holds
        return False
    return ts is None or ts.state == "cancelled"


def deliver(replies: Mapping[str, tuple[Any, str | None]], dask_worker: Any = None) -> int:
    """Run by the kernel (``Client.run``): wake the load tasks waiting for these replies;
    returns how many were waiting.

    A reply is (frames, None), or (key, None) for frames the kernel scattered to this
    worker under ``key`` (large entries: scattered data travels out of band, ``Client.run``
    arguments do not), or (None, problem), or (None, None) for a ref the kernel does not hold.
    """
    woken = 0
    for rid, (frames, error) in replies.items():
        waiting = _inbox.get(rid)
        if waiting is None:
            continue
        if isinstance(frames, str):
            try:
                frames = list(dask_worker.data[frames])
            except Exception as exc:  # released or lost meanwhile: the load task recomputes
                frames, error = None, f"the scattered entry is gone ({type(exc).__name__}: {exc})"
        waiting.frames, waiting.error = frames, error
        waiting.done.set()
        woken += 1
    return woken
