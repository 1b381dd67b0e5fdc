"""The cluster tier: real nats-server clusters (tests/support/nats_cluster.py), and hosts as network namespaces
(tests/support/host_fixtures.py). A failed test on the hosts gets the last lines of every service's output in its
report: they live only in memory (`HostProcess.log`), and a fault that shows under a loaded CI machine is found from
them or not at all."""

import pytest

from tests.support.nats_cluster import cluster_client, nats_cluster  # noqa: F401 - fixtures
from tests.support.host_fixtures import host_mesh, no_namespace_left, one_host_reference  # noqa: F401 - fixtures

SERVICE_LOG_LINES = 60


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    mesh = getattr(item, "funcargs", {}).get("host_mesh")
    if report.failed and mesh is not None:
        for name, process in sorted(mesh.services.items()):
            report.sections.append((f"service {name} (last {SERVICE_LOG_LINES} lines)",
                                    process.tail(SERVICE_LOG_LINES)))
