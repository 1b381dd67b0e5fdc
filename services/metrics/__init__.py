"""Prometheus metrics of the voxmesh services: the shared metric names, each service's registry, and a
loopback-only `/metrics` listener for the services that have no HTTP server of their own (decode, vocoder)."""

import prometheus_client

# No `*_created` series: they double every counter and histogram, and nothing here reads them.
prometheus_client.disable_created_metrics()
