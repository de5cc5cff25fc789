"""`jupyter nbrewind ...`: thin commands over library functions that return data.

Each subcommand parses its arguments, calls one function and prints the result as
a table or, with `--json`, as JSON. Every command that reads a store finds it the
same way (`find_store`). A bad input (a missing file, a file of the wrong kind, no
store where one was looked for) is one line on stderr and exit 2; a failure of the
work itself exits 1; no traceback is shown unless `--debug`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nbrewind._version import __version__
from nbrewind.errors import NbrewindError, NotAStoreError

EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 1, 2, 130
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class BadInput(NbrewindError):
    """An argument names something missing or of the wrong kind; nothing was done (exit 2)."""


def _json(value: Any) -> str:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    elif isinstance(value, list):
        value = [dataclasses.asdict(v) if dataclasses.is_dataclass(v) and not isinstance(v, type) else v for v in value]
    return json.dumps(value, indent=2, default=str)


def _show(path: Path) -> str:
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
            path, source = given.with_name(given.name + ".nbrewind"), f"the notebook {_show(given)}"
            if not given.exists() and not path.exists():
                raise BadInput(f"{_show(given)} does not exist (and neither does its store {_show(path)})")
        elif given.is_dir():
            raise BadInput(f"{_show(given)} is a folder but not an NBRewind store (no {MARKER_NAME})"
                           + _nearby_hint(given))
        elif given.exists():
            raise BadInput(f"{_show(given)} is neither a notebook (.ipynb) nor a store folder")
        else:
            raise BadInput(f"{_show(given)} does not exist")
    else:
        path, source = Path.cwd() / ".nbrewind", "the default"
    if not path.exists():
        folders = [Path.cwd(), *([Path(target).absolute().parent] if target else [])]
        raise BadInput(f"no store: {_show(path)} ({source}) does not exist" + _nearby_hint(*folders))
    if not (path / MARKER_NAME).is_file():
        raise BadInput(f"{_show(path)} is not an NBRewind store (no {MARKER_NAME}; store from {source})"
                       + _nearby_hint(path.parent))
    return path


def _nearby_hint(*folders: Path) -> str:
    stores = nearby_stores(*folders)
    if not stores:
        return "; no *.nbrewind store nearby: run the notebook on the audit kernel first"
    names = ", ".join(_show(s) for s in stores[:5]) + (", ..." if len(stores) > 5 else "")
    return f"; stores nearby: {names} (name one with --store, or pass its notebook)"


def _open_store(args: argparse.Namespace, *, readonly: bool = True) -> Any:
    from nbrewind.store import Store

    path = find_store(args.store, getattr(args, "target", None))
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

    target = Path(args.target) if args.target else None
    if target is not None and not args.store and (target.is_file() and target.suffix != ".ipynb" or _is_backpack_folder(target)):
        _check_backpack_file(target)
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


def _check_backpack_file(path: Path) -> None:
    """BadInput unless `path` exists and is named like a backpack or starts like one (a
    zstd stream). A .tar.zst that fails verification is a damaged backpack, reported by
    the verification itself (exit 1), not a wrong argument."""
    if not path.exists():
        raise BadInput(f"{_show(path)} does not exist")
    if path.is_dir() or path.name.endswith((".tar.zst", ".tzst")):
        return
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head != ZSTD_MAGIC:
        raise BadInput(f"{_show(path)} is not a backpack (a .tar.zst archive made by `jupyter nbrewind pack`)")


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


def _check_notebook(path: str) -> Path:
    """BadInput unless `path` is an existing .ipynb file."""
    given = Path(path)
    if not given.exists():
        raise BadInput(f"{_show(given.absolute())} does not exist")
    if given.is_dir() or given.suffix != ".ipynb":
        raise BadInput(f"{_show(given.absolute())} is not a notebook: expected an .ipynb file")
    return given


def cmd_pack(args: argparse.Namespace) -> int:
    from nbrewind.pack import pack

    _check_notebook(args.notebook)
    if args.store:
        find_store(args.store, None)
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

    archive = Path(args.archive)
    _check_backpack_file(archive)
    if archive.is_dir():
        raise BadInput(f"{_show(archive.absolute())} is a folder; unpack takes a backpack file (verify checks folders)")
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

    if not Path(args.folder).exists():
        raise BadInput(f"{_show(Path(args.folder).absolute())} does not exist")
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


def cmd_report(args: argparse.Namespace) -> int:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise NbrewindError("the report draws its plots with matplotlib: pip install 'nbrewind[report]'") from None
    from nbrewind.store.htmlreport import render_html, report_data, report_json

    with _open_store(args) as store:
        data = report_data(store)
    if args.output:
        output = Path(args.output)
    elif args.target and args.target.endswith(".ipynb"):
        output = Path(args.target).with_suffix(".report.html")
    else:
        output = Path("nbrewind-report.html")
    title = f"NBRewind report: {Path(args.target).name}" if args.target else "NBRewind report"
    output.write_text(render_html(data, title), encoding="utf-8")
    if args.json:
        print(_json({"output": str(output.absolute()), **report_json(data)}))
    else:
        print(f"wrote {output} ({output.stat().st_size:,} bytes, self-contained); open it in a browser")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    from nbrewind.store.retention import prune

    with _open_store(args, readonly=not args.yes) as store:
        plan = prune(store, args.keep_sessions, dry_run=not args.yes, min_age_seconds=args.min_age)
    if args.json:
        print(_json(plan))
        return 0
    verb = "removed" if args.yes else "would remove"
    print(f"{plan.store}: keeping the newest {len(plan.kept_sessions)} session(s); {verb} "
          f"{len(plan.dropped_sessions)} older session(s): {plan.cell_runs} cell run(s), {plan.checkpoints} "
          f"checkpoint(s), {plan.task_rows} task log row(s) and {plan.task_refs} cached task result(s)")
    if plan.cell_runs_kept_for_replays:
        print(f"kept {plan.cell_runs_kept_for_replays} older cell run(s) that the kept sessions' replays and checkpoints need")
    if args.yes:
        print(f"removed {plan.objects_removed:,} unreachable objects ({plan.bytes_removed:,} bytes)"
              + (f"; {plan.objects_kept_recent:,} younger than {args.min_age:g} s kept" if plan.objects_kept_recent else ""))
    else:
        print("dry run: run again with --yes to remove them")
    return 0


def cmd_log(args: argparse.Namespace) -> int:
    from nbrewind.store.report import cell_log, format_log, format_tasks, task_rows

    with _open_store(args) as store:
        rows = cell_log(store, last_session=not args.all)
        tasks = task_rows(store, [r.id for r in rows]) if args.tasks or args.json else []
    if args.json:
        print(_json({"cell_runs": [dict(dataclasses.asdict(r), why=r.why) for r in rows],
                     "tasks": [dataclasses.asdict(t) for t in tasks]}))
        return 0
    print(format_log(rows))
    if args.tasks:
        print()
        print(format_tasks(tasks))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from nbrewind.store.report import format_status, store_status

    with _open_store(args) as store:
        status = store_status(store)
    print(_json(status) if args.json else format_status(status))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from nbrewind.run import default_store, kernel_short_name, parse_parameters, read_notebook, run_notebook

    kernel = kernel_short_name(args.kernel)
    notebook = Path(args.notebook)
    read_notebook(notebook.absolute())  # a bad notebook is a one-line error before any kernel starts
    parameters = parse_parameters(args.parameters, args.parameters_raw, args.parameters_file, args.parameters_yaml)
    store = Path(args.store).absolute() if args.store else default_store(notebook.absolute())
    if kernel != "python3":
        notice = _trust_notice(store)
        if notice:
            print(notice, file=sys.stderr)
    if kernel == "repeat" and not store.exists():
        print(f"jupyter nbrewind run: no store at {_show(store)} yet, so every cell runs"
              + _papermill_hint(notebook, args.cwd), file=sys.stderr)
    bar = None if (args.quiet or args.json or not sys.stderr.isatty()) else _progress_bar(notebook.name)
    result = run_notebook(
        notebook, kernel=kernel, store=str(store) if kernel != "python3" else None, output=args.output,
        timeout=args.timeout, allow_errors=args.allow_errors, parameters=parameters, cwd=args.cwd,
        quiet=args.quiet, on_cell=bar, raise_on_error=False,
    )
    if bar is not None:
        bar(None, 0)
    summary = _run_summary(result) if kernel != "python3" else []
    if args.json:
        print(_json({**dataclasses.asdict(result), "summary": [dataclasses.asdict(s) for s in summary]}))
    elif not args.quiet:
        from nbrewind.store.report import format_summary

        if summary:
            print(format_summary(summary))
        print(f"ran {result.notebook} on {kernel} in {result.seconds:.2f} s"
              + (f"; outputs in {result.output}" if result.output else ""))
    where = f"partial outputs written to {result.output}" if result.output else "no -o given, outputs not saved"
    if result.interrupted:
        print(f"jupyter nbrewind run: interrupted; {where}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if result.failed:
        print(f"jupyter nbrewind run: {result.error}; {where}", file=sys.stderr)
        return EXIT_FAILED
    if result.errors and not args.quiet:
        print(f"{len(result.errors)} cell(s) raised (--allow-errors):", file=sys.stderr)
        for error in result.errors:
            print(f"  {error}", file=sys.stderr)
    return 0


def _papermill_hint(notebook: Path, cwd: str | None) -> str:
    """Where a store from `papermill -k nbrewind-audit` would be: papermill tells the
    kernel only its cwd and environment, so without NBREWIND_STORE it is ./.nbrewind."""
    for folder in dict.fromkeys([Path(cwd or notebook.absolute().parent).absolute(), Path.cwd()]):
        candidate = folder / ".nbrewind"
        if candidate.is_dir():
            return (f"; {_show(candidate)} exists (papermill's kernels store there unless NBREWIND_STORE is set): "
                    f"pass --store {_show(candidate)} to replay from it")
    return ""


def _run_summary(result: Any) -> list[Any]:
    """The kernel's decisions for each cell of a finished run, from its store."""
    from nbrewind.store import Store
    from nbrewind.store.report import run_summary
    from nbrewind.store.store import MARKER_NAME

    if result.store is None or not (Path(result.store) / MARKER_NAME).is_file():
        return []
    with Store.open(result.store, create=False, readonly=True) as store:
        return run_summary(store, [(c.cell, c.execution_count, c.seconds, c.error) for c in result.cells])


def _progress_bar(label: str) -> Any:
    """A tqdm bar on stderr advanced once per code cell; call it with (None, 0) to close it."""
    from tqdm import tqdm

    state: dict[str, Any] = {}

    def advance(cell: Any, total: int) -> None:
        if cell is None:
            if "bar" in state:
                state["bar"].close()
            return
        if "bar" not in state:
            state["bar"] = tqdm(total=total, desc=label, unit="cell", file=sys.stderr, leave=False)
        state["bar"].set_postfix_str(f"cell {cell.cell}: {cell.source[:30]}", refresh=False)
        state["bar"].update(1)

    return advance


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

    result = run_demo(args.dir, keep=True)  # the folder stays, so the report command printed works
    print(_json(result) if args.json else format_demo(result))
    return 0


_JSON_HELP = "print the result as JSON, for programs"
_STORE_HELP = "the store folder (default: NBREWIND_STORE, else NOTEBOOK.nbrewind for a notebook given, else ./.nbrewind)"
_TARGET_HELP = "a notebook (its store NOTEBOOK.nbrewind beside it) or a store folder"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show the full traceback of an error")
    parser = argparse.ArgumentParser(prog="jupyter nbrewind", description="Checkpointing Jupyter kernels for Dask notebooks.")
    parser.add_argument("--version", action="version", version=f"nbrewind {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=summary, description=description, parents=[common])

    p = command("install", "write kernelspecs that start this interpreter",
                "Write the nbrewind-audit and nbrewind-repeat kernelspecs, pointing at this Python.")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="per-user Jupyter data folder")
    where.add_argument("--sys-prefix", action="store_true", help="this environment's share/jupyter")
    where.add_argument("--prefix", help="PREFIX/share/jupyter/kernels")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p.set_defaults(func=cmd_install)

    p = command("status", "the store: trust, writes in progress, last session, size",
                "Where the store is, whether this user trusts it, writes still in progress, the newest kernel "
                "session and the space used.")
    p.add_argument("target", nargs="?", metavar="NOTEBOOK", help=_TARGET_HELP)
    p.add_argument("--store", help=_STORE_HELP)
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p.set_defaults(func=cmd_status)

    p = command("log", "cell runs: replayed or executed, and why",
                "One row per cell run of the newest kernel session (or every session): the decision, why, time, "
                "time saved and Dask task hits and misses.")
    p.add_argument("target", nargs="?", metavar="NOTEBOOK", help=_TARGET_HELP)
    p.add_argument("--store", help=_STORE_HELP)
    p.add_argument("--all", action="store_true", help="every session, not only the newest")
    p.add_argument("--tasks", action="store_true", help="list the Dask tasks of the shown cell runs, with duration and worker")
    p.add_argument("--json", action="store_true", help=_JSON_HELP + " (cell runs and their tasks)")
    p.set_defaults(func=cmd_log)

    p = command("du", "space used: objects, stored and logical bytes, dedup ratio",
                "Space the store uses: objects, bytes on disk, logical bytes, dedup and compression ratios.")
    p.add_argument("target", nargs="?", metavar="NOTEBOOK", help=_TARGET_HELP)
    p.add_argument("--store", help=_STORE_HELP)
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p.set_defaults(func=cmd_du)

    p = command("verify", "re-hash a store, a backpack file or an unpacked backpack (exit 1 on any problem)",
                "Re-hash every object of a store (damaged ones are moved aside), or every file of a backpack "
                "archive or unpacked backpack. Exit 1 when anything does not verify.")
    p.add_argument("target", nargs="?", metavar="TARGET",
                   help="a notebook (its store), a store folder, a backpack archive or an unpacked backpack folder")
    p.add_argument("--store", help=_STORE_HELP)
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p.set_defaults(func=cmd_verify)

    p = command("gc", "remove objects no checkpoint or task log reaches (dry run without --yes)",
                "List (or, with --yes, delete) objects nothing in the catalog reaches.")
    p.add_argument("target", nargs="?", metavar="NOTEBOOK", help=_TARGET_HELP)
    p.add_argument("--store", help=_STORE_HELP)
    p.add_argument("--yes", action="store_true", help="really delete")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p.set_defaults(func=cmd_gc)

    p = command("report", "one self-contained HTML page: timeline, task hits, why cells ran, store contents",
                "Write one HTML file (no network, no external assets; plots drawn with matplotlib as inline SVG): a "
                "cell timeline per session with the time saved, Dask task hits and misses per cell, the reasons "
                "cells ran, what the store holds, and the top causes of unchanged cells running again.")
    p.add_argument("target", nargs="?", metavar="NOTEBOOK", help=_TARGET_HELP)
    p.add_argument("--store", help=_STORE_HELP)
    p.add_argument("-o", "--output", help="the HTML file (default: NOTEBOOK_STEM.report.html, else ./nbrewind-report.html)")
    p.add_argument("--json", action="store_true", help=_JSON_HELP + " (the report's numbers)")
    p.set_defaults(func=cmd_report)

    p = command("prune", "drop all but the newest kernel sessions (dry run without --yes)",
                "Keep the newest N kernel sessions of a store and what they need (the recorded runs their replays "
                "re-sent, their checkpoints, the task results they used); remove the rest, then the objects "
                "nothing reaches any more.")
    p.add_argument("target", nargs="?", metavar="NOTEBOOK", help=_TARGET_HELP)
    p.add_argument("--store", help=_STORE_HELP)
    p.add_argument("--keep-sessions", type=int, required=True, metavar="N", help="how many of the newest sessions to keep")
    p.add_argument("--yes", action="store_true", help="really remove (default: only report)")
    p.add_argument("--min-age", type=float, default=900.0, metavar="SECONDS",
                   help="keep unreachable objects younger than this, as gc does (default: 900)")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p.set_defaults(func=cmd_prune)

    p = command("run", "execute a notebook headless, like papermill, on the audit, repeat or python3 kernel",
                "Execute a notebook headless. Parameters are injected after the cell tagged 'parameters' as papermill "
                "does. The output notebook is written even when a cell fails or the run is interrupted. Exit 1 when "
                "a cell raised (unless --allow-errors), 130 on Ctrl-C.")
    p.add_argument("notebook", help="the .ipynb file to run")
    p.add_argument("--kernel", "-k", default="audit", metavar="KERNEL",
                   help="audit (record), repeat (replay what is unchanged) or python3; the kernelspec names "
                        "nbrewind-audit and nbrewind-repeat work too (default: audit)")
    p.add_argument("--store", help="store folder (default: NBREWIND_STORE, else NOTEBOOK.nbrewind beside the notebook)")
    p.add_argument("--output", "-o", help="write the executed notebook here (also on failure and on Ctrl-C)")
    p.add_argument("-p", "--parameters", nargs=2, action="append", metavar=("NAME", "VALUE"), default=[],
                   help="a parameter; VALUE is typed as papermill types it (int, float, True/False, None, else str)")
    p.add_argument("-r", "--parameters-raw", nargs=2, action="append", metavar=("NAME", "RAW"), default=[],
                   help="a parameter whose value is always a string")
    p.add_argument("-f", "--parameters-file", action="append", metavar="YAML", default=[],
                   help="a YAML file of parameters (read before -y, -p and -r)")
    p.add_argument("-y", "--parameters-yaml", action="append", metavar="YAML", default=[],
                   help="a YAML string of parameters")
    p.add_argument("--cwd", help="the kernel's working directory (default: the notebook's folder)")
    p.add_argument("--timeout", type=int, default=600, help="seconds each cell may take (default: 600)")
    p.add_argument("--allow-errors", action="store_true",
                   help="keep going after a cell raises; the errors are listed and the exit status is 0")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar, no table, no kernel log")
    p.add_argument("--json", action="store_true", help=_JSON_HELP + " (timings, errors and the per-cell summary)")
    p.set_defaults(func=cmd_run)

    p = command("demo", "audit a bundled notebook, edit a parameter, repeat it, show what replayed",
                "Audit a small bundled notebook, change one parameter, run it on the repeat kernel and show which "
                "cells replayed, which ran and the time saved.")
    p.add_argument("--dir", help="work in this folder instead of a temporary one (kept)")
    p.add_argument("--keep", action="store_true", help="keep the folder (the default; accepted for older scripts)")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p.set_defaults(func=cmd_demo)

    p = command("pack", "build a backpack: one verifiable archive of a notebook and its checkpoints",
                "Pack a notebook, its store and (optionally) its input data into one archive with a manifest of hashes.")
    p.add_argument("notebook", help="the .ipynb file to pack")
    p.add_argument("-o", "--output", help="archive path (default: NOTEBOOK_STEM.backpack.tar.zst beside the notebook)")
    p.add_argument("--store", help="store folder (default: NOTEBOOK.nbrewind beside the notebook)")
    p.add_argument("--include-data", action="store_true", help="include the input files the audit read")
    p.add_argument("--history", choices=("all", "latest"), default="all", help="every session, or the newest only")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p.set_defaults(func=cmd_pack)

    p = command("unpack", "verify a backpack, then unpack it into a working folder",
                "Verify every file of a backpack archive, then unpack it into a new folder.")
    p.add_argument("archive", help="a .backpack.tar.zst file made by `jupyter nbrewind pack`")
    p.add_argument("-d", "--dest", help="new folder (default: ./ARCHIVE_NAME)")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p.set_defaults(func=cmd_unpack)

    p = command("trust", "let the kernels load a store you did not sign: an unpacked backpack or a copied store",
                "Record this user's signature of a store's current content, so the kernels load it.")
    p.add_argument("folder", help="an unpacked backpack, its store, a store folder, or a folder holding one store")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p.set_defaults(func=cmd_trust)
    return parser


def _fail(command: str, message: str, code: int) -> int:
    print(f"jupyter nbrewind {command}: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `jupyter-nbrewind`: the command's exit status, with every error
    a single line on stderr (the traceback too with --debug)."""
    args = build_parser().parse_args(argv)
    command, debug = args.command, bool(getattr(args, "debug", False))
    try:
        return int(args.func(args))
    except BrokenPipeError:
        # The reader went away (`log --json | head`): stop quietly, and keep the
        # interpreter from complaining again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    except KeyboardInterrupt:
        if debug:
            raise
        return _fail(command, "interrupted", EXIT_INTERRUPTED)
    except (BadInput, NotAStoreError) as exc:
        if debug:
            raise
        return _fail(command, str(exc), EXIT_BAD_INPUT)
    except NbrewindError as exc:
        if debug:
            raise
        from nbrewind.run import RunInputError

        return _fail(command, str(exc), EXIT_BAD_INPUT if isinstance(exc, RunInputError) else EXIT_FAILED)
    except FileNotFoundError as exc:
        if debug:
            raise
        return _fail(command, f"{exc.filename or exc} does not exist", EXIT_BAD_INPUT)
    except Exception as exc:
        if debug:
            raise
        return _fail(command, f"unexpected error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", EXIT_FAILED)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
