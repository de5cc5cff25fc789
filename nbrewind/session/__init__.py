"""The per-cell decisions of the audit and repeat kernels (no ipykernel import)."""

from nbrewind.session.core import CellPlan, Session

__all__ = ["CellPlan", "Session"]
