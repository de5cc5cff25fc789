"""Counting real calls of task functions, for the task-cache tests: each call leaves a file."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path


class Calls:
    """Counts the calls task functions recorded in ``folder`` since the last ``take``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def take(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for name in os.listdir(self.folder):
            counts[name.rpartition("-")[0]] += 1
            os.remove(self.folder / name)
        return counts
