"""`python -m services.vocoder`: run the vocoder service (flags: --help)."""

import sys

from services.runtime.process import main

sys.exit(main("vocoder"))
