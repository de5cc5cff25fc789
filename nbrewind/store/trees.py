"""The byte layout of trees and blobs, shared by the writing and reading halves of
`ObjectStore`: a tree is ``TREE_MAGIC``, the child count, one child digest per line,
then a payload; a blob is 2 MiB chunks under a chunk-list tree."""

from __future__ import annotations

import json
from collections.abc import Sequence

import zstandard

from nbrewind.store import frame
from nbrewind.store.digest import DIGEST_LENGTH, digest_bytes, is_digest

__all__ = ["BLOB_CHUNK_SIZE", "REHASH_LIMIT", "TREE_MAGIC"]

BLOB_CHUNK_SIZE = 2 * 1024 * 1024
TREE_MAGIC = b"NBRTREE1\n"
# A put that finds its object present re-hashes a file up to this size (header
# included); larger ones (blob chunks) get the header and length check only.
REHASH_LIMIT = 64 * 1024


def as_bytes_view(data: object) -> memoryview:
    """A flat byte view of any buffer; non-contiguous buffers are copied in C order."""
    view = memoryview(data)  # type: ignore[arg-type]  # any buffer-protocol object
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def encode_tree(children: Sequence[str], payload: bytes) -> bytes:
    for child in children:
        if not is_digest(child):
            raise ValueError(f"tree child {child!r} is not a digest")
    body = "".join(f"{child}\n" for child in children)
    return b"".join((TREE_MAGIC, b"%d\n" % len(children), body.encode("ascii"), payload))


def decode_tree(content: bytes) -> tuple[list[str], bytes] | None:
    if not content.startswith(TREE_MAGIC):
        return None
    start = len(TREE_MAGIC)
    newline = content.find(b"\n", start)
    count_text = content[start:newline]
    if newline < 0 or not count_text.isdigit():
        return None
    count = int(count_text)
    pos = newline + 1
    end = pos + count * (DIGEST_LENGTH + 1)
    if len(content) < end:
        return None
    listing = content[pos:end].decode("ascii", errors="replace").split("\n")[:-1]
    if len(listing) != count or not all(is_digest(child) for child in listing):
        return None
    return listing, content[end:]


def checked_header(head: bytes, stored: int, size: int | None) -> frame.FrameHeader | None:
    """The header of an object file when it decodes and agrees with the file's
    length ``stored`` and the expected content ``size``; else None."""
    header = frame.decode_header(head)
    if header is None:
        return None
    declared = frame.content_size(header.codec, stored, head[frame.HEADER_SIZE :])
    if declared is None or (size is not None and declared != size):
        return None
    if header.codec == frame.CODEC_ZSTD and not frame.plausible_size(declared, stored - frame.HEADER_SIZE):
        return None
    return header


def content_matches(header: frame.FrameHeader, raw: bytes, digest: str) -> bool:
    """Whether the whole object file ``raw`` hashes to ``digest`` (and, flagged as a
    tree, holds one); a compressed one that would decode to more than
    ``REHASH_LIMIT`` bytes is not decoded (True)."""
    content: bytes | memoryview = memoryview(raw)[frame.HEADER_SIZE :]
    if header.codec == frame.CODEC_ZSTD:
        if zstandard.frame_content_size(content) > REHASH_LIMIT:
            return True  # cheap checks only, like any large object
        try:
            content = frame.decompress(bytes(content))
        except zstandard.ZstdError:
            return False
    if digest_bytes(content) != digest:
        return False
    return header.kind != frame.KIND_TREE or decode_tree(bytes(content)) is not None


def blob_payload(size: int) -> bytes:
    # Sorted, compact JSON: identical data must always give an identical tree digest.
    return json.dumps(
        {"blob": 1, "chunk_size": BLOB_CHUNK_SIZE, "size": size},
        sort_keys=True,
        separators=(",", ":"),
    ).encode("ascii")
