"""The on-disk frame of one object: a small header, then raw or zstd bytes.

Header (8 bytes): ``b"NBRO"``, format version 1, codec, kind, one reserved byte.
The digest is always taken over the *decoded* content, so how an object happens
to be stored (raw or compressed) never changes its name.

Compression is adaptive: a sample of at most 64 KiB is compressed first and the
whole object is compressed only when the sample shrinks enough. Random float64
(about 1.04x under zstd) is therefore written raw after compressing 64 KiB, not
all of it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import zstandard

__all__ = [
    "CODEC_RAW",
    "CODEC_ZSTD",
    "HEADER_SIZE",
    "KIND_LEAF",
    "KIND_TREE",
    "FrameHeader",
    "content_size",
    "decode_header",
    "decompress",
    "decompress_into",
    "encode",
    "encode_header",
    "plausible_size",
]

MAGIC = b"NBRO"
FORMAT_VERSION = 1
HEADER_SIZE = 8

CODEC_RAW = 0
CODEC_ZSTD = 1
KIND_LEAF = 0
KIND_TREE = 1

# Below this size a zstd frame's own overhead eats any gain.
MIN_COMPRESS_SIZE = 256
SAMPLE_SIZE = 64 * 1024
_SAMPLE_PIECES = 4
# Compress the whole object only if the sample shrank to at most this fraction...
SAMPLE_RATIO = 0.90
# ...and keep the compressed form only if the whole shrank to at most this one.
KEEP_RATIO = 0.95

_local = threading.local()


@dataclass(frozen=True)
class FrameHeader:
    """A decoded object header."""

    codec: int
    kind: int


def encode_header(codec: int, kind: int) -> bytes:
    """Return the 8-byte header for an object of this codec and kind."""
    return MAGIC + bytes((FORMAT_VERSION, codec, kind, 0))


def decode_header(raw: bytes) -> FrameHeader | None:
    """Decode the first 8 bytes of an object file; None when they are not a valid
    header (truncated file, foreign file, unknown codec or version, or a reserved
    byte that is not zero). Every one of the 8 bytes is checked, so a bit flip
    anywhere in the header is detected."""
    if len(raw) < HEADER_SIZE or raw[:4] != MAGIC or raw[4] != FORMAT_VERSION or raw[7] != 0:
        return None
    codec, kind = raw[5], raw[6]
    if codec not in (CODEC_RAW, CODEC_ZSTD) or kind not in (KIND_LEAF, KIND_TREE):
        return None
    return FrameHeader(codec=codec, kind=kind)


def _compressor(level: int) -> zstandard.ZstdCompressor:
    # A ZstdCompressor must not be used by two threads at once; keep one per thread
    # and level so repeated small puts do not rebuild the zstd context.
    cache: dict[int, zstandard.ZstdCompressor] | None = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    comp = cache.get(level)
    if comp is None:
        comp = cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return comp


def _sample(view: memoryview) -> bytes | memoryview:
    """Up to SAMPLE_SIZE bytes taken from pieces spread across ``view``, so data
    that starts with a compressible header but is random after it is judged by
    its bulk, not its start."""
    n = len(view)
    if n <= SAMPLE_SIZE:
        return view
    piece = SAMPLE_SIZE // _SAMPLE_PIECES
    step = (n - piece) // (_SAMPLE_PIECES - 1)
    return b"".join(view[i * step : i * step + piece] for i in range(_SAMPLE_PIECES))


def encode(view: memoryview, level: int) -> tuple[int, bytes | memoryview]:
    """Choose a codec for ``view`` and return ``(codec, payload)``.

    The payload is ``view`` itself (no copy) when stored raw.
    """
    n = len(view)
    if n < MIN_COMPRESS_SIZE:
        return CODEC_RAW, view
    comp = _compressor(level)
    sample = _sample(view)
    packed_sample = comp.compress(sample)
    if len(packed_sample) > SAMPLE_RATIO * len(sample):
        return CODEC_RAW, view
    packed = packed_sample if sample is view else comp.compress(view)
    if len(packed) > KEEP_RATIO * n:
        return CODEC_RAW, view
    return CODEC_ZSTD, packed


# A zstd block holds at most 128 KiB and takes at least 4 bytes (an RLE block), so no
# frame decodes to more than this many bytes per payload byte.
_MAX_RATIO = 128 * 1024 // 4


def decompress(payload: bytes) -> bytes:
    """Decode a zstd payload; raises ``zstandard.ZstdError`` on a damaged frame.

    The size the frame header declares is checked against what a payload this
    long can possibly decode to before anything is allocated: a bit flip in that
    field would otherwise ask for terabytes and end in a MemoryError.
    """
    declared = zstandard.frame_content_size(payload)
    if not plausible_size(declared, len(payload)):
        raise zstandard.ZstdError(f"the frame declares {declared} bytes, more than {len(payload)} bytes can hold")
    return _decompressor().decompress(payload)


def decompress_into(payload: bytes | memoryview, target: memoryview) -> bool:
    """Decode a zstd payload straight into ``target``, which it must fill exactly.

    False when it does not: a damaged frame, or one that declares or holds another
    size. The caller then reads the object the slow way, which says what is wrong.
    Nothing here is verified: the caller hashes ``target``.
    """
    try:
        if zstandard.frame_content_size(payload) != len(target):
            return False
        with _decompressor().stream_reader(payload) as reader:
            filled = 0
            while filled < len(target):
                got = reader.readinto(target[filled:])
                if not got:
                    return False  # the frame ended early
                filled += got
            return reader.read(1) == b""
    except zstandard.ZstdError:
        return False


def _decompressor() -> zstandard.ZstdDecompressor:
    # Making a decompression context costs more than decoding a small object.
    decompressor: zstandard.ZstdDecompressor | None = getattr(_local, "decompressor", None)
    if decompressor is None:
        decompressor = _local.decompressor = zstandard.ZstdDecompressor()
    return decompressor


def plausible_size(declared: int, payload_size: int) -> bool:
    """Whether a zstd payload of ``payload_size`` bytes can decode to ``declared`` bytes."""
    return 0 <= declared <= _MAX_RATIO * payload_size


def content_size(codec: int, stored_size: int, payload_head: bytes) -> int | None:
    """The decoded size of an object from its stored size and the first bytes of
    its payload (at least 18); None when it cannot be told."""
    if codec == CODEC_RAW:
        return stored_size - HEADER_SIZE
    try:
        size = zstandard.frame_content_size(payload_head)
    except zstandard.ZstdError:
        return None
    return size if size >= 0 else None
