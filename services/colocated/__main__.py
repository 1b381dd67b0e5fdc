"""`python -m services.colocated`: decode and the vocoder in one process (flags: --help)."""

import sys

from services.runtime.process import main

sys.exit(main("colocated"))
