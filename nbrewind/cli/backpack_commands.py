"""The backpack commands: pack, unpack and trust.

Each checks its file arguments first (a bad one is BadInput, exit 2), then calls one
function of `nbrewind.pack` and prints its result as text or, with `--json`, as JSON.
(`verify` of a backpack is a store command: it takes stores and backpacks alike.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nbrewind.cli.common import BadInput, check_backpack_file, check_notebook, find_store, json_text, progress, show


def cmd_pack(args: argparse.Namespace) -> int:
    """`pack`: one archive of a notebook, its store and (optionally) its input data."""
    from nbrewind.pack import pack

    check_notebook(args.notebook)
    if args.store:
        find_store(args.store, None)
    result = pack(
        args.notebook, args.output, include_data=args.include_data, history=args.history,
        store=args.store, progress=progress("packing", args.json),
    )
    if args.json:
        print(json_text(result))
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
    """`unpack`: verify a backpack archive, then unpack it into a new working folder."""
    from nbrewind.pack import unpack

    archive = Path(args.archive)
    check_backpack_file(archive)
    if archive.is_dir():
        raise BadInput(f"{show(archive.absolute())} is a folder; unpack takes a backpack file (verify checks folders)")
    result = unpack(args.archive, args.dest, progress=progress("unpacking", args.json))
    if args.json:
        print(json_text(result))
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
    """`trust`: sign a store's current content for this user, so the kernels load it."""
    from nbrewind.pack import trust

    if not Path(args.folder).exists():
        raise BadInput(f"{show(Path(args.folder).absolute())} does not exist")
    result = trust(args.folder)
    if args.json:
        print(json_text(result))
    else:
        verb = "trusted" if result.newly_trusted else "already trusted"
        what = f"manifest sha256 {result.manifest_sha256}; " if result.manifest_sha256 else ""
        refs = f"; {result.refs_signed} ref file(s) re-signed" if result.refs_signed else ""
        print(f"{verb}: {result.store} ({what}signature recorded in {result.trust_db}{refs})")
    return 0
