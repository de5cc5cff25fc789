"""NBRewind (audit): runs every cell and checkpoints it, with its outputs and Dask tasks."""

from __future__ import annotations

from nbrewind.kernels.base import NbrewindKernel


class AuditKernel(NbrewindKernel):
    """Records every cell run: code, reads and writes, outputs, and a namespace checkpoint."""

    mode = "audit"
    implementation = "nbrewind-audit"


if __name__ == "__main__":
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(kernel_class=AuditKernel)
