"""`python -m nbrewind.cli ...`: the same as `jupyter nbrewind ...`, unbuffered."""

from __future__ import annotations

import os
import sys

from nbrewind.cli import main

if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
