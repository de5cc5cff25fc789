"""The per-cell decisions of the audit and repeat kernels (no ipykernel import)."""

from nbrewind.session.core import Session
from nbrewind.session.frontend import COMM_TARGET
from nbrewind.session.plan import CellPlan

__all__ = ["COMM_TARGET", "CellPlan", "Session"]
