"""The environment and compute descriptions a backpack carries, and the
comparison of a backpack's environment with this one."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Iterable

from nbrewind.pack.manifest import yaml_records, yaml_scalar
from nbrewind.store.origin import environment_differences, installed_versions

__all__ = ["compute_yml", "environment_differences", "environment_yml", "requirements_txt"]


def _python() -> str:
    return platform.python_version()


def _platform() -> str:
    return f"{sys.platform}-{platform.machine()}"


def _distributions() -> list[tuple[str, str]]:
    return sorted(installed_versions().items())


def requirements_txt() -> str:
    """Python version and platform as comments, then every distribution==version."""
    lines = [
        "# the environment this backpack was recorded in (nbrewind pack)",
        f"# python: {_python()}",
        f"# platform: {_platform()}",
    ]
    lines += [f"{name}=={version}" for name, version in _distributions()]
    return "\n".join(lines) + "\n"


def environment_yml(name: str) -> str:
    """A conda environment file: Python pinned, every distribution through pip."""
    lines = [
        f"# platform: {_platform()}",
        f"name: {yaml_scalar(name)}",
        "channels:",
        "  - conda-forge",
        "dependencies:",
        f"  - python={_python()}",
        "  - pip",
        "  - pip:",
    ]
    lines += [f"      - {yaml_scalar(f'{n}=={v}')}" for n, v in _distributions()]
    return "\n".join(lines) + "\n"


def _memory_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def compute_yml(workers: Iterable[str]) -> str:
    """The Dask workers the task log saw, else this machine's cores and memory."""
    seen = sorted({w for w in workers if w})
    lines = ["# compute the notebook was recorded on (nbrewind pack)"]
    if seen:
        lines.append(f"source: {yaml_scalar('dask task log')}")
        lines += yaml_records("workers", ({"address": w} for w in seen))
    else:
        lines.append(f"source: {yaml_scalar('local machine')}")
        lines += yaml_records(
            "workers",
            [{"address": "local", "cores": os.cpu_count() or 1, "memory_bytes": _memory_bytes()}],
        )
    return "\n".join(lines) + "\n"
