"""`jupyter nbrewind ...`: thin commands over library functions that return data.

Each subcommand parses its arguments, calls one function and prints the result as
a table or, with `--json`, as JSON. Every command that reads a store finds it the
same way (`find_store`). A bad input (a missing file, a file of the wrong kind, no
store where one was looked for) is one line on stderr and exit 2; a failure of the
work itself exits 1; no traceback is shown unless `--debug`.

This module is the entry point (`main`, the console script `jupyter-nbrewind`;
`python -m nbrewind.cli` runs it too). The parts: `parser` (every subcommand and
option), `common` (exit codes, BadInput, finding the store, output helpers), and the
handlers in `store_commands`, `backpack_commands` and `kernel_commands`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from nbrewind.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, BadInput, find_store, nearby_stores
from nbrewind.cli.parser import build_parser
from nbrewind.errors import NbrewindError, NotAStoreError

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "BadInput",
    "build_parser",
    "find_store",
    "main",
    "nearby_stores",
]


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
