"""The commands that set up or start kernels: install, run and demo.

`run` executes a notebook headless through `nbrewind.run` and then reads the store the
kernel wrote to say what each cell did; `demo` runs the bundled notebook through
`nbrewind.demo`. Both modules are outside DESIGN.md's `cli -> {pack, store, kernelspec}`,
which tests/test_layers.py records as known deviations of this file.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from nbrewind.cli.common import EXIT_FAILED, EXIT_INTERRUPTED, json_text, show
from nbrewind.errors import NbrewindError


def cmd_install(args: argparse.Namespace) -> int:
    """`install`: write the nbrewind-audit and nbrewind-repeat kernelspecs for this interpreter."""
    from nbrewind.kernelspec import install_kernelspecs

    prefix = sys.prefix if args.sys_prefix else args.prefix
    specs = install_kernelspecs(user=args.user, prefix=prefix)
    if args.json:
        print(json_text(specs))
    else:
        for spec in specs:
            print(f"installed {spec.name} in {spec.path} (python: {spec.python})")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """`run`: execute a notebook headless, papermill-style; exit 1 when a cell raised, 130 on Ctrl-C."""
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
        print(f"jupyter nbrewind run: no store at {show(store)} yet, so every cell runs"
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
        print(json_text({**dataclasses.asdict(result), "summary": [dataclasses.asdict(s) for s in summary]}))
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
            return (f"; {show(candidate)} exists (papermill's kernels store there unless NBREWIND_STORE is set): "
                    f"pass --store {show(candidate)} to replay from it")
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
    """`demo`: audit the bundled notebook, change a parameter, repeat it and say what replayed."""
    from nbrewind.demo import format_demo, run_demo

    result = run_demo(args.dir, keep=True)  # the folder stays, so the report command printed works
    print(json_text(result) if args.json else format_demo(result))
    return 0
