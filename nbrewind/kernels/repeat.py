"""NBRewind (repeat): replays unchanged cells from the store and runs the rest."""

from __future__ import annotations

from nbrewind.kernels.base import NbrewindKernel


class RepeatKernel(NbrewindKernel):
    """Replays a cell whose code and recorded inputs are unchanged; runs and records the others."""

    mode = "repeat"
    implementation = "nbrewind-repeat"


if __name__ == "__main__":
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(kernel_class=RepeatKernel)
