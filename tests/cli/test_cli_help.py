"""Every subcommand has a description and every option a help text."""

from __future__ import annotations

import argparse
import subprocess
import sys

from nbrewind.cli import build_parser


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_option_has_help_and_every_command_a_description() -> None:
    commands = subcommands()
    assert {"install", "status", "log", "du", "verify", "gc", "run", "demo", "pack", "unpack", "trust", "report",
            "prune"} <= set(commands)
    missing = [
        f"{name} {'/'.join(action.option_strings) or action.dest}"
        for name, sub in commands.items()
        for action in sub._actions
        if not action.help and not isinstance(action, argparse._HelpAction)
    ]
    assert missing == []
    assert [name for name, sub in commands.items() if not sub.description] == []


def test_subcommand_help_pages_describe_the_command() -> None:
    out = subprocess.run([sys.executable, "-m", "nbrewind.cli", "run", "--help"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert "Parameters are injected after the cell tagged 'parameters' as papermill" in " ".join(out.split())
    for option in ("--allow-errors", "--json", "--kernel", "-p NAME VALUE", "--cwd", "--quiet", "--debug"):
        assert option in out
