"""`python -m services.prefill`: run the prefill service (flags: --help)."""

import sys

from services.runtime.process import main

sys.exit(main("prefill"))
