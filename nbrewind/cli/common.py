"""What every `jupyter nbrewind` command shares: exit codes, the bad-input error, JSON
and path output, finding and opening the store, checking file arguments, and the
progress line for large backpacks.

The command modules import these; nothing here imports a command module.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nbrewind.errors import NbrewindError

EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 1, 2, 130
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class BadInput(NbrewindError):
    """An argument names something missing or of the wrong kind; nothing was done (exit 2)."""


def json_text(value: Any) -> str:
    """`value` (a dataclass, a list of them, or plain data) as indented JSON for `--json`."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    elif isinstance(value, list):
        value = [dataclasses.asdict(v) if dataclasses.is_dataclass(v) and not isinstance(v, type) else v for v in value]
    return json.dumps(value, indent=2, default=str)


def show(path: Path) -> str:
    """A path as the user would type it: relative to the working directory when inside it."""
    try:
        return str(path.relative_to(Path.cwd())) or "."
    except ValueError:
        return str(path)


def nearby_stores(*folders: Path) -> list[Path]:
    """The stores (``*.nbrewind`` and ``.nbrewind`` folders with a store marker) in these folders."""
    from nbrewind.store.store import MARKER_NAME

    found: list[Path] = []
    for folder in dict.fromkeys(f.absolute() for f in folders):
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            continue
        found += [e for e in entries if e.name.endswith(".nbrewind") and (e / MARKER_NAME).is_file()]
    return found


def find_store(
    store: str | None, target: str | None, environ: Mapping[str, str] | None = None
) -> Path:
    """The store a command works on: ``--store``, then ``NBREWIND_STORE``, then the
    notebook (or store folder) named on the command line (``NB`` means ``NB.nbrewind``),
    then ``./.nbrewind``. Raises BadInput saying what was tried and which stores are
    nearby when the chosen one does not exist or is not a store."""
    from nbrewind.store.store import MARKER_NAME

    env = os.environ if environ is None else environ
    given = Path(target).expanduser().absolute() if target else None
    if store:
        path, source = Path(store).expanduser().absolute(), "--store"
    elif given is not None and given.is_dir() and ((given / MARKER_NAME).is_file() or given.name.endswith(".nbrewind")):
        path, source = given, "the store folder given"  # a store named on the command line is as explicit as --store
    elif env.get("NBREWIND_STORE"):
        path, source = Path(env["NBREWIND_STORE"]).expanduser().absolute(), "NBREWIND_STORE"
    elif given is not None:
        if given.suffix == ".ipynb":
            path, source = given.with_name(given.name + ".nbrewind"), f"the notebook {show(given)}"
            if not given.exists() and not path.exists():
                raise BadInput(f"{show(given)} does not exist (and neither does its store {show(path)})")
        elif given.is_dir():
            raise BadInput(f"{show(given)} is a folder but not an NBRewind store (no {MARKER_NAME})"
                           + _nearby_hint(given))
        elif given.exists():
            raise BadInput(f"{show(given)} is neither a notebook (.ipynb) nor a store folder")
        else:
            raise BadInput(f"{show(given)} does not exist")
    else:
        path, source = Path.cwd() / ".nbrewind", "the default"
    if not path.exists():
        folders = [Path.cwd(), *([Path(target).absolute().parent] if target else [])]
        raise BadInput(f"no store: {show(path)} ({source}) does not exist" + _nearby_hint(*folders))
    if not (path / MARKER_NAME).is_file():
        raise BadInput(f"{show(path)} is not an NBRewind store (no {MARKER_NAME}; store from {source})"
                       + _nearby_hint(path.parent))
    return path


def _nearby_hint(*folders: Path) -> str:
    stores = nearby_stores(*folders)
    if not stores:
        return "; no *.nbrewind store nearby: run the notebook on the audit kernel first"
    names = ", ".join(show(s) for s in stores[:5]) + (", ..." if len(stores) > 5 else "")
    return f"; stores nearby: {names} (name one with --store, or pass its notebook)"


def open_store(args: argparse.Namespace, *, readonly: bool = True) -> Any:
    """The store `args` name (``--store`` and the optional target), opened; not created."""
    from nbrewind.store import Store

    path = find_store(args.store, getattr(args, "target", None))
    return Store.open(path, create=False, readonly=readonly)


def is_backpack_folder(path: Path) -> bool:
    """An unpacked backpack (working folder, its store, or a plain tar extraction)."""
    from nbrewind.store.origin import MANIFEST_NAME

    return path.is_dir() and (
        (path / "nbrewind" / MANIFEST_NAME).is_file()
        or (path / MANIFEST_NAME).is_file()
        or any(path.glob(f"*.nbrewind/{MANIFEST_NAME}"))
    )


def check_backpack_file(path: Path) -> None:
    """BadInput unless `path` exists and is named like a backpack or starts like one (a
    zstd stream). A .tar.zst that fails verification is a damaged backpack, reported by
    the verification itself (exit 1), not a wrong argument."""
    if not path.exists():
        raise BadInput(f"{show(path)} does not exist")
    if path.is_dir() or path.name.endswith((".tar.zst", ".tzst")):
        return
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head != ZSTD_MAGIC:
        raise BadInput(f"{show(path)} is not a backpack (a .tar.zst archive made by `jupyter nbrewind pack`)")


def check_notebook(path: str) -> Path:
    """BadInput unless `path` is an existing .ipynb file."""
    given = Path(path)
    if not given.exists():
        raise BadInput(f"{show(given.absolute())} does not exist")
    if given.is_dir() or given.suffix != ".ipynb":
        raise BadInput(f"{show(given.absolute())} is not a notebook: expected an .ipynb file")
    return given


def progress(label: str, quiet: bool, threshold: int = 64 * 1024 * 1024) -> Callable[[int, int], None]:
    """A callback printing a percentage line on stderr, for large backpacks only."""
    shown = [-1]

    def report(done: int, total: int) -> None:
        if quiet or total < threshold:
            return
        percent = min(100, done * 100 // max(total, 1))
        if percent != shown[0]:
            shown[0] = percent
            end = "\n" if percent == 100 else ""
            print(f"\r{label}: {percent:3d}% of {total:,} bytes", end=end, file=sys.stderr, flush=True)

    return report
