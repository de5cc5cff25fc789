"""Install the two NBRewind kernelspecs with an absolute interpreter path.

`pip install nbrewind` already puts both specs into the environment's
`share/jupyter/kernels`; those start `python`, which Jupyter resolves to its own
interpreter. When Jupyter runs from a different environment than NBRewind, the
specs written here name this interpreter explicitly so the kernels start where
NBRewind is installed.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

KERNEL_NAMES = ("nbrewind-audit", "nbrewind-repeat")


def spec_source_dir(name: str) -> Path:
    """The folder holding kernel.json and the logos of kernel `name`.

    Wheels carry a copy at `nbrewind/_kernelspecs`; a source checkout (editable
    install) has them at the repository's top-level `kernelspecs/`.
    """
    if name not in KERNEL_NAMES:
        raise ValueError(f"unknown kernel {name!r}; expected one of {', '.join(KERNEL_NAMES)}")
    here = Path(__file__).resolve().parent
    for candidate in (here / "_kernelspecs" / name, here.parent / "kernelspecs" / name):
        if (candidate / "kernel.json").is_file():
            return candidate
    raise FileNotFoundError(f"kernelspec files for {name} are missing from the installation; reinstall nbrewind")


@dataclass(frozen=True)
class InstalledSpec:
    """Where one kernelspec was written and which interpreter it starts."""

    name: str
    path: str
    python: str


def install_kernelspecs(*, user: bool = False, prefix: str | None = None) -> list[InstalledSpec]:
    """Write both kernelspecs, pointing at the absolute path of the running interpreter.

    `user` installs into the per-user Jupyter data dir, `prefix` into
    `<prefix>/share/jupyter/kernels` (use `sys.prefix` for `--sys-prefix`);
    with neither, the system-wide location is used as `jupyter kernelspec install` does.
    """
    from jupyter_client.kernelspec import KernelSpecManager

    manager = KernelSpecManager()
    installed = []
    for name in KERNEL_NAMES:
        source = spec_source_dir(name)
        with tempfile.TemporaryDirectory() as tmp:
            staged = Path(tmp) / name
            shutil.copytree(source, staged)
            spec = json.loads((staged / "kernel.json").read_text())
            spec["argv"][0] = sys.executable
            (staged / "kernel.json").write_text(json.dumps(spec, indent=1) + "\n")
            dest = manager.install_kernel_spec(str(staged), name, user=user, prefix=prefix)
        installed.append(InstalledSpec(name=name, path=dest, python=sys.executable))
    return installed
