"""UCX is needed only where KV moves: the services of `single` import neither ucxx nor the transfer agent, so a
laptop install without the `ucx` extra runs the default mesh."""

from __future__ import annotations

import subprocess
import sys


def test_the_single_topology_s_services_never_import_ucxx():
    probe = ("import sys\n"
             "import services.gateway.service, services.decode.service, services.vocoder.service, services.cli\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'ucxx' or m == 'services.transfer.agent'))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout
