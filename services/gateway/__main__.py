"""`python -m services.gateway`: run the gateway service (flags: --help)."""

import sys

from services.runtime.process import main

sys.exit(main("gateway"))
