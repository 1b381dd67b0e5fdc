"""The cluster tier: real nats-server clusters (tests/support/nats_cluster.py)."""

from tests.support.nats_cluster import cluster_client, nats_cluster  # noqa: F401 - fixtures
