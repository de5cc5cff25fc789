"""`python -m benchmarks` runs the domain-notebook benchmark (`benchmarks.run`)."""

import sys

from benchmarks.run import main

sys.exit(main())
