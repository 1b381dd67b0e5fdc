"""`python -m services.mtp`: run one code-predictor replica (flags: --help)."""

import sys

from services.runtime.process import main

sys.exit(main("mtp"))
