"""Helpers for the backpack tests: a small recorded project without kernels, and
rewriting archives member by member (to build damaged or hostile backpacks)."""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any
import tarfile
from pathlib import Path

import zstandard

from nbrewind.store import CellRun, Store, digest_bytes

CSV = b"x,y\n1,2\n3,4\n"


def notebook_json(*sources: str) -> str:
    cells: list[dict[str, Any]] = [
        {"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [], "source": s}
        for i, s in enumerate(sources)
    ]
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def make_project(folder: Path) -> dict[str, str]:
    """A notebook with a local module, an input CSV and a store with two kernel
    sessions; returns the digests of the interesting objects."""
    folder.mkdir(parents=True)
    (folder / "data.csv").write_bytes(CSV)
    (folder / "helpers.py").write_text("import util\n\ndef double(v):\n    return util.twice(v)\n")
    (folder / "util.py").write_text("def twice(v):\n    return 2 * v\n")
    (folder / "unrelated.py").write_text("print('not imported')\n")
    (folder / "nb.ipynb").write_text(
        notebook_json("%matplotlib inline\nimport helpers, os\nfrom pathlib import Path", "rows = open('data.csv').read()")
    )
    with Store.open(folder / "nb.ipynb.nbrewind") as store:
        objects, catalog = store.objects, store.catalog
        old_value = objects.put(b"value of the first session")
        new_value = objects.put(b"value of the second session")
        output_child = objects.put(b"output buffer")
        outputs = objects.put_tree([output_child], b'{"outputs": []}')
        objects.put(b"unreachable garbage")
        file_input = {"@file:data.csv": digest_bytes(CSV), "@file:/usr/lib/elsewhere.zip": "absent"}
        for session, value in (("s1", old_value), ("s2", new_value)):
            run = catalog.add_cell_run(CellRun(
                session=session, kernel="audit", code="rows = 1", code_digest=digest_bytes(b"rows = 1"),
                decision="executed", status="ok", inputs=file_input, outputs=outputs,
            ))
            checkpoint = catalog.add_checkpoint(run, None, {"rows": (value, {"kind": "value"})})
            catalog.set_cell_run_checkpoint(run, checkpoint)
    return {"old": old_value, "new": new_value, "outputs": outputs, "output_child": output_child}


def read_members(archive: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with open(archive, "rb") as handle:
        raw = zstandard.ZstdDecompressor().stream_reader(handle).read()
    out = []
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
        for member in tar.getmembers():
            stream = tar.extractfile(member)
            out.append((member, stream.read() if stream is not None else b""))
    return out


def write_members(archive: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    archive.write_bytes(zstandard.ZstdCompressor().compress(buffer.getvalue()))


def resign(manifest: dict[str, Any]) -> bytes:
    """Manifest bytes with a fresh checksum, as a (hostile) packer would write them."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    body["checksum"] = "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    return json.dumps(body, indent=1, sort_keys=True).encode()


def entry(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info, data
