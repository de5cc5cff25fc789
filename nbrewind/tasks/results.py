"""Task results as store entries: pickling a value into frames, frames into objects, and back.

A task result lives in the store as an *entry*: a tree object whose first child
is the pickle stream (cloudpickle, protocol 5), whose other children are the
large out-of-band buffers (``put_blob``: chunked, deduplicated by content), and
whose payload is a small JSON record (size, run time, worker, and the local
files the task's fingerprint covered).

Pickling (:func:`pickle_frames`) and writing (:func:`store_frames`) are separate
steps because they may happen in different processes: a worker that cannot see
the store pickles its result and the kernel writes the frames (see ``remote.py``
and ``relay.py``). Likewise :func:`entry_frames` reads an entry's frames where
the store is and :func:`load_frames` unpickles them where the task runs.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Mapping, Sequence
from typing import Any

from nbrewind.errors import NbrewindError
from nbrewind.store import BLOB_CHUNK_SIZE, ObjectStore

__all__ = [
    "ENTRY_FORMAT",
    "OOB_THRESHOLD",
    "TaskCacheError",
    "entry_frames",
    "load_entry",
    "load_frames",
    "pickle_frames",
    "read_entry",
    "store_frames",
    "store_result",
]

ENTRY_FORMAT = "nbrewind-task-result/1"
#: Buffers at least this large leave the pickle stream and are stored (deduplicated) on their own.
OOB_THRESHOLD = 64 * 1024


class TaskCacheError(NbrewindError):
    """A cached task result could not be loaded and there was no way to recompute it."""


def pickle_frames(value: object) -> tuple[bytes, list[memoryview]]:
    """``value`` as a cloudpickle stream (protocol 5) and its out-of-band buffers of
    :data:`OOB_THRESHOLD` bytes or more (views on ``value``'s memory, not copies)."""
    import cloudpickle

    buffers: list[memoryview] = []

    def keep_in_band(pb: pickle.PickleBuffer) -> bool:
        view = pb.raw() if memoryview(pb).contiguous else memoryview(memoryview(pb).tobytes())
        if view.nbytes < OOB_THRESHOLD:
            return True
        buffers.append(view)
        return False

    payload = cloudpickle.dumps(value, protocol=5, buffer_callback=keep_in_band)
    return payload, buffers


def store_frames(
    objects: ObjectStore, payload: bytes, buffers: Sequence[Any], record: Mapping[str, Any]
) -> tuple[str, int]:
    """Store a pickle stream and its buffers as an entry carrying ``record``; return
    (entry digest, nbytes)."""
    if len(payload) <= BLOB_CHUNK_SIZE:
        kind, first = "object", objects.put(payload)
    else:
        kind, first = "blob", objects.put_blob(payload)
    children = [first, *(objects.put_blob(b) for b in buffers)]
    nbytes = len(payload) + sum(memoryview(b).nbytes for b in buffers)
    meta = {"format": ENTRY_FORMAT, "payload": kind, "nbytes": nbytes, **record}
    entry = objects.put_tree(children, json.dumps(meta, sort_keys=True).encode())
    return entry, nbytes


def store_result(objects: ObjectStore, value: object, record: Mapping[str, Any]) -> tuple[str, int]:
    """Pickle ``value`` into the store as an entry; return (entry digest, nbytes).

    Raises whatever pickling or writing raises; callers decide what that means.
    """
    payload, buffers = pickle_frames(value)
    return store_frames(objects, payload, buffers, record)


def read_entry(objects: ObjectStore, entry: str) -> tuple[list[str], dict[str, Any]]:
    """An entry's children and its JSON record (verified)."""
    children, payload = objects.get_tree(entry)
    meta = json.loads(payload)
    if not isinstance(meta, dict) or meta.get("format") != ENTRY_FORMAT or not children:
        raise TaskCacheError(f"object {entry} is not a task result entry")
    return children, meta


def entry_frames(objects: ObjectStore, entry: str) -> list[Any]:
    """The pickle stream and buffers of ``entry``, every object verified against its digest."""
    children, meta = read_entry(objects, entry)
    payload = objects.get(children[0]) if meta["payload"] == "object" else objects.get_blob(children[0])
    return [payload, *(objects.get_blob(d) for d in children[1:])]


def load_frames(frames: Sequence[Any]) -> Any:
    """The value pickled as ``frames`` (a pickle stream, then its out-of-band buffers)."""
    return pickle.loads(frames[0], buffers=frames[1:])


def load_entry(objects: ObjectStore, entry: str) -> Any:
    """The value stored in ``entry``; every object is verified against its digest first."""
    return load_frames(entry_frames(objects, entry))
