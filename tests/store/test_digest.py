"""Digests are persisted names: pin them so a release never silently changes them."""

from __future__ import annotations

import pytest

from nbrewind.store import digest_bytes, is_digest, new_hasher

@pytest.mark.parametrize(
    ("data", "expected"),
    [
        # XXH3-128 of the empty input, as published by the xxHash project.
        (b"", "99aa06d3014798d86001c324468d497f"),
        (b"nbrewind", "fd71f02568e3fe19ced2327d79881b8e"),
        (bytes(range(256)) * 16, "03916578969f7a66eb4b7c3707879151"),
        (b"\x00" * (2 * 1024 * 1024), "7b3e6abe1456fd0094e26d8e04364852"),
    ],
)
def test_golden_digests(data: bytes, expected: str) -> None:
    assert digest_bytes(data) == expected


def test_buffer_types_agree() -> None:
    data = bytes(range(200)) * 50
    expected = digest_bytes(data)
    assert digest_bytes(bytearray(data)) == expected
    assert digest_bytes(memoryview(data)) == expected
    assert digest_bytes(memoryview(data)[10:]) == digest_bytes(data[10:])


def test_incremental_hasher_matches_one_shot() -> None:
    data = bytes(range(256)) * 1000
    hasher = new_hasher()
    for start in range(0, len(data), 777):
        hasher.update(data[start : start + 777])
    assert hasher.hexdigest() == digest_bytes(data)


def test_is_digest() -> None:
    assert is_digest(digest_bytes(b"x"))
    assert not is_digest("0" * 31)
    assert not is_digest("0" * 33)
    assert not is_digest("A" * 32)  # uppercase never names an object
    assert not is_digest("../" + "0" * 29)
