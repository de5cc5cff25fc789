"""Stage and load groups of co-variables as store objects.

A group becomes one tree object: its children are the chunked blobs of the
pickle's out-of-band buffers (one per buffer segment, so an unchanged array or
column is a blob that already exists and costs nothing), its payload is a small
header plus the pickle stream. Every byte is verified by the store before it is
unpickled.
"""

from __future__ import annotations

import functools
import json
import struct
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nbrewind.checkpoint.serialize import Unserializable, pickle_group, unpickle_group
from nbrewind.store.objects import ObjectStore, StagedBlob

_MAGIC = b"NBRV1"


@dataclass(frozen=True)
class StagedGroup:
    """A group hashed (its digest known), to be written later by `commit`."""

    digest: str
    blobs: tuple[StagedBlob, ...]
    tree: StagedBlob

    @property
    def new_bytes(self) -> int:
        return sum(b.new_bytes for b in self.blobs) + len(self.tree.tree)

    def commit(self, objects: ObjectStore) -> None:
        for blob in self.blobs:
            objects.commit(blob)
        objects.commit(self.tree)


def stage_group(objects: ObjectStore, mapping: Mapping[str, object]) -> StagedGroup | Unserializable:
    """Pickle `mapping` as one group and stage it: its digest is known now, the
    bytes are written by `StagedGroup.commit` (on the session's writer thread).

    The store copies and re-checks each new chunk when it commits, so the next
    cell may mutate the live objects while the write is still in flight.
    """
    pickled = pickle_group(mapping)
    if isinstance(pickled, Unserializable):
        return pickled
    blobs: list[StagedBlob] = []
    counts: list[int] = []
    for index in range(len(pickled.buffers)):
        segments = pickled.buffer_segments(index)
        counts.append(len(segments))
        blobs.extend(objects.stage_blob(segment) for segment in segments)
    header = json.dumps({"segments": counts}).encode()
    payload = _MAGIC + struct.pack("<I", len(header)) + header + pickled.payload
    tree = objects.stage_tree([b.digest for b in blobs], payload)
    return StagedGroup(tree.digest, tuple(blobs), tree)


def load_group(objects: ObjectStore, digest: str) -> dict[str, object]:
    """Load and unpickle the group stored under `digest` (every object verified first)."""
    children, payload = objects.get_tree(digest)
    if not payload.startswith(_MAGIC):
        raise ValueError(f"object {digest} is not a stored value group")
    (size,) = struct.unpack_from("<I", payload, len(_MAGIC))
    start = len(_MAGIC) + 4
    header: dict[str, Any] = json.loads(payload[start : start + size])
    stream = payload[start + size :]
    numpy = sys.modules.get("numpy")  # never imported here: only if the notebook did
    allocate = None if numpy is None else functools.partial(numpy.empty, dtype=numpy.uint8)
    # A buffer stored in several segments (one per pandas block row) is read straight
    # into one new buffer, chunk by chunk, each chunk verified as it is read.
    segments, position = [], 0
    for count in header["segments"]:
        segments.append(children[position : position + count])
        position += count
    buffers = objects.get_blobs(segments, allocate)
    return unpickle_group(stream, buffers, adopt=allocate is not None)


def stage_json(objects: ObjectStore, doc: Mapping[str, Any], children: Iterable[str] = ()) -> StagedBlob:
    """A small JSON document (a module reference, an Unserializable record), staged as a
    tree so it is written with the rest of its checkpoint.

    `children` are the digests the document refers to (a rebuild record's pre-cell
    state, that state's values): as the tree's children they are what gc keeps,
    du counts, verify checks and pack ships. They must be committed before it.
    """
    return objects.stage_tree(sorted(set(children)), json.dumps(doc, sort_keys=True).encode())


def load_json(objects: ObjectStore, digest: str) -> dict[str, Any]:
    """The document `stage_json` stored under `digest` (verified)."""
    _, payload = objects.get_tree(digest)
    result: dict[str, Any] = json.loads(payload)
    return result
