"""The commands that read or tidy a store: status, log, du, verify, gc, report, prune.

Each finds its store with `find_store` (through `open_store`), calls one library
function of `nbrewind.store` (or `nbrewind.pack` for `verify` of a backpack) and prints
its result as text or, with `--json`, as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from nbrewind.cli.common import check_backpack_file, is_backpack_folder, json_text, open_store, progress
from nbrewind.errors import NbrewindError


def cmd_status(args: argparse.Namespace) -> int:
    """`status`: where the store is, its trust, writes in progress, the newest session, its size."""
    from nbrewind.store.report import format_status, store_status

    with open_store(args) as store:
        status = store_status(store)
    print(json_text(status) if args.json else format_status(status))
    return 0


def cmd_log(args: argparse.Namespace) -> int:
    """`log`: one row per cell run (of the newest session, or all with `--all`), with its tasks on request."""
    from nbrewind.store.report import cell_log, format_log, format_tasks, task_rows

    with open_store(args) as store:
        rows = cell_log(store, last_session=not args.all)
        tasks = task_rows(store, [r.id for r in rows]) if args.tasks or args.json else []
    if args.json:
        print(json_text({"cell_runs": [dict(dataclasses.asdict(r), why=r.why) for r in rows],
                         "tasks": [dataclasses.asdict(t) for t in tasks]}))
        return 0
    print(format_log(rows))
    if args.tasks:
        print()
        print(format_tasks(tasks))
    return 0


def cmd_du(args: argparse.Namespace) -> int:
    """`du`: the space the store uses, and its dedup and compression ratios."""
    from nbrewind.store import du

    with open_store(args) as store:
        report = du(store)
    if args.json:
        print(json_text(report))
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
    """`verify`: re-hash a backpack (file or unpacked folder) or a store; exit 1 on any problem."""
    from nbrewind.store import verify_store

    target = Path(args.target) if args.target else None
    if target is not None and not args.store and (target.is_file() and target.suffix != ".ipynb" or is_backpack_folder(target)):
        check_backpack_file(target)
        from nbrewind.pack import verify

        result = verify(target, progress=progress("verifying", args.json))
        if args.json:
            print(json_text(result))
        else:
            for problem in result.problems:
                print(f"problem: {problem}")
            state = "ok" if result.ok else f"{len(result.problems)} problem(s)"
            print(f"checked {result.checked:,} files ({result.bytes:,} bytes) of the backpack {result.path}: {state}")
        return 0 if result.ok else 1
    from nbrewind.errors import ReadOnlyStoreError

    try:
        opened = open_store(args, readonly=False)  # writable, so damaged files are moved aside
    except ReadOnlyStoreError:
        opened = open_store(args)
    with opened as store:
        report = verify_store(store)
    if args.json:
        print(json_text(report))
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


def cmd_gc(args: argparse.Namespace) -> int:
    """`gc`: list, or with `--yes` delete, the objects nothing in the catalog reaches."""
    from nbrewind.store import gc

    with open_store(args, readonly=not args.yes) as store:
        report = gc(store, dry_run=not args.yes)
    if args.json:
        print(json_text(report))
    else:
        verb = "removed" if args.yes else "would remove"
        print(f"{verb} {len(report.removed):,} unreachable objects ({report.removed_bytes:,} bytes); {report.reachable:,} reachable kept")
        if not args.yes and report.removed:
            print("run again with --yes to delete them")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """`report`: write the self-contained HTML report of the store."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise NbrewindError("the report draws its plots with matplotlib: pip install 'nbrewind[report]'") from None
    from nbrewind.store.htmlreport import render_html, report_data, report_json

    with open_store(args) as store:
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
        print(json_text({"output": str(output.absolute()), **report_json(data)}))
    else:
        print(f"wrote {output} ({output.stat().st_size:,} bytes, self-contained); open it in a browser")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    """`prune`: keep the newest N sessions and what they need; report, or with `--yes` remove, the rest."""
    from nbrewind.store.retention import prune

    with open_store(args, readonly=not args.yes) as store:
        plan = prune(store, args.keep_sessions, dry_run=not args.yes, min_age_seconds=args.min_age)
    if args.json:
        print(json_text(plan))
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
