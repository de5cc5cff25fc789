"""``pack``: one deterministic tar + zstd archive of a notebook and its store.

Deterministic means the same notebook, store, data and environment give the
same bytes: entries in a fixed order (the manifest first, then sorted paths),
regular files only, fixed mtime, owner and mode, GNU tar headers (no pax
timestamps), single-threaded zstd, and a catalog copy rebuilt with VACUUM.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import zstandard

from nbrewind._version import __version__
from nbrewind.errors import PackError
from nbrewind.pack import env
from nbrewind.pack.inputs import DataFile, code_cells, data_inputs, local_modules
from nbrewind.pack.manifest import DATA_INDEX, MANIFEST_PATH, FileEntry, Manifest, layout_problems, yaml_records
from nbrewind.store import Catalog, Record, Store, records
from nbrewind.store.walk import walk
from nbrewind.store.origin import is_trusted, sign_catalog
from nbrewind.store.store import CATALOG_NAME, MARKER_NAME

__all__ = ["FIXED_MTIME", "PackResult", "Progress", "pack"]

FIXED_MTIME = 946684800  # 2000-01-01T00:00:00Z
ZSTD_LEVEL = 3
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class PackResult:
    """What ``pack`` wrote."""

    archive: str
    notebook: str
    manifest_sha256: str
    files: int
    bytes: int
    archive_bytes: int
    objects: int
    cell_runs: int
    modules: list[str] = field(default_factory=list)
    data_files: list[str] = field(default_factory=list)
    data_included: bool = False
    warnings: list[str] = field(default_factory=list)
    trusted: bool = False
    """Whether unpacking it here needs no ``trust`` (the packed store was signed by this user)."""


Source = Path | bytes


def pack(
    notebook: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    include_data: bool = False,
    history: str = "all",
    store: str | os.PathLike[str] | None = None,
    trust: bool = True,
    progress: Progress | None = None,
) -> PackResult:
    """Pack ``notebook`` with its store (default ``<notebook>.nbrewind`` beside it).

    ``history="latest"`` keeps only the newest kernel session's cell runs and
    what they reach. With ``trust``, and when this user signed the store, the
    packed catalog is signed beside this manifest, so unpacking the backpack here
    needs no ``trust``; packing someone else's store never makes it trusted.
    """
    nb_path = Path(notebook).absolute()
    if not nb_path.is_file() or nb_path.suffix != ".ipynb":
        raise PackError(f"{nb_path} is not a notebook file (.ipynb)")
    if history not in ("all", "latest"):
        raise PackError(f"history must be 'all' or 'latest', not {history!r}")
    folder = nb_path.parent
    store_path = Path(store).absolute() if store is not None else nb_path.with_name(nb_path.name + ".nbrewind")
    out = Path(output).absolute() if output is not None else folder / f"{nb_path.stem}.backpack.tar.zst"
    warnings: list[str] = []
    with contextlib.ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nbrewind-pack-")))
        opened = stack.enter_context(Store.open(store_path, create=False, readonly=True))
        catalog_copy = scratch / CATALOG_NAME
        _copy_catalog(opened.catalog.path, catalog_copy, history)
        with Catalog(catalog_copy, readonly=True) as kept:
            runs = kept.cell_runs()
            roots = records(kept, opened.objects)  # the kept history's records and every ref file
            workers = [t.worker or "" for t in kept.task_log()]
        sources: dict[str, Source] = {
            f"nbrewind/{MARKER_NAME}": opened.root / MARKER_NAME,
            f"nbrewind/{CATALOG_NAME}": catalog_copy,
        }
        for namespace in opened.objects.ref_namespaces():
            for name, digest in opened.objects.iter_refs(namespace, trusted_only=True):
                sources[f"nbrewind/refs/{namespace}/{name[:2]}/{name}"] = opened.objects.refs_dir / namespace / name[:2] / name
        objects = _reachable(opened, roots)
        for digest in objects:
            sources[f"nbrewind/objects/{digest[:2]}/{digest[2:]}"] = opened.objects.path_of(digest)

        sources[f"workflow/{nb_path.name}"] = nb_path
        modules = local_modules(folder, code_cells(nb_path))
        for rel in modules:
            sources[f"workflow/{rel}"] = folder / rel
        data = data_inputs(folder, (r.inputs for r in runs), skip_top=(store_path.name, out.name))
        sources[DATA_INDEX] = _data_yml(data, include_data, {nb_path.name, *modules}).encode("utf-8")
        for item in data:
            if include_data and item.sha256 and item.path not in modules and item.path != nb_path.name:
                sources[f"data/{item.path}"] = folder / item.path
            if item.changed:
                warnings.append(f"{item.path} changed since the audit read it; a repeat re-runs the cells that read it")
            if item.external:
                warnings.append(f"{item.path} is outside the notebook's folder and is not packed")
            elif item.sha256 is None:
                warnings.append(f"{item.path} was read by the audit but no longer exists")
        sources["software/requirements.txt"] = env.requirements_txt().encode("utf-8")
        sources["software/environment.yml"] = env.environment_yml(nb_path.stem).encode("utf-8")
        sources["compute/compute.yml"] = env.compute_yml(workers).encode("utf-8")

        entries = [_describe(path, src) for path, src in sorted(sources.items())]
        manifest = Manifest(
            notebook=nb_path.name,
            nbrewind_version=__version__,
            history=history,
            include_data=include_data,
            files=entries,
            cell_runs=[_run_index(r) for r in runs],
        )
        problems = layout_problems(manifest)
        if problems:
            raise PackError("cannot pack: " + "; ".join(problems))
        manifest_bytes = manifest.to_bytes()
        _write_archive(out, manifest_bytes, sources, entries, progress)
        digest = hashlib.sha256(manifest_bytes).hexdigest()
        trusted = trust and is_trusted(opened.root)
        if trusted:
            sign_catalog(catalog_copy, digest, f"packed here: {out}")
    return PackResult(
        archive=str(out),
        notebook=str(nb_path),
        manifest_sha256=digest,
        files=len(entries) + 1,
        bytes=manifest.total_size + len(manifest_bytes),
        archive_bytes=out.stat().st_size,
        objects=len(objects),
        cell_runs=len(runs),
        modules=modules,
        data_files=[d.path for d in data if not d.external],
        data_included=include_data,
        warnings=warnings,
        trusted=trusted,
    )


def _copy_catalog(source: Path, target: Path, history: str) -> None:
    """A consistent copy through SQLite's backup API (safe while a kernel
    writes), pruned to the newest session for ``latest``, then vacuumed into a
    single rollback-journal file so equal content gives equal bytes."""
    try:
        src = sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True)
        dst = sqlite3.connect(target, isolation_level=None)
        try:
            src.backup(dst)
            dst.execute("PRAGMA journal_mode = DELETE")
            if history == "latest":
                _prune_to_latest(dst)
            dst.execute("VACUUM")
        finally:
            src.close()
            dst.close()
    except sqlite3.Error as exc:
        raise PackError(f"could not copy the catalog {source}: {exc}") from exc


def _prune_to_latest(db: sqlite3.Connection) -> None:
    row = db.execute("SELECT session FROM cell_runs ORDER BY id DESC LIMIT 1").fetchone()
    if row is None:
        return
    kept = "(SELECT id FROM cell_runs)"
    dropped_checkpoints = f"SELECT id FROM checkpoints WHERE cell_run_id IS NULL OR cell_run_id NOT IN {kept}"
    for statement, params in (
        ("DELETE FROM cell_runs WHERE session IS NOT ?", (row[0],)),
        (f"DELETE FROM checkpoint_entries WHERE checkpoint_id IN ({dropped_checkpoints})", ()),
        (f"DELETE FROM checkpoints WHERE id IN ({dropped_checkpoints})", ()),
        ("UPDATE checkpoints SET parent_id = NULL WHERE parent_id NOT IN (SELECT id FROM checkpoints)", ()),
        (f"DELETE FROM task_log WHERE cell_run_id IS NOT NULL AND cell_run_id NOT IN {kept}", ()),
    ):
        db.execute(statement, params)


def _reachable(store: Store, roots: list[Record]) -> list[str]:
    """Every object the records reach (the same walk as gc and verify), each
    verified; a missing or damaged object stops the pack (the backpack would not
    replay), naming the record it breaks."""
    reached = walk(store.objects, (r.digest for r in roots), verify=True)
    if reached.problems:
        broken = next(r for r in roots if reached.problems_below(r.digest))
        digest = sorted(reached.problems_below(broken.digest))[0]
        what = f"{broken.kind} record" + (f" {broken.name!r}" if broken.name else "")
        if broken.cell_run_id is not None:
            what += f" of cell run #{broken.cell_run_id}"
        raise PackError(
            f"the store at {store.root} cannot be packed: {len(reached.problems)} object(s) are missing or "
            f"damaged; the {what} reaches {digest} ({reached.problems[digest]}). "
            f"Run `jupyter nbrewind verify {store.root}` for every broken record and what repairs it"
        )
    return sorted(reached.children)


def _data_yml(data: list[DataFile], include: bool, in_workflow: set[str]) -> str:
    records = []
    for item in data:
        if item.external or item.sha256 is None:
            continue
        record: dict[str, object] = {"path": item.path, "size": item.size, "checksum": f"sha256:{item.sha256}"}
        if item.path in in_workflow:
            record["source"] = f"backpack://workflow/{item.path}"
        elif include:
            record["source"] = f"backpack://data/{item.path}"
        records.append(record)
    external = [{"path": d.path, "note": "outside the notebook's folder; not packed"} for d in data if d.external]
    lines = ["# input files the audit read, relative to the notebook's folder (nbrewind pack)"]
    lines += yaml_records("files", records) + yaml_records("external", external)
    return "\n".join(lines) + "\n"


def _run_index(run: object) -> dict[str, object]:
    keep = ("id", "session", "kernel", "execution_count", "cell_id", "code_digest", "decision", "status", "checkpoint_id", "outputs")
    return {name: getattr(run, name) for name in keep}


def _chunks(source: Source) -> Iterator[bytes]:
    if isinstance(source, bytes):
        yield source
        return
    with open(source, "rb") as handle:
        while chunk := handle.read(1 << 20):
            yield chunk


def _describe(path: str, source: Source) -> FileEntry:
    sha = hashlib.sha256()
    size = 0
    try:
        for chunk in _chunks(source):
            sha.update(chunk)
            size += len(chunk)
    except OSError as exc:
        raise PackError(f"cannot read the file for {path}: {exc}") from exc
    return FileEntry(path, size, sha.hexdigest())


class _CheckedReader:
    """Feeds tarfile a source while re-hashing it: a file that changes between
    the manifest and the archive stops the pack instead of shipping a lie."""

    def __init__(self, entry: FileEntry, source: Source, advance: Callable[[int], None]) -> None:
        self.entry = entry
        self._chunks = _chunks(source)
        self._chunk = b""
        self._pos = 0
        self._sha = hashlib.sha256()
        self._advance = advance

    def read(self, size: int = -1) -> bytes:
        pieces: list[bytes] = []
        wanted = size
        while wanted != 0:
            if self._pos >= len(self._chunk):
                chunk = next(self._chunks, None)
                if chunk is None:
                    break
                self._chunk, self._pos = chunk, 0
            end = len(self._chunk) if wanted < 0 else min(len(self._chunk), self._pos + wanted)
            pieces.append(self._chunk[self._pos : end])
            if wanted > 0:
                wanted -= end - self._pos
            self._pos = end
        data = b"".join(pieces)
        self._sha.update(data)
        self._advance(len(data))
        return data

    def check(self) -> None:
        self.read()  # a grown file leaves bytes behind: they change the hash
        if self._sha.hexdigest() != self.entry.sha256:
            raise PackError(f"{self.entry.path} changed while it was being packed; pack again")


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = FIXED_MTIME
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info


def _write_archive(
    out: Path, manifest: bytes, sources: dict[str, Source], entries: list[FileEntry], progress: Progress | None
) -> None:
    total = sum(e.size for e in entries) + len(manifest)
    done = 0

    def advance(count: int) -> None:
        nonlocal done
        done += count
        if progress is not None and count:
            progress(done, total)

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".tmp-", suffix=".tar.zst", dir=out.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            _write_stream(handle, manifest, sources, entries, advance)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_stream(
    handle: BinaryIO, manifest: bytes, sources: dict[str, Source], entries: list[FileEntry], advance: Callable[[int], None]
) -> None:
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True)
    with compressor.stream_writer(handle, closefd=False) as zstream:
        with tarfile.open(fileobj=zstream, mode="w|", format=tarfile.GNU_FORMAT) as tar:
            first = FileEntry(MANIFEST_PATH, len(manifest), hashlib.sha256(manifest).hexdigest())
            for entry, source in [(first, manifest), *((e, sources[e.path]) for e in entries)]:
                reader = _CheckedReader(entry, source, advance)
                try:
                    tar.addfile(_tarinfo(entry.path, entry.size), reader)
                except OSError as exc:
                    raise PackError(f"{entry.path} changed while it was being packed ({exc}); pack again") from exc
                reader.check()
