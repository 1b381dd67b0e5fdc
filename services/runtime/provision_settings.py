"""The settings of `voxmesh provision`, the one administrative step (here, beside the services' settings, so that
the README's settings table lists them too)."""

from __future__ import annotations

from dataclasses import dataclass

from services.runtime.common_settings import CommonSettings
from services.runtime.settings_schema import setting


@dataclass(frozen=True, slots=True)
class ProvisionSettings(CommonSettings):
    max_queued_requests: int = setting(256, "bound of the REQUESTS queue; beyond it the gateway answers 429")
    storage: str = setting("file", "JetStream storage for streams and bucket", choices=("file", "memory"))
    stream_replicas: int = setting(1, "copies of every stream, the KV bucket and the object stores, each on its own "
                                   "server of a JetStream cluster (3 or 5 on a cluster: a quorum stores every "
                                   "publish); an existing one is changed in place")
    usage_retention_days: float = setting(35.0, "days the USAGE stream keeps each request's usage record (what "
                                          "GET /admin/usage and `voxmesh usage` sum); at least 1 (EVENTS' 24 h)")
