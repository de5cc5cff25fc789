"""Reading a backpack archive safely, for ``unpack`` and ``verify``.

One streaming pass: the first entry must be the manifest, which is parsed and
checked (format, version, checksum, safe layout) before anything else is read.
From then on the decompressed stream is capped at what the manifest declares
plus tar's own overhead, so a decompression bomb stops early. Every entry must
be a regular file listed in the manifest, with the declared size and SHA-256;
links, devices, FIFOs, unlisted, duplicate, absolute and ``..`` entries are
problems and are never handed to the sink. Every problem is collected, not
just the first; damage that makes the rest unreadable ends the pass.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import zstandard

from nbrewind.errors import PackError
from nbrewind.pack.manifest import MANIFEST_MAX_BYTES, MANIFEST_PATH, FileEntry, Manifest, parse_manifest, safe_member_path

__all__ = ["ScanResult", "Sink", "scan_archive"]

# Per entry: a header block, padding, and a GNU long-name header with its data.
_ENTRY_OVERHEAD = 512 + 511 + 512 + 4096
_END_SLACK = 64 * 1024

Sink = Callable[[FileEntry], BinaryIO]
Progress = Callable[[int, int], None]


@dataclass
class ScanResult:
    """What one pass over an archive found."""

    manifest: Manifest | None = None
    manifest_sha256: str | None = None
    manifest_bytes: bytes = b""
    checked: int = 0
    bytes: int = 0
    problems: list[str] = field(default_factory=list)


class _CappedReader:
    """The decompressed stream, refusing to yield more than ``cap`` bytes."""

    def __init__(self, raw: BinaryIO, cap: int) -> None:
        self._raw = raw
        self.cap = cap
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        allowed = self.cap - self.count + 1
        data = self._raw.read(allowed if size < 0 else min(size, allowed))
        self.count += len(data)
        if self.count > self.cap:
            raise PackError(
                f"the archive decompresses to more than the {self.cap:,} bytes its manifest accounts for "
                f"(a decompression bomb or a damaged archive); nothing was unpacked"
            )
        return data


class _Fatal(Exception):
    """The rest of the archive cannot be read."""


def _kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return f"a symbolic link (to {member.linkname!r})"
    if member.islnk():
        return f"a hard link (to {member.linkname!r})"
    if member.ischr() or member.isblk():
        return "a device file"
    if member.isfifo():
        return "a FIFO"
    return f"an entry of tar type {member.type!r}"


def scan_archive(
    path: str | os.PathLike[str],
    sink: Sink | None = None,
    *,
    on_manifest: Callable[[Manifest], None] | None = None,
    progress: Progress | None = None,
) -> ScanResult:
    """Read and check the whole archive; hand each verified-so-far entry's bytes
    to ``sink`` (a file the caller opened; the caller discards everything if
    any problem is found). ``on_manifest`` may raise PackError to stop early."""
    result = ScanResult()
    archive = Path(path)
    try:
        handle = open(archive, "rb")
    except OSError as exc:
        raise PackError(f"cannot open the backpack {archive}: {exc}") from exc
    with handle:
        capped = _CappedReader(zstandard.ZstdDecompressor().stream_reader(handle), MANIFEST_MAX_BYTES + _END_SLACK)
        try:
            _scan(capped, result, sink, on_manifest, progress)
        except _Fatal as exc:
            result.problems.append(str(exc))
        except PackError as exc:
            result.problems.append(str(exc))
        except (tarfile.TarError, zstandard.ZstdError, EOFError) as exc:
            result.problems.append(f"the archive is truncated or damaged ({type(exc).__name__}: {exc})")
        except OSError as exc:
            raise PackError(f"could not read {archive} or write what it holds: {exc}") from exc
    return result


def _scan(
    capped: _CappedReader,
    result: ScanResult,
    sink: Sink | None,
    on_manifest: Callable[[Manifest], None] | None,
    progress: Progress | None,
) -> None:
    tar = tarfile.open(fileobj=capped, mode="r|")  # type: ignore[call-overload]
    manifest, first = _read_manifest(tar, result)
    if on_manifest is not None:
        on_manifest(manifest)
    expected = {f.path: f for f in manifest.files}
    capped.cap = capped.count + manifest.total_size + _ENTRY_OVERHEAD * (len(expected) + 1) + _END_SLACK
    seen: set[str] = set()
    total = manifest.total_size
    for member in tar:
        if member is first:
            continue  # iterating a TarFile yields the members already read, too
        name = member.name
        why = safe_member_path(name.rstrip("/") if member.isdir() else name)
        if why is not None:
            result.problems.append(f"refused entry {name!r}: {why}")
            continue
        if member.isdir():
            continue  # folders come from the files' paths
        if not member.isreg():
            result.problems.append(f"refused entry {name!r}: {_kind(member)}; backpacks hold regular files only")
            continue
        entry = expected.get(name)
        if entry is None:
            result.problems.append(f"extra file {name!r} is not in the manifest")
            continue
        if name in seen:
            result.problems.append(f"{name} appears twice in the archive")
            continue
        seen.add(name)
        if member.size != entry.size:
            result.problems.append(f"{name}: {member.size:,} bytes in the archive, {entry.size:,} in the manifest")
            continue
        _copy_member(tar, member, entry, result, sink)
        if progress is not None:
            progress(result.bytes, total)
    for name in sorted(set(expected) - seen):
        result.problems.append(f"{name} is in the manifest but missing from the archive (truncated?)")


def _read_manifest(tar: tarfile.TarFile, result: ScanResult) -> tuple[Manifest, tarfile.TarInfo]:
    first = tar.next()
    if first is None:
        raise _Fatal("the archive is empty or truncated: it holds no manifest")
    if first.name != MANIFEST_PATH or not first.isreg():
        raise _Fatal(f"the archive's first entry is {first.name!r}, not {MANIFEST_PATH}: not an NBRewind backpack")
    if first.size > MANIFEST_MAX_BYTES:
        raise _Fatal(f"the manifest claims {first.size:,} bytes, more than the {MANIFEST_MAX_BYTES:,} allowed")
    stream = tar.extractfile(first)
    assert stream is not None
    data = stream.read()
    if len(data) != first.size:
        raise _Fatal("the archive is truncated inside the manifest")
    result.manifest_sha256 = hashlib.sha256(data).hexdigest()
    result.manifest_bytes = data
    try:
        manifest = parse_manifest(data)
    except PackError as exc:
        raise _Fatal(str(exc)) from None
    result.manifest = manifest
    return manifest, first


def _copy_member(
    tar: tarfile.TarFile, member: tarfile.TarInfo, entry: FileEntry, result: ScanResult, sink: Sink | None
) -> None:
    stream = tar.extractfile(member)
    assert stream is not None
    sha = hashlib.sha256()
    size = 0
    target = sink(entry) if sink is not None else None
    try:
        while chunk := stream.read(1 << 20):
            sha.update(chunk)
            size += len(chunk)
            if target is not None:
                target.write(chunk)
    finally:
        if target is not None:
            target.close()
    result.bytes += size
    result.checked += 1
    if size != entry.size:
        raise _Fatal(f"the archive is truncated inside {entry.path}")
    if sha.hexdigest() != entry.sha256:
        result.problems.append(f"{entry.path}: SHA-256 does not match the manifest (damaged or altered)")
