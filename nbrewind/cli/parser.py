"""The argument parser of `jupyter nbrewind`: every subcommand, its options and help.

Each subcommand's parser names its handler (`args.func`). The options several
commands share are added by one helper each: the store a command reads
(`add_store_options`) and `--json` (`add_json_option`), so their names and help read
the same everywhere.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from nbrewind._version import __version__
from nbrewind.cli.backpack_commands import cmd_pack, cmd_trust, cmd_unpack
from nbrewind.cli.kernel_commands import cmd_demo, cmd_install, cmd_run
from nbrewind.cli.store_commands import cmd_du, cmd_gc, cmd_log, cmd_prune, cmd_report, cmd_status, cmd_verify

Handler = Callable[[argparse.Namespace], int]

_JSON_HELP = "print the result as JSON, for programs"
_STORE_HELP = "the store folder (default: NBREWIND_STORE, else NOTEBOOK.nbrewind for a notebook given, else ./.nbrewind)"
_TARGET_HELP = "a notebook (its store NOTEBOOK.nbrewind beside it) or a store folder"


def add_store_options(
    parser: argparse.ArgumentParser, *, metavar: str = "NOTEBOOK", target: str = _TARGET_HELP
) -> None:
    """The options of a command that reads a store, as `find_store` takes them: the
    optional notebook or store folder, and `--store`."""
    parser.add_argument("target", nargs="?", metavar=metavar, help=target)
    parser.add_argument("--store", help=_STORE_HELP)


def add_json_option(parser: argparse.ArgumentParser, what: str = "") -> None:
    """`--json`, every command's last option; `what` says what the JSON holds, when it is more than the result."""
    parser.add_argument("--json", action="store_true", help=_JSON_HELP + (f" ({what})" if what else ""))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show the full traceback of an error")
    parser = argparse.ArgumentParser(prog="jupyter nbrewind", description="Checkpointing Jupyter kernels for Dask notebooks.")
    parser.add_argument("--version", action="version", version=f"nbrewind {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str, func: Handler, summary: str, description: str, *, store: bool = False
    ) -> argparse.ArgumentParser:
        """A subcommand's parser, which runs `func`; `store`: the command reads a store."""
        p = sub.add_parser(name, help=summary, description=description, parents=[common])
        p.set_defaults(func=func)
        if store:
            add_store_options(p)
        return p

    p = command("install", cmd_install, "write kernelspecs that start this interpreter",
                "Write the nbrewind-audit and nbrewind-repeat kernelspecs, pointing at this Python.")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="per-user Jupyter data folder")
    where.add_argument("--sys-prefix", action="store_true", help="this environment's share/jupyter")
    where.add_argument("--prefix", help="PREFIX/share/jupyter/kernels")
    add_json_option(p)

    p = command("status", cmd_status, "the store: trust, writes in progress, last session, size",
                "Where the store is, whether this user trusts it, writes still in progress, the newest kernel "
                "session and the space used.", store=True)
    add_json_option(p)

    p = command("log", cmd_log, "cell runs: replayed or executed, and why",
                "One row per cell run of the newest kernel session (or every session): the decision, why, time, "
                "time saved and Dask task hits and misses.", store=True)
    p.add_argument("--all", action="store_true", help="every session, not only the newest")
    p.add_argument("--tasks", action="store_true", help="list the Dask tasks of the shown cell runs, with duration and worker")
    add_json_option(p, "cell runs and their tasks")

    p = command("du", cmd_du, "space used: objects, stored and logical bytes, dedup ratio",
                "Space the store uses: objects, bytes on disk, logical bytes, dedup and compression ratios.",
                store=True)
    add_json_option(p)

    p = command("verify", cmd_verify,
                "re-hash a store, a backpack file or an unpacked backpack (exit 1 on any problem)",
                "Re-hash every object of a store (damaged ones are moved aside), or every file of a backpack "
                "archive or unpacked backpack. Exit 1 when anything does not verify.")
    add_store_options(
        p, metavar="TARGET",
        target="a notebook (its store), a store folder, a backpack archive or an unpacked backpack folder",
    )
    add_json_option(p)

    p = command("gc", cmd_gc, "remove objects no checkpoint or task log reaches (dry run without --yes)",
                "List (or, with --yes, delete) objects nothing in the catalog reaches.", store=True)
    p.add_argument("--yes", action="store_true", help="really delete")
    add_json_option(p)

    p = command("report", cmd_report,
                "one self-contained HTML page: timeline, task hits, why cells ran, store contents",
                "Write one HTML file (no network, no external assets; plots drawn with matplotlib as inline SVG): a "
                "cell timeline per session with the time saved, Dask task hits and misses per cell, the reasons "
                "cells ran, what the store holds, and the top causes of unchanged cells running again.", store=True)
    p.add_argument("-o", "--output", help="the HTML file (default: NOTEBOOK_STEM.report.html, else ./nbrewind-report.html)")
    add_json_option(p, "the report's numbers")

    p = command("prune", cmd_prune, "drop all but the newest kernel sessions (dry run without --yes)",
                "Keep the newest N kernel sessions of a store and what they need (the recorded runs their replays "
                "re-sent, their checkpoints, the task results they used); remove the rest, then the objects "
                "nothing reaches any more.", store=True)
    p.add_argument("--keep-sessions", type=int, required=True, metavar="N", help="how many of the newest sessions to keep")
    p.add_argument("--yes", action="store_true", help="really remove (default: only report)")
    p.add_argument("--min-age", type=float, default=900.0, metavar="SECONDS",
                   help="keep unreachable objects younger than this, as gc does (default: 900)")
    add_json_option(p)

    p = command("run", cmd_run, "execute a notebook headless, like papermill, on the audit, repeat or python3 kernel",
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
    add_json_option(p, "timings, errors and the per-cell summary")

    p = command("demo", cmd_demo, "audit a bundled notebook, edit a parameter, repeat it, show what replayed",
                "Audit a small bundled notebook, change one parameter, run it on the repeat kernel and show which "
                "cells replayed, which ran and the time saved.")
    p.add_argument("--dir", help="work in this folder instead of a temporary one (kept)")
    p.add_argument("--keep", action="store_true", help="keep the folder (the default; accepted for older scripts)")
    add_json_option(p)

    p = command("pack", cmd_pack, "build a backpack: one verifiable archive of a notebook and its checkpoints",
                "Pack a notebook, its store and (optionally) its input data into one archive with a manifest of hashes.")
    p.add_argument("notebook", help="the .ipynb file to pack")
    p.add_argument("-o", "--output", help="archive path (default: NOTEBOOK_STEM.backpack.tar.zst beside the notebook)")
    p.add_argument("--store", help="store folder (default: NOTEBOOK.nbrewind beside the notebook)")
    p.add_argument("--include-data", action="store_true", help="include the input files the audit read")
    p.add_argument("--history", choices=("all", "latest"), default="all", help="every session, or the newest only")
    add_json_option(p)

    p = command("unpack", cmd_unpack, "verify a backpack, then unpack it into a working folder",
                "Verify every file of a backpack archive, then unpack it into a new folder.")
    p.add_argument("archive", help="a .backpack.tar.zst file made by `jupyter nbrewind pack`")
    p.add_argument("-d", "--dest", help="new folder (default: ./ARCHIVE_NAME)")
    add_json_option(p)

    p = command("trust", cmd_trust,
                "let the kernels load a store you did not sign: an unpacked backpack or a copied store",
                "Record this user's signature of a store's current content, so the kernels load it.")
    p.add_argument("folder", help="an unpacked backpack, its store, a store folder, or a folder holding one store")
    add_json_option(p)
    return parser
