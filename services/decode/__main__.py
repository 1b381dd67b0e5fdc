"""`python -m services.decode`: run the decode service (flags: --help)."""

import sys

from services.runtime.process import main

sys.exit(main("decode"))
