"""Moving the bus contract: connections, provisioning, pull consumers, fencing, ownership, leases, micro services.

The contract itself (subjects, streams, message types) lives in `messages/`; this package only moves it.
"""

from services.bus.advisories import MaxDeliveriesAdvisory, load_exhausted_message, watch_max_deliveries
from services.bus.claims import claim_partition, claim_request, read_owner, read_partition, still_owner
from services.bus.codes_publisher import CodesPublisher
from services.bus.connection import Backoff, connect
from services.bus.embedded import EmbeddedNats, find_nats_server
from services.bus.pull_consumer import Capacity, Delivery, PullConsumer
from services.bus.submit import submit_request
from services.bus.errors import (
    BusError,
    NatsServerError,
    NotProvisioned,
    OwnershipConflict,
    ProvisionConflict,
    QueueFull,
    StaleOwner,
)
from services.bus.fencing import fenced_publish, last_subject_sequence
from services.bus.kvstore import Versioned, cancel_request, read_cancel, read_record, write_record
from services.bus.leases import LeaseKeeper, is_alive, lease_expired, read_lease
from services.bus.logs import configure_logging, request_context
from services.bus.micro import register_service
from services.bus.provision import open_bucket, provision
from services.bus.terminal_guard import publish_terminal

__all__ = [
    "Backoff", "BusError", "Capacity", "CodesPublisher", "Delivery", "EmbeddedNats", "LeaseKeeper",
    "MaxDeliveriesAdvisory", "NatsServerError", "NotProvisioned", "OwnershipConflict", "ProvisionConflict",
    "PullConsumer", "QueueFull", "StaleOwner", "Versioned", "cancel_request", "claim_partition",
    "claim_request", "configure_logging", "connect", "fenced_publish", "find_nats_server", "is_alive",
    "last_subject_sequence", "lease_expired", "load_exhausted_message", "open_bucket", "provision",
    "publish_terminal", "read_cancel", "read_lease", "read_owner", "read_partition", "read_record",
    "register_service", "request_context", "still_owner", "submit_request",
    "watch_max_deliveries", "write_record",
]
