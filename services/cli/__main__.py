"""`python -m services.cli ...` is the `voxmesh` command (used where the script is not on PATH)."""

import sys

from services.cli import main

sys.exit(main())
