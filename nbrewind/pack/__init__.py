"""Backpacks: one portable, verifiable archive of a notebook, its environment,
its checkpoints, its task log and its input data.

Imports only ``nbrewind.store`` and ``nbrewind.errors``. See ``docs/backpack.md``.
"""

from __future__ import annotations

from nbrewind.pack.build import PackResult, pack
from nbrewind.pack.trust import TrustResult, is_trusted, trust
from nbrewind.pack.unpack import UnpackResult, unpack
from nbrewind.pack.verify import VerifyResult, verify

__all__ = [
    "PackResult",
    "TrustResult",
    "UnpackResult",
    "VerifyResult",
    "is_trusted",
    "pack",
    "trust",
    "unpack",
    "verify",
]
