"""What a backpack takes from beside the notebook: the local modules its code
cells import, and the input files the audit recorded (``@file:`` inputs)."""

from __future__ import annotations

import ast
import json
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nbrewind.errors import PackError
from nbrewind.pack.manifest import safe_member_path
from nbrewind.store.digest import new_hasher

__all__ = ["DataFile", "code_cells", "data_inputs", "local_modules"]


def code_cells(notebook: Path) -> list[str]:
    """The source of every code cell (read as JSON: nbformat is slow to import)."""
    try:
        nb = json.loads(notebook.read_text("utf-8"))
        cells = nb["cells"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise PackError(f"{notebook} is not a readable notebook ({type(exc).__name__}: {exc})") from None
    out = []
    for cell in cells:
        if isinstance(cell, dict) and cell.get("cell_type") == "code":
            source = cell.get("source", "")
            out.append("".join(source) if isinstance(source, list) else str(source))
    return out


def _imported_names(source: str) -> set[str]:
    """Top-level module names of absolute imports; IPython magics and shell lines
    are dropped first, and code that still does not parse contributes nothing."""
    if source.lstrip().startswith("%%"):
        return set()
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    try:
        tree = ast.parse("\n".join(lines))
    except (SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def local_modules(folder: Path, sources: Iterable[str]) -> list[str]:
    """Relative POSIX paths of the ``.py`` files beside the notebook that its
    cells import, followed transitively through those files' own imports."""
    found: set[str] = set()
    todo = [name for source in sources for name in _imported_names(source)]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or not name.isidentifier():
            continue
        seen.add(name)
        files: list[Path] = []
        if (folder / f"{name}.py").is_file():
            files = [folder / f"{name}.py"]
        elif (folder / name / "__init__.py").is_file():
            files = sorted(p for p in (folder / name).rglob("*.py") if "__pycache__" not in p.parts)
        for path in files:
            if path.is_symlink():
                continue
            rel = path.relative_to(folder).as_posix()
            if rel not in found:
                found.add(rel)
                todo.extend(_imported_names(path.read_text("utf-8", errors="replace")))
    return sorted(found)


@dataclass(frozen=True)
class DataFile:
    """An input file the audit recorded, as it is now."""

    path: str
    recorded: str
    size: int | None = None
    sha256: str | None = None
    changed: bool = False
    external: bool = False


def _file_hashes(path: Path) -> tuple[int, str, str]:
    import hashlib

    sha = hashlib.sha256()
    xxh = new_hasher()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            sha.update(chunk)
            xxh.update(chunk)
            size += len(chunk)
    return size, sha.hexdigest(), xxh.hexdigest()


def data_inputs(folder: Path, inputs: Iterable[dict[str, str] | None], skip_top: Iterable[str]) -> list[DataFile]:
    """The files cell runs recorded as read (``@file:<path>`` inputs that existed),
    newest record winning. Paths are relative to the notebook's folder (the
    kernel's start folder); an absolute or escaping path is ``external`` and is
    never packed. Files under ``skip_top`` (the store) are left out."""
    recorded: dict[str, str] = {}
    for run_inputs in inputs:
        for key, digest in (run_inputs or {}).items():
            if key.startswith("@file:") and digest != "absent":
                recorded[key[6:]] = digest
    skip = set(skip_top)
    out: list[DataFile] = []
    for raw, digest in sorted(recorded.items()):
        rel = posixpath.normpath(raw)
        if raw.startswith("/") or safe_member_path(f"data/{rel}") is not None:
            out.append(DataFile(raw, digest, external=True))
            continue
        if rel.split("/", 1)[0] in skip:
            continue
        path = folder / rel
        if not path.is_file() or path.is_symlink():
            out.append(DataFile(rel, digest))
            continue
        size, sha, xxh = _file_hashes(path)
        out.append(DataFile(rel, digest, size, sha, changed=xxh != digest))
    return out
