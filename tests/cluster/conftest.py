"""The cluster tier: real nats-server clusters (tests/support/nats_cluster.py), and hosts as network namespaces
(tests/support/host_fixtures.py)."""

from tests.support.nats_cluster import cluster_client, nats_cluster  # noqa: F401 - fixtures
from tests.support.host_fixtures import host_mesh, no_namespace_left, one_host_reference  # noqa: F401 - fixtures
