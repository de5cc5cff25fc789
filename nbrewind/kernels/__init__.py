"""The two Jupyter kernels: thin IPythonKernel subclasses over `nbrewind.session`."""
