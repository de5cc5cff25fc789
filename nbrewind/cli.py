"""`jupyter nbrewind ...`: thin commands over library functions that return data.

Each subcommand parses its arguments, calls one function and prints the result as
a table or, with `--json`, as JSON. Commands whose feature has not landed say so
and exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nbrewind._version import __version__
from nbrewind.errors import NbrewindError



def _json(value: Any) -> str:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    elif isinstance(value, list):
        value = [dataclasses.asdict(v) if dataclasses.is_dataclass(v) and not isinstance(v, type) else v for v in value]
    return json.dumps(value, indent=2, default=str)


def _store_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", help="the store folder (default: NBREWIND_STORE, else ./.nbrewind)")


def _open_store(args: argparse.Namespace, *, readonly: bool = True) -> Any:
    from nbrewind.store import Store, resolve_store_path

    path = Path(args.store) if args.store else resolve_store_path()
    return Store.open(path, create=False, readonly=readonly)


def cmd_install(args: argparse.Namespace) -> int:
    from nbrewind.kernelspec import install_kernelspecs

    prefix = sys.prefix if args.sys_prefix else args.prefix
    specs = install_kernelspecs(user=args.user, prefix=prefix)
    if args.json:
        print(_json(specs))
    else:
        for spec in specs:
            print(f"installed {spec.name} in {spec.path} (python: {spec.python})")
    return 0


def cmd_du(args: argparse.Namespace) -> int:
    from nbrewind.store import du

    with _open_store(args) as store:
        report = du(store)
    if args.json:
        print(_json(report))
    else:
        print(f"store:            {store.root}")
        print(f"objects:          {report.objects:,}")
        print(f"stored bytes:     {report.stored_bytes:,}")
        print(f"logical bytes:    {report.logical_bytes:,}")
        print(f"referenced bytes: {report.referenced_bytes:,}")
        print(f"dedup ratio:      {report.dedup_ratio:.2f}x")
        print(f"compression:      {report.compression_ratio:.2f}x")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from nbrewind.store import verify_store
    from nbrewind.store.store import MARKER_NAME

    target = Path(args.target) if args.target else None
    if target is not None and (target.is_file() or _is_backpack_folder(target)):
        from nbrewind.pack import verify

        result = verify(target, progress=_progress("verifying", args.json))
        if args.json:
            print(_json(result))
        else:
            for problem in result.problems:
                print(f"problem: {problem}")
            state = "ok" if result.ok else f"{len(result.problems)} problem(s)"
            print(f"checked {result.checked:,} files ({result.bytes:,} bytes) of the backpack {result.path}: {state}")
        return 0 if result.ok else 1
    if target is not None:
        if not (target / MARKER_NAME).is_file() and target.is_dir():
            print(f"jupyter nbrewind verify: {target} is neither a store nor an unpacked backpack", file=sys.stderr)
            return 1
        args.store = str(target)
    from nbrewind.errors import ReadOnlyStoreError

    try:
        opened = _open_store(args, readonly=False)  # writable, so damaged files are moved aside
    except ReadOnlyStoreError:
        opened = _open_store(args)
    with opened as store:
        report = verify_store(store)
    if args.json:
        print(_json(report))
    else:
        for bad in report.corrupt:
            print(f"corrupt: {bad.digest}: {bad.problem}")
        for digest in report.missing:
            print(f"missing: {digest} (referenced but not in the store)")
        for broken in report.broken:
            print(f"broken: {broken.message}")
        state = "ok" if report.ok else f"{len(report.corrupt)} corrupt, {len(report.missing)} missing"
        print(f"checked {report.checked:,} objects in {store.root}: {state}")
    return 0 if report.ok else 1


def _is_backpack_folder(path: Path) -> bool:
    """An unpacked backpack (working folder, its store, or a plain tar extraction)."""
    from nbrewind.store.origin import MANIFEST_NAME

    return path.is_dir() and (
        (path / "nbrewind" / MANIFEST_NAME).is_file()
        or (path / MANIFEST_NAME).is_file()
        or any(path.glob(f"*.nbrewind/{MANIFEST_NAME}"))
    )


def _progress(label: str, quiet: bool, threshold: int = 64 * 1024 * 1024) -> Any:
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


def cmd_pack(args: argparse.Namespace) -> int:
    from nbrewind.pack import pack

    result = pack(
        args.notebook, args.output, include_data=args.include_data, history=args.history,
        store=args.store, progress=_progress("packing", args.json),
    )
    if args.json:
        print(_json(result))
        return 0
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    data = "included" if result.data_included else "listed in data/data.yml (not included; use --include-data)"
    print(f"packed {result.notebook}: {result.cell_runs} cell runs, {result.objects:,} objects, "
          f"{len(result.modules)} local modules; input data {data}")
    print(f"wrote {result.archive} ({result.archive_bytes:,} bytes; {result.bytes:,} unpacked)")
    print(f"manifest sha256 {result.manifest_sha256}" + (" (trusted on this machine)" if result.trusted else ""))
    if not result.trusted:
        print(f"warning: {result.notebook}'s store is not signed by you here, so the backpack is not trusted here "
              f"either (run `jupyter nbrewind trust` on the store first if it is yours)", file=sys.stderr)
    return 0


def cmd_unpack(args: argparse.Namespace) -> int:
    from nbrewind.pack import unpack

    result = unpack(args.archive, args.dest, progress=_progress("unpacking", args.json))
    if args.json:
        print(_json(result))
        return 0
    print(f"verified and unpacked {result.files} files ({result.bytes:,} bytes) into {result.folder}")
    print(f"notebook: {result.notebook}")
    print(f"store:    {result.store}")
    if result.environment:
        print(f"warning: the environment differs from the backpack's ({len(result.environment)}):", file=sys.stderr)
        for line in result.environment:
            print(f"  {line}", file=sys.stderr)
        print("  the repeat kernel still replays recorded cells; cells that run may behave differently", file=sys.stderr)
    if result.trusted:
        print(f"trusted (packed on this machine). Run: jupyter nbrewind run {result.notebook} --kernel repeat")
    else:
        print("untrusted: the repeat kernel will not load its checkpoints until you run")
        print(f"  jupyter nbrewind trust {result.folder}")
    return 0


def cmd_trust(args: argparse.Namespace) -> int:
    from nbrewind.pack import trust

    result = trust(args.folder)
    if args.json:
        print(_json(result))
    else:
        verb = "trusted" if result.newly_trusted else "already trusted"
        what = f"manifest sha256 {result.manifest_sha256}; " if result.manifest_sha256 else ""
        refs = f"; {result.refs_signed} ref file(s) re-signed" if result.refs_signed else ""
        print(f"{verb}: {result.store} ({what}signature recorded in {result.trust_db}{refs})")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from nbrewind.store import gc

    with _open_store(args, readonly=not args.yes) as store:
        report = gc(store, dry_run=not args.yes)
    if args.json:
        print(_json(report))
    else:
        verb = "removed" if args.yes else "would remove"
        print(f"{verb} {len(report.removed):,} unreachable objects ({report.removed_bytes:,} bytes); {report.reachable:,} reachable kept")
        if not args.yes and report.removed:
            print("run again with --yes to delete them")
    return 0


def cmd_log(args: argparse.Namespace) -> int:
    from nbrewind.store.report import cell_log, format_log

    with _open_store(args) as store:
        rows = cell_log(store, last_session=not args.all)
        tasks = store.catalog.task_log() if args.tasks else []
    if args.json:
        print(_json({"cell_runs": [dataclasses.asdict(r) for r in rows], "tasks": [dataclasses.asdict(t) for t in tasks]}))
        return 0
    print(format_log(rows))
    if args.tasks:
        for t in tasks:
            print(f"task {t.fingerprint[:12]} {t.key_prefix or '':<24} {'hit' if t.hit else 'miss':<4} run #{t.cell_run_id}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from nbrewind.run import default_store, run_notebook

    notice = None if args.kernel == "python3" else _trust_notice(Path(args.store) if args.store else default_store(Path(args.notebook)))
    result = run_notebook(
        args.notebook, kernel=args.kernel, store=args.store, output=args.output,
        timeout=args.timeout, allow_errors=args.allow_errors,
    )
    if args.json:
        print(_json(result))
    else:
        print(f"ran {result.notebook} on {args.kernel} in {result.seconds:.2f} s"
              + (f"; outputs in {result.output}" if result.output else ""))
    if notice:
        print(notice, file=sys.stderr)  # the kernel's own line may be lost among its log
    return 0


def _trust_notice(store: Path) -> str | None:
    """The kernel's message about a store this user has not signed, for the terminal
    (None when it is trusted, new, or too damaged to tell: the kernel reports that)."""
    from nbrewind.store.origin import store_trust, untrusted_message

    try:
        verdict = store_trust(store.resolve())
    except NbrewindError:
        return None
    return None if verdict.trusted else untrusted_message(verdict)


def cmd_demo(args: argparse.Namespace) -> int:
    from nbrewind.demo import format_demo, run_demo

    result = run_demo(args.dir, keep=args.keep)
    print(_json(result) if args.json else format_demo(result))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="jupyter nbrewind", description="Checkpointing Jupyter kernels for Dask notebooks.")
    parser.add_argument("--version", action="version", version=f"nbrewind {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("install", help="write kernelspecs that start this interpreter")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="per-user Jupyter data folder")
    where.add_argument("--sys-prefix", action="store_true", help="this environment's share/jupyter")
    where.add_argument("--prefix", help="PREFIX/share/jupyter/kernels")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_install)

    for name, func, helptext in (
        ("du", cmd_du, "space used: objects, stored and logical bytes, dedup ratio"),
        ("status", cmd_log, "cell runs of the newest kernel session (same as log)"),
    ):
        p = sub.add_parser(name, help=helptext)
        _store_arg(p)
        p.add_argument("--json", action="store_true")
        if name == "status":
            p.add_argument("--all", action="store_true", help="every session, not only the newest")
            p.add_argument("--tasks", action="store_true", help="list Dask tasks too")
        p.set_defaults(func=func)

    p = sub.add_parser("log", help="cell runs: replayed or executed, and why")
    _store_arg(p)
    p.add_argument("--all", action="store_true", help="every session, not only the newest")
    p.add_argument("--tasks", action="store_true", help="list Dask tasks too")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_log)

    p = sub.add_parser("verify", help="re-hash a store, a backpack file or an unpacked backpack (exit 1 on any problem)")
    p.add_argument("target", nargs="?", help="a store folder, a backpack archive or an unpacked backpack folder")
    _store_arg(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("gc", help="remove objects no checkpoint or task log reaches (dry run without --yes)")
    _store_arg(p)
    p.add_argument("--yes", action="store_true", help="really delete")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_gc)

    p = sub.add_parser("run", help="execute a notebook headless on the audit, repeat or python3 kernel")
    p.add_argument("notebook")
    p.add_argument("--kernel", choices=("audit", "repeat", "python3"), default="audit")
    p.add_argument("--store", help="store folder (default: NOTEBOOK.nbrewind beside the notebook)")
    p.add_argument("--output", "-o", help="write the executed notebook here")
    p.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    p.add_argument("--allow-errors", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("demo", help="audit a bundled notebook, edit a cell, repeat it, show what replayed")
    p.add_argument("--dir", help="work in this folder instead of a temporary one (kept)")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("pack", help="build a backpack: one verifiable archive of a notebook and its checkpoints")
    p.add_argument("notebook")
    p.add_argument("-o", "--output", help="archive path (default: NOTEBOOK_STEM.backpack.tar.zst beside the notebook)")
    p.add_argument("--store", help="store folder (default: NOTEBOOK.nbrewind beside the notebook)")
    p.add_argument("--include-data", action="store_true", help="include the input files the audit read")
    p.add_argument("--history", choices=("all", "latest"), default="all", help="every session, or the newest only")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_pack)

    p = sub.add_parser("unpack", help="verify a backpack, then unpack it into a working folder")
    p.add_argument("archive")
    p.add_argument("-d", "--dest", help="new folder (default: ./ARCHIVE_NAME)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_unpack)

    p = sub.add_parser("trust", help="let the kernels load a store you did not sign: an unpacked backpack or a copied store")
    p.add_argument("folder", help="an unpacked backpack, its store, a store folder, or a folder holding one store")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_trust)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `jupyter-nbrewind`."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except NbrewindError as exc:
        print(f"jupyter nbrewind {args.command}: {exc}", file=sys.stderr)
        return 1
    except FileNotFoundError as exc:
        print(f"jupyter nbrewind {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
